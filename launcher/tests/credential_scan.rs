//! The whole-host search for a VM's credential tmpfs, which cleanup and
//! `verify-clean` run in every mount namespace, still finds what it must
//! now that a namespace the kernel says holds none of the VMs' sources is
//! not read (`host::ns_mounts`): the tmpfs kept alive in a foreign
//! namespace by a process of another uid, among namespaces that hold
//! other VMs' credential tmpfs (which are skipped); and the tmpfs in a
//! namespace no process is in, kept alive by an nsfs bind mount alone,
//! which the kernel's enumeration of the namespaces finds and a walk of
//! `/proc` never could. Needs root.

mod common;

use std::process::{Child, Command, Stdio};

use common::*;
use serde_json::json;

fn spec_with_cred(env: &Env, name: &str, u: u32) {
    let src = env.secret(&format!("{name}.cred"), b"scan-secret");
    let mut s = env.spec(name, u);
    s["credentials"] = json!([{ "name": "key", "source": { "path": src } }]);
    env.write_spec(name, &s);
}

/// A process of uid `holder` in a private mount namespace of its own
/// holding a tmpfs named `source` at `mount_point` (made as root before
/// it dropped to `holder`).
fn hold(source: &str, mount_point: &std::path::Path, holder: u32) -> Child {
    hold_then(
        source,
        mount_point,
        &format!("echo MOUNTED && exec setpriv --reuid={holder} --regid={holder} --clear-groups sleep 600"),
    )
}

/// A process in a private mount namespace of its own that mounts a tmpfs
/// named `source` at `mount_point`, then runs `then` (which prints
/// `MOUNTED` and stays); returned once it has said so.
fn hold_then(source: &str, mount_point: &std::path::Path, then: &str) -> Child {
    std::fs::create_dir_all(mount_point).unwrap();
    let mut c = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            "mount -t tmpfs {source} '{}' && {then}",
            mount_point.display()
        ))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    use std::io::BufRead;
    std::io::BufReader::new(c.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    if line.trim() != "MOUNTED" {
        let _ = c.kill();
        let _ = c.wait();
        panic!("the holder of {source} did not mount it");
    }
    c
}

fn stop(mut c: Child) {
    let _ = c.kill();
    let _ = c.wait();
}

#[test]
fn a_credential_tmpfs_in_a_foreign_namespace_is_found_among_other_vms_namespaces() {
    let env = Env::new();
    spec_with_cred(&env, "web", uid(80));
    spec_with_cred(&env, "other", uid(81));
    for n in ["web", "other"] {
        let o = env.probe(n, &["/bin/true"]);
        assert!(o.status.success(), "{n}: {}", text(&o));
    }
    // Namespaces holding another VM's credential tmpfs at its own place
    // (as every running VM's namespace does): the search for web's skips
    // them unread.
    let decoys: Vec<Child> = (0..3)
        .map(|_| {
            hold(
                "vmwarden-creds:other",
                &env.run.join("other/credentials"),
                uid(81),
            )
        })
        .collect();
    env.cleanup_clean("web");
    // web's tmpfs, at web's place, kept alive by a process of neither
    // web's uid nor root, in a namespace no VM made.
    let kept = hold(
        "vmwarden-creds:web",
        &env.run.join("web/credentials"),
        65534,
    );
    let v = env.verify_clean(&["web"]);
    assert!(!v.status.success(), "verify-clean web passed: {}", text(&v));
    assert!(
        text(&v).contains("no-credential-mount vm=web check=FAIL"),
        "verify-clean web does not name the mount: {}",
        text(&v)
    );
    // Asked about both: each VM's own tmpfs is found.
    let v = env.vmwarden(&["verify-clean", "web", "other", "--json"]);
    let out = String::from_utf8_lossy(&v.stdout).to_string();
    let r: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    for n in ["web", "other"] {
        let c = r["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["check"] == "no-credential-mount" && c["vm"] == n)
            .unwrap_or_else(|| panic!("no credential check for {n}: {r:#}"));
        assert_eq!(c["ok"], false, "{n}'s tmpfs not found: {c:#}");
    }
    // cleanup finds it there and unmounts it in that namespace.
    let shown = |c: &Child| {
        std::fs::read_to_string(format!("/proc/{}/mountinfo", c.id())).unwrap_or_default()
    };
    assert!(shown(&kept).contains("vmwarden-creds:web"));
    let (o, rep) = env.cleanup("web");
    assert!(o.status.success(), "{rep:#}");
    assert!(
        !shown(&kept).contains("vmwarden-creds:web"),
        "cleanup of web left its tmpfs in the foreign namespace: {rep:#}"
    );
    let v = env.verify_clean(&["web"]);
    assert!(v.status.success(), "{}", text(&v));
    stop(kept);
    for d in decoys {
        stop(d);
    }
    env.cleanup_clean("web");
    env.cleanup_clean("other");
}

/// A mount namespace kept alive by an nsfs bind mount alone, on a private
/// tmpfs of the test's (a bind mount of a namespace may not sit on a
/// shared mount); unmounted at the end, whatever the test's outcome.
struct Pinned {
    dir: std::path::PathBuf,
}

impl Pinned {
    fn file(&self) -> std::path::PathBuf {
        self.dir.join("ns")
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.file()).status();
        let _ = Command::new("umount").arg(&self.dir).status();
    }
}

