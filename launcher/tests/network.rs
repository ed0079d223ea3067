//! Taps for real, in a network namespace the test creates: a bridge, two
//! QEMU guests (TCG) each with a tap the launcher made, the guests see their
//! NIC with the spec's MAC, the taps die with the hypervisor, and cleanup,
//! verify-clean and reap agree. Needs root and iproute2 (`ip netns`).

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;
use vmwarden::host::procs::processes_of_uid;
use vmwarden::hypervisor::api;

const BOOT: Duration = Duration::from_secs(120);

fn nic_spec(env: &Env, name: &str, uid: u32, tap: &str, mac: &str) -> serde_json::Value {
    let mut s = env.spec(name, uid);
    s["interfaces"] = json!([{ "tap": tap, "bridge": "br0", "mac": mac }]);
    s
}

#[test]
fn two_guests_on_a_bridge_see_their_macs_and_their_taps_die_with_them() {
    let env = Env::new();
    let ns = Netns::new("two");
    ns.bridge("br0");
    let (mac_a, mac_b) = ("02:00:00:00:0a:01", "02:00:00:00:0b:01");
    env.write_spec("neta", &nic_spec(&env, "neta", uid(21), "vmw-neta0", mac_a));
    env.write_spec("netb", &nic_spec(&env, "netb", uid(22), "vmw-netb0", mac_b));

    let mut a = ns.start(&env, "neta");
    let mut b = ns.start(&env, "netb");
    a.wait_for("VMWARDEN-GUEST-READY", BOOT);
    b.wait_for("VMWARDEN-GUEST-READY", BOOT);

    // The guests see one virtio NIC each, with the spec's MAC.
    for (g, mac) in [(&a, mac_a), (&b, mac_b)] {
        let nics: Vec<String> = g
            .log_text()
            .lines()
            .filter(|l| l.starts_with("VMWARDEN-NIC "))
            .map(str::to_string)
            .collect();
        assert_eq!(
            nics,
            [format!("VMWARDEN-NIC name=eth0 mac={mac}")],
            "{}",
            g.log_text()
        );
    }

    // Host side, inside the namespace: each tap is on br0, up, with the
    // host-side MAC (fe: + the guest's last five octets).
    for (tap, host_mac) in [
        ("vmw-neta0", "fe:00:00:00:0a:01"),
        ("vmw-netb0", "fe:00:00:00:0b:01"),
    ] {
        let l = ns.ip(&["-o", "-d", "link", "show", "dev", tap]);
        assert!(l.contains("master br0"), "{tap} not on br0: {l}");
        assert!(l.contains(",UP"), "{tap} not up: {l}");
        assert!(l.contains(&format!("link/ether {host_mac}")), "{tap}: {l}");
        assert!(
            l.contains("tun type tap pi off vnet_hdr on persist off"),
            "{tap} must be a non-persistent tap: {l}"
        );
        // Not in the test's own network namespace.
        assert!(!std::path::Path::new("/sys/class/net").join(tap).exists());
    }
    // The hypervisor itself holds exactly its own tap, and the intent record
    // named it before it existed.
    assert_eq!(tun_fds_of(a.pid()), ["vmw-neta0"]);
    assert_eq!(tun_fds_of(b.pid()), ["vmw-netb0"]);
    let intent: serde_json::Value =
        serde_json::from_slice(&std::fs::read(env.run.join("neta/instance.json")).unwrap())
            .unwrap();
    assert!(
        intent["resources"]
            .as_array()
            .unwrap()
            .contains(&json!({ "kind": "tap", "name": "vmw-neta0", "bridge": "br0" })),
        "{intent}"
    );

    // SIGKILL the hypervisor: the kernel deletes its tap, nobody else does.
    a.kill();
    wait_until(
        "vmw-neta0 gone after SIGKILL",
        Duration::from_secs(10),
        || !ns.has_link("vmw-neta0"),
    );
    assert!(ns.has_link("vmw-netb0"), "the other VM's tap must stay");
    let (o, rep) = ns.cleanup(&env, "neta");
    assert!(o.status.success() && rep["clean"] == true, "{}", text(&o));
    let v = ns.vmwarden(&env, &["verify-clean", "neta"]);
    let vt = String::from_utf8_lossy(&v.stdout).into_owned();
    assert!(
        v.status.success() && vt.contains("no-tap vm=neta check=ok"),
        "{}",
        text(&v)
    );

    // Graceful stop of the other one: same result.
    let st = ns.vmwarden(&env, &["stop", "netb", "--timeout", "60"]);
    assert!(st.status.success(), "{}", text(&st));
    b.wait_exit(Duration::from_secs(30));
    assert!(!ns.has_link("vmw-netb0"));
    let (o, rep) = ns.cleanup(&env, "netb");
    assert!(o.status.success() && rep["clean"] == true, "{}", text(&o));
    let v = ns.vmwarden(&env, &["verify-clean", "neta", "netb"]);
    assert!(v.status.success(), "{}", text(&v));
    assert_eq!(ns.ip(&["-o", "link", "show", "master", "br0"]).trim(), "");
}

