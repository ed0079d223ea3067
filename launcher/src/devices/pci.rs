//! PCI devices through VFIO, as the kernel's VFIO usage example and
//! libvirt's managed host devices do it: the IOMMU group checked viable,
//! the device's driver read (and recorded by the caller) before anything
//! changes, then `driver_override` + unbind + `drivers_probe` to `vfio-pci`;
//! given back the same way, to the driver it had.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::config::devices::PciAddress;
use crate::devices::host_use;
use crate::devices::sysfs::{self, Node, SysDir};
use crate::devices::DeviceError;
use crate::host::procs::read_proc_file;
use crate::host::sys::SysError;

pub const PCI_DEVICES: &str = "/sys/bus/pci/devices";
pub const PCI_DRIVERS: &str = "/sys/bus/pci/drivers";
pub const DRIVERS_PROBE: &str = "drivers_probe";
pub const IOMMU_GROUPS: &str = "/sys/kernel/iommu_groups";
pub const VFIO_DIR: &str = "/dev/vfio";
/// The VFIO container node: every VFIO user opens it; it gives nothing
/// without a group.
pub const VFIO_CONTAINER: &str = "/dev/vfio/vfio";
pub const VFIO_PCI: &str = "vfio-pci";
/// Drivers that leave a group's other device harmless to the VM (libvirt's
/// `virPCIDeviceIsAssignable` list, with no driver at all).
pub const INERT_DRIVERS: &[&str] = &[VFIO_PCI, "pci-stub"];

/// A PCI device the VM holds: where it is, its IOMMU group and the driver
/// it had (`None`: no driver).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciDevice {
    pub addr: PciAddress,
    pub group: u32,
    pub driver: Option<String>,
    pub keep_on_vfio_pci: bool,
}

/// `/dev/vfio/N`.
pub fn group_node(group: u32) -> PathBuf {
    Path::new(VFIO_DIR).join(group.to_string())
}

fn device_dir(addr: &PciAddress) -> Result<Option<SysDir>, DeviceError> {
    let devices = sysfs::open_dir(Path::new(PCI_DEVICES))?
        .ok_or_else(|| DeviceError::NoSuchPci { addr: addr.clone() })?;
    Ok(sysfs::open_sub(&devices, addr.as_str())?)
}

/// The driver `addr` is bound to now.
pub fn driver_of(addr: &PciAddress) -> Result<Option<String>, DeviceError> {
    let dir = device_dir(addr)?.ok_or_else(|| DeviceError::NoSuchPci { addr: addr.clone() })?;
    Ok(sysfs::link_name(&dir, "driver")?)
}

/// Read what the VM will hold of `addr`: its group and its driver. Refuses
/// a device that does not exist, is a bridge, carries the host's mounted
/// file systems or swap ([`host_use`]), or is in no IOMMU group.
pub fn inspect(addr: &PciAddress, keep: bool) -> Result<PciDevice, DeviceError> {
    let dir = device_dir(addr)?.ok_or_else(|| DeviceError::NoSuchPci { addr: addr.clone() })?;
    if host_use::is_bridge(&dir) {
        return Err(DeviceError::Bridge { addr: addr.clone() });
    }
    let uses = host_use::host_uses(addr);
    if !uses.is_empty() {
        return Err(DeviceError::HostUses {
            addr: addr.clone(),
            uses,
        });
    }
    let group = sysfs::link_name(&dir, "iommu_group")?
        .ok_or_else(|| DeviceError::NoIommuGroup { addr: addr.clone() })?;
    let group = group
        .parse()
        .map_err(|_| DeviceError::NoIommuGroup { addr: addr.clone() })?;
    Ok(PciDevice {
        addr: addr.clone(),
        group,
        driver: sysfs::link_name(&dir, "driver")?,
        keep_on_vfio_pci: keep,
    })
}

/// The other devices of `group` that the VM does not list and that are
/// bound to a driver that can still use them (each with that driver): a
/// group is viable only when there are none.
pub fn unviable_members(group: u32, listed: &[PciAddress]) -> Result<Vec<String>, DeviceError> {
    let members = sysfs::entries(
        &Path::new(IOMMU_GROUPS)
            .join(group.to_string())
            .join("devices"),
    )?;
    let mut out = Vec::new();
    for m in members {
        if listed.iter().any(|a| a.as_str() == m) {
            continue;
        }
        let Ok(a) = PciAddress::parse(&m) else {
            out.push(format!("{m} (not a PCI device)"));
            continue;
        };
        match driver_of(&a)? {
            None => {}
            Some(d) if INERT_DRIVERS.contains(&d.as_str()) => {}
            Some(d) => out.push(format!("{m} (bound to {d})")),
        }
    }
    Ok(out)
}

/// Whether the host remaps interrupts: a remapped interrupt chip's name
/// starts with `IR-` in `/proc/interrupts` (`IR-IO-APIC`, `IR-PCI-MSI`, as
/// Intel's and AMD's remapping name them). Without it, a device the guest
/// drives can write an MSI that the host takes as any interrupt it likes
/// (what vfio_iommu_type1 refuses unless `allow_unsafe_interrupts`).
pub fn interrupt_remapping() -> Result<bool, DeviceError> {
    let bytes = read_proc_file("/proc/interrupts").map_err(|errno| SysError {
        op: "read",
        path: "/proc/interrupts".into(),
        errno,
    })?;
    Ok(String::from_utf8_lossy(&bytes)
        .split_whitespace()
        .any(|w| w.starts_with("IR-")))
}

