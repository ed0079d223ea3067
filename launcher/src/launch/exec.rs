//! The last step: the program resolved, every fd but the inherited ones
//! closed on exec, and `execve`.

use std::convert::Infallible;
use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::host::dirs::Dir;
use crate::host::net;
use crate::host::sys::SysContext;
use crate::hypervisor::ch_reboot;
use crate::identity::principal::Principal;
use crate::instance::lease::Lease;
use crate::launch::syscall::Syscall;
use crate::launch::{sandbox, StepError, EXEC_STEP};

type Result<T, E = StepError> = std::result::Result<T, E>;

/// Environment the hypervisor (or probe command) gets: nothing but a PATH.
pub const EXEC_PATH: &str = "PATH=/run/current-system/sw/bin:/usr/local/bin:/usr/bin:/bin";

fn resolve_program(arg0: &str) -> PathBuf {
    if arg0.contains('/') {
        return PathBuf::from(arg0);
    }
    for dir in EXEC_PATH.trim_start_matches("PATH=").split(':') {
        let p = Path::new(dir).join(arg0);
        if p.is_file() {
            return p;
        }
    }
    PathBuf::from(arg0)
}

pub fn exec(
    sys: &dyn Syscall,
    argv: &[String],
    lease: &Lease,
    taps: &[net::Tap],
    inherit: &[&std::os::fd::OwnedFd],
    principal: &Principal,
    state_dir: &Dir,
) -> Result<Infallible> {
    let Some(arg0) = argv.first() else {
        return Err(StepError::Usage("--probe: needs a command after --"));
    };
    let program = resolve_program(arg0);
    let cstr = |s: &str| CString::new(s).map_err(|_| StepError::NulInArgument(s.to_string()));
    let c_argv = argv.iter().map(|a| cstr(a)).collect::<Result<Vec<_>>>()?;
    let c_env = [cstr(EXEC_PATH)?];
    let c_prog = CString::new(program.as_os_str().as_encoded_bytes())
        .map_err(|_| StepError::NulInProgram(program.clone()))?;
    // The working directory is the VM's state dir (the principal's own),
    // by path: inside this namespace it is reached through the bind mount.
    sys.chdir(&state_dir.path).sys("chdir", &state_dir.path)?;
    let mut keep = vec![lease.inherit_across_exec()?];
    for fd in taps.iter().flat_map(net::Tap::fds) {
        keep.push(net::inherit_across_exec(fd)?);
    }
    for fd in inherit {
        use nix::fcntl::{fcntl, FcntlArg, FdFlag};
        fcntl(*fd, FcntlArg::F_SETFD(FdFlag::empty())).sys(
            "fcntl(F_SETFD, 0)",
            format!("/proc/self/fd/{}", fd.as_raw_fd()),
        )?;
        keep.push(fd.as_raw_fd());
    }
    sandbox::cloexec_all_but(sys, &keep)?;
    tracing::info!(
        step = %EXEC_STEP,
        uid = principal.uid,
        program = %program.display(),
        "exec"
    );
    // Whatever the hypervisor creates is the principal's alone: a memory
    // snapshot (`vmwarden hibernate`) holds the guest's RAM, credentials
    // included, and is 0600 as the hypervisor writes it.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    let errno = sys.execve(&c_prog, &c_argv, &c_env);
    Err(StepError::Exec {
        path: program,
        errno,
    })
}

/// reboot-watch's signal (`hypervisor::ch_reboot::SIGNAL`) at its default
/// disposition and unblocked in this thread, so that the hypervisor
/// inherits it so across `execve` and ends by it (`config::reboot`).
pub fn default_reboot_signal() -> nix::Result<()> {
    use nix::sys::signal::{SigHandler, SigSet, Signal};
    let sig = Signal::try_from(ch_reboot::SIGNAL)?;
    // SAFETY: SIG_DFL installs no handler; the launcher has none of its own
    // for this signal, and nothing in this process relies on ignoring it.
    unsafe { nix::sys::signal::signal(sig, SigHandler::SigDfl) }?;
    let mut set = SigSet::empty();
    set.add(sig);
    set.thread_unblock()
}
