//! No host socket is within a VM's reach. Hardening, round six: a
//! compromised hypervisor or helper tries every Unix socket the host has
//! (`/proc/net/unix`: by path and abstract), each from its own sandbox,
//! and only the VM's own answer. Landlock does not mediate `connect(2)`
//! to a socket's path: the VM's own root (`launch/root.rs`) holds no host
//! socket; abstract sockets are scoped by each Landlock domain
//! (docs/design/threat-model.md). Needs root.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixDatagram, UnixListener};
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

/// Sockets of the test's own, world-connectable, as a service's would be:
/// a stream socket in `/run` and one in `/tmp`, a datagram socket in
/// `/tmp`, and an abstract one. Removed on drop.
struct OwnHostSockets {
    paths: Vec<PathBuf>,
    _stream: Vec<UnixListener>,
    _dgram: UnixDatagram,
}

impl OwnHostSockets {
    fn new() -> OwnHostSockets {
        let id = std::process::id();
        let paths = vec![
            PathBuf::from(format!("/run/vmwt-reach-{id}.sock")),
            PathBuf::from(format!("/tmp/vmwt-reach-{id}.sock")),
            PathBuf::from(format!("/tmp/vmwt-reach-{id}.dgram")),
        ];
        for p in &paths {
            let _ = std::fs::remove_file(p);
        }
        let stream: Vec<UnixListener> = paths[..2]
            .iter()
            .map(|p| UnixListener::bind(p).unwrap())
            .chain(std::iter::once(abstract_listener(&format!(
                "vmwt-reach-{id}"
            ))))
            .collect();
        let dgram = UnixDatagram::bind(&paths[2]).unwrap();
        for p in &paths {
            std::fs::set_permissions(p, PermissionsExt::from_mode(0o777)).unwrap();
        }
        OwnHostSockets {
            paths,
            _stream: stream,
            _dgram: dgram,
        }
    }
}

impl Drop for OwnHostSockets {
    fn drop(&mut self) {
        for p in &self.paths {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn abstract_listener(name: &str) -> UnixListener {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    UnixListener::bind_addr(&addr).unwrap()
}

/// Every socket of the host that can be connected to, from its
/// `/proc/net/unix` (this test runs in the host's network namespace): a
/// listening stream or seqpacket socket, or a bound datagram socket, by
/// path (`/…`) or abstract (`@…`), with its type (1 stream, 2 datagram,
/// 5 seqpacket). Each once.
fn host_sockets() -> Vec<(String, u32)> {
    let table = std::fs::read_to_string("/proc/net/unix").unwrap();
    let mut out: Vec<(String, u32)> = Vec::new();
    for line in table.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 8 {
            continue;
        }
        let flags = u32::from_str_radix(f[3], 16).unwrap_or(0);
        let kind = u32::from_str_radix(f[4], 16).unwrap_or(0);
        let path = f[7..].join(" ");
        let listening = flags & 0x10000 != 0;
        let reachable = match kind {
            1 | 5 => listening,
            2 => true,
            _ => false,
        };
        if reachable && !out.contains(&(path.clone(), kind)) {
            out.push((path, kind));
        }
    }
    out
}

/// What every probe runs: try each target, print one line each, then
/// `REACH-DONE LABEL`. It first binds an abstract socket of its own and
/// tries it too (the positive control: a socket of its own answers).
/// `MODE` says what it stands in for: `probe` (the hypervisor's command
/// under `--probe`), `virtiofsd` (waits until the launcher has rooted it
/// in its share), `vsock` (makes vhost-device-vsock's two sockets first),
/// `passt` (makes passt's own sandbox first).
const REACH: &str = r#"#!/usr/bin/python3
import base64, ctypes, errno, json, os, socket, sys, time
MODE = "@MODE@"
TARGETS = json.loads(base64.b64decode("@TARGETS@"))
label = sys.argv[1] if MODE == "probe" else MODE
args = sys.argv[1:]
libc = ctypes.CDLL(None, use_errno=True)
def arg(prefix):
    return [a[len(prefix):] for a in args if a.startswith(prefix)][0]
if MODE == "virtiofsd":
    share = os.open(".", os.O_RDONLY)
    before = os.stat("/")
    end = time.time() + 20
    while time.time() < end and (os.stat("/").st_ino, os.stat("/").st_dev) == (before.st_ino, before.st_dev):
        time.sleep(0.01)
if MODE == "vsock":
    keep = []
    for p in (arg("--socket="), arg("--uds-path=")):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.bind(p); s.listen(1); keep.append(s)
if MODE == "passt":
    uid, gid = os.getuid(), os.getgid()
    libc.unshare(0x10000000)
    open("/proc/self/uid_map", "w").write("0 %d 1" % uid)
    open("/proc/self/setgroups", "w").write("deny")
    open("/proc/self/gid_map", "w").write("0 %d 1" % gid)
    libc.unshare(0x00020000)
    libc.mount(b"", b"/", b"", 0x20000 | 0x4000, None)
    libc.mount(b"", b"/tmp", b"tmpfs", 1 | 2 | 4 | 8, b"nr_inodes=2,nr_blocks=0")
    os.chdir("/tmp")
    libc.syscall(155, b".", b".")
    libc.umount2(b".", 2)
    class SockFilter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]
    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]
    allow = (SockFilter * 1)(SockFilter(0x06, 0, 0, 0x7fff0000))
    libc.prctl(22, 2, ctypes.byref(SockFprog(1, allow)), 0, 0)
    time.sleep(0.5)
