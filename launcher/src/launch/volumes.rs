//! `disks[].create`: images the launcher makes inside the VM's own state
//! dir, once.
//!
//! Root creates the image under a temporary name next to its final one
//! (`O_CREAT|O_EXCL|O_NOFOLLOW`, relative to the parent directory's fd),
//! gives it to the principal (0600) and sizes it with `ftruncate` (sparse).
//! With `fs_type`, `mkfs` formats it in a forked child that has dropped to
//! the principal (no supplementary groups) and restricted itself with
//! Landlock to that one file and the system's program trees; it reaches the
//! image through `/proc/self/fd/N`, the very inode root made. Only then is
//! the image renamed into place (`RENAME_NOREPLACE`): a launch killed in
//! between leaves the temporary name, which the intent record lists and
//! cleanup removes, never a half-made image under the final name. Root
//! never reads an image: an existing one is only `fstatat`ed (a regular
//! file of the principal's, not a symlink) and left alone.

use std::ffi::CString;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{openat, renameat2, AtFlags, OFlag, RenameFlags};
use nix::sys::stat::{fchmod, fstatat, Mode, SFlag};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{fchown, ftruncate, Gid, Uid};

use crate::config::spec::{FsType, LandlockMode, Spec, SpecError};
use crate::host::dirs::{self, Dir, DirError};
use crate::host::trust::{self, Distrust, Policy};
use crate::identity::principal::Principal;
use crate::launch::landlock::{self, Grant, Rule};
use crate::launch::sandbox;
use crate::launch::syscall::LinuxSyscall;
use crate::launch::EXEC_PATH;

/// The temporary name of an image being made: hidden, next to the final
/// one (a rename never crosses a file system), and never a name a spec can
/// give (`.…​.vmwarden-new`). Cleanup removes exactly this name.
pub fn temp_name(final_name: &str) -> String {
    format!(".{final_name}.vmwarden-new")
}

/// The temporary path of `image` (see [`temp_name`]).
pub fn temp_path(image: &Path) -> Option<PathBuf> {
    let name = image.file_name()?.to_str()?;
    Some(image.with_file_name(temp_name(name)))
}

/// Where `mkfs.<fs>` is looked for: the system profile on NixOS, then the
/// usual sbin and bin directories. It must be root's alone (like the
/// hypervisor binary): it runs with the image of a VM open.
pub const MKFS_DIRS: &[&str] = &[
    "/run/current-system/sw/bin",
    "/usr/local/sbin",
    "/usr/sbin",
    "/sbin",
    "/usr/bin",
    "/bin",
];

/// The program that formats `fs`.
pub fn mkfs_name(fs: FsType) -> &'static str {
    match fs {
        FsType::Ext4 => "mkfs.ext4",
    }
}

/// A created image could not be made; `field` is the spec field
/// (`disks[0].create`, …) and `path` the image.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// What is there refuses the image: a symlink, another kind of file, a
    /// foreign owner.
    #[error("`{field}`: {path}: {reason}; nothing was created")]
    Refused {
        field: String,
        path: PathBuf,
        reason: String,
    },
    #[error("`{field}`: {path}: {op}: {errno}")]
    Sys {
        field: String,
        path: PathBuf,
        op: &'static str,
        #[source]
        errno: Errno,
    },
    #[error("`{field}`: {path}: {source}")]
    Dir {
        field: String,
        path: PathBuf,
        #[source]
        source: DirError,
    },
    /// `mkfs` as the principal did not succeed.
    #[error(transparent)]
    Mkfs(Box<MkfsFailed>),
}

/// `mkfs` as the principal did not succeed (its stderr, shortened).
#[derive(Debug, thiserror::Error)]
#[error("`{field}`: {path}: {program} (as uid {uid}) {status}: {stderr}")]
pub struct MkfsFailed {
    pub field: String,
    pub path: PathBuf,
    pub program: PathBuf,
    pub uid: u32,
    pub status: String,
    pub stderr: String,
}

