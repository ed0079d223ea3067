//! `vmwarden adopt NAME --from DIR [--apply]`: move a stopped VM's disk
//! images and share sources from a microvm.nix state dir (DIR, usually
//! `/var/lib/microvms/NAME`) into its vmwarden state dir and give them to
//! its principal.
//!
//! What moves is what the spec names under `STATE_ROOT/NAME/`: a disk image
//! or share source at `STATE_ROOT/NAME/X` comes from `DIR/X`. Everything
//! else in DIR (microvm.nix's `current`, `booted`, `toplevel`, sockets) is
//! listed and left. Every walk is `openat`-style from DIR's descriptor with
//! `O_NOFOLLOW`; a symlink is never followed (one the spec names is
//! refused; one inside a share source is made anew or re-owned itself,
//! with `AT_SYMLINK_NOFOLLOW`); a regular file with more than one link is
//! refused (the other name would keep the data); a device node, another
//! file system, or nesting deeper than 64 directories inside a share source
//! is refused. DIR and the state root must be on one file system.
//!
//! The old owner loses the data for good. `chown` revokes nothing already
//! open (a `MAP_SHARED` mapping, a descriptor passed over a unix socket,
//! which no scan of `/proc` sees while it is in flight), so an item is
//! only moved (`renameat2(RENAME_NOREPLACE)`, then re-owned) when every
//! inode in it is root's alone (owned by root, nothing for group or
//! others) and DIR is root's (in another's DIR, a root-only inode may be
//! anyone's, renamed onto the item's name by DIR's owner); any other
//! item gets new inodes that only root has held — a reflink where the
//! file system has one, else a copy that keeps holes (`copy`) — and its
//! old inodes are removed from DIR. The copies need
//! room: the plan counts it, and an adoption it does not fit in is refused
//! before anything changes.
//!
//! DIR's names are its owner's to change at any time, so what root reads
//! from DIR to copy, and the old inodes it removes, it reads and removes
//! with DIR's owner's file-system ids (`old_owner`): root never gives the
//! VM, nor deletes, what that owner could not read or delete itself. The
//! plan refuses an item its old owner could not read or remove.
//!
//! `--apply` holds the VM's lease (no launch starts meanwhile), records
//! what it is about to do in `STATE_ROOT/.adopt-NAME.json` (durably, like
//! the launch's intent record) and then, item by item, moves and re-owns,
//! or copies and removes (`apply`). A launch between a kill and the
//! re-run is refused by the launcher's own checks while an image or share
//! source is missing or not yet the principal's (a moved share's own
//! directory is re-owned last; a copy appears under its name only when
//! complete and the principal's); after the last item the state is
//! complete and only the record is left. A run killed at any step is
//! finished by running the same command again: an item already in the
//! state dir and gone from DIR is one the record names as done, one in
//! both is a finished copy whose old inodes are still to be removed, a
//! half-made copy (under a temporary name) is made again, and re-owning is
//! idempotent. The record is removed last.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use serde::{Deserialize, Serialize};

use crate::config::names::{check_abs_normalised, VmName};
use crate::config::paths::{adopt_record_name, Roots};
use crate::config::rawpath;
use crate::config::spec::{Spec, SpecError};
use crate::host::dirs::{self, Dir, DirError};
use crate::host::ownership;
use crate::host::sys::{SysContext, SysError};
use crate::identity::principal::{self, PrincipalError};
use crate::instance::lease::LeaseError;
use crate::instance::liveness::{self, Verdict};
use crate::launch::drop_check::assert_single_threaded;

mod apply;
mod copy;
mod old_owner;
mod render;
mod walk;

use apply::apply;
use old_owner::OldOwner;
pub use render::render;
use walk::{describe, holders, inodes_of, inspect_source, lstat_at, open_parent};

/// The record of an adoption in progress: `STATE_ROOT/.adopt-NAME.json`
/// (root, 0600). In the state root, not the runtime dir: it must outlive a
/// reboot and `vmwarden-cleanup` (which empties the runtime dir), and a
/// dot name is no VM's (status and the registry read VM names only).
pub fn record_name(name: &VmName) -> String {
    adopt_record_name(name)
}
const MAX_RECORD_BYTES: u64 = 256 * 1024;

/// Steps `VMWARDEN_FAULT_AFTER` can name (builds with the `fault-injection`
/// feature): the record, then per item `move:X` and `own:X` (moved) or
/// `copy:X` and `remove:X` (new inodes), then `done`.
pub const RECORD_STEP: &str = "record";

