//! `vmwarden adopt NAME --from DIR`: a microvm.nix-shaped state dir (a
//! sparse 1 GiB volume image, a share source, microvm.nix's own links and
//! socket) moved into vmwarden's state dir and re-owned, on real files as
//! root. Planted symlinks and hard links are never followed or re-owned
//! outside DIR, a VM that might be running is refused with nothing changed,
//! a kill after every step is finished by running the command again, bad
//! input is refused with a clear message and the host unchanged, and the
//! guide's procedure ends with a guest that reads the data written before.
//! Needs root and, for the kill test, `--features fault-injection`.

mod common;

use std::os::unix::fs::MetadataExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::*;
use serde_json::json;

const GIB: u64 = 1024 * 1024 * 1024;
const MARK: &[u8] = b"VOLUME-DATA-WRITTEN-UNDER-MICROVM-NIX\n";

/// microvm.nix's state dir of VM `web`, as its host module leaves it: a
/// volume image `var.img` (sparse, 1 GiB, a marker at its start), a share
/// source `home/` (a file, a subdir, a symlink planted by the guest that
/// points outside DIR), and what is microvm.nix's own: `current`, `booted`
/// and `toplevel` links into the store, `web.sock`, `notify.vsock`.
struct Legacy {
    dir: PathBuf,
    /// A root-owned file outside DIR that `home/escape` points at.
    outside: PathBuf,
}

fn legacy(env: &Env) -> Legacy {
    let dir = env.path("microvms/web");
    std::fs::create_dir_all(&dir).unwrap();
    let img = dir.join("var.img");
    let mut f = std::fs::File::create(&img).unwrap();
    std::io::Write::write_all(&mut f, MARK).unwrap();
    f.set_len(GIB).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let home = dir.join("home");
    std::fs::create_dir_all(home.join("sub")).unwrap();
    std::fs::write(
        home.join("hello"),
        b"share-data-written-under-microvm-nix\n",
    )
    .unwrap();
    std::fs::write(home.join("sub/deep"), b"deep\n").unwrap();
    let outside = env.path("outside-secret");
    std::fs::write(&outside, b"root's\n").unwrap();
    std::os::unix::fs::symlink(&outside, home.join("escape")).unwrap();
    for l in ["current", "booted", "toplevel"] {
        std::os::unix::fs::symlink(
            "/nix/store/00000000000000000000000000000000-runner",
            dir.join(l),
        )
        .unwrap();
    }
    drop(std::os::unix::net::UnixListener::bind(dir.join("web.sock")).unwrap());
    std::fs::write(dir.join("notify.vsock"), b"").unwrap();
    // microvm.nix's owner: microvm:kvm; any non-root owner stands for it
    // (its QEMU writes a 9p share's files as itself).
    for p in [&dir, &img, &home] {
        std::os::unix::fs::chown(p, Some(uid(90)), Some(uid(90))).unwrap();
    }
    for p in ["hello", "sub", "sub/deep", "escape"] {
        std::os::unix::fs::lchown(home.join(p), Some(uid(90)), Some(uid(90))).unwrap();
    }
    Legacy { dir, outside }
}

/// A spec for `web` of `u` whose volume and share are in its state dir.
fn adopt_spec(env: &Env, u: u32) -> serde_json::Value {
    let mut spec = env.spec("web", u);
    spec["disks"] = json!([{ "path": env.state.join("web/var.img"), "serial": "var" }]);
    spec["shares"] =
        json!([{ "tag": "home", "source": env.state.join("web/home"), "proto": "9p" }]);
    spec
}

fn adopt(env: &Env, from: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["adopt", "web", "--from", from.to_str().unwrap()];
    args.extend_from_slice(extra);
    env.vmwarden(&args)
}

/// Owner, mode, inode and allocated bytes of every path below `p` (not
/// following links), and the contents of regular files: what must not
/// change when adopt refuses.
fn tree(p: &Path) -> Vec<String> {
    let mut out = Vec::new();
    fn go(p: &Path, out: &mut Vec<String>) {
        let Ok(md) = std::fs::symlink_metadata(p) else {
            return;
        };
        out.push(format!(
            "{} {:o} {}:{} ino={} blocks={} nlink={}",
            p.display(),
            md.mode(),
            md.uid(),
            md.gid(),
            md.ino(),
            md.blocks(),
            md.nlink()
        ));
        if md.is_dir() {
            let mut names: Vec<_> = std::fs::read_dir(p)
                .unwrap()
                .flatten()
                .map(|e| e.path())
                .collect();
            names.sort();
            for n in names {
                go(&n, out);
            }
        }
    }
    go(p, &mut out);
    out
}

#[track_caller]
fn assert_refused(o: &Output, want: &[&str]) {
    assert_eq!(o.status.code(), Some(1), "{}", text(o));
    let err = stderr(o);
    for w in want {
        assert!(err.contains(w), "stderr lacks {w:?}:\n{}", text(o));
    }
    assert!(err.contains("nothing changed"), "{}", text(o));
}

/// Make everything of `l` root's alone (owner root, nothing for group or
/// others), and DIR root's (no one else may rename in it): such items are
/// moved, the same inodes, not copied.
fn make_root_only(l: &Legacy) {
    fn go(p: &Path) {
        let md = std::fs::symlink_metadata(p).unwrap();
        if md.file_type().is_symlink() {
            std::os::unix::fs::lchown(p, Some(0), Some(0)).unwrap();
            return;
        }
        std::os::unix::fs::chown(p, Some(0), Some(0)).unwrap();
        let mode = if md.is_dir() { 0o700 } else { 0o600 };
        std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(mode)).unwrap();
        if md.is_dir() {
            for e in std::fs::read_dir(p).unwrap().flatten() {
                go(&e.path());
            }
        }
    }
    go(&l.dir.join("var.img"));
    go(&l.dir.join("home"));
    std::os::unix::fs::chown(&l.dir, Some(0), Some(0)).unwrap();
    std::fs::set_permissions(&l.dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
}

/// How the items were adopted: `Moved` (root's alone: the same inodes) or
/// `Copied` (new inodes; the old owner's handles reach only the old ones).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Adopted {
    Moved,
    Copied,
}

/// The end state of a finished adoption, checked on the host.
#[track_caller]
fn assert_adopted(env: &Env, l: &Legacy, u: u32, img_ino: u64, img_blocks: u64, how: Adopted) {
    let img = env.state.join("web/var.img");
    let md = std::fs::symlink_metadata(&img).unwrap();
    assert!(md.file_type().is_file());
    assert_eq!((md.uid(), md.gid(), md.mode() & 0o7777), (u, u, 0o600));
    match how {
        // Moved: the same inode, the same (few) blocks.
        Adopted::Moved => {
            assert_eq!(md.ino(), img_ino, "the image was copied, not moved");
            assert_eq!(md.blocks(), img_blocks, "the image's allocation changed");
        }
        // Copied: a new inode, as sparse as the old one.
        Adopted::Copied => {
            assert_ne!(md.ino(), img_ino, "the old owner's inode was kept");
            assert!(
                md.blocks() <= img_blocks + 8,
                "the copy allocates {} blocks, the original {img_blocks}",
                md.blocks()
            );
        }
    }
    assert_eq!(md.len(), GIB);
    assert!(
        md.blocks() * 512 < GIB / 100,
        "not sparse any more: {} blocks",
        md.blocks()
    );
    let head = std::fs::read(&img)
        .map(|b| b[..MARK.len()].to_vec())
        .unwrap();
    assert_eq!(head, MARK);
    for p in [
        "home",
        "home/hello",
        "home/sub",
        "home/sub/deep",
        "home/escape",
    ] {
        let md = std::fs::symlink_metadata(env.state.join("web").join(p)).unwrap();
        assert_eq!((md.uid(), md.gid()), (u, u), "{p} not re-owned");
    }
    assert_eq!(
        std::fs::symlink_metadata(env.state.join("web/home"))
            .unwrap()
            .mode()
            & 0o022,
        0,
        "the share source is writable by others"
    );
    assert!(std::fs::symlink_metadata(env.state.join("web/home/escape"))
        .unwrap()
        .file_type()
        .is_symlink());
    // The planted link's target, outside DIR, is root's as before.
    let o = std::fs::metadata(&l.outside).unwrap();
    assert_eq!((o.uid(), o.gid()), (0, 0), "a link was followed");
    // microvm.nix's own entries are left in DIR, untouched.
    for n in ["current", "booted", "toplevel", "web.sock", "notify.vsock"] {
        assert!(
            std::fs::symlink_metadata(l.dir.join(n)).is_ok(),
            "{n} was moved"
        );
    }
    std::fs::symlink_metadata(l.dir.join("var.img")).unwrap_err();
    std::fs::symlink_metadata(l.dir.join("home")).unwrap_err();
    assert!(
        !env.state.join(".adopt-web.json").exists(),
        "the record is left"
    );
}

