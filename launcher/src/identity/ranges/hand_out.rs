//! Handing ranges out and taking them back, under the host-wide lock:
//! [`allocate`], [`check_again`], [`retire`], and what the tools read
//! ([`range_of`], [`book`]).

use std::path::{Path, PathBuf};

use super::book::{legacy_dir, read_all};
use super::{
    range_name, ranges_dir, Book, IdRange, RangeError, RangeRecord, State, MAX_RECORD, POOL_FIRST,
    POOL_RANGES, RANGE_SIZE,
};
use crate::config::names::VmName;
use crate::config::paths::Roots;
use crate::host::dirs::{self, Dir, Loose, Want};
use crate::host::locks;
use crate::host::procs::Snapshot;
use crate::host::sys::IoError;
use crate::identity::host_ids::HostIds;
use crate::identity::principal::Principal;

fn want() -> Want {
    Want {
        uid: 0,
        gid: 0,
        mode: 0o700,
        loose: Loose::Tighten,
    }
}

/// The host-wide directory if it exists (readers never create it), root's
/// as the writers require ([`open_host_locked`]): one another user owns
/// could hold any record, and is refused here too, never read.
fn open_host() -> Result<Option<Dir>, RangeError> {
    let dir = dirs::open_dir_if_exists(ranges_dir())?;
    if let Some(d) = &dir {
        dirs::check_dir(d, &want())?;
    }
    Ok(dir)
}

/// How long a launch or purge waits for the host-wide lock
/// ([`open_host_locked`]). It is held for the book alone: the records read
/// (twice when old ones are moved; a few KiB each, one per VM), and at
/// most one record written durably and read back, or a purge's few
/// tombstones; what holds host ids is read before it, and a launch whose
/// record already names its shares does not take it. Measured held 1.4
/// to 9.4 ms per launch (`strace -f` of `id_ranges.rs`' launches, the
/// bench's table says 49.8 ms under strace on a loaded host), so 50
/// launches of new VMs at once queue for well under a few seconds; 30 s
/// is the bound past which a holder is stuck, and named in the error.
pub const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// The host-wide directory, made if missing (root's 0700, in a root-owned
/// parent no one else may write), locked exclusively until the guard goes,
/// waiting for another holder at most [`LOCK_WAIT`]
/// (`host::locks::lock_dir`: the directory itself is the lock, checked
/// root's with no group or other bits).
fn open_host_locked() -> Result<(Dir, nix::fcntl::Flock<std::os::fd::OwnedFd>), RangeError> {
    open_locked_at(ranges_dir(), LOCK_WAIT)
}

/// [`open_host_locked`] of the directory `path`, waiting at most `wait`
/// (tests: another directory, a shorter wait).
pub(crate) fn open_locked_at(
    path: &Path,
    wait: std::time::Duration,
) -> Result<(Dir, nix::fcntl::Flock<std::os::fd::OwnedFd>), RangeError> {
    let parent = path.parent().ok_or_else(|| IoError {
        op: "parent",
        path: path.to_path_buf(),
        source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
    })?;
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| IoError {
            op: "file name",
            path: path.to_path_buf(),
            source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
        })?;
    let parent = dirs::ensure_root(parent, None, &dirs::root_want("the ranges directory"))?;
    let (dir, _) = dirs::ensure(&parent, name, &want())?;
    let lock = locks::lock_dir(&dir, wait)?;
    Ok((dir, lock))
}

/// Every record, validated (the host's, and the old ones of `roots`).
pub fn book(roots: &Roots) -> Result<Book, RangeError> {
    read_all(open_host()?.as_ref(), Some(roots))
}

/// The active range of VM `name`. A bad record that names this VM makes
/// its range ambiguous: refused, naming the record.
pub fn range_of(roots: &Roots, name: &VmName) -> Result<Option<IdRange>, RangeError> {
    let b = book(roots)?;
    for bad in &b.bad {
        tracing::warn!(vm = %name, "{bad}");
    }
    if let Some(bad) = b.bad_of(roots, name).first() {
        return Err(RangeError::BadRecord {
            path: bad.path.clone(),
            vm: name.to_string(),
            why: bad.why.clone(),
        });
    }
    Ok(b.active_of(roots, name).map(RangeRecord::range))
}

