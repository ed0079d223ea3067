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
use vmwarden::hypervisor::api;

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

/// A local user's attack on a VM's tap by its name, from the namespace
/// `ns`: `/dev/net/tun` opened first as root (on NixOS the node is 0666,
/// here 0600), then the uid and gid dropped to `attacker` with no
/// supplementary group (and so no capability), then `TUNSETIFF` on the
/// tap's name as one more queue (plain, and with `IFF_ATTACH_QUEUE`), and
/// on each fd `TUNSETPERSIST` and `TUNSETOWNER`, which would keep the tap
/// past the VM and make it the attacker's. Prints `label=ok` or
/// `label=errnoN` for each.
const TAP_ATTACK: &str = r#"
import fcntl, os, struct, sys
name, uid = sys.argv[1], int(sys.argv[2])
fds = [os.open('/dev/net/tun', os.O_RDWR) for _ in range(2)]
os.setgroups([])
os.setresgid(uid, uid, uid)
os.setresuid(uid, uid, uid)
TUNSETIFF, TUNSETPERSIST, TUNSETOWNER = 0x400454ca, 0x400454cb, 0x400454cc
base = 0x0002 | 0x1000 | 0x4000 | 0x0100  # TAP, NO_PI, VNET_HDR, MULTI_QUEUE
out = []
def attempt(label, req, arg, fd):
    try:
        fcntl.ioctl(fd, req, arg)
        out.append(label + '=ok')
    except OSError as e:
        out.append(label + '=errno%d' % e.errno)
for fd, label, flags in [(fds[0], 'attach', base), (fds[1], 'attach-queue', base | 0x0200)]:
    attempt(label, TUNSETIFF, struct.pack('16sH22x', name.encode(), flags), fd)
    attempt(label + '-persist', TUNSETPERSIST, 1, fd)
    attempt(label + '-owner', TUNSETOWNER, uid, fd)
print(' '.join(out))
"#;

/// Run [`TAP_ATTACK`] on `tap` in `ns` as `attacker`.
fn attack_tap(ns: &Netns, tap: &str, attacker: u32) -> String {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &ns.name, "python3", "-c", TAP_ATTACK, tap])
        .arg(attacker.to_string())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// `/sys/class/net/TAP/FILE` in `ns`.
