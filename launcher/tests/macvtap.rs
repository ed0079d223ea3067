//! macvtap interfaces for real, on this host's kernel, in network
//! namespaces the test creates: the parent is one end of a veth pair whose
//! other end, with an address, is in a second ("peer") namespace, so every
//! frame stays on this machine. Two QEMU guests (TCG) on macvtaps in bridge
//! mode on that one parent reach each other and the peer; the link is the
//! VM's (named in the intent record, the guest's MAC, the hypervisor's fds
//! on its character device, a node the principal cannot open), it survives
//! a SIGKILL of the hypervisor (a macvtap outlives its fds) and cleanup
//! deletes it; a launch killed after every step leaves no link once
//! cleanup ran; the hypervisor cannot change the link's MAC; a missing
//! parent or another VM's link is refused by name with nothing made;
//! cloud-hypervisor takes the fds. Needs root and iproute2 (`ip netns`).

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;
use vmwarden::hypervisor::api;

const BOOT: Duration = Duration::from_secs(240);
const PARENT: &str = "mvp0";

/// The launcher's namespace with parent [`PARENT`], and the peer namespace
/// holding the veth's other end as 10.205.0.1/24.
fn namespaces(tag: &str) -> (Netns, Netns) {
    let ns = Netns::new(tag);
    let peer = Netns::new(&format!("{tag}p"));
    ns.ip(&[
        "link", "add", PARENT, "type", "veth", "peer", "name", "mvpeer", "netns", &peer.name,
    ]);
    ns.ip(&["link", "set", PARENT, "up"]);
    peer.ip(&["addr", "add", "10.205.0.1/24", "dev", "mvpeer"]);
    peer.ip(&["link", "set", "mvpeer", "up"]);
    (ns, peer)
}

fn macvtap(tap: &str, mac: &str, link: &str) -> serde_json::Value {
    json!([{ "tap": tap, "type": "macvtap", "mac": mac,
             "macvtap": { "link": link, "mode": "bridge" } }])
}

/// `cat /sys/class/net/LINK/FILE` in the namespace's own sysfs.
fn sys_net(ns: &Netns, link: &str, file: &str) -> String {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &ns.name, "cat"])
        .arg(format!("/sys/class/net/{link}/{file}"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// `MAJOR:MINOR` of each fd of `pid` that is a character device whose
/// target is named `tapN` (a macvtap's: seen from here as `/dev/tapN` or,
/// opened before the sandbox's mounts, `/tapN`).
fn macvtap_fds_of(pid: u32) -> Vec<String> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let mut out: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read_link(e.path()).is_ok_and(|t| {
                t.file_name()
                    .and_then(|n| n.to_str())
                    .and_then(|n| n.strip_prefix("tap"))
                    .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            })
        })
        .filter_map(|e| std::fs::metadata(e.path()).ok())
        .filter(|m| m.file_type().is_char_device())
        .map(|m| {
            let rdev = m.rdev();
            format!(
                "{}:{}",
                nix::sys::stat::major(rdev),
                nix::sys::stat::minor(rdev)
            )
        })
        .collect();
    out.sort();
    out
}

/// `MAJOR:MINOR` of macvtap `link`'s character device, from sysfs.
fn char_dev_of(ns: &Netns, link: &str) -> String {
    let index = sys_net(ns, link, "ifindex");
    sys_net(ns, link, &format!("macvtap/tap{index}/dev"))
}

/// `busybox ping` from the peer namespace.
fn ping_from(peer: &Netns, addr: &str) -> std::process::Output {
    std::process::Command::new("ip")
        .args([
            "netns", "exec", &peer.name, "busybox", "ping", "-c", "3", "-W", "10", addr,
        ])
        .output()
        .unwrap()
}

/// The guest's script: its address, then the peer and the other guest by
/// ping, each success a marker on the console.
fn guest_script(own: &str, other: &str) -> String {
    format!(
        "ip addr add {own}/24 dev eth0 && ip link set eth0 up && \
         for i in $(seq 1 60); do ping -c 1 -W 1 10.205.0.1 >/dev/null 2>&1 && echo T-PEER-OK && break; done; \
         for i in $(seq 1 180); do ping -c 1 -W 1 {other} >/dev/null 2>&1 && echo T-OTHER-OK && break; done"
    )
}

