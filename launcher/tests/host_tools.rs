//! The host's own tools with a real TCG guest (QEMU, the shares guest of
//! tests/assets/build-guest-shares.sh, which loads `virtio_balloon`):
//! `vmwarden console` through a pseudo-terminal (type into the guest's
//! shell, read its answer, detach, the VM runs on, its serial output also
//! where the journal would have it: the launcher's stdout), `vmwarden
//! balloon` (the target set is the one the guest reports), and the
//! journal fields every launcher, cleanup and tool line carries
//! (`VMWARDEN_VM=`), read from the native-protocol datagrams the journald
//! layer writes. Needs root.

mod common;

use std::ffi::CString;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixDatagram;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

const BOOT: Duration = Duration::from_secs(180);

/// A shell on the guest's serial port: what an operator's `vmwarden
/// console` would find (a getty, in a real guest). Started a moment after
/// READY, so its banner and prompt come after the markers.
const SERIAL_SHELL: &str =
    "(sleep 1; setsid sh -c 'exec sh </dev/ttyS0 >/dev/ttyS0 2>&1') >/dev/null 2>&1 &\n";

/// `vmwarden console NAME` on a fresh pseudo-terminal: the child and the
/// master side.
fn console_on_pty(env: &Env, name: &str) -> (Child, std::fs::File) {
    let pty = nix::pty::openpty(None, None).unwrap();
    let slave: OwnedFd = pty.slave;
    let mut cmd = env.vmwarden_cmd();
    cmd.args(["console", name])
        .stdin(Stdio::from(slave.try_clone().unwrap()))
        .stdout(Stdio::from(slave.try_clone().unwrap()))
        .stderr(Stdio::from(slave));
    // SAFETY: setsid(2) is async-signal-safe; the pty becomes the
    // console's controlling terminal, as an operator's would be.
    unsafe {
        cmd.pre_exec(|| {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            Ok(())
        });
    }
    let child = cmd.spawn().unwrap();
    (child, std::fs::File::from(pty.master))
}

/// Read the pty master until `want` appears (or panic after `limit`).
fn read_until(master: &mut std::fs::File, seen: &mut String, want: &str, limit: Duration) {
    let end = Instant::now() + limit;
    let fd = master.as_raw_fd();
    while !seen.contains(want) {
        assert!(
            Instant::now() < end,
            "no {want:?} on the console within {limit:?}; it showed:\n{seen}"
        );
        // SAFETY: `fd` is the open pty master, borrowed for this poll.
        let b = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        let mut fds = [nix::poll::PollFd::new(b, nix::poll::PollFlags::POLLIN)];
        if nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(200u16)).unwrap_or(0) == 0 {
            continue;
        }
        let mut buf = [0u8; 4096];
        match master.read(&mut buf) {
            Ok(0) | Err(_) => {
                panic!("the console's terminal closed before {want:?}; it showed:\n{seen}")
            }
            Ok(n) => seen.push_str(&String::from_utf8_lossy(&buf[..n])),
        }
    }
}

/// `MemTotal` (kB) as the guest's shell prints it, through the console.
fn guest_memtotal_kb(master: &mut std::fs::File, tag: &str) -> u64 {
    let mut seen = String::new();
    write!(master, "grep MemTotal /proc/meminfo | sed s/^/{tag}-/\r").unwrap();
    let want = format!("{tag}-MemTotal:");
    read_until(master, &mut seen, &want, Duration::from_secs(30));
    read_until(master, &mut seen, " kB", Duration::from_secs(10));
    let at = seen.rfind(&want).unwrap();
    let rest = &seen[at + want.len()..];
    rest.split("kB")
        .next()
        .unwrap()
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{seen}"))
}

/// Press Enter until the guest's serial shell answers, as an operator
/// does on a fresh console: a line typed before its reader has the port
/// open is the serial line's, not the shell's.
fn sync_shell(master: &mut std::fs::File, seen: &mut String) {
    for i in 0..20 {
        write!(master, "echo SYNC-$((1000+{i}))\r").unwrap();
        let want = format!("SYNC-{}", 1000 + i);
        let end = Instant::now() + Duration::from_secs(3);
        while Instant::now() < end {
            let mut buf = [0u8; 4096];
            let fd = master.as_raw_fd();
            // SAFETY: `fd` is the open pty master, borrowed for this poll.
            let b = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
            let mut fds = [nix::poll::PollFd::new(b, nix::poll::PollFlags::POLLIN)];
            if nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(200u16)).unwrap_or(0) == 0 {
                continue;
            }
            if let Ok(n) = master.read(&mut buf) {
                seen.push_str(&String::from_utf8_lossy(&buf[..n]));
            }
            if seen.contains(&want) {
                return;
            }
        }
    }
    panic!("the guest's serial shell never answered; the console showed:\n{seen}");
}

