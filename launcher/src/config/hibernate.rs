//! `hibernate`: whether `vmwarden hibernate NAME` may put this VM's RAM on
//! its state directory's disk, and what a start does when the snapshot no
//! longer matches what the VM would run.
//!
//! Absent means not allowed: a snapshot holds the guest's memory, the
//! secrets it read included, on persistent disk, where the credentials'
//! `noswap` tmpfs promises they never go. So it is an explicit opt-in.
//!
//! The snapshot is a directory in the VM's state dir: [`SNAPSHOT_DIR`]
//! once complete, [`SNAPSHOT_NEW`] while it is written (the intent record
//! of every instance that may hibernate names both, `Resource::Snapshot`).
//! Root's record of what it must match is `STATE/.hibernated-NAME.json`
//! (`instance::hibernated`).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::config::shares::ShareProto;
use crate::config::spec::{HypervisorKind, Spec, SpecError, VsockBackend};

/// The complete snapshot's name in the VM's state dir (principal, 0700;
/// its files principal, 0600).
pub const SNAPSHOT_DIR: &str = ".vmwarden-hibernate";
/// The snapshot's name while the hypervisor writes it: only a complete
/// capture is renamed to [`SNAPSHOT_DIR`]; cleanup deletes this one once
/// the instance that wrote it is dead.
pub const SNAPSHOT_NEW: &str = ".vmwarden-hibernate.new";
/// QEMU's migration stream inside the snapshot directory.
pub const QEMU_MEMORY_FILE: &str = "memory";

/// What a start does with a snapshot that no longer matches.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum OnMismatch {
    /// Refuse the start (exit 78), naming what differs; keep the snapshot.
    #[default]
    Refuse,
    /// Boot cold (logged), keeping the snapshot until `purge` or the next
    /// hibernation replaces it.
    ColdBoot,
}

impl OnMismatch {
    pub fn as_str(self) -> &'static str {
        match self {
            OnMismatch::Refuse => "refuse",
            OnMismatch::ColdBoot => "cold-boot",
        }
    }
}

/// `hibernate` in the spec.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct HibernateSpec {
    #[serde(default)]
    pub allowed: bool,
    #[serde(default)]
    pub on_mismatch: OnMismatch,
}

/// Whether the spec lets this VM hibernate.
pub fn allowed(spec: &Spec) -> bool {
    spec.hibernate.is_some_and(|h| h.allowed)
}

/// Why `kind` cannot hibernate at all, or `None` when it can. The one
/// place a hypervisor is switched on.
pub fn unsupported(kind: HypervisorKind) -> Option<&'static str> {
    match kind {
        HypervisorKind::Qemu => None,
        HypervisorKind::CloudHypervisor | HypervisorKind::Firecracker => None,
    }
}

/// The spec's refusals: a hypervisor that cannot, or a device QEMU
/// cannot migrate (each names the device's field).
pub fn check(spec: &Spec, path: &Path) -> Result<(), SpecError> {
    if !allowed(spec) {
        return Ok(());
    }
    let bad = |field: String, reason: String| SpecError::Invalid {
        path: path.to_path_buf(),
        field,
        reason,
    };
    if let Some(why) = unsupported(spec.hypervisor.kind) {
        return Err(bad("hibernate.allowed".into(), why.into()));
    }
    match blockers(spec).into_iter().next() {
        Some(b) => Err(bad(
            b.field,
            format!(
                "{}; hibernate.allowed needs a VM its hypervisor can snapshot",
                b.why
            ),
        )),
        None => Ok(()),
    }
}

/// A device of the spec QEMU refuses to migrate (a migration blocker).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocker {
    pub field: String,
    pub why: String,
}

