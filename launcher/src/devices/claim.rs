//! The host-wide claim on devices: one launch at a time checks that its
//! devices are free and makes them its VM's. Without it two launches
//! racing for one device could both find it free (each check reads the
//! node's owner and its holders before either launch has changed them)
//! and both take it.
//!
//! The claim is `flock(LOCK_EX)` on `.devices.lock` in `/var/lib/vmwarden`
//! ([`lock_dir`]; root's `0600`, made once and kept, beside the id ranges'
//! host-wide directory), one for the host whatever runtime and state roots
//! a launch is given: a device is the host's one, and two launchers with
//! two runtime roots each holding a lock of its own could both check a
//! node free, then both give it away (the second's chown after the
//! first's hypervisor opened it). No one but root can open the file, so
//! no one else can hold the lock. Taken after the launch's lease and before its intent
//! record, and held until [`super::take`] has given every node to the
//! principal. Under it each node is checked free again ([`claim`]): the
//! launch that comes second waits, then finds the node the first one's
//! principal's and is refused by name, before its intent record names the
//! device, so a refused launch leaves nothing for cleanup to give back.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use nix::errno::Errno;
use nix::fcntl::{openat, Flock, FlockArg, OFlag};
use nix::sys::stat::{fstat, Mode};

use crate::devices::{check_free, pci, sysfs, DeviceError, Plan};
use crate::host::dirs;
use crate::host::sys::SysContext;

/// The lock file's name in [`lock_dir`].
pub const LOCK_FILE: &str = ".devices.lock";

/// The host-wide directory of the lock (the parent of the id ranges'
/// directory, writable in the unit through its `StateDirectory=`).
pub const DEFAULT_LOCK_DIR: &str = "/var/lib/vmwarden";
/// Builds with the `fault-injection` feature (the test suite) take the
/// directory from this variable; release builds have no way to move it.
pub const TEST_LOCK_DIR_ENV: &str = "VMWARDEN_TEST_DEVICES_LOCK_DIR";

static LOCK_DIR: OnceLock<PathBuf> = OnceLock::new();

/// The host-wide directory of the lock. The launcher calls this before it
/// clears its environment, which fixes it for the process.
pub fn lock_dir() -> &'static Path {
    LOCK_DIR.get_or_init(|| {
        #[cfg(feature = "fault-injection")]
        if let Some(p) = std::env::var_os(TEST_LOCK_DIR_ENV) {
            return PathBuf::from(p);
        }
        PathBuf::from(DEFAULT_LOCK_DIR)
    })
}

/// Proof that the host-wide device lock is held (released when dropped).
#[derive(Debug)]
pub struct Claim {
    _lock: Flock<OwnedFd>,
}

/// Open (make if missing, as `dir` too: root's, no one else may write
/// it) `.devices.lock` in `dir` and lock it exclusively, waiting for
/// another launch's claim to end. A file there that is not root's
/// regular `0600` file is refused.
fn lock(dir: &Path) -> Result<Flock<OwnedFd>, DeviceError> {
    let dir = dirs::ensure_root(dir, None, &dirs::root_want("the devices lock's directory"))?;
    let path = dir.path.join(LOCK_FILE);
    let fd = openat(
        dir.fd.as_fd(),
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

/// Take the host-wide device lock in `lock_dir` ([`lock_dir`] for a
/// launch; when `plan` has a device; `None` otherwise), then check every
/// node of `plan` free again: root's, held by no process. The lock is
/// held as long as the [`Claim`] lives.
pub fn claim(lock_dir: &Path, plan: &Plan) -> Result<Option<Claim>, DeviceError> {
    if plan.is_empty() {
        return Ok(None);
    }
    let claim = Claim {
        _lock: lock(lock_dir)?,
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
