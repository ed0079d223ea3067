//! New inodes for the principal.
//!
//! `chown` does not revoke access that is already open: a file descriptor
//! passed over a unix socket, or a `MAP_SHARED` mapping, keeps reading and
//! writing the inode whatever its owner and mode become, and a descriptor
//! in flight in a socket's queue is seen by no `/proc` scan. So an item the
//! old owner could reach (an inode in it not root's alone,
//! [`super::walk::root_only`]) is adopted as new inodes that only root has
//! ever held: each regular file a reflink where the file system has one,
//! else a copy of its data ranges only (holes stay holes: a sparse image
//! stays sparse); directories, symlinks, FIFOs and sockets made anew; modes
//! kept without set-id bits, times kept, extended attributes (ACLs among
//! them) not copied. Everything is made under a temporary name in the
//! target's directory (root's, 0700 or 0600, until it is complete), then
//! given to the principal, synced, and renamed into place; only then are
//! the old inodes removed from DIR. What the old owner still holds reaches
//! only those old inodes, which are nobody's data any more. Every look
//! into DIR (a lookup, an open, a `readlinkat`) is made with DIR's owner's
//! file-system ids ([`super::old_owner`]), every change in the state dir
//! with root's.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{openat, readlinkat, renameat2, AtFlags, OFlag, RenameFlags};
use nix::sys::stat::{
    fchmod, fstat, futimens, mkdirat, mknodat, utimensat, FileStat, Mode, SFlag, UtimensatFlags,
};
use nix::sys::time::TimeSpec;
use nix::unistd::{fchown, fchownat, Gid, Uid, Whence};

use crate::host::dirs::Dir;
use crate::host::ownership;
use crate::host::sys::SysContext;

use super::old_owner::OldOwner;
use super::walk::{check_entry, describe, kind_of, lstat_at, too_deep, DIR_FLAGS, NOFOLLOW};
use super::{sys_err, AdoptError, Kind, Result};

/// The temporary name of item `index`'s new inodes in the target's
/// directory (an item's own name may already be `NAME_MAX` long).
pub(super) fn temp_name(index: usize) -> String {
    format!(".vmwarden-adopt-{index}")
}

/// Who the new inodes belong to.
#[derive(Debug, Clone, Copy)]
pub(super) struct Owner {
    pub uid: u32,
    pub gid: u32,
}

/// Bytes a copy is counted to need beyond its data, per entry (a directory
/// block, an inode's share).
pub(super) const PER_ENTRY: u64 = 4096;