fn status_json(env: &Env, name: &str) -> Value {
    let out = env.vmwarden(&["status", name, "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    serde_json::from_slice::<Value>(&out.stdout).unwrap()[0].clone()
}

#[test]
fn console_attaches_through_a_pty_types_into_the_guest_and_detaches_while_the_balloon_is_set_and_reported(
) {
    let env = Env::new();
    let name = "con";
    let mut spec = env.shares_spec(name, uid(331), "hold", SERIAL_SHELL);
    spec["console"] = json!(true);
    // Without deflate-on-OOM the guest's MemTotal shrinks by the balloon:
    // what the guest itself reports.
    spec["balloon"] = json!({ "deflate_on_oom": false });
    env.write_spec(name, &spec);
    let mut g = env.start(name);
    g.wait_for("VMWARDEN-GUEST-READY", BOOT);

    // The console socket: root's, 0600, in control/.
    let sock = env.run.join(name).join("control/console.sock");
    let md = std::fs::symlink_metadata(&sock).unwrap();
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    assert!(md.file_type().is_socket());
    assert_eq!(
        (md.uid(), md.mode() & 0o777),
        (0, 0o600),
        "{}",
        sock.display()
    );

    // The relay: the hypervisor's only child, the principal's with no
    // capability, no_new_privs and the seccomp filter; beyond stdio it
    // holds only the serial end, the console socket and its copy of
    // stdout (the status pipe is closed once it is confined).
    let children =
        std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", g.pid())).unwrap();
    let relay: Vec<u32> = children
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(relay.len(), 1, "the hypervisor's children: {children:?}");
    let relay = relay[0];
    for (key, want) in [
        ("Uid", format!("{0}\t{0}\t{0}\t{0}", uid(331))),
        ("Groups", String::new()),
        ("CapEff", "0000000000000000".to_string()),
        ("CapPrm", "0000000000000000".to_string()),
        ("NoNewPrivs", "1".to_string()),
        ("Seccomp", "2".to_string()),
    ] {
        assert_eq!(proc_status(relay, key), want, "relay {relay} {key}");
    }
    let fds: Vec<_> = std::fs::read_dir(format!("/proc/{relay}/fd"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.parse::<u32>().is_ok_and(|n| n > 2))
        .collect();
    assert_eq!(fds.len(), 3, "the relay's fds beyond stdio: {fds:?}");

    // Attach through a pseudo-terminal, type a line, read the answer.
    let (mut console, mut master) = console_on_pty(&env, name);
    let mut seen = String::new();
    read_until(
        &mut master,
        &mut seen,
        "Ctrl-] detaches",
        Duration::from_secs(10),
    );
    sync_shell(&mut master, &mut seen);
    master.write_all(b"echo ANSWER-$((6*7))\r").unwrap();
    read_until(&mut master, &mut seen, "ANSWER-42", Duration::from_secs(30));

    // A second console while this one is attached is told so.
    let (mut second, mut second_master) = console_on_pty(&env, name);
    let mut second_seen = String::new();
    read_until(
        &mut second_master,
        &mut second_seen,
        "attached elsewhere",
        Duration::from_secs(10),
    );
    assert!(second.wait().unwrap().success());

    // The balloon: set, acknowledged by the guest (QMP's `actual`, shown
    // by status), and seen by the guest itself (MemTotal shrinks by it).
    let before = guest_memtotal_kb(&mut master, "MEM0");
    let out = env.vmwarden(&["balloon", name, "64M"]);
    assert!(out.status.success(), "{}", text(&out));
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let st = status_json(&env, name);
        if st["balloon_mib"] == json!(64) {
            break;
        }
        assert!(
            Instant::now() < end,
            "the guest did not reach a 64 MiB balloon: {st}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let table = text(&env.vmwarden(&["status", name]));
    assert!(
        table.contains("BALLOON") && table.contains("64M"),
        "{table}"
    );
    let after = guest_memtotal_kb(&mut master, "MEM1");
    assert_eq!(
        before - after,
        64 * 1024,
        "MemTotal {before} kB -> {after} kB"
    );
    // Bounds: more than the guest can give is refused, naming the limit.
    let out = env.vmwarden(&["balloon", name, "250"]);
    assert!(
        !out.status.success() && text(&out).contains("at most 240 MiB"),
        "{}",
        text(&out)
    );

    // Detach: the console ends, the VM runs on.
    master.write_all(&[0x1d]).unwrap();
    read_until(
        &mut master,
        &mut seen,
        "Detached from the console",
        Duration::from_secs(10),
    );
    assert!(console.wait().unwrap().success());
    assert_eq!(status_json(&env, name)["state"], json!("running"));
    assert!(
        g.child.try_wait().unwrap().is_none(),
        "the VM stopped on detach"
    );
    // What the guest printed while attached also reached the launcher's
    // stdout (the unit's journal).
    let log = g.log_text();
    assert!(log.contains("ANSWER-42") && log.contains("MEM1-"), "{log}");
    // Attach again: the console is still there.
    let (mut again, mut again_master) = console_on_pty(&env, name);
    let mut again_seen = String::new();
    read_until(
        &mut again_master,
        &mut again_seen,
        "Ctrl-] detaches",
        Duration::from_secs(10),
    );
    sync_shell(&mut again_master, &mut again_seen);
    again_master.write_all(b"echo AGAIN-$((2+3))\r").unwrap();
    read_until(
        &mut again_master,
        &mut again_seen,
        "AGAIN-5",
        Duration::from_secs(30),
    );
    again_master.write_all(&[0x1d]).unwrap();
    assert!(again.wait().unwrap().success());

    let out = env.vmwarden(&["stop", name, "--timeout", "30"]);
    assert!(out.status.success(), "{}", text(&out));
    g.wait_exit(Duration::from_secs(30));
    env.assert_clean(name);
}

#[test]
fn console_and_balloon_refuse_a_vm_without_them_by_name() {
    let env = Env::new();
    let name = "plain";
    env.write_spec(name, &env.spec(name, uid(332)));
    let mut g = env.start(name);
    g.wait_for("VMWARDEN-GUEST-READY", BOOT);
    let out = env.vmwarden(&["console", name]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("has no console to attach to"),
        "{}",
        text(&out)
    );
    assert!(!env.run.join(name).join("control/console.sock").exists());
    let out = env.vmwarden(&["balloon", name, "16"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("has no balloon"), "{}", text(&out));
    // The serial output went to stdout as before (no relay).
    assert!(g.log_text().contains("VMWARDEN-GUEST-READY"));
    let out = env.vmwarden(&["stop", name, "--timeout", "30"]);
    assert!(out.status.success(), "{}", text(&out));
    g.wait_exit(Duration::from_secs(30));
    env.assert_clean(name);
}

/// The entries of journald's native protocol in `buf`: `KEY=value\n`, or
/// `KEY\n` + a little-endian u64 length + the value + `\n`.
fn journal_fields(buf: &[u8]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = buf;
    while !rest.is_empty() {
        let nl = rest
            .iter()
            .position(|&b| b == b'\n')
            .expect("a field ends in \\n");
        let line = &rest[..nl];
        if let Some(eq) = line.iter().position(|&b| b == b'=') {
            out.push((
                String::from_utf8_lossy(&line[..eq]).into_owned(),
                String::from_utf8_lossy(&line[eq + 1..]).into_owned(),
            ));
            rest = &rest[nl + 1..];
        } else {
            let key = String::from_utf8_lossy(line).into_owned();
            let len = u64::from_le_bytes(rest[nl + 1..nl + 9].try_into().unwrap()) as usize;
            let val = &rest[nl + 9..nl + 9 + len];
            out.push((key, String::from_utf8_lossy(val).into_owned()));
            rest = &rest[nl + 9 + len + 1..];
        }
    }
    out
}

/// Run `cmd` with `/run/systemd/journal/socket` (in a private mount
/// namespace: the host's /run is untouched) being `receiver`'s socket,
/// stderr a file and `$JOURNAL_STREAM` that file's device and inode (as
/// systemd sets them for a unit whose stderr is the journal).
fn run_under_journal(
    mut cmd: Command,
    journal_dir: &std::path::Path,
    stderr: &std::path::Path,
    matching: bool,
) -> std::process::Output {
    let f = std::fs::File::create(stderr).unwrap();
    let md = f.metadata().unwrap();
    use std::os::unix::fs::MetadataExt;
    let stream = if matching {
        format!("{}:{}", md.dev(), md.ino())
    } else {
        format!("{}:{}", md.dev(), md.ino() + 1)
    };
    let run_systemd = CString::new("/run/systemd").unwrap();
    let journal = CString::new("/run/systemd/journal").unwrap();
    let src = CString::new(journal_dir.as_os_str().as_encoded_bytes()).unwrap();
    let tmpfs = CString::new("tmpfs").unwrap();
    let root = CString::new("/").unwrap();
    // stdout and stderr the same stream, as systemd connects them.
    cmd.env("JOURNAL_STREAM", stream)
        .stdin(Stdio::null())
        .stdout(f.try_clone().unwrap())
        .stderr(f);
    let paths = [root, tmpfs, run_systemd, journal, src];
    // SAFETY: the closure makes only raw syscalls (unshare, mount, mkdir)
    // on CStrings made before the fork: async-signal-safe.
    unsafe {
        cmd.pre_exec(move || enter_journal_namespace(&paths));
    }
    cmd.output().unwrap()
}

/// A raw call's return value as a result (in a child between fork and
/// exec: no allocation).
fn check(r: libc::c_int) -> std::io::Result<()> {
    if r != 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// In the child before exec: a mount namespace of its own, every mount
/// under `root` (`/`) private to it.
fn private_mount_namespace(root: &CString) -> std::io::Result<()> {
    // SAFETY: unshare(2) takes a flag.
    check(unsafe { libc::unshare(libc::CLONE_NEWNS) })?;
    // SAFETY: mount(2) with NUL-terminated strings that outlive the call.
    check(unsafe {
        libc::mount(
            std::ptr::null(),
            root.as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        )
    })
}

/// In the child before exec: a private mount namespace where
/// `/run/systemd/journal` is the test's directory. `p` is `/`, `tmpfs`,
/// `/run/systemd`, `/run/systemd/journal` and the test's directory.
fn enter_journal_namespace(p: &[CString; 5]) -> std::io::Result<()> {
    let [root, tmpfs, run_systemd, journal, src] = p;
    private_mount_namespace(root)?;
    // SAFETY: mount(2) with NUL-terminated strings that outlive the call.
    check(unsafe {
        libc::mount(
            tmpfs.as_ptr(),
            run_systemd.as_ptr(),
            tmpfs.as_ptr(),
            0,
            std::ptr::null(),
        )
    })?;
    // SAFETY: mkdir(2) with a NUL-terminated path.
    check(unsafe { libc::mkdir(journal.as_ptr(), 0o755) })?;
    // SAFETY: as the mount above.
    check(unsafe {
        libc::mount(
            src.as_ptr(),
            journal.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    })
}

/// Every entry sent to `receiver` so far: a datagram's payload, or (for
/// an entry too large for one datagram) the sealed memfd it carries, as
/// journald reads them.
fn drain(receiver: &UnixDatagram) -> Vec<Vec<(String, String)>> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    receiver.set_nonblocking(true).unwrap();
    let mut entries = Vec::new();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let mut cmsg = nix::cmsg_space!([std::os::fd::RawFd; 1]);
        let mut iov = [std::io::IoSliceMut::new(&mut buf)];
        let Ok(msg) = recvmsg::<()>(
            receiver.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::empty(),
        ) else {
            break;
        };
        let n = msg.bytes;
        let mut fds = Vec::new();
        for c in msg.cmsgs().unwrap() {
            if let ControlMessageOwned::ScmRights(r) = c {
                fds.extend(r);
            }
        }
        if let Some(fd) = fds.first() {
            // SAFETY: the fd arrived with this message and is ours alone.
            let mut f = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(*fd) };
            let mut data = Vec::new();
            std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(0)).unwrap();
            f.read_to_end(&mut data).unwrap();
            entries.push(journal_fields(&data));
        } else if n > 0 {
            entries.push(journal_fields(&buf[..n]));
        }
        // An empty datagram is the layer's probe at start, which journald
        // discards.
    }
    entries
}

fn field<'a>(e: &'a [(String, String)], k: &str) -> Vec<&'a str> {
    e.iter()
        .filter(|(key, _)| key == k)
        .map(|(_, v)| v.as_str())
        .collect()
}

#[test]
fn every_launcher_cleanup_and_tool_line_in_the_journal_names_its_vm() {
    let env = Env::new();
    let name = "jf";
    env.write_spec(name, &env.spec(name, uid(333)));
    let jdir = env.path("journal");
    std::fs::create_dir(&jdir).unwrap();
    let receiver = UnixDatagram::bind(jdir.join("socket")).unwrap();
    // As journald's: anyone may write (the launcher logs after its drop).
    std::fs::set_permissions(
        jdir.join("socket"),
        std::os::unix::fs::PermissionsExt::from_mode(0o666),
    )
    .unwrap();
    let stderr = env.path("stderr");

    // The launcher (a probe: every step, then /bin/true), cleanup, and a
    // tool about this VM (stop of a stopped VM, a refused balloon).
    let mut launch = env.launch_cmd(name);
    launch.args(["--probe", "--", "/bin/true"]);
    let out = run_under_journal(launch, &jdir, &stderr, true);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&std::fs::read(&stderr).unwrap())
    );
    let launcher = drain(&receiver);
    let mut cleanup = env.cleanup_cmd();
    cleanup.arg(name);
    let out = run_under_journal(cleanup, &jdir, &stderr, true);
    assert!(
        out.status.success(),
        "{}",
        std::fs::read_to_string(&stderr).unwrap()
    );
    let cleanup_entries = drain(&receiver);
    let mut balloon = env.vmwarden_cmd();
    balloon.args(["balloon", name, "16"]);
    let out = run_under_journal(balloon, &jdir, &stderr, true);
    assert!(!out.status.success());
    let tool = drain(&receiver);

    for (who, entries, ident) in [
        ("launcher", &launcher, "vmwarden-launch"),
        ("cleanup", &cleanup_entries, "vmwarden-cleanup"),
        ("vmwarden balloon", &tool, "vmwarden"),
    ] {
        assert!(!entries.is_empty(), "{who} wrote nothing to the journal");
        for e in entries.iter() {
            assert_eq!(field(e, "VMWARDEN_VM"), [name], "{who}: {e:?}");
            assert_eq!(field(e, "SYSLOG_IDENTIFIER"), [ident], "{who}: {e:?}");
            assert_eq!(field(e, "MESSAGE").len(), 1, "{who}: {e:?}");
        }
    }
    // The launcher's step lines keep their step; its error-free run ends at exec.
    assert!(
        launcher
            .iter()
            .any(|e| field(e, "F_STEP") == ["spec-loaded"]),
        "{launcher:?}"
    );
    assert!(
        launcher.iter().any(|e| field(e, "F_STEP") == ["exec"]),
        "{launcher:?}"
    );
    // The tool's refusal is an error entry (priority 3) naming the VM.
    assert!(
        tool.iter()
            .any(|e| field(e, "PRIORITY") == ["3"]
                && field(e, "MESSAGE")[0].contains("is not running")),
        "{tool:?}"
    );
    // Cleanup's report is its own entry, as stdout had it.
    assert!(
        cleanup_entries
            .iter()
            .any(|e| field(e, "MESSAGE")[0].starts_with("{\"name\":\"jf\"")),
        "{cleanup_entries:?}"
    );
    // Nothing went to stdout or stderr as text: the journal had it all.
    assert_eq!(std::fs::read_to_string(&stderr).unwrap(), "");

    // A JOURNAL_STREAM that is not stderr's (a child that inherited the
    // variable, not the stream): plain text on stderr, nothing sent.
    let mut balloon = env.vmwarden_cmd();
    balloon.args(["balloon", name, "16"]);
    let out = run_under_journal(balloon, &jdir, &stderr, false);
    assert!(!out.status.success());
    assert!(drain(&receiver).is_empty());
    let err = std::fs::read_to_string(&stderr).unwrap();
    assert!(
        err.contains("vmwarden: error: VM jf is not running"),
        "{err}"
    );
    let _ = receiver.as_fd();
}

