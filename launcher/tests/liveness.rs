//! Liveness believes the probe, not the lease, and the probe looks where
//! the instance really is (hardening properties 5 and 6):
//!
//! * a VM that releases the flock it inherited and runs on is neither
//!   "stopped" for `status` nor "not running" for `stop` — with and without
//!   a cgroup of its own — and `stop` ends it;
//! * a launch in a cgroup of its own (a real kernel cgroup made here, as
//!   systemd makes a unit's) records that cgroup, and the cgroup verdict
//!   and the `/proc` fallback agree for a live, a dead and an ambiguous VM;
//! * kill-after-every-step stays clean when the launcher runs in its own
//!   cgroup.
//!
//! Needs root (cgroups, namespaces, setresuid).

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::cgroup::TestCgroup;
use common::*;
use serde_json::json;
use vmwarden::config::names::VmName;
use vmwarden::config::paths::Roots;
use vmwarden::host::dirs;
use vmwarden::host::procs::processes_of_uid;
use vmwarden::instance::intent::Intent;
use vmwarden::instance::lease::{self, LeaseState};
use vmwarden::instance::liveness::{recorded_cgroup, Probe, Verdict, Via};

/// A Python program run as VM `name`'s principal in its sandbox, in
/// `cg` when given; waits for `marker` on its output.
fn python_vm(
    env: &Env,
    name: &str,
    u: u32,
    code: &str,
    marker: &str,
    cg: Option<&TestCgroup>,
) -> Guest {
    let script = env.path(&format!("{name}.py"));
    std::fs::write(&script, code).unwrap();
    let mut sp = env.spec(name, u);
    sp["landlock"]["read"] = json!([script]);
    env.write_spec(name, &sp);
    let log = env.path(&format!("{name}.serial.log"));
    let f = std::fs::File::create(&log).unwrap();
    let mut c = env.launch_cmd(name);
    c.arg("--probe")
        .arg("--")
        .args(["/usr/bin/python3", script.to_str().unwrap()]);
    if let Some(cg) = cg {
        c = cg.start_in(c);
    }
    c.stdin(Stdio::null())
        .stdout(f.try_clone().unwrap())
        .stderr(f);
    let mut g = Guest {
        child: c.spawn().unwrap(),
        log,
    };
    g.wait_for(marker, Duration::from_secs(30));
    g
}

/// Releases every flock it inherited (the lease among them), then runs on.
const RELEASE_THE_LEASE: &str = r#"import fcntl, os, time
for f in os.listdir('/proc/self/fd'):
    if int(f) > 2:
        try:
            fcntl.flock(int(f), fcntl.LOCK_UN)
        except OSError:
            pass
print('RELEASED', flush=True)
time.sleep(600)
"#;

/// Holds the lease, runs on.
const HOLD: &str = r#"import time
print('HOLDING', flush=True)
time.sleep(600)
"#;

fn lease_state(env: &Env, name: &str) -> LeaseState {
    let d = dirs::open_dir(&env.run.join(name)).unwrap();
    lease::state(&d).unwrap()
}

fn roots(env: &Env) -> Roots {
    Roots {
        config_dir: env.config.clone(),
        runtime_root: env.run.clone(),
        state_root: env.state.clone(),
    }
}

fn intent(env: &Env, name: &str) -> Intent {
    let d = dirs::open_dir(&env.run.join(name)).unwrap();
    Intent::read(&d).unwrap().expect("an intent record")
}

fn status_state(env: &Env, name: &str) -> String {
    let st = env.vmwarden(&["status", name, "--json"]);
    assert!(st.status.success(), "{}", text(&st));
    let v: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
    v[0]["state"].as_str().unwrap_or_default().to_string()
}