def addr(a):
    return "\0" + a[1:] if a.startswith("@") else a
own = "@vmwt-reach-own-%d" % os.getpid()
mine = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
mine.bind(addr(own)); mine.listen(8)
kinds = {1: socket.SOCK_STREAM, 2: socket.SOCK_DGRAM, 5: socket.SOCK_SEQPACKET}
for a, t in TARGETS + [[own, 1]]:
    c = socket.socket(socket.AF_UNIX, kinds[t])
    c.setblocking(False)
    try:
        c.connect(addr(a)); r = "ANSWERED"
    except BlockingIOError:
        r = "ANSWERED"
    except OSError as e:
        r = "refused " + errno.errorcode.get(e.errno, str(e.errno))
    c.close()
    sys.stderr.write("REACH %s %s %s\n" % (label, json.dumps(a), r))
sys.stderr.write("REACH-DONE %s\n" % label)
sys.stderr.flush()
if MODE == "probe":
    time.sleep(600)
while True:
    time.sleep(600)
"#;

/// The reach script for `mode`, executable, with the targets baked in
/// (a helper's sandbox lets it read its binary and nothing of the test's).
fn reach_script(env: &Env, mode: &str, targets: &[(String, u32)]) -> PathBuf {
    let list = b64(&serde_json::to_string(targets).unwrap());
    let body = REACH.replace("@MODE@", mode).replace("@TARGETS@", &list);
    let p = env.path(&format!("reach-{mode}"));
    std::fs::write(&p, body).unwrap();
    std::fs::set_permissions(&p, PermissionsExt::from_mode(0o755)).unwrap();
    p
}

/// Launch `name` from `spec`, under `--probe` running the reach script
/// as `labels[0]` when `probe` is given; vmwarden's own helpers are told
/// the targets (`VMWARDEN_TEST_REACH`). Wait until every one of `labels`
/// has tried every target, and return the log.
fn run_reach(
    env: &Env,
    name: &str,
    spec: &Value,
    probe: Option<&Path>,
    labels: &[&str],
    targets: &[(String, u32)],
) -> String {
    env.write_spec(name, spec);
    let mut c = env.launch_cmd(name);
    let list: String = targets.iter().map(|(a, t)| format!("{t} {a}\n")).collect();
    c.env("VMWARDEN_TEST_REACH", list);
    if let Some(p) = probe {
        c.arg("--probe")
            .arg("--")
            .arg("/usr/bin/python3")
            .arg(p)
            .arg(labels[0]);
    }
    let mut g = spawn_logged(c, env.path(&format!("{name}.log")));
    for l in labels {
        g.wait_for(&format!("REACH-DONE {l}"), Duration::from_secs(60));
    }
    let log = g.log_text();
    g.child.kill().unwrap();
    g.wait_exit(Duration::from_secs(10));
    // Its helpers die by their death signal, a moment after it: until
    // then they hold the lease and cleanup says the VM is live.
    let end = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (o, rep) = env.cleanup(name);
        if o.status.success() && rep["clean"] == true {
            break;
        }
        assert!(std::time::Instant::now() < end, "{}", text(&o));
        std::thread::sleep(Duration::from_millis(100));
    }
    log
}