fn write(dir: &Dir, rec: &RangeRecord) -> Result<(), RangeError> {
    let name = range_name(rec.base);
    let mut bytes = serde_json::to_vec_pretty(rec).map_err(|source| RangeError::Serialise {
        path: dir.path.join(&name),
        source,
    })?;
    bytes.push(b'\n');
    dirs::durable_write(dir, &name, &bytes, 0o600)?;
    let back = dirs::read_small(dir, &name, MAX_RECORD)?
        .and_then(|b| serde_json::from_slice::<RangeRecord>(&b).ok());
    if back.as_ref() != Some(rec) {
        return Err(RangeError::Mismatch {
            path: dir.path.join(name),
        });
    }
    Ok(())
}

/// Move the old records of `roots`'s state root into the host-wide
/// directory (under its lock): each written here durably, then its old
/// file removed. One that clashes stays where it is (the book reports it).
fn move_legacy(dir: &Dir, roots: &Roots, book: &Book) -> Result<(), RangeError> {
    let Some(old) = legacy_dir(roots)? else {
        return Ok(());
    };
    for (path, rec) in &book.good {
        if !path.starts_with(&old.path) {
            continue;
        }
        let here = book
            .good
            .iter()
            .any(|(p, r)| p.starts_with(&dir.path) && r.base == rec.base);
        if !here {
            write(dir, rec)?;
        }
        let name = range_name(rec.base);
        nix::unistd::unlinkat(
            std::os::fd::AsFd::as_fd(&old.fd),
            name.as_str(),
            nix::unistd::UnlinkatFlags::NoRemoveDir,
        )
        .map_err(|e| IoError {
            op: "unlink",
            path: path.clone(),
            source: e.into(),
        })?;
        tracing::info!(vm = %rec.vm, base = rec.base, from = %path.display(), "id range record moved to the host-wide record");
    }
    Ok(())
}

/// Where VM `name` of the state root `state_root` starts looking in the
/// pool: a hash of both (FNV-1a), so VMs seldom meet, and one VM always
/// starts at the same place.
pub fn first_index(state_root: &Path, name: &VmName) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let bytes = state_root.as_os_str().as_encoded_bytes();
    for b in bytes.iter().chain(&[0u8]).chain(name.as_str().as_bytes()) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    u32::try_from(h % u64::from(POOL_RANGES)).unwrap_or(0)
}

/// Check VM `name`'s existing range `r` again (every launch that uses it):
/// refused, naming what holds one of its ids.
pub fn check_again(
    roots: &Roots,
    name: &VmName,
    p: &Principal,
    r: IdRange,
) -> Result<(), RangeError> {
    let ids = HostIds::gather(roots, name, p);
    let snap = Snapshot::take();
    match ids.taken(r.base, r.end(), snap.scan()) {
        None => Ok(()),
        Some(why) => Err(RangeError::Taken {
            path: ranges_dir().join(range_name(r.base)),
            vm: name.to_string(),
            first: r.base + 1,
            end: r.end(),
            why,
        }),
    }
}

/// VM `name`'s active range, read without the lock, when nothing is left
/// to write: its record is in the host-wide directory, already names every
/// share of this launch, and no record of the state root waits to be
/// moved there or fails to read (those take the locked path, which moves
/// or refuses them by name). A record is replaced atomically, so a reader
/// sees the old or the new one whole; only this VM's launch or purge
/// writes this VM's record, and the launch's lease keeps its purge out.
fn recorded(
    roots: &Roots,
    name: &VmName,
    shares: &[PathBuf],
) -> Result<Option<IdRange>, RangeError> {
    let Some(dir) = open_host()? else {
        return Ok(None);
    };
    let b = read_all(Some(&dir), Some(roots))?;
    if !b.bad.is_empty() || b.good.iter().any(|(p, _)| !p.starts_with(&dir.path)) {
        return Ok(None);
    }
    Ok(b.active_of(roots, name)
        .filter(|rec| shares.iter().all(|s| rec.shares.contains(s)))
        .map(RangeRecord::range))
}

/// How many fresh ranges one launch records before it refuses: each one
/// found taken once recorded (by what came to hold one of its ids while
/// the launch waited on the lock) is withdrawn, and the next one tried.
const ATTEMPTS: usize = 3;

