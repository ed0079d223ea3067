//! The launcher's own seccomp filters, installed last (after Landlock), on
//! top of whatever the hypervisor installs itself (filters stack; the
//! strictest answer wins). They hold with or without a systemd unit around
//! the launcher: under `--probe`, under any supervisor, started by hand.
//!
//! What the hypervisor (and everything it runs) cannot do:
//!
//! * Turn its tap fds against the host: make a tap persistent (so it
//!   outlives the VM), hand it to another owner, or set the host-side MAC
//!   (a tap claiming the router's MAC takes a bridge's traffic). The ioctls
//!   a hypervisor uses on a tap (TUNGETIFF, TUNSETOFFLOAD, …) stay allowed.
//! * Create namespaces: `unshare` and `clone` with any `CLONE_NEW*` flag,
//!   and `setns`, are refused (EPERM). A user namespace would give it a
//!   root of its own to attack the kernel with, and a mount or network
//!   namespace would outlive nothing vmwarden can see. `clone3` answers
//!   ENOSYS: its flags live in memory seccomp cannot read, and glibc (and
//!   Rust's std) fall back to `clone`, whose flags it can.
//! * Open sockets other than `AF_UNIX` (EAFNOSUPPORT, as systemd's
//!   RestrictAddressFamilies= answers): no IP, netlink, packet or vsock
//!   socket. Taps arrive as fds and the control socket is a Unix socket, so
//!   QEMU needs nothing else; no spec field asks for more today.
//! * Use the kernel keyrings (`add_key`, `request_key`, `keyctl`: EPERM).
//!   The per-uid keyring outlives every process of the uid: data stashed
//!   there survived stop, cleanup and purge and was read by the next VM
//!   given the same uid.
//! * Read or write another process's memory, or take its fds: `ptrace`,
//!   `process_vm_readv`/`writev`, `pidfd_getfd` (EPERM). The hypervisor
//!   cannot be made non-dumpable from outside (`execve` resets the flag);
//!   this denies what non-dumpable would deny to a process of the same uid.
//! * Use io_uring (EPERM): its operations bypass seccomp's per-syscall view
//!   (an `IORING_OP_SOCKET` is a socket this filter never sees). QEMU falls
//!   back to ppoll/threads when io_uring is unavailable.
//! * On x86_64, use the x32 syscall ABI (ENOSYS): x32 numbers carry bit 30
//!   and would match none of the rules above. (Other architectures' ABIs
//!   fail seccompiler's architecture check, which kills the process.)

use std::collections::BTreeMap;

use seccompiler::{
    sock_filter, BackendError, BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp,
    SeccompCondition, SeccompFilter, SeccompRule, TargetArch,
};

use crate::launch::syscall::Syscall;

