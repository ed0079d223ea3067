//! cloud-hypervisor and firecracker, the real binaries, on the host.
//!
//! The binaries come from `../shared/hypervisors/bin` beside the repository
//! (or VMWARDEN_TEST_CLOUD_HYPERVISOR / VMWARDEN_TEST_FIRECRACKER) and are
//! copied into the test's root-owned directory so that the launcher's trust
//! walk accepts them. With `CI=true` a missing binary fails the test;
//! elsewhere the test prints one `NOT RUN:` line.
//!
//! On the host, no guest: each binary runs under `vmwarden-launch --probe`
//! (the identical sandbox: namespaces, masks, credential tmpfs, privilege
//! drop, Landlock, seccomp) in its unconfigured state, answers on its API
//! socket in `control/`, shows its state in `vmwarden status`, is ended by
//! `vmwarden stop` (and, on a second run, by SIGKILL), and leaves nothing
//! behind. Booting a guest needs a KVM that can run one: the boot tests
//! here are `#[ignore]`d on the host (run them with `--ignored` where KVM
//! boots guests; the systemd suite boots both hypervisors through the unit).
//! Needs root.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use vmwarden::host::procs::processes_of_uid;
use vmwarden::hypervisor::api;

const BOOT: Duration = Duration::from_secs(120);

fn kernel() -> PathBuf {
    std::env::var_os("VMWARDEN_TEST_VMLINUX")
        .map(PathBuf::from)
        .unwrap_or_else(|| assets().kernel)
}

fn spec_for(env: &Env, name: &str, uid: u32, kind: &str, bin: &Path) -> serde_json::Value {
    let mut s = env.spec(name, uid);
    s["hypervisor"] = json!({ "kind": kind, "binary": bin, "accel": "kvm" });
    s["kernel"] = json!(kernel());
    s["cmdline"] = json!("console=ttyS0 quiet panic=-1 vmwarden.mode=hold");
    s
}

/// Start, see the guest and its state through the API, stop through the
/// API, clean up, verify clean.
fn run_one(env: &Env, ns: &Netns, name: &str, uid: u32, kind: &str, want_nic: Option<&str>) {
    let _acl = KvmAcl::grant(uid);
    let mut g = ns.start(env, name);
    g.wait_for("VMWARDEN-GUEST-READY", BOOT);
    if let Some(mac) = want_nic {
        g.wait_for(&format!("VMWARDEN-NIC name=eth0 mac={mac}"), BOOT);
    }
    let ready = ns.vmwarden(env, &["wait-ready", name, "--timeout", "30"]);
    assert!(ready.status.success(), "{}", text(&ready));
    let st = ns.vmwarden(env, &["status", name, "--json"]);
    let st_t = String::from_utf8_lossy(&st.stdout).into_owned();
    assert!(
        st_t.contains(&format!("\"hypervisor\": \"{kind}\"")) && st_t.contains("Running"),
        "{st_t}"
    );
    // The API socket is in control/, and no credential or secret path is
    // on the command line (none can be: the spec refuses credentials).
    let cmdline = String::from_utf8_lossy(&read_proc_bytes(g.pid(), "cmdline")).into_owned();
    assert!(
        cmdline.contains(
            &env.run
                .join(name)
                .join("control/api.sock")
                .display()
                .to_string()
        ),
        "{cmdline}"
    );
    assert_eq!(
        proc_status(g.pid(), "Uid"),
        format!("{0}\t{0}\t{0}\t{0}", uid)
    );
    let stop = ns.vmwarden(env, &["stop", name, "--timeout", "30"]);
    assert!(stop.status.success(), "{}", text(&stop));
    g.wait_exit(Duration::from_secs(30));
    let (o, rep) = ns.cleanup(env, name);
    assert!(o.status.success() && rep["clean"] == true, "{}", text(&o));
    let v = ns.vmwarden(env, &["verify-clean", name]);
    assert!(v.status.success(), "{}", text(&v));
}

#[test]
#[ignore = "boots a guest: needs a KVM that runs one (not this host's PVM); the systemd suite boots it through the unit"]
fn cloud_hypervisor_boots_networked_stops_through_its_api_and_cleans_up() {
    let env = Env::new();
    let Some(bin) = real_binary(&env, "VMWARDEN_TEST_CLOUD_HYPERVISOR", "cloud-hypervisor") else {
        return;
    };
    let ns = Netns::new("ch");
    ns.bridge("br0");
    let mut s = spec_for(&env, "chvm", uid(31), "cloud-hypervisor", &bin);
    s["interfaces"] = json!([{ "tap": "vmw-chvm0", "bridge": "br0", "mac": "02:00:00:00:31:01" }]);
    env.write_spec("chvm", &s);
    run_one(
        &env,
        &ns,
        "chvm",
        uid(31),
        "cloud-hypervisor",
        Some("02:00:00:00:31:01"),
    );
    assert!(!ns.has_link("vmw-chvm0"));
}

