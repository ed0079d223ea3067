//! The helper daemons: one `virtiofsd` per virtiofs share,
//! `vhost-device-vsock` for QEMU's user vsock backend and `passt` for
//! QEMU's user network, each forked by the launcher inside the VM's mount
//! namespace (after the credential tmpfs, before the launcher's own drop)
//! and run as the VM's principal. What differs between them is data, one
//! entry per kind in [`shape::TABLE`]; this file starts any entry the same
//! way.
//!
//! The child, before it `execve`s the daemon: drops to the principal with
//! no supplementary group ([`sandbox::drop_privileges`], so every
//! capability set is empty and `no_new_privs` is set), sets
//! `PR_SET_PDEATHSIG(SIGKILL)` (after the drop: a credential change clears
//! it) and re-checks `getppid()`, applies a Landlock domain of its own (its
//! share, read-only or read-write; `control/` for the vsock daemon's
//! sockets; its binary and the system's libraries; for passt no file
//! access, which its own sandbox takes away, and TCP bind on its forwarded
//! ports only), installs its seccomp filter (the launcher's, or for passt
//! the self-sandboxing one), and keeps only the lease fd (and the socket
//! it is handed) across `execve`. The launcher then becomes the hypervisor in the
//! same process, so the death signal follows the hypervisor; the inherited
//! lease keeps the VM "live" for as long as any helper somehow survives.
//!
//! A helper whose [`Root`] is its share (each virtiofsd) is confined to a
//! mount namespace rooted at it (see `share_root`).
//!
//! A share the guest owns ([`guest_owned`]: a writable share of a kind
//! whose [`Shape::guest_owns_writable`] says so, virtiofsd's) is served
//! differently: its daemon does not drop to the principal but becomes root
//! of a user namespace of its own mapping the VM's id range (see `owned`),
//! under its own filter, beside a broker for its setgid directories (see
//! `broker`).
//!
//! A [`Channel::Listener`] helper (virtiofsd) gets its listening socket
//! from root as an fd; a [`Channel::OwnSockets`] helper
//! (vhost-device-vsock) makes its sockets itself and the launcher waits
//! for them; a [`Channel::Pair`] helper (passt) gets one end of a
//! connected socket pair and the hypervisor the other. A
//! [`Root::OwnSandbox`] helper (passt) makes a sandbox of its own once
//! started, and the launcher waits until it has (see `own_sandbox`).
//!
//! A [`Program::Own`] helper (vmm-notify) runs vmwarden's own code in the
//! forked child instead of an `execve`: confined the same way, it then
//! holds nothing but the lease, the descriptors it is handed and, when it
//! may end the hypervisor, a pidfd of its parent.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{fcntl, AtFlags, FcntlArg, FdFlag, OFlag};
use nix::sys::signal::{SigHandler, Signal};
use nix::sys::socket::{
    bind, listen, socket, socketpair, AddressFamily, Backlog, SockFlag, SockType, UnixAddr,
};
use nix::sys::stat::{fstatat, umask, Mode, SFlag};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{ForkResult, Gid, Pid, Uid};
use seccompiler::BpfProgram;

use crate::config::spec::LandlockMode;
use crate::host::cgroup;
use crate::host::dirs::Dir;
use crate::host::sys::{SysContext, SysError};
use crate::identity::principal::Principal;
use crate::identity::registry::IdRange;
use crate::instance::lease::Lease;
use crate::launch::syscall::Syscall;
use crate::launch::{landlock, reach, sandbox, seccomp, EXEC_PATH};

mod broker;
mod own_sandbox;
mod owned;
mod shape;
mod share_root;

pub use broker::BROKER_CAPS;
pub use owned::{guest_owned, KEPT_CAPS, NS_CAPS};
pub use shape::{
    need_proc_sys, plan, Arg, Channel, Filter, Helper, HelperKind, Own, Program, Root, Shape,
    Share, OWN_CODE, TABLE,
};
use share_root::{confine_to_share, share_namespace};

/// How long a helper may take to exec and (vhost-device-vsock) to make its
/// sockets. Here virtiofsd execs in ~2 ms and vhost-device-vsock binds in
/// ~10 ms; the bound only turns a hang into an error naming the helper.
pub const START_TIMEOUT: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(2);

