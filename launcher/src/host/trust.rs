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
//! * [`Policy::Principal`] (disk images, share sources): what the VM is
//!   given to use. Every entry may be root's or the VM's principal's (the
//!   principal can only hurt its own VM), symlinks are followed as for
//!   executables, and nobody else may be able to write anything on the
//!   way: no directory or file writable by everyone (sticky or not), none
//!   writable by a group other than the principal's (except the sticky
//!   root-owned store, on the way only, as above).
//!
//! One walk may end at the sticky store itself: [`walk_store`], which the
//! launcher calls for exactly one share, `/nix/store` shared read-only
//! (see `launch/preflight.rs`). It is [`Policy::Principal`]'s walk, and its
//! final directory may be writable by its group when, and only when, it is
//! root's, sticky and not writable by everyone (the store as Nix makes it,
//! `root:nixbld 1775`); its ACL is checked as any other's. Every other
//! sticky, group-writable directory stays refused at the end of a walk.
//!
//! Under every policy the POSIX access ACL counts like the mode bits: a
//! named user or group entry that grants write (through the mask) is a
//! writer the mode does not show, and refuses the path unless it is root
//! (or, under [`Policy::Principal`], the principal's uid or gid). With an
//! ACL, the owning group's write is its ACL entry's through the mask (the
//! mode's group bits are the mask).
//!
//! Knows nothing of specs or VMs; the launcher maps a refusal to the field.

use std::collections::{BTreeMap, VecDeque};
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
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
    /// Root's or this principal's (see the module docs).
    Principal {
        uid: u32,
        gid: u32,
    },
}

