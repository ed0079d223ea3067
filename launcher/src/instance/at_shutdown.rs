//! Root's record of the VMs the host's shutdown hibernated:
//! `STATE_ROOT/.hibernated-at-shutdown.json` (root 0600, written durably),
//! `{"vms": [NAME…]}`. `vmwarden hibernate-all` adds each VM it put down
//! (`control::at_shutdown`); `vmwarden start-hibernated` reads it once at
//! the next boot, starts their units and removes it.
//!
//! A VM is named only while the snapshot the shutdown made is the one
//! there: whatever deletes that snapshot takes the VM off ([`forget`]),
//! once the deletion succeeded: a restore's consumption (`wait-ready`), a
//! cold boot's discard of a stale snapshot (`launch::restore`), the
//! cleanup that finishes what a discard left (`teardown::hibernate`) and
//! `purge`. Otherwise a VM the operator then hibernated by hand would be
//! started by the next boot, where it should stay down. The record is
//! here, below launch and teardown, so that each of them reaches it.
//!
//! Every change to the record holds the exclusive `flock` of
//! `STATE_ROOT/.hibernated-at-shutdown.lock` ([`lock`]) from its read to
//! its write, and the boot holds it from its read to the removal: the
//! units the boot starts run at once, and each one's restore or cold
//! boot takes its VM off the same record. Without it two of them write
//! through the one temp name (one's rename fails, refusing its start),
//! or one writes back a name another took off, or the record the boot
//! removed.

use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::time::Duration;

use nix::fcntl::Flock;
use serde::{Deserialize, Serialize};

use crate::config::names::VmName;
use crate::config::paths::Roots;
use crate::host::dirs::{self, DirError};
use crate::host::locks::{self, LockError};
use crate::host::sys::SysError;

/// The record's name in the state root (a dot name is no VM's).
pub const RECORD: &str = ".hibernated-at-shutdown.json";

/// The lock every change to the record holds ([`lock`]), beside it.
pub const LOCK: &str = ".hibernated-at-shutdown.lock";

/// How long a change waits for the record's lock ([`lock`]): each holder
/// keeps it for a read and a write, the boot's `start-hibernated` for a
/// few unit starts. A holder that keeps it longer is named in the error.
pub const LOCK_WAIT: Duration = Duration::from_secs(30);

/// The most bytes the record may have (a few thousand VM names).
pub const MAX_RECORD_BYTES: u64 = 256 * 1024;

/// The record could not be read, parsed, written or removed.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error(
        "{path}: cannot {op} the record of the VMs hibernated at the host's shutdown: {source}"
    )]
    Dir {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: DirError,
    },
    #[error("{path}: cannot be parsed: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// The lock file is not the one vmwarden makes (root's regular `0600`
    /// file with one link): refused, never waited on or locked.
    #[error("{path}: refused: the lock of the record of the VMs hibernated at the host's shutdown is {why}, not root's regular 0600 file with one link; remove it (vmwarden makes it again)")]
    BadLock { path: PathBuf, why: String },
    /// Another process held the lock for the whole bounded wait.
    #[error("{path}: the lock of the record of the VMs hibernated at the host's shutdown is still held after {} s, by {holders}; nothing changed", .waited.as_secs())]
    LockBusy {
        path: PathBuf,
        waited: Duration,
        holders: String,
    },
}

/// The VMs `hibernate-all` put down, for the next boot.
#[derive(Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AtShutdown {
    pub vms: Vec<VmName>,
}

/// The record's path under `roots`.
pub fn path(roots: &Roots) -> PathBuf {
    roots.state_root.join(RECORD)
}

fn dir_error(roots: &Roots, op: &'static str) -> impl FnOnce(DirError) -> RecordError {
    let path = path(roots);
    move |source| RecordError::Dir { op, path, source }
}

impl AtShutdown {
    /// The record, or an empty one when there is none.
    pub fn read(roots: &Roots) -> Result<AtShutdown, RecordError> {
        let Some(root) =
            dirs::open_dir_if_exists(&roots.state_root).map_err(dir_error(roots, "read"))?
        else {
            return Ok(AtShutdown::default());
        };
        match dirs::read_small(&root, RECORD, MAX_RECORD_BYTES).map_err(dir_error(roots, "read"))? {
            None => Ok(AtShutdown::default()),
            Some(b) => serde_json::from_slice(&b).map_err(|source| RecordError::Parse {
                path: path(roots),
                source,
            }),
        }
    }

