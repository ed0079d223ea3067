//! The credential floor: `RUNTIME/NAME/creds-floor.json` (root's, 0644), a
//! mount id below every mount of this VM's credential tmpfs that may still
//! exist this boot. Cleanup and `verify-clean NAME` ask the kernel only
//! for mounts at or above it (`host::ns_mounts::holding`), so a mount
//! namespace made before the VM costs them one listing, not one
//! `statmount` per mount.
//!
//! Why a floor finds every copy. Since Linux 6.8 every mount gets a
//! 64-bit id from one counter that only grows (`STATX_MNT_ID_UNIQUE`),
//! when it is made: a tmpfs mounted, a bind mount, a namespace's copy of
//! every mount (`unshare -m`, `clone(CLONE_NEWNS)`), a detached clone
//! (`open_tree`). Moving a mount keeps its id. So every mount of a
//! credential tmpfs, the original and any copy anywhere, has an id above
//! one read before the tmpfs existed.
//!
//! The record follows the project's order: intent before the resource.
//! The launch reads the id of its new namespace's root right after
//! `unshare` (made then, so above everything before it and below the
//! tmpfs it has not mounted yet) and writes it here before it mounts the
//! tmpfs ([`note_launch`]). A record of an earlier instance this boot that
//! no cleanup has proven gone is kept as it is: its floor is lower and
//! covers both. Cleanup, when its search found no mount of the VM's
//! tmpfs, marks the record proven ([`mark_proven`]), so the next launch
//! may start a floor of its own; it never raises the floor itself, so
//! `verify-clean` after it still searches from the instance's own floor.
//!
//! Ambiguity searches everything: no record, one of another boot (mount
//! ids start again at each boot; `/proc/sys/kernel/random/boot_id` tells
//! them apart), one not root's or not a regular file, one that does not
//! parse: [`read`] answers `None` and the caller searches every mount as
//! before. Such a record is left for the launch (a bad one is not
//! replaced by a higher floor) until a cleanup's search of every mount
//! finds none and writes a proven one.
//!
//! Kept beside the lease (`host::ownership::RUNTIME_KEEP`): it must
//! outlive the instance whose leftovers it bounds.

use std::os::fd::AsRawFd;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::config::paths::CREDS_FLOOR_FILE;
use crate::host::dirs::{self, Dir, DirError};

/// The record's format version.
pub const VERSION: u32 = 1;

/// The temporary name `dirs::atomic_write` writes the record under.
pub const TEMP_NAME: &str = ".creds-floor.json.tmp";

/// A record is under a hundred bytes; anything larger is not one.
const MAX_BYTES: u64 = 1024;

/// `STATX_MNT_ID_UNIQUE` (include/uapi/linux/stat.h, Linux 6.8): `stx_mnt_id`
/// is the mount's 64-bit id, never reused. The `libc` crate has the field
/// but not this flag.
const STATX_MNT_ID_UNIQUE: u32 = 0x4000;

/// What the launch logs when [`root_mount_id`] fails (a kernel before
/// 6.8 has no unique mount ids): its floor is then 0, every mount, which
/// is sound on any kernel, so the launch goes on.
pub fn no_mount_id(e: nix::errno::Errno) -> String {
    format!("/: cannot read the unique mount id of the VM's new mount namespace's root (Linux 6.8 and later): {e}; credential floor 0 (cleanup and verify-clean search every mount)")
}

