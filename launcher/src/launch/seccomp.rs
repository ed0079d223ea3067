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
//!   a hypervisor uses on a tap (TUNGETIFF, TUNSETOFFLOAD, …) stay allowed,
//!   and so does TUNSETIFF for firecracker with interfaces ([`Taps::ByName`]:
//!   it attaches to its taps by name). That alone would let it attach to
//!   any tap without owner or group of the namespace it runs in; it runs
//!   in a network namespace of its own that holds only its taps
//!   (`launch::netns`), and that namespace, not this filter, keeps every
//!   other tap out of its reach.
//!   With inherited tap fds, `TUNSETIFF` answers EEXIST, as the kernel does
//!   on a tun fd that is already attached (every fd such a hypervisor
//!   gets is): cloud-hypervisor calls it on each inherited tap fd and goes
//!   on only on EEXIST.
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
//!   back to ppoll/threads when io_uring is unavailable, and its disks are
//!   given `aio=threads` (microvm.nix gives `aio=io_uring`): what that costs
//!   a guest's disk is the guest-io bench's io_uring/threads rows (README).
//! * Give a file a set-user-ID or set-group-ID mode (EPERM): `chmod`,
//!   `fchmod`, `fchmodat` and `fchmodat2` with `S_ISUID` or `S_ISGID` in
//!   their mode argument. A set-id copy of a binary the principal owns,
//!   left in a share or the state dir, would let any local user run code
//!   as the principal outside every sandbox. systemd's `RestrictSUIDSGID=`
//!   does the same, but (in systemd 252) misses `fchmodat2`, and the
//!   filter must hold without a unit. The helpers get this filter too, so
//!   a guest's FUSE SETATTR with mode 04755 is refused by virtiofsd's
//!   `fchmod`/`fchmodat`.
//! * Create a file with a set-id mode (EPERM), as `RestrictSUIDSGID=` also
//!   refuses: `open` and `openat` with `O_CREAT` or `O_TMPFILE`, `creat`,
//!   `mknod` and `mknodat`, whose mode argument has `S_ISUID` or
//!   `S_ISGID` (the kernel keeps `S_ISUID` from a create's mode, and
//!   `S_ISGID` for a member of the file's group: a guest's FUSE CREATE
//!   with mode 04755 made a set-uid file of the principal's through
//!   virtiofsd's `openat`). `openat2` answers ENOSYS, as under
//!   `RestrictSUIDSGID=`: its mode is in memory seccomp cannot read, and
//!   its callers (virtiofsd's probe) fall back to `openat`. `mkdir` is not
//!   filtered: the kernel ignores set-id bits in its mode.
//! * On x86_64, use the x32 syscall ABI (ENOSYS): x32 numbers carry bit 30
//!   and would match none of the rules above. (Other architectures' ABIs
//!   fail seccompiler's architecture check, which kills the process.)
//!
//! A helper that sandboxes itself (passt, see `launch::helpers`) gets the
//! same filter with two differences ([`self_sandboxing_programs`]): its
//! `unshare` may make the user, mount, IPC, UTS and PID namespaces its own
//! sandbox is made of (never a network, cgroup or time namespace; `clone`
//! with any namespace flag and `setns` stay refused), and it may open IPv4,
//! IPv6 and `NETLINK_ROUTE` sockets besides Unix ones: it is the guest's
//! network, and reads the network namespace's routes once at start.

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

/// `ioctl` requests refused with EPERM (`TUNSETIFF` on an inherited fd:
/// EEXIST, see above) (include/uapi/linux/if_tun.h,
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
const EEXIST: u32 = 17;
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

/// What the broker of a share the guest owns may do of [`DENIED_SYSCALLS`].
pub const BROKER_NEEDS: &[&str] = &["process_vm_readv", "pidfd_getfd"];

/// `CLONE_THREAD` (include/uapi/linux/sched.h).
pub const CLONE_THREAD: u64 = 0x0001_0000;

/// The system calls that only make processes (x86_64 has them beside
/// `clone`).
const NEW_PROCESS_SYSCALLS: &[i64] = &[
    #[cfg(target_arch = "x86_64")]
    libc::SYS_fork,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_vfork,
];