/// The dry run, then `--apply`, for a microvm.nix state dir as it is (its
/// items its service user's: copied to new inodes) and for one whose items
/// are root's alone (moved, the same inodes).
#[test]
fn dry_run_changes_nothing_and_apply_moves_reowns_and_leaves_the_rest() {
    for how in [Adopted::Copied, Adopted::Moved] {
        let env = Env::new();
        let u = uid(81);
        let l = legacy(&env);
        if how == Adopted::Moved {
            make_root_only(&l);
        }
        env.write_spec("web", &adopt_spec(&env, u));
        // The state dir exists (the principal's), and holds a symlink out
        // at the temporary name of the first copy: it is removed, never
        // followed.
        let sd = env.state.join("web");
        std::fs::create_dir_all(&sd).unwrap();
        std::os::unix::fs::chown(&sd, Some(u), Some(u)).unwrap();
        std::os::unix::fs::symlink(&l.outside, sd.join(".vmwarden-adopt-0")).unwrap();
        let before = (
            tree(&l.dir),
            tree(&env.state),
            tree(&env.run),
            tree(&l.outside),
        );
        let img = std::fs::symlink_metadata(l.dir.join("var.img")).unwrap();

        let o = adopt(&env, &l.dir, &[]);
        assert!(o.status.success(), "{}", text(&o));
        let out = String::from_utf8_lossy(&o.stdout).to_string();
        eprintln!("dry run ({how:?}):\n{out}");
        let (verb, counts, done) = match how {
            Adopted::Copied => ("copy  ", "0 to move, 2 to copy", "0 moved, 2 copied"),
            Adopted::Moved => ("move  ", "2 to move, 0 to copy", "2 moved, 0 copied"),
        };
        for want in [
            format!("adopt web from {}", l.dir.display()),
            format!(
                "{verb} {} -> {}",
                l.dir.join("var.img").display(),
                env.state.join("web/var.img").display()
            ),
            format!("disks[0].path: disk image, {GIB} bytes"),
            format!(
                "{verb} {} -> {}",
                l.dir.join("home").display(),
                env.state.join("web/home").display()
            ),
            "shares[0].source: share source, 4 entries".into(),
            format!(
                "leave  {}  (symlink, not named by the spec)",
                l.dir.join("current").display()
            ),
            format!(
                "leave  {}  (socket, not named by the spec)",
                l.dir.join("web.sock").display()
            ),
            format!(
                "leave  {}  (regular file, not named by the spec)",
                l.dir.join("notify.vsock").display()
            ),
            format!("adopt: {counts}, 5 to leave (dry run: nothing changed; --apply to adopt)"),
        ] {
            assert!(out.contains(&want), "dry run lacks {want:?}:\n{out}");
        }
        let after = (
            tree(&l.dir),
            tree(&env.state),
            tree(&env.run),
            tree(&l.outside),
        );
        assert_eq!(before, after, "the dry run changed something");

        let o = adopt(&env, &l.dir, &["--apply"]);
        assert!(o.status.success(), "{}", text(&o));
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            out.contains(&format!("adopt: done: {done}, 5 left")),
            "{out}"
        );
        assert_adopted(&env, &l, u, img.ino(), img.blocks(), how);
        if how == Adopted::Copied {
            assert!(
                !sd.join(".vmwarden-adopt-0").exists()
                    && std::fs::symlink_metadata(sd.join(".vmwarden-adopt-0")).is_err(),
                "the temporary name is left"
            );
        } else {
            std::fs::remove_file(sd.join(".vmwarden-adopt-0")).unwrap();
        }
        assert_eq!(std::fs::read(&l.outside).unwrap(), b"root's\n");
        let now = std::fs::symlink_metadata(env.state.join("web/var.img")).unwrap();
        eprintln!(
            "measured: 1 GiB sparse image {how:?} with {} bytes allocated before, {} after",
            img.blocks() * 512,
            now.blocks() * 512
        );
        let v = env.verify_clean(&["web"]);
        assert!(v.status.success(), "{}", text(&v));
        // A second run finds the targets there and refuses.
        let o = adopt(&env, &l.dir, &[]);
        assert_refused(&o, &["var.img", "exists", "already there"]);
    }
}

#[test]
fn planted_symlinks_hardlinks_devices_and_mounts_are_refused_with_nothing_changed() {
    let env = Env::new();
    let u = uid(82);
    env.write_spec("web", &adopt_spec(&env, u));
    type Plant = fn(&Legacy, &Env);
    let cases: Vec<(&str, Plant, Vec<&str>)> = vec![
        (
            "image is a symlink",
            |l, _| {
                std::fs::remove_file(l.dir.join("var.img")).unwrap();
                std::os::unix::fs::symlink(&l.outside, l.dir.join("var.img")).unwrap();
            },
            vec!["var.img", "is a symlink", "disks[0].path"],
        ),
        (
            "share is a symlink",
            |l, _| {
                std::fs::rename(l.dir.join("home"), l.dir.join("home.real")).unwrap();
                std::os::unix::fs::symlink(l.dir.join("home.real"), l.dir.join("home")).unwrap();
            },
            vec!["home", "is a symlink", "shares[0].source"],
        ),
        (
            "image hard-linked elsewhere",
            |l, env| std::fs::hard_link(l.dir.join("var.img"), env.path("other-name.img")).unwrap(),
            vec!["var.img", "2 links"],
        ),
        (
            "file in the share hard-linked to a file outside DIR",
            |l, _| {
                std::fs::remove_file(l.dir.join("home/sub/deep")).unwrap();
                std::fs::hard_link(&l.outside, l.dir.join("home/sub/deep")).unwrap();
            },
            vec!["home/sub/deep", "2 links", "other names' inode"],
        ),
        (
            "device node in the share",
            |l, _| {
                nix::sys::stat::mknod(
                    &l.dir.join("home/disk"),
                    nix::sys::stat::SFlag::S_IFBLK,
                    nix::sys::stat::Mode::from_bits_truncate(0o600),
                    nix::sys::stat::makedev(8, 0),
                )
                .unwrap();
            },
            vec!["home/disk", "block device"],
        ),
        (
            "a mount inside the share",
            |l, _| {
                std::fs::create_dir(l.dir.join("home/mnt")).unwrap();
                nix::mount::mount(
                    Some("adopt-test"),
                    &l.dir.join("home/mnt"),
                    Some("tmpfs"),
                    nix::mount::MsFlags::empty(),
                    Some("size=64k"),
                )
                .unwrap();
            },
            vec![
                "home/mnt",
                "another file system",
                "does not cross file systems",
            ],
        ),
        (
            "the image is a directory",
            |l, _| {
                std::fs::remove_file(l.dir.join("var.img")).unwrap();
                std::fs::create_dir(l.dir.join("var.img")).unwrap();
            },
            vec![
                "var.img",
                "is a directory, but disks[0].path is a disk image",
            ],
        ),
    ];
    for (what, plant, want) in cases {
        let l = legacy(&env);
        plant(&l, &env);
        let before = (
            tree(&l.dir),
            tree(&env.state),
            tree(&env.run),
            tree(&l.outside),
        );
        for extra in [&[][..], &["--apply"][..]] {
            let o = adopt(&env, &l.dir, extra);
            eprintln!("{what}: {}", stderr(&o).trim());
            assert_refused(&o, &want);
            let after = (
                tree(&l.dir),
                tree(&env.state),
                tree(&env.run),
                tree(&l.outside),
            );
            assert_eq!(before, after, "{what}: the host changed");
        }
        let _ = nix::mount::umount(&l.dir.join("home/mnt"));
        std::fs::remove_dir_all(env.path("microvms")).unwrap();
        let _ = std::fs::remove_file(env.path("other-name.img"));
        let _ = std::fs::remove_file(env.path("outside-secret"));
    }
}

