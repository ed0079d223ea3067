//! What is in the microvm.nix state dir: each walk `openat`-style from the
//! directory's descriptor with `O_NOFOLLOW`, each entry checked (no
//! symlink followed, no hard-linked file, no device node, no other file
//! system), and who still holds an item open.

use std::ffi::{OsStr, OsString};
use std::os::fd::AsFd;
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{openat, AtFlags, OFlag};
use nix::sys::stat::{fstatat, FileStat, Mode, SFlag};

use crate::host::dirs::Dir;
use crate::host::ownership;
use crate::host::sys::SysContext;

use super::{sys_err, AdoptError, How, Item, Kind, Place, Planned, Result};

pub(super) const NOFOLLOW: OFlag = OFlag::O_NOFOLLOW.union(OFlag::O_CLOEXEC);
pub(super) const DIR_FLAGS: OFlag = OFlag::O_RDONLY.union(OFlag::O_DIRECTORY).union(NOFOLLOW);

/// A file's size in bytes (never negative).
pub(super) fn size_of(st: &FileStat) -> u64 {
    u64::try_from(st.st_size).unwrap_or(0)
}

/// The bytes a file's blocks take (less than its size when sparse).
pub(super) fn allocated_of(st: &FileStat) -> u64 {
    u64::try_from(st.st_blocks).unwrap_or(0) * 512
}

pub(super) fn kind_of(st: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits())
}

pub(super) fn describe(st: &FileStat) -> &'static str {
    match kind_of(st) {
        SFlag::S_IFREG => "regular file",
        SFlag::S_IFDIR => "directory",
        SFlag::S_IFLNK => "symlink",
        SFlag::S_IFSOCK => "socket",
        SFlag::S_IFIFO => "fifo",
        SFlag::S_IFBLK => "block device",
        SFlag::S_IFCHR => "character device",
        _ => "file of unknown type",
    }
}

/// Open the directory `rel`'s parent below `base` without following a
/// symlink; `Ok(None)` when a component is missing.
pub(super) fn open_parent(base: &Dir, rel: &Path) -> Result<Option<(Dir, OsString)>> {
    let mut comps: Vec<&OsStr> = Vec::new();
    for c in rel.components() {
        match c {
            Component::Normal(n) => comps.push(n),
            _ => {
                return Err(AdoptError::Refused {
                    name: String::new(),
                    path: base.path.join(rel),
                    why: "not a plain relative path".into(),
                })
            }
        }
    }
    let Some((last, parents)) = comps.split_last() else {
        return Ok(None);
    };
    let mut cur = Dir {
        fd: nix::unistd::dup(base.fd.as_fd()).sys("dup", &base.path)?,
        path: base.path.clone(),
    };
    for c in parents {
        let path = cur.path.join(c);
        match openat(cur.fd.as_fd(), *c, DIR_FLAGS, Mode::empty()) {
            Ok(fd) => cur = Dir { fd, path },
            Err(Errno::ENOENT) => return Ok(None),
            Err(Errno::ELOOP | Errno::ENOTDIR) => {
                return Err(AdoptError::Refused {
                    name: String::new(),
                    path,
                    why: "is a symlink or not a directory; adopt never follows symlinks".into(),
                })
            }
            Err(e) => return Err(sys_err(e, "openat", path)),
        }
    }
    Ok(Some((cur, last.to_os_string())))
}

pub(super) fn lstat_at(dir: &Dir, name: &OsStr) -> Result<Option<FileStat>> {
    match fstatat(dir.fd.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(st)),
        Err(Errno::ENOENT) => Ok(None),
        Err(e) => Err(sys_err(e, "fstatat", dir.path.join(name))),
    }
}

/// Walk a share source (opened, O_NOFOLLOW) and call `f` on every entry
/// below it with its parent and stat, depth first; refuses devices, other
/// file systems, regular files with more than one link, and nesting deeper
/// than [`ownership::MAX_DEPTH`] (the walk and the copy recurse).
pub(super) fn walk_share(
    dir: &Dir,
    dev: u64,
    f: &mut dyn FnMut(&Dir, &OsStr, &FileStat) -> Result<()>,
) -> Result<()> {
    walk_share_at(dir, dev, f, 1)
}