#[test]
fn two_guests_on_macvtaps_in_bridge_mode_reach_each_other_and_a_peer_and_cleanup_deletes_the_links()
{
    require_root();
    let env = Env::new();
    let (ns, peer) = namespaces("mvt");
    let (mac_a, mac_b) = ("02:00:00:00:5a:01", "02:00:00:00:5b:01");
    let mut a = env.shares_spec(
        "mva",
        uid(400),
        "hold",
        &guest_script("10.205.0.2", "10.205.0.3"),
    );
    a["interfaces"] = macvtap("vmw-mva0", mac_a, PARENT);
    env.write_spec("mva", &a);
    let mut b = env.shares_spec(
        "mvb",
        uid(401),
        "hold",
        &guest_script("10.205.0.3", "10.205.0.2"),
    );
    b["interfaces"] = macvtap("vmw-mvb0", mac_b, PARENT);
    env.write_spec("mvb", &b);

    let mut ga = ns.start(&env, "mva");
    let mut gb = ns.start(&env, "mvb");
    for g in [&mut ga, &mut gb] {
        g.wait_for("T-PEER-OK", BOOT);
        g.wait_for("T-OTHER-OK", BOOT);
        g.wait_for("VMWARDEN-GUEST-READY", BOOT);
    }
    for addr in ["10.205.0.2", "10.205.0.3"] {
        let p = ping_from(&peer, addr);
        assert!(p.status.success(), "peer -> {addr}: {}", text(&p));
    }

    // Host side: each link is a bridge-mode macvtap on the parent, up,
    // with the guest's MAC and every multicast frame let through; the
    // hypervisor holds exactly its own character device, which the
    // principal cannot open.
    for (g, tap, mac, u) in [
        (&ga, "vmw-mva0", mac_a, uid(400)),
        (&gb, "vmw-mvb0", mac_b, uid(401)),
    ] {
        let l = ns.ip(&["-o", "-d", "link", "show", "dev", tap]);
        assert!(l.contains(&format!("{tap}@{PARENT}")), "{l}");
        assert!(l.contains("macvtap mode bridge"), "{l}");
        assert!(l.contains(&format!("link/ether {mac}")), "{l}");
        assert!(l.contains("ALLMULTI") && l.contains(",UP"), "{l}");
        let node = format!("/dev/tap{}", sys_net(&ns, tap, "ifindex"));
        assert_eq!(macvtap_fds_of(g.pid()), [char_dev_of(&ns, tap)]);
        let own = std::process::Command::new("setpriv")
            .args(["--reuid", &u.to_string(), "--regid", &u.to_string()])
            .args(["--clear-groups", "sh", "-c"])
            .arg(format!("exec 3<>{node}"))
            .output()
            .unwrap();
        assert!(!own.status.success(), "the principal opened {node}");
    }
    let intent: serde_json::Value =
        serde_json::from_slice(&std::fs::read(env.run.join("mva/instance.json")).unwrap()).unwrap();
    assert!(
        intent["resources"].as_array().unwrap().contains(&json!({
            "kind": "macvtap", "name": "vmw-mva0", "link": PARENT, "mode": "bridge"
        })),
        "{intent}"
    );

    // SIGKILL: the macvtap outlives the fds; cleanup deletes it.
    ga.kill();
    ga.wait_exit(Duration::from_secs(10));
    assert!(ns.has_link("vmw-mva0"), "a macvtap outlives its fds");
    let (o, rep) = ns.cleanup(&env, "mva");
    assert!(o.status.success() && rep["clean"] == true, "{}", text(&o));
    assert!(
        rep["deleted"]
            .to_string()
            .contains("/sys/class/net/vmw-mva0"),
        "{rep}"
    );
    assert!(!ns.has_link("vmw-mva0"));
    assert!(ns.has_link("vmw-mvb0"), "the other VM's macvtap must stay");
    let v = ns.vmwarden(&env, &["verify-clean", "mva"]);
    assert!(
        v.status.success() && String::from_utf8_lossy(&v.stdout).contains("no-tap vm=mva check=ok"),
        "{}",
        text(&v)
    );

    // A graceful stop, then cleanup: the same.
    let st = ns.vmwarden(&env, &["stop", "mvb", "--timeout", "90"]);
    assert!(st.status.success(), "{}", text(&st));
    gb.wait_exit(Duration::from_secs(30));
    let (o, rep) = ns.cleanup(&env, "mvb");
    assert!(o.status.success() && rep["clean"] == true, "{}", text(&o));
    assert!(!ns.has_link("vmw-mvb0"));
    let v = ns.vmwarden(&env, &["verify-clean", "mva", "mvb"]);
    assert!(v.status.success(), "{}", text(&v));
    // The parent is as it was: up, no macvtap left on it.
    assert_eq!(ns.ip(&["-o", "link", "show", "type", "macvtap"]).trim(), "");
}

