//! What each hypervisor cannot do, as data: one row per (hypervisor,
//! feature) the spec may ask for and that hypervisor does not have, with
//! the field the refusal names and the reason it gives. The spec's checks
//! (`config::validation`) take their refusals from here, and
//! [`markdown`] renders the same rows for the documentation, so the two
//! cannot drift apart: the table between the `capabilities` markers in
//! docs/design/hypervisors.md must equal it byte for byte
//! (`launcher/tests/cli.rs` checks, and prints the table to paste when
//! they differ).
//!
//! In short: firecracker has no TCG, no credentials, no qcow2, no disk
//! serial, no O_DIRECT or discard on its drives, no vhost-net or
//! multi-queue taps, no macvtap, no shares (neither 9p nor virtiofs), no vhost vsock,
//! no user networking, no same-page merging and no PCI or USB passthrough;
//! cloud-hypervisor has no TCG, no 9p, no vhost-net, no vhost vsock, no user
//! networking and no USB passthrough; QEMU has them all.

use crate::config::spec::HypervisorKind;

/// A feature of the spec that not every hypervisor has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feature {
    /// `hypervisor.accel` other than `"kvm"` (TCG, software emulation).
    Tcg,
    /// `credentials`: secrets delivered through fw_cfg.
    Credentials,
    /// `disks[].format = "qcow2"`.
    Qcow2,
    /// `disks[].serial`.
    DiskSerial,
    /// `shares` of either protocol.
    Shares,
    /// `shares[].proto = "9p"`.
    NinePShares,
    /// `vsock.backend = "vhost"` (the kernel's vhost-vsock device).
    VhostVsock,
    /// `balloon`: virtio-balloon set through the control socket.
    Balloon,
    /// `console`: a serial console to attach to (`vmwarden console`).
    Console,
    /// `user_network`: an interface served by passt.
    UserNetwork,
    /// `disks[].direct = true` (O_DIRECT, past the host's page cache).
    DirectIo,
    /// `disks[].discard = true` (the guest's TRIM frees the image's blocks).
    Discard,
    /// `interfaces[].vhost = true` (the kernel's vhost-net).
    VhostNet,
    /// `interfaces[].queues` above 1 (a multi-queue tap).
    Multiqueue,
    /// `mem_merge`: kernel same-page merging of the guest's memory.
    MemMerge,
    /// `interfaces[].type = "macvtap"` (config/macvtap.rs).
    Macvtap,
    /// `devices[i].bus = "pci"` (VFIO).
    PciPassthrough,
    /// `devices[i].bus = "usb"`.
    UsbPassthrough,
}

impl Feature {
    /// How the documentation names the feature.
    pub fn as_str(self) -> &'static str {
        match self {
            Feature::Tcg => "TCG (`hypervisor.accel`)",
            Feature::Credentials => "credentials",
            Feature::Qcow2 => "qcow2 images",
            Feature::DiskSerial => "disk serials",
            Feature::Shares => "shares (9p and virtiofs)",
            Feature::NinePShares => "9p shares",
            Feature::VhostVsock => "vhost vsock",
            Feature::Balloon => "memory balloon",
            Feature::Console => "a console to attach to",
            Feature::UserNetwork => "user networking (passt)",
            Feature::DirectIo => "O_DIRECT disks",
            Feature::Discard => "discard",
            Feature::VhostNet => "vhost-net",
            Feature::Multiqueue => "multi-queue taps",
            Feature::MemMerge => "same-page merging (KSM)",
            Feature::Macvtap => "macvtap interfaces",
            Feature::PciPassthrough => "PCI passthrough",
            Feature::UsbPassthrough => "USB passthrough",
        }
    }
}

/// One thing a hypervisor does not have, and how the spec check says so:
/// `spec PATH: field `FIELD` REASON`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    pub kind: HypervisorKind,
    pub feature: Feature,
    /// The field the error names; `[i]` stands for the item's index.
    pub field: &'static str,
    /// What follows the field in the error; `{value}` stands for the
    /// field's value where the reason quotes it.
    pub reason: &'static str,
}

impl Refusal {
    /// The field of item `i` (for a field of a list: `disks[i].format`).
    pub fn field_at(&self, i: usize) -> String {
        self.field.replace("[i]", &format!("[{i}]"))
    }

    /// The reason, `{value}` replaced by `value`.
    pub fn reason_with(&self, value: &str) -> String {
        self.reason.replace("{value}", value)
    }
}

