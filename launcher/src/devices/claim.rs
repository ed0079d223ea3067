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
//! no one else can hold the lock; a file planted there that is not that
//! (a link, another owner, a loose mode, a second link) is refused by
//! name, and a claim held past [`LOCK_WAIT`] fails naming its holder.
//! Taken after the launch's lease and before its intent
//! record, and held until [`super::take`] has given every node to the
//! principal. Under it each node is checked free again ([`claim`]): the
//! launch that comes second waits, then finds the node the first one's
//! principal's and is refused by name, before its intent record names the
//! device, so a refused launch leaves nothing for cleanup to give back.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use nix::fcntl::Flock;

use crate::devices::{check_free, pci, sysfs, DeviceError, Plan};
use crate::host::{dirs, locks};

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

/// How long a launch waits for another's claim (`lock`). A claim is
/// held from the lease's step to the `devices` step of one launch (the
/// devices checked free, the intent record, the state dir, the shares and
/// taps made, the nodes bound and chowned): well under a second each,
/// and only launches with devices take it, each device one VM's. A
/// holder past this bound is stuck, and named in the error.
pub const LOCK_WAIT: Duration = Duration::from_secs(30);

/// Open (make if missing, as `dir` too: root's, no one else may write
/// it) `.devices.lock` in `dir` and lock it exclusively, waiting for
/// another launch's claim at most `wait` (`host::locks::lock_file`: a
/// file there that is not root's regular `0600` file with one link is
/// refused, a link is not followed).
fn lock(dir: &Path, wait: Duration) -> Result<Flock<OwnedFd>, DeviceError> {
    let dir = dirs::ensure_root(dir, None, &dirs::root_want("the devices lock's directory"))?;
    Ok(locks::lock_file(&dir, LOCK_FILE, wait)?)
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
        _lock: lock(lock_dir, LOCK_WAIT)?,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::locks::testing::HeldElsewhere;
    use std::os::unix::fs::PermissionsExt;

    const WAIT: Duration = Duration::from_millis(300);

    /// The claim's lock in `dir` refused: the error's text, which must
    /// name the lock file.
    fn refused(dir: &Path) -> String {
        let text = lock(dir, WAIT).unwrap_err().to_string();
        assert!(
            text.contains(&dir.join(LOCK_FILE).display().to_string()),
            "{text}"
        );
        text
    }

    #[test]
    fn a_planted_devices_lock_is_refused_naming_it() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test needs root (it gives the lock file to another uid)"
        );
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("lockdir");
        std::fs::create_dir(&dir).unwrap();
        let path = dir.join(LOCK_FILE);
        // A symlink to another of root's files: not followed, not locked.
        let victim = t.path().join("victim");
        std::fs::write(&victim, b"root's").unwrap();
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        let text = refused(&dir);
        assert!(text.contains("open"), "{text}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"root's");
        std::fs::remove_file(&path).unwrap();
        let mk = |mode: u32| {
            let _ = std::fs::remove_file(&path);
            std::fs::write(&path, b"").unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        // Another user's: they could hold every device claim forever.
        mk(0o600);
        std::os::unix::fs::lchown(&path, Some(4_610_002), None).unwrap();
        let text = refused(&dir);
        assert!(text.contains("owned by uid 4610002"), "{text}");
        // Root's, but anyone may open (and lock) it.
        mk(0o666);
        let text = refused(&dir);
        assert!(text.contains("mode 666"), "{text}");
        // A second link: the lock would be another file's too.
        mk(0o600);
        let other = t.path().join("other");
        std::fs::hard_link(&path, &other).unwrap();
        let text = refused(&dir);
        assert!(text.contains("2 links"), "{text}");
        std::fs::remove_file(&other).unwrap();
        // vmwarden's own: taken.
        lock(&dir, WAIT).unwrap();
    }

    #[test]
    fn a_devices_claim_held_elsewhere_fails_after_the_wait_naming_the_holder() {
        let t = tempfile::tempdir().unwrap();
        drop(lock(t.path(), Duration::ZERO).unwrap());
        let other = HeldElsewhere::hold(&t.path().join(LOCK_FILE));
        let t0 = std::time::Instant::now();
        let e = lock(t.path(), WAIT).unwrap_err();
        let waited = t0.elapsed();
        assert!(
            waited >= WAIT && waited < Duration::from_secs(10),
            "{waited:?}"
        );
        let text = refused(t.path());
        assert!(
            matches!(e, DeviceError::Lock(locks::LockError::Busy { .. }))
                && text.contains(&format!("pid {}", other.pid()))
                && text.contains("still held after"),
            "{text}"
        );
        drop(other);
        lock(t.path(), WAIT).unwrap();
    }
}
