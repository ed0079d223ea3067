//! A compromised VM controls its hypervisor, and with it the other end of
//! the control socket root's tools talk to. Here a fake hypervisor — a
//! real unix-socket server, run as the VM's principal inside its sandbox
//! (`vmwarden-launch --probe`), exactly where a compromised QEMU would sit —
//! answers never, one byte at a time, with 100 MiB, with bytes that are
//! not UTF-8, with a stream of tiny events, or with terminal escapes. The
//! real `status`, `wait-ready` and `stop` must finish within their
//! documented time (docs/operating.md, "Time and size limits"), say what
//! happened, stay small, and print nothing raw. One test per property,
//! each re-running the attack; each fails if its defence is reverted.
//! Needs root.

mod common;

use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;

/// The fake hypervisor. `MODE` picks the attack; every connection gets it,
/// each in its own thread, so a tool's retries meet the same answer.
const SERVER: &str = r#"
import socket, sys, threading, time
mode, path = sys.argv[1], sys.argv[2]
G = b'{"QMP": {"version": {"qemu": {"micro": 0, "minor": 2, "major": 8}, "package": ""}, "capabilities": []}}\r\n'
MiB = 1 << 20
def drain(c):
    while c.recv(4096):
        pass
def serve(c):
    try:
        if mode == "silent":
            drain(c)
        elif mode == "drip":
            # A greeting that never ends, one byte per 0.9 s.
            for b in b'{"QMP": {"version": ':
                c.sendall(bytes([b])); time.sleep(0.9)
            while True:
                c.sendall(b" "); time.sleep(0.9)
        elif mode == "huge":
            # 100 MiB of well-formed events of 60 KiB each.
            ev = b'{"event": "PAD", "data": {"pad": "' + b"x" * 61000 + b'"}}\r\n'
            c.sendall(G)
            sent = 0
            while sent < 100 * MiB:
                c.sendall(ev); sent += len(ev)
            drain(c)
        elif mode == "endless":
            # 100 MiB without a line break.
            c.sendall(b'{"QMP": "')
            for _ in range(100 * 16):
                c.sendall(b"x" * 65536)
            drain(c)
        elif mode == "utf8":
            c.sendall(b'{"QMP": {"version": "\xff\xfe\xc0\xaf"}}\r\n')
            drain(c)
        elif mode == "flood":
            c.sendall(G)
            ev = b'{"event":"X"}\r\n' * 4096
            while True:
                c.sendall(ev)
        elif mode == "escapes":
            # A well-behaved QMP server whose run state is a terminal
            # escape: clear the line, return, "stopped", bell.
            c.sendall(G)
            f = c.makefile("rb")
            for line in f:
                if b"query-status" in line:
                    c.sendall(b'{"return": {"status": "\\u001b[2K\\rstopped\\u0007\\u009b31m", "running": true}}\r\n')
                else:
                    c.sendall(b'{"return": {}}\r\n')
    except Exception:
        pass
    finally:
        c.close()
s = socket.socket(socket.AF_UNIX)
s.bind(path)
s.listen(64)
print("LISTENING", flush=True)
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;

/// Start VM `name` as a probe whose "hypervisor" is [`SERVER`] in `mode`
/// on the VM's QMP socket.
fn fake_hypervisor(env: &Env, name: &str, u: u32, mode: &str) -> Guest {
    let script = env.path(&format!("{name}-server.py"));
    std::fs::write(&script, SERVER).unwrap();
    let mut sp = env.spec(name, u);
    sp["landlock"]["read"] = json!([script]);
    env.write_spec(name, &sp);
    let sock = env.run.join(format!("{name}/control/qmp.sock"));
    let log = env.path(&format!("{name}.serial.log"));
    let mut c = env.launch_cmd(name);
    c.arg("--probe").arg("--").args([
        "/usr/bin/python3",
        &script.display().to_string(),
        mode,
        &sock.display().to_string(),
    ]);
    let mut g = spawn_logged(c, log);
    g.wait_for("LISTENING", Duration::from_secs(30));
    g
}

/// One run of a real binary: its output, how long it took and its peak
/// resident memory (`wait4`'s rusage, the kernel's own count).
struct Measured {
    status: ExitStatus,
    stdout: String,
    stderr: String,
    raw: Vec<u8>,
    took: Duration,
    max_rss_kib: i64,
    /// The test process's own peak at the spawn: a child's ru_maxrss is at
    /// least that (exec records the old address space's peak).
    parent_hwm_kib: i64,
}