/// The attack of property 5, with or without a cgroup of the VM's own.
fn released_lease_is_not_stopped(u: u32, cg: Option<&TestCgroup>) {
    let env = Env::new();
    let mut g = python_vm(&env, "web", u, RELEASE_THE_LEASE, "RELEASED", cg);
    let pid = g.pid();
    assert_eq!(
        lease_state(&env, "web"),
        LeaseState::Free,
        "the attack did not release the lease"
    );
    assert!(processes_of_uid(u).contains(&pid), "the VM should run on");
    match cg {
        Some(cg) => {
            let rec = intent(&env, "web")
                .cgroup
                .expect("the launch recorded its cgroup");
            assert_eq!(rec.path, cg.path);
            assert_eq!(rec.id, cg.id());
        }
        None => assert!(
            intent(&env, "web").cgroup.is_none(),
            "a launch sharing its cgroup must not record it"
        ),
    }
    // status must not call it stopped.
    let state = status_state(&env, "web");
    assert_ne!(state, "stopped", "status believed the free lease");
    // cleanup must refuse (and delete nothing).
    let (o, rep) = env.cleanup("web");
    assert!(!o.status.success(), "cleanup ran while the VM runs: {rep}");
    assert_eq!(rep["deleted"], json!([]), "{rep}");
    // stop must not answer "not running" with exit 0: it stops the VM.
    let stop = env.vmwarden(&["stop", "web", "--timeout", "2"]);
    let out = String::from_utf8_lossy(&stop.stdout).into_owned();
    assert!(
        !(stop.status.success() && out.contains("not-running")),
        "stop believed the free lease: {}",
        text(&stop)
    );
    assert!(stop.status.success(), "stop failed: {}", text(&stop));
    assert!(out.contains("stopped by sigkill"), "{}", text(&stop));
    assert!(
        g.wait_exit(Duration::from_secs(10)).is_some(),
        "the VM still runs after stop"
    );
    assert!(processes_of_uid(u).is_empty());
    assert_eq!(status_state(&env, "web"), "stopped");
    let (o, rep) = env.cleanup("web");
    assert!(o.status.success() && rep["clean"] == true, "{}", text(&o));
    let v = env.verify_clean(&["web"]);
    assert!(v.status.success(), "{}", text(&v));
}

#[test]
fn a_vm_that_releases_its_lease_is_neither_stopped_nor_not_running() {
    released_lease_is_not_stopped(uid(140), None);
}

#[test]
fn in_its_own_cgroup_a_vm_that_releases_its_lease_is_found_there_and_stopped() {
    let cg = TestCgroup::new("release");
    released_lease_is_not_stopped(uid(141), Some(&cg));
    assert!(
        cg.procs().is_empty(),
        "stop left {:?} in the cgroup",
        cg.procs()
    );
}

/// Under systemd, the unit's `ExecStartPost=` (`wait-ready`) runs in the
/// unit's cgroup beside the launcher: the cgroup of the unit that started
/// the launch (named after the VM's unit, `PREFIX@NAME.service`, its
/// `trusted.invocation_id` the launcher's `$INVOCATION_ID`, and systemd
/// executed the launcher itself) is the unit's whatever else of it runs
/// there, so the launch records it; the same other process in a cgroup of
/// another name makes it shared, and the launch records none.
#[test]
fn a_launch_records_its_units_cgroup_beside_the_units_other_processes() {
    let env = Env::new();
    let u = uid(145);
    for (cg, recorded) in [
        (
            TestCgroup::unit(
                &format!("vmwarden-test-{}@web.service", std::process::id()),
                "4f1b0c6a9d2e4b7a8c3d5e6f7a8b9c0d",
            ),
            true,
        ),
        (TestCgroup::new("shared"), false),
    ] {
        // The stand-in for ExecStartPost's wait-ready.
        let mut other = Command::new("/bin/sleep");
        other.arg("600");
        cg.enter(&mut other);
        let mut other = other.spawn().unwrap();
        let mut g = python_vm(&env, "web", u, HOLD, "HOLDING", Some(&cg));
        let rec = intent(&env, "web").cgroup;
        if recorded {
            let rec = rec.expect("the launch recorded its unit's cgroup");
            assert_eq!((rec.path, rec.id), (cg.path.clone(), cg.id()));
        } else {
            assert!(rec.is_none(), "a shared cgroup was recorded: {rec:?}");
        }
        other.kill().unwrap();
        other.wait().unwrap();
        g.kill();
        let (o, rep) = env.cleanup("web");
        assert!(o.status.success() && rep["clean"] == true, "{}", text(&o));
    }
}

