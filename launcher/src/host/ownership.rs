//! What vmwarden owns, and how it deletes it.
//!
//! Complete deletion is "every entry under a root minus an explicit keep
//! set", never a list of known names. Removal never follows a symlink and
//! never crosses into another file system (a mount point inside a root is
//! not vmwarden's to empty); every reported deletion is re-checked.
//!
//! Names are bytes end to end: enumerated, deleted and re-stat'ed as the raw
//! `OsStr` the kernel returned, never through a lossy or filtered string. An
//! entry that vanishes between enumeration and deletion is a failure (the
//! caller holds the lease and the VM is dead: nothing else should be deleting
//! there), never a silent success.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::dir::Dir as NixDir;
use nix::errno::Errno;
use nix::fcntl::{openat, AtFlags, OFlag};
use nix::sys::stat::{fstat, fstatat, FileStat, Mode, SFlag};
use nix::unistd::{unlinkat, UnlinkatFlags};
use serde::Serialize;

use crate::config::paths::{CREDS_FLOOR_FILE, INTENT_FILE, LAST_CLEANUP_FILE, LEASE_FILE};
use crate::config::rawpath;
use crate::host::dirs::Dir;

/// Entries of a VM's runtime dir that teardown keeps: the lease file, so a
/// concurrent launch always locks the same inode, the last cleanup's
/// record (`instance::last_cleanup`), which counts the instances torn down,
/// and the credential floor (`instance::creds_floor`), which bounds what
/// an instance may have left.
pub const RUNTIME_KEEP: &[&str] = &[LEASE_FILE, LAST_CLEANUP_FILE, CREDS_FLOOR_FILE];

/// The runtime dir entry deleted last: while it exists, a teardown killed
/// mid-way can still be completed from it.
pub const DELETE_LAST: &str = INTENT_FILE;

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Kept {
    #[serde(serialize_with = "rawpath::path")]
    pub path: PathBuf,
    pub reason: String,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Failed {
    #[serde(serialize_with = "rawpath::path")]
    pub path: PathBuf,
    pub reason: String,
}

/// The outcome of deleting a set of paths, re-checked.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Outcome {
    #[serde(serialize_with = "rawpath::paths")]
    pub deleted: Vec<PathBuf>,
    pub kept: Vec<Kept>,
    pub failed: Vec<Failed>,
}

impl Outcome {
    pub fn merge(&mut self, o: Outcome) {
        self.deleted.extend(o.deleted);
        self.kept.extend(o.kept);
        self.failed.extend(o.failed);
    }
}

/// Names in `dir` as raw bytes, sorted (`.` and `..` excluded).
pub fn entries(dir: &Dir) -> nix::Result<Vec<OsString>> {
    names_at(dir.fd.as_fd())
}

