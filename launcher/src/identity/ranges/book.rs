//! Reading the ranges' records: each validated, a bad one kept with its
//! path and the ids it may claim, overlapping ones both bad, and the
//! records an older vmwarden kept per state root read beside them.

use std::path::PathBuf;

use serde::Deserialize;

use super::{
    base_of_name, ranges_dir, validate, IdRange, RangeError, RangeRecord, State, MAX_RECORD,
    RANGE_SIZE,
};
use crate::config::names::VmName;
use crate::config::paths::{Roots, PRINCIPALS_DIR};
use crate::host::dirs::{self, Dir};
use crate::host::sys::IoError;

/// The record an older vmwarden wrote in `STATE_ROOT/.principals/`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct LegacyRecord {
    base: u32,
    count: u32,
    vm: VmName,
    state: State,
    #[serde(default)]
    retired_unix: Option<u64>,
}

/// A record that cannot be used: its path, why, the ids it may claim (kept
/// out of every allocation) and whose it may be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRecord {
    pub path: PathBuf,
    pub why: String,
    pub blocks: Vec<IdRange>,
    pub claims: Option<(PathBuf, VmName)>,
}

impl std::fmt::Display for BadRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: range record not used: {}; its ids stay unusable until it is fixed or removed by hand",
            self.path.display(),
            self.why
        )
    }
}

/// What the records say, every record validated.
#[derive(Debug, Clone, Default)]
pub struct Book {
    pub good: Vec<(PathBuf, RangeRecord)>,
    pub bad: Vec<BadRecord>,
}

/// A record as read: its path, and the record or why it cannot be.
/// A record file's bytes, or why they cannot be read.
type Bytes = Result<Vec<u8>, (String, Vec<IdRange>)>;

pub(super) type Read = (PathBuf, Result<RangeRecord, (String, Vec<IdRange>)>);

impl Book {
    /// Validate `entries` together: each alone ([`validate`]), then no two
    /// overlapping (both are then bad: which one holds is ambiguous). An
    /// entry whose record is the same range of the same VM as another's
    /// (a record moved from an older vmwarden while its old file is still
    /// there) is the same record, read once.
    pub(super) fn from_entries(entries: Vec<Read>) -> Book {
        let mut book = Book::default();
        let mut good: Vec<(PathBuf, RangeRecord)> = Vec::new();
        for (path, r) in entries {
            let file = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let checked = r
                .map_err(|e| (e, None))
                .and_then(|rec| match validate(&file, &rec) {
                    Ok(()) => Ok(rec),
                    Err(why) => Err((
                        (
                            format!(
                                "{why} (VM {:?} of {})",
                                rec.vm.as_str(),
                                rec.state_root.display()
                            ),
                            vec![rec.range()],
                        ),
                        Some((rec.state_root.clone(), rec.vm.clone())),
                    )),
                });
            match checked {
                Ok(rec) => good.push((path, rec)),
                Err(((why, mut blocks), claims)) => {
                    if let Some(b) = base_of_name(&file) {
                        blocks.push(IdRange {
                            base: b,
                            count: RANGE_SIZE,
                        });
                    }
                    book.bad.push(BadRecord {
                        path,
                        why,
                        blocks,
                        claims,
                    });
                }
            }
        }
        // The host-wide records first: a moved record's old file repeats it.
        good.sort_by_key(|(p, r)| (r.base, !p.starts_with(ranges_dir())));
        let mut i = 0;
        while i < good.len() {
            let mut j = i + 1;
            let mut clash = false;
            while j < good.len() && good[j].1.range().overlaps(&good[i].1.range()) {
                let same = good[j].1.base == good[i].1.base
                    && good[j].1.vm == good[i].1.vm
                    && good[j].1.state_root == good[i].1.state_root;
                if same {
                    good.remove(j);
                    continue;
                }
                clash = true;
                j += 1;
            }
            if !clash {
                book.good.push(good[i].clone());
                i += 1;
                continue;
            }
            let names: Vec<String> = good[i..j]
                .iter()
                .map(|(p, _)| p.display().to_string())
                .collect();
            for (path, rec) in good.drain(i..j) {
                book.bad.push(BadRecord {
                    why: format!(
                        "it overlaps another record ({}): which VM holds the ids is ambiguous",
                        names.join(", ")
                    ),
                    blocks: vec![rec.range()],
                    claims: Some((rec.state_root.clone(), rec.vm.clone())),
                    path,
                });
            }
        }
        book
    }

    /// The active record of VM `name` of `roots`.
    pub fn active_of(&self, roots: &Roots, name: &VmName) -> Option<&RangeRecord> {
        self.good
            .iter()
            .map(|(_, r)| r)
            .find(|r| r.is_of(roots, name) && r.state == State::Active)
    }

