//! Asking a hypervisor binary about its build, when its ELF cannot tell
//! (a wrapper script, a static or packed build): QEMU's `-sandbox` probe,
//! cloud-hypervisor's `--help`. Root hands this binary to a VM, but has
//! not yet confined anything: so the probe runs in the hypervisor's own
//! confinement, and never outlives its deadline.
//!
//! The forked child, before it `execve`s `BINARY ARGS…`:
//!
//! * leads a process group of its own (everything it starts is in it, and
//!   its filter keeps them there: `setsid` and `setpgid` answer EPERM);
//! * enters private mount and IPC namespaces, masks the runtime and state
//!   roots and `/run/credentials` whole (no VM's directory is kept: none is
//!   this probe's), mounts a private `/proc` (`hidepid=invisible`,
//!   `subset=pid`), sets `RLIMIT_CORE` to 0 — `launch::sandbox`, as for
//!   the hypervisor;
//! * drops to the principal with no supplementary group and checks the
//!   drop, dies with the launcher (`PR_SET_PDEATHSIG`);
//! * restricts itself with Landlock to the system's program and library
//!   trees, `/dev/null` and the binary (less than the hypervisor gets: no
//!   kernel, disk, state dir or device), and installs the launcher's seccomp
//!   filters (no socket but `AF_UNIX`, no namespace, …);
//! * has `/dev/null` as stdin and two pipes as stdout and stderr, and no
//!   other fd.
//!
//! The launcher reads both pipes and waits for the child under one
//! deadline. As soon as the child exits, or the deadline passes, the whole
//! process group is SIGKILLed: whatever the binary left behind (a
//! daemonised child, one that holds a pipe open) cannot keep the launch
//! waiting or outlive it. Then the launcher waits, through a pidfd on
//! each, until no process of the group is alive (a zombie is dead), for at
//! most [`GROUP_EXIT_TIMEOUT`]: a killed process can take a while to exit
//! (freeing a large address space), and one still exiting when the launch
//! looks for processes of the principal under the lease would make it
//! refuse as "ambiguous". One still alive then fails the probe, named.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{killpg, Signal};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{ForkResult, Pid};
use seccompiler::BpfProgram;

use crate::config::paths::Roots;
use crate::config::spec::LandlockMode;
use crate::host::{cgroup, procs};
use crate::identity::principal::Principal;
use crate::launch::syscall::{LinuxSyscall, Syscall};
use crate::launch::{landlock, sandbox, seccomp, EXEC_PATH};

/// How long a probe may take, from the fork to its exit (a QEMU answers
/// `-version` in ~40 ms, cloud-hypervisor `--help` in a few).
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the probe's killed process group may take to die.
pub const GROUP_EXIT_TIMEOUT: Duration = Duration::from_secs(10);

/// Most bytes kept of a probe's stdout and of its stderr each (the rest is
/// read and dropped, so the binary never blocks on a full pipe).
const OUTPUT_MAX: usize = 256 * 1024;

/// What to run, as whom.
#[derive(Debug)]
pub struct Probe<'a> {
    /// The hypervisor binary (already walked and trusted).
    pub binary: &'a Path,
    pub args: &'a [&'a str],
    pub principal: &'a Principal,
    /// Masked whole in the probe's namespace.
    pub roots: &'a Roots,
    pub landlock: LandlockMode,
    pub timeout: Duration,
}

