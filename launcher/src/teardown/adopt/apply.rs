//! `adopt --apply`: under the VM's lease, the record first, then item by
//! item: a root-only item moved and re-owned (`move:X`, `own:X`), any other
//! made anew for the principal and the old inodes removed from DIR
//! (`copy:X`, `remove:X`; [`super::copy`]).

use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{openat, renameat2, AtFlags, OFlag, RenameFlags};
use nix::sys::stat::{fchmod, FileStat, Mode, SFlag};
use nix::unistd::{fchownat, Gid, Uid};

use crate::config::names::VmName;
use crate::config::paths::Roots;
use crate::host::dirs::{self, Dir, Loose, Want};
use crate::host::ownership;
use crate::host::sys::SysContext;
use crate::instance::liveness;
use crate::teardown::lease_as_a_launch;

use super::copy::{self, Owner};
use super::old_owner::{self as old_owner, OldOwner};
use super::walk::{
    check_entry, describe, kind_of, lstat_at, open_parent, root_only, walk_share, DIR_FLAGS,
    NOFOLLOW,
};
use super::{
    fault, record_name, sys_err, AdoptError, How, Item, Kind, Options, Place, Plan, Planned,
    Record, Result, RECORD_STEP,
};

pub(super) fn apply(
    roots: &Roots,
    name: &VmName,
    from_dir: &Dir,
    from_st: &FileStat,
    plan: &mut Plan,
    opts: &Options,
) -> Result<()> {
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
        items,
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
    let owner = Owner {
        uid: plan.uid,
        gid: plan.gid,
    };
    for (index, p) in plan.items.iter().enumerate() {
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
        let item = Step {
            name,
            from_dir,
            dev: from_st.st_dev,
            planned: p,
            parent: &parent,
            last,
            owner,
            old: OldOwner::of(from_st),
            opts,
        };
        match p.item.how {
            How::Move => item.move_and_own()?,
            How::Copy => item.copy_and_remove(index)?,
        }
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

/// One item's steps.
struct Step<'a> {
    name: &'a VmName,
    from_dir: &'a Dir,
    /// DIR's file system.
    dev: u64,
    planned: &'a Planned,
    /// The target's directory in the state dir, and its last component.
    parent: &'a Dir,
    last: &'a OsStr,
    owner: Owner,
    /// DIR's owner: the copy reads and the removal unlinks with its ids.
    old: OldOwner,
    opts: &'a Options,
}

impl Step<'_> {
    fn refused(&self, path: &Path, why: String) -> AdoptError {
        AdoptError::Refused {
            name: self.name.to_string(),
            path: path.to_path_buf(),
            why,
        }
    }

    fn rel(&self) -> String {
        self.planned.item.rel.display().to_string()
    }

    /// The item in DIR, opened by its parent: `None` once it is gone.
    /// Looked up with the old owner's ids (a copied item's).
    fn source(&self) -> Result<Option<(Dir, std::ffi::OsString)>> {
        self.old.with(|| {
            let Some((parent, name)) = open_parent(self.from_dir, &self.planned.item.rel)? else {
                return Ok(None);
            };
            Ok(lstat_at(&parent, &name)?.map(|_| (parent, name)))
        })?
    }

    /// The kernel refused the old owner's ids something in DIR: said so.
    fn as_old_owner(&self, e: AdoptError) -> AdoptError {
        if !old_owner::is_denied(&e) {
            return e;
        }
        self.changed(
            &self.planned.from,
            format!(
                "{e}: its old owner (DIR's owner uid {} gid {}) could not read or look it up itself since the plan (an entry renamed in?); adopt reads and removes in DIR only what DIR's owner could",
                self.old.uid, self.old.gid
            ),
        )
    }

    /// A new-inode adoption: the copy in place (`copy:X`), then the old
    /// inodes removed from DIR (`remove:X`).
    fn copy_and_remove(&self, index: usize) -> Result<()> {
        let p = self.planned;
        if let Place::From { .. } = p.place {
            let (src_parent, src_name) = self
                .source()
                .map_err(|e| self.as_old_owner(e))?
                .ok_or_else(|| self.refused(&p.from, "vanished".into()))?;
            copy::copy_item(
                p.item.kind,
                &src_parent,
                &src_name,
                self.parent,
                self.last,
                &copy::temp_name(index),
                self.owner,
                self.old,
                self.dev,
            )
            .map_err(|e| self.as_old_owner(e))?;
        }
        fault(self.opts, &format!("copy:{}", self.rel()));
        if matches!(p.place, Place::From { .. } | Place::Copied) {
            if let Some((src_parent, src_name)) = self.source().map_err(|e| self.as_old_owner(e))? {
                // With the old owner's ids: what it swapped in under the
                // name and could not remove itself stays.
                let out = self
                    .old
                    .with(|| ownership::delete_entries(&src_parent, &[src_name], None))?;
                if let Some(f) = out.failed.first() {
                    return Err(AdoptError::NotRemoved {
                        name: self.name.to_string(),
                        path: f.path.clone(),
                        to: p.to.clone(),
                        reason: format!(
                            "{} (removed with its old owner's ids, DIR's owner uid {} gid {}: what it could not remove itself is left)",
                            f.reason, self.old.uid, self.old.gid
                        ),
                    });
                }
                nix::unistd::fsync(src_parent.fd.as_fd()).sys("fsync", &src_parent.path)?;
            }
        }
        fault(self.opts, &format!("remove:{}", self.rel()));
        Ok(())
    }

    /// A root-only item: renamed into the state dir (`move:X`), then
    /// re-owned (`own:X`), never following a link. The plan's verdict is
    /// not trusted at the rename: DIR is its old owner's, who may swap in
    /// a file of its own (mapped, or open) under the planned name
    /// meanwhile. So the item is opened first, judged root's alone through
    /// that descriptor ([`Step::judge`]), renamed, and what then sits at
    /// the target must be the inode judged (device and inode), else it is
    /// put back and not adopted. It is re-owned through the same
    /// descriptor.
    fn move_and_own(&self) -> Result<()> {
        let p = self.planned;
        let mut judged = None;
        if let Place::From { .. } = p.place {
            let (src_parent, src_name) = open_parent(self.from_dir, &p.item.rel)?
                .ok_or_else(|| self.refused(&p.from, "vanished".into()))?;
            let fd = match self.open_item(&src_parent, &src_name, &p.from)? {
                Some(fd) => fd,
                None => return Err(self.refused(&p.from, "vanished".into())),
            };
            let st = self.judge(&fd, &p.from)?;
            match renameat2(
                src_parent.fd.as_fd(),
                src_name.as_os_str(),
                self.parent.fd.as_fd(),
                self.last,
                RenameFlags::RENAME_NOREPLACE,
            ) {
                Ok(()) => {}
                Err(Errno::EXDEV) => {
                    return Err(self.refused(
                        &p.from,
                        format!(
                            "cannot be renamed to {} (another file system); adopt never copies across file systems",
                            p.to.display()
                        ),
                    ))
                }
                Err(e) => return Err(sys_err(e, "renameat2", &p.from)),
            }
            let now = lstat_at(self.parent, self.last)?;
            if now.as_ref().map(|n| (n.st_dev, n.st_ino)) != Some((st.st_dev, st.st_ino)) {
                // Swapped between the judgement and the rename: what was
                // moved is not the judged inode; back to DIR, untouched.
                let back = renameat2(
                    self.parent.fd.as_fd(),
                    self.last,
                    src_parent.fd.as_fd(),
                    src_name.as_os_str(),
                    RenameFlags::RENAME_NOREPLACE,
                );
                return Err(self.changed(
                    &p.from,
                    format!(
                        "was swapped for another inode while it was moved (ino {} judged root's alone, ino {} moved){}",
                        st.st_ino,
                        now.map_or(0, |n| n.st_ino),
                        match back {
                            Ok(()) => String::from("; the other inode is back in DIR, not re-owned"),
                            Err(e) => format!(
                                "; the other inode could not be put back ({e}) and is left, not re-owned, at {}",
                                p.to.display()
                            ),
                        }
                    ),
                ));
            }
            judged = Some(fd);
        }
        fault(self.opts, &format!("move:{}", self.rel()));
        let fd = match judged {
            Some(fd) => Some(fd),
            None => self.open_item(self.parent, self.last, &p.to)?,
        };
        if let Some(fd) = fd {
            self.own(fd)?;
        }
        fault(self.opts, &format!("own:{}", self.rel()));
        Ok(())
    }

    /// Open the item `parent/name` itself, never following a link:
    /// `None` when it is not there. O_NONBLOCK: a fifo swapped in must not
    /// hang the open (its type is refused by [`Step::judge`]); a share is
    /// opened as a directory or refused.
    fn open_item(&self, parent: &Dir, name: &OsStr, path: &Path) -> Result<Option<OwnedFd>> {
        let flags = match self.planned.item.kind {
            Kind::Image => OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | NOFOLLOW,
            Kind::Share => DIR_FLAGS,
        };
        match openat(parent.fd.as_fd(), name, flags, Mode::empty()) {
            Ok(fd) => Ok(Some(fd)),
            Err(Errno::ENOENT) => Ok(None),
            Err(Errno::ELOOP | Errno::ENOTDIR) => Err(self.changed(
                path,
                "became a symlink or a non-directory since the plan; adopt never follows symlinks"
                    .into(),
            )),
            Err(e) => Err(sys_err(e, "openat", path)),
        }
    }

    /// The plan's verdict, taken again on the open inode: of the item's
    /// kind, on DIR's file system, one link, and every inode in it root's
    /// alone (a share's entries walked from this descriptor). Its stat.
    fn judge(&self, fd: &OwnedFd, path: &Path) -> Result<FileStat> {
        let st = nix::sys::stat::fstat(fd.as_fd()).sys("fstat", path)?;
        let want = match self.planned.item.kind {
            Kind::Image => SFlag::S_IFREG,
            Kind::Share => SFlag::S_IFDIR,
        };
        if kind_of(&st) != want {
            return Err(self.changed(path, format!("became a {} since the plan", describe(&st))));
        }
        check_entry(path, &st, self.dev)?;
        let mut alone = root_only(&st);
        if alone && self.planned.item.kind == Kind::Share {
            let dir = Dir {
                fd: nix::unistd::dup(fd.as_fd()).sys("dup", path)?,
                path: path.to_path_buf(),
            };
            walk_share(&dir, self.dev, &mut |_, _, s| {
                alone &= root_only(s);
                Ok(())
            })?;
        }
        if !alone {
            return Err(self.changed(
                path,
                format!(
                    "is no longer root's alone (the plan found it so and would move it; now uid {} mode {:o}, or an entry in it): a file its old owner could hold open would become the VM's",
                    st.st_uid,
                    st.st_mode & 0o7777
                ),
            ));
        }
        Ok(st)
    }

    fn changed(&self, path: &Path, why: String) -> AdoptError {
        AdoptError::Changed {
            name: self.name.to_string(),
            path: path.to_path_buf(),
            why,
        }
    }

    /// Re-own at the target, through the descriptor of the item itself
    /// (judged before the move, or opened at the target on a resumed run:
    /// then it must be root's or already the principal's, with nothing
    /// for group or others), a share's entries with AT_SYMLINK_NOFOLLOW
    /// from their parent's descriptor.
    fn own(&self, fd: OwnedFd) -> Result<()> {
        let (parent, last) = (self.parent, self.last);
        let to = parent.path.join(last);
        let (uid, gid) = (Uid::from_raw(self.owner.uid), Gid::from_raw(self.owner.gid));
        let st = nix::sys::stat::fstat(fd.as_fd()).sys("fstat", &to)?;
        if !(st.st_uid == 0 || st.st_uid == self.owner.uid) || st.st_mode & 0o077 != 0 {
            return Err(self.changed(
                &to,
                format!(
                    "is uid {} mode {:o}, not root's alone nor the principal's; left as it is, not re-owned",
                    st.st_uid,
                    st.st_mode & 0o7777
                ),
            ));
        }
        match self.planned.item.kind {
            Kind::Image => {
                if kind_of(&st) != SFlag::S_IFREG {
                    return Err(self.refused(
                        &to,
                        format!("became a {} during the move; left as it is", describe(&st)),
                    ));
                }
                check_entry(&to, &st, self.dev)?;
                nix::unistd::fchown(fd.as_fd(), Some(uid), Some(gid)).sys("fchown", &to)?;
                fchmod(fd.as_fd(), Mode::from_bits_truncate(0o600)).sys("fchmod", &to)?;
            }
            Kind::Share => {
                let dir = Dir {
                    fd,
                    path: to.clone(),
                };
                walk_share(&dir, self.dev, &mut |d, n, _| {
                    fchownat(
                        d.fd.as_fd(),
                        n,
                        Some(uid),
                        Some(gid),
                        AtFlags::AT_SYMLINK_NOFOLLOW,
                    )
                    .sys("fchownat", d.path.join(n))?;
                    Ok(())
                })?;
                nix::unistd::fchown(dir.fd.as_fd(), Some(uid), Some(gid)).sys("fchown", &to)?;
                // Writable by the principal only (the launcher refuses a
                // share source others may write).
                let st = dir.stat()?;
                fchmod(
                    dir.fd.as_fd(),
                    Mode::from_bits_truncate(st.st_mode & 0o7755 & !0o022),
                )
                .sys("fchmod", &to)?;
            }
        }
        Ok(())
    }
}