/// A cloud-hypervisor VM with a virtiofs share runs reboot-watch, which
/// ends cloud-hypervisor when the guest reboots, and its unit starts it
/// again (`RestartForceExitStatus=`): `vmwarden stop` run by hand beside
/// that unit presses the power button, a guest that answers it with a
/// reboot has the unit start the VM again, and stop had reported it
/// stopped. Refused, as for firecracker, pointing to `systemctl stop`,
/// with nothing sent to the VM (it still runs); `--probe` stands in for
/// cloud-hypervisor, with its real helpers.
#[test]
fn a_hand_run_stop_beside_the_unit_of_a_vm_that_reboot_watch_restarts_is_refused() {
    let env = Env::new();
    let u = uid(146);
    let name = "chunit";
    let unit = format!("vmwarden-test-{}@{name}.service", std::process::id());
    let cg = TestCgroup::unit(&unit, "5a2c1d7b0e3f4a8b9c6d7e8f9a0b1c2d");
    let _kvm = KvmAcl::grant(u);
    let bin = env.path("cloud-hypervisor");
    std::fs::copy("/bin/true", &bin).unwrap();
    let script = env.path(&format!("{name}.py"));
    std::fs::write(&script, HOLD).unwrap();
    let share = env.path("chunit-share");
    std::fs::create_dir(&share).unwrap();
    let mut s = env.spec(name, u);
    s["hypervisor"] = json!({ "kind": "cloud-hypervisor", "binary": bin, "accel": "kvm" });
    s["cmdline"] = json!("console=ttyS0");
    s["landlock"]["read"] = json!([script]);
    s["shares"] = json!([{ "tag": "ro", "source": share, "proto": "virtiofs", "read_only": true }]);
    s["virtiofsd"] = json!({ "binary": daemon("virtiofsd") });
    env.write_spec(name, &s);
    let log = env.path(&format!("{name}.serial.log"));
    let f = std::fs::File::create(&log).unwrap();
    let mut c = env.launch_cmd(name);
    c.arg("--probe")
        .arg("--")
        .args(["/usr/bin/python3", script.to_str().unwrap()]);
    let mut c = cg.start_in(c);
    c.stdin(Stdio::null())
        .stdout(f.try_clone().unwrap())
        .stderr(f);
    let mut g = Guest {
        child: c.spawn().unwrap(),
        log,
    };
    g.wait_for("HOLDING", Duration::from_secs(30));
    let rec = intent(&env, name);
    assert!(
        rec.cgroup.is_some() && format!("{rec:?}").contains("reboot-watch"),
        "{rec:?}"
    );
    let out = env.vmwarden(&["stop", name, "--timeout", "2"]);
    let said = text(&out);
    assert!(
        !out.status.success() && said.contains(&format!("systemctl stop {unit}")),
        "a hand-run stop beside the unit that restarts the VM on reboot: {said}"
    );
    assert!(
        g.child.try_wait().unwrap().is_none(),
        "the refused stop ended the VM: {said}"
    );
    g.kill();
    // Its helpers die by their death signal, a moment after it.
    let end = Instant::now() + Duration::from_secs(10);
    while !processes_of_uid(u).is_empty() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    let (o, rep) = env.cleanup(name);
    assert!(o.status.success() && rep["clean"] == true, "{}", text(&o));
}

/// The verdict's kind, for comparing the two paths (reasons differ).
fn kind(v: &Verdict) -> &'static str {
    match v {
        Verdict::Live(_) => "live",
        Verdict::Dead => "dead",
        Verdict::Ambiguous(_) => "ambiguous",
    }
}