/// Why an adoption was refused or failed. Every refusal changes nothing.
#[derive(Debug, thiserror::Error)]
pub enum AdoptError {
    #[error("adopt {name}: {path}: refused: {why}; nothing changed")]
    Refused {
        name: String,
        path: PathBuf,
        why: String,
    },
    #[error("adopt {name}: refused: VM {name} is {}; stop it first; nothing changed", .verdict.reason())]
    Running { name: String, verdict: Verdict },
    #[error("adopt {name}: {from}: refused: held open by process {pid} ({what}); stop microvm.nix's VM first (systemctl stop microvm@{name}); nothing changed")]
    HeldOpen {
        name: String,
        from: PathBuf,
        pid: u32,
        what: String,
    },
    #[error(
        "adopt {name}: refused: VM {name} started meanwhile (its lease is held); nothing changed"
    )]
    StartedMeanwhile { name: String },
    #[error("adopt {name}: {from}: refused: the new copies need {needed} bytes ({why}), and the file system of {state_root} has {available} bytes free; free that much room there, or make the items root's alone (owner root, mode 0600/0700: they are then moved, not copied); nothing changed")]
    NoRoom {
        name: String,
        from: PathBuf,
        state_root: PathBuf,
        needed: u64,
        available: u64,
        why: String,
    },
    #[error("{path}: the file system ran out of room while the copy was made (adopt stops before the room reserved for root: the source may have grown since the plan counted it, if its old owner wrote into it); the partial copy is removed and the old files are as they were: free room and run the same command again")]
    RanOutOfRoom { path: PathBuf },
    #[error("adopt {name}: {path}: {why}; it was not adopted (the items before it were): run the same command again, which judges it anew")]
    Changed {
        name: String,
        path: PathBuf,
        why: String,
    },
    #[error("adopt {name}: the new copy {to} is in place and the principal's, but its old inodes were not all removed: {path}: {reason}; run the same command again, or remove them by hand once you have checked they are the item's old inodes (DIR's owner can rename anything in DIR)")]
    NotRemoved {
        name: String,
        path: PathBuf,
        to: PathBuf,
        reason: String,
    },
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error(transparent)]
    Principal(#[from] PrincipalError),
    #[error(transparent)]
    Dir(#[from] DirError),
    #[error(transparent)]
    Lease(#[from] LeaseError),
    #[error(transparent)]
    Sys(#[from] SysError),
    #[error("adopt record {path}: {reason}")]
    Record { path: PathBuf, reason: String },
}

impl AdoptError {
    /// A refusal of the input or the host state (nothing was changed).
    pub fn is_refusal(&self) -> bool {
        match self {
            AdoptError::Refused { .. }
            | AdoptError::Running { .. }
            | AdoptError::HeldOpen { .. }
            | AdoptError::StartedMeanwhile { .. }
            | AdoptError::NoRoom { .. }
            | AdoptError::Spec(_)
            | AdoptError::Principal(_) => true,
            AdoptError::Dir(e) => e.is_refusal(),
            AdoptError::Lease(e) => e.is_refusal(),
            AdoptError::Sys(_)
            | AdoptError::Record { .. }
            | AdoptError::RanOutOfRoom { .. }
            | AdoptError::Changed { .. }
            | AdoptError::NotRemoved { .. } => false,
        }
    }
}

type Result<T, E = AdoptError> = std::result::Result<T, E>;

/// A failed system call on `path`.
fn sys_err(errno: Errno, op: &'static str, path: impl Into<PathBuf>) -> AdoptError {
    AdoptError::Sys(SysError {
        op,
        path: path.into(),
        errno,
    })
}

/// What kind of thing an item is.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// A disk image: a regular file with one link, re-owned, mode 0600.
    Image,
    /// A share source: a directory, re-owned with everything in it.
    Share,
}

/// How an item becomes the principal's.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum How {
    /// Every inode in it is root's alone: renamed into the state dir and
    /// re-owned, the same inodes (a record without `how` is from before
    /// copies, when every item moved).
    #[default]
    Move,
    /// Its old owner (or group, or others) could hold it open: new inodes
    /// made by root, the old ones removed from DIR.
    Copy,
}

impl How {
    fn of(root_only: bool) -> How {
        if root_only {
            How::Move
        } else {
            How::Copy
        }
    }
}

/// One thing the spec names under the state dir.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Item {
    /// The spec field that names it (`disks[0].path`).
    pub field: String,
    /// Its path relative to DIR and to the state dir.
    #[serde(serialize_with = "rawpath::path")]
    pub rel: PathBuf,
    pub kind: Kind,
    #[serde(default)]
    pub how: How,
}

