//! A compromised VM (its principal runs arbitrary code in its sandbox, here
//! through `--probe`) and hostile local users try to turn root's tools
//! against other VMs or the host. Each case once worked; each must fail.
//! Needs root.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use serde_json::json;
use vmwarden::host::dirs;
use vmwarden::host::procs::processes_of_uid;
use vmwarden::hypervisor::qmp::Qmp;
use vmwarden::instance::lease;

const BOOT: Duration = Duration::from_secs(90);

/// Start `vmwarden-launch NAME --probe -- sh -c SCRIPT` in the background.
fn spawn_probe(env: &Env, name: &str, script: &str) -> Guest {
    let log = env.path(&format!("{name}.serial.log"));
    let f = std::fs::File::create(&log).unwrap();
    let mut c = env.launch_cmd(name);
    c.arg("--probe").arg("--").args(["/bin/sh", "-c", script]);
    c.stdin(Stdio::null())
        .stdout(f.try_clone().unwrap())
        .stderr(f);
    Guest {
        child: c.spawn().unwrap(),
        log,
    }
}

/// Run the Python program `code` as VM `name`'s principal in its sandbox
/// (the script readable through `landlock.read`) and wait for `marker`.
fn python_probe(env: &Env, name: &str, u: u32, file: &str, code: &str, marker: &str) -> Guest {
    let script = env.path(file);
    std::fs::write(&script, code).unwrap();
    let mut sp = env.spec(name, u);
    sp["landlock"]["read"] = json!([script]);
    env.write_spec(name, &sp);
    let mut g = spawn_probe(env, name, &format!("exec python3 {}", script.display()));
    g.wait_for(marker, Duration::from_secs(30));
    g
}