/// For each of `labels`: every target was tried and its own abstract
/// socket answered (else a panic), and what else answered (`reached`).
fn answered(log: &str, labels: &[&str], targets: &[(String, u32)], reached: &mut Vec<String>) {
    for l in labels {
        let lines: Vec<&str> = log
            .lines()
            .filter_map(|x| x.strip_prefix(&format!("REACH {l} ")))
            .collect();
        assert_eq!(lines.len(), targets.len() + 1, "{l}: {log}");
        assert!(
            lines
                .iter()
                .any(|x| x.starts_with("\"@vmwt-reach-own-") && x.ends_with(" ANSWERED")),
            "{l}: its own socket did not answer: {lines:#?}"
        );
        reached.extend(
            lines
                .iter()
                .filter(|x| x.ends_with(" ANSWERED") && !x.starts_with("\"@vmwt-reach-own-"))
                .map(|x| format!("{l}: {x}")),
        );
    }
}

/// No host socket is within a VM's reach: every socket of the host's
/// `/proc/net/unix` (with a world-connectable stream socket of the test's
/// own in `/run` and `/tmp`, a datagram one in `/tmp` and an abstract one)
/// is tried, by path or abstract name, from the identical sandbox of
/// QEMU, cloud-hypervisor and firecracker (`--probe`) and from stand-ins
/// at the configured paths of virtiofsd, vhost-device-vsock and passt,
/// and from vmwarden's own helpers, vmm-notify, reboot-watch and the console relay
/// (`VMWARDEN_TEST_REACH`, `launch/reach.rs`), each in its own sandbox;
/// none answers, while a socket each makes itself does. (The broker of a
/// share the guest owns has no `socket(2)` at all: its allowlist.)
#[test]
fn no_host_socket_is_within_a_vms_reach() {
    let env = Env::new();
    let _own = OwnHostSockets::new();
    let targets = host_sockets();
    let id = std::process::id();
    for want in [
        format!("/run/vmwt-reach-{id}.sock"),
        format!("/tmp/vmwt-reach-{id}.sock"),
        format!("/tmp/vmwt-reach-{id}.dgram"),
        format!("@vmwt-reach-{id}"),
    ] {
        assert!(
            targets.iter().any(|(p, _)| *p == want),
            "{want} not in /proc/net/unix: {targets:?}"
        );
    }
    let probe = reach_script(&env, "probe", &targets);

    // QEMU, with a virtiofs share, vhost-device-vsock and passt.
    let u = uid(340);
    let share = env.path("share");
    std::fs::create_dir(&share).unwrap();
    let mut s = env.spec("reachq", u);
    s["landlock"]["read"] = json!([probe]);
    s["shares"] = json!([{ "tag": "ro", "source": share, "proto": "virtiofs", "read_only": true }]);
    s["virtiofsd"] = json!({ "binary": reach_script(&env, "virtiofsd", &targets) });
    s["vsock"] =
        json!({ "cid": 3, "backend": "user", "binary": reach_script(&env, "vsock", &targets) });
    s["user_network"] = json!({
        "binary": reach_script(&env, "passt", &targets), "id": "qemu", "mac": "02:00:00:01:01:01"
    });
    let labels = ["qemu", "virtiofsd", "vsock", "passt"];
    let mut reached = Vec::new();
    let log = run_reach(&env, "reachq", &s, Some(&probe), &labels, &targets);
    answered(&log, &labels, &targets, &mut reached);
    assert!(
        reached.is_empty(),
        "host sockets within a VM's reach: {reached:#?}"
    );

    // The console relay (vmwarden's own code, started beside a real QEMU
    // only: not under --probe).
    let mut s = env.spec("reachr", uid(343));
    s["console"] = json!(true);
    let log = run_reach(&env, "reachr", &s, None, &["console-relay"], &targets);
    answered(&log, &["console-relay"], &targets, &mut reached);
    assert!(
        reached.is_empty(),
        "host sockets within a VM's reach: {reached:#?}"
    );

    // cloud-hypervisor and firecracker: their binaries are not run under
    // --probe; any trusted executable will do.
    for (name, kind, n) in [
        ("reachc", "cloud-hypervisor", 341),
        ("reachf", "firecracker", 342),
    ] {
        let bin = env.path(kind);
        std::fs::copy("/bin/true", &bin).unwrap();
        let u = uid(n);
        let _kvm = KvmAcl::grant(u);
        let mut s = env.spec(name, u);
        s["hypervisor"] = json!({ "kind": kind, "binary": bin, "accel": "kvm" });
        s["cmdline"] = json!("console=ttyS0");
        s["landlock"]["read"] = json!([probe]);
        // Firecracker's vsock brings vmm-notify, cloud-hypervisor's
        // virtiofs share reboot-watch (vmwarden's own code, both).
        let labels: &[&str] = if kind == "firecracker" {
            s["vsock"] = json!({ "cid": 4, "backend": "user" });
            &[kind, "vmm-notify"]
        } else {
            s["shares"] =
                json!([{ "tag": "ro", "source": share, "proto": "virtiofs", "read_only": true }]);
            s["virtiofsd"] = json!({ "binary": reach_script(&env, "virtiofsd", &targets) });
            &[kind, "virtiofsd", "reboot-watch"]
        };
        let log = run_reach(&env, name, &s, Some(&probe), labels, &targets);
        answered(&log, labels, &targets, &mut reached);
    }
    assert!(
        reached.is_empty(),
        "host sockets within a VM's reach: {reached:#?}"
    );
}

