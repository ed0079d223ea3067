//! The principal registry: `STATE_ROOT/.principals/uid-<UID>.json` (root
//! 0700 directory, 0600 records) maps a uid to the VM it belongs to and a
//! generation. Retiring a principal leaves a tombstone, so a uid is never
//! silently handed to another VM while the old VM's files still exist.
//!
//! Each VM's own id range is recorded once per host, whatever its state
//! root: [`crate::identity::ranges`].

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::config::names::VmName;
use crate::config::paths::{Roots, PRINCIPALS_DIR};
use crate::host::dirs::{self, Dir, DirError, Loose, Want};
use crate::host::leftovers;
use crate::host::procs::processes_of_uid;
use crate::host::sys::IoError;
use crate::identity::principal::{Principal, PrincipalError, Problem};
use crate::identity::ranges;
pub use crate::identity::ranges::{IdRange, RangeError, RangeRecord, State};

/// A registry that cannot be read or written, or a launch it refuses.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error(transparent)]
    Dir(#[from] DirError),
    #[error(transparent)]
    Io(#[from] IoError),
    #[error(
        "{path}: refused: principal record cannot be parsed ({source}); fix or remove it by hand"
    )]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: refused: cannot serialise the principal record: {source}")]
    Serialise {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: refused: tombstone did not read back as written (found {found:?})")]
    TombstoneMismatch {
        path: PathBuf,
        found: Option<Record>,
    },
    /// The uid still belongs to another VM's residue.
    #[error(transparent)]
    Principal(#[from] PrincipalError),
    /// The VM's own id range (`identity::ranges`).
    #[error(transparent)]
    Range(#[from] RangeError),
}

impl RegistryError {
    /// A record or a principal refused (`EX_CONFIG`).
    pub fn is_refusal(&self) -> bool {
        match self {
            RegistryError::Dir(e) => e.is_refusal(),
            RegistryError::Io(_) => false,
            RegistryError::Parse { .. }
            | RegistryError::Serialise { .. }
            | RegistryError::TombstoneMismatch { .. }
            | RegistryError::Principal(_) => true,
            RegistryError::Range(e) => e.is_refusal(),
        }
    }
}

type Result<T, E = RegistryError> = std::result::Result<T, E>;

const MAX_RECORD: u64 = 16 * 1024;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Record {
    pub uid: u32,
    pub vm: VmName,
    pub generation: u64,
    pub state: State,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retired_unix: Option<u64>,
}

fn record_name(uid: u32) -> String {
    format!("uid-{uid}.json")
}

fn registry_want() -> Want {
    Want {
        uid: 0,
        gid: 0,
        mode: 0o700,
        loose: Loose::Tighten,
    }
}

fn open_registry(roots: &Roots) -> Result<Option<Dir>> {
    let state_root = match dirs::open_dir(&roots.state_root) {
        Ok(d) => d,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    Ok(dirs::open_existing(&state_root, PRINCIPALS_DIR)?)
}

/// The record for `uid`, if any.
pub fn lookup(roots: &Roots, uid: u32) -> Result<Option<Record>> {
    let Some(dir) = open_registry(roots)? else {
        return Ok(None);
    };
    lookup_in(&dir, uid)
}

/// The record for `uid` in the registry directory `dir`, if any.
fn lookup_in(dir: &Dir, uid: u32) -> Result<Option<Record>> {
    let name = record_name(uid);
    let Some(bytes) = dirs::read_small(dir, &name, MAX_RECORD)? else {
        return Ok(None);
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|source| RegistryError::Parse {
            path: dir.path.join(name),
            source,
        })
}

/// The registry as read: every record that could be read, and each one
/// that could not, with why (one bad record hides no other).
#[derive(Debug, Default)]
pub struct Listing {
    pub records: Vec<Record>,
    pub unreadable: Vec<RegistryError>,
}

/// Every record in the registry. A registry that cannot be opened or listed
/// is an error; a record that cannot be read or parsed is listed in
/// [`Listing::unreadable`] and the others are still returned.
pub fn all(roots: &Roots) -> Result<Listing> {
    let Some(dir) = open_registry(roots)? else {
        return Ok(Listing::default());
    };
    let mut out = Listing::default();
    let rd = std::fs::read_dir(&dir.path).map_err(|source| IoError {
        op: "read_dir",
        path: dir.path.clone(),
        source,
    })?;
    for e in rd.flatten() {
        let n = e.file_name();
        let Some(uid) = n
            .to_str()
            .and_then(|s| s.strip_prefix("uid-"))
            .and_then(|s| s.strip_suffix(".json"))
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        // Through the directory already open: one open per record, not
        // the state root, the registry and the record again each time.
        match lookup_in(&dir, uid) {
            Ok(Some(r)) => out.records.push(r),
            Ok(None) => {}
            Err(e) => out.unreadable.push(e),
        }
    }
    out.records.sort_by_key(|r| r.uid);
    Ok(out)
}

/// What still exists of VM `vm` (its state dir's entries, processes of
/// `uid`): a non-empty answer means the uid cannot move to another VM.
pub fn residue(roots: &Roots, vm: &VmName, uid: u32) -> Vec<String> {
    let mut out = Vec::new();
    let sd = roots.state_dir(vm);
    if let Ok(rd) = std::fs::read_dir(&sd) {
        let n = rd.count();
        if n > 0 {
            out.push(format!("{} ({n} entries)", sd.display()));
        }
    }
    let pids = processes_of_uid(uid);
    if !pids.is_empty() {
        out.push(format!("processes {pids:?} running as uid {uid}"));
    }
    // Outside any directory: kernel keys and host IPC objects of the uid
    // outlive its processes and would be the next owner's to read.
    if let Some(n) = leftovers::stashed_keys(uid) {
        out.push(format!(
            "{n} kernel keys owned by uid {uid} (/proc/key-users; clear its keyrings as that uid, e.g. `keyctl clear @u`)"
        ));
    }
    let ipc = leftovers::sysv_objects_of_uid(uid);
    if !ipc.is_empty() {
        out.push(format!(
            "SysV IPC objects of uid {uid}: {ipc:?} (ipcrm them)"
        ));
    }
    out
}

/// Refuse a launch whose uid belonged to a different VM that left residue.
/// `state_root`: the state root, opened by the caller (`None`: it does not
/// exist yet, so neither does a registry).
pub fn check_launch(
    roots: &Roots,
    state_root: Option<&Dir>,
    name: &VmName,
    p: &Principal,
) -> Result<()> {
    let Some(registry) = state_root
        .map(|d| dirs::open_existing(d, PRINCIPALS_DIR))
        .transpose()?
        .flatten()
    else {
        return Ok(());
    };
    let Some(rec) = lookup_in(&registry, p.uid)? else {
        return Ok(());
    };
    if &rec.vm == name {
        return Ok(());
    }
    let left = residue(roots, &rec.vm, p.uid);
    if left.is_empty() {
        return Ok(());
    }
    let was = match rec.state {
        State::Retired => "was retired with",
        State::Active => "belongs to",
    };
    Err(PrincipalError {
        principal: p.display(),
        problem: Box::new(Problem::Residue {
            uid: p.uid,
            was,
            vm: rec.vm.to_string(),
            generation: rec.generation,
            residue: left,
            name: name.to_string(),
        }),
    }
    .into())
}

/// Record that `uid` belongs to `name` (a new generation when it belonged to
/// another VM or was retired). The record is read again here, under the
/// lease: it may have changed since [`check_launch`] (a purge retiring it).
pub fn register(state_root: &Dir, name: &VmName, p: &Principal) -> Result<()> {
    let (dir, _) = dirs::ensure(state_root, PRINCIPALS_DIR, &registry_want())?;
    let prev = lookup_in(&dir, p.uid)?;
    let generation = match &prev {
        Some(r) if &r.vm == name && r.state == State::Active => return Ok(()),
        Some(r) => r.generation + 1,
        None => 1,
    };
    write(
        &dir,
        &Record {
            uid: p.uid,
            vm: name.clone(),
            generation,
            state: State::Active,
            retired_unix: None,
        },
    )
}

fn write(dir: &Dir, rec: &Record) -> Result<()> {
    let mut bytes = serde_json::to_vec_pretty(rec).map_err(|source| RegistryError::Serialise {
        path: dir.path.join(record_name(rec.uid)),
        source,
    })?;
    bytes.push(b'\n');
    Ok(dirs::durable_write(
        dir,
        &record_name(rec.uid),
        &bytes,
        0o600,
    )?)
}

/// Turn the registration of `uid` into a tombstone. Fails closed: an error
/// writing the tombstone is an error of the whole retirement.
pub fn retire(roots: &Roots, name: &VmName, uid: u32) -> Result<Record> {
    let state_root = dirs::open_dir(&roots.state_root)?;
    let (dir, _) = dirs::ensure(&state_root, PRINCIPALS_DIR, &registry_want())?;
    let prev = lookup(roots, uid)?;
    let generation = prev.as_ref().map(|r| r.generation).unwrap_or(1);
    let rec = Record {
        uid,
        vm: name.clone(),
        generation,
        state: State::Retired,
        retired_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .ok()
            .map(|d| d.as_secs()),
    };
    write(&dir, &rec)?;
    match lookup(roots, uid)? {
        Some(r) if r == rec => Ok(rec),
        found => Err(RegistryError::TombstoneMismatch {
            path: dir.path.join(record_name(uid)),
            found,
        }),
    }
}

/// The active id range of VM `name` (`identity::ranges::range_of`).
pub fn range_of(roots: &Roots, name: &VmName) -> Result<Option<IdRange>> {
    Ok(ranges::range_of(roots, name)?)
}