#[test]
fn a_symlinked_control_socket_cannot_steer_stop_or_status_to_another_vm() {
    let env = Env::new();
    env.write_spec("victim", &env.spec("victim", uid(71)));
    env.write_spec("evil", &env.spec("evil", uid(72)));
    let mut victim = env.start("victim");
    victim.wait_for("VMWARDEN-GUEST-READY", BOOT);
    let vsock = env.run.join("victim/control/qmp.sock");
    let esock = env.run.join("evil/control/qmp.sock");
    // The evil VM plants a symlink to the victim's socket in its own control dir.
    let mut evil = spawn_probe(
        &env,
        "evil",
        &format!(
            "ln -sf {} {} && echo PLANTED && exec sleep 600",
            vsock.display(),
            esock.display()
        ),
    );
    evil.wait_for("PLANTED", Duration::from_secs(30));
    let st = env.vmwarden(&["status", "evil", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
    assert!(
        v[0]["qmp_status"].is_null(),
        "status read the victim through evil's socket: {v}"
    );
    // Root's stop of the evil VM must not power the victim off.
    let _ = env.vmwarden(&["stop", "evil", "--timeout", "3"]);
    assert!(
        !victim.log_text().contains("VMWARDEN-GUEST-POWERBUTTON"),
        "stop evil powered off the victim"
    );
    assert!(victim.child.try_wait().unwrap().is_none(), "victim died");
    let mut q = Qmp::connect(&vsock, Duration::from_secs(5)).unwrap();
    assert_eq!(q.status().unwrap(), "running");
    drop(q);
    evil.kill();
    victim.kill();
    for n in ["victim", "evil"] {
        let (o, rep) = env.cleanup(n);
        assert!(o.status.success() && rep["clean"] == true, "{}", text(&o));
    }
}

#[test]
fn a_flooding_fake_qmp_server_cannot_hang_root() {
    let env = Env::new();
    let sock = env.run.join("evil/control/qmp.sock");
    let server = format!(
        "import socket,os\n\
         s=socket.socket(socket.AF_UNIX); s.bind('{}'); s.listen(4); print('LISTENING', flush=True)\n\
         while True:\n\
         \x20   c,_=s.accept()\n\
         \x20   c.sendall(b'{{\"QMP\": {{\"version\": \"')\n\
         \x20   try:\n\
         \x20       while True: c.sendall(b'x'*65536)\n\
         \x20   except Exception: pass\n",
        sock.display()
    );
    let mut evil = python_probe(&env, "evil", uid(73), "server.py", &server, "LISTENING");
    // Bounded: each command fails instead of growing without end.
    let out = env
        .vmwarden_bounded(
            &["wait-ready", "evil", "--timeout", "3"],
            Duration::from_secs(60),
        )
        .expect("wait-ready against a flooding server never returned");
    assert!(
        !out.status.success(),
        "a flooding server must not count as ready"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("longer than") || err.contains("timed out") || err.contains("did not answer"),
        "{err}"
    );
    evil.kill();
    env.cleanup("evil");
}

#[test]
fn a_vm_cannot_write_through_its_inherited_lease_fd_or_run_what_it_writes() {
    let env = Env::new();
    env.write_spec("web", &env.spec("web", uid(74)));
    let script = r#"import os, subprocess, shutil
wrote = 0
for f in os.listdir('/proc/self/fd'):
    if int(f) > 2:
        try:
            os.write(int(f), b'x' * 4096); wrote += 1
        except OSError:
            pass
print('WROTE', wrote)
shutil.copy('/bin/echo', './dropped')
os.chmod('./dropped', 0o755)
try:
    subprocess.run(['./dropped', 'RAN'], check=True); print('EXEC ok')
except (OSError, subprocess.CalledProcessError):
    print('EXEC denied')
"#;
    let out = env.probe("web", &["/usr/bin/python3", "-c", script]);
    let o = String::from_utf8_lossy(&out.stdout);
    assert!(o.contains("WROTE 0"), "{}", text(&out));
    assert!(
        o.contains("EXEC denied") && !o.contains("RAN"),
        "{}",
        text(&out)
    );
    assert_eq!(
        std::fs::metadata(env.run.join("web/instance.lock"))
            .unwrap()
            .len(),
        0
    );
    env.cleanup("web");
}

#[test]
fn a_credential_path_through_a_vm_owned_directory_cannot_reach_another_vm() {
    let env = Env::new();
    // other's identity key, readable by root only.
    let other_id = env.state.join("other/identity");
    std::fs::create_dir_all(&other_id).unwrap();
    std::fs::write(other_id.join("host-key"), b"OTHER-VM-PRIVATE-KEY").unwrap();
    // web passes its own identity key into the guest.
    let web_id = env.state.join("web/identity");
    std::fs::create_dir_all(&web_id).unwrap();
    std::fs::write(web_id.join("host-key"), b"web-key").unwrap();
    nix::unistd::chown(
        &env.state.join("web"),
        Some(nix::unistd::Uid::from_raw(uid(75))),
        Some(nix::unistd::Gid::from_raw(uid(75))),
    )
    .unwrap();
    nix::unistd::chown(&web_id, Some(nix::unistd::Uid::from_raw(uid(75))), None).unwrap();
    let mut s = env.spec("web", uid(75));
    s["credentials"] =
        json!([{ "name": "host-key", "source": { "path": web_id.join("host-key") } }]);
    env.write_spec("web", &s);
    let ok = env.probe(
        "web",
        &[
            "/bin/cat",
            env.run.join("web/credentials/host-key").to_str().unwrap(),
        ],
    );
    assert_eq!(
        String::from_utf8_lossy(&ok.stdout),
        "web-key",
        "{}",
        text(&ok)
    );
    env.cleanup("web");
    // The VM swaps its identity dir for a symlink to the other VM's.
    std::fs::rename(&web_id, env.state.join("web/identity.old")).unwrap();
    std::os::unix::fs::symlink(&other_id, &web_id).unwrap();
    let before = snapshot(&env, &[uid(75)]);
    let out = env.probe(
        "web",
        &[
            "/bin/cat",
            env.run.join("web/credentials/host-key").to_str().unwrap(),
        ],
    );
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("OTHER"),
        "leaked: {}",
        text(&out)
    );
    assert_eq!(out.status.code(), Some(78), "{}", text(&out));
    assert!(stderr(&out).contains("is a symlink"), "{}", text(&out));
    // Credentials are read with the spec, before anything is created.
    assert!(
        stderr(&out).contains("error at step \"spec-loaded\": credential host-key"),
        "{}",
        text(&out)
    );
    assert_eq!(before, snapshot(&env, &[uid(75)]));
    // Pointing straight into another VM's state dir is refused by field.
    s["credentials"] =
        json!([{ "name": "host-key", "source": { "path": other_id.join("host-key") } }]);
    env.write_spec("web", &s);
    let out = env.probe("web", &["/bin/true"]);
    assert!(
        stderr(&out).contains("credentials[0].source.path")
            && stderr(&out).contains("another VM's directory"),
        "{}",
        text(&out)
    );
}

#[test]
fn a_process_whose_main_thread_exited_still_counts_as_running() {
    let env = Env::new();
    env.write_spec("web", &env.spec("web", uid(76)));
    // Close every fd (the lease too), start a thread, end the main thread.
    let script = r#"import os, threading, time, ctypes
os.closerange(3, 1024)
def spin():
    print('THREAD', flush=True)
    while True: time.sleep(1)
threading.Thread(target=spin, daemon=False).start()
time.sleep(0.5)
ctypes.CDLL(None).syscall(60, 0)
"#;
    let mut g = spawn_probe(
        &env,
        "web",
        &format!(
            "exec /usr/bin/python3 -c \"{}\"",
            script.replace('"', "\\\"")
        ),
    );
    g.wait_for("THREAD", Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(800));
    assert!(
        !processes_of_uid(uid(76)).is_empty(),
        "the running thread is invisible"
    );
    let st = env.vmwarden(&["status", "web"]);
    assert!(
        !String::from_utf8_lossy(&st.stdout).contains("stopped"),
        "{}",
        text(&st)
    );
    let (o, rep) = env.cleanup("web");
    assert!(
        !o.status.success(),
        "cleanup ran while a thread of the VM lives: {rep}"
    );
    let k = env.vmwarden(&["reap", "--apply", "--kill"]);
    assert!(k.status.success(), "{}", text(&k));
    assert!(processes_of_uid(uid(76)).is_empty());
    g.kill();
    let (o, _) = env.cleanup("web");
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn an_unprivileged_users_fake_credential_mount_does_not_fail_cleanup() {
    let env = Env::new();
    env.write_spec("web", &env.spec("web", uid(77)));
    assert!(env.probe("web", &["/bin/true"]).status.success());
    // nobody makes a tmpfs named like web's, at a path shaped like it.
    let fake = env.path("fake/web/credentials");
    std::fs::create_dir_all(&fake).unwrap();
    let mut holder = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "unshare",
            "-Urm",
            "sh",
            "-c",
        ])
        .arg(format!(
            "mount -t tmpfs vmwarden-creds:web {} && echo MOUNTED && exec sleep 600",
            fake.display()
        ))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    use std::io::BufRead;
    std::io::BufReader::new(holder.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "MOUNTED");
    let (o, rep) = env.cleanup("web");
    assert!(
        o.status.success(),
        "a user's fake mount failed cleanup: {rep}"
    );
    let v = env.verify_clean(&["web"]);
    assert!(v.status.success(), "{}", text(&v));
    let _ = holder.kill();
    let _ = holder.wait();
}