/// A probe that exited by itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Run `p`; `Err` says why there is no answer (it could not be confined or
/// started, was killed by a signal, or did not exit within its deadline).
pub fn run(p: &Probe<'_>) -> Result<Answer, String> {
    let deadline = Instant::now() + p.timeout;
    let cstr = |s: &str| CString::new(s).map_err(|_| format!("{s:?} contains a NUL byte"));
    let prog = cstr(&p.binary.to_string_lossy())?;
    let mut argv = vec![prog.clone()];
    for a in p.args {
        argv.push(cstr(a)?);
    }
    let env = [cstr(EXEC_PATH)?];
    // Everything the child needs is made before the fork.
    let policy = landlock::Policy {
        rules: landlock::program_rules(p.binary, "hypervisor.binary".into()),
        vm_trees: Vec::new(),
        signals_unscoped: false,
        // The drop in the child sets it and checks it.
        no_new_privs_set: true,
        ..Default::default()
    };
    let mut filters = seccomp::programs().map_err(|e| e.to_string())?;
    filters
        .push(seccomp::eperm(&[libc::SYS_setsid, libc::SYS_setpgid]).map_err(|e| e.to_string())?);
    let principal = Principal {
        groups: Vec::new(),
        ..p.principal.clone()
    };
    let pipe = || nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| format!("pipe2: {e}"));
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    let (status_r, status_w) = pipe()?;
    for r in [&out_r, &err_r, &status_r] {
        fcntl(r, FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).map_err(|e| format!("fcntl: {e}"))?;
    }
    let parent = nix::unistd::getpid();
    LinuxSyscall
        .assert_single_threaded()
        .map_err(|e| e.to_string())?;
    // SAFETY: the launcher is single-threaded (checked just above), so the
    // child is a complete copy with no lock held by another thread; it only
    // runs the launcher's own code until it execs or `_exit`s.
    match unsafe { nix::unistd::fork() }.map_err(|e| format!("fork: {e}"))? {
        ForkResult::Child => {
            let msg = child(&Child {
                parent,
                roots: p.roots,
                principal: &principal,
                policy: &policy,
                landlock: p.landlock,
                filters: &filters,
                stdout: &out_w,
                stderr: &err_w,
                prog: &prog,
                argv: &argv,
                env: &env,
            });
            let _ = nix::unistd::write(&status_w, msg.as_bytes());
            // SAFETY: _exit ends this forked child at once, without running
            // the launcher's destructors or atexit handlers.
            unsafe { libc::_exit(127) }
        }
        ForkResult::Parent { child } => {
            drop((out_w, err_w, status_w));
            // Also set here, so that the group exists whichever of the two
            // runs first (EACCES once the child has exec'd: it set it).
            let _ = nix::unistd::setpgid(child, child);
            wait(child, deadline, p.timeout, [out_r, err_r, status_r])
        }
    }
}

/// What the child needs (all of it made before the fork).
struct Child<'a> {
    parent: Pid,
    roots: &'a Roots,
    principal: &'a Principal,
    policy: &'a landlock::Policy,
    landlock: LandlockMode,
    filters: &'a [BpfProgram],
    stdout: &'a OwnedFd,
    stderr: &'a OwnedFd,
    prog: &'a CString,
    argv: &'a [CString],
    env: &'a [CString],
}

