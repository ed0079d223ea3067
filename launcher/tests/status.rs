//! `vmwarden status` on real VMs, against the goldens in `tests/golden/status/`:
//! nothing configured, a stopped VM, a running guest (real QEMU, TCG), the
//! same guest outdated by a spec change after its launch, and a retired
//! VM with state left (`--all`, with what reap and purge would do). Also
//! that stop, verify-clean and purge believe the spec the instance was
//! launched from while its record exists. Needs root.

mod common;

use std::time::Duration;

use common::golden::Golden;
use common::*;
use serde_json::json;

const BOOT: Duration = Duration::from_secs(90);

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `vmwarden ARGS`, asserted to exit with `code`; returns stdout.
fn run(env: &Env, args: &[&str], code: i32) -> String {
    let o = env.vmwarden(args);
    assert_eq!(
        o.status.code(),
        Some(code),
        "vmwarden {args:?}: {}",
        text(&o)
    );
    stdout(&o)
}

#[test]
fn nothing_configured_stopped_running_and_outdated() {
    let env = Env::new();
    let mut g = Golden::new(&env);

    // Nothing configured: a sentence, `[]`, exit 0.
    g.assert_table("status/nothing.txt", &run(&env, &["status"], 0));
    assert_eq!(run(&env, &["status", "--json"], 0), "[]\n");
    g.assert_table(
        "status/nothing-all.txt",
        &run(&env, &["status", "--all"], 0),
    );

    // A stopped VM: launched once (so its principal is registered), cleaned.
    env.write_spec("db", &env.spec("db", uid(61)));
    let p = env.probe("db", &["/bin/true"]);
    assert!(p.status.success(), "{}", text(&p));
    assert!(env.cleanup("db").0.status.success());
    g.assert_table("status/stopped.txt", &run(&env, &["status"], 0));
    g.assert_json("status/stopped.json", &run(&env, &["status", "--json"], 0));

    // A running guest: the control socket answers, the spec is current.
    let mut web_spec = env.spec("web", uid(62));
    web_spec["keep_on_purge"] = json!(["keys"]);
    let spec_path = env.write_spec("web", &web_spec);
    let mut guest = env.start("web");
    guest.wait_for("VMWARDEN-GUEST-READY", BOOT);
    let ready = env.vmwarden(&["wait-ready", "web", "--timeout", "30"]);
    assert!(ready.status.success(), "{}", text(&ready));
    g.set("{pid:web}", guest.pid());
    g.assert_table("status/running.txt", &run(&env, &["status"], 0));
    g.assert_json("status/running.json", &run(&env, &["status", "--json"], 0));
    let copy = env.run.join("web/launched-spec.json");
    assert_eq!(
        std::fs::read(&copy).unwrap(),
        std::fs::read(&spec_path).unwrap()
    );
    {
        use std::os::unix::fs::MetadataExt;
        let md = std::fs::metadata(&copy).unwrap();
        assert_eq!((md.uid(), md.mode() & 0o7777), (0, 0o600));
    }

    // The spec changes after the launch (a rebuild with restartIfChanged =
    // false): outdated. The new spec also names a tap and another keep set.
    let mut changed = web_spec.clone();
    changed["memory_mib"] = json!(320);
    changed["interfaces"] = json!([{ "tap": "vmw-st0", "bridge": "br-none" }]);
    changed["keep_on_purge"] = json!(["other"]);
    env.write_spec("web", &changed);
    g.assert_table("status/outdated.txt", &run(&env, &["status", "web"], 0));
    g.assert_json(
        "status/outdated.json",
        &run(&env, &["status", "web", "--json"], 0),
    );
    // verify-clean judges the running instance's taps, not the new spec's.
    let v: serde_json::Value =
        serde_json::from_str(&run(&env, &["verify-clean", "web", "--json"], 1)).unwrap();
    let tap = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "no-tap")
        .unwrap()
        .clone();
    assert_eq!(tap["expected"], "none of [] in /sys/class/net", "{v}");

    // Stopped but not cleaned: the record (and the copy) still stand, so
    // purge plans with the launched keep set.
    let stop = run(&env, &["stop", "web", "--timeout", "30"], 0);
    assert!(stop.contains("stopped by powerdown"), "{stop}");
    guest.wait_exit(Duration::from_secs(10)).expect("QEMU gone");
    let plan = env.vmwarden(&["purge", "web", "--keep-identity"]);
    assert_eq!(plan.status.code(), Some(1), "{}", text(&plan));
    let plan = stdout(&plan);
    assert!(
        plan.contains("keep   keys") && !plan.contains("keep   other"),
        "{plan}"
    );
    // Cleanup takes the copy with everything else; then the configured
    // spec is the one to believe.
    let (o, rep) = env.cleanup("web");
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        rep["deleted"].to_string().contains("launched-spec.json"),
        "{rep}"
    );
    assert!(!copy.exists());
    let plan = stdout(&env.vmwarden(&["purge", "web", "--keep-identity"]));
    assert!(plan.contains("keep   other"), "{plan}");
    g.assert_table("status/stopped-both.txt", &run(&env, &["status"], 0));
}

#[test]
fn a_retired_vm_with_state_left_and_what_reap_and_purge_would_do() {
    let env = Env::new();
    let g = Golden::new(&env);
    env.write_spec("old", &env.spec("old", uid(63)));
    let p = env.probe("old", &["/bin/true"]);
    assert!(p.status.success(), "{}", text(&p));
    assert!(env.cleanup("old").0.status.success());
    std::fs::write(env.state.join("old/disk.img"), b"d").unwrap();
    let (ok, out) = purge_on_pty(&env, &["old"], "DELETE-EVERYTHING");
    assert!(ok && out.contains("retired principal"), "{out}");
    // State left after the retirement, and no spec any more.
    std::fs::write(env.state.join("old/disk.img"), b"d").unwrap();
    std::fs::create_dir(env.state.join("old/identity")).unwrap();
    std::fs::write(env.state.join("old/identity/key"), b"k").unwrap();
    std::fs::remove_file(env.config.join("old.json")).unwrap();

    // Without --all: still shown (its runtime dir holds the lease file).
    g.assert_table("status/retired.txt", &run(&env, &["status"], 0));
    // --all: what it left and what reap and purge would do.
    g.assert_table(
        "status/retired-all.txt",
        &run(&env, &["status", "--all"], 0),
    );
    g.assert_json(
        "status/retired-all.json",
        &run(&env, &["status", "--all", "--json"], 0),
    );
    // After reap --apply the runtime dir is gone: only --all shows it.
    let r = env.vmwarden(&["reap", "--apply"]);
    assert!(r.status.success(), "{}", text(&r));
    g.assert_table("status/nothing.txt", &run(&env, &["status"], 0));
    let all = run(&env, &["status", "--all"], 0);
    assert!(
        all.contains("old   retired") && all.contains("reap:  nothing to do"),
        "{all}"
    );
    // A named VM vmwarden knows through its state dir only: exit 0; one
    // it does not know at all: exit 4, the known one still shown.
    run(&env, &["status", "old"], 0);
    let o = env.vmwarden(&["status", "old", "nosuch"]);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    assert!(stdout(&o).contains("old "), "{}", text(&o));
    assert!(stderr(&o).contains("no VM \"nosuch\""), "{}", text(&o));
}
