//! The VMs' own id ranges, one record of them per host:
//! `/var/lib/vmwarden/.ranges/range-<BASE>.json` (root 0700 directory,
//! 0600 records, [`ranges_dir`]), whatever `--state-root` each VM has.
//! A range is the host ids that files a guest owns on a writable virtiofs
//! share belong to (guest id `g` is host id `BASE + g`; guest 0 is the
//! principal). Each record names its VM by state root and name.
//!
//! * Every record is validated as it is read ([`validate`]): in the pool,
//!   of [`RANGE_SIZE`] ids, its file name matching its base, overlapping
//!   no other. A record that fails is reported by its path and its range
//!   stays unusable (ambiguity keeps); every other range still works.
//! * A range is recorded, under an exclusive lock of the directory, before
//!   anything can carry its ids, together with every share source the VM
//!   used it on. The lock covers the book alone: what holds host ids is
//!   read before it (and again once a new range is recorded: one taken
//!   meanwhile is withdrawn, another tried), and a launch whose record
//!   already names its shares reads it without the lock ([`allocate`]), so
//!   launches do not queue.
//! * At every launch that uses the range its ids are checked again against
//!   the accounts (`/etc/passwd`, `/etc/group`, and what NSS enumerates),
//!   `/etc/subuid` and `/etc/subgid`, the other VMs' principals and the
//!   running processes (`identity::host_ids`); an account in it refuses the launch,
//!   named.
//! * `purge` retires a range ([`retire`]). A retired range is handed out
//!   again only when nothing can carry its ids: every share it was used on
//!   lay in the VM's state dir, which purge deleted and verified empty, and
//!   no process runs with one of them. Fresh ranges go first.
//! * Records an older vmwarden kept in `STATE_ROOT/.principals/` are read
//!   too, and moved here under the lock by the next launch or purge of
//!   that state root.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use crate::config::names::VmName;
use crate::config::paths::Roots;
use crate::host::dirs::DirError;
use crate::host::locks::LockError;
use crate::host::sys::IoError;

mod book;
mod hand_out;
#[cfg(test)]
mod tests;

pub use book::{BadRecord, Book};
#[cfg(test)]
pub(crate) use hand_out::open_locked_at;
pub use hand_out::{allocate, book, check_again, first_index, range_of, retire};

/// Whether a record (a principal's, a range's) is in use or a tombstone.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum State {
    Active,
    Retired,
}

