//! The share sources vmwarden made for a VM (a writable share whose source
//! was missing at launch, `launch::share_sources`), kept beyond the
//! instance: `STATE_ROOT/.made-sources-NAME.json` (root, 0600, written
//! durably). In the state root, not the VM's state dir, which the
//! principal may write: nobody but root can make vmwarden believe it made
//! a directory. Each entry names the directory by path and identity
//! (`st_dev`, `st_ino`, and its birth time), so `purge` deletes only the very directory the
//! launcher made, and says "kept: not made by vmwarden" of any other.
//!
//! The parent of such a source is root's, writable by root only, and
//! reached from `/` without a symlink ([`open_parent`]): the launcher
//! makes nothing anywhere else, and cleanup and purge reach it the same way.

use std::ffi::OsString;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::AtFlags;
use nix::sys::stat::{fstatat, FileStat};
use serde::{Deserialize, Serialize};

use crate::config::files::{Distrust, Kind};
use crate::config::names::VmName;
use crate::host::dirs::{self, Dir, DirError};
use crate::host::sys::SysError;
use crate::host::trust::{self, Policy};

/// The most bytes a record may have.
pub const MAX_RECORD_BYTES: u64 = 64 * 1024;

/// The record's name in the state root (a dot name is no VM's: status and
/// the registry read VM names only).
pub fn record_name(name: &VmName) -> String {
    format!(".made-sources-{name}.json")
}

/// Why a made source's parent or record cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum MadeError {
    /// The parent is not root's alone, is reached through a symlink, or
    /// does not exist.
    #[error("{source_path}: vmwarden makes a missing share source only in a directory that is root's, writable by root alone and reached without a symlink: {why}")]
    Parent {
        source_path: PathBuf,
        #[source]
        why: Distrust,
    },
    /// The source path has no parent or no name (`/`).
    #[error("{0}: has no parent directory to make it in")]
    NoParent(PathBuf),
    #[error(transparent)]
    Dir(#[from] DirError),
    #[error("{path}: cannot be parsed: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: cannot be encoded: {source}")]
    Encode {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// The parent walked and the parent opened are not one directory.
    #[error("{0}: changed while it was opened")]
    Moved(PathBuf),
}

impl MadeError {
    /// A refusal of the configuration or the host (`EX_CONFIG`).
    pub fn is_refusal(&self) -> bool {
        match self {
            MadeError::Parent { why, .. } => !matches!(
                why,
                Distrust::Sys {
                    errno: Errno::EIO | Errno::ENOMEM,
                    ..
                }
            ),
            MadeError::NoParent(_) | MadeError::Parse { .. } => true,
            MadeError::Dir(e) => e.is_refusal(),
            MadeError::Encode { .. } | MadeError::Moved(_) => false,
        }
    }
}

/// One directory vmwarden made: where, which inode, for whom, when.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct MadeSource {
    pub path: PathBuf,
    pub dev: u64,
    pub ino: u64,
    /// The principal it was made for (its owner, mode 0700).
    pub uid: u32,
    pub made_unix: u64,
    /// Its birth time (`statx` `STATX_BTIME`: seconds, nanoseconds), where
    /// the file system keeps one: an inode number is reused (ext4 gives a
    /// removed directory's back to the next one), a birth time is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub btime: Option<(i64, u32)>,
}

impl MadeSource {
    /// `st`, born at `btime`, is this very directory: the same device and
    /// inode, and the same birth time when both are known.
    pub fn is(&self, st: &FileStat, btime: Option<(i64, u32)>) -> bool {
        st.st_dev == self.dev
            && st.st_ino == self.ino
            && !matches!((self.btime, btime), (Some(a), Some(b)) if a != b)
    }
}

/// The birth time of `fd`, or of `name` in it (not followed), when its
/// file system keeps one.
pub fn btime(fd: std::os::fd::BorrowedFd<'_>, name: &std::ffi::OsStr) -> Option<(i64, u32)> {
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(name.as_bytes()).ok()?;
    // SAFETY: an all-zero statx is a valid value for the kernel to fill.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is NUL-terminated, `stx` is valid for writing.
    let rc = unsafe {
        libc::statx(
            fd.as_raw_fd(),
            c.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW | libc::AT_EMPTY_PATH,
            libc::STATX_BTIME,
            &raw mut stx,
        )
    };
    (rc == 0 && stx.stx_mask & libc::STATX_BTIME != 0)
        .then_some((stx.stx_btime.tv_sec, stx.stx_btime.tv_nsec))
}

/// Every share source vmwarden made for one VM and has not deleted.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct MadeSources {
    pub vm: String,
    pub sources: Vec<MadeSource>,
}