/// Where an item is now.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case", tag = "at")]
pub enum Place {
    /// In DIR, to be moved: its size and the blocks it uses (a sparse
    /// image uses fewer), and for a share the number of entries in it.
    From {
        bytes: u64,
        allocated: u64,
        entries: u64,
        owner: (u32, u32),
    },
    /// Already in the state dir and gone from DIR (a resumed adoption).
    Moved,
    /// Already in the state dir as new inodes, the old ones still in DIR,
    /// to be removed (a resumed adoption).
    Copied,
    /// In neither, and the spec creates it at launch (`disks[].create`).
    CreatedAtLaunch,
}

/// An item with where it is.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Planned {
    #[serde(flatten)]
    pub item: Item,
    pub place: Place,
    #[serde(serialize_with = "rawpath::path")]
    pub from: PathBuf,
    #[serde(serialize_with = "rawpath::path")]
    pub to: PathBuf,
}

/// An entry of DIR the spec does not name: listed, left where it is.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Left {
    #[serde(serialize_with = "rawpath::path")]
    pub path: PathBuf,
    pub what: &'static str,
}

/// The room the new copies need, and what the file system has.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Room {
    /// Bytes the copies still to make need: the blocks their data takes
    /// (a sparse image's holes take none) and 4 KiB per entry; with
    /// reflinks only the 4 KiB per entry.
    pub needed: u64,
    /// Bytes free for them on the state root's file system (`f_bavail`).
    pub available: u64,
    /// The file system makes reflinks (copies share blocks until written).
    pub reflink: bool,
}

/// What `adopt` does (dry run) or did (`--apply`).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Plan {
    pub name: String,
    #[serde(serialize_with = "rawpath::path")]
    pub from: PathBuf,
    #[serde(serialize_with = "rawpath::path")]
    pub state_dir: PathBuf,
    pub uid: u32,
    pub gid: u32,
    pub user: Option<String>,
    pub items: Vec<Planned>,
    pub left: Vec<Left>,
    pub room: Room,
    /// An earlier `--apply` was interrupted: this one finishes it.
    pub resuming: bool,
    pub applied: bool,
}

/// The record `--apply` writes before it changes anything.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
struct Record {
    version: u32,
    name: String,
    from: PathBuf,
    /// DIR's device and inode: a record is for this DIR only.
    from_dev: u64,
    from_ino: u64,
    uid: u32,
    gid: u32,
    items: Vec<Item>,
}

/// Caller's options.
#[derive(Debug, Clone, Default)]
pub struct Options {
    pub apply: bool,
    /// `$VMWARDEN_FAULT_AFTER` (honoured only with `fault-injection`).
    pub fault_after: Option<String>,
    /// `$VMWARDEN_FAULT_STOP` (honoured only with `fault-injection`): the
    /// process stops itself (SIGSTOP) right after that step, until a
    /// SIGCONT, so a test can act in the window that follows it.
    pub fault_stop: Option<String>,
}

/// The items of `spec`: every disk image and share source under
/// `state_dir`, by the path relative to it.
pub fn items(spec: &Spec, state_dir: &Path) -> Vec<(Item, bool)> {
    let mut out: Vec<(Item, bool)> = Vec::new();
    let mut add = |field: String, p: &Path, kind: Kind, created: bool| {
        if let Ok(rel) = p.strip_prefix(state_dir) {
            if rel.as_os_str().is_empty() || out.iter().any(|(i, _)| i.rel == rel) {
                return;
            }
            out.push((
                Item {
                    field,
                    rel: rel.to_path_buf(),
                    kind,
                    how: How::Move,
                },
                created,
            ));
        }
    };
    for (i, d) in spec.disks.iter().enumerate() {
        add(
            format!("disks[{i}].path"),
            &d.path,
            Kind::Image,
            d.create.is_some(),
        );
    }
    for (i, s) in spec.shares.iter().enumerate() {
        add(format!("shares[{i}].source"), &s.source, Kind::Share, false);
    }
    out
}

