//! Opening the files a spec names without ever blocking on them.
//!
//! A FIFO opened for reading blocks until a writer appears, a socket cannot
//! be opened at all, and opening a device can have side effects (a tape
//! rewinds, a tty becomes the controlling terminal). So a file the launcher
//! reads is first opened `O_PATH` (which neither blocks nor touches the
//! device), `fstat`ed, and only a regular file is opened for reading, with
//! `O_NONBLOCK` and a check that the second open reached the same inode.
//! A leaf like the rest of `config`: it imports nothing from the crate.

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;

use nix::errno::Errno;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{fstat, FileStat, Mode, SFlag};

/// The type of a file, from its `st_mode`, for refusals that say what was
/// found instead of a regular file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Regular,
    Directory,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
    Unknown,
}

impl Kind {
    pub fn of(mode: u32) -> Kind {
        match SFlag::from_bits_truncate(mode & SFlag::S_IFMT.bits()) {
            SFlag::S_IFREG => Kind::Regular,
            SFlag::S_IFDIR => Kind::Directory,
            SFlag::S_IFLNK => Kind::Symlink,
            SFlag::S_IFIFO => Kind::Fifo,
            SFlag::S_IFSOCK => Kind::Socket,
            SFlag::S_IFCHR => Kind::CharDevice,
            SFlag::S_IFBLK => Kind::BlockDevice,
            _ => Kind::Unknown,
        }
    }

    /// "a FIFO", "a socket", … for messages.
    pub fn describe(self) -> &'static str {
        match self {
            Kind::Regular => "a regular file",
            Kind::Directory => "a directory",
            Kind::Symlink => "a symlink",
            Kind::Fifo => "a FIFO",
            Kind::Socket => "a socket",
            Kind::CharDevice => "a character device",
            Kind::BlockDevice => "a block device",
            Kind::Unknown => "a file of unknown type",
        }
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.describe())
    }
}

/// Symlinks followed before giving up (the kernel's limit).
pub const MAX_LINKS: usize = 40;

/// Why a path cannot be trusted (the walk itself is `host::trust`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Distrust {
    #[error("{path}: {op}: {errno}")]
    Sys {
        path: PathBuf,
        op: &'static str,
        errno: Errno,
    },
    #[error("{path} is owned by uid {uid}; only what root owns can be trusted")]
    NotRootOwned { path: PathBuf, uid: u32 },
    /// Under a walk that trusts the VM's principal too.
    #[error("{path} is owned by uid {uid}; only what root or the VM's principal (uid {principal}) owns can be trusted")]
    NotOwnersOwn {
        path: PathBuf,
        uid: u32,
        principal: u32,
    },
    /// A POSIX access ACL grants write to someone the mode bits do not show.
    #[error("{path} has a POSIX ACL that lets {who} change it; only root (or the VM's principal, where it is trusted) may be able to")]
    AclWritable { path: PathBuf, who: AclWriter },
    #[error("{path} has mode {mode:04o}: {who} can change it; only root may be able to")]
    Writable {
        path: PathBuf,
        mode: u32,
        who: &'static str,
    },
    #[error("{path} is a symlink; this file is never read through a symlink")]
    Symlink { path: PathBuf },
    #[error("{path} is {kind}, not {want}")]
    WrongKind {
        path: PathBuf,
        kind: Kind,
        want: &'static str,
    },
    #[error("{path}: more than {MAX_LINKS} symlinks on the way")]
    TooManyLinks { path: PathBuf },
    #[error("{path}: {reason}")]
    BadPath { path: PathBuf, reason: &'static str },
}

/// Who a POSIX ACL lets write, for [`Distrust::AclWritable`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AclWriter {
    User(u32),
    Group(u32),
    /// The ACL's bytes are not an ACL: anyone, for all root can tell.
    Unknown,
}

impl std::fmt::Display for AclWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AclWriter::User(u) => write!(f, "user uid {u}"),
            AclWriter::Group(g) => write!(f, "group gid {g}"),
            AclWriter::Unknown => write!(f, "someone (its ACL cannot be read)"),
        }
    }
}

/// Why a file could not be opened as a regular file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    #[error("{0}")]
    Sys(Errno),
    #[error("is {0}, not a regular file")]
    NotRegular(Kind),
    #[error("was replaced while it was being opened")]
    Replaced,
}