/// What QEMU 7.2 cannot put in a snapshot: vhost-user-fs (virtiofs) and a
/// mounted virtio-9p register migration blockers, vhost-user-vsock is
/// unmigratable, and so is a device passed through (VFIO, USB host).
pub fn blockers(spec: &Spec) -> Vec<Blocker> {
    let mut out = Vec::new();
    for (i, s) in spec.shares.iter().enumerate() {
        let why = match s.proto {
            ShareProto::Virtiofs => "is virtiofs, whose vhost-user-fs device QEMU cannot migrate",
            ShareProto::NineP => "is 9p, which QEMU cannot migrate while the guest has it mounted",
        };
        out.push(Blocker {
            field: format!("shares[{i}].proto"),
            why: why.into(),
        });
    }
    if let Some(v) = &spec.vsock {
        if v.backend == VsockBackend::User {
            out.push(Blocker {
                field: "vsock.backend".into(),
                why: if spec.hypervisor.kind == HypervisorKind::Qemu {
                    "is \"user\" (vhost-user-vsock), which QEMU cannot migrate".into()
                } else {
                    "is \"user\" (the hypervisor's hybrid vsock), whose host side vmwarden does not carry across a restore".into()
                },
            });
        }
    }
    if spec.hugepage_mem && spec.hypervisor.kind != HypervisorKind::Qemu {
        out.push(Blocker {
            field: "hugepage_mem".into(),
            why: "is true: cloud-hypervisor restores memory by copy and firecracker's file backend takes no hugepages".into(),
        });
    }
    for (i, _) in spec.devices.iter().enumerate() {
        out.push(Blocker {
            field: format!("devices[{i}]"),
            why: "is a device passed through, whose state QEMU cannot migrate".into(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(extra: serde_json::Value) -> Spec {
        let mut v = json!({
            "version": 1, "name": "web",
            "principal": { "uid": 61000, "gid": 61000 },
            "hypervisor": { "kind": "qemu", "binary": "/usr/bin/qemu-system-x86_64" },
            "vcpus": 1, "memory_mib": 256, "kernel": "/k",
        });
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        serde_json::from_value(v).unwrap()
    }

    fn refusal(extra: serde_json::Value) -> Option<String> {
        check(&spec(extra), Path::new("/s.json"))
            .err()
            .map(|e| e.to_string())
    }

    #[test]
    fn hibernation_is_refused_by_field_where_qemu_cannot_migrate_or_the_kind_cannot() {
        let on = json!({ "allowed": true });
        assert!(refusal(json!({})).is_none());
        assert!(refusal(json!({ "hibernate": on })).is_none());
        // Not allowed: nothing to refuse.
        assert!(refusal(
            json!({ "shares": [{ "tag": "a", "source": "/a", "proto": "virtiofs" }] })
        )
        .is_none());
        let e = refusal(json!({ "hibernate": on, "shares": [{ "tag": "a", "source": "/a", "proto": "virtiofs" }] })).unwrap();
        assert!(e.contains("`shares[0].proto`"), "{e}");
        let e = refusal(
            json!({ "hibernate": on, "shares": [{ "tag": "a", "source": "/a", "proto": "9p" }] }),
        )
        .unwrap();
        assert!(e.contains("`shares[0].proto`"), "{e}");
        let e =
            refusal(json!({ "hibernate": on, "vsock": { "cid": 3, "backend": "user" } })).unwrap();
        assert!(e.contains("`vsock.backend`"), "{e}");
        assert!(
            refusal(json!({ "hibernate": on, "vsock": { "cid": 3, "backend": "vhost" } }))
                .is_none()
        );
        // firecracker hibernates, but not hugepage-backed memory.
        assert!(refusal(
            json!({ "hibernate": on, "hypervisor": { "kind": "firecracker", "binary": "/f" } })
        )
        .is_none());
        let e = refusal(json!({ "hibernate": on, "hugepage_mem": true,
            "hypervisor": { "kind": "firecracker", "binary": "/f" } }))
        .unwrap();
        assert!(e.contains("`hugepage_mem`"), "{e}");
    }

    #[test]
    fn absent_means_not_allowed_and_refuse_is_the_default() {
        assert!(!allowed(&spec(json!({}))));
        let s = spec(json!({ "hibernate": { "allowed": true } }));
        assert!(allowed(&s));
        assert_eq!(s.hibernate.unwrap().on_mismatch, OnMismatch::Refuse);
        let s = spec(json!({ "hibernate": { "allowed": true, "on_mismatch": "cold-boot" } }));
        assert_eq!(s.hibernate.unwrap().on_mismatch, OnMismatch::ColdBoot);
    }
}
