//! Root's record of a complete snapshot and of what it must match:
//! `STATE_ROOT/.hibernated-NAME.json` (root, 0600, written durably), like
//! `.made-sources-NAME.json`: in the state root, which only root writes,
//! not in the VM's state dir, which the principal may write. Written by
//! `vmwarden hibernate` once the capture is complete and renamed, before
//! the VM stops; read by the launch, which restores only when every
//! identity below is still what it would run ([`Manifest::mismatches`]);
//! removed with the snapshot when a restore consumes it, and by `purge`.
//!
//! Identities of files are `(dev, ino, size, mtime, ctime)`, not a hash:
//! hashing a disk of many GiB at every start would cost more than the
//! restore saves, and `ctime` cannot be set by anyone but the kernel (a
//! write, `touch -d` and `utimensat` all move it to now), so a file
//! written or replaced since the capture differs.

use std::ffi::OsStr;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{fstat, fstatat, FileStat, Mode};
use serde::{Deserialize, Serialize};

use crate::config::hibernate::SNAPSHOT_DIR;
use crate::config::names::VmName;
use crate::config::spec::{HypervisorKind, Spec};
use crate::host::dirs::{self, Dir, DirError};
use crate::host::ownership;
use crate::host::sys::SysError;

/// The most bytes a record may have.
pub const MAX_RECORD_BYTES: u64 = 256 * 1024;

/// The record's name in the state root (a dot name is no VM's).
pub fn record_name(name: &VmName) -> String {
    format!(".hibernated-{name}.json")
}

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
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
    #[error("{0}")]
    Sys(#[from] SysError),
}

/// One file's identity (see the module's note on why not a hash).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct FileId {
    pub path: PathBuf,
    pub dev: u64,
    pub ino: u64,
    pub size: i64,
    pub mtime: (i64, i64),
    pub ctime: (i64, i64),
}

impl FileId {
    pub fn of_stat(path: &Path, st: &FileStat) -> FileId {
        FileId {
            path: path.to_path_buf(),
            dev: st.st_dev,
            ino: st.st_ino,
            size: st.st_size,
            mtime: (st.st_mtime, st.st_mtime_nsec),
            ctime: (st.st_ctime, st.st_ctime_nsec),
        }
    }

    /// The identity of `path` now (followed: the file the hypervisor
    /// opens), or `None` when it cannot be stat'ed.
    pub fn of(path: &Path) -> Option<FileId> {
        nix::sys::stat::stat(path)
            .ok()
            .map(|st| FileId::of_stat(path, &st))
    }
}

/// One regular file of the snapshot directory. `ctime` because the file
/// is the principal's: a hypervisor of a later run (a snapshot kept with
/// `--keep-after-restore` stays in the state dir it may write) could
/// rewrite it in place, same inode and size, and every later restore
/// would load what it wrote; only the kernel sets `ctime`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SnapshotFile {
    pub name: String,
    pub ino: u64,
    pub size: i64,
    pub ctime: (i64, i64),
}

/// The snapshot directory as captured: its inode and every file in it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SnapshotId {
    pub dev: u64,
    pub ino: u64,
    pub files: Vec<SnapshotFile>,
}

impl SnapshotId {
    pub fn size(&self) -> u64 {
        self.files
            .iter()
            .map(|f| u64::try_from(f.size).unwrap_or(0))
            .sum()
    }
}

/// What a restore must find unchanged: everything the VM would run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Identities {
    /// The spec's exact bytes (JSON, at most 64 KiB: kept whole rather
    /// than hashed, so no digest crate is needed and a difference is
    /// certain).
    pub spec: String,
    pub hypervisor_binary: Option<FileId>,
    pub kernel: Option<FileId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initrd: Option<FileId>,
    pub disks: Vec<Option<FileId>>,
    /// This boot's id, for a hypervisor whose snapshot holds host state
    /// that does not survive a reboot ([`needs_boot_id`]); else `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
}

/// Whether `kind`'s snapshot is bound to this boot of the host. QEMU's
/// migration stream is not (it is made to cross hosts).
pub fn needs_boot_id(kind: HypervisorKind) -> bool {
    !matches!(kind, HypervisorKind::Qemu)
}

