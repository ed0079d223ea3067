//! A rule's path resolved on the host component by component, each host
//! path met looked up once per plan ([`HostPaths`]).

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};

/// Symlinks followed while one path is resolved before `ELOOP`.
pub(super) const MAX_LINKS: usize = 40;

/// What one host path with no symlink before it is, as [`resolve`] met it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Node {
    /// `lstat` failed (the host lacks it, or the principal cannot reach
    /// it), or it is a symlink `readlink` failed on.
    Absent,
    /// A symlink, and its target.
    Link(PathBuf),
    /// Anything else.
    Other,
}

/// The host paths one [`plan`](super::plan) has looked at: the rules share their
/// prefixes (`/nix`, `/nix/store`, `/usr`, the runtime root and the VM's
/// dir under it), and each is `lstat`ed (and read, a symlink) once, not
/// once per rule that goes through it. Only for one plan: the host may
/// change between launches.
#[derive(Debug, Default)]
pub(super) struct HostPaths {
    pub(super) seen: HashMap<PathBuf, Node>,
    /// `lstat`s made (the tests count them).
    pub(super) lookups: usize,
}

impl HostPaths {
    fn node(&mut self, path: &Path) -> &Node {
        if !self.seen.contains_key(path) {
            self.lookups += 1;
            let node = match std::fs::symlink_metadata(path) {
                Ok(md) if md.file_type().is_symlink() => match std::fs::read_link(path) {
                    Ok(target) => Node::Link(target),
                    Err(_) => Node::Absent,
                },
                Ok(_) => Node::Other,
                Err(_) => Node::Absent,
            };
            self.seen.insert(path.to_path_buf(), node);
        }
        &self.seen[path]
    }
}

/// Resolve `path` on the host component by component, as the kernel would,
/// recording every symlink met (its location, with no symlink before it,
/// and its target); the real path, or `None` when the host lacks it.
/// `host`: what the plan's earlier paths found on the way.
pub(super) fn resolve(
    path: &Path,
    host: &mut HostPaths,
    links: &mut Vec<(PathBuf, PathBuf)>,
) -> Option<PathBuf> {
    let mut cur = PathBuf::from("/");
    let mut hops = 0;
    // Pending components, last first; a symlink's target's go on top.
    let mut pending: Vec<std::ffi::OsString> = path
        .components()
        .rev()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some("..".into()),
            _ => None,
        })
        .collect();
    while let Some(name) = pending.pop() {
        if name == ".." {
            cur.pop();
            continue;
        }
        let next = cur.join(&name);
        match host.node(&next) {
            Node::Absent => return None,
            Node::Other => cur = next,
            Node::Link(target) => {
                hops += 1;
                if hops > MAX_LINKS {
                    return None;
                }
                if target.is_absolute() {
                    cur = PathBuf::from("/");
                }
                for c in target.components().rev() {
                    match c {
                        Component::Normal(n) => pending.push(n.to_os_string()),
                        Component::ParentDir => pending.push("..".into()),
                        _ => {}
                    }
                }
                links.push((next, target.clone()));
            }
        }
    }
    Some(cur)
}
