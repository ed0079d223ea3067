//! The files of the control dir the launcher itself writes before the
//! hypervisor starts: a dead instance's stale sockets removed, the
//! principal's files (firecracker's config, cloud-hypervisor's API lock)
//! created.

use nix::errno::Errno;

use crate::host::dirs::Dir;
use crate::host::sys::{IoContext, SysContext};
use crate::identity::principal::Principal;
use crate::launch::StepError;

type Result<T, E = StepError> = std::result::Result<T, E>;

/// Remove every file a dead instance's hypervisor may have left in the
/// control dir: a hypervisor cannot bind over a stale socket.
pub fn remove_all_stale(dir: &Dir) -> Result<()> {
    use crate::config::paths::{
        API_SOCKET, CH_API_LOCK, CONSOLE_SOCKET, FIRECRACKER_CONFIG, QMP_SOCKET, VSOCK_SOCKET,
    };
    for stale in [
        QMP_SOCKET,
        API_SOCKET,
        CH_API_LOCK,
        FIRECRACKER_CONFIG,
        VSOCK_SOCKET,
        CONSOLE_SOCKET,
    ] {
        remove_stale(dir, stale)?;
    }
    Ok(())
}

/// Remove `dir/name` if it exists (never following a symlink).
pub fn remove_stale(dir: &Dir, name: &str) -> Result<()> {
    use std::os::fd::AsFd;
    match nix::unistd::unlinkat(
        dir.fd.as_fd(),
        name,
        nix::unistd::UnlinkatFlags::NoRemoveDir,
    ) {
        Ok(()) | Err(Errno::ENOENT) => Ok(()),
        Err(e) => Err(e)
            .sys("unlink stale", dir.path.join(name))
            .map_err(Into::into),
    }
}

/// Create `dir/name` (`O_EXCL|O_NOFOLLOW`, 0600), owned by the principal.
pub fn write_private(dir: &Dir, name: &str, bytes: &[u8], p: &Principal) -> Result<()> {
    use nix::fcntl::{openat, OFlag};
    use nix::sys::stat::Mode;
    use std::io::Write;
    use std::os::fd::AsFd;
    let path = dir.path.join(name);
    let fd = openat(
        dir.fd.as_fd(),
        name,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    )
    .sys("create", &path)?;
    nix::unistd::fchown(
        &fd,
        Some(nix::unistd::Uid::from_raw(p.uid)),
        Some(nix::unistd::Gid::from_raw(p.gid)),
    )
    .sys("fchown", &path)?;
    let mut f = std::fs::File::from(fd);
    f.write_all(bytes).io("write", &path)?;
    f.sync_all().io("fsync", path)?;
    Ok(())
}