#[test]
fn a_running_vm_on_either_side_is_refused_with_nothing_changed() {
    let env = Env::new();
    let u = uid(83);
    let l = legacy(&env);
    let before = || (tree(&l.dir), tree(&env.state), tree(&l.outside));

    // microvm.nix's VM: its hypervisor holds the image open and runs in DIR.
    env.write_spec("web", &adopt_spec(&env, u));
    let snap = before();
    let holder = |how: &str| -> std::process::Child {
        let mut c = Command::new("/bin/sleep");
        c.arg("600").stdout(Stdio::null()).stderr(Stdio::null());
        match how {
            "image open" => {
                c.stdin(std::fs::File::open(l.dir.join("var.img")).unwrap());
            }
            "share file open" => {
                c.stdin(std::fs::File::open(l.dir.join("home/sub/deep")).unwrap());
            }
            _ => {
                c.stdin(Stdio::null()).current_dir(&l.dir);
            }
        }
        c.spawn().unwrap()
    };
    for how in ["image open", "share file open", "working directory"] {
        let mut h = holder(how);
        let o = adopt(&env, &l.dir, &["--apply"]);
        let _ = h.kill();
        let _ = h.wait();
        eprintln!("{how}: {}", stderr(&o).trim());
        assert_refused(
            &o,
            &[
                &format!("held open by process {}", h.id()),
                "stop microvm.nix's VM first",
            ],
        );
        assert_eq!(before(), snap, "{how}: the host changed");
    }

    // vmwarden's side: an instance holds the lease (a probe launched from a
    // spec without the volume, which is then configured).
    env.write_spec("web", &env.spec("web", u));
    let mut held = env.launch_cmd("web");
    held.args(["--probe", "--", "sleep", "600"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut held = held.spawn().unwrap();
    let end = std::time::Instant::now() + Duration::from_secs(30);
    while !env.run.join("web/instance.json").exists()
        || !String::from_utf8_lossy(&env.vmwarden(&["status", "web", "--json"]).stdout)
            .contains("\"state\": \"running")
    {
        assert!(std::time::Instant::now() < end, "the probe never ran");
        std::thread::sleep(Duration::from_millis(50));
    }
    env.write_spec("web", &adopt_spec(&env, u));
    let snap = before();
    let o = adopt(&env, &l.dir, &["--apply"]);
    eprintln!("vmwarden side: {}", stderr(&o).trim());
    assert_refused(&o, &["VM web is", "stop it first"]);
    assert_eq!(before(), snap, "the host changed");
    let _ = held.kill();
    let _ = held.wait();
    env.assert_clean("web");
}

#[test]
fn a_kill_after_every_step_is_finished_by_running_it_again() {
    require_fault_injection();
    let env = Env::new();
    let u = uid(84);
    env.write_spec("web", &adopt_spec(&env, u));
    // Copied (the items microvm.nix's service user owns), then moved (the
    // items root's alone).
    let runs = [
        (
            Adopted::Copied,
            [
                "record",
                "copy:var.img",
                "remove:var.img",
                "copy:home",
                "remove:home",
                "done",
            ],
            // From here on both targets are the principal's.
            &["copy:home", "remove:home"][..],
        ),
        (
            Adopted::Moved,
            [
                "record",
                "move:var.img",
                "own:var.img",
                "move:home",
                "own:home",
                "done",
            ],
            &["own:home"][..],
        ),
    ];
    for (how, steps, complete_after) in runs {
        for step in steps {
            let l = legacy(&env);
            if how == Adopted::Moved {
                make_root_only(&l);
            }
            let img = std::fs::symlink_metadata(l.dir.join("var.img")).unwrap();
            let o = env
                .vmwarden_cmd()
                .args(["adopt", "web", "--from", l.dir.to_str().unwrap(), "--apply"])
                .env("VMWARDEN_FAULT_AFTER", step)
                .stdin(Stdio::null())
                .output()
                .unwrap();
            assert_eq!(
                o.status.signal(),
                Some(9),
                "step {step}: adopt should SIGKILL itself: {}",
                text(&o)
            );
            // The record is there (but for `done`, after which it is gone),
            // and a launch meanwhile is refused by the launcher's own checks
            // while an item is missing or not yet the principal's; the cleanup
            // after it keeps the record.
            let record = env.state.join(".adopt-web.json");
            assert_eq!(record.exists(), step != "done", "step {step}");
            if step != "done" {
                // After the last item is the principal's only the record (and
                // the old inodes of a copy) is left: that state is complete and
                // a launch may run.
                let complete = complete_after.contains(&step);
                let p = env.probe("web", &["/bin/true"]);
                assert_eq!(
                    p.status.code(),
                    Some(if complete { 0 } else { 78 }),
                    "step {step}: a launch of the half-adopted VM: {}",
                    text(&p)
                );
                env.cleanup_clean("web");
                assert!(
                    record.exists(),
                    "step {step}: the cleanup removed the record"
                );
            }
            let dry = adopt(&env, &l.dir, &[]);
            if step == "done" {
                // Everything was done before the kill: a re-run finds the
                // targets there and refuses, changing nothing.
                assert_refused(&dry, &["var.img", "already there"]);
            } else {
                assert!(dry.status.success(), "step {step}: {}", text(&dry));
                assert!(
                    String::from_utf8_lossy(&dry.stdout)
                        .contains("finishing an interrupted --apply"),
                    "step {step}: {}",
                    text(&dry)
                );
                let o = adopt(&env, &l.dir, &["--apply"]);
                assert!(o.status.success(), "step {step}: {}", text(&o));
            }
            assert_adopted(&env, &l, u, img.ino(), img.blocks(), how);
            std::fs::remove_dir_all(env.path("microvms")).unwrap();
            std::fs::remove_dir_all(env.state.join("web")).unwrap();
            let _ = std::fs::remove_file(env.path("outside-secret"));
        }
    }
}

#[test]
fn bad_input_is_refused_with_a_clear_message_and_the_host_unchanged() {
    let env = Env::new();
    let u = uid(85);
    let l = legacy(&env);
    let snap = || (tree(&l.dir), tree(&env.state), tree(&env.run));
    let s0 = snap();
    // No spec.
    let o = adopt(&env, &l.dir, &["--apply"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        stderr(&o).contains(&env.config.join("web.json").display().to_string()),
        "{}",
        text(&o)
    );
    assert_eq!(snap(), s0);
    // An invalid spec: the launcher's own validation names the field.
    let mut bad = adopt_spec(&env, u);
    bad["memory_mib"] = json!(4);
    env.write_spec("web", &bad);
    let o = adopt(&env, &l.dir, &["--apply"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(stderr(&o).contains("memory_mib"), "{}", text(&o));
    env.write_spec("web", &adopt_spec(&env, u));
    let s0 = snap();
    let cases: Vec<(String, Vec<String>)> = vec![
        ("relative/dir".into(), vec!["--from".into()]),
        (
            env.path("microvms/nosuch").display().to_string(),
            vec!["no such directory".into()],
        ),
        (
            env.state.join("web").display().to_string(),
            vec!["outside vmwarden's state root".into()],
        ),
        (
            l.dir.join("var.img").display().to_string(),
            vec!["var.img".into(), "not a directory".into()],
        ),
    ];
    for (from, want) in &cases {
        let o = env.vmwarden(&["adopt", "web", "--from", from, "--apply"]);
        eprintln!("--from {from}: {}", stderr(&o).trim());
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        for w in want {
            assert!(
                stderr(&o).contains(w.as_str()),
                "--from {from}: lacks {w:?}: {}",
                text(&o)
            );
        }
        assert_eq!(snap(), s0, "--from {from}: the host changed");
    }
    // A volume that is not in DIR (and is not created at launch).
    std::fs::rename(l.dir.join("var.img"), env.path("var.img.aside")).unwrap();
    let s1 = snap();
    let o = adopt(&env, &l.dir, &["--apply"]);
    assert_refused(
        &o,
        &["var.img", "does not exist", "disks[0].path", "check --from"],
    );
    assert_eq!(snap(), s1);
    std::fs::rename(env.path("var.img.aside"), l.dir.join("var.img")).unwrap();
    // A target that exists.
    std::fs::create_dir_all(env.state.join("web")).unwrap();
    std::fs::write(env.state.join("web/var.img"), b"already here").unwrap();
    let s2 = snap();
    let o = adopt(&env, &l.dir, &["--apply"]);
    assert_refused(&o, &["var.img", "exists", "never replaces a target"]);
    assert_eq!(snap(), s2);
    std::fs::remove_dir_all(env.state.join("web")).unwrap();
    // A spec that places nothing in the state dir.
    env.write_spec("web", &env.spec("web", u));
    let o = adopt(&env, &l.dir, &["--apply"]);
    assert_refused(
        &o,
        &["names no disk image or share source", "nothing to adopt"],
    );
    // DIR on another file system than the state root: refused, not copied.
    env.write_spec("web", &adopt_spec(&env, u));
    let shm = tempfile::tempdir_in("/dev/shm").unwrap();
    let other = shm.path().join("web");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("var.img"), b"x").unwrap();
    std::fs::create_dir(other.join("home")).unwrap();
    let s3 = (snap(), tree(&other));
    let o = env.vmwarden(&["adopt", "web", "--from", other.to_str().unwrap(), "--apply"]);
    assert_refused(&o, &["another file system", "within one file system"]);
    assert_eq!((snap(), tree(&other)), s3);
}

/// The guide (docs/migrating-from-microvm-nix.md, "One VM at a time"), end to end: a
/// microvm.nix-shaped state dir whose volume and share hold data written
/// before is adopted (dry run, then --apply), verify-clean passes, the VM
/// is launched under vmwarden (QEMU, TCG) and its guest reads that data
/// from the volume and the share, and the stop is proven clean.
#[test]
fn the_migration_guide_end_to_end_the_guest_reads_the_data_written_before() {
    let env = Env::new();
    let u = uid(86);
    let l = legacy(&env);
    let script = "\
echo \"T-VOLUME $(head -c 37 /dev/vda)\"
mkdir -p /home && mount -t 9p -o trans=virtio,version=9p2000.L home /home || echo T-MOUNT-FAILED
echo \"T-SHARE $(cat /home/hello)\"
echo written-under-vmwarden >/home/after && echo T-WROTE
sync; umount /home
";
    let mut spec = env.shares_spec("web", u, "oneshot", script);
    spec["disks"] = json!([{ "path": env.state.join("web/var.img"), "serial": "var" }]);
    spec["shares"] =
        json!([{ "tag": "home", "source": env.state.join("web/home"), "proto": "9p" }]);
    env.write_spec("web", &spec);

    // 1. The dry run, then --apply.
    let o = adopt(&env, &l.dir, &[]);
    assert!(o.status.success(), "{}", text(&o));
    let o = adopt(&env, &l.dir, &["--apply"]);
    assert!(o.status.success(), "{}", text(&o));
    // 2. verify-clean.
    let v = env.verify_clean(&["web"]);
    assert!(v.status.success(), "{}", text(&v));
    // 3. The launch; the guest reads what was written before.
    let mut g = spawn_logged(env.launch_cmd("web"), env.path("web.guide.log"));
    g.wait_for("VMWARDEN-GUEST-READY", Duration::from_secs(180));
    let status = g
        .wait_exit(Duration::from_secs(60))
        .expect("the oneshot guest powers off");
    assert!(status.success(), "QEMU: {status:?}\n{}", g.log_text());
    let out = g.log_text();
    for want in [
        "T-VOLUME VOLUME-DATA-WRITTEN-UNDER-MICROVM-NIX",
        "T-SHARE share-data-written-under-microvm-nix",
        "T-WROTE",
        "VMWARDEN-RUN-END rc=0",
    ] {
        assert!(out.contains(want), "guest output lacks {want:?}:\n{out}");
    }
    assert!(!out.contains("T-MOUNT-FAILED"), "{out}");
    // What the guest wrote is the principal's, in the adopted share.
    let md = std::fs::symlink_metadata(env.state.join("web/home/after")).unwrap();
    assert_eq!(md.uid(), u);
    // 4. The stop is proven clean; microvm.nix's leftovers are still in DIR.
    env.assert_clean("web");
    std::fs::symlink_metadata(l.dir.join("current")).unwrap();
}

/// The old owner's process (microvm.nix's service user, or its
/// compromised QEMU) before the adoption: maps the image `MAP_SHARED`,
/// opens the image, a file of the share (read-write) and a directory of
/// it, passes the three descriptors into a unix socket it keeps (in
/// flight: no scan of `/proc` sees them) and closes its own. After
/// `adopt --apply` it writes through all of them, then reads what the
/// principal wrote afterwards.
const OLD_OWNER: &str = r#"
import ctypes, os, socket, sys
img, hello, sub = sys.argv[1:4]
a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
fd = os.open(img, os.O_RDWR)
# mmap(2) itself: Python's mmap module would keep a descriptor of its own.
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
addr = libc.mmap(None, 4096, 3, 1, fd, 0)  # PROT_READ|PROT_WRITE, MAP_SHARED
assert addr not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
m = (ctypes.c_char * 4096).from_address(addr)
fds = [fd, os.open(hello, os.O_RDWR), os.open(sub, os.O_RDONLY | os.O_DIRECTORY)]
socket.send_fds(a, [b"x"], fds)
for f in fds:
    os.close(f)
a.close()
os.chdir("/")
print("HOLDING", flush=True)
sys.stdin.readline()
_, (img_fd, hello_fd, sub_fd), _, _ = socket.recv_fds(b, 16, 3)
m[1024:1028] = b"EVIL"
libc.msync(ctypes.c_void_p(addr), ctypes.c_size_t(4096), 4)  # MS_SYNC
os.pwrite(img_fd, b"EVIL-FD", 2048)
os.pwrite(hello_fd, b"EVIL-HELLO", 0)
for what, name, flags in [("PLANTED", "planted", os.O_WRONLY | os.O_CREAT), ("DEEP", "deep", os.O_RDWR)]:
    try:
        f = os.open(name, flags, 0o644, dir_fd=sub_fd)
        os.pwrite(f, b"EVIL-" + what.encode(), 0)
        print(what, "written", flush=True)
    except OSError as e:
        print(what, "refused", e.errno, flush=True)
print("WROTE", flush=True)
sys.stdin.readline()
print("READ-MAP", bytes(m[3072:3088]).hex(), flush=True)
print("READ-FD", os.pread(img_fd, 16, 3072).hex(), flush=True)
print("READ-HELLO", os.pread(hello_fd, 16, 100).hex(), flush=True)
print("DONE", flush=True)
"#;

/// A line-by-line view of a child's stdout, each wait bounded.
struct Lines(std::sync::mpsc::Receiver<String>);

impl Lines {
    fn of(out: std::process::ChildStdout) -> Lines {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Lines(rx)
    }

    /// Every line up to and including the one that starts with `marker`.
    fn until(&self, marker: &str) -> Vec<String> {
        let mut seen = Vec::new();
        loop {
            let l = self
                .0
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|e| panic!("no {marker} from the old owner ({e}); saw {seen:?}"));
            let done = l.starts_with(marker);
            seen.push(l);
            if done {
                return seen;
            }
        }
    }
}

/// `adopt` takes the files away from their old owner for good. chown
/// revokes nothing already open: a `MAP_SHARED` mapping of the disk image
/// and descriptors passed in a unix socket before `adopt --apply` kept the
/// old owner's read-write access to the adopted image and share (0600 and
/// 0700 the principal's). Now such items get new inodes and the old ones
/// are removed from DIR: after the adoption, writes through those handles
/// do not reach the adopted data, and reads through them do not see what
/// the principal writes afterwards.
#[test]
fn adopt_takes_the_files_away_from_their_old_owner_for_good() {
    let env = Env::new();
    let (u, old) = (uid(305), uid(90));
    let l = legacy(&env);
    // What the guest wrote into its share is the service user's.
    std::os::unix::fs::chown(l.dir.join("home/hello"), Some(old), Some(old)).unwrap();
    env.write_spec("web", &adopt_spec(&env, u));
    let script = env.path("old-owner.py");
    std::fs::write(&script, OLD_OWNER).unwrap();
    let mut holder = Command::new("setpriv")
        .arg(format!("--reuid={old}"))
        .arg(format!("--regid={old}"))
        .arg("--clear-groups")
        .arg("/usr/bin/python3")
        .arg(&script)
        .arg(l.dir.join("var.img"))
        .arg(l.dir.join("home/hello"))
        .arg(l.dir.join("home/sub"))
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let lines = Lines::of(holder.stdout.take().unwrap());
    let mut to_holder = holder.stdin.take().unwrap();
    lines.until("HOLDING");

    let o = adopt(&env, &l.dir, &["--apply"]);
    assert!(o.status.success(), "{}", text(&o));
    eprintln!("{}", String::from_utf8_lossy(&o.stdout));

    // The old owner writes through everything it kept.
    std::io::Write::write_all(&mut to_holder, b"go\n").unwrap();
    let wrote = lines.until("WROTE");
    eprintln!("the old owner after the adoption: {wrote:?}");
    let img = env.state.join("web/var.img");
    let data = std::fs::read(&img).map(|b| b[..4096].to_vec()).unwrap();
    let hello = std::fs::read(env.state.join("web/home/hello")).unwrap();
    let deep = std::fs::read(env.state.join("web/home/sub/deep")).unwrap();
    assert!(
        &data[1024..1028] != b"EVIL" && &data[2048..2055] != b"EVIL-FD",
        "the old owner's mapping or descriptor wrote into the adopted image: {:?} / {:?}",
        String::from_utf8_lossy(&data[1024..1028]),
        String::from_utf8_lossy(&data[2048..2055])
    );
    assert_eq!(&data[..MARK.len()], MARK);
    assert_eq!(
        hello, b"share-data-written-under-microvm-nix\n",
        "the old owner's descriptor wrote into the adopted share"
    );
    assert_eq!(
        deep, b"deep\n",
        "the old owner's directory reached the adopted share"
    );
    assert!(
        !env.state.join("web/home/sub/planted").exists(),
        "the old owner's directory planted a file in the adopted share"
    );

    // The principal writes; the old owner reads through what it kept.
    let later = b"PRINCIPAL-LATER!";
    for (p, at) in [(&img, 3072), (&env.state.join("web/home/hello"), 100)] {
        let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, later, at).unwrap();
        f.sync_all().unwrap();
    }
    std::io::Write::write_all(&mut to_holder, b"go\n").unwrap();
    let read = lines.until("DONE");
    let later_hex: String = later.iter().map(|b| format!("{b:02x}")).collect();
    for l in &read {
        assert!(
            !l.contains(&later_hex),
            "the old owner read the principal's later writes: {l} ({read:?})"
        );
    }
    eprintln!("the old owner's reads after the principal wrote: {read:?}");
    let _ = holder.kill();
    let _ = holder.wait();
    let v = env.verify_clean(&["web"]);
    assert!(v.status.success(), "{}", text(&v));
}

/// The copies need room: an adoption whose copies do not fit on the state
/// root's file system is refused before anything changes, saying how much
/// is needed and free; with room, the 1 GiB sparse image is copied with
/// its holes (it would not fit otherwise).
#[test]
fn a_copy_that_does_not_fit_is_refused_before_anything_changes() {
    let env = Env::new();
    let u = uid(306);
    // A small file system holding DIR and the state root.
    let small = env.path("small");
    std::fs::create_dir(&small).unwrap();
    nix::mount::mount(
        Some("adopt-room"),
        &small,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("size=64m,mode=0755"),
    )
    .unwrap();
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
        }
    }
    let _unmount = Unmount(small.clone());
    let dir = small.join("microvms/web");
    std::fs::create_dir_all(&dir).unwrap();
    let img = dir.join("var.img");
    let f = std::fs::File::create(&img).unwrap();
    f.set_len(GIB).unwrap();
    // 40 MiB of data in a 1 GiB image: a copy needs 40 MiB more of the 64.
    let chunk = vec![0xa5u8; 1 << 20];
    for i in 0..40u64 {
        std::os::unix::fs::FileExt::write_all_at(&f, &chunk, i * 16 * (1 << 20)).unwrap();
    }
    f.sync_all().unwrap();
    drop(f);
    std::os::unix::fs::chown(&img, Some(uid(90)), Some(uid(90))).unwrap();
    let state = small.join("state");
    let mut spec = env.spec("web", u);
    spec["disks"] = json!([{ "path": state.join("web/var.img"), "serial": "var" }]);
    env.write_spec("web", &spec);
    let adopt_small = |extra: &[&str]| {
        Command::new(VMWARDEN)
            .arg("--config-dir")
            .arg(&env.config)
            .arg("--runtime-root")
            .arg(&env.run)
            .arg("--state-root")
            .arg(&state)
            .args(["adopt", "web", "--from", dir.to_str().unwrap()])
            .args(extra)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let before = (tree(&small), tree(&env.run));
    for extra in [&[][..], &["--apply"]] {
        let o = adopt_small(extra);
        eprintln!("{}", stderr(&o).trim());
        assert_refused(
            &o,
            &[
                "the new copies need",
                "bytes free",
                "var.img",
                "free that much room there",
            ],
        );
        assert_eq!((tree(&small), tree(&env.run)), before, "the host changed");
    }
    // With room, the copy keeps the holes (a 1 GiB image in 128 MiB).
    nix::mount::mount(
        None::<&str>,
        &small,
        None::<&str>,
        nix::mount::MsFlags::MS_REMOUNT,
        Some("size=128m"),
    )
    .unwrap();
    let o = adopt_small(&["--apply"]);
    assert!(o.status.success(), "{}", text(&o));
    let md = std::fs::symlink_metadata(state.join("web/var.img")).unwrap();
    assert_eq!((md.len(), md.uid()), (GIB, u));
    assert!(
        md.blocks() * 512 <= 41 << 20,
        "the copy allocated {} bytes for 40 MiB of data",
        md.blocks() * 512
    );
    assert!(!img.exists(), "the old image is left in DIR");
    eprintln!(
        "measured: 1 GiB image with 40 MiB of data copied on tmpfs: {} bytes allocated",
        md.blocks() * 512
    );
}

/// Free bytes (`f_bavail`) on the file system of `p`.
fn free_bytes(p: &Path) -> u64 {
    let v = nix::sys::statvfs::statvfs(p).unwrap();
    v.blocks_available() * v.fragment_size()
}

/// Where the file system makes reflinks (XFS here, loop-mounted), the new
/// inodes share the old ones' blocks: the plan counts no room for the data
/// and says so, an image whose plain copy would not fit is adopted, and
/// between the copy and the removal of the old inode (a kill after
/// `copy:var.img`, fault injection) both exist with the blocks of one.
#[test]
fn a_copy_shares_blocks_where_the_file_system_makes_reflinks() {
    require_fault_injection();
    let env = Env::new();
    let u = uid(307);
    assert!(
        Path::new("/usr/sbin/mkfs.xfs").exists() || Path::new("/sbin/mkfs.xfs").exists(),
        "this test needs mkfs.xfs (xfsprogs): run tests/setup-host.sh"
    );
    let img_file = env.path("xfs.img");
    std::fs::File::create(&img_file)
        .unwrap()
        .set_len(300 << 20)
        .unwrap();
    let out = Command::new("mkfs.xfs")
        .arg("-q")
        .arg(&img_file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let fs = env.path("xfs");
    std::fs::create_dir(&fs).unwrap();
    let out = Command::new("mount")
        .args(["-o", "loop"])
        .arg(&img_file)
        .arg(&fs)
        .output()
        .unwrap();
    assert!(out.status.success(), "mount -o loop: {}", text(&out));
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            // A loop mount detaches its device when unmounted.
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(fs.clone());
    std::fs::set_permissions(&fs, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let dir = fs.join("microvms/web");
    std::fs::create_dir_all(&dir).unwrap();
    let img = dir.join("var.img");
    let f = std::fs::File::create(&img).unwrap();
    f.set_len(GIB).unwrap();
    // 160 MiB of data: a plain copy needs 160 MiB more than the ~70 free.
    let mut chunk = vec![0u8; 1 << 20];
    for i in 0..160u64 {
        chunk
            .iter_mut()
            .enumerate()
            .for_each(|(j, b)| *b = (i as u8) ^ (j as u8));
        std::os::unix::fs::FileExt::write_all_at(&f, &chunk, i * 4 * (1 << 20)).unwrap();
    }
    f.sync_all().unwrap();
    drop(f);
    std::os::unix::fs::chown(&img, Some(uid(90)), Some(uid(90))).unwrap();
    let state = fs.join("state");
    let mut spec = env.spec("web", u);
    spec["disks"] = json!([{ "path": state.join("web/var.img"), "serial": "var" }]);
    env.write_spec("web", &spec);
    let adopt_xfs = |extra: &[&str], fault: Option<&str>| {
        let mut c = Command::new(VMWARDEN);
        c.arg("--config-dir")
            .arg(&env.config)
            .arg("--runtime-root")
            .arg(&env.run)
            .arg("--state-root")
            .arg(&state)
            .args(["adopt", "web", "--from", dir.to_str().unwrap()])
            .args(extra)
            .stdin(Stdio::null());
        if let Some(step) = fault {
            c.env("VMWARDEN_FAULT_AFTER", step);
        }
        c.output().unwrap()
    };
    let free_before = free_bytes(&fs);
    assert!(
        free_before < 160 << 20,
        "{free_before} bytes free: the test needs less than a copy"
    );
    let dry = adopt_xfs(&[], None);
    assert!(dry.status.success(), "{}", text(&dry));
    let plan = String::from_utf8_lossy(&dry.stdout).into_owned();
    assert!(
        plan.contains("copy   ") && plan.contains("(reflinks)"),
        "{plan}"
    );
    let o = adopt_xfs(&["--apply"], Some("copy:var.img"));
    assert_eq!(o.status.signal(), Some(9), "{}", text(&o));
    let (old, new) = (
        std::fs::symlink_metadata(&img).unwrap(),
        std::fs::symlink_metadata(state.join("web/var.img")).unwrap(),
    );
    assert_ne!(old.ino(), new.ino());
    let used = free_before.saturating_sub(free_bytes(&fs));
    assert!(
        used < 8 << 20,
        "the copy took {used} bytes: its blocks are not shared with the original"
    );
    eprintln!(
        "measured: 160 MiB of data reflinked on XFS: {used} bytes used by the copy, {} bytes allocated to it",
        new.blocks() * 512
    );
    let o = adopt_xfs(&["--apply"], None);
    assert!(o.status.success(), "{}", text(&o));
    assert!(!img.exists());
    let md = std::fs::symlink_metadata(state.join("web/var.img")).unwrap();
    assert_eq!((md.len(), md.uid(), md.mode() & 0o7777), (GIB, u, 0o600));
    let got = std::fs::File::open(state.join("web/var.img")).unwrap();
    for i in [0u64, 77, 159] {
        let mut b = vec![0u8; 1 << 20];
        std::os::unix::fs::FileExt::read_exact_at(&got, &mut b, i * 4 * (1 << 20)).unwrap();
        assert!(
            b.iter()
                .enumerate()
                .all(|(j, x)| *x == (i as u8) ^ (j as u8)),
            "chunk {i} differs"
        );
    }
}

/// The old owner's swap, in the window between the plan and the move: it
/// renames root's image out of the way (DIR is its own), puts a file of
/// its own under the name, maps it `MAP_SHARED` and closes the descriptor
/// (no scan of `/proc/*/fd` sees a mapping). Later it writes through the
/// mapping.
/// Whether process `pid` is stopped (state `T` in `/proc/PID/stat`).
fn stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.starts_with('T')))
        .unwrap_or(false)
}

