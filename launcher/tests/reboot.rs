//! A guest that reboots or powers off by itself, with a real TCG QEMU: a
//! reboot resets the machine in place (the same QEMU process, sandbox,
//! lease, instance, helper daemons and credentials; a new boot of the
//! guest), a poweroff ends QEMU with status 0 and the teardown is clean.
//! The guest is tests/assets/build-guest-shares.sh's; it counts its boots
//! on a writable virtiofs share and takes its orders ("reboot",
//! "poweroff") over the user vsock backend, so both helper daemons
//! (virtiofsd, vhost-device-vsock) must serve the second boot as they
//! served the first. Needs root.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use vmwarden::host::procs::processes_of_uid;
use vmwarden::hypervisor::api;

const BOOT: Duration = Duration::from_secs(180);
/// The vsock port the guest takes its orders on.
const ORDERS: u32 = 1300;

/// The guest's script: count this boot on the share, print it with the
/// kernel's boot id, then obey one order at a time from vsock port
/// `ORDERS` (`reboot -f` and `poweroff -f` are what any init ends with).
fn script() -> String {
    format!(
        "\
mkdir -p /vrw
mount -t virtiofs vrw /vrw || echo T-MOUNT-VRW-FAILED
n=$(( $(cat /vrw/boots 2>/dev/null || echo 0) + 1 ))
echo $n >/vrw/boots && sync
echo \"T-BOOT n=$n id=$(cat /proc/sys/kernel/random/boot_id)\"
orders() {{
  while :; do
    o=$(/bin/vsock-echo {ORDERS} 2>/dev/null | sed -n 's/^VSOCK-ECHO got=//p')
    case \"$o\" in
      reboot) echo T-ORDER-REBOOT; umount /vrw; reboot -f ;;
      poweroff) echo T-ORDER-POWEROFF; umount /vrw; poweroff -f ;;
    esac
  done
}}
orders &
"
    )
}

