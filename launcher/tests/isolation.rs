//! Two VMs side by side, each probed in its own sandbox (`--probe`, no
//! systemd unit around it): every principal is denied the other's
//! credentials, state dir and control socket, `/etc/shadow`, writes outside
//! its own dirs, anything but sockets in its control dir, other processes
//! in /proc, user namespaces, IP and netlink sockets, the kernel keyring
//! and other processes' memory; SysV IPC it makes dies with it. The
//! positive controls (its own files, sockets, IPC and /proc entry) succeed.
//! Needs root.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;
use vmwarden::instance::liveness::control_socket_answers;

/// Run `sh -c SCRIPT` in VM `name`'s sandbox and return its stdout lines.
fn probe_lines(env: &Env, name: &str, script: &str) -> Vec<String> {
    let out = env.probe(name, &["/bin/sh", "-c", script]);
    assert!(
        out.status.success(),
        "probe of {name} failed: {}",
        text(&out)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// `try LABEL CMD…` prints `LABEL=ok` or `LABEL=denied`.
const TRY: &str = r#"try() { l=$1; shift; if "$@" >/dev/null 2>&1; then echo "$l=ok"; else echo "$l=denied"; fi; }; "#;

/// Probe `me` while `other` runs for real; assert the whole matrix.
fn matrix(env: &Env, me: &str, me_uid: u32, other: &str, other_uid: u32) {
    let mut guest = env.start(other);
    guest.wait_for("VMWARDEN-GUEST-READY", Duration::from_secs(90));
    let sock = env.run.join(format!("{other}/control/qmp.sock"));
    assert!(control_socket_answers(&sock));
    let disk = env.state.join(format!("{other}/disk.img"));
    std::fs::write(&disk, b"other-data").unwrap();
    nix::unistd::chown(&disk, Some(nix::unistd::Uid::from_raw(other_uid)), None).unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();

    let (run, state) = (env.run.display(), env.state.display());
    let script = format!(
        "{TRY}
        try own_cred cat {run}/{me}/credentials/key
        try own_state_write sh -c 'echo x > {state}/{me}/probe-file'
        try own_state_read cat {state}/{me}/probe-file
        try own_control_sock python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind(\"{run}/{me}/control/probe.sock\")'
        try own_control_write sh -c 'echo x > {run}/{me}/control/probe-file'
        try control_fill sh -c 'head -c 104857600 /dev/zero > {run}/{me}/control/fill'
        try control_mkdir mkdir {run}/{me}/control/d
        try control_fifo mkfifo {run}/{me}/control/p
        try control_symlink ln -s / {run}/{me}/control/l
        try own_shm ipcmk -M 4096
        try own_proc cat /proc/self/status
        try proc_init cat /proc/1/status
        try proc_other cat /proc/{opid}/status
        try userns python3 -c 'import ctypes,sys; sys.exit(ctypes.CDLL(None).unshare(0x10000000) != 0)'
        try userns_tool unshare -U true
        try udp4 python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM)'
        try udp6 python3 -c 'import socket; socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)'
        try netlink python3 -c 'import socket; socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)'
        try keyring_add python3 -c 'import ctypes,sys; sys.exit(ctypes.CDLL(None).syscall(248, b\"user\", b\"stash\", b\"data\", 4, -4) < 0)'
        try keyring_read python3 -c 'import ctypes,sys; sys.exit(ctypes.CDLL(None).syscall(250, 0, -4, 0) < 0)'
        try ptrace python3 -c 'import ctypes,sys; sys.exit(ctypes.CDLL(None).ptrace(0, 0, 0, 0) != 0)'
        try process_vm python3 -c 'import ctypes,os,sys; sys.exit(ctypes.CDLL(None).syscall(310, os.getpid(), 0, 0, 0, 0, 0) != 0)'
        try other_cred cat {run}/{other}/credentials/key
        try other_cred_ls ls {run}/{other}/credentials
        try other_state_ls ls {state}/{other}
        try other_state_read cat {state}/{other}/disk.img
        try other_control_ls ls {run}/{other}/control
        try other_qmp python3 -c 'import socket; s=socket.socket(socket.AF_UNIX); s.connect(\"{run}/{other}/control/qmp.sock\")'
        try shadow cat /etc/shadow
        try write_tmp sh -c 'echo x > /tmp/vmwarden-probe-escape'
        try write_etc sh -c 'echo x > /etc/vmwarden-probe-escape'
        try write_run_root sh -c 'echo x > {run}/escape'
        try host_creds ls /run/credentials
        try tcp_connect python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), timeout=2)'
        try setuid_root python3 -c 'import os; os.setuid(0)'
        try signal_other kill -0 {opid}
        ",
        opid = guest.pid()
    );
    let lines = probe_lines(env, me, &script);
    drop(listener);
    let mut got: std::collections::BTreeMap<String, String> = lines
        .iter()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    // The probe made a SysV segment in its IPC namespace (own_shm=ok); it
    // must not be in the host's once the probe is gone.
    got.insert(
        "shm_survives".into(),
        if sysv_objects_of_uid(me_uid).is_empty() {
            "denied".into()
        } else {
            "ok".into()
        },
    );
    let want_ok = [
        "own_cred",
        "own_state_write",
        "own_state_read",
        "own_control_sock",
        "own_shm",
        "own_proc",
    ];
    let want_denied = [
        "own_control_write",
        "control_fill",
        "control_mkdir",
        "control_fifo",
        "control_symlink",
        "shm_survives",
        "proc_init",
        "proc_other",
        "userns",
        "userns_tool",
        "udp4",
        "udp6",
        "netlink",
        "keyring_add",
        "keyring_read",
        "ptrace",
        "process_vm",
        "other_cred",
        "other_cred_ls",
        "other_state_ls",
        "other_state_read",
        "other_control_ls",
        "other_qmp",
        "shadow",
        "write_tmp",
        "write_etc",
        "write_run_root",
        "host_creds",
        "tcp_connect",
        "setuid_root",
        "signal_other",
    ];
    let mut bad = Vec::new();
    for k in want_ok {
        if got.get(k).map(String::as_str) != Some("ok") {
            bad.push(format!("{me}: {k}: expected ok, got {:?}", got.get(k)));
        }
    }
    for k in want_denied {
        if got.get(k).map(String::as_str) != Some("denied") {
            bad.push(format!("{me}: {k}: expected denied, got {:?}", got.get(k)));
        }
    }
    assert!(bad.is_empty(), "{bad:#?}\nall: {got:#?}");
    assert!(!std::path::Path::new("/tmp/vmwarden-probe-escape").exists());
    assert!(!env.run.join(format!("{me}/control/fill")).exists());
    assert!(
        keys_of_uid(me_uid) == 0,
        "the probe's uid owns kernel keys after it ended"
    );
    assert!(!std::path::Path::new("/etc/vmwarden-probe-escape").exists());
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        std::fs::metadata(env.state.join(format!("{me}/probe-file")))
            .unwrap()
            .uid(),
        me_uid
    );

    let stop = env.vmwarden(&["stop", other, "--timeout", "30"]);
    assert!(stop.status.success(), "{}", text(&stop));
    guest.wait_exit(Duration::from_secs(10));
    for n in [me, other] {
        let (o, rep) = env.cleanup(n);
        assert!(o.status.success(), "{}", text(&o));
        assert_eq!(rep["clean"], true);
    }
}