fn read_record(state_root: &Dir, file: &str) -> Result<Option<Record>> {
    let path = state_root.path.join(file);
    let Some(bytes) = dirs::read_small(state_root, file, MAX_RECORD_BYTES)? else {
        return Ok(None);
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| AdoptError::Record {
            path,
            reason: format!("cannot be parsed: {e}"),
        })
}

/// Check everything and say what `--apply` would do (and, with `apply`, do
/// it). Refusals leave the host as it was.
pub fn adopt(roots: &Roots, name: &VmName, from: &Path, opts: &Options) -> Result<Plan> {
    let refuse = |path: &Path, why: String| AdoptError::Refused {
        name: name.to_string(),
        path: path.to_path_buf(),
        why,
    };
    // The spec, read and checked as the launcher does.
    let spec_path = roots.spec_path(name);
    let spec = Spec::read(&spec_path)?;
    spec.validate(&spec_path, name)?;
    let principal = principal::resolve(&spec, roots)?;
    let state_path = roots.state_dir(name);
    check_abs_normalised(from).map_err(|r| refuse(from, format!("--from: {r}")))?;
    if from.starts_with(&roots.state_root) || roots.state_root.starts_with(from) {
        return Err(refuse(
            from,
            format!(
                "--from must be outside vmwarden's state root {}",
                roots.state_root.display()
            ),
        ));
    }
    let from_dir = dirs::open_dir(from).map_err(|e| match e {
        DirError::Sys(SysError {
            errno: Errno::ENOENT,
            ..
        }) => refuse(from, "--from: no such directory".into()),
        DirError::Refused { path, why } => refuse(&path, format!("--from: {why}")),
        e => e.into(),
    })?;
    let from_st = from_dir.stat()?;

    // DIR's owner's file-system ids are taken for every look into DIR
    // (`setfsuid` is the calling thread's): one thread.
    assert_single_threaded()
        .map_err(|e| refuse(from, format!("adopt must run on one thread: {e}")))?;

    // The vmwarden side: the launcher's own liveness verdict.
    let verdict = liveness::probe(roots, name);
    if !verdict.is_dead() {
        return Err(AdoptError::Running {
            name: name.to_string(),
            verdict,
        });
    }

    // A record of an interrupted --apply for this DIR: finish it.
    let record_file = record_name(name);
    let record_path = roots.state_root.join(&record_file);
    let record = match dirs::open_dir_if_exists(&roots.state_root)? {
        Some(d) => read_record(&d, &record_file)?,
        None => None,
    };
    if let Some(r) = &record {
        if (r.from_dev, r.from_ino) != (from_st.st_dev, from_st.st_ino) || r.name != name.as_str() {
            return Err(refuse(
                from,
                format!(
                    "an interrupted adoption of {} from {} is recorded in {}; finish it with `vmwarden adopt {} --from {} --apply` first",
                    r.name,
                    r.from.display(),
                    record_path.display(),
                    r.name,
                    r.from.display()
                ),
            ));
        }
    }
    // How the record says an item is adopted, when it names it.
    let recorded = |rel: &Path| {
        record
            .as_ref()
            .and_then(|r| r.items.iter().find(|i| i.rel == rel))
            .map(|i| i.how)
    };

    // The state root must be on DIR's file system: items are renamed into
    // it (a move, or a copy made beside its target).
    let root_dir = match dirs::open_dir_if_exists(&roots.state_root)? {
        Some(d) => d,
        None => {
            let parent = roots
                .state_root
                .parent()
                .ok_or_else(|| refuse(&roots.state_root, "has no parent".into()))?;
            dirs::open_dir(parent)?
        }
    };
    if root_dir.stat()?.st_dev != from_st.st_dev {
        return Err(refuse(
            from,
            format!(
                "is on another file system than {}; adopt works within one file system: copy the images yourself (cp --sparse=always) or put DIR on the same file system",
                roots.state_root.display()
            ),
        ));
    }
    let state_dir = dirs::open_dir_if_exists(&state_path)?;
    let old = OldOwner::of(&from_st);
    old.check_above(from).map_err(|e| match e {
        AdoptError::Refused { path, why, .. } => refuse(&path, why),
        e => e,
    })?;

    // Every item: in DIR (to move or copy), already done or copied (a
    // resumed run), or to be created at launch. A target that exists is
    // refused unless the record says this adoption made it.
    let mut planned = Vec::new();
    for (mut item, created) in items(&spec, &state_path) {
        let from_path = from.join(&item.rel);
        let to_path = state_path.join(&item.rel);
        let src = match open_parent(&from_dir, &item.rel) {
            Ok(Some((p, n))) => inspect_source(&p, &n, &item, from_st.st_dev),
            Ok(None) => Ok(None),
            Err(e) => Err(e),
        }
        .map_err(|e| match e {
            AdoptError::Refused { path, why, .. } => AdoptError::Refused {
                name: name.to_string(),
                path,
                why,
            },
            e => e,
        })?;
        let target = match &state_dir {
            Some(sd) => match open_parent(sd, &item.rel)? {
                Some((p, n)) => lstat_at(&p, &n)?,
                None => None,
            },
            None => None,
        };
        let was = recorded(&item.rel);
        let place = match (src, target) {
            // A copy the interrupted run finished: its old inodes go.
            (Some(_), Some(_)) if was == Some(How::Copy) => {
                item.how = How::Copy;
                Place::Copied
            }
            (Some(_), Some(_)) => {
                return Err(refuse(
                    &to_path,
                    format!(
                        "exists, and {} exists too; adopt never replaces a target: remove one of them",
                        from_path.display()
                    ),
                ))
            }
            // Copied when either this run or the record says so.
            (Some((p, how)), None) => {
                // Moved only from a DIR that is root's: in another's, a
                // root-only inode may be anyone's, renamed onto the item's
                // name by DIR's owner; copied, it is read as that owner,
                // who cannot ([`old_owner`]).
                item.how = if was == Some(How::Copy) || !old.is_root() {
                    How::Copy
                } else {
                    how
                };
                p
            }
            (None, Some(_)) if was.is_some() => {
                item.how = was.unwrap_or_default();
                Place::Moved
            }
            (None, Some(_)) => {
                return Err(refuse(
                    &to_path,
                    format!(
                        "exists ({} does not): this VM's state is already there; nothing to adopt for {}",
                        from_path.display(),
                        item.field
                    ),
                ))
            }
            (None, None) if created => Place::CreatedAtLaunch,
            (None, None) => {
                return Err(refuse(
                    &from_path,
                    format!(
                        "does not exist, and {} names {} (a microvm.nix volume keeps its image at DIR/{}); check --from",
                        item.field,
                        to_path.display(),
                        item.rel.display()
                    ),
                ))
            }
        };
        // What is copied is read, and what is removed is removed, with
        // DIR's owner's rights ([`old_owner`]): checked now, nothing
        // changed yet.
        if matches!(place, Place::From { .. } | Place::Copied) {
            let read = item.how == How::Copy && matches!(place, Place::From { .. });
            old.check_item(&from_dir, &item.rel, item.kind, from_st.st_dev, read)
                .map_err(|e| match e {
                    AdoptError::Refused { path, why, .. } => AdoptError::Refused {
                        name: name.to_string(),
                        path,
                        why,
                    },
                    e => e,
                })?;
        }
        planned.push(Planned {
            item,
            place,
            from: from_path,
            to: to_path,
        });
    }
    if planned.is_empty() {
        return Err(refuse(
            &spec_path,
            format!(
                "the spec names no disk image or share source under {}; nothing to adopt",
                state_path.display()
            ),
        ));
    }

    // Everything else in DIR: listed, left.
    let mut left = Vec::new();
    let mut names = ownership::entries(&from_dir).sys("readdir", from)?;
    names.sort();
    for n in names {
        if planned
            .iter()
            .any(|p| p.item.rel.as_os_str() == n.as_os_str())
        {
            continue;
        }
        let what = lstat_at(&from_dir, &n)?
            .map(|st| describe(&st))
            .unwrap_or("vanished");
        left.push(Left {
            path: from.join(&n),
            what,
        });
    }

    // microvm.nix's side: a process holding DIR, an image or a share open
    // (a running VM; what no scan can see is dealt with by the copies).
    if let Some((pid, what)) = holders(from_st.st_dev, &inodes_of(&from_dir, &planned)?) {
        return Err(AdoptError::HeldOpen {
            name: name.to_string(),
            from: from.to_path_buf(),
            pid,
            what,
        });
    }

    // The room the copies need, refused before anything changes.
    let room = room(&root_dir, &planned)?;
    if room.needed > room.available {
        let why = planned
            .iter()
            .filter(|p| p.item.how == How::Copy)
            .filter_map(|p| match p.place {
                Place::From { allocated, .. } => Some(format!(
                    "{} {allocated} bytes allocated",
                    rawpath::show(&p.item.rel)
                )),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join(", ");
        return Err(AdoptError::NoRoom {
            name: name.to_string(),
            from: from.to_path_buf(),
            state_root: roots.state_root.clone(),
            needed: room.needed,
            available: room.available,
            why: format!("new inodes for what its old owner could hold open: {why}"),
        });
    }

    let mut plan = Plan {
        name: name.to_string(),
        from: from.to_path_buf(),
        state_dir: state_path.clone(),
        uid: principal.uid,
        gid: principal.gid,
        user: principal.user.clone(),
        items: planned,
        left,
        room,
        resuming: record.is_some(),
        applied: false,
    };
    if opts.apply {
        apply(roots, name, &from_dir, &from_st, &mut plan, opts)?;
    }
    Ok(plan)
}

fn fault(opts: &Options, step: &str) {
    tracing::debug!(step = %step, "adopt step done");
    #[cfg(feature = "fault-injection")]
    if opts.fault_after.as_deref() == Some(step) {
        tracing::warn!(step = %step, "fault injection: SIGKILL after step");
        let _ = nix::sys::signal::kill(nix::unistd::getpid(), nix::sys::signal::Signal::SIGKILL);
    }
    #[cfg(feature = "fault-injection")]
    if opts.fault_stop.as_deref() == Some(step) {
        tracing::warn!(step = %step, "fault injection: SIGSTOP after step");
        let _ = nix::sys::signal::kill(nix::unistd::getpid(), nix::sys::signal::Signal::SIGSTOP);
    }
    #[cfg(not(feature = "fault-injection"))]
    let _ = (&opts.fault_after, &opts.fault_stop);
}

/// The step names of an adoption of `plan`'s items, in order.
pub fn steps(items: &[Item]) -> Vec<String> {
    let mut out = vec![RECORD_STEP.to_string()];
    for i in items {
        let (a, b) = match i.how {
            How::Move => ("move", "own"),
            How::Copy => ("copy", "remove"),
        };
        out.push(format!("{a}:{}", i.rel.display()));
        out.push(format!("{b}:{}", i.rel.display()));
    }
    out.push("done".to_string());
    out
}

/// The room the copies still to make need on `dir`'s file system (the
/// state root's, DIR's), and what it has free.
fn room(dir: &Dir, planned: &[Planned]) -> Result<Room> {
    let vfs = nix::sys::statvfs::fstatvfs(dir.fd.as_fd()).sys("fstatvfs", &dir.path)?;
    let available = vfs.blocks_available().saturating_mul(vfs.fragment_size());
    let to_copy: Vec<(u64, u64)> = planned
        .iter()
        .filter(|p| p.item.how == How::Copy)
        .filter_map(|p| match p.place {
            Place::From {
                allocated, entries, ..
            } => Some((allocated, entries + 1)),
            _ => None,
        })
        .collect();
    // Only asked when there is something to copy (it makes two unnamed
    // files, gone when closed).
    let reflink = !to_copy.is_empty() && copy::reflinks(dir);
    let needed = to_copy
        .iter()
        .map(|(allocated, entries)| {
            let meta = entries.saturating_mul(copy::PER_ENTRY);
            if reflink {
                meta
            } else {
                meta.saturating_add(*allocated)
            }
        })
        .fold(0u64, u64::saturating_add);
    Ok(Room {
        needed,
        available,
        reflink,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_record_then_move_and_own_or_copy_and_remove_per_item_then_done() {
        let items = vec![
            Item {
                field: "disks[0].path".into(),
                rel: "var.img".into(),
                kind: Kind::Image,
                how: How::Move,
            },
            Item {
                field: "shares[0].source".into(),
                rel: "home".into(),
                kind: Kind::Share,
                how: How::Copy,
            },
        ];
        assert_eq!(
            steps(&items),
            [
                "record",
                "move:var.img",
                "own:var.img",
                "copy:home",
                "remove:home",
                "done"
            ]
        );
    }

    #[test]
    fn a_record_from_before_copies_moves_every_item() {
        let old = r#"{"field":"disks[0].path","rel":"var.img","kind":"image"}"#;
        assert_eq!(serde_json::from_str::<Item>(old).unwrap().how, How::Move);
    }

    #[test]
    fn the_record_rejects_unknown_fields() {
        let bad = r#"{"version":1,"name":"web","from":"/x","from_dev":1,"from_ino":2,"uid":1,"gid":1,"items":[],"extra":1}"#;
        serde_json::from_str::<Record>(bad).unwrap_err();
    }
}