/// Both paths: the whole probe, and the probe after the lease (what a
/// launch, cleanup and purge ask under their own lock).
fn both(env: &Env, name: &str, u: u32) -> [(String, String); 2] {
    let r = roots(env);
    let vm = VmName::parse(name).unwrap();
    let i = dirs::open_dir(&env.run.join(name))
        .ok()
        .and_then(|d| Intent::read(&d).ok().flatten());
    let by_cg = Probe::single();
    let by_proc = Probe::single().via(Via::Procs);
    let full = (by_cg.probe(&r, &vm), by_proc.probe(&r, &vm));
    let rest = (
        by_cg.with_lease_held(&r, &vm, Some(u), i.as_ref()),
        by_proc.with_lease_held(&r, &vm, Some(u), i.as_ref()),
    );
    // The cgroup path must have been the one taken where it could be.
    if let Some(i) = &i {
        assert!(
            recorded_cgroup(i).is_some(),
            "the record names no cgroup: {i:?}"
        );
        if let Verdict::Ambiguous(r) = &rest.0 {
            assert!(r.contains("cgroup"), "not the cgroup's verdict: {r}");
        }
    }
    [
        (kind(&full.0).to_string(), kind(&full.1).to_string()),
        (kind(&rest.0).to_string(), kind(&rest.1).to_string()),
    ]
}

#[test]
fn the_cgroup_and_proc_give_the_same_verdict_for_live_dead_and_ambiguous() {
    let env = Env::new();
    let u = uid(142);
    let cg = TestCgroup::new("verdicts");

    // Live: the VM holds its lease.
    let mut live = python_vm(&env, "web", u, HOLD, "HOLDING", Some(&cg));
    let [full, rest] = both(&env, "web", u);
    assert_eq!(full, ("live".into(), "live".into()), "live: full probe");
    assert_eq!(
        rest,
        ("ambiguous".into(), "ambiguous".into()),
        "live: after the lease"
    );
    assert_eq!(status_state(&env, "web"), "running");
    live.kill();

    // Dead: it exited; its cgroup is empty, no process of its uid.
    let end = Instant::now() + Duration::from_secs(10);
    while !cg.procs().is_empty() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    let [full, rest] = both(&env, "web", u);
    assert_eq!(full, ("dead".into(), "dead".into()), "dead: full probe");
    assert_eq!(
        rest,
        ("dead".into(), "dead".into()),
        "dead: after the lease"
    );
    assert_eq!(status_state(&env, "web"), "stopped");
    let (o, rep) = env.cleanup("web");
    assert!(o.status.success() && rep["clean"] == true, "{}", text(&o));

    // Ambiguous: it released its lease and runs on.
    let mut amb = python_vm(&env, "web", u, RELEASE_THE_LEASE, "RELEASED", Some(&cg));
    let [full, rest] = both(&env, "web", u);
    assert_eq!(
        full,
        ("ambiguous".into(), "ambiguous".into()),
        "ambiguous: full probe"
    );
    assert_eq!(
        rest,
        ("ambiguous".into(), "ambiguous".into()),
        "ambiguous: after the lease"
    );
    assert_eq!(status_state(&env, "web"), "ambiguous");
    amb.kill();
    let end = Instant::now() + Duration::from_secs(10);
    while !cg.procs().is_empty() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    let (o, rep) = env.cleanup("web");
    assert!(o.status.success() && rep["clean"] == true, "{}", text(&o));
}

