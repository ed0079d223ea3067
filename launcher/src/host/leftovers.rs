//! What a uid can leave behind outside any directory vmwarden owns: kernel
//! keys (the per-uid keyrings outlive every process of the uid) and IPC
//! objects in this IPC namespace (SysV shared memory, semaphores, message
//! queues; POSIX message queues and shared memory files). The launcher's
//! seccomp filter and private IPC namespace keep a VM from making any of
//! these on the host; `verify-clean` proves it with these readers, and the
//! principal registry counts them as residue of a retired uid.
//!
//! And what a VM can leave in its own state dir that is a danger to the
//! host: a set-user-ID or set-group-ID program (see [`setid_files`]).

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::{openat, AtFlags, OFlag, AT_FDCWD};
use nix::sys::stat::{fstat, fstatat, Mode, SFlag};

use crate::config::rawpath;
use crate::host::procs::read_proc_file;

/// The keys `uid` owns, from `/proc/key-users` (readable by anyone; reading
/// it creates nothing). `None` when the uid has no key at all.
pub fn keys_of_uid(uid: u32) -> Option<u32> {
    parse_key_users(&read_text("/proc/key-users")?, uid)
}

/// A /proc seq file as text, read with one buffer that usually takes it in
/// one call (`std::fs::read_to_string` probes from 32 bytes up on a file
/// that reports size 0).
fn read_text(path: &str) -> Option<String> {
    String::from_utf8(read_proc_file(path).ok()?).ok()
}

fn parse_key_users(text: &str, uid: u32) -> Option<u32> {
    text.lines().find_map(|l| {
        let (u, rest) = l.trim().split_once(':')?;
        if u.trim().parse::<u32>().ok()? != uid {
            return None;
        }
        // "<usage> <nkeys>/<nikeys> <qnkeys>/<maxkeys> <qnbytes>/<maxbytes>"
        rest.split_whitespace()
            .nth(1)?
            .split('/')
            .next()?
            .parse()
            .ok()
    })
}

/// A uid's own two keyrings (user and user-session), which the kernel
/// creates for it on first use and never deletes. Any key beyond them is
/// data someone put there: adding a key to either creates both keyrings
/// first, so a stash always shows as more than two.
pub const USER_KEYRINGS: u32 = 2;

/// Keys of `uid` beyond its own (empty) user keyrings, if any.
pub fn stashed_keys(uid: u32) -> Option<u32> {
    keys_of_uid(uid).filter(|n| *n > USER_KEYRINGS)
}

/// SysV IPC objects in the caller's IPC namespace owned or created by
/// `uid`, one line each ("shm 32768 key=0x…").
pub fn sysv_objects_of_uid(uid: u32) -> Vec<String> {
    let mut out = Vec::new();
    for kind in ["shm", "sem", "msg"] {
        if let Some(text) = read_text(&format!("/proc/sysvipc/{kind}")) {
            out.extend(parse_sysvipc(kind, &text, uid));
        }
    }
    out
}

fn parse_sysvipc(kind: &str, text: &str, uid: u32) -> Vec<String> {
    let mut lines = text.lines();
    let Some(header) = lines.next() else {
        return Vec::new();
    };
    let header: Vec<&str> = header.split_whitespace().collect();
    let col = |name: &str| header.iter().position(|h| *h == name);
    let (Some(u), Some(cu), Some(key), Some(id)) = (
        col("uid"),
        col("cuid"),
        col("key"),
        col(if kind == "sem" {
            "semid"
        } else if kind == "msg" {
            "msqid"
        } else {
            "shmid"
        }),
    ) else {
        return Vec::new();
    };
    lines
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let is = |i: usize| f.get(i).and_then(|x| x.parse::<u32>().ok()) == Some(uid);
            (is(u) || is(cu)).then(|| {
                format!(
                    "{kind} id={} key={}",
                    f.get(id).unwrap_or(&"?"),
                    f.get(key).unwrap_or(&"?")
                )
            })
        })
        .collect()
}

