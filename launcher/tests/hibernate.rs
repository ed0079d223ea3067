//! Hibernate and restore with a real QEMU guest (TCG): `vmwarden
//! hibernate` writes the snapshot as the principal, the next start
//! restores the very guest (its uptime and an in-memory marker go on) in
//! the full sandbox and consumes the snapshot; a changed spec refuses by
//! name; a failed capture resumes the guest; a kill at every capture kill
//! point leaves nothing cleanup does not take; purge takes the snapshot.
//! Needs root.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::Duration;

use common::hibernate::*;
use common::*;
use serde_json::{json, Value};
use vmwarden::control::hibernate::KILL_POINTS;
use vmwarden::host::mountinfo;
use vmwarden::hypervisor::hibernate::SLOW;
use vmwarden::hypervisor::qmp::Qmp;
use vmwarden::teardown::purge::CONFIRM_PHRASE;

const CAPTURE: &str = "120";

fn hibernate(env: &Env, name: &str) -> std::process::Output {
    env.vmwarden(&["hibernate", name, "--timeout", CAPTURE])
}

#[test]
fn hibernate_then_start_restores_the_guest_in_its_sandbox_and_consumes_the_snapshot() {
    require_root();
    let env = Env::new();
    spec(&env, "hib", 31);
    let (mut g, (up1, marker)) = boot(&env, "hib", "hib.1.log");
    let h = hibernate(&env, "hib");
    assert!(h.status.success(), "hibernate: {}", text(&h));
    assert!(
        g.wait_exit(Duration::from_secs(15)).is_some(),
        "QEMU still runs after hibernate"
    );

    // The snapshot: the principal's 0700 directory, its file the
    // principal's 0600 (written by QEMU, never root); root's record 0600.
    let d = std::fs::symlink_metadata(snap(&env, "hib")).unwrap();
    assert!(d.is_dir());
    assert_eq!((d.uid(), d.mode() & 0o7777), (uid(31), 0o700));
    let m = std::fs::symlink_metadata(snap(&env, "hib").join("memory")).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o7777), (uid(31), 0o600));
    assert!(m.len() > 1024 * 1024, "memory is {} bytes", m.len());
    let r = std::fs::symlink_metadata(record(&env, "hib")).unwrap();
    assert_eq!((r.uid(), r.mode() & 0o7777), (0, 0o600));
    assert!(!partial(&env, "hib").exists());

    // status says hibernated, with size and age.
    let st = env.vmwarden(&["status", "hib", "--json"]);
    let v: Value = serde_json::from_slice(&st.stdout).unwrap();
    let v = if v.is_array() { v[0].clone() } else { v };
    assert_eq!(v["state"], "hibernated", "{v}");
    assert_eq!(v["hibernated"]["bytes"], json!(m.len()), "{v}");
    let table = env.vmwarden(&["status", "hib"]);
    assert!(
        String::from_utf8_lossy(&table.stdout).contains("hibernated:"),
        "{}",
        text(&table)
    );
    // Cleanup (the unit's ExecStopPost) keeps the complete snapshot.
    let rep = env.assert_clean("hib");
    assert!(
        rep["kept"].to_string().contains(".vmwarden-hibernate"),
        "{rep}"
    );
    assert!(snap(&env, "hib").is_dir());

    // The next start restores: no boot (no READY), the same marker, the
    // uptime going on from where it was.
    let mut g2 = spawn_logged(env.launch_cmd("hib"), env.path("hib.2.log"));
    // wait-ready (the unit's ExecStartPost) runs the loaded guest and
    // consumes the snapshot.
    let r = env.vmwarden(&["wait-ready", "hib", "--timeout", "120"]);
    assert!(r.status.success(), "{}\n{}", text(&r), g2.log_text());
    let (up2, marker2) = tick_after(&mut g2, 0, Duration::from_secs(30));
    assert_eq!(marker2, marker, "the in-memory marker did not survive");
    assert!(up2 >= up1, "uptime went back: {up1} then {up2}");
    assert!(
        !g2.log_text().contains("VMWARDEN-GUEST-READY"),
        "the guest booted instead of resuming:\n{}",
        g2.log_text()
    );
    // The restore consumed the snapshot and its record.
    assert!(!snap(&env, "hib").exists(), "snapshot left after restore");
    assert!(!record(&env, "hib").exists(), "record left after restore");

    // In the same sandbox as a booted guest.
    let pid = g2.pid();
    assert_eq!(
        proc_status(pid, "Uid"),
        format!("{0}\t{0}\t{0}\t{0}", uid(31))
    );
    for set in ["CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(proc_status(pid, set), "0000000000000000", "{set}");
    }
    assert_eq!(proc_status(pid, "NoNewPrivs"), "1");
    assert_eq!(proc_status(pid, "Seccomp"), "2");
    assert!(seccomp_filters(pid) >= 2);
    let vm_mounts = mountinfo::read(&pid.to_string()).unwrap();
    let creds = vm_mounts
        .iter()
        .find(|m| m.mount_point == env.run.join("hib/credentials"))
        .expect("the credential tmpfs, rebuilt at restore");
    assert!(creds.has_option("noswap"));
    assert_ne!(
        std::fs::read_link(format!("/proc/{pid}/ns/mnt")).unwrap(),
        std::fs::read_link("/proc/self/ns/mnt").unwrap()
    );
    // The guest goes on ticking.
    let len = g2.log_text().len();
    let (up3, _) = tick_after(&mut g2, len, Duration::from_secs(30));
    assert!(up3 > up2);

    let s = env.vmwarden(&["stop", "hib", "--timeout", "30"]);
    assert!(s.status.success(), "{}", text(&s));
    g2.wait_exit(Duration::from_secs(15));
    env.assert_clean("hib");
    // Consumed: the next start boots.
    let mut g3 = spawn_logged(env.launch_cmd("hib"), env.path("hib.3.log"));
    g3.wait_for("VMWARDEN-GUEST-READY", BOOT);
    g3.kill();
    env.assert_clean("hib");
}

