//! A firecracker guest's poweroff ends its VM: the guest's notify socket
//! (`vsock.notify`, `config::vmm_notify`) and its helper, `vmm-notify`
//! (vmwarden's own code, `launch::helpers`), with the real firecracker.
//!
//! On this host firecracker starts and configures a VM but cannot boot a
//! guest (PVM), so the test stands in for firecracker's hybrid vsock: it
//! connects to `control/vsock.sock_8888`, where firecracker hands over a
//! guest's connection to host port 8888, and writes what systemd-shutdown
//! writes. The systemd suite's `guest_reboot` scenario does it with a
//! booted guest through the unit. Needs root.

mod common;

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use vmwarden::hypervisor::api;

/// The ELF vmlinux firecracker boots, extracted from the test guest's
/// bzImage into the test's own directory.
fn vmlinux(env: &Env) -> PathBuf {
    let out = env.path("vmlinux");
    asset_script(
        "extract-vmlinux.sh",
        &[
            &assets().kernel.display().to_string(),
            &out.display().to_string(),
        ],
    );
    out
}

/// What systemd-shutdown writes to its notify socket, through a new
/// connection that is closed after it (a guest's connection through
/// firecracker's hybrid vsock arrives the same way).
fn guest_says(sock: &Path, msg: &[u8]) {
    let mut c = UnixStream::connect(sock).unwrap_or_else(|e| panic!("{}: {e}", sock.display()));
    c.write_all(msg).unwrap();
}

/// The helper runs as the principal with nothing more, as the hypervisor's
/// child in its mount namespace, and holds the lease, its listening socket
/// and a pidfd of the hypervisor beyond stdio, nothing else.
fn assert_confined_helper(helper: u32, hv: u32, u: u32) {
    assert_eq!(
        std::fs::read_to_string(format!("/proc/{helper}/comm"))
            .unwrap()
            .trim(),
        "vmm-notify"
    );
    let us = format!("{u}\t{u}\t{u}\t{u}");
    assert_eq!(proc_status(helper, "Uid"), us);
    assert_eq!(proc_status(helper, "Gid"), us);
    assert_eq!(proc_status(helper, "Groups"), "");
    for key in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(proc_status(helper, key), "0000000000000000", "{key}");
    }
    assert_eq!(proc_status(helper, "NoNewPrivs"), "1");
    assert_eq!(proc_status(helper, "Seccomp"), "2");
    assert_eq!(proc_status(helper, "PPid"), hv.to_string());
    let ns = |p: u32| std::fs::read_link(format!("/proc/{p}/ns/mnt")).unwrap();
    assert_eq!(ns(helper), ns(hv));
    assert_ne!(ns(helper), ns(std::process::id()));
    let fds: Vec<String> = std::fs::read_dir(format!("/proc/{helper}/fd"))
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .parse::<u32>()
                .is_ok_and(|n| n > 2)
        })
        .map(|e| std::fs::read_link(e.path()).unwrap().display().to_string())
        .collect();
    assert_eq!(fds.len(), 3, "the helper's fds beyond stdio: {fds:?}");
    assert!(fds.iter().any(|f| f == "anon_inode:[pidfd]"), "{fds:?}");
    assert!(fds.iter().any(|f| f.ends_with("/instance.lock")), "{fds:?}");
    assert!(fds.iter().any(|f| f.starts_with("socket:")), "{fds:?}");
}

