//! Hibernation under attack and under a confused operator, with a real
//! QEMU guest (TCG): a running VM whose configured spec no longer allows
//! hibernation is not put down (by hand or at the host's shutdown), and a
//! `wait-ready` killed once the restored guest runs never leaves its
//! snapshot to be restored a second time, and a snapshot kept for more
//! restores that is rewritten in place (same inode, same size) is refused.
//! The at-shutdown record names a VM only while the snapshot the shutdown
//! made is there: a restore, a cold boot's discard, the cleanup that
//! finishes a discard left half done and `purge` take it off. Its lock,
//! held by another process or planted, fails each user within a bound,
//! naming it.
//! Needs root.

mod common;

use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use common::hibernate::*;
use common::*;
use serde_json::{json, Value};
use vmwarden::control::hibernate::{RESTORE_KILL_POINT, UNWRITABLE};
use vmwarden::hypervisor::qmp::Qmp;
use vmwarden::teardown::purge::CONFIRM_PHRASE;

#[test]
fn a_vm_whose_configured_spec_no_longer_allows_it_is_not_hibernated() {
    require_root();
    let env = Env::new();
    let mut s = spec(&env, "cfg", 41);
    let (mut g, (up1, marker)) = boot(&env, "cfg", "cfg.log");
    // The operator forbids hibernation (a rebuild that did not restart
    // the VM): the running instance was launched allowing it.
    s["hibernate"] = json!({ "allowed": false });
    env.write_spec("cfg", &s);

    let h = env.vmwarden(&["hibernate", "cfg", "--timeout", "120"]);
    assert!(!h.status.success(), "hibernated anyway: {}", text(&h));
    let e = stderr(&h);
    assert!(
        e.contains("hibernate.allowed") && e.contains("configured spec"),
        "{e}"
    );
    // Nor at the host's shutdown: left to its unit, still running.
    let all = env.vmwarden(&["hibernate-all", "--timeout", "120"]);
    assert!(all.status.success(), "{}", text(&all));
    assert!(
        String::from_utf8_lossy(&all.stdout).contains("cfg: left to its unit"),
        "{}",
        text(&all)
    );
    assert!(!env.state.join(".hibernated-at-shutdown.json").exists());
    // No memory on disk, nothing recorded, the guest untouched.
    assert!(!partial(&env, "cfg").exists());
    assert!(!snap(&env, "cfg").exists());
    assert!(!record(&env, "cfg").exists());
    let len = g.log_text().len();
    let (up2, marker2) = tick_after(&mut g, len, Duration::from_secs(30));
    assert_eq!(marker2, marker);
    assert!(up2 > up1);

    let st = env.vmwarden(&["stop", "cfg", "--timeout", "30"]);
    assert!(st.status.success(), "{}", text(&st));
    g.wait_exit(Duration::from_secs(15));
    env.assert_clean("cfg");
}

#[test]
fn a_wait_ready_killed_once_the_restored_guest_runs_leaves_no_snapshot_to_restore_twice() {
    require_root();
    require_fault_injection();
    let env = Env::new();
    spec(&env, "twice", 42);
    let (mut g, (up1, marker)) = boot(&env, "twice", "twice.1.log");
    let h = env.vmwarden(&["hibernate", "twice", "--timeout", "120"]);
    assert!(h.status.success(), "hibernate: {}", text(&h));
    assert!(g.wait_exit(Duration::from_secs(15)).is_some());
    env.assert_clean("twice");

    // Restore; wait-ready (the unit's ExecStartPost) is killed the moment
    // the restored guest runs again.
    let mut g2 = spawn_logged(env.launch_cmd("twice"), env.path("twice.2.log"));
    let w = env
        .vmwarden_cmd()
        .args(["wait-ready", "twice", "--timeout", "120"])
        .env(
            "VMWARDEN_FAULT_AFTER",
            format!("hibernate:{RESTORE_KILL_POINT}"),
        )
        .output()
        .unwrap();
    assert_eq!(w.status.signal(), Some(9), "{}", text(&w));
    let (up2, marker2) = tick_after(&mut g2, 0, Duration::from_secs(60));
    assert_eq!(marker2, marker, "not the restored guest");
    assert!(up2 >= up1);
    // The guest ran: its snapshot must be gone already.
    assert!(
        !record(&env, "twice").exists(),
        "the record of a snapshot whose guest already ran is left"
    );
    assert!(!snap(&env, "twice").exists(), "the snapshot is left");
    // wait-ready again (an operator's, a health check's): the VM is ready,
    // its snapshot long consumed.
    let again = env.vmwarden(&["wait-ready", "twice", "--timeout", "30"]);
    assert!(
        again.status.success(),
        "second wait-ready: {}",
        text(&again)
    );

    let st = env.vmwarden(&["stop", "twice", "--timeout", "30"]);
    assert!(st.status.success(), "{}", text(&st));
    g2.wait_exit(Duration::from_secs(15));
    env.assert_clean("twice");
    // The next start boots cold: the snapshot is not restored twice.
    let mut g3 = spawn_logged(env.launch_cmd("twice"), env.path("twice.3.log"));
    g3.wait_for("VMWARDEN-GUEST-READY", BOOT);
    g3.kill();
    env.assert_clean("twice");
}