    /// Write the record durably (root 0600), replacing the old one whole.
    pub fn write(&self, roots: &Roots) -> Result<(), RecordError> {
        let root = dirs::open_dir(&roots.state_root).map_err(dir_error(roots, "write"))?;
        let mut bytes = serde_json::to_vec_pretty(self).expect("a list of names encodes");
        bytes.push(b'\n');
        dirs::durable_write(&root, RECORD, &bytes, 0o600).map_err(dir_error(roots, "write"))
    }

    /// Remove the record (none is fine).
    pub fn remove(roots: &Roots) -> Result<(), RecordError> {
        let Some(root) =
            dirs::open_dir_if_exists(&roots.state_root).map_err(dir_error(roots, "remove"))?
        else {
            return Ok(());
        };
        match nix::unistd::unlinkat(
            root.fd.as_fd(),
            RECORD,
            nix::unistd::UnlinkatFlags::NoRemoveDir,
        ) {
            Ok(()) | Err(nix::errno::Errno::ENOENT) => Ok(()),
            Err(errno) => Err(dir_error(roots, "remove")(DirError::Sys(SysError {
                op: "unlink",
                path: path(roots),
                errno,
            }))),
        }
    }
}

/// Proof that the record's lock is held (released when dropped).
#[derive(Debug)]
pub struct Held {
    _lock: Flock<OwnedFd>,
}

/// Open (make if missing, root's 0600) `STATE_ROOT/`[`LOCK`] without
/// following a link (nor blocking on a FIFO) and lock it exclusively,
/// waiting for the holder at most [`LOCK_WAIT`]. A lock file that is not
/// root's regular `0600` file with one link (more where any user may link
/// it, `host::locks::lock_file`) is refused ([`RecordError::BadLock`]):
/// one another user may open could be locked by them forever. `None`
/// when there is no state root (and so no record).
pub fn lock(roots: &Roots) -> Result<Option<Held>, RecordError> {
    lock_within(roots, LOCK_WAIT)
}

fn lock_within(roots: &Roots, wait: Duration) -> Result<Option<Held>, RecordError> {
    let Some(root) =
        dirs::open_dir_if_exists(&roots.state_root).map_err(dir_error(roots, "lock"))?
    else {
        return Ok(None);
    };
    match locks::lock_file(&root, LOCK, wait) {
        Ok(lock) => Ok(Some(Held { _lock: lock })),
        Err(LockError::Bad { path, why, .. }) => Err(RecordError::BadLock { path, why }),
        Err(LockError::Busy {
            path,
            waited,
            holders,
        }) => Err(RecordError::LockBusy {
            path,
            waited,
            holders,
        }),
        Err(LockError::Sys { op, path, errno }) => {
            Err(dir_error(roots, "lock")(DirError::Sys(SysError {
                op,
                path,
                errno,
            })))
        }
    }
}

/// Add `name` to the record (`hibernate-all`, once it is hibernated),
/// under the record's lock.
pub fn add(roots: &Roots, name: &VmName) -> Result<(), RecordError> {
    add_within(roots, name, LOCK_WAIT)
}

/// [`add`], waiting for the lock's holder at most `wait` (zero: one try).
pub fn add_within(roots: &Roots, name: &VmName, wait: Duration) -> Result<(), RecordError> {
    let _held = lock_within(roots, wait)?;
    let mut record = AtShutdown::read(roots)?;
    if !record.vms.contains(name) {
        record.vms.push(name.clone());
    }
    record.write(roots)
}