/// Every refusal, by hypervisor. QEMU has every feature: it has no rows.
pub const REFUSALS: &[Refusal] = &[
    Refusal {
        kind: HypervisorKind::Firecracker,
        feature: Feature::Tcg,
        field: "hypervisor.accel",
        reason: "is {value}, but firecracker runs only on KVM; use \"kvm\" (or hypervisor.kind \"qemu\" for TCG)",
    },
    Refusal {
        kind: HypervisorKind::Firecracker,
        feature: Feature::Credentials,
        field: "credentials",
        reason: "cannot be passed to firecracker safely: it has no fw_cfg and no SMBIOS, so no channel keeps a \
                 secret off its command line and out of the host's mount namespace (systemd takes credentials from \
                 an initrd's /.extra/credentials/ only as encrypted ones, for services to decrypt with the guest's \
                 own key). Use hypervisor.kind \"qemu\" or \"cloud-hypervisor\" (fw_cfg from a private tmpfs) or \
                 deliver the secret over the network or a disk",
    },
    Refusal {
        kind: HypervisorKind::Firecracker,
        feature: Feature::Qcow2,
        field: "disks[i].format",
        reason: "is qcow2, but firecracker reads raw images only; convert it (qemu-img convert -O raw)",
    },
    Refusal {
        kind: HypervisorKind::Firecracker,
        feature: Feature::DiskSerial,
        field: "disks[i].serial",
        reason: "is not supported with firecracker: its drives have no serial",
    },
    Refusal {
        kind: HypervisorKind::Firecracker,
        feature: Feature::DirectIo,
        field: "disks[i].direct",
        reason: "is true, but firecracker's drives have no O_DIRECT mode (they go through the host's page cache); set it to false or drop it",
    },
    Refusal {
        kind: HypervisorKind::Firecracker,
        feature: Feature::Discard,
        field: "disks[i].discard",
        reason: "is true, but firecracker's drives have no discard; set it to false or drop it",
    },
    Refusal {
        kind: HypervisorKind::Firecracker,
        feature: Feature::VhostNet,
        field: "interfaces[i].vhost",
        reason: "is true, but firecracker's network devices run in firecracker itself, not in the kernel's vhost-net; set it to false or drop it",
    },
    Refusal {
        kind: HypervisorKind::Firecracker,
        feature: Feature::Multiqueue,
        field: "interfaces[i].queues",
        reason: "is above 1, but firecracker's network devices have one queue pair; set it to 1 or drop it",
    },
    Refusal {
        kind: HypervisorKind::Firecracker,
        feature: Feature::Macvtap,
        field: "interfaces[i].type",
        reason: "is \"macvtap\", but firecracker opens its network devices by name (a tap it attaches to) and \
                 cannot take a macvtap's queues as the fds root opened; use a tap on a bridge, or qemu or \
                 cloud-hypervisor",
    },
    Refusal {
        kind: HypervisorKind::Firecracker,
        feature: Feature::Shares,
        field: "shares",
        reason: "is not supported with firecracker: it has neither virtio-fs nor 9p; give the guest a disk, or use qemu or cloud-hypervisor",
    },
    Refusal {
        kind: HypervisorKind::Firecracker,
        feature: Feature::VhostVsock,
        field: "vsock.backend",
        reason: "is \"vhost\", but firecracker serves vsock itself on a unix socket in control/; use \"user\"",
    },
    Refusal {
        kind: HypervisorKind::Firecracker,
        feature: Feature::Balloon,
        field: "balloon",
        reason: "is not supported with firecracker by vmwarden: its balloon is set through another API (PATCH /balloon) \
                 that vmwarden does not drive; use qemu or cloud-hypervisor, or leave balloon unset",
    },
    Refusal {
        kind: HypervisorKind::Firecracker,
        feature: Feature::Console,
        field: "console",
        reason: "is not supported with firecracker: its serial console is only its own stdin and stdout, which \
                 the journal holds; read the console with journalctl, or use qemu or cloud-hypervisor",
    },
    Refusal {
        kind: HypervisorKind::Firecracker,
        feature: Feature::UserNetwork,
        field: "user_network",
        reason: "is not supported with firecracker: its only network backend is a tap, and passt serves a guest \
                 over QEMU's stream socket; use interfaces (a tap), or hypervisor.kind \"qemu\"",
    },
    Refusal {
        kind: HypervisorKind::Firecracker,
        feature: Feature::MemMerge,
        field: "mem_merge",
        reason: "is true, but firecracker never marks guest memory mergeable (it has no KSM option); set it to false or drop it",
    },
    Refusal {
        kind: HypervisorKind::Firecracker,
        feature: Feature::PciPassthrough,
        field: "devices[i].bus",
        reason: "is \"pci\", but firecracker has no PCI passthrough (no VFIO devices); use qemu or cloud-hypervisor",
    },
    Refusal {
        kind: HypervisorKind::Firecracker,
        feature: Feature::UsbPassthrough,
        field: "devices[i].bus",
        reason: "is \"usb\", but firecracker has no USB controller; use qemu",
    },
    Refusal {
        kind: HypervisorKind::CloudHypervisor,
        feature: Feature::Tcg,
        field: "hypervisor.accel",
        reason: "is {value}, but cloud-hypervisor runs only on KVM; use \"kvm\" (or hypervisor.kind \"qemu\" for TCG)",
    },
    Refusal {
        kind: HypervisorKind::CloudHypervisor,
        feature: Feature::NinePShares,
        field: "shares[i].proto",
        reason: "is 9p, which cloud-hypervisor does not have; use \"virtiofs\"",
    },
    Refusal {
        kind: HypervisorKind::CloudHypervisor,
        feature: Feature::VhostNet,
        field: "interfaces[i].vhost",
        reason: "is true, but cloud-hypervisor's network devices run in cloud-hypervisor itself, not in the kernel's vhost-net (its queues come from interfaces[].queues); set it to false or drop it",
    },
    Refusal {
        kind: HypervisorKind::CloudHypervisor,
        feature: Feature::VhostVsock,
        field: "vsock.backend",
        reason: "is \"vhost\", but cloud-hypervisor serves vsock itself on a unix socket in control/; use \"user\"",
    },
    Refusal {
        kind: HypervisorKind::CloudHypervisor,
        feature: Feature::UserNetwork,
        field: "user_network",
        reason: "is not supported with cloud-hypervisor: passt serves a guest over QEMU's stream socket, which \
                 cloud-hypervisor does not speak (and this passt has no vhost-user mode); use interfaces (a tap), \
                 or hypervisor.kind \"qemu\"",
    },
    Refusal {
        kind: HypervisorKind::CloudHypervisor,
        feature: Feature::UsbPassthrough,
        field: "devices[i].bus",
        reason: "is \"usb\", but cloud-hypervisor has no USB controller (microvm.nix passes USB devices to QEMU only); use qemu",
    },
];

