//! What a compromised hypervisor, and a binary root asks before a launch,
//! can reach. Hardening, round five: "Firecracker reaches only its own
//! taps" and "probes run inside the sandbox". Each test re-runs the attack
//! against the real binaries and must see it fail; each fails when its
//! defence is reverted (docs/design/threat-model.md). Needs root, and
//! iproute2 for the taps the tests make.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;
use serde_json::json;
use vmwarden::host::procs::processes_of_uid;
use vmwarden::hypervisor::{self, api};

// ---------------------------------------------------------------------------
// Firecracker reaches only its own taps.

/// An ownerless tap of the host (the network namespace the launcher runs
/// in), as a VPN's tun or an `ip tuntap add` without `user` is: persistent,
/// neither owner nor group, up. Uniquely named; deleted on drop.
struct HostTap {
    name: String,
}

impl HostTap {
    fn new() -> HostTap {
        let name = format!("vmwt-own{}", std::process::id());
        assert!(name.len() <= 15, "{name}");
        let _ = Command::new("ip").args(["link", "del", &name]).output();
        for args in [
            vec!["tuntap", "add", "dev", &name, "mode", "tap"],
            vec!["link", "set", &name, "up"],
        ] {
            let out = Command::new("ip")
                .args(&args)
                .output()
                .expect("ip (iproute2)");
            assert!(out.status.success(), "ip {args:?}: {}", text(&out));
        }
        let t = HostTap { name };
        assert_eq!(
            t.sys("owner").as_deref(),
            Some("-1"),
            "the tap has an owner"
        );
        assert_eq!(t.sys("group").as_deref(), Some("-1"), "the tap has a group");
        t
    }

    fn sys(&self, file: &str) -> Option<String> {
        std::fs::read_to_string(format!("/sys/class/net/{}/{file}", self.name))
            .ok()
            .map(|s| s.trim().to_string())
    }

    /// 1 while some process is attached to the tap (it has a queue).
    fn carrier(&self) -> String {
        self.sys("carrier").unwrap_or_default()
    }
}

impl Drop for HostTap {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.name])
            .output();
    }
}

/// A firecracker spec with one interface, `tap`, on no bridge: its host
/// side is an interface of the host (the test's own namespace), which the
/// test talks to directly.
fn firecracker_spec(env: &Env, name: &str, u: u32, binary: &Path, tap: &str) -> serde_json::Value {
    let mut s = env.spec(name, u);
    s["hypervisor"] = json!({ "kind": "firecracker", "binary": binary, "accel": "kvm" });
    s["cmdline"] = json!("console=ttyS0");
    s["interfaces"] = json!([{ "tap": tap, "mac": "02:00:00:00:30:01" }]);
    s
}

/// The VM's side: attach by name to the host's ownerless tap (the attack),
/// then to its own tap, and exchange one frame each way with the host side
/// of its link (ethertype 0x88b5, local experimental).
const VM_SIDE: &str = r#"
import fcntl, os, select, struct, sys, time
TUNSETIFF, IFF_TAP, IFF_NO_PI = 0x400454ca, 0x0002, 0x1000
def attach(name):
    fd = os.open('/dev/net/tun', os.O_RDWR)
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack('16sH22x', name.encode(), IFF_TAP | IFF_NO_PI))
        return fd, 0
    except OSError as e:
        os.close(fd)
        return None, e.errno
fd, err = attach(sys.argv[1])
if fd is None:
    print('HOST-TAP refused errno=%d' % err, flush=True)
else:
    r, _, _ = select.select([fd], [], [], 3)
    print('HOST-TAP attached read=%d' % (len(os.read(fd, 4096)) if r else 0), flush=True)
fd, err = attach(sys.argv[2])
if fd is None:
    print('OWN-TAP refused errno=%d' % err, flush=True)
    sys.exit(1)
