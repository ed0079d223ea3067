//! The principal registry: `STATE_ROOT/.principals/uid-<UID>.json` (root
//! 0700 directory, 0600 records) maps a uid to the VM it belongs to and a
//! generation. Retiring a principal leaves a tombstone, so a uid is never
//! silently handed to another VM while the old VM's files still exist.
//!
//! The same directory records each VM's own id range,
//! `range-<BASE>.json`: the host ids that files a guest owns on a writable
//! virtiofs share belong to (guest id `g` is host id `BASE + g`; guest 0
//! is the principal). A range is allocated (recorded durably, under an
//! exclusive lock of the directory) before any file can carry its ids, is
//! the VM's until `purge` retires it, and a retired range is never handed
//! out again: files with its ids may outlive the purge wherever a share
//! lay outside the state dir.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::config::names::VmName;
use crate::config::paths::{Roots, PRINCIPALS_DIR};
use crate::host::dirs::{self, Dir, DirError, Loose, Want};
use crate::host::leftovers;
use crate::host::procs::{processes_of_uid, Scan, Snapshot};
use crate::host::sys::IoError;
use crate::identity::accounts::Accounts;
use crate::identity::principal::{self, Principal, PrincipalError, Problem};

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
    /// No id range of the pool is free.
    #[error("{path}: refused: no id range is free for VM {vm:?} in {first}..{end} ({RANGE_SIZE} ids each; retired ranges are never handed out again); purge VMs that are gone or move their shares' ownership to a volume")]
    RangesExhausted {
        path: PathBuf,
        vm: String,
        first: u32,
        end: u32,
    },
    /// The registry's lock could not be taken.
    #[error("{path}: flock: {errno}")]
    Lock {
        path: PathBuf,
        errno: nix::errno::Errno,
    },
}

impl RegistryError {
    /// A record or a principal refused (`EX_CONFIG`).
    pub fn is_refusal(&self) -> bool {
        match self {
            RegistryError::Dir(e) => e.is_refusal(),
            RegistryError::Io(_) => false,
            RegistryError::Lock { .. } => false,
            RegistryError::Parse { .. }
            | RegistryError::Serialise { .. }
            | RegistryError::TombstoneMismatch { .. }
            | RegistryError::Principal(_)
            | RegistryError::RangesExhausted { .. } => true,
        }
    }
}

type Result<T, E = RegistryError> = std::result::Result<T, E>;

const MAX_RECORD: u64 = 16 * 1024;

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum State {
    Active,
    Retired,
}

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

/// Every record in the registry (unparsable ones are reported as errors).
pub fn all(roots: &Roots) -> Result<Vec<Record>> {
    let Some(dir) = open_registry(roots)? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
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
        if let Some(r) = lookup(roots, uid)? {
            out.push(r);
        }
    }
    out.sort_by_key(|r| r.uid);
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

// ------------------------------------------------------------- id ranges

/// Ids in a VM's own range: guest ids 0 to 65535, the ids a NixOS or
/// Debian guest gives its users and groups (its `nobody`, 65534, included).
pub const RANGE_SIZE: u32 = 65_536;
/// The pool the ranges come from: 1879048192 (0x70000000) up to, not
/// including, 2147352576 (0x7FFE0000): 4094 ranges. systemd's
/// UIDS-GIDS.md leaves these ids unused (above its container ranges,
/// below its foreign-image range and the signed 2^31 - 1).
pub const POOL_FIRST: u32 = 0x7000_0000;
pub const POOL_END: u32 = 0x7FFE_0000;

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
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RangeRecord {
    pub base: u32,
    pub count: u32,
    pub vm: VmName,
    pub state: State,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retired_unix: Option<u64>,
}

impl RangeRecord {
    pub fn range(&self) -> IdRange {
        IdRange {
            base: self.base,
            count: self.count,
        }
    }
}

fn range_name(base: u32) -> String {
    format!("range-{base}.json")
}

/// Every range record in the registry directory `dir`.
fn ranges_in(dir: &Dir) -> Result<Vec<RangeRecord>> {
    let rd = std::fs::read_dir(&dir.path).map_err(|source| IoError {
        op: "read_dir",
        path: dir.path.clone(),
        source,
    })?;
    let mut out = Vec::new();
    for e in rd.flatten() {
        let n = e.file_name();
        let Some(base) = n
            .to_str()
            .and_then(|s| s.strip_prefix("range-"))
            .and_then(|s| s.strip_suffix(".json"))
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let name = range_name(base);
        let Some(bytes) = dirs::read_small(dir, &name, MAX_RECORD)? else {
            continue;
        };
        let rec: RangeRecord =
            serde_json::from_slice(&bytes).map_err(|source| RegistryError::Parse {
                path: dir.path.join(&name),
                source,
            })?;
        out.push(rec);
    }
    out.sort_by_key(|r| r.base);
    Ok(out)
}

