//! `vmwarden metrics` on real VMs: a stopped, a running (real QEMU, TCG,
//! in a cgroup of its own as a unit's), an outdated and a retired VM
//! against the goldens in `tests/golden/metrics/`, each output also
//! accepted by `promtool check metrics` (tests/setup-host.sh installs it);
//! `--output` replaces its file atomically; and a running guest's counters
//! move. Needs root.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::cgroup::TestCgroup;
use common::golden::Golden;
use common::*;
use serde_json::json;

const BOOT: Duration = Duration::from_secs(120);
const PROMTOOL: &str = "/usr/local/bin/promtool";

fn metrics(env: &Env) -> String {
    let o = env.vmwarden(&["metrics"]);
    assert!(o.status.success(), "vmwarden metrics: {}", text(&o));
    String::from_utf8(o.stdout).unwrap()
}

/// `promtool check metrics` (its linter too) accepts `text`.
fn promtool_accepts(text: &str) {
    let mut c = Command::new(PROMTOOL)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{PROMTOOL} (tests/setup-host.sh installs it): {e}"));
    std::io::Write::write_all(c.stdin.as_mut().unwrap(), text.as_bytes()).unwrap();
    drop(c.stdin.take());
    let o = c.wait_with_output().unwrap();
    assert!(
        o.status.success() && o.stdout.is_empty() && o.stderr.is_empty(),
        "promtool check metrics: {}\n{text}",
        common::text(&o)
    );
}

/// The value of the sample `series` (name and labels, exactly).
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn metrics_of_a_stopped_a_running_an_outdated_and_a_retired_vm() {
    let env = Env::new();
    let g = Golden::new(&env);

    // Nothing configured: every family's HELP and TYPE, no sample.
    let empty = metrics(&env);
    g.assert_prom("metrics/nothing.prom", &empty);
    promtool_accepts(&empty);

    // Stopped: launched once and cleaned (one start, a clean verdict).
    env.write_spec("db", &env.spec("db", uid(71)));
    let p = env.probe("db", &["/bin/true"]);
    assert!(p.status.success(), "{}", text(&p));
    assert!(env.cleanup("db").0.status.success());

    // Retired: launched, cleaned, purged, its spec removed.
    env.write_spec("old", &env.spec("old", uid(72)));
    let p = env.probe("old", &["/bin/true"]);
    assert!(p.status.success(), "{}", text(&p));
    assert!(env.cleanup("old").0.status.success());
    let (ok, out) = purge_on_pty(&env, &["old"], "DELETE-EVERYTHING");
    assert!(ok && out.contains("retired principal"), "{out}");
    std::fs::remove_file(env.config.join("old.json")).unwrap();

    // Running, in a cgroup of its own as a unit's: its figures.
    let web_spec = env.spec("web", uid(73));
    env.write_spec("web", &web_spec);
    let cg = TestCgroup::new("metrics");
    let mut guest = spawn_logged(cg.start_in(env.launch_cmd("web")), env.path("web.log"));
    guest.wait_for("VMWARDEN-GUEST-READY", BOOT);
    let ready = env.vmwarden(&["wait-ready", "web", "--timeout", "30"]);
    assert!(ready.status.success(), "{}", text(&ready));
    let running = metrics(&env);
    g.assert_prom("metrics/running.prom", &running);
    promtool_accepts(&running);

    // Outdated: the spec changed after the launch.
    let mut changed = web_spec.clone();
    changed["memory_mib"] = json!(320);
    env.write_spec("web", &changed);
    let outdated = metrics(&env);
    g.assert_prom("metrics/outdated.prom", &outdated);
    promtool_accepts(&outdated);

    // --output: the file replaced whole, root's 0644, no temporary left.
    let out = env.path("textfile/vmwarden.prom");
    std::fs::create_dir(out.parent().unwrap()).unwrap();
    std::fs::write(&out, b"stale").unwrap();
    let o = env.vmwarden(&["metrics", "--output", out.to_str().unwrap()]);
    assert!(o.status.success() && o.stdout.is_empty(), "{}", text(&o));
    let written = std::fs::read_to_string(&out).unwrap();
    g.assert_prom("metrics/outdated.prom", &written);
    let names: Vec<_> = std::fs::read_dir(out.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["vmwarden.prom"]);
    {
        use std::os::unix::fs::MetadataExt;
        let md = std::fs::metadata(&out).unwrap();
        assert_eq!((md.uid(), md.mode() & 0o7777), (0, 0o644));
    }

    let stop = env.vmwarden(&["stop", "web", "--timeout", "30"]);
    assert!(stop.status.success(), "{}", text(&stop));
    guest.wait_exit(Duration::from_secs(10)).expect("QEMU gone");
    assert!(env.cleanup("web").0.status.success());
    // Its cleanup is recorded: one start, a clean verdict, no figures.
    let after = metrics(&env);
    for line in [
        "vmwarden_vm_state{vm=\"web\",state=\"stopped\"} 1",
        "vmwarden_vm_starts_total{vm=\"web\"} 1",
        "vmwarden_vm_last_cleanup_clean{vm=\"web\"} 1",
        "vmwarden_vm_last_cleanup_residue{vm=\"web\"} 0",
    ] {
        assert!(after.lines().any(|l| l == line), "{line} not in:\n{after}");
    }
    assert!(!after.contains("cpu_seconds_total{vm=\"web\"}"), "{after}");
    env.assert_clean("web");
}