/// `source` mounted at `mount_point` in a new private mount namespace
/// that no process stays in: `unshare --mount=FILE` pins it on FILE and
/// its only process exits.
fn pin(env: &Env, source: &str, mount_point: &std::path::Path) -> Pinned {
    let dir = env.dir.path().join("pin");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::create_dir_all(mount_point).unwrap();
    let run = |args: &[&str]| {
        let o = Command::new(args[0]).args(&args[1..]).output().unwrap();
        assert!(o.status.success(), "{args:?}: {}", text(&o));
    };
    let d = dir.to_str().unwrap().to_string();
    let d = d.as_str();
    run(&["mount", "-t", "tmpfs", "pin", d]);
    let p = Pinned { dir };
    run(&["mount", "--make-private", d]);
    std::fs::write(p.file(), b"").unwrap();
    run(&[
        "unshare",
        &format!("--mount={}", p.file().display()),
        "--propagation",
        "private",
        "mount",
        "-t",
        "tmpfs",
        source,
        mount_point.to_str().unwrap(),
    ]);
    p
}

/// The mountinfo of the pinned namespace, read from a process entered
/// into it for the reading.
fn pinned_mountinfo(p: &Pinned) -> String {
    let o = Command::new("nsenter")
        .arg(format!("--mount={}", p.file().display()))
        .args(["cat", "/proc/self/mountinfo"])
        .output()
        .unwrap();
    assert!(o.status.success(), "nsenter: {}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn a_credential_tmpfs_in_a_namespace_no_process_is_in_is_found() {
    use std::os::unix::fs::MetadataExt;
    let env = Env::new();
    spec_with_cred(&env, "web", uid(82));
    let o = env.probe("web", &["/bin/true"]);
    assert!(o.status.success(), "{}", text(&o));
    env.cleanup_clean("web");
    let pinned = pin(&env, "vmwarden-creds:web", &env.run.join("web/credentials"));
    assert!(pinned_mountinfo(&pinned).contains("vmwarden-creds:web"));
    // No process is in it: only the bind mount keeps it.
    let ino = std::fs::metadata(pinned.file()).unwrap().ino();
    let name = format!("mnt:[{ino}]");
    let holders: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read_link(e.path().join("ns/mnt")).is_ok_and(|l| l.to_string_lossy() == name)
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(holders.is_empty(), "processes in {name}: {holders:?}");
    // verify-clean names it, in that namespace, with no process.
    let v = env.verify_clean(&["web"]);
    assert!(!v.status.success(), "verify-clean web passed: {}", text(&v));
    assert!(
        text(&v).contains("no-credential-mount vm=web check=FAIL"),
        "verify-clean web does not name the mount: {}",
        text(&v)
    );
    assert!(text(&v).contains(&name), "{name} not named: {}", text(&v));
    // And asked about every VM.
    let v = env.verify_clean(&[]);
    assert!(!v.status.success(), "verify-clean passed: {}", text(&v));
    // cleanup finds it as it finds one in a namespace with a process:
    // deleting web's runtime dir makes the kernel detach every mount on
    // it in every namespace, this one too, and the check after finds none.
    let (o, rep) = env.cleanup("web");
    assert!(o.status.success(), "{rep:#}");
    assert!(
        !pinned_mountinfo(&pinned).contains("vmwarden-creds:web"),
        "cleanup of web left its tmpfs in the pinned namespace: {rep:#}"
    );
    let v = env.verify_clean(&["web"]);
    assert!(v.status.success(), "{}", text(&v));
    drop(pinned);
    env.cleanup_clean("web");
}

/// A process that is stopped when dropped, whatever the test's outcome.
struct Held(Option<Child>);

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(c) = self.0.take() {
            stop(c);
        }
    }
}

