//! cloud-hypervisor and firecracker, for real, when a binary is given:
//!
//!   VMWARDEN_TEST_CLOUD_HYPERVISOR=/path/to/cloud-hypervisor
//!   VMWARDEN_TEST_FIRECRACKER=/path/to/firecracker
//!
//! Both need a working KVM (the principal is granted /dev/kvm with setfacl
//! for the test) and a kernel they can boot: VMWARDEN_TEST_VMLINUX (an
//! uncompressed vmlinux with a PVH note for cloud-hypervisor, any vmlinux for
//! firecracker), else the test guest's bzImage. Without the variable a test
//! prints one `NOT RUN:` line (past the test harness's capture) and passes:
//! Debian has no package for either binary, so CI cannot install them.
//! Needs root.

mod common;

use std::io::Write;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::*;
use serde_json::json;

const BOOT: Duration = Duration::from_secs(120);

/// The binary from `var`, or `None` after saying loudly that the test did
/// not run.
fn binary(var: &str, what: &str) -> Option<PathBuf> {
    match std::env::var_os(var) {
        Some(p) if !p.is_empty() => Some(PathBuf::from(p)),
        _ => {
            // Not eprintln!: the harness captures that; this line must show.
            let _ = writeln!(
                std::io::stderr(),
                "NOT RUN: {what} real-binary test (set {var}=/path/to/{what})"
            );
            None
        }
    }
}

/// Grants /dev/kvm to `uid` for the life of the value.
struct KvmAcl(u32);

impl KvmAcl {
    fn grant(uid: u32) -> KvmAcl {
        let out = Command::new("setfacl")
            .args(["-m", &format!("u:{uid}:rw"), "/dev/kvm"])
            .output()
            .expect("setfacl (acl package; tests/setup-host.sh installs it)");
        assert!(out.status.success(), "setfacl /dev/kvm: {}", text(&out));
        KvmAcl(uid)
    }
}

impl Drop for KvmAcl {
    fn drop(&mut self) {
        let _ = Command::new("setfacl")
            .args(["-x", &format!("u:{}", self.0), "/dev/kvm"])
            .output();
    }
}

fn kernel() -> PathBuf {
    std::env::var_os("VMWARDEN_TEST_VMLINUX")
        .map(PathBuf::from)
        .unwrap_or_else(|| assets().kernel)
}

fn spec_for(env: &Env, name: &str, uid: u32, kind: &str, bin: &PathBuf) -> serde_json::Value {
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
fn cloud_hypervisor_boots_networked_stops_through_its_api_and_cleans_up() {
    let Some(bin) = binary("VMWARDEN_TEST_CLOUD_HYPERVISOR", "cloud-hypervisor") else {
        return;
    };
    let env = Env::new();
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
fn firecracker_boots_from_its_private_config_stops_and_cleans_up() {
    let Some(bin) = binary("VMWARDEN_TEST_FIRECRACKER", "firecracker") else {
        return;
    };
    let env = Env::new();
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