#[test]
fn a_changed_spec_refuses_the_restore_by_name_and_purge_takes_the_snapshot() {
    require_root();
    let env = Env::new();
    let mut s = spec(&env, "chg", 32);
    let (mut g, _) = boot(&env, "chg", "chg.1.log");
    let h = hibernate(&env, "chg");
    assert!(h.status.success(), "hibernate: {}", text(&h));
    g.wait_exit(Duration::from_secs(15));
    env.assert_clean("chg");

    // The spec changed since the capture: refused, exit 78, by name, the
    // snapshot kept and nothing made.
    let memory = s["memory_mib"].clone();
    s["memory_mib"] = json!(320);
    env.write_spec("chg", &s);
    let out = env.launch_cmd("chg").output().unwrap();
    assert_eq!(out.status.code(), Some(78), "{}", text(&out));
    let e = stderr(&out);
    assert!(
        e.contains("does not match") && e.contains("spec:") && e.contains("hibernate.on_mismatch"),
        "{e}"
    );
    assert!(snap(&env, "chg").is_dir() && record(&env, "chg").is_file());
    assert!(!env.run.join("chg/instance.json").exists());

    // purge deletes it (state dir minus the keep set) and its record;
    // verify-clean is clean.
    let (ok, out) = purge_on_pty(&env, &["chg"], CONFIRM_PHRASE);
    assert!(ok, "purge: {out}");
    assert!(!snap(&env, "chg").exists(), "purge left the snapshot");
    assert!(!record(&env, "chg").exists(), "purge left the record");
    let v = env.verify_clean(&["chg"]);
    assert!(v.status.success(), "{}", text(&v));

    // on_mismatch = cold-boot: booted cold, logged, and the snapshot
    // discarded (record first, then the files): the guest now runs from
    // its disks, so its RAM image is stale for good.
    s["memory_mib"] = memory.clone();
    s["hibernate"]["on_mismatch"] = json!("cold-boot");
    env.write_spec("chg", &s);
    let (mut g, _) = boot(&env, "chg", "chg.2.log");
    let h = hibernate(&env, "chg");
    assert!(h.status.success(), "hibernate: {}", text(&h));
    g.wait_exit(Duration::from_secs(15));
    env.assert_clean("chg");
    s["memory_mib"] = json!(320);
    env.write_spec("chg", &s);
    let mut g2 = spawn_logged(env.launch_cmd("chg"), env.path("chg.3.log"));
    g2.wait_for("VMWARDEN-GUEST-READY", BOOT);
    assert!(g2.log_text().contains("booting cold"), "{}", g2.log_text());
    assert!(
        !snap(&env, "chg").exists() && !record(&env, "chg").exists(),
        "the cold boot kept the stale snapshot"
    );
    g2.kill();
    env.assert_clean("chg");
    // The difference put back, the next start boots: a kept snapshot
    // would restore RAM over disks the cold-booted guest has changed.
    s["memory_mib"] = memory.clone();
    env.write_spec("chg", &s);
    let mut g3 = spawn_logged(env.launch_cmd("chg"), env.path("chg.4.log"));
    g3.wait_for("VMWARDEN-GUEST-READY", BOOT);
    g3.kill();
    env.assert_clean("chg");
    let v = env.verify_clean(&["chg"]);
    assert!(v.status.success(), "{}", text(&v));
}