/// The filters could not be built or installed.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("seccomp: unsupported architecture: {0:?}")]
    Arch(#[source] BackendError),
    #[error("seccomp: {0}")]
    Compile(#[from] BackendError),
    #[error("seccomp: {0}")]
    Install(#[from] seccompiler::Error),
}

type Result<T, E = SeccompError> = std::result::Result<T, E>;

/// `ioctl` requests refused with EPERM (include/uapi/linux/if_tun.h,
/// sockios.h): the low 32 bits are compared, as the kernel reads `cmd` as
/// an unsigned int.
pub const DENIED_IOCTLS: &[(&str, u64)] = &[
    ("TUNSETIFF", 0x4004_54ca),
    ("TUNSETPERSIST", 0x4004_54cb),
    ("TUNSETOWNER", 0x4004_54cc),
    ("TUNSETLINK", 0x4004_54cd),
    ("TUNSETGROUP", 0x4004_54ce),
    ("TUNSETIFINDEX", 0x4004_54da),
    ("TUNSETCARRIER", 0x4004_54e2),
    ("SIOCSIFHWADDR", 0x8924),
];

/// Every namespace flag `unshare` takes (CLONE_NEWTIME shares its bit
/// with the exit-signal byte of `clone`, so it is checked for `unshare`
/// only; `clone` cannot create a time namespace).
/// (include/uapi/linux/sched.h; the unit tests compare them with libc's.)
pub const NAMESPACE_FLAGS: &[(&str, u64)] = &[
    ("CLONE_NEWNS", 0x0002_0000),
    ("CLONE_NEWCGROUP", 0x0200_0000),
    ("CLONE_NEWUTS", 0x0400_0000),
    ("CLONE_NEWIPC", 0x0800_0000),
    ("CLONE_NEWUSER", 0x1000_0000),
    ("CLONE_NEWPID", 0x2000_0000),
    ("CLONE_NEWNET", 0x4000_0000),
];
pub const CLONE_NEWTIME: u64 = 0x80;

/// Socket families the hypervisor may open (AF_UNIX is 1).
pub const ALLOWED_FAMILIES: &[u64] = &[1];

/// The errnos the filters answer with (include/uapi/asm-generic/errno*.h).
const EPERM: u32 = 1;
const ENOSYS: u32 = 38;
const EAFNOSUPPORT: u32 = 97;

/// Syscalls refused outright with EPERM.
pub const DENIED_SYSCALLS: &[(&str, i64)] = &[
    ("setns", libc::SYS_setns),
    ("add_key", libc::SYS_add_key),
    ("request_key", libc::SYS_request_key),
    ("keyctl", libc::SYS_keyctl),
    ("ptrace", libc::SYS_ptrace),
    ("process_vm_readv", libc::SYS_process_vm_readv),
    ("process_vm_writev", libc::SYS_process_vm_writev),
    ("pidfd_getfd", libc::SYS_pidfd_getfd),
    ("io_uring_setup", libc::SYS_io_uring_setup),
    ("io_uring_enter", libc::SYS_io_uring_enter),
    ("io_uring_register", libc::SYS_io_uring_register),
];

fn arch() -> Result<TargetArch> {
    TargetArch::try_from(std::env::consts::ARCH).map_err(SeccompError::Arch)
}

fn masked(arg: u8, bit: u64) -> Result<SeccompRule> {
    let c = SeccompCondition::new(
        arg,
        SeccompCmpArgLen::Dword,
        SeccompCmpOp::MaskedEq(bit),
        bit,
    )?;
    Ok(SeccompRule::new(vec![c])?)
}

fn build(map: BTreeMap<i64, Vec<SeccompRule>>, errno: u32) -> Result<BpfProgram> {
    let filter = SeccompFilter::new(
        map,
        SeccompAction::Allow,
        SeccompAction::Errno(errno),
        arch()?,
    )?;
    Ok(filter.try_into()?)
}

/// On x86_64: every syscall number with the x32 bit answers ENOSYS.
#[cfg(target_arch = "x86_64")]
fn x32_filter() -> BpfProgram {
    // BPF_LD | BPF_W | BPF_ABS, BPF_JMP | BPF_JEQ/BPF_JGE | BPF_K, BPF_RET | BPF_K.
    const BPF_LD_W_ABS: u16 = 0x20;
    const BPF_JMP_JEQ_K: u16 = 0x05 | 0x10;
    const BPF_JMP_JGE_K: u16 = 0x05 | 0x30;
    const BPF_RET_K: u16 = 0x06;
    const AUDIT_ARCH_X86_64: u32 = 62 | 0x8000_0000 | 0x4000_0000;
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    let ins = |code, jt, jf, k| sock_filter { code, jt, jf, k };
    vec![
        ins(BPF_LD_W_ABS, 0, 0, 4),                  // arch
        ins(BPF_JMP_JEQ_K, 0, 2, AUDIT_ARCH_X86_64), // not x86_64: allow (others judge)
        ins(BPF_LD_W_ABS, 0, 0, 0),                  // nr
        ins(BPF_JMP_JGE_K, 1, 0, X32_SYSCALL_BIT),   // x32: ENOSYS
        ins(BPF_RET_K, 0, 0, libc::SECCOMP_RET_ALLOW),
        ins(BPF_RET_K, 0, 0, libc::SECCOMP_RET_ERRNO | ENOSYS),
    ]
}

#[cfg(not(target_arch = "x86_64"))]
fn x32_filter() -> BpfProgram {
    Vec::new()
}

/// The compiled filters, in installation order (built before any is
/// installed, so a build error is reported while nothing is restricted).
pub fn programs() -> Result<Vec<BpfProgram>> {
    // EPERM: tap ioctls, namespaces, keyrings, other processes, io_uring.
    let mut eperm: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    let mut ioctls = Vec::new();
    for (_, cmd) in DENIED_IOCTLS {
        let c = SeccompCondition::new(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, *cmd)?;
        ioctls.push(SeccompRule::new(vec![c])?);
    }
    eperm.insert(libc::SYS_ioctl, ioctls);
    let mut unshare = Vec::new();
    let mut clone = Vec::new();
    for (_, bit) in NAMESPACE_FLAGS {
        unshare.push(masked(0, *bit)?);
        clone.push(masked(0, *bit)?);
    }
    unshare.push(masked(0, CLONE_NEWTIME)?);
    eperm.insert(libc::SYS_unshare, unshare);
    eperm.insert(libc::SYS_clone, clone);
    for (_, nr) in DENIED_SYSCALLS {
        eperm.insert(*nr, Vec::new());
    }

    // EAFNOSUPPORT: any socket family but the allowed ones.
    let mut sockets: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for nr in [libc::SYS_socket, libc::SYS_socketpair] {
        let conds = ALLOWED_FAMILIES
            .iter()
            .map(|f| SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, *f))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        sockets.insert(nr, vec![SeccompRule::new(conds)?]);
    }

    // ENOSYS: clone3 (glibc then uses clone, whose flags are checked above).
    let mut enosys: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    enosys.insert(libc::SYS_clone3, Vec::new());

    let mut out = vec![
        build(eperm, EPERM)?,
        build(sockets, EAFNOSUPPORT)?,
        build(enosys, ENOSYS)?,
    ];
    let x32 = x32_filter();
    if !x32.is_empty() {
        out.push(x32);
    }
    Ok(out)
}

/// Install the filters on the calling (only) thread; `no_new_privs` must be
/// set already (it is, by the privilege drop).
pub fn apply(sys: &dyn Syscall, progs: &[BpfProgram]) -> Result<()> {
    for p in progs {
        sys.seccomp_load(p)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filters_compile_for_this_architecture() {
        let p = programs().unwrap();
        assert!(p.len() >= 3);
        assert!(p.iter().all(|f| !f.is_empty()));
    }

    #[test]
    fn the_numbers_are_the_kernels() {
        let flags = [
            libc::CLONE_NEWNS,
            libc::CLONE_NEWCGROUP,
            libc::CLONE_NEWUTS,
            libc::CLONE_NEWIPC,
            libc::CLONE_NEWUSER,
            libc::CLONE_NEWPID,
            libc::CLONE_NEWNET,
        ];
        for ((name, bit), want) in NAMESPACE_FLAGS.iter().zip(flags) {
            assert_eq!(Some(*bit), u64::try_from(want).ok(), "{name}");
        }
        assert_eq!(ALLOWED_FAMILIES, [u64::try_from(libc::AF_UNIX).unwrap()]);
        assert_eq!(Ok(EPERM), u32::try_from(libc::EPERM));
        assert_eq!(Ok(ENOSYS), u32::try_from(libc::ENOSYS));
        assert_eq!(Ok(EAFNOSUPPORT), u32::try_from(libc::EAFNOSUPPORT));
    }
}