/// adopt moves only what no one but root could have named. A root-only
/// item is moved (the same inode, given to the VM) only from a DIR that
/// is root's: in the old owner's DIR, the old owner chooses what each
/// name points at, and (1) renames onto the image's name a root-only file
/// of someone else's (here another root-only file in DIR, which it cannot
/// read), or (2) the items were made root's alone by hand, with whatever
/// handles the old owner took before. Either way adopt copies as the old
/// owner, which cannot read them: refused, nothing changed, nothing of
/// root's given to the VM. (3) In a DIR that is root's, a directory in an
/// item another user may write (it could rename in it what root, the old
/// owner then, reads and removes) is refused too, and so is (4) a root's
/// DIR in a directory another user may write (microvm.nix's state root is
/// `microvm:kvm` 0775), which could rename a directory of root's onto
/// DIR's name.
#[test]
fn adopt_moves_only_what_no_one_but_root_could_have_named() {
    let old = uid(90);
    for case in [
        "renamed onto the name",
        "made root's by hand",
        "another's directory in root's DIR",
        "root's DIR in another's directory",
    ] {
        let env = Env::new();
        let u = uid(308);
        let l = legacy(&env);
        env.write_spec("web", &adopt_spec(&env, u));
        if case == "renamed onto the name" {
            let other = l.dir.join("other.img");
            std::fs::write(&other, b"ROOT-ONLY-NOT-THIS-VMS\n").unwrap();
            std::fs::set_permissions(&other, std::os::unix::fs::PermissionsExt::from_mode(0o600))
                .unwrap();
            let out = Command::new("setpriv")
                .arg(format!("--reuid={old}"))
                .arg(format!("--regid={old}"))
                .arg("--clear-groups")
                .args(["/usr/bin/python3", "-c"])
                .arg(format!(
                    "import os\nd = {:?}\nos.rename(d + '/var.img', d + '/var.img.mine')\nos.rename(d + '/other.img', d + '/var.img')\nprint('RENAMED')\n",
                    l.dir.to_str().unwrap()
                ))
                .current_dir("/")
                .output()
                .unwrap();
            assert!(
                String::from_utf8_lossy(&out.stdout).contains("RENAMED"),
                "{}",
                text(&out)
            );
        } else if case == "made root's by hand" {
            make_root_only(&l);
            // The old owner's DIR, as microvm.nix leaves it.
            std::os::unix::fs::chown(&l.dir, Some(old), Some(old)).unwrap();
        } else if case == "another's directory in root's DIR" {
            make_root_only(&l);
            std::os::unix::fs::chown(l.dir.join("home/sub"), Some(old), Some(old)).unwrap();
        } else {
            make_root_only(&l);
            std::os::unix::fs::chown(l.dir.parent().unwrap(), Some(old), Some(old)).unwrap();
        }
        let before = (tree(&l.dir), tree(&env.state));
        let o = adopt(&env, &l.dir, &["--apply"]);
        eprintln!("{case}: {}", text(&o));
        assert!(
            std::fs::symlink_metadata(env.state.join("web/var.img")).is_err(),
            "{case}: a root-only file in its old owner's DIR became the VM's disk: {}",
            text(&o)
        );
        if case == "another's directory in root's DIR" {
            assert_refused(&o, &["home/sub", "in a DIR that is root's"]);
        } else if case == "root's DIR in another's directory" {
            assert_refused(&o, &["microvms", "onto DIR's name"]);
        } else {
            assert_refused(&o, &["var.img", "cannot read it", "DIR's owner"]);
        }
        assert_eq!(
            (tree(&l.dir), tree(&env.state)),
            before,
            "{case}: a refusal changed the host"
        );
    }
}