#[test]
fn a_running_guests_counters_move() {
    let env = Env::new();
    let u = uid(74);
    // The guest spins the CPU, then writes 8 MiB to its disk, synced.
    let script = "\
( i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done
  dd if=/dev/urandom of=/dev/vda bs=64k count=128 conv=fsync 2>/dev/null && echo T-WROTE ) &
";
    let mut spec = env.shares_spec("web", u, "hold", script);
    spec["disks"] = json!([{ "path": env.state.join("web/data.img"),
                             "create": { "size_mib": 16, "fs_type": "ext4" } }]);
    env.write_spec("web", &spec);
    let cg = TestCgroup::new("counters");
    let mut guest = spawn_logged(cg.start_in(env.launch_cmd("web")), env.path("web.log"));
    guest.wait_for("VMWARDEN-GUEST-READY", BOOT);
    let cpu = "vmwarden_vm_cpu_seconds_total{vm=\"web\"}";
    let written = "vmwarden_vm_block_written_bytes_total{vm=\"web\"}";
    let first = metrics(&env);
    let cpu0 = value(&first, cpu).unwrap_or_else(|| panic!("no {cpu}:\n{first}"));
    guest.wait_for("T-WROTE", BOOT);
    let second = metrics(&env);
    let cpu1 = value(&second, cpu).unwrap();
    assert!(cpu1 > cpu0, "CPU seconds did not grow: {cpu0} then {cpu1}");
    eprintln!("measured: cpu seconds {cpu0} then {cpu1}");
    // Block bytes come from io.stat, which cgroup v2 has only where the io
    // controller is enabled for it: then they must have grown by what the
    // guest wrote. (On a hybrid host, where io belongs to the v1 blkio
    // hierarchy, the systemd suite's `metrics` scenario checks them.)
    let io_on_v2 = std::fs::read_to_string(cg.path.join("cgroup.controllers"))
        .unwrap_or_default()
        .split_whitespace()
        .any(|c| c == "io");
    match (value(&first, written), value(&second, written)) {
        (Some(w0), Some(w1)) => {
            assert!(io_on_v2, "io.stat read without the io controller");
            assert!(w1 >= w0 + 8.0 * 1024.0 * 1024.0, "{w0} then {w1}");
        }
        (None, None) => assert!(!io_on_v2, "io is enabled but no block bytes:\n{second}"),
        other => panic!("block bytes came and went: {other:?}"),
    }
    promtool_accepts(&second);
    let stop = env.vmwarden(&["stop", "web", "--timeout", "30"]);
    assert!(stop.status.success(), "{}", text(&stop));
    guest.wait_exit(Duration::from_secs(10)).expect("QEMU gone");
    assert!(env.cleanup("web").0.status.success());
}
