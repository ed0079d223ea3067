//! USB devices: the selector (ids or bus and address) resolved to the one
//! device it names, and that device's usbfs node.

use std::path::{Path, PathBuf};

use crate::config::devices::UsbSelector;
use crate::devices::sysfs;
use crate::devices::DeviceError;

pub const USB_DEVICES: &str = "/sys/bus/usb/devices";
pub const USBFS: &str = "/dev/bus/usb";

/// A USB device the VM holds: its node, and the owner and mode the node
/// had (given back after the stop).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsbDevice {
    pub selector: UsbSelector,
    pub node: PathBuf,
    pub uid: u32,
    pub gid: u32,
    pub mode: u32,
}

/// `/dev/bus/usb/BBB/DDD`.
pub fn node_path(bus: u16, addr: u16) -> PathBuf {
    Path::new(USBFS).join(format!("{bus:03}/{addr:03}"))
}

fn hex(s: Option<String>) -> Option<u16> {
    u16::from_str_radix(s?.trim(), 16).ok()
}

fn dec(s: Option<String>) -> Option<u16> {
    s?.trim().parse().ok()
}

/// The nodes of every USB device `sel` matches (sysfs' devices, not their
/// interfaces), with the sysfs name of each.
pub fn matches(sel: &UsbSelector) -> Result<Vec<(String, PathBuf)>, DeviceError> {
    let Some(root) = sysfs::open_dir(Path::new(USB_DEVICES))? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for name in sysfs::entries(&root.path)? {
        // Interfaces (`1-1:1.0`) have no ids of their own.
        if name.contains(':') {
            continue;
        }
        let Some(dir) = sysfs::open_sub(&root, &name)? else {
            continue;
        };
        let bus = dec(sysfs::read_attr(&dir, "busnum")?);
        let dev = dec(sysfs::read_attr(&dir, "devnum")?);
        let (Some(bus), Some(dev)) = (bus, dev) else {
            continue;
        };
        let hit = match *sel {
            UsbSelector::Ids { vendor, product } => {
                hex(sysfs::read_attr(&dir, "idVendor")?) == Some(vendor)
                    && hex(sysfs::read_attr(&dir, "idProduct")?) == Some(product)
            }
            UsbSelector::Port { bus: b, addr } => b == bus && addr == dev,
        };
        if hit {
            out.push((name, node_path(bus, dev)));
        }
    }
    Ok(out)
}

/// USB device class 0x09: a hub (a root hub too).
const HUB_CLASS: u16 = 0x09;

/// Whether the device `name` of /sys/bus/usb/devices is a hub: handing
/// one to a VM hands it every device behind it (the host's keyboard,
/// its disks), which no selector named.
fn is_hub(name: &str) -> Result<bool, DeviceError> {
    let Some(root) = sysfs::open_dir(Path::new(USB_DEVICES))? else {
        return Ok(false);
    };
    let Some(dir) = sysfs::open_sub(&root, name)? else {
        return Ok(false);
    };
    Ok(hex(sysfs::read_attr(&dir, "bDeviceClass")?) == Some(HUB_CLASS))
}

/// Resolve `sel` to its one device's node, and read the node's owner.
pub fn resolve(sel: &UsbSelector) -> Result<UsbDevice, DeviceError> {
    let found = matches(sel)?;
    let node = match found.as_slice() {
        [] => {
            return Err(DeviceError::NoSuchUsb {
                selector: sel.to_string(),
            })
        }
        [(name, node)] => {
            if is_hub(name)? {
                return Err(DeviceError::UsbHub {
                    selector: sel.to_string(),
                    name: name.clone(),
                });
            }
            node.clone()
        }
        many => {
            return Err(DeviceError::UsbAmbiguous {
                selector: sel.to_string(),
                matches: many.iter().map(|(n, _)| n.clone()).collect(),
            })
        }
    };
    let n = sysfs::open_node(&node)?.ok_or_else(|| DeviceError::NoSuchUsb {
        selector: format!("{sel} (its node {} is missing)", node.display()),
    })?;
    let (uid, gid, mode) = n.owner();
    Ok(UsbDevice {
        selector: *sel,
        node,
        uid,
        gid,
        mode,
    })
}