/// A helper that could not be started.
#[derive(Debug, thiserror::Error)]
pub enum HelperError {
    #[error("{helper}: {source}")]
    Sys {
        helper: String,
        #[source]
        source: SysError,
    },
    /// The child failed before `execve` (or `execve` itself); `detail` is
    /// what it reported through the status pipe.
    #[error("{helper} ({binary}): not started: {detail}")]
    Setup {
        helper: String,
        binary: PathBuf,
        detail: String,
    },
    #[error("{helper} ({binary}) exited ({status}) before its socket {socket} appeared; its own messages are in the launcher's log")]
    Exited {
        helper: String,
        binary: PathBuf,
        socket: PathBuf,
        status: String,
    },
    /// The helper's own root could not be made, or is not its share.
    #[error("{helper} ({binary}): cannot confine it to its share {share}: {detail}")]
    Confine {
        helper: String,
        binary: PathBuf,
        share: PathBuf,
        detail: String,
    },
    /// A helper with no socket to wait for exited while it started.
    #[error("{helper} ({binary}) exited ({status}) before {what}; its own messages are in the launcher's log")]
    ExitedBefore {
        helper: String,
        binary: PathBuf,
        what: &'static str,
        status: String,
    },
    /// A [`Root::OwnSandbox`] helper runs, but not in a sandbox of its own.
    #[error("{helper} ({binary}) has not sandboxed itself: {detail}")]
    NotSandboxed {
        helper: String,
        binary: PathBuf,
        detail: String,
    },
    #[error("{helper} ({binary}): {what} within {secs} s")]
    Timeout {
        helper: String,
        binary: PathBuf,
        what: String,
        secs: u64,
    },
}

/// What a helper child needs from the launch.
pub struct Context<'a> {
    /// The privileged calls of the child (the launch's seam; the fork
    /// itself is not one of them).
    pub sys: &'a dyn Syscall,
    pub principal: &'a Principal,
    pub lease: &'a Lease,
    pub control: &'a Dir,
    /// Trees the principal can write (state and control dir): Landlock rule
    /// paths inside them are opened without following symlinks.
    pub vm_trees: &'a [PathBuf],
    pub landlock: LandlockMode,
    /// [`Filter::Launcher`]'s programs.
    pub seccomp: &'a [BpfProgram],
    /// [`Filter::SelfSandboxing`]'s programs.
    pub seccomp_self_sandboxing: &'a [BpfProgram],
    /// What the daemon of each share the guest owns needs (`owned`);
    /// `None` when the VM has no such share.
    pub owned: Option<Owned<'a>>,
}

/// The VM's own id range and the filters of the daemon of a share the
/// guest owns ([`seccomp::Role::OwnedVirtiofsd`]).
#[derive(Debug, Clone, Copy)]
pub struct Owned<'a> {
    pub ids: IdRange,
    pub seccomp: &'a [BpfProgram],
}

impl Context<'_> {
    /// The programs of seccomp filter `f`, in installation order.
    fn programs(&self, f: Filter) -> &[BpfProgram] {
        match f {
            Filter::Launcher => self.seccomp,
            Filter::SelfSandboxing => self.seccomp_self_sandboxing,
        }
    }
}

impl std::fmt::Debug for Context<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("principal", self.principal)
            .field("control", &self.control.path)
            .field("vm_trees", &self.vm_trees)
            .field("landlock", &self.landlock)
            .finish_non_exhaustive()
    }
}

/// A started helper: its pid (the hypervisor's child once the launcher
/// has exec'd), how long it took until it was ready, and for a
/// [`Channel::Pair`] helper the hypervisor's end of the pair
/// (close-on-exec until the launcher's `execve` inherits it).
#[derive(Debug)]
pub struct Started {
    pub pid: Pid,
    pub took: Duration,
    pub hypervisor_end: Option<OwnedFd>,
}

/// Start every helper, in order; each is ready (exec'd, and its sockets
/// made) before the next is forked.
pub fn start_all(helpers: &[Helper], ctx: &Context<'_>) -> Result<Vec<Started>, HelperError> {
    helpers.iter().map(|h| start(h, ctx)).collect()
}

