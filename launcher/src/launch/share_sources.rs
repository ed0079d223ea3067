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

use std::ffi::OsString;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{fchmod, fstat, mkdirat, Mode};
use nix::unistd::{fchown, Gid, Uid};

use crate::config::names::VmName;
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
    /// Its parent, opened at the pre-flight (root's alone).
    parent: Dir,
    name: OsString,
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
pub fn preflight(spec: &Spec, spec_path: &Path) -> Result<Plan, SpecError> {
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
            parent,
            name,
        });
    }
    Ok(plan)
}

/// What the intent record names before any of it exists.
pub fn records(plan: &Plan) -> Vec<Resource> {
    plan.0
        .iter()
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
}

/// Make each source: `mkdirat` in its parent (never over an existing
/// name), then the new directory opened without following a link, given
/// to the principal and set to 0700 by its descriptor, the parent synced.
pub fn make(plan: &Plan, principal: &Principal) -> Result<Vec<MadeSource>, MakeError> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut made = Vec::new();
    for t in &plan.0 {
        match mkdirat(
            t.parent.fd.as_fd(),
            t.name.as_os_str(),
            Mode::from_bits_truncate(0o700),
        ) {
            Err(Errno::EEXIST) => return Err(MakeError::Appeared(t.path.clone())),
            r => r.sys("mkdir", &t.path)?,
        }
        let fd = openat(
            t.parent.fd.as_fd(),
            t.name.as_os_str(),
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .sys("open", &t.path)?;
        fchown(
            fd.as_fd(),
            Some(Uid::from_raw(principal.uid)),
            Some(Gid::from_raw(principal.gid)),
        )
        .sys("fchown", &t.path)?;
        fchmod(fd.as_fd(), Mode::from_bits_truncate(0o700)).sys("fchmod", &t.path)?;
        let st = fstat(fd.as_fd()).sys("fstat", &t.path)?;
        nix::unistd::fsync(t.parent.fd.as_fd()).sys("fsync", &t.parent.path)?;
        tracing::info!(step = %"share-sources-made", source = %show(&t.path), uid = principal.uid, "share source made (mode 0700)");
        made.push(MadeSource {
            path: t.path.clone(),
            dev: st.st_dev,
            ino: st.st_ino,
            uid: principal.uid,
            made_unix: now,
        });
    }
    Ok(made)
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
