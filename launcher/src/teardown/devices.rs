//! The teardown side of `devices`: each device the intent record names
//! given back, and proven given back — no process holds its node, the node
//! is root's (`0600` for a VFIO group; a USB node as it was), the PCI
//! device is on the driver it had (or left on `vfio-pci` when the spec
//! says so) — and verify-clean's check that none is still held.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::config::spec::Spec;
use crate::devices::{self, pci};
use crate::host::ownership::Failed;
use crate::instance::intent::{Intent, Resource};

/// What a give-back did, device by device (cleanup's report).
#[derive(Debug, Default)]
pub struct GivenBack {
    /// Each device given back, as the report says it.
    pub returned: Vec<String>,
    /// Each device that could not be given back, and why.
    pub failed: Vec<Failed>,
}

/// Give back every device `intent` names. The nodes first (no process may
/// hold them: the instance is dead), then the drivers: a group's node
/// vanishes when its last device leaves `vfio-pci`.
pub fn give_back(intent: Option<&Intent>) -> GivenBack {
    let mut out = GivenBack::default();
    let Some(intent) = intent else {
        return out;
    };
    let vm_uid = intent.principal.uid;
    let mut groups = BTreeSet::new();
    for r in &intent.resources {
        match r {
            Resource::PciDevice { group, .. } if groups.insert(*group) => {
                let node = pci::group_node(*group);
                match devices::give_back_node(&node, 0, 0, 0o600, vm_uid) {
                    Ok(None) => out.returned.push(format!(
                        "{}: root's, 0600, held by no process",
                        node.display()
                    )),
                    Ok(Some(why)) => out.returned.push(format!("{}: {why}", node.display())),
                    Err(reason) => out.failed.push(Failed { path: node, reason }),
                }
            }
            Resource::UsbDevice {
                selector,
                node,
                uid,
                gid,
                mode,
            } => match devices::give_back_node(node, *uid, *gid, *mode, vm_uid) {
                Ok(None) => out.returned.push(format!(
                    "USB device {selector} ({}): {uid}:{gid} {mode:o} again, held by no process",
                    node.display()
                )),
                Ok(Some(_)) => out.returned.push(format!(
                    "USB device {selector} ({}): unplugged while the VM ran; nothing to give back",
                    node.display()
                )),
                Err(reason) => out.failed.push(Failed {
                    path: node.clone(),
                    reason: format!("USB device {selector}: {reason}"),
                }),
            },
            _ => {}
        }
    }
    if !out.failed.is_empty() {
        // A node still held: its device stays on vfio-pci until it is not.
        return out;
    }
    for r in &intent.resources {
        if let Resource::PciDevice {
            address,
            driver,
            keep_on_vfio_pci,
            ..
        } = r
        {
            let path = Path::new(pci::PCI_DEVICES).join(address);
            match devices::give_back_pci(address, driver.as_deref(), *keep_on_vfio_pci) {
                Ok(()) => out.returned.push(format!(
                    "PCI device {address}: on {}",
                    if *keep_on_vfio_pci {
                        "vfio-pci, as the spec keeps it"
                    } else {
                        driver.as_deref().unwrap_or("no driver, as it was")
                    }
                )),
                Err(reason) => out.failed.push(Failed {
                    path,
                    reason: format!("PCI device {address}: {reason}"),
                }),
            }
        }
    }
    out
}

/// The nodes VM's devices may hold: its intent record's and its spec's
/// (whose USB devices are resolved now, when they are plugged in).
fn nodes(intent: Option<&Intent>, spec: Option<&Spec>) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    for r in intent.map(|i| i.resources.as_slice()).unwrap_or_default() {
        match r {
            Resource::PciDevice { address, group, .. } => {
                out.push((pci::group_node(*group), format!("PCI device {address}")))
            }
            Resource::UsbDevice { selector, node, .. } => {
                out.push((node.clone(), format!("USB device {selector}")))
            }
            _ => {}
        }
    }
    for d in spec.map(|s| s.devices.as_slice()).unwrap_or_default() {
        if let Some(a) = d.pci() {
            if let Ok(dev) = pci::inspect(&a, false) {
                out.push((pci::group_node(dev.group), format!("PCI device {a}")));
            }
        }
        if let Some(sel) = d.usb() {
            if let Ok(dev) = devices::usb::resolve(&sel) {
                out.push((dev.node, format!("USB device {sel}")));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// verify-clean: none of the VM's device nodes is still the principal's
/// (`uid`) or held by a process. Each one still held, with why.
pub fn still_held(intent: Option<&Intent>, spec: Option<&Spec>, uid: Option<u32>) -> Vec<String> {
    nodes(intent, spec)
        .into_iter()
        .filter_map(|(node, what)| {
            devices::node_held(&node, uid.unwrap_or(0)).map(|why| format!("{what}: {why}"))
        })
        .collect()
}

/// verify-clean's `no-device-held` for a VM with devices (its record's or
/// its spec's); `None` for a VM without any.
pub fn held_check<E>(
    intent: Option<&Intent>,
    spec: Option<&Spec>,
    uid: &Result<Option<u32>, E>,
) -> Option<Vec<String>> {
    let any = intent.is_some_and(|i| {
        i.resources
            .iter()
            .any(|r| matches!(r, Resource::PciDevice { .. } | Resource::UsbDevice { .. }))
    }) || spec.is_some_and(|s| !s.devices.is_empty());
    any.then(|| still_held(intent, spec, uid.as_ref().ok().copied().flatten()))
}