fn start(h: &Helper, ctx: &Context<'_>) -> Result<Started, HelperError> {
    let t0 = Instant::now();
    let sys = |source: SysError| HelperError::Sys {
        helper: h.name(),
        source,
    };
    let shape = h.shape();
    // Stale sockets of a dead instance (cleanup normally removed them).
    for p in &h.sockets {
        remove_stale(ctx.control, p).map_err(sys)?;
    }
    // What root hands the daemon as an fd, and the hypervisor's end.
    let (handed, hypervisor_end) = match (shape.channel, h.socket()) {
        (Channel::Listener, Some(socket)) => (
            Some(bind_listener(ctx.control, socket, ctx.principal).map_err(sys)?),
            None,
        ),
        (Channel::Pair, _) => {
            let (daemon, hypervisor) = socketpair(
                AddressFamily::Unix,
                SockType::Stream,
                None,
                SockFlag::SOCK_CLOEXEC,
            )
            .sys("socketpair(AF_UNIX)", &h.binary)
            .map_err(sys)?;
            (Some(daemon), Some(hypervisor))
        }
        _ => (None, None),
    };
    let fd = handed.as_ref().map(AsRawFd::as_raw_fd);
    let argv = h.argv(fd);
    let cstr = |s: &str| {
        CString::new(s).map_err(|_| HelperError::Setup {
            helper: h.name(),
            binary: h.binary.clone(),
            detail: format!("argument {s:?} contains a NUL byte"),
        })
    };
    let c_argv = argv
        .iter()
        .map(|a| cstr(a))
        .collect::<Result<Vec<_>, _>>()?;
    let c_env = [cstr(EXEC_PATH)?];
    let c_prog = cstr(&h.binary.to_string_lossy())?;
    let policy = h.policy(&ctx.control.path, ctx.vm_trees);
    // No supplementary group: the kvm group is the hypervisor's only.
    let principal = Principal {
        groups: Vec::new(),
        ..ctx.principal.clone()
    };
    let (status_r, status_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)
        .sys("pipe2", &ctx.control.path)
        .map_err(sys)?;
    let parent = nix::unistd::getpid();
    // A share the guest owns: the launcher writes the child's id map.
    let owned_ids = match (guest_owned(h), ctx.owned) {
        (true, Some(o)) => Some(o),
        (true, None) => {
            return Err(HelperError::Setup {
                helper: h.name(),
                binary: h.binary.clone(),
                detail: "the guest owns this share, but the VM has no id range".into(),
            })
        }
        (false, _) => None,
    };
    let sync = owned_ids
        .map(|_| owned::Sync::new())
        .transpose()
        .sys("pipe2", &ctx.control.path)
        .map_err(sys)?;
    ctx.sys
        .assert_single_threaded()
        .map_err(|e| HelperError::Setup {
            helper: h.name(),
            binary: h.binary.clone(),
            detail: e.to_string(),
        })?;
    // SAFETY: the launcher is single-threaded (checked just above), so the
    // child is a complete copy with no lock held by another thread; it only
    // runs the launcher's own code until it execs or exits.
    match unsafe { nix::unistd::fork() }
        .sys("fork", &h.binary)
        .map_err(sys)?
    {
        ForkResult::Child => {
            drop(status_r);
            let share = match shape.root {
                Root::Share => h.share.as_ref().map(|s| (s.source.as_path(), s.read_only)),
                Root::Vm | Root::OwnSandbox => None,
            };
            let confined = child(
                &principal,
                parent,
                &policy,
                ctx,
                ctx.programs(shape.filter),
                handed,
                share,
                sync.map(owned::Sync::child),
                Run {
                    program: shape.program,
                    name: shape.name,
                    status: status_w.as_raw_fd(),
                    prog: &c_prog,
                    argv: &c_argv,
                    env: &c_env,
                },
            );
            match (confined, shape.program) {
                // vmwarden's own code, confined: closing the status pipe
                // tells the launcher it started.
                (Ok(own), Program::Own { main, .. }) => {
                    drop(status_w);
                    let code = main(own);
                    // SAFETY: _exit ends this forked child at once, without
                    // running the parent's atexit handlers or flushing its
                    // buffers twice.
                    unsafe { libc::_exit(code) }
                }
                (Ok(_), Program::Exec) => {}
                (Err(msg), _) => {
                    let _ = nix::unistd::write(&status_w, msg.as_bytes());
                }
            }
            // SAFETY: as above.
            unsafe { libc::_exit(127) }
        }
        ForkResult::Parent { child } => {
            drop(status_w);
            // The hypervisor must not hold a helper's end: its listening
            // socket, or the daemon's end of a pair.
            drop(handed);
            let sync = sync.map(owned::Sync::parent);
            let fail = |e: HelperError| {
                let _ = nix::sys::signal::kill(child, Signal::SIGKILL);
                let _ = waitpid(child, None);
                e
            };
            if let (Some(o), Some(sync)) = (owned_ids, &sync) {
                // false: the child ended first; wait_started says why.
                if !owned::map_ids(h, child, &o.ids, &principal, sync, t0).map_err(fail)? {
                    wait_started(h, child, status_r, t0)?;
                    return Err(fail(HelperError::Exited {
                        helper: h.name(),
                        binary: h.binary.clone(),
                        socket: h.socket().map(Path::to_path_buf).unwrap_or_default(),
                        status: "before its user namespace was mapped".into(),
                    }));
                }
            }
            wait_started(h, child, status_r, t0)?;
            match (shape.root, &h.share) {
                (Root::Share, Some(share)) => {
                    confine_to_share(h, child, &share.source, t0).map_err(fail)?;
                }
                (Root::OwnSandbox, _) => {
                    own_sandbox::wait(h, child, ctx.programs(shape.filter).len(), t0)
                        .map_err(fail)?;
                }
                _ => {}
            }
            // A share the guest owns: its set-group-ID chmods go to a
            // broker of their own, started once it is rooted in its share.
            if let Some(sync) = sync {
                let listener = owned::listener(h, &sync).map_err(fail)?;
                let b = broker::start(h, child, listener, ctx, t0).map_err(fail)?;
                tracing::debug!(helper = %h.name(), broker = b.as_raw(), "broker started");
            }
            if shape.channel == Channel::OwnSockets {
                for s in &h.sockets {
                    wait_socket(h, child, ctx.control, s, t0)?;
                }
            }
            Ok(Started {
                pid: child,
                took: t0.elapsed(),
                hypervisor_end,
            })
        }
    }
}

