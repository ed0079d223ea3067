//! Host devices a VM holds for its life (the spec's `devices`): PCI
//! devices through VFIO ([`pci`]) and USB devices through usbfs ([`usb`]),
//! read and written the openat way ([`sysfs`]).
//!
//! Three moments, each root's: [`preflight`] before anything is created
//! (what the device is, its IOMMU group viable, interrupts remapped, nobody
//! holding it: every "no" a refusal naming the device), [`take`] after the
//! intent record names each device and the driver it had (bound to
//! `vfio-pci`, the group's node or the USB node the principal's), and
//! [`give_back_pci`]/[`give_back_node`] at cleanup, which prove it returned.
//! Knows nothing of instances: the caller records and reads the intent.

pub mod claim;
pub mod host_use;
pub mod pci;
pub mod sysfs;
pub mod usb;

use std::path::PathBuf;

use crate::config::devices::{DeviceBus, PciAddress};
use crate::config::spec::Spec;
use crate::host::dirs::DirError;
use crate::host::locks::LockError;
use crate::host::sys::SysError;

pub use pci::PciDevice;
pub use usb::UsbDevice;

/// A device that cannot be handed to the VM, or given back.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("devices: PCI device {addr} does not exist (no /sys/bus/pci/devices/{addr}); check the address with lspci -D")]
    NoSuchPci { addr: PciAddress },
    #[error("devices: PCI device {addr} is a bridge (PCI class 0x06): the host's devices behind it would go with it, and vfio-pci takes no bridge; name the device behind it")]
    Bridge { addr: PciAddress },
    #[error("devices: PCI device {addr} carries {}: binding it to vfio-pci would take it from the host; check the address with lspci -D", uses.join(", "))]
    HostUses { addr: PciAddress, uses: Vec<String> },
    #[error("devices: PCI device {addr} is in no IOMMU group: the host has no IOMMU, or it is off (turn it on: intel_iommu=on or amd_iommu=on on the kernel's command line, and VT-d/AMD-Vi in the firmware); without one the device could reach all of the host's memory")]
    NoIommuGroup { addr: PciAddress },
    #[error("devices: PCI device {addr} shares IOMMU group {group} with {}, which this VM does not list: the VM could reach them through the device; list them in devices too, or unbind them (no driver, vfio-pci or pci-stub)", others.join(", "))]
    GroupNotViable {
        addr: PciAddress,
        group: u32,
        others: Vec<String>,
    },
    #[error("devices: the host has no interrupt remapping (no IR- interrupt chip in /proc/interrupts): a guest driving PCI device {addr} could send the host any interrupt; turn remapping on (intremap=on), or accept it by name with allow_unsafe_interrupts = true")]
    NoInterruptRemapping { addr: PciAddress },
    #[error("devices: the vfio-pci driver is not loaded (no /sys/bus/pci/drivers/vfio-pci); load it at boot (boot.kernelModules = [ \"vfio-pci\" ])")]
    NoVfioDriver,
    #[error("devices: {what} is held by {by}: one device, one VM; stop that VM first")]
    Held { what: String, by: String },
    #[error(
        "devices: no USB device matches {selector} (see /sys/bus/usb/devices; is it plugged in?)"
    )]
    NoSuchUsb { selector: String },
    #[error("devices: {selector} matches {} USB devices ({}); name one by hostbus=…,hostaddr=…", matches.len(), matches.join(", "))]
    UsbAmbiguous {
        selector: String,
        matches: Vec<String>,
    },
    #[error("devices: {selector} is a USB hub ({name}: device or interface class 0x09, or ports): handing it over would hand the VM every device plugged in behind it; name the device behind it")]
    UsbHub { selector: String, name: String },
    #[error("devices: PCI device {addr} is on {got:?} after binding it to {want}")]
    Bind {
        addr: PciAddress,
        want: String,
        got: Option<String>,
    },
    #[error("devices: {path} did not appear after the bind to vfio-pci")]
    NoGroupNode { path: PathBuf },
    #[error("devices: {0}")]
    Sys(#[from] SysError),
    #[error("devices: {0}")]
    Dir(#[from] DirError),
    /// The host-wide claim's lock file refused, or held too long.
    #[error("devices: the host-wide device claim: {0}")]
    Lock(#[from] LockError),
}

impl DeviceError {
    /// A refusal of the spec or of the host's state (exit 78).
    pub fn is_refusal(&self) -> bool {
        !matches!(
            self,
            DeviceError::Bind { .. }
                | DeviceError::NoGroupNode { .. }
                | DeviceError::Sys(_)
                | DeviceError::Dir(_)
                | DeviceError::Lock(_)
        )
    }
}

/// What the VM will hold, read before anything changes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub pci: Vec<PciDevice>,
    pub usb: Vec<UsbDevice>,
}

impl Plan {
    /// The IOMMU groups of the PCI devices, each once.
    pub fn groups(&self) -> Vec<u32> {
        let mut g: Vec<u32> = self.pci.iter().map(|d| d.group).collect();
        g.sort();
        g.dedup();
        g
    }

    pub fn is_empty(&self) -> bool {
        self.pci.is_empty() && self.usb.is_empty()
    }
}

fn held_by(holders: &[(u32, Option<String>)]) -> String {
    holders
        .iter()
        .map(|(pid, why)| match why {
            None => format!("process {pid}"),
            Some(w) => format!("process {pid} ({w})"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Refuse a node that a principal owns (another VM's) or a process holds.
pub(crate) fn check_free(node: &sysfs::Node, what: &str) -> Result<(), DeviceError> {
    let (uid, _, _) = node.owner();
    if uid != 0 {
        return Err(DeviceError::Held {
            what: format!("{what} ({})", node.path.display()),
            by: format!("uid {uid} (it owns the node)"),
        });
    }
    let h = sysfs::holders(node);
    if !h.is_empty() {
        return Err(DeviceError::Held {
            what: format!("{what} ({})", node.path.display()),
            by: held_by(&h),
        });
    }
    Ok(())
}

/// Before anything is created: each device read, its group viable, the
/// host's interrupts remapped (or the spec's `allow_unsafe_interrupts`),
/// nobody holding it. Changes nothing.
pub fn preflight(spec: &Spec) -> Result<Plan, DeviceError> {
    let mut plan = Plan::default();
    let listed: Vec<PciAddress> = spec.devices.iter().filter_map(|d| d.pci()).collect();
    if !listed.is_empty() {
        for d in spec.devices.iter().filter(|d| d.bus == DeviceBus::Pci) {
            if let Some(a) = d.pci() {
                plan.pci.push(pci::inspect(&a, d.keep_on_vfio_pci)?);
            }
        }
        if !pci::vfio_pci_loaded()? {
            return Err(DeviceError::NoVfioDriver);
        }
        if !spec.allow_unsafe_interrupts && !pci::interrupt_remapping()? {
            return Err(DeviceError::NoInterruptRemapping {
                addr: listed[0].clone(),
            });
        }
        for dev in &plan.pci {
            let others = pci::unviable_members(dev.group, &listed)?;
            if !others.is_empty() {
                return Err(DeviceError::GroupNotViable {
                    addr: dev.addr.clone(),
                    group: dev.group,
                    others,
                });
            }
        }
        for g in plan.groups() {
            if let Some(node) = sysfs::open_node(&pci::group_node(g))? {
                check_free(&node, &format!("IOMMU group {g}"))?;
            }
        }
    }
    for d in spec.devices.iter().filter(|d| d.bus == DeviceBus::Usb) {
        if let Some(sel) = d.usb() {
            let dev = usb::resolve(&sel)?;
            let node = sysfs::open_node(&dev.node)?.ok_or_else(|| DeviceError::NoSuchUsb {
                selector: sel.to_string(),
            })?;
            check_free(&node, &format!("USB device {sel}"))?;
            plan.usb.push(dev);
        }
    }
    Ok(plan)
}

/// After the intent record names them, under the host-wide [`claim::Claim`]:
/// each PCI device on `vfio-pci`, each group's node and each USB node the
/// principal's (`0600`), checked free once more right before.
pub fn take(_claim: &claim::Claim, plan: &Plan, uid: u32, gid: u32) -> Result<(), DeviceError> {
    for dev in &plan.pci {
        pci::bind_vfio(dev)?;
    }
    for g in plan.groups() {
        let node = pci::wait_group_node(g)?;
        check_free(&node, &format!("IOMMU group {g}"))?;
        node.set_owner(uid, gid, 0o600)?;
    }
    for dev in &plan.usb {
        let node = sysfs::open_node(&dev.node)?.ok_or_else(|| DeviceError::NoSuchUsb {
            selector: dev.selector.to_string(),
        })?;
        check_free(&node, &format!("USB device {}", dev.selector))?;
        node.set_owner(uid, gid, 0o600)?;
    }
    Ok(())
}

/// Give node `path` back to `uid:gid` `mode` after proving no process holds
/// it. A node that is gone (a USB device unplugged, a group whose last
/// device left VFIO) is `Ok(Some(reason))`: reported, not a failure. So is
/// a root's node that is neither as it was nor the principal's (`vm_uid`):
/// not the node the launch gave the VM but another device's that took its
/// place (a USB device unplugged, another enumerated at the same bus and
/// address), whose owner and mode are udev's, never the old device's. A
/// node another principal owns is an error (another VM's: a PCI device is
/// then not taken off `vfio-pci` under it).
pub fn give_back_node(
    path: &std::path::Path,
    uid: u32,
    gid: u32,
    mode: u32,
    vm_uid: u32,
) -> Result<Option<String>, String> {
    let node = match sysfs::open_node(path) {
        Ok(Some(n)) => n,
        Ok(None) => return Ok(Some("gone (unplugged, or no longer a VFIO group)".into())),
        Err(e) => return Err(e.to_string()),
    };
    let h = sysfs::holders(&node);
    if !h.is_empty() {
        return Err(format!("still held by {}", held_by(&h)));
    }
    let now = node.owner();
    if now != (uid, gid, mode) && now.0 != vm_uid {
        if now.0 != 0 {
            // Another principal's: another VM took it (or its successor
            // device); it is that VM's cleanup's to give back.
            return Err(format!(
                "is uid {}'s, not the VM's (uid {vm_uid}): another VM's now; left as it is",
                now.0
            ));
        }
        return Ok(Some(format!(
            "gone: the node is {}:{} {:o}, not the VM's (uid {vm_uid}), another device's now; left as it is",
            now.0, now.1, now.2
        )));
    }
    if now != (uid, gid, mode) {
        node.set_owner(uid, gid, mode).map_err(|e| e.to_string())?;
    }
    match sysfs::open_node(path) {
        Ok(Some(n)) if n.owner() == (uid, gid, mode) => Ok(None),
        Ok(Some(n)) => Err(format!(
            "is {:?} after the give-back, not {uid}:{gid} {mode:o}",
            n.owner()
        )),
        Ok(None) => Ok(Some("gone".into())),
        Err(e) => Err(e.to_string()),
    }
}

/// Give PCI device `addr` back to `driver` (see [`pci::give_back`]).
pub fn give_back_pci(addr: &str, driver: Option<&str>, keep: bool) -> Result<(), String> {
    let a = PciAddress::parse(addr).map_err(|e| format!("recorded address {e}"))?;
    pci::give_back(&a, driver, keep)
}

/// Whether node `path` is still the VM's: owned by `uid`, or held by a
/// process. `None`: free (or gone).
pub fn node_held(path: &std::path::Path, uid: u32) -> Option<String> {
    let node = match sysfs::open_node(path) {
        Ok(Some(n)) => n,
        Ok(None) => return None,
        Err(e) => return Some(format!("cannot tell: {e}")),
    };
    let (owner, _, _) = node.owner();
    if owner == uid && uid != 0 {
        return Some(format!("{} is still owned by uid {uid}", path.display()));
    }
    let h = sysfs::holders(&node);
    (!h.is_empty()).then(|| format!("{} is held by {}", path.display(), held_by(&h)))
}