#[test]
fn a_child_that_outlives_the_hypervisor_keeps_its_cgroup_ambiguous() {
    // The hypervisor forks a helper and exits (its lease goes with it);
    // the helper runs on in the cgroup.
    let env = Env::new();
    let u = uid(143);
    let cg = TestCgroup::new("child");
    let code = r#"import os, time, sys
if os.fork() == 0:
    os.closerange(3, 1024)
    print('CHILD', flush=True)
    time.sleep(600)
    sys.exit(0)
time.sleep(0.3)
"#;
    let mut g = python_vm(&env, "web", u, code, "CHILD", Some(&cg));
    assert!(g.wait_exit(Duration::from_secs(10)).is_some());
    let [full, rest] = both(&env, "web", u);
    assert_eq!(full, ("ambiguous".into(), "ambiguous".into()));
    assert_eq!(rest, ("ambiguous".into(), "ambiguous".into()));
    let (o, _) = env.cleanup("web");
    assert!(!o.status.success(), "cleanup ran while the helper runs");
    let stop = env.vmwarden(&["stop", "web", "--timeout", "1"]);
    assert!(stop.status.success(), "{}", text(&stop));
    assert!(cg.procs().is_empty(), "{:?} left in the cgroup", cg.procs());
    let (o, rep) = env.cleanup("web");
    assert!(o.status.success() && rep["clean"] == true, "{}", text(&o));
}

#[test]
#[allow(clippy::assertions_on_constants)]
fn kill_at_every_launch_step_in_its_own_cgroup_then_cleanup_is_clean() {
    assert!(
        cfg!(feature = "fault-injection"),
        "this test needs the fault-injection build: cargo test --features fault-injection"
    );
    let env = Env::new();
    let src = env.secret("web.cred", b"cgroup-secret");
    let mut s = env.spec("web", uid(144));
    s["credentials"] = json!([{ "name": "key", "source": { "path": src } }]);
    env.write_spec("web", &s);
    let cg = TestCgroup::new("steps");
    let out = Command::new(LAUNCH).arg("--list-steps").output().unwrap();
    let steps: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert!(steps.len() >= 10, "{steps:?}");
    let clean = |what: &str| {
        let (o, rep) = env.cleanup("web");
        assert!(
            o.status.success() && rep["clean"] == true,
            "{what}: {}",
            text(&o)
        );
        let v = env.verify_clean(&["web"]);
        assert!(v.status.success(), "{what}: {}", text(&v));
    };
    for step in &steps {
        let mut c = env.launch_cmd("web");
        c.env("VMWARDEN_FAULT_AFTER", step);
        cg.enter(&mut c);
        let out = c.output().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(out.status.signal(), Some(9), "step {step}: {}", text(&out));
        clean(&format!("after a kill at {step}"));
        let mut c = env.launch_cmd("web");
        c.args(["--probe", "--", "/bin/true"]);
        cg.enter(&mut c);
        let ok = c.output().unwrap();
        assert!(ok.status.success(), "relaunch after {step}: {}", text(&ok));
        clean(&format!("after the relaunch at {step}"));
    }
}

/// A root process (euid 0: its `/proc` entry is root's) that holds the
/// VM's uid only as its real, saved or fs uid still counts as running as
/// it: the scan reads every root process's four uids, whether they come
/// from a pidfd or from `status`.
#[test]
fn a_root_process_holding_the_uid_as_real_saved_or_fs_uid_is_found() {
    require_root();
    for (i, set) in [
        "os.setresuid(U, 0, 0)",
        "os.setresuid(0, 0, U)",
        "ctypes.CDLL(None).setfsuid(U)",
    ]
    .into_iter()
    .enumerate()
    {
        let u = 61_970 + u32::try_from(i).unwrap();
        let script = format!(
            "import os, ctypes, sys, time\nU = {u}\n{set}\nprint(os.getresuid(), flush=True)\ntime.sleep(30)\n"
        );
        let mut child = Command::new("python3")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let pid = child.id();
        let st = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let found = processes_of_uid(u).contains(&pid);
        let _ = child.kill();
        let _ = child.wait();
        let uids = st.lines().find(|l| l.starts_with("Uid:")).unwrap_or("");
        assert!(
            uids.split_whitespace().nth(2) == Some("0"),
            "{set}: euid not 0: {uids}"
        );
        assert!(uids.contains(&u.to_string()), "{set} did not take: {uids}");
        assert!(found, "a root process with {set} ({uids}) was missed");
    }
}
