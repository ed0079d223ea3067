//! The checks of the spec's `devices` (`config::devices`): every refusal
//! names its field. Nothing on the host is read here.

use std::path::Path;

use crate::config::capabilities::{self, Feature};
use crate::config::devices::{
    DeviceBus, PciAddress, UsbSelector, MAX_DEVICES, SAFE_VFIO_PROPERTIES,
};
use crate::config::spec::{HypervisorKind, Machine, Spec, SpecError};

/// A QEMU id or bus name: a letter, then letters, digits, `-`, `_`, `.`.
fn check_qemu_name(s: &str) -> Result<(), String> {
    let ok = s.len() <= 64
        && s.starts_with(|c: char| c.is_ascii_alphabetic())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "is {s:?}; give a letter, then letters, digits, '-', '_' or '.' (at most 64)"
        ))
    }
}

impl Spec {
    /// The `devices` checks (no file system access).
    pub(crate) fn validate_devices(&self, path: &Path) -> Result<(), SpecError> {
        let bad = |field: String, reason: String| SpecError::Invalid {
            path: path.to_path_buf(),
            field,
            reason,
        };
        if self.devices.is_empty() {
            if self.allow_unsafe_interrupts {
                return Err(bad(
                    "allow_unsafe_interrupts".into(),
                    "is true, but the VM has no PCI device; drop it".into(),
                ));
            }
            return Ok(());
        }
        if self.devices.len() > MAX_DEVICES {
            return Err(bad(
                "devices".into(),
                format!(
                    "has {} devices; the limit is {MAX_DEVICES}",
                    self.devices.len()
                ),
            ));
        }
        let kind = self.hypervisor.kind;
        if kind == HypervisorKind::Qemu && self.hypervisor.machine == Machine::Microvm {
            return Err(bad(
                "devices".into(),
                "needs a PCI bus, which QEMU's microvm machine has not here (its devices are virtio-mmio); set hypervisor.machine to \"q35\"".into(),
            ));
        }
        let mut seen: Vec<String> = Vec::new();
        for (i, d) in self.devices.iter().enumerate() {
            let field = |s: &str| format!("devices[{i}].{s}");
            let feature = match d.bus {
                DeviceBus::Pci => Feature::PciPassthrough,
                DeviceBus::Usb => Feature::UsbPassthrough,
            };
            if let Some(r) = capabilities::refusal(kind, feature) {
                return Err(bad(r.field_at(i), r.reason.into()));
            }
            let canonical = match d.bus {
                DeviceBus::Pci => PciAddress::parse(&d.path)
                    .map_err(|r| bad(field("path"), r))?
                    .to_string(),
                DeviceBus::Usb => UsbSelector::parse(&d.path)
                    .map_err(|r| bad(field("path"), r))?
                    .to_string(),
            };
            if seen.contains(&canonical) {
                return Err(bad(
                    field("path"),
                    format!("is {canonical:?} again; list each device once"),
                ));
            }
            seen.push(canonical);
            let qemu_only = kind != HypervisorKind::Qemu;
            if let Some(id) = &d.id {
                if qemu_only {
                    return Err(bad(field("id"), "is QEMU's device id; drop it".into()));
                }
                check_qemu_name(id).map_err(|r| bad(field("id"), r))?;
            }
            if let Some(b) = &d.qemu_bus {
                if qemu_only {
                    return Err(bad(field("qemu_bus"), "is QEMU's bus; drop it".into()));
                }
                check_qemu_name(b).map_err(|r| bad(field("qemu_bus"), r))?;
            }
            for (j, p) in d.qemu_properties.iter().enumerate() {
                let f = field(&format!("qemu_properties[{j}]"));
                if qemu_only || d.bus != DeviceBus::Pci {
                    return Err(bad(
                        f,
                        "sets a property of QEMU's vfio-pci device, and this is not one; drop it"
                            .into(),
                    ));
                }
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                if !SAFE_VFIO_PROPERTIES.contains(&k) {
                    return Err(bad(
                        f,
                        format!("is {p:?}: {k:?} is not a vfio-pci property vmwarden passes (what QEMU opens is the launcher's); it passes {}", SAFE_VFIO_PROPERTIES.join(", ")),
                    ));
                }
                let v_ok = !v.is_empty()
                    && v.chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
                if !v_ok {
                    return Err(bad(
                        f,
                        format!(
                            "is {p:?}; give key=value, the value letters, digits, '.', '-' or '_'"
                        ),
                    ));
                }
            }
            if d.keep_on_vfio_pci && d.bus != DeviceBus::Pci {
                return Err(bad(
                    field("keep_on_vfio_pci"),
                    "is for PCI devices only; drop it".into(),
                ));
            }
        }
        if self.allow_unsafe_interrupts && !self.devices.iter().any(|d| d.bus == DeviceBus::Pci) {
            return Err(bad(
                "allow_unsafe_interrupts".into(),
                "is true, but the VM has no PCI device; drop it".into(),
            ));
        }
        Ok(())
    }
}