#[test]
fn a_vm_cannot_change_its_macvtaps_mac_or_flags() {
    // Through the inherited fd the macvtap driver changes the link's MAC
    // (in passthru mode its parent's) with no capability check; the
    // launcher's seccomp filter refuses it, as for a tap.
    require_root();
    let env = Env::new();
    let (ns, _peer) = namespaces("mvi");
    let mut s = env.spec("mvi", uid(402));
    s["interfaces"] = macvtap("vmw-mvi0", "02:00:00:00:5c:01", PARENT);
    let script = env.path("ioctl.py");
    std::fs::write(
        &script,
        r#"import fcntl, os, re, struct
# /dev/tapN, seen from the sandbox as /tapN (the host's /dev is not its).
def is_macvtap(f):
    try:
        return re.search(r'/tap[0-9]+$', os.readlink('/proc/self/fd/' + f)) is not None
    except OSError:
        return False
fd = next(int(f) for f in list(os.listdir('/proc/self/fd')) if is_macvtap(f))
def attempt(name, req, arg):
    try:
        fcntl.ioctl(fd, req, arg); print(name + '=ok')
    except OSError as e:
        print(name + '=denied:' + str(e.errno))
hw = struct.pack('16sH6s8x', b'vmw-mvi0', 1, bytes.fromhex('020000000099'))
attempt('SIOCSIFHWADDR', 0x8924, hw)
attempt('TUNSETIFF', 0x400454ca, struct.pack('16sH22x', b'', 0x1002))
attempt('TUNGETIFF', 0x800454d2, b'\0' * 40)
"#,
    )
    .unwrap();
    s["landlock"]["read"] = json!([script]);
    env.write_spec("mvi", &s);
    let out = ns
        .cmd(&env, LAUNCH, &["mvi"])
        .args(["--probe", "--", "/usr/bin/python3"])
        .arg(&script)
        .output()
        .unwrap();
    let o = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", text(&out));
    assert!(o.contains("SIOCSIFHWADDR=denied:1"), "{o}");
    assert!(o.contains("TUNSETIFF=denied:17"), "{o}");
    // The query a hypervisor uses still works (positive control).
    assert!(o.contains("TUNGETIFF=ok"), "{o}");
    let l = ns.ip(&["-o", "link", "show", "dev", "vmw-mvi0"]);
    assert!(l.contains("link/ether 02:00:00:00:5c:01"), "{l}");
    let (o, rep) = ns.cleanup(&env, "mvi");
    assert!(o.status.success() && rep["clean"] == true, "{}", text(&o));
    assert!(!ns.has_link("vmw-mvi0"));
}

