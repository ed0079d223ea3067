//! The old owner's rights for what root reads from DIR and removes from it.
//!
//! DIR is its owner's (microvm.nix's `microvm:kvm`): it may rename any
//! entry of DIR, and of every directory of its own in it, at any time, so
//! the name root walks to is no proof of what sits under it. Root could be
//! made to copy into the VM's state, or to delete, an inode of someone
//! else's (a root-only subtree the old owner cannot open or delete itself,
//! in a directory of its own that it renames onto an item's name). So the
//! copy's reads and the removal of the old inodes are done with DIR's
//! owner's file-system uid and gid (`setfsuid`/`setfsgid`, which also
//! takes root's file capabilities out of the effective set while they are
//! not 0) and no supplementary groups: the kernel checks every open,
//! lookup and unlink as the old owner's, and root reads or removes nothing
//! its old owner could not. What is made in the state dir is made as root.
//!
//! "The old owner" is DIR's owner and group, whoever owns the items in it:
//! it is whoever chooses what DIR's names point at. An entry of another
//! owner that it could not read or remove itself (a file a guest's root
//! wrote through a virtiofsd running as root) is refused by the plan.

use std::ffi::OsStr;
use std::os::fd::AsFd;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{openat, AtFlags};
use nix::sys::stat::{FileStat, Mode, SFlag};
use nix::unistd::{faccessat, getgroups, setfsgid, setfsuid, setgroups, AccessFlags, Gid, Uid};

use crate::host::dirs::Dir;
use crate::host::sys::SysContext;

use super::walk::{kind_of, lstat_at, walk_share, DIR_FLAGS};
use super::{sys_err, AdoptError, Kind, Result};

/// DIR's owner and group: the ids the copy reads and the removal unlinks
/// with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct OldOwner {
    pub uid: u32,
    pub gid: u32,
}

impl OldOwner {
    /// DIR's owner (`st`: DIR's stat), with the group its reads are made
    /// with: DIR's group only when the owner's account is in it (its
    /// primary group, or one `getgrouplist` names), else the account's
    /// primary group. DIR's group alone proves nothing (`install -d -o
    /// microvm` leaves it root's): with it root would read a file of that
    /// group the owner renamed in and could not read itself, and give it
    /// to the VM. An owner no account names keeps DIR's group (nothing
    /// says which groups it has).
    pub(super) fn of(st: &FileStat) -> OldOwner {
        OldOwner {
            uid: st.st_uid,
            gid: group_of(st.st_uid, st.st_gid),
        }
    }

    /// Whether the old owner is root (a DIR root made: its rights are
    /// root's, and no other user may change a name adopt walks).
    pub(super) fn is_root(self) -> bool {
        self.uid == 0
    }

    /// When DIR is root's, no directory above it may be another user's to
    /// write (owned by another, or writable by group or others without
    /// the sticky bit): that user could have renamed a directory of
    /// root's onto DIR's name, and adopt would act in it with root's
    /// rights. Checked on the path after DIR is open: any rename that put
    /// another directory there needed write on a directory still on it.
    pub(super) fn check_above(self, from: &Path) -> Result<()> {
        if !self.is_root() {
            return Ok(());
        }
        for up in from.ancestors().skip(1) {
            let st = nix::sys::stat::lstat(up).sys("lstat", up)?;
            let others_write = st.st_mode & 0o022 != 0 && st.st_mode & 0o1000 == 0;
            if st.st_uid != 0 || others_write {
                return Err(AdoptError::Refused {
                    name: String::new(),
                    path: up.to_path_buf(),
                    why: format!(
                        "is uid {}'s, mode {:o}, above {}, which is root's: that user could have renamed a directory of root's onto DIR's name, and adopt acts in a root-owned DIR with root's rights; give DIR to its old owner (chown) so that adopt acts with that owner's",
                        st.st_uid,
                        st.st_mode & 0o7777,
                        from.display()
                    ),
                });
            }
        }
        Ok(())
    }

    /// Run `f` with the old owner's file-system uid and gid and no
    /// supplementary groups, then root's back (a guard restores them on
    /// unwinding too). The process has one thread (checked by the caller
    /// before the first use: `setfsuid` changes the calling thread only,
    /// and `setgroups` is the process's).
    pub(super) fn with<T>(self, f: impl FnOnce() -> T) -> Result<T> {
        if self.is_root() {
            return Ok(f());
        }
        let guard = Guard::enter(self)?;
        let out = f();
        guard.leave()?;
        Ok(out)
    }
}

impl OldOwner {
    /// The plan's check of an item to be copied (`read`), moved, or whose
    /// old inodes are still to be removed: made with the old owner's ids, it
    /// must be able to look up the item, read every inode in it, and remove
    /// them all (every directory of it, and the item's own parent,
    /// searchable and writable by it; a sticky one holding only what it
    /// owns). When DIR is root's, the old owner is root, and no directory
    /// adopt walks may be another's or writable by group or others: that
    /// user could rename what root then reads and removes with root's
    /// rights. A refusal changes nothing.
    pub(super) fn check_item(
        self,
        from: &Dir,
        rel: &Path,
        kind: Kind,
        dev: u64,
        read: bool,
    ) -> Result<()> {
        self.with(|| self.check_item_as_old_owner(from, rel, kind, dev, read))?
    }