/// A host without systemd-machined (no system bus: `/run/dbus` is an empty
/// tmpfs in the launcher's own mount namespace, so the test does not depend
/// on the host's bus): a spec with `register_with_machined` is refused at
/// its step with exit 78 and a message that says how to fix it; cleanup
/// leaves the host as it was.
#[test]
fn a_host_without_machined_refuses_a_registration_it_was_asked_for() {
    let env = Env::new();
    let name = "reg";
    let mut spec = env.spec(name, uid(334));
    spec["register_with_machined"] = json!(true);
    env.write_spec(name, &spec);
    let mut c = env.launch_cmd(name);
    let dbus = CString::new("/run/dbus").unwrap();
    let tmpfs = CString::new("tmpfs").unwrap();
    let root = CString::new("/").unwrap();
    let has_dbus_dir = std::path::Path::new("/run/dbus").is_dir();
    // SAFETY: the closure makes only raw syscalls on CStrings made before
    // the fork: async-signal-safe.
    unsafe {
        c.pre_exec(move || hide_system_bus(&root, &tmpfs, &dbus, has_dbus_dir));
    }
    // In a cgroup of its own, as under its unit: the launch registers.
    let own = cgroup::TestCgroup::new("reg");
    own.enter(&mut c);
    let o = bounded(&mut c, Duration::from_secs(60)).expect("the launch hung");
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(78), "{e}");
    assert!(e.contains("error at step \"machine-registered\""), "{e}");
    assert!(
        e.contains("systemd-machined is not reachable") && e.contains("register_with_machined"),
        "{e}"
    );
    env.assert_clean(name);
}