/// Tell the guest `order` over the hybrid vsock socket (retried until its
/// listener is up); returns once the guest has acknowledged it.
fn order(sock: &Path, order: &str) {
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(mut c) = UnixStream::connect(sock) {
            c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut r = BufReader::new(c.try_clone().unwrap());
            let mut line = String::new();
            if c.write_all(format!("CONNECT {ORDERS}\n").as_bytes())
                .is_ok()
                && r.read_line(&mut line).is_ok()
                && line.starts_with("OK ")
            {
                c.write_all(format!("{order}\n").as_bytes()).unwrap();
                line.clear();
                r.read_line(&mut line).unwrap();
                assert_eq!(line, format!("guest-got:{order}\n"));
                return;
            }
        }
        assert!(
            Instant::now() < end,
            "the guest took no order on vsock port {ORDERS} within 60 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The `T-BOOT n=N id=ID` lines of the console, in order.
fn boots(log: &str) -> Vec<(u32, String)> {
    log.lines()
        .filter_map(|l| l.strip_prefix("T-BOOT n="))
        .filter_map(|l| {
            let (n, id) = l.split_once(" id=")?;
            Some((n.parse().ok()?, id.trim().to_string()))
        })
        .collect()
}

/// Wait until the console has `n` boot lines, each boot's ready marker
/// after its own.
fn wait_boots(g: &mut Guest, n: usize) -> Vec<(u32, String)> {
    let end = Instant::now() + BOOT;
    loop {
        let log = g.log_text();
        let b = boots(&log);
        if b.len() >= n && log.matches("VMWARDEN-GUEST-READY").count() >= n {
            return b;
        }
        if let Ok(Some(st)) = g.child.try_wait() {
            panic!("QEMU exited ({st}) before boot {n}; log:\n{}", g.log_text());
        }
        assert!(
            Instant::now() < end,
            "no boot {n} within {BOOT:?}; log:\n{}",
            g.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn status_json(env: &Env) -> serde_json::Value {
    let o = env.vmwarden(&["status", "web", "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    v.as_array().and_then(|a| a.first()).cloned().unwrap_or(v)
}

#[test]
fn a_guest_reboot_resets_qemu_in_place_and_a_guest_poweroff_ends_it_cleanly() {
    let env = Env::new();
    let u = uid(170);
    let rw = env.path("rw-src");
    std::fs::create_dir(&rw).unwrap();
    std::os::unix::fs::chown(&rw, Some(u), Some(u)).unwrap();
    std::fs::set_permissions(&rw, PermissionsExt::from_mode(0o700)).unwrap();
    let secret = b"the same after a reboot".to_vec();
    let cred = env.secret("token.src", &secret);

    let mut spec = env.shares_spec("web", u, "hold", &script());
    spec["shares"] = json!([{ "tag": "vrw", "source": rw, "proto": "virtiofs" }]);
    spec["virtiofsd"] = json!({ "binary": daemon("virtiofsd") });
    spec["vsock"] = json!({ "cid": 12, "backend": "user", "binary": daemon("vhost-device-vsock") });
    spec["credentials"] = json!([{ "name": "token", "source": { "path": cred } }]);
    env.write_spec("web", &spec);
    let sock = env.run.join("web/control/vsock.sock");
    let cred_line = format!("VMWARDEN-CRED name=token sha256={}", sha256_hex(&secret));

    let mut g = env.start("web");
    let first = wait_boots(&mut g, 1);
    assert_eq!(first[0].0, 1, "{first:?}");
    let qemu = g.pid();
    let helpers = others_of(u, qemu);
    let mut names: Vec<String> = helpers
        .iter()
        .map(|p| {
            std::fs::read_to_string(format!("/proc/{p}/comm"))
                .unwrap_or_default()
                .trim()
                .to_string()
        })
        .collect();
    names.sort();
    // The writable share is the guest's own: its virtiofsd runs in the VM's
    // user namespace beside the broker that makes its setgid directories.
    assert_eq!(
        names,
        ["vhost-device-vs", "virtiofsd", "vmwarden-broker"],
        "the helpers of a writable virtiofs share and a user vsock: {helpers:?}"
    );
    let before = status_json(&env);
    assert_eq!(before["state"], "running", "{before}");
    let record = std::fs::read(env.run.join("web/instance.json")).unwrap();

    // The guest reboots itself: QEMU resets the machine and stays.
    order(&sock, "reboot");
    let both = wait_boots(&mut g, 2);
    assert_eq!(both[1].0, 2, "the second boot counts the first: {both:?}");
    assert_ne!(
        both[0].1, both[1].1,
        "a new boot has a new boot id: {both:?}"
    );
    let log = g.log_text();
    assert!(log.contains("T-ORDER-REBOOT"), "{log}");
    assert_eq!(
        log.matches("VMWARDEN-GUEST-READY").count(),
        2,
        "two boots of one QEMU: {log}"
    );
    assert_eq!(
        log.matches(&cred_line).count(),
        2,
        "the credential reaches both boots: {log}"
    );
    assert!(!log.contains("T-MOUNT-VRW-FAILED"), "{log}");
    assert_eq!(g.child.try_wait().unwrap(), None, "QEMU exited on a reboot");
    assert_eq!(g.pid(), qemu);
    // The same helpers (the launcher, which started them, is long gone)
    // serve the second boot: the share counted it, the orders still come.
    assert_eq!(others_of(u, qemu), helpers, "the helper daemons changed");
    assert_eq!(std::fs::read_to_string(rw.join("boots")).unwrap(), "2\n");
    // vmwarden sees one instance throughout: the same record, running.
    let after = status_json(&env);
    assert_eq!(after["state"], "running", "{after}");
    assert_eq!(after["pid"], before["pid"], "{after}");
    assert_eq!(after["instance_id"], before["instance_id"], "{after}");
    assert_eq!(
        std::fs::read(env.run.join("web/instance.json")).unwrap(),
        record,
        "the intent record changed across an in-place reboot"
    );
    let ready = env.vmwarden(&["wait-ready", "web", "--timeout", "10"]);
    assert!(ready.status.success(), "{}", text(&ready));

    // The guest powers itself off: QEMU ends with status 0, its helpers
    // with it, and nothing is left.
    order(&sock, "poweroff");
    let st = g.wait_exit(Duration::from_secs(60)).unwrap_or_else(|| {
        panic!(
            "QEMU still runs after the guest's poweroff:\n{}",
            g.log_text()
        )
    });
    assert_eq!(st.code(), Some(0), "{st}: {}", g.log_text());
    assert!(g.log_text().contains("T-ORDER-POWEROFF"));
    let end = Instant::now() + Duration::from_secs(10);
    while !processes_of_uid(u).is_empty() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        processes_of_uid(u),
        Vec::<u32>::new(),
        "left after poweroff"
    );
    env.assert_clean("web");
}

/// A cgroup made for one test under the v2 hierarchy, named like a VM's
/// unit's (`PARENT/microvm@NAME.service`), removed again when dropped.
struct UnitCgroup {
    parent: PathBuf,
    unit: PathBuf,
}

impl UnitCgroup {
    fn new(name: &str) -> UnitCgroup {
        let root = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.join("cgroup.procs").exists() && p.join("cgroup.controllers").exists())
            .expect("a cgroup v2 hierarchy at /sys/fs/cgroup or /sys/fs/cgroup/unified");
        let parent = root.join(format!("vmwarden-test-{}.slice", std::process::id()));
        let unit = parent.join(format!("microvm@{name}.service"));
        std::fs::create_dir_all(&unit).unwrap();
        UnitCgroup { parent, unit }
    }

    /// `sh -c 'move into the cgroup; exec ARGV'`: the process runs in the
    /// unit's cgroup, as the unit's own commands do.
    fn command(&self, argv: &[&str]) -> std::process::Command {
        let mut c = std::process::Command::new("/bin/sh");
        c.arg("-c")
            .arg("echo $$ >\"$0/cgroup.procs\" && exec \"$@\"")
            .arg(&self.unit)
            .args(argv);
        c
    }
}

impl Drop for UnitCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.unit);
        let _ = std::fs::remove_dir(&self.parent);
    }
}

/// `vmwarden stop` by hand, beside the systemd unit that runs a
/// firecracker VM, sends nothing and says to use `systemctl stop`: the
/// guest would answer the stop's Ctrl-Alt-Del with a reboot, firecracker
/// would end with status 0, and the unit restarts a firecracker VM after
/// that. The same command from the unit itself (its `ExecStop=`, which
/// runs in the unit's cgroup) stops it. The real firecracker, unconfigured
/// (no guest boots on this host), under the launcher in a cgroup named
/// like the VM's unit's.
#[test]
fn vmwarden_stop_by_hand_refuses_a_firecracker_vm_its_unit_would_restart() {
    let env = Env::new();
    let Some(bin) = real_binary(&env, "VMWARDEN_TEST_FIRECRACKER", "firecracker") else {
        return;
    };
    let u = uid(171);
    let mut s = env.spec("fcu", u);
    s["hypervisor"] = json!({ "kind": "firecracker", "binary": bin, "accel": "kvm" });
    s["cmdline"] = json!("console=ttyS0");
    env.write_spec("fcu", &s);
    let _acl = KvmAcl::grant(u);
    let cg = UnitCgroup::new("fcu");
    let sock = env.run.join("fcu/control/api.sock");

    let bin_s = bin.display().to_string();
    let sock_s = sock.display().to_string();
    let launch = env.launch_cmd("fcu");
    let mut argv: Vec<String> = vec![launch.get_program().to_string_lossy().into_owned()];
    argv.extend(launch.get_args().map(|a| a.to_string_lossy().into_owned()));
    argv.extend(["--probe", "--", &bin_s, "--api-sock", &sock_s].map(String::from));
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let mut c = cg.command(&argv);
    c.env_remove("CREDENTIALS_DIRECTORY");
    let mut g = spawn_logged(c, env.path("fcu.log"));
    let r = env.vmwarden(&["wait-ready", "fcu", "--timeout", "30"]);
    assert!(r.status.success(), "{}\n{}", text(&r), g.log_text());
    let rec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(env.run.join("fcu/instance.json")).unwrap()).unwrap();
    assert_eq!(
        rec["cgroup"]["path"].as_str().map(Path::new),
        Some(cg.unit.as_path()),
        "the launcher recorded its unit's cgroup: {rec}"
    );

    // By hand: refused, nothing sent, the VM runs on.
    let stop = env.vmwarden(&["stop", "fcu", "--timeout", "5"]);
    let err = String::from_utf8_lossy(&stop.stderr).into_owned();
    assert_eq!(stop.status.code(), Some(1), "{}", text(&stop));
    assert!(
        err.contains("VM fcu runs under microvm@fcu.service")
            && err.contains("`systemctl stop microvm@fcu.service`")
            && err.contains("nothing was sent to the VM"),
        "{err}"
    );
    assert_eq!(g.child.try_wait().unwrap(), None, "firecracker was stopped");
    assert!(
        api::request(&sock, "GET", "/", None, Duration::from_secs(2)).is_ok_and(|r| r.ok()),
        "firecracker's API no longer answers"
    );

    // From the unit itself (its ExecStop=): stopped.
    let mut from_unit = {
        let v = env.vmwarden_cmd();
        let mut a: Vec<String> = vec![v.get_program().to_string_lossy().into_owned()];
        a.extend(v.get_args().map(|a| a.to_string_lossy().into_owned()));
        a.extend(["stop", "fcu", "--timeout", "5"].map(String::from));
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        cg.command(&a)
    };
    let stop = from_unit.output().unwrap();
    assert!(stop.status.success(), "{}", text(&stop));
    assert!(g.wait_exit(Duration::from_secs(10)).is_some());
    env.assert_clean("fcu");
}