/// A range record that cannot be read or written, or a launch it refuses.
#[derive(Debug, thiserror::Error)]
pub enum RangeError {
    #[error(transparent)]
    Dir(#[from] DirError),
    #[error(transparent)]
    Io(#[from] IoError),
    #[error("{path}: refused: cannot serialise the range record: {source}")]
    Serialise {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// The host-wide lock (the directory itself) refused, or held too
    /// long by another launch or purge.
    #[error("the host-wide id range record: {0}")]
    Lock(#[from] LockError),
    /// No id range of the pool is free.
    #[error("{path}: refused: no id range is free for VM {vm:?} in {POOL_FIRST}..{POOL_END} ({RANGE_SIZE} ids each); what would free one: {what_frees}")]
    Exhausted {
        path: PathBuf,
        vm: String,
        what_frees: String,
    },
    /// A range record that names this VM cannot be used.
    #[error("{path}: refused: the id range record of VM {vm:?} cannot be used: {why}; fix or remove it by hand (files the guest owned may carry its ids)")]
    BadRecord {
        path: PathBuf,
        vm: String,
        why: String,
    },
    /// Something else holds an id of the VM's range.
    #[error("{path}: refused: VM {vm:?}'s id range {first}..{end} is no longer its alone: {why}; the guest's files would be that account's. Move the account's ids out of the range, or purge the VM so that it gets another")]
    Taken {
        path: PathBuf,
        vm: String,
        first: u32,
        end: u32,
        why: String,
    },
    #[error("{path}: refused: the range record did not read back as written")]
    Mismatch { path: PathBuf },
}

impl RangeError {
    /// A record or a range refused (`EX_CONFIG`).
    pub fn is_refusal(&self) -> bool {
        match self {
            RangeError::Dir(e) => e.is_refusal(),
            RangeError::Io(_) | RangeError::Lock(_) => false,
            RangeError::Serialise { .. }
            | RangeError::Exhausted { .. }
            | RangeError::BadRecord { .. }
            | RangeError::Taken { .. }
            | RangeError::Mismatch { .. } => true,
        }
    }
}

/// Ids in a VM's own range: guest ids 0 to 65535, the ids a NixOS or
/// Debian guest gives its users and groups (its `nobody`, 65534, included).
pub const RANGE_SIZE: u32 = 65_536;
/// The pool the ranges come from: 1879048192 (0x70000000) up to, not
/// including, 2147352576 (0x7FFE0000): 4094 ranges. systemd's
/// UIDS-GIDS.md leaves these ids unused (above its container ranges,
/// below its foreign-image range and the signed 2^31 - 1).
pub const POOL_FIRST: u32 = 0x7000_0000;
pub const POOL_END: u32 = 0x7FFE_0000;
/// Ranges in the pool.
pub const POOL_RANGES: u32 = (POOL_END - POOL_FIRST) / RANGE_SIZE;

/// The host-wide record of ranges, shared by every state root.
pub const DEFAULT_RANGES_DIR: &str = "/var/lib/vmwarden/.ranges";
/// Builds with the `fault-injection` feature (the test suite) take the
/// directory from this variable, so that test runs keep their ranges
/// apart from the host's; release builds have no way to move it.
pub const TEST_RANGES_DIR_ENV: &str = "VMWARDEN_TEST_RANGES_DIR";

const MAX_RECORD: u64 = 64 * 1024;

static RANGES_DIR: OnceLock<PathBuf> = OnceLock::new();

/// The host-wide ranges directory. The launcher calls this before it
/// clears its environment, which fixes it for the process.
pub fn ranges_dir() -> &'static Path {
    RANGES_DIR.get_or_init(|| {
        #[cfg(feature = "fault-injection")]
        if let Some(p) = std::env::var_os(TEST_RANGES_DIR_ENV) {
            return PathBuf::from(p);
        }
        PathBuf::from(DEFAULT_RANGES_DIR)
    })
}

/// A VM's own id range: host ids `base + 1 ..= base + count - 1` stand for
/// guest ids `1 ..= count - 1`; guest id 0 is the principal (`base` itself
/// is never used).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct IdRange {
    pub base: u32,
    pub count: u32,
}

impl IdRange {
    /// Whether host id `id` is one of this range's.
    pub fn contains(&self, id: u32) -> bool {
        id > self.base && id - self.base < self.count
    }

    /// The first host id past the range.
    pub fn end(&self) -> u32 {
        self.base.saturating_add(self.count)
    }

    /// `/proc/PID/uid_map` (or `gid_map`) of a process whose namespace
    /// root is host id `root`: guest 0 is `root`, guest 1.. are the range.
    pub fn id_map(&self, root: u32) -> String {
        format!("0 {root} 1\n1 {} {}\n", self.base + 1, self.count - 1)
    }

    fn span(&self) -> (u64, u64) {
        (
            u64::from(self.base),
            u64::from(self.base) + u64::from(self.count),
        )
    }

    fn overlaps(&self, other: &IdRange) -> bool {
        let (a, b) = (self.span(), other.span());
        a.0 < b.1 && b.0 < a.1
    }
}

/// One range record of the host-wide directory.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RangeRecord {
    pub base: u32,
    pub count: u32,
    pub vm: VmName,
    /// The state root of the VM (`--state-root`).
    pub state_root: PathBuf,
    pub state: State,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retired_unix: Option<u64>,
    /// Every share source the guest owned with this range (recorded at the
    /// launch, before the share is served).
    #[serde(default)]
    pub shares: Vec<PathBuf>,
    /// Moved from an older vmwarden's per-state-root record: the shares of
    /// its launches before that are unknown, so it is never recycled.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub legacy: bool,
    /// Retired with nothing left that can carry its ids: every share lay
    /// in the state dir purge deleted and verified.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub recyclable: bool,
    /// Retired: the share sources outside the state dir whose files may
    /// still carry its ids (why it is not recyclable).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kept_by: Vec<PathBuf>,
}

impl RangeRecord {
    pub fn range(&self) -> IdRange {
        IdRange {
            base: self.base,
            count: self.count,
        }
    }

    fn is_of(&self, roots: &Roots, name: &VmName) -> bool {
        &self.vm == name && self.state_root == roots.state_root
    }
}

pub fn range_name(base: u32) -> String {
    format!("range-{base}.json")
}

/// The base a record's file name says, if it is a range record's name.
fn base_of_name(name: &str) -> Option<u32> {
    name.strip_prefix("range-")?
        .strip_suffix(".json")?
        .parse()
        .ok()
}

/// Whether `base` starts a range of the pool.
pub fn in_pool(base: u32) -> bool {
    (POOL_FIRST..POOL_END).contains(&base) && (base - POOL_FIRST).is_multiple_of(RANGE_SIZE)
}

/// Check a parsed record against its file name `file`: in the pool, the
/// right size, the name matching the base, an absolute state root.
pub fn validate(file: &str, rec: &RangeRecord) -> Result<(), String> {
    if base_of_name(file) != Some(rec.base) {
        return Err(format!(
            "its base {} is not the one its file name says (a record of base {} is named {})",
            rec.base,
            rec.base,
            range_name(rec.base)
        ));
    }
    if rec.count != RANGE_SIZE {
        return Err(format!(
            "it counts {} ids; every range has {RANGE_SIZE}",
            rec.count
        ));
    }
    if !in_pool(rec.base) {
        return Err(format!(
            "base {} is not a range of the pool {POOL_FIRST}..{POOL_END} (multiples of {RANGE_SIZE} from {POOL_FIRST})",
            rec.base
        ));
    }
    if !rec.state_root.is_absolute() {
        return Err(format!(
            "its state root {} is not absolute",
            rec.state_root.display()
        ));
    }
    Ok(())
}