impl Measured {
    fn text(&self) -> String {
        format!(
            "exit {:?} after {:?}, peak RSS {} KiB (the test's own at the spawn: {} KiB)\nstdout:\n{}\nstderr:\n{}",
            self.status.code(),
            self.took,
            self.max_rss_kib,
            self.parent_hwm_kib,
            self.stdout,
            self.stderr
        )
    }
}

/// Run `vmwarden ARGS…`, killed at `limit` (then `None`: it hung).
#[expect(
    clippy::zombie_processes,
    reason = "the child is reaped by wait4, which also gives its rusage"
)]
fn measured(env: &Env, args: &[&str], limit: Duration) -> Option<Measured> {
    let parent_hwm_kib = proc_status(std::process::id(), "VmHWM")
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    let mut child = env
        .vmwarden_cmd()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = libc::pid_t::try_from(child.id()).unwrap();
    let pipe = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            v
        })
    };
    let out = pipe(Box::new(child.stdout.take().unwrap()));
    let err = pipe(Box::new(child.stderr.take().unwrap()));
    let start = Instant::now();
    loop {
        let mut status = 0;
        // SAFETY: an all-zero rusage is a valid value; wait4 fills it.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `pid` is our child, not yet reaped; both out-pointers
        // point at live locals.
        let r = unsafe { libc::wait4(pid, &raw mut status, libc::WNOHANG, &raw mut ru) };
        if r == pid {
            let raw = out.join().unwrap();
            return Some(Measured {
                status: ExitStatus::from_raw(status),
                stdout: String::from_utf8_lossy(&raw).into_owned(),
                stderr: String::from_utf8_lossy(&err.join().unwrap()).into_owned(),
                raw,
                took: start.elapsed(),
                max_rss_kib: ru.ru_maxrss,
                parent_hwm_kib,
            });
        }
        assert_eq!(r, 0, "wait4: {}", std::io::Error::last_os_error());
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Far above what the tools need (a few MiB) and far below what keeping a
/// VM's stream costs (GiBs within seconds).
const RSS_BOUND_KIB: i64 = 64 * 1024;

/// A generous bound derived from a documented one: twice it, plus 20 s
/// for a loaded test host. A tool held by the VM overshoots it by hours.
fn generous(documented: Duration) -> Duration {
    documented * 2 + Duration::from_secs(20)
}

// docs/operating.md, "Time and size limits".
const WAIT_READY_TIMEOUT: u64 = 3;
fn wait_ready_documented() -> Duration {
    Duration::from_secs(WAIT_READY_TIMEOUT + 5)
}
const STOP_TIMEOUT: u64 = 2;
fn stop_documented() -> Duration {
    Duration::from_secs(STOP_TIMEOUT + 25)
}
fn status_documented() -> Duration {
    Duration::from_secs(2)
}

/// `status`, `wait-ready` and `stop` against `mode`: each finishes within
/// its bound, in bounded memory, and `wait-ready` (which must fail) says
/// what happened with one of `said`. Returns the runs (status, wait-ready,
/// stop).
fn attack(env: &Env, name: &str, u: u32, mode: &str, said: &[&str]) -> [Measured; 3] {
    let mut g = fake_hypervisor(env, name, u, mode);
    let wr_timeout = WAIT_READY_TIMEOUT.to_string();
    let stop_timeout = STOP_TIMEOUT.to_string();
    let runs: [(Vec<&str>, Duration); 3] = [
        (vec!["status", name], status_documented()),
        (
            vec!["wait-ready", name, "--timeout", &wr_timeout],
            wait_ready_documented(),
        ),
        (
            vec!["stop", name, "--timeout", &stop_timeout],
            stop_documented(),
        ),
    ];
    let results = runs.map(|(args, documented)| {
        let m = measured(env, &args, generous(documented)).unwrap_or_else(|| {
            panic!(
                "`vmwarden {}` against a fake hypervisor that is {mode} did not finish within {:?} (documented {documented:?})",
                args.join(" "),
                generous(documented)
            )
        });
        assert!(
            m.max_rss_kib < RSS_BOUND_KIB,
            "`vmwarden {}` against {mode}: peak RSS {} KiB\n{}",
            args.join(" "),
            m.max_rss_kib,
            m.text()
        );
        m
    });
    let [status, wait_ready, stop] = &results;
    assert!(
        status.status.success() && status.stdout.contains("no-answer"),
        "status against {mode} should show a VM that does not answer\n{}",
        status.text()
    );
    assert!(
        !wait_ready.status.success() && said.iter().any(|s| wait_ready.stderr.contains(s)),
        "wait-ready against {mode} should fail saying one of {said:?}\n{}",
        wait_ready.text()
    );
    assert!(
        stop.status.success() && stop.stdout.contains("stopped by"),
        "stop against {mode}\n{}",
        stop.text()
    );
    eprintln!(
        "{mode}: status {:?} {} KiB, wait-ready {:?} {} KiB, stop {:?} {} KiB (the test itself: {} KiB)",
        status.took,
        status.max_rss_kib,
        wait_ready.took,
        wait_ready.max_rss_kib,
        stop.took,
        stop.max_rss_kib,
        stop.parent_hwm_kib
    );
    g.kill();
    let (o, rep) = env.cleanup(name);
    assert!(o.status.success(), "{rep}");
    results
}

/// A VM cannot exhaust root's memory through its control socket: a stream
/// of tiny QMP events (each parsed and kept, it took `wait-ready` to 3 GiB)
/// and 100 MiB of large ones end the connection at its message and byte
/// bounds, and only the event waited for is kept.
#[test]
fn a_vm_cannot_exhaust_roots_memory_through_its_control_socket() {
    let env = Env::new();
    attack(
        &env,
        "flood",
        uid(210),
        "flood",
        &["more than 256 messages"],
    );
    attack(&env, "huge", uid(211), "huge", &["more than 1048576 bytes"]);
}

/// A VM cannot hold root's tools past their deadline: a greeting dripped
/// one byte per 0.9 s (each read within its timeout) held `status`, `stop`
/// and `wait-ready` for hours. The overall deadline is checked before
/// every read.
#[test]
fn a_vm_cannot_hold_roots_tools_past_their_deadline() {
    let env = Env::new();
    attack(&env, "drip", uid(212), "drip", &["timed out"]);
}

/// Root never hangs on a VM: a hypervisor that accepts and never answers,
/// answers 100 MiB without a line break, or answers bytes that are not
/// UTF-8 costs each tool its documented time at most, and the tool says
/// which it was.
#[test]
fn root_never_hangs_on_a_vm() {
    let env = Env::new();
    attack(&env, "silent", uid(213), "silent", &["timed out"]);
    attack(
        &env,
        "endless",
        uid(214),
        "endless",
        &["longer than 65536 bytes"],
    );
    attack(&env, "utf8", uid(215), "utf8", &["not UTF-8"]);
}

/// Control characters (C0, DEL, C1) in `b`.
fn raw_controls(b: &[u8]) -> Vec<char> {
    String::from_utf8_lossy(b)
        .chars()
        .filter(|c| c.is_control() && *c != '\n')
        .collect()
}

/// Nothing reaches root's terminal raw, adopt included. Every subcommand's
/// text output — `status` (table, `--json`, `--all`), `wait-ready`,
/// `stop`, `reap`, `purge`, `adopt` (plan and `--json`), `verify-clean`,
/// and cleanup's report (JSON on stdout, failures on stderr) — is fed
/// control characters (ESC, OSC, CR, BEL, a C1 CSI) through what a VM or
/// a state dir's old owner controls: its hypervisor's QMP run state (a VM
/// made its row read "stopped"), file names in its state, runtime and
/// control dirs, the names in microvm.nix's state dir that `adopt` lists
/// (they reached the terminal raw); and through the roots themselves,
/// whose path every report names (a directory named with escapes). Each
/// must show them escaped, on stdout and on stderr (logs included), and
/// show that it got some.
#[test]
fn nothing_reaches_roots_terminal_raw_adopt_included() {
    require_fault_injection();
    let base = Env::new();
    let mut env = base.sibling();
    // The roots under a directory named with escapes (OSC title, CR, C1).
    let weird = env.path("r\x1b]0;x\x07\r\u{9b}");
    std::fs::create_dir(&weird).unwrap();
    std::fs::set_permissions(&weird, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let config = weird.join("config");
    std::fs::rename(&env.config, &config).unwrap();
    env.config = config;
    env.run = weird.join("run");
    env.state = weird.join("state");
    let u = uid(216);
    let limit = generous(wait_ready_documented());
    // Each run: nothing raw on stdout or stderr, and escapes were shown.
    let check = |what: &str, m: &Measured| {
        assert_eq!(
            raw_controls(&m.raw),
            Vec::<char>::new(),
            "{what}: stdout\n{}",
            m.text()
        );
        assert_eq!(
            raw_controls(m.stderr.as_bytes()),
            Vec::<char>::new(),
            "{what}: stderr\n{}",
            m.text()
        );
        let all = format!("{}{}", m.stdout, m.stderr);
        assert!(
            ["\\x1b", "\\u001b", "\\x0d", "\\u{9b}", "\\u009b"]
                .iter()
                .any(|e| all.contains(e)),
            "{what}: no control character was fed through\n{}",
            m.text()
        );
    };
    let run = |args: &[&str]| {
        let m = measured(&env, args, limit)
            .unwrap_or_else(|| panic!("`vmwarden {}` did not finish", args.join(" ")));
        check(&format!("vmwarden {}", args.join(" ")), &m);
        m
    };

    // The VM's hypervisor answers a run state of escapes; the VM names a
    // file in its control dir with them.
    let mut g = fake_hypervisor(&env, "esc", u, "escapes");
    std::fs::write(env.run.join("esc/control/\x1b]0;owned\x07"), b"x").unwrap();
    // The table's CONTROL column is lower case.
    for (args, shown) in [
        (
            &["status", "esc"][..],
            "\\x1b[2k\\x0dstopped\\x07\\u{9b}31m",
        ),
        (
            &["wait-ready", "esc", "--timeout", "3"],
            "\\x1b[2K\\x0dstopped\\x07\\u{9b}31m",
        ),
        (
            &["status", "esc", "--json"],
            "\\u001b[2K\\rstopped\\u0007\\u009b31m",
        ),
    ] {
        let m = run(args);
        assert!(m.status.success(), "{}", m.text());
        assert!(
            m.stdout.contains(shown),
            "`vmwarden {}` does not show the escaped state\n{}",
            args.join(" "),
            m.text()
        );
    }
    let stop = run(&["stop", "esc", "--timeout", "2"]);
    assert!(stop.status.success(), "{}", stop.text());
    g.kill();

    // cleanup's report: JSON on stdout; a deletion that did not happen
    // (fault injection) is a failure line on stderr naming it.
    let mut cleanup = env.cleanup_cmd();
    cleanup
        .arg("esc")
        .env("VMWARDEN_TEST_SKIP_DELETE", "control");
    let check_cleanup = |c: &mut Command, ok: bool| {
        let o = c.output().unwrap();
        let m = Measured {
            status: o.status,
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
            raw: o.stdout.clone(),
            took: Duration::ZERO,
            max_rss_kib: 0,
            parent_hwm_kib: 0,
        };
        check("vmwarden-cleanup esc", &m);
        assert_eq!(o.status.success(), ok, "{}", m.text());
        serde_json::from_slice::<serde_json::Value>(&o.stdout)
            .unwrap_or_else(|e| panic!("cleanup's report is not JSON ({e}): {}", m.text()));
    };
    check_cleanup(&mut cleanup, false);
    // verify-clean names what is left (the control dir), escaped.
    let v = run(&["verify-clean", "esc"]);
    assert!(!v.status.success(), "{}", v.text());
    let v = run(&["verify-clean", "esc", "--json"]);
    assert!(!v.status.success(), "{}", v.text());
    let mut cleanup = env.cleanup_cmd();
    cleanup.arg("esc");
    check_cleanup(&mut cleanup, true);

    // reap lists (and keeps) an entry of the runtime root without
    // vmwarden's marks, named with escapes.
    std::fs::write(env.run.join("a\rb\x1b[8m"), b"x").unwrap();
    for args in [&["reap"][..], &["reap", "--apply"], &["reap", "--json"]] {
        let m = run(args);
        assert!(m.status.success(), "{}", m.text());
        assert!(
            m.stdout.contains("a\\x0db\\x1b[8m") || m.stdout.contains("a\\rb\\u001b[8m"),
            "{}",
            m.text()
        );
    }

    // The VM's state dir holds names with escapes; the VM is no longer
    // configured, so `status --all` describes what it left and `purge`
    // prints its plan (and, without a terminal, stops there).
    let sd = env.state.join("esc");
    for n in ["\x1b]0;owned\x07", "a\rb", "c\x1b[8md"] {
        std::fs::write(sd.join(n), b"x").unwrap();
    }
    std::fs::rename(env.config.join("esc.json"), env.path("esc.json")).unwrap();
    let all = run(&["status", "--all"]);
    assert!(all.stdout.contains("\\x1b]0;owned\\x07"), "{}", all.text());
    let purge = run(&["purge", "esc"]);
    assert!(!purge.status.success(), "{}", purge.text());
    assert!(
        purge.stdout.contains("a\\x0db") && purge.stdout.contains("c\\x1b[8md"),
        "{}",
        purge.text()
    );

    // adopt: microvm.nix's state dir (its old owner's) names files with
    // escapes; the plan lists them, in text and in JSON.
    std::fs::rename(env.path("esc.json"), env.config.join("esc.json")).unwrap();
    let mut spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(env.config.join("esc.json")).unwrap()).unwrap();
    spec["disks"] = json!([{ "path": env.state.join("esc/var.img"), "serial": "var" }]);
    env.write_spec("esc", &spec);
    let from = weird.join("microvms/esc");
    std::fs::create_dir_all(&from).unwrap();
    std::fs::write(from.join("var.img"), b"image").unwrap();
    for n in ["\x1b]0;owned\x07", "a\rb", "\u{9b}2J"] {
        std::fs::write(from.join(n), b"x").unwrap();
    }
    for n in ["\x1b]0;owned\x07", "a\rb", "c\x1b[8md"] {
        std::fs::remove_file(sd.join(n)).unwrap();
    }
    let from_s = from.to_str().unwrap();
    for args in [
        &["adopt", "esc", "--from", from_s][..],
        &["adopt", "esc", "--from", from_s, "--json"],
        &["adopt", "esc", "--from", from_s, "--apply"],
    ] {
        let m = run(args);
        assert!(m.status.success(), "{}", m.text());
        assert!(
            m.stdout.contains("\\x1b]0;owned\\x07") || m.stdout.contains("\\u001b]0;owned\\u0007"),
            "{}",
            m.text()
        );
    }
    // A refusal quotes the old owner's names escaped too.
    std::fs::remove_file(env.state.join("esc/var.img")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", from.join("var.img")).unwrap();
    let m = run(&["adopt", "esc", "--from", from_s]);
    assert!(
        !m.status.success() && m.stderr.contains("is a symlink"),
        "{}",
        m.text()
    );
}

/// `extra_args` is read the way QEMU reads it: a QMP monitor on an
/// abstract socket, its keys after the first (`id=m,backend=socket,…,
/// abstract=on`) and attached with `-mon`, passed the checks that read the
/// implied first key only. The real launcher refuses it with exit 78
/// before anything runs: no QEMU, no runtime dir, no abstract socket.
#[test]
fn extra_args_are_read_the_way_qemu_reads_them() {
    let env = Env::new();
    let u = uid(217);
    let control = env.run.join("mon/control");
    for (args, said) in [
        (
            vec![
                "-chardev".to_string(),
                format!(
                    "id=m,backend=socket,path={}/m.sock,abstract=on,server=on,wait=off",
                    control.display()
                ),
                "-mon".into(),
                "chardev=m,mode=control".into(),
            ],
            "an abstract socket is reachable",
        ),
        (
            vec![
                "-chardev".to_string(),
                format!(
                    "socket,id=m,path={}/m.sock,server=on,wait=off",
                    control.display()
                ),
                "-mon".into(),
                "chardev=m,mode=control".into(),
            ],
            "\"-mon\" is refused",
        ),
        (
            vec![
                "-qmp".to_string(),
                format!(
                    "unix:{}/q.sock,server=on,wait=off,path=/tmp/q.sock",
                    control.display()
                ),
            ],
            "\"path\" is given twice",
        ),
    ] {
        let mut sp = env.spec("mon", u);
        sp["hypervisor"]["extra_args"] = json!(args);
        env.write_spec("mon", &sp);
        let before = std::fs::read_to_string("/proc/net/unix").unwrap();
        // Bounded: a launch the checks let through runs QEMU (with the
        // monitor) until killed; that is a failure, not a hung test.
        let Some(out) = bounded(&mut env.launch_cmd("mon"), Duration::from_secs(30)) else {
            panic!("{args:?} was not refused: the launch ran QEMU (killed after 30 s)");
        };
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(78), "{args:?}: {}", text(&out));
        assert!(
            err.contains("hypervisor.extra_args") && err.contains(said),
            "{args:?}: {err}"
        );
        assert!(
            !env.run.join("mon").exists(),
            "{args:?}: a runtime dir was made"
        );
        let after = std::fs::read_to_string("/proc/net/unix").unwrap();
        assert_eq!(
            after.lines().filter(|l| l.contains("m.sock")).count(),
            before.lines().filter(|l| l.contains("m.sock")).count(),
            "{args:?}: a socket appeared"
        );
    }
}