/// `adopt`, copying a sparse file its old owner keeps filling, cannot use
/// up the root reserve. The plan counts the copy's room from the image's
/// allocated size; the old owner then writes into its holes (here between
/// the plan and the copy: `adopt --apply` stopped after its record, fault
/// injection), so the copy needs more than users have free, though less
/// than root may take (ext4 keeps 10% for root here). The copy must stop
/// short of the reserve and fail cleanly: no partial file, the old image
/// as its owner left it, the free room as before. (Without the bound, the
/// copy went on into the reserve: a kill right after it shows the host
/// with no room left for anyone but root.)
#[test]
fn adopt_copying_a_sparse_file_its_old_owner_keeps_filling_cannot_use_up_the_root_reserve() {
    require_fault_injection();
    const MIB: u64 = 1 << 20;
    let env = Env::new();
    let (u, old) = (uid(309), uid(90));
    let img_file = env.path("ext4.img");
    std::fs::File::create(&img_file)
        .unwrap()
        .set_len(256 * MIB)
        .unwrap();
    let out = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-m", "10"])
        .arg(&img_file)
        .output()
        .unwrap();
    assert!(out.status.success(), "mkfs.ext4: {}", text(&out));
    let fs = env.path("ext4");
    std::fs::create_dir(&fs).unwrap();
    let out = Command::new("mount")
        .args(["-o", "loop"])
        .arg(&img_file)
        .arg(&fs)
        .output()
        .unwrap();
    assert!(out.status.success(), "mount -o loop: {}", text(&out));
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            // A loop mount detaches its device when unmounted.
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(fs.clone());
    std::fs::set_permissions(&fs, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let dir = fs.join("microvms/web");
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::chown(&dir, Some(old), Some(old)).unwrap();
    let img = dir.join("var.img");
    let f = std::fs::File::create(&img).unwrap();
    f.set_len(GIB).unwrap();
    // 8 MiB of data in a 1 GiB image, the old owner's (so it is copied).
    std::os::unix::fs::FileExt::write_all_at(&f, &vec![0xa5u8; 8 << 20], 0).unwrap();
    f.sync_all().unwrap();
    drop(f);
    std::os::unix::fs::chown(&img, Some(old), Some(old)).unwrap();
    let state = fs.join("state");
    let mut spec = env.spec("web", u);
    spec["disks"] = json!([{ "path": state.join("web/var.img"), "serial": "var" }]);
    env.write_spec("web", &spec);

    let mut run = Command::new(VMWARDEN);
    run.arg("--config-dir")
        .arg(&env.config)
        .arg("--runtime-root")
        .arg(&env.run)
        .arg("--state-root")
        .arg(&state)
        .args(["adopt", "web", "--from", dir.to_str().unwrap(), "--apply"])
        .env("VMWARDEN_FAULT_STOP", "record")
        .env("VMWARDEN_FAULT_AFTER", "copy:var.img")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = run.spawn().unwrap();
    let pid = child.id();
    wait_until(
        "adopt --apply stopped after its record",
        Duration::from_secs(30),
        || stopped(pid),
    );
    // The old owner fills holes: as much as leaves a copy of the image
    // bigger than what users have free, but within what root may take.
    let v = nix::sys::statvfs::statvfs(&fs).unwrap();
    let (avail, bfree) = (
        v.blocks_available() * v.fragment_size(),
        v.blocks_free() * v.fragment_size(),
    );
    let reserve = bfree - avail;
    assert!(
        reserve >= 16 * MIB,
        "ext4 keeps only {reserve} bytes for root"
    );
    let fill = ((avail - 8 * MIB) / 2 + reserve / 4) / MIB;
    let out = Command::new("setpriv")
        .arg(format!("--reuid={old}"))
        .arg(format!("--regid={old}"))
        .arg("--clear-groups")
        .args(["/usr/bin/python3", "-c"])
        .arg(format!(
            "import os\nfd = os.open({:?}, os.O_RDWR)\nb = b'\\x5a' * (1 << 20)\nfor i in range({fill}):\n    os.pwrite(fd, b, (64 << 20) + i * (4 << 20))\nos.fsync(fd)\nprint('FILLED')\n",
            img.to_str().unwrap()
        ))
        .current_dir("/")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the old owner's writes: {}",
        text(&out)
    );
    let old_ino = std::fs::symlink_metadata(&img).unwrap().ino();
    let before = (free_bytes(&fs), tree(&dir));
    eprintln!(
        "{avail} bytes free to users and {reserve} kept for root at the plan; the old owner then wrote {fill} MiB into the image's holes"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap()),
        nix::sys::signal::Signal::SIGCONT,
    )
    .unwrap();
    let o = child.wait_with_output().unwrap();
    eprintln!("adopt --apply: {}", text(&o));
    let v = nix::sys::statvfs::statvfs(&fs).unwrap();
    let (avail_now, bfree_now) = (
        v.blocks_available() * v.fragment_size(),
        v.blocks_free() * v.fragment_size(),
    );
    assert!(
        bfree_now >= reserve && avail_now > 0,
        "the copy used the root reserve: {} of its {reserve} bytes taken, {avail_now} bytes left free to users ({})",
        reserve.saturating_sub(bfree_now),
        text(&o)
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(stderr(&o).contains("ran out of room"), "{}", text(&o));
    // No partial copy; the old image as its owner left it; the room back.
    for p in ["web/var.img", "web/.vmwarden-adopt-0"] {
        assert!(
            std::fs::symlink_metadata(state.join(p)).is_err(),
            "{p} is left"
        );
    }
    assert_eq!(std::fs::symlink_metadata(&img).unwrap().ino(), old_ino);
    assert_eq!(tree(&dir), before.1, "DIR changed");
    // A directory block of the state dir may stay allocated.
    let free_after = free_bytes(&fs);
    assert!(
        free_after.abs_diff(before.0) <= 64 << 10,
        "{} bytes free after the failed copy, {} before: the partial copy is left",
        free_after,
        before.0
    );
}

