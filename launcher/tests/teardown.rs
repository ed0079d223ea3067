//! Teardown with proof: cleanup after a launch killed at every step and
//! after a killed hypervisor, refusals while live or ambiguous, the
//! enumerate-minus-keep rule, re-checked deletions, reap, purge and
//! principal retirement, and repeated start/stop cycles. Needs root and a
//! build with `--features fault-injection`.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use serde_json::json;
use vmwarden::config::paths::Roots;
use vmwarden::host::mountinfo;
use vmwarden::identity::registry::{self, State};
use vmwarden::instance::liveness::control_socket_answers;

const BOOT: Duration = Duration::from_secs(90);

fn spec_with_cred(env: &Env, name: &str, u: u32) {
    let src = env.secret(&format!("{name}.cred"), b"teardown-secret");
    let mut s = env.spec(name, u);
    s["credentials"] = json!([{ "name": "key", "source": { "path": src } }]);
    env.write_spec(name, &s);
}

#[test]
fn kill_at_every_launch_step_then_cleanup_is_clean_and_relaunch_works() {
    require_fault_injection();
    let env = Env::new();
    spec_with_cred(&env, "web", uid(31));
    let steps = launch_steps();
    assert!(steps.len() >= 10, "{steps:?}");
    for step in &steps {
        env.launch_killed_after("web", step);
        env.assert_clean("web");
        // The next normal launch succeeds (probe: same sandbox, no guest boot).
        let ok = env.probe("web", &["/bin/true"]);
        assert!(
            ok.status.success(),
            "relaunch after kill at {step}: {}",
            text(&ok)
        );
        env.assert_clean("web");
    }
}

#[test]
fn cleanup_after_sigkill_of_a_running_hypervisor() {
    let env = Env::new();
    spec_with_cred(&env, "web", uid(32));
    let mut g = env.start("web");
    g.wait_for("VMWARDEN-GUEST-READY", BOOT);
    let live = env.cleanup("web");
    assert!(!live.0.status.success());
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(g.pid()).unwrap()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    g.wait_exit(Duration::from_secs(10))
        .expect("hypervisor gone");
    env.assert_clean("web");
    // And it starts again.
    let mut g = env.start("web");
    g.wait_for("VMWARDEN-GUEST-READY", BOOT);
    g.kill();
    env.assert_clean("web");
}

#[test]
fn unreadable_intent_record_keeps_everything() {
    let env = Env::new();
    spec_with_cred(&env, "web", uid(33));
    assert!(env.probe("web", &["/bin/true"]).status.success());
    let rundir = env.run.join("web");
    std::fs::create_dir(rundir.join("leftover")).unwrap();
    std::fs::write(rundir.join("instance.json"), b"{ not json").unwrap();
    let before = snapshot(&env, &[uid(33)]);
    let (o, rep) = env.cleanup("web");
    assert!(!o.status.success());
    assert_eq!(rep["deleted"], json!([]));
    assert!(
        rep["kept"].to_string().contains("cannot be parsed"),
        "{rep}"
    );
    assert_eq!(before, snapshot(&env, &[uid(33)]));
}