/// Open `dir/name` (or `name` relative to the working directory when `dir`
/// is `None`; absolute names ignore `dir`) for reading, only if it is a
/// regular file. `follow`: whether a symlink in the last component may be
/// followed. Never blocks, never opens anything but a regular file.
pub fn open_regular_at(
    dir: Option<BorrowedFd<'_>>,
    name: &OsStr,
    follow: bool,
) -> Result<(File, FileStat), OpenError> {
    let nofollow = if follow {
        OFlag::empty()
    } else {
        OFlag::O_NOFOLLOW
    };
    let at = |flags: OFlag| -> nix::Result<OwnedFd> {
        match dir {
            Some(d) => openat(d, name, flags | nofollow | OFlag::O_CLOEXEC, Mode::empty()),
            None => openat(
                nix::fcntl::AT_FDCWD,
                name,
                flags | nofollow | OFlag::O_CLOEXEC,
                Mode::empty(),
            ),
        }
    };
    let probe = at(OFlag::O_PATH).map_err(OpenError::Sys)?;
    let first = fstat(probe.as_fd()).map_err(OpenError::Sys)?;
    // The probe stays open until the inode check: its inode cannot be
    // freed and reused by a replacement meanwhile.
    let opened = open_probed_at(dir, name, follow, &first);
    drop(probe);
    opened
}

/// The second half of [`open_regular_at`], for a caller that has probed
/// `dir/name` itself (an `O_PATH` open and `fstat`, as a trusted walk
/// does): `first` is that probe's stat, and the probe's fd must stay open
/// until this returns. Refuses anything but a regular file before opening
/// it, and a file that is not the probed inode after.
pub fn open_probed_at(
    dir: Option<BorrowedFd<'_>>,
    name: &OsStr,
    follow: bool,
    first: &FileStat,
) -> Result<(File, FileStat), OpenError> {
    let kind = Kind::of(first.st_mode);
    if kind != Kind::Regular {
        return Err(OpenError::NotRegular(kind));
    }
    let nofollow = if follow {
        OFlag::empty()
    } else {
        OFlag::O_NOFOLLOW
    };
    let flags = OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | nofollow | OFlag::O_CLOEXEC;
    let opened = match dir {
        Some(d) => openat(d, name, flags, Mode::empty()),
        None => openat(nix::fcntl::AT_FDCWD, name, flags, Mode::empty()),
    };
    let fd = opened.map_err(|e| match e {
        // The name now holds a socket (open(2) cannot open one).
        Errno::ENXIO => OpenError::Replaced,
        e => OpenError::Sys(e),
    })?;
    let st = fstat(fd.as_fd()).map_err(OpenError::Sys)?;
    if (st.st_dev, st.st_ino) != (first.st_dev, first.st_ino) {
        return Err(OpenError::Replaced);
    }
    Ok((File::from(fd), st))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStrExt;

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("fifo");
        nix::unistd::mkfifo(&p, Mode::from_bits_truncate(0o600)).unwrap();
        let e = open_regular_at(None, p.as_os_str(), true).unwrap_err();
        assert_eq!(e, OpenError::NotRegular(Kind::Fifo));
        assert_eq!(e.to_string(), "is a FIFO, not a regular file");
    }

    #[test]
    fn a_socket_and_a_directory_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sock");
        let _l = std::os::unix::net::UnixListener::bind(&p).unwrap();
        assert_eq!(
            open_regular_at(None, p.as_os_str(), true).unwrap_err(),
            OpenError::NotRegular(Kind::Socket)
        );
        assert_eq!(
            open_regular_at(None, dir.path().as_os_str(), true).unwrap_err(),
            OpenError::NotRegular(Kind::Directory)
        );
        assert_eq!(
            open_regular_at(None, OsStr::from_bytes(b"/dev/null"), true).unwrap_err(),
            OpenError::NotRegular(Kind::CharDevice)
        );
    }

    #[test]
    fn symlinks_follow_only_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f");
        std::fs::write(&f, b"x").unwrap();
        let l = dir.path().join("l");
        std::os::unix::fs::symlink(&f, &l).unwrap();
        open_regular_at(None, l.as_os_str(), true).unwrap();
        assert_eq!(
            open_regular_at(None, l.as_os_str(), false).unwrap_err(),
            OpenError::NotRegular(Kind::Symlink)
        );
    }
}