#[test]
fn a_surviving_tap_fails_cleanup_and_only_reap_deletes_it_when_the_vm_is_dead() {
    let env = Env::new();
    let ns = Netns::new("reap");
    ns.bridge("br0");

    // A live VM (a probe holding the lease and its tap) keeps its tap.
    env.write_spec(
        "live",
        &nic_spec(&env, "live", uid(23), "vmw-live0", "02:00:00:00:0c:01"),
    );
    let mut probe = ns
        .cmd(&env, LAUNCH, &["live"])
        .args(["--probe", "--", "/bin/sleep", "60"])
        .spawn()
        .unwrap();
    wait_until("the probe's tap", Duration::from_secs(20), || {
        ns.has_link("vmw-live0")
    });
    assert_eq!(tun_fds_of(probe.id()), ["vmw-live0"]);

    // A stopped VM whose tap survived (made persistent by someone), and a
    // vmw-* tap nobody claims.
    env.write_spec(
        "dead",
        &nic_spec(&env, "dead", uid(24), "vmw-dead0", "02:00:00:00:0d:01"),
    );
    ns.ip(&["tuntap", "add", "dev", "vmw-dead0", "mode", "tap"]);
    ns.ip(&["tuntap", "add", "dev", "vmw-stray0", "mode", "tap"]);

    // Launching "dead" now is refused: its tap name is taken, nothing made.
    let out = ns
        .cmd(&env, LAUNCH, &["dead"])
        .args(["--probe", "--", "/bin/true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78), "{}", text(&out));
    assert!(
        stderr(&out).contains("`interfaces[0].tap`") && stderr(&out).contains("already exists"),
        "{}",
        text(&out)
    );
    assert!(!env.run.join("dead").exists());

    let (o, rep) = ns.cleanup(&env, "dead");
    assert!(!o.status.success() && rep["clean"] == false, "{}", text(&o));
    assert!(
        rep["failed"].to_string().contains("tap vmw-dead0 survives"),
        "{rep}"
    );
    let v = ns.vmwarden(&env, &["verify-clean", "dead"]);
    assert!(!v.status.success(), "{}", text(&v));
    assert!(
        String::from_utf8_lossy(&v.stdout).contains("no-tap vm=dead check=FAIL"),
        "{}",
        text(&v)
    );

    // Dry run: lists, deletes nothing.
    let dry = ns.vmwarden(&env, &["reap", "--json"]);
    let dry_t = String::from_utf8_lossy(&dry.stdout).into_owned();
    assert!(dry.status.success(), "{}", text(&dry));
    assert!(
        dry_t.contains("vmw-dead0") && dry_t.contains("vmw-stray0"),
        "{dry_t}"
    );
    assert!(ns.has_link("vmw-dead0") && ns.has_link("vmw-stray0"));

    // A stopped VM whose spec names the live VM's tap by mistake must not
    // get that tap deleted (every claimant counts; a held tap is kept).
    env.write_spec(
        "aaa",
        &nic_spec(&env, "aaa", uid(25), "vmw-live0", "02:00:00:00:0e:01"),
    );
    let ap = ns.vmwarden(&env, &["reap", "--apply", "--json"]);
    std::fs::remove_file(env.config.join("aaa.json")).unwrap();
    assert!(ap.status.success(), "{}", text(&ap));
    assert!(
        !ns.has_link("vmw-dead0") && !ns.has_link("vmw-stray0"),
        "{}",
        text(&ap)
    );
    assert!(
        ns.has_link("vmw-live0"),
        "a live VM's tap must be kept: {}",
        text(&ap)
    );
    let rep: serde_json::Value = serde_json::from_slice(&ap.stdout).unwrap();
    assert!(
        rep["kept"].to_string().contains("vmw-live0"),
        "the live tap should be listed as kept: {rep}"
    );
    let (o, rep) = ns.cleanup(&env, "dead");
    assert!(o.status.success() && rep["clean"] == true, "{}", text(&o));

    let _ = probe.kill();
    let _ = probe.wait();
    wait_until(
        "vmw-live0 gone with the probe",
        Duration::from_secs(10),
        || !ns.has_link("vmw-live0"),
    );
    let (o, rep) = ns.cleanup(&env, "live");
    assert!(o.status.success() && rep["clean"] == true, "{}", text(&o));
    let v = ns.vmwarden(&env, &["verify-clean", "live", "dead"]);
    assert!(v.status.success(), "{}", text(&v));
}

#[test]
fn a_vm_cannot_make_its_tap_persistent_or_change_its_host_mac() {
    // Through the inherited tap fd, no capability is needed for these
    // ioctls; the launcher's seccomp filter refuses them.
    let env = Env::new();
    let ns = Netns::new("ioctl");
    ns.bridge("br0");
    let mut s = nic_spec(&env, "evil", uid(26), "vmw-evil0", "02:00:00:00:0f:01");
    let script = env.path("ioctl.py");
    std::fs::write(
        &script,
        r#"import fcntl, os, struct
def is_tap(f):
    try:
        return int(f) > 2 and 'iff:' in open('/proc/self/fdinfo/' + f).read()
    except OSError:
        return False
fd = next(int(f) for f in list(os.listdir('/proc/self/fd')) if is_tap(f))
def attempt(name, req, arg):
    try:
        fcntl.ioctl(fd, req, arg); print(name + '=ok')
    except OSError as e:
        print(name + '=denied:' + str(e.errno))
attempt('TUNSETPERSIST', 0x400454cb, 1)
attempt('TUNSETOWNER', 0x400454cc, 0)
attempt('TUNSETGROUP', 0x400454ce, 0)
hw = struct.pack('16sH6s8x', b'vmw-evil0', 1, bytes.fromhex('020000000099'))
attempt('SIOCSIFHWADDR', 0x8924, hw)
attempt('TUNGETIFF', 0x800454d2, b'\0' * 40)
"#,
    )
    .unwrap();
    s["landlock"]["read"] = json!([script]);
    env.write_spec("evil", &s);
    let out = ns
        .cmd(&env, LAUNCH, &["evil"])
        .args(["--probe", "--", "/usr/bin/python3"])
        .arg(&script)
        .output()
        .unwrap();
    let o = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", text(&out));
    for denied in [
        "TUNSETPERSIST",
        "TUNSETOWNER",
        "TUNSETGROUP",
        "SIOCSIFHWADDR",
    ] {
        assert!(
            o.contains(&format!("{denied}=denied:1")),
            "{denied} not refused with EPERM: {o}"
        );
    }
    // The harmless query a hypervisor uses still works (positive control).
    assert!(o.contains("TUNGETIFF=ok"), "{o}");
    // The tap died with the probe: it was never made persistent.
    wait_until("vmw-evil0 gone", Duration::from_secs(10), || {
        !ns.has_link("vmw-evil0")
    });
    let (o, rep) = ns.cleanup(&env, "evil");
    assert!(o.status.success() && rep["clean"] == true, "{}", text(&o));
}

#[test]
#[allow(clippy::assertions_on_constants)]
fn kill_at_every_launch_step_with_a_tap_leaves_no_tap() {
    assert!(
        cfg!(feature = "fault-injection"),
        "this test needs the fault-injection build: cargo test --features fault-injection"
    );
    let env = Env::new();
    let ns = Netns::new("kill");
    ns.bridge("br0");
    env.write_spec(
        "kvm0",
        &nic_spec(&env, "kvm0", uid(27), "vmw-kill0", "02:00:00:00:10:01"),
    );
    let steps = String::from_utf8(
        std::process::Command::new(LAUNCH)
            .arg("--list-steps")
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    for step in steps.lines() {
        let out = ns
            .cmd(&env, LAUNCH, &["kvm0"])
            .env("VMWARDEN_FAULT_AFTER", step)
            .output()
            .unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(out.status.signal(), Some(9), "step {step}: {}", text(&out));
        // The tap's only holder died: the kernel removed it, nothing else had to.
        assert!(
            !ns.has_link("vmw-kill0"),
            "tap survived a kill after {step}"
        );
        let (o, rep) = ns.cleanup(&env, "kvm0");
        assert!(
            o.status.success() && rep["clean"] == true,
            "after {step}: {}",
            text(&o)
        );
        let v = ns.vmwarden(&env, &["verify-clean", "kvm0"]);
        assert!(v.status.success(), "after {step}: {}", text(&v));
    }
}

/// `ip netns exec NS cat /sys/class/net/TAP/FILE` (sysfs of the namespace).
fn sys_net(ns: &Netns, tap: &str, file: &str) -> Option<String> {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &ns.name, "cat"])
        .arg(format!("/sys/class/net/{tap}/{file}"))
        .output()
        .unwrap();
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// A Python program that attaches to tap `name` with TUNSETIFF, as
/// firecracker does, and prints `attached` or `denied:ERRNO`.
fn attach_script(name: &str) -> String {
    format!(
        r#"import fcntl, os, struct
fd = os.open('/dev/net/tun', os.O_RDWR)
try:
    fcntl.ioctl(fd, 0x400454ca, struct.pack('16sH22x', b'{name}', 0x0002 | 0x1000 | 0x4000))
    print('attached')
except OSError as e:
    print('denied:' + str(e.errno))
"#
    )
}

fn firecracker_nic_spec(
    env: &Env,
    name: &str,
    uid: u32,
    bin: &std::path::Path,
    tap: &str,
) -> serde_json::Value {
    let mut s = env.spec(name, uid);
    s["hypervisor"] = json!({ "kind": "firecracker", "binary": bin, "accel": "kvm" });
    s["cmdline"] = json!("console=ttyS0");
    s["interfaces"] = json!([{ "tap": tap, "bridge": "br0", "mac": "02:00:00:00:21:01" }]);
    s["vsock"] = json!({ "cid": 21, "backend": "user" });
    s
}

#[test]
fn firecracker_attaches_by_name_to_a_tap_in_a_network_namespace_of_its_own() {
    // The real firecracker, unconfigured, in the full sandbox: it is given
    // the network interface and vsock of the config file vmwarden wrote
    // through its API, so it opens the tap by name and binds its vsock
    // socket as it would at boot (this host's KVM runs no guest).
    let env = Env::new();
    let Some(bin) = real_binary(&env, "VMWARDEN_TEST_FIRECRACKER", "firecracker") else {
        return;
    };
    let ns = Netns::new("fctap");
    ns.bridge("br0");
    let u = uid(38);
    env.write_spec(
        "fcnet",
        &firecracker_nic_spec(&env, "fcnet", u, &bin, "vmw-fcnet0"),
    );
    let _acl = KvmAcl::grant(u);
    // firecracker opens /dev/net/tun itself: udev makes it 0666 on a
    // standard host; this one has no udev (0600), so the test grants it,
    // to the other uid as well so that the tap's owner check is what
    // refuses that one.
    let _tun = DevAcl::grant("/dev/net/tun", u);
    let _tun_other = DevAcl::grant("/dev/net/tun", uid(39));
    let sock = env.run.join("fcnet/control/api.sock");
    let mut c = ns.cmd(&env, LAUNCH, &["fcnet"]);
    c.arg("--probe")
        .arg("--")
        .arg(&bin)
        .arg("--api-sock")
        .arg(&sock);
    let mut g = spawn_logged(c, env.path("fcnet.log"));
    wait_until("firecracker's API", Duration::from_secs(30), || {
        api::answers(&sock)
    });
    // On the host (the test's namespace): the host side of the link into
    // firecracker's namespace, a veth on the bridge, up; no tap.
    let shown = ns.ip(&["-d", "link", "show", "vmw-fcnet0"]);
    assert!(
        shown.contains("master br0") && shown.contains("veth") && shown.contains("UP"),
        "{shown}"
    );
    assert_eq!(sys_net(&ns, "vmw-fcnet0", "tun_flags"), None);
    // firecracker runs in a network namespace of its own, which holds its
    // tap (persistent, the principal's) and the other end of the link,
    // joined by tc redirects both ways, and nothing else.
    let fc = FcNet { pid: g.pid() };
    assert_ne!(
        fc.ns_id(),
        ns_id_of(&ns),
        "firecracker shares the host's network namespace"
    );
    let mut links = fc.links();
    links.sort();
    assert_eq!(links, ["lo", "uplink0", "vmw-fcnet0"]);
    let flags = u32::from_str_radix(
        fc.sys("vmw-fcnet0", "tun_flags").trim_start_matches("0x"),
        16,
    )
    .unwrap();
    assert_ne!(flags & 0x0800, 0, "not persistent: {flags:#x}");
    assert_eq!(fc.sys("vmw-fcnet0", "owner"), u.to_string());
    assert_eq!(fc.sys("vmw-fcnet0", "group"), u.to_string());
    for (from, to) in [("vmw-fcnet0", "uplink0"), ("uplink0", "vmw-fcnet0")] {
        let f = fc.run(&["tc", "filter", "show", "dev", from, "ingress"]);
        assert!(
            f.contains(&format!("Egress Redirect to device {to}")),
            "{from}: {f}"
        );
    }
    // Another uid cannot attach to it; without CAP_NET_ADMIN nobody can
    // create one either.
    assert_eq!(fc.attach_as(uid(39), "vmw-fcnet0"), "denied:1");
    // firecracker attaches to it by name through the sandbox (Landlock
    // grants /dev/net/tun, seccomp lets TUNSETIFF through) and binds its
    // vsock socket in control/.
    let cfg: serde_json::Value = serde_json::from_slice(
        &std::fs::read(env.run.join("fcnet/control/firecracker.json")).unwrap(),
    )
    .unwrap();
    let nic = &cfg["network-interfaces"][0];
    assert_eq!(nic["host_dev_name"], "vmw-fcnet0");
    let t = Duration::from_secs(5);
    api::expect_ok(
        &sock,
        "PUT",
        "/network-interfaces/net0",
        Some(&nic.to_string()),
        t,
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", g.log_text()));
    assert_eq!(tun_fds_of(g.pid()), ["vmw-fcnet0"]);
    api::expect_ok(&sock, "PUT", "/vsock", Some(&cfg["vsock"].to_string()), t)
        .unwrap_or_else(|e| panic!("{e}\n{}", g.log_text()));
    use std::os::unix::fs::FileTypeExt;
    let vs = env.run.join("fcnet/control/vsock.sock");
    assert_eq!(cfg["vsock"]["uds_path"], json!(vs));
    assert!(std::fs::symlink_metadata(&vs)
        .unwrap()
        .file_type()
        .is_socket());
    // SIGKILL while something else holds firecracker's namespace (here the
    // test, by an fd of it; nothing the principal runs can): the namespace,
    // with the tap and the link, outlives it, and so does the host end of
    // the link, still on the bridge. verify-clean says so, reap lists it as
    // the dead VM's, and cleanup deletes it (the rest is unreachable from
    // the host and goes with the namespace).
    let held = std::fs::File::open(format!("/proc/{}/ns/net", g.pid())).unwrap();
    g.child.kill().unwrap();
    g.wait_exit(Duration::from_secs(10)).unwrap();
    assert!(ns.has_link("vmw-fcnet0"));
    let v = ns.vmwarden(&env, &["verify-clean", "fcnet"]);
    assert!(!v.status.success(), "{}", text(&v));
    let dry = ns.vmwarden(&env, &["reap", "--json"]);
    assert!(dry.status.success(), "{}", text(&dry));
    let dry: serde_json::Value = serde_json::from_slice(&dry.stdout).unwrap();
    assert!(
        dry["orphans"].as_array().unwrap().iter().any(|o| {
            o["path"] == "/sys/class/net/vmw-fcnet0"
                && o["vm"] == "fcnet"
                && o["reason"]
                    .as_str()
                    .unwrap()
                    .contains("link into a VM's network namespace")
        }),
        "{dry}"
    );
    let (o, rep) = ns.cleanup(&env, "fcnet");
    assert!(o.status.success() && rep["clean"] == true, "{}", text(&o));
    assert!(
        rep["deleted"]
            .to_string()
            .contains("/sys/class/net/vmw-fcnet0"),
        "{rep}"
    );
    assert!(!ns.has_link("vmw-fcnet0"));
    let v = ns.vmwarden(&env, &["verify-clean", "fcnet"]);
    assert!(v.status.success(), "{}", text(&v));
    drop(held);
}

/// The network namespace of process `pid` (firecracker's), for the test's
/// own looks inside it (`nsenter`, as root).
struct FcNet {
    pid: u32,
}

impl FcNet {
    fn ns_id(&self) -> std::path::PathBuf {
        std::fs::read_link(format!("/proc/{}/ns/net", self.pid)).unwrap()
    }

    /// `nsenter --net=… --mount=… PROGRAM ARGS…` (the mount namespace too,
    /// for a sysfs of that network namespace), asserted to succeed.
    fn run(&self, args: &[&str]) -> String {
        let out = std::process::Command::new("nsenter")
            .arg(format!("--net=/proc/{}/ns/net", self.pid))
            .args(["--", "unshare", "--mount", "--", "sh", "-c"])
            .arg(r#"mount -t sysfs sysfs /sys && exec "$@""#)
            .arg("sh")
            .args(args)
            .output()
            .expect("nsenter and unshare (util-linux)");
        assert!(out.status.success(), "{args:?}: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn links(&self) -> Vec<String> {
        self.run(&["ls", "/sys/class/net"])
            .split_whitespace()
            .map(str::to_string)
            .collect()
    }

    fn sys(&self, link: &str, file: &str) -> String {
        self.run(&["cat", &format!("/sys/class/net/{link}/{file}")])
    }

    /// Can `uid` attach to tap `name` in this namespace?
    fn attach_as(&self, uid: u32, name: &str) -> String {
        self.run(&[
            "setpriv",
            &format!("--reuid={uid}"),
            &format!("--regid={uid}"),
            "--clear-groups",
            "/usr/bin/python3",
            "-c",
            &attach_script(name),
        ])
    }
}

/// The network namespace of `ns`, as /proc names it.
fn ns_id_of(ns: &Netns) -> std::path::PathBuf {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &ns.name, "readlink", "/proc/self/ns/net"])
        .output()
        .unwrap();
    std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

#[test]
fn kill_at_every_launch_step_with_a_firecracker_tap_leaves_no_tap_after_cleanup() {
    require_fault_injection();
    let env = Env::new();
    let Some(bin) = real_binary(&env, "VMWARDEN_TEST_FIRECRACKER", "firecracker") else {
        return;
    };
    let ns = Netns::new("fckill");
    ns.bridge("br0");
    env.write_spec(
        "fck",
        &firecracker_nic_spec(&env, "fck", uid(40), &bin, "vmw-fck0"),
    );
    for step in launch_steps() {
        let out = ns
            .cmd(&env, LAUNCH, &["fck"])
            .env("VMWARDEN_FAULT_AFTER", &step)
            .output()
            .unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(out.status.signal(), Some(9), "step {step}: {}", text(&out));
        // From `taps` on, the host end of the link exists until the kernel
        // has torn the dead launcher's namespace down; cleanup deletes it
        // if it is still there.
        let (o, rep) = ns.cleanup(&env, "fck");
        assert!(
            o.status.success() && rep["clean"] == true,
            "after {step}: {}",
            text(&o)
        );
        assert!(
            !ns.has_link("vmw-fck0"),
            "tap left after {step} and cleanup"
        );
        let v = ns.vmwarden(&env, &["verify-clean", "fck"]);
        assert!(v.status.success(), "after {step}: {}", text(&v));
    }
}

/// Two installations side by side (two sets of roots, as `unitPrefix`
/// makes them) whose firecracker VMs name the same tap: neither's teardown
/// deletes the other's host end of its link. Roots B's VM ran (under
/// `--probe`) and left its intent record, which names the link; roots A's
/// VM then runs with the same tap name, with the real firecracker. B's
/// cleanup and B's `reap --apply` leave A's link alone (it carries A's
/// instance's mark, not B's); A's own cleanup deletes nothing of B's and
/// leaves nothing.
#[test]
fn two_installations_never_delete_each_others_firecracker_link() {
    let a = Env::new();
    let Some(bin) = real_binary(&a, "VMWARDEN_TEST_FIRECRACKER", "firecracker") else {
        return;
    };
    let b = a.sibling();
    let ns = Netns::new("fcsib");
    ns.bridge("br0");
    let (ua, ub) = (uid(44), uid(45));
    a.write_spec(
        "web",
        &firecracker_nic_spec(&a, "web", ua, &bin, "vmw-sib0"),
    );
    b.write_spec(
        "web",
        &firecracker_nic_spec(&b, "web", ub, &bin, "vmw-sib0"),
    );
    let _kvm_a = KvmAcl::grant(ua);
    let _kvm_b = KvmAcl::grant(ub);
    // Roots B: its VM ran and is gone; its intent record stays until its
    // cleanup (a killed unit's ExecStopPost, an operator's later run).
    let out = ns
        .cmd(&b, LAUNCH, &["web"])
        .args(["--probe", "--", "/bin/true"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let intent_b = b.run.join("web/instance.json");
    assert!(intent_b.exists(), "roots B's intent record is gone");
    wait_until(
        "B's link gone with its namespace",
        Duration::from_secs(10),
        || !ns.has_link("vmw-sib0"),
    );
    // Roots A: the real firecracker, its link on the bridge.
    let sock = a.run.join("web/control/api.sock");
    let mut c = ns.cmd(&a, LAUNCH, &["web"]);
    c.arg("--probe")
        .arg("--")
        .arg(&bin)
        .arg("--api-sock")
        .arg(&sock);
    let mut g = spawn_logged(c, a.path("web.log"));
    wait_until("A's firecracker API", Duration::from_secs(30), || {
        api::answers(&sock)
    });
    let index = sys_net(&ns, "vmw-sib0", "ifindex").expect("A's link");
    let mut a_still_there = |when: &str| {
        assert_eq!(
            sys_net(&ns, "vmw-sib0", "ifindex").as_deref(),
            Some(index.as_str()),
            "{when}: roots B deleted roots A's link vmw-sib0"
        );
        assert!(
            g.child.try_wait().unwrap().is_none(),
            "{when}: A's firecracker died"
        );
    };
    let (o, rep) = ns.cleanup(&b, "web");
    assert!(
        !rep["deleted"].to_string().contains("vmw-sib0"),
        "{}",
        text(&o)
    );
    a_still_there("after B's cleanup");
    let r = ns.vmwarden(&b, &["reap", "--apply", "--json"]);
    a_still_there(&format!("after B's reap --apply ({})", text(&r)));
    // A's own teardown: the link goes with its namespace, or A's cleanup
    // deletes it (its mark is A's), and nothing is left.
    g.child.kill().unwrap();
    g.wait_exit(Duration::from_secs(10)).unwrap();
    // Its helpers (the vsock relay) follow it within moments, and hold the
    // lease until then.
    wait_until("A's instance dead", Duration::from_secs(10), || {
        processes_of_uid(ua).is_empty()
    });
    let (o, rep) = ns.cleanup(&a, "web");
    assert!(o.status.success() && rep["clean"] == true, "{}", text(&o));
    assert!(!ns.has_link("vmw-sib0"));
    let v = ns.vmwarden(&a, &["verify-clean", "web"]);
    assert!(v.status.success(), "{}", text(&v));
    let (o, rep) = ns.cleanup(&b, "web");
    assert!(o.status.success() && rep["clean"] == true, "{}", text(&o));
}