#[test]
fn a_kept_snapshot_rewritten_in_place_by_a_later_run_is_refused_by_name() {
    require_root();
    let env = Env::new();
    spec(&env, "gold", 43);
    let (mut g, (_, marker)) = boot(&env, "gold", "gold.1.log");
    let h = env.vmwarden(&[
        "hibernate",
        "gold",
        "--timeout",
        "120",
        "--keep-after-restore",
    ]);
    assert!(h.status.success(), "hibernate: {}", text(&h));
    assert!(g.wait_exit(Duration::from_secs(15)).is_some());
    env.assert_clean("gold");

    // A first restore: kept, as asked.
    let mut g2 = spawn_logged(env.launch_cmd("gold"), env.path("gold.2.log"));
    let r = env.vmwarden(&["wait-ready", "gold", "--timeout", "120"]);
    assert!(r.status.success(), "{}\n{}", text(&r), g2.log_text());
    assert_eq!(tick_after(&mut g2, 0, Duration::from_secs(30)).1, marker);
    assert!(snap(&env, "gold").is_dir() && record(&env, "gold").exists());
    // While it runs, its hypervisor (the principal, who owns the kept
    // snapshot in the state dir it may write) rewrites the memory file in
    // place: same inode, same size, other guest memory.
    let mem = snap(&env, "gold").join("memory");
    let before = std::fs::symlink_metadata(&mem).unwrap();
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&mem).unwrap();
        f.write_all_at(b"planted by the principal", before.len() / 2)
            .unwrap();
    }
    let after = std::fs::symlink_metadata(&mem).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!((after.ino(), after.len()), (before.ino(), before.len()));
    let st = env.vmwarden(&["stop", "gold", "--timeout", "30"]);
    assert!(st.status.success(), "{}", text(&st));
    g2.wait_exit(Duration::from_secs(15));
    env.assert_clean("gold");

    // The next start refuses it by name (exit 78) instead of loading it.
    let mut c = env.launch_cmd("gold");
    let log = env.path("gold.3.log");
    c.stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::create(env.path("gold.3.err")).unwrap());
    let mut child = c.spawn().unwrap();
    let end = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() >= end {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let err = std::fs::read_to_string(env.path("gold.3.err")).unwrap_or_default();
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(78),
        "the rewritten snapshot was not refused: {err}"
    );
    assert!(
        err.contains(".vmwarden-hibernate: not the files captured"),
        "{err}"
    );
    assert!(snap(&env, "gold").is_dir(), "the refused snapshot is kept");
    env.assert_clean("gold");
}

