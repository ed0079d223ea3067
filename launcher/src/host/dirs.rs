//! `openat`-style directory handling: walk without following symlinks,
//! create with an exact owner and mode, refuse or tighten what is found.

use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{openat, OFlag, OpenHow, ResolveFlag, AT_FDCWD};
use nix::sys::stat::{fchmod, fstat, mkdirat, FileStat, Mode, SFlag};
use nix::sys::statfs::{FsType, TMPFS_MAGIC};
use nix::unistd::{fchown, Gid, Uid};

use crate::config::names::check_abs_normalised;
use crate::host::sys::{IoContext, IoError, SysContext, SysError};

/// Why a path vmwarden owns was refused.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// The path is relative or not normalised (the reason says which).
    #[error("{0}")]
    NotNormalised(&'static str),
    #[error("is a symlink; vmwarden never follows symlinks on its own paths")]
    Symlink,
    #[error("is not a directory")]
    NotADirectory,
    #[error("is owned by uid {found}, expected uid {expected}; fix or remove it by hand")]
    ForeignOwner { found: u32, expected: u32 },
    #[error("has mode {mode:04o}, looser than {wanted:04o}; its contents cannot be trusted, fix or remove it by hand")]
    LooseMode { mode: u32, wanted: u32 },
    /// A runtime or state root that others may write (`/tmp`, `/var/tmp`,
    /// `/dev/shm`): named by its flag, never tightened.
    #[error("{flag}: is {what} (mode {mode:04o}): other users may have put files in it, and vmwarden never takes over a directory it does not own (it would make it root's 0755, and reap would count their files as its own); give {flag} a directory of vmwarden's own (the default, or one made with `install -d -m 0755 -o root -g root DIR`)")]
    SharedRoot {
        flag: &'static str,
        what: &'static str,
        mode: u32,
    },
    #[error("vanished while it was being created")]
    Vanished,
    #[error("has no parent directory")]
    NoParent,
    #[error("has no UTF-8 file name")]
    NoFileName,
    #[error("is not a regular file of at most {max} bytes")]
    NotASmallFile { max: u64 },
}

/// An error of the directory functions: a refused path, or a failed call.
#[derive(Debug, thiserror::Error)]
pub enum DirError {
    #[error("{path}: refused: {why}")]
    Refused { path: PathBuf, why: Refusal },
    #[error(transparent)]
    Sys(#[from] SysError),
    #[error(transparent)]
    Io(#[from] IoError),
}

impl DirError {
    fn refused(path: impl Into<PathBuf>, why: Refusal) -> DirError {
        DirError::Refused {
            path: path.into(),
            why,
        }
    }

    /// A component of the path does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(
            self,
            DirError::Sys(SysError {
                errno: Errno::ENOENT,
                ..
            })
        )
    }

    /// A refusal of the path itself (`EX_CONFIG`: starting again will not help).
    pub fn is_refusal(&self) -> bool {
        matches!(self, DirError::Refused { .. })
    }
}

type Result<T, E = DirError> = std::result::Result<T, E>;

const DIR_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

/// What to do with group/other permission bits beyond the wanted mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loose {
    /// Refuse: the contents of a loosely-permissioned directory cannot be trusted.
    Refuse,
    /// Tighten to the wanted mode (the directory's contents are checked elsewhere).
    Tighten,
    /// A runtime or state root, named by its flag (`--runtime-root`):
    /// refused when group or others may write it or it is sticky (a
    /// directory others may have put files in is not vmwarden's to take
    /// over); other loose bits are tightened.
    Root(&'static str),
}

/// The bits that make a directory others' too: group or other write, sticky.
const SHARED_BITS: u32 = 0o1022;