print('OWN-TAP attached', flush=True)
frame = b'\xff' * 6 + bytes.fromhex('020000003001') + b'\x88\xb5' + b'FROM-VM'.ljust(46, b'\0')
end = time.time() + 30
while time.time() < end:
    os.write(fd, frame)
    r, _, _ = select.select([fd], [], [], 0.2)
    if r:
        f = os.read(fd, 4096)
        if f[12:14] == b'\x88\xb5' and f[14:23] == b'FROM-HOST':
            print('OWN-TAP got FROM-HOST', flush=True)
            sys.exit(0)
print('OWN-TAP no frame from the host', flush=True)
sys.exit(1)
"#;

/// The host's side, on the host end of the VM's link (root, in the test's
/// namespace): wait for the VM's frame, answer it.
const HOST_SIDE: &str = r#"
import socket, sys, time
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x88b5))
s.bind((sys.argv[1], 0))
s.settimeout(0.2)
end = time.time() + 30
while time.time() < end:
    try:
        f = s.recv(4096)
    except socket.timeout:
        continue
    if f[14:21] == b'FROM-VM':
        print('HOST got FROM-VM', flush=True)
        reply = f[6:12] + bytes.fromhex('02000000aa01') + b'\x88\xb5' + b'FROM-HOST'.ljust(46, b'\0')
        # Until the VM has it: it exits then, and its link goes with it.
        for _ in range(30):
            try:
                s.send(reply)
            except OSError:
                break
            time.sleep(0.1)
        sys.exit(0)
print('HOST no frame from the VM', flush=True)
sys.exit(1)
"#;

/// Firecracker reaches only its own taps, in the identical sandbox
/// (`--probe`, so it runs wherever the tests run): an ownerless tap is made
/// on the host; a process in the launcher's firecracker sandbox (the
/// principal, its namespaces, Landlock with /dev/net/tun, the seccomp
/// filter that lets TUNSETIFF through) attaches to it by name with
/// TUNSETIFF and is refused, and nothing attached to it; the VM's own tap
/// works both ways through the link to the host. After a kill, cleanup
/// and verify-clean leave nothing on the host.
#[test]
fn firecracker_reaches_only_its_own_taps() {
    let env = Env::new();
    let host_tap = HostTap::new();
    let u = uid(300);
    let own = format!("vmw-fo{}", std::process::id());
    // The binary is not run under --probe; any trusted executable will do.
    let bin = env.path("firecracker");
    std::fs::copy("/bin/true", &bin).unwrap();
    let script = env.path("vm-side.py");
    std::fs::write(&script, VM_SIDE).unwrap();
    let mut s = firecracker_spec(&env, "fcown", u, &bin, &own);
    s["landlock"]["read"] = json!([script]);
    env.write_spec("fcown", &s);
    let _kvm = KvmAcl::grant(u);
    // This host has no udev (/dev/net/tun is 0600): the principal gets it
    // as udev's 0666 would give it to everyone.
    let _tun = DevAcl::grant("/dev/net/tun", u);

    let mut c = env.launch_cmd("fcown");
    c.arg("--probe").arg("--").args([
        "/usr/bin/python3",
        &script.to_string_lossy(),
        &host_tap.name,
        &own,
    ]);
    let mut g = spawn_logged(c, env.path("fcown.log"));
    let line = g.wait_for("HOST-TAP", Duration::from_secs(60));
    assert!(
        line.starts_with("HOST-TAP refused errno=1"),
        "the VM attached to the host's ownerless tap {}: {line}\n{}",
        host_tap.name,
        g.log_text()
    );
    assert_eq!(
        host_tap.carrier(),
        "0",
        "something attached to the host's tap"
    );
    // It runs in a network namespace of its own, where its tap is.
    let mine = std::fs::read_link("/proc/self/ns/net").unwrap();
    let its = std::fs::read_link(format!("/proc/{}/ns/net", g.pid())).unwrap();
    assert_ne!(mine, its, "the VM shares the host's network namespace");
    g.wait_for("OWN-TAP attached", Duration::from_secs(30));
    // Its tap, seen from the host: the host side of its link, up.
    assert!(
        Path::new("/sys/class/net").join(&own).exists(),
        "no {own} on the host"
    );
    let host = Command::new("/usr/bin/python3")
        .args(["-c", HOST_SIDE, &own])
        .output()
        .unwrap();
    assert!(host.status.success(), "{}\n{}", text(&host), g.log_text());
    g.wait_for("OWN-TAP got FROM-HOST", Duration::from_secs(30));
    assert_eq!(
        g.wait_exit(Duration::from_secs(10)).map(|s| s.success()),
        Some(true)
    );

    // The namespace ended with its last process: nothing of the VM's
    // network is left on the host once cleanup has run.
    let (o, rep) = env.cleanup("fcown");
    assert!(o.status.success() && rep["clean"] == true, "{}", text(&o));
    assert!(!Path::new("/sys/class/net").join(&own).exists());
    let v = env.verify_clean(&["fcown"]);
    assert!(v.status.success(), "{}", text(&v));
    assert_eq!(host_tap.sys("owner").as_deref(), Some("-1"));
}

