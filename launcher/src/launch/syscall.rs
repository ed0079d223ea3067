//! The seam around the launch's privileged calls: every call that changes
//! what the launcher is or may do from the private namespace to `execve`
//! (unshare, mounts, rlimits, the privilege drop and its self-check,
//! Landlock, seccomp, the working directory, close-on-exec, `execve`) goes
//! through [`Syscall`]. [`LinuxSyscall`] makes the real calls; the unit
//! tests hand the same code a recorder (`RecordingSyscall`) and assert the
//! order without root. Modelled on youki's `libcontainer::syscall`.
//!
//! Narrow on purpose: file reads and the work under the VM's own
//! directories (opening, `mkdirat`, writing credentials) stay direct calls.
//! The real path costs one indirect call per system call and allocates
//! nothing more than the direct calls did.

use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::mount::{mount, MsFlags};
use nix::sched::{unshare, CloneFlags};
use nix::sys::resource::{setrlimit, Resource};
use nix::unistd::{setgroups, setresgid, setresuid, Gid, Uid};
use seccompiler::BpfProgram;

use crate::config::spec::LandlockMode;
use crate::host::mountinfo::{self, Mount};
use crate::identity::principal::Principal;
use crate::instance::creds_floor;
use crate::launch::drop_check;
use crate::launch::landlock::{self, LandlockError, Outcome, Policy};
use crate::launch::sandbox_error::SandboxError;

/// One method per privileged call of the launch, in the order the launch
/// makes them (see the order tests in `launch::sandbox` and `launch`).
/// Errors are the kernel's; callers attach the operation and path.
pub trait Syscall {
    /// `unshare(2)`.
    fn unshare(&self, flags: CloneFlags) -> Result<(), Errno>;
    /// `mount(2)` (a mount, a bind, a remount or a propagation change).
    fn mount(
        &self,
        source: Option<&str>,
        target: &Path,
        fstype: Option<&str>,
        flags: MsFlags,
        data: Option<&str>,
    ) -> Result<(), Errno>;
    /// `mount_setattr(2)` with `AT_RECURSIVE | AT_EMPTY_PATH`: the
    /// `MOUNT_ATTR_*` bits of `set` added to the mount whose root `target`
    /// (an `O_PATH` descriptor) is and to every mount below it (none
    /// cleared; the other flags each keeps). Named by descriptor, never by
    /// a path a symlink or a rename could send elsewhere; and `EXDEV` when
    /// `target` is not the file `source` is (the bind of `source` is not
    /// what `target` found). `shown`: its path, for the record.
    fn mount_setattr_recursive(
        &self,
        target: BorrowedFd<'_>,
        source: BorrowedFd<'_>,
        shown: &Path,
        set: u64,
    ) -> Result<(), Errno>;
    /// The last mount at `target` in this process's mount table, as the
    /// kernel states it after a mount (`/proc/self/mountinfo`): how a mount
    /// option is confirmed.
    fn own_mount_at(&self, target: &Path) -> std::io::Result<Option<Mount>>;
    /// The unique id of the mount `/` is on (`statx` `STATX_MNT_ID_UNIQUE`):
    /// read right after the `unshare`, the credential floor
    /// (`instance::creds_floor`).
    fn root_mount_id(&self) -> Result<u64, Errno>;
    /// `pivot_root(2)` into `new_root` (a mount point): `chdir` there,
    /// `pivot_root(".", ".")`, the old root detached, `chdir("/")`.
    fn pivot_root(&self, new_root: &Path) -> Result<(), Errno>;
    /// `setrlimit(2)`.
    fn setrlimit(&self, resource: Resource, soft: u64, hard: u64) -> Result<(), Errno>;
    /// The calls below act per thread: the launcher must have just one.
    fn assert_single_threaded(&self) -> Result<(), SandboxError>;
    /// `setgroups(2)`.
    fn setgroups(&self, groups: &[Gid]) -> Result<(), Errno>;
    /// `setresgid(2)`, all three ids to `gid`.
    fn setresgid(&self, gid: Gid) -> Result<(), Errno>;
    /// `prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)`.
    fn clear_ambient(&self) -> Result<(), Errno>;
    /// `prctl(PR_CAPBSET_DROP)` for every capability the kernel knows.
    fn drop_bounding_set(&self) -> Result<(), Errno>;
    /// `prctl(PR_SET_SECUREBITS)`.
    fn set_securebits(&self, bits: libc::c_ulong) -> Result<(), Errno>;
    /// `prctl(PR_SET_NO_NEW_PRIVS)`.
    fn set_no_new_privs(&self) -> Result<(), Errno>;
    /// `setresuid(2)`, all three ids to `uid`.
    fn setresuid(&self, uid: Uid) -> Result<(), Errno>;
    /// `capset(2)`: effective, permitted and inheritable sets emptied.
    fn clear_capabilities(&self) -> Result<(), Errno>;
    /// The privilege drop's self-check ([`drop_check::verify_dropped`]).
    fn verify_dropped(&self, p: &Principal) -> Result<(), SandboxError>;
    /// `landlock_restrict_self(2)` with the ruleset of `policy`.
    fn landlock_restrict(
        &self,
        policy: &Policy,
        mode: LandlockMode,
    ) -> Result<Outcome, LandlockError>;
    /// `seccomp(SECCOMP_SET_MODE_FILTER)` with one program.
    fn seccomp_load(&self, program: &BpfProgram) -> Result<(), seccompiler::Error>;
    /// `chdir(2)`.
    fn chdir(&self, dir: &Path) -> Result<(), Errno>;
    /// `close_range(first, last, CLOSE_RANGE_CLOEXEC)`.
    fn cloexec_range(&self, first: u32, last: u32) -> Result<(), Errno>;
    /// `execve(2)`: returns only on failure.
    fn execve(&self, program: &CStr, argv: &[CString], env: &[CString]) -> Errno;
}