/// Why a directory with `mode` is shared, in words; `None` when it is not.
fn shared(mode: u32) -> Option<&'static str> {
    let sticky = mode & 0o1000 != 0;
    Some(match (mode & 0o002 != 0, mode & 0o020 != 0, sticky) {
        (true, _, true) => "world-writable and sticky, like /tmp",
        (true, _, false) => "world-writable",
        (false, true, true) => "group-writable and sticky",
        (false, true, false) => "group-writable",
        (false, false, true) => "sticky (a directory meant for other users' files)",
        (false, false, false) => return None,
    })
}

/// The owner and mode of a runtime or state root: root's, 0755; shared
/// bits refused, naming `flag`.
pub fn root_want(flag: &'static str) -> Want {
    Want {
        uid: 0,
        gid: 0,
        mode: 0o755,
        loose: Loose::Root(flag),
    }
}

/// Refuse a runtime or state root that exists and is not vmwarden's alone:
/// another owner, or writable by others or sticky ([`Loose::Root`]).
/// Every binary calls this for both roots before it reads or changes
/// anything under them; a root that does not exist yet passes (it is made
/// root's 0755).
pub fn check_root(path: &Path, flag: &'static str) -> Result<()> {
    match open_dir_if_exists(path)? {
        Some(dir) => check(&dir, &root_want(flag)).map(drop),
        None => Ok(()),
    }
}

/// The owner and mode a directory must have.
#[derive(Debug, Clone, Copy)]
pub struct Want {
    pub uid: u32,
    pub gid: u32,
    pub mode: u32,
    pub loose: Loose,
}

/// An open directory and the path it was opened by (for messages).
#[derive(Debug)]
pub struct Dir {
    pub fd: OwnedFd,
    pub path: PathBuf,
}

impl Dir {
    pub fn stat(&self) -> Result<FileStat> {
        Ok(fstat(self.fd.as_fd()).sys("fstat", &self.path)?)
    }
}

fn is_dir(st: &FileStat) -> bool {
    SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) == SFlag::S_IFDIR
}

/// Open an absolute, normalised path as a directory, component by component,
/// never following a symlink.
pub fn open_dir(path: &Path) -> Result<Dir> {
    check_abs_normalised(path).map_err(|r| DirError::refused(path, Refusal::NotNormalised(r)))?;
    // One openat2 that refuses a symlink in any component does the walk
    // below in one system call. Anything but success (an old kernel without
    // openat2, a symlink, a missing component) takes the walk, which says
    // precisely what is wrong where.
    let how = OpenHow::new()
        .flags(DIR_FLAGS)
        .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS);
    if let Ok(fd) = nix::fcntl::openat2(AT_FDCWD, path, how) {
        return Ok(Dir {
            fd,
            path: path.to_path_buf(),
        });
    }
    let mut fd = openat(AT_FDCWD, "/", DIR_FLAGS, Mode::empty()).sys("open", "/")?;
    let mut so_far = PathBuf::from("/");
    for c in path.components() {
        if let Component::Normal(name) = c {
            so_far.push(name);
            fd = open_child_dir(&fd, name, &so_far)?;
        }
    }
    Ok(Dir {
        fd,
        path: path.to_path_buf(),
    })
}

/// Why `parent/name` could not be opened as a directory, in words: with
/// `O_DIRECTORY|O_NOFOLLOW` a symlink fails with ENOTDIR or ELOOP.
fn not_a_dir(parent: &OwnedFd, name: &OsStr, path: &Path) -> DirError {
    let is_link = nix::sys::stat::fstatat(
        parent.as_fd(),
        name,
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .map(|st| SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) == SFlag::S_IFLNK)
    .unwrap_or(false);
    DirError::refused(
        path,
        if is_link {
            Refusal::Symlink
        } else {
            Refusal::NotADirectory
        },
    )
}

fn open_child_dir(parent: &OwnedFd, name: &OsStr, path: &Path) -> Result<OwnedFd> {
    match openat(parent.as_fd(), name, DIR_FLAGS, Mode::empty()) {
        Ok(fd) => Ok(fd),
        Err(Errno::ELOOP | Errno::ENOTDIR) => Err(not_a_dir(parent, name, path)),
        Err(e) => Err(e).sys("open directory", path).map_err(Into::into),
    }
}

