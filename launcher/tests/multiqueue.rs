//! Multi-queue taps and vhost-net for real, in a network namespace the
//! test creates: one tap fd per queue, all opened by root and inherited by
//! QEMU (TCG), the guest's NIC with as many queue pairs and traffic over
//! them; `/dev/vhost-net` opened by root before anything is made, or the
//! launch refused with nothing made where the kernel has no vhost-net.
//! Needs root and iproute2 (`ip netns`).

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;

const BOOT: Duration = Duration::from_secs(180);

/// How many fds of `pid` are open on `path`.
fn fds_on(pid: u32, path: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter(|e| std::fs::read_link(e.path()).is_ok_and(|t| t == std::path::Path::new(path)))
        .count()
}

#[test]
fn a_two_queue_tap_is_two_fds_from_root_and_the_guest_gets_two_queue_pairs() {
    require_root();
    let env = Env::new();
    let ns = Netns::new("mq");
    ns.bridge("br0");
    ns.ip(&["addr", "add", "10.204.0.1/24", "dev", "br0"]);
    let mac = "02:00:00:00:4d:01";
    let script = "ip addr add 10.204.0.2/24 dev eth0 && ip link set eth0 up && \
                  echo T-QUEUES $(ls /sys/class/net/eth0/queues | tr '\\n' ' ')";
    let mut spec = env.shares_spec("mq", uid(330), "hold", script);
    spec["vcpus"] = json!(2);
    spec["interfaces"] = json!([{ "tap": "vmw-mq0", "bridge": "br0", "mac": mac, "queues": 2 }]);
    env.write_spec("mq", &spec);

    let mut g = ns.start(&env, "mq");
    g.wait_for("VMWARDEN-GUEST-READY", BOOT);
    let log = g.log_text();
    // The guest's virtio NIC runs two queue pairs (one per vCPU).
    assert!(
        log.lines()
            .any(|l| l.trim_end() == "T-QUEUES rx-0 rx-1 tx-0 tx-1"),
        "{log}"
    );
    // QEMU holds one fd per queue, all on the VM's tap, handed over by
    // root: the principal has no way to open a tap by name.
    assert_eq!(tun_fds_of(g.pid()), ["vmw-mq0", "vmw-mq0"]);
    let argv = String::from_utf8_lossy(&read_proc_bytes(g.pid(), "cmdline")).replace('\0', " ");
    assert!(
        argv.contains(",vhost=off")
            && argv.contains("tap,id=net0,fds=")
            && argv.contains(",mq=on,vectors=6"),
        "{argv}"
    );
    let l = ns.ip(&["-o", "-d", "link", "show", "dev", "vmw-mq0"]);
    assert!(
        l.contains("multi_queue") && l.contains("persist off") && l.contains("master br0"),
        "{l}"
    );
    // Traffic crosses it.
    let ping = std::process::Command::new("ip")
        .args([
            "netns", "exec", &ns.name, "busybox", "ping", "-c", "3", "-W", "10",
        ])
        .arg("10.204.0.2")
        .output()
        .unwrap();
    assert!(ping.status.success(), "{}", text(&ping));

    // The tap goes with the hypervisor's fds; cleanup agrees.
    g.kill();
    wait_until(
        "vmw-mq0 gone after SIGKILL",
        Duration::from_secs(10),
        || !ns.has_link("vmw-mq0"),
    );
    let (o, rep) = ns.cleanup(&env, "mq");
    assert!(o.status.success() && rep["clean"] == true, "{}", text(&o));
}

#[test]
fn vhost_net_is_opened_by_root_per_queue_or_the_launch_is_refused_with_nothing_made() {
    require_root();
    let env = Env::new();
    let ns = Netns::new("vh");
    ns.bridge("br0");
    let mut spec = env.spec("vh", uid(331));
    spec["vcpus"] = json!(2);
    spec["interfaces"] = json!([{ "tap": "vmw-vh0", "bridge": "br0", "vhost": true, "queues": 2 }]);
    env.write_spec("vh", &spec);
    let mut probe = ns
        .cmd(&env, LAUNCH, &["vh"])
        .args(["--probe", "--", "/bin/sleep", "60"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    if !std::path::Path::new("/dev/vhost-net").exists() {
        // This kernel has no vhost-net: refused at principal-resolved,
        // naming the field, before the runtime dir, the lease or the tap.
        let out = probe.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(78), "{}", text(&out));
        let err = stderr(&out);
        assert!(
            err.contains("error at step \"principal-resolved\"")
                && err.contains("/dev/vhost-net: cannot open it for `interfaces[0].vhost` = true")
                && err.contains("modprobe vhost_net")
                && err.contains("nothing was created"),
            "{err}"
        );
        assert!(!env.run.join("vh").exists() && !ns.has_link("vmw-vh0"));
        return;
    }
    // With vhost-net: the probe (in the hypervisor's place) holds one
    // /dev/vhost-net fd per queue and one tap fd per queue, all root's
    // opens, while the principal itself cannot open the device.
    wait_until("the probe's tap", Duration::from_secs(20), || {
        ns.has_link("vmw-vh0") && fds_on(probe.id(), "/dev/vhost-net") == 2
    });
    assert_eq!(tun_fds_of(probe.id()), ["vmw-vh0", "vmw-vh0"]);
    let own = std::process::Command::new("setpriv")
        .args([
            "--reuid",
            &uid(331).to_string(),
            "--regid",
            &uid(331).to_string(),
        ])
        .args(["--clear-groups", "sh", "-c", "exec 3<>/dev/vhost-net"])
        .output()
        .unwrap();
    assert!(
        !own.status.success(),
        "the principal opened /dev/vhost-net itself"
    );
    let _ = probe.kill();
    let _ = probe.wait();
    let (o, rep) = ns.cleanup(&env, "vh");
    assert!(o.status.success() && rep["clean"] == true, "{}", text(&o));
}