/// The real calls.
#[derive(Debug, Clone, Copy, Default)]
pub struct LinuxSyscall;

/// `PR_CAP_AMBIENT_CLEAR_ALL` (libc declares it as an int).
const PR_CAP_AMBIENT_CLEAR_ALL: u32 = 4;
/// `_LINUX_CAPABILITY_VERSION_3`: two 32-bit words per set.
const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// `struct __user_cap_header_struct`.
#[repr(C)]
#[derive(Debug)]
struct CapHeader {
    version: u32,
    pid: i32,
}

/// `struct __user_cap_data_struct`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// `close_range`'s flags argument is an int (libc declares the flag, 1 << 2,
/// unsigned).
#[allow(clippy::cast_possible_wrap)]
const CLOSE_RANGE_CLOEXEC: libc::c_int = libc::CLOSE_RANGE_CLOEXEC as libc::c_int;

impl Syscall for LinuxSyscall {
    fn unshare(&self, flags: CloneFlags) -> Result<(), Errno> {
        unshare(flags)
    }

    fn mount(
        &self,
        source: Option<&str>,
        target: &Path,
        fstype: Option<&str>,
        flags: MsFlags,
        data: Option<&str>,
    ) -> Result<(), Errno> {
        mount(source, target, fstype, flags, data)
    }

    fn mount_setattr_recursive(
        &self,
        target: BorrowedFd<'_>,
        source: BorrowedFd<'_>,
        _shown: &Path,
        set: u64,
    ) -> Result<(), Errno> {
        /// `struct mount_attr` (linux/mount.h, `MOUNT_ATTR_SIZE_VER0`).
        #[repr(C)]
        struct MountAttr {
            attr_set: u64,
            attr_clr: u64,
            propagation: u64,
            userns_fd: u64,
        }
        let (t, s) = (
            nix::sys::stat::fstat(target)?,
            nix::sys::stat::fstat(source)?,
        );
        if (t.st_dev, t.st_ino) != (s.st_dev, s.st_ino) {
            return Err(Errno::EXDEV);
        }
        let attr = MountAttr {
            attr_set: set,
            attr_clr: 0,
            propagation: 0,
            userns_fd: 0,
        };
        // SAFETY: `target` is an open descriptor, the path an empty
        // NUL-terminated string and `attr` a `struct mount_attr` of the
        // size passed, all alive for the call; the kernel only reads them.
        let r = unsafe {
            libc::syscall(
                libc::SYS_mount_setattr,
                target.as_raw_fd(),
                c"".as_ptr(),
                libc::AT_RECURSIVE | libc::AT_EMPTY_PATH,
                std::ptr::from_ref(&attr),
                size_of::<MountAttr>(),
            )
        };
        match Errno::result(r) {
            Ok(_) => Ok(()),
            // No mount_setattr (a kernel before 5.12, or a filter that
            // answers ENOSYS or EPERM for it: the systemd suite's unit
            // does): the bind's own remount through its descriptor, its
            // other flags kept; the mounts it carried keep theirs, as
            // before Linux 5.12.
            Err(Errno::ENOSYS | Errno::EPERM) => remount_bind(target, set),
            Err(e) => Err(e),
        }
    }

