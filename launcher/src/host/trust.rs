//! Trust in a path: can anyone but root change what it names?
//!
//! Root runs the launcher and reads (credentials) or hands to the
//! hypervisor (kernel, initrd, hypervisor binary) files named by the spec.
//! Whoever can replace such a file, or any directory on the way to it,
//! chooses what root reads or what the VM boots. So the path is walked from
//! `/` one component at a time with `O_PATH|O_NOFOLLOW`, and every entry on
//! the way must be owned by root and writable by root only.
//!
//! Two policies:
//!
//! * [`Policy::Secret`] (credential sources): no symlink anywhere, and no
//!   directory writable by its group or by everyone — sticky or not, so
//!   `/tmp` and `/dev/shm` are refused.
//! * [`Policy::Executable`] (hypervisor binary, kernel, initrd): symlinks
//!   are followed component by component (NixOS paths such as
//!   `/run/current-system/sw/bin/qemu-system-x86_64` are chains of links
//!   into `/nix/store`), and every directory traversed, including those a
//!   link leads through, is checked. One exception: a root-owned *sticky*
//!   directory that its group may write but everyone may not (the Nix
//!   store, `root:nixbld 1775`). Its group can add entries but cannot
//!   rename, remove or replace an entry it does not own, and every entry
//!   taken from it must itself be root-owned, so nothing on the path can
//!   change under root. A world-writable directory (`/tmp`, sticky or not)
//!   is never accepted: anyone may squat names there, and tmp cleaners
//!   delete what they like.
//!
//! Knows nothing of specs or VMs; the launcher maps a refusal to the field.

use std::collections::{BTreeMap, VecDeque};
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::rc::Rc;

use nix::errno::Errno;
use nix::fcntl::{openat, readlinkat, OFlag, AT_FDCWD};
use nix::sys::stat::{fstat, FileStat, Mode};

use crate::config::files::Kind;
use crate::config::names::check_abs_normalised;

const S_ISVTX: u32 = 0o1000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    Secret,
    Executable,
}

pub use crate::config::files::{Distrust, MAX_LINKS};

/// The end of a trusted walk.
#[derive(Debug)]
pub struct Walked {
    /// The directory holding the final entry (`O_PATH`; shared with the
    /// [`Walker`]'s cache, which may hand it to later walks).
    pub parent: Rc<OwnedFd>,
    /// The final entry's name in `parent`.
    pub name: OsString,
    /// The final entry (`O_PATH`, not followed).
    pub fd: OwnedFd,
    pub stat: FileStat,
    /// The path with every symlink resolved.
    pub resolved: PathBuf,
}

/// An entry met on the way to a final one, kept by a [`Walker`].
#[derive(Debug)]
enum Seen {
    /// A directory: its `O_PATH` fd, to open the next component under.
    Dir(Rc<OwnedFd>),
    /// A symlink: its target.
    Link(PathBuf),
}

/// Trusted walks that share their way: every directory and symlink met
/// before a final entry is opened (`O_PATH|O_NOFOLLOW`) and `fstat`ed once
/// and kept with its stat, by the path it was reached at (symlinks before
/// it resolved). A later walk through the same prefix — the spec, a
/// credential and the hypervisor under one config dir or the Nix store —
/// takes the kept fd and stat instead of opening the entry again, and
/// applies its own checks to that stat exactly as to a fresh one (owner,
/// the policy's mode rule, no symlink for secrets), so a walk refuses what
/// a fresh walk would. Final entries are always opened fresh.
///
/// For one launch: what it keeps is what was true when first met, which
/// only root can change (every entry kept is root's and writable by root
/// only; the sticky store's group can add entries, never replace one).
#[derive(Debug)]
pub struct Walker {
    /// What stands for `/` (absolute symlink targets restart there).
    top: PathBuf,
    /// The one trusted uid: root in production; the unit tests use a
    /// temporary tree and their own uid, so they need no root.
    owner: u32,
    /// A `BTreeMap`: a `HashMap` would seed its hasher with a `getrandom`.
    seen: BTreeMap<PathBuf, (Seen, FileStat)>,
}

