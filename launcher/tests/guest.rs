//! A real QEMU guest (TCG) launched by vmwarden-launch: what the hypervisor
//! process is, what the guest sees, a refused double start, a graceful stop
//! and a proven-clean teardown. Needs root.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;
use vmwarden::host::mountinfo;
use vmwarden::hypervisor::qmp::Qmp;

const BOOT: Duration = Duration::from_secs(90);

fn host_mnt_ns() -> String {
    mountinfo::mnt_ns("self").unwrap()
}

#[test]
fn guest_runs_as_its_principal_with_private_noswap_credentials() {
    let env = Env::new();
    let db_pw = b"correct horse battery staple".to_vec();
    let token: Vec<u8> = (0..=255u8).cycle().take(4099).collect();
    let pw_path = env.secret("db-password.src", &db_pw);
    let tok_dir = env.path("creds-dir");
    std::fs::create_dir(&tok_dir).unwrap();
    std::fs::write(tok_dir.join("token"), &token).unwrap();
    let mut spec = env.spec("web", uid(11));
    spec["credentials"] = json!([
        { "name": "db-password", "source": { "path": pw_path } },
        { "name": "token", "source": { "systemd": "token" } }
    ]);
    env.write_spec("web", &spec);

    let mut cmd = env.launch_cmd("web");
    cmd.env("CREDENTIALS_DIRECTORY", &tok_dir);
    let mut g = spawn_logged(cmd, env.path("web.serial.log"));
    g.wait_for("VMWARDEN-GUEST-READY", BOOT);
    let pid = g.pid();

    // QMP over control/qmp.sock says running.
    let mut q = Qmp::connect(
        &env.run.join("web/control/qmp.sock"),
        Duration::from_secs(5),
    )
    .unwrap();
    assert_eq!(q.status().unwrap(), "running");
    drop(q);
    let ready = env.vmwarden(&["wait-ready", "web", "--timeout", "10"]);
    assert!(ready.status.success(), "{}", text(&ready));

    // The hypervisor process: principal ids, no capabilities, NNP, seccomp.
    assert_eq!(
        proc_status(pid, "Uid"),
        format!("{0}\t{0}\t{0}\t{0}", uid(11))
    );
    assert_eq!(
        proc_status(pid, "Gid"),
        format!("{0}\t{0}\t{0}\t{0}", uid(11))
    );
    assert_eq!(proc_status(pid, "Groups"), "");
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(proc_status(pid, set), "0000000000000000", "{set}");
    }
    assert_eq!(proc_status(pid, "NoNewPrivs"), "1");
    assert_eq!(
        proc_status(pid, "Seccomp"),
        "2",
        "QEMU's -sandbox should be on"
    );
    // The launcher's own filter (its four policies as one program) under
    // QEMU's.
    let filters: u32 = proc_status(pid, "Seccomp_filters").parse().unwrap();
    assert!(filters >= 2, "Seccomp_filters={filters}");
    let comm = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    assert_eq!(comm, std::path::Path::new(QEMU));
    // Its own IPC namespace: SysV objects die with it.
    assert_ne!(
        std::fs::read_link(format!("/proc/{pid}/ns/ipc")).unwrap(),
        std::fs::read_link("/proc/self/ns/ipc").unwrap()
    );

    // Its own mount namespace, with the credential tmpfs (noswap, ro) that
    // the host's namespace does not have.
    let vm_ns = mountinfo::mnt_ns(&pid.to_string()).unwrap();
    assert_ne!(vm_ns, host_mnt_ns());
    let creds_mp = env.run.join("web/credentials");
    let vm_mounts = mountinfo::read(&pid.to_string()).unwrap();
    let m = vm_mounts
        .iter()
        .find(|m| m.mount_point == creds_mp)
        .expect("credential tmpfs in the VM's namespace");
    assert_eq!(m.fstype, "tmpfs");
    assert_eq!(m.source, "vmwarden-creds:web");
    for opt in ["noswap", "ro", "nosuid", "nodev", "noexec"] {
        assert!(m.has_option(opt), "credential tmpfs lacks {opt}: {m:?}");
    }
    let host_mounts = mountinfo::read("self").unwrap();
    assert!(
        !host_mounts.iter().any(|m| m.source.starts_with("vmwarden")),
        "host sees {host_mounts:?}"
    );
    // A private /proc: QEMU sees its own processes only, and no global files.
    let proc_mount = vm_mounts
        .iter()
        .rev()
        .find(|m| m.mount_point == std::path::Path::new("/proc"))
        .expect("a /proc mount in the VM's namespace");
    assert_eq!(proc_mount.fstype, "proc");
    assert!(
        proc_mount.has_option("hidepid=invisible") && proc_mount.has_option("subset=pid"),
        "{proc_mount:?}"
    );
    // Its root is its own (a tmpfs): of the runtime and state roots it
    // holds this VM's directory alone, no other VM's.
    assert!(vm_mounts
        .iter()
        .any(|m| m.mount_point == std::path::Path::new("/") && m.source == "vmwarden-mask"));
    for root in [&env.run, &env.state] {
        let names: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/root{}", root.display()))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["web"], "{}", root.display());
    }

    // No credential byte in argv or the environment.
    let cmdline = read_proc_bytes(pid, "cmdline");
    let environ = read_proc_bytes(pid, "environ");
    for secret in [&db_pw[..], &token[..64]] {
        assert!(
            !cmdline.windows(secret.len()).any(|w| w == secret),
            "secret in cmdline"
        );
        assert!(
            !environ.windows(secret.len()).any(|w| w == secret),
            "secret in environ"
        );
    }
    assert_eq!(
        String::from_utf8_lossy(&environ).trim_end_matches('\0'),
        "PATH=/run/current-system/sw/bin:/usr/local/bin:/usr/bin:/bin"
    );
    assert!(String::from_utf8_lossy(&cmdline).contains("opt/io.systemd.credentials/db-password"));

    // The guest read each credential and its sha256 matches the source.
    let log_text = g.log_text();
    for (name, bytes) in [("db-password", &db_pw), ("token", &token)] {
        let want = format!("VMWARDEN-CRED name={name} sha256={}", sha256_hex(bytes));
        assert!(
            log_text.lines().any(|l| l == want),
            "missing {want:?} in:\n{log_text}"
        );
    }

    // A second launch is refused and changes nothing.
    let before = snapshot(&env, &[uid(11)]);
    let second = env
        .launch_cmd("web")
        .env("CREDENTIALS_DIRECTORY", &tok_dir)
        .output()
        .unwrap();
    assert_eq!(second.status.code(), Some(1), "{}", text(&second));
    assert!(
        stderr(&second).contains("already running"),
        "{}",
        text(&second)
    );
    assert_eq!(before, snapshot(&env, &[uid(11)]));

    // Cleanup of a live VM refuses and deletes nothing.
    let (o, rep) = env.cleanup("web");
    assert!(!o.status.success());
    assert_eq!(rep["deleted"], json!([]));
    assert!(rep["liveness"].as_str().unwrap().starts_with("live"));
    assert_eq!(before, snapshot(&env, &[uid(11)]));

    // Graceful stop: the guest sees the power button, QEMU exits.
    let stop = env.vmwarden(&["stop", "web", "--timeout", "30"]);
    assert!(stop.status.success(), "{}", text(&stop));
    assert!(
        String::from_utf8_lossy(&stop.stdout).contains("stopped by powerdown"),
        "{}",
        text(&stop)
    );
    assert!(g.wait_exit(Duration::from_secs(10)).is_some());
    assert!(g.log_text().contains("VMWARDEN-GUEST-POWERBUTTON"));

    let (o, rep) = env.cleanup("web");
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(rep["clean"], true);
    assert_eq!(rep["failed"], json!([]));
    let v = env.verify_clean(&["web"]);
    assert!(v.status.success(), "{}", text(&v));
    assert!(String::from_utf8_lossy(&v.stdout).contains("result=clean"));
}

