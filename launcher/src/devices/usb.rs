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

/// USB class 0x09: a hub (a root hub too), as a device or an interface class.
const HUB_CLASS: u16 = 0x09;

/// Whether the device `name` of /sys/bus/usb/devices is a hub: handing
/// one to a VM hands it every device behind it (the host's keyboard,
/// its disks), which no selector named.
fn is_hub(name: &str) -> Result<bool, DeviceError> {
    let Some(root) = sysfs::open_dir(Path::new(USB_DEVICES))? else {
        return Ok(false);
    };
    is_hub_in(&root, name)
}

/// [`is_hub`] of device `name` in the directory `root`. A hub by its
/// device class, and also one whose class says nothing (0x00: "see the
/// interfaces", or 0xEF, a composite device) but that has an interface
/// of the hub class (the kernel's hub driver binds to that interface and
/// enumerates the devices behind it), or ports the hub driver counted
/// (`maxchild`).
fn is_hub_in(root: &sysfs::SysDir, name: &str) -> Result<bool, DeviceError> {
    let Some(dir) = sysfs::open_sub(root, name)? else {
        return Ok(false);
    };
    if hex(sysfs::read_attr(&dir, "bDeviceClass")?) == Some(HUB_CLASS)
        || dec(sysfs::read_attr(&dir, "maxchild")?).is_some_and(|n| n > 0)
    {
        return Ok(true);
    }
    let prefix = format!("{name}:");
    for iface in sysfs::entries(&root.path)? {
        if !iface.starts_with(&prefix) {
            continue;
        }
        let Some(idir) = sysfs::open_sub(root, &iface)? else {
            continue;
        };
        if hex(sysfs::read_attr(&idir, "bInterfaceClass")?) == Some(HUB_CLASS) {
            return Ok(true);
        }
    }
    Ok(false)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory laid out as /sys/bus/usb/devices is: each device's and
    /// each interface's attributes (plain files here).
    fn devices(files: &[(&str, &str, &str)]) -> (tempfile::TempDir, sysfs::SysDir) {
        let t = tempfile::tempdir().unwrap();
        for (dir, attr, value) in files {
            std::fs::create_dir_all(t.path().join(dir)).unwrap();
            std::fs::write(t.path().join(dir).join(attr), format!("{value}\n")).unwrap();
        }
        let root = sysfs::open_dir(t.path()).unwrap().unwrap();
        (t, root)
    }

    /// A hub is refused by its device class, and so is a composite device
    /// (class 0x00 or 0xEF) with a hub interface or ports: the devices
    /// behind it are the host's just the same. A keyboard is no hub.
    #[test]
    fn a_hub_is_a_hub_by_its_class_its_interfaces_or_its_ports() {
        let (_t, root) = devices(&[
            ("1-1", "bDeviceClass", "09"),
            ("1-2", "bDeviceClass", "00"),
            ("1-2:1.0", "bInterfaceClass", "03"),
            ("1-2:1.1", "bInterfaceClass", "09"),
            ("1-3", "bDeviceClass", "ef"),
            ("1-3", "maxchild", "4"),
            ("1-4", "bDeviceClass", "00"),
            ("1-4", "maxchild", "0"),
            ("1-4:1.0", "bInterfaceClass", "03"),
            ("1-4.1", "bDeviceClass", "00"),
            ("1-4.1:1.0", "bInterfaceClass", "09"),
        ]);
        for (name, want) in [
            ("1-1", true),
            ("1-2", true),
            ("1-3", true),
            ("1-4", false),
            ("1-4.1", true),
        ] {
            assert_eq!(is_hub_in(&root, name).unwrap(), want, "device {name}");
        }
    }
}