/// Why `kind` cannot have `feature`, or `None` when it can.
pub fn refusal(kind: HypervisorKind, feature: Feature) -> Option<&'static Refusal> {
    REFUSALS
        .iter()
        .find(|r| r.kind == kind && r.feature == feature)
}

/// The table as the documentation shows it: one row per refusal.
pub fn markdown() -> String {
    let mut out = String::from(
        "| hypervisor | has no | field refused | the launcher says |\n|---|---|---|---|\n",
    );
    for r in REFUSALS {
        out.push_str(&format!(
            "| {} | {} | `{}` | {} |\n",
            r.kind.as_str(),
            r.feature.as_str(),
            r.field,
            r.reason.replace('|', "\\|")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_hypervisor_and_feature_has_at_most_one_row() {
        for (i, a) in REFUSALS.iter().enumerate() {
            for b in &REFUSALS[i + 1..] {
                assert!(
                    (a.kind, a.feature) != (b.kind, b.feature),
                    "{:?} {:?} twice",
                    a.kind,
                    a.feature
                );
            }
        }
        assert!(REFUSALS.iter().all(|r| r.kind != HypervisorKind::Qemu));
    }

    #[test]
    fn each_reason_names_its_hypervisor_and_the_table_renders_every_row() {
        for r in REFUSALS {
            assert!(r.reason.contains(r.kind.as_str()), "{r:?}");
        }
        let md = markdown();
        assert_eq!(md.lines().count(), REFUSALS.len() + 2);
        assert!(md.contains("| firecracker | qcow2 images | `disks[i].format` |"));
    }

    #[test]
    fn an_item_field_gets_its_index() {
        let r = refusal(HypervisorKind::Firecracker, Feature::Qcow2).unwrap();
        assert_eq!(r.field_at(3), "disks[3].format");
        assert!(refusal(HypervisorKind::Qemu, Feature::Qcow2).is_none());
    }
}