/// A start decides whether to restore before it holds the VM's lease: a
/// start that stalls there (here: stopped) while another instance runs,
/// hibernates and lets the lease go must go by the capture recorded
/// meanwhile, and restore it. Booting cold beside it would leave a
/// snapshot whose RAM no longer matches the disks the guest then ran from,
/// for the next start to restore. (The other way round, a start that
/// decided to restore a snapshot another instance has since restored,
/// consumed and run past would restore stale RAM over those disks.)
#[test]
fn a_snapshot_recorded_while_a_start_waited_for_the_lease_is_restored_not_left_stale() {
    require_root();
    let env = Env::new();
    spec(&env, "late", 36);
    // A start, stopped right after its decision (no snapshot yet: boot).
    let mut c = env.launch_cmd("late");
    c.env("VMWARDEN_FAULT_AFTER", "stop:restore-checked");
    let mut g2 = spawn_logged(c, env.path("late.2.log"));
    let pid = g2.pid();
    let stopped = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.starts_with('T')))
            .unwrap_or(false)
    };
    let end = std::time::Instant::now() + BOOT;
    while !stopped() {
        assert!(
            std::time::Instant::now() < end && g2.child.try_wait().unwrap().is_none(),
            "the start did not stop after restore-checked:\n{}",
            g2.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Meanwhile another start runs the VM, which hibernates.
    let (mut g, (_, marker)) = boot(&env, "late", "late.1.log");
    let h = hibernate(&env, "late");
    assert!(h.status.success(), "hibernate: {}", text(&h));
    g.wait_exit(Duration::from_secs(15));
    env.assert_clean("late");
    assert!(snap(&env, "late").is_dir() && record(&env, "late").is_file());
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap()),
        nix::sys::signal::Signal::SIGCONT,
    )
    .unwrap();
    let r = env.vmwarden(&["wait-ready", "late", "--timeout", "120"]);
    assert!(r.status.success(), "{}\n{}", text(&r), g2.log_text());
    let (_, marker2) = tick_after(&mut g2, 0, Duration::from_secs(30));
    assert_eq!(
        marker2,
        marker,
        "the start booted cold beside the snapshot recorded while it waited for the lease (snapshot there: {}, record there: {}):\n{}",
        snap(&env, "late").exists(),
        record(&env, "late").exists(),
        g2.log_text()
    );
    assert!(!snap(&env, "late").exists() && !record(&env, "late").exists());
    let s = env.vmwarden(&["stop", "late", "--timeout", "30"]);
    assert!(s.status.success(), "{}", text(&s));
    g2.wait_exit(Duration::from_secs(15));
    env.assert_clean("late");
}