impl Default for Walker {
    fn default() -> Self {
        Walker::new()
    }
}

impl Walker {
    /// Walks from the real `/`, trusting root.
    pub fn new() -> Walker {
        Walker::with_top(Path::new("/"), 0)
    }

    fn with_top(top: &Path, owner: u32) -> Walker {
        Walker {
            top: top.to_path_buf(),
            owner,
            seen: BTreeMap::new(),
        }
    }

    /// [`walk`], sharing this walker's open directories.
    pub fn walk(&mut self, path: &Path, policy: Policy) -> Result<Walked, Distrust> {
        check_abs_normalised(path).map_err(|reason| Distrust::BadPath {
            path: path.to_path_buf(),
            reason,
        })?;
        self.walk_in(path, policy)
    }

    /// [`regular_file`], sharing this walker's open directories.
    pub fn regular_file(&mut self, path: &Path, policy: Policy) -> Result<Walked, Distrust> {
        require_regular(self.walk(path, policy)?)
    }

    /// `dir/name` (the entry reached at `p`): from the cache, or opened
    /// (`O_PATH|O_NOFOLLOW`) and stat'ed now. `keep`: an entry met on the
    /// way (not the final one), which the cache keeps if it is a directory
    /// or a symlink.
    fn entry(
        &mut self,
        dir: &OwnedFd,
        c: &OsStr,
        p: &Path,
        keep: bool,
    ) -> Result<(Option<OwnedFd>, FileStat), Distrust> {
        if keep {
            if let Some((_, st)) = self.seen.get(p) {
                return Ok((None, *st));
            }
        }
        let fd = openat(dir.as_fd(), c, ENTRY_FLAGS, Mode::empty()).map_err(sys(p, "open"))?;
        let st = fstat(fd.as_fd()).map_err(sys(p, "fstat"))?;
        Ok((Some(fd), st))
    }

