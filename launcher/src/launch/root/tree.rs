//! The directories, mount points and symlinks of the VM's root, made
//! relative to its tmpfs's root directory.

use std::collections::HashSet;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::{Mode, SFlag};

use crate::host::sys::SysContext;
use crate::launch::sandbox::SandboxError;

type Result<T, E = SandboxError> = std::result::Result<T, E>;

/// The VM's root while [`enter`](super::enter) fills it: its tmpfs's root directory,
/// opened once, which every directory, mount point and symlink is made
/// relative to (`mkdirat`, `openat`, `symlinkat`: no walk from the host's
/// `/` to the runtime root each time), and the directories made so far
/// (each made once, not again for every bind under it).
pub(super) struct Tree<'a> {
    at: &'a Path,
    root: OwnedFd,
    made: HashSet<PathBuf>,
}

impl<'a> Tree<'a> {
    pub(super) fn open(at: &'a Path) -> Result<Tree<'a>> {
        let root = nix::fcntl::open(
            at,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .sys("open the VM's root", at)?;
        Ok(Tree {
            at,
            root,
            made: HashSet::new(),
        })
    }

    /// `path` (absolute, as in the VM) relative to the root's descriptor,
    /// `.` for the root itself.
    fn relative(path: &Path) -> &Path {
        match path.strip_prefix("/").unwrap_or(path) {
            p if p.as_os_str().is_empty() => Path::new("."),
            p => p,
        }
    }

    /// The host path of `path` in the VM's root, for errors.
    pub(super) fn shown(&self, path: &Path) -> PathBuf {
        self.at.join(path.strip_prefix("/").unwrap_or(path))
    }

    /// Make `dir` and every missing directory above it (0755 under the
    /// umask [`enter`](super::enter) sets), as `create_dir_all` does: a directory there
    /// already (one of a bound tree) will do, anything else will not.
    pub(super) fn dir(&mut self, dir: &Path) -> Result<()> {
        let dir = Self::relative(dir);
        if dir == Path::new(".") || self.made.contains(dir) {
            return Ok(());
        }
        if let Some(parent) = dir.parent() {
            if !parent.as_os_str().is_empty() {
                self.dir(parent)?;
            }
        }
        let fd = self.root.as_fd();
        match nix::sys::stat::mkdirat(fd, dir, Mode::from_bits_truncate(0o777)) {
            Ok(()) => {}
            Err(Errno::EEXIST) if is_dir(fd, dir) => {}
            Err(e) => return Err(e).sys("mkdir in the VM's root", self.shown(dir))?,
        }
        self.made.insert(dir.to_path_buf());
        Ok(())
    }

    /// What a bind is mounted on: a directory, or an empty regular file
    /// (`mknodat`). One there already will do when it is of the kind
    /// (`lstat`ed, a symlink never is): the path may be inside a tree bound
    /// before it, a writable disk in a read-only tree, where it is the
    /// host's file itself. Never opened, so never truncated (the read-only
    /// bind refused that with `EROFS`; a mount of the disk's own below it
    /// let root empty the disk).
    pub(super) fn mount_point(&mut self, path: &Path, directory: bool) -> Result<()> {
        let rel = Self::relative(path);
        let fd = self.root.as_fd();
        let made = if directory {
            nix::sys::stat::mkdirat(fd, rel, Mode::from_bits_truncate(0o777))
        } else {
            nix::sys::stat::mknodat(fd, rel, SFlag::S_IFREG, Mode::from_bits_truncate(0o666), 0)
        };
        match made {
            Ok(()) => {}
            Err(Errno::EEXIST)
                if kind_of(fd, rel)
                    .is_some_and(|k| (k == SFlag::S_IFDIR) == directory && k != SFlag::S_IFLNK) => {
            }
            Err(e) => return Err(e).sys("make a mount point in the VM's root", self.shown(rel))?,
        }
        if directory {
            self.made.insert(rel.to_path_buf());
        }
        Ok(())
    }

    /// What is at `path` now (the root of the bind just mounted there),
    /// opened `O_PATH` relative to the root's descriptor with no symlink
    /// followed on the way and nothing outside the root reached (`openat2`,
    /// `RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH`): what the bind's flags are
    /// set through. A second walk by path from the host's `/` followed a
    /// symlink put in the way since the bind (a host tree the bind lies
    /// in), and set the flags on whatever mount it led to.
    pub(super) fn open_mounted(&self, path: &Path) -> Result<OwnedFd> {
        use nix::fcntl::{OpenHow, ResolveFlag};
        let rel = Self::relative(path);
        let how = OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_BENEATH);
        match nix::fcntl::openat2(self.root.as_fd(), rel, how) {
            Ok(fd) => Ok(fd),
            // No openat2 (a kernel before 5.6, or a filter that answers
            // ENOSYS or EPERM for it: systemd does under the unit's
            // RestrictSUIDSGID=, its filter cannot read openat2's mode):
            // the same walk, one component at a time, none followed.
            Err(Errno::ENOSYS | Errno::EPERM) => self.walk_unfollowed(rel),
            Err(e) => Err(e).sys("open a bind in the VM's root", self.shown(rel))?,
        }
    }

    /// `rel` opened `O_PATH` from the tmpfs's root one component at a
    /// time, each `O_NOFOLLOW` (a symlink on the way is not a directory;
    /// one at the end is opened itself, and so is not the bind's file).
    /// Only plain names: `..` or a root would leave the tree.
    pub(super) fn walk_unfollowed(&self, rel: &Path) -> Result<OwnedFd> {
        use std::path::Component;
        let names: Vec<&std::ffi::OsStr> = rel
            .components()
            .filter(|c| *c != Component::CurDir)
            .map(|c| match c {
                Component::Normal(n) => Ok(n),
                _ => Err(Errno::EXDEV),
            })
            .collect::<std::result::Result<_, _>>()
            .sys("open a bind in the VM's root", self.shown(rel))?;
        let flags = OFlag::O_PATH | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW;
        let mut cur = nix::fcntl::openat(self.root.as_fd(), ".", flags, Mode::empty())
            .sys("open a bind in the VM's root", self.shown(rel))?;
        for (i, name) in names.iter().enumerate() {
            let more = if i + 1 < names.len() {
                OFlag::O_DIRECTORY
            } else {
                OFlag::empty()
            };
            cur = nix::fcntl::openat(cur.as_fd(), *name, flags | more, Mode::empty())
                .sys("open a bind in the VM's root", self.shown(rel))?;
        }
        Ok(cur)
    }

    /// A symlink at `location` to `target`; one there already will do.
    pub(super) fn symlink(&self, location: &Path, target: &Path) -> Result<()> {
        let rel = Self::relative(location);
        match nix::unistd::symlinkat(target, self.root.as_fd(), rel) {
            Ok(()) | Err(Errno::EEXIST) => Ok(()),
            Err(e) => Err(e).sys("symlink in the VM's root", self.shown(rel))?,
        }
    }
}

/// Whether `path`, relative to `dir`, is a directory (symlinks followed,
/// as `Path::is_dir`).
fn is_dir(dir: BorrowedFd<'_>, path: &Path) -> bool {
    nix::sys::stat::fstatat(dir, path, nix::fcntl::AtFlags::empty())
        .is_ok_and(|st| st.st_mode & SFlag::S_IFMT.bits() == SFlag::S_IFDIR.bits())
}

/// The file type of `path`, relative to `dir`, itself (not followed).
fn kind_of(dir: BorrowedFd<'_>, path: &Path) -> Option<SFlag> {
    nix::sys::stat::fstatat(dir, path, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
        .ok()
        .map(|st| SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()))
}