/// Whether the `vfio-pci` driver is there to bind to.
pub fn vfio_pci_loaded() -> Result<bool, DeviceError> {
    Ok(sysfs::open_dir(&Path::new(PCI_DRIVERS).join(VFIO_PCI))?.is_some())
}

fn drivers_dir() -> Result<SysDir, DeviceError> {
    sysfs::open_dir(Path::new(PCI_DRIVERS))?.ok_or(DeviceError::NoVfioDriver)
}

fn bus_dir() -> Result<SysDir, DeviceError> {
    sysfs::open_dir(Path::new("/sys/bus/pci"))?.ok_or(DeviceError::NoVfioDriver)
}

/// Unbind `addr` from `driver`.
fn unbind(addr: &PciAddress, driver: &str) -> Result<(), DeviceError> {
    let drivers = drivers_dir()?;
    if let Some(d) = sysfs::open_sub(&drivers, driver)? {
        sysfs::write_attr(&d, "unbind", addr.as_str())?;
    }
    Ok(())
}

/// Bind `dev` to `vfio-pci` (the kernel's VFIO usage example, with
/// `driver_override` so no other driver takes it meanwhile), and check it
/// took.
pub fn bind_vfio(dev: &PciDevice) -> Result<(), DeviceError> {
    let dir = device_dir(&dev.addr)?.ok_or_else(|| DeviceError::NoSuchPci {
        addr: dev.addr.clone(),
    })?;
    let now = sysfs::link_name(&dir, "driver")?;
    if now.as_deref() == Some(VFIO_PCI) {
        return Ok(());
    }
    sysfs::write_attr(&dir, "driver_override", VFIO_PCI)?;
    if let Some(d) = &now {
        unbind(&dev.addr, d)?;
    }
    sysfs::write_attr(&bus_dir()?, DRIVERS_PROBE, dev.addr.as_str())?;
    let after = sysfs::link_name(&dir, "driver")?;
    if after.as_deref() != Some(VFIO_PCI) {
        return Err(DeviceError::Bind {
            addr: dev.addr.clone(),
            want: VFIO_PCI.into(),
            got: after,
        });
    }
    Ok(())
}

/// Wait (briefly: devtmpfs makes it as the driver binds) for `/dev/vfio/N`.
pub fn wait_group_node(group: u32) -> Result<Node, DeviceError> {
    let path = group_node(group);
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(n) = sysfs::open_node(&path)? {
            return Ok(n);
        }
        if Instant::now() > until {
            return Err(DeviceError::NoGroupNode { path });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Give `addr` back: off `vfio-pci`, `driver_override` cleared, probed, and
/// checked to be on `driver` again (or left on `vfio-pci` when `keep`).
/// Idempotent: a device already given back is only checked.
pub fn give_back(addr: &PciAddress, driver: Option<&str>, keep: bool) -> Result<(), String> {
    let dir = match device_dir(addr) {
        Ok(Some(d)) => d,
        // Gone from the bus (hot-unplugged): nothing left to give back.
        Ok(None) => return Ok(()),
        Err(e) => return Err(e.to_string()),
    };
    let e = |x: SysError| x.to_string();
    let now = sysfs::link_name(&dir, "driver").map_err(e)?;
    if keep {
        return match now.as_deref() {
            Some(VFIO_PCI) => Ok(()),
            other => Err(format!("is on {other:?}, not left on vfio-pci as asked")),
        };
    }
    if now.as_deref() == driver {
        // Back already; a stale override of ours would send the next probe
        // to vfio-pci (a device that was on vfio-pci keeps the host's).
        if driver != Some(VFIO_PCI) {
            clear_override(&dir).map_err(e)?;
        }
        return Ok(());
    }
    if now.as_deref() == Some(VFIO_PCI) {
        unbind(addr, VFIO_PCI).map_err(|x| x.to_string())?;
    }
    clear_override(&dir).map_err(e)?;
    if let Some(d) = driver {
        let bus = bus_dir().map_err(|x| x.to_string())?;
        sysfs::write_attr(&bus, DRIVERS_PROBE, addr.as_str()).map_err(e)?;
        // drivers_probe picks the best match, which is the driver it had
        // unless another claims it; then bind it by name.
        if sysfs::link_name(&dir, "driver").map_err(e)?.as_deref() != Some(d) {
            let drivers = drivers_dir().map_err(|x| x.to_string())?;
            if let Some(dd) = sysfs::open_sub(&drivers, d).map_err(e)? {
                let _ = sysfs::write_attr(&dd, "bind", addr.as_str());
            }
        }
    }
    let after = sysfs::link_name(&dir, "driver").map_err(e)?;
    if after.as_deref() != driver {
        return Err(format!(
            "is on {after:?} after the give-back, not on the driver it had ({driver:?})"
        ));
    }
    Ok(())
}

fn clear_override(dir: &SysDir) -> Result<(), SysError> {
    match sysfs::read_attr(dir, "driver_override")? {
        Some(v) if v != "(null)" && !v.is_empty() => {
            sysfs::write_attr(dir, "driver_override", "\n")
        }
        _ => Ok(()),
    }
}