/// What the child runs once confined, and how it reports.
struct Run<'a> {
    program: Program,
    /// The entry's name (the process's `comm` for vmwarden's own code).
    name: &'static str,
    /// The status pipe's write end: kept open by vmwarden's own code until
    /// it is confined (an exec'd binary closes it by `execve`).
    status: RawFd,
    prog: &'a CString,
    argv: &'a [CString],
    env: &'a [CString],
}

/// The child's way to `execve` (an exec'd helper: returns only with what
/// went wrong) or to its confined state (vmwarden's own code: returns what
/// its `main` is given).
#[allow(clippy::too_many_arguments)]
fn child(
    principal: &Principal,
    parent: Pid,
    policy: &landlock::Policy,
    ctx: &Context<'_>,
    filter: &[BpfProgram],
    handed: Option<OwnedFd>,
    share: Option<(&Path, bool)>,
    owned: Option<owned::ChildSync>,
    run: Run<'_>,
) -> Result<Own, String> {
    match share {
        Some((share, read_only)) => {
            share_namespace(ctx.sys, share, read_only).map_err(|e| e.to_string())?;
            nix::unistd::chdir(share).map_err(|e| format!("chdir {}: {e}", share.display()))?;
        }
        None => nix::unistd::chdir("/").map_err(|e| format!("chdir /: {e}"))?,
    }
    // A share the guest owns: root of a user namespace of its own.
    let owned = match owned {
        Some(sync) => Some(owned::enter(ctx.sys, sync, principal)?),
        None => {
            sandbox::drop_privileges_with(ctx.sys, principal).map_err(|e| e.to_string())?;
            None
        }
    };
    // After the drop: changing credentials clears the death signal.
    nix::sys::prctl::set_pdeathsig(Some(Signal::SIGKILL))
        .map_err(|e| format!("prctl(PR_SET_PDEATHSIG): {e}"))?;
    // A handle on the launcher, which becomes the hypervisor: opened
    // before the parent check below, which proves it is that process and
    // not one that took its pid.
    let hypervisor = match run.program {
        Program::Own {
            ends_hypervisor: true,
            ..
        } => Some(
            cgroup::pidfd_open(u32::try_from(parent.as_raw()).unwrap_or(0))
                .ok_or_else(|| format!("pidfd_open({parent}): {}", Errno::last()))?,
        ),
        _ => None,
    };
    if nix::unistd::getppid() != parent {
        return Err("the launcher died while the helper was starting".into());
    }
    let outcome = ctx
        .sys
        .landlock_restrict(policy, ctx.landlock)
        .map_err(|e| e.to_string())?;
    match owned {
        // Its own role's filters, then the one that hands its
        // set-group-ID chmods to its broker.
        Some(o) => o.filters(ctx.sys, ctx.owned.map_or(&[], |x| x.seccomp))?,
        None => seccomp::apply(ctx.sys, filter).map_err(|e| e.to_string())?,
    }
    let mut keep = vec![ctx.lease.inherit_across_exec().map_err(|e| e.to_string())?];
    keep.extend(handed.as_ref().map(AsRawFd::as_raw_fd));
    match run.program {
        Program::Exec => {
            // The socket the parent made for the daemon (a listening
            // socket, or its end of a pair) stays open across execve.
            if let Some(fd) = &handed {
                fcntl(fd, FcntlArg::F_SETFD(FdFlag::empty()))
                    .map_err(|e| format!("fcntl(F_SETFD) of the socket it is handed: {e}"))?;
            }
            sandbox::cloexec_all_but(ctx.sys, &keep).map_err(|e| e.to_string())?;
            let e = ctx.sys.execve(run.prog, run.argv, run.env);
            Err(format!("execve {}: {e}", run.prog.to_string_lossy()))
        }
        Program::Own { .. } => {
            // Its domain grants no file access: prove it where Landlock is
            // enforced at all, before it reads a byte from the guest.
            if outcome != landlock::Outcome::NotEnforced {
                if let Ok(fd) = nix::fcntl::open(
                    "/",
                    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
                    Mode::empty(),
                ) {
                    drop(fd);
                    return Err("its Landlock domain lets it read `/`; refusing to run it".into());
                }
            }
            keep.push(run.status);
            keep.extend(hypervisor.as_ref().map(AsRawFd::as_raw_fd));
            sandbox::close_all_but(&keep)?;
            let comm = CString::new(run.name).map_err(|_| format!("{:?} holds a NUL", run.name))?;
            nix::sys::prctl::set_name(&comm).map_err(|e| format!("prctl(PR_SET_NAME): {e}"))?;
            // A write to a closed stream is an error, not a signal.
            // SAFETY: setting SIGPIPE's disposition installs no handler.
            unsafe { nix::sys::signal::signal(Signal::SIGPIPE, SigHandler::SigIgn) }
                .map_err(|e| format!("signal(SIGPIPE): {e}"))?;
            reach::try_all(run.name);
            Ok(Own { handed, hypervisor })
        }
    }
}