/// Names in the directory `fd` as raw bytes, sorted (`.` and `..` excluded).
fn names_at(fd: BorrowedFd<'_>) -> nix::Result<Vec<OsString>> {
    let fd = openat(
        fd,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let mut d = NixDir::from_fd(fd)?;
    let mut out = Vec::new();
    for e in d.iter() {
        let e = e?;
        let n = e.file_name().to_bytes();
        if n != b"." && n != b".." {
            out.push(OsStr::from_bytes(n).to_os_string());
        }
    }
    out.sort();
    Ok(out)
}

/// `E(dir) \ keep`, with `last` (if present) moved to the end. Compared
/// byte for byte.
pub fn deletion_set(names: &[OsString], keep: &[&str], last: Option<&str>) -> Vec<OsString> {
    let mut d: Vec<OsString> = names
        .iter()
        .filter(|n| !keep.iter().any(|k| n.as_os_str() == OsStr::new(k)))
        .cloned()
        .collect();
    if let Some(l) = last {
        if let Some(i) = d.iter().position(|n| n.as_os_str() == OsStr::new(l)) {
            let x = d.remove(i);
            d.push(x);
        }
    }
    d
}

fn is_dir_mode(mode: u32) -> bool {
    SFlag::from_bits_truncate(mode & SFlag::S_IFMT.bits()) == SFlag::S_IFDIR
}

/// Deepest directory nesting `adopt` descends into below a share source
/// (it copies recursively). Removal has no such limit: it walks a tree of
/// any depth iteratively, holding two descriptors at a time.
pub const MAX_DEPTH: usize = 64;

/// Why an entry could not be removed (a [`Failed`] entry's reason).
#[derive(Debug, thiserror::Error)]
pub enum RemoveError {
    /// `stat`, `open`, `read directory`, `rmdir`, `unlink`.
    #[error("{op}: {errno}")]
    Sys {
        op: &'static str,
        #[source]
        errno: Errno,
    },
    #[error("is a mount point (another file system, or a bind mount); not descending")]
    MountPoint,
    /// ENOENT on an entry just enumerated.
    #[error("vanished between enumeration and deletion (ENOENT); not counted as deleted")]
    Vanished,
    /// The directory opened is not the one just stat'ed, or its `..` is no
    /// longer the directory it was entered from: something moved the tree.
    #[error("was replaced or moved while being emptied; not descending or climbing through it")]
    Moved,
    /// Entries of a directory that could not be removed (so neither could it).
    #[error("{}", children_text(.0))]
    Children(Vec<(PathBuf, RemoveError)>),
}

fn children_text(children: &[(PathBuf, RemoveError)]) -> String {
    children
        .iter()
        .map(|(p, e)| format!("{}: {e}", rawpath::show(p)))
        .collect::<Vec<_>>()
        .join("; ")
}

fn sys(op: &'static str) -> impl FnOnce(Errno) -> RemoveError {
    move |errno| RemoveError::Sys { op, errno }
}

const DIR_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

/// Open the directory `parent/name` that `st` describes: refused unless
/// the inode opened is that one.
fn open_same_dir(
    parent: BorrowedFd<'_>,
    name: &OsStr,
    st: &FileStat,
) -> Result<OwnedFd, RemoveError> {
    let fd = openat(parent, name, DIR_FLAGS, Mode::empty()).map_err(sys("open"))?;
    let now = fstat(fd.as_fd()).map_err(sys("stat"))?;
    if now.st_dev != st.st_dev || now.st_ino != st.st_ino {
        return Err(RemoveError::Moved);
    }
    // A bind mount of the same file system has the same `st_dev`: only
    // the mount id tells it (a host directory bound inside, emptied
    // through it, would be the host's files deleted).
    if mount_id(parent).map_err(sys("statx"))? != mount_id(fd.as_fd()).map_err(sys("statx"))? {
        return Err(RemoveError::MountPoint);
    }
    Ok(fd)
}

/// The id of the mount `fd` is on (`STATX_MNT_ID`, Linux 5.8).
fn mount_id(fd: BorrowedFd<'_>) -> Result<u64, Errno> {
    use std::os::fd::AsRawFd;
    // SAFETY: an all-zero statx is a valid value for the kernel to fill.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: the path is a NUL-terminated empty string (AT_EMPTY_PATH:
    // `fd` itself), `stx` is valid for writing.
    let rc = unsafe {
        libc::statx(
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_MNT_ID,
            &raw mut stx,
        )
    };
    if rc != 0 {
        return Err(Errno::last());
    }
    if stx.stx_mask & libc::STATX_MNT_ID == 0 {
        return Err(Errno::ENOSYS);
    }
    Ok(stx.stx_mnt_id)
}

/// A directory being emptied: its name in its parent, its inode (how its
/// child recognises it again through `..`), the names still to remove
/// (last first) and whether one of them could not be removed.
struct Frame {
    name: OsString,
    ino: u64,
    left: Vec<OsString>,
    failed: bool,
}

impl Frame {
    fn new(name: &OsStr, ino: u64, mut names: Vec<OsString>) -> Frame {
        names.reverse();
        Frame {
            name: name.to_os_string(),
            ino,
            left: names,
            failed: false,
        }
    }
}

/// The path of `name` inside the innermost directory of `stack`, whose
/// first directory is `top`.
fn path_in(top: &Path, stack: &[Frame], name: &OsStr) -> PathBuf {
    let mut p = top.to_path_buf();
    for f in stack.iter().skip(1) {
        p.push(&f.name);
    }
    p.push(name);
    p
}

/// Remove `parent/name` on `parent`'s file system only, however deep it
/// is: iteratively, never following a symlink, each directory opened
/// through its parent's descriptor and checked to be the inode stat'ed,
/// each climb back through `..` checked to reach the directory it came
/// from; at most two descriptors open at a time. An entry that cannot be
/// removed is reported and its directories are left; the rest goes.
fn remove_at(parent: &OwnedFd, dev: u64, name: &OsStr, path: &Path) -> Result<(), RemoveError> {
    let st = match fstatat(parent.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::ENOENT) => return Err(RemoveError::Vanished),
        Err(e) => return Err(sys("stat")(e)),
    };
    if !is_dir_mode(st.st_mode) {
        return unlinkat(parent.as_fd(), name, UnlinkatFlags::NoRemoveDir).map_err(sys("unlink"));
    }
    if st.st_dev != dev {
        return Err(RemoveError::MountPoint);
    }
    let mut cur = open_same_dir(parent.as_fd(), name, &st)?;
    let names = names_at(cur.as_fd()).map_err(sys("read directory"))?;
    let mut stack = vec![Frame::new(name, st.st_ino, names)];
    let mut errs: Vec<(PathBuf, RemoveError)> = Vec::new();
    while let Some(frame) = stack.last_mut() {
        if let Some(n) = frame.left.pop() {
            let failed = match fstatat(cur.as_fd(), n.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
                Err(Errno::ENOENT) => Some(RemoveError::Vanished),
                Err(e) => Some(sys("stat")(e)),
                Ok(cst) if !is_dir_mode(cst.st_mode) => {
                    unlinkat(cur.as_fd(), n.as_os_str(), UnlinkatFlags::NoRemoveDir)
                        .map_err(sys("unlink"))
                        .err()
                }
                Ok(cst) if cst.st_dev != dev => Some(RemoveError::MountPoint),
                Ok(cst) => match open_same_dir(cur.as_fd(), &n, &cst).and_then(|child| {
                    let names = names_at(child.as_fd()).map_err(sys("read directory"))?;
                    Ok((child, names))
                }) {
                    Ok((child, names)) => {
                        cur = child;
                        stack.push(Frame::new(&n, cst.st_ino, names));
                        None
                    }
                    Err(e) => Some(e),
                },
            };
            if let Some(e) = failed {
                errs.push((path_in(path, &stack, &n), e));
                if let Some(f) = stack.last_mut() {
                    f.failed = true;
                }
            }
            continue;
        }
        // The innermost directory is empty (or keeps what failed): back to
        // its parent, then remove it there.
        let Some(done) = stack.pop() else {
            break;
        };
        let Some(up) = stack.last_mut() else {
            // The top: its parent is the caller's.
            if done.failed {
                return Err(RemoveError::Children(errs));
            }
            return unlinkat(
                parent.as_fd(),
                done.name.as_os_str(),
                UnlinkatFlags::RemoveDir,
            )
            .map_err(sys("rmdir"));
        };
        let parent_fd = openat(cur.as_fd(), "..", DIR_FLAGS, Mode::empty())
            .map_err(sys("open .."))
            .and_then(|fd| {
                let pst = fstat(fd.as_fd()).map_err(sys("stat .."))?;
                if pst.st_dev == dev && pst.st_ino == up.ino {
                    Ok(fd)
                } else {
                    Err(RemoveError::Moved)
                }
            });
        let parent_fd = match parent_fd {
            Ok(fd) => fd,
            Err(e) => {
                // No safe way back up: report it, leave the rest.
                errs.push((path_in(path, &stack, &done.name), e));
                return Err(RemoveError::Children(errs));
            }
        };
        cur = parent_fd;
        if done.failed {
            up.failed = true;
        } else if let Err(e) =
            unlinkat(cur.as_fd(), done.name.as_os_str(), UnlinkatFlags::RemoveDir)
        {
            up.failed = true;
            errs.push((path_in(path, &stack, &done.name), sys("rmdir")(e)));
        }
    }
    Err(RemoveError::Children(errs))
}