/// In the child before exec: a private mount namespace whose `/run/dbus`
/// (when the host has one) is an empty tmpfs.
fn hide_system_bus(
    root: &CString,
    tmpfs: &CString,
    dbus: &CString,
    has_dbus_dir: bool,
) -> std::io::Result<()> {
    private_mount_namespace(root)?;
    if has_dbus_dir {
        // SAFETY: mount(2) with NUL-terminated strings that outlive the call.
        check(unsafe {
            libc::mount(
                tmpfs.as_ptr(),
                dbus.as_ptr(),
                tmpfs.as_ptr(),
                0,
                std::ptr::null(),
            )
        })?;
    }
    Ok(())
}

/// What the guest prints in the tests below: lines starting `<0>` and
/// `<1>` (an emergency and an alert, to a stream that reads level
/// prefixes), and one of escape sequences (a colour, a window title, a
/// screen clear) and BEL.
const GUEST_BYTES: &str =
    r"printf '<0>VMWJ-P0\n<1>VMWJ-P1\n\033[31m\033]0;VMWJ\007VMWJ-ESC\007\033[2J\n'";

/// Everything a non-blocking `s` has now (until EOF or EAGAIN).
fn read_available(s: &mut std::os::unix::net::UnixStream) -> Vec<u8> {
    s.set_nonblocking(true).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    out
}