/// The id range of VM `name`: its active one, or one handed out now and
/// recorded before anything can carry its ids. `shares`: the sources of
/// the shares the guest owns at this launch, recorded with the range.
/// Under the host-wide lock; a new range is free ([`HostIds::taken`]),
/// fresh ranges before recycled ones.
pub fn allocate(
    roots: &Roots,
    name: &VmName,
    p: &Principal,
    shares: &[PathBuf],
) -> Result<IdRange, RangeError> {
    if let Some(r) = recorded(roots, name, shares)? {
        return Ok(r);
    }
    // What holds host ids is read before the lock: with many VMs
    // configured it reads every spec, and the lock guards only the book,
    // so launches do not queue behind each other's scans. What came to
    // hold an id meanwhile (while this launch waited on the lock, say) is
    // seen by `check_again`, the read every later launch takes, run once
    // a new range is recorded: that range is withdrawn
    // (nothing carries its ids yet) and another one tried.
    let mut ids = HostIds::gather(roots, name, p);
    let mut snap = Snapshot::take();
    let mut attempt = 1;
    loop {
        let (r, fresh) = hand_out(roots, name, shares, &ids, &snap)?;
        if !fresh {
            return Ok(r);
        }
        let Err(taken) = check_again(roots, name, p, r) else {
            return Ok(r);
        };
        tracing::warn!(vm = %name, base = r.base, "{taken}: withdrawn");
        withdraw(roots, name, r)?;
        if attempt == ATTEMPTS {
            return Err(taken);
        }
        attempt += 1;
        ids = HostIds::gather(roots, name, p);
        snap = Snapshot::take();
    }
}

/// Remove VM `name`'s fresh record of `r` (under the lock): found taken
/// right after it was recorded, before anything carried its ids.
fn withdraw(roots: &Roots, name: &VmName, r: IdRange) -> Result<(), RangeError> {
    let (dir, _lock) = open_host_locked()?;
    let book = read_all(Some(&dir), Some(roots))?;
    let ours = book.good.iter().any(|(path, rec)| {
        path.starts_with(&dir.path)
            && rec.base == r.base
            && rec.is_of(roots, name)
            && rec.state == State::Active
    });
    if !ours {
        return Ok(());
    }
    let file = range_name(r.base);
    nix::unistd::unlinkat(
        std::os::fd::AsFd::as_fd(&dir.fd),
        file.as_str(),
        nix::unistd::UnlinkatFlags::NoRemoveDir,
    )
    .map_err(|e| IoError {
        op: "unlink",
        path: dir.path.join(&file),
        source: e.into(),
    })?;
    Ok(())
}

/// Under the host-wide lock: VM `name`'s active range (its shares added to
/// its record), or a new one free by `ids` and `snap` recorded (`true`).
fn hand_out(
    roots: &Roots,
    name: &VmName,
    shares: &[PathBuf],
    ids: &HostIds,
    snap: &Snapshot,
) -> Result<(IdRange, bool), RangeError> {
    let (dir, _lock) = open_host_locked()?;
    let first = read_all(Some(&dir), Some(roots))?;
    move_legacy(&dir, roots, &first)?;
    let book = read_all(Some(&dir), Some(roots))?;
    for bad in &book.bad {
        tracing::warn!(vm = %name, "{bad}");
    }
    if let Some(bad) = book.bad_of(roots, name).first() {
        return Err(RangeError::BadRecord {
            path: bad.path.clone(),
            vm: name.to_string(),
            why: bad.why.clone(),
        });
    }
    if let Some(rec) = book.active_of(roots, name) {
        let mut rec = rec.clone();
        let before = rec.shares.len();
        for s in shares {
            if !rec.shares.contains(s) {
                rec.shares.push(s.clone());
            }
        }
        if rec.shares.len() != before {
            write(&dir, &rec)?;
        }
        return Ok((rec.range(), false));
    }
    let start = first_index(&roots.state_root, name);
    let mut skipped: Vec<String> = Vec::new();
    for recycle in [false, true] {
        for i in 0..POOL_RANGES {
            let base = POOL_FIRST + ((start + i) % POOL_RANGES) * RANGE_SIZE;
            let r = IdRange {
                base,
                count: RANGE_SIZE,
            };
            let held = book.good.iter().find(|(_, x)| x.range().overlaps(&r));
            match (held, recycle) {
                (None, false) => {}
                (Some((_, x)), true) if x.state == State::Retired && x.recyclable => {}
                _ => continue,
            }
            if book.blocked(&r) {
                continue;
            }
            if let Some(why) = ids.taken(r.base, r.end(), snap.scan()) {
                if skipped.len() < 3 {
                    skipped.push(format!("{}..{}: {why}", r.base + 1, r.end()));
                }
                continue;
            }
            let rec = RangeRecord {
                base,
                count: RANGE_SIZE,
                vm: name.clone(),
                state_root: roots.state_root.clone(),
                state: State::Active,
                retired_unix: None,
                shares: shares.to_vec(),
                legacy: false,
                recyclable: false,
                kept_by: Vec::new(),
            };
            write(&dir, &rec)?;
            tracing::info!(vm = %name, base, count = RANGE_SIZE, recycled = recycle, "id range allocated");
            return Ok((r, true));
        }
    }
    Err(RangeError::Exhausted {
        path: dir.path.clone(),
        vm: name.to_string(),
        what_frees: what_frees(&book, &skipped),
    })
}