/// SysV IPC objects (shm, sem, msg) in the host's IPC namespace owned or
/// created by `uid`.
fn sysv_objects_of_uid(uid: u32) -> Vec<String> {
    let mut out = Vec::new();
    for kind in ["shm", "sem", "msg"] {
        let text = std::fs::read_to_string(format!("/proc/sysvipc/{kind}")).unwrap();
        let mut lines = text.lines();
        let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
        let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
        let (u, cu) = (col("uid"), col("cuid"));
        for l in lines {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f[u] == uid.to_string() || f[cu] == uid.to_string() {
                out.push(format!("{kind}: {l}"));
            }
        }
    }
    out
}

/// Keys `uid` owns (/proc/key-users), 0 when it has none.
fn keys_of_uid(uid: u32) -> u32 {
    let text = std::fs::read_to_string("/proc/key-users").unwrap();
    text.lines()
        .find_map(|l| {
            let (u, rest) = l.trim().split_once(':')?;
            (u.trim() == uid.to_string()).then(|| {
                rest.split_whitespace()
                    .nth(1)
                    .and_then(|n| n.split('/').next())
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0)
            })
        })
        .unwrap_or(0)
}

#[test]
fn two_vms_cannot_reach_each_other() {
    let env = Env::new();
    let (a_uid, b_uid) = (uid(21), uid(22));
    for (name, u, secret) in [
        ("alpha", a_uid, "alpha-secret"),
        ("beta", b_uid, "beta-secret"),
    ] {
        let src = env.secret(&format!("{name}.cred"), secret.as_bytes());
        let mut s = env.spec(name, u);
        s["credentials"] = json!([{ "name": "key", "source": { "path": src } }]);
        env.write_spec(name, &s);
    }
    matrix(&env, "alpha", a_uid, "beta", b_uid);
    matrix(&env, "beta", b_uid, "alpha", a_uid);
    let v = env.verify_clean(&["alpha", "beta"]);
    assert!(v.status.success(), "{}", text(&v));
}

#[test]
fn landlock_required_confines_reads_to_the_policy() {
    // Paths outside the policy are unreadable even when DAC allows them.
    let env = Env::new();
    let world = env.path("world-readable");
    std::fs::write(&world, b"hello").unwrap();
    env.write_spec("gamma", &env.spec("gamma", uid(23)));
    let lines = probe_lines(
        &env,
        "gamma",
        &format!(
            "{TRY} try world cat {} ; try usr cat /usr/share/common-licenses/GPL-3",
            world.display()
        ),
    );
    assert!(lines.contains(&"world=denied".to_string()), "{lines:?}");
    assert!(lines.contains(&"usr=ok".to_string()), "{lines:?}");
    // With the path in landlock.read it becomes readable.
    let mut s = env.spec("gamma", uid(23));
    s["landlock"]["read"] = json!([world]);
    env.write_spec("gamma", &s);
    let lines = probe_lines(
        &env,
        "gamma",
        &format!("{TRY} try world cat {}", world.display()),
    );
    assert!(lines.contains(&"world=ok".to_string()), "{lines:?}");
    env.cleanup("gamma");
}