/// Files owned by `uid` directly in the POSIX IPC file systems
/// (`/dev/mqueue`, `/dev/shm`).
pub fn posix_ipc_of_uid(uid: u32) -> Vec<String> {
    let mut out = Vec::new();
    for dir in ["/dev/mqueue", "/dev/shm"] {
        let Ok(rd) = std::fs::read_dir(dir) else {
            continue;
        };
        for e in rd.flatten() {
            if e.metadata().map(|m| m.uid() == uid).unwrap_or(false) {
                out.push(rawpath::show(&e.path()));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_users_lines() {
        let t = "    0:     9 8/8 3/1000000 40/25000000\n62990:     3 3/3 3/200 51/20000\n";
        assert_eq!(parse_key_users(t, 62990), Some(3));
        assert_eq!(parse_key_users(t, 0), Some(8));
        assert_eq!(parse_key_users(t, 5), None);
    }

    #[test]
    fn sysvipc_lines() {
        let t = "       key      shmid perms                  size  cpid  lpid nattch   uid   gid  cuid  cgid      atime      dtime      ctime                   rss                  swap\n\
                 -1001302231          0   644                  4096 16529     0      0 62001 62001 62001 62001          0          0 1764500000                     0                     0\n";
        let v = parse_sysvipc("shm", t, 62001);
        assert_eq!(v, vec!["shm id=0 key=-1001302231".to_string()]);
        assert!(parse_sysvipc("shm", t, 62002).is_empty());
    }
}

/// A set-id program found under a VM's state dir, or a place the scan
/// could not look.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetId {
    /// A regular file with `S_ISUID` or `S_ISGID` (`mode`: its 12 low bits).
    File { path: PathBuf, mode: u32, uid: u32 },
    /// A directory that could not be read, or one moved while it was read.
    Unreadable { path: PathBuf, why: String },
}

impl std::fmt::Display for SetId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SetId::File { path, mode, uid } => write!(
                f,
                "{} is set-{}-ID (mode {mode:04o}, owner uid {uid})",
                rawpath::show(path),
                if mode & 0o4000 != 0 { "user" } else { "group" }
            ),
            SetId::Unreadable { path, why } => {
                write!(
                    f,
                    "{}: cannot look for set-id files: {why}",
                    rawpath::show(path)
                )
            }
        }
    }
}

/// Every regular file under `dir` (a VM's state dir) whose mode has
/// `S_ISUID` or `S_ISGID`: anyone who can reach it would run it as its
/// owner (the VM's principal) outside every sandbox. The launcher's
/// seccomp filter refuses such modes; this finds what got there anyway (a
/// launch before that filter, or a file copied in from outside). Nothing
/// is followed: each entry is `fstatat`ed with `AT_SYMLINK_NOFOLLOW` and
/// each directory opened with `O_NOFOLLOW` under its parent's fd. A
/// missing `dir` has none. Directories with the set-group-ID bit (new
/// entries inherit the group) are not programs and are not reported.
pub fn setid_files(dir: &Path) -> Vec<SetId> {
    let mut out = Vec::new();
    let top = match openat(AT_FDCWD, dir, DIR_FLAGS, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => return out,
        Err(e) => {
            out.push(SetId::Unreadable {
                path: dir.to_path_buf(),
                why: format!("open: {e}"),
            });
            return out;
        }
    };
    scan(top, dir, &mut out);
    out
}

const DIR_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

/// The sorted names in the directory `fd` (`.` and `..` excluded).
fn names_in(fd: &OwnedFd) -> Result<Vec<OsString>, String> {
    let dup =
        openat(fd.as_fd(), ".", DIR_FLAGS, Mode::empty()).map_err(|e| format!("open: {e}"))?;
    let mut d = Dir::from_fd(dup).map_err(|e| format!("fdopendir: {e}"))?;
    let mut names: Vec<OsString> = Vec::new();
    for e in d.iter() {
        let e = e.map_err(|e| format!("readdir: {e}"))?;
        let name = e.file_name().to_bytes();
        if name != b"." && name != b".." {
            names.push(<OsString as std::os::unix::ffi::OsStringExt>::from_vec(
                name.to_vec(),
            ));
        }
    }
    names.sort();
    Ok(names)
}