fn tap_sys(ns: &Netns, tap: &str, file: &str) -> String {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &ns.name, "cat"])
        .arg(format!("/sys/class/net/{tap}/{file}"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Every attack on each of `taps` (name, queues) is refused while
/// `holder` holds all their queues; the taps stay `owner`'s (owner and
/// group), not persistent, with their queues and nobody else's.
fn taps_refuse_other_users(ns: &Netns, holder: u32, owner: u32, taps: &[(&str, usize)]) {
    taps_refuse(ns, holder, owner, uid(349), taps);
}

/// [`taps_refuse_other_users`] with `attacker` as the attacker's uid.
fn taps_refuse(ns: &Netns, holder: u32, owner: u32, attacker: u32, taps: &[(&str, usize)]) {
    let refused = "attach=errno1 attach-persist=errno77 attach-owner=errno77 \
                   attach-queue=errno1 attach-queue-persist=errno77 attach-queue-owner=errno77";
    let mut want: Vec<String> = Vec::new();
    for (tap, queues) in taps {
        want.extend((0..*queues).map(|_| tap.to_string()));
    }
    want.sort();
    assert_eq!(tun_fds_of(holder), want);
    for (tap, _) in taps {
        // EPERM for the attach (the tap has an owner and a group that are
        // not the attacker's: root's), EBADFD after it: an fd attached to no tap
        // can neither persist nor own one.
        let got = attack_tap(ns, tap, attacker);
        assert_eq!(got, refused, "{tap}: a local user reached the VM's tap");
        assert_eq!(tap_sys(ns, tap, "owner"), owner.to_string(), "{tap}");
        assert_eq!(tap_sys(ns, tap, "group"), owner.to_string(), "{tap}");
        let flags = u32::from_str_radix(tap_sys(ns, tap, "tun_flags").trim_start_matches("0x"), 16)
            .unwrap();
        assert_eq!(flags & 0x0800, 0, "{tap} was made persistent");
    }
    // The hypervisor still holds every queue, and no one else got one.
    assert_eq!(tun_fds_of(holder), want);
}

/// A tap is its VM's alone, even against a process of its principal's uid
/// outside the sandbox (one the seccomp filter does not hold, which the
/// filter's refusal of `TUNSETPERSIST`, `TUNSETOWNER` and `SIOCSIFHWADDR`
/// on a tap assumes never has a queue): a tap owned by the principal would
/// let it attach one more queue by name, then make the tap persistent,
/// hand it away or set its MAC. Root owns the taps whose fds it hands on
/// (the hypervisor never attaches by name: its `TUNSETIFF` is refused),
/// and the probe in the VM's sandbox holds the queues as the hypervisor
/// would.
#[test]
fn a_tap_is_its_vms_alone_even_from_its_principals_uid_unsandboxed() {
    require_root();
    let env = Env::new();
    let ns = Netns::new("mqp");
    ns.bridge("br0");
    let u = uid(344);
    let mut spec = env.spec("mqp", u);
    spec["vcpus"] = json!(2);
    spec["interfaces"] = json!([{ "tap": "vmw-mqp2", "bridge": "br0", "queues": 2 }]);
    env.write_spec("mqp", &spec);
    let mut c = ns.cmd(&env, LAUNCH, &["mqp"]);
    c.args(["--probe", "--", "sleep", "600"]);
    let mut g = spawn_logged(c, env.path("mqp.log"));
    wait_until(
        "the probe, the principal, holding the taps",
        Duration::from_secs(30),
        || {
            tun_fds_of(g.pid()).len() == 2
                && proc_status(g.pid(), "Uid") == format!("{0}\t{0}\t{0}\t{0}", u)
        },
    );
    taps_refuse(&ns, g.pid(), 0, u, &[("vmw-mqp2", 2)]);
    g.kill();
    wait_until(
        "the tap gone with the probe",
        Duration::from_secs(10),
        || !ns.has_link("vmw-mqp2"),
    );
    let (o, rep) = ns.cleanup(&env, "mqp");
    assert!(o.status.success() && rep["clean"] == true, "{}", text(&o));
}

/// A tap is its VM's alone, whatever its queue count: the real QEMU's
/// taps of two and four queues, with the guest up, refuse a local user's
/// attach of one more queue by name (and so its reading and injecting
/// frames, and its making the tap persistent and its own); they go with
/// QEMU, and cleanup and verify-clean find nothing.
#[test]
fn a_tap_is_its_vms_alone_whatever_its_queue_count_qemu() {
    require_root();
    let env = Env::new();
    let ns = Netns::new("mqo");
    ns.bridge("br0");
    let u = uid(341);
    let mut spec = env.spec("mqo", u);
    spec["vcpus"] = json!(2);
    spec["interfaces"] = json!([
        { "tap": "vmw-mqo2", "bridge": "br0", "queues": 2 },
        { "tap": "vmw-mqo4", "bridge": "br0", "queues": 4 }
    ]);
    env.write_spec("mqo", &spec);
    let mut g = ns.start(&env, "mqo");
    g.wait_for("VMWARDEN-GUEST-READY", BOOT);
    taps_refuse_other_users(&ns, g.pid(), 0, &[("vmw-mqo2", 2), ("vmw-mqo4", 4)]);
    g.kill();
    wait_until("the taps gone with QEMU", Duration::from_secs(10), || {
        !ns.has_link("vmw-mqo2") && !ns.has_link("vmw-mqo4")
    });
    let (o, rep) = ns.cleanup(&env, "mqo");
    assert!(o.status.success() && rep["clean"] == true, "{}", text(&o));
    let v = ns.vmwarden(&env, &["verify-clean", "mqo"]);
    assert!(v.status.success(), "{}", text(&v));
}

/// The same with the real cloud-hypervisor (which this host's KVM cannot
/// boot a guest under): it runs in the VM's full sandbox (`--probe`), idle
/// on its API socket, holding the taps' queues as it would a guest's.
#[test]
fn a_tap_is_its_vms_alone_whatever_its_queue_count_cloud_hypervisor() {
    require_root();
    let env = Env::new();
    let Some(bin) = real_binary(&env, "VMWARDEN_TEST_CLOUD_HYPERVISOR", "cloud-hypervisor") else {
        return;
    };
    let ns = Netns::new("mqc");
    ns.bridge("br0");
    let u = uid(342);
    let mut spec = env.spec("mqc", u);
    spec["hypervisor"] = json!({ "kind": "cloud-hypervisor", "binary": bin, "accel": "kvm" });
    spec["vcpus"] = json!(2);
    spec["interfaces"] = json!([
        { "tap": "vmw-mqc2", "bridge": "br0", "queues": 2 },
        { "tap": "vmw-mqc4", "bridge": "br0", "queues": 4 }
    ]);
    env.write_spec("mqc", &spec);
    let _kvm = KvmAcl::grant(u);
    let sock = env.run.join("mqc/control/api.sock");
    let mut c = ns.cmd(&env, LAUNCH, &["mqc"]);
    c.arg("--probe")
        .arg("--")
        .arg(&bin)
        .arg("--api-socket")
        .arg(format!("path={}", sock.display()));
    let mut g = spawn_logged(c, env.path("mqc.log"));
    wait_until("cloud-hypervisor's API", Duration::from_secs(30), || {
        api::answers(&sock)
    });
    assert_eq!(
        proc_status(g.pid(), "Uid"),
        format!("{0}\t{0}\t{0}\t{0}", u)
    );
    taps_refuse_other_users(&ns, g.pid(), 0, &[("vmw-mqc2", 2), ("vmw-mqc4", 4)]);
    g.child.kill().unwrap();
    g.wait_exit(Duration::from_secs(10)).unwrap();
    wait_until(
        "the taps gone with cloud-hypervisor",
        Duration::from_secs(10),
        || !ns.has_link("vmw-mqc2") && !ns.has_link("vmw-mqc4"),
    );
    let (o, rep) = ns.cleanup(&env, "mqc");
    assert!(o.status.success() && rep["clean"] == true, "{}", text(&o));
    let v = ns.vmwarden(&env, &["verify-clean", "mqc"]);
    assert!(v.status.success(), "{}", text(&v));
}

/// A local user that spins on `TUNSETIFF` of a tap's name while the
/// launcher makes it (the name is in the VM's spec), in C so that it
/// spends its time in the kernel, two processes of it: `/dev/net/tun`
/// opened as root (on NixOS the node is 0666), then the ids dropped to
/// the attacker's with no supplementary group. Each tries `TUNSETIFF` as
/// one more queue of a multi-queue tap until it succeeds, or the tap has
/// an owner (the window is closed), or `limit` seconds pass. On success it
/// detaches its queue at once (`TUNSETQUEUE`, so that the tap shows no
/// more queues than the VM's), waits for the owner, then makes the tap
/// persistent, re-attaches its queue and makes the tap its own, prints
/// `WON` with the kernel's answers (0: done) and holds its queue until
/// killed; else it prints `LOST`. Arguments: tap name, attacker uid,
/// limit in seconds.
const TAP_RACE_C: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <grp.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <errno.h>
static int owned(const char *name) {
  char p[128], b[32] = {0};
  snprintf(p, sizeof p, "/sys/class/net/%s/owner", name);
  int f = open(p, O_RDONLY);
  if (f < 0) return 0;
  int n = read(f, b, sizeof b - 1);
  close(f);
  return n > 0 && strncmp(b, "-1", 2) != 0;
}
int main(int argc, char **argv) {
  const char *name = argv[1];
  uid_t uid = atoi(argv[2]);
  int limit = atoi(argv[3]);
  int fd = open("/dev/net/tun", O_RDWR);
  if (fd < 0 || setgroups(0, NULL) || setresgid(uid, uid, uid) || setresuid(uid, uid, uid)) { perror("setup"); return 1; }
  struct ifreq req; memset(&req, 0, sizeof req);
  strncpy(req.ifr_name, name, IFNAMSIZ - 1);
  req.ifr_flags = IFF_TAP | IFF_NO_PI | IFF_VNET_HDR | IFF_MULTI_QUEUE;
  printf("READY\n"); fflush(stdout);
  /* Two racers, one a core; the second dies with the first. */
  pid_t twin = fork();
  if (twin == 0) prctl(PR_SET_PDEATHSIG, SIGKILL);
  time_t end = time(NULL) + limit;
  long n = 0;
  int done = 0;
  while (!done && time(NULL) < end) {
    done = owned(name);
    for (int i = 0; i < 1000; i++) {
      n++;
      struct ifreq r = req;
      if (ioctl(fd, TUNSETIFF, &r) == 0) {
        struct ifreq q; memset(&q, 0, sizeof q); q.ifr_flags = IFF_DETACH_QUEUE;
        int d = ioctl(fd, TUNSETQUEUE, &q);
        while (!owned(name)) usleep(1000);
        int p = ioctl(fd, TUNSETPERSIST, 1);
        q.ifr_flags = IFF_ATTACH_QUEUE;
        int a = ioctl(fd, TUNSETQUEUE, &q);
        int o = ioctl(fd, TUNSETOWNER, uid);
        printf("WON after %ld attempts: detach=%d, then with the tap owned: persist=%d reattach=%d owner=%d\n", n, d, p, a, o);
        fflush(stdout);
        pause();
      }
    }
  }
  printf("LOST after %ld attempts\n", n);
  fflush(stdout);
  if (twin > 0) waitpid(twin, NULL, 0);
  return 0;
}
"#;

/// A tap is its VM's alone from the moment it is made: a local user that
/// spins on `TUNSETIFF` of the tap's name (the spec names it) while the
/// launcher makes a four-queue tap never gets a queue of it, in any of
/// several launches. Owner and group set after the tap and its queues
/// exist in the host's namespace would leave a window in which the tap has
/// neither, and the kernel then lets anyone attach one more queue; an
/// attached (or detached) queue keeps every tun ioctl after the owner is
/// set (`TUNSETPERSIST`, `TUNSETOWNER`, a re-attach by `TUNSETQUEUE`,
/// which checks no owner). The launcher makes and owns the tap in a
/// network namespace of its own and moves it out only then
/// (`host::net::apart`).
#[test]
fn a_tap_is_its_vms_alone_from_the_moment_it_is_made() {
    require_root();
    let env = Env::new();
    let ns = Netns::new("mqr");
    ns.bridge("br0");
    let u = uid(343);
    let attacker = uid(349);
    let mut spec = env.spec("mqr", u);
    spec["vcpus"] = json!(2);
    spec["interfaces"] = json!([{ "tap": "vmw-mqr4", "bridge": "br0", "queues": 4 }]);
    env.write_spec("mqr", &spec);
    let src = env.path("race.c");
    let racer_bin = env.path("race");
    std::fs::write(&src, TAP_RACE_C).unwrap();
    let cc = std::process::Command::new("cc")
        .arg("-O2")
        .arg("-o")
        .arg(&racer_bin)
        .arg(&src)
        .output()
        .unwrap();
    assert!(cc.status.success(), "cc: {}", text(&cc));
    for round in 0..40 {
        let mut race = std::process::Command::new("ip");
        race.args(["netns", "exec", &ns.name])
            .arg(&racer_bin)
            .arg("vmw-mqr4")
            .arg(attacker.to_string())
            .arg("15");
        let mut racer = spawn_logged(race, env.path(&format!("mqr-race{round}.log")));
        racer.wait_for("READY", Duration::from_secs(10));
        let mut c = ns.cmd(&env, LAUNCH, &["mqr"]);
        c.args(["--probe", "--", "sleep", "600"]);
        let mut g = spawn_logged(c, env.path(&format!("mqr{round}.log")));
        wait_until("the launch's tap", Duration::from_secs(30), || {
            tun_fds_of(g.pid()).len() == 4
        });
        wait_until("the racer's verdict", Duration::from_secs(30), || {
            racer
                .log_text()
                .lines()
                .filter(|l| l.starts_with("WON") || l.starts_with("LOST"))
                .count()
                > 1
        });
        let log = racer.log_text();
        let line = log.lines().find(|l| l.starts_with("WON")).unwrap_or("LOST");
        g.kill();
        racer.kill();
        assert!(
            line.starts_with("LOST"),
            "round {round}: a local user attached a queue to the VM's tap while it was made: {line}"
        );
        wait_until("the tap gone", Duration::from_secs(10), || {
            !ns.has_link("vmw-mqr4")
        });
        let (o, rep) = ns.cleanup(&env, "mqr");
        assert!(o.status.success() && rep["clean"] == true, "{}", text(&o));
    }
}

/// A launch killed inside the making of a multi-queue tap, at each of its
/// kill points (the tap made and owned in the launcher's own network
/// namespace; moved into the host's, the launcher not yet back) and right
/// after the `taps` step, leaves no tap: the kernel deletes it with its
/// fds wherever it is, and the launcher's own namespace goes with them.
/// Cleanup and verify-clean find nothing.
#[test]
fn kill_inside_the_making_of_a_multi_queue_tap_leaves_no_tap() {
    require_root();
    require_fault_injection();
    let env = Env::new();
    let ns = Netns::new("mqk");
    ns.bridge("br0");
    let mut spec = env.spec("mqk", uid(345));
    spec["vcpus"] = json!(2);
    spec["interfaces"] = json!([{ "tap": "vmw-mqk4", "bridge": "br0", "queues": 4 }]);
    env.write_spec("mqk", &spec);
    for at in ["taps:vmw-mqk4:apart", "taps:vmw-mqk4:moved", "taps"] {
        let out = ns
            .cmd(&env, LAUNCH, &["mqk"])
            .args(["--probe", "--", "/bin/true"])
            .env("VMWARDEN_FAULT_AFTER", at)
            .output()
            .unwrap();
        use std::os::unix::process::ExitStatusExt;
        // Killed there: the kill point exists and was reached.
        assert_eq!(out.status.signal(), Some(9), "{at}: {}", text(&out));
        assert!(!ns.has_link("vmw-mqk4"), "the tap survived a kill at {at}");
        let (o, rep) = ns.cleanup(&env, "mqk");
        assert!(
            o.status.success() && rep["clean"] == true,
            "after {at}: {}",
            text(&o)
        );
        let v = ns.vmwarden(&env, &["verify-clean", "mqk"]);
        assert!(v.status.success(), "after {at}: {}", text(&v));
    }
}
