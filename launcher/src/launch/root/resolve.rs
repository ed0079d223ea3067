//! A rule's path resolved on the host component by component, each host
//! path met looked up once per plan ([`HostPaths`]).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

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
    /// A directory.
    Dir,
    /// Anything else: nothing may follow it, not even `.`, `..` or a
    /// trailing `/` (the kernel's `ENOTDIR`).
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
                Ok(md) if md.is_dir() => Node::Dir,
                Ok(_) => Node::Other,
                Err(_) => Node::Absent,
            };
            self.seen.insert(path.to_path_buf(), node);
        }
        &self.seen[path]
    }
}

/// One step of a path: what the kernel walks, `.` and a trailing `/`
/// kept (each needs a directory before it, as [`Path::components`] does
/// not say).
enum Step<'a> {
    Name(&'a OsStr),
    /// `.`, or the empty name after a trailing `/`.
    Here,
    Up,
}

/// The steps of `path`, last first (a stack); a leading `/` is the walk's
/// start, `//` one `/`.
fn steps(path: &Path) -> Vec<Step<'_>> {
    let bytes = path.as_os_str().as_bytes();
    let parts: Vec<&[u8]> = bytes.split(|b| *b == b'/').collect();
    let last = parts.len().saturating_sub(1);
    let mut out: Vec<Step<'_>> = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        match *part {
            b"" if i == last && i > 0 => out.push(Step::Here),
            b"" => {}
            b"." => out.push(Step::Here),
            b".." => out.push(Step::Up),
            name => out.push(Step::Name(OsStr::from_bytes(name))),
        }
    }
    out.reverse();
    out
}

/// Resolve `path` on the host component by component, as the kernel would,
/// recording every symlink met (its location, with no symlink before it,
/// and its target); the real path, or `None` when the host lacks it (or
/// the kernel's walk would fail: a step after a non-directory, `ELOOP`).
/// `host`: what the plan's earlier paths found on the way.
pub(super) fn resolve(
    path: &Path,
    host: &mut HostPaths,
    links: &mut Vec<(PathBuf, PathBuf)>,
) -> Option<PathBuf> {
    let mut cur = PathBuf::from("/");
    // Whether `cur` is a directory (`/` is).
    let mut dir = true;
    let mut hops = 0;
    // Pending steps, last first; a symlink's target's go on top (owned:
    // the memo is borrowed again before they are all taken).
    let owned = |s: Step<'_>| match s {
        Step::Name(n) => Owned::Name(n.to_os_string()),
        Step::Here => Owned::Here,
        Step::Up => Owned::Up,
    };
    let mut stack: Vec<Owned> = steps(path).into_iter().map(owned).collect();
    while let Some(step) = stack.pop() {
        if !dir {
            return None;
        }
        let name = match step {
            Owned::Here => continue,
            Owned::Up => {
                cur.pop();
                continue;
            }
            Owned::Name(n) => n,
        };
        let next = cur.join(&name);
        match host.node(&next) {
            Node::Absent => return None,
            Node::Dir => cur = next,
            Node::Other => {
                cur = next;
                dir = false;
            }
            Node::Link(target) => {
                hops += 1;
                if hops > MAX_LINKS {
                    return None;
                }
                let target = target.clone();
                if target.as_os_str().is_empty() {
                    return None;
                }
                if target.is_absolute() {
                    cur = PathBuf::from("/");
                }
                stack.extend(steps(&target).into_iter().map(owned));
                links.push((next, target));
            }
        }
    }
    Some(cur)
}

/// A [`Step`] that owns its name.
enum Owned {
    Name(std::ffi::OsString),
    Here,
    Up,
}