#[test]
fn unknown_entries_go_keep_set_stays_root_keeps_its_mode() {
    let env = Env::new();
    spec_with_cred(&env, "web", uid(34));
    assert!(env.probe("web", &["/bin/true"]).status.success());
    let rundir = env.run.join("web");
    // What a future subsystem might leave: a file, a nested dir, a symlink out.
    std::fs::write(rundir.join("future-subsystem.sock"), b"").unwrap();
    std::fs::create_dir_all(rundir.join("cache/deep/er")).unwrap();
    std::fs::write(rundir.join("cache/deep/er/blob"), b"x").unwrap();
    let outside = env.path("outside-target");
    std::fs::write(&outside, b"must survive").unwrap();
    std::os::unix::fs::symlink(&outside, rundir.join("link-out")).unwrap();
    let (o, rep) = env.cleanup("web");
    assert!(o.status.success(), "{}", text(&o));
    let deleted = rep["deleted"].to_string();
    for n in [
        "future-subsystem.sock",
        "cache",
        "link-out",
        "instance.json",
        "control",
        "credentials",
    ] {
        assert!(deleted.contains(n), "{n} not deleted: {rep}");
    }
    assert!(
        outside.exists(),
        "cleanup followed a symlink out of its root"
    );
    assert!(
        rundir.join("instance.lock").exists(),
        "keep set entry deleted"
    );
    let mut names: Vec<_> = std::fs::read_dir(&rundir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    names.sort();
    // The keep set: the lease file, the last cleanup's record and the
    // credential floor (proven by this cleanup).
    assert_eq!(
        names,
        ["creds-floor.json", "instance.lock", "last-cleanup.json"]
    );
    assert_eq!(std::fs::metadata(&rundir).unwrap().mode() & 0o7777, 0o755);
    // Idempotent.
    env.assert_clean("web");
}

#[test]
fn a_deletion_that_leaves_the_path_is_failed_and_exit_is_nonzero() {
    let env = Env::new();
    spec_with_cred(&env, "web", uid(35));
    assert!(env.probe("web", &["/bin/true"]).status.success());
    let rundir = env.run.join("web");

    // 1. A file under a bind mount: unlink fails with EBUSY.
    let src = env.path("bind-src");
    std::fs::write(&src, b"x").unwrap();
    let target = rundir.join("bound");
    std::fs::write(&target, b"").unwrap();
    nix::mount::mount(
        Some(&src),
        &target,
        None::<&str>,
        nix::mount::MsFlags::MS_BIND,
        None::<&str>,
    )
    .unwrap();
    let (o, rep) = env.cleanup("web");
    assert!(!o.status.success());
    assert!(rep["failed"].to_string().contains("bound"), "{rep}");
    assert_eq!(rep["clean"], false);
    nix::mount::umount2(&target, nix::mount::MntFlags::MNT_DETACH).unwrap();

    // 2. An immutable file: unlink fails with EPERM.
    std::fs::write(rundir.join("immutable"), b"x").unwrap();
    let st = Command::new("chattr")
        .arg("+i")
        .arg(rundir.join("immutable"))
        .status()
        .unwrap();
    assert!(
        st.success(),
        "chattr +i failed (needs ext2/3/4 under the test base)"
    );
    let (o, rep) = env.cleanup("web");
    let _ = Command::new("chattr")
        .arg("-i")
        .arg(rundir.join("immutable"))
        .status();
    assert!(!o.status.success());
    assert!(rep["failed"].to_string().contains("immutable"), "{rep}");

    // 3. A tree nested deeper than any fixed limit (a compromised VM
    //    filling its control dir): removed to its bottom, iteratively (no
    //    stack to overflow, two descriptors at a time), not refused.
    let mut deep = rundir.join("control");
    for i in 0..300 {
        deep = deep.join(format!("d{i}"));
    }
    std::fs::create_dir_all(&deep).unwrap();
    std::fs::write(deep.join("f"), b"x").unwrap();
    let (o, rep) = env.cleanup("web");
    assert!(o.status.success(), "{rep}");
    assert!(!rundir.join("control").exists(), "{rep}");

    // 4. A deletion that reports success but leaves the path (the test
    //    switch skips the unlink and reports it deleted): the verify pass
    //    must move it to failed.
    if cfg!(feature = "fault-injection") {
        std::fs::write(rundir.join("sticky"), b"x").unwrap();
        let mut c = env.cleanup_cmd();
        c.arg("web").env("VMWARDEN_TEST_SKIP_DELETE", "sticky");
        let o = c.output().unwrap();
        let rep: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert!(!o.status.success());
        assert!(
            rep["failed"]
                .to_string()
                .contains("reported success but the path still exists"),
            "{rep}"
        );
    } else {
        panic!("build with --features fault-injection to run the verify-pass case");
    }
    env.assert_clean("web");
}

/// A process running as `uid` outside any sandbox (an orphan).
fn orphan_process(u: u32) -> std::process::Child {
    Command::new("/bin/sleep")
        .arg("600")
        .uid(u)
        .gid(u)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
fn reap_dry_run_then_apply_then_kill() {
    let env = Env::new();
    // live: a running VM that reap must not touch.
    spec_with_cred(&env, "live", uid(40));
    // orphan: configured, launch killed after its credential dir existed.
    spec_with_cred(&env, "orphan", uid(41));
    // gone: launched once, then its spec was removed.
    spec_with_cred(&env, "gone", uid(42));
    // zombie: configured, an orphan process runs as its uid.
    spec_with_cred(&env, "zombie", uid(43));
    let mut live = env.start("live");
    live.wait_for("VMWARDEN-GUEST-READY", BOOT);
    for n in ["orphan", "gone", "zombie"] {
        assert!(env.probe(n, &["/bin/true"]).status.success());
    }
    std::fs::write(env.run.join("orphan/left-behind"), b"x").unwrap();
    std::fs::remove_file(env.config.join("gone.json")).unwrap();
    std::fs::write(env.run.join("not-a-vm.tmp"), b"x").unwrap();
    let mut proc_ = orphan_process(uid(43));
    // A stray credential mount in a namespace nothing of vmwarden owns, at
    // the exact mount point of `gone` under these roots: only a mount there
    // is this set of roots' (one at another root's path, even one shaped
    // like it, belongs to another operator's VM).
    let stray_mp = env.run.join("gone/credentials");
    std::fs::create_dir_all(&stray_mp).unwrap();
    let mut holder = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            "mount -t tmpfs vmwarden-creds:gone {} && exec sleep 600",
            stray_mp.display()
        ))
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // User data in every state dir must survive everything below.
    for n in ["live", "orphan", "gone", "zombie"] {
        std::fs::write(env.state.join(n).join("volume.img"), b"user data").unwrap();
    }
    let state_before = {
        let mut s = std::collections::BTreeSet::new();
        for n in ["live", "orphan", "gone", "zombie"] {
            for e in std::fs::read_dir(env.state.join(n)).unwrap().flatten() {
                s.insert(e.path());
            }
        }
        s
    };

    // Dry run: lists, changes nothing, exits 0.
    let before = snapshot(&env, &[uid(40), uid(41), uid(42), uid(43)]);
    let dry = env.vmwarden(&["reap", "--json"]);
    assert!(dry.status.success(), "{}", text(&dry));
    let r: serde_json::Value = serde_json::from_slice(&dry.stdout).unwrap();
    let orphans = r["orphans"].to_string();
    for want in ["run/orphan", "run/gone", "run/gone/credentials"] {
        assert!(orphans.contains(want), "dry run misses {want}: {r:#}");
    }
    assert!(!orphans.contains("run/live"), "{r:#}");
    let kept = r["kept"].to_string();
    // Not vmwarden's (no marks of a runtime dir): listed and kept.
    assert!(
        !orphans.contains("not-a-vm.tmp") && kept.contains("not-a-vm.tmp"),
        "{r:#}"
    );
    assert!(kept.contains("--kill") && kept.contains("zombie"), "{r:#}");
    assert!(kept.contains("run/live"), "{r:#}");
    assert_eq!(
        before,
        snapshot(&env, &[uid(40), uid(41), uid(42), uid(43)])
    );

    // --apply: deletes the orphans, keeps the live VM and the process.
    let ap = env.vmwarden(&["reap", "--apply", "--json"]);
    assert!(ap.status.success(), "{}", text(&ap));
    assert!(!env.run.join("gone").exists());
    assert!(env.run.join("not-a-vm.tmp").exists());
    assert!(!env.run.join("orphan/left-behind").exists());
    assert!(env.run.join("live/control/qmp.sock").exists());
    assert!(mountinfo::credential_mounts_everywhere(
        Some(&env.run),
        Some(&"gone".parse().unwrap())
    )
    .is_empty());
    assert!(
        proc_.try_wait().unwrap().is_none(),
        "reap without --kill killed a process"
    );

    // --apply --kill: the orphan process goes, then zombie's dir is cleaned.
    let k = env.vmwarden(&["reap", "--apply", "--kill", "--json"]);
    assert!(k.status.success(), "{}", text(&k));
    assert!(proc_.wait_timeout_secs(5), "orphan process survived --kill");
    let v = env.verify_clean(&["orphan", "gone", "zombie"]);
    assert!(v.status.success(), "{}", text(&v));

    // The live VM is untouched and every state dir is as it was.
    assert!(control_socket_answers(
        &env.run.join("live/control/qmp.sock")
    ));
    let state_after = {
        let mut s = std::collections::BTreeSet::new();
        for n in ["live", "orphan", "gone", "zombie"] {
            for e in std::fs::read_dir(env.state.join(n)).unwrap().flatten() {
                s.insert(e.path());
            }
        }
        s
    };
    assert_eq!(state_before, state_after);
    live.kill();
    let _ = holder.kill();
    let _ = holder.wait();
    env.assert_clean("live");
}