/// A directory being scanned: its name in its parent, its inode (how its
/// child recognises it again through `..`), the names still to look at
/// (last first).
struct Frame {
    name: OsString,
    ino: u64,
    left: Vec<OsString>,
}

/// Depth first through `top` (the directory `path`), however deep, never
/// following a symlink: each directory opened under its parent's fd and
/// checked to be the inode stat'ed, each climb back through `..` checked to
/// reach the directory it came from (two descriptors open at a time). A
/// guest-made tree of any depth is scanned to its bottom.
fn scan(top: OwnedFd, path: &Path, out: &mut Vec<SetId>) {
    let unreadable = |out: &mut Vec<SetId>, path: PathBuf, why: String| {
        out.push(SetId::Unreadable { path, why });
    };
    let path_of = |stack: &[Frame], name: Option<&OsStr>| {
        let mut p = path.to_path_buf();
        for f in stack.iter().skip(1) {
            p.push(&f.name);
        }
        if let Some(n) = name {
            p.push(n);
        }
        p
    };
    let top_ino = match fstat(top.as_fd()) {
        Ok(st) => st.st_ino,
        Err(e) => return unreadable(out, path.to_path_buf(), format!("fstat: {e}")),
    };
    let names = match names_in(&top) {
        Ok(n) => n,
        Err(why) => return unreadable(out, path.to_path_buf(), why),
    };
    let mut cur = top;
    let mut stack = vec![Frame {
        name: OsString::new(),
        ino: top_ino,
        left: names.into_iter().rev().collect(),
    }];
    loop {
        let next = match stack.last_mut() {
            Some(f) => f.left.pop(),
            None => return,
        };
        let Some(name) = next else {
            // This directory is done: back to its parent through `..`.
            stack.pop();
            let Some(up) = stack.last() else {
                return;
            };
            let parent = openat(cur.as_fd(), "..", DIR_FLAGS, Mode::empty())
                .map_err(|e| format!("open ..: {e}"))
                .and_then(|fd| match fstat(fd.as_fd()) {
                    Ok(st) if st.st_ino == up.ino => Ok(fd),
                    Ok(_) => Err("moved while it was scanned; not climbing through it".into()),
                    Err(e) => Err(format!("fstat ..: {e}")),
                });
            match parent {
                Ok(fd) => cur = fd,
                Err(why) => return unreadable(out, path_of(&stack, None), why),
            }
            continue;
        };
        // The entry's type from the directory is a hint only: stat it.
        let st = match fstatat(cur.as_fd(), name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::ENOENT) => continue,
            Err(e) => {
                unreadable(out, path_of(&stack, Some(&name)), format!("fstatat: {e}"));
                continue;
            }
        };
        let kind = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits());
        if kind == SFlag::S_IFREG && st.st_mode & 0o6000 != 0 {
            out.push(SetId::File {
                path: path_of(&stack, Some(&name)),
                mode: st.st_mode & 0o7777,
                uid: st.st_uid,
            });
        } else if kind == SFlag::S_IFDIR {
            let child = match openat(cur.as_fd(), name.as_os_str(), DIR_FLAGS, Mode::empty()) {
                Ok(fd) => fd,
                Err(Errno::ENOENT) => continue,
                Err(e) => {
                    unreadable(out, path_of(&stack, Some(&name)), format!("open: {e}"));
                    continue;
                }
            };
            let same =
                fstat(child.as_fd()).is_ok_and(|c| c.st_ino == st.st_ino && c.st_dev == st.st_dev);
            let names = if same {
                names_in(&child)
            } else {
                Err("replaced between stat and open; not descending".into())
            };
            match names {
                Ok(names) => {
                    cur = child;
                    stack.push(Frame {
                        name,
                        ino: st.st_ino,
                        left: names.into_iter().rev().collect(),
                    });
                }
                Err(why) => unreadable(out, path_of(&stack, Some(&name)), why),
            }
        }
    }
}
