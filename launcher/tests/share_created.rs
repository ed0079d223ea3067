//! Share sources made for the VM: a writable share whose source does not
//! exist is made at launch, the principal's, 0700, when its parent is
//! root's and writable by root alone, reached without a symlink; anything
//! else is refused by name with the host left as it was. The guest uses
//! it (9p and an owned virtiofs share), a restart keeps it, cleanup after
//! a launch killed at any step accounts for it, and purge deletes what
//! vmwarden made and keeps what it did not, saying so. Needs root; the
//! kill test needs `--features fault-injection`.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use serde_json::json;

const BOOT: Duration = Duration::from_secs(180);

/// A directory of `owner`'s with `mode` under the test dir.
fn dir(env: &Env, rel: &str, owner: u32, mode: u32) -> PathBuf {
    let p = env.path(rel);
    std::fs::create_dir_all(&p).unwrap();
    std::os::unix::fs::chown(&p, Some(owner), Some(owner)).unwrap();
    std::fs::set_permissions(&p, PermissionsExt::from_mode(mode)).unwrap();
    p
}

fn owner_mode(p: &Path) -> (u32, u32, u32) {
    let md = std::fs::symlink_metadata(p).unwrap();
    assert!(md.is_dir(), "{p:?} is not a directory");
    (md.uid(), md.gid(), md.mode() & 0o7777)
}

fn ino(p: &Path) -> Option<u64> {
    std::fs::symlink_metadata(p).ok().map(|m| m.ino())
}

/// The record of what vmwarden made for `web`, as JSON (`null` when none).
fn made_record(env: &Env) -> serde_json::Value {
    std::fs::read(env.state.join(".made-sources-web.json"))
        .map(|b| serde_json::from_slice(&b).unwrap())
        .unwrap_or(serde_json::Value::Null)
}

/// The record names `p` as the directory there now (its inode).
fn recorded(env: &Env, p: &Path) -> bool {
    let Some(i) = ino(p) else { return false };
    made_record(env)["sources"].as_array().is_some_and(|v| {
        v.iter()
            .any(|s| s["path"] == json!(p) && s["ino"] == json!(i))
    })
}