    fn walk_in(&mut self, path: &Path, policy: Policy) -> Result<Walked, Distrust> {
        let owner = self.owner;
        let top = self.top.clone();
        let (root, st) = match self.seen.get(Path::new("/")) {
            Some((Seen::Dir(fd), st)) => (Rc::clone(fd), *st),
            _ => {
                let fd = openat(
                    AT_FDCWD,
                    &top,
                    ENTRY_FLAGS | OFlag::O_DIRECTORY,
                    Mode::empty(),
                )
                .map_err(sys(&top, "open"))?;
                let st = fstat(fd.as_fd()).map_err(sys(&top, "fstat"))?;
                let fd = Rc::new(fd);
                self.seen
                    .insert(PathBuf::from("/"), (Seen::Dir(Rc::clone(&fd)), st));
                (fd, st)
            }
        };
        if st.st_uid != owner {
            return Err(Distrust::NotRootOwned {
                path: top.clone(),
                uid: st.st_uid,
            });
        }
        check_dir(&top, &st, policy)?;
        let mut stack: Vec<(Rc<OwnedFd>, PathBuf)> = vec![(root, PathBuf::from("/"))];
        let mut queue = VecDeque::new();
        push_front_components(&mut queue, path);
        let mut links = 0;
        while let Some(c) = queue.pop_front() {
            if c == OsStr::new("..") {
                if stack.len() > 1 {
                    stack.pop();
                }
                continue;
            }
            let (dir, dir_path) = stack.last().expect("the root is never popped");
            let dir = Rc::clone(dir);
            let p = dir_path.join(&c);
            let on_the_way = !queue.is_empty();
            let (fd, st) = self.entry(&dir, &c, &p, on_the_way)?;
            if st.st_uid != owner {
                return Err(Distrust::NotRootOwned {
                    path: p,
                    uid: st.st_uid,
                });
            }
            match Kind::of(st.st_mode) {
                Kind::Symlink => {
                    if policy == Policy::Secret {
                        return Err(Distrust::Symlink { path: p });
                    }
                    links += 1;
                    if links > MAX_LINKS {
                        return Err(Distrust::TooManyLinks {
                            path: path.to_path_buf(),
                        });
                    }
                    let target = match self.seen.get(&p) {
                        Some((Seen::Link(t), _)) => t.clone(),
                        _ => {
                            let t = PathBuf::from(
                                readlinkat(dir.as_fd(), c.as_os_str())
                                    .map_err(sys(&p, "readlink"))?,
                            );
                            if on_the_way {
                                self.seen.insert(p.clone(), (Seen::Link(t.clone()), st));
                            }
                            t
                        }
                    };
                    if target.is_absolute() {
                        stack.truncate(1);
                    }
                    push_front_components(&mut queue, &target);
                }
                Kind::Directory if on_the_way => {
                    check_dir(&p, &st, policy)?;
                    let fd = match (fd, self.seen.get(&p)) {
                        (None, Some((Seen::Dir(fd), _))) => Rc::clone(fd),
                        (Some(fd), _) => {
                            let fd = Rc::new(fd);
                            self.seen.insert(p.clone(), (Seen::Dir(Rc::clone(&fd)), st));
                            fd
                        }
                        // The cache holds every entry it answers for.
                        (None, _) => unreachable!("a cached directory without its fd"),
                    };
                    stack.push((fd, p));
                }
                kind => {
                    if on_the_way {
                        return Err(Distrust::Sys {
                            path: p,
                            op: "open",
                            errno: Errno::ENOTDIR,
                        });
                    }
                    match kind {
                        Kind::Directory => check_dir(&p, &st, policy)?,
                        Kind::Regular => check_file(&p, &st)?,
                        // A FIFO, socket or device is never a trusted file.
                        kind => {
                            return Err(Distrust::WrongKind {
                                path: p,
                                kind,
                                want: "a regular file",
                            })
                        }
                    }
                    let fd = fd.expect("a final entry is always opened");
                    let (parent, _) = stack.pop().expect("the root is never popped");
                    return Ok(Walked {
                        parent,
                        name: c,
                        fd,
                        stat: st,
                        resolved: p,
                    });
                }
            }
        }
        Err(Distrust::BadPath {
            path: path.to_path_buf(),
            reason: "names a directory, not a file",
        })
    }
}

const ENTRY_FLAGS: OFlag = OFlag::O_PATH
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

fn sys<'a>(path: &'a Path, op: &'static str) -> impl FnOnce(Errno) -> Distrust + 'a {
    move |errno| Distrust::Sys {
        path: path.to_path_buf(),
        op,
        errno,
    }
}

/// The group/world write check of a directory (its owner is checked with
/// every entry).
fn check_dir(path: &Path, st: &FileStat, policy: Policy) -> Result<(), Distrust> {
    let mode = st.st_mode & 0o7777;
    let who = match (mode & 0o020 != 0, mode & 0o002 != 0) {
        (_, true) if mode & 0o020 != 0 => "its group and everyone",
        (_, true) => "everyone",
        (true, false) if policy == Policy::Executable && mode & S_ISVTX != 0 => return Ok(()),
        (true, false) => "its group",
        (false, false) => return Ok(()),
    };
    Err(Distrust::Writable {
        path: path.to_path_buf(),
        mode,
        who,
    })
}

/// A file at the end of the walk: root's, and writable by root only.
fn check_file(path: &Path, st: &FileStat) -> Result<(), Distrust> {
    let mode = st.st_mode & 0o7777;
    let who = match (mode & 0o020 != 0, mode & 0o002 != 0) {
        (true, true) => "its group and everyone",
        (false, true) => "everyone",
        (true, false) => "its group",
        (false, false) => return Ok(()),
    };
    Err(Distrust::Writable {
        path: path.to_path_buf(),
        mode,
        who,
    })
}

fn push_front_components(queue: &mut VecDeque<OsString>, target: &Path) {
    let parts: Vec<OsString> = target
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some(OsString::from("..")),
            _ => None,
        })
        .collect();
    for p in parts.into_iter().rev() {
        queue.push_front(p);
    }
}