#[test]
fn a_failed_capture_of_a_restored_guest_never_resumes_it_with_its_snapshot_still_there() {
    require_root();
    require_fault_injection();
    let env = Env::new();
    spec(&env, "again", 44);
    let (mut g, (_, marker)) = boot(&env, "again", "again.1.log");
    let h = env.vmwarden(&["hibernate", "again", "--timeout", "120"]);
    assert!(h.status.success(), "hibernate: {}", text(&h));
    assert!(g.wait_exit(Duration::from_secs(15)).is_some());
    env.assert_clean("again");

    // Restored by hand, no wait-ready: loaded and held paused.
    let mut g2 = spawn_logged(env.launch_cmd("again"), env.path("again.2.log"));
    let qmp = env.run.join("again/control/qmp.sock");
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let loaded = Qmp::connect(&qmp, Duration::from_secs(5))
            .ok()
            .and_then(|mut q| q.execute("query-migrate", None).ok())
            .is_some_and(|v| v["status"] == "completed");
        if loaded {
            break;
        }
        assert!(Instant::now() < end, "never loaded: {}", g2.log_text());
        std::thread::sleep(Duration::from_millis(200));
    }
    // A capture that fails (QEMU's migration, on its first write to a
    // file handed over read-only: a short --timeout is no failure where
    // the paused guest's memory is written before the first poll), and
    // the guest is resumed (it ran before the hibernate, as far as the
    // operator knows).
    // The capture's own resume is what must show: only ticks logged after
    // the hibernate returned count (the consume before it ran the guest
    // for a moment too).
    let said = failed_capture(
        &env,
        "again",
        "120",
        UNWRITABLE,
        "the capture failed (the capture failed: ",
    );
    let failed_at = g2.log_text().len();
    let (_, marker2) = tick_after(&mut g2, failed_at, Duration::from_secs(30));
    assert_eq!(marker2, marker);
    // The guest runs: the snapshot it was restored from must be gone.
    assert!(
        !record(&env, "again").exists(),
        "a resumed guest's snapshot is still recorded: {said}"
    );
    assert!(!snap(&env, "again").exists() && !partial(&env, "again").exists());

    let st = env.vmwarden(&["stop", "again", "--timeout", "30"]);
    assert!(st.status.success(), "{}", text(&st));
    g2.wait_exit(Duration::from_secs(15));
    env.assert_clean("again");
}

#[test]
fn a_vm_restored_by_hand_then_hibernated_by_hand_is_not_started_at_the_next_boot() {
    require_root();
    let env = Env::new();
    spec(&env, "shut", 45);
    let (mut g, _) = boot(&env, "shut", "shut.1.log");
    // The host's shutdown puts it down (the unit stopped by hand, so its
    // start at boot has not consumed the record yet).
    let all = env.vmwarden(&["hibernate-all", "--timeout", "120"]);
    assert!(all.status.success(), "{}", text(&all));
    assert!(g.wait_exit(Duration::from_secs(15)).is_some());
    let at_shutdown = env.state.join(".hibernated-at-shutdown.json");
    let listed = || {
        std::fs::read(&at_shutdown)
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .is_some_and(|v| v["vms"].to_string().contains("\"shut\""))
    };
    assert!(listed(), "hibernate-all did not record it");
    env.assert_clean("shut");

    // The operator restores it by hand, then hibernates it by hand: it
    // must stay down until started, not be started at the next boot.
    let mut g2 = spawn_logged(env.launch_cmd("shut"), env.path("shut.2.log"));
    let r = env.vmwarden(&["wait-ready", "shut", "--timeout", "120"]);
    assert!(r.status.success(), "{}\n{}", text(&r), g2.log_text());
    let h = env.vmwarden(&["hibernate", "shut", "--timeout", "120"]);
    assert!(h.status.success(), "{}", text(&h));
    assert!(g2.wait_exit(Duration::from_secs(15)).is_some());
    assert!(
        !listed(),
        "the next boot's start-hibernated would start a VM hibernated by hand"
    );
    assert!(record(&env, "shut").exists());
    env.assert_clean("shut");
}

/// The VMs `vmwarden hibernate-all` put down, as root's record names them.
fn at_shutdown_vms(env: &Env) -> Value {
    let b = std::fs::read(env.state.join(".hibernated-at-shutdown.json")).unwrap();
    serde_json::from_slice::<Value>(&b).unwrap()["vms"].clone()
}

fn write_at_shutdown(env: &Env, bytes: &[u8]) {
    std::fs::write(env.state.join(".hibernated-at-shutdown.json"), bytes).unwrap();
}