/// The child's way to `execve`; returns only with what went wrong.
fn child(c: &Child<'_>) -> String {
    let sys = &LinuxSyscall;
    let run = || -> Result<(), String> {
        nix::unistd::setpgid(Pid::from_raw(0), Pid::from_raw(0))
            .map_err(|e| format!("setpgid: {e}"))?;
        sandbox::enter_private_namespaces(sys).map_err(|e| e.to_string())?;
        for root in [&c.roots.runtime_root, &c.roots.state_root] {
            sandbox::mask_dir(sys, root).map_err(|e| e.to_string())?;
        }
        sandbox::mask_dir(sys, Path::new("/run/credentials")).map_err(|e| e.to_string())?;
        sandbox::mount_private_proc(sys, true).map_err(|e| e.to_string())?;
        sandbox::set_rlimits(sys).map_err(|e| e.to_string())?;
        let null = nix::fcntl::open(
            "/dev/null",
            OFlag::O_RDONLY | OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )
        .map_err(|e| format!("open /dev/null: {e}"))?;
        for (from, to) in [
            (null.as_fd(), 0),
            (c.stdout.as_fd(), 1),
            (c.stderr.as_fd(), 2),
        ] {
            // SAFETY: dup2 only changes this (child) process's fd table;
            // `from` stays open until execve.
            let rc = unsafe { libc::dup2(from.as_raw_fd(), to) };
            Errno::result(rc).map_err(|e| format!("dup2: {e}"))?;
        }
        sandbox::drop_privileges_with(sys, c.principal).map_err(|e| e.to_string())?;
        // After the drop: changing credentials clears the death signal.
        nix::sys::prctl::set_pdeathsig(Some(Signal::SIGKILL))
            .map_err(|e| format!("prctl(PR_SET_PDEATHSIG): {e}"))?;
        if nix::unistd::getppid() != c.parent {
            return Err("the launcher died while the probe was starting".into());
        }
        sys.landlock_restrict(c.policy, c.landlock)
            .map_err(|e| e.to_string())?;
        seccomp::apply(sys, c.filters).map_err(|e| e.to_string())?;
        sandbox::cloexec_all_but(sys, &[]).map_err(|e| e.to_string())?;
        sys.chdir(Path::new("/"))
            .map_err(|e| format!("chdir /: {e}"))?;
        Ok(())
    };
    if let Err(e) = run() {
        return e;
    }
    let e = sys.execve(c.prog, c.argv, c.env);
    format!("execve {}: {e}", c.prog.to_string_lossy())
}

/// Read `[stdout, stderr, status]` until `child` exits or `deadline`
/// passes; then SIGKILL its process group, reap it and keep what it wrote.
fn wait(
    child: Pid,
    deadline: Instant,
    timeout: Duration,
    fds: [OwnedFd; 3],
) -> Result<Answer, String> {
    let pidfd = cgroup::pidfd_open(u32::try_from(child.as_raw()).unwrap_or(0));
    let mut bufs: [Vec<u8>; 3] = Default::default();
    let mut open = [true; 3];
    let exited = loop {
        drain(&fds, &mut bufs, &mut open);
        if exited(child, pidfd.as_ref()) {
            break true;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break false;
        }
        // Without a pidfd (a kernel before 5.3) the exit is checked every
        // few milliseconds instead of being waited for.
        let step = if pidfd.is_some() {
            left
        } else {
            left.min(Duration::from_millis(5))
        };
        let mut polled: Vec<PollFd<'_>> = fds
            .iter()
            .zip(open)
            .filter(|(_, o)| *o)
            .map(|(f, _)| PollFd::new(f.as_fd(), PollFlags::POLLIN))
            .collect();
        if let Some(p) = &pidfd {
            polled.push(PollFd::new(p.as_fd(), PollFlags::POLLIN));
        }
        let ms = u16::try_from(step.as_millis().max(1)).unwrap_or(u16::MAX);
        match poll(&mut polled, PollTimeout::from(ms)) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(e) => {
                kill_group(child);
                return Err(format!("poll: {e}"));
            }
        }
    };
    // Done or out of time: nothing of the probe outlives this point.
    kill_group(child);
    let status = loop {
        match waitpid(child, None) {
            Err(Errno::EINTR) => continue,
            other => break other.map_err(|e| format!("waitpid: {e}"))?,
        }
    };
    drain(&fds, &mut bufs, &mut open);
    await_group_gone(child, GROUP_EXIT_TIMEOUT)?;
    let [out, err, setup] = bufs;
    if !exited {
        return Err(format!(
            "did not exit within {timeout:?}; its process group was killed"
        ));
    }
    if !setup.is_empty() {
        return Err(format!(
            "not run: {}",
            String::from_utf8_lossy(&setup).trim()
        ));
    }
    let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
    match status {
        WaitStatus::Exited(_, code) => Ok(Answer {
            code,
            stdout: text(out),
            stderr: text(err),
        }),
        WaitStatus::Signaled(_, sig, _) => Err(format!("killed by signal {sig}")),
        other => Err(format!("ended as {other:?}")),
    }
}