/// The set-id mode bits (include/uapi/linux/stat.h).
pub const S_ISUID: u64 = 0o4000;
pub const S_ISGID: u64 = 0o2000;

/// The mode-setting system calls and the index of their mode argument:
/// each is refused when that argument has [`S_ISUID`] or [`S_ISGID`].
/// `fchmodat2` (Linux 6.6) is named by its number, which is the same on
/// every architecture (the unified syscall table).
pub const CHMOD_SYSCALLS: &[(&str, i64, u8)] = &[
    #[cfg(target_arch = "x86_64")]
    ("chmod", libc::SYS_chmod, 1),
    ("fchmod", libc::SYS_fchmod, 1),
    ("fchmodat", libc::SYS_fchmodat, 2),
    ("fchmodat2", SYS_FCHMODAT2, 2),
];
pub const SYS_FCHMODAT2: i64 = 452;

/// The creating system calls, the index of their flags argument (`None`:
/// they always create) and of their mode argument: each is refused when
/// it creates (`O_CREAT` or `O_TMPFILE` in its flags) with [`S_ISUID`] or
/// [`S_ISGID`] in its mode.
pub const CREATE_SYSCALLS: &[(&str, i64, Option<u8>, u8)] = &[
    #[cfg(target_arch = "x86_64")]
    ("open", libc::SYS_open, Some(1), 2),
    ("openat", libc::SYS_openat, Some(2), 3),
    #[cfg(target_arch = "x86_64")]
    ("creat", libc::SYS_creat, None, 1),
    #[cfg(target_arch = "x86_64")]
    ("mknod", libc::SYS_mknod, None, 1),
    ("mknodat", libc::SYS_mknodat, None, 2),
];
/// `O_CREAT` and the bit of `O_TMPFILE` that is not `O_DIRECTORY`
/// (include/uapi/asm-generic/fcntl.h; x86_64 and aarch64 alike).
pub const O_CREAT: u64 = 0o100;
pub const O_TMPFILE_BIT: u64 = 0o20_000_000;

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

/// `flag` set in argument `flags_arg` and `bit` in argument `mode_arg`.
fn creating(flags_arg: u8, flag: u64, mode_arg: u8, bit: u64) -> Result<SeccompRule> {
    let c = |arg, bit| {
        SeccompCondition::new(
            arg,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::MaskedEq(bit),
            bit,
        )
    };
    Ok(SeccompRule::new(vec![
        c(flags_arg, flag)?,
        c(mode_arg, bit)?,
    ])?)
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

/// A filter that answers system call `nr` with ENOSYS and allows the rest
/// (the tests' stand-in for a supervisor's filter, such as systemd's
/// `RestrictSUIDSGID=` answering every `openat2`).
pub fn enosys(nr: i64) -> Result<BpfProgram> {
    let mut map: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    map.insert(nr, Vec::new());
    build(map, ENOSYS)
}

/// A filter that answers each of the system calls `nrs` with EPERM and
/// allows the rest (a probe's: `setsid` and `setpgid`, so that nothing a
/// probed binary starts leaves the process group the launcher kills; see
/// `launch::probe`).
pub fn eperm(nrs: &[i64]) -> Result<BpfProgram> {
    let map: BTreeMap<i64, Vec<SeccompRule>> = nrs.iter().map(|nr| (*nr, Vec::new())).collect();
    build(map, EPERM)
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
    programs_for(Taps::Inherited)
}

/// How the hypervisor gets its taps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taps {
    /// As open fds (QEMU, cloud-hypervisor): every tap ioctl above is
    /// denied, `TUNSETIFF` with EEXIST (the kernel's answer on an attached
    /// fd, which cloud-hypervisor's tap-fd path expects).
    Inherited,
    /// By name (firecracker): `TUNSETIFF` stays allowed so it can attach to
    /// the persistent taps the launcher made for it. Without CAP_NET_ADMIN
    /// the kernel never lets it create a tap, but lets it attach to one
    /// whose owner and group are its own *or unset* (`tun_not_capable` in
    /// drivers/net/tun.c): a tap with neither owner nor group is anyone's.
    /// What keeps such taps of the host out of reach is that firecracker
    /// runs in a network namespace holding only its own (`launch::netns`).
    ByName,
}