#[test]
fn kill_at_every_launch_step_with_a_macvtap_leaves_no_link_after_cleanup() {
    require_root();
    require_fault_injection();
    let env = Env::new();
    let (ns, _peer) = namespaces("mvk");
    let mut s = env.spec("mvk", uid(403));
    s["interfaces"] = macvtap("vmw-mvk0", "02:00:00:00:5d:01", PARENT);
    env.write_spec("mvk", &s);
    let mut made = false;
    for step in launch_steps() {
        let out = ns
            .cmd(&env, LAUNCH, &["mvk"])
            .env("VMWARDEN_FAULT_AFTER", &step)
            .output()
            .unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(out.status.signal(), Some(9), "step {step}: {}", text(&out));
        made |= ns.has_link("vmw-mvk0");
        let (o, rep) = ns.cleanup(&env, "mvk");
        assert!(
            o.status.success() && rep["clean"] == true,
            "after {step}: {}",
            text(&o)
        );
        assert!(
            !ns.has_link("vmw-mvk0"),
            "macvtap survived cleanup after {step}"
        );
        let v = ns.vmwarden(&env, &["verify-clean", "mvk"]);
        assert!(v.status.success(), "after {step}: {}", text(&v));
    }
    assert!(made, "no step left a macvtap for cleanup to delete");
    assert_eq!(ns.ip(&["-o", "link", "show", "type", "macvtap"]).trim(), "");
}

