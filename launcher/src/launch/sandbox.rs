//! The sandbox around one VM: its private mount namespace, the credential
//! tmpfs, the masks over other VMs' directories, rlimits and the privilege
//! drop with its self-check.
//!
//! Every function here runs in the single-threaded launcher between taking
//! the lease and `execve`.

use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::Path;

use nix::errno::Errno;
use nix::mount::MsFlags;
use nix::sched::CloneFlags;
use nix::sys::resource::Resource;
use nix::sys::stat::{mkdirat, Mode};
use nix::unistd::{Gid, Uid};

use crate::config::names::VmName;
use crate::host::dirs::{self, Dir};
use crate::host::mountinfo;
use crate::host::sys::SysContext;
use crate::identity::principal::Principal;
pub use crate::launch::drop_check::{assert_single_threaded, verify_dropped};
pub use crate::launch::sandbox_error::{DropFailure, SandboxError};
use crate::launch::syscall::{self, LinuxSyscall, Syscall};

type Result<T, E = SandboxError> = std::result::Result<T, E>;

const NONE: Option<&str> = None;

/// `unshare(CLONE_NEWNS | CLONE_NEWIPC)` and make every mount a recursive
/// slave: host mount events still arrive, nothing made here leaks back
/// (never shared). The IPC namespace is the VM's alone: SysV shared memory,
/// semaphores, message queues and POSIX message queues made inside die with
/// its last process instead of outliving the VM on the host.
pub fn enter_private_namespaces(sys: &dyn Syscall) -> Result<()> {
    sys.unshare(CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_NEWIPC).sys(
        "unshare(CLONE_NEWNS|CLONE_NEWIPC) (a unit around the launcher needs RestrictNamespaces=mnt ipc: re-render it)",
        "/",
    )?;
    sys.mount(
        NONE,
        Path::new("/"),
        NONE,
        MsFlags::MS_REC | MsFlags::MS_SLAVE,
        NONE,
    )
    .sys("mount --make-rslave", "/")?;
    Ok(())
}

/// Mount options of the VM's private procfs: `hidepid=invisible` shows only
/// processes the viewer could ptrace-read (its own uid's, and the
/// hypervisor cannot ptrace at all), so other VMs and host processes are
/// not even listed; `subset=pid` also drops the non-process files
/// (`/proc/sys`, `/proc/kallsyms`, `/proc/mounts`-style global views).
/// QEMU runs with both (the guest suite boots through it). cloud-hypervisor
/// and firecracker get `hidepid=invisible` only: neither can be run here to
/// check what of the global /proc they read.
pub fn proc_options(subset_pid: bool) -> &'static str {
    if subset_pid {
        "hidepid=invisible,subset=pid"
    } else {
        "hidepid=invisible"
    }
}

/// A fresh procfs over `/proc` inside the private mount namespace (see
/// [`proc_options`]); the host's `/proc`, which root's liveness checks
/// read, is untouched.
pub fn mount_private_proc(sys: &dyn Syscall, subset_pid: bool) -> Result<()> {
    sys.mount(
        Some("proc"),
        Path::new("/proc"),
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some(proc_options(subset_pid)),
    )
    .sys("mount private procfs", "/proc")?;
    Ok(())
}

/// Mount the credential tmpfs on `target` with `noswap` (fail closed when the
/// kernel lacks it) and confirm the option took effect.
pub fn mount_credential_tmpfs(
    sys: &dyn Syscall,
    target: &Path,
    vm: &VmName,
    size: u64,
    files: usize,
) -> Result<()> {
    let data = format!("mode=0700,size={size},nr_inodes={},noswap", files + 16);
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    let source = mountinfo::credential_source(vm);
    match sys.mount(
        Some(source.as_str()),
        target,
        Some("tmpfs"),
        flags,
        Some(data.as_str()),
    ) {
        Ok(()) => {}
        Err(errno @ Errno::EINVAL) => {
            return Err(SandboxError::NoSwapUnsupported {
                path: target.to_path_buf(),
                errno,
            })
        }
        Err(e) => {
            return Err(e)
                .sys("mount credential tmpfs", target)
                .map_err(Into::into)
        }
    }
    // Only the mount at `target` is parsed out of the table.
    let found = sys
        .own_mount_at(target)
        .map_err(|source| SandboxError::NoSwapUnconfirmed {
            path: target.to_path_buf(),
            source,
        })?;
    match found {
        Some(m) if m.source == source && m.has_option("noswap") => {}
        found => {
            return Err(SandboxError::NoSwapNotShown {
                path: target.to_path_buf(),
                found: found.map(Box::new),
            })
        }
    }
    Ok(())
}