impl VolumeError {
    /// What turns the errno of `op` on `path` (for the disk at `field`)
    /// into a [`VolumeError::Sys`], for `map_err`.
    fn sys(field: &str, path: &Path, op: &'static str) -> impl FnOnce(Errno) -> VolumeError {
        let field = field.to_string();
        let path = path.to_path_buf();
        move |errno| VolumeError::Sys {
            field,
            path,
            op,
            errno,
        }
    }

    /// A refusal of what is on the host (`EX_CONFIG`).
    pub fn is_refusal(&self) -> bool {
        match self {
            VolumeError::Refused { .. } => true,
            VolumeError::Dir { source, .. } => source.is_refusal(),
            VolumeError::Sys { .. } | VolumeError::Mkfs(_) => false,
        }
    }
}

type Result<T, E = VolumeError> = std::result::Result<T, E>;

fn bad(spec_path: &Path, field: String, reason: String) -> SpecError {
    SpecError::Invalid {
        path: spec_path.to_path_buf(),
        field,
        reason,
    }
}

fn kind_of(st: &nix::sys::stat::FileStat) -> SFlag {
    SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits())
}

/// Find `mkfs.<fs>` in [`MKFS_DIRS`] and check it is root's alone.
pub fn find_mkfs(fs: FsType) -> std::result::Result<PathBuf, Option<Distrust>> {
    let name = mkfs_name(fs);
    let Some(p) = MKFS_DIRS
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
    else {
        return Err(None);
    };
    trust::regular_file(&p, Policy::Executable).map_err(Some)?;
    Ok(p)
}

/// Before anything is created (`principal-resolved`): an image that exists
/// is a regular file of the principal's reached without a symlink, a
/// missing one has its directory, and `mkfs` is there and root's.
pub fn preflight(
    spec: &Spec,
    spec_path: &Path,
    principal: &Principal,
    state_dir: &Path,
) -> std::result::Result<(), SpecError> {
    for (i, d) in spec.disks.iter().enumerate() {
        let Some(c) = &d.create else { continue };
        let field = format!("disks[{i}].create");
        // Every directory between the state dir and the image: a real
        // directory (the state dir itself may not exist yet).
        let mut dir = d.path.parent();
        while let Some(p) = dir {
            if !p.starts_with(state_dir) || p == state_dir {
                break;
            }
            match std::fs::symlink_metadata(p) {
                Ok(m) if m.file_type().is_dir() => {}
                Ok(m) => {
                    return Err(bad(
                        spec_path,
                        field,
                        format!(
                            "{} is on the way to the image {} but is a {:?}, not a directory; vmwarden follows no symlink inside a VM's state dir",
                            p.display(),
                            d.path.display(),
                            m.file_type()
                        ),
                    ))
                }
                Err(e) => {
                    return Err(bad(
                        spec_path,
                        field,
                        format!(
                            "the directory {} of the image {}: {e}; vmwarden creates the image, not its directories (create it as the principal, or put the image directly in {})",
                            p.display(),
                            d.path.display(),
                            state_dir.display()
                        ),
                    ))
                }
            }
            dir = p.parent();
        }
        match std::fs::symlink_metadata(&d.path) {
            Ok(m) => check_existing(spec_path, &field, &d.path, &m, principal)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if let Some(fs) = c.fs() {
                    let fs_field = format!("{field}.fs_type");
                    match find_mkfs(fs) {
                        Ok(_) => {}
                        Err(None) => {
                            return Err(bad(
                                spec_path,
                                fs_field,
                                format!(
                                    "needs {} to format {}, found in none of {}; install it (Debian: e2fsprogs) or drop fs_type",
                                    mkfs_name(fs),
                                    d.path.display(),
                                    MKFS_DIRS.join(", ")
                                ),
                            ))
                        }
                        Err(Some(why)) => {
                            return Err(bad(
                                spec_path,
                                fs_field,
                                format!("{} cannot be trusted: {why}", mkfs_name(fs)),
                            ))
                        }
                    }
                }
            }
            Err(e) => return Err(bad(spec_path, field, format!("{}: {e}", d.path.display()))),
        }
    }
    Ok(())
}

