//! `/proc` as a scan reads it: opened once, every path relative to it
//! and built in place, a live process's credentials from a pidfd
//! (`PIDFD_GET_INFO`) and the rest from `status`, and what could not be
//! read.

use std::ffi::CStr;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use nix::errno::Errno;
use nix::fcntl::{openat, OFlag, AT_FDCWD};
use nix::sys::stat::Mode;

use super::parse_id;
use crate::host::sys::{read_fd_to_end, ReadEnd};

/// A path under `/proc` (`PID/…` or `PID/task/TID/…`), built in place:
/// a scan makes a few per process and allocates none of them.
pub(super) struct Rel {
    buf: [u8; 64],
    len: usize,
}

impl Rel {
    pub(super) fn new(args: std::fmt::Arguments<'_>) -> Rel {
        use std::io::Write;
        let mut buf = [0u8; 64];
        let mut w = &mut buf[..63];
        // Two u32 and a short tail fit in 63 bytes; the 64th stays NUL.
        let _ = w.write_fmt(args);
        let len = 63 - w.len();
        Rel { buf, len }
    }

    pub(super) fn pid(pid: u32, tail: &str) -> Rel {
        Rel::new(format_args!("{pid}/{tail}"))
    }

    pub(super) fn task(pid: u32, tid: u32, tail: &str) -> Rel {
        Rel::new(format_args!("{pid}/task/{tid}/{tail}"))
    }

    pub(super) fn c(&self) -> &CStr {
        CStr::from_bytes_until_nul(&self.buf).unwrap_or_default()
    }

    /// For messages.
    pub(super) fn show(&self) -> String {
        format!("/proc/{}", String::from_utf8_lossy(&self.buf[..self.len]))
    }
}

/// `/proc`, opened once per scan; every path below is relative to it.
#[derive(Debug)]
pub(super) struct Proc {
    fd: OwnedFd,
    buf: Vec<u8>,
    /// Whether the kernel states credentials through a pidfd
    /// (`PIDFD_GET_INFO`, Linux 6.13); cleared at its first refusal.
    pidfd_creds: bool,
}

/// `struct pidfd_info` as first published (`PIDFD_INFO_SIZE_VER0`, 64
/// bytes; include/uapi/linux/pidfd.h): the kernel fills what `mask` asks.
#[repr(C)]
#[derive(Default)]
pub(super) struct PidfdInfo {
    mask: u64,
    cgroupid: u64,
    pid: u32,
    tgid: u32,
    ppid: u32,
    ruid: u32,
    rgid: u32,
    euid: u32,
    egid: u32,
    suid: u32,
    sgid: u32,
    fsuid: u32,
    fsgid: u32,
    exit_code: i32,
}

pub(super) const PIDFD_INFO_CREDS: u64 = 1 << 1;
/// `_IOWR(PIDFS_IOCTL_MAGIC, 11, struct pidfd_info)` for the 64-byte
/// structure (the kernel takes any published size).
pub(super) const PIDFD_GET_INFO: libc::c_ulong = 0xC040_FF0B;

/// Why a scan could not tell everything: entries it could not read for a
/// reason other than the task having exited.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Unreadable(pub Vec<(String, Errno)>);

impl Unreadable {
    /// Record `e` on `what` unless it says the task exited during the scan
    /// (ENOENT, ESRCH). True when it did (nothing more to read of it).
    pub(super) fn gone_or(&mut self, what: impl FnOnce() -> String, e: Errno) -> bool {
        if matches!(e, Errno::ENOENT | Errno::ESRCH) {
            return true;
        }
        self.0.push((what(), e));
        false
    }
}

impl Proc {
    pub(super) fn open() -> Result<Proc, Errno> {
        let fd = openat(
            AT_FDCWD,
            "/proc",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Proc {
            fd,
            buf: Vec::with_capacity(4096),
            pidfd_creds: true,
        })
    }