/// The same attack from the real firecracker, in the full sandbox and its
/// own namespace, through its API (this host's KVM runs no guest, but
/// firecracker opens its taps when it is told of them): an interface on
/// the host's ownerless tap is refused, its own tap is opened.
#[test]
fn firecracker_reaches_only_its_own_taps_real_binary() {
    let env = Env::new();
    let Some(bin) = real_binary(&env, "VMWARDEN_TEST_FIRECRACKER", "firecracker") else {
        return;
    };
    let host_tap = HostTap::new();
    let u = uid(301);
    let own = format!("vmw-fr{}", std::process::id());
    env.write_spec("fcreal", &firecracker_spec(&env, "fcreal", u, &bin, &own));
    let _kvm = KvmAcl::grant(u);
    let _tun = DevAcl::grant("/dev/net/tun", u);
    let sock = env.run.join("fcreal/control/api.sock");
    let mut c = env.launch_cmd("fcreal");
    c.arg("--probe")
        .arg("--")
        .arg(&bin)
        .arg("--api-sock")
        .arg(&sock);
    let mut g = spawn_logged(c, env.path("fcreal.log"));
    wait_until("firecracker's API", Duration::from_secs(30), || {
        api::answers(&sock)
    });
    let t = Duration::from_secs(5);
    let nic = |id: &str, dev: &str| json!({ "iface_id": id, "host_dev_name": dev }).to_string();
    let attack = api::expect_ok(
        &sock,
        "PUT",
        "/network-interfaces/net1",
        Some(&nic("net1", &host_tap.name)),
        t,
    );
    assert!(
        attack.is_err(),
        "firecracker opened the host's ownerless tap {}\n{}",
        host_tap.name,
        g.log_text()
    );
    assert_eq!(
        host_tap.carrier(),
        "0",
        "something attached to the host's tap"
    );
    api::expect_ok(
        &sock,
        "PUT",
        "/network-interfaces/net0",
        Some(&nic("net0", &own)),
        t,
    )
    .unwrap_or_else(|e| panic!("its own tap: {e}\n{}", g.log_text()));
    g.child.kill().unwrap();
    g.wait_exit(Duration::from_secs(10)).unwrap();
    let (o, rep) = env.cleanup("fcreal");
    assert!(o.status.success() && rep["clean"] == true, "{}", text(&o));
    assert!(!Path::new("/sys/class/net").join(&own).exists());
    let v = env.verify_clean(&["fcreal"]);
    assert!(v.status.success(), "{}", text(&v));
}

// ---------------------------------------------------------------------------
// Probes run inside the sandbox.

