//! What cleanup and `purge` do with the share sources the launcher made
//! (`launch::share_sources`, `instance::made_sources`).
//!
//! * cleanup keeps one the record names (the VM's data), and removes one
//!   the intent record names but the made-sources record does not — a
//!   launch killed between its `mkdir` and its record — while it is an
//!   empty private (0700) directory of the principal's or root's (never followed, reached
//!   through a parent of root's alone); anything else there is kept, named.
//! * purge deletes one the record names when it is still that very
//!   directory (same `st_dev` and `st_ino`) and still the principal's (or
//!   one of the VM's own ids, which the guest may give its share root),
//!   through the deletion purge uses in the state dir
//!   (`host::ownership::delete_entries`: any depth, never a symlink, never
//!   another file system, each deletion re-checked), and says "kept: not
//!   made by vmwarden" of a writable share's source that existed before.

use std::os::fd::AsFd;
use std::path::PathBuf;

use serde::Serialize;

use crate::config::names::VmName;
use crate::config::paths::Roots;
use crate::config::rawpath;
use crate::config::spec::Spec;
use crate::host::dirs;
use crate::host::ownership::{self, Failed, Kept, Outcome};
use crate::identity::registry::IdRange;
use crate::instance::intent::{Intent, Resource};
use crate::instance::made_sources::{btime, open_parent, stat_at, MadeSource, MadeSources};

fn is_dir(mode: u32) -> bool {
    mode & libc::S_IFMT == libc::S_IFDIR
}

/// Cleanup: each share source the intent record names (see the module docs).
pub fn cleanup(roots: &Roots, name: &VmName, intent: Option<&Intent>) -> Outcome {
    let mut out = Outcome::default();
    let Some(intent) = intent else { return out };
    let paths: Vec<&PathBuf> = intent
        .resources
        .iter()
        .filter_map(|r| match r {
            Resource::ShareSource { path } => Some(path),
            _ => None,
        })
        .collect();
    if paths.is_empty() {
        return out;
    }
    let record = match MadeSources::read_at(&roots.state_root, name) {
        Ok(r) => r,
        Err(e) => {
            out.failed.push(Failed {
                path: roots.state_root.clone(),
                reason: format!("the record of the share sources vmwarden made: {e}"),
            });
            return out;
        }
    };
    for path in paths {
        let keep = |reason: String| Kept {
            path: path.clone(),
            reason,
        };
        let (parent, file) = match open_parent(path) {
            Ok(p) => p,
            Err(e) => {
                out.kept
                    .push(keep(format!("share source: not reached ({e}); left")));
                continue;
            }
        };
        let st = match stat_at(&parent, &file) {
            Ok(Some(st)) => st,
            // Never made (the launch stopped before it).
            Ok(None) => continue,
            Err(e) => {
                out.failed.push(Failed {
                    path: path.clone(),
                    reason: format!("stat: {e}"),
                });
                continue;
            }
        };
        let born = btime(parent.fd.as_fd(), &file);
        if record.find(path).is_some_and(|m| m.is(&st, born)) {
            out.kept.push(keep(
                "share source made by vmwarden: the VM's data; only `vmwarden purge` deletes it"
                    .into(),
            ));
            continue;
        }
        // As the launch leaves it at each moment: root's (before its
        // `fchown`) or the principal's, private (`mkdirat` 0700). Root's
        // 0755 there is someone's by hand since the kill: not taken.
        let owner_ok = st.st_uid == intent.principal.uid || st.st_uid == 0;
        if !is_dir(st.st_mode) || !owner_ok || st.st_mode & 0o077 != 0 {
            out.kept.push(keep(format!(
                "share source: not made by vmwarden (owner uid {}, mode {:o}); left",
                st.st_uid,
                st.st_mode & 0o7777
            )));
            continue;
        }
        // Made by a launch killed before it recorded it: empty, it goes
        // (the next launch makes it again).
        match nix::unistd::unlinkat(
            parent.fd.as_fd(),
            file.as_os_str(),
            nix::unistd::UnlinkatFlags::RemoveDir,
        ) {
            Ok(()) if matches!(stat_at(&parent, &file), Ok(None)) => {
                out.deleted.push(path.clone())
            }
            Ok(()) => out.failed.push(Failed {
                path: path.clone(),
                reason: "rmdir succeeded but the path still exists".into(),
            }),
            Err(nix::errno::Errno::ENOTEMPTY | nix::errno::Errno::EEXIST) => out.kept.push(keep(
                "share source: made by a launch that did not record it, and not empty; left (`vmwarden purge` does not delete it)".into(),
            )),
            Err(e) => out.failed.push(Failed {
                path: path.clone(),
                reason: format!("rmdir of a share source a killed launch made: {e}"),
            }),
        }
    }
    out
}

/// What purge does with a share source, and why.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct SourceFate {
    #[serde(serialize_with = "rawpath::path")]
    pub path: PathBuf,
    /// `delete` or `keep`.
    pub action: &'static str,
    pub reason: String,
    /// The record's entry (a source vmwarden made), checked again before
    /// the deletion.
    #[serde(skip)]
    made: Option<MadeSource>,
}