    /// Numeric entries of `/proc/REL` (`REL` = "" for `/proc` itself).
    pub(super) fn ids(&self, rel: &str) -> Result<Vec<u32>, Errno> {
        let fd = openat(
            self.fd.as_fd(),
            if rel.is_empty() { "." } else { rel },
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        let mut d = nix::dir::Dir::from_fd(fd)?;
        let mut out = Vec::new();
        for e in d.iter() {
            let e = e?;
            if let Some(id) = parse_id(e.file_name()) {
                out.push(id);
            }
        }
        Ok(out)
    }

    /// Read `/proc/REL` whole into the scan's buffer. With `whole_on_first`
    /// the file is generated whole on the first read (single_open: `status`,
    /// `stat`) and a short read is the end; otherwise (a seq_file iterating
    /// records: `mountinfo`, `children`) a read stops short before a record
    /// that does not fit, and only a read of 0 ends it.
    pub(super) fn read_file<P: ?Sized + nix::NixPath>(
        &mut self,
        rel: &P,
        whole_on_first: bool,
    ) -> Result<&[u8], Errno> {
        let fd = openat(
            self.fd.as_fd(),
            rel,
            OFlag::O_RDONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        read_into(File::from(fd), &mut self.buf, whole_on_first)?;
        Ok(&self.buf)
    }

    /// A `status` or `stat` file (generated whole on the first read).
    pub(super) fn read<P: ?Sized + nix::NixPath>(&mut self, rel: &P) -> Result<&[u8], Errno> {
        self.read_file(rel, true)
    }

    /// The owner of `/proc/PID`: the process's effective uid (root for a
    /// kernel thread). The directory itself is exempt from the rule that
    /// makes a non-dumpable process's entries root's (the files in it are
    /// not): its owner is the euid whatever the dumpable flag.
    pub(super) fn owner(&self, pid: u32) -> Result<u32, Errno> {
        nix::sys::stat::fstatat(
            self.fd.as_fd(),
            Rel::new(format_args!("{pid}")).c(),
            nix::fcntl::AtFlags::empty(),
        )
        .map(|st| st.st_uid)
    }

    /// Whether `pid` has an address space: its `exe` link resolves (a live
    /// process's is its binary, even when deleted). A kernel thread, a
    /// zombie (its leader's credentials then do not speak for threads that
    /// run on) and a process past `exit_mm` have none: ENOENT, as for a
    /// process that is gone. (`exe` is followed, not read: the kernel then
    /// skips building the path string readlink would return.)
    pub(super) fn has_mm(&self, pid: u32) -> Result<bool, Errno> {
        match nix::unistd::faccessat(
            self.fd.as_fd(),
            Rel::pid(pid, "exe").c(),
            nix::unistd::AccessFlags::F_OK,
            nix::fcntl::AtFlags::empty(),
        ) {
            Ok(()) => Ok(true),
            Err(Errno::ENOENT) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The real, effective, saved and fs uid of process `pid`, from a
    /// pidfd (`PIDFD_GET_INFO`): the kernel copies four numbers instead of
    /// generating the ~1.5 KiB of `status` (~6 µs against ~19 µs per
    /// process measured here). `Ok(None)` when the kernel cannot say (too
    /// old: every later process's `status` is read instead) or the pidfd
    /// cannot be had for another reason (this one's is read); ESRCH when
    /// the process is gone.
    pub(super) fn creds(&mut self, pid: u32) -> Result<Option<[u32; 4]>, Errno> {
        if !self.pidfd_creds {
            return Ok(None);
        }
        let Ok(raw) = libc::pid_t::try_from(pid) else {
            return Ok(None);
        };
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or
        // -1; it touches no memory of ours.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, raw, 0u32) };
        let fd = match i32::try_from(fd) {
            Ok(fd) if fd >= 0 => {
                // SAFETY: the kernel just returned `fd`, open and ours alone.
                unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) }
            }
            _ => {
                return match Errno::last() {
                    Errno::ESRCH => Err(Errno::ESRCH),
                    Errno::ENOSYS => {
                        self.pidfd_creds = false;
                        Ok(None)
                    }
                    _ => Ok(None),
                }
            }
        };
        let mut info = PidfdInfo {
            mask: PIDFD_INFO_CREDS,
            ..PidfdInfo::default()
        };
        // SAFETY: `info` is a valid, writable pidfd_info of the size the
        // request number states.
        let rc = unsafe { libc::ioctl(fd.as_raw_fd(), PIDFD_GET_INFO, &raw mut info) };
        if rc != 0 {
            return match Errno::last() {
                Errno::ESRCH => Err(Errno::ESRCH),
                Errno::ENOTTY | Errno::EINVAL | Errno::EOPNOTSUPP => {
                    self.pidfd_creds = false;
                    Ok(None)
                }
                _ => Ok(None),
            };
        }
        if info.mask & PIDFD_INFO_CREDS == 0 {
            return Ok(None);
        }
        Ok(Some([info.ruid, info.euid, info.suid, info.fsuid]))
    }

    /// The number of threads in `pid`'s group, from its `task/` directory's
    /// link count (2 + the threads; a zombie leader counts while its group
    /// lives). None when it cannot be read.
    pub(super) fn threads(&self, pid: u32) -> Option<u64> {
        nix::sys::stat::fstatat(
            self.fd.as_fd(),
            Rel::pid(pid, "task").c(),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .ok()
        .map(|st| st.st_nlink.saturating_sub(2))
    }

    /// The children of kthreadd (pid 2), sorted: the kernel's threads,
    /// each but kthreadd itself, are among them. A hint, never a verdict: a
    /// pid listed here is still tested (no address space and one thread; a
    /// user-mode helper is kthreadd's child too), and one missing from it
    /// (a kernel thread started since, a list cut short, another pid 2 in
    /// a container) has its status read. None when it cannot be read
    /// (no `CONFIG_PROC_CHILDREN`): every process is tested.
    pub(super) fn kthreadd_children(&mut self) -> Option<Vec<u32>> {
        let text = std::str::from_utf8(self.read_file("2/task/2/children", false).ok()?).ok()?;
        let mut pids: Vec<u32> = text
            .split_ascii_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        pids.sort_unstable();
        (!pids.is_empty()).then_some(pids)
    }

    /// The target of the symlink `/proc/REL`, into `out` (a namespace
    /// link, `mnt:[4026531841]`, is far shorter than its 64 bytes).
    pub(super) fn link_into<'a>(
        &self,
        rel: &CStr,
        out: &'a mut [u8; 64],
    ) -> Result<&'a [u8], Errno> {
        // SAFETY: `rel` is NUL-terminated; the kernel writes at most
        // `out.len()` bytes into `out`, which is valid for that many.
        let n = unsafe {
            libc::readlinkat(
                self.fd.as_raw_fd(),
                rel.as_ptr(),
                out.as_mut_ptr().cast(),
                out.len(),
            )
        };
        match usize::try_from(n) {
            Ok(n) if n < out.len() => Ok(&out[..n]),
            Ok(_) => Err(Errno::ENAMETOOLONG),
            Err(_) => Err(Errno::last()),
        }
    }

    /// The inode of the user namespace that owns the namespace
    /// `/proc/REL` (`ns/mnt`): `ioctl(NS_GET_USERNS)` on it, which answers
    /// by the namespace, not by the user namespace its process is in now
    /// (a process that unshared only its user namespace stays in a mount
    /// namespace its old one owns).
    pub(super) fn ns_owner(&self, rel: &CStr) -> Result<u64, Errno> {
        /// `_IO(0xb7, 0x1)` (include/uapi/linux/nsfs.h).
        const NS_GET_USERNS: libc::c_ulong = 0xb701;
        let ns = openat(
            self.fd.as_fd(),
            rel,
            OFlag::O_RDONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        // SAFETY: NS_GET_USERNS takes no argument and returns a new fd (or
        // -1); `ns` is open for the call's whole length.
        let user = unsafe { libc::ioctl(ns.as_raw_fd(), NS_GET_USERNS) };
        if user < 0 {
            return Err(Errno::last());
        }
        // SAFETY: a non-negative return is a new fd owned by nothing else.
        let user = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(user) };
        Ok(nix::sys::stat::fstat(&user)?.st_ino)
    }

    /// The target of the symlink `/proc/REL`.
    pub(super) fn link(&self, rel: &str) -> Result<String, Errno> {
        nix::fcntl::readlinkat(self.fd.as_fd(), rel).map(|t| t.to_string_lossy().into_owned())
    }

    /// The thread ids of `pid` but the leader's own.
    pub(super) fn other_threads(&self, pid: u32, u: &mut Unreadable) -> Vec<u32> {
        match self.ids(&format!("{pid}/task")) {
            Ok(t) => t.into_iter().filter(|t| *t != pid).collect(),
            Err(e) => {
                u.gone_or(|| format!("/proc/{pid}/task"), e);
                Vec::new()
            }
        }
    }
}

/// Read `f` whole into `buf` (see [`Proc::read_file`] for `whole_on_first`),
/// starting with the room the buffer already has (a page at least).
pub(super) fn read_into(f: File, buf: &mut Vec<u8>, whole_on_first: bool) -> Result<(), Errno> {
    let end = if whole_on_first {
        ReadEnd::ShortRead
    } else {
        ReadEnd::Eof
    };
    let room = buf.capacity().max(4096);
    read_fd_to_end(f.as_fd(), buf, room, usize::MAX, end)
}