fn walk_share_at(
    dir: &Dir,
    dev: u64,
    f: &mut dyn FnMut(&Dir, &OsStr, &FileStat) -> Result<()>,
    depth: usize,
) -> Result<()> {
    let names = ownership::entries(dir).sys("readdir", &dir.path)?;
    for n in names {
        let path = dir.path.join(&n);
        let Some(st) = lstat_at(dir, &n)? else {
            continue;
        };
        check_entry(&path, &st, dev)?;
        if kind_of(&st) == SFlag::S_IFDIR {
            if depth >= ownership::MAX_DEPTH {
                return Err(too_deep(&path));
            }
            let fd = openat(dir.fd.as_fd(), n.as_os_str(), DIR_FLAGS, Mode::empty())
                .sys("openat", &path)?;
            walk_share_at(&Dir { fd, path }, dev, f, depth + 1)?;
        }
        f(dir, &n, &st)?;
    }
    Ok(())
}

/// A share source nested deeper than adopt descends.
pub(super) fn too_deep(path: &Path) -> AdoptError {
    AdoptError::Refused {
        name: String::new(),
        path: path.to_path_buf(),
        why: format!(
            "is nested deeper than {} directories below its share source; adopt does not descend that far: move the share yourself",
            ownership::MAX_DEPTH
        ),
    }
}

/// Whether `st` is root's alone: owned by root, with no permission for
/// group or others (an ACL's entries are bounded by the group bits, its
/// mask). Only such an inode can be given to the principal as it is: any
/// other owner, group or user may hold it open (`adopt.rs`, "new inodes").
/// A symlink's mode means nothing (it cannot be opened for its data).
pub(super) fn root_only(st: &FileStat) -> bool {
    st.st_uid == 0 && (kind_of(st) == SFlag::S_IFLNK || st.st_mode & 0o077 == 0)
}

/// What may be re-owned inside a share source.
pub(super) fn check_entry(path: &Path, st: &FileStat, dev: u64) -> Result<()> {
    let refuse = |why: String| AdoptError::Refused {
        name: String::new(),
        path: path.to_path_buf(),
        why,
    };
    if st.st_dev != dev {
        return Err(refuse(
            "is on another file system (a mount inside the share source); adopt moves, never copies, and does not cross file systems".into(),
        ));
    }
    match kind_of(st) {
        SFlag::S_IFBLK | SFlag::S_IFCHR => Err(refuse(format!(
            "is a {}; the VM's principal would own a device node",
            describe(st)
        ))),
        SFlag::S_IFREG if st.st_nlink > 1 => Err(refuse(format!(
            "is a regular file with {} links; re-owning it would re-own the other names' inode too (break the link with cp, then retry)",
            st.st_nlink
        ))),
        _ => Ok(()),
    }
}