pub use crate::config::files::{AclWriter, Distrust, MAX_LINKS};

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
    /// Only entries of the trusted uid are kept.
    seen: BTreeMap<PathBuf, (Seen, FileStat, Acl)>,
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
        self.walk_to(path, policy, End::Any)
    }

    fn walk_to(&mut self, path: &Path, policy: Policy, end: End) -> Result<Walked, Distrust> {
        check_abs_normalised(path).map_err(|reason| Distrust::BadPath {
            path: path.to_path_buf(),
            reason,
        })?;
        self.walk_in(path, policy, end)
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
    ) -> Result<(Option<OwnedFd>, FileStat, Acl), Distrust> {
        if keep {
            if let Some((_, st, acl)) = self.seen.get(p) {
                return Ok((None, *st, acl.clone()));
            }
        }
        let fd = openat(dir.as_fd(), c, ENTRY_FLAGS, Mode::empty()).map_err(sys(p, "open"))?;
        let st = fstat(fd.as_fd()).map_err(sys(p, "fstat"))?;
        let acl = match Kind::of(st.st_mode) {
            Kind::Symlink => Acl::default(),
            _ => Acl::of(&fd, p)?,
        };
        Ok((Some(fd), st, acl))
    }

    /// Whether `uid` may own what this walk meets under `policy`.
    fn owner_ok(&self, uid: u32, policy: Policy) -> bool {
        uid == self.owner || matches!(policy, Policy::Principal { uid: p, .. } if p == uid)
    }

    fn not_owned(path: PathBuf, uid: u32, policy: Policy) -> Distrust {
        match policy {
            Policy::Principal { uid: principal, .. } => Distrust::NotOwnersOwn {
                path,
                uid,
                principal,
            },
            _ => Distrust::NotRootOwned { path, uid },
        }
    }

    fn walk_in(&mut self, path: &Path, policy: Policy, end: End) -> Result<Walked, Distrust> {
        let owner = self.owner;
        let top = self.top.clone();
        let (root, st, acl) = match self.seen.get(Path::new("/")) {
            Some((Seen::Dir(fd), st, acl)) => (Rc::clone(fd), *st, acl.clone()),
            _ => {
                let fd = openat(
                    AT_FDCWD,
                    &top,
                    ENTRY_FLAGS | OFlag::O_DIRECTORY,
                    Mode::empty(),
                )
                .map_err(sys(&top, "open"))?;
                let st = fstat(fd.as_fd()).map_err(sys(&top, "fstat"))?;
                let acl = Acl::of(&fd, &top)?;
                let fd = Rc::new(fd);
                if st.st_uid == owner {
                    self.seen.insert(
                        PathBuf::from("/"),
                        (Seen::Dir(Rc::clone(&fd)), st, acl.clone()),
                    );
                }
                (fd, st, acl)
            }
        };
        if !self.owner_ok(st.st_uid, policy) {
            return Err(Walker::not_owned(top.clone(), st.st_uid, policy));
        }
        check_dir(&top, &st, &acl, policy, owner, true)?;
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
            let (fd, st, acl) = self.entry(&dir, &c, &p, on_the_way)?;
            // A share the guest owns may itself belong to one of the VM's
            // own ids (the guest chowned it); nothing on the way may.
            let owned_end =
                !on_the_way && Kind::of(st.st_mode) == Kind::Directory && end.owned_by(st.st_uid);
            if !self.owner_ok(st.st_uid, policy) && !owned_end {
                return Err(Walker::not_owned(p, st.st_uid, policy));
            }
            // Only root's entries are kept for later walks: what the
            // principal owns it can change between them.
            let keep = on_the_way && st.st_uid == owner;
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
                        Some((Seen::Link(t), _, _)) => t.clone(),
                        _ => {
                            let t = PathBuf::from(
                                readlinkat(dir.as_fd(), c.as_os_str())
                                    .map_err(sys(&p, "readlink"))?,
                            );
                            if keep {
                                self.seen
                                    .insert(p.clone(), (Seen::Link(t.clone()), st, acl));
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
                    check_dir(&p, &st, &acl, policy, owner, true)?;
                    let fd = match (fd, self.seen.get(&p)) {
                        (None, Some((Seen::Dir(fd), _, _))) => Rc::clone(fd),
                        (Some(fd), _) => {
                            let fd = Rc::new(fd);
                            if keep {
                                self.seen
                                    .insert(p.clone(), (Seen::Dir(Rc::clone(&fd)), st, acl));
                            }
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
                        // The store, at the end of a [`walk_store`]: its
                        // directory is judged as on the way (root's and
                        // sticky, its group may write; never everyone).
                        Kind::Directory => match end {
                            End::Owned(ids) if is_principal(policy) => {
                                check_owned_dir(&p, &st, &acl, policy, owner, &ids)?
                            }
                            _ => {
                                let store = end == End::StickyStore && is_principal(policy);
                                check_dir(&p, &st, &acl, policy, owner, store)?
                            }
                        },
                        Kind::Regular => check_file(&p, &st, &acl, policy, owner)?,
                        // A disk may be a block device: its owner and
                        // everyone's write are checked, not its group's
                        // (`disk`, root's equivalent everywhere).
                        Kind::BlockDevice if is_principal(policy) => {
                            check_device(&p, &st, &acl, policy, owner)?
                        }
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

/// What a walk accepts at its end beyond its policy's rule.
#[derive(Debug, Clone, PartialEq, Eq)]
enum End {
    /// Nothing: the final entry is judged as the policy says.
    Any,
    /// A directory that is root's, sticky and not writable by everyone,
    /// whose group may write it: the Nix store ([`walk_store`]).
    StickyStore,
    /// A directory the guest owns ([`walk_owned`]): the VM's own ids
    /// (this range of host ids) count as the principal's.
    Owned(std::ops::Range<u32>),
}

impl End {
    fn owned_by(&self, id: u32) -> bool {
        matches!(self, End::Owned(ids) if ids.contains(&id))
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
/// every entry), the ACL's named writers included. `on_the_way`: not the
/// walk's final entry (the sticky store is accepted only there under
/// [`Policy::Principal`]).
fn check_dir(
    path: &Path,
    st: &FileStat,
    acl: &Acl,
    policy: Policy,
    owner: u32,
    on_the_way: bool,
) -> Result<(), Distrust> {
    let mode = st.st_mode & 0o7777;
    let group = acl.owning_group_writes(mode);
    let sticky_store = mode & S_ISVTX != 0 && st.st_uid == owner;
    let who = match (group, mode & 0o002 != 0) {
        (_, true) if group => "its group and everyone",
        (_, true) => "everyone",
        (true, false) if policy == Policy::Executable && mode & S_ISVTX != 0 => "",
        (true, false) if principals_group(policy, st.st_gid) => "",
        (true, false) if on_the_way && sticky_store && is_principal(policy) => "",
        (true, false) => "its group",
        (false, false) => "",
    };
    if !who.is_empty() {
        return Err(Distrust::Writable {
            path: path.to_path_buf(),
            mode,
            who,
        });
    }
    acl.check(path, policy, owner)
}

/// The share a guest owns, at the end of a [`walk_owned`]: owned by the
/// trusted uid, the principal or one of the VM's own ids (checked with
/// the owner), writable by its group only when that group is the
/// principal's or one of the VM's own, never by everyone, and its ACL
/// naming no writer but those.
fn check_owned_dir(
    path: &Path,
    st: &FileStat,
    acl: &Acl,
    policy: Policy,
    owner: u32,
    ids: &std::ops::Range<u32>,
) -> Result<(), Distrust> {
    let mode = st.st_mode & 0o7777;
    let group = acl.owning_group_writes(mode)
        && !principals_group(policy, st.st_gid)
        && !ids.contains(&st.st_gid);
    let who = match (group, mode & 0o002 != 0) {
        (true, true) => "its group and everyone",
        (false, true) => "everyone",
        (true, false) => "its group",
        (false, false) => {
            return Acl {
                users: acl
                    .users
                    .iter()
                    .copied()
                    .filter(|u| !ids.contains(u))
                    .collect(),
                groups: acl
                    .groups
                    .iter()
                    .copied()
                    .filter(|g| !ids.contains(g))
                    .collect(),
                ..acl.clone()
            }
            .check(path, policy, owner)
        }
    };
    Err(Distrust::Writable {
        path: path.to_path_buf(),
        mode,
        who,
    })
}

/// A file at the end of the walk: writable by its owner only (or, under
/// [`Policy::Principal`], the principal's group too), ACL included.
fn check_file(
    path: &Path,
    st: &FileStat,
    acl: &Acl,
    policy: Policy,
    owner: u32,
) -> Result<(), Distrust> {
    let mode = st.st_mode & 0o7777;
    let group = acl.owning_group_writes(mode) && !principals_group(policy, st.st_gid);
    let who = match (group, mode & 0o002 != 0) {
        (true, true) => "its group and everyone",
        (false, true) => "everyone",
        (true, false) => "its group",
        (false, false) => return acl.check(path, policy, owner),
    };
    Err(Distrust::Writable {
        path: path.to_path_buf(),
        mode,
        who,
    })
}

/// A block device at the end of a [`Policy::Principal`] walk.
fn check_device(
    path: &Path,
    st: &FileStat,
    acl: &Acl,
    policy: Policy,
    owner: u32,
) -> Result<(), Distrust> {
    let mode = st.st_mode & 0o7777;
    if mode & 0o002 != 0 {
        return Err(Distrust::Writable {
            path: path.to_path_buf(),
            mode,
            who: "everyone",
        });
    }
    Acl {
        groups: Vec::new(),
        ..acl.clone()
    }
    .check(path, policy, owner)
}

fn is_principal(policy: Policy) -> bool {
    matches!(policy, Policy::Principal { .. })
}

/// `gid` is the principal's own group (under [`Policy::Principal`]).
fn principals_group(policy: Policy, gid: u32) -> bool {
    matches!(policy, Policy::Principal { gid: g, .. } if g == gid)
}

/// `system.posix_acl_access` (include/uapi/linux/posix_acl_xattr.h): a
/// 4-byte version, then 8-byte entries (tag, perm, id), little-endian.
const ACL_XATTR: &std::ffi::CStr = c"system.posix_acl_access";
const ACL_XATTR_VERSION: u32 = 2;
const ACL_USER: u16 = 0x02;
const ACL_GROUP_OBJ: u16 = 0x04;
const ACL_GROUP: u16 = 0x08;
const ACL_MASK: u16 = 0x10;
const ACL_WRITE: u16 = 0x02;
/// The most bytes of ACL read (ext4 and tmpfs hold far fewer entries).
const ACL_MAX: usize = 64 * 1024;

/// Who an entry's POSIX access ACL lets write beyond its owner, the mask
/// applied. Empty when it has none (or the file system has no ACLs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Acl {
    /// Named users with write.
    pub users: Vec<u32>,
    /// Named groups with write.
    pub groups: Vec<u32>,
    /// The owning group's write, when an extended ACL states it (its mode
    /// bits are the mask then, not its own).
    pub owning_group: Option<bool>,
}

impl Acl {
    /// The ACL of the entry `fd` (an `O_PATH` fd) reached at `path`.
    fn of(fd: &OwnedFd, path: &Path) -> Result<Acl, Distrust> {
        // getxattr(2) through the fd's /proc link: an O_PATH fd takes no
        // fgetxattr, and the link names the very inode that was opened.
        let via = std::ffi::CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .expect("no NUL in a /proc path");
        let mut buf = vec![0u8; 1024];
        loop {
            // SAFETY: `via` and ACL_XATTR are NUL-terminated; `buf` is a
            // writable buffer of exactly `buf.len()` bytes that outlives
            // the call, which writes at most that many.
            let n = unsafe {
                libc::getxattr(
                    via.as_ptr(),
                    ACL_XATTR.as_ptr(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                )
            };
            match usize::try_from(n) {
                Ok(n) => {
                    return Acl::parse(&buf[..n]).ok_or_else(|| Distrust::AclWritable {
                        path: path.to_path_buf(),
                        who: AclWriter::Unknown,
                    })
                }
                Err(_) => match Errno::last() {
                    Errno::ENODATA | Errno::EOPNOTSUPP => return Ok(Acl::default()),
                    Errno::ERANGE if buf.len() < ACL_MAX => buf.resize(ACL_MAX, 0),
                    errno => {
                        return Err(Distrust::Sys {
                            path: path.to_path_buf(),
                            op: "getxattr(system.posix_acl_access)",
                            errno,
                        })
                    }
                },
            }
        }
    }

    /// The writers in an ACL's bytes; `None` for bytes that are not one.
    pub fn parse(b: &[u8]) -> Option<Acl> {
        let (head, rest) = b.split_first_chunk::<4>()?;
        if u32::from_le_bytes(*head) != ACL_XATTR_VERSION || rest.len() % 8 != 0 {
            return None;
        }
        let entries: Vec<(u16, u16, u32)> = rest
            .chunks_exact(8)
            .map(|e| {
                (
                    u16::from_le_bytes([e[0], e[1]]),
                    u16::from_le_bytes([e[2], e[3]]),
                    u32::from_le_bytes([e[4], e[5], e[6], e[7]]),
                )
            })
            .collect();
        // Without a mask entry the ACL is the mode bits alone.
        let mask = entries
            .iter()
            .find(|(t, _, _)| *t == ACL_MASK)
            .map(|(_, p, _)| *p);
        let Some(mask) = mask else {
            return Some(Acl::default());
        };
        let writes = |perm: u16| perm & mask & ACL_WRITE != 0;
        let of = |tag: u16| -> Vec<u32> {
            entries
                .iter()
                .filter(|(t, p, _)| *t == tag && writes(*p))
                .map(|(_, _, id)| *id)
                .collect()
        };
        Some(Acl {
            users: of(ACL_USER),
            groups: of(ACL_GROUP),
            owning_group: entries
                .iter()
                .find(|(t, _, _)| *t == ACL_GROUP_OBJ)
                .map(|(_, p, _)| writes(*p)),
        })
    }

    fn owning_group_writes(&self, mode: u32) -> bool {
        self.owning_group.unwrap_or(mode & 0o020 != 0)
    }

    /// The named writers the policy does not trust.
    fn check(&self, path: &Path, policy: Policy, owner: u32) -> Result<(), Distrust> {
        let (uid, gid) = match policy {
            Policy::Principal { uid, gid } => (Some(uid), Some(gid)),
            _ => (None, None),
        };
        if let Some(u) = self.users.iter().find(|u| **u != owner && Some(**u) != uid) {
            return Err(Distrust::AclWritable {
                path: path.to_path_buf(),
                who: AclWriter::User(*u),
            });
        }
        if let Some(g) = self.groups.iter().find(|g| Some(**g) != gid) {
            return Err(Distrust::AclWritable {
                path: path.to_path_buf(),
                who: AclWriter::Group(*g),
            });
        }
        Ok(())
    }
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

/// [`walk`] under [`Policy::Principal`] to the Nix store, shared read-only:
/// the final directory may also be writable by its group, if it is root's,
/// sticky and not writable by everyone (see the module docs). The caller
/// decides that the share is the store and read-only; nothing else may
/// call this.
pub fn walk_store(path: &Path, policy: Policy) -> Result<Walked, Distrust> {
    Walker::new().walk_to(path, policy, End::StickyStore)
}

/// [`walk`] under [`Policy::Principal`] to a share the guest owns: its
/// final directory may also belong to, and be writable by the group of,
/// one of the VM's own ids (`ids`, host ids), as the guest's `chown` and
/// `chgrp` through its virtiofsd leave it. Everything above it is
/// checked as in any walk.
pub fn walk_owned(
    path: &Path,
    policy: Policy,
    ids: std::ops::Range<u32>,
) -> Result<Walked, Distrust> {
    Walker::new().walk_to(path, policy, End::Owned(ids))
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
mod tests;