/// The guest's bytes cannot speak for the journal or reach a terminal:
/// the guest's serial output (the hypervisor's stdout, which the console
/// relay's copy shares) never goes to a journal stream that reads a
/// leading `<N>` as the line's priority, whatever the unit says, nor to a
/// terminal. journald's `stdout` socket is the test's (in a private mount
/// namespace); the launcher's stdout and stderr are a stream to it whose
/// header says level prefixes on (`SyslogLevelPrefix=` left on), named by
/// `$JOURNAL_STREAM`, and the probe prints [`GUEST_BYTES`]: they arrive on
/// a stream of the launcher's own, whose header says priority 6 and no
/// level prefix, and none on the unit's. Then stdout (and stdin) a
/// pseudo-terminal, as at a shell: the terminal receives none of them,
/// and the launcher says where the console is. The real journald (the
/// line's PRIORITY, no wall) is the systemd suite's `guest_bytes`.
#[test]
fn the_guests_bytes_cannot_speak_for_the_journal_or_reach_a_terminal() {
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::net::{UnixListener, UnixStream};
    let env = Env::new();
    let name = "gb";
    env.write_spec(name, &env.spec(name, uid(335)));
    let jdir = env.path("journal");
    std::fs::create_dir(&jdir).unwrap();
    let receiver = UnixDatagram::bind(jdir.join("socket")).unwrap();
    let listener = UnixListener::bind(jdir.join("stdout")).unwrap();
    for s in ["socket", "stdout"] {
        std::fs::set_permissions(
            jdir.join(s),
            std::os::unix::fs::PermissionsExt::from_mode(0o666),
        )
        .unwrap();
    }
    // The unit's stream, as systemd opens it for a unit that leaves
    // SyslogLevelPrefix= on: identifier, unit, priority 6, level prefix 1.
    let mut unit_stream = UnixStream::connect(jdir.join("stdout")).unwrap();
    unit_stream
        .write_all(b"microvm@gb\n\n6\n1\n0\n0\n0\n")
        .unwrap();
    let (mut unit_side, _) = listener.accept().unwrap();
    let md = std::fs::metadata(format!("/proc/self/fd/{}", unit_stream.as_raw_fd())).unwrap();
    let mut c = env.launch_cmd(name);
    c.args(["--probe", "--", "/bin/sh", "-c", GUEST_BYTES])
        .env("JOURNAL_STREAM", format!("{}:{}", md.dev(), md.ino()))
        .stdin(Stdio::null())
        .stdout(Stdio::from(OwnedFd::from(unit_stream.try_clone().unwrap())))
        .stderr(Stdio::from(OwnedFd::from(unit_stream.try_clone().unwrap())));
    let paths = [
        CString::new("/").unwrap(),
        CString::new("tmpfs").unwrap(),
        CString::new("/run/systemd").unwrap(),
        CString::new("/run/systemd/journal").unwrap(),
        CString::new(jdir.as_os_str().as_encoded_bytes()).unwrap(),
    ];
    // SAFETY: the closure makes only raw syscalls (unshare, mount, mkdir)
    // on CStrings made before the fork: async-signal-safe.
    unsafe {
        c.pre_exec(move || enter_journal_namespace(&paths));
    }
    let o = c.output().unwrap();
    drop(unit_stream);
    let unit_bytes = read_available(&mut unit_side);
    let unit_text = String::from_utf8_lossy(&unit_bytes);
    assert!(o.status.success(), "{}\n{unit_text}", text(&o));
    assert!(
        !unit_text.contains("VMWJ"),
        "the guest's bytes went to the unit's stream, whose header says level prefixes on (a leading <0> is an emergency there): {unit_text:?}"
    );
    listener.set_nonblocking(true).unwrap();
    let Ok((mut own, _)) = listener.accept() else {
        let logged: Vec<String> = drain(&receiver)
            .iter()
            .flat_map(|e| field(e, "MESSAGE").into_iter().map(str::to_string))
            .collect();
        panic!("the launcher opened no stream of its own to journald; it logged {logged:?}; the unit's stream had {unit_text:?}")
    };
    let own_bytes = read_available(&mut own);
    let own_text = String::from_utf8_lossy(&own_bytes);
    let header: Vec<&str> = own_text.splitn(8, '\n').take(7).collect();
    assert_eq!(
        header,
        ["gb", "", "6", "0", "0", "0", "0"],
        "the launcher's stream: identifier, unit, priority 6, no level prefix, no forwarding: {own_text:?}"
    );
    for want in ["<0>VMWJ-P0\n", "<1>VMWJ-P1\n", "VMWJ-ESC\x07"] {
        assert!(own_text.contains(want), "{want:?} not in {own_text:?}");
    }
    let _ = drain(&receiver);
    env.assert_clean(name);

    // stdout and stdin a terminal: the guest's bytes do not reach it.
    let pty = nix::pty::openpty(None, None).unwrap();
    let mut c = env.launch_cmd(name);
    c.args(["--probe", "--", "/bin/sh", "-c", GUEST_BYTES])
        .env_remove("JOURNAL_STREAM")
        .stdin(Stdio::from(pty.slave.try_clone().unwrap()))
        .stdout(Stdio::from(pty.slave))
        .stderr(Stdio::piped());
    let o = c.output().unwrap();
    drop(c);
    let mut master = std::fs::File::from(pty.master);
    let _ = nix::fcntl::fcntl(
        master.as_fd(),
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
    );
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = master.read(&mut buf) {
        if n == 0 {
            break;
        }
        seen.extend_from_slice(&buf[..n]);
    }
    let seen = String::from_utf8_lossy(&seen);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        !seen.contains("VMWJ") && !seen.contains('\x1b'),
        "the guest's bytes reached the terminal: {seen:?}"
    );
    let e = stderr(&o);
    assert!(
        e.contains("not written to this terminal") && e.contains("vmwarden console"),
        "{e}"
    );
    env.assert_clean(name);
}