/// Every range record (active and retired).
pub fn ranges(roots: &Roots) -> Result<Vec<RangeRecord>> {
    match open_registry(roots)? {
        Some(dir) => ranges_in(&dir),
        None => Ok(Vec::new()),
    }
}

/// The active range of VM `name`, if it has one.
pub fn range_of(roots: &Roots, name: &VmName) -> Result<Option<IdRange>> {
    Ok(ranges(roots)?
        .into_iter()
        .find(|r| &r.vm == name && r.state == State::Active)
        .map(|r| r.range()))
}

fn write_range(dir: &Dir, rec: &RangeRecord) -> Result<()> {
    let name = range_name(rec.base);
    let mut bytes = serde_json::to_vec_pretty(rec).map_err(|source| RegistryError::Serialise {
        path: dir.path.join(&name),
        source,
    })?;
    bytes.push(b'\n');
    Ok(dirs::durable_write(dir, &name, &bytes, 0o600)?)
}

/// The registry directory, locked exclusively until the returned guard
/// is dropped (two launches allocating at once take turns).
fn lock(dir: &Dir) -> Result<nix::fcntl::Flock<std::os::fd::OwnedFd>> {
    let fd = dir.fd.try_clone().map_err(|source| IoError {
        op: "dup",
        path: dir.path.clone(),
        source,
    })?;
    nix::fcntl::Flock::lock(fd, nix::fcntl::FlockArg::LockExclusive).map_err(|(_, errno)| {
        RegistryError::Lock {
            path: dir.path.clone(),
            errno,
        }
    })
}

/// Where VM `name` of the state root `state_root` starts looking in the
/// pool: a hash of both (FNV-1a), so the VMs of two state roots on one
/// host (test runs, a demo) seldom meet, and one VM always starts at the
/// same place.
fn first_index(state_root: &std::path::Path, name: &VmName) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let bytes = state_root.as_os_str().as_encoded_bytes();
    for b in bytes.iter().chain(&[0u8]).chain(name.as_str().as_bytes()) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let n = u64::from((POOL_END - POOL_FIRST) / RANGE_SIZE);
    u32::try_from(h % n).unwrap_or(0)
}

/// Ranges (`start..end`) of `/etc/subuid` or `/etc/subgid`.
fn subordinate_ranges(path: &str) -> Vec<(u64, u64)> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.trim().split(':').collect();
            let start: u64 = f.get(1)?.parse().ok()?;
            let count: u64 = f.get(2)?.parse().ok()?;
            Some((start, start + count))
        })
        .collect()
}

/// Why range `r` cannot be handed out, if it cannot: an account, a
/// subordinate range, a configured principal or a running process has an
/// id in it.
fn taken(
    r: IdRange,
    acc: &Accounts,
    sub: &[(u64, u64)],
    principals: &[(u32, u32)],
    scan: &Scan,
) -> Option<String> {
    let inside = |id: u32| id >= r.base && id < r.end();
    if let Some(u) = acc.users.iter().find(|u| inside(u.uid)) {
        return Some(format!("user {} has uid {}", u.name, u.uid));
    }
    if let Some(g) = acc.groups.iter().find(|g| inside(g.gid)) {
        return Some(format!("group {} has gid {}", g.name, g.gid));
    }
    let (lo, hi) = (u64::from(r.base), u64::from(r.end()));
    if sub.iter().any(|(s, e)| *s < hi && lo < *e) {
        return Some("a subordinate id range (/etc/subuid, /etc/subgid) overlaps".into());
    }
    if principals.iter().any(|(u, g)| inside(*u) || inside(*g)) {
        return Some("a VM's principal is in it".into());
    }
    let running = scan.in_range(r.base, r.end());
    if !running.is_empty() {
        return Some(format!("processes run with its uids: {running:?}"));
    }
    None
}