/// Whether the file system of `dir` makes reflinks: two unnamed files
/// (`O_TMPFILE`, gone when closed: nothing is left behind), one cloned
/// from the other.
pub(super) fn reflinks(dir: &Dir) -> bool {
    let tmp = || {
        openat(
            dir.fd.as_fd(),
            ".",
            OFlag::O_TMPFILE | OFlag::O_RDWR | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
    };
    let (Ok(a), Ok(b)) = (tmp(), tmp()) else {
        return false;
    };
    let block = fstat(a.as_fd()).map(|s| s.st_blksize).unwrap_or(4096);
    let data = vec![0x5au8; usize::try_from(block).unwrap_or(4096).max(512)];
    if nix::sys::uio::pwrite(a.as_fd(), &data, 0) != Ok(data.len()) {
        return false;
    }
    clone(a.as_fd(), b.as_fd()).is_ok()
}

/// `ioctl(dst, FICLONE, src)`: `dst` shares `src`'s blocks, copy on write.
fn clone(src: BorrowedFd<'_>, dst: BorrowedFd<'_>) -> nix::Result<()> {
    // SAFETY: FICLONE takes the source descriptor as its integer argument;
    // both descriptors are open for the whole call.
    let r = unsafe { libc::ioctl(dst.as_raw_fd(), libc::FICLONE, src.as_raw_fd()) };
    Errno::result(r).map(drop)
}

/// The data of `src` (`size` bytes) into the empty `dst`: a reflink, else
/// the ranges `SEEK_DATA`/`SEEK_HOLE` report as data (all of it when the
/// file system cannot tell), then the size set, so holes stay holes.
fn copy_data(src: BorrowedFd<'_>, dst: BorrowedFd<'_>, size: u64, to: &Path) -> Result<()> {
    if clone(src, dst).is_ok() {
        return Ok(());
    }
    let end = i64::try_from(size).unwrap_or(i64::MAX);
    let mut off = 0i64;
    while off < end {
        let data = match nix::unistd::lseek(src, off, Whence::SeekData) {
            Ok(d) => d,
            Err(Errno::ENXIO) => break,
            Err(Errno::EINVAL) => off,
            Err(e) => return Err(sys_err(e, "lseek SEEK_DATA", to)),
        };
        let hole = match nix::unistd::lseek(src, data, Whence::SeekHole) {
            Ok(h) => h.min(end),
            Err(Errno::EINVAL) => end,
            Err(e) => return Err(sys_err(e, "lseek SEEK_HOLE", to)),
        };
        copy_range(src, dst, data, hole, to)?;
        off = hole.max(data + 1);
    }
    nix::unistd::ftruncate(dst, end).map_err(|e| copy_err(e, "ftruncate", to))
}

/// Free room (`f_bavail`) a copy always leaves beyond each write: what it
/// writes next may take some metadata blocks besides its data.
const FLOOR: u64 = 1 << 20;

/// The most a copy writes between two looks at the free room.
const CHUNK: usize = 64 << 20;

/// Room for `len` more bytes in `dst`'s file system, counted as an
/// unprivileged writer's (`f_bavail`, plus [`FLOOR`]): root's own writes
/// could go on into the reserve kept for root (`f_bfree`), which the host's
/// services need when the disk is full. The plan counted the room from
/// the sources' allocated size, but an old owner who keeps writing into a
/// sparse image's holes grows it meanwhile: the copy stops here instead
/// (the caller removes what it made; the old files are as they were).
fn ensure_room(dst: BorrowedFd<'_>, len: u64, path: &Path) -> Result<()> {
    let v = nix::sys::statvfs::fstatvfs(dst).sys("fstatvfs", path)?;
    let free = v.blocks_available().saturating_mul(v.fragment_size());
    if free < len.saturating_add(FLOOR) {
        return Err(AdoptError::RanOutOfRoom {
            path: path.to_path_buf(),
        });
    }
    Ok(())
}

/// Bytes `from..to` of `src` to the same offsets of `dst`.
fn copy_range(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    from: i64,
    to: i64,
    path: &Path,
) -> Result<()> {
    let (mut i, mut o) = (from, from);
    while i < to {
        let len = usize::try_from(to - i).unwrap_or(usize::MAX).min(CHUNK);
        ensure_room(dst, u64::try_from(len).unwrap_or(u64::MAX), path)?;
        match nix::fcntl::copy_file_range(src, Some(&mut i), dst, Some(&mut o), len) {
            Ok(0) => break, // the source shrank meanwhile
            Ok(_) => {}
            // No in-kernel copy between these files: through a buffer.
            Err(Errno::EINVAL | Errno::EOPNOTSUPP | Errno::EXDEV | Errno::ENOSYS) => {
                return copy_buffered(src, dst, i, to, path)
            }
            Err(e) => return Err(copy_err(e, "copy_file_range", path)),
        }
    }
    Ok(())
}

/// Bytes `from..to` of `src` to the same offsets of `dst` through a buffer.
fn copy_buffered(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    mut at: i64,
    to: i64,
    path: &Path,
) -> Result<()> {
    const BUF: usize = 1 << 20;
    let mut buf = vec![0u8; BUF];
    while at < to {
        let want = usize::try_from(to - at).map_or(BUF, |w| w.min(BUF));
        ensure_room(dst, u64::try_from(want).unwrap_or(u64::MAX), path)?;
        let n = nix::sys::uio::pread(src, &mut buf[..want], at)
            .map_err(|e| sys_err(e, "pread", path))?;
        if n == 0 {
            break; // the source shrank meanwhile
        }
        let mut w = 0;
        while w < n {
            let off = at + i64::try_from(w).expect("within a 1 MiB buffer");
            w += nix::sys::uio::pwrite(dst, &buf[w..n], off)
                .map_err(|e| copy_err(e, "pwrite", path))?;
        }
        at += i64::try_from(n).expect("within a 1 MiB buffer");
    }
    Ok(())
}

/// A failed write of a copy: no room is said as such.
fn copy_err(e: Errno, op: &'static str, path: &Path) -> AdoptError {
    match e {
        Errno::ENOSPC | Errno::EDQUOT => AdoptError::RanOutOfRoom {
            path: path.to_path_buf(),
        },
        e => sys_err(e, op, path),
    }
}

/// Open `parent/name` to read its data, never following a symlink, and
/// check it is still what the plan inspected (a regular file with one
/// link, on DIR's file system): the old owner may swap entries meanwhile.
fn open_source_file(parent: &Dir, name: &OsStr, dev: u64) -> Result<(OwnedFd, FileStat)> {
    let path = parent.path.join(name);
    let fd = openat(
        parent.fd.as_fd(),
        name,
        OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | NOFOLLOW,
        Mode::empty(),
    )
    .sys("openat", &path)?;
    let st = fstat(fd.as_fd()).sys("fstat", &path)?;
    if kind_of(&st) != SFlag::S_IFREG {
        return Err(AdoptError::Refused {
            name: String::new(),
            path,
            why: format!("became a {} during the copy; left as it is", describe(&st)),
        });
    }
    check_entry(&path, &st, dev)?;
    Ok((fd, st))
}

fn times(st: &FileStat) -> (TimeSpec, TimeSpec) {
    (
        TimeSpec::new(st.st_atime, st.st_atime_nsec),
        TimeSpec::new(st.st_mtime, st.st_mtime_nsec),
    )
}

/// Give a new inode (open as `fd`) to `owner` with `st`'s permission bits
/// (no set-id) and times.
fn finish(fd: BorrowedFd<'_>, st: &FileStat, owner: Owner, mode: u32, to: &Path) -> Result<()> {
    fchown(
        fd,
        Some(Uid::from_raw(owner.uid)),
        Some(Gid::from_raw(owner.gid)),
    )
    .sys("fchown", to)?;
    fchmod(fd, Mode::from_bits_truncate(mode)).sys("fchmod", to)?;
    let (a, m) = times(st);
    futimens(fd, &a, &m).sys("futimens", to)?;
    Ok(())
}

/// A new regular file `dst/name` (root's 0600 while it is written) with the
/// data of `src_fd`.
fn new_file(src_fd: &OwnedFd, st: &FileStat, dst: &Dir, name: &OsStr) -> Result<OwnedFd> {
    let to = dst.path.join(name);
    let fd = openat(
        dst.fd.as_fd(),
        name,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | NOFOLLOW,
        Mode::from_bits_truncate(0o600),
    )
    .map_err(|e| copy_err(e, "create", &to))?;
    copy_data(
        src_fd.as_fd(),
        fd.as_fd(),
        u64::try_from(st.st_size).unwrap_or(0),
        &to,
    )?;
    Ok(fd)
}

/// Copy the entries of the share directory `src` into the new, empty
/// directory `dst`, depth first; `depth` is `dst`'s below the share.
/// Every look into `src` is made with the old owner's ids (`old`).
fn copy_tree(
    src: &Dir,
    dst: &Dir,
    dev: u64,
    owner: Owner,
    old: OldOwner,
    depth: usize,
) -> Result<()> {
    for n in ownership::entries(src).sys("readdir", &src.path)? {
        let from = src.path.join(&n);
        let to = dst.path.join(&n);
        let Some(st) = old.with(|| lstat_at(src, &n))?? else {
            continue;
        };
        check_entry(&from, &st, dev)?;
        // Every entry made takes room of its own (a directory's block, a
        // long symlink's, the parent's growing entries), which the plan
        // counted for the entries there were then; the old owner may add
        // more meanwhile.
        ensure_room(dst.fd.as_fd(), PER_ENTRY, &to)?;
        let mode = st.st_mode & 0o777;
        match kind_of(&st) {
            SFlag::S_IFDIR => {
                if depth >= ownership::MAX_DEPTH {
                    return Err(too_deep(&from));
                }
                let s = Dir {
                    fd: old
                        .with(|| openat(src.fd.as_fd(), n.as_os_str(), DIR_FLAGS, Mode::empty()))?
                        .sys("openat", &from)?,
                    path: from.clone(),
                };
                check_entry(&from, &fstat(s.fd.as_fd()).sys("fstat", &from)?, dev)?;
                mkdirat(
                    dst.fd.as_fd(),
                    n.as_os_str(),
                    Mode::from_bits_truncate(0o700),
                )
                .map_err(|e| copy_err(e, "mkdir", &to))?;
                let d = Dir {
                    fd: openat(dst.fd.as_fd(), n.as_os_str(), DIR_FLAGS, Mode::empty())
                        .sys("openat", &to)?,
                    path: to.clone(),
                };
                copy_tree(&s, &d, dev, owner, old, depth + 1)?;
                finish(d.fd.as_fd(), &st, owner, st.st_mode & 0o1777, &to)?;
            }
            SFlag::S_IFREG => {
                let (src_fd, now) = old.with(|| open_source_file(src, &n, dev))??;
                let fd = new_file(&src_fd, &now, dst, &n)?;
                finish(fd.as_fd(), &now, owner, mode, &to)?;
            }
            kind => {
                match kind {
                    SFlag::S_IFLNK => {
                        let target = old
                            .with(|| readlinkat(src.fd.as_fd(), n.as_os_str()))?
                            .sys("readlinkat", &from)?;
                        nix::unistd::symlinkat(target.as_os_str(), dst.fd.as_fd(), n.as_os_str())
                            .map_err(|e| copy_err(e, "symlinkat", &to))?;
                    }
                    // FIFOs and sockets: new, unbound nodes (check_entry
                    // refused devices).
                    k => mknodat(
                        dst.fd.as_fd(),
                        n.as_os_str(),
                        k,
                        Mode::from_bits_truncate(mode),
                        0,
                    )
                    .map_err(|e| copy_err(e, "mknodat", &to))?,
                }
                fchownat(
                    dst.fd.as_fd(),
                    n.as_os_str(),
                    Some(Uid::from_raw(owner.uid)),
                    Some(Gid::from_raw(owner.gid)),
                    AtFlags::AT_SYMLINK_NOFOLLOW,
                )
                .sys("fchownat", &to)?;
                let (a, m) = times(&st);
                utimensat(
                    dst.fd.as_fd(),
                    n.as_os_str(),
                    &a,
                    &m,
                    UtimensatFlags::NoFollowSymlink,
                )
                .sys("utimensat", &to)?;
            }
        }
    }
    Ok(())
}

/// Remove `dir/name` if it is there (a temporary name a killed run left),
/// never following a symlink.
fn remove_if_there(dir: &Dir, name: &OsStr) -> Result<()> {
    if lstat_at(dir, name)?.is_none() {
        return Ok(());
    }
    let out = ownership::delete_entries(dir, &[name.to_os_string()], None);
    match out.failed.first() {
        None => Ok(()),
        Some(f) => Err(AdoptError::Refused {
            name: String::new(),
            path: f.path.clone(),
            why: format!(
                "is left by an interrupted run and cannot be removed: {}",
                f.reason
            ),
        }),
    }
}

/// Make item `src_parent/src_name` (a disk image or a share source) anew
/// as `dst_parent/last`, the principal's: under `temp` until complete,
/// then renamed into place (never over an existing name). The old inodes
/// stay in DIR (the caller removes them after). Every look into DIR is
/// made with the old owner's ids (`old`), every change in the state dir
/// with root's.
#[allow(clippy::too_many_arguments)]
pub(super) fn copy_item(
    kind: Kind,
    src_parent: &Dir,
    src_name: &OsStr,
    dst_parent: &Dir,
    last: &OsStr,
    temp: &str,
    owner: Owner,
    old: OldOwner,
    dev: u64,
) -> Result<()> {
    let temp = OsString::from(temp);
    remove_if_there(dst_parent, &temp)?;
    let tmp_path = dst_parent.path.join(&temp);
    let made = (|| -> Result<()> {
        match kind {
            Kind::Image => {
                let (src_fd, st) = old.with(|| open_source_file(src_parent, src_name, dev))??;
                let fd = new_file(&src_fd, &st, dst_parent, &temp)?;
                nix::unistd::fsync(fd.as_fd()).sys("fsync", &tmp_path)?;
                finish(fd.as_fd(), &st, owner, 0o600, &tmp_path)?;
            }
            Kind::Share => {
                let from = src_parent.path.join(src_name);
                let src = Dir {
                    fd: old
                        .with(|| openat(src_parent.fd.as_fd(), src_name, DIR_FLAGS, Mode::empty()))?
                        .sys("openat", &from)?,
                    path: from.clone(),
                };
                let st = fstat(src.fd.as_fd()).sys("fstat", &from)?;
                check_entry(&from, &st, dev)?;
                ensure_room(dst_parent.fd.as_fd(), PER_ENTRY, &tmp_path)?;
                mkdirat(
                    dst_parent.fd.as_fd(),
                    temp.as_os_str(),
                    Mode::from_bits_truncate(0o700),
                )
                .map_err(|e| copy_err(e, "mkdir", &tmp_path))?;
                let dst = Dir {
                    fd: openat(
                        dst_parent.fd.as_fd(),
                        temp.as_os_str(),
                        DIR_FLAGS,
                        Mode::empty(),
                    )
                    .sys("openat", &tmp_path)?,
                    path: tmp_path.clone(),
                };
                copy_tree(&src, &dst, dev, owner, old, 1)?;
                nix::unistd::syncfs(dst.fd.as_fd()).sys("syncfs", &tmp_path)?;
                // Writable by the principal only (the launcher refuses a
                // share source others may write).
                finish(dst.fd.as_fd(), &st, owner, st.st_mode & 0o755, &tmp_path)?;
            }
        }
        Ok(())
    })();
    if let Err(e) = made {
        // Nothing half-made stays; what the old owner has is untouched.
        let _ = remove_if_there(dst_parent, &temp);
        return Err(e);
    }
    renameat2(
        dst_parent.fd.as_fd(),
        temp.as_os_str(),
        dst_parent.fd.as_fd(),
        last,
        RenameFlags::RENAME_NOREPLACE,
    )
    .sys("renameat2", dst_parent.path.join(last))?;
    nix::unistd::fsync(dst_parent.fd.as_fd()).sys("fsync", &dst_parent.path)?;
    Ok(())
}