#[test]
fn kvm_permission_path_opens_dev_kvm_as_the_principal() {
    // Guests cannot boot under KVM on this host (see ENVIRONMENT.md), but the
    // permission path can be exercised: QEMU paused (-S) as the principal,
    // with /dev/kvm reachable only through its group, must report KVM enabled.
    let env = Env::new();
    let kvm = std::path::Path::new("/dev/kvm");
    assert!(kvm.exists(), "/dev/kvm is missing on this host");
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let md = std::fs::metadata(kvm).unwrap();
    let (old_gid, old_mode) = (md.gid(), md.mode() & 0o7777);
    let kvm_gid = uid(50);
    nix::unistd::chown(kvm, None, Some(nix::unistd::Gid::from_raw(kvm_gid))).unwrap();
    std::fs::set_permissions(kvm, std::fs::Permissions::from_mode(0o660)).unwrap();
    let restore = scopeguard(move || {
        let _ = nix::unistd::chown(kvm, None, Some(nix::unistd::Gid::from_raw(old_gid)));
        let _ = std::fs::set_permissions(kvm, std::fs::Permissions::from_mode(old_mode));
    });
    let mut spec = env.spec("kvm", uid(12));
    spec["hypervisor"]["accel"] = json!("kvm");
    env.write_spec("kvm", &spec);
    // The probe sees exactly the kvm group as a supplementary group.
    let out = env.probe(
        "kvm",
        &["/bin/sh", "-c", "id -G; exec 3<>/dev/kvm && echo KVM-OPEN"],
    );
    assert!(out.status.success(), "{}", text(&out));
    let o = String::from_utf8_lossy(&out.stdout);
    assert!(o.contains(&format!("{} {}", uid(12), kvm_gid)), "{o}");
    assert!(o.contains("KVM-OPEN"), "{o}");
    env.cleanup("kvm");
    drop(restore);
    // Without a group-owned device there is no grant at all: no extra group,
    // and the principal cannot open /dev/kvm (root 0600 here by default).
    if std::fs::metadata(kvm).unwrap().mode() & 0o077 == 0 {
        let out = env.probe(
            "kvm",
            &["/bin/sh", "-c", "id -G; exec 3<>/dev/kvm && echo KVM-OPEN"],
        );
        let o = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            o.lines().next(),
            Some(uid(12).to_string().as_str()),
            "{}",
            text(&out)
        );
        assert!(!o.contains("KVM-OPEN"), "{}", text(&out));
        env.cleanup("kvm");
    }
}

/// Run a closure on drop (restores host state even when an assert fails).
struct Guard<F: FnOnce()>(Option<F>);
impl<F: FnOnce()> Drop for Guard<F> {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f()
        }
    }
}
fn scopeguard<F: FnOnce()>(f: F) -> Guard<F> {
    Guard(Some(f))
}