/// [`programs`] for a hypervisor that gets its taps as `taps` says.
pub fn programs_for(taps: Taps) -> Result<Vec<BpfProgram>> {
    programs_as(taps, Role::Default)
}

/// Whose filter: the same rules for every process of the VM, but for the
/// two processes that serve a share the guest owns
/// (`launch/helpers/owned.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The hypervisor and every other helper: everything above.
    Default,
    /// The virtiofsd of a share the guest owns: a set-group-ID mode in a
    /// `chmod` is not refused here but handed to its broker by the filter
    /// of [`notify`] (the broker sets it on directories only; this
    /// filter's EPERM would win over that filter's notification), and it
    /// makes no process (`fork`, `vfork`, `clone` without
    /// `CLONE_THREAD`: EPERM), so no task with the ids it may take in its
    /// namespace outlives it.
    OwnedVirtiofsd,
    /// That virtiofsd's broker: as [`Role::OwnedVirtiofsd`], and it may
    /// read the virtiofsd's memory and take its fds
    /// (`process_vm_readv`, `pidfd_getfd`), which is all it is for.
    Broker,
}

/// [`programs_for`] of the process that plays `role`.
pub fn programs_as(taps: Taps, role: Role) -> Result<Vec<BpfProgram>> {
    let (progs, judged) = separate_for(taps, role, &HYPERVISOR)?;
    Ok(prefixed(&judged, chain(progs)))
}

/// What a filter lets through that the rules above refuse.
struct Allowed {
    /// Namespace flags `unshare` may take.
    unshare: &'static [u64],
    /// Socket families (AF_NETLINK only with protocol `netlink`).
    families: &'static [u64],
    /// The one netlink protocol, when `families` has AF_NETLINK.
    netlink: u64,
}

/// The hypervisor's: nothing more.
const HYPERVISOR: Allowed = Allowed {
    unshare: &[],
    families: ALLOWED_FAMILIES,
    netlink: NETLINK_ROUTE,
};

/// The netlink protocol of the kernel's uevents.
pub const NETLINK_KOBJECT_UEVENT: u64 = 15;

/// A QEMU given a USB device: also a `NETLINK_KOBJECT_UEVENT` socket.
/// QEMU's `usb-host` starts libusb, whose `libusb_init` fails unless it
/// can open its hotplug monitor (libudev's uevent socket), even for the
/// one device QEMU opens by its node. Such a socket receives the host's
/// device events (what is added and removed, their sysfs paths and
/// properties) and can send nothing: the kernel takes uevents only from
/// CAP_SYS_ADMIN. No other netlink protocol, no IP.
const HYPERVISOR_USB: Allowed = Allowed {
    unshare: &[],
    families: &[1, AF_NETLINK],
    netlink: NETLINK_KOBJECT_UEVENT,
};

/// [`programs_for`] of a hypervisor given a USB device (see
/// `HYPERVISOR_USB`); its helpers keep [`programs_for`]'s.
pub fn programs_for_usb(taps: Taps) -> Result<Vec<BpfProgram>> {
    let (progs, judged) = separate_for(taps, Role::Default, &HYPERVISOR_USB)?;
    Ok(prefixed(&judged, chain(progs)))
}

/// The namespaces a self-sandboxing helper's `unshare` may make: passt
/// makes a user namespace, then mount (its root becomes an empty tmpfs),
/// IPC, UTS and PID namespaces inside it.
pub const SELF_SANDBOXING_UNSHARE: &[u64] = &[
    0x1000_0000, // CLONE_NEWUSER
    0x0002_0000, // CLONE_NEWNS
    0x0800_0000, // CLONE_NEWIPC
    0x0400_0000, // CLONE_NEWUTS
    0x2000_0000, // CLONE_NEWPID
];
/// Its socket families: AF_UNIX, AF_INET, AF_INET6, AF_NETLINK.
pub const SELF_SANDBOXING_FAMILIES: &[u64] = &[1, 2, 10, 16];
/// The one netlink protocol it may open (reading routes and addresses).
pub const NETLINK_ROUTE: u64 = 0;
const AF_NETLINK: u64 = 16;