/// A cold boot that cannot discard the stale snapshot refuses the start,
/// naming what is left and why (here a file system mounted inside it:
/// deletion never descends into another file system); root's record is
/// gone first, so no start restores what is left of it.
#[test]
fn a_cold_boot_that_cannot_discard_the_snapshot_refuses_naming_what_is_left_and_why() {
    require_root();
    let env = Env::new();
    let mut s = spec(&env, "left", 47);
    s["hibernate"]["on_mismatch"] = json!("cold-boot");
    env.write_spec("left", &s);
    let (mut g, _) = boot(&env, "left", "left.1.log");
    let h = hibernate(&env, "left");
    assert!(h.status.success(), "hibernate: {}", text(&h));
    g.wait_exit(Duration::from_secs(15));
    env.assert_clean("left");
    let held = snap(&env, "left").join("held");
    std::fs::create_dir(&held).unwrap();
    std::os::unix::fs::chown(&held, Some(uid(47)), Some(uid(47))).unwrap();
    nix::mount::mount(
        Some("vmwarden-test-held"),
        &held,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("size=1m"),
    )
    .unwrap();
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
        }
    }
    let u = Unmount(held.clone());
    s["memory_mib"] = json!(320);
    env.write_spec("left", &s);
    let out = env.launch_cmd("left").output().unwrap();
    assert!(!out.status.success(), "{}", text(&out));
    let e = stderr(&out);
    assert!(
        e.contains(&held.display().to_string()) && e.contains("mount point"),
        "the refusal names neither what is left nor why:\n{e}"
    );
    assert!(
        !record(&env, "left").exists(),
        "the record outlived a partial discard"
    );
    assert!(!env.run.join("left/instance.json").exists());
    drop(u);
    // Nothing in the way: the next start boots cold, and its cleanup
    // deletes what was left (no record: no start would restore it).
    let mut g2 = spawn_logged(env.launch_cmd("left"), env.path("left.2.log"));
    g2.wait_for("VMWARDEN-GUEST-READY", BOOT);
    g2.kill();
    env.assert_clean("left");
    assert!(
        !snap(&env, "left").exists(),
        "what was left of the snapshot is still there"
    );
    let v = env.verify_clean(&["left"]);
    assert!(v.status.success(), "{}", text(&v));
}

#[test]
fn a_failed_capture_resumes_the_guest_and_keeps_nothing() {
    require_root();
    let env = Env::new();
    spec(&env, "fail", 33);
    // The state dir on a 4 MiB tmpfs of the principal's: QEMU's write of
    // 256 MiB of RAM fails for real (ENOSPC).
    let dir = env.state.join("fail");
    std::fs::create_dir_all(&env.state).unwrap();
    std::fs::create_dir(&dir).unwrap();
    let opts = format!("size=4m,mode=0700,uid={0},gid={0}", uid(33));
    nix::mount::mount(
        Some("vmwarden-test-small"),
        &dir,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some(opts.as_str()),
    )
    .unwrap();
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
        }
    }
    let _u = Unmount(dir.clone());
    let (mut g, (up1, marker)) = boot(&env, "fail", "fail.log");
    let h = hibernate(&env, "fail");
    assert!(!h.status.success(), "hibernate should fail: {}", text(&h));
    let e = stderr(&h);
    assert!(e.contains("capture failed") && e.contains("resumed"), "{e}");
    // Resumed: it ticks on, the same guest.
    let len = g.log_text().len();
    let (up2, marker2) = tick_after(&mut g, len, Duration::from_secs(30));
    assert_eq!(marker2, marker);
    assert!(up2 > up1);
    let mut q = Qmp::connect(
        &env.run.join("fail/control/qmp.sock"),
        Duration::from_secs(5),
    )
    .unwrap();
    assert_eq!(q.status().unwrap(), "running");
    drop(q);
    // Nothing half written is kept, and no record.
    assert!(!partial(&env, "fail").exists());
    assert!(!snap(&env, "fail").exists());
    assert!(!record(&env, "fail").exists());
    let s = env.vmwarden(&["stop", "fail", "--timeout", "30"]);
    assert!(s.status.success(), "{}", text(&s));
    g.wait_exit(Duration::from_secs(15));
    env.assert_clean("fail");
}

#[test]
fn a_capture_past_its_timeout_is_cancelled_and_the_guest_resumed() {
    require_root();
    require_fault_injection();
    let env = Env::new();
    spec(&env, "slow", 99);
    let (mut g, (up1, marker)) = boot(&env, "slow", "slow.log");
    // QEMU's migration capped at 64 KiB/s: 2 s cannot hold the capture of
    // this guest, on any host.
    failed_capture(
        &env,
        "slow",
        "2",
        SLOW,
        "the capture did not complete within 2s",
    );
    // QEMU cancelled its migration and runs the same guest on.
    let len = g.log_text().len();
    let (up2, marker2) = tick_after(&mut g, len, Duration::from_secs(30));
    assert_eq!(marker2, marker);
    assert!(up2 > up1);
    let sock = env.run.join("slow/control/qmp.sock");
    let mut q = Qmp::connect(&sock, Duration::from_secs(5)).unwrap();
    assert_eq!(q.status().unwrap(), "running");
    let m = q.execute("query-migrate", None).unwrap();
    assert_eq!(m["status"], "cancelled", "{m}");
    drop(q);
    assert!(!partial(&env, "slow").exists());
    assert!(!snap(&env, "slow").exists());
    assert!(!record(&env, "slow").exists());
    // A cancelled migration leaves QEMU able to capture again, whole: the
    // next start restores the same guest from it.
    let h = hibernate(&env, "slow");
    assert!(h.status.success(), "{}", text(&h));
    assert!(g.wait_exit(Duration::from_secs(15)).is_some());
    assert!(snap(&env, "slow").is_dir() && record(&env, "slow").exists());
    env.assert_clean("slow");
    let mut g2 = spawn_logged(env.launch_cmd("slow"), env.path("slow.2.log"));
    let r = env.vmwarden(&["wait-ready", "slow", "--timeout", "120"]);
    assert!(r.status.success(), "{}\n{}", text(&r), g2.log_text());
    let (_, marker3) = tick_after(&mut g2, 0, Duration::from_secs(30));
    assert_eq!(marker3, marker);
    assert!(!snap(&env, "slow").exists() && !record(&env, "slow").exists());
    let st = env.vmwarden(&["stop", "slow", "--timeout", "30"]);
    assert!(st.status.success(), "{}", text(&st));
    g2.wait_exit(Duration::from_secs(15));
    env.assert_clean("slow");
}