    fn own_mount_at(&self, target: &Path) -> std::io::Result<Option<Mount>> {
        mountinfo::own_mount_at(target)
    }

    fn root_mount_id(&self) -> Result<u64, Errno> {
        creds_floor::root_mount_id()
    }

    fn pivot_root(&self, new_root: &Path) -> Result<(), Errno> {
        nix::unistd::chdir(new_root)?;
        nix::unistd::pivot_root(".", ".")?;
        nix::mount::umount2(".", nix::mount::MntFlags::MNT_DETACH)?;
        nix::unistd::chdir("/")
    }

    fn setrlimit(&self, resource: Resource, soft: u64, hard: u64) -> Result<(), Errno> {
        setrlimit(resource, soft, hard)
    }

    fn assert_single_threaded(&self) -> Result<(), SandboxError> {
        drop_check::assert_single_threaded()
    }

    fn setgroups(&self, groups: &[Gid]) -> Result<(), Errno> {
        setgroups(groups)
    }

    fn setresgid(&self, gid: Gid) -> Result<(), Errno> {
        setresgid(gid, gid, gid)
    }

    fn clear_ambient(&self) -> Result<(), Errno> {
        // SAFETY: prctl(PR_CAP_AMBIENT) takes integers and no pointers; the
        // return value is checked.
        let rc = unsafe {
            libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::c_ulong::from(PR_CAP_AMBIENT_CLEAR_ALL),
                0,
                0,
                0,
            )
        };
        Errno::result(rc).map(drop)
    }

    fn drop_bounding_set(&self) -> Result<(), Errno> {
        // One drop per capability the kernel knows (numbered from 0; EINVAL
        // past the last one ends the loop).
        for cap in 0..=63u8 {
            // SAFETY: prctl(PR_CAPBSET_DROP) takes a capability number and no
            // pointers; the return value is checked.
            let rc =
                unsafe { libc::prctl(libc::PR_CAPBSET_DROP, libc::c_ulong::from(cap), 0, 0, 0) };
            match Errno::result(rc) {
                Ok(_) => {}
                Err(Errno::EINVAL) if cap > 0 => break,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn set_securebits(&self, bits: libc::c_ulong) -> Result<(), Errno> {
        // SAFETY: prctl(PR_SET_SECUREBITS) takes an integer bit mask and no
        // pointers; the return value is checked.
        let rc = unsafe { libc::prctl(libc::PR_SET_SECUREBITS, bits, 0, 0, 0) };
        Errno::result(rc).map(drop)
    }

    fn set_no_new_privs(&self) -> Result<(), Errno> {
        nix::sys::prctl::set_no_new_privs()
    }

    fn setresuid(&self, uid: Uid) -> Result<(), Errno> {
        setresuid(uid, uid, uid)
    }

    fn clear_capabilities(&self) -> Result<(), Errno> {
        let header = CapHeader {
            version: LINUX_CAPABILITY_VERSION_3,
            pid: 0,
        };
        let data = [CapData::default(); 2];
        // SAFETY: capset(2) reads the header and two data structs, both alive
        // for the call and laid out as the kernel's (repr(C)).
        let rc = unsafe { libc::syscall(libc::SYS_capset, &raw const header, data.as_ptr()) };
        Errno::result(rc).map(drop)
    }

    fn verify_dropped(&self, p: &Principal) -> Result<(), SandboxError> {
        drop_check::verify_dropped(p)
    }

    fn landlock_restrict(
        &self,
        policy: &Policy,
        mode: LandlockMode,
    ) -> Result<Outcome, LandlockError> {
        landlock::apply(policy, mode)
    }

    fn seccomp_load(&self, program: &BpfProgram) -> Result<(), seccompiler::Error> {
        seccompiler::apply_filter(program)
    }

    fn chdir(&self, dir: &Path) -> Result<(), Errno> {
        nix::unistd::chdir(dir)
    }

    fn cloexec_range(&self, first: u32, last: u32) -> Result<(), Errno> {
        // SAFETY: close_range only changes the fd table; with
        // CLOSE_RANGE_CLOEXEC it closes nothing and the return is checked.
        let rc = unsafe { libc::close_range(first, last, CLOSE_RANGE_CLOEXEC) };
        Errno::result(rc).map(drop)
    }

    fn execve(&self, program: &CStr, argv: &[CString], env: &[CString]) -> Errno {
        match nix::unistd::execve(program, argv, env) {
            Ok(never) => match never {},
            Err(e) => e,
        }
    }
}

/// The per-mount flags the kernel states for a mount (`statvfs`), as
/// `mount(2)` names them: a bind remount replaces every one, so each one
/// it keeps is named again.
pub fn stated_flags(have: nix::sys::statvfs::FsFlags) -> MsFlags {
    use nix::sys::statvfs::FsFlags;
    [
        (FsFlags::ST_RDONLY, MsFlags::MS_RDONLY),
        (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
        (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
        (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
        (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
    ]
    .into_iter()
    .filter(|(st, _)| have.contains(*st))
    .fold(MsFlags::empty(), |acc, (_, ms)| acc | ms)
}

/// `MS_REMOUNT|MS_BIND` of the mount `target` is the root of, through
/// `/proc/self/fd/N`, with `set` (`MOUNT_ATTR_RDONLY`, `_NOSUID`,
/// `_NODEV`) added to the flags the kernel states for it (`fstatvfs`): a
/// bind remount replaces every per-mount flag, so each one it has is
/// named again.
fn remount_bind(target: BorrowedFd<'_>, set: u64) -> Result<(), Errno> {
    use nix::sys::statvfs::fstatvfs;
    let have = fstatvfs(target)?.flags();
    let mut flags = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | stated_flags(have);
    for (bit, ms) in [
        (0x1, MsFlags::MS_RDONLY),
        (0x2, MsFlags::MS_NOSUID),
        (0x4, MsFlags::MS_NODEV),
    ] {
        if set & bit != 0 {
            flags |= ms;
        }
    }
    let at = format!("/proc/self/fd/{}", target.as_raw_fd());
    mount(None::<&str>, at.as_str(), None::<&str>, flags, None::<&str>)
}

#[cfg(test)]
pub use recording::{Call, RecordingSyscall, RECORDED_ROOT_MOUNT_ID};

/// The test double: records each call (its name and key arguments) and
/// answers as a kernel that grants everything would, or fails at one chosen
/// call.
#[cfg(test)]
mod recording {
    use std::cell::RefCell;

    use super::*;
    use crate::launch::sandbox_error::DropFailure;

    /// One recorded call: the trait method's name and its key arguments.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Call {
        pub name: &'static str,
        pub args: String,
    }

    /// What [`RecordingSyscall::root_mount_id`] answers.
    pub const RECORDED_ROOT_MOUNT_ID: u64 = 0x1_0000_4242;

    #[derive(Debug, Default)]
    pub struct RecordingSyscall {
        calls: RefCell<Vec<Call>>,
        /// The tmpfs mounts made, as [`Syscall::own_mount_at`] states them.
        mounts: RefCell<Vec<Mount>>,
        /// The first call of this name fails (`EPERM`, or the self-check's
        /// own failure); every later call is still recorded if made.
        fail_at: Option<&'static str>,
    }

    impl RecordingSyscall {
        pub fn new() -> Self {
            Self::default()
        }

        pub fn failing_at(name: &'static str) -> Self {
            RecordingSyscall {
                fail_at: Some(name),
                ..Self::default()
            }
        }

        pub fn calls(&self) -> Vec<Call> {
            self.calls.borrow().clone()
        }

        /// The names of the calls made, in order.
        pub fn names(&self) -> Vec<&'static str> {
            self.calls.borrow().iter().map(|c| c.name).collect()
        }

        /// Record the call; `true` when it is the one to fail.
        fn record(&self, name: &'static str, args: String) -> bool {
            self.calls.borrow_mut().push(Call { name, args });
            self.fail_at == Some(name)
        }

        fn answer(&self, name: &'static str, args: String) -> Result<(), Errno> {
            if self.record(name, args) {
                Err(Errno::EPERM)
            } else {
                Ok(())
            }
        }
    }

    impl Syscall for RecordingSyscall {
        fn unshare(&self, flags: CloneFlags) -> Result<(), Errno> {
            self.answer("unshare", format!("{flags:?}"))
        }

        fn mount(
            &self,
            source: Option<&str>,
            target: &Path,
            fstype: Option<&str>,
            flags: MsFlags,
            data: Option<&str>,
        ) -> Result<(), Errno> {
            let failed = self.record(
                "mount",
                format!(
                    "{source:?} {} {fstype:?} {flags:?} {data:?}",
                    target.display()
                ),
            );
            if failed {
                return Err(Errno::EPERM);
            }
            if let (Some(source), Some("tmpfs")) = (source, fstype) {
                self.mounts.borrow_mut().push(Mount {
                    mount_id: 0,
                    unique_id: 0,
                    ns_id: 0,
                    mount_point: target.to_path_buf(),
                    mount_options: String::new(),
                    fstype: "tmpfs".into(),
                    source: source.into(),
                    super_options: data.unwrap_or_default().into(),
                });
            }
            Ok(())
        }

        fn mount_setattr_recursive(
            &self,
            _target: BorrowedFd<'_>,
            _source: BorrowedFd<'_>,
            shown: &Path,
            set: u64,
        ) -> Result<(), Errno> {
            self.answer(
                "mount_setattr",
                format!("{} AT_RECURSIVE {set:#x}", shown.display()),
            )
        }

        /// The last tmpfs mounted at `target` so far, with the options it
        /// was given: the kernel's answer when the options took.
        fn own_mount_at(&self, target: &Path) -> std::io::Result<Option<Mount>> {
            Ok(self
                .mounts
                .borrow()
                .iter()
                .rev()
                .find(|m| m.mount_point == target)
                .cloned())
        }

        fn pivot_root(&self, new_root: &Path) -> Result<(), Errno> {
            self.answer("pivot_root", new_root.display().to_string())
        }

        fn root_mount_id(&self) -> Result<u64, Errno> {
            self.answer("root_mount_id", String::new())
                .map(|()| RECORDED_ROOT_MOUNT_ID)
        }

        fn setrlimit(&self, resource: Resource, soft: u64, hard: u64) -> Result<(), Errno> {
            self.answer("setrlimit", format!("{resource:?} {soft} {hard}"))
        }

        fn assert_single_threaded(&self) -> Result<(), SandboxError> {
            if self.record("assert_single_threaded", String::new()) {
                return Err(SandboxError::Drop(DropFailure::Threads(2)));
            }
            Ok(())
        }

        fn setgroups(&self, groups: &[Gid]) -> Result<(), Errno> {
            let raw: Vec<u32> = groups.iter().map(|g| g.as_raw()).collect();
            self.answer("setgroups", format!("{raw:?}"))
        }

        fn setresgid(&self, gid: Gid) -> Result<(), Errno> {
            self.answer("setresgid", gid.to_string())
        }

        fn clear_ambient(&self) -> Result<(), Errno> {
            self.answer("clear_ambient", String::new())
        }

        fn drop_bounding_set(&self) -> Result<(), Errno> {
            self.answer("drop_bounding_set", String::new())
        }

        fn set_securebits(&self, bits: libc::c_ulong) -> Result<(), Errno> {
            self.answer("set_securebits", format!("{bits:#x}"))
        }

        fn set_no_new_privs(&self) -> Result<(), Errno> {
            self.answer("set_no_new_privs", String::new())
        }

        fn setresuid(&self, uid: Uid) -> Result<(), Errno> {
            self.answer("setresuid", uid.to_string())
        }

        fn clear_capabilities(&self) -> Result<(), Errno> {
            self.answer("clear_capabilities", String::new())
        }

        fn verify_dropped(&self, p: &Principal) -> Result<(), SandboxError> {
            if self.record("verify_dropped", p.uid.to_string()) {
                return Err(SandboxError::Drop(DropFailure::NoNewPrivs));
            }
            Ok(())
        }

        fn landlock_restrict(
            &self,
            policy: &Policy,
            mode: LandlockMode,
        ) -> Result<Outcome, LandlockError> {
            if self.record(
                "landlock_restrict",
                format!("{} rules {mode:?}", policy.rules.len()),
            ) {
                return Err(LandlockError::NotEnforced);
            }
            Ok(Outcome::Full)
        }

        fn seccomp_load(&self, program: &BpfProgram) -> Result<(), seccompiler::Error> {
            if self.record("seccomp_load", format!("{} instructions", program.len())) {
                return Err(seccompiler::Error::EmptyFilter);
            }
            Ok(())
        }

        fn chdir(&self, dir: &Path) -> Result<(), Errno> {
            self.answer("chdir", dir.display().to_string())
        }

        fn cloexec_range(&self, first: u32, last: u32) -> Result<(), Errno> {
            self.answer("cloexec_range", format!("{first}..={last}"))
        }

        /// Records the call and fails it (`ENOEXEC`): nothing is executed.
        fn execve(&self, program: &CStr, argv: &[CString], _env: &[CString]) -> Errno {
            self.record("execve", format!("{program:?} {argv:?}"));
            Errno::ENOEXEC
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use nix::fcntl::OFlag;
    use nix::sys::stat::Mode;
    use nix::sys::statvfs::{statvfs, FsFlags};
    use nix::sys::wait::{waitpid, WaitStatus};
    use nix::unistd::{fork, ForkResult};

    use super::*;

    /// In a child's own mount namespace: a `noexec` tmpfs at `src`, bound
    /// at `dst`, the bind's flags set by [`remount_bind`] through an
    /// `O_PATH` descriptor. 0: the bind is read-only, `nosuid`, `nodev`
    /// and still `noexec`, the tmpfs itself still writable; 1: not; 3:
    /// setting up failed.
    fn remounted(src: &Path, dst: &Path) -> i32 {
        let run = || -> Result<i32, Box<dyn std::error::Error>> {
            unshare(CloneFlags::CLONE_NEWNS)?;
            let private = MsFlags::MS_REC | MsFlags::MS_PRIVATE;
            mount(None::<&str>, "/", None::<&str>, private, None::<&str>)?;
            mount(
                Some("vmwt-remount"),
                src,
                Some("tmpfs"),
                MsFlags::MS_NOEXEC,
                None::<&str>,
            )?;
            mount(Some(src), dst, None::<&str>, MsFlags::MS_BIND, None::<&str>)?;
            let fd = nix::fcntl::open(dst, OFlag::O_PATH | OFlag::O_CLOEXEC, Mode::empty())?;
            remount_bind(fd.as_fd(), 0x1 | 0x2 | 0x4)?;
            let want = FsFlags::ST_RDONLY | FsFlags::ST_NOSUID | FsFlags::ST_NODEV;
            let bound = statvfs(dst)?.flags();
            let under = statvfs(src)?.flags();
            let ok =
                bound.contains(want | FsFlags::ST_NOEXEC) && !under.contains(FsFlags::ST_RDONLY);
            Ok(i32::from(!ok))
        };
        run().unwrap_or(3)
    }

    /// Where `mount_setattr` answers ENOSYS or EPERM (the systemd suite's
    /// unit), a bind's flags are set by a bind remount through its
    /// descriptor: the three asked for added, the ones it had kept, the
    /// mount it was bound from untouched. Needs root (mounts, in a forked
    /// child's own mount namespace, gone with it).
    #[test]
    fn the_remount_without_mount_setattr_adds_the_flags_and_keeps_the_others() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "needs root: mounts in a mount namespace of its own"
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
        for d in [&src, &dst] {
            std::fs::create_dir(d).expect("mkdir");
        }
        // SAFETY: the child makes system calls and `_exit`s, never
        // returning into the test harness.
        match unsafe { fork() }.expect("fork") {
            ForkResult::Child => {
                let code = std::panic::catch_unwind(|| remounted(&src, &dst));
                // SAFETY: ends the child without running the harness's
                // exit handlers.
                unsafe { libc::_exit(code.unwrap_or(4)) }
            }
            ForkResult::Parent { child } => match waitpid(child, None).expect("waitpid") {
                WaitStatus::Exited(_, 0) => {}
                WaitStatus::Exited(_, 1) => {
                    panic!("the bind did not get read-only, nosuid, nodev with its noexec kept")
                }
                other => panic!("{other:?} (3: setup failed)"),
            },
        }
    }
}