/// The host's shutdown puts a VM down and its snapshot no longer matches
/// (`on_mismatch = "cold-boot"`): the cold boot discards the snapshot and
/// takes the VM off the at-shutdown record (another VM's name stays), or
/// a later hibernation by hand would have the next boot start it. A
/// record it cannot update refuses the start, naming the record.
#[test]
fn a_cold_boot_that_discards_the_snapshot_takes_the_vm_off_the_at_shutdown_record() {
    require_root();
    let env = Env::new();
    let mut s = spec(&env, "cold", 48);
    s["hibernate"]["on_mismatch"] = json!("cold-boot");
    env.write_spec("cold", &s);
    let memory = s["memory_mib"].clone();
    let at_shutdown = env.state.join(".hibernated-at-shutdown.json");

    // The host's shutdown puts it down; the record names another VM too.
    let (mut g, _) = boot(&env, "cold", "cold.1.log");
    let all = env.vmwarden(&["hibernate-all", "--timeout", "120"]);
    assert!(all.status.success(), "{}", text(&all));
    assert!(g.wait_exit(Duration::from_secs(15)).is_some());
    env.assert_clean("cold");
    assert_eq!(at_shutdown_vms(&env), json!(["cold"]));
    write_at_shutdown(&env, br#"{"vms": ["cold", "other"]}"#);
    // The spec changed since: a cold boot, the snapshot discarded.
    s["memory_mib"] = json!(320);
    env.write_spec("cold", &s);
    let mut g2 = spawn_logged(env.launch_cmd("cold"), env.path("cold.2.log"));
    g2.wait_for("VMWARDEN-GUEST-READY", BOOT);
    assert!(g2.log_text().contains("booting cold"), "{}", g2.log_text());
    assert!(!snap(&env, "cold").exists() && !record(&env, "cold").exists());
    assert_eq!(
        at_shutdown_vms(&env),
        json!(["other"]),
        "the cold boot discarded the snapshot but the next boot would still start the VM"
    );
    g2.kill();
    env.assert_clean("cold");

    // A record that cannot be parsed: the stale snapshot goes, and the
    // start is refused naming the record, which is left as it was.
    let (mut g, _) = boot(&env, "cold", "cold.3.log");
    let h = env.vmwarden(&["hibernate", "cold", "--timeout", "120"]);
    assert!(h.status.success(), "{}", text(&h));
    assert!(g.wait_exit(Duration::from_secs(15)).is_some());
    env.assert_clean("cold");
    write_at_shutdown(&env, b"not json\n");
    s["memory_mib"] = memory;
    env.write_spec("cold", &s);
    // (Bounded: a start that is not refused boots and runs on.)
    let out = bounded(&mut env.launch_cmd("cold"), BOOT)
        .expect("the start was not refused: the guest booted and ran");
    assert!(!out.status.success(), "{}", text(&out));
    let e = stderr(&out);
    assert!(
        e.contains(&at_shutdown.display().to_string()) && e.contains("cannot be parsed"),
        "the refusal does not name the record and why:\n{e}"
    );
    assert!(!snap(&env, "cold").exists() && !record(&env, "cold").exists());
    assert!(!env.run.join("cold/instance.json").exists());
    assert_eq!(std::fs::read(&at_shutdown).unwrap(), b"not json\n");
    // As the refusal says: the next start, with nothing to discard, boots.
    let mut g4 = spawn_logged(env.launch_cmd("cold"), env.path("cold.4.log"));
    g4.wait_for("VMWARDEN-GUEST-READY", BOOT);
    g4.kill();
    env.assert_clean("cold");
}

/// `purge` deletes the snapshot the host's shutdown made and takes the VM
/// off the at-shutdown record (another VM's name stays). A record it
/// cannot update fails the purge, naming the record, and retires
/// nothing; the purge run again takes the name off.
#[test]
fn purge_of_the_snapshot_the_shutdown_made_takes_the_vm_off_the_at_shutdown_record() {
    require_root();
    let env = Env::new();
    spec(&env, "gone", 49);
    let at_shutdown = env.state.join(".hibernated-at-shutdown.json");
    let (mut g, _) = boot(&env, "gone", "gone.1.log");
    let all = env.vmwarden(&["hibernate-all", "--timeout", "120"]);
    assert!(all.status.success(), "{}", text(&all));
    assert!(g.wait_exit(Duration::from_secs(15)).is_some());
    env.assert_clean("gone");
    assert_eq!(at_shutdown_vms(&env), json!(["gone"]));
    assert!(snap(&env, "gone").is_dir() && record(&env, "gone").is_file());
    write_at_shutdown(&env, br#"{"vms": ["other", "gone"]}"#);
    let (ok, out) = purge_on_pty(&env, &["gone", "--keep-identity"], CONFIRM_PHRASE);
    assert!(ok, "purge: {out}");
    assert!(!snap(&env, "gone").exists() && !record(&env, "gone").exists());
    assert_eq!(
        at_shutdown_vms(&env),
        json!(["other"]),
        "purge deleted the snapshot but the next boot would still start the VM"
    );

    // Put down again; a record that cannot be parsed fails the purge.
    let (mut g, _) = boot(&env, "gone", "gone.2.log");
    let all = env.vmwarden(&["hibernate-all", "--timeout", "120"]);
    assert!(all.status.success(), "{}", text(&all));
    assert!(g.wait_exit(Duration::from_secs(15)).is_some());
    env.assert_clean("gone");
    assert_eq!(at_shutdown_vms(&env), json!(["other", "gone"]));
    write_at_shutdown(&env, b"not json\n");
    let (ok, out) = purge_on_pty(&env, &["gone"], CONFIRM_PHRASE);
    assert!(!ok, "purge succeeded with the record not updated: {out}");
    assert!(
        out.contains(&at_shutdown.display().to_string())
            && out.contains("cannot be parsed")
            && out.contains("NOT RETIRED"),
        "the purge does not name the record and why, or retired the principal: {out}"
    );
    assert!(!snap(&env, "gone").exists() && !record(&env, "gone").exists());
    // Run again with the record readable: the name goes, the rest too.
    write_at_shutdown(&env, br#"{"vms": ["other", "gone"]}"#);
    let (ok, out) = purge_on_pty(&env, &["gone"], CONFIRM_PHRASE);
    assert!(ok, "purge: {out}");
    assert_eq!(at_shutdown_vms(&env), json!(["other"]));
    let v = env.verify_clean(&["gone"]);
    assert!(v.status.success(), "{}", text(&v));
}

/// What the principal may make in its own state dir: `path` made by root,
/// then handed to `uid` without following a symlink.
fn as_principal(path: &std::path::Path, uid: u32) {
    std::os::unix::fs::lchown(path, Some(uid), Some(uid)).unwrap();
}

#[test]
fn links_the_principal_plants_for_the_snapshot_never_reach_beyond_its_state_dir() {
    require_root();
    let env = Env::new();
    spec(&env, "plant", 46);
    let victim = env.path("victim");
    std::fs::create_dir(&victim).unwrap();
    std::fs::write(victim.join("secret"), b"root's").unwrap();
    let intact = || {
        assert_eq!(std::fs::read(victim.join("secret")).unwrap(), b"root's");
    };
    let (mut g, _) = boot(&env, "plant", "plant.1.log");
    let p = uid(46);

    // A "previous snapshot" the principal planted: a directory of links
    // to root's files, and a link to root's directory inside it. The
    // capture replaces it, deleting the links, never their targets.
    let fake = snap(&env, "plant");
    std::fs::create_dir(&fake).unwrap();
    std::os::unix::fs::symlink(victim.join("secret"), fake.join("memory")).unwrap();
    std::os::unix::fs::symlink(&victim, fake.join("sub")).unwrap();
    for x in [fake.join("memory"), fake.join("sub"), fake.clone()] {
        as_principal(&x, p);
    }
    let h = env.vmwarden(&["hibernate", "plant", "--timeout", "120"]);
    assert!(h.status.success(), "{}", text(&h));
    assert!(g.wait_exit(Duration::from_secs(15)).is_some());
    intact();
    let m = std::fs::symlink_metadata(snap(&env, "plant").join("memory")).unwrap();
    assert!(m.is_file(), "the planted link is the snapshot");

    // Restored; then a "capture in progress" the principal planted: a
    // link to root's directory. hibernate refuses, the stop's cleanup
    // deletes the link, not what it points to.
    let mut g2 = spawn_logged(env.launch_cmd("plant"), env.path("plant.2.log"));
    let r = env.vmwarden(&["wait-ready", "plant", "--timeout", "120"]);
    assert!(r.status.success(), "{}\n{}", text(&r), g2.log_text());
    std::os::unix::fs::symlink(&victim, partial(&env, "plant")).unwrap();
    as_principal(&partial(&env, "plant"), p);
    let h = env.vmwarden(&["hibernate", "plant", "--timeout", "120"]);
    assert!(!h.status.success(), "{}", text(&h));
    assert!(stderr(&h).contains("exists"), "{}", text(&h));
    intact();
    let st = env.vmwarden(&["stop", "plant", "--timeout", "30"]);
    assert!(st.status.success(), "{}", text(&st));
    g2.wait_exit(Duration::from_secs(15));
    env.assert_clean("plant");
    intact();
    std::fs::symlink_metadata(partial(&env, "plant")).unwrap_err();
}

/// A cold boot's discard that cannot delete all of the stale snapshot
/// refuses the start and keeps the VM on the at-shutdown record (root's
/// record of the snapshot is gone first). The cleanup after a later
/// instance deletes the rest: only once it is gone does it take the VM
/// off (a deletion that fails keeps the name), or a later hibernation by
/// hand would have the next boot start it.
#[test]
fn the_cleanup_that_finishes_a_half_done_discard_takes_the_vm_off_the_at_shutdown_record() {
    require_root();
    require_fault_injection();
    let env = Env::new();
    let mut s = spec(&env, "half", 93);
    s["hibernate"]["on_mismatch"] = json!("cold-boot");
    env.write_spec("half", &s);
    let (mut g, _) = boot(&env, "half", "half.1.log");
    let all = env.vmwarden(&["hibernate-all", "--timeout", "120"]);
    assert!(all.status.success(), "{}", text(&all));
    assert!(g.wait_exit(Duration::from_secs(15)).is_some());
    env.assert_clean("half");
    write_at_shutdown(&env, br#"{"vms": ["half", "other"]}"#);

    // One file of the snapshot cannot be deleted (immutable): the cold
    // boot's discard stops half way, and the start is refused.
    let stuck = snap(&env, "half").join("memory");
    let chattr = |flag: &str| {
        std::process::Command::new("chattr")
            .arg(flag)
            .arg(&stuck)
            .status()
            .unwrap()
            .success()
    };
    assert!(
        chattr("+i"),
        "chattr +i (needs ext2/3/4 under the test base)"
    );
    s["memory_mib"] = json!(320);
    env.write_spec("half", &s);
    let out = bounded(&mut env.launch_cmd("half"), BOOT);
    assert!(chattr("-i"));
    let out = out.expect("the start was not refused: the guest booted and ran");
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        stderr(&out).contains("could not be discarded"),
        "{}",
        text(&out)
    );
    assert!(snap(&env, "half").is_dir() && !record(&env, "half").exists());
    assert_eq!(at_shutdown_vms(&env), json!(["half", "other"]));

    // The next start boots cold (nothing recorded to restore or discard);
    // the cleanup after it deletes the rest. A deletion that fails
    // (reported done, found still there) keeps the name: the name goes
    // after the snapshot, never before.
    let mut g2 = spawn_logged(env.launch_cmd("half"), env.path("half.2.log"));
    g2.wait_for("VMWARDEN-GUEST-READY", BOOT);
    g2.kill();
    let c = env
        .cleanup_cmd()
        .arg("half")
        .env("VMWARDEN_TEST_SKIP_DELETE", ".vmwarden-hibernate")
        .output()
        .unwrap();
    assert!(!c.status.success(), "{}", text(&c));
    assert!(snap(&env, "half").is_dir());
    assert_eq!(
        at_shutdown_vms(&env),
        json!(["half", "other"]),
        "the VM was taken off the record though its snapshot is still there: {}",
        text(&c)
    );

    // Once more, the deletion done: the name goes, the other VM's stays.
    let mut g3 = spawn_logged(env.launch_cmd("half"), env.path("half.3.log"));
    g3.wait_for("VMWARDEN-GUEST-READY", BOOT);
    g3.kill();
    env.assert_clean("half");
    assert!(!snap(&env, "half").exists());
    assert_eq!(
        at_shutdown_vms(&env),
        json!(["other"]),
        "the cleanup finished deleting the snapshot but the next boot would still start the VM"
    );
}

/// The at-shutdown record's lock (`STATE_ROOT/.hibernated-at-shutdown.lock`)
/// held by another process: `start-hibernated` waits a bounded time, then
/// fails naming the lock and its holder, the record left as it was. A
/// link planted there is refused, its target untouched.
#[test]
fn start_hibernated_with_the_record_lock_held_or_planted_fails_naming_it() {
    use std::os::unix::fs::OpenOptionsExt;
    require_root();
    let env = Env::new();
    std::fs::create_dir_all(&env.state).unwrap();
    write_at_shutdown(&env, br#"{"vms": ["x"]}"#);
    let lock = env.state.join(".hibernated-at-shutdown.lock");
    // As vmwarden makes it (root's 0600), held by this process.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .mode(0o600)
        .truncate(false)
        .open(&lock)
        .unwrap();
    let held = nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive).unwrap();
    let out = bounded(
        env.vmwarden_cmd().arg("start-hibernated"),
        Duration::from_secs(120),
    )
    .expect("start-hibernated waited for the held lock without bound");
    drop(held);
    assert!(!out.status.success(), "{}", text(&out));
    let e = stderr(&out);
    assert!(
        e.contains(&lock.display().to_string())
            && e.contains("still held")
            && e.contains(&format!("pid {}", std::process::id())),
        "the error does not name the lock and its holder:\n{e}"
    );
    assert_eq!(at_shutdown_vms(&env), json!(["x"]));

    // A symlink planted as the lock: refused, its target not made.
    std::fs::remove_file(&lock).unwrap();
    let target = env.path("planted-target");
    std::os::unix::fs::symlink(&target, &lock).unwrap();
    let out = bounded(
        env.vmwarden_cmd().arg("start-hibernated"),
        Duration::from_secs(120),
    )
    .unwrap();
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        stderr(&out).contains(&lock.display().to_string()),
        "{}",
        text(&out)
    );
    assert!(
        !target.exists(),
        "the lock was made through the planted link"
    );
    assert_eq!(at_shutdown_vms(&env), json!(["x"]));
}

/// The at-shutdown record's lock held by another process for good:
/// `hibernate-all` puts the VM down, then fails within a bound naming the
/// lock and its holder (the VM not named, so the next boot does not start
/// it: its own start restores it); a cold boot whose discard must take
/// the VM off the record is refused likewise, the stale snapshot gone.
#[test]
fn hibernate_all_and_a_discard_with_the_record_lock_held_fail_naming_its_holder() {
    use std::os::unix::fs::OpenOptionsExt;
    require_root();
    let env = Env::new();
    let mut s = spec(&env, "held", 94);
    s["hibernate"]["on_mismatch"] = json!("cold-boot");
    env.write_spec("held", &s);
    let lock = env.state.join(".hibernated-at-shutdown.lock");
    let (mut g, _) = boot(&env, "held", "held.1.log");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&lock)
        .unwrap();
    let held = nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive).unwrap();
    let holder = format!("pid {}", std::process::id());
    let names_it = |e: &str| e.contains(&lock.display().to_string()) && e.contains(&holder);

    let all = bounded(
        env.vmwarden_cmd()
            .args(["hibernate-all", "--timeout", "120"]),
        Duration::from_secs(300),
    )
    .expect("hibernate-all waited for the held lock without bound");
    assert!(!all.status.success(), "{}", text(&all));
    // Put down, and reported not recorded (naming the lock's holder).
    let out = String::from_utf8_lossy(&all.stdout);
    assert!(
        out.contains("held: hibernated") && out.contains("NOT recorded") && names_it(&out),
        "{}",
        text(&all)
    );
    assert!(g.wait_exit(Duration::from_secs(15)).is_some());
    env.assert_clean("held");
    assert!(snap(&env, "held").is_dir() && record(&env, "held").exists());
    assert!(!env.state.join(".hibernated-at-shutdown.json").exists());

    // The record names it (as a shutdown would have); the spec changed:
    // the discard deletes the snapshot, and the start is refused naming
    // the lock's holder instead of hanging.
    write_at_shutdown(&env, br#"{"vms": ["held"]}"#);
    s["memory_mib"] = json!(320);
    env.write_spec("held", &s);
    let out = bounded(&mut env.launch_cmd("held"), BOOT)
        .expect("the start waited for the held lock without bound, or booted");
    drop(held);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(names_it(&stderr(&out)), "{}", text(&out));
    assert!(!snap(&env, "held").exists() && !record(&env, "held").exists());
    assert_eq!(at_shutdown_vms(&env), json!(["held"]));
    env.assert_clean("held");
}

/// The at-shutdown record refuses every VM (its lock planted: a symlink,
/// refused by name): `hibernate-all` still puts each VM down, one after
/// the other, reports each hibernated but not recorded (naming the lock)
/// and exits non-zero. With `add`'s failure fatal it stopped after the
/// first VM, the second left running. Nothing recorded: the next boot's
/// `start-hibernated` starts neither; a start of its unit restores it
/// from its snapshot.
#[test]
fn hibernate_all_goes_on_past_a_vm_it_cannot_record() {
    require_root();
    let env = Env::new();
    spec(&env, "nra", 95);
    spec(&env, "nrb", 96);
    let (mut ga, (_, marker)) = boot(&env, "nra", "nra.1.log");
    let (mut gb, _) = boot(&env, "nrb", "nrb.1.log");
    let lock = env.state.join(".hibernated-at-shutdown.lock");
    let target = env.path("planted-target");
    std::os::unix::fs::symlink(&target, &lock).unwrap();

    let all = bounded(
        env.vmwarden_cmd()
            .args(["hibernate-all", "--timeout", "120"]),
        Duration::from_secs(300),
    )
    .expect("hibernate-all did not end");
    assert!(!all.status.success(), "{}", text(&all));
    let out = String::from_utf8_lossy(&all.stdout);
    for vm in ["nra", "nrb"] {
        assert!(
            out.lines()
                .any(|l| l.starts_with(&format!("{vm}: hibernated"))
                    && l.contains("NOT recorded")
                    && l.contains(&lock.display().to_string())),
            "{vm} not reported hibernated and not recorded: {}",
            text(&all)
        );
        assert!(
            snap(&env, vm).is_dir() && record(&env, vm).exists(),
            "{vm}'s snapshot: {}",
            text(&all)
        );
    }
    assert!(ga.wait_exit(Duration::from_secs(15)).is_some());
    assert!(gb.wait_exit(Duration::from_secs(15)).is_some());
    env.assert_clean("nra");
    env.assert_clean("nrb");
    assert!(!env.state.join(".hibernated-at-shutdown.json").exists());
    assert!(
        !target.exists(),
        "the lock was made through the planted link"
    );

    // Its own start restores it (the guest's marker is the one it had).
    std::fs::remove_file(&lock).unwrap();
    let mut g2 = spawn_logged(env.launch_cmd("nra"), env.path("nra.2.log"));
    let r = env.vmwarden(&["wait-ready", "nra", "--timeout", "120"]);
    assert!(r.status.success(), "{}\n{}", text(&r), g2.log_text());
    let (_, marker2) = tick_after(&mut g2, 0, Duration::from_secs(30));
    assert_eq!(marker2, marker, "not restored: {}", g2.log_text());
    assert!(!snap(&env, "nra").exists() && !record(&env, "nra").exists());
    let st = env.vmwarden(&["stop", "nra", "--timeout", "30"]);
    assert!(st.status.success(), "{}", text(&st));
    assert!(g2.wait_exit(Duration::from_secs(15)).is_some());
    env.assert_clean("nra");
}

/// The at-shutdown record's lock held for good by another process (a
/// stuck holder, here the test): `hibernate-all` waits for it once, for
/// its whole bound, at the first VM it puts down; the VMs after it try it
/// once without waiting again. Both are still put down and reported not
/// recorded, naming the holder. Each VM waiting its own 30 s held the
/// host's shutdown N × 30 s (the unit's stop has no timeout) while the
/// VMs not yet reached kept running. Counted by the wait's log line, not
/// by the clock.
#[test]
fn hibernate_all_waits_for_a_held_record_lock_once_not_once_per_vm() {
    use std::os::unix::fs::OpenOptionsExt;
    require_root();
    let env = Env::new();
    spec(&env, "hwa", 97);
    spec(&env, "hwb", 98);
    let (mut ga, _) = boot(&env, "hwa", "hwa.1.log");
    let (mut gb, _) = boot(&env, "hwb", "hwb.1.log");
    let lock = env.state.join(".hibernated-at-shutdown.lock");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&lock)
        .unwrap();
    let held = nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive).unwrap();
    let holder = format!("pid {}", std::process::id());

    let all = bounded(
        env.vmwarden_cmd()
            .args(["hibernate-all", "--timeout", "120"]),
        Duration::from_secs(300),
    )
    .expect("hibernate-all did not end");
    drop(held);
    assert!(!all.status.success(), "{}", text(&all));
    let out = String::from_utf8_lossy(&all.stdout);
    for vm in ["hwa", "hwb"] {
        assert!(
            out.lines()
                .any(|l| l.starts_with(&format!("{vm}: hibernated"))
                    && l.contains("NOT recorded")
                    && l.contains(&lock.display().to_string())
                    && l.contains(&holder)),
            "{vm} not reported hibernated and not recorded naming the holder: {}",
            text(&all)
        );
        assert!(snap(&env, vm).is_dir() && record(&env, vm).exists());
    }
    let waits = stderr(&all)
        .matches("waiting for a lock another process holds")
        .count();
    assert_eq!(
        waits,
        1,
        "hibernate-all waited on the held record lock once per VM: {}",
        text(&all)
    );
    assert!(ga.wait_exit(Duration::from_secs(15)).is_some());
    assert!(gb.wait_exit(Duration::from_secs(15)).is_some());
    env.assert_clean("hwa");
    env.assert_clean("hwb");
    assert!(!env.state.join(".hibernated-at-shutdown.json").exists());
}
