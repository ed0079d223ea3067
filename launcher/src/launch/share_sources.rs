//! Share sources made for the VM: a writable share (9p or virtiofs) whose
//! source does not exist is made at launch, the principal's, mode 0700 —
//! what microvm.nix's tmpfiles rules do for its shares — but only in a
//! parent directory that is root's, writable by root alone and reached
//! from `/` without a symlink ([`made_sources::open_parent`]). Anywhere
//! else it is refused, naming the path and why: a directory someone else
//! may write is one where they choose what the name holds, and a symlink
//! on the way is a path someone else chose. A read-only share's missing
//! source stays an error: there is nothing for the guest to read.
//!
//! The same owner for every share the guest writes: the principal. On a
//! share the guest owns (writable virtiofs, `launch/helpers/owned.rs`)
//! that is the guest's root (guest id 0 is the principal), as on a fresh
//! file system; on a writable 9p share it is the principal whose files
//! the guest's are on the host.
//!
//! In order: the pre-flight ([`preflight`], step `principal-resolved`)
//! finds each missing writable source and opens its parent; the intent
//! record names each ([`records`], step `intent-written`) before anything
//! exists; [`make`] makes them (step `share-sources-made`); [`record`]
//! keeps their identity in the state root (step `share-sources-recorded`,
//! `instance::made_sources`), where cleanup and `purge` find it. A launch
//! killed between the two leaves a directory the record does not name:
//! cleanup removes it while it is empty (`teardown::made_sources`).
//!
//! A source inside the VM's own state directory (microvm.nix's relative
//! sources, `home` for `/var/lib/microvms/NAME/home`) is the VM's data
//! like the rest of that directory, which is the principal's: it is made
//! there, each missing component the principal's 0700, through
//! descriptors that never follow a link, at a moment no process of the
//! principal runs (the lease is held and the uid probed). It needs no
//! record of its own: cleanup keeps the state directory, purge deletes
//! everything under it.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{fchmod, fstat, mkdirat, Mode};
use nix::unistd::{fchown, Gid, Uid};

use crate::config::names::VmName;
use crate::config::paths::adopt_record_name;
use crate::config::rawpath::show;
use crate::config::spec::{Spec, SpecError, NIX_STORE};
use crate::host::dirs::Dir;
use crate::host::sys::{SysContext, SysError};
use crate::identity::principal::Principal;
use crate::instance::intent::Resource;
use crate::instance::made_sources::{self, MadeSource, MadeSources};

/// A missing writable share source, to be made.
#[derive(Debug)]
pub struct ToMake {
    /// Its index in `shares`.
    pub index: usize,
    pub path: PathBuf,
    place: Place,
}

/// Where a source is made.
#[derive(Debug)]
enum Place {
    /// In a parent of root's alone, opened at the pre-flight.
    Root { parent: Dir, name: OsString },
    /// Inside the VM's state directory: these components below it.
    StateDir { below: PathBuf },
}

/// The share sources this launch makes.
#[derive(Debug, Default)]
pub struct Plan(pub Vec<ToMake>);

impl Plan {
    /// `shares[index]`'s source is made by this launch.
    pub fn makes(&self, index: usize) -> bool {
        self.0.iter().any(|t| t.index == index)
    }
}