    fn check_item_as_old_owner(
        self,
        from: &Dir,
        rel: &Path,
        kind: Kind,
        dev: u64,
        read: bool,
    ) -> Result<()> {
        let refuse = |path: &Path, why: String| AdoptError::Refused {
            name: String::new(),
            path: path.to_path_buf(),
            why,
        };
        let denied = |path: &Path, what: &str| {
            refuse(
                path,
                format!(
                    "its old owner (DIR's owner uid {} gid {}) cannot {what}; adopt reads and removes in DIR only what DIR's owner could, since it chooses what DIR's names point at; if this is the VM's own data, give it to uid {} (or move it yourself)",
                    self.uid, self.gid, self.uid
                ),
            )
        };
        let comps: Vec<&OsStr> = rel.iter().collect();
        let Some((last, mids)) = comps.split_last() else {
            return Ok(());
        };
        let mut cur = Dir {
            fd: nix::unistd::dup(from.fd.as_fd()).sys("dup", &from.path)?,
            path: from.path.clone(),
        };
        let mut cur_st = cur.stat()?;
        self.check_dir(&cur, None, &cur_st, &refuse, &denied)?;
        for c in mids {
            let path = cur.path.join(c);
            let fd = match openat(cur.fd.as_fd(), *c, DIR_FLAGS, Mode::empty()) {
                Ok(fd) => fd,
                Err(Errno::EACCES | Errno::EPERM) => {
                    return Err(denied(&path, "open this directory"))
                }
                Err(e) => return Err(sys_err(e, "openat", path)),
            };
            cur = Dir { fd, path };
            cur_st = cur.stat()?;
            self.check_dir(&cur, None, &cur_st, &refuse, &denied)?;
        }
        let path = cur.path.join(last);
        let st = match lstat_at(&cur, last) {
            Ok(Some(st)) => st,
            Ok(None) => return Ok(()),
            Err(_) => return Err(denied(&path, "look it up")),
        };
        self.check_entry(&cur, &cur_st, last, &st, read, &refuse, &denied)?;
        if kind == Kind::Share && kind_of(&st) == SFlag::S_IFDIR {
            let fd = match openat(cur.fd.as_fd(), *last, DIR_FLAGS, Mode::empty()) {
                Ok(fd) => fd,
                Err(Errno::EACCES | Errno::EPERM) => return Err(denied(&path, "open it")),
                Err(e) => return Err(sys_err(e, "openat", path)),
            };
            let share = Dir { fd, path };
            walk_share(&share, dev, &mut |d, n, st| {
                let parent = d.stat()?;
                self.check_entry(d, &parent, n, st, read, &refuse, &denied)
            })
            .map_err(|e| match e {
                AdoptError::Sys(s) if matches!(s.errno, Errno::EACCES | Errno::EPERM) => {
                    denied(&s.path, "open or look into it")
                }
                e => e,
            })?;
        }
        Ok(())
    }

    /// A directory adopt walks (`name` in `parent`, or `dir` itself).
    fn check_dir(
        self,
        dir: &Dir,
        name: Option<&OsStr>,
        st: &FileStat,
        refuse: &dyn Fn(&Path, String) -> AdoptError,
        denied: &dyn Fn(&Path, &str) -> AdoptError,
    ) -> Result<()> {
        let path = name.map_or_else(|| dir.path.clone(), |n| dir.path.join(n));
        if self.is_root() {
            if st.st_uid != 0 || st.st_mode & 0o022 != 0 {
                return Err(refuse(
                    &path,
                    format!(
                        "is uid {}'s, mode {:o}, in a DIR that is root's: adopt acts with the rights of DIR's owner, root here, and another user who can rename entries in it could make root copy or remove what that user cannot reach; give DIR to that user (chown) so that adopt acts with its rights",
                        st.st_uid,
                        st.st_mode & 0o7777
                    ),
                ));
            }
            return Ok(());
        }
        let want = AccessFlags::R_OK | AccessFlags::W_OK | AccessFlags::X_OK;
        let ok = match name {
            Some(n) => faccessat(dir.fd.as_fd(), n, want, AT_AS_OLD_OWNER),
            None => faccessat(dir.fd.as_fd(), ".", want, AT_AS_OLD_OWNER),
        };
        ok.map_err(|_| denied(&path, "read, search and write this directory"))
    }