/// Does `dir/name` still exist (not following symlinks)? Anything but a
/// clean ENOENT counts as existing.
pub fn exists_at(dir: &Dir, name: &OsStr) -> bool {
    !matches!(
        fstatat(dir.fd.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW),
        Err(Errno::ENOENT)
    )
}

/// Delete `names` under `dir` (in order), then re-stat each: an entry that
/// is still there is `failed`, whatever the deletion reported.
/// `skip` names entries to leave in place (a test switch to prove the
/// verify pass; see `VMWARDEN_TEST_SKIP_DELETE`).
pub fn delete_entries(dir: &Dir, names: &[OsString], skip: Option<&OsStr>) -> Outcome {
    let mut out = Outcome::default();
    let dev = match dir.stat() {
        Ok(st) => st.st_dev,
        Err(e) => {
            out.failed.push(Failed {
                path: dir.path.clone(),
                reason: e.to_string(),
            });
            return out;
        }
    };
    let mut reported = Vec::new();
    for n in names {
        let path = dir.path.join(n);
        if skip == Some(n.as_os_str()) {
            // Pretend success: the verify pass below must catch it.
            tracing::warn!(
                path = %path.display(),
                "VMWARDEN_TEST_SKIP_DELETE (fault-injection build): not deleting this entry and reporting it deleted, so the verify pass must fail it"
            );
            reported.push((n.clone(), path));
            continue;
        }
        match remove_at(&dir.fd, dev, n, &path) {
            Ok(()) => reported.push((n.clone(), path)),
            Err(e) => out.failed.push(Failed {
                path,
                reason: e.to_string(),
            }),
        }
    }
    for (n, path) in reported {
        if exists_at(dir, &n) {
            out.failed.push(Failed {
                path,
                reason: "deletion reported success but the path still exists".into(),
            });
        } else {
            out.deleted.push(path);
        }
    }
    out
}