trait WaitTimeout {
    fn wait_timeout_secs(&mut self, s: u64) -> bool;
}
impl WaitTimeout for std::process::Child {
    fn wait_timeout_secs(&mut self, s: u64) -> bool {
        let end = std::time::Instant::now() + Duration::from_secs(s);
        while std::time::Instant::now() < end {
            if let Ok(Some(_)) = self.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

fn fill_state(env: &Env, name: &str, u: u32) {
    let sd = env.state.join(name);
    for d in ["identity", "volumes", "keys"] {
        std::fs::create_dir_all(sd.join(d)).unwrap();
    }
    std::fs::write(sd.join("identity/ssh_host_ed25519_key"), b"id").unwrap();
    std::fs::write(sd.join("volumes/root.img"), b"root").unwrap();
    std::fs::write(sd.join("keys/host"), b"k").unwrap();
    std::fs::write(sd.join("keys/other"), b"o").unwrap();
    std::fs::write(sd.join("future-file"), b"f").unwrap();
    for e in ["identity", "volumes", "keys", "future-file"] {
        nix::unistd::chown(&sd.join(e), Some(nix::unistd::Uid::from_raw(u)), None).unwrap();
    }
}

#[test]
fn purge_needs_a_terminal_keeps_identity_and_retires_the_principal() {
    let env = Env::new();
    let mut s = env.spec("web", uid(51));
    s["keep_on_purge"] = json!(["identity", "keys/host"]);
    env.write_spec("web", &s);
    assert!(env.probe("web", &["/bin/true"]).status.success());
    env.assert_clean("web");
    fill_state(&env, "web", uid(51));
    let sd = env.state.join("web");

    // No terminal: refused, nothing deleted.
    let before = snapshot(&env, &[uid(51)]);
    let o = env.vmwarden(&["purge", "web"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("needs a terminal"), "{}", text(&o));
    assert_eq!(before, snapshot(&env, &[uid(51)]));
    // Wrong phrase: nothing deleted.
    let (ok, out) = purge_on_pty(&env, &["web", "--keep-identity"], "yes");
    assert!(!ok, "{out}");
    assert_eq!(before, snapshot(&env, &[uid(51)]));
    // Refused while live.
    {
        let mut g = env.start("web");
        g.wait_for("VMWARDEN-GUEST-READY", BOOT);
        let (ok, out) = purge_on_pty(&env, &["web"], "DELETE-EVERYTHING");
        assert!(!ok && out.contains("stop it first"), "{out}");
        g.kill();
        env.assert_clean("web");
    }
    assert!(sd.join("volumes/root.img").exists());

    // --keep-identity: E \ K, identity and the registration stay.
    let (ok, out) = purge_on_pty(&env, &["web", "--keep-identity"], "DELETE-EVERYTHING");
    assert!(ok, "{out}");
    let left: std::collections::BTreeSet<_> = walkdir(&sd);
    let want: std::collections::BTreeSet<_> = [
        "identity",
        "identity/ssh_host_ed25519_key",
        "keys",
        "keys/host",
    ]
    .iter()
    .map(|p| sd.join(p))
    .collect();
    assert_eq!(left, want, "{out}");
    assert!(sd.is_dir() && std::fs::metadata(&sd).unwrap().mode() & 0o777 == 0o700);
    let reg = registry::lookup(
        &Roots {
            config_dir: env.config.clone(),
            runtime_root: env.run.clone(),
            state_root: env.state.clone(),
        },
        uid(51),
    )
    .unwrap()
    .unwrap();
    assert_eq!(reg.state, State::Active);

    // Without --keep-identity: everything goes, the principal is retired.
    let (ok, out) = purge_on_pty(&env, &["web"], "DELETE-EVERYTHING");
    assert!(ok, "{out}");
    assert!(walkdir(&sd).is_empty(), "{out}");
    assert!(sd.is_dir(), "the state dir itself stays");
    let roots = Roots {
        config_dir: env.config.clone(),
        runtime_root: env.run.clone(),
        state_root: env.state.clone(),
    };
    let reg = registry::lookup(&roots, uid(51)).unwrap().unwrap();
    assert_eq!(reg.state, State::Retired);

    // Residue under the retired uid: another VM may not take that uid.
    std::fs::write(sd.join("residue"), b"r").unwrap();
    std::fs::remove_file(env.config.join("web.json")).unwrap();
    env.write_spec("other", &env.spec("other", uid(51)));
    let before = snapshot(&env, &[uid(51)]);
    let o = env.probe("other", &["/bin/true"]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("retired") && e.contains("vmwarden purge web") && e.contains("residue"),
        "{e}"
    );
    assert_eq!(before, snapshot(&env, &[uid(51)]));
    // Once the residue is gone, the uid may be reused (a new generation).
    std::fs::remove_file(sd.join("residue")).unwrap();
    let o = env.probe("other", &["/bin/true"]);
    assert!(o.status.success(), "{}", text(&o));
    let reg = registry::lookup(&roots, uid(51)).unwrap().unwrap();
    assert_eq!(
        (reg.vm.as_str(), reg.generation, reg.state),
        ("other", 2, State::Active)
    );
    env.assert_clean("other");
}

/// A guest-made directory tree deeper than 64 levels does not stop
/// `purge`: the principal (a probe in the VM's sandbox, as a guest writes
/// through a share or the hypervisor through its state dir) makes a chain
/// of 300 directories with a file and a symlink to `/` at the bottom, and
/// a wide level half way. `purge` removes all of it (iteratively: no depth
/// limit, two descriptors at a time), never through the symlink, re-checks,
/// and retires the principal.
#[test]
fn a_guest_made_tree_deeper_than_64_levels_does_not_stop_purge() {
    let env = Env::new();
    let u = uid(52);
    env.write_spec("deep", &env.spec("deep", u));
    let sd = env.state.join("deep");
    let make = format!(
        "cd {} || exit 1; i=0; while [ $i -lt 300 ]; do mkdir d && cd d || exit 1; \
         if [ $i -eq 150 ]; then for w in 1 2 3 4 5 6 7 8; do mkdir w$w && echo x > w$w/f || exit 1; done; fi; \
         i=$((i+1)); done; echo leaf > f && ln -s / root && echo MADE",
        sd.display()
    );
    let o = env.probe("deep", &["/bin/sh", "-c", &make]);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("MADE"),
        "{}",
        text(&o)
    );
    let depth = walkdir(&sd)
        .iter()
        .map(|p| p.strip_prefix(&sd).unwrap().components().count())
        .max();
    assert_eq!(depth, Some(301), "the tree is 300 directories deep");
    // The set-id scan after every stop reaches the bottom too.
    let bottom = (0..300).fold(sd.clone(), |p, _| p.join("d"));
    let planted = bottom.join("planted");
    std::fs::write(&planted, b"x").unwrap();
    std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let (o, rep) = env.cleanup("deep");
    assert!(
        !o.status.success() && rep["failed"].to_string().contains("planted is set-user-ID"),
        "cleanup did not find the set-id file 300 levels down: {rep}"
    );
    std::fs::remove_file(&planted).unwrap();
    env.assert_clean("deep");
    // Nothing of the host's behind the symlink may go.
    let probe_file = std::path::Path::new("/etc/hostname");
    let host_before = std::fs::metadata(probe_file).map(|m| m.ino()).ok();

    let (ok, out) = purge_on_pty(&env, &["deep"], "DELETE-EVERYTHING");
    assert!(ok, "purge stopped at the deep tree: {out}");
    assert!(walkdir(&sd).is_empty(), "{out}");
    assert_eq!(
        std::fs::metadata(probe_file).map(|m| m.ino()).ok(),
        host_before
    );
    let roots = Roots {
        config_dir: env.config.clone(),
        runtime_root: env.run.clone(),
        state_root: env.state.clone(),
    };
    let reg = registry::lookup(&roots, u).unwrap().unwrap();
    assert_eq!(reg.state, State::Retired, "{out}");
}

fn walkdir(p: &std::path::Path) -> std::collections::BTreeSet<std::path::PathBuf> {
    let mut out = std::collections::BTreeSet::new();
    if let Ok(rd) = std::fs::read_dir(p) {
        for e in rd.flatten() {
            out.insert(e.path());
            if e.file_type().unwrap().is_dir() {
                out.extend(walkdir(&e.path()));
            }
        }
    }
    out
}

#[test]
fn twenty_start_stop_cycles_of_two_vms_stay_clean() {
    let env = Env::new();
    spec_with_cred(&env, "a", uid(61));
    spec_with_cred(&env, "b", uid(62));
    let cycles: usize = std::env::var("VMWARDEN_TEST_CYCLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let protected = env.path("protected");
    std::fs::create_dir(&protected).unwrap();
    std::fs::write(protected.join("keep-me"), b"x").unwrap();
    std::fs::set_permissions(&protected, std::fs::Permissions::from_mode(0o755)).unwrap();
    for i in 0..cycles {
        let mut a = env.start("a");
        let mut b = env.start("b");
        a.wait_for("VMWARDEN-GUEST-READY", BOOT);
        b.wait_for("VMWARDEN-GUEST-READY", BOOT);
        for (n, g) in [("a", &mut a), ("b", &mut b)] {
            let o = env.vmwarden(&["stop", n, "--timeout", "30"]);
            assert!(o.status.success(), "cycle {i} stop {n}: {}", text(&o));
            assert!(
                String::from_utf8_lossy(&o.stdout).contains("stopped by powerdown"),
                "cycle {i}: {}",
                text(&o)
            );
            assert!(
                g.wait_exit(Duration::from_secs(10)).is_some(),
                "cycle {i}: {n} still running"
            );
            assert!(
                g.log_text().contains("VMWARDEN-GUEST-POWERBUTTON"),
                "cycle {i}: {n} never saw the power button"
            );
            let (o, rep) = env.cleanup(n);
            assert!(
                o.status.success() && rep["clean"] == true,
                "cycle {i}: {}",
                text(&o)
            );
        }
    }
    let v = env.vmwarden(&[
        "verify-clean",
        "a",
        "b",
        "--protected",
        protected.to_str().unwrap(),
        "--since",
        &since.to_string(),
    ]);
    assert!(v.status.success(), "{}", text(&v));
    let out = String::from_utf8_lossy(&v.stdout);
    assert!(
        out.contains("protected-untouched check=ok") && out.contains("result=clean"),
        "{out}"
    );
}

/// One principal record that cannot be parsed hides no other from reap: the
/// process of a VM only the registry still knows (its spec is gone) is
/// found, and the bad record is reported, kept, naming its path.
#[test]
fn one_unreadable_principal_record_hides_no_other_from_reap() {
    let env = Env::new();
    spec_with_cred(&env, "gone", uid(44));
    assert!(env.probe("gone", &["/bin/true"]).status.success());
    std::fs::remove_file(env.config.join("gone.json")).unwrap();
    let bad = env
        .state
        .join(".principals")
        .join(format!("uid-{}.json", uid(45)));
    std::fs::write(&bad, b"{ not json").unwrap();
    let mut proc_ = orphan_process(uid(44));

    let dry = env.vmwarden(&["reap", "--json"]);
    let _ = proc_.kill();
    let _ = proc_.wait();
    assert!(dry.status.success(), "{}", text(&dry));
    let r: serde_json::Value = serde_json::from_slice(&dry.stdout).unwrap();
    let kept = r["kept"].as_array().cloned().unwrap_or_default();
    assert!(
        kept.iter()
            .any(|i| i["kind"] == "process" && i["pid"] == proc_.id() && i["vm"] == "gone"),
        "the process of a registered principal was not found beside an unreadable record: {r:#}"
    );
    assert!(
        kept.iter().any(|i| i["kind"] == "principal-record"
            && i["reason"]
                .as_str()
                .is_some_and(|s| s.contains(&bad.display().to_string()))),
        "the unreadable record is not reported by its path: {r:#}"
    );
    assert!(bad.exists(), "reap's dry run removed the bad record");
    std::fs::remove_file(&bad).unwrap();
    env.assert_clean("gone");
}