/// Has `child` exited (without reaping it: its pid stays its group's id
/// until the group is killed)?
fn exited(child: Pid, pidfd: Option<&OwnedFd>) -> bool {
    use nix::sys::wait::{waitid, Id, WaitPidFlag};
    let id = match pidfd {
        Some(p) => Id::PIDFd(p.as_fd()),
        None => Id::Pid(child),
    };
    matches!(
        waitid(
            id,
            WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT
        ),
        Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..))
    )
}

/// Wait until no process of the probe's group (`pgid`, SIGKILLed) is
/// alive, each waited for through a pidfd opened while it is still listed
/// in the group (so never another process that took its pid), for at most
/// `limit`. The group is SIGKILLed again on each round (for a member forked
/// while the first kill went through). Err names the processes left.
fn await_group_gone(pgid: Pid, limit: Duration) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    let group = match u32::try_from(pgid.as_raw()) {
        // Group 0 is the kernel's threads': never a probe's.
        Ok(g) if g > 0 => g,
        _ => return Err(format!("no process group {pgid} to wait for")),
    };
    loop {
        let left = procs::live_in_group(group);
        if left.is_empty() {
            return Ok(());
        }
        let rest = deadline.saturating_duration_since(Instant::now());
        if rest.is_zero() {
            return Err(format!(
                "its process group was killed, but processes {left:?} of it were still alive {limit:?} later"
            ));
        }
        kill_group(pgid);
        let mut pidfds: Vec<OwnedFd> = left
            .iter()
            .filter_map(|pid| {
                let fd = cgroup::pidfd_open(*pid)?;
                // Still the group's now that the pidfd pins the process?
                procs::is_alive_in_group(*pid, group).then_some(fd)
            })
            .collect();
        if pidfds.is_empty() {
            // Gone meanwhile, or no pidfd (a kernel before 5.3): look
            // again shortly.
            std::thread::sleep(Duration::from_millis(5).min(rest));
            continue;
        }
        // Each pidfd turns readable when its process has exited.
        while !pidfds.is_empty() {
            let rest = deadline.saturating_duration_since(Instant::now());
            if rest.is_zero() {
                break;
            }
            let mut polled: Vec<PollFd<'_>> = pidfds
                .iter()
                .map(|f| PollFd::new(f.as_fd(), PollFlags::POLLIN))
                .collect();
            let ms = u16::try_from(rest.as_millis().max(1)).unwrap_or(u16::MAX);
            match poll(&mut polled, PollTimeout::from(ms)) {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(e) => return Err(format!("poll on its process group's pidfds: {e}")),
            }
            let done: Vec<bool> = polled
                .iter()
                .map(|p| p.revents().is_some_and(|r| !r.is_empty()))
                .collect();
            drop(polled);
            pidfds = pidfds
                .into_iter()
                .zip(done)
                .filter_map(|(fd, gone)| (!gone).then_some(fd))
                .collect();
        }
    }
}

/// SIGKILL the probe's process group (gone already is fine).
fn kill_group(child: Pid) {
    let _ = killpg(child, Signal::SIGKILL);
}

/// Read what is there on each open, non-blocking fd; keep the first
/// [`OUTPUT_MAX`] bytes of each.
fn drain(fds: &[OwnedFd; 3], bufs: &mut [Vec<u8>; 3], open: &mut [bool; 3]) {
    let mut chunk = [0u8; 16 * 1024];
    for ((fd, buf), o) in fds.iter().zip(bufs.iter_mut()).zip(open.iter_mut()) {
        while *o {
            match nix::unistd::read(fd, &mut chunk) {
                Ok(0) => *o = false,
                Ok(n) => {
                    let room = OUTPUT_MAX.saturating_sub(buf.len());
                    buf.extend_from_slice(&chunk[..n.min(room)]);
                }
                Err(Errno::EINTR) => {}
                Err(Errno::EAGAIN) => break,
                Err(_) => *o = false,
            }
        }
    }
}