/// Make the mount at `target` read-only (per-mount flags: a bind remount
/// leaves the tmpfs superblock and its `noswap` alone).
pub fn remount_read_only(sys: &dyn Syscall, target: &Path) -> Result<()> {
    sys.mount(
        NONE,
        target,
        NONE,
        MsFlags::MS_REMOUNT
            | MsFlags::MS_BIND
            | MsFlags::MS_RDONLY
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NODEV
            | MsFlags::MS_NOEXEC,
        NONE,
    )
    .sys("remount read-only", target)?;
    Ok(())
}

/// Hide everything under `root` except `keep` (this VM's own directory):
/// an empty read-only tmpfs goes over `root` and the VM's directory is
/// bind-mounted back from an fd opened before the mask. VMs created later
/// are hidden too, since the mask covers the whole root.
pub fn mask_root_except(sys: &dyn Syscall, root: &Path, keep: &Dir) -> Result<()> {
    let keep_name = keep
        .path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| SandboxError::NoFileName {
            path: keep.path.clone(),
        })?
        .to_string();
    // Re-open inside this namespace (a bind source must be a mount of the
    // current namespace) and check it is still the directory vetted before.
    // The fd stays valid after the mask hides its path.
    let here = dirs::open_dir(&keep.path)?;
    let (a, b) = (keep.stat()?, here.stat()?);
    if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino) {
        return Err(SandboxError::Replaced {
            path: keep.path.clone(),
        });
    }
    let keep_src = format!("/proc/self/fd/{}", here.fd.as_raw_fd());
    sys.mount(
        Some(mountinfo::MASK_SOURCE),
        root,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("mode=0755,size=64k,nr_inodes=64"),
    )
    .sys("mount mask tmpfs", root)?;
    let mask = dirs::open_dir(root)?;
    mkdirat(
        mask.fd.as_fd(),
        keep_name.as_str(),
        Mode::from_bits_truncate(0o755),
    )
    .sys("mkdir in mask", root.join(&keep_name))?;
    let target = root.join(&keep_name);
    sys.mount(
        Some(keep_src.as_str()),
        &target,
        NONE,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        NONE,
    )
    .sys("bind own directory back", &target)?;
    remount_nosuid(sys, &target, MsFlags::empty())?;
    remount_read_only(sys, root)?;
    Ok(())
}

/// Add `nosuid` and `nodev` (and `extra`) to the bind mount at `target`,
/// keeping its other per-mount flags (read-only, noexec, atime) as the
/// kernel states them: no set-id program and no device node in what a VM
/// is given has any effect inside its namespaces. (A set-id mode cannot
/// be set there at all: see `launch::seccomp`.)
pub fn remount_nosuid(sys: &dyn Syscall, target: &Path, extra: MsFlags) -> Result<()> {
    let have = nix::sys::statvfs::statvfs(target)
        .sys("statvfs", target)?
        .flags();
    let flags = MsFlags::MS_REMOUNT
        | MsFlags::MS_BIND
        | MsFlags::MS_NOSUID
        | MsFlags::MS_NODEV
        | extra
        | syscall::stated_flags(have);
    sys.mount(NONE, target, NONE, flags, NONE)
        .sys("remount nosuid,nodev", target)?;
    Ok(())
}

/// Hide a directory entirely (e.g. `/run/credentials`) with an empty,
/// read-only, mode 000 tmpfs. Missing directories need no mask.
pub fn mask_dir(sys: &dyn Syscall, path: &Path) -> Result<bool> {
    match std::fs::symlink_metadata(path) {
        Ok(md) if md.is_dir() => {}
        _ => return Ok(false),
    }
    sys.mount(
        Some(mountinfo::MASK_SOURCE),
        path,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC | MsFlags::MS_RDONLY,
        Some("mode=000,size=4k,nr_inodes=1"),
    )
    .sys("mount mask tmpfs", path)?;
    Ok(true)
}