/// The VM's root binds only what its principal could reach itself. Root
/// builds that root, following the symlinks on the way to each path it
/// binds; a disk path may lie in a directory of the principal's (the trust
/// walk's principal policy), so the principal decides where a symlink
/// there leads. Root followed it into a directory the principal cannot
/// search (root's, mode 0700) and bound the file behind it at its own path
/// in the VM's root, whose directories are everyone's to search: the
/// principal read a file the host's permissions had kept from it. Now the
/// paths are resolved and opened with the principal's file-system ids and
/// groups, so what it cannot reach on the host is not in its root.
#[test]
fn the_vms_root_binds_only_what_its_principal_can_reach() {
    const SECRET: &str = "VMWT-BEHIND-A-ROOT-ONLY-DIRECTORY";
    let env = Env::new();
    let u = uid(410);
    // Root's directory, searchable by root alone; the file in it is
    // everyone's to read, as files under such directories often are.
    let vault = env.path("vault");
    std::fs::create_dir(&vault).unwrap();
    std::fs::set_permissions(&vault, PermissionsExt::from_mode(0o700)).unwrap();
    let secret = vault.join("secret.img");
    std::fs::write(&secret, format!("{SECRET}\n")).unwrap();
    std::fs::set_permissions(&secret, PermissionsExt::from_mode(0o644)).unwrap();
    // The principal's own directory, where its disk is, and the link it
    // planted there in place of the image.
    let own = env.path("images");
    std::fs::create_dir(&own).unwrap();
    std::os::unix::fs::chown(&own, Some(u), Some(u)).unwrap();
    let disk = own.join("disk.img");
    std::os::unix::fs::symlink(&secret, &disk).unwrap();
    std::os::unix::fs::lchown(&disk, Some(u), Some(u)).unwrap();
    let mut s = env.spec("vault", u);
    s["disks"] = json!([{ "path": disk, "serial": "d", "read_only": true }]);
    env.write_spec("vault", &s);
    let disk_s = disk.to_string_lossy().into_owned();
    let secret_s = secret.to_string_lossy().into_owned();
    let out = env.probe(
        "vault",
        &[
            "/bin/sh",
            "-c",
            "/bin/cat \"$0\"; /bin/cat \"$1\"",
            &disk_s,
            &secret_s,
        ],
    );
    let said = text(&out);
    assert!(
        !said.contains(SECRET),
        "the principal read, in its own root, a file behind root's 0700 directory: {said}"
    );
    // Refused by the field's name: the path is not in the VM's root.
    assert!(
        !out.status.success() && said.contains("`disks[0].path`"),
        "{said}"
    );
    env.assert_clean("vault");
}

