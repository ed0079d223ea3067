//! `vmwarden status`: what an operator reads at a glance.
//!
//! Three pieces, kept apart so each can change alone:
//! * the record ([`VmStatus`]): plain data, the `--json` schema
//!   (docs/operating.md documents every field; it only grows);
//! * [`gather`]: deciding, from the host, what each record says: it asks
//!   `control::status` (the one liveness probe) and reads the intent
//!   record, the launched spec copy, the configured spec and the principal
//!   registry; with `--all`, also what `reap` and `purge` would do;
//! * [`render`]: pure functions from records to the table and to JSON,
//!   unit-tested with fixed records.

pub mod gather;
pub mod metrics;
pub mod render;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::config::rawpath;
use crate::config::spec::HypervisorKind;
use crate::identity::ranges::IdRange;

/// The STATE column: the instance's liveness, and `retired` for a VM
/// with no instance whose principal `purge` retired.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum State {
    /// The liveness probe says live (its lease is held, or its control
    /// socket answers).
    Running,
    /// Dead: nothing of an instance runs.
    Stopped,
    /// The probe cannot tell (an unreadable record, a process of the VM's
    /// uid without the lease, …): the teardown tools keep everything.
    Ambiguous,
    /// Dead, and the principal's registration is a tombstone (`purge`).
    Retired,
    /// Dead, with a complete hibernation snapshot the next start restores
    /// (`vmwarden hibernate`; [`VmStatus::hibernated`] has its size and age).
    Hibernated,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Running => "running",
            State::Stopped => "stopped",
            State::Ambiguous => "ambiguous",
            State::Retired => "retired",
            State::Hibernated => "hibernated",
        }
    }
}

/// The SPEC column: the configured spec against the one the instance runs.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum SpecState {
    /// Running from exactly the configured spec's bytes.
    Current,
    /// Running, but the configured spec changed since the launch: a
    /// restart applies it.
    Outdated,
    /// Running, and no spec is configured any more.
    Removed,
    /// Running, but its record names no launched copy (an instance started
    /// by an older vmwarden) or the copy cannot be read: cannot tell.
    Unknown,
    /// Not running; a spec is configured (the next start uses it).
    Configured,
    /// The configured spec cannot be read or parsed: a start would fail.
    Invalid,
    /// Not running, and no spec is configured.
    None,
}

impl SpecState {
    pub fn as_str(self) -> &'static str {
        match self {
            SpecState::Current => "current",
            SpecState::Outdated => "outdated",
            SpecState::Removed => "removed",
            SpecState::Unknown => "unknown",
            SpecState::Configured => "configured",
            SpecState::Invalid => "invalid",
            SpecState::None => "none",
        }
    }
}

/// The principal's registration in the registry (`identity::registry`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Registration {
    Active,
    Retired,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PrincipalInfo {
    pub uid: u32,
    pub gid: Option<u32>,
    /// The user name, when the spec names one or NSS knows the uid.
    pub user: Option<String>,
    /// This VM's registration of the uid; `null` when the registry has
    /// none for this VM (never launched, or the uid now belongs to another).
    pub registration: Option<Registration>,
}

/// The state dir of a VM, counted (never read further).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct StateDirInfo {
    #[serde(serialize_with = "rawpath::path")]
    pub path: PathBuf,
    pub entries: usize,
}

/// One thing `vmwarden reap` (a dry run) would do about this VM.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ReapItem {
    /// `delete` (or, for a process, kill) with `--apply`; `keep` otherwise.
    pub action: String,
    /// reap's kind: `runtime-dir`, `unconfigured-runtime-dir`,
    /// `credential-mount`, `tap`, `process`.
    pub kind: String,
    #[serde(serialize_with = "rawpath::path")]
    pub path: PathBuf,
    pub reason: String,
}

/// What `vmwarden purge NAME` would do (its plan), or why it would refuse.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PurgeInfo {
    pub command: String,
    /// Entries of the state dir it would delete (the dir itself stays).
    /// A name the VM made that is not UTF-8 is an object with its bytes
    /// (`config::rawpath`), as in every report.
    #[serde(serialize_with = "rawpath::paths")]
    pub delete: Vec<PathBuf>,
    /// The uid it would retire (tombstone), when one is known.
    pub retire_uid: Option<u32>,
    /// The VM's own id range it would retire (`identity::ranges`), when it
    /// holds one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retire_range: Option<IdRange>,
    /// Why purge would refuse (the VM might be running, no state dir).
    pub refused: Option<String>,
    /// Share sources outside the state dir and what purge does with each:
    /// `delete` one vmwarden made, `keep` any other, with why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub share_sources: Vec<ShareSourceFate>,
}

/// A share source in purge's plan ([`PurgeInfo::share_sources`]).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ShareSourceFate {
    #[serde(serialize_with = "rawpath::path")]
    pub path: PathBuf,
    /// `delete` or `keep`.
    pub action: String,
    pub reason: String,
}

/// With `--all`: what the VM left behind, and what reap and purge would do.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Leftovers {
    pub state_dir: Option<StateDirInfo>,
    pub reap: Vec<ReapItem>,
    pub purge: PurgeInfo,
}

/// One VM, as `status` shows it. Field order is the JSON's.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct VmStatus {
    pub name: String,
    pub state: State,
    /// The liveness probe's verdict with its reason.
    pub liveness: String,
    /// The hypervisor's pid while running or ambiguous.
    pub pid: Option<u32>,
    pub principal: Option<PrincipalInfo>,
    /// When the running instance was launched (Unix seconds).
    pub started_unix: Option<u64>,
    pub uptime_seconds: Option<u64>,
    pub spec: SpecState,
    /// `CONFIG_DIR/NAME.json`, whether or not it exists.
    #[serde(serialize_with = "rawpath::path")]
    pub spec_path: PathBuf,
    pub configured: bool,
    /// The copy of the spec the instance was launched from, while its
    /// record names one.
    pub launched_spec: Option<PathBuf>,
    pub hypervisor: Option<HypervisorKind>,
    /// The control socket's answer while running: QMP `query-status`, or
    /// the cloud-hypervisor/firecracker API's state.
    pub control: Option<String>,
    /// The balloon's current size in MiB (memory taken from the guest, as
    /// the guest acknowledged it), while running with a balloon.
    pub balloon_mib: Option<u64>,
    pub instance_id: Option<String>,
    /// Only with `--all`.
    pub leftovers: Option<Leftovers>,
    /// The complete hibernation snapshot, from root's record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hibernated: Option<HibernatedInfo>,
}

/// A VM's hibernation snapshot as `status` shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct HibernatedInfo {
    pub bytes: u64,
    pub created_unix: u64,
    pub age_seconds: u64,
}