fn check_existing(
    spec_path: &Path,
    field: &str,
    path: &Path,
    m: &std::fs::Metadata,
    principal: &Principal,
) -> std::result::Result<(), SpecError> {
    use std::os::unix::fs::MetadataExt;
    if m.file_type().is_symlink() {
        return Err(bad(
            spec_path,
            field.to_string(),
            format!(
                "{} is a symlink; an image vmwarden creates is a regular file of the VM's principal, and vmwarden follows no symlink inside a VM's state dir",
                path.display()
            ),
        ));
    }
    if !m.file_type().is_file() {
        return Err(bad(
            spec_path,
            field.to_string(),
            format!(
                "{} exists but is not a regular file ({:?})",
                path.display(),
                m.file_type()
            ),
        ));
    }
    if m.uid() != principal.uid {
        return Err(bad(
            spec_path,
            field.to_string(),
            format!(
                "{} exists but is owned by uid {}, not the VM's principal {}; vmwarden neither adopts nor overwrites it (chown it to the principal, or remove it to have it created)",
                path.display(),
                m.uid(),
                principal.uid
            ),
        ));
    }
    Ok(())
}

/// An image made under its temporary name, waiting for [`commit`].
#[derive(Debug)]
pub struct Pending {
    field: String,
    parent: Dir,
    temp: String,
    name: String,
}