#[test]
fn a_missing_link_or_another_vms_link_is_refused_by_name_with_nothing_made() {
    require_root();
    let env = Env::new();
    let (ns, _peer) = namespaces("mvr");
    ns.bridge("br0");
    let links_before = ns.ip(&["-o", "link", "show"]);
    let other = |name: &str| {
        let mut s = env.spec(name, uid(404));
        s["interfaces"] = json!([{ "tap": "vmw-mvo0", "bridge": "br0" }]);
        s
    };
    env.write_spec("mvo", &other("mvo"));
    let cases = [
        (
            "nosuch0",
            "principal-resolved",
            "`interfaces[0].macvtap.link` \"nosuch0\" does not exist on this host",
        ),
        (
            "vmw-mvo0",
            "spec-loaded",
            "`interfaces[0].macvtap.link` \"vmw-mvo0\" is a VM's link",
        ),
    ];
    for (link, step, want) in cases {
        let mut s = env.spec("mvr", uid(405));
        s["interfaces"] = macvtap("vmw-mvr0", "02:00:00:00:5e:01", link);
        env.write_spec("mvr", &s);
        let out = ns
            .cmd(&env, LAUNCH, &["mvr"])
            .args(["--probe", "--", "/bin/true"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(78), "{link}: {}", text(&out));
        let err = stderr(&out);
        assert!(
            err.contains(&format!("error at step \"{step}\"")) && err.contains(want),
            "{link}: {err}"
        );
        assert!(
            !env.run.join("mvr").exists(),
            "{link}: a runtime dir was made"
        );
        assert_eq!(ns.ip(&["-o", "link", "show"]), links_before, "{link}");
    }
    // While the other VM runs (its tap exists), naming it is refused too.
    let mut probe = ns
        .cmd(&env, LAUNCH, &["mvo"])
        .args(["--probe", "--", "/bin/sleep", "60"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_until("the other VM's tap", Duration::from_secs(20), || {
        ns.has_link("vmw-mvo0")
    });
    let out = ns
        .cmd(&env, LAUNCH, &["mvr"])
        .args(["--probe", "--", "/bin/true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78), "{}", text(&out));
    assert!(
        stderr(&out).contains("`interfaces[0].macvtap.link` \"vmw-mvo0\""),
        "{}",
        text(&out)
    );
    let _ = probe.kill();
    let _ = probe.wait();
    let (o, rep) = ns.cleanup(&env, "mvo");
    assert!(o.status.success() && rep["clean"] == true, "{}", text(&o));
}

/// A passthru macvtap makes its parent promiscuous, and a promiscuous
/// bridge passes every frame it forwards between its ports up to its own
/// device: a passthru macvtap on a bridge that carries other VMs' taps
/// would hand the guest all their traffic. Refused by name at pre-flight,
/// with nothing made.
#[test]
fn a_passthru_macvtap_on_a_bridge_is_refused_it_would_hear_every_port() {
    require_root();
    let env = Env::new();
    let (ns, _peer) = namespaces("mvb");
    ns.bridge("br0");
    let links_before = ns.ip(&["-o", "link", "show"]);
    let mut s = env.spec("mvb", uid(406));
    s["interfaces"] = json!([{ "tap": "vmw-mvb0", "type": "macvtap", "mac": "02:00:00:00:5e:02",
             "macvtap": { "link": "br0", "mode": "passthru" } }]);
    env.write_spec("mvb", &s);
    let out = ns
        .cmd(&env, LAUNCH, &["mvb"])
        .args(["--probe", "--", "/bin/true"])
        .output()
        .unwrap();
    let promisc = sys_net(&ns, "br0", "flags");
    if out.status.success() {
        let _ = ns.cleanup(&env, "mvb");
    }
    assert_eq!(
        out.status.code(),
        Some(78),
        "a passthru macvtap was made on bridge br0 (its flags then {promisc}): {}",
        text(&out)
    );
    let err = stderr(&out);
    assert!(
        err.contains("`interfaces[0].macvtap.link` \"br0\" is a bridge"),
        "{err}"
    );
    assert!(!env.run.join("mvb").exists(), "a runtime dir was made");
    assert_eq!(ns.ip(&["-o", "link", "show"]), links_before);
}

#[test]
fn reap_deletes_a_dead_vms_macvtap_and_keeps_one_no_vm_claims() {
    require_root();
    let env = Env::new();
    let (ns, _peer) = namespaces("mvp");
    require_fault_injection();
    let mut s = env.spec("mvd", uid(407));
    s["interfaces"] = macvtap("vmw-mvd0", "02:00:00:00:60:01", PARENT);
    env.write_spec("mvd", &s);
    // A dead VM's macvtap that survived: its launch killed right after the
    // `taps` step (the link made and marked with the instance its intent
    // record names, no cleanup run); and a vmw-* macvtap that no VM claims,
    // made here by hand.
    let out = ns
        .cmd(&env, LAUNCH, &["mvd"])
        .env("VMWARDEN_FAULT_AFTER", "taps")
        .output()
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(9), "{}", text(&out));
    assert!(ns.has_link("vmw-mvd0"), "the killed launch left no macvtap");
    ns.ip(&[
        "link", "add", "link", PARENT, "name", "vmw-mvx0", "type", "macvtap", "mode", "bridge",
    ]);
    let v = ns.vmwarden(&env, &["verify-clean", "mvd"]);
    assert!(
        !v.status.success()
            && String::from_utf8_lossy(&v.stdout).contains("no-tap vm=mvd check=FAIL"),
        "{}",
        text(&v)
    );
    let dry = ns.vmwarden(&env, &["reap", "--json"]);
    assert!(dry.status.success(), "{}", text(&dry));
    let rep: serde_json::Value = serde_json::from_slice(&dry.stdout).unwrap();
    assert!(rep["orphans"].to_string().contains("vmw-mvd0"), "{rep}");
    assert!(
        ns.has_link("vmw-mvd0") && ns.has_link("vmw-mvx0"),
        "a dry run deletes nothing"
    );
    let ap = ns.vmwarden(&env, &["reap", "--apply", "--json"]);
    assert!(ap.status.success(), "{}", text(&ap));
    let rep: serde_json::Value = serde_json::from_slice(&ap.stdout).unwrap();
    assert!(!ns.has_link("vmw-mvd0"), "{rep}");
    assert!(
        ns.has_link("vmw-mvx0"),
        "a macvtap no VM claims is not vmwarden's: {rep}"
    );
    assert!(
        rep["kept"]
            .to_string()
            .contains("a macvtap that no VM's intent record or spec names"),
        "{rep}"
    );
    ns.ip(&["link", "del", "vmw-mvx0"]);
    let (o, c) = ns.cleanup(&env, "mvd");
    assert!(o.status.success() && c["clean"] == true, "{}", text(&o));
    let v = ns.vmwarden(&env, &["verify-clean", "mvd"]);
    assert!(v.status.success(), "{}", text(&v));
}

#[test]
fn real_cloud_hypervisor_takes_a_macvtaps_fds_and_cleanup_deletes_the_link() {
    require_root();
    let env = Env::new();
    let Some(bin) = real_binary(&env, "VMWARDEN_TEST_CLOUD_HYPERVISOR", "cloud-hypervisor") else {
        return;
    };
    let (ns, _peer) = namespaces("mvc");
    let u = uid(406);
    let mut s = env.spec("mvc", u);
    s["hypervisor"] = json!({ "kind": "cloud-hypervisor", "binary": bin, "accel": "kvm" });
    s["cmdline"] = json!("console=ttyS0");
    s["vcpus"] = json!(2);
    s["interfaces"] = json!([{ "tap": "vmw-mvc0", "type": "macvtap", "mac": "02:00:00:00:5f:01",
        "queues": 2, "macvtap": { "link": PARENT, "mode": "bridge" } }]);
    env.write_spec("mvc", &s);
    let _acl = KvmAcl::grant(u);
    // This host's KVM cannot run the guest, but cloud-hypervisor creates
    // the VM, its virtio-net on the two inherited queue fds, and answers.
    let mut g = ns.start(&env, "mvc");
    let sock = env.run.join("mvc/control/api.sock");
    let mut info = String::new();
    wait_until(
        "cloud-hypervisor's vm.info",
        Duration::from_secs(60),
        || {
            assert!(
                g.child.try_wait().unwrap().is_none(),
                "cloud-hypervisor exited:\n{}",
                g.log_text()
            );
            match api::request(
                &sock,
                "GET",
                "/api/v1/vm.info",
                None,
                Duration::from_secs(2),
            ) {
                Ok(r) if r.ok() => {
                    info = format!("{r:?}");
                    true
                }
                _ => false,
            }
        },
    );
    assert!(info.contains("02:00:00:00:5f:01"), "{info}");
    // Both queues' fds (cloud-hypervisor keeps a copy of each it was
    // given), every one on this link's character device.
    let dev = char_dev_of(&ns, "vmw-mvc0");
    let fds = macvtap_fds_of(g.pid());
    assert!(
        fds.len() >= 2 && fds.iter().all(|f| *f == dev),
        "{fds:?} {dev}"
    );
    let argv = String::from_utf8_lossy(&read_proc_bytes(g.pid(), "cmdline")).replace('\0', " ");
    assert!(
        argv.contains("--net fd=[") && argv.contains(",num_queues=4"),
        "{argv}"
    );
    g.kill();
    g.wait_exit(Duration::from_secs(10));
    let (o, rep) = ns.cleanup(&env, "mvc");
    assert!(o.status.success() && rep["clean"] == true, "{}", text(&o));
    assert!(!ns.has_link("vmw-mvc0"));
}

/// Two installations (two sets of roots) whose VMs name the same macvtap
/// never delete each other's: each macvtap carries its instance's mark, and
/// cleanup and reap delete only one whose mark is their own record's.
#[test]
fn two_installations_never_delete_each_others_macvtap() {
    require_root();
    require_fault_injection();
    use std::os::unix::process::ExitStatusExt;
    let a = Env::new();
    let b = a.sibling();
    let (ns, _peer) = namespaces("mvs");
    for (env, u) in [(&a, 408), (&b, 409)] {
        let mut s = env.spec("mvs", uid(u));
        s["interfaces"] = macvtap("vmw-mvs0", "02:00:00:00:62:01", PARENT);
        env.write_spec("mvs", &s);
    }
    let killed = |env: &Env, step: &str| {
        let out = ns
            .cmd(env, LAUNCH, &["mvs"])
            .env("VMWARDEN_FAULT_AFTER", step)
            .output()
            .unwrap();
        assert_eq!(out.status.signal(), Some(9), "{step}: {}", text(&out));
    };
    // B's instance recorded the macvtap and died before making it; A's
    // made it and died.
    killed(&b, "intent-written");
    assert!(!ns.has_link("vmw-mvs0"));
    killed(&a, "taps");
    let index = sys_net(&ns, "vmw-mvs0", "ifindex");
    let (o, _) = ns.cleanup(&b, "mvs");
    assert_eq!(
        sys_net(&ns, "vmw-mvs0", "ifindex"),
        index,
        "B's cleanup deleted A's macvtap: {}",
        text(&o)
    );
    // B's reap keeps the link, naming why (it exits 1: B's runtime dir's
    // cleanup sees a link of its tap's name survive, which is A's).
    let r = ns.vmwarden(&b, &["reap", "--apply", "--json"]);
    assert!(
        String::from_utf8_lossy(&r.stdout)
            .contains("a macvtap that no intent record of these roots marked as its own"),
        "{}",
        text(&r)
    );
    assert_eq!(
        sys_net(&ns, "vmw-mvs0", "ifindex"),
        index,
        "B's reap deleted A's macvtap: {}",
        text(&r)
    );
    let (o, rep) = ns.cleanup(&a, "mvs");
    assert!(o.status.success() && rep["clean"] == true, "{}", text(&o));
    assert!(!ns.has_link("vmw-mvs0"), "A's cleanup left its macvtap");
}

/// A local user cannot keep a VM's macvtap from starting by holding the
/// `/dev/tapN` nodes of the ifindexes the launcher's namespace hands out
/// next. devtmpfs has one `/dev/tapN` for all namespaces, and any user
/// may make a user and network namespace with macvtaps in it at ifindexes
/// of its choosing: the kernel then makes no node for the VM's macvtap,
/// and the only `/dev/tapN` is that user's. The launcher chooses its
/// macvtap's ifindex at random, out of that user's reach, with no node.
#[test]
fn a_local_users_macvtap_nodes_do_not_stop_a_vms_macvtap() {
    require_root();
    let env = Env::new();
    let (ns, _peer) = namespaces("mvq");
    // The namespace's last ifindex: a veth pair made and deleted (the
    // kernel hands out the ones after it next).
    ns.ip(&[
        "link", "add", "mvqx", "type", "veth", "peer", "name", "mvqy",
    ]);
    let last: u32 = sys_net(&ns, "mvqy", "ifindex").parse().unwrap();
    ns.ip(&["link", "del", "mvqx"]);
    let attacker = uid(409).to_string();
    let hold = format!(
        "ip link add va type veth peer name vb && \
         for i in $(seq {} {}); do ip link add link va name m$i index $i type macvtap mode bridge || exit 1; done && \
         echo HELD && exec sleep 600",
        last + 1,
        last + 32
    );
    let mut c = std::process::Command::new("setpriv");
    c.args(["--reuid", &attacker, "--regid", &attacker, "--clear-groups"])
        .args(["unshare", "-Urn", "sh", "-c", &hold]);
    let mut squat = spawn_logged(c, env.path("mvq-squat.log"));
    // Fails here if this host allows no unprivileged user namespace.
    squat.wait_for("HELD", Duration::from_secs(30));
    let next = format!("/dev/tap{}", last + 1);
    assert!(std::path::Path::new(&next).exists(), "{next}");

    let mut s = env.spec("mvq", uid(408));
    s["interfaces"] = macvtap("vmw-mvq0", "02:00:00:00:5e:01", PARENT);
    env.write_spec("mvq", &s);
    let mut c = ns.cmd(&env, LAUNCH, &["mvq"]);
    c.args(["--probe", "--", "sleep", "600"]);
    let mut g = spawn_logged(c, env.path("mvq.log"));
    wait_until(
        "the probe holding the macvtap, or the launch's error",
        Duration::from_secs(30),
        || macvtap_fds_of(g.pid()).len() == 1 || g.log_text().contains("error at step"),
    );
    let log = g.log_text();
    assert!(!log.contains("error at step"), "{log}");
    assert_eq!(macvtap_fds_of(g.pid()), [char_dev_of(&ns, "vmw-mvq0")]);
    g.kill();
    squat.kill();
    let (o, rep) = ns.cleanup(&env, "mvq");
    assert!(o.status.success() && rep["clean"] == true, "{}", text(&o));
    assert!(!ns.has_link("vmw-mvq0"));
}