/// A "hypervisor" that is a script (so its ELF cannot answer for it and
/// the launcher asks it): it reports what it can reach on its first line
/// of stderr, which the launcher's refusal quotes, leaves a child that
/// holds stdout and stderr open for two minutes (after trying to leave its
/// process group), and exits 1. `OUTSIDE` is a world-readable file outside
/// the system's trees.
const REPORTER: &str = r#"#!/usr/bin/python3
import os, socket, sys, time
def attempt(f):
    try:
        return f()
    except OSError as e:
        return 'errno%d' % e.errno
def inet():
    socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()
    return 'opened'
status = dict(l.split(':', 1) for l in open('/proc/self/status'))
seen = [
    'mntns=' + os.readlink('/proc/self/ns/mnt'),
    'pid1=' + str(os.path.exists('/proc/1')),
    'outside=' + str(attempt(lambda: open('OUTSIDE').read().strip())),
    'inet=' + str(attempt(inet)),
    'seccomp=' + status['Seccomp'].strip(),
]
if os.fork() == 0:
    try:
        os.setsid()
    except OSError:
        pass
    time.sleep(120)
    os._exit(0)
sys.stderr.write('PROBE ' + ' '.join(seen) + '\n')
sys.exit(1)
"#;

/// A "hypervisor" whose probe never ends, and whose child neither.
const HANGER: &str = "#!/bin/sh\n/bin/sleep 120 &\nexec /bin/sleep 120\n";

fn script(env: &Env, name: &str, body: &str) -> PathBuf {
    let p = env.path(name);
    std::fs::write(&p, body).unwrap();
    std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    p
}

/// The `PROBE …` report the launcher's refusal quotes, as key=value pairs.
fn report(out: &std::process::Output) -> std::collections::BTreeMap<String, String> {
    let e = stderr(out);
    let line = e
        .split("PROBE ")
        .nth(1)
        .unwrap_or_else(|| panic!("no PROBE report in the refusal: {}", text(out)));
    line.split_whitespace()
        .map_while(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.trim_end_matches([')', ':']).to_string()))
        .collect()
}

