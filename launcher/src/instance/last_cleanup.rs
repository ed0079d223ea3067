//! The last cleanup's record: `RUNTIME/NAME/last-cleanup.json`, root's
//! (0644), written by `vmwarden-cleanup` under the lease once its report is
//! decided, read by `vmwarden metrics`. It says whether the last teardown
//! was clean, how many things it left (its report's `failed`), when it
//! ran, and how many instances cleanup has torn down since the runtime
//! root was made (a boot: `/run` is a tmpfs), which is where the starts
//! counter comes from.
//!
//! It is in the runtime dir's keep set (`host::ownership::RUNTIME_KEEP`)
//! beside the lease file: cleanup, verify-clean and reap's keep set leave
//! it, and reap deletes it with an unconfigured VM's runtime dir. Only root
//! writes it (the runtime dir is root's 0755), replaced atomically (a
//! temporary name, then a rename), so a reader sees the old record or the
//! new one whole.

use serde::{Deserialize, Serialize};

use crate::config::paths::LAST_CLEANUP_FILE;
use crate::host::dirs::{self, Dir, DirError};

/// The record's format version.
pub const VERSION: u32 = 1;

/// A record is a few hundred bytes; anything larger is not one.
const MAX_BYTES: u64 = 4096;

/// The temporary name `dirs::durable_write` writes the record under.
pub const TEMP_NAME: &str = ".last-cleanup.json.tmp";

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct LastCleanup {
    pub version: u32,
    /// The instance the last cleanup tore down (absent when it found no
    /// intent record: a second cleanup of the same stop, say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<String>,
    /// Its report's `clean`.
    pub clean: bool,
    /// Its report's `failed`: what it could not delete or found left.
    pub residue: u64,
    /// When it finished (Unix seconds).
    pub finished_unix: u64,
    /// Distinct instances torn down since the runtime root was made.
    pub instances: u64,
    /// The last of those instances' id, so a second cleanup of the same
    /// instance does not count it twice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counted_instance: Option<String>,
}

impl LastCleanup {
    /// The record after a cleanup of `instance_id` with this verdict,
    /// following `prev` (the record before it, if any).
    pub fn next(
        prev: Option<&LastCleanup>,
        instance_id: Option<&str>,
        clean: bool,
        residue: u64,
        now: u64,
    ) -> LastCleanup {
        let counted = prev.and_then(|p| p.counted_instance.as_deref());
        let new_instance = instance_id.is_some_and(|i| Some(i) != counted);
        LastCleanup {
            version: VERSION,
            instance_id: instance_id.map(str::to_string),
            clean,
            residue,
            finished_unix: now,
            instances: prev.map_or(0, |p| p.instances) + u64::from(new_instance),
            counted_instance: if new_instance {
                instance_id.map(str::to_string)
            } else {
                counted.map(str::to_string)
            },
        }
    }

    /// The record in `rundir`, if there is one that parses.
    pub fn read(rundir: &Dir) -> Option<LastCleanup> {
        let bytes = dirs::read_small(rundir, LAST_CLEANUP_FILE, MAX_BYTES)
            .ok()
            .flatten()?;
        serde_json::from_slice::<LastCleanup>(&bytes)
            .ok()
            .filter(|r| r.version == VERSION)
    }

    /// Replace the record in `rundir` (root's, 0644), atomically.
    pub fn write(&self, rundir: &Dir) -> Result<(), DirError> {
        let mut bytes = serde_json::to_vec(self).unwrap_or_default();
        bytes.push(b'\n');
        dirs::durable_write(rundir, LAST_CLEANUP_FILE, &bytes, 0o644)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_instance_is_counted_once() {
        let a = LastCleanup::next(None, Some("a"), true, 0, 10);
        assert_eq!((a.instances, a.clean), (1, true));
        // A second cleanup of the same stop finds no record, or the same id.
        let again = LastCleanup::next(Some(&a), None, true, 0, 11);
        assert_eq!(again.instances, 1);
        let same = LastCleanup::next(Some(&again), Some("a"), false, 2, 12);
        assert_eq!((same.instances, same.residue, same.clean), (1, 2, false));
        let b = LastCleanup::next(Some(&same), Some("b"), true, 0, 13);
        assert_eq!(b.instances, 2);
        assert_eq!(b.counted_instance.as_deref(), Some("b"));
    }

    #[test]
    fn the_record_is_written_and_read_back_and_nothing_else_is_taken() {
        let t = tempfile::tempdir().unwrap();
        let d = dirs::open_dir(t.path()).unwrap();
        assert_eq!(LastCleanup::read(&d), None);
        let r = LastCleanup::next(None, Some("x"), true, 0, 5);
        r.write(&d).unwrap();
        assert_eq!(LastCleanup::read(&d), Some(r));
        assert!(!t.path().join(TEMP_NAME).exists());
        std::fs::write(t.path().join(LAST_CLEANUP_FILE), b"{\"version\":1}").unwrap();
        assert_eq!(LastCleanup::read(&d), None);
    }
}