#[test]
fn read_only_probes_never_make_a_launch_say_already_running() {
    let env = Env::new();
    env.write_spec("web", &env.spec("web", uid(78)));
    assert!(env.probe("web", &["/bin/true"]).status.success());
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let prober = {
        let stop = stop.clone();
        let rundir = env.run.join("web");
        std::thread::spawn(move || {
            let d = dirs::open_dir(&rundir).unwrap();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = lease::state(&d);
            }
        })
    };
    let mut failures = Vec::new();
    for i in 0..30 {
        let out = env.probe("web", &["/bin/true"]);
        if !out.status.success() {
            failures.push(format!("launch {i}: {}", stderr(&out)));
        }
        let (o, _) = env.cleanup("web");
        if !o.status.success() {
            failures.push(format!("cleanup {i}: {}", text(&o)));
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    prober.join().unwrap();
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn a_full_listen_backlog_cannot_hang_root_on_connect() {
    let env = Env::new();
    let sock = env.run.join("evil/control/qmp.sock");
    let server = format!(
        "import socket,time\n\
         s=socket.socket(socket.AF_UNIX); s.bind('{0}'); s.listen(0)\n\
         held=[]\n\
         for i in range(4):\n\
         \x20   c=socket.socket(socket.AF_UNIX); c.setblocking(False)\n\
         \x20   try: c.connect('{0}')\n\
         \x20   except OSError: pass\n\
         \x20   held.append(c)\n\
         print('FULL', flush=True)\n\
         time.sleep(600)\n",
        sock.display()
    );
    let mut evil = python_probe(&env, "evil", uid(79), "backlog.py", &server, "FULL");
    for args in [
        &["status", "evil"][..],
        &["wait-ready", "evil", "--timeout", "2"][..],
        &["stop", "evil", "--timeout", "2"][..],
    ] {
        let done = env
            .vmwarden_bounded(args, Duration::from_secs(60))
            .is_some();
        assert!(done, "`vmwarden {}` hung on a full backlog", args.join(" "));
    }
    evil.kill();
    env.cleanup("evil");
}
