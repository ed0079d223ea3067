//! The filter that hands the set-group-ID `chmod`s of a share the guest
//! owns to that share's broker (`launch/helpers/broker.rs`).
//!
//! A guest's `chmod g+s` reaches virtiofsd as a FUSE SETATTR, which it
//! turns into `fchmodat(proc_self_fd, "N", mode, 0)` whether `N` is a
//! directory or a file: seccomp cannot tell them apart, and only a
//! directory may get the bit (a set-group-ID *file* on the host would run
//! with the group of whoever owns it). So for that virtiofsd alone the
//! launcher's filter lets a set-group-ID mode through ([`super::Role`]),
//! and this one, installed after it with `SECCOMP_FILTER_FLAG_NEW_LISTENER`,
//! answers `chmod`, `fchmod`, `fchmodat` and `fchmodat2` with:
//!
//! * a set-user-ID bit in the mode: EPERM (never, anywhere);
//! * a set-group-ID bit: a user notification, which blocks the call until
//!   the broker answers (it makes the change itself on an fd it opened
//!   with `O_DIRECTORY`, so a file is refused whatever the memory the
//!   call's path points to says by then); with no broker listening, the
//!   kernel answers ENOSYS;
//! * anything else: allowed.
//!
//! seccomp's order of precedence puts EPERM above a notification, which is
//! why the launcher's filter must not refuse the bit for this process.

use std::os::fd::{FromRawFd, OwnedFd};

use nix::errno::Errno;
use seccompiler::{sock_filter, BpfProgram};

use super::CHMOD_SYSCALLS;

const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JMP_JEQ_K: u16 = 0x05 | 0x10;
const BPF_JMP_JSET_K: u16 = 0x05 | 0x40;
const BPF_JMP_JA: u16 = 0x05;
const BPF_RET_K: u16 = 0x06;

/// Offset of the low 32 bits of argument `i` in `struct seccomp_data` (a
/// little-endian `u64` each, after `nr`, `arch` and `instruction_pointer`).
fn arg_low(i: u8) -> u32 {
    16 + 8 * u32::from(i)
}

/// The program (see the module docs), for this build's architecture;
/// empty where there is none it knows.
pub fn program() -> BpfProgram {
    let Some(arch) = super::AUDIT_ARCH_NATIVE else {
        return Vec::new();
    };
    let ins = |code, jt, jf, k| sock_filter { code, jt, jf, k };
    let n = CHMOD_SYSCALLS.len();
    // Layout: 0 load arch, 1 check it, 2 load nr, 3..3+n one test per
    // call, then ALLOW, LOAD_ARG1 (+ JA), LOAD_ARG2, then the mode check.
    let allow = 3 + n;
    let load1 = allow + 1;
    let load2 = load1 + 2;
    let check = load2 + 1;
    let rel = |from: usize, to: usize| u8::try_from(to - from - 1).expect("a short program");
    let mut p = vec![
        ins(BPF_LD_W_ABS, 0, 0, 4),
        ins(BPF_JMP_JEQ_K, 0, rel(1, allow), arch),
        ins(BPF_LD_W_ABS, 0, 0, 0),
    ];
    for (i, (_, nr, arg)) in CHMOD_SYSCALLS.iter().enumerate() {
        let at = 3 + i;
        let to = if *arg == 1 { load1 } else { load2 };
        let nr = u32::try_from(*nr).expect("a system call number");
        p.push(ins(BPF_JMP_JEQ_K, rel(at, to), 0, nr));
    }
    p.push(ins(BPF_RET_K, 0, 0, libc::SECCOMP_RET_ALLOW));
    p.push(ins(BPF_LD_W_ABS, 0, 0, arg_low(1)));
    p.push(ins(BPF_JMP_JA, 0, 0, u32::from(rel(load1 + 1, check))));
    p.push(ins(BPF_LD_W_ABS, 0, 0, arg_low(2)));
    let suid = u32::try_from(super::S_ISUID).expect("a mode bit");
    let sgid = u32::try_from(super::S_ISGID).expect("a mode bit");
    p.push(ins(BPF_JMP_JSET_K, 0, 1, suid));
    p.push(ins(
        BPF_RET_K,
        0,
        0,
        libc::SECCOMP_RET_ERRNO | libc::EPERM as u32,
    ));
    p.push(ins(BPF_JMP_JSET_K, 0, 1, sgid));
    p.push(ins(BPF_RET_K, 0, 0, libc::SECCOMP_RET_USER_NOTIF));
    p.push(ins(BPF_RET_K, 0, 0, libc::SECCOMP_RET_ALLOW));
    debug_assert_eq!(p.len(), check + 5);
    p
}

/// Install `prog` on the calling thread with a listener: its fd, which the
/// broker reads notifications from. Needs `no_new_privs` (set by then).
pub fn install(prog: &BpfProgram) -> Result<OwnedFd, Errno> {
    let fprog = libc::sock_fprog {
        len: u16::try_from(prog.len()).map_err(|_| Errno::E2BIG)?,
        filter: prog.as_ptr().cast_mut().cast(),
    };
    // SAFETY: seccomp(2) reads `fprog`, which points at `prog`'s
    // instructions; both outlive the call. The result is checked.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_NEW_LISTENER,
            &raw const fprog,
        )
    };
    let fd = Errno::result(fd)?;
    let fd = i32::try_from(fd).map_err(|_| Errno::EBADF)?;
    // SAFETY: seccomp returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The system calls the broker's loop makes (`launch/helpers/broker.rs`):
/// wait for and answer notifications, read the caller's memory and fds,
/// open a directory, change its mode, close, allocate, exit. Only these;
/// anything else kills it.
pub const BROKER_ALLOWED: &[(&str, i64)] = &[
    #[cfg(target_arch = "x86_64")]
    ("poll", libc::SYS_poll),
    ("ppoll", libc::SYS_ppoll),
    ("ioctl", libc::SYS_ioctl),
    ("process_vm_readv", libc::SYS_process_vm_readv),
    ("pidfd_getfd", libc::SYS_pidfd_getfd),
    ("openat", libc::SYS_openat),
    ("fcntl", libc::SYS_fcntl),
    ("fchmod", libc::SYS_fchmod),
    ("close", libc::SYS_close),
    ("mmap", libc::SYS_mmap),
    ("munmap", libc::SYS_munmap),
    ("mremap", libc::SYS_mremap),
    ("madvise", libc::SYS_madvise),
    ("brk", libc::SYS_brk),
    ("rt_sigreturn", libc::SYS_rt_sigreturn),
    ("restart_syscall", libc::SYS_restart_syscall),
    ("exit", libc::SYS_exit),
    ("exit_group", libc::SYS_exit_group),
];

/// The broker's allowlist ([`BROKER_ALLOWED`]), installed last.
pub fn broker_allowlist() -> Result<BpfProgram, seccompiler::BackendError> {
    use seccompiler::{SeccompAction, SeccompFilter};
    let map = BROKER_ALLOWED
        .iter()
        .map(|(_, nr)| (*nr, Vec::new()))
        .collect();
    let arch = seccompiler::TargetArch::try_from(std::env::consts::ARCH)?;
    let f = SeccompFilter::new(map, SeccompAction::KillProcess, SeccompAction::Allow, arch)?;
    f.try_into()
}