/// Make every missing image of the spec under its temporary name: root
/// creates, owns to the principal, sizes; `mkfs` runs as the principal.
/// Inside the VM's mount namespace, before the privilege drop.
pub fn prepare(spec: &Spec, principal: &Principal, state_dir: &Path) -> Result<Vec<Pending>> {
    let mut pending = Vec::new();
    for (i, d) in spec.disks.iter().enumerate() {
        let Some(c) = &d.create else { continue };
        let field = format!("disks[{i}].create");
        let refused = |reason: String| VolumeError::Refused {
            field: field.clone(),
            path: d.path.clone(),
            reason,
        };
        if !d.path.starts_with(state_dir) || d.path == state_dir {
            return Err(refused(format!(
                "is not strictly inside the VM's state dir {}",
                state_dir.display()
            )));
        }
        let (parent, name) = dirs::split_parent(&d.path).map_err(|source| VolumeError::Dir {
            field: field.clone(),
            path: d.path.clone(),
            source,
        })?;
        let sys = |op: &'static str, path: &Path| VolumeError::sys(&field, path, op);
        match fstatat(
            parent.fd.as_fd(),
            name.as_str(),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        ) {
            Ok(st) => {
                // Made by an earlier launch (or by the user): left alone.
                if kind_of(&st) != SFlag::S_IFREG {
                    return Err(refused(format!(
                        "exists but is not a regular file (mode {:o}); vmwarden follows no symlink inside a VM's state dir",
                        st.st_mode
                    )));
                }
                if st.st_uid != principal.uid {
                    return Err(refused(format!(
                        "exists but is owned by uid {}, not the VM's principal {}",
                        st.st_uid, principal.uid
                    )));
                }
                tracing::info!(step = %"images-made", image = %d.path.display(), "image exists; left as it is");
                continue;
            }
            Err(Errno::ENOENT) => {}
            Err(e) => return Err(sys("fstatat", &d.path)(e)),
        }
        let temp = temp_name(&name);
        let temp_path = parent.path.join(&temp);
        // A leftover of a launch killed while making it: never a finished
        // image (those have the final name), so it goes.
        match nix::unistd::unlinkat(
            parent.fd.as_fd(),
            temp.as_str(),
            nix::unistd::UnlinkatFlags::NoRemoveDir,
        ) {
            Ok(()) | Err(Errno::ENOENT) => {}
            Err(e) => return Err(sys("unlink leftover", &temp_path)(e)),
        }
        let fd = openat(
            parent.fd.as_fd(),
            temp.as_str(),
            OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(sys("create", &temp_path))?;
        fchown(
            &fd,
            Some(Uid::from_raw(principal.uid)),
            Some(Gid::from_raw(principal.gid)),
        )
        .map_err(sys("fchown", &temp_path))?;
        fchmod(&fd, Mode::from_bits_truncate(0o600)).map_err(sys("fchmod", &temp_path))?;
        let bytes = c.size_mib * 1024 * 1024;
        let len = i64::try_from(bytes)
            .map_err(|_| refused(format!("size_mib {} is too large", c.size_mib)))?;
        ftruncate(&fd, len).map_err(sys("ftruncate", &temp_path))?;
        if let Some(fs) = c.fs() {
            let program = find_mkfs(fs).map_err(|why| {
                refused(format!(
                    "{} is missing or cannot be trusted{}",
                    mkfs_name(fs),
                    why.map(|w| format!(": {w}")).unwrap_or_default()
                ))
            })?;
            run_mkfs(
                &program,
                fd.as_fd(),
                &temp_path,
                principal,
                spec.landlock.mode,
                &field,
            )?;
        }
        nix::unistd::fsync(&fd).map_err(sys("fsync", &temp_path))?;
        tracing::info!(step = %"images-made", image = %temp_path.display(), size_mib = c.size_mib, fs = ?c.fs(), "image made");
        pending.push(Pending {
            field,
            parent,
            temp,
            name,
        });
    }
    Ok(pending)
}

/// Rename every prepared image into place (never over an existing entry),
/// then make the renames durable.
pub fn commit(pending: Vec<Pending>) -> Result<()> {
    for p in pending {
        let path = p.parent.path.join(&p.name);
        let sys = |op: &'static str| VolumeError::sys(&p.field, &path, op);
        renameat2(
            p.parent.fd.as_fd(),
            p.temp.as_str(),
            p.parent.fd.as_fd(),
            p.name.as_str(),
            RenameFlags::RENAME_NOREPLACE,
        )
        .map_err(sys("rename into place"))?;
        nix::unistd::fsync(&p.parent.fd).map_err(sys("fsync directory"))?;
        tracing::info!(step = %"images-in-place", image = %path.display(), "image in place");
    }
    Ok(())
}

/// How much of `mkfs`'s output an error keeps.
const MKFS_OUTPUT_MAX: usize = 2048;

/// Format the open image `image` with `program`, run as the principal (no
/// supplementary groups, every capability gone, `no_new_privs`) under a
/// Landlock domain of its own: the system's program trees, `/dev/null`,
/// `/etc/mke2fs.conf` and this one file. Waits for it.
fn run_mkfs(
    program: &Path,
    image: BorrowedFd<'_>,
    image_path: &Path,
    principal: &Principal,
    mode: LandlockMode,
    field: &str,
) -> Result<()> {
    let fail = |status: String, stderr: String| {
        VolumeError::Mkfs(Box::new(MkfsFailed {
            field: field.to_string(),
            path: image_path.to_path_buf(),
            program: program.to_path_buf(),
            uid: principal.uid,
            status,
            stderr,
        }))
    };
    let sys = |op: &'static str| VolumeError::sys(field, image_path, op);
    // Everything the child needs is made here, before the fork.
    let fd_path = format!("/proc/self/fd/{}", image.as_raw_fd());
    let cstr = |s: &str| {
        CString::new(s).map_err(|_| fail("not run".into(), format!("{s:?} contains a NUL byte")))
    };
    let c_prog = cstr(&program.to_string_lossy())?;
    // -F: a regular file is formatted without asking; -E nodiscard: the
    // image stays sparse without punching holes; -q: errors only.
    let c_argv = [
        c_prog.clone(),
        cstr("-q")?,
        cstr("-F")?,
        cstr("-E")?,
        cstr("nodiscard")?,
        cstr(&fd_path)?,
    ];
    let c_env = [cstr(EXEC_PATH)?];
    let mut child_principal = principal.clone();
    child_principal.groups.clear();
    let mut rules = landlock::program_rules(program, format!("{field}.fs_type"));
    rules.push(Rule {
        path: PathBuf::from("/etc/mke2fs.conf"),
        grant: Grant::Read,
        field: None,
    });
    rules.push(Rule {
        path: image_path.to_path_buf(),
        grant: Grant::Write,
        field: Some(field.to_string()),
    });
    let vm_tree = image_path.parent().map(Path::to_path_buf);
    let policy = landlock::Policy {
        rules,
        vm_trees: vm_tree.into_iter().collect(),
        // mkfs starts nothing that signals it.
        ..landlock::Policy::default()
    };
    let (rd, wr) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(sys("pipe2"))?;
    let parent_pid = nix::unistd::getpid();
    // SAFETY: the launcher is single-threaded (checked again by the drop in
    // the child), so the child may allocate and call anything; it never
    // returns into the launcher: it execs or `_exit`s.
    match unsafe { nix::unistd::fork() }.map_err(sys("fork"))? {
        nix::unistd::ForkResult::Child => {
            drop(rd);
            let code = match child(
                &wr,
                &child_principal,
                &policy,
                mode,
                image,
                parent_pid,
                &c_prog,
                &c_argv,
                &c_env,
            ) {
                Ok(never) => match never {},
                Err(msg) => {
                    let _ = nix::unistd::write(&wr, msg.as_bytes());
                    126
                }
            };
            // SAFETY: _exit ends the child without running the launcher's
            // destructors or atexit handlers (they belong to the parent).
            unsafe { libc::_exit(code) }
        }
        nix::unistd::ForkResult::Parent { child } => {
            drop(wr);
            let mut out = Vec::new();
            let mut f = std::fs::File::from(rd);
            let _ = (&mut f).take(64 * 1024).read_to_end(&mut out);
            drop(f);
            let status = loop {
                match waitpid(child, None) {
                    Err(Errno::EINTR) => continue,
                    other => break other.map_err(sys("waitpid"))?,
                }
            };
            let text = || {
                let s = String::from_utf8_lossy(&out);
                let s = s.trim();
                let mut cut = s.len().min(MKFS_OUTPUT_MAX);
                while !s.is_char_boundary(cut) {
                    cut -= 1;
                }
                s[..cut].to_string()
            };
            match status {
                WaitStatus::Exited(_, 0) => Ok(()),
                WaitStatus::Exited(_, n) => Err(fail(format!("exited {n}"), text())),
                WaitStatus::Signaled(_, s, _) => Err(fail(format!("killed by {s}"), text())),
                other => Err(fail(format!("ended as {other:?}"), text())),
            }
        }
    }
}

/// The forked child: drop, restrict, exec. Returns only an error message.
#[allow(clippy::too_many_arguments)]
fn child(
    out: &OwnedFd,
    p: &Principal,
    policy: &landlock::Policy,
    mode: LandlockMode,
    image: BorrowedFd<'_>,
    parent_pid: nix::unistd::Pid,
    prog: &CString,
    argv: &[CString],
    env: &[CString],
) -> std::result::Result<std::convert::Infallible, String> {
    for target in [1, 2] {
        // SAFETY: dup2 only changes this (child) process's fd table; `out`
        // stays open for the messages below.
        let rc = unsafe { libc::dup2(out.as_raw_fd(), target) };
        Errno::result(rc).map_err(|e| format!("dup2: {e}"))?;
    }
    sandbox::drop_privileges(p).map_err(|e| e.to_string())?;
    // After the drop (a credential change clears it): the child dies with
    // the launcher, and a launcher already gone is noticed here.
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
        .map_err(|e| format!("prctl(PR_SET_PDEATHSIG): {e}"))?;
    if nix::unistd::getppid() != parent_pid {
        return Err("the launcher died while mkfs was starting".into());
    }
    landlock::apply(policy, mode).map_err(|e| e.to_string())?;
    // Keep stdout/stderr (fds 1, 2 are below 3) and the image fd.
    nix::fcntl::fcntl(
        image,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
    )
    .map_err(|e| format!("fcntl(F_SETFD): {e}"))?;
    sandbox::cloexec_all_but(&LinuxSyscall, &[image.as_raw_fd()]).map_err(|e| e.to_string())?;
    let errno = match nix::unistd::execve(prog, argv, env) {
        Ok(never) => match never {},
        Err(e) => e,
    };
    Err(format!("execve {prog:?}: {errno}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_temporary_name_sits_next_to_the_image_and_is_hidden() {
        assert_eq!(temp_name("data.img"), ".data.img.vmwarden-new");
        assert_eq!(
            temp_path(Path::new("/var/lib/vmwarden/web/vols/data.img")),
            Some(PathBuf::from(
                "/var/lib/vmwarden/web/vols/.data.img.vmwarden-new"
            ))
        );
    }
}