/// Probes run inside the sandbox. QEMU's `-sandbox` probe (a binary the
/// ELF check cannot judge) and cloud-hypervisor's `--help` (credentials
/// need its `fw_cfg` feature) run the binary as the principal in the
/// hypervisor's confinement: their own mount namespace and a private /proc
/// (no host process, not even pid 1), Landlock (a world-readable file
/// outside the system's trees is refused), seccomp (no IP socket). The
/// child each leaves holding stdout and stderr does not keep the launch
/// waiting and does not outlive it; a probe that never exits is killed,
/// with its child, at its deadline. The real cloud-hypervisor's `fw_cfg`
/// is read from its ELF, without running it.
#[test]
fn probes_run_inside_the_sandbox() {
    let env = Env::new();
    let outside = env.path("outside.txt");
    std::fs::write(&outside, "OUTSIDE-READ\n").unwrap();
    std::fs::set_permissions(
        &outside,
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    let reporter = script(
        &env,
        "reporter",
        &REPORTER.replace("OUTSIDE", &outside.to_string_lossy()),
    );
    let mine = std::fs::read_link("/proc/self/ns/mnt").unwrap();
    let secret = env.secret("tok", b"x");
    let u = uid(302);
    let _kvm = KvmAcl::grant(u);
    let qemu = |bin: &Path| {
        let mut s = env.spec("probed", u);
        s["hypervisor"]["binary"] = json!(bin);
        s
    };
    let ch = |bin: &Path| {
        let mut s = env.spec("probed", u);
        s["hypervisor"] = json!({ "kind": "cloud-hypervisor", "binary": bin, "accel": "kvm" });
        s["credentials"] = json!([{ "name": "tok", "source": { "path": secret } }]);
        s
    };
    for (kind, spec) in [
        ("qemu", qemu(&reporter)),
        ("cloud-hypervisor", ch(&reporter)),
    ] {
        env.write_spec("probed", &spec);
        let before = snapshot(&env, &[u]);
        // The probe's child holds stdout and stderr for two minutes: a
        // launch that waits for them (or for it) hangs past this bound,
        // far past the probe's deadline.
        let out = bounded(&mut env.launch_cmd("probed"), Duration::from_secs(60))
            .unwrap_or_else(|| panic!("{kind}: the launch hung on its probe's output"));
        assert!(!out.status.success(), "{kind}: {}", text(&out));
        let seen = report(&out);
        assert_ne!(
            seen.get("mntns").map(String::as_str),
            Some(mine.to_string_lossy().as_ref()),
            "{kind}: the probe ran in the host's mount namespace: {seen:?}"
        );
        assert_eq!(
            seen.get("pid1").map(String::as_str),
            Some("False"),
            "{kind}: the probe sees the host's processes: {seen:?}"
        );
        assert_eq!(
            seen.get("outside").map(String::as_str),
            Some("errno13"),
            "{kind}: the probe read a file outside its Landlock domain: {seen:?}"
        );
        assert_eq!(
            seen.get("inet").map(String::as_str),
            Some("errno97"),
            "{kind}: the probe opened an IP socket: {seen:?}"
        );
        assert_eq!(
            seen.get("seccomp").map(String::as_str),
            Some("2"),
            "{kind}: {seen:?}"
        );
        // Its child, which held stdout and stderr open, is gone.
        wait_until(
            &format!("{kind}: the probe's child gone"),
            Duration::from_secs(10),
            || processes_of_uid(u).is_empty(),
        );
        assert_eq!(
            before,
            snapshot(&env, &[u]),
            "{kind}: the refusal left something"
        );
    }

    // A probe that never exits: refused at its deadline, its child with it.
    let hanger = script(&env, "hanger", HANGER);
    env.write_spec("probed", &qemu(&hanger));
    let out = bounded(&mut env.launch_cmd("probed"), Duration::from_secs(60))
        .expect("the launch outlived its probe's deadline");
    assert!(
        stderr(&out).contains("did not exit within")
            && stderr(&out).contains("process group was killed"),
        "{}",
        text(&out)
    );
    wait_until(
        "the hanging probe and its child gone",
        Duration::from_secs(10),
        || processes_of_uid(u).is_empty(),
    );

    // The real cloud-hypervisor: its fw_cfg feature is read from its ELF.
    if let Some(real) = real_binary(&env, "VMWARDEN_TEST_CLOUD_HYPERVISOR", "cloud-hypervisor") {
        assert!(hypervisor::cloud_hypervisor_fw_cfg_in_elf(&real));
        assert!(!hypervisor::cloud_hypervisor_fw_cfg_in_elf(&reporter));
    }
}

/// A "QEMU" whose `-sandbox` probe answers yes (exit 0) and leaves
/// children behind that are slow to die: each holds 48 MiB of memory it
/// has written to, in 4 KiB pages (no transparent huge pages), so that
/// when the probe's process group is SIGKILLed each spends a while in its
/// exit freeing them, still alive as the principal.
const SLOW_TO_DIE: &str = r#"#!/usr/bin/python3
import mmap, os, sys
CHILDREN, SIZE = 6, 48 << 20
r, w = os.pipe()
hold, _ = os.pipe()
for _ in range(CHILDREN):
    if os.fork() == 0:
        m = mmap.mmap(-1, SIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        m.madvise(mmap.MADV_NOHUGEPAGE)
        page = b'\x01' * 4096
        for off in range(0, SIZE, 4096):
            m[off:off + 4096] = page
        os.write(w, b'.')
        os.read(hold, 1)  # forever: nobody writes to it
        os._exit(0)
got = 0
while got < CHILDREN:
    got += len(os.read(r, CHILDREN - got))
sys.exit(0)
"#;

/// A probe's children are gone before the launch goes on: the launcher
/// kills the probe's process group and waits (through pidfds) until none
/// of it is alive, so children still exiting when the launch takes its
/// lease do not make it refuse as "ambiguous". Each launch here goes on
/// to run the probe command as the principal, time after time.
#[test]
fn a_probes_children_are_gone_before_the_launch_goes_on() {
    require_root();
    let env = Env::new();
    let slow = script(&env, "slow-qemu", SLOW_TO_DIE);
    let u = uid(303);
    let mut s = env.spec("slowprobe", u);
    s["hypervisor"]["binary"] = json!(slow);
    env.write_spec("slowprobe", &s);
    for round in 0..4 {
        let out = bounded(
            env.launch_cmd("slowprobe")
                .args(["--probe", "--", "/bin/sh", "-c", "echo LAUNCHED"]),
            Duration::from_secs(60),
        )
        .unwrap_or_else(|| panic!("round {round}: the launch hung"));
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains("LAUNCHED"),
            "round {round}: {}",
            text(&out)
        );
        assert!(
            processes_of_uid(u).is_empty(),
            "round {round}: the principal still runs {:?} after the launch",
            processes_of_uid(u)
        );
        let (o, rep) = env.cleanup("slowprobe");
        assert!(o.status.success() && rep["clean"] == true, "{}", text(&o));
    }
}

/// [`SLOW_TO_DIE`] whose children's main threads have exited
/// (`pthread_exit`): each child's memory is held by a second thread, and
/// its leader is a zombie (`State: Z`, `Threads: 2`) while that thread
/// lives, so when the group is SIGKILLed the process is still alive as the
/// principal behind a zombie leader until the thread has freed it.
const SLOW_BEHIND_A_ZOMBIE_LEADER: &str = r#"#!/usr/bin/python3
import ctypes, mmap, os, sys, threading
CHILDREN, SIZE = 6, 48 << 20
r, w = os.pipe()
hold, _ = os.pipe()
def held():
    m = mmap.mmap(-1, SIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    m.madvise(mmap.MADV_NOHUGEPAGE)
    page = b'\x01' * 4096
    for off in range(0, SIZE, 4096):
        m[off:off + 4096] = page
    os.write(w, b'.')
    os.read(hold, 1)  # forever: nobody writes to it
for _ in range(CHILDREN):
    if os.fork() == 0:
        threading.Thread(target=held).start()
        ctypes.CDLL(None).pthread_exit(None)
got = 0
while got < CHILDREN:
    got += len(os.read(r, CHILDREN - got))
sys.exit(0)
"#;

/// A probe's children are gone before the launch goes on, even those whose
/// main thread exited first: a process whose leader is a zombie while a
/// thread of it runs is alive (as `processes_of_uid` counts it), so the
/// wait for the probe's group waits for it too.
#[test]
fn a_probes_children_are_gone_before_the_launch_goes_on_behind_a_zombie_leader() {
    require_root();
    let env = Env::new();
    let slow = script(&env, "slow-qemu", SLOW_BEHIND_A_ZOMBIE_LEADER);
    let u = uid(318);
    let mut s = env.spec("zombieprobe", u);
    s["hypervisor"]["binary"] = json!(slow);
    env.write_spec("zombieprobe", &s);
    for round in 0..4 {
        let out = bounded(
            env.launch_cmd("zombieprobe")
                .args(["--probe", "--", "/bin/sh", "-c", "echo LAUNCHED"]),
            Duration::from_secs(60),
        )
        .unwrap_or_else(|| panic!("round {round}: the launch hung"));
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains("LAUNCHED"),
            "round {round}: {}",
            text(&out)
        );
        assert!(
            processes_of_uid(u).is_empty(),
            "round {round}: the principal still runs {:?} after the launch",
            processes_of_uid(u)
        );
        let (o, rep) = env.cleanup("zombieprobe");
        assert!(o.status.success() && rep["clean"] == true, "{}", text(&o));
    }
}