#[test]
fn a_kill_at_every_capture_kill_point_then_stop_and_cleanup_is_clean() {
    require_root();
    require_fault_injection();
    let env = Env::new();
    spec(&env, "kill", 34);
    for at in KILL_POINTS {
        let (mut g, _) = boot(&env, "kill", &format!("kill.{at}.log"));
        let h = env
            .vmwarden_cmd()
            .args(["hibernate", "kill", "--timeout", CAPTURE])
            .env("VMWARDEN_FAULT_AFTER", format!("hibernate:{at}"))
            .output()
            .unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(h.status.signal(), Some(9), "{at}: {}", text(&h));
        // The operator stops what is left (a paused guest) and the unit's
        // cleanup runs: clean, nothing half written left.
        let s = env.vmwarden(&["stop", "kill", "--timeout", "5"]);
        assert!(s.status.success(), "{at}: {}", text(&s));
        g.wait_exit(Duration::from_secs(15));
        env.assert_clean_after("kill", &format!("hibernate:{at}"));
        assert!(
            !partial(&env, "kill").exists(),
            "{at}: the partial snapshot is left"
        );
        // Only a recorded snapshot is kept (the user's, restorable).
        assert_eq!(
            snap(&env, "kill").exists(),
            record(&env, "kill").exists(),
            "{at}: a snapshot without its record, or a record without it"
        );
        let (ok, out) = purge_on_pty(&env, &["kill", "--keep-identity"], CONFIRM_PHRASE);
        assert!(ok, "{at}: purge: {out}");
        assert!(!snap(&env, "kill").exists() && !record(&env, "kill").exists());
    }
}

#[test]
fn a_kill_after_every_launch_step_of_a_restore_keeps_the_snapshot_and_cleanup_is_clean() {
    require_root();
    require_fault_injection();
    let env = Env::new();
    spec(&env, "rk", 35);
    let (mut g, (up1, marker)) = boot(&env, "rk", "rk.1.log");
    let h = hibernate(&env, "rk");
    assert!(h.status.success(), "hibernate: {}", text(&h));
    g.wait_exit(Duration::from_secs(15));
    env.assert_clean("rk");
    let steps = launch_steps();
    assert!(steps.iter().any(|s| s == "restore-checked"), "{steps:?}");
    for step in &steps {
        env.launch_killed_after("rk", step);
        env.assert_clean_after("rk", step);
        // Only wait-ready consumes it: a killed restore leaves it as it was.
        assert!(
            snap(&env, "rk").is_dir(),
            "after {step}: the snapshot is gone"
        );
        assert!(
            record(&env, "rk").is_file(),
            "after {step}: the record is gone"
        );
        assert!(!partial(&env, "rk").exists());
    }
    // And it still restores the same guest.
    let mut g2 = spawn_logged(env.launch_cmd("rk"), env.path("rk.2.log"));
    let r = env.vmwarden(&["wait-ready", "rk", "--timeout", "120"]);
    assert!(r.status.success(), "{}\n{}", text(&r), g2.log_text());
    let (up2, marker2) = tick_after(&mut g2, 0, Duration::from_secs(30));
    assert_eq!(marker2, marker);
    assert!(up2 >= up1);
    g2.kill();
    env.assert_clean("rk");
}