/// `Some(entry)` from `VMWARDEN_TEST_SKIP_DELETE` in builds with the
/// `fault-injection` feature; always `None` otherwise.
pub fn test_skip_delete() -> Option<OsString> {
    #[cfg(feature = "fault-injection")]
    {
        std::env::var_os("VMWARDEN_TEST_SKIP_DELETE")
    }
    #[cfg(not(feature = "fault-injection"))]
    {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::dirs::open_dir;

    fn s(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn deletion_set_is_everything_minus_keep() {
        let names = s(&[
            "control",
            "credentials",
            "future-subsystem",
            "instance.json",
            "instance.lock",
        ]);
        assert_eq!(
            deletion_set(&names, RUNTIME_KEEP, Some(DELETE_LAST)),
            s(&[
                "control",
                "credentials",
                "future-subsystem",
                "instance.json"
            ])
        );
    }

    #[test]
    fn unknown_entries_are_in_the_deletion_set() {
        let names = s(&["zzz-planted", "instance.lock"]);
        assert_eq!(
            deletion_set(&names, RUNTIME_KEEP, None),
            s(&["zzz-planted"])
        );
    }

    fn tmp_dir() -> (tempfile::TempDir, Dir) {
        let t = tempfile::tempdir().unwrap();
        let d = open_dir(t.path()).unwrap();
        (t, d)
    }

    #[test]
    fn names_that_are_not_utf8_are_deleted_by_their_bytes() {
        use std::os::unix::ffi::OsStringExt;
        let (t, d) = tmp_dir();
        let ff = OsString::from_vec(b"\xff".to_vec());
        let fe = OsString::from_vec(b"sub\xfe".to_vec());
        std::fs::write(t.path().join(&ff), b"x").unwrap();
        std::fs::create_dir(t.path().join(&fe)).unwrap();
        std::fs::write(t.path().join(&fe).join(&ff), b"y").unwrap();
        let names = entries(&d).unwrap();
        assert_eq!(names, vec![fe.clone(), ff.clone()]);
        let out = delete_entries(&d, &names, None);
        assert!(out.failed.is_empty(), "{out:?}");
        assert_eq!(out.deleted.len(), 2);
        assert!(entries(&d).unwrap().is_empty());
    }

    #[test]
    fn an_entry_that_vanished_after_enumeration_is_a_failure() {
        let (_t, d) = tmp_dir();
        let out = delete_entries(&d, &[OsString::from("never-there")], None);
        assert!(out.deleted.is_empty());
        assert_eq!(out.failed.len(), 1);
        assert!(out.failed[0].reason.contains("vanished"), "{out:?}");
    }

    #[test]
    fn empty_keep_deletes_all() {
        let names = s(&["a", "b"]);
        assert_eq!(deletion_set(&names, &[], None), names);
    }
}