/// Open `parent/name` as a directory if it exists (never following a
/// symlink). The name is bytes: it need not be UTF-8.
pub fn open_existing(parent: &Dir, name: impl AsRef<OsStr>) -> Result<Option<Dir>> {
    let name = name.as_ref();
    let path = parent.path.join(name);
    match openat(parent.fd.as_fd(), name, DIR_FLAGS, Mode::empty()) {
        Ok(fd) => Ok(Some(Dir { fd, path })),
        Err(Errno::ENOENT) => Ok(None),
        Err(Errno::ELOOP | Errno::ENOTDIR) => Err(not_a_dir(&parent.fd, name, &path)),
        Err(e) => Err(e).sys("open directory", path).map_err(Into::into),
    }
}

/// The refusals of `want` (a foreign owner; loose bits when `Loose::Refuse`),
/// without changing anything. Returns the stat for the caller's fixes.
fn check(dir: &Dir, want: &Want) -> Result<FileStat> {
    let st = dir.stat()?;
    if !is_dir(&st) {
        return Err(DirError::refused(&dir.path, Refusal::NotADirectory));
    }
    if st.st_uid != want.uid {
        return Err(DirError::refused(
            &dir.path,
            Refusal::ForeignOwner {
                found: st.st_uid,
                expected: want.uid,
            },
        ));
    }
    let mode = st.st_mode & 0o7777;
    if let Loose::Root(flag) = want.loose {
        if let Some(what) = shared(mode & SHARED_BITS) {
            return Err(DirError::refused(
                &dir.path,
                Refusal::SharedRoot { flag, what, mode },
            ));
        }
    }
    if mode & !want.mode != 0 && want.loose == Loose::Refuse {
        return Err(DirError::refused(
            &dir.path,
            Refusal::LooseMode {
                mode,
                wanted: want.mode,
            },
        ));
    }
    Ok(st)
}

/// `check`, for a directory the caller opened: refuses what `want` does,
/// changes nothing.
pub fn check_dir(dir: &Dir, want: &Want) -> Result<()> {
    check(dir, want).map(drop)
}

/// Check `dir` against `want`: refuse a foreign owner, refuse or tighten
/// loose bits (a root's shared bits are always refused), fix the group and
/// any missing owner bits.
pub fn enforce(dir: &Dir, want: &Want) -> Result<()> {
    let st = check(dir, want)?;
    if st.st_gid != want.gid {
        fchown(dir.fd.as_fd(), None, Some(Gid::from_raw(want.gid))).sys("fchown", &dir.path)?;
    }
    if st.st_mode & 0o7777 != want.mode {
        fchmod(dir.fd.as_fd(), Mode::from_bits_truncate(want.mode)).sys("fchmod", &dir.path)?;
    }
    Ok(())
}

