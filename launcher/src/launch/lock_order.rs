//! The order in which a launch takes the two host-wide locks it may wait
//! on: the id ranges' (`/var/lib/vmwarden/.ranges`, held only inside
//! [`ranges::allocate`]), then the device claim
//! (`/var/lib/vmwarden/.devices.lock`, held until the `devices` step).
//!
//! Each is waited on at most 30 s. Were the claim taken first, a launch
//! holding it could wait its own 30 s on the ranges lock (a stuck `purge`
//! or launch holding that), and a second launch waiting on the claim
//! would time out only because of that other wait. In this order no
//! launch waits on the ranges lock while it holds the claim, so the
//! claim's holders are only ever busy with their own steps. Nor on the
//! at-shutdown record's lock: a cold boot's discard of a stale snapshot,
//! which takes it, comes before both (`launch::run`).
//!
//! The range may come first: it is no resource of the instance (the
//! intent record names none; it is host-wide identity, like the
//! principal's registration, kept by cleanup and retired by `purge`), and
//! the claim is still taken before the intent record names any device.

use std::path::PathBuf;

use crate::config::paths::Roots;
use crate::config::spec::{ShareSpec, Spec};
use crate::devices::{self, claim::Claim, Plan};
use crate::identity::principal::Principal;
use crate::identity::{ranges, registry};
use crate::launch::error::StepError;

/// Run `ids` (what takes the ranges lock), then `claim` (what takes the
/// device claim): the one order of the host-wide locks (module docs).
pub(crate) fn ids_then_claim<I, C, E>(
    ids: impl FnOnce() -> Result<I, E>,
    claim: impl FnOnce() -> Result<C, E>,
) -> Result<(I, C), E> {
    let ids = ids()?;
    let claim = claim()?;
    Ok((ids, claim))
}

/// A launch's: the VM's own id range when a share is the guest's (recorded
/// before anything can carry its ids: its virtiofsd maps the guest's ids
/// to it), then the device claim when `devices` has any.
pub(crate) fn take(
    roots: &Roots,
    spec: &Spec,
    principal: &Principal,
    devices: &Plan,
) -> Result<(Option<registry::IdRange>, Option<Claim>), StepError> {
    ids_then_claim(
        || -> Result<_, StepError> {
            if !spec.shares.iter().any(ShareSpec::guest_owned) {
                return Ok(None);
            }
            let owned: Vec<PathBuf> = spec
                .shares
                .iter()
                .filter(|sh| sh.guest_owned())
                .map(|sh| sh.source.clone())
                .collect();
            let r = ranges::allocate(roots, &spec.name, principal, &owned)
                .map_err(registry::RegistryError::from)?;
            Ok(Some(r))
        },
        || Ok(devices::claim::claim(devices::claim::lock_dir(), devices)?),
    )
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::mpsc;
    use std::time::Duration;

    use nix::sys::stat::{makedev, mknod, Mode, SFlag};

    use super::*;
    use crate::config::devices::UsbSelector;
    use crate::devices::{claim, UsbDevice};
    use crate::host::locks::testing::HeldElsewhere;
    use crate::identity::ranges::open_locked_at;

    /// A plan with one USB device: a character device made in `dir`
    /// (this host has no USB bus), root's 0664, held by no process.
    fn usb_plan(dir: &Path) -> Plan {
        let node = dir.join("009");
        mknod(
            &node,
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o664),
            makedev(189, 8),
        )
        .expect("mknod");
        Plan {
            pci: Vec::new(),
            usb: vec![UsbDevice {
                selector: UsbSelector::Port { bus: 1, addr: 9 },
                node,
                uid: 0,
                gid: 0,
                mode: 0o664,
            }],
        }
    }

    /// A launch with a device and a share the guest owns waits on the
    /// ranges lock (a stuck holder has it, here `flock(1)`): meanwhile it
    /// holds no device claim, so a second launch's claim (another device
    /// or the same: the lock is one) is taken at once instead of timing
    /// out on the first launch's wait. Once the ranges holder is gone, the
    /// first launch takes both. Real locks (`flock`), real claim (the
    /// node checked free by its holders in `/proc`).
    #[test]
    fn the_device_claim_is_not_held_while_the_ranges_lock_is_waited_on() {
        assert!(nix::unistd::geteuid().is_root(), "this test needs root");
        let t = tempfile::tempdir().expect("tempdir");
        let ranges = t.path().join(".ranges");
        let claims = t.path().join("var-lib-vmwarden");
        let devdir = t.path().join("dev");
        std::fs::create_dir(&devdir).expect("mkdir dev");
        let plan = usb_plan(&devdir);
        // Made (root's 0700) by a first lock, then held elsewhere.
        open_locked_at(&ranges, Duration::from_millis(300)).expect("ranges lock");
        let stuck = HeldElsewhere::hold(&ranges);
        let (waiting_tx, waiting_rx) = mpsc::channel();
        let first = {
            let (ranges, claims, plan) = (ranges.clone(), claims.clone(), plan.clone());
            std::thread::spawn(move || {
                ids_then_claim(
                    || {
                        waiting_tx.send(()).expect("send");
                        open_locked_at(&ranges, Duration::from_secs(30))
                            .map(drop)
                            .map_err(|e| e.to_string())
                    },
                    || claim::claim(&claims, &plan).map_err(|e| e.to_string()),
                )
                .map(|(_, c)| c.is_some())
            })
        };
        waiting_rx.recv().expect("the first launch's ids step");
        // The first launch is at (or past) its wait on the ranges lock,
        // which `stuck` holds: it cannot be done.
        let second = claim::claim(&claims, &plan);
        let done_early = first.is_finished();
        let second = second.unwrap_or_else(|e| {
            panic!("the second launch's claim failed while the first waited on the ranges lock (held under the claim?): {e}")
        });
        assert!(second.is_some(), "a plan with a device is claimed");
        assert!(
            !done_early,
            "the first launch did not wait on the ranges lock"
        );
        drop(second);
        drop(stuck);
        assert_eq!(
            first.join().expect("the first launch's thread"),
            Ok(true),
            "the first launch, the ranges holder gone"
        );
    }
}