/// `RLIMIT_CORE=0`: guest memory never lands in a core file.
pub fn set_rlimits(sys: &dyn Syscall) -> Result<()> {
    sys.setrlimit(Resource::RLIMIT_CORE, 0, 0)
        .sys("setrlimit(RLIMIT_CORE)", "/")?;
    Ok(())
}

// Securebits (include/uapi/linux/securebits.h).
const SECBIT_NOROOT: libc::c_ulong = 1 << 0;
const SECBIT_NOROOT_LOCKED: libc::c_ulong = 1 << 1;
const SECBIT_NO_SETUID_FIXUP_LOCKED: libc::c_ulong = 1 << 3;
const SECBIT_KEEP_CAPS_LOCKED: libc::c_ulong = 1 << 5;
const SECBIT_NO_CAP_AMBIENT_RAISE: libc::c_ulong = 1 << 6;
const SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED: libc::c_ulong = 1 << 7;
/// uid 0 gets no special powers, the setuid fixup (which clears the
/// capability sets when the uid leaves 0) stays on, keep-caps stays off, no
/// ambient raise, and all of it locked.
pub const SECUREBITS: libc::c_ulong = SECBIT_NOROOT
    | SECBIT_NOROOT_LOCKED
    | SECBIT_NO_SETUID_FIXUP_LOCKED
    | SECBIT_KEEP_CAPS_LOCKED
    | SECBIT_NO_CAP_AMBIENT_RAISE
    | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED;

/// Drop to the principal: supplementary groups, gids, bounding and ambient
/// sets, securebits, `no_new_privs`, uids, then the remaining sets; then
/// [`verify_dropped`].
pub fn drop_privileges(p: &Principal) -> Result<()> {
    drop_privileges_with(&LinuxSyscall, p)
}

/// [`drop_privileges`], each call made through `sys` (the launch passes
/// [`LinuxSyscall`]; the order tests a recorder).
pub fn drop_privileges_with(sys: &dyn Syscall, p: &Principal) -> Result<()> {
    sys.assert_single_threaded()?;
    let groups: Vec<Gid> = p.groups.iter().map(|g| Gid::from_raw(*g)).collect();
    sys.setgroups(&groups).sys("setgroups", "/")?;
    let g = Gid::from_raw(p.gid);
    sys.setresgid(g).sys("setresgid", "/")?;
    // Ambient: one call. Bounding: one drop per capability the kernel knows.
    sys.clear_ambient()
        .sys("prctl(PR_CAP_AMBIENT_CLEAR_ALL)", "/")?;
    sys.drop_bounding_set().sys("prctl(PR_CAPBSET_DROP)", "/")?;
    sys.set_securebits(SECUREBITS)
        .sys("prctl(PR_SET_SECUREBITS)", "/")?;
    sys.set_no_new_privs()
        .sys("prctl(PR_SET_NO_NEW_PRIVS)", "/")?;
    let u = Uid::from_raw(p.uid);
    sys.setresuid(u).sys("setresuid", "/")?;
    // Effective, permitted and inheritable: one capset of empty sets.
    sys.clear_capabilities().sys("capset", "/")?;
    sys.verify_dropped(p)
}

/// The ranges of fds from 3 up that are not in `keep`, in order, as
/// `close_range(2)` takes them (`last` inclusive; the last range ends at
/// `u32::MAX`). Fds 0–2 in `keep` change nothing: they are never in a range.
pub(crate) fn ranges_but(keep: &[RawFd]) -> Vec<(u32, u32)> {
    let mut keep: Vec<u32> = keep
        .iter()
        .filter_map(|k| u32::try_from(*k).ok())
        .filter(|k| *k >= 3)
        .collect();
    keep.sort_unstable();
    let mut ranges = Vec::new();
    let mut first = 3u32;
    for k in keep.iter().copied().chain(std::iter::once(u32::MAX)) {
        if k > first {
            let last = if k == u32::MAX { u32::MAX } else { k - 1 };
            ranges.push((first, last));
        }
        first = first.max(k.saturating_add(1));
    }
    ranges
}