/// `adopt`, copying a share its old owner keeps growing, cannot use up the
/// root reserve. The bound on the copy's room must hold for every block
/// root's copy allocates, not only for file data: a directory (or a long
/// symlink) takes a block of its own. The plan counts the share's entries
/// as they were; the old owner then (here: `adopt --apply` stopped after
/// its record, fault injection) adds a few thousand empty directories to
/// its share and fills what users have free. Root's `mkdir` of each copy
/// may take the blocks kept for root (ext4 keeps 10% here), so the copy
/// must look at the free room before every entry it makes, stop short of
/// the reserve and fail cleanly: no partial copy, DIR as its owner left
/// it, the reserve whole. (Without the bound, a kill right after
/// `copy:home` shows the copy finished inside the reserve.)
#[test]
fn adopt_copying_a_share_its_old_owner_keeps_growing_cannot_use_up_the_root_reserve() {
    require_fault_injection();
    const MIB: u64 = 1 << 20;
    let env = Env::new();
    let (u, old) = (uid(310), uid(90));
    let img_file = env.path("ext4.img");
    std::fs::File::create(&img_file)
        .unwrap()
        .set_len(256 * MIB)
        .unwrap();
    let out = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-m", "10"])
        .arg(&img_file)
        .output()
        .unwrap();
    assert!(out.status.success(), "mkfs.ext4: {}", text(&out));
    let fs = env.path("ext4");
    std::fs::create_dir(&fs).unwrap();
    let out = Command::new("mount")
        .args(["-o", "loop"])
        .arg(&img_file)
        .arg(&fs)
        .output()
        .unwrap();
    assert!(out.status.success(), "mount -o loop: {}", text(&out));
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            // A loop mount detaches its device when unmounted.
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(fs.clone());
    std::fs::set_permissions(&fs, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let dir = fs.join("microvms/web");
    let home = dir.join("home");
    // The share holds directories only: no file data, whose copy the
    // bound already covers.
    std::fs::create_dir_all(home.join("sub")).unwrap();
    for p in [&dir, &home, &home.join("sub")] {
        std::os::unix::fs::chown(p, Some(old), Some(old)).unwrap();
    }
    let state = fs.join("state");
    let mut spec = env.spec("web", u);
    spec["shares"] = json!([{ "tag": "home", "source": state.join("web/home"), "proto": "9p" }]);
    env.write_spec("web", &spec);

    let mut run = Command::new(VMWARDEN);
    run.arg("--config-dir")
        .arg(&env.config)
        .arg("--runtime-root")
        .arg(&env.run)
        .arg("--state-root")
        .arg(&state)
        .args(["adopt", "web", "--from", dir.to_str().unwrap(), "--apply"])
        .env("VMWARDEN_FAULT_STOP", "record")
        .env("VMWARDEN_FAULT_AFTER", "copy:home")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = run.spawn().unwrap();
    let pid = child.id();
    wait_until(
        "adopt --apply stopped after its record",
        Duration::from_secs(30),
        || stopped(pid),
    );
    let v = nix::sys::statvfs::statvfs(&fs).unwrap();
    let reserve = (v.blocks_free() - v.blocks_available()) * v.fragment_size();
    assert!(
        reserve >= 16 * MIB,
        "ext4 keeps only {reserve} bytes for root"
    );
    // Directories for about half the reserve, then everything users have
    // free filled (a file in DIR, the old owner's).
    let dirs = reserve / 2 / v.fragment_size();
    let out = Command::new("setpriv")
        .arg(format!("--reuid={old}"))
        .arg(format!("--regid={old}"))
        .arg("--clear-groups")
        .args(["/usr/bin/python3", "-c"])
        .arg(format!(
            "import os, errno\nfor i in range({dirs}):\n    os.mkdir(os.path.join({home:?}, 'd%d' % i))\nfd = os.open({filler:?}, os.O_WRONLY | os.O_CREAT, 0o600)\nfor size in (1 << 20, 4096):\n    while True:\n        try:\n            os.write(fd, b'\\x5a' * size)\n        except OSError as e:\n            if e.errno != errno.ENOSPC:\n                raise\n            break\nos.fsync(fd)\nprint('FILLED')\n",
            home = home.to_str().unwrap(),
            filler = dir.join("filler").to_str().unwrap(),
        ))
        .current_dir("/")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the old owner's writes: {}",
        text(&out)
    );
    let before = tree(&dir);
    eprintln!(
        "{reserve} bytes kept for root; the old owner added {dirs} directories to its share after the plan and filled the {} bytes users had free",
        free_bytes(&fs)
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap()),
        nix::sys::signal::Signal::SIGCONT,
    )
    .unwrap();
    let o = child.wait_with_output().unwrap();
    eprintln!("adopt --apply: {}", text(&o));
    let v = nix::sys::statvfs::statvfs(&fs).unwrap();
    let bfree_now = v.blocks_free() * v.fragment_size();
    // The state dir's own directory block may come out of the reserve.
    assert!(
        bfree_now + (64 << 10) >= reserve,
        "the copy used the root reserve: {} of its {reserve} bytes taken ({})",
        reserve.saturating_sub(bfree_now),
        text(&o)
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(stderr(&o).contains("ran out of room"), "{}", text(&o));
    for p in ["web/home", "web/.vmwarden-adopt-0"] {
        assert!(
            std::fs::symlink_metadata(state.join(p)).is_err(),
            "{p} is left"
        );
    }
    assert_eq!(tree(&dir), before, "DIR changed");
}