/// Walk `path` from `/` under `policy`: every entry root-owned, every
/// directory writable by root only (see the module docs for the sticky
/// exception), the final entry writable by root only. The caller checks the
/// final entry's type. One walk alone; a [`Walker`] shares the way between
/// several.
pub fn walk(path: &Path, policy: Policy) -> Result<Walked, Distrust> {
    Walker::new().walk(path, policy)
}

/// [`walk`], then require a regular file.
pub fn regular_file(path: &Path, policy: Policy) -> Result<Walked, Distrust> {
    Walker::new().regular_file(path, policy)
}

fn require_regular(w: Walked) -> Result<Walked, Distrust> {
    match Kind::of(w.stat.st_mode) {
        Kind::Regular => Ok(w),
        kind => Err(Distrust::WrongKind {
            path: w.resolved,
            kind,
            want: "a regular file",
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, PermissionsExt};

    fn chmod(p: &Path, mode: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    /// A private tree standing for `/`, trusted as the test's own uid (so
    /// these tests need no root; the root suites walk the real `/`).
    struct Tree {
        t: tempfile::TempDir,
        me: u32,
    }

    impl Tree {
        fn new() -> Tree {
            let t = tempfile::tempdir().unwrap();
            chmod(t.path(), 0o755);
            Tree {
                t,
                me: nix::unistd::geteuid().as_raw(),
            }
        }
        fn p(&self, rel: &str) -> PathBuf {
            self.t.path().join(rel)
        }
        fn walk(&self, rel: &str, policy: Policy) -> Result<Walked, Distrust> {
            self.walk_as(rel, policy, self.me)
        }
        fn walk_as(&self, rel: &str, policy: Policy, owner: u32) -> Result<Walked, Distrust> {
            Walker::with_top(self.t.path(), owner)
                .walk_in(Path::new(rel), policy)
                .and_then(require_regular)
        }
    }

    #[test]
    fn owner_only_chains_pass_and_loose_ones_name_the_culprit() {
        let t = Tree::new();
        std::fs::write(t.p("ok"), b"x").unwrap();
        chmod(&t.p("ok"), 0o644);
        t.walk("/ok", Policy::Secret).unwrap();
        // Anyone else's file (here: the tree is not owned by the trusted uid).
        assert!(matches!(
            t.walk_as("/ok", Policy::Executable, t.me + 1),
            Err(Distrust::NotRootOwned { .. })
        ));
        // A group-writable file.
        std::fs::write(t.p("gw"), b"x").unwrap();
        chmod(&t.p("gw"), 0o664);
        assert!(matches!(
            t.walk("/gw", Policy::Executable),
            Err(Distrust::Writable {
                who: "its group",
                ..
            })
        ));
        // A world-writable sticky dir (like /tmp): refused under both.
        std::fs::create_dir(t.p("tmp")).unwrap();
        chmod(&t.p("tmp"), 0o1777);
        std::fs::write(t.p("tmp/f"), b"x").unwrap();
        chmod(&t.p("tmp/f"), 0o600);
        for pol in [Policy::Secret, Policy::Executable] {
            assert!(matches!(
                t.walk("/tmp/f", pol),
                Err(Distrust::Writable { who, .. }) if who.contains("everyone")
            ));
        }
        // A group-writable sticky dir (like the Nix store): executables only.
        std::fs::create_dir(t.p("store")).unwrap();
        chmod(&t.p("store"), 0o1775);
        std::fs::write(t.p("store/qemu"), b"x").unwrap();
        chmod(&t.p("store/qemu"), 0o555);
        t.walk("/store/qemu", Policy::Executable).unwrap();
        assert!(matches!(
            t.walk("/store/qemu", Policy::Secret),
            Err(Distrust::Writable {
                who: "its group",
                ..
            })
        ));
        // ... and not without the sticky bit.
        chmod(&t.p("store"), 0o775);
        t.walk("/store/qemu", Policy::Executable).unwrap_err();
        // Not a regular file.
        nix::unistd::mkfifo(&t.p("fifo"), Mode::from_bits_truncate(0o600)).unwrap();
        assert!(matches!(
            t.walk("/fifo", Policy::Secret),
            Err(Distrust::WrongKind {
                kind: Kind::Fifo,
                ..
            })
        ));
    }

    #[test]
    fn a_shared_walker_checks_every_walk_against_its_own_policy() {
        let t = Tree::new();
        std::fs::create_dir_all(t.p("store/pkg")).unwrap();
        chmod(&t.p("store"), 0o1775);
        std::fs::write(t.p("store/pkg/qemu"), b"x").unwrap();
        chmod(&t.p("store/pkg/qemu"), 0o555);
        std::fs::write(t.p("store/pkg/key"), b"x").unwrap();
        chmod(&t.p("store/pkg/key"), 0o600);
        std::fs::create_dir(t.p("etc")).unwrap();
        symlink("/store/pkg/key", t.p("etc/key")).unwrap();
        let mut w = Walker::with_top(t.t.path(), t.me);
        let walk = |w: &mut Walker, rel: &str, pol| {
            w.walk_in(Path::new(rel), pol).and_then(require_regular)
        };
        walk(&mut w, "/store/pkg/qemu", Policy::Executable).unwrap();
        // The same (kept) group-writable sticky directory, now for a secret.
        assert!(matches!(
            walk(&mut w, "/store/pkg/key", Policy::Secret),
            Err(Distrust::Writable {
                who: "its group",
                ..
            })
        ));
        // A kept symlink is followed for executables only.
        let got = walk(&mut w, "/etc/key/../key", Policy::Executable);
        assert!(
            matches!(
                got,
                Err(Distrust::Sys {
                    errno: Errno::ENOTDIR,
                    ..
                })
            ),
            "{got:?}"
        );
        walk(&mut w, "/etc/key", Policy::Executable).unwrap();
        assert!(matches!(
            walk(&mut w, "/etc/key", Policy::Secret),
            Err(Distrust::Symlink { .. })
        ));
        // What a fresh walk refuses, a kept way refuses too: the final
        // entry is stat'ed anew.
        chmod(&t.p("store/pkg/qemu"), 0o777);
        assert!(matches!(
            walk(&mut w, "/store/pkg/qemu", Policy::Executable),
            Err(Distrust::Writable { .. })
        ));
    }

    #[test]
    fn symlinks_are_followed_and_every_directory_they_cross_is_checked() {
        let t = Tree::new();
        std::fs::create_dir_all(t.p("store/pkg/bin")).unwrap();
        std::fs::write(t.p("store/pkg/bin/qemu"), b"x").unwrap();
        chmod(&t.p("store/pkg/bin/qemu"), 0o555);
        std::fs::create_dir_all(t.p("sw/bin")).unwrap();
        symlink("../../store/pkg/bin/qemu", t.p("sw/bin/qemu")).unwrap();
        // An absolute target restarts at the top.
        symlink("/sw", t.p("current")).unwrap();
        let w = t.walk("/current/bin/qemu", Policy::Executable).unwrap();
        assert_eq!(w.resolved, Path::new("/store/pkg/bin/qemu"));
        // Secrets never go through a link.
        assert!(matches!(
            t.walk("/current/bin/qemu", Policy::Secret),
            Err(Distrust::Symlink { .. })
        ));
        // A directory the link leads through that others can write.
        chmod(&t.p("store/pkg"), 0o777);
        assert!(matches!(
            t.walk("/current/bin/qemu", Policy::Executable),
            Err(Distrust::Writable { .. })
        ));
        chmod(&t.p("store/pkg"), 0o755);
        // A link loop ends.
        symlink("loop-b", t.p("loop-a")).unwrap();
        symlink("loop-a", t.p("loop-b")).unwrap();
        assert!(matches!(
            t.walk("/loop-a", Policy::Executable),
            Err(Distrust::TooManyLinks { .. })
        ));
    }
}