/// machined does not take a hand-launched VM's login session as the
/// machine's unit: machined files a machine under the unit of its leader's
/// cgroup, which `machinectl terminate` stops. A launch by hand from a
/// login shell runs in the session's scope (a cgroup
/// `session-N.scope` holding the shell, here a `sleep`): a spec with
/// `register_with_machined` goes on unregistered, with a warning that says
/// how to get the registration, and never asks the bus (which is hidden,
/// so that asking it would refuse the launch with exit 78). The launch is
/// stopped right after its `machine-registered` step (fault injection),
/// cleanup leaves the host clean and the session's process runs on. The
/// registration under the VM's own cgroup is
/// `a_host_without_machined_refuses_a_registration_it_was_asked_for`'s
/// and, with a real machined, the systemd suite's `machined`.
#[test]
fn machined_does_not_take_a_hand_launched_vms_login_session_as_its_unit() {
    use common::cgroup::TestCgroup;
    let env = Env::new();
    let name = "hand";
    let mut spec = env.spec(name, uid(336));
    spec["register_with_machined"] = json!(true);
    env.write_spec(name, &spec);
    let session = TestCgroup::named(&format!("session-vmwt{}.scope", std::process::id()));
    let mut shell = Command::new("/bin/sleep");
    shell.arg("600").stdin(Stdio::null());
    session.enter(&mut shell);
    let mut shell = shell.spawn().unwrap();
    let shell_pid = shell.id();
    let mut c = env.launch_cmd(name);
    c.env("VMWARDEN_FAULT_AFTER", "machine-registered");
    let dbus = CString::new("/run/dbus").unwrap();
    let tmpfs = CString::new("tmpfs").unwrap();
    let root = CString::new("/").unwrap();
    let has_dbus_dir = std::path::Path::new("/run/dbus").is_dir();
    // SAFETY: the closure makes only raw syscalls on CStrings made before
    // the fork: async-signal-safe.
    unsafe {
        c.pre_exec(move || hide_system_bus(&root, &tmpfs, &dbus, has_dbus_dir));
    }
    session.enter(&mut c);
    let o = bounded(&mut c, Duration::from_secs(60)).expect("the launch hung");
    let e = stderr(&o);
    assert_ne!(
        o.status.code(),
        Some(78),
        "a launch from a login session's cgroup asked systemd-machined to register it (machined would take the session for the machine's unit, and `machinectl terminate` would end the session): {e}"
    );
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&o.status),
        Some(libc::SIGKILL),
        "the launch did not reach the end of its machine-registered step: {e}"
    );
    assert!(
        e.contains("not registered with systemd-machined")
            && e.contains("systemd-run --scope")
            && e.contains("session-vmwt"),
        "{e}"
    );
    env.assert_clean(name);
    assert!(
        shell.try_wait().unwrap().is_none() && session.procs().contains(&shell_pid),
        "the session's process did not survive"
    );
    let _ = shell.kill();
    let _ = shell.wait();
}