/// The old owner's swap: its own directory `victim`, holding a root-only
/// subtree (`rootdata/`, 0700, with `secret`) that it can neither read nor
/// delete itself, renamed onto DIR/home (the real `home` renamed away).
fn swap_in_roots_subtree(env: &Env, l: &Legacy, old: u32) -> PathBuf {
    let victim = env.path("microvms/db");
    std::fs::create_dir_all(victim.join("rootdata")).unwrap();
    std::fs::write(victim.join("rootdata/secret"), b"root's data\n").unwrap();
    std::fs::set_permissions(
        victim.join("rootdata"),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    std::os::unix::fs::chown(&victim, Some(old), Some(old)).unwrap();
    std::os::unix::fs::chown(victim.parent().unwrap(), Some(old), Some(old)).unwrap();
    let out = Command::new("setpriv")
        .arg(format!("--reuid={old}"))
        .arg(format!("--regid={old}"))
        .arg("--clear-groups")
        .args(["/usr/bin/python3", "-c"])
        .arg(format!(
            "import os, shutil\nd, v = {:?}, {:?}\ntry:\n    shutil.rmtree(v + '/rootdata')\n    print('OLD OWNER DELETED IT ITSELF')\nexcept OSError as e:\n    print('old owner cannot delete it:', e)\ntry:\n    open(v + '/rootdata/secret').read()\n    print('OLD OWNER READ IT ITSELF')\nexcept OSError as e:\n    print('old owner cannot read it:', e)\nos.rename(d + '/home', d + '/home.mine')\nos.rename(v, d + '/home')\nprint('SWAPPED')\n",
            l.dir.to_str().unwrap(),
            victim.to_str().unwrap()
        ))
        .current_dir("/")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("SWAPPED") && !said.contains("ITSELF"),
        "{}",
        text(&out)
    );
    l.dir.join("home/rootdata/secret")
}