/// An unprivileged user's own user and mount namespace (uid 65534,
/// `unshare -Urm`) holding a tmpfs whose source fills the 4 KiB that
/// `statmount` is offered for it, and one with an empty source: the
/// kernel states neither.
fn unreadable_source_of_a_local_user() -> Held {
    let long = "x".repeat(4095);
    let mut c = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .args(["unshare", "-Urm", "sh", "-c"])
        .arg(format!(
            "mount -t tmpfs {long} /tmp && mount -t tmpfs '' /mnt && echo MOUNTED && exec sleep 600"
        ))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    use std::io::BufRead;
    std::io::BufReader::new(c.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let held = Held(Some(c));
    assert_eq!(
        line.trim(),
        "MOUNTED",
        "uid 65534 could not mount its tmpfs"
    );
    held
}

/// A local user cannot blind the kernel's enumeration: a mount whose
/// source `statmount` will not state, in the user's own namespace (which
/// is not vmwarden's and is skipped unread), does not send the search
/// back to the `/proc` walk, which never sees a namespace no process is
/// in; web's tmpfs pinned in one is still found.
#[test]
fn a_local_users_unreadable_mount_does_not_hide_a_namespace_no_process_is_in() {
    use std::os::unix::fs::MetadataExt;
    let env = Env::new();
    spec_with_cred(&env, "web", uid(83));
    let o = env.probe("web", &["/bin/true"]);
    assert!(o.status.success(), "{}", text(&o));
    env.cleanup_clean("web");
    let blind = unreadable_source_of_a_local_user();
    let pinned = pin(&env, "vmwarden-creds:web", &env.run.join("web/credentials"));
    let name = format!("mnt:[{}]", std::fs::metadata(pinned.file()).unwrap().ino());
    let v = env.verify_clean(&["web"]);
    assert!(
        text(&v).contains("no-credential-mount vm=web check=FAIL"),
        "web's tmpfs pinned in {name} not found: {}",
        text(&v)
    );
    assert!(text(&v).contains(&name), "{name} not named: {}", text(&v));
    let (o, rep) = env.cleanup("web");
    assert!(o.status.success(), "{rep:#}");
    assert!(!pinned_mountinfo(&pinned).contains("vmwarden-creds:web"));
    drop(blind);
    drop(pinned);
    env.cleanup_clean("web");
}

/// web's tmpfs in a mount namespace of the initial user namespace whose
/// only process has since entered a user namespace of its own
/// (`unshare -U`, as a helper that unshares its mount namespace as root
/// and then its user namespace does): the namespace is vmwarden's, and
/// the process in it is named, so `reap --apply` unmounts it there.
#[test]
fn a_namespace_whose_process_moved_to_a_user_namespace_of_its_own_names_it() {
    let env = Env::new();
    spec_with_cred(&env, "web", uid(85));
    let o = env.probe("web", &["/bin/true"]);
    assert!(o.status.success(), "{}", text(&o));
    env.cleanup_clean("web");
    let mp = env.run.join("web/credentials");
    let held = Held(Some(hold_then(
        "vmwarden-creds:web",
        &mp,
        "exec unshare -U sh -c 'echo MOUNTED; exec sleep 600'",
    )));
    let pid = held.0.as_ref().unwrap().id();
    let shown = || std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap_or_default();
    assert!(shown().contains("vmwarden-creds:web"));
    assert_ne!(
        std::fs::read_link(format!("/proc/{pid}/ns/user")).unwrap(),
        std::fs::read_link("/proc/self/ns/user").unwrap()
    );
    let v = env.verify_clean(&["web"]);
    assert!(
        text(&v).contains("no-credential-mount vm=web check=FAIL"),
        "web's tmpfs not found: {}",
        text(&v)
    );
    assert!(
        text(&v).contains(&format!("(pid {pid})")),
        "the process in the namespace, {pid}, is not named: {}",
        text(&v)
    );
    let r = env.vmwarden(&["reap", "--apply"]);
    assert!(
        !shown().contains("vmwarden-creds:web"),
        "reap --apply left web's tmpfs in pid {pid}'s namespace: {}",
        text(&r)
    );
    drop(held);
    env.cleanup_clean("web");
}

/// web launched (as `uid(n)`), then its tmpfs mounted at its place in a
/// namespace of uid 65534 (what an instance may leave), then `between`,
/// then web launched again with no cleanup: the holder, for the caller to
/// drop.
fn relaunch_over_a_tmpfs_left_between(env: &Env, n: u32, between: impl FnOnce()) -> Held {
    spec_with_cred(env, "web", uid(n));
    let o = env.probe("web", &["/bin/true"]);
    assert!(o.status.success(), "{}", text(&o));
    let kept = Held(Some(hold(
        "vmwarden-creds:web",
        &env.run.join("web/credentials"),
        65534,
    )));
    between();
    let o = env.probe("web", &["/bin/true"]);
    assert!(o.status.success(), "second launch: {}", text(&o));
    kept
}

/// The credential floor (`instance::creds_floor`) bounds the search from
/// below, so it must stay under everything an instance may have left: a
/// launch after an instance no cleanup proved gone keeps that instance's
/// floor. Here web's tmpfs, at web's place, is mounted after web's first
/// launch and before its second, with no cleanup between: a floor taken
/// from the second launch would be above it, and verify-clean would pass.
#[test]
fn a_relaunch_before_any_cleanup_keeps_the_floor_under_what_the_last_instance_left() {
    let env = Env::new();
    let kept = relaunch_over_a_tmpfs_left_between(&env, 84, || {});
    let v = env.verify_clean(&["web"]);
    assert!(!v.status.success(), "verify-clean web passed: {}", text(&v));
    assert!(
        text(&v).contains("no-credential-mount vm=web check=FAIL"),
        "verify-clean web does not name what the first instance left: {}",
        text(&v)
    );
    // Cleanup finds it too (and detaches it with the runtime dir); the
    // record is then proven and the next launch may start a floor of its
    // own.
    let (o, rep) = env.cleanup("web");
    assert!(o.status.success(), "{rep:#}");
    let floor: serde_json::Value =
        serde_json::from_slice(&std::fs::read(env.run.join("web/creds-floor.json")).unwrap())
            .unwrap();
    assert_eq!(floor["proven"], true, "{floor}");
    drop(kept);
    env.cleanup_clean("web");
    let v = env.verify_clean(&["web"]);
    assert!(v.status.success(), "{}", text(&v));
}

/// A runtime dir that was there with no credential floor in it (an
/// instance launched before floors were recorded, or the record lost):
/// what that instance may have left has an unknown id, so the next
/// launch's floor is every mount until a cleanup proves none left.
#[test]
fn a_runtime_dir_without_a_floor_has_every_mount_searched_after_the_next_launch() {
    let env = Env::new();
    let kept = relaunch_over_a_tmpfs_left_between(&env, 85, || {
        std::fs::remove_file(env.run.join("web/creds-floor.json")).unwrap();
    });
    let v = env.verify_clean(&["web"]);
    assert!(
        text(&v).contains("no-credential-mount vm=web check=FAIL"),
        "verify-clean web does not name what the floorless instance left: {}",
        text(&v)
    );
    let (o, rep) = env.cleanup("web");
    assert!(o.status.success(), "{rep:#}");
    drop(kept);
    env.cleanup_clean("web");
}
