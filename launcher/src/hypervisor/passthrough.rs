//! What each hypervisor is told of the spec's `devices`: QEMU's `vfio-pci`
//! by host address (QEMU opens `/dev/vfio/vfio` and the group's node
//! itself: its 7.2 `vfio-pci` takes no group fd) and `usb-host` by its
//! node on an xHCI controller of its own; cloud-hypervisor's `--device`
//! by the device's sysfs directory.

use std::path::PathBuf;

use crate::config::devices::DeviceBus;
use crate::config::spec::Spec;

/// The xHCI controller the USB devices are plugged into.
pub const USB_CONTROLLER_ID: &str = "vmwarden-xhci";

/// QEMU's `-device` arguments for `spec.devices`; `usb_nodes` are the USB
/// devices' nodes, resolved by root, in order.
pub fn qemu_args(spec: &Spec, usb_nodes: &[PathBuf]) -> Vec<String> {
    let mut out = Vec::new();
    for d in spec.devices.iter().filter(|d| d.bus == DeviceBus::Pci) {
        let Some(addr) = d.pci() else { continue };
        let mut dev = format!("vfio-pci,host={addr}");
        if let Some(id) = &d.id {
            dev.push_str(&format!(",id={id}"));
        }
        if let Some(b) = &d.qemu_bus {
            dev.push_str(&format!(",bus={b}"));
        }
        for p in &d.qemu_properties {
            dev.push(',');
            dev.push_str(p);
        }
        out.extend(["-device".to_string(), dev]);
    }
    let usb: Vec<_> = spec
        .devices
        .iter()
        .filter(|d| d.bus == DeviceBus::Usb)
        .collect();
    if !usb.is_empty() {
        out.extend([
            "-device".to_string(),
            format!("qemu-xhci,id={USB_CONTROLLER_ID}"),
        ]);
    }
    for (d, node) in usb.iter().zip(usb_nodes) {
        let id =
            d.id.as_ref()
                .map(|i| format!(",id={i}"))
                .unwrap_or_default();
        out.extend([
            "-device".to_string(),
            format!(
                "usb-host,bus={USB_CONTROLLER_ID}.0,hostdevice={}{id}",
                node.display()
            ),
        ]);
    }
    out
}

/// cloud-hypervisor's `--device path=/sys/bus/pci/devices/ADDR/` for each
/// PCI device.
pub fn cloud_hypervisor_args(spec: &Spec) -> Vec<String> {
    let paths: Vec<String> = spec
        .devices
        .iter()
        .filter_map(|d| d.pci())
        .map(|a| format!("path=/sys/bus/pci/devices/{a}/"))
        .collect();
    if paths.is_empty() {
        return Vec::new();
    }
    let mut out = vec!["--device".to_string()];
    out.extend(paths);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::devices::DeviceSpec;
    use crate::config::spec::HypervisorKind;
    use crate::hypervisor::tests::spec;

    fn with_devices(kind: HypervisorKind) -> Spec {
        let mut s = spec();
        s.hypervisor.kind = kind;
        let dev = |bus, path: &str| DeviceSpec {
            bus,
            path: path.into(),
            id: None,
            qemu_bus: None,
            qemu_properties: vec![],
            keep_on_vfio_pci: false,
        };
        s.devices = vec![
            DeviceSpec {
                id: Some("gpu".into()),
                qemu_properties: vec!["x-vga=on".into()],
                ..dev(DeviceBus::Pci, "0000:01:00.0")
            },
            dev(DeviceBus::Pci, "0000:01:00.1"),
            dev(DeviceBus::Usb, "vendorid=0x0627,productid=0x0001"),
        ];
        s
    }

    #[test]
    fn qemu_gets_vfio_pci_by_address_and_usb_host_by_its_node() {
        let s = with_devices(HypervisorKind::Qemu);
        let a = qemu_args(&s, &["/dev/bus/usb/001/002".into()]);
        assert_eq!(
            a,
            [
                "-device",
                "vfio-pci,host=0000:01:00.0,id=gpu,x-vga=on",
                "-device",
                "vfio-pci,host=0000:01:00.1",
                "-device",
                "qemu-xhci,id=vmwarden-xhci",
                "-device",
                "usb-host,bus=vmwarden-xhci.0,hostdevice=/dev/bus/usb/001/002",
            ]
        );
    }

    #[test]
    fn cloud_hypervisor_gets_each_sysfs_directory() {
        let mut s = with_devices(HypervisorKind::CloudHypervisor);
        s.devices.pop();
        assert_eq!(
            cloud_hypervisor_args(&s),
            [
                "--device",
                "path=/sys/bus/pci/devices/0000:01:00.0/",
                "path=/sys/bus/pci/devices/0000:01:00.1/"
            ]
        );
    }
}