/// adopt reads and removes only what the old owner could. DIR is its old
/// owner's, who may rename anything in it at any time: it renames onto
/// the share's name a directory of its own holding a subtree of root's
/// that it can neither read nor delete itself, (1) before the run, (2)
/// after the record (`VMWARDEN_FAULT_STOP=record`; in life, any time
/// before the copy reaches it), (3) after the copy, before the old inodes
/// are removed (`copy:home`; in life, the copy's whole duration, or any
/// time before a re-run of an interrupted adoption). Root, reading and
/// removing with DIR's owner's file-system ids, must neither give root's
/// file to the VM nor delete it.
#[test]
fn adopt_reads_and_removes_only_what_the_old_owner_could() {
    require_fault_injection();
    let old = uid(90);
    for (i, stop) in [None, Some("record"), Some("copy:home")]
        .into_iter()
        .enumerate()
    {
        let env = Env::new();
        let u = uid(312 + u32::try_from(i).unwrap());
        let l = legacy(&env);
        env.write_spec("web", &adopt_spec(&env, u));
        let leaked = env.state.join("web/home/rootdata/secret");
        let o = match stop {
            None => {
                let secret = swap_in_roots_subtree(&env, &l, old);
                let before = (tree(&l.dir), tree(&env.state));
                let o = adopt(&env, &l.dir, &["--apply"]);
                assert_refused(&o, &["home/rootdata", "cannot", "DIR's owner"]);
                assert_eq!(
                    (tree(&l.dir), tree(&env.state)),
                    before,
                    "a refusal changed the host"
                );
                assert!(secret.exists());
                o
            }
            Some(step) => {
                let mut run = Command::new(VMWARDEN);
                env.with_roots(&mut run);
                run.args(["adopt", "web", "--from", l.dir.to_str().unwrap(), "--apply"])
                    .env("VMWARDEN_FAULT_STOP", step)
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped());
                let child = run.spawn().unwrap();
                let pid = child.id();
                wait_until(
                    &format!("adopt --apply stopped after {step}"),
                    Duration::from_secs(60),
                    || stopped(pid),
                );
                let secret = swap_in_roots_subtree(&env, &l, old);
                nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap()),
                    nix::sys::signal::Signal::SIGCONT,
                )
                .unwrap();
                let o = child.wait_with_output().unwrap();
                assert!(
                    secret.exists(),
                    "root deleted a subtree its old owner swapped in under the copied item's name (and could not delete itself), stopped after {step}: {}",
                    text(&o)
                );
                assert!(!o.status.success(), "{}", text(&o));
                o
            }
        };
        eprintln!("{stop:?}: {}", text(&o));
        assert!(
            std::fs::symlink_metadata(&leaked).is_err(),
            "root copied into the VM's state a file its old owner could not read, swapped in {}: {}",
            stop.map_or("before the run".to_string(), |s| format!("after {s}")),
            text(&o)
        );
        assert_eq!(
            std::fs::read(l.dir.join("home/rootdata/secret")).unwrap(),
            b"root's data\n"
        );
    }
}

/// adopt reads only what the old owner could, its groups included: DIR's
/// group is not a group its owner is in (`install -d -o microvm` leaves
/// DIR `microvm:root`). The old owner renames into the share a file of
/// root's group (`root:root 0640`) that it cannot read itself; root must
/// not read it with DIR's group's rights and give it to the VM.
#[test]
fn adopt_reads_only_what_the_old_owner_could_its_groups_included() {
    let env = Env::new();
    // An owner with an account, so that its groups are known: `nobody`
    // (65534, primary group 65534, in no other).
    let (old, u) = (65_534, uid(316));
    let l = legacy(&env);
    let walk = Command::new("chown")
        .args(["-R", "-h", &format!("{old}:{old}")])
        .arg(&l.dir)
        .status()
        .unwrap();
    assert!(walk.success());
    // DIR's group: root's, which the old owner is not in.
    std::os::unix::fs::chown(&l.dir, Some(old), Some(0)).unwrap();
    env.write_spec("web", &adopt_spec(&env, u));
    let victim = env.path("microvms/db");
    std::fs::create_dir_all(&victim).unwrap();
    let secret = victim.join("gsecret");
    std::fs::write(&secret, b"root's group's data\n").unwrap();
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o640)).unwrap();
    std::os::unix::fs::chown(&victim, Some(old), Some(old)).unwrap();
    let out = Command::new("setpriv")
        .arg(format!("--reuid={old}"))
        .arg(format!("--regid={old}"))
        .arg("--clear-groups")
        .args(["/usr/bin/python3", "-c"])
        .arg(format!(
            "import os\ns, d = {:?}, {:?}\ntry:\n    open(s).read()\n    print('OLD OWNER READ IT ITSELF')\nexcept OSError as e:\n    print('old owner cannot read it:', e)\nos.rename(s, d)\nprint('SWAPPED')\n",
            secret.to_str().unwrap(),
            l.dir.join("home/gsecret").to_str().unwrap()
        ))
        .current_dir("/")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("SWAPPED") && !said.contains("ITSELF"),
        "{}",
        text(&out)
    );
    let o = adopt(&env, &l.dir, &["--apply"]);
    let leaked = env.state.join("web/home/gsecret");
    assert!(
        std::fs::symlink_metadata(&leaked).is_err(),
        "root copied into the VM's state a file of DIR's group that its old owner, not in that group, could not read: {}",
        text(&o)
    );
    assert_refused(&o, &["home/gsecret", "cannot read it"]);
    assert_eq!(
        std::fs::read(l.dir.join("home/gsecret")).unwrap(),
        b"root's group's data\n"
    );
}