/// The guest's bytes cannot speak for the journal even when the launcher
/// is not told its stdout is the journal: a unit of someone else's that
/// leaves level prefixes on and wipes the environment on the way (`sudo`,
/// `env -i`, `UnsetEnvironment=JOURNAL_STREAM`) gave the launcher a
/// journal stream and no `$JOURNAL_STREAM`; it left fd 1 as it was and
/// the guest's `<0>` reached journald as an emergency. Now a stdout
/// connected to the listener behind journald's `stdout` socket (the same
/// peer as a new connection there) is the journal's too.
#[test]
fn the_guests_bytes_cannot_speak_for_the_journal_without_journal_stream() {
    use std::os::unix::net::{UnixListener, UnixStream};
    let env = Env::new();
    let name = "gbn";
    env.write_spec(name, &env.spec(name, uid(411)));
    let jdir = env.path("journal");
    std::fs::create_dir(&jdir).unwrap();
    let receiver = UnixDatagram::bind(jdir.join("socket")).unwrap();
    let listener = UnixListener::bind(jdir.join("stdout")).unwrap();
    for s in ["socket", "stdout"] {
        std::fs::set_permissions(
            jdir.join(s),
            std::os::unix::fs::PermissionsExt::from_mode(0o666),
        )
        .unwrap();
    }
    let mut unit_stream = UnixStream::connect(jdir.join("stdout")).unwrap();
    unit_stream
        .write_all(b"microvm@gbn\n\n6\n1\n0\n0\n0\n")
        .unwrap();
    let (mut unit_side, _) = listener.accept().unwrap();
    let mut c = env.launch_cmd(name);
    c.args(["--probe", "--", "/bin/sh", "-c", GUEST_BYTES])
        .env_remove("JOURNAL_STREAM")
        .stdin(Stdio::null())
        .stdout(Stdio::from(OwnedFd::from(unit_stream.try_clone().unwrap())))
        .stderr(Stdio::piped());
    let paths = [
        CString::new("/").unwrap(),
        CString::new("tmpfs").unwrap(),
        CString::new("/run/systemd").unwrap(),
        CString::new("/run/systemd/journal").unwrap(),
        CString::new(jdir.as_os_str().as_encoded_bytes()).unwrap(),
    ];
    // SAFETY: the closure makes only raw syscalls (unshare, mount, mkdir)
    // on CStrings made before the fork: async-signal-safe.
    unsafe {
        c.pre_exec(move || enter_journal_namespace(&paths));
    }
    let o = c.output().unwrap();
    drop(unit_stream);
    let unit_bytes = read_available(&mut unit_side);
    let unit_text = String::from_utf8_lossy(&unit_bytes);
    assert!(o.status.success(), "{}\n{unit_text}", text(&o));
    assert!(
        !unit_text.contains("VMWJ"),
        "the guest's bytes went to the unit's stream, whose header says level prefixes on (a leading <0> is an emergency there): {unit_text:?}"
    );
    listener.set_nonblocking(true).unwrap();
    let (mut own, _) = listener
        .accept()
        .expect("the launcher opened no stream of its own to journald");
    let own_text = String::from_utf8_lossy(&read_available(&mut own)).into_owned();
    let header: Vec<&str> = own_text.splitn(8, '\n').take(7).collect();
    assert_eq!(header, ["gbn", "", "6", "0", "0", "0", "0"], "{own_text:?}");
    assert!(own_text.contains("<0>VMWJ-P0\n"), "{own_text:?}");
    let _ = drain(&receiver);
    env.assert_clean(name);
}

