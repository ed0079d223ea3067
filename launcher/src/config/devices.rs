//! The spec's `devices`: host PCI and USB devices handed to the VM for its
//! life (microvm.nix `microvm.devices`), and their checks. Nothing on the
//! host is read here: the IOMMU group, the drivers and the USB node are the
//! launcher's pre-flight (`devices::`); the checks are in
//! `validation_devices.rs`.

use std::fmt;

use serde::{Deserialize, Serialize};

/// What VFIO may pin beyond the guest's RAM, in MiB: its ROM BARs and the
/// hypervisor's own DMA-mapped buffers (libvirt adds 1 GiB for the same).
/// The launcher's `RLIMIT_MEMLOCK` and the unit's `LimitMEMLOCK=` are the
/// guest's RAM plus this.
pub const MEMLOCK_MARGIN_MIB: u64 = 1024;

/// Most devices one VM may hold.
pub const MAX_DEVICES: usize = 16;

/// The bus a device is on (microvm.nix `devices[].bus`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DeviceBus {
    Pci,
    Usb,
}

/// One device of `devices`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DeviceSpec {
    pub bus: DeviceBus,
    /// PCI: the address, `DDDD:BB:DD.F`. USB: `vendorid=0x…,productid=0x…`
    /// or `hostbus=…,hostaddr=…` (microvm.nix's two forms).
    pub path: String,
    /// QEMU's device id (microvm.nix `qemu.id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// QEMU's bus to plug it in (microvm.nix `qemu.bus`), e.g. a
    /// `pcie-root-port` of `extra_args`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qemu_bus: Option<String>,
    /// More properties of QEMU's `vfio-pci` device (microvm.nix
    /// `qemu.deviceExtraArgs`), `key=value` each; only the keys of
    /// [`SAFE_VFIO_PROPERTIES`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub qemu_properties: Vec<String>,
    /// PCI: leave the device on `vfio-pci` after the VM stops instead of
    /// giving it back to the driver it had (a host that keeps it for VMs).
    #[serde(default, skip_serializing_if = "is_false")]
    pub keep_on_vfio_pci: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// The `vfio-pci` properties a spec may set: how the device looks to the
/// guest, never what QEMU opens (`host`, `sysfsdev`, `romfile`, `fd` are
/// the launcher's or refused).
pub const SAFE_VFIO_PROPERTIES: &[&str] = &[
    "x-vga",
    "rombar",
    "multifunction",
    "addr",
    "x-igd-opregion",
    "x-igd-gms",
    "display",
    "x-no-mmap",
];

/// A PCI address, `DDDD:BB:DD.F`, lower case.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciAddress(String);

impl PciAddress {
    pub fn parse(s: &str) -> Result<PciAddress, String> {
        let b = s.as_bytes();
        let shape = b.len() == 12
            && b[4] == b':'
            && b[7] == b':'
            && b[10] == b'.'
            && [0, 1, 2, 3, 5, 6, 8, 9]
                .iter()
                .all(|&i| b[i].is_ascii_hexdigit())
            && (b'0'..=b'7').contains(&b[11]);
        let slot_ok = u8::from_str_radix(s.get(8..10).unwrap_or("ff"), 16).is_ok_and(|d| d < 32);
        if !shape || !slot_ok {
            return Err(format!(
                "is {s:?}; give a PCI address DDDD:BB:DD.F (domain:bus:slot.function, e.g. \"0000:01:00.0\", as lspci -D prints it)"
            ));
        }
        Ok(PciAddress(s.to_ascii_lowercase()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PciAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Which USB device: by its ids or by where it is plugged in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsbSelector {
    Ids { vendor: u16, product: u16 },
    Port { bus: u16, addr: u16 },
}

fn number(v: &str) -> Option<u32> {
    match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(h) => u32::from_str_radix(h, 16).ok(),
        None => v.parse().ok(),
    }
}

impl UsbSelector {
    pub fn parse(s: &str) -> Result<UsbSelector, String> {
        let bad = || {
            format!(
                "is {s:?}; give \"vendorid=0xVVVV,productid=0xPPPP\" or \"hostbus=B,hostaddr=D\" (as microvm.nix takes them; lsusb prints both)"
            )
        };
        let mut kv = std::collections::BTreeMap::new();
        for part in s.split(',') {
            let (k, v) = part.split_once('=').ok_or_else(bad)?;
            let n = number(v).filter(|n| *n <= 0xffff).ok_or_else(bad)?;
            if kv.insert(k, n as u16).is_some() {
                return Err(bad());
            }
        }
        let keys: Vec<&str> = kv.keys().copied().collect();
        match keys.as_slice() {
            ["productid", "vendorid"] => Ok(UsbSelector::Ids {
                vendor: kv["vendorid"],
                product: kv["productid"],
            }),
            ["hostaddr", "hostbus"] => Ok(UsbSelector::Port {
                bus: kv["hostbus"],
                addr: kv["hostaddr"],
            }),
            _ => Err(bad()),
        }
    }
}

impl fmt::Display for UsbSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UsbSelector::Ids { vendor, product } => {
                write!(f, "vendorid=0x{vendor:04x},productid=0x{product:04x}")
            }
            UsbSelector::Port { bus, addr } => write!(f, "hostbus={bus},hostaddr={addr}"),
        }
    }
}

impl DeviceSpec {
    /// The PCI address (a validated spec has one for each `pci` device).
    pub fn pci(&self) -> Option<PciAddress> {
        (self.bus == DeviceBus::Pci)
            .then(|| PciAddress::parse(&self.path).ok())
            .flatten()
    }

    /// The USB selector (a validated spec has one for each `usb` device).
    pub fn usb(&self) -> Option<UsbSelector> {
        (self.bus == DeviceBus::Usb)
            .then(|| UsbSelector::parse(&self.path).ok())
            .flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_addresses_in_the_full_form_only() {
        assert_eq!(
            PciAddress::parse("0000:01:00.0").unwrap().as_str(),
            "0000:01:00.0"
        );
        assert_eq!(
            PciAddress::parse("0000:0A:1f.7").unwrap().as_str(),
            "0000:0a:1f.7"
        );
        for bad in [
            "01:00.0",
            "0000:01:00.8",
            "0000:01:20.0",
            "0000:01:00.0/..",
            "../../x",
            "",
        ] {
            assert!(PciAddress::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn usb_in_either_of_microvm_nix_forms() {
        assert_eq!(
            UsbSelector::parse("vendorid=0x0627,productid=0x0001"),
            Ok(UsbSelector::Ids {
                vendor: 0x0627,
                product: 1
            })
        );
        assert_eq!(
            UsbSelector::parse("hostbus=3,hostaddr=2"),
            Ok(UsbSelector::Port { bus: 3, addr: 2 })
        );
        for bad in [
            "vendorid=0x0627",
            "vendorid=0x0627,productid=0x1,hostbus=1",
            "hostbus=1,hostbus=2",
            "vendorid=0x10000,productid=1",
            "hostdevice=/dev/bus/usb/001/002",
        ] {
            assert!(UsbSelector::parse(bad).is_err(), "{bad}");
        }
    }
}