/// Each share whose source does not exist: a read-only one is refused; a
/// writable one is made if its parent allows it, and refused otherwise,
/// the path and the reason named. Nothing is created here.
pub fn preflight(
    spec: &Spec,
    spec_path: &Path,
    state_dir: &Path,
    principal_uid: u32,
) -> Result<Plan, SpecError> {
    let mut plan = Plan::default();
    for (i, sh) in spec.shares.iter().enumerate() {
        if sh.source == Path::new(NIX_STORE) {
            continue;
        }
        match nix::sys::stat::lstat(&sh.source) {
            Err(Errno::ENOENT) => {}
            // It exists (or cannot be told): the share's own walk judges it.
            _ => continue,
        }
        let bad = |reason: String| SpecError::Invalid {
            path: spec_path.to_path_buf(),
            field: format!("shares[{i}].source"),
            reason,
        };
        // A read-only share's missing source was refused with the spec.
        if sh.read_only {
            continue;
        }
        let path = show(&sh.source);
        // One missing directory is made once, for one share: a second
        // share of it would find it made by the first ("appeared since the
        // pre-flight") and fail every start after making it.
        if let Some(j) = spec.shares[..i].iter().position(|o| o.source == sh.source) {
            return Err(bad(format!(
                "{path} does not exist, and is also shares[{j}].source: vmwarden makes a missing source for one share; give each share its own source, or make it yourself (the principal's)"
            )));
        }
        if let Some(below) = below_state_dir(&sh.source, state_dir) {
            // An adoption of this VM is unfinished: what it has yet to move
            // in is not made empty in its place (`vmwarden adopt` brings it).
            let adopting = state_dir
                .parent()
                .map(|r| r.join(adopt_record_name(&spec.name)))
                .filter(|r| r.symlink_metadata().is_ok());
            if let Some(record) = adopting {
                return Err(bad(format!(
                    "{path} does not exist, and is not made for share {:?}: the adoption of {} is unfinished ({}); run `vmwarden adopt` again to bring it",
                    sh.tag,
                    spec.name,
                    show(&record)
                )));
            }
            in_state_dir_ok(state_dir, &below, principal_uid).map_err(|why| {
                bad(format!(
                    "{path} does not exist, and is not made for share {:?}: {why}",
                    sh.tag
                ))
            })?;
            plan.0.push(ToMake {
                index: i,
                path: sh.source.clone(),
                place: Place::StateDir { below },
            });
            continue;
        }
        let (parent, name) = made_sources::open_parent(&sh.source).map_err(|e| {
            bad(format!(
                "{path} does not exist, and is not made for share {:?}: {e}",
                sh.tag
            ))
        })?;
        if !matches!(made_sources::stat_at(&parent, &name), Ok(None)) {
            continue;
        }
        plan.0.push(ToMake {
            index: i,
            path: sh.source.clone(),
            place: Place::Root { parent, name },
        });
    }
    Ok(plan)
}

/// `source`'s components below `state_dir`, when it lies inside (none
/// when it is the state directory itself: the `state-dir` step makes that
/// one, the principal's 0700, before [`make`]).
fn below_state_dir(source: &Path, state_dir: &Path) -> Option<PathBuf> {
    Some(source.strip_prefix(state_dir).ok()?.to_path_buf())
}

/// Each component of `below` that exists under `state_dir` is a directory
/// (a symlink is refused: the principal may have put it there) that
/// nobody but the principal and root may change ([`kept`]). Read without
/// following anything; [`make`] checks again by descriptor.
fn in_state_dir_ok(state_dir: &Path, below: &Path, uid: u32) -> Result<(), String> {
    let mut at = state_dir.to_path_buf();
    for c in below.components() {
        at.push(c);
        match std::fs::symlink_metadata(&at) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(format!("{}: {e}", show(&at))),
            Ok(m) if m.file_type().is_symlink() => {
                return Err(format!(
                    "{} is a symlink inside the VM's state directory",
                    show(&at)
                ))
            }
            Ok(m) if !m.is_dir() => return Err(format!("{} is not a directory", show(&at))),
            Ok(m) => {
                use std::os::unix::fs::MetadataExt;
                kept(m.uid(), m.mode(), uid).map_err(|why| format!("{} {why}", show(&at)))?;
            }
        }
    }
    Ok(())
}

/// A directory on the way to a source inside the state directory is one
/// the principal (or root) keeps from everyone else: in one another user
/// owns or may write, they choose what each name holds between the open
/// and the `mkdirat` (through a descriptor opened while they could reach
/// it), and the principal would be given what they put there.
fn kept(owner: u32, mode: u32, principal_uid: u32) -> Result<(), String> {
    if owner != principal_uid && owner != 0 {
        return Err(format!("is owned by uid {owner}, not the VM's principal ({principal_uid}) or root, inside the VM's state directory; fix its owner, or make the source yourself"));
    }
    if mode & 0o002 != 0 {
        return Err(format!(
            "has mode {:o}: everyone can change it, inside the VM's state directory; chmod o-w it, or make the source yourself",
            mode & 0o7777
        ));
    }
    Ok(())
}

/// What the intent record names before any of it exists.
/// (A source inside the state directory is part of it: not named.)
pub fn records(plan: &Plan) -> Vec<Resource> {
    plan.0
        .iter()
        .filter(|t| matches!(t.place, Place::Root { .. }))
        .map(|t| Resource::ShareSource {
            path: t.path.clone(),
        })
        .collect()
}