/// What would free a range, for the refusal when none is free.
fn what_frees(book: &Book, skipped: &[String]) -> String {
    let mut out = Vec::new();
    let active: Vec<String> = book
        .good
        .iter()
        .filter(|(_, r)| r.state == State::Active)
        .map(|(_, r)| format!("{} of {}", r.vm, r.state_root.display()))
        .collect();
    if !active.is_empty() {
        out.push(format!(
            "{} ranges are held by VMs (e.g. {}): `vmwarden --state-root ROOT purge NAME` of a VM that is gone retires its range, and a range whose shares all lay in its state dir is handed out again",
            active.len(),
            active.iter().take(3).cloned().collect::<Vec<_>>().join(", ")
        ));
    }
    let kept: Vec<String> = book
        .good
        .iter()
        .filter(|(_, r)| r.state == State::Retired && !r.recyclable)
        .map(|(p, r)| {
            if r.legacy {
                format!("{} (recorded before its shares were)", p.display())
            } else {
                format!(
                    "{} (files in {})",
                    p.display(),
                    r.kept_by
                        .iter()
                        .map(|k| k.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
        })
        .collect();
    if !kept.is_empty() {
        out.push(format!(
            "{} retired ranges may still own files outside a state dir (e.g. {}): once no file carries their ids, remove the record",
            kept.len(),
            kept.iter().take(3).cloned().collect::<Vec<_>>().join(", ")
        ));
    }
    if !book.bad.is_empty() {
        out.push(format!(
            "{} records cannot be used (e.g. {}): fix or remove them",
            book.bad.len(),
            book.bad
                .iter()
                .take(3)
                .map(|b| b.path.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if !skipped.is_empty() {
        out.push(format!("ids in use: {}", skipped.join("; ")));
    }
    out.join("; ")
}

/// Retire every active range of VM `name` (purge, once the state dir
/// `state_dir` is verified empty): each record becomes a tombstone, written
/// durably and read back, recyclable when every share it was used on lay
/// in `state_dir`. Fails closed.
pub fn retire(
    roots: &Roots,
    name: &VmName,
    state_dir: &Path,
) -> Result<Vec<RangeRecord>, RangeError> {
    let (dir, _lock) = open_host_locked()?;
    let first = read_all(Some(&dir), Some(roots))?;
    move_legacy(&dir, roots, &first)?;
    let book = read_all(Some(&dir), Some(roots))?;
    let mut out = Vec::new();
    for (_, rec) in book
        .good
        .iter()
        .filter(|(_, r)| r.is_of(roots, name) && r.state == State::Active)
    {
        let kept_by: Vec<PathBuf> = rec
            .shares
            .iter()
            .filter(|s| !s.starts_with(state_dir))
            .cloned()
            .collect();
        let tomb = RangeRecord {
            state: State::Retired,
            retired_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .ok()
                .map(|d| d.as_secs()),
            recyclable: kept_by.is_empty() && !rec.legacy,
            kept_by,
            ..rec.clone()
        };
        write(&dir, &tomb)?;
        out.push(tomb);
    }
    Ok(out)
}