/// The VM's root is the same whatever umask the launcher inherits: the
/// unit's `UMask=0077` made every directory the launcher made there
/// root's 0700, so the principal reached nothing below one (`/usr`,
/// `/nix`): every launch under systemd failed at `landlock` (EACCES on a
/// system path). Run under that umask, a probe in the identical sandbox
/// must start and read the system's files.
#[test]
fn the_vms_root_is_the_same_whatever_umask_the_launcher_inherits() {
    use std::os::unix::process::CommandExt;
    let env = Env::new();
    env.write_spec("web", &env.spec("web", uid(90)));
    let mut cmd = env.launch_cmd("web");
    cmd.args([
        "--probe",
        "--",
        "/bin/sh",
        "-c",
        "ls /usr/bin >/dev/null && echo VMWT-UMASK-OK",
    ]);
    // SAFETY: umask(2) is async-signal-safe and touches only this child.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
            Ok(())
        });
    }
    let out = bounded(&mut cmd, Duration::from_secs(60)).expect("the probe returns");
    assert!(
        out.status.success() && text(&out).contains("VMWT-UMASK-OK"),
        "a launch under umask 0077: {}",
        text(&out)
    );
}

/// Every mount of the VM's root is `nosuid`, `nodev` but a device node's
/// (which is not `nodev`), and read-only but the VM's own trees (state,
/// control, credentials), device nodes and the VM's procfs: the flags
/// `rooted` gives each bind (`launch/root.rs` `remount`), and each mount a
/// bind carried (`remount_carried`: a file system mounted inside a tree
/// granted reading kept the host's `rw`, set-uid and devices), read from
/// the probe's own mountinfo. Needs root.
#[test]
fn every_mount_of_the_vms_root_is_nosuid_nodev_and_read_only_but_its_own() {
    use std::os::unix::fs::FileTypeExt;
    let env = Env::new();
    // A tree granted reading with a file system mounted inside it: the
    // bind carries that mount (`MS_REC`), which must get the bind's flags
    // too (a remount is the top mount's alone).
    let tree = env.path("ro");
    let carried = tree.join("sub");
    let _m = OwnMount::tmpfs(&carried);
    let mut s = env.spec("web", uid(95));
    s["landlock"]["read"] = json!([tree]);
    env.write_spec("web", &s);
    let out = env.probe("web", &["/bin/cat", "/proc/self/mountinfo"]);
    assert!(out.status.success(), "{}", text(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    let mut seen = 0;
    let mut seen_carried = false;
    let mut wrong = Vec::new();
    for line in said.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        // id parent dev root mount-point per-mount-options … - fstype …
        let dash = f.iter().position(|x| *x == "-");
        let (Some(dash), true) = (dash, f[0].bytes().all(|b| b.is_ascii_digit())) else {
            continue;
        };
        if dash < 6 || dash + 1 >= f.len() {
            continue;
        }
        let (at, opts) = (f[4], f[5].split(',').collect::<Vec<_>>());
        let fstype = f[dash + 1];
        seen += 1;
        let device = std::fs::metadata(at)
            .is_ok_and(|m| m.file_type().is_char_device() || m.file_type().is_block_device());
        let own = Path::new(at).starts_with(&env.run) || Path::new(at).starts_with(&env.state);
        seen_carried |= Path::new(at) == carried;
        let procfs = fstype == "proc";
        let mut want = vec!["nosuid"];
        if !device {
            want.push("nodev");
        }
        if !device && !own && !procfs {
            want.push("ro");
        }
        if let Some(missing) = want.iter().find(|w| !opts.contains(w)) {
            wrong.push(format!("{at} ({fstype}) lacks {missing}: {}", f[5]));
        }
        // A device node's mount is usable: not `nodev`.
        if device && opts.contains(&"nodev") {
            wrong.push(format!(
                "{at} ({fstype}) is a device node mounted nodev: {}",
                f[5]
            ));
        }
    }
    assert!(seen >= 5, "too few mounts to judge: {said}");
    assert!(seen_carried, "the carried mount is not in the root: {said}");
    assert!(wrong.is_empty(), "{wrong:#?}\n{said}");
    env.assert_clean("web");
}

/// A tmpfs of the test's own mounted at `at` (rw), unmounted on drop.
struct OwnMount(PathBuf);

impl OwnMount {
    fn tmpfs(at: &Path) -> OwnMount {
        std::fs::create_dir_all(at).unwrap();
        nix::mount::mount(
            Some("vmwt-rooted"),
            at,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some("mode=0755,size=1m"),
        )
        .unwrap();
        OwnMount(at.to_path_buf())
    }
}

impl Drop for OwnMount {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// A writable disk inside a directory the spec grants reading only
/// (`landlock.read`): the plan binds the directory read-only and the disk
/// again, read-write, over it. The disk's mount point was made as
/// `File::create` makes a file (`O_WRONLY|O_CREAT|O_TRUNC`, as root) on the
/// disk itself, seen through the read-only bind: the launch failed with
/// `EROFS`, and where the disk lies on a mount of its own under that
/// directory (the read-only remount is the bind's top mount's alone), root
/// truncated the VM's disk to nothing on the host. A mount point that
/// exists is now left as it is: the launch starts, the disk keeps every
/// byte.
#[test]
fn a_writable_disk_inside_a_read_only_tree_is_bound_and_never_truncated() {
    const DATA: &str = "VMWT-DISK-KEEPS-ITS-BYTES";
    let env = Env::new();
    let u = uid(96);
    let tree = env.path("ro");
    // Case one: the disk on the tree's own file system; case two: on a
    // mount of its own below it.
    let flat = tree.join("flat");
    std::fs::create_dir_all(&flat).unwrap();
    let mounted = tree.join("mounted");
    let _m = OwnMount::tmpfs(&mounted);
    for dir in [&mounted, &flat] {
        let disk = dir.join("disk.img");
        std::fs::write(&disk, DATA).unwrap();
        std::os::unix::fs::chown(&disk, Some(u), Some(u)).unwrap();
        std::fs::set_permissions(&disk, PermissionsExt::from_mode(0o600)).unwrap();
        let mut s = env.spec("web", u);
        s["disks"] = json!([{ "path": disk, "serial": "d" }]);
        s["landlock"]["read"] = json!([tree]);
        env.write_spec("web", &s);
        let disk_s = disk.to_string_lossy().into_owned();
        let out = env.probe("web", &["/bin/cat", &disk_s]);
        let kept = std::fs::read_to_string(&disk).unwrap();
        assert_eq!(
            kept,
            DATA,
            "the launch truncated the VM's disk {}: {}",
            disk.display(),
            text(&out)
        );
        assert!(
            out.status.success() && text(&out).contains(DATA),
            "a writable disk in a read-only tree ({}): {}",
            disk.display(),
            text(&out)
        );
        env.assert_clean("web");
    }
}

/// A path of the spec inside a tree the VM may write (`landlock.write`)
/// is the VM's to choose: a compromised hypervisor replaces it with a
/// symlink to a host socket (or a directory of them), and the next launch
/// resolved it as the principal (who may connect to a world-connectable
/// socket) and bound that socket into the VM's root at its own path, where
/// `connect(2)` reached it. A symlink inside a tree the VM may write is
/// now never followed: the tree's bind holds it, and it leads nowhere in
/// the VM's root (Landlock refuses the path, naming its field).
#[test]
fn a_symlink_the_vm_planted_in_a_tree_it_may_write_binds_no_host_socket() {
    let sockets = OwnHostSockets::new();
    let env = Env::new();
    let u = uid(97);
    let shared = env.path("shared");
    std::fs::create_dir(&shared).unwrap();
    std::os::unix::fs::chown(&shared, Some(u), Some(u)).unwrap();
    std::fs::set_permissions(&shared, PermissionsExt::from_mode(0o700)).unwrap();
    let target = &sockets.paths[0];
    for (name, to) in [("sock", target.clone()), ("dir", PathBuf::from("/run"))] {
        let planted = shared.join(name);
        std::os::unix::fs::symlink(&to, &planted).unwrap();
        std::os::unix::fs::lchown(&planted, Some(u), Some(u)).unwrap();
        let mut s = env.spec("web", u);
        s["landlock"]["write"] = json!([shared]);
        s["landlock"]["read"] = json!([planted]);
        env.write_spec("web", &s);
        let script = format!(
            "import socket\ns = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect({:?})\n    print('VMWT-REACHED')\nexcept OSError as e:\n    print('VMWT-REFUSED', e)\n",
            target.to_string_lossy()
        );
        let out = env.probe("web", &["/usr/bin/python3", "-c", &script]);
        let said = text(&out);
        assert!(
            !said.contains("VMWT-REACHED"),
            "the VM reached the host's socket through its planted {name}: {said}"
        );
        // Refused, naming the field; or the probe ran and found no socket.
        assert!(
            said.contains("`landlock.read[0]`") || said.contains("VMWT-REFUSED"),
            "{said}"
        );
        env.assert_clean("web");
        std::fs::remove_file(&planted).unwrap();
    }
}