/// The filter of a helper that sandboxes itself (see the module docs).
pub fn self_sandboxing_programs() -> Result<Vec<BpfProgram>> {
    let (progs, judged) = separate_for(
        Taps::Inherited,
        Role::Default,
        &Allowed {
            unshare: SELF_SANDBOXING_UNSHARE,
            families: SELF_SANDBOXING_FAMILIES,
            netlink: NETLINK_ROUTE,
        },
    )?;
    Ok(prefixed(&judged, chain(progs)))
}

/// The filters one by one (what [`chain`] joins), and the system call
/// numbers their rules name (sorted): every other call they all allow,
/// except on another ABI (a foreign architecture, x32).
#[cfg(test)]
fn separate() -> Result<(Vec<BpfProgram>, Vec<u32>)> {
    separate_for(Taps::Inherited, Role::Default, &HYPERVISOR)
}

fn separate_for(taps: Taps, role: Role, allowed: &Allowed) -> Result<(Vec<BpfProgram>, Vec<u32>)> {
    // EPERM: tap ioctls, namespaces, keyrings, other processes, io_uring,
    // set-id modes.
    let mut eperm: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    let mut ioctls = Vec::new();
    // EEXIST: TUNSETIFF on an inherited (attached) tap fd.
    let mut eexist: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for (name, cmd) in DENIED_IOCTLS {
        let c = SeccompCondition::new(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, *cmd)?;
        match (*name == "TUNSETIFF", taps) {
            (true, Taps::ByName) => {}
            (true, Taps::Inherited) => {
                eexist.insert(libc::SYS_ioctl, vec![SeccompRule::new(vec![c])?]);
            }
            (false, _) => ioctls.push(SeccompRule::new(vec![c])?),
        }
    }
    eperm.insert(libc::SYS_ioctl, ioctls);
    let mut unshare = Vec::new();
    let mut clone = Vec::new();
    for (_, bit) in NAMESPACE_FLAGS {
        if !allowed.unshare.contains(bit) {
            unshare.push(masked(0, *bit)?);
        }
        clone.push(masked(0, *bit)?);
    }
    unshare.push(masked(0, CLONE_NEWTIME)?);
    let owned = role != Role::Default;
    if owned {
        // A new process rather than a thread.
        clone.push(SeccompRule::new(vec![SeccompCondition::new(
            0,
            SeccompCmpArgLen::Qword,
            SeccompCmpOp::MaskedEq(CLONE_THREAD),
            0,
        )?])?);
        for nr in NEW_PROCESS_SYSCALLS {
            eperm.insert(*nr, Vec::new());
        }
    }
    eperm.insert(libc::SYS_unshare, unshare);
    eperm.insert(libc::SYS_clone, clone);
    for (name, nr) in DENIED_SYSCALLS {
        if role == Role::Broker && BROKER_NEEDS.contains(name) {
            continue;
        }
        eperm.insert(*nr, Vec::new());
    }
    // A mode argument (a `mode_t`, 32 bits) with a set-id bit.
    for (_, nr, arg) in CHMOD_SYSCALLS {
        let mut rules = vec![masked(*arg, S_ISUID)?];
        if !owned {
            rules.push(masked(*arg, S_ISGID)?);
        }
        eperm.insert(*nr, rules);
    }
    // A set-id mode given to a call that creates the file.
    for (_, nr, flags, mode) in CREATE_SYSCALLS {
        let mut rules = Vec::new();
        for bit in [S_ISUID, S_ISGID] {
            match flags {
                Some(f) => {
                    rules.push(creating(*f, O_CREAT, *mode, bit)?);
                    rules.push(creating(*f, O_TMPFILE_BIT, *mode, bit)?);
                }
                None => rules.push(masked(*mode, bit)?),
            }
        }
        eperm.insert(*nr, rules);
    }

    // EAFNOSUPPORT: any socket family but the allowed ones.
    let mut sockets: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for nr in [libc::SYS_socket, libc::SYS_socketpair] {
        let conds = allowed
            .families
            .iter()
            .map(|f| SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, *f))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let mut rules = vec![SeccompRule::new(conds)?];
        if allowed.families.contains(&AF_NETLINK) {
            rules.push(SeccompRule::new(vec![
                SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, AF_NETLINK)?,
                SeccompCondition::new(
                    2,
                    SeccompCmpArgLen::Dword,
                    SeccompCmpOp::Ne,
                    allowed.netlink,
                )?,
            ])?);
        }
        sockets.insert(nr, rules);
    }

    // ENOSYS: clone3 (glibc then uses clone, whose flags are checked
    // above) and openat2 (its callers fall back to openat, whose mode is).
    let mut enosys: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    enosys.insert(libc::SYS_clone3, Vec::new());
    enosys.insert(libc::SYS_openat2, Vec::new());

    let mut judged: Vec<u32> = [&eperm, &eexist, &sockets, &enosys]
        .iter()
        .flat_map(|m| m.keys())
        .filter_map(|nr| u32::try_from(*nr).ok())
        .collect();
    judged.sort_unstable();
    judged.dedup();
    let mut out = vec![
        build(eperm, EPERM)?,
        build(eexist, EEXIST)?,
        build(sockets, EAFNOSUPPORT)?,
        build(enosys, ENOSYS)?,
    ];
    let x32 = x32_filter();
    if !x32.is_empty() {
        out.push(x32);
    }
    Ok((out, judged))
}