/// Why a share source could not be made.
#[derive(Debug, thiserror::Error)]
pub enum MakeError {
    #[error(transparent)]
    Sys(#[from] SysError),
    /// Something made the name between the pre-flight and `mkdir`: not
    /// vmwarden's, so not taken over.
    #[error("{0}: appeared since the pre-flight; vmwarden does not take over a directory it did not make; start again")]
    Appeared(PathBuf),
    #[error(transparent)]
    Record(#[from] made_sources::MadeError),
    /// A directory on the way inside the state directory changed since
    /// the pre-flight to one someone else may change (`kept`).
    #[error("{0}")]
    NotKept(String),
}

/// Make each source: `mkdirat` in its parent (never over an existing
/// name), then the new directory opened without following a link, given
/// to the principal and set to 0700 by its descriptor, the parent synced.
pub fn make(
    plan: &Plan,
    principal: &Principal,
    state_dir: &Dir,
) -> Result<Vec<MadeSource>, MakeError> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut made = Vec::new();
    for t in &plan.0 {
        let (parent, name) = match &t.place {
            Place::Root { parent, name } => (parent, name),
            Place::StateDir { below } => {
                make_in_state_dir(state_dir, below, &t.path, principal)?;
                continue;
            }
        };
        let fd = make_one(parent.fd.as_fd(), name, &t.path, principal)?;
        let st = fstat(fd.as_fd()).sys("fstat", &t.path)?;
        nix::unistd::fsync(parent.fd.as_fd()).sys("fsync", &parent.path)?;
        tracing::info!(step = %"share-sources-made", source = %show(&t.path), uid = principal.uid, "share source made (mode 0700)");
        made.push(MadeSource {
            path: t.path.clone(),
            dev: st.st_dev,
            ino: st.st_ino,
            uid: principal.uid,
            made_unix: now,
            btime: made_sources::btime(fd.as_fd(), OsStr::new("")),
        });
    }
    Ok(made)
}

/// `mkdirat` `name` in `parent` (never over an existing name), then the
/// new directory opened without following a link, given to the principal
/// and set to 0700 by its descriptor.
fn make_one(
    parent: BorrowedFd<'_>,
    name: &OsStr,
    path: &Path,
    principal: &Principal,
) -> Result<OwnedFd, MakeError> {
    match mkdirat(parent, name, Mode::from_bits_truncate(0o700)) {
        Err(Errno::EEXIST) => return Err(MakeError::Appeared(path.to_path_buf())),
        r => r.sys("mkdir", path)?,
    }
    let fd = open_below(parent, name, path)?;
    // Still the directory just made (root's 0700, as `mkdirat` left it),
    // not one swapped in at the name since: never given away.
    let st = fstat(fd.as_fd()).sys("fstat", path)?;
    if st.st_uid != 0 || st.st_mode & 0o077 != 0 {
        return Err(MakeError::Appeared(path.to_path_buf()));
    }
    fchown(
        fd.as_fd(),
        Some(Uid::from_raw(principal.uid)),
        Some(Gid::from_raw(principal.gid)),
    )
    .sys("fchown", path)?;
    fchmod(fd.as_fd(), Mode::from_bits_truncate(0o700)).sys("fchmod", path)?;
    Ok(fd)
}

fn open_below(parent: BorrowedFd<'_>, name: &OsStr, path: &Path) -> Result<OwnedFd, MakeError> {
    Ok(openat(
        parent,
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .sys("open", path)?)
}

/// A source inside the state directory: each component opened from the
/// state directory's descriptor without following a link (a symlink or a
/// file on the way fails the open), each missing one made the
/// principal's 0700.
fn make_in_state_dir(
    state_dir: &Dir,
    below: &Path,
    path: &Path,
    principal: &Principal,
) -> Result<(), MakeError> {
    let mut at: Option<OwnedFd> = None;
    let mut shown = state_dir.path.clone();
    for c in below.components() {
        let name = c.as_os_str();
        shown.push(name);
        let parent = at.as_ref().map_or(state_dir.fd.as_fd(), |f| f.as_fd());
        let fd = match open_below(parent, name, &shown) {
            Err(MakeError::Sys(e)) if e.errno == Errno::ENOENT => {
                let fd = make_one(parent, name, &shown, principal)?;
                nix::unistd::fsync(parent).sys("fsync", shown.parent().unwrap_or(&shown))?;
                fd
            }
            r => {
                let fd = r?;
                let st = fstat(fd.as_fd()).sys("fstat", &shown)?;
                if let Err(why) = kept(st.st_uid, st.st_mode, principal.uid) {
                    return Err(MakeError::NotKept(format!("{} {why}", show(&shown))));
                }
                fd
            }
        };
        at = Some(fd);
    }
    tracing::info!(step = %"share-sources-made", source = %show(path), uid = principal.uid, "share source made in the VM's state directory (mode 0700)");
    Ok(())
}

/// Keep what [`make`] made in the VM's record of made sources, durably.
pub fn record(state_root: &Dir, name: &VmName, made: Vec<MadeSource>) -> Result<(), MakeError> {
    if made.is_empty() {
        return Ok(());
    }
    let mut rec = MadeSources::read(state_root, name)?;
    rec.vm = name.to_string();
    for m in made {
        rec.put(m);
    }
    rec.write(state_root, name)?;
    Ok(())
}