/// Mark every fd ≥ 3 except `keep` close-on-exec, as late as possible.
pub fn cloexec_all_but(sys: &dyn Syscall, keep: &[i32]) -> Result<()> {
    for (first, last) in ranges_but(keep) {
        sys.cloexec_range(first, last)
            .sys("close_range(CLOEXEC)", "/proc/self/fd")?;
    }
    Ok(())
}

/// Close every fd from 3 up but `keep` (stdin, stdout and stderr stay):
/// what a forked child that runs the launcher's own code keeps (the console
/// relay, the broker, a helper of vmwarden's own code), instead of an
/// `execve`'s close-on-exec.
pub fn close_all_but(keep: &[RawFd]) -> Result<(), String> {
    for (first, last) in ranges_but(keep) {
        // SAFETY: close_range(2) takes plain integers and closes fds of
        // this process only; none in the range is used after this.
        let r = unsafe { libc::syscall(libc::SYS_close_range, first, last, 0u32) };
        if r != 0 {
            return Err(format!("close_range({first}, {last}): {}", Errno::last()));
        }
    }
    Ok(())
}

/// Close every inherited fd ≥ 3 (the first thing the launcher does).
pub fn close_inherited_fds() -> Result<()> {
    // SAFETY: nothing in this process holds an fd ≥ 3 yet (called before
    // anything is opened); close_range touches only the fd table.
    let rc = unsafe { libc::close_range(3, u32::MAX, 0) };
    Errno::result(rc).sys("close_range", "/proc/self/fd")?;
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::launch::syscall::RecordingSyscall;

    #[test]
    fn the_ranges_left_to_close_skip_every_kept_fd_and_never_touch_0_to_2() {
        assert_eq!(ranges_but(&[]), [(3, u32::MAX)]);
        assert_eq!(ranges_but(&[5, 3, 9]), [(4, 4), (6, 8), (10, u32::MAX)]);
        // Fds below 3 (stdin, stdout and stderr always stay) and fds named
        // twice change nothing: before, `close_all_but` given fd 1 closed
        // fd 2.
        assert_eq!(ranges_but(&[1, 7, 7, 2]), [(3, 6), (8, u32::MAX)]);
        assert_eq!(ranges_but(&[-1, 4]), [(3, 3), (5, u32::MAX)]);
    }

    /// The privilege drop's calls, in the order the kernel must see them
    /// (also the middle of the launch tail's order, `launch::tests`).
    pub(crate) const DROP_ORDER: &[&str] = &[
        "assert_single_threaded",
        "setgroups",
        "setresgid",
        "clear_ambient",
        "drop_bounding_set",
        "set_securebits",
        "set_no_new_privs",
        "setresuid",
        "clear_capabilities",
        "verify_dropped",
    ];

    fn principal() -> Principal {
        Principal {
            uid: 61001,
            gid: 61002,
            user: None,
            groups: vec![994],
        }
    }

    #[test]
    fn the_privilege_drop_makes_its_calls_in_order() {
        let sys = RecordingSyscall::new();
        let got = drop_privileges_with(&sys, &principal());
        assert!(got.is_ok(), "{got:?}");
        assert_eq!(sys.names(), DROP_ORDER);
        let args: Vec<(&str, String)> = sys
            .calls()
            .into_iter()
            .filter(|c| !c.args.is_empty())
            .map(|c| (c.name, c.args))
            .collect();
        assert_eq!(
            args,
            [
                ("setgroups", "[994]".to_string()),
                ("setresgid", "61002".into()),
                ("set_securebits", format!("{SECUREBITS:#x}")),
                ("setresuid", "61001".into()),
                ("verify_dropped", "61001".into()),
            ]
        );
        // NOROOT, the setuid fixup kept on, keep-caps kept off, no ambient
        // raise: each locked.
        assert_eq!(SECUREBITS, 0b1110_1011);
    }

    #[test]
    fn a_failed_call_ends_the_privilege_drop() {
        for (k, step) in DROP_ORDER.iter().enumerate() {
            let sys = RecordingSyscall::failing_at(step);
            let got = drop_privileges_with(&sys, &principal());
            assert!(got.is_err(), "{step}: {got:?}");
            assert_eq!(sys.names(), DROP_ORDER[..=k], "failing at {step}");
        }
    }
}
