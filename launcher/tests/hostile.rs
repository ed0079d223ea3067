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
use vmwarden::host::leftovers;
use vmwarden::host::mountinfo;
use vmwarden::host::procs::processes_of_uid;
use vmwarden::hypervisor::qmp::Qmp;
use vmwarden::instance::intent::Intent;
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
    // The evil VM cannot plant a symlink to the victim's socket in its own
    // control dir (Landlock lets it make sockets there, nothing else) ...
    let mut evil = spawn_probe(
        &env,
        "evil",
        &format!(
            "if ln -sf {} {}; then echo PLANTED; else echo REFUSED; fi; exec sleep 600",
            vsock.display(),
            esock.display()
        ),
    );
    let said = evil.wait_for("REFUSED", Duration::from_secs(30));
    assert_eq!(said, "REFUSED");
    // ... but where Landlock is not enforced (best-effort mode on an old
    // kernel) it could, and root's tools must still not follow it.
    std::os::unix::fs::symlink(&vsock, &esock).unwrap();
    let st = env.vmwarden(&["status", "evil", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
    assert!(
        v[0]["control"].is_null(),
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
    // web would pass its own identity key into the guest: but web's state
    // dir is the VM's to change, so root never reads a credential there.
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
    let before = snapshot(&env, &[uid(75)]);
    let out = env.probe("web", &["/bin/true"]);
    assert_eq!(out.status.code(), Some(78), "{}", text(&out));
    assert!(
        stderr(&out).contains("credentials[0].source.path")
            && stderr(&out).contains(&format!("is owned by uid {}", uid(75))),
        "{}",
        text(&out)
    );
    assert_eq!(before, snapshot(&env, &[uid(75)]));
    // The VM swaps its identity dir for a symlink to the other VM's: still
    // refused, nothing leaked.
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

// ---------------------------------------------------------------------------
// Hardening, round three: one regression test per hardening property,
// each re-running the attack against the real binaries.

/// `CMD…` as `u:u` with no groups (a local process of the VM's uid).
fn as_uid(u: u32, cmd: &[&str]) -> Command {
    let mut c = Command::new("setpriv");
    c.arg(format!("--reuid={u}"))
        .arg(format!("--regid={u}"))
        .arg("--clear-groups")
        .args(cmd);
    c
}

fn verify_line(env: &Env, vm: &str, check: &str) -> String {
    let v = env.verify_clean(&[vm]);
    let out = String::from_utf8_lossy(&v.stdout).into_owned();
    out.lines()
        .find(|l| l.starts_with(&format!("{check} vm={vm} ")))
        .unwrap_or_else(|| panic!("no {check} line for {vm}: {}", text(&v)))
        .to_string()
}

/// Property 1 (keyrings, IPC): a VM stashes a secret in its uid's kernel
/// keyring and in SysV IPC, stops, is purged (its uid retired), and the
/// next VM given that uid goes looking. Nothing is there to find: the
/// sandbox refuses the keyring calls and the IPC lived in the VM's own
/// namespace. What another process of the uid leaves (or a launch before
/// this fix left) is seen by verify-clean and blocks the uid's reuse.
#[test]
fn a_vm_leaves_nothing_in_the_kernel_for_the_next_owner_of_its_uid() {
    let env = Env::new();
    let u = uid(80);
    env.write_spec("first", &env.spec("first", u));
    let stash = r#"import ctypes, subprocess
libc = ctypes.CDLL(None, use_errno=True)
r = libc.syscall(248, b"user", b"stash", b"first-vm-secret", 15, -4)
print("ADD_KEY", r, ctypes.get_errno(), flush=True)
ok = all(subprocess.run(a, capture_output=True).returncode == 0
         for a in (["ipcmk", "-M", "4096"], ["ipcmk", "-S", "1"], ["ipcmk", "-Q"]))
print("IPC_MADE", ok, flush=True)
"#;
    let out = env.probe("first", &["/usr/bin/python3", "-c", stash]);
    let o = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", text(&out));
    assert!(o.contains("ADD_KEY -1 1"), "add_key was not refused: {o}");
    assert!(o.contains("IPC_MADE True"), "the IPC half did not run: {o}");
    assert!(
        leftovers::sysv_objects_of_uid(u).is_empty(),
        "SysV objects survived the VM"
    );
    let (c, rep) = env.cleanup("first");
    assert!(c.status.success(), "{rep}");
    for check in ["no-key", "no-ipc"] {
        let l = verify_line(&env, "first", check);
        assert!(l.ends_with("check=ok"), "{l}");
    }
    // Purge retires the uid; the next VM gets it and looks for the stash.
    let (ok, p) = purge_on_pty(&env, &["first"], "DELETE-EVERYTHING");
    assert!(ok && p.contains("retired principal uid"), "{p}");
    std::fs::remove_file(env.config.join("first.json")).unwrap();
    env.write_spec("second", &env.spec("second", u));
    let look = r#"import ctypes
libc = ctypes.CDLL(None, use_errno=True)
r = libc.syscall(250, 10, -4, b"user", b"stash", 0)
print("SEARCH", r, ctypes.get_errno(), flush=True)
"#;
    let out = env.probe("second", &["/usr/bin/python3", "-c", look]);
    let o = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", text(&out));
    assert!(o.contains("SEARCH -1 1"), "keyctl was not refused: {o}");
    env.cleanup("second");

    // A key and a SysV segment left by another process of the uid (or by
    // a launch before this fix): verify-clean fails on each, and the uid
    // cannot go to another VM while they exist.
    let add = as_uid(
        u,
        &[
            "/usr/bin/python3",
            "-c",
            "import ctypes,sys; sys.exit(ctypes.CDLL(None).syscall(248, b'user', b'old', b'x', 1, -4) < 0)",
        ],
    )
    .output()
    .unwrap();
    assert!(add.status.success(), "{}", text(&add));
    let shm = as_uid(u, &["ipcmk", "-M", "4096"]).output().unwrap();
    assert!(shm.status.success(), "{}", text(&shm));
    let shm_id = String::from_utf8_lossy(&shm.stdout)
        .split(':')
        .nth(1)
        .unwrap()
        .trim()
        .to_string();
    let l = verify_line(&env, "second", "no-key");
    assert!(l.contains("check=FAIL") && l.contains("keys"), "{l}");
    let l = verify_line(&env, "second", "no-ipc");
    assert!(l.contains("check=FAIL") && l.contains("shm"), "{l}");
    std::fs::remove_file(env.config.join("second.json")).unwrap();
    env.write_spec("third", &env.spec("third", u));
    let out = env.probe("third", &["/bin/true"]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        stderr(&out).contains("kernel keys owned by uid")
            && stderr(&out).contains("SysV IPC objects"),
        "{}",
        text(&out)
    );
    // Clean up what the test made on the host (the uid's two empty user
    // keyrings stay: the kernel never deletes them).
    let clear = as_uid(
        u,
        &[
            "/usr/bin/python3",
            "-c",
            "import ctypes,sys; l=ctypes.CDLL(None); sys.exit(l.syscall(250, 7, -4) != 0)",
        ],
    )
    .output()
    .unwrap();
    assert!(clear.status.success(), "{}", text(&clear));
    let rm = Command::new("ipcrm")
        .args(["-m", &shm_id])
        .output()
        .unwrap();
    assert!(rm.status.success(), "{}", text(&rm));
    let end = std::time::Instant::now() + Duration::from_secs(10);
    while leftovers::stashed_keys(u).is_some() && std::time::Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    let l = verify_line(&env, "third", "no-key");
    assert!(l.ends_with("check=ok"), "{l}");
}

/// Property 2: a VM fills its control dir (on the runtime root's file
/// system) with a 100 MiB file, directories, FIFOs, links and files moved
/// in from its state dir. All refused; only sockets can be made there, and
/// another VM starts while it keeps trying.
#[test]
fn a_vm_cannot_fill_the_runtime_root_through_its_control_dir() {
    let env = Env::new();
    env.write_spec("hog", &env.spec("hog", uid(81)));
    env.write_spec("next", &env.spec("next", uid(82)));
    let ctl = env.run.join("hog/control");
    let st = env.state.join("hog");
    let (c, s) = (ctl.display(), st.display());
    let script = format!(
        "head -c 104857600 /dev/zero > {c}/fill && echo WROTE-FILE
         mkdir {c}/d && echo MADE-DIR
         mkfifo {c}/p && echo MADE-FIFO
         ln -s / {c}/l && echo MADE-LINK
         head -c 1048576 /dev/zero > {s}/blob
         ln {s}/blob {c}/hard && echo MADE-HARDLINK
         mv {s}/blob {c}/moved && echo MOVED-IN
         python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind(\"{c}/ok.sock\")' && echo MADE-SOCKET
         echo HOG-DONE; exec sleep 600"
    );
    let mut hog = spawn_probe(&env, "hog", &script);
    hog.wait_for("HOG-DONE", Duration::from_secs(60));
    let log = hog.log_text();
    for bad in [
        "WROTE-FILE",
        "MADE-DIR",
        "MADE-FIFO",
        "MADE-LINK",
        "MADE-HARDLINK",
        "MOVED-IN",
    ] {
        assert!(!log.contains(bad), "{bad}:\n{log}");
    }
    assert!(log.contains("MADE-SOCKET"), "{log}");
    let names: Vec<_> = std::fs::read_dir(&ctl)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["ok.sock"], "control dir holds more than sockets");
    // Another VM starts while the hog runs.
    let out = env.probe("next", &["/bin/true"]);
    assert!(out.status.success(), "{}", text(&out));
    hog.kill();
    for n in ["hog", "next"] {
        let (o, rep) = env.cleanup(n);
        assert!(o.status.success(), "{rep}");
    }
}

fn raw(b: &[u8]) -> std::ffi::OsString {
    use std::os::unix::ffi::OsStringExt;
    std::ffi::OsString::from_vec(b.to_vec())
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Property 3: names that are not UTF-8 — made by the VM (a socket in its
/// control dir, files in its state dir) or found in its runtime dir — are
/// deleted (or, in the runtime root, kept) by their bytes and reported
/// losslessly, or reported as failed;
/// never reported deleted while they survive (purge did that, then
/// retired the uid).
#[test]
fn names_that_are_not_utf8_are_deleted_or_reported_never_lost() {
    use std::os::unix::ffi::OsStrExt;
    let env = Env::new();
    let u = uid(83);
    env.write_spec("web", &env.spec("web", u));
    let ctl = env.run.join("web/control");
    let sd = env.state.join("web");
    let plant = format!(
        r#"import socket, os
socket.socket(socket.AF_UNIX).bind(os.fsencode("{c}") + b"/\xff")
open(os.fsencode("{s}") + b"/\xfe", "wb").write(b"x")
os.mkdir(os.fsencode("{s}") + b"/d\xfd")
open(os.fsencode("{s}") + b"/d\xfd/\xff", "wb").write(b"y")
print("PLANTED", flush=True)
"#,
        c = ctl.display(),
        s = sd.display()
    );
    let out = env.probe("web", &["/usr/bin/python3", "-c", &plant]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("PLANTED"),
        "{}",
        text(&out)
    );
    // What a VM on a kernel without Landlock could also leave: entries
    // straight in the runtime dir.
    let rundir = env.run.join("web");
    let top = rundir.join(raw(b"\xff-top"));
    std::fs::write(&top, b"z").unwrap();
    std::fs::create_dir(rundir.join(raw(b"x\xfc"))).unwrap();
    std::fs::write(rundir.join(raw(b"x\xfc")).join(raw(b"\xfb")), b"w").unwrap();
    let (o, rep) = env.cleanup("web");
    assert!(o.status.success(), "{rep}");
    assert_eq!(rep["clean"], true);
    let deleted = rep["deleted"].to_string();
    assert!(
        deleted.contains(&hex(top.as_os_str().as_bytes())),
        "the non-UTF-8 entry is not in the report by its bytes: {rep}"
    );
    let mut left: Vec<_> = std::fs::read_dir(&rundir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    left.sort();
    assert_eq!(
        left,
        ["creds-floor.json", "instance.lock", "last-cleanup.json"],
        "survivors: {left:?}"
    );

    // An entry that cannot be deleted (a mount point) is a failure, named
    // by its exact bytes, and verify-clean shows it escaped.
    assert!(env.probe("web", &["/bin/true"]).status.success());
    let mp = rundir.join(raw(b"m\xfa"));
    std::fs::create_dir(&mp).unwrap();
    nix::mount::mount(
        Some("tmpfs"),
        &mp,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("size=64k"),
    )
    .unwrap();
    let (o, rep) = env.cleanup("web");
    let failed = rep["failed"].to_string();
    let v = env.verify_clean(&["web"]);
    let vt = String::from_utf8_lossy(&v.stdout).into_owned();
    nix::mount::umount2(&mp, nix::mount::MntFlags::MNT_DETACH).unwrap();
    assert!(!o.status.success(), "{rep}");
    assert!(failed.contains(&hex(mp.as_os_str().as_bytes())), "{rep}");
    assert!(
        vt.contains("runtime-empty vm=web check=FAIL") && vt.contains("m\\xFA"),
        "{vt}"
    );
    let (o, rep) = env.cleanup("web");
    assert!(o.status.success(), "{rep}");

    // Purge: the VM's non-UTF-8 files are deleted and the uid retired;
    // an undeletable one (immutable) is a failure and nothing is retired.
    let stuck = sd.join(raw(b"\xf9"));
    std::fs::write(&stuck, b"s").unwrap();
    assert!(Command::new("chattr")
        .arg("+i")
        .arg(&stuck)
        .status()
        .unwrap()
        .success());
    let (ok, p) = purge_on_pty(&env, &["web"], "DELETE-EVERYTHING");
    let _ = Command::new("chattr").arg("-i").arg(&stuck).status();
    assert!(!ok, "{p}");
    assert!(
        p.contains("FAILED") && p.contains("\\xF9") && p.contains("NOT RETIRED"),
        "{p}"
    );
    assert!(!p.contains("retired principal uid"), "{p}");
    let (ok, p) = purge_on_pty(&env, &["web"], "DELETE-EVERYTHING");
    assert!(ok && p.contains("retired principal uid"), "{p}");
    assert_eq!(std::fs::read_dir(&sd).unwrap().count(), 0, "{p}");

    // Reap: an unknown non-UTF-8 entry in the runtime root carries none of
    // vmwarden's marks: it is kept, and reported by its bytes.
    let odd = env.run.join(raw(b"\xf8"));
    std::fs::write(&odd, b"o").unwrap();
    let r = env.vmwarden(&["reap", "--apply", "--json"]);
    assert!(r.status.success(), "{}", text(&r));
    assert!(odd.exists());
    let v: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
    assert!(
        v["kept"]
            .to_string()
            .contains(&hex(odd.as_os_str().as_bytes())),
        "{}",
        text(&r)
    );
    std::fs::remove_file(&odd).unwrap();
}

/// A system account for the test, removed on drop.
struct Account(String);

impl Account {
    fn add(tag: &str, u: u32, shell: &str) -> Account {
        let name = format!("vmwt{}{tag}", uid(0));
        let _ = Command::new("userdel").arg(&name).output();
        let out = Command::new("useradd")
            .args(["-M", "-N", "-o", "-d", "/nonexistent", "-s", shell, "-u"])
            .arg(u.to_string())
            .arg(&name)
            .output()
            .expect("useradd (passwd package)");
        assert!(out.status.success(), "useradd {name}: {}", text(&out));
        Account(name)
    }
}

impl Drop for Account {
    fn drop(&mut self) {
        let _ = Command::new("userdel").arg(&self.0).output();
    }
}

/// Property 4: a principal is a uid no one else uses. An account with a
/// login shell, a uid two accounts share, and a uid that already runs
/// processes are refused and nothing is made; a dedicated nologin account
/// is accepted. Inside the sandbox, the hypervisor cannot ptrace or read
/// the memory of another process of its own uid (what non-dumpable would
/// prevent; execve resets that flag, so the filter denies it instead).
#[test]
fn a_principal_must_be_dedicated_to_one_vm() {
    let env = Env::new();
    let refused = |spec: serde_json::Value, want: &[&str]| {
        env.write_spec("web", &spec);
        let before = snapshot(&env, &[uid(84), uid(85), uid(86)]);
        let out = env.probe("web", &["/bin/true"]);
        assert_eq!(out.status.code(), Some(78), "{}", text(&out));
        for w in want {
            assert!(stderr(&out).contains(w), "lacks {w:?}: {}", text(&out));
        }
        assert_eq!(before, snapshot(&env, &[uid(84), uid(85), uid(86)]));
    };
    // A login shell, by uid and by name.
    let login = Account::add("l", uid(84), "/bin/bash");
    let mut s = env.spec("web", uid(84));
    refused(s.clone(), &["login shell \"/bin/bash\"", &login.0]);
    s["principal"] = json!({ "user": login.0, "gid": uid(84) });
    refused(s, &["login shell"]);
    drop(login);
    // A uid two accounts share.
    let a = Account::add("a", uid(85), "/usr/sbin/nologin");
    let b = Account::add("b", uid(85), "/usr/sbin/nologin");
    refused(
        env.spec("web", uid(85)),
        &[
            &format!("uid {} is shared by the accounts", uid(85)),
            &a.0,
            &b.0,
        ],
    );
    drop((a, b));
    // A dedicated nologin account is fine, by name.
    let ok = Account::add("o", uid(86), "/usr/sbin/nologin");
    let mut s = env.spec("web", uid(86));
    s["principal"] = json!({ "user": ok.0, "gid": uid(86) });
    env.write_spec("web", &s);
    let sibling = r#"import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
pid = os.fork()
if pid == 0:
    time.sleep(30); os._exit(0)
time.sleep(0.2)
r1 = libc.ptrace(16, pid, 0, 0)
e1 = ctypes.get_errno()
buf = ctypes.create_string_buffer(16)
class iov(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
local = iov(ctypes.cast(buf, ctypes.c_void_p), 16)
remote = iov(ctypes.cast(buf, ctypes.c_void_p), 16)
r2 = libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
e2 = ctypes.get_errno()
os.kill(pid, 9)
print("ATTACH", r1, e1, "VMREAD", r2, e2, flush=True)
"#;
    let out = env.probe("web", &["/usr/bin/python3", "-c", sibling]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("ATTACH -1 1 VMREAD -1 1"),
        "{}",
        text(&out)
    );
    env.cleanup("web");
    drop(ok);
    // A uid that already runs a process: refused when the lease is taken,
    // the process untouched, no intent record, no hypervisor.
    env.write_spec("busy", &env.spec("busy", uid(87)));
    let mut squatter = as_uid(uid(87), &["sleep", "600"]).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let out = env.probe("busy", &["/bin/true"]);
    let alive = squatter.try_wait().unwrap().is_none();
    let _ = squatter.kill();
    let _ = squatter.wait();
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        stderr(&out).contains(&format!("run as the VM's uid {}", uid(87))),
        "{}",
        text(&out)
    );
    assert!(alive, "the launch touched the other process");
    assert!(!env.run.join("busy/instance.json").exists());
}

/// Property 7: two operators' roots on one host, each with a VM called
/// "web". Reap, cleanup and verify-clean with one set of roots never see,
/// report or unmount the other set's live credential tmpfs.
#[test]
fn reap_cleanup_and_verify_with_one_set_of_roots_leave_another_alone() {
    let a = Env::new();
    let b = a.sibling();
    let secret = a.secret("a.cred", b"roots-a-secret");
    let mut sa = a.spec("web", uid(89));
    sa["credentials"] = json!([{ "name": "key", "source": { "path": secret } }]);
    a.write_spec("web", &sa);
    b.write_spec("web", &b.spec("web", uid(90)));
    let cred = a.run.join("web/credentials/key");
    let mut live = spawn_probe(
        &a,
        "web",
        &format!(
            "cat {} && echo && echo HOLDING && exec sleep 600",
            cred.display()
        ),
    );
    live.wait_for("HOLDING", Duration::from_secs(30));
    let pid = live.pid().to_string();
    let has_mount = || {
        mountinfo::read(&pid)
            .map(|ms| {
                ms.iter()
                    .any(|m| m.mount_point == a.run.join("web/credentials"))
            })
            .unwrap_or(false)
    };
    assert!(has_mount());
    // Roots B: b's web ran once and stopped.
    assert!(b.probe("web", &["/bin/true"]).status.success());
    let r = b.vmwarden(&["reap", "--apply", "--kill", "--json"]);
    assert!(r.status.success(), "{}", text(&r));
    assert!(
        !String::from_utf8_lossy(&r.stdout).contains(&a.run.display().to_string()),
        "reap with roots B reported roots A: {}",
        text(&r)
    );
    let (o, rep) = b.cleanup("web");
    assert!(o.status.success(), "{rep}");
    let v = b.verify_clean(&["web"]);
    assert!(v.status.success(), "{}", text(&v));
    let v = b.verify_clean(&[]);
    assert!(v.status.success(), "{}", text(&v));
    assert!(
        live.child.try_wait().unwrap().is_none(),
        "roots A's VM died"
    );
    assert!(has_mount(), "roots A's credential tmpfs was unmounted");
    // Its own roots do see it.
    let v = a.verify_clean(&["web"]);
    assert!(!v.status.success(), "{}", text(&v));
    live.kill();
    let (o, rep) = a.cleanup("web");
    assert!(o.status.success(), "{rep}");
}

/// Property 8: a VM writes a "hypervisor" and a "kernel" into its own
/// state dir, and a symlink elsewhere points at them. Root neither runs
/// nor trusts any of it: each spec is refused before anything executes.
#[test]
fn a_vm_cannot_get_root_to_run_or_trust_what_it_wrote() {
    let env = Env::new();
    let u = uid(88);
    env.write_spec("web", &env.spec("web", u));
    let sd = env.state.join("web");
    let s = sd.display();
    let out = env.probe(
        "web",
        &[
            "/bin/sh",
            "-c",
            &format!(
                "printf '#!/bin/sh\\ntouch {s}/ran-$(id -u)\\nexec /usr/bin/qemu-system-x86_64 \"$@\"\\n' > {s}/qemu \
                 && chmod 0755 {s}/qemu && cp {k} {s}/vmlinuz && echo WROTE",
                k = assets().kernel.display()
            ),
        ],
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("WROTE"),
        "{}",
        text(&out)
    );
    env.cleanup("web");
    let link = env.path("qemu-link");
    std::os::unix::fs::symlink(sd.join("qemu"), &link).unwrap();
    let base = env.spec("web", u);
    let cases: Vec<(&str, serde_json::Value, String)> = vec![
        (
            "hypervisor.binary",
            {
                let mut s = base.clone();
                s["hypervisor"]["binary"] = json!(sd.join("qemu"));
                s
            },
            "inside vmwarden's state or runtime root".to_string(),
        ),
        (
            "kernel",
            {
                let mut s = base.clone();
                s["kernel"] = json!(sd.join("vmlinuz"));
                s
            },
            "inside vmwarden's state or runtime root".to_string(),
        ),
        (
            "hypervisor.binary",
            {
                let mut s = base.clone();
                s["hypervisor"]["binary"] = json!(link);
                s
            },
            format!("is owned by uid {u}"),
        ),
    ];
    for (field, spec, want) in cases {
        env.write_spec("web", &spec);
        let before = snapshot(&env, &[u]);
        // The real launch, not the probe: nothing may run either way.
        let out = env.launch_cmd("web").output().unwrap();
        assert_eq!(out.status.code(), Some(78), "{}", text(&out));
        assert!(
            stderr(&out).contains(&format!("`{field}`")) && stderr(&out).contains(&want),
            "{}",
            text(&out)
        );
        assert_eq!(before, snapshot(&env, &[u]));
    }
    let ran: Vec<_> = std::fs::read_dir(&sd)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("ran-"))
        .map(|e| e.file_name())
        .collect();
    assert!(ran.is_empty(), "the VM's binary was executed: {ran:?}");
}

/// A file root makes for the test, removed on drop.
struct Planted(std::path::PathBuf);
impl Drop for Planted {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Property 9: a careless operator keeps a VM's secret in /tmp or
/// /dev/shm (root-owned, 0600, but in a directory anyone can write, where
/// names can be squatted and cleaners delete). Refused by field, nothing
/// made.
#[test]
fn a_credential_in_tmp_or_dev_shm_is_refused() {
    let env = Env::new();
    for dir in ["/tmp", "/dev/shm"] {
        let p = Planted(std::path::PathBuf::from(format!(
            "{dir}/vmwarden-test-cred-{}",
            uid(0)
        )));
        std::fs::write(&p.0, b"operator-secret").unwrap();
        std::fs::set_permissions(&p.0, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        let mut s = env.spec("web", uid(91));
        s["credentials"] = json!([{ "name": "key", "source": { "path": p.0 } }]);
        env.write_spec("web", &s);
        let before = snapshot(&env, &[uid(91)]);
        let out = env.probe("web", &["/bin/true"]);
        assert_eq!(out.status.code(), Some(78), "{}", text(&out));
        let e = stderr(&out);
        assert!(
            e.contains("`credentials[0].source.path`")
                && e.contains(&format!("{dir} has mode"))
                && e.contains("everyone can change it"),
            "{}",
            text(&out)
        );
        assert_eq!(before, snapshot(&env, &[uid(91)]));
    }
}

/// Property 10: FIFOs planted where the launcher and the tools read: the
/// spec itself (refused at once, host unchanged) and another VM's spec in
/// the config dir (every tool reads those: none may hang).
#[test]
fn a_fifo_where_the_launcher_reads_never_blocks_it() {
    let env = Env::new();
    let fifo = |p: &std::path::Path| {
        nix::unistd::mkfifo(p, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap()
    };
    fifo(&env.config.join("web.json"));
    let before = snapshot(&env, &[uid(92)]);
    let t = std::time::Instant::now();
    let mut c = env.launch_cmd("web");
    c.arg("--probe").arg("--").arg("/bin/true");
    let mut child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let end = t + Duration::from_secs(10);
    while child.try_wait().unwrap().is_none() && std::time::Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    if child.try_wait().unwrap().is_none() {
        let _ = child.kill();
        panic!("the launch blocked on a FIFO at the spec path");
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(78), "{}", text(&out));
    assert!(
        stderr(&out).contains("is a FIFO, not a regular file"),
        "{}",
        text(&out)
    );
    assert_eq!(before, snapshot(&env, &[uid(92)]));
    // Another VM's spec is a FIFO: web launches, and every tool finishes.
    std::fs::remove_file(env.config.join("web.json")).unwrap();
    env.write_spec("web", &env.spec("web", uid(92)));
    fifo(&env.config.join("other.json"));
    let out = env.probe("web", &["/bin/true"]);
    assert!(out.status.success(), "{}", text(&out));
    for args in [
        &["status"][..],
        &["reap"][..],
        &["verify-clean"][..],
        &["stop", "other", "--timeout", "2"][..],
    ] {
        assert!(
            env.vmwarden_bounded(args, Duration::from_secs(30))
                .is_some(),
            "`vmwarden {}` hung on a FIFO spec",
            args.join(" ")
        );
    }
    let (o, rep) = env.cleanup("web");
    assert!(o.status.success(), "{rep}");
}

// ---------------------------------------------------------------------------
// Hardening, round four: the properties of the fourth review that this
// file's attacks re-run (set-id programs, disk trust, share trust, the
// helpers' own namespace).

/// Set-id programs: a VM makes a copy of a binary its principal owns and
/// tries every mode-setting call (`chmod`, `fchmod`, `fchmodat`,
/// `fchmodat2`) with `S_ISUID`, `S_ISGID` or both: each is refused by the
/// launcher's own filter, a plain mode is not, and its directories are
/// mounted `nosuid` in its namespace. A set-id file that got there anyway
/// (planted here by root, as a launch before the filter could leave it)
/// makes cleanup and verify-clean fail, naming it.
#[test]
fn a_vm_cannot_leave_set_id_programs() {
    let env = Env::new();
    let u = uid(170);
    env.write_spec("setid", &env.spec("setid", u));
    let attempt = r#"import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
with open("prog", "wb") as f:
    f.write(open("/bin/true", "rb").read())
os.chmod("prog", 0o755)
fd = os.open("prog", os.O_RDONLY)
for name, nr, args in [
    ("chmod", 90, (b"prog", 0o4755)),
    ("fchmod", 91, (fd, 0o2755)),
    ("fchmodat", 268, (-100, b"prog", 0o6755, 0)),
    ("fchmodat2", 452, (-100, b"prog", 0o4755, 0)),
    ("plain", 268, (-100, b"prog", 0o700, 0)),
    # Made set-id as they are created (O_CREAT is 0o100, O_TMPFILE
    # 0o20200000, O_RDWR 2, S_IFREG 0o100000).
    ("open", 2, (b"c-open", 0o102, 0o4755)),
    ("openat", 257, (-100, b"c-openat", 0o102, 0o2755)),
    ("creat", 85, (b"c-creat", 0o6755)),
    ("mknod", 133, (b"c-mknod", 0o104755, 0)),
    ("mknodat", 259, (-100, b"c-mknodat", 0o102755, 0)),
    ("tmpfile", 257, (-100, b".", 0o20200002, 0o4755)),
]:
    ctypes.set_errno(0)
    r = libc.syscall(nr, *args)
    print(name, r, ctypes.get_errno(), flush=True)
# openat2 (how: flags O_CREAT|O_RDWR, mode 04755): its mode is in memory,
# so it is not available at all (ENOSYS).
how = (ctypes.c_uint64 * 3)(0o102, 0o4755, 0)
ctypes.set_errno(0)
r = libc.syscall(437, -100, b"c-openat2", ctypes.byref(how), 24)
print("openat2", r, ctypes.get_errno(), flush=True)
print("SETID", sorted(n for n in os.listdir(".") if os.lstat(n).st_mode & 0o6000), flush=True)
print("MODE", oct(os.stat("prog").st_mode & 0o7777), flush=True)
cwd = os.getcwd()
opts = [l.split()[5] for l in open("/proc/self/mountinfo") if l.split()[4] == cwd]
print("OPTS", opts[-1] if opts else "none", flush=True)
"#;
    let out = env.probe("setid", &["/usr/bin/python3", "-c", attempt]);
    let o = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{}", text(&out));
    for call in [
        "chmod",
        "fchmod",
        "fchmodat",
        "fchmodat2",
        "open",
        "openat",
        "creat",
        "mknod",
        "mknodat",
        "tmpfile",
    ] {
        assert!(
            o.lines().any(|l| l == format!("{call} -1 1")),
            "{call} with a set-id mode was not refused (EPERM): {o}"
        );
    }
    assert!(o.lines().any(|l| l == "openat2 -1 38"), "{o}");
    assert!(o.lines().any(|l| l == "SETID []"), "{o}");
    assert!(o.lines().any(|l| l == "plain 0 0"), "{o}");
    assert!(o.lines().any(|l| l == "MODE 0o700"), "{o}");
    let opts = o
        .lines()
        .find_map(|l| l.strip_prefix("OPTS "))
        .unwrap_or_default();
    assert!(
        opts.split(',').any(|x| x == "nosuid") && opts.split(',').any(|x| x == "nodev"),
        "the state dir is not mounted nosuid,nodev in the VM's namespace: {opts}"
    );
    let sd = env.state.join("setid");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(sd.join("prog")).unwrap().permissions(),
    );
    assert_eq!(mode & 0o7777, 0o700, "{mode:o}");
    env.assert_clean("setid");

    // What got there anyway: a setuid and a setgid copy, one level down.
    std::fs::create_dir(sd.join("deep")).unwrap();
    for (name, m) in [("suid", 0o4755), ("deep/sgid", 0o2755)] {
        let p = sd.join(name);
        std::fs::copy("/bin/true", &p).unwrap();
        std::os::unix::fs::chown(&p, Some(u), Some(u)).unwrap();
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(m)).unwrap();
    }
    std::os::unix::fs::chown(sd.join("deep"), Some(u), Some(u)).unwrap();
    let (c, rep) = env.cleanup("setid");
    assert!(!c.status.success(), "{rep}");
    assert_eq!(rep["clean"], json!(false), "{rep}");
    let failed = rep["failed"].to_string();
    for (name, what) in [("suid", "set-user-ID"), ("deep/sgid", "set-group-ID")] {
        assert!(
            failed.contains(&format!("{}", sd.join(name).display())) && failed.contains(what),
            "{name} not reported: {rep}"
        );
    }
    let l = verify_line(&env, "setid", "no-setid-file");
    assert!(
        l.contains("check=FAIL") && l.contains("suid") && l.contains("deep/sgid"),
        "{l}"
    );
    std::fs::remove_file(sd.join("suid")).unwrap();
    std::fs::remove_file(sd.join("deep/sgid")).unwrap();
    let l = verify_line(&env, "setid", "no-setid-file");
    assert!(l.ends_with("check=ok"), "{l}");
    env.assert_clean("setid");
}

/// Disk images: an image owned by another user in `/dev/shm` was attached.
/// `disks[].path` is walked like every path root hands over, trusting the
/// principal too: the world-writable directory and the foreign owner are
/// each refused by the field's name, with the host left as it was; the
/// principal's own image beside them is attached.
#[test]
fn a_disk_image_is_trusted_like_everything_else_a_vm_is_given() {
    let env = Env::new();
    let (u, other) = (uid(171), uid(172));
    let shm = Planted(std::path::PathBuf::from(format!(
        "/dev/shm/vmwarden-test-disk-{u}.img"
    )));
    let mine = env.path("mine.img");
    let theirs = env.path("theirs.img");
    for (p, owner) in [(&shm.0, other), (&mine, u), (&theirs, other)] {
        std::fs::write(p, vec![0u8; 1 << 20]).unwrap();
        std::os::unix::fs::chown(p, Some(owner), Some(owner)).unwrap();
        std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    }
    for (img, want) in [
        (&shm.0, "/dev/shm has mode 1777: its group and everyone can change it".to_string()),
        (
            &theirs,
            format!("theirs.img is owned by uid {other}; only what root or the VM's principal (uid {u})"),
        ),
    ] {
        let mut s = env.spec("disk", u);
        s["disks"] = json!([{ "path": img, "serial": "d" }]);
        env.write_spec("disk", &s);
        let before = snapshot(&env, &[u, other]);
        let out = env.probe("disk", &["/bin/true"]);
        assert_eq!(out.status.code(), Some(78), "{}", text(&out));
        let e = stderr(&out);
        assert!(
            e.contains("`disks[0].path`") && e.contains(&want),
            "{}",
            text(&out)
        );
        assert_eq!(before, snapshot(&env, &[u, other]));
    }
    let mut s = env.spec("disk", u);
    s["disks"] = json!([{ "path": mine, "serial": "d" }]);
    env.write_spec("disk", &s);
    let out = env.probe("disk", &["/bin/true"]);
    assert!(out.status.success(), "{}", text(&out));
    env.assert_clean("disk");
}

/// One trust walk, ACLs included: a share owned by the principal, mode
/// 0700, that a POSIX ACL lets another user write was accepted. Now it is
/// refused by the field's name; the same ACL entry for the principal's own
/// uid is no writer beyond it, and the share is accepted.
#[test]
fn one_trust_walk_refuses_a_share_writable_through_an_acl() {
    let env = Env::new();
    let (u, other) = (uid(173), uid(174));
    let share = env.path("share");
    std::fs::create_dir(&share).unwrap();
    std::os::unix::fs::chown(&share, Some(u), Some(u)).unwrap();
    std::fs::set_permissions(&share, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let setfacl = |entry: String| {
        let out = Command::new("setfacl")
            .args(["-m", &entry])
            .arg(&share)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
    };
    setfacl(format!("u:{other}:rwx"));
    let mut s = env.spec("acl", u);
    s["shares"] = json!([{ "tag": "data", "source": share, "proto": "9p", "read_only": false }]);
    env.write_spec("acl", &s);
    let before = snapshot(&env, &[u, other]);
    let out = env.probe("acl", &["/bin/true"]);
    assert_eq!(out.status.code(), Some(78), "{}", text(&out));
    let e = stderr(&out);
    assert!(
        e.contains("`shares[0].source`")
            && e.contains(&format!(
                "has a POSIX ACL that lets user uid {other} change it"
            )),
        "{}",
        text(&out)
    );
    assert_eq!(before, snapshot(&env, &[u, other]));
    let out = Command::new("setfacl")
        .args(["-x", &format!("u:{other}")])
        .arg(&share)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    setfacl(format!("u:{u}:rwx"));
    let out = env.probe("acl", &["/bin/true"]);
    assert!(out.status.success(), "{}", text(&out));
    env.assert_clean("acl");
}

// ---------------------------------------------------------------------------
// Hardening, round five (adopt, the roots, the terminal, the own unit): one
// regression test per property, each re-running the attack against the
// real binaries.

/// Owner, mode, inode and contents of every path below `p` (not following
/// links): what must not change when a tool refuses.
fn tree_of(p: &std::path::Path) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    fn go(p: &std::path::Path, out: &mut Vec<String>) {
        let Ok(md) = std::fs::symlink_metadata(p) else {
            return;
        };
        let body = if md.is_file() {
            String::from_utf8_lossy(&std::fs::read(p).unwrap()).into_owned()
        } else {
            String::new()
        };
        out.push(format!(
            "{} {:o} {}:{} ino={} {body:?}",
            p.display(),
            md.mode(),
            md.uid(),
            md.gid(),
            md.ino()
        ));
        if md.is_dir() {
            let mut names: Vec<_> = std::fs::read_dir(p)
                .unwrap()
                .flatten()
                .map(|e| e.path())
                .collect();
            names.sort();
            for n in names {
                go(&n, out);
            }
        }
    }
    go(p, &mut out);
    out
}

/// vmwarden never takes over a directory it does not own. A world-writable
/// sticky directory (what `/tmp`, `/var/tmp` and `/dev/shm` are) holding
/// other users' files, given as the runtime or the state root, was made
/// root's 0755 by the launch, and `reap --apply` then deleted those files.
/// Every binary that takes the roots now refuses it before it reads or
/// changes anything, naming the directory, why and what to do. And in
/// vmwarden's own runtime root, reap deletes only runtime dirs that carry
/// vmwarden's marks (root's, holding its lease file and intent record);
/// everything else is kept and reported with the reason.
#[test]
fn vmwarden_never_takes_over_a_directory_it_does_not_own() {
    use std::os::unix::fs::{chown, PermissionsExt};
    let env = Env::new();
    let (u, other) = (uid(301), uid(302));
    env.write_spec("web", &env.spec("web", u));
    // A directory like /tmp, with other users' files in it: a file, and a
    // directory named like a VM holding files named like vmwarden's.
    let shared = env.path("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    std::fs::write(shared.join("notes"), b"another user's notes").unwrap();
    std::fs::create_dir(shared.join("db")).unwrap();
    for f in ["instance.lock", "instance.json", "thesis.tex"] {
        std::fs::write(shared.join("db").join(f), b"another user's work").unwrap();
        chown(shared.join("db").join(f), Some(other), Some(other)).unwrap();
    }
    chown(shared.join("notes"), Some(other), Some(other)).unwrap();
    chown(shared.join("db"), Some(other), Some(other)).unwrap();
    let before = tree_of(&shared);

    let from = env.path("from");
    std::fs::create_dir(&from).unwrap();
    for flag in ["--runtime-root", "--state-root"] {
        let roots = |c: &mut Command| {
            c.arg("--config-dir").arg(&env.config);
            for (f, p) in [("--runtime-root", &env.run), ("--state-root", &env.state)] {
                c.arg(f).arg(if f == flag { &shared } else { p });
            }
            c.stdin(Stdio::null());
        };
        let mut runs: Vec<(String, Command, i32)> = Vec::new();
        let mut launch = Command::new(LAUNCH);
        launch.arg("web");
        roots(&mut launch);
        launch.args(["--probe", "--", "/bin/true"]);
        runs.push(("vmwarden-launch web".into(), launch, 78));
        let mut cleanup = Command::new(CLEANUP);
        cleanup.arg("web");
        roots(&mut cleanup);
        runs.push(("vmwarden-cleanup web".into(), cleanup, 1));
        for args in [
            &["reap", "--apply", "--kill"][..],
            &["reap"],
            &["status", "--all"],
            &["status", "web"],
            &["stop", "web", "--timeout", "1"],
            &["wait-ready", "web", "--timeout", "1"],
            &["purge", "web"],
            &["verify-clean", "web"],
            &["adopt", "web", "--from", from.to_str().unwrap(), "--apply"],
        ] {
            let mut c = Command::new(VMWARDEN);
            roots(&mut c);
            c.args(args);
            runs.push((format!("vmwarden {}", args.join(" ")), c, 1));
        }
        for (what, mut c, code) in runs {
            let o = c.output().unwrap();
            assert_eq!(
                tree_of(&shared),
                before,
                "`{what}` with {flag} {} changed it (another user's files and the directory's mode 1777 must stay): {}",
                shared.display(),
                text(&o)
            );
            assert_eq!(
                o.status.code(),
                Some(code),
                "`{what}` with {flag}: {}",
                text(&o)
            );
            let e = stderr(&o);
            for want in [
                &shared.display().to_string()[..],
                flag,
                "world-writable and sticky, like /tmp",
                "never takes over a directory it does not own",
                "install -d -m 0755 -o root -g root",
            ] {
                assert!(
                    e.contains(want),
                    "`{what}` with {flag}: lacks {want:?}: {}",
                    text(&o)
                );
            }
            assert!(!env.run.join("web").exists() && !env.state.join("web").exists());
        }
        eprintln!("{flag} {}: every binary refused it", shared.display());
    }

    // vmwarden's own runtime root: reap deletes only what carries its marks.
    assert!(env.probe("web", &["/bin/true"]).status.success());
    env.write_spec("gone", &env.spec("gone", uid(303)));
    assert!(env.probe("gone", &["/bin/true"]).status.success());
    std::fs::remove_file(env.config.join("gone.json")).unwrap();
    let plant = |name: &str, owner: u32, mode: u32, files: &[(&str, u32)]| {
        let d = env.run.join(name);
        std::fs::create_dir(&d).unwrap();
        for (f, o) in files {
            std::fs::write(d.join(f), b"someone's").unwrap();
            chown(d.join(f), Some(*o), Some(*o)).unwrap();
        }
        chown(&d, Some(owner), Some(owner)).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    plant(
        "db",
        other,
        0o755,
        &[("instance.lock", other), ("data", other)],
    );
    plant("cache", 0, 0o755, &[("data", 0)]);
    plant("half", 0, 0o755, &[("instance.lock", 0), ("data", 0)]);
    plant(
        "forged",
        0,
        0o755,
        &[("instance.lock", other), ("instance.json", 0)],
    );
    plant(
        "open",
        0,
        0o777,
        &[("instance.lock", 0), ("instance.json", 0)],
    );
    std::fs::write(env.run.join("notes.txt"), b"someone's").unwrap();
    let planted = ["db", "cache", "half", "forged", "open", "notes.txt"];
    let snap = |n: &str| tree_of(&env.run.join(n));
    let before: Vec<_> = planted.iter().map(|n| snap(n)).collect();
    let o = env.vmwarden(&["reap", "--apply", "--json"]);
    let after: Vec<_> = planted.iter().map(|n| snap(n)).collect();
    assert_eq!(
        before,
        after,
        "reap --apply deleted what does not carry vmwarden's marks: {}",
        text(&o)
    );
    assert!(o.status.success(), "{}", text(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let kept = r["kept"].as_array().unwrap();
    for (n, why) in [
        ("db", format!("is owned by uid {other}, not root")),
        (
            "cache",
            "holds files but no lease file instance.lock".into(),
        ),
        ("half", "no intent record instance.json".into()),
        ("forged", "its instance.lock is owned by uid".into()),
        ("open", "has mode 0777: others may write in it".into()),
        ("notes.txt", "not a VM's runtime dir".into()),
    ] {
        let path = env.run.join(n).display().to_string();
        let k = kept
            .iter()
            .find(|k| k["path"] == json!(path))
            .unwrap_or_else(|| panic!("{n} is not reported kept: {r:#}"));
        let reason = k["reason"].as_str().unwrap();
        assert!(
            reason.contains("not vmwarden's") && reason.contains(&why),
            "{n}: {reason}"
        );
    }
    // What carries the marks is reaped as before: the unconfigured VM's
    // runtime dir goes, the configured one's leftovers go.
    assert!(!env.run.join("gone").exists(), "{r:#}");
    let mut left: Vec<_> = std::fs::read_dir(env.run.join("web"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    left.sort();
    // The keep set: the lease file, the last cleanup's record and the
    // credential floor.
    assert_eq!(
        left,
        ["creds-floor.json", "instance.lock", "last-cleanup.json"],
        "{r:#}"
    );
    for n in planted {
        let p = env.run.join(n);
        if p.is_dir() {
            std::fs::remove_dir_all(&p).unwrap();
        } else {
            std::fs::remove_file(&p).unwrap();
        }
    }
    env.assert_clean("web");
}

/// Only the VM's own unit counts as its unit. The own-unit rule took any
/// cgroup named `PREFIX@NAME.service` for the VM's unit: a VM called
/// `tty1` launched from a shell in `getty@tty1.service` (a console login
/// without pam_systemd stays in getty's cgroup) recorded getty's cgroup,
/// so `stop tty1` SIGKILLed getty with the VM, and liveness counted getty
/// as the VM. Now such a cgroup counts only when it is the unit that
/// started this launch: systemd executed the launcher itself
/// (`$SYSTEMD_EXEC_PID`) with the `$INVOCATION_ID` the cgroup carries as
/// `trusted.invocation_id`. Re-run from a shell in getty's cgroup without
/// systemd's variables, and with getty's variables inherited (as a shell
/// started under getty has them). The unit's own launch still records its
/// cgroup (liveness.rs `a_launch_records_its_units_cgroup_beside_the_units_other_processes`).
#[test]
fn only_the_vms_own_unit_counts_as_its_unit() {
    use common::cgroup::TestCgroup;
    let env = Env::new();
    let u = uid(304);
    env.write_spec("tty1", &env.spec("tty1", u));
    let id = "6b1f2a9c0d3e4f5a8b7c6d5e4f3a2b1c";
    let getty = TestCgroup::unit(
        &format!("getty-vmwt{}@tty1.service", std::process::id()),
        id,
    );
    // agetty: the process systemd executed for getty@tty1.
    let mut agetty = Command::new("/bin/sleep");
    agetty.arg("600");
    let mut agetty = getty
        .as_unit_process(&agetty, id)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let agetty_pid = agetty.id();
    let agetty_pid_s = agetty_pid.to_string();
    for (how, vars) in [
        ("from a shell in getty's cgroup", vec![]),
        (
            "with getty's $INVOCATION_ID and $SYSTEMD_EXEC_PID inherited",
            vec![
                ("INVOCATION_ID", id),
                ("SYSTEMD_EXEC_PID", agetty_pid_s.as_str()),
            ],
        ),
    ] {
        let mut c = env.launch_cmd("tty1");
        c.args([
            "--probe",
            "--",
            "/bin/sh",
            "-c",
            "echo STARTED; exec sleep 600",
        ])
        .env_remove("INVOCATION_ID")
        .env_remove("SYSTEMD_EXEC_PID");
        for (k, v) in vars {
            c.env(k, v);
        }
        getty.enter(&mut c);
        let mut g = spawn_logged(c, env.path("tty1.log"));
        g.wait_for("STARTED", Duration::from_secs(30));
        let d = dirs::open_dir(&env.run.join("tty1")).unwrap();
        let rec = Intent::read(&d).unwrap().expect("an intent record").cgroup;
        let stop = env.vmwarden(&["stop", "tty1", "--timeout", "1"]);
        let alive = agetty.try_wait().unwrap().is_none();
        assert!(
            alive && getty.procs().contains(&agetty_pid),
            "launched {how}: `vmwarden stop tty1` killed getty ({agetty_pid}); the launch recorded the cgroup {rec:?}: {}",
            text(&stop)
        );
        assert!(
            rec.is_none(),
            "launched {how}: the launch took getty's cgroup for the VM's unit: {rec:?}"
        );
        assert!(
            stop.status.success() && String::from_utf8_lossy(&stop.stdout).contains("stopped by"),
            "{}",
            text(&stop)
        );
        assert!(
            g.wait_exit(Duration::from_secs(10)).is_some(),
            "the VM survived stop"
        );
        env.assert_clean("tty1");
        assert!(agetty.try_wait().unwrap().is_none(), "cleanup killed getty");
        eprintln!("launched {how}: no cgroup recorded; stop and cleanup left getty ({agetty_pid}) running");
    }
    let _ = agetty.kill();
    let _ = agetty.wait();
}