/// Read the status pipe until it closes: empty means `execve` succeeded
/// (the pipe was close-on-exec); anything else is the child's error.
fn wait_started(h: &Helper, child: Pid, r: OwnedFd, t0: Instant) -> Result<(), HelperError> {
    let mut msg = Vec::new();
    loop {
        let mut buf = [0u8; 1024];
        match nix::unistd::read(&r, &mut buf) {
            Ok(0) => break,
            Ok(n) => msg.extend_from_slice(&buf[..n]),
            Err(Errno::EINTR) => {}
            Err(Errno::EAGAIN) => {
                if t0.elapsed() >= START_TIMEOUT {
                    let _ = nix::sys::signal::kill(child, Signal::SIGKILL);
                    let _ = waitpid(child, None);
                    return Err(timeout(h, "did not exec".into()));
                }
                std::thread::sleep(POLL);
            }
            Err(_) => break,
        }
    }
    if msg.is_empty() {
        return Ok(());
    }
    let _ = waitpid(child, None);
    Err(HelperError::Setup {
        helper: h.name(),
        binary: h.binary.clone(),
        detail: String::from_utf8_lossy(&msg).into_owned(),
    })
}

fn timeout(h: &Helper, what: String) -> HelperError {
    HelperError::Timeout {
        helper: h.name(),
        binary: h.binary.clone(),
        what,
        secs: START_TIMEOUT.as_secs(),
    }
}