impl Identities {
    /// What `spec` (read as `spec_bytes`) would run now.
    pub fn now(spec: &Spec, spec_bytes: &[u8]) -> Identities {
        Identities {
            spec: String::from_utf8_lossy(spec_bytes).into_owned(),
            hypervisor_binary: FileId::of(&spec.hypervisor.binary),
            kernel: FileId::of(&spec.kernel),
            initrd: spec.initrd.as_deref().and_then(FileId::of),
            disks: spec.disks.iter().map(|d| FileId::of(&d.path)).collect(),
            boot_id: needs_boot_id(spec.hypervisor.kind).then(super::intent::boot_id),
        }
    }
}

/// `STATE/.hibernated-NAME.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub version: u32,
    pub vm: String,
    pub hypervisor: HypervisorKind,
    /// The principal who owns the snapshot (its uid).
    pub uid: u32,
    pub identities: Identities,
    pub snapshot: SnapshotId,
    pub created_unix: u64,
    /// `vmwarden hibernate --keep-after-restore`: a restore does not
    /// consume it (the disks' identities still refuse a second restore
    /// once the guest has written to them).
    #[serde(default)]
    pub keep_after_restore: bool,
}

impl Manifest {
    /// The record of `name`, or `None`.
    pub fn read(state_root: &Dir, name: &VmName) -> Result<Option<Manifest>, ManifestError> {
        let file = record_name(name);
        match dirs::read_small(state_root, &file, MAX_RECORD_BYTES)? {
            None => Ok(None),
            Some(b) => {
                serde_json::from_slice(&b)
                    .map(Some)
                    .map_err(|source| ManifestError::Parse {
                        path: state_root.path.join(&file),
                        source,
                    })
            }
        }
    }

    /// [`Manifest::read`] by the state root's path.
    pub fn read_at(state_root: &Path, name: &VmName) -> Result<Option<Manifest>, ManifestError> {
        match dirs::open_dir_if_exists(state_root)? {
            Some(d) => Manifest::read(&d, name),
            None => Ok(None),
        }
    }

    /// Write durably (root 0600).
    pub fn write(&self, state_root: &Dir, name: &VmName) -> Result<(), ManifestError> {
        let file = record_name(name);
        let mut bytes =
            serde_json::to_vec_pretty(self).map_err(|source| ManifestError::Encode {
                path: state_root.path.join(&file),
                source,
            })?;
        bytes.push(b'\n');
        Ok(dirs::durable_write(state_root, &file, &bytes, 0o600)?)
    }

    /// What differs between the capture and `now`, and the snapshot found
    /// (`found`, [`snapshot_now`]): one `field: why` per difference, empty
    /// when the snapshot may be restored.
    pub fn mismatches(&self, now: &Identities, found: Option<&SnapshotId>) -> Vec<String> {
        let mut out = Vec::new();
        let was = &self.identities;
        if was.spec != now.spec {
            out.push("spec: its bytes changed since the capture".to_string());
        }
        let file = |out: &mut Vec<String>, what: &str, a: &Option<FileId>, b: &Option<FileId>| {
            if a != b {
                out.push(format!(
                    "{what}: not the file the snapshot was captured with"
                ));
            }
        };
        file(
            &mut out,
            "hypervisor.binary",
            &was.hypervisor_binary,
            &now.hypervisor_binary,
        );
        file(&mut out, "kernel", &was.kernel, &now.kernel);
        file(&mut out, "initrd", &was.initrd, &now.initrd);
        if was.disks.len() != now.disks.len() {
            out.push("disks: a different number of disks".to_string());
        } else {
            for (i, (a, b)) in was.disks.iter().zip(&now.disks).enumerate() {
                file(&mut out, &format!("disks[{i}]"), a, b);
            }
        }
        if was.boot_id != now.boot_id {
            out.push("boot: the host rebooted since the capture".to_string());
        }
        match found {
            None => out.push(format!(
                "{SNAPSHOT_DIR}: missing or not the principal's 0700 directory"
            )),
            Some(f) if f != &self.snapshot => out.push(format!(
                "{SNAPSHOT_DIR}: not the files captured (replaced, added to or changed)"
            )),
            Some(_) => {}
        }
        out
    }
}