/// Check one item at DIR (`src_parent`/`name`) and describe where it is,
/// and how it is adopted: moved when every inode in it is root's alone,
/// else copied to new inodes ([`root_only`]).
pub(super) fn inspect_source(
    parent: &Dir,
    name: &OsStr,
    item: &Item,
    dev: u64,
) -> Result<Option<(Place, How)>> {
    let path = parent.path.join(name);
    let Some(st) = lstat_at(parent, name)? else {
        return Ok(None);
    };
    let refuse = |why: String| AdoptError::Refused {
        name: String::new(),
        path: path.clone(),
        why,
    };
    if st.st_dev != dev {
        return Err(refuse("is on another file system than the state root; adopt moves, never copies: move it to the same file system first".into()));
    }
    match (item.kind, kind_of(&st)) {
        (_, SFlag::S_IFLNK) => Err(refuse(format!(
            "is a symlink ({} names it); adopt never follows symlinks: put the file itself there",
            item.field
        ))),
        (Kind::Image, SFlag::S_IFREG) => {
            check_entry(&path, &st, dev)?;
            Ok(Some((
                Place::From {
                    bytes: size_of(&st),
                    allocated: allocated_of(&st),
                    entries: 0,
                    owner: (st.st_uid, st.st_gid),
                },
                How::of(root_only(&st)),
            )))
        }
        (Kind::Share, SFlag::S_IFDIR) => {
            let fd =
                openat(parent.fd.as_fd(), name, DIR_FLAGS, Mode::empty()).sys("openat", &path)?;
            let (mut entries, mut bytes, mut allocated) = (0u64, 0u64, 0u64);
            let mut private = root_only(&st);
            walk_share(
                &Dir {
                    fd,
                    path: path.clone(),
                },
                dev,
                &mut |_, _, st| {
                    entries += 1;
                    bytes += size_of(st);
                    allocated += allocated_of(st);
                    private &= root_only(st);
                    Ok(())
                },
            )?;
            Ok(Some((
                Place::From {
                    bytes,
                    allocated,
                    entries,
                    owner: (st.st_uid, st.st_gid),
                },
                How::of(private),
            )))
        }
        (Kind::Image, _) => Err(refuse(format!(
            "is a {}, but {} is a disk image (a regular file)",
            describe(&st),
            item.field
        ))),
        (Kind::Share, _) => Err(refuse(format!(
            "is a {}, but {} is a share source (a directory)",
            describe(&st),
            item.field
        ))),
    }
}

/// Processes that hold DIR or anything in it open, or run in it (cwd,
/// root): `/proc/*/{cwd,root,fd/*}` compared by device and inode.
pub(super) fn holders(dir_dev: u64, inodes: &[(u64, u64)]) -> Option<(u32, String)> {
    let me = std::process::id();
    let proc_dir = std::fs::read_dir("/proc").ok()?;
    for e in proc_dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let hit = |p: &Path| {
            // stat(2) on a /proc magic link reaches the open file itself.
            std::fs::metadata(p).ok().is_some_and(|m| {
                use std::os::unix::fs::MetadataExt;
                m.dev() == dir_dev && inodes.contains(&(m.dev(), m.ino()))
            })
        };
        let base = PathBuf::from(format!("/proc/{pid}"));
        for link in ["cwd", "root"] {
            if hit(&base.join(link)) {
                return Some((pid, format!("its {link} is in it")));
            }
        }
        if let Ok(fds) = std::fs::read_dir(base.join("fd")) {
            for fd in fds.flatten() {
                if hit(&fd.path()) {
                    return Some((pid, format!("fd {}", fd.file_name().to_string_lossy())));
                }
            }
        }
    }
    None
}

/// Every inode of DIR's items and DIR itself (what a running microvm.nix
/// VM would hold: its images, its share sources, its working directory).
pub(super) fn inodes_of(from: &Dir, planned: &[Planned]) -> Result<Vec<(u64, u64)>> {
    let st = from.stat()?;
    let mut out = vec![(st.st_dev, st.st_ino)];
    for p in planned {
        if !matches!(p.place, Place::From { .. } | Place::Copied) {
            continue;
        }
        let Some((parent, name)) = open_parent(from, &p.item.rel)? else {
            continue;
        };
        if let Some(st) = lstat_at(&parent, &name)? {
            out.push((st.st_dev, st.st_ino));
            if kind_of(&st) == SFlag::S_IFDIR {
                let fd = openat(
                    parent.fd.as_fd(),
                    name.as_os_str(),
                    DIR_FLAGS,
                    Mode::empty(),
                )
                .sys("openat", parent.path.join(&name))?;
                let dir = Dir {
                    fd,
                    path: parent.path.join(&name),
                };
                walk_share(&dir, st.st_dev, &mut |_, _, s| {
                    out.push((s.st_dev, s.st_ino));
                    Ok(())
                })?;
            }
        }
    }
    Ok(out)
}