/// An error of a launch step after the privilege drop reaches the journal:
/// in the VM's own root journald's socket is a link through
/// `/proc/self/fd`, which the dropped launcher cannot follow, so such an
/// error went nowhere (every VM that failed at `landlock` under systemd
/// failed silently). It now goes to stderr, the unit's journal stream.
#[test]
fn an_error_after_the_drop_reaches_the_journal() {
    let env = Env::new();
    let name = "je";
    let hidden = env.path("root-only");
    std::fs::create_dir(&hidden).unwrap();
    std::fs::set_permissions(&hidden, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    std::fs::write(hidden.join("file"), b"x").unwrap();
    let mut spec = env.spec(name, uid(334));
    spec["landlock"]["read"] = json!([hidden.join("file")]);
    env.write_spec(name, &spec);
    let jdir = env.path("journal");
    std::fs::create_dir(&jdir).unwrap();
    let receiver = UnixDatagram::bind(jdir.join("socket")).unwrap();
    std::fs::set_permissions(
        jdir.join("socket"),
        std::os::unix::fs::PermissionsExt::from_mode(0o666),
    )
    .unwrap();
    let stderr = env.path("stderr");
    let mut launch = env.launch_cmd(name);
    launch.args(["--probe", "--", "/bin/true"]);
    let out = run_under_journal(launch, &jdir, &stderr, true);
    assert!(!out.status.success(), "the launch went on");
    let entries = drain(&receiver);
    let in_journal = entries.iter().any(|e| {
        field(e, "MESSAGE")
            .iter()
            .any(|m| m.contains("error at step"))
    });
    let err = std::fs::read_to_string(&stderr).unwrap();
    assert!(
        in_journal || err.contains("error at step"),
        "the launch's error went nowhere: stderr {err:?}, journal {entries:?}"
    );
}