/// `AUDIT_ARCH_*` of this build (include/uapi/linux/audit.h).
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH_NATIVE: Option<u32> = Some(62 | 0x8000_0000 | 0x4000_0000);
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH_NATIVE: Option<u32> = Some(183 | 0x8000_0000 | 0x4000_0000);
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const AUDIT_ARCH_NATIVE: Option<u32> = None;

const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JMP_JEQ_K: u16 = 0x05 | 0x10;
const BPF_JMP_JGE_K: u16 = 0x05 | 0x30;
const BPF_RET_K: u16 = 0x06;

/// Where a jump of the prefix goes.
#[derive(Debug, Clone, Copy)]
enum To {
    Next,
    Allow,
    Chain,
    At(usize),
}

#[derive(Debug)]
struct Ins {
    code: u16,
    jt: To,
    jf: To,
    k: u32,
}

/// A binary search of the number in A among `nrs` (sorted): found, on to
/// the chained filters; not found, allow.
fn search(out: &mut Vec<Ins>, nrs: &[u32]) {
    if nrs.len() <= 3 {
        for (i, nr) in nrs.iter().enumerate() {
            let jf = if i + 1 == nrs.len() {
                To::Allow
            } else {
                To::Next
            };
            out.push(Ins {
                code: BPF_JMP_JEQ_K,
                jt: To::Chain,
                jf,
                k: *nr,
            });
        }
        return;
    }
    let mid = nrs.len() / 2;
    let at = out.len();
    out.push(Ins {
        code: BPF_JMP_JGE_K,
        jt: To::Next,
        jf: To::Next,
        k: nrs[mid],
    });
    search(out, &nrs[..mid]);
    out[at].jt = To::At(out.len());
    search(out, &nrs[mid..]);
}