    /// An entry `name` (stat `st`) of `parent` (stat `parent_st`): the old
    /// owner may remove it, and read it when it is a file to copy.
    #[allow(clippy::too_many_arguments)]
    fn check_entry(
        self,
        parent: &Dir,
        parent_st: &FileStat,
        name: &OsStr,
        st: &FileStat,
        read: bool,
        refuse: &dyn Fn(&Path, String) -> AdoptError,
        denied: &dyn Fn(&Path, &str) -> AdoptError,
    ) -> Result<()> {
        let path = parent.path.join(name);
        if kind_of(st) == SFlag::S_IFDIR {
            self.check_dir(parent, Some(name), st, refuse, denied)?;
        }
        if self.is_root() {
            return Ok(());
        }
        if parent_st.st_mode & 0o1000 != 0 && parent_st.st_uid != self.uid && st.st_uid != self.uid
        {
            return Err(denied(&path, "remove it (a sticky directory)"));
        }
        if read && kind_of(st) == SFlag::S_IFREG {
            faccessat(parent.fd.as_fd(), name, AccessFlags::R_OK, AT_AS_OLD_OWNER)
                .map_err(|_| denied(&path, "read it"))?;
        }
        Ok(())
    }
}

/// The group the old owner `uid` reads DIR with (see [`OldOwner::of`]).
fn group_of(uid: u32, dir_gid: u32) -> u32 {
    let Ok(Some(user)) = nix::unistd::User::from_uid(Uid::from_raw(uid)) else {
        return dir_gid;
    };
    let primary = user.gid.as_raw();
    if primary == dir_gid {
        return dir_gid;
    }
    let member = std::ffi::CString::new(user.name.as_bytes())
        .ok()
        .and_then(|name| nix::unistd::getgrouplist(&name, user.gid).ok())
        .is_some_and(|groups| groups.iter().any(|g| g.as_raw() == dir_gid));
    if member {
        dir_gid
    } else {
        primary
    }
}

/// `faccessat` with the ids in force (the old owner's file-system ids,
/// not the real ones), never following a link.
const AT_AS_OLD_OWNER: AtFlags = AtFlags::AT_EACCESS.union(AtFlags::AT_SYMLINK_NOFOLLOW);

/// Whether `e` is the kernel refusing the old owner (it could not open,
/// look up or remove the entry itself).
pub(super) fn is_denied(e: &AdoptError) -> bool {
    matches!(
        e,
        AdoptError::Sys(s) if matches!(s.errno, Errno::EACCES | Errno::EPERM)
    )
}

/// Root's own ids could not be changed or put back.
fn failed(op: &'static str, errno: Errno) -> AdoptError {
    sys_err(errno, op, "/proc/self (the adopting process's ids)")
}

/// Root's file-system ids and groups while the old owner's are in force.
struct Guard {
    uid: Uid,
    gid: Gid,
    groups: Vec<Gid>,
    restored: bool,
}

impl Guard {
    fn enter(o: OldOwner) -> Result<Guard> {
        let groups = getgroups().map_err(|e| failed("getgroups", e))?;
        setgroups(&[]).map_err(|e| failed("setgroups", e))?;
        let mut g = Guard {
            uid: Uid::current(),
            gid: Gid::current(),
            groups,
            restored: false,
        };
        // setfsgid and setfsuid return the previous id whether or not they
        // changed it: a second call says what is in force.
        g.gid = setfsgid(Gid::from_raw(o.gid));
        if setfsgid(Gid::from_raw(o.gid)) != Gid::from_raw(o.gid) {
            // The guard's drop puts back what was changed.
            return Err(failed("setfsgid", Errno::EPERM));
        }
        g.uid = setfsuid(Uid::from_raw(o.uid));
        if setfsuid(Uid::from_raw(o.uid)) != Uid::from_raw(o.uid) {
            return Err(failed("setfsuid", Errno::EPERM));
        }
        Ok(g)
    }

    fn restore(&mut self) -> bool {
        self.restored = true;
        setfsuid(self.uid);
        let uid_ok = setfsuid(self.uid) == self.uid;
        setfsgid(self.gid);
        let gid_ok = setfsgid(self.gid) == self.gid;
        uid_ok && gid_ok && setgroups(&self.groups).is_ok()
    }

    fn leave(mut self) -> Result<()> {
        if self.restore() {
            Ok(())
        } else {
            Err(failed("restore root's file-system ids", Errno::EPERM))
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if !self.restored && !self.restore() {
            // Fewer rights than root's: every later step fails closed.
            tracing::error!("adopt: root's file-system ids could not be restored");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's verdict changes while the old owner's ids are in
    /// force, and root's come back after (needs root).
    #[test]
    fn the_old_owners_ids_are_in_force_inside_and_roots_after() {
        assert!(Uid::effective().is_root(), "this test needs root");
        let dir = std::env::temp_dir().join(format!("vmwarden-oldowner-{}", std::process::id()));
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .unwrap();
        let o = OldOwner {
            uid: 64_999,
            gid: 64_999,
        };
        let inside = o.with(|| std::fs::read_dir(&dir).map(drop)).unwrap();
        let after = std::fs::read_dir(&dir).map(drop);
        std::fs::remove_dir(&dir).unwrap();
        assert_eq!(
            inside.unwrap_err().kind(),
            std::io::ErrorKind::PermissionDenied
        );
        after.unwrap();
    }
}