/// Poll (short sleeps, bounded) until `socket` in the control dir is a
/// socket; the helper exiting first is an error naming it.
fn wait_socket(
    h: &Helper,
    child: Pid,
    control: &Dir,
    socket: &Path,
    t0: Instant,
) -> Result<(), HelperError> {
    let name = socket.file_name().unwrap_or_default();
    let is_socket = || {
        fstatat(control.fd.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW).is_ok_and(|st| {
            SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) == SFlag::S_IFSOCK
        })
    };
    let exited = |status: String| HelperError::Exited {
        helper: h.name(),
        binary: h.binary.clone(),
        socket: socket.to_path_buf(),
        status,
    };
    match poll_while_alive(child, t0, is_socket) {
        Ok(()) => Ok(()),
        Err(Ended::Exited(status)) => Err(exited(format!("{status:?}"))),
        Err(Ended::WaitFailed(e)) => Err(exited(format!("waitpid: {e}"))),
        Err(Ended::TimedOut) => {
            let _ = nix::sys::signal::kill(child, Signal::SIGKILL);
            let _ = waitpid(child, None);
            Err(timeout(
                h,
                format!("its socket {} did not appear", socket.display()),
            ))
        }
    }
}

/// How a helper's start ended before what its launcher waited for.
pub(super) enum Ended {
    /// It exited (or was killed) first.
    Exited(WaitStatus),
    /// `waitpid` on it failed.
    WaitFailed(Errno),
    /// [`START_TIMEOUT`] from the start passed.
    TimedOut,
}

/// Poll, in short sleeps, until `ready()` holds, while helper `child`
/// (started at `t0`) lives: the one wait of every step that waits for a
/// helper (its socket, its share opened, its own sandbox).
pub(super) fn poll_while_alive(
    child: Pid,
    t0: Instant,
    mut ready: impl FnMut() -> bool,
) -> Result<(), Ended> {
    loop {
        if ready() {
            return Ok(());
        }
        match waitpid(child, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => {}
            Ok(status) => return Err(Ended::Exited(status)),
            Err(e) => return Err(Ended::WaitFailed(e)),
        }
        if t0.elapsed() >= START_TIMEOUT {
            return Err(Ended::TimedOut);
        }
        std::thread::sleep(POLL);
    }
}

/// Remove `control/<name of path>` if it exists (never following a symlink).
fn remove_stale(control: &Dir, path: &Path) -> Result<(), SysError> {
    let name = path.file_name().unwrap_or_default();
    match nix::unistd::unlinkat(
        control.fd.as_fd(),
        name,
        nix::unistd::UnlinkatFlags::NoRemoveDir,
    ) {
        Ok(()) | Err(Errno::ENOENT) => Ok(()),
        Err(e) => Err(e).sys("unlink stale", path),
    }
}

/// A listening Unix socket at `path` in the control dir (reached through
/// the dir's fd, not its path), the principal's, mode 0600.
fn bind_listener(control: &Dir, path: &Path, p: &Principal) -> Result<OwnedFd, SysError> {
    let fd = bind_unix(control, path)?;
    let name = path.file_name().unwrap_or_default();
    nix::unistd::fchownat(
        control.fd.as_fd(),
        name,
        Some(Uid::from_raw(p.uid)),
        Some(Gid::from_raw(p.gid)),
        AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .sys("fchownat", path)?;
    listen(&fd, Backlog::new(8).unwrap_or(Backlog::MAXCONN)).sys("listen", path)?;
    Ok(fd)
}

/// A Unix stream socket bound at `path` in the control dir (reached
/// through the dir's fd, not its path), close-on-exec, not yet listening:
/// root's, mode 0600, until the caller hands it on.
pub(super) fn bind_unix(control: &Dir, path: &Path) -> Result<OwnedFd, SysError> {
    let name = path.file_name().unwrap_or_default();
    let via = PathBuf::from(format!("/proc/self/fd/{}", control.fd.as_raw_fd())).join(name);
    let fd = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .sys("socket(AF_UNIX)", path)?;
    let addr = UnixAddr::new(&via).sys("socket address", path)?;
    let old = umask(Mode::from_bits_truncate(0o177));
    let bound = bind(fd.as_raw_fd(), &addr);
    umask(old);
    bound.sys("bind", path)?;
    Ok(fd)
}

#[cfg(test)]
mod tests;