/// The chained filter behind a prefix that allows, in a few steps, every
/// native system call no rule names (`judged`: the rest of the program
/// would allow it too), and sends everything else — the named calls, x32
/// numbers, other architectures — to the chain. Installing a filter, the
/// kernel walks it once per system call number and ABI to find the calls
/// it always allows (seccomp_cache_prepare): through the chain that walk
/// took ~0.08 ms of the 0.14 ms `seccomp(2)` here; through the prefix it
/// is ~10 steps. Anything that does not fit (no single chained program,
/// an unknown architecture, a jump past 255) is left as it is.
fn prefixed(judged: &[u32], progs: Vec<BpfProgram>) -> Vec<BpfProgram> {
    const BPF_MAXINSNS: usize = 4096;
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    let (Some(arch), [chained]) = (AUDIT_ARCH_NATIVE, progs.as_slice()) else {
        return progs;
    };
    if judged.is_empty() {
        return progs;
    }
    let ld = |k| Ins {
        code: BPF_LD_W_ABS,
        jt: To::Next,
        jf: To::Next,
        k,
    };
    let mut ins = vec![
        ld(4),
        Ins {
            code: BPF_JMP_JEQ_K,
            jt: To::Next,
            jf: To::Chain,
            k: arch,
        },
        ld(0),
    ];
    if cfg!(target_arch = "x86_64") {
        ins.push(Ins {
            code: BPF_JMP_JGE_K,
            jt: To::Chain,
            jf: To::Next,
            k: X32_SYSCALL_BIT,
        });
    }
    search(&mut ins, judged);
    let allow = ins.len();
    let chain_at = allow + 1;
    let mut out = Vec::with_capacity(chain_at + chained.len());
    for (pc, i) in ins.iter().enumerate() {
        let off = |t: To| {
            let target = match t {
                To::Next => pc + 1,
                To::Allow => allow,
                To::Chain => chain_at,
                To::At(x) => x,
            };
            u8::try_from(target.checked_sub(pc + 1)?).ok()
        };
        let (Some(jt), Some(jf)) = (off(i.jt), off(i.jf)) else {
            return progs;
        };
        out.push(sock_filter {
            code: i.code,
            jt,
            jf,
            k: i.k,
        });
    }
    out.push(sock_filter {
        code: BPF_RET_K,
        jt: 0,
        jf: 0,
        k: libc::SECCOMP_RET_ALLOW,
    });
    out.extend_from_slice(chained);
    if out.len() > BPF_MAXINSNS {
        return progs;
    }
    vec![out]
}

/// The programs as one, when they can be: each one's "allow" becomes a
/// jump to the start of the next, so a system call meets the first
/// program that refuses it. That is the stacked filters' answer, since no
/// two of them refuse the same call (the unit tests run both ways), and
/// one filter is one `seccomp(2)` instead of four (0.14 ms instead of
/// 0.17 here) — and a system call of the hypervisor that the kernel's
/// always-allowed bitmap does not cover runs one program of ours, not
/// four. A program that returns its accumulator, or a result past
/// `BPF_MAXINSNS`, is left as it is.
fn chain(progs: Vec<BpfProgram>) -> Vec<BpfProgram> {
    const BPF_RET: u16 = 0x06;
    const BPF_JMP_JA: u16 = 0x05;
    const BPF_SRC_A: u16 = 0x10;
    const BPF_MAXINSNS: usize = 4096;
    let total: usize = progs.iter().map(Vec::len).sum();
    let Some((last, rest)) = progs.split_last() else {
        return progs;
    };
    let returns_a = rest
        .iter()
        .flatten()
        .any(|i| i.code & 0x07 == BPF_RET && i.code & 0x18 == BPF_SRC_A);
    if total > BPF_MAXINSNS || returns_a {
        return progs;
    }
    let mut out = Vec::with_capacity(total);
    for p in rest {
        for (pc, ins) in p.iter().enumerate() {
            let allow = ins.code & 0x07 == BPF_RET && ins.k == libc::SECCOMP_RET_ALLOW;
            out.push(match (allow, u32::try_from(p.len() - pc - 1)) {
                (true, Ok(k)) => sock_filter {
                    code: BPF_JMP_JA,
                    jt: 0,
                    jf: 0,
                    k,
                },
                _ => ins.clone(),
            });
        }
    }
    out.extend_from_slice(last);
    vec![out]
}

/// Install the filters on the calling (only) thread; `no_new_privs` must be
/// set already (it is, by the privilege drop).
pub fn apply(sys: &dyn Syscall, progs: &[BpfProgram]) -> Result<()> {
    for p in progs {
        sys.seccomp_load(p)?;
    }
    Ok(())
}

pub mod notify;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod self_sandboxing_tests;
