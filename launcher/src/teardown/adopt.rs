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
//! refused; one inside a share source is re-owned itself, with
//! `AT_SYMLINK_NOFOLLOW`); a regular file with more than one link is
//! refused (re-owning it would re-own the other name too); a device node or
//! another file system inside a share source is refused. The move is one
//! `renameat2(RENAME_NOREPLACE)` per item within one file system: an item
//! on another file system is refused, never copied, so a sparse image stays
//! the same inode with the same blocks.
//!
//! `--apply` holds the VM's lease (no launch starts meanwhile), records
//! what it is about to do in `STATE_ROOT/.adopt-NAME.json` (durably, like
//! the launch's intent record) and then, item by item, moves and re-owns.
//! A launch between a kill and the re-run is refused by the launcher's own
//! checks while an image or share source is missing or not yet the
//! principal's (a share's own directory is re-owned last); after the last
//! re-own the state is complete and only the record is left. A run
//! killed at any step is finished by running the same command again: an
//! item already in the state dir and gone from DIR is one the record names
//! as moved, and re-owning is idempotent. The record is removed last.

use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{openat, renameat2, AtFlags, OFlag, RenameFlags};
use nix::sys::stat::{fchmod, FileStat, Mode, SFlag};
use nix::unistd::{fchownat, Gid, Uid};
use serde::{Deserialize, Serialize};

use crate::config::names::{check_abs_normalised, VmName};
use crate::config::paths::Roots;
use crate::config::spec::{Spec, SpecError};
use crate::host::dirs::{self, Dir, DirError, Loose, Want};
use crate::host::ownership;
use crate::host::sys::{SysContext, SysError};
use crate::identity::principal::{self, PrincipalError};
use crate::instance::lease::LeaseError;
use crate::instance::liveness::{self, Verdict};
use crate::teardown::lease_as_a_launch;

mod render;
mod walk;

pub use render::render;
use walk::{
    check_entry, describe, holders, inodes_of, inspect_source, kind_of, lstat_at, open_parent,
    walk_share, DIR_FLAGS, NOFOLLOW,
};

/// The record of an adoption in progress: `STATE_ROOT/.adopt-NAME.json`
/// (root, 0600). In the state root, not the runtime dir: it must outlive a
/// reboot and `vmwarden-cleanup` (which empties the runtime dir), and a
/// dot name is no VM's (status and the registry read VM names only).
pub fn record_name(name: &VmName) -> String {
    format!(".adopt-{name}.json")
}
const MAX_RECORD_BYTES: u64 = 256 * 1024;

/// Steps `VMWARDEN_FAULT_AFTER` can name (builds with the `fault-injection`
/// feature): the record, then `move:X` and `own:X` per item, then `done`.
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
            | AdoptError::Spec(_)
            | AdoptError::Principal(_) => true,
            AdoptError::Dir(e) => e.is_refusal(),
            AdoptError::Lease(e) => e.is_refusal(),
            AdoptError::Sys(_) | AdoptError::Record { .. } => false,
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

/// One thing the spec names under the state dir.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Item {
    /// The spec field that names it (`disks[0].path`).
    pub field: String,
    /// Its path relative to DIR and to the state dir.
    pub rel: PathBuf,
    pub kind: Kind,
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
    /// In neither, and the spec creates it at launch (`disks[].create`).
    CreatedAtLaunch,
}

/// An item with where it is.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Planned {
    #[serde(flatten)]
    pub item: Item,
    pub place: Place,
    pub from: PathBuf,
    pub to: PathBuf,
}

/// An entry of DIR the spec does not name: listed, left where it is.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Left {
    pub path: PathBuf,
    pub what: &'static str,
}