/// The snapshot directory `name` in `state_dir` as it is now: opened
/// without following a symlink, the principal's `uid` and mode 0700, each
/// entry a regular file of `uid`, mode 0600, one link. `None` when absent
/// or anything else.
pub fn snapshot_now(state_dir: &Dir, name: &str, uid: u32) -> Option<(SnapshotId, Dir)> {
    let d = dirs::open_existing(state_dir, name).ok()??;
    let st = fstat(d.fd.as_fd()).ok()?;
    if st.st_uid != uid || st.st_mode & 0o7777 != 0o700 {
        return None;
    }
    let mut files = Vec::new();
    for n in ownership::entries(&d).ok()? {
        let s = fstatat(d.fd.as_fd(), n.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW).ok()?;
        if s.st_mode & libc::S_IFMT != libc::S_IFREG
            || s.st_uid != uid
            || s.st_mode & 0o7777 != 0o600
            || s.st_nlink != 1
        {
            return None;
        }
        files.push(SnapshotFile {
            name: n.to_str()?.to_string(),
            ino: s.st_ino,
            size: s.st_size,
            ctime: (s.st_ctime, s.st_ctime_nsec),
        });
    }
    files.sort_by(|a, b| a.name.cmp(&b.name));
    Some((
        SnapshotId {
            dev: st.st_dev,
            ino: st.st_ino,
            files,
        },
        d,
    ))
}

/// Open `file` of the snapshot directory `dir` read-only, not following a
/// symlink nor waiting on a FIFO, and check it is still the file captured
/// (inode, `ctime`, size, one link, owner, mode).
pub fn open_snapshot_file(
    dir: &Dir,
    file: &SnapshotFile,
    uid: u32,
) -> Result<std::os::fd::OwnedFd, SysError> {
    let path = dir.path.join(&file.name);
    let fd = nix::fcntl::openat(
        dir.fd.as_fd(),
        OsStr::new(&file.name),
        // O_NONBLOCK: a FIFO swapped in is refused below, not waited on
        // (no effect on the regular file handed to the hypervisor).
        OFlag::O_RDONLY
            | OFlag::O_NOFOLLOW
            | OFlag::O_CLOEXEC
            | OFlag::O_NOCTTY
            | OFlag::O_NONBLOCK,
        Mode::empty(),
    )
    .map_err(|errno| SysError {
        op: "open",
        path: path.clone(),
        errno,
    })?;
    let st = fstat(fd.as_fd()).map_err(|errno| SysError {
        op: "fstat",
        path: path.clone(),
        errno,
    })?;
    if st.st_ino != file.ino
        || (st.st_ctime, st.st_ctime_nsec) != file.ctime
        || st.st_size != file.size
        || st.st_nlink != 1
        || st.st_uid != uid
        || st.st_mode & 0o7777 != 0o600
        || st.st_mode & libc::S_IFMT != libc::S_IFREG
    {
        return Err(SysError {
            op: "check the captured file",
            path,
            errno: Errno::ESTALE,
        });
    }
    Ok(fd)
}

/// Remove the record (ENOENT is fine).
pub fn remove(state_root: &Dir, name: &VmName) -> Result<(), SysError> {
    let file = record_name(name);
    match nix::unistd::unlinkat(
        state_root.fd.as_fd(),
        file.as_str(),
        nix::unistd::UnlinkatFlags::NoRemoveDir,
    ) {
        Ok(()) | Err(Errno::ENOENT) => Ok(()),
        Err(errno) => Err(SysError {
            op: "unlink",
            path: state_root.path.join(&file),
            errno,
        }),
    }
}