/// The id range of VM `name`: its active one, or a new one recorded now
/// (before anything can carry its ids). Under the registry's lock: no
/// record of any state claims a new range, and no account, subordinate
/// range, configured principal (`p` among them) or running process has an
/// id in it.
pub fn allocate_range(
    state_root: &Dir,
    roots: &Roots,
    name: &VmName,
    p: &Principal,
) -> Result<IdRange> {
    let (dir, _) = dirs::ensure(state_root, PRINCIPALS_DIR, &registry_want())?;
    let _lock = lock(&dir)?;
    let recs = ranges_in(&dir)?;
    if let Some(r) = recs
        .iter()
        .find(|r| &r.vm == name && r.state == State::Active)
    {
        return Ok(r.range());
    }
    let acc = Accounts::load();
    let mut sub = subordinate_ranges("/etc/subuid");
    sub.extend(subordinate_ranges("/etc/subgid"));
    let mut principals = vec![(p.uid, p.gid)];
    for (_, _, spec) in principal::configured_specs_except(roots, Some(name)) {
        if let Some(ids) = spec.and_then(|s| principal::resolve_ids_with(&s, &acc).ok()) {
            principals.push((ids.0, ids.1));
        }
    }
    let snap = Snapshot::take();
    let n = (POOL_END - POOL_FIRST) / RANGE_SIZE;
    let start = first_index(&roots.state_root, name);
    for i in 0..n {
        let base = POOL_FIRST + ((start + i) % n) * RANGE_SIZE;
        let r = IdRange {
            base,
            count: RANGE_SIZE,
        };
        if recs.iter().any(|x| x.base == base) {
            continue;
        }
        if let Some(why) = taken(r, &acc, &sub, &principals, snap.scan()) {
            tracing::debug!(base, %why, "id range skipped");
            continue;
        }
        let rec = RangeRecord {
            base,
            count: RANGE_SIZE,
            vm: name.clone(),
            state: State::Active,
            retired_unix: None,
        };
        write_range(&dir, &rec)?;
        tracing::info!(vm = %name, base, count = RANGE_SIZE, "id range allocated");
        return Ok(r);
    }
    Err(RegistryError::RangesExhausted {
        path: dir.path.clone(),
        vm: name.to_string(),
        first: POOL_FIRST,
        end: POOL_END,
    })
}

/// Retire every active range of VM `name` (purge): each record becomes a
/// tombstone, written durably and read back. Fails closed, as [`retire`].
pub fn retire_ranges(roots: &Roots, name: &VmName) -> Result<Vec<RangeRecord>> {
    let state_root = dirs::open_dir(&roots.state_root)?;
    let (dir, _) = dirs::ensure(&state_root, PRINCIPALS_DIR, &registry_want())?;
    let _lock = lock(&dir)?;
    let mut out = Vec::new();
    for rec in ranges_in(&dir)?
        .into_iter()
        .filter(|r| &r.vm == name && r.state == State::Active)
    {
        let tomb = RangeRecord {
            state: State::Retired,
            retired_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .ok()
                .map(|d| d.as_secs()),
            ..rec
        };
        write_range(&dir, &tomb)?;
        let back = dirs::read_small(&dir, &range_name(tomb.base), MAX_RECORD)?
            .and_then(|b| serde_json::from_slice::<RangeRecord>(&b).ok());
        if back.as_ref() != Some(&tomb) {
            return Err(RegistryError::TombstoneMismatch {
                path: dir.path.join(range_name(tomb.base)),
                found: None,
            });
        }
        out.push(tomb);
    }
    Ok(out)
}

#[cfg(test)]
mod range_tests {
    use super::*;

    #[test]
    fn a_range_maps_guest_root_to_the_principal_and_the_rest_to_itself() {
        let r = IdRange {
            base: POOL_FIRST,
            count: RANGE_SIZE,
        };
        assert_eq!(
            r.id_map(61021),
            format!("0 61021 1\n1 {} 65535\n", POOL_FIRST + 1)
        );
        assert!(!r.contains(POOL_FIRST));
        assert!(r.contains(POOL_FIRST + 1) && r.contains(POOL_FIRST + 65_535));
        assert!(!r.contains(POOL_FIRST + 65_536) && !r.contains(0));
        assert_eq!((POOL_END - POOL_FIRST) % RANGE_SIZE, 0);
        // The pool stays below the signed 2^31 - 1 that tools mistake for -1.
        const { assert!(POOL_END <= 0x7FFF_FFFF) };
    }

    #[test]
    fn where_a_vm_starts_in_the_pool_depends_on_its_root_and_name() {
        let a = VmName::parse("web").unwrap();
        let b = VmName::parse("db").unwrap();
        let root = std::path::Path::new("/var/lib/vmwarden");
        let n = (POOL_END - POOL_FIRST) / RANGE_SIZE;
        assert!(first_index(root, &a) < n);
        assert_eq!(first_index(root, &a), first_index(root, &a));
        assert_ne!(first_index(root, &a), first_index(root, &b));
        assert_ne!(
            first_index(root, &a),
            first_index(std::path::Path::new("/srv/vmwarden"), &a)
        );
    }
}