#[test]
#[ignore = "boots a guest: needs a KVM that runs one (not this host's PVM); the systemd suite boots it through the unit"]
fn firecracker_boots_from_its_private_config_stops_and_cleans_up() {
    let env = Env::new();
    let Some(bin) = real_binary(&env, "VMWARDEN_TEST_FIRECRACKER", "firecracker") else {
        return;
    };
    let ns = Netns::new("fc");
    let s = spec_for(&env, "fcvm", uid(32), "firecracker", &bin);
    env.write_spec("fcvm", &s);
    run_one(&env, &ns, "fcvm", uid(32), "firecracker", None);
}

#[test]
fn firecracker_config_is_the_principals_alone() {
    // Runs everywhere: a probe in the identical sandbox stands in for
    // firecracker, so the config file's owner and mode are checked for real.
    let env = Env::new();
    let mut s = env.spec("fccfg", uid(33));
    s["hypervisor"] = json!({ "kind": "firecracker", "binary": "/bin/true", "accel": "kvm" });
    env.write_spec("fccfg", &s);
    let cfg = env.run.join("fccfg/control/firecracker.json");
    let out = env.probe(
        "fccfg",
        &[
            "/bin/sh",
            "-c",
            &format!("stat -c '%u %a' {}; cat {}", cfg.display(), cfg.display()),
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    let o = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(o.starts_with(&format!("{} 600\n", uid(33))), "{o}");
    let v: serde_json::Value = serde_json::from_str(o.split_once('\n').unwrap().1).unwrap();
    assert_eq!(v["machine-config"]["vcpu_count"], 1);
    assert_eq!(v["network-interfaces"], json!([]));
    let intent: serde_json::Value =
        serde_json::from_slice(&std::fs::read(env.run.join("fccfg/instance.json")).unwrap())
            .unwrap();
    assert_eq!(intent["hypervisor"], "firecracker");
    let (o, rep) = env.cleanup("fccfg");
    assert!(o.status.success() && rep["clean"] == true, "{}", text(&o));
    assert!(!cfg.exists());
}

/// A stand-in for cloud-hypervisor's API, run as the VM's principal in its
/// sandbox: answers GET with a running state, logs every PUT, and exits
/// after `vm.power-button`, as a guest that powers off would.
const FAKE_CH_API: &str = r#"import http.server, json, os, socketserver, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"state": "Running"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_PUT(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(204)
        self.send_header("Content-Length", "0")
        self.end_headers()
        self.wfile.flush()
        print("PUT " + self.path, flush=True)
        if self.path.endswith("power-button"):
            os._exit(0)
    def log_message(self, *a):
        pass
class S(socketserver.UnixStreamServer):
    def get_request(self):
        c, _ = self.socket.accept()
        return c, ("vm", 0)
print("LISTENING", flush=True)
S(sys.argv[1], H).serve_forever()
"#;

#[test]
fn cloud_hypervisor_api_paths_wait_ready_status_and_graceful_stop() {
    // Runs everywhere: the API client, readiness, status and the power-button
    // stop against a server in the identical sandbox (the real binary is
    // covered by the test above when VMWARDEN_TEST_CLOUD_HYPERVISOR is set).
    let env = Env::new();
    let script = env.path("fake-ch-api.py");
    std::fs::write(&script, FAKE_CH_API).unwrap();
    let mut s = env.spec("chapi", uid(34));
    s["hypervisor"] = json!({ "kind": "cloud-hypervisor", "binary": "/bin/true", "accel": "kvm" });
    s["landlock"]["read"] = json!([script]);
    env.write_spec("chapi", &s);
    let sock = env.run.join("chapi/control/api.sock");
    let log = env.path("chapi.serial.log");
    let f = std::fs::File::create(&log).unwrap();
    let mut c = env.launch_cmd("chapi");
    c.args(["--probe", "--", "/usr/bin/python3"])
        .arg(&script)
        .arg(&sock);
    c.stdout(f.try_clone().unwrap()).stderr(f);
    let mut g = Guest {
        child: c.spawn().unwrap(),
        log,
    };
    g.wait_for("LISTENING", Duration::from_secs(30));

    let r = env.vmwarden(&["wait-ready", "chapi", "--timeout", "20"]);
    assert!(r.status.success(), "{}", text(&r));
    let st = env.vmwarden(&["status", "chapi", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
    assert_eq!(v[0]["state"], "running", "{v}");
    let stop = env.vmwarden(&["stop", "chapi", "--timeout", "20"]);
    assert!(stop.status.success(), "{}", text(&stop));
    assert!(
        String::from_utf8_lossy(&stop.stdout).contains("stopped by powerdown"),
        "{}",
        text(&stop)
    );
    assert!(g.wait_exit(Duration::from_secs(10)).is_some());
    assert!(
        g.log_text().contains("PUT /api/v1/vm.power-button"),
        "{}",
        g.log_text()
    );
    let (o, rep) = env.cleanup("chapi");
    assert!(o.status.success() && rep["clean"] == true, "{}", text(&o));
}

/// How a real hypervisor is driven on the host, where it cannot boot a
/// guest: its argv in the unconfigured state, and how to bring it to the
/// state `status` then shows.
struct Unconfigured {
    kind: &'static str,
    var: &'static str,
    /// The API request that answers as soon as the socket is served.
    ping: &'static str,
    /// The API `state` the test brings it to.
    state: &'static str,
}

const CH: Unconfigured = Unconfigured {
    kind: "cloud-hypervisor",
    var: "VMWARDEN_TEST_CLOUD_HYPERVISOR",
    ping: "/api/v1/vmm.ping",
    state: "Created",
};

const FC: Unconfigured = Unconfigured {
    kind: "firecracker",
    var: "VMWARDEN_TEST_FIRECRACKER",
    ping: "/",
    state: "Not started",
};

impl Unconfigured {
    /// The binary with no VM: cloud-hypervisor with only its API socket
    /// (and its own seccomp filter on), firecracker without a config file.
    fn argv(&self, bin: &Path, sock: &Path) -> Vec<String> {
        let b = bin.display().to_string();
        let s = sock.display().to_string();
        match self.kind {
            "cloud-hypervisor" => vec![
                b,
                "--api-socket".into(),
                format!("path={s}"),
                "--seccomp".into(),
                "true".into(),
            ],
            _ => vec![b, "--api-sock".into(), s],
        }
    }

    /// Launch it through the full sandbox and wait until its API answers;
    /// cloud-hypervisor then gets a VM created (not booted) through the API.
    fn start(&self, env: &Env, name: &str, bin: &Path, kernel: &Path) -> Guest {
        let sock = env.run.join(name).join("control/api.sock");
        let mut c = env.launch_cmd(name);
        c.arg("--probe").arg("--").args(self.argv(bin, &sock));
        let mut g = spawn_logged(c, env.path(&format!("{name}.{}.log", self.kind)));
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(r) = api::request(&sock, "GET", self.ping, None, Duration::from_secs(2)) {
                assert!(r.ok(), "GET {}: {r:?}", self.ping);
                break;
            }
            if let Ok(Some(st)) = g.child.try_wait() {
                panic!(
                    "{} exited ({st}) before its API answered:\n{}",
                    self.kind,
                    g.log_text()
                );
            }
            assert!(
                Instant::now() < end,
                "{} API never answered:\n{}",
                self.kind,
                g.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        if self.kind == "cloud-hypervisor" {
            let body = json!({
                "payload": { "kernel": kernel, "cmdline": "console=ttyS0" },
                "cpus": { "boot_vcpus": 1, "max_vcpus": 1 },
                "memory": { "size": 256u64 << 20 },
            })
            .to_string();
            api::expect_ok(
                &sock,
                "PUT",
                "/api/v1/vm.create",
                Some(&body),
                Duration::from_secs(10),
            )
            .unwrap_or_else(|e| panic!("vm.create: {e}\n{}", g.log_text()));
        }
        g
    }

    /// The process runs as the principal with nothing more.
    fn assert_confined(&self, g: &Guest, uid: u32) {
        let pid = g.pid();
        assert_eq!(proc_status(pid, "Uid"), format!("{0}\t{0}\t{0}\t{0}", uid));
        for k in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
            assert_eq!(proc_status(pid, k), "0000000000000000", "{k}");
        }
        assert_eq!(proc_status(pid, "NoNewPrivs"), "1");
        assert_eq!(proc_status(pid, "Seccomp"), "2");
        let own = std::fs::read_link(format!("/proc/{pid}/ns/mnt")).unwrap();
        let mine = std::fs::read_link("/proc/self/ns/mnt").unwrap();
        assert_ne!(own, mine, "{} shares the host's mount namespace", self.kind);
        let cmd = String::from_utf8_lossy(&read_proc_bytes(pid, "cmdline")).into_owned();
        assert!(cmd.contains("control/api.sock"), "{cmd}");
    }

    /// Start, status, stop through `vmwarden stop`, clean; start again,
    /// SIGKILL, clean.
    fn run(&self, n: u32) {
        let env = Env::new();
        let Some(bin) = real_binary(&env, self.var, self.kind) else {
            return;
        };
        let name = format!("hv{n}");
        let u = uid(n);
        let mut s = env.spec(&name, u);
        s["hypervisor"] = json!({ "kind": self.kind, "binary": bin, "accel": "kvm" });
        s["cmdline"] = json!("console=ttyS0");
        env.write_spec(&name, &s);
        let kernel = assets().kernel;
        let _acl = KvmAcl::grant(u);

        let mut g = self.start(&env, &name, &bin, &kernel);
        self.assert_confined(&g, u);
        let r = env.vmwarden(&["wait-ready", &name, "--timeout", "20"]);
        assert!(r.status.success(), "{}", text(&r));
        let st = env.vmwarden(&["status", &name, "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
        assert_eq!(v[0]["state"], "running", "{v}");
        assert_eq!(v[0]["hypervisor"], self.kind, "{v}");
        assert_eq!(v[0]["control"], self.state, "{v}");
        let table = env.vmwarden(&["status", &name]);
        let t = String::from_utf8_lossy(&table.stdout).into_owned();
        assert!(
            t.contains("CONTROL") && t.contains(&self.state.to_lowercase()),
            "{t}"
        );
        let stop = env.vmwarden(&["stop", &name, "--timeout", "5"]);
        assert!(stop.status.success(), "{}", text(&stop));
        assert!(
            g.wait_exit(Duration::from_secs(10)).is_some(),
            "{} still runs after stop",
            self.kind
        );
        let st = env.vmwarden(&["status", &name, "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
        assert_eq!(v[0]["state"], "stopped", "{v}");
        env.assert_clean(&name);

        let mut g = self.start(&env, &name, &bin, &kernel);
        self.assert_confined(&g, u);
        // Child::kill is SIGKILL.
        g.child.kill().unwrap();
        assert!(g.wait_exit(Duration::from_secs(10)).is_some());
        env.assert_clean_after(&name, "SIGKILL");
        drop(g);
    }
}

#[test]
fn real_cloud_hypervisor_runs_in_the_full_sandbox_answers_stops_and_cleans_up() {
    CH.run(35);
}

#[test]
fn real_firecracker_runs_in_the_full_sandbox_answers_stops_and_cleans_up() {
    FC.run(36);
}

#[test]
fn real_cloud_hypervisor_takes_credentials_as_fw_cfg_files_from_the_private_tmpfs() {
    // The real argv (not --probe): cloud-hypervisor parses vmwarden's
    // --fw-cfg-config, opens each file on the VM's tmpfs, creates and boots
    // the VM (which cannot get far on a KVM that runs no guest), and
    // reports the items through its API. The secret is nowhere in argv.
    let env = Env::new();
    let Some(bin) = real_binary(&env, CH.var, CH.kind) else {
        return;
    };
    let u = uid(37);
    let mut s = env.spec("chcred", u);
    s["hypervisor"] = json!({ "kind": "cloud-hypervisor", "binary": bin, "accel": "kvm" });
    s["cmdline"] = json!("console=ttyS0 panic=-1");
    let secret = b"fw-cfg-secret-7f3a";
    let p = env.secret("db-pass", secret);
    s["credentials"] = json!([
        { "name": "db-password", "source": { "path": p } },
        { "name": "api.token", "source": { "path": p } },
    ]);
    env.write_spec("chcred", &s);
    let _acl = KvmAcl::grant(u);
    let mut g = env.start("chcred");
    let r = env.vmwarden(&["wait-ready", "chcred", "--timeout", "30"]);
    assert!(r.status.success(), "{}\n{}", text(&r), g.log_text());
    let sock = env.run.join("chcred/control/api.sock");
    let info = api::expect_ok(
        &sock,
        "GET",
        "/api/v1/vm.info",
        None,
        Duration::from_secs(5),
    )
    .unwrap_or_else(|e| panic!("vm.info: {e}\n{}", g.log_text()));
    let v: serde_json::Value = serde_json::from_str(&info.body).unwrap();
    let fw = &v["config"]["payload"]["fw_cfg_config"];
    let creds = env.run.join("chcred/credentials");
    assert_eq!(
        fw["items"]["item_list"],
        json!([
            { "name": "opt/io.systemd.credentials/db-password", "file": creds.join("db-password") },
            { "name": "opt/io.systemd.credentials/api.token", "file": creds.join("api.token") },
        ]),
        "{v}"
    );
    assert_eq!(fw["kernel"], false, "{fw}");
    let cmdline = read_proc_bytes(g.pid(), "cmdline");
    let environ = read_proc_bytes(g.pid(), "environ");
    for (what, b) in [("cmdline", &cmdline), ("environ", &environ)] {
        assert!(
            !b.windows(secret.len()).any(|w| w == secret),
            "secret in /proc/PID/{what}"
        );
        let t = String::from_utf8_lossy(b);
        assert!(
            !t.contains(&p.display().to_string()),
            "source path in {what}"
        );
    }
    let stop = env.vmwarden(&["stop", "chcred", "--timeout", "5"]);
    assert!(stop.status.success(), "{}", text(&stop));
    assert!(g.wait_exit(Duration::from_secs(20)).is_some());
    env.assert_clean("chcred");
}

#[test]
fn kill_at_every_launch_step_of_a_cloud_hypervisor_leaves_nothing_after_cleanup() {
    // cloud-hypervisor's launch makes one thing QEMU's does not: the empty
    // control/api.sock.lock it locks; with a virtiofs share, one helper
    // more, reboot-watch (config::reboot). A launch killed after any step
    // leaves nothing cleanup does not remove.
    require_fault_injection();
    let env = Env::new();
    let Some(bin) = real_binary(&env, CH.var, CH.kind) else {
        return;
    };
    let u = uid(41);
    let share = env.path("chkill-share");
    std::fs::create_dir(&share).unwrap();
    let mut s = env.spec("chkill", u);
    s["hypervisor"] = json!({ "kind": "cloud-hypervisor", "binary": bin, "accel": "kvm" });
    s["cmdline"] = json!("console=ttyS0");
    s["shares"] = json!([{ "tag": "ro", "source": share, "proto": "virtiofs", "read_only": true }]);
    s["virtiofsd"] = json!({ "binary": daemon("virtiofsd") });
    env.write_spec("chkill", &s);
    let lock = env.run.join("chkill/control/api.sock.lock");
    let intent = env.run.join("chkill/instance.json");
    let (mut locked, mut watched) = (0, 0);
    for step in launch_steps() {
        env.launch_killed_after("chkill", &step);
        if lock.exists() {
            locked += 1;
        }
        if std::fs::read_to_string(&intent).is_ok_and(|i| i.contains("\"reboot-watch\"")) {
            watched += 1;
        }
        // The helpers' death signal is delivered as the launcher exits.
        wait_until(
            &format!("no process of the principal after {step}"),
            Duration::from_secs(10),
            || processes_of_uid(u).is_empty(),
        );
        env.assert_clean_after("chkill", &step);
        assert!(
            !lock.exists(),
            "api.sock.lock left after {step} and cleanup"
        );
    }
    assert!(locked > 0, "no killed launch got as far as the lock file");
    assert!(watched > 0, "no killed launch recorded reboot-watch");
}

/// The processes of `u` other than `hv`, by `comm`, sorted; each must be
/// `hv`'s child.
fn children_of(u: u32, hv: u32) -> Vec<(String, u32)> {
    let mut v: Vec<(String, u32)> = processes_of_uid(u)
        .into_iter()
        .filter(|p| *p != hv)
        .filter_map(|p| {
            let comm = std::fs::read_to_string(format!("/proc/{p}/comm")).ok()?;
            Some((comm.trim().to_string(), p))
        })
        .collect();
    v.sort();
    for (comm, p) in &v {
        assert_eq!(proc_status(*p, "PPid"), hv.to_string(), "{comm} {p}");
        assert_eq!(proc_status(*p, "NoNewPrivs"), "1", "{comm} {p}");
        assert_eq!(proc_status(*p, "CapEff").len(), 16, "{comm} {p}");
    }
    v
}

/// A cloud-hypervisor VM with a writable virtiofs share reboots (here
/// through its API's `vm.reboot`, the code path of a guest's reset: this
/// host's KVM runs no guest far enough to reset itself; the systemd suite's
/// `guest_reboot` reboots a real guest): its virtiofsd serves one
/// connection, so the launcher's reboot-watch ends cloud-hypervisor with
/// SIGHUP at its `rebooting` event (before: the new virtio-fs device
/// retried the ended virtiofsd for a minute and cloud-hypervisor exited 1).
/// Cleanup is clean after it, and the next launch (the unit's restart)
/// gets a fresh virtiofsd, broker and reboot-watch in the same sandbox,
/// which the new VM's virtio-fs device connects to. Needs root.
#[test]
fn a_cloud_hypervisor_reboot_with_a_virtiofs_share_ends_it_by_sighup_and_it_starts_again_clean() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::ExitStatusExt;
    let env = Env::new();
    let Some(bin) = real_binary(&env, "VMWARDEN_TEST_CLOUD_HYPERVISOR", "cloud-hypervisor") else {
        return;
    };
    let name = "chboot";
    let u = uid(367);
    let share = env.path("chboot-share");
    std::fs::create_dir(&share).unwrap();
    std::os::unix::fs::chown(&share, Some(u), Some(u)).unwrap();
    std::fs::set_permissions(&share, PermissionsExt::from_mode(0o700)).unwrap();
    let mut s = spec_for(&env, name, u, "cloud-hypervisor", &bin);
    s["cmdline"] = json!("console=ttyS0");
    s["shares"] = json!([{ "tag": "vrw", "source": share, "proto": "virtiofs" }]);
    s["virtiofsd"] = json!({ "binary": daemon("virtiofsd") });
    env.write_spec(name, &s);
    let _acl = KvmAcl::grant(u);
    let sock = env.run.join(name).join("control/api.sock");
    let mut daemons = Vec::new();
    for boot in 0..2 {
        let log = env.path(&format!("{name}.{boot}.log"));
        let mut g = spawn_logged(env.launch_cmd(name), log);
        // Booted: its virtio-fs device connected to this launch's virtiofsd.
        wait_until("the VM is running", Duration::from_secs(60), || {
            if let Ok(Some(st)) = g.child.try_wait() {
                panic!("cloud-hypervisor exited ({st}):\n{}", g.log_text());
            }
            api::request(
                &sock,
                "GET",
                "/api/v1/vm.info",
                None,
                Duration::from_secs(2),
            )
            .is_ok_and(|r| r.ok() && r.body.contains("\"state\":\"Running\""))
        });
        let hs = children_of(u, g.pid());
        let comms: Vec<&str> = hs.iter().map(|(c, _)| c.as_str()).collect();
        assert_eq!(comms, ["reboot-watch", "virtiofsd", "vmwarden-broker"]);
        daemons.push(hs[1].1);
        let intent = std::fs::read_to_string(env.run.join(name).join("instance.json")).unwrap();
        assert!(intent.contains("\"reboot-watch\""), "{intent}");
        if boot == 1 {
            assert_ne!(daemons[0], daemons[1], "the same virtiofsd");
            let stop = env.vmwarden(&["stop", name, "--timeout", "10"]);
            assert!(stop.status.success(), "{}", text(&stop));
            let st = g.wait_exit(Duration::from_secs(20)).expect("stopped");
            assert_eq!(st.code(), Some(0), "{}", g.log_text());
            env.assert_clean(name);
            break;
        }
        // Killed mid-reboot: the answer may never come.
        let _ = api::request(
            &sock,
            "PUT",
            "/api/v1/vm.reboot",
            None,
            Duration::from_secs(5),
        );
        let st = g.wait_exit(Duration::from_secs(30)).unwrap_or_else(|| {
            panic!(
                "cloud-hypervisor still runs 30 s after its reboot (its new virtio-fs device retries the ended virtiofsd):\n{}",
                g.log_text()
            )
        });
        assert_eq!(
            st.signal(),
            Some(libc::SIGHUP),
            "{st}, not by reboot-watch's SIGHUP:\n{}",
            g.log_text()
        );
        let log = g.log_text();
        assert!(
            log.contains("vmwarden reboot-watch: cloud-hypervisor reboots the VM"),
            "{log}"
        );
        // Its helpers die by their death signal, a moment after it.
        wait_until("its helpers are gone", Duration::from_secs(20), || {
            processes_of_uid(u).is_empty()
        });
        env.assert_clean_after(name, "a reboot");
    }
}