/// Root's record of VM `name`'s snapshot removed (no start restores what
/// is left), then the snapshot in `state_dir` deleted by the teardown's
/// own deletion (`openat`, never following a link): what that deletion
/// did, or `None` when there was no snapshot. A restore's consumption, a
/// capture replacing a kept snapshot, and a cold boot's discard.
pub fn remove_with_snapshot(
    state_root: &Dir,
    name: &VmName,
    state_dir: &Dir,
) -> Result<Option<ownership::Outcome>, SysError> {
    remove(state_root, name)?;
    if !ownership::exists_at(state_dir, OsStr::new(SNAPSHOT_DIR)) {
        return Ok(None);
    }
    Ok(Some(ownership::delete_entries(
        state_dir,
        &[std::ffi::OsString::from(SNAPSHOT_DIR)],
        None,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(path: &str, ino: u64, ctime: i64) -> Option<FileId> {
        Some(FileId {
            path: path.into(),
            dev: 1,
            ino,
            size: 10,
            mtime: (5, 0),
            ctime: (ctime, 0),
        })
    }

    fn ids() -> Identities {
        Identities {
            spec: "{}".into(),
            hypervisor_binary: id("/q", 1, 1),
            kernel: id("/k", 2, 1),
            initrd: id("/i", 3, 1),
            disks: vec![id("/d", 4, 1)],
            boot_id: None,
        }
    }

    fn snap() -> SnapshotId {
        SnapshotId {
            dev: 1,
            ino: 9,
            files: vec![SnapshotFile {
                name: "memory".into(),
                ino: 10,
                size: 100,
                ctime: (0, 0),
            }],
        }
    }

    fn manifest() -> Manifest {
        Manifest {
            version: 1,
            vm: "web".into(),
            hypervisor: HypervisorKind::Qemu,
            uid: 61000,
            identities: ids(),
            snapshot: snap(),
            created_unix: 1,
            keep_after_restore: false,
        }
    }

    #[test]
    fn a_snapshot_matches_only_what_it_was_captured_with() {
        let m = manifest();
        assert!(m.mismatches(&ids(), Some(&snap())).is_empty());
        let mut spec = ids();
        spec.spec = "{ }".into();
        assert!(m.mismatches(&spec, Some(&snap()))[0].starts_with("spec:"));
        // A disk written since (its ctime moved) is another disk.
        let mut disk = ids();
        disk.disks[0] = id("/d", 4, 2);
        assert!(m.mismatches(&disk, Some(&snap()))[0].starts_with("disks[0]:"));
        let mut kernel = ids();
        kernel.kernel = id("/k", 7, 1);
        assert!(m.mismatches(&kernel, Some(&snap()))[0].starts_with("kernel:"));
        let mut binary = ids();
        binary.hypervisor_binary = None;
        assert!(m.mismatches(&binary, Some(&snap()))[0].starts_with("hypervisor.binary:"));
        let mut boot = ids();
        boot.boot_id = Some("other".into());
        assert!(m.mismatches(&boot, Some(&snap()))[0].starts_with("boot:"));
        // A replaced memory file, or none at all.
        let mut other = snap();
        other.files[0].ino = 11;
        assert!(m.mismatches(&ids(), Some(&other))[0].contains("not the files captured"));
        assert!(m.mismatches(&ids(), None)[0].contains("missing"));
    }

    #[test]
    fn only_hypervisors_with_host_state_in_their_snapshot_need_this_boot() {
        assert!(!needs_boot_id(HypervisorKind::Qemu));
        assert!(needs_boot_id(HypervisorKind::CloudHypervisor));
        assert!(needs_boot_id(HypervisorKind::Firecracker));
    }

    use std::os::unix::fs::MetadataExt;
    use std::time::Duration;

    /// A FIFO swapped in for a snapshot file is refused at once, not
    /// waited on: the launch would hang before the VM starts.
    #[test]
    fn a_fifo_in_place_of_a_snapshot_file_is_refused_without_blocking() {
        let t = tempfile::tempdir().unwrap();
        let fifo = t.path().join("memory");
        nix::unistd::mkfifo(&fifo, Mode::from_bits_truncate(0o600)).unwrap();
        let md = std::fs::symlink_metadata(&fifo).unwrap();
        let file = SnapshotFile {
            name: "memory".into(),
            ino: md.ino(),
            size: i64::try_from(md.size()).unwrap(),
            ctime: (md.ctime(), md.ctime_nsec()),
        };
        let dir = dirs::open_dir(t.path()).unwrap();
        let uid = md.uid();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(open_snapshot_file(&dir, &file, uid).map(drop));
        });
        let r = rx
            .recv_timeout(Duration::from_secs(5))
            .expect("opening a FIFO snapshot file blocked");
        assert!(r.is_err(), "a FIFO was accepted as a snapshot file");
    }

    /// A snapshot file rewritten in place (same inode, same size) is no
    /// longer the file captured.
    #[test]
    fn a_snapshot_file_rewritten_in_place_is_not_the_one_captured() {
        let t = tempfile::tempdir().unwrap();
        let snap = t.path().join(SNAPSHOT_DIR);
        std::fs::create_dir(&snap).unwrap();
        std::fs::set_permissions(&snap, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .unwrap();
        let mem = snap.join("memory");
        std::fs::write(&mem, b"guest memory").unwrap();
        std::fs::set_permissions(&mem, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        let uid = nix::unistd::geteuid().as_raw();
        let state = dirs::open_dir(t.path()).unwrap();
        let (captured, d) = snapshot_now(&state, SNAPSHOT_DIR, uid).unwrap();
        open_snapshot_file(&d, &captured.files[0], uid).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        std::fs::write(&mem, b"GUEST memory").unwrap();
        let (now, d) = snapshot_now(&state, SNAPSHOT_DIR, uid).unwrap();
        assert_ne!(now, captured, "an in-place rewrite went unseen");
        open_snapshot_file(&d, &captured.files[0], uid).unwrap_err();
    }
}