/// Purge's plan for the share sources: every one the record names, and
/// every writable share's source outside the state dir that it does not.
pub fn plan(
    roots: &Roots,
    name: &VmName,
    spec: Option<&Spec>,
    uid: Option<u32>,
    range: Option<IdRange>,
) -> Vec<SourceFate> {
    let own = roots.state_dir(name);
    let fate = |path: &PathBuf, action, reason: String, made| SourceFate {
        path: path.clone(),
        action,
        reason,
        made,
    };
    let record = match MadeSources::read_at(&roots.state_root, name) {
        Ok(r) => r,
        Err(e) => {
            return vec![fate(
                &roots.state_root,
                "keep",
                format!("the record of the share sources vmwarden made cannot be read ({e}); every share source is kept"),
                None,
            )]
        }
    };
    let mut out = Vec::new();
    for m in &record.sources {
        let st = match open_parent(&m.path) {
            Ok((parent, file)) => stat_at(&parent, &file)
                .map(|st| st.map(|st| (st, btime(parent.fd.as_fd(), &file))))
                .map_err(|e| format!("stat: {e}")),
            Err(e) => Err(e.to_string()),
        };
        let ours = |u: u32| Some(u) == uid || u == m.uid || range.is_some_and(|r| r.contains(u));
        let (action, reason) = match st {
            Err(e) => ("keep", format!("made by vmwarden, but not reached: {e}")),
            Ok(None) => ("keep", "made by vmwarden, and gone already".to_string()),
            Ok(Some((st, born))) if !m.is(&st, born) => (
                "keep",
                format!(
                    "not the directory vmwarden made (inode {}:{} now, {}:{} made{}): not made by vmwarden",
                    st.st_dev,
                    st.st_ino,
                    m.dev,
                    m.ino,
                    if st.st_dev == m.dev && st.st_ino == m.ino {
                        ", the number given again to a directory born since"
                    } else {
                        ""
                    }
                ),
            ),
            Ok(Some((st, _))) if !ours(st.st_uid) => (
                "keep",
                format!(
                    "made by vmwarden, but now owned by uid {}, not the VM's",
                    st.st_uid
                ),
            ),
            Ok(Some(_)) => (
                "delete",
                format!(
                    "share source made by vmwarden for this VM (inode {}:{}), with everything in it",
                    m.dev, m.ino
                ),
            ),
        };
        out.push(fate(&m.path, action, reason, Some(m.clone())));
    }
    for sh in spec.map(|s| s.shares.as_slice()).unwrap_or_default() {
        if sh.read_only || sh.source.starts_with(&own) || record.find(&sh.source).is_some() {
            continue;
        }
        out.push(fate(
            &sh.source,
            "keep",
            "not made by vmwarden".into(),
            None,
        ));
    }
    out
}

/// Delete the sources [`plan`] would, each checked again to be the very
/// directory made; then keep in the record only what is still there.
pub fn execute(roots: &Roots, name: &VmName, fates: &[SourceFate]) -> Outcome {
    let mut out = Outcome::default();
    for f in fates.iter().filter(|f| f.action == "delete") {
        let Some(m) = &f.made else { continue };
        let fail = |reason: String| Failed {
            path: f.path.clone(),
            reason,
        };
        match open_parent(&m.path) {
            Ok((parent, file)) => match stat_at(&parent, &file) {
                Ok(Some(st)) if m.is(&st, btime(parent.fd.as_fd(), &file)) => {
                    out.merge(ownership::delete_entries(&parent, &[file], None))
                }
                Ok(_) => out.kept.push(Kept {
                    path: f.path.clone(),
                    reason: "changed since the plan: not the directory vmwarden made; kept".into(),
                }),
                Err(e) => out.failed.push(fail(format!("stat: {e}"))),
            },
            Err(e) => out.failed.push(fail(e.to_string())),
        }
    }
    // The record keeps what is still there as made (a deletion that
    // failed, to try again); the rest is not vmwarden's any more.
    let state_root = match dirs::open_dir_if_exists(&roots.state_root) {
        Ok(Some(d)) => d,
        Ok(None) => return out,
        Err(e) => {
            out.failed.push(Failed {
                path: roots.state_root.clone(),
                reason: e.to_string(),
            });
            return out;
        }
    };
    let result = MadeSources::read(&state_root, name).and_then(|mut rec| {
        rec.sources.retain(|m| {
            open_parent(&m.path)
                .ok()
                .and_then(|(p, f)| {
                    let st = stat_at(&p, &f).ok().flatten()?;
                    Some(m.is(&st, btime(p.fd.as_fd(), &f)))
                })
                .unwrap_or(false)
        });
        rec.write(&state_root, name)
    });
    if let Err(e) = result {
        out.failed.push(Failed {
            path: state_root.path.clone(),
            reason: format!("the record of the share sources vmwarden made: {e}"),
        });
    }
    out
}