/// Open `path` as a directory ([`open_dir`]), or `None` when it (or a
/// directory above it) does not exist.
pub fn open_dir_if_exists(path: &Path) -> Result<Option<Dir>> {
    match open_dir(path) {
        Ok(d) => Ok(Some(d)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}

/// Check an existing `parent/name` against `want` without changing
/// anything (a pre-flight check before the launch creates its first file),
/// with the parent already open. A missing directory, or a missing parent
/// (`None`), passes: it will be created with the wanted owner and mode.
/// Returns the directory when it exists.
pub fn preflight_in(parent: Option<&Dir>, name: &str, want: &Want) -> Result<Option<Dir>> {
    let Some(parent) = parent else {
        return Ok(None);
    };
    match open_existing(parent, name)? {
        Some(dir) => check(&dir, want).map(|_| Some(dir)),
        None => Ok(None),
    }
}

/// Create `parent/name` if missing (owner and mode set on the new inode
/// before anyone else can use it), then open it without following symlinks
/// and enforce `want`. Returns the directory and whether it was created.
pub fn ensure(parent: &Dir, name: &str, want: &Want) -> Result<(Dir, bool)> {
    // It usually exists: one open, not a mkdir failing with EEXIST first.
    // (A symlink or a file at the name is refused by the open as by the
    // open after a mkdir.)
    if let Some(dir) = open_existing(parent, name)? {
        enforce(&dir, want)?;
        return Ok((dir, false));
    }
    let path = parent.path.join(name);
    let created = match mkdirat(parent.fd.as_fd(), name, Mode::from_bits_truncate(0o700)) {
        Ok(()) => true,
        Err(Errno::EEXIST) => false,
        Err(e) => return Err(e).sys("mkdir", path).map_err(Into::into),
    };
    let dir = match open_existing(parent, name)? {
        Some(d) => d,
        None => return Err(DirError::refused(path, Refusal::Vanished)),
    };
    if created {
        fchown(
            dir.fd.as_fd(),
            Some(Uid::from_raw(want.uid)),
            Some(Gid::from_raw(want.gid)),
        )
        .sys("fchown", &dir.path)?;
        fchmod(dir.fd.as_fd(), Mode::from_bits_truncate(want.mode)).sys("fchmod", &dir.path)?;
    }
    enforce(&dir, want)?;
    Ok((dir, created))
}

/// [`split_parent`], with `None` for a parent that does not exist (yet).
pub fn split_parent_if_exists(path: &Path) -> Result<(Option<Dir>, String)> {
    match split_parent(path) {
        Ok((d, name)) => Ok((Some(d), name)),
        Err(e) if e.is_not_found() => {
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .ok_or_else(|| DirError::refused(path, Refusal::NoFileName))?;
            Ok((None, name.to_string()))
        }
        Err(e) => Err(e),
    }
}

/// A root directory (the runtime or state root): `opened` when the caller
/// has it open already (its pre-flight), checked against `want` again
/// (as [`ensure`] would: with [`root_want`], shared bits refused and other
/// loose bits tightened); otherwise created in its parent if missing, as
/// [`ensure`] does.
pub fn ensure_root(path: &Path, opened: Option<Dir>, want: &Want) -> Result<Dir> {
    if let Some(dir) = opened {
        enforce(&dir, want)?;
        return Ok(dir);
    }
    let (parent, name) = split_parent(path)?;
    Ok(ensure(&parent, &name, want)?.0)
}

/// Open the parent of `path` (walked without symlinks) and return it with
/// the final component.
pub fn split_parent(path: &Path) -> Result<(Dir, String)> {
    let parent = path
        .parent()
        .ok_or_else(|| DirError::refused(path, Refusal::NoParent))?;
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| DirError::refused(path, Refusal::NoFileName))?;
    Ok((open_dir(parent)?, name.to_string()))
}

/// Replace `dir/name` durably: write a temp file (`O_EXCL`, `mode`), fsync,
/// rename over `name`, fsync the directory.
///
/// On a tmpfs (`/run` in production) there is no disk to be durable on and
/// nothing survives a reboot anyway: the fsyncs are skipped there and kept
/// everywhere else.
pub fn durable_write(dir: &Dir, name: &str, bytes: &[u8], mode: u32) -> Result<()> {
    replace(dir, name, bytes, mode, true)
}

/// Replace `dir/name` atomically but without fsync: readers see the old
/// file or the whole new one. For files that need not outlive the machine
/// (the runtime root is on /run) and are written on the launch's hot path.
pub fn atomic_write(dir: &Dir, name: &str, bytes: &[u8], mode: u32) -> Result<()> {
    replace(dir, name, bytes, mode, false)
}

fn replace(dir: &Dir, name: &str, bytes: &[u8], mode: u32, sync: bool) -> Result<()> {
    use std::io::Write;
    let tmp = format!(".{name}.tmp");
    let path = dir.path.join(name);
    let tmp_path = dir.path.join(&tmp);
    let create = || {
        openat(
            dir.fd.as_fd(),
            tmp.as_str(),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(mode),
        )
    };
    // A temp file left by a writer killed mid-way is replaced.
    let fd = match create() {
        Err(Errno::EEXIST) => {
            nix::unistd::unlinkat(
                dir.fd.as_fd(),
                tmp.as_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            )
            .sys("unlink", &tmp_path)?;
            create()
        }
        r => r,
    }
    .sys("create", &tmp_path)?;
    // On a tmpfs (/run) there is no disk to be durable on.
    let durable = sync && !on_tmpfs(dir);
    let mut f = std::fs::File::from(fd);
    f.write_all(bytes).io("write", &tmp_path)?;
    if durable {
        nix::unistd::fsync(f.as_fd()).sys("fsync", &tmp_path)?;
    }
    drop(f);
    nix::fcntl::renameat(dir.fd.as_fd(), tmp.as_str(), dir.fd.as_fd(), name)
        .sys("rename", &path)?;
    if durable {
        nix::unistd::fsync(dir.fd.as_fd()).sys("fsync", &dir.path)?;
    }
    Ok(())
}

/// linux/magic.h; nix names TMPFS_MAGIC but not this one.
const RAMFS_MAGIC: FsType = FsType(0x8584_58f6);

/// Is `dir` on a tmpfs (or ramfs)? When unsure, no.
pub fn on_tmpfs(dir: &Dir) -> bool {
    nix::sys::statfs::fstatfs(dir.fd.as_fd())
        .map(|s| {
            let t = s.filesystem_type();
            // ramfs: linux/magic.h RAMFS_MAGIC.
            t == TMPFS_MAGIC || t == RAMFS_MAGIC
        })
        .unwrap_or(false)
}

/// Read a small regular file `dir/name` without following symlinks.
/// `Ok(None)` when it does not exist.
pub fn read_small(dir: &Dir, name: &str, max: u64) -> Result<Option<Vec<u8>>> {
    use std::io::Read;
    let path = dir.path.join(name);
    let fd = match openat(
        dir.fd.as_fd(),
        name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
        Mode::empty(),
    ) {
        Err(Errno::ENOENT) => return Ok(None),
        r => r.sys("open", &path)?,
    };
    let f = std::fs::File::from(fd);
    let md = f.metadata().io("stat", &path)?;
    if !md.is_file() || md.len() > max {
        return Err(DirError::refused(path, Refusal::NotASmallFile { max }));
    }
    // Sized from the stat: one read takes it and one more sees the end
    // (`read_to_end` on an empty Vec probes from 32 bytes up: eight reads
    // for a 1 KiB intent record).
    let mut bytes = Vec::with_capacity(usize::try_from(md.len()).unwrap_or(0).saturating_add(1));
    f.take(max).read_to_end(&mut bytes).io("read", path)?;
    Ok(Some(bytes))
}

#[cfg(test)]
mod tests {
    use super::shared;

    #[test]
    fn a_root_others_may_write_or_a_sticky_one_is_shared() {
        assert_eq!(
            shared(0o1777 & SHARED),
            Some("world-writable and sticky, like /tmp")
        );
        assert_eq!(shared(0o777 & SHARED), Some("world-writable"));
        assert_eq!(shared(0o775 & SHARED), Some("group-writable"));
        assert_eq!(shared(0o3775 & SHARED), Some("group-writable and sticky"));
        assert!(shared(0o1755 & SHARED).is_some_and(|w| w.starts_with("sticky")));
        for mine in [0o755, 0o700, 0o2755, 0o4755, 0o711] {
            assert_eq!(shared(mine & SHARED), None, "{mine:o}");
        }
    }

    const SHARED: u32 = super::SHARED_BITS;
}
