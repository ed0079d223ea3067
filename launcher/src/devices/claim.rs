//! The host-wide claim on devices: one launch at a time checks that its
//! devices are free and makes them its VM's. Without it two launches
//! racing for one device could both find it free (each check reads the
//! node's owner and its holders before either launch has changed them)
//! and both take it.
//!
//! The claim is `flock(LOCK_EX)` on `.devices.lock` in the runtime root
//! (root's `0600`, made once and kept, as the id ranges' host-wide
//! directory is), taken after the launch's lease and before its intent
//! record, and held until [`super::take`] has given every node to the
//! principal. Under it each node is checked free again ([`claim`]): the
//! launch that comes second waits, then finds the node the first one's
//! principal's and is refused by name, before its intent record names the
//! device, so a refused launch leaves nothing for cleanup to give back.

use std::os::fd::{AsFd, OwnedFd};

use nix::errno::Errno;
use nix::fcntl::{openat, Flock, FlockArg, OFlag};
use nix::sys::stat::{fstat, Mode};

use crate::devices::{check_free, pci, sysfs, DeviceError, Plan};
use crate::host::dirs::Dir;
use crate::host::sys::SysContext;

/// The lock file's name in the runtime root.
pub const LOCK_FILE: &str = ".devices.lock";

/// Proof that the host-wide device lock is held (released when dropped).
#[derive(Debug)]
pub struct Claim {
    _lock: Flock<OwnedFd>,
}

/// Open (make if missing) `.devices.lock` in `runtime_root` and lock it
/// exclusively, waiting for another launch's claim to end. A file there
/// that is not root's regular `0600` file is refused.
fn lock(runtime_root: &Dir) -> Result<Flock<OwnedFd>, DeviceError> {
    let path = runtime_root.path.join(LOCK_FILE);
    let fd = openat(
        runtime_root.fd.as_fd(),
        LOCK_FILE,
        OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    )
    .sys("open", &path)?;
    let st = fstat(&fd).sys("fstat", &path)?;
    let is_file = st.st_mode & libc::S_IFMT == libc::S_IFREG;
    if !is_file || st.st_uid != 0 || st.st_mode & 0o077 != 0 {
        Err::<(), _>(Errno::EPERM).sys("is not root's 0600 regular file", &path)?;
    }
    Ok(Flock::lock(fd, FlockArg::LockExclusive)
        .map_err(|(_, e)| e)
        .sys("flock", &path)?)
}

/// Take the host-wide device lock (when `plan` has a device; `None`
/// otherwise), then check every node of `plan` free again: root's, held
/// by no process. The lock is held as long as the [`Claim`] lives.
pub fn claim(runtime_root: &Dir, plan: &Plan) -> Result<Option<Claim>, DeviceError> {
    if plan.is_empty() {
        return Ok(None);
    }
    let claim = Claim {
        _lock: lock(runtime_root)?,
    };
    for g in plan.groups() {
        if let Some(node) = sysfs::open_node(&pci::group_node(g))? {
            check_free(&node, &format!("IOMMU group {g}"))?;
        }
    }
    for dev in &plan.usb {
        let node = sysfs::open_node(&dev.node)?.ok_or_else(|| DeviceError::NoSuchUsb {
            selector: dev.selector.to_string(),
        })?;
        check_free(&node, &format!("USB device {}", dev.selector))?;
    }
    Ok(Some(claim))
}