/// Take `name` off the record (when it names it): the snapshot the
/// shutdown made of it is gone (consumed by a restore, discarded by a cold
/// boot, purged), so a later hibernation of it (by hand) is not the
/// shutdown's, and the next boot must not start it. Called only once that
/// snapshot's deletion succeeded; a record that names nothing of `name`,
/// or none at all, is left as it is. Under the record's lock.
pub fn forget(roots: &Roots, name: &VmName) -> Result<(), RecordError> {
    // A record that does not name it (or none: the lock file is not made
    // for every purge) stays so: only `hibernate-all` adds its name, and
    // only once the VM is down with a new snapshot. Each version read is
    // whole (a rename replaces it).
    if !AtShutdown::read(roots)?.vms.contains(name) {
        return Ok(());
    }
    let _held = lock(roots)?;
    let mut record = AtShutdown::read(roots)?;
    if !record.vms.contains(name) {
        return Ok(());
    }
    record.vms.retain(|n| n != name);
    record.write(roots)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::fcntl::FlockArg;
    use nix::sys::stat::Mode;
    use std::time::Instant;

    fn roots(state: &std::path::Path) -> Roots {
        Roots {
            state_root: state.to_path_buf(),
            ..Roots::default()
        }
    }

    fn names(v: &[&str]) -> Vec<VmName> {
        v.iter().map(|n| VmName::parse(n).unwrap()).collect()
    }

    #[test]
    fn forget_takes_only_that_name_off_and_keeps_the_others() {
        let t = tempfile::tempdir().unwrap();
        let r = roots(t.path());
        AtShutdown {
            vms: names(&["web", "db"]),
        }
        .write(&r)
        .unwrap();
        forget(&r, &VmName::parse("web").unwrap()).unwrap();
        assert_eq!(AtShutdown::read(&r).unwrap().vms, names(&["db"]));
        // A name it does not hold, and no record at all: nothing written.
        forget(&r, &VmName::parse("mail").unwrap()).unwrap();
        assert_eq!(AtShutdown::read(&r).unwrap().vms, names(&["db"]));
        AtShutdown::remove(&r).unwrap();
        forget(&r, &VmName::parse("db").unwrap()).unwrap();
        assert!(
            !path(&r).exists(),
            "forget made a record where there was none"
        );
        // Nor its lock, in a state root without one (every purge forgets).
        let t = tempfile::tempdir().unwrap();
        forget(&roots(t.path()), &VmName::parse("db").unwrap()).unwrap();
        assert!(!t.path().join(LOCK).exists() && !t.path().join(RECORD).exists());
    }

    #[test]
    fn a_record_that_cannot_be_parsed_is_an_error_naming_its_path() {
        let t = tempfile::tempdir().unwrap();
        let r = roots(t.path());
        std::fs::write(path(&r), b"{\"vms\": [\"../x\"]}").unwrap();
        let e = forget(&r, &VmName::parse("web").unwrap()).unwrap_err();
        let text = e.to_string();
        assert!(
            matches!(e, RecordError::Parse { .. })
                && text.contains(&path(&r).display().to_string()),
            "{text}"
        );
    }

    #[test]
    fn forgets_of_different_vms_at_once_lose_no_update() {
        // The units `start-hibernated` starts run at once: each cold boot's
        // discard (and each restore) takes its VM off the same record.
        let t = tempfile::tempdir().unwrap();
        let r = roots(t.path());
        let all: Vec<String> = (0..12).map(|i| format!("vm{i}")).collect();
        for round in 0..15 {
            AtShutdown {
                vms: all.iter().map(|n| VmName::parse(n).unwrap()).collect(),
            }
            .write(&r)
            .unwrap();
            let errors: Vec<String> = std::thread::scope(|s| {
                let hs: Vec<_> = all
                    .iter()
                    .map(|n| {
                        let r = &r;
                        s.spawn(move || forget(r, &VmName::parse(n).unwrap()))
                    })
                    .collect();
                hs.into_iter()
                    .filter_map(|h| h.join().unwrap().err().map(|e| e.to_string()))
                    .collect()
            });
            assert!(errors.is_empty(), "round {round}: {errors:?}");
            assert_eq!(
                AtShutdown::read(&r).unwrap().vms,
                Vec::<VmName>::new(),
                "round {round}: a VM whose snapshot is gone is still named"
            );
        }
    }

    /// What a lock attack left: the error's text, which must name the
    /// lock's path.
    fn refused(r: &Roots) -> (RecordError, String) {
        let e = lock_within(r, Duration::from_millis(300)).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains(&r.state_root.join(LOCK).display().to_string()),
            "{text}"
        );
        (e, text)
    }

    #[test]
    fn a_link_fifo_or_directory_planted_as_the_lock_is_refused_and_its_target_untouched() {
        let t = tempfile::tempdir().unwrap();
        let r = roots(&t.path().join("state"));
        std::fs::create_dir(&r.state_root).unwrap();
        let lock_path = r.state_root.join(LOCK);
        // A symlink to a file elsewhere, and one to nowhere.
        let victim = t.path().join("victim");
        std::fs::write(&victim, b"root's").unwrap();
        std::os::unix::fs::symlink(&victim, &lock_path).unwrap();
        let (_, text) = refused(&r);
        assert!(text.contains("open"), "{text}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"root's");
        std::fs::remove_file(&lock_path).unwrap();
        let nowhere = t.path().join("nowhere");
        std::os::unix::fs::symlink(&nowhere, &lock_path).unwrap();
        refused(&r);
        assert!(!nowhere.exists(), "the lock was made through a link");
        std::fs::remove_file(&lock_path).unwrap();
        // A FIFO: refused at once, never blocked on.
        nix::unistd::mkfifo(&lock_path, Mode::from_bits_truncate(0o600)).unwrap();
        let (e, text) = refused(&r);
        assert!(
            matches!(e, RecordError::BadLock { .. }) && text.contains("FIFO"),
            "{text}"
        );
        std::fs::remove_file(&lock_path).unwrap();
        // A directory.
        std::fs::create_dir(&lock_path).unwrap();
        refused(&r);
        assert!(lock_path.is_dir());
        // Nothing changed the record meanwhile, and forget says why.
        AtShutdown {
            vms: names(&["web"]),
        }
        .write(&r)
        .unwrap();
        let e = forget(&r, &VmName::parse("web").unwrap()).unwrap_err();
        assert!(e.to_string().contains(LOCK), "{e}");
        assert_eq!(AtShutdown::read(&r).unwrap().vms, names(&["web"]));
    }

    #[test]
    fn a_lock_file_of_another_owner_or_mode_or_with_another_link_is_refused() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test needs root (it gives the lock file to another uid)"
        );
        let t = tempfile::tempdir().unwrap();
        let r = roots(t.path());
        let lock_path = r.state_root.join(LOCK);
        let mk = |mode: u32| {
            let _ = std::fs::remove_file(&lock_path);
            std::fs::write(&lock_path, b"").unwrap();
            std::fs::set_permissions(
                &lock_path,
                std::os::unix::fs::PermissionsExt::from_mode(mode),
            )
            .unwrap();
        };
        // Another user's: they could hold it forever.
        mk(0o600);
        std::os::unix::fs::lchown(&lock_path, Some(4_200_001), None).unwrap();
        let (e, text) = refused(&r);
        assert!(
            matches!(e, RecordError::BadLock { .. }) && text.contains("owned by uid 4200001"),
            "{text}"
        );
        // Root's, but anyone may open it (and lock it).
        mk(0o644);
        let (_, text) = refused(&r);
        assert!(text.contains("mode 644"), "{text}");
        // Root's 0600, but a hard link to another of root's files: the
        // lock would be that file's.
        mk(0o600);
        let other = t.path().join("other");
        std::fs::hard_link(&lock_path, &other).unwrap();
        let (_, text) = refused(&r);
        assert!(text.contains("2 links"), "{text}");
        std::fs::remove_file(&other).unwrap();
        // vmwarden's own: taken.
        assert!(lock_within(&r, Duration::from_millis(300))
            .unwrap()
            .is_some());
    }

    #[test]
    fn a_lock_held_by_someone_else_is_waited_on_for_a_bounded_time_naming_the_holder() {
        let t = tempfile::tempdir().unwrap();
        let r = roots(t.path());
        drop(lock_within(&r, Duration::ZERO).unwrap());
        // Another open file description: another holder, as another
        // process's would be (this process's pid is the one named).
        let f = std::fs::File::open(r.state_root.join(LOCK)).unwrap();
        let held = Flock::lock(f, FlockArg::LockExclusive).unwrap();
        let t0 = Instant::now();
        let (e, text) = refused(&r);
        assert!(t0.elapsed() >= Duration::from_millis(300));
        assert!(
            matches!(e, RecordError::LockBusy { .. })
                && text.contains(&format!("pid {}", std::process::id())),
            "{text}"
        );
        drop(held);
        assert!(lock_within(&r, Duration::from_millis(300))
            .unwrap()
            .is_some());
    }
}
