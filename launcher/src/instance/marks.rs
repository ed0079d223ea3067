//! vmwarden's marks on a runtime dir: what tells a directory a launch made
//! from one it did not, so that `reap` deletes only its own.
//!
//! A launch makes `RUNTIME/NAME` root's (mode 0755), then the lease file
//! `instance.lock`, then the intent record `instance.json`, both root's
//! regular files, and only then anything else; cleanup deletes the record
//! last and keeps the lease file. So at every point of a launch or a
//! teardown, killed or not, the directory is root's and not writable by
//! others, and it is empty, or holds the lease file (and the record's
//! temporary name while the record is written), or holds both the lease
//! file and the record. Beside the lease file it may also hold the last
//! cleanup's record (`instance::last_cleanup`) and the credential floor
//! (`instance::creds_floor`), each with its temporary name, which launch
//! and cleanup write under the lease and keep. A directory that is not so is not one vmwarden
//! left: reap keeps it and says why (ambiguity keeps).

use std::ffi::OsStr;
use std::os::fd::AsFd;

use nix::errno::Errno;
use nix::fcntl::AtFlags;
use nix::sys::stat::{fstatat, FileStat, SFlag};

use crate::config::paths::{CREDS_FLOOR_FILE, INTENT_FILE, LAST_CLEANUP_FILE, LEASE_FILE};
use crate::host::dirs::{self, Dir, DirError};
use crate::host::ownership;
use crate::instance::{creds_floor, last_cleanup};

/// The temporary name the intent record is written under before its
/// rename (`dirs::durable_write`).
const INTENT_TEMP: &str = ".instance.json.tmp";

/// Why an entry of the runtime root does not carry vmwarden's marks.
#[derive(Debug, thiserror::Error)]
pub enum Unmarked {
    #[error("cannot be opened as a directory: {0}")]
    Open(#[source] DirError),
    #[error("is owned by uid {0}, not root")]
    Owner(u32),
    #[error("has mode {0:04o}: others may write in it")]
    Writable(u32),
    #[error("cannot be read: {0}")]
    Unreadable(Errno),
    #[error("its {name} is {what}, not a regular file of root's")]
    Entry { name: &'static str, what: String },
    #[error("holds files but no lease file {LEASE_FILE}")]
    NoLease,
    #[error("holds files besides its lease file but no intent record {INTENT_FILE} (a launch writes the record before anything else)")]
    NoIntent,
}

fn is(st: &FileStat, kind: SFlag) -> bool {
    SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) == kind
}

/// `dir/name` is a regular file of root's; `Ok(false)` when it is absent.
fn roots_file(dir: &Dir, name: &'static str) -> Result<bool, Unmarked> {
    match fstatat(dir.fd.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) if is(&st, SFlag::S_IFREG) && st.st_uid == 0 => Ok(true),
        Ok(st) => Err(Unmarked::Entry {
            name,
            what: if is(&st, SFlag::S_IFREG) {
                format!("owned by uid {}", st.st_uid)
            } else {
                "not a regular file".into()
            },
        }),
        Err(Errno::ENOENT) => Ok(false),
        Err(e) => Err(Unmarked::Unreadable(e)),
    }
}

/// Open `root/name` (never following a symlink) when it carries
/// vmwarden's marks as a runtime dir (see the module docs); else why not.
pub fn runtime_dir(root: &Dir, name: &OsStr) -> Result<Dir, Unmarked> {
    let dir = match dirs::open_existing(root, name) {
        Ok(Some(d)) => d,
        Ok(None) => return Err(Unmarked::Unreadable(Errno::ENOENT)),
        Err(e) => return Err(Unmarked::Open(e)),
    };
    let st = dir.stat().map_err(Unmarked::Open)?;
    if st.st_uid != 0 {
        return Err(Unmarked::Owner(st.st_uid));
    }
    if st.st_mode & 0o022 != 0 {
        return Err(Unmarked::Writable(st.st_mode & 0o7777));
    }
    let entries = ownership::entries(&dir).map_err(Unmarked::Unreadable)?;
    if entries.is_empty() {
        return Ok(dir);
    }
    if !roots_file(&dir, LEASE_FILE)? {
        return Err(Unmarked::NoLease);
    }
    let beside_lease = [
        LEASE_FILE,
        INTENT_TEMP,
        LAST_CLEANUP_FILE,
        last_cleanup::TEMP_NAME,
        CREDS_FLOOR_FILE,
        creds_floor::TEMP_NAME,
    ];
    let beyond_lease = entries
        .iter()
        .any(|n| !beside_lease.iter().any(|k| n.as_os_str() == OsStr::new(k)));
    if beyond_lease && !roots_file(&dir, INTENT_FILE)? {
        return Err(Unmarked::NoIntent);
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A runtime dir as cleanup leaves it (the lease file and the last
    /// cleanup's record) carries the marks; anything else beside the lease
    /// without an intent record does not. Needs root (the files must be
    /// root's).
    #[test]
    fn the_last_cleanups_record_is_one_of_the_marks() {
        assert!(nix::unistd::geteuid().is_root(), "this test needs root");
        let t = tempfile::tempdir().unwrap();
        let vm = t.path().join("web");
        std::fs::create_dir(&vm).unwrap();
        std::fs::write(vm.join(LEASE_FILE), b"").unwrap();
        std::fs::write(vm.join(LAST_CLEANUP_FILE), b"{}").unwrap();
        let root = dirs::open_dir(t.path()).unwrap();
        runtime_dir(&root, OsStr::new("web")).unwrap();
        std::fs::write(vm.join("data"), b"").unwrap();
        assert!(matches!(
            runtime_dir(&root, OsStr::new("web")),
            Err(Unmarked::NoIntent)
        ));
    }
}