/// Start the VM and wait until firecracker answers with a running VM and
/// the helper listens.
fn start_running(env: &Env, name: &str) -> Guest {
    let mut g = env.start(name);
    let api_sock = env.run.join(name).join("control/api.sock");
    let notify = env.run.join(name).join("control/vsock.sock_8888");
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let running = api::request(&api_sock, "GET", "/", None, Duration::from_secs(2))
            .is_ok_and(|r| r.body.contains("\"Running\""));
        if running && notify.exists() {
            break;
        }
        if let Ok(Some(st)) = g.child.try_wait() {
            panic!("firecracker exited ({st}) before it ran:\n{}", g.log_text());
        }
        assert!(
            Instant::now() < end,
            "firecracker did not run:\n{}",
            g.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    g
}

/// The real firecracker with vsock, launched as the unit launches it: the
/// guest's notify credential is on its kernel command line, `vmm-notify`
/// listens in its sandbox; a guest's reboot message leaves firecracker to
/// itself, its poweroff message ends firecracker with SIGTERM (a clean
/// exit to systemd, not a restart) and the helper with it, and cleanup is
/// clean. `vmwarden stop` and a SIGKILL then behave as before.
#[test]
fn a_guests_poweroff_message_ends_firecracker_with_sigterm_through_its_sandboxed_helper() {
    let env = Env::new();
    let Some(bin) = real_binary(&env, "VMWARDEN_TEST_FIRECRACKER", "firecracker") else {
        return;
    };
    let name = "fcoff";
    let u = uid(290);
    let mut s = env.spec(name, u);
    s["hypervisor"] = json!({ "kind": "firecracker", "binary": bin, "accel": "kvm" });
    s["kernel"] = json!(vmlinux(&env));
    s.as_object_mut().unwrap().remove("initrd");
    s["cmdline"] = json!("console=ttyS0 reboot=k panic=1");
    s["vsock"] = json!({ "cid": 29, "backend": "user" });
    env.write_spec(name, &s);
    let _acl = KvmAcl::grant(u);
    let control = env.run.join(name).join("control");
    let notify = control.join("vsock.sock_8888");

    let mut g = start_running(&env, name);
    let hv = g.pid();
    // The credential is on the kernel command line firecracker was given.
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(control.join("firecracker.json")).unwrap()).unwrap();
    assert_eq!(
        cfg["boot-source"]["boot_args"],
        "console=ttyS0 reboot=k panic=1 systemd.set_credential=vmm.notify_socket:vsock-stream:2:8888"
    );
    assert_eq!(cfg["vsock"]["uds_path"], json!(control.join("vsock.sock")));
    // The socket is root's bind, the principal's, 0600; the intent record
    // names the helper with it.
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let md = std::fs::symlink_metadata(&notify).unwrap();
    assert!(md.file_type().is_socket());
    assert_eq!((md.uid(), md.mode() & 0o777), (u, 0o600));
    let intent: serde_json::Value =
        serde_json::from_slice(&std::fs::read(env.run.join(name).join("instance.json")).unwrap())
            .unwrap();
    let named = intent["resources"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["helper"] == "vmm-notify" && r["socket"] == json!(notify));
    assert!(named, "{intent}");
    let helpers = others_of(u, hv);
    assert_eq!(helpers.len(), 1, "{helpers:?}");
    let helper = helpers[0];
    assert_confined_helper(helper, hv, u);

    // Boot chatter and a reboot leave firecracker to itself (it exits by
    // itself on a guest reset).
    guest_says(&notify, b"READY=1\nSTATUS=Ready.");
    guest_says(&notify, b"EXIT_STATUS=0\nX_SYSTEMD_SHUTDOWN=reboot");
    std::thread::sleep(Duration::from_millis(1500));
    assert!(g.child.try_wait().unwrap().is_none(), "{}", g.log_text());
    assert_eq!(others_of(u, hv), [helper]);

    // The poweroff: firecracker ends by SIGTERM, which systemd counts as a
    // clean exit that Restart=on-failure does not restart (and is not the
    // exit status 0 that RestartForceExitStatus=0 names).
    let t0 = Instant::now();
    guest_says(&notify, b"EXIT_STATUS=0\nX_SYSTEMD_SHUTDOWN=poweroff");
    let st = g
        .wait_exit(Duration::from_secs(10))
        .unwrap_or_else(|| panic!("firecracker still runs:\n{}", g.log_text()));
    assert_eq!(st.signal(), Some(libc::SIGTERM), "{st}");
    let took = t0.elapsed();
    assert!(
        g.log_text()
            .contains("vmwarden vmm-notify: the guest's systemd said poweroff: ending the hypervisor (SIGTERM)"),
        "{}",
        g.log_text()
    );
    wait_until("the helper gone", Duration::from_secs(10), || {
        others_of(u, 0).is_empty()
    });
    env.assert_clean(name);
    eprintln!("poweroff message to firecracker's end: {took:?}");

    // Without a poweroff: `vmwarden stop` as before (the Ctrl-Alt-Del no
    // guest answers here, then SIGKILL), the helper with it.
    let mut g = start_running(&env, name);
    assert_eq!(others_of(u, g.pid()).len(), 1);
    let stop = env.vmwarden(&["stop", name, "--timeout", "2"]);
    assert!(stop.status.success(), "{}", text(&stop));
    assert!(
        String::from_utf8_lossy(&stop.stdout).contains("stopped by sigkill"),
        "{}",
        text(&stop)
    );
    assert!(g.wait_exit(Duration::from_secs(10)).is_some());
    wait_until("the helper gone", Duration::from_secs(10), || {
        others_of(u, 0).is_empty()
    });
    env.assert_clean(name);

    // A SIGKILL of the hypervisor takes the helper with it.
    let mut g = start_running(&env, name);
    g.child.kill().unwrap();
    assert_eq!(g.child.wait().unwrap().signal(), Some(libc::SIGKILL));
    wait_until("the helper gone", Duration::from_secs(10), || {
        others_of(u, 0).is_empty()
    });
    env.assert_clean_after(name, "SIGKILL");
}