/// The floor could not be recorded.
#[derive(Debug, thiserror::Error)]
pub enum FloorError {
    #[error("{path}: cannot read this boot's id: {source}")]
    BootId {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: cannot write the credential floor: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: DirError,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CredsFloor {
    pub version: u32,
    /// The boot the mount id belongs to.
    pub boot_id: String,
    /// No mount of the VM's credential tmpfs this boot has a lower id.
    pub floor: u64,
    /// A cleanup's search from `floor` found none (under the lease, the
    /// VM's processes gone): the next launch may record its own floor.
    pub proven: bool,
}

const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// This boot's id.
pub fn boot_id() -> Result<String, FloorError> {
    std::fs::read_to_string(BOOT_ID)
        .map(|s| s.trim().to_string())
        .map_err(|source| FloorError::BootId {
            path: PathBuf::from(BOOT_ID),
            source,
        })
}

/// The unique id of the mount `/` is on, for the calling thread's root.
pub fn root_mount_id() -> Result<u64, nix::errno::Errno> {
    let root = nix::fcntl::open(
        "/",
        nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    // SAFETY: an all-zero `statx` is a valid value of the plain C struct.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `root` is an open fd for the call's whole length, the path
    // is an empty NUL-terminated string (AT_EMPTY_PATH: the fd itself),
    // and the kernel writes one `statx` into `stx`, which it points to.
    let rc = unsafe {
        libc::statx(
            root.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            STATX_MNT_ID_UNIQUE,
            &raw mut stx,
        )
    };
    if rc != 0 {
        return Err(nix::errno::Errno::last());
    }
    if stx.stx_mask & STATX_MNT_ID_UNIQUE == 0 {
        return Err(nix::errno::Errno::ENOSYS);
    }
    Ok(stx.stx_mnt_id)
}

/// The record in `rundir` as it stands, when it is root's, a regular file
/// and parses; `None` otherwise.
fn current(rundir: &Dir) -> Option<CredsFloor> {
    let bytes = dirs::read_small(rundir, CREDS_FLOOR_FILE, MAX_BYTES)
        .ok()
        .flatten()?;
    let st = nix::sys::stat::fstatat(
        &rundir.fd,
        CREDS_FLOOR_FILE,
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .ok()?;
    if st.st_uid != 0 {
        return None;
    }
    serde_json::from_slice::<CredsFloor>(&bytes)
        .ok()
        .filter(|r| r.version == VERSION)
}

/// The floor to search `rundir`'s VM's credential tmpfs from: `None`
/// (search every mount) unless the record is root's, parses and is of
/// this boot.
pub fn read(rundir: &Dir) -> Option<u64> {
    let rec = current(rundir)?;
    (rec.boot_id == boot_id().ok()?).then_some(rec.floor)
}

fn write(rundir: &Dir, rec: &CredsFloor) -> Result<(), FloorError> {
    let mut bytes = serde_json::to_vec(rec).unwrap_or_default();
    bytes.push(b'\n');
    dirs::atomic_write(rundir, CREDS_FLOOR_FILE, &bytes, 0o644).map_err(|source| {
        FloorError::Write {
            path: rundir.path.join(CREDS_FLOOR_FILE),
            source,
        }
    })
}

/// What the launch records, in its new mount namespace before it mounts
/// the credential tmpfs: `floor` (its root's mount id) unless an earlier
/// instance's unproven floor of this boot stands (lower, kept), or a
/// record stands that cannot be judged (left: readers search everything).
pub fn note_launch(rundir: &Dir, floor: u64) -> Result<(), FloorError> {
    let boot = boot_id()?;
    let standing = dirs::read_small(rundir, CREDS_FLOOR_FILE, MAX_BYTES);
    let rec = match standing {
        Ok(None) => None,
        Ok(Some(_)) => match current(rundir) {
            Some(r) => Some(r),
            // There, but not a record to believe: keep it.
            None => return Ok(()),
        },
        Err(_) => return Ok(()),
    };
    match rec {
        Some(r) if r.boot_id == boot && !r.proven && r.floor <= floor => Ok(()),
        _ => write(
            rundir,
            &CredsFloor {
                version: VERSION,
                boot_id: boot,
                floor,
                proven: false,
            },
        ),
    }
}

/// The launch found the runtime dir there already (an instance may have
/// run this boot) and no record in it: one that ran before floors were
/// recorded (an upgrade), or a record lost. Its floor is unknown, so it
/// is 0 (every mount asked) until a cleanup's search proves none left;
/// [`note_launch`] then keeps it. Any record already there is left.
pub fn note_unknown_past(rundir: &Dir) -> Result<(), FloorError> {
    match dirs::read_small(rundir, CREDS_FLOOR_FILE, MAX_BYTES) {
        Ok(None) => write(
            rundir,
            &CredsFloor {
                version: VERSION,
                boot_id: boot_id()?,
                floor: 0,
                proven: false,
            },
        ),
        _ => Ok(()),
    }
}

/// Cleanup's search from `searched_from` (0: every mount) found no mount
/// of the VM's credential tmpfs: the record says so, with the floor it
/// had (or 0). Not written when the record changed meanwhile or is of
/// another boot; a failure leaves the record unproven (the next launch
/// keeps the lower floor), which is safe.
pub fn mark_proven(rundir: &Dir, searched_from: Option<u64>) -> Result<(), FloorError> {
    let boot = boot_id()?;
    let floor = match (current(rundir), searched_from) {
        (Some(r), Some(f)) if r.boot_id == boot && r.floor == f => f,
        (_, None) => 0,
        _ => return Ok(()),
    };
    write(
        rundir,
        &CredsFloor {
            version: VERSION,
            boot_id: boot,
            floor,
            proven: true,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> (tempfile::TempDir, Dir) {
        let t = tempfile::tempdir().unwrap();
        let d = dirs::open_dir(t.path()).unwrap();
        (t, d)
    }

    #[test]
    fn the_root_mount_id_is_a_unique_one() {
        // Unique ids start above the old 32-bit ones (2^31 on this
        // kernel): a reused small id would not do.
        assert!(root_mount_id().unwrap() > u64::from(u32::MAX >> 1));
    }

    /// The record, as the launch and cleanup keep it; needs root (a
    /// record not root's is not believed).
    #[test]
    fn a_launch_keeps_an_unproven_floor_and_starts_anew_after_a_proof() {
        assert!(nix::unistd::geteuid().is_root(), "this test needs root");
        let (t, d) = dir();
        assert_eq!(read(&d), None);
        note_launch(&d, 100).unwrap();
        assert_eq!(read(&d), Some(100));
        // A second instance before any proof: the first one's stands.
        note_launch(&d, 200).unwrap();
        assert_eq!(read(&d), Some(100));
        // Proven from another floor than the record's: not marked.
        mark_proven(&d, Some(150)).unwrap();
        note_launch(&d, 300).unwrap();
        assert_eq!(read(&d), Some(100));
        mark_proven(&d, Some(100)).unwrap();
        assert_eq!(read(&d), Some(100), "a proof does not raise the floor");
        // A runtime dir found there: a record standing is left.
        note_unknown_past(&d).unwrap();
        note_launch(&d, 300).unwrap();
        assert_eq!(read(&d), Some(300));
        // None there: 0 until a proof, whatever the launch reads.
        std::fs::remove_file(t.path().join(CREDS_FLOOR_FILE)).unwrap();
        note_unknown_past(&d).unwrap();
        note_launch(&d, 400).unwrap();
        assert_eq!(read(&d), Some(0));
        mark_proven(&d, Some(0)).unwrap();
        note_launch(&d, 500).unwrap();
        assert_eq!(read(&d), Some(500));
        assert!(!t.path().join(TEMP_NAME).exists());
    }

    #[test]
    fn a_record_of_another_boot_or_not_roots_or_unparsed_is_not_believed() {
        assert!(nix::unistd::geteuid().is_root(), "this test needs root");
        let (t, d) = dir();
        let f = t.path().join(CREDS_FLOOR_FILE);
        let other = CredsFloor {
            version: VERSION,
            boot_id: "another-boot".into(),
            floor: 5,
            proven: false,
        };
        std::fs::write(&f, serde_json::to_vec(&other).unwrap()).unwrap();
        assert_eq!(read(&d), None, "another boot's floor was believed");
        // A launch replaces it with this boot's.
        note_launch(&d, 400).unwrap();
        assert_eq!(read(&d), Some(400));
        // Not root's: not believed, and a launch does not replace it.
        nix::unistd::chown(&f, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
        assert_eq!(read(&d), None, "a record not root's was believed");
        note_launch(&d, 500).unwrap();
        assert_eq!(read(&d), None);
        // Unparsed: the same; a proof from every mount replaces it.
        std::fs::remove_file(&f).unwrap();
        std::fs::write(&f, b"{\"floor\": 1").unwrap();
        assert_eq!(read(&d), None);
        note_launch(&d, 600).unwrap();
        assert_eq!(read(&d), None);
        mark_proven(&d, None).unwrap();
        assert_eq!(read(&d), Some(0));
        note_launch(&d, 700).unwrap();
        assert_eq!(read(&d), Some(700));
        // A link planted in its place is not followed.
        std::fs::remove_file(&f).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", &f).unwrap();
        assert_eq!(read(&d), None);
    }
}