impl MadeSources {
    /// The record of `name` in `state_root`; empty when there is none.
    pub fn read(state_root: &Dir, name: &VmName) -> Result<MadeSources, MadeError> {
        let file = record_name(name);
        match dirs::read_small(state_root, &file, MAX_RECORD_BYTES)? {
            None => Ok(MadeSources {
                vm: name.to_string(),
                sources: Vec::new(),
            }),
            Some(b) => serde_json::from_slice(&b).map_err(|source| MadeError::Parse {
                path: state_root.path.join(&file),
                source,
            }),
        }
    }

    /// [`MadeSources::read`] by the state root's path; empty when the
    /// state root does not exist.
    pub fn read_at(state_root: &Path, name: &VmName) -> Result<MadeSources, MadeError> {
        match dirs::open_dir_if_exists(state_root)? {
            Some(d) => MadeSources::read(&d, name),
            None => Ok(MadeSources {
                vm: name.to_string(),
                sources: Vec::new(),
            }),
        }
    }

    /// Write it durably (root 0600); with no source left, remove it.
    pub fn write(&self, state_root: &Dir, name: &VmName) -> Result<(), MadeError> {
        let file = record_name(name);
        if self.sources.is_empty() {
            return match nix::unistd::unlinkat(
                state_root.fd.as_fd(),
                file.as_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            ) {
                Ok(()) | Err(Errno::ENOENT) => Ok(()),
                Err(errno) => Err(DirError::Sys(SysError {
                    op: "unlink",
                    path: state_root.path.join(&file),
                    errno,
                })
                .into()),
            };
        }
        let mut bytes = serde_json::to_vec_pretty(self).map_err(|source| MadeError::Encode {
            path: state_root.path.join(&file),
            source,
        })?;
        bytes.push(b'\n');
        Ok(dirs::durable_write(state_root, &file, &bytes, 0o600)?)
    }

    /// The entry for `path`, if vmwarden made it.
    pub fn find(&self, path: &Path) -> Option<&MadeSource> {
        self.sources.iter().find(|s| s.path == path)
    }

    /// Record `made`, replacing an older entry of the same path.
    pub fn put(&mut self, made: MadeSource) {
        self.sources.retain(|s| s.path != made.path);
        self.sources.push(made);
    }
}

/// The parent directory of `source`, opened, and the source's name in it:
/// walked from `/` one component at a time without following a symlink,
/// every directory on the way root's and writable by root only (its ACL
/// too: `host::trust`'s [`Policy::Secret`]), then opened as a directory
/// and checked to be the inode walked.
pub fn open_parent(source: &Path) -> Result<(Dir, OsString), MadeError> {
    let (Some(parent), Some(name)) = (source.parent(), source.file_name()) else {
        return Err(MadeError::NoParent(source.to_path_buf()));
    };
    let parent_err = |why| MadeError::Parent {
        source_path: source.to_path_buf(),
        why,
    };
    let walked = if parent == Path::new("/") {
        None
    } else {
        let w = trust::walk(parent, Policy::Secret).map_err(parent_err)?;
        if Kind::of(w.stat.st_mode) != Kind::Directory {
            return Err(parent_err(Distrust::WrongKind {
                path: parent.to_path_buf(),
                kind: Kind::of(w.stat.st_mode),
                want: "a directory",
            }));
        }
        Some(w.stat)
    };
    let dir = dirs::open_dir(parent)?;
    let st = dir.stat()?;
    if walked.is_some_and(|w| w.st_dev != st.st_dev || w.st_ino != st.st_ino) {
        return Err(MadeError::Moved(parent.to_path_buf()));
    }
    if walked.is_none() && (st.st_uid != 0 || st.st_mode & 0o022 != 0) {
        return Err(parent_err(Distrust::Writable {
            path: parent.to_path_buf(),
            mode: st.st_mode & 0o7777,
            who: "someone but root",
        }));
    }
    Ok((dir, name.to_os_string()))
}

/// `dir/name`, not followed: `None` when it does not exist.
pub fn stat_at(dir: &Dir, name: &OsString) -> nix::Result<Option<FileStat>> {
    match fstatat(
        dir.fd.as_fd(),
        name.as_os_str(),
        AtFlags::AT_SYMLINK_NOFOLLOW,
    ) {
        Ok(st) => Ok(Some(st)),
        Err(Errno::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_newer_entry_of_a_path_replaces_the_older() {
        let mut m = MadeSources::default();
        let e = |ino| MadeSource {
            path: "/srv/vm/data".into(),
            dev: 1,
            ino,
            uid: 5,
            made_unix: 0,
            btime: None,
        };
        m.put(e(10));
        m.put(e(11));
        assert_eq!(m.sources, vec![e(11)]);
        assert_eq!(m.find(Path::new("/srv/vm/data")).map(|s| s.ino), Some(11));
    }
}
