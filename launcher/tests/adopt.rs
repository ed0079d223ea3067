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
    // microvm.nix's owner: microvm:kvm; any non-root owner stands for it.
    for p in [&dir, &img, &home] {
        std::os::unix::fs::chown(p, Some(uid(90)), Some(uid(90))).unwrap();
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

/// The end state of a finished adoption, checked on the host.
#[track_caller]
fn assert_adopted(env: &Env, l: &Legacy, u: u32, img_ino: u64, img_blocks: u64) {
    let img = env.state.join("web/var.img");
    let md = std::fs::symlink_metadata(&img).unwrap();
    assert!(md.file_type().is_file());
    assert_eq!((md.uid(), md.gid(), md.mode() & 0o7777), (u, u, 0o600));
    // Moved, not copied: the same inode, the same (few) blocks.
    assert_eq!(md.ino(), img_ino, "the image was copied, not moved");
    assert_eq!(md.blocks(), img_blocks, "the image's allocation changed");
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

#[test]
fn dry_run_changes_nothing_and_apply_moves_reowns_and_leaves_the_rest() {
    let env = Env::new();
    let u = uid(81);
    let l = legacy(&env);
    env.write_spec("web", &adopt_spec(&env, u));
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
    eprintln!("dry run:\n{out}");
    for want in [
        format!("adopt web from {}", l.dir.display()),
        format!(
            "move   {} -> {}",
            l.dir.join("var.img").display(),
            env.state.join("web/var.img").display()
        ),
        format!("disks[0].path: disk image, {GIB} bytes"),
        format!(
            "move   {} -> {}",
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
        "adopt: 2 to move, 5 to leave (dry run: nothing changed; --apply to move)".into(),
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
    assert!(out.contains("adopt: done: 2 moved, 5 left"), "{out}");
    assert_adopted(&env, &l, u, img.ino(), img.blocks());
    eprintln!(
        "measured: 1 GiB sparse image moved with {} bytes allocated before and after",
        img.blocks() * 512
    );
    let v = env.verify_clean(&["web"]);
    assert!(v.status.success(), "{}", text(&v));
    // A second run finds the targets there and refuses.
    let o = adopt(&env, &l.dir, &[]);
    assert_refused(&o, &["var.img", "exists", "already there"]);
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
    let steps = [
        "record",
        "move:var.img",
        "own:var.img",
        "move:home",
        "own:home",
        "done",
    ];
    for step in steps {
        let l = legacy(&env);
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
            // After the last item is re-owned only the record is left:
            // that state is complete and a launch may run.
            let complete = step == "own:home";
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
                String::from_utf8_lossy(&dry.stdout).contains("finishing an interrupted --apply"),
                "step {step}: {}",
                text(&dry)
            );
            let o = adopt(&env, &l.dir, &["--apply"]);
            assert!(o.status.success(), "step {step}: {}", text(&o));
        }
        assert_adopted(&env, &l, u, img.ino(), img.blocks());
        std::fs::remove_dir_all(env.path("microvms")).unwrap();
        std::fs::remove_dir_all(env.state.join("web")).unwrap();
        let _ = std::fs::remove_file(env.path("outside-secret"));
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
    assert_refused(&o, &["another file system", "never copies"]);
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