    /// Bad records that name VM `name` (one that cannot be read far
    /// enough to say whose it is names no VM: it would stop every VM).
    pub fn bad_of(&self, roots: &Roots, name: &VmName) -> Vec<&BadRecord> {
        self.bad
            .iter()
            .filter(|b| {
                b.claims
                    .as_ref()
                    .is_some_and(|(root, vm)| root == &roots.state_root && vm == name)
            })
            .collect()
    }

    pub fn blocked(&self, r: &IdRange) -> bool {
        self.bad
            .iter()
            .any(|b| b.blocks.iter().any(|x| x.overlaps(r)))
    }
}

/// Read every record: the host-wide directory's and, when `roots` is given,
/// the old ones of its state root.
pub(super) fn read_all(host: Option<&Dir>, roots: Option<&Roots>) -> Result<Book, RangeError> {
    let mut entries: Vec<Read> = Vec::new();
    // The bytes of the records that did not parse, as read (bounded, not
    // followed): whose such a record is comes from these, never from
    // opening its path again (a FIFO would block, a symlink be followed, a
    // huge file be read whole).
    let mut unparsed: Vec<(PathBuf, Vec<u8>)> = Vec::new();
    if let Some(dir) = host {
        for (path, bytes) in read_dir_records(dir)? {
            let r = bytes.and_then(|b| {
                serde_json::from_slice::<RangeRecord>(&b).map_err(|e| {
                    unparsed.push((path.clone(), b));
                    (format!("cannot be parsed ({e})"), Vec::new())
                })
            });
            entries.push((path, r));
        }
    }
    if let Some(roots) = roots {
        if let Some(dir) = legacy_dir(roots)? {
            for (path, bytes) in read_dir_records(&dir)? {
                let r = bytes.and_then(|b| {
                    serde_json::from_slice::<LegacyRecord>(&b)
                        .map(|l| from_legacy(l, roots))
                        .map_err(|e| {
                            unparsed.push((path.clone(), b));
                            (format!("cannot be parsed ({e})"), Vec::new())
                        })
                });
                entries.push((path, r));
            }
        }
    }
    let mut book = Book::from_entries(entries);
    // Whose a bad record is, when its bytes say so.
    for b in &mut book.bad {
        if b.claims.is_some() {
            continue;
        }
        if let Some((_, bytes)) = unparsed.iter().find(|(p, _)| p == &b.path) {
            if let Ok(v) = serde_json::from_slice::<serde_json::Value>(bytes) {
                let vm = v["vm"].as_str().and_then(|s| VmName::parse(s).ok());
                let root = v["state_root"].as_str().map(PathBuf::from).or_else(|| {
                    roots
                        .filter(|r| b.path.starts_with(&r.state_root))
                        .map(|r| r.state_root.clone())
                });
                if let (Some(vm), Some(root)) = (vm, root) {
                    b.claims = Some((root, vm));
                }
            }
        }
    }
    Ok(book)
}

fn from_legacy(l: LegacyRecord, roots: &Roots) -> RangeRecord {
    RangeRecord {
        base: l.base,
        count: l.count,
        vm: l.vm,
        state_root: roots.state_root.clone(),
        state: l.state,
        retired_unix: l.retired_unix,
        shares: Vec::new(),
        legacy: true,
        recyclable: false,
        kept_by: Vec::new(),
    }
}

/// `range-*.json` of `dir`, each with its bytes or why they cannot be
/// read (a file that cannot be read is reported, not fatal).
fn read_dir_records(dir: &Dir) -> Result<Vec<(PathBuf, Bytes)>, RangeError> {
    let rd = std::fs::read_dir(&dir.path).map_err(|source| IoError {
        op: "read_dir",
        path: dir.path.clone(),
        source,
    })?;
    let mut out = Vec::new();
    for e in rd.flatten() {
        let n = e.file_name();
        let Some(name) = n.to_str().filter(|s| s.starts_with("range-")) else {
            continue;
        };
        if !name.ends_with(".json") {
            continue;
        }
        let r = match dirs::read_small(dir, name, MAX_RECORD) {
            Ok(Some(b)) => Ok(b),
            Ok(None) => continue,
            Err(e) => Err((format!("cannot be read ({e})"), Vec::new())),
        };
        out.push((dir.path.join(name), r));
    }
    Ok(out)
}

pub(super) fn legacy_dir(roots: &Roots) -> Result<Option<Dir>, RangeError> {
    let state_root = match dirs::open_dir(&roots.state_root) {
        Ok(d) => d,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let dir = dirs::open_existing(&state_root, PRINCIPALS_DIR)?;
    // Root's, as the registry that makes it requires: one another user
    // owns could hold any record, which a purge would move into the
    // host-wide record as root's.
    if let Some(d) = &dir {
        dirs::check_dir(
            d,
            &dirs::Want {
                uid: 0,
                gid: 0,
                mode: 0o700,
                loose: dirs::Loose::Tighten,
            },
        )?;
    }
    Ok(dir)
}