#[test]
fn missing_writable_sources_are_made_for_the_principal_used_kept_by_a_restart_and_purged() {
    let env = Env::new();
    let u = uid(361);
    let parent = dir(&env, "srv", 0, 0o755);
    let made9 = parent.join("made9");
    let madev = parent.join("madev");
    // A writable share that existed before: purge keeps it, and says so.
    let before = dir(&env, "srv/before", u, 0o700);
    let script = "\
mkdir -p /m9 /mv /b
mount -t 9p -o trans=virtio,version=9p2000.L made9 /m9 || echo T-MOUNT-9P-FAILED
mount -t virtiofs madev /mv || echo T-MOUNT-VFS-FAILED
mount -t 9p -o trans=virtio,version=9p2000.L before /b || echo T-MOUNT-B-FAILED
echo \"T-ROOTS 9p=$(stat -c '%u:%a' /m9) vfs=$(stat -c '%u:%g:%a' /mv)\"
echo \"T-BEFORE $(cat /m9/mark 2>/dev/null || echo none) $(cat /mv/mark 2>/dev/null || echo none)\"
echo kept >/m9/mark && echo kept >/mv/mark && echo T-WROTE
sync; umount /m9; umount /mv; umount /b
";
    let mut spec = env.shares_spec("web", u, "oneshot", script);
    spec["shares"] = json!([
        { "tag": "made9", "source": made9, "proto": "9p" },
        { "tag": "madev", "source": madev, "proto": "virtiofs" },
        { "tag": "before", "source": before, "proto": "9p" }
    ]);
    spec["virtiofsd"] = json!({ "binary": daemon("virtiofsd") });
    env.write_spec("web", &spec);

    let out = boot_once_within(&env, "first", BOOT);
    for want in [
        // 9p: the principal's own directory; virtiofs: the guest's root
        // (guest id 0 is the principal) on its own share.
        format!("T-ROOTS 9p={u}:700 vfs=0:0:700"),
        "T-BEFORE none none".into(),
        "T-WROTE".into(),
        "VMWARDEN-RUN-END rc=0".into(),
    ] {
        assert!(out.contains(&want), "guest output lacks {want:?}:\n{out}");
    }
    assert!(!out.contains("T-MOUNT-"), "{out}");
    // On the host: both the principal's, 0700, recorded with their inodes.
    for p in [&made9, &madev] {
        assert_eq!(owner_mode(p), (u, u, 0o700), "{p:?}");
        assert!(recorded(&env, p), "{p:?}: {}", made_record(&env));
    }
    assert_eq!(std::fs::read(made9.join("mark")).unwrap(), b"kept\n");
    let inodes = (ino(&made9), ino(&madev));
    let rec = std::fs::symlink_metadata(env.state.join(".made-sources-web.json")).unwrap();
    assert_eq!((rec.uid(), rec.mode() & 0o777), (0, 0o600));

    // Cleanup keeps them, saying why.
    let rep = env.assert_clean("web");
    let kept = rep["kept"].to_string();
    assert!(
        kept.contains("made9") && kept.contains("made by vmwarden"),
        "{rep}"
    );

    // A restart finds them, with what the guest wrote, not made again.
    let out = boot_once_within(&env, "second", BOOT);
    assert!(out.contains("T-BEFORE kept kept"), "{out}");
    assert_eq!((ino(&made9), ino(&madev)), inodes);
    env.assert_clean("web");

    // status --all --json shows what purge would do with each, and why.
    let st = env.vmwarden(&["status", "--all", "--json", "web"]);
    assert!(st.status.success(), "{}", text(&st));
    let j = serde_json::from_slice::<serde_json::Value>(&st.stdout)
        .unwrap()
        .to_string();
    for (p, action, why) in [
        (&made9, "delete", "share source made by vmwarden"),
        (&before, "keep", "not made by vmwarden"),
    ] {
        let want = format!(
            "{{\"action\":\"{action}\",\"path\":\"{}\",\"reason\":\"{why}",
            p.display()
        );
        assert!(j.contains(&want), "lacks {want}: {j}");
    }
    // purge: what vmwarden made goes, what existed before stays; both said.
    let (ok, p) = purge_on_pty(&env, &["web", "--keep-identity"], "DELETE-EVERYTHING");
    assert!(ok, "{p}");
    for m in [&made9, &madev] {
        assert!(
            p.contains(&format!(
                "delete {} (share source: share source made by vmwarden",
                m.display()
            )),
            "{p}"
        );
        assert!(p.contains(&format!("deleted {}", m.display())), "{p}");
        assert!(!m.exists(), "{m:?}: {p}");
    }
    assert!(
        p.contains(&format!(
            "keep   {} (share source: not made by vmwarden)",
            before.display()
        )),
        "{p}"
    );
    assert_eq!(owner_mode(&before), (u, u, 0o700));
    assert_eq!(made_record(&env), serde_json::Value::Null, "{p}");
}

/// `web` of `u` with one writable 9p share from `source`.
fn write_share_spec(env: &Env, u: u32, source: &Path, read_only: bool) {
    let mut spec = env.spec("web", u);
    spec["shares"] =
        json!([{ "tag": "data", "source": source, "proto": "9p", "read_only": read_only }]);
    env.write_spec("web", &spec);
}

/// The launch is refused (exit 78) naming `want`, and the host is as it was.
#[track_caller]
fn assert_refused(env: &Env, u: u32, want: &[&str]) {
    let snap = snapshot(env, &[u]);
    let out = env.probe("web", &["/bin/true"]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(78), "{said}");
    for w in want {
        assert!(said.contains(w), "lacks {w:?}: {said}");
    }
    assert_eq!(snapshot(env, &[u]), snap, "{said}");
}