/// What `adopt` does (dry run) or did (`--apply`).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Plan {
    pub name: String,
    pub from: PathBuf,
    pub state_dir: PathBuf,
    pub uid: u32,
    pub gid: u32,
    pub user: Option<String>,
    pub items: Vec<Planned>,
    pub left: Vec<Left>,
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
    let recorded = |rel: &Path| {
        record
            .as_ref()
            .is_some_and(|r| r.items.iter().any(|i| i.rel == rel))
    };

    // The state root must be on DIR's file system (a move, not a copy).
    let root_st = match dirs::open_dir_if_exists(&roots.state_root)? {
        Some(d) => d.stat()?,
        None => {
            let parent = roots
                .state_root
                .parent()
                .ok_or_else(|| refuse(&roots.state_root, "has no parent".into()))?;
            dirs::open_dir(parent)?.stat()?
        }
    };
    if root_st.st_dev != from_st.st_dev {
        return Err(refuse(
            from,
            format!(
                "is on another file system than {}; adopt moves, never copies: copy the images yourself (cp --sparse=always) or put DIR on the same file system",
                roots.state_root.display()
            ),
        ));
    }
    let state_dir = dirs::open_dir_if_exists(&state_path)?;

    // Every item: in DIR (to move), already moved (a resumed run), or to be
    // created at launch. A target that exists is refused unless the record
    // says this adoption moved it.
    let mut planned = Vec::new();
    for (item, created) in items(&spec, &state_path) {
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
        let place = match (src, target) {
            (Some(_), Some(_)) => {
                return Err(refuse(
                    &to_path,
                    format!(
                        "exists, and {} exists too; adopt never replaces a target: remove one of them",
                        from_path.display()
                    ),
                ))
            }
            (Some(p), None) => p,
            (None, Some(_)) if recorded(&item.rel) => Place::Moved,
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

    // microvm.nix's side: a process holding DIR, an image or a share open.
    if let Some((pid, what)) = holders(from_st.st_dev, &inodes_of(&from_dir, &planned)?) {
        return Err(AdoptError::HeldOpen {
            name: name.to_string(),
            from: from.to_path_buf(),
            pid,
            what,
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
    #[cfg(not(feature = "fault-injection"))]
    let _ = &opts.fault_after;
}

/// The step names of an adoption of `plan`'s items, in order.
pub fn steps(items: &[Item]) -> Vec<String> {
    let mut out = vec![RECORD_STEP.to_string()];
    for i in items {
        out.push(format!("move:{}", i.rel.display()));
        out.push(format!("own:{}", i.rel.display()));
    }
    out.push("done".to_string());
    out
}

fn apply(
    roots: &Roots,
    name: &VmName,
    from_dir: &Dir,
    from_st: &FileStat,
    plan: &mut Plan,
    opts: &Options,
) -> Result<()> {
    let root_want = |mode| Want {
        uid: 0,
        gid: 0,
        mode,
        loose: Loose::Refuse,
    };
    let vm_want = |mode| Want {
        uid: plan.uid,
        gid: plan.gid,
        mode,
        loose: Loose::Tighten,
    };
    // The lease, as a launch takes it: no launch starts until the record is
    // gone.
    let Some(_lease) = lease_as_a_launch::<AdoptError>(roots, name)? else {
        return Err(AdoptError::StartedMeanwhile {
            name: name.to_string(),
        });
    };
    let verdict = liveness::probe_with_lease_held(roots, name, plan.uid, None);
    if !verdict.is_dead() {
        return Err(AdoptError::Running {
            name: name.to_string(),
            verdict,
        });
    }
    let items: Vec<Item> = plan.items.iter().map(|p| p.item.clone()).collect();
    let record = Record {
        version: 1,
        name: name.to_string(),
        from: plan.from.clone(),
        from_dev: from_st.st_dev,
        from_ino: from_st.st_ino,
        uid: plan.uid,
        gid: plan.gid,
        items: items.clone(),
    };
    let (state_parent, state_name) = dirs::split_parent(&roots.state_root)?;
    let (state_root, _) =
        dirs::ensure(&state_parent, &state_name, &dirs::root_want("--state-root"))?;
    let record_file = record_name(name);
    let mut bytes = serde_json::to_vec_pretty(&record).map_err(|e| AdoptError::Record {
        path: state_root.path.join(&record_file),
        reason: e.to_string(),
    })?;
    bytes.push(b'\n');
    dirs::durable_write(&state_root, &record_file, &bytes, 0o600)?;
    fault(opts, RECORD_STEP);

    let (state_dir, _) = dirs::ensure(&state_root, name.as_str(), &vm_want(0o700))?;
    let (uid, gid) = (plan.uid, plan.gid);
    for p in &plan.items {
        let rel = &p.item.rel;
        // Directories between the state dir and the item: the principal's.
        let mut parent = Dir {
            fd: nix::unistd::dup(state_dir.fd.as_fd()).sys("dup", &state_dir.path)?,
            path: state_dir.path.clone(),
        };
        let comps: Vec<&OsStr> = rel.iter().collect();
        let (last, mids) = comps.split_last().expect("items are not empty");
        for c in mids {
            let c = c.to_str().ok_or_else(|| AdoptError::Refused {
                name: name.to_string(),
                path: parent.path.join(c),
                why: "is not UTF-8".into(),
            })?;
            parent = dirs::ensure(&parent, c, &vm_want(0o700))?.0;
        }
        if let Place::From { .. } = p.place {
            let (src_parent, src_name) =
                open_parent(from_dir, rel)?.ok_or_else(|| AdoptError::Refused {
                    name: name.to_string(),
                    path: p.from.clone(),
                    why: "vanished".into(),
                })?;
            match renameat2(
                src_parent.fd.as_fd(),
                src_name.as_os_str(),
                parent.fd.as_fd(),
                *last,
                RenameFlags::RENAME_NOREPLACE,
            ) {
                Ok(()) => {}
                // Moved by the run this one resumes.
                Err(Errno::ENOENT) if lstat_at(&parent, last)?.is_some() => {}
                Err(Errno::EXDEV) => {
                    return Err(AdoptError::Refused {
                        name: name.to_string(),
                        path: p.from.clone(),
                        why: format!(
                            "cannot be renamed to {} (another file system); adopt never copies",
                            p.to.display()
                        ),
                    })
                }
                Err(e) => return Err(sys_err(e, "renameat2", &p.from)),
            }
        }
        fault(opts, &format!("move:{}", rel.display()));
        // Re-own at the target, never following a link: the item itself by
        // an O_NOFOLLOW descriptor, a share's entries with
        // AT_SYMLINK_NOFOLLOW from their parent's descriptor.
        if lstat_at(&parent, last)?.is_some() {
            let to = parent.path.join(last);
            match p.item.kind {
                Kind::Image => {
                    // O_NONBLOCK: a fifo swapped in meanwhile must not
                    // hang the open; its type is refused below.
                    let fd: OwnedFd = openat(
                        parent.fd.as_fd(),
                        *last,
                        OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | NOFOLLOW,
                        Mode::empty(),
                    )
                    .sys("openat", &to)?;
                    let st = nix::sys::stat::fstat(fd.as_fd()).sys("fstat", &to)?;
                    if kind_of(&st) != SFlag::S_IFREG {
                        return Err(AdoptError::Refused {
                            name: name.to_string(),
                            path: to,
                            why: format!(
                                "became a {} during the move; left as it is",
                                describe(&st)
                            ),
                        });
                    }
                    check_entry(&to, &st, from_st.st_dev)?;
                    nix::unistd::fchown(
                        fd.as_fd(),
                        Some(Uid::from_raw(uid)),
                        Some(Gid::from_raw(gid)),
                    )
                    .sys("fchown", &to)?;
                    fchmod(fd.as_fd(), Mode::from_bits_truncate(0o600)).sys("fchmod", &to)?;
                }
                Kind::Share => {
                    let fd = openat(parent.fd.as_fd(), *last, DIR_FLAGS, Mode::empty())
                        .sys("openat", &to)?;
                    let dir = Dir {
                        fd,
                        path: to.clone(),
                    };
                    walk_share(&dir, from_st.st_dev, &mut |d, n, _| {
                        fchownat(
                            d.fd.as_fd(),
                            n,
                            Some(Uid::from_raw(uid)),
                            Some(Gid::from_raw(gid)),
                            AtFlags::AT_SYMLINK_NOFOLLOW,
                        )
                        .sys("fchownat", d.path.join(n))?;
                        Ok(())
                    })?;
                    nix::unistd::fchown(
                        dir.fd.as_fd(),
                        Some(Uid::from_raw(uid)),
                        Some(Gid::from_raw(gid)),
                    )
                    .sys("fchown", &to)?;
                    // Writable by the principal only (the launcher refuses
                    // a share source others may write).
                    let st = dir.stat()?;
                    fchmod(
                        dir.fd.as_fd(),
                        Mode::from_bits_truncate(st.st_mode & 0o7755 & !0o022),
                    )
                    .sys("fchmod", &to)?;
                }
            }
        }
        fault(opts, &format!("own:{}", rel.display()));
    }
    nix::unistd::fsync(state_dir.fd.as_fd()).sys("fsync", &state_dir.path)?;
    nix::unistd::fsync(from_dir.fd.as_fd()).sys("fsync", &from_dir.path)?;
    nix::unistd::unlinkat(
        state_root.fd.as_fd(),
        record_file.as_str(),
        nix::unistd::UnlinkatFlags::NoRemoveDir,
    )
    .sys("unlinkat", state_root.path.join(&record_file))?;
    nix::unistd::fsync(state_root.fd.as_fd()).sys("fsync", &state_root.path)?;
    fault(opts, "done");
    plan.applied = true;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_record_then_move_and_own_per_item_then_done() {
        let items = vec![
            Item {
                field: "disks[0].path".into(),
                rel: "var.img".into(),
                kind: Kind::Image,
            },
            Item {
                field: "shares[0].source".into(),
                rel: "home".into(),
                kind: Kind::Share,
            },
        ];
        assert_eq!(
            steps(&items),
            [
                "record",
                "move:var.img",
                "own:var.img",
                "move:home",
                "own:home",
                "done"
            ]
        );
    }

    #[test]
    fn the_record_rejects_unknown_fields() {
        let bad = r#"{"version":1,"name":"web","from":"/x","from_dev":1,"from_ino":2,"uid":1,"gid":1,"items":[],"extra":1}"#;
        serde_json::from_str::<Record>(bad).unwrap_err();
    }
}