/// Runs everywhere: a probe in the identical sandbox stands in for
/// firecracker. A firecracker VM with vsock gets the notify socket by
/// default; `vsock.notify = false` gives the old VM (no helper, no
/// credential); a VM without vsock has none either.
#[test]
fn the_notify_socket_is_on_for_firecracker_with_vsock_unless_the_spec_turns_it_off() {
    let env = Env::new();
    let name = "fcnfy";
    let u = uid(291);
    let control = env.run.join(name).join("control");
    let show = format!("cat {0}/firecracker.json; ls {0}", control.display());
    for (vsock, want) in [
        (json!({ "cid": 31, "backend": "user" }), true),
        (
            json!({ "cid": 31, "backend": "user", "notify_port": 7777 }),
            true,
        ),
        (
            json!({ "cid": 31, "backend": "user", "notify": false }),
            false,
        ),
        (json!(null), false),
    ] {
        let mut s = env.spec(name, u);
        s["hypervisor"] = json!({ "kind": "firecracker", "binary": "/bin/true", "accel": "kvm" });
        s.as_object_mut().unwrap().remove("initrd");
        s["cmdline"] = json!("console=ttyS0");
        if !vsock.is_null() {
            s["vsock"] = vsock.clone();
        }
        env.write_spec(name, &s);
        let out = env.probe(name, &["/bin/sh", "-c", &show]);
        assert!(out.status.success(), "{vsock}: {}", text(&out));
        let o = String::from_utf8_lossy(&out.stdout).into_owned();
        let port = vsock["notify_port"].as_u64().unwrap_or(8888);
        let param = format!("systemd.set_credential=vmm.notify_socket:vsock-stream:2:{port}");
        let sock = format!("vsock.sock_{port}");
        assert_eq!(o.contains(&param), want, "{vsock}: {o}");
        assert_eq!(o.lines().any(|l| l == sock), want, "{vsock}: {o}");
        env.assert_clean(name);
    }
    // QEMU never gets one; asking for it is refused by name, and the host
    // is left as it was.
    let mut s = env.spec(name, u);
    s["vsock"] = json!({ "cid": 31, "backend": "vhost", "notify": true });
    env.write_spec(name, &s);
    let before = snapshot(&env, &[u]);
    let out = env.probe(name, &["/bin/true"]);
    assert_eq!(out.status.code(), Some(78), "{}", text(&out));
    assert!(
        stderr(&out).contains("field `vsock.notify` is true, but qemu needs no notify socket"),
        "{}",
        text(&out)
    );
    assert_eq!(snapshot(&env, &[u]), before);
}