#[test]
fn a_missing_source_is_made_only_in_a_parent_of_roots_alone_reached_without_a_symlink() {
    let env = Env::new();
    let u = uid(362);
    // Writable by everyone (root's, sticky or not), by its group.
    for (mode, who) in [
        (0o777, "everyone"),
        (0o1777, "everyone"),
        (0o775, "its group"),
    ] {
        let parent = dir(&env, "loose", 0, mode);
        let src = parent.join("data");
        write_share_spec(&env, u, &src, false);
        assert_refused(
            &env,
            u,
            &["shares[0].source", &src.display().to_string(), who],
        );
        assert!(!src.exists());
    }
    // Another owner's directory (the principal's own, 0755).
    let theirs = dir(&env, "theirs", u, 0o755);
    write_share_spec(&env, u, &theirs.join("data"), false);
    assert_refused(&env, u, &["shares[0].source", &format!("owned by uid {u}")]);
    // A symlink on the way: to a directory of root's alone.
    let real = dir(&env, "real", 0, 0o755);
    let link = env.path("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    write_share_spec(&env, u, &link.join("data"), false);
    assert_refused(&env, u, &["shares[0].source", "is a symlink"]);
    assert!(!real.join("data").exists());
    // A missing parent.
    write_share_spec(&env, u, &env.path("nowhere/data"), false);
    assert_refused(&env, u, &["shares[0].source", "nowhere"]);
    // A read-only share's missing source stays an error, named.
    write_share_spec(&env, u, &real.join("data"), true);
    assert_refused(
        &env,
        u,
        &[
            "shares[0].source",
            "read-only share (tag \"data\") must exist",
        ],
    );
    assert!(!real.join("data").exists());
    // ...and the same writable share is made there.
    write_share_spec(&env, u, &real.join("data"), false);
    let ok = env.probe("web", &["/bin/true"]);
    assert!(ok.status.success(), "{}", text(&ok));
    assert_eq!(owner_mode(&real.join("data")), (u, u, 0o700));
    env.assert_clean("web");
}

#[test]
fn kill_after_every_step_leaves_every_made_source_accounted_for() {
    require_fault_injection();
    let env = Env::new();
    let u = uid(363);
    let src = dir(&env, "srv", 0, 0o755).join("data");
    write_share_spec(&env, u, &src, false);
    let steps = launch_steps();
    let made = steps
        .iter()
        .position(|s| s == "share-sources-made")
        .unwrap();
    assert_eq!(steps[made + 1], "share-sources-recorded", "{steps:?}");
    for (i, step) in steps.iter().enumerate() {
        // Each kill meets a missing source, never recorded (an inode
        // number is reused: a stale entry could name the new directory).
        if src.exists() {
            std::fs::remove_dir(&src).unwrap();
        }
        let _ = std::fs::remove_file(env.state.join(".made-sources-web.json"));
        env.launch_killed_after("web", step);
        let intent: serde_json::Value = std::fs::read(env.run.join("web/instance.json"))
            .map(|b| serde_json::from_slice(&b).unwrap())
            .unwrap_or_default();
        let named = intent["resources"].to_string().contains(&format!(
            "{{\"kind\":\"share-source\",\"path\":\"{}\"}}",
            src.display()
        ));
        if i < made {
            assert!(!src.exists(), "step {step}");
        } else {
            assert_eq!(owner_mode(&src), (u, u, 0o700), "step {step}");
            assert_eq!(recorded(&env, &src), i > made, "step {step}");
        }
        // From the intent record on, the record names the source first.
        let intent_at = steps.iter().position(|s| s == "intent-written").unwrap();
        assert_eq!(named, i >= intent_at, "step {step}: {intent}");
        let before = ino(&src);
        let rep = env.assert_clean_after("web", step);
        if i == made {
            // Made, not recorded: cleanup removes it (empty) and says so.
            assert!(!src.exists(), "step {step}: {rep}");
            assert!(
                rep["deleted"].to_string().contains(&*src.to_string_lossy()),
                "step {step}: {rep}"
            );
        } else if i > made {
            // Recorded: the VM's data, kept.
            assert_eq!(ino(&src), before, "step {step}: {rep}");
            assert!(
                rep["kept"].to_string().contains("made by vmwarden"),
                "step {step}: {rep}"
            );
        }
        // The next launch makes (or keeps) it and succeeds.
        let ok = env.probe("web", &["/bin/true"]);
        assert!(ok.status.success(), "relaunch after {step}: {}", text(&ok));
        assert!(recorded(&env, &src), "after {step}");
        if let Some(b) = before.filter(|_| i > made) {
            assert_eq!(
                ino(&src),
                Some(b),
                "step {step}: a made source was made again"
            );
        }
        env.assert_clean("web");
    }
}

#[test]
fn purge_keeps_a_made_source_that_is_no_longer_the_directory_it_made() {
    let env = Env::new();
    let u = uid(364);
    let src = dir(&env, "srv", 0, 0o755).join("data");
    write_share_spec(&env, u, &src, false);
    let ok = env.probe("web", &["/bin/true"]);
    assert!(ok.status.success(), "{}", text(&ok));
    env.assert_clean("web");
    // Replaced by another directory of the same name (another inode: made
    // while the first still exists, or ext4 may give the same number back).
    let new = dir(&env, "srv/data.new", u, 0o700);
    std::fs::write(new.join("theirs"), b"x").unwrap();
    std::fs::remove_dir(&src).unwrap();
    std::fs::rename(&new, &src).unwrap();
    let (ok, p) = purge_on_pty(&env, &["web", "--keep-identity"], "DELETE-EVERYTHING");
    assert!(ok, "{p}");
    assert!(
        p.contains(&format!(
            "keep   {} (share source: not the directory vmwarden made",
            src.display()
        )),
        "{p}"
    );
    assert!(src.join("theirs").is_file(), "{p}");
    // No longer vmwarden's: the record forgets it.
    assert_eq!(made_record(&env), serde_json::Value::Null, "{p}");
}

/// A source inside the VM's own state directory (microvm.nix's relative
/// sources) is made there, each missing component the principal's 0700,
/// named in no record of its own (the state directory is the VM's); a
/// symlink the principal left on the way is refused by name, and nothing
/// is made where it points.
#[test]
fn a_missing_source_inside_the_vms_state_dir_is_made_the_principals() {
    let env = Env::new();
    let u = uid(366);
    let sd = env.state.join("web");
    let src = sd.join("home/alice");
    write_share_spec(&env, u, &src, false);
    let ok = env.probe("web", &["/bin/true"]);
    assert!(ok.status.success(), "{}", text(&ok));
    assert_eq!(owner_mode(&sd.join("home")), (u, u, 0o700));
    assert_eq!(owner_mode(&src), (u, u, 0o700));
    assert_eq!(made_record(&env), serde_json::Value::Null);
    env.assert_clean("web");

    // A symlink at a component, pointing at a directory of root's alone.
    let real = dir(&env, "real", 0, 0o755);
    std::fs::remove_dir(&src).unwrap();
    std::fs::remove_dir(sd.join("home")).unwrap();
    std::os::unix::fs::symlink(&real, sd.join("home")).unwrap();
    assert_refused(
        &env,
        u,
        &[
            "shares[0].source",
            &sd.join("home").display().to_string(),
            "symlink",
        ],
    );
    assert!(!real.join("alice").exists());
    std::fs::remove_file(sd.join("home")).unwrap();
    env.assert_clean("web");
}

/// One missing source named by two shares is refused by name before
/// anything is made (it used to be made for the first, then fail the
/// second as "appeared since the pre-flight", at every start).
#[test]
fn a_missing_source_named_by_two_shares_is_refused_before_anything_is_made() {
    let env = Env::new();
    let u = uid(368);
    let src = dir(&env, "srv", 0, 0o755).join("data");
    let mut spec = env.spec("web", u);
    spec["shares"] = json!([
        { "tag": "a", "source": src, "proto": "9p" },
        { "tag": "b", "source": src, "proto": "9p" },
    ]);
    env.write_spec("web", &spec);
    assert_refused(
        &env,
        u,
        &[
            "shares[1].source",
            &src.display().to_string(),
            "also shares[0].source",
        ],
    );
    assert!(!src.exists());
    env.assert_clean("web");
}

/// Inside the VM's state directory, a source is made only below
/// directories the principal (or root) keeps from everyone else: one of
/// another owner's, or one everyone may write (where someone holding a
/// descriptor to it chooses what a name holds), is refused by name before
/// anything is made, and nothing is given to the principal in it.
#[test]
fn a_missing_source_inside_the_state_dir_is_not_made_below_another_users_directory() {
    let env = Env::new();
    let u = uid(370);
    let other = uid(371);
    let sd = env.state.join("web");
    let src = sd.join("home/alice");
    write_share_spec(&env, u, &src, false);
    let ok = env.probe("web", &["/bin/true"]);
    assert!(ok.status.success(), "{}", text(&ok));
    std::fs::remove_dir(&src).unwrap();
    let home = sd.join("home");
    for (owner, mode, why) in [
        (other, 0o755, format!("owned by uid {other}")),
        (u, 0o777, "everyone can change it".to_string()),
    ] {
        std::os::unix::fs::chown(&home, Some(owner), Some(owner)).unwrap();
        std::fs::set_permissions(&home, PermissionsExt::from_mode(mode)).unwrap();
        assert_refused(
            &env,
            u,
            &["shares[0].source", &home.display().to_string(), &why],
        );
        assert!(!src.exists());
    }
    std::fs::remove_dir(&home).unwrap();
    env.assert_clean("web");
}

/// A bind mount (root's, of the same file system) inside a made source:
/// `mount --bind` of a host directory over a subdirectory of the VM's
/// data. Purge deletes the made source but never descends into the mount:
/// what is mounted there stays whole, and the mount point is named.
#[test]
fn purge_of_a_made_source_does_not_descend_into_a_bind_mount_inside_it() {
    let env = Env::new();
    let u = uid(372);
    let src = dir(&env, "srv", 0, 0o755).join("data");
    write_share_spec(&env, u, &src, false);
    let ok = env.probe("web", &["/bin/true"]);
    assert!(ok.status.success(), "{}", text(&ok));
    env.assert_clean("web");
    // The host's files, on the same file system as the made source.
    let host = dir(&env, "host-files", 0, 0o755);
    std::fs::write(host.join("precious"), b"x").unwrap();
    let sub = dir(&env, "srv/data/sub", u, 0o700);
    let mount = BindMount::new(&host, &sub);
    let (_, p) = purge_on_pty(&env, &["web", "--keep-identity"], "DELETE-EVERYTHING");
    assert!(host.join("precious").is_file(), "{p}");
    assert!(p.contains("mount point"), "{p}");
    drop(mount);
}

/// `mount --bind from to`, undone (lazily) when dropped.
struct BindMount(PathBuf);

impl BindMount {
    fn new(from: &Path, to: &Path) -> BindMount {
        nix::mount::mount(
            Some(from),
            to,
            None::<&str>,
            nix::mount::MsFlags::MS_BIND,
            None::<&str>,
        )
        .unwrap();
        BindMount(to.to_path_buf())
    }
}

impl Drop for BindMount {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// A launch killed after naming a source and before making it; then an
/// empty directory of root's (0755) made there by hand. Cleanup keeps it,
/// named: only a private one of root's or the principal's can be what a
/// killed launch's `mkdirat` left.
#[test]
fn cleanup_keeps_a_directory_made_by_hand_where_a_killed_launch_named_a_source() {
    require_fault_injection();
    let env = Env::new();
    let u = uid(374);
    let src = dir(&env, "srv", 0, 0o755).join("data");
    write_share_spec(&env, u, &src, false);
    env.launch_killed_after("web", "state-dir");
    assert!(!src.exists());
    let _ = dir(&env, "srv/data", 0, 0o755);
    let (o, rep) = env.cleanup("web");
    assert!(src.is_dir(), "{rep} {}", text(&o));
    assert!(
        rep["kept"].to_string().contains("not made by vmwarden"),
        "{rep}"
    );
    std::fs::remove_dir(&src).unwrap();
    env.assert_clean("web");
}

/// The VM's state directory itself as a writable share's source, on the
/// first start (it does not exist yet): the `state-dir` step makes it, the
/// principal's 0700, and the start goes on (it used to be planned as a
/// source of its own in the state root: refused while the state root did
/// not exist, else found made by then, "appeared since the pre-flight":
/// every first start failed).
#[test]
fn the_state_dir_itself_as_a_missing_source_is_made_once_by_the_state_dir_step() {
    let env = Env::new();
    let u = uid(376);
    let sd = env.state.join("web");
    assert!(!sd.exists());
    write_share_spec(&env, u, &sd, false);
    let ok = env.probe("web", &["/bin/true"]);
    assert!(ok.status.success(), "{}", text(&ok));
    assert_eq!(owner_mode(&sd), (u, u, 0o700));
    assert_eq!(made_record(&env), serde_json::Value::Null);
    env.assert_clean("web");
}

/// A made source replaced by a directory that got the same inode number
/// (ext4 gives a removed directory's number back): the record's inode set
/// to the replacement's, as that reuse would, its birth time still the
/// made one's. Purge keeps the replacement, named.
#[test]
fn purge_keeps_a_replacement_that_got_the_made_sources_inode_number() {
    let env = Env::new();
    let u = uid(378);
    let src = dir(&env, "srv", 0, 0o755).join("data");
    write_share_spec(&env, u, &src, false);
    let ok = env.probe("web", &["/bin/true"]);
    assert!(ok.status.success(), "{}", text(&ok));
    env.assert_clean("web");
    let mut rec = made_record(&env);
    assert!(rec["sources"][0]["btime"].is_array(), "{rec}");
    std::thread::sleep(Duration::from_millis(20));
    let new = dir(&env, "srv/data.new", u, 0o700);
    std::fs::write(new.join("theirs"), b"x").unwrap();
    std::fs::remove_dir(&src).unwrap();
    std::fs::rename(&new, &src).unwrap();
    let md = std::fs::symlink_metadata(&src).unwrap();
    rec["sources"][0]["ino"] = json!(md.ino());
    rec["sources"][0]["dev"] = json!(md.dev());
    std::fs::write(
        env.state.join(".made-sources-web.json"),
        serde_json::to_vec(&rec).unwrap(),
    )
    .unwrap();
    let (ok, p) = purge_on_pty(&env, &["web", "--keep-identity"], "DELETE-EVERYTHING");
    assert!(ok, "{p}");
    assert!(src.join("theirs").is_file(), "{p}");
    assert!(p.contains("born since"), "{p}");
}
