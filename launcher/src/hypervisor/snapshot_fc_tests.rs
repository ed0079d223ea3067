//! Unit tests of `snapshot_fc.rs`.

use super::*;
use crate::config::spec::{HypervisorKind, InterfaceSpec};
use crate::hypervisor::tests::spec;
use serde_json::json;

const CONTROL: &str = "/run/vmwarden/web/control";

fn fc_spec() -> Spec {
    let mut s = spec();
    s.hypervisor.kind = HypervisorKind::Firecracker;
    s.credentials.clear();
    s.interfaces = vec![InterfaceSpec {
        tap: "vmw-web0".parse().unwrap(),
        bridge: None,
        mac: Some("02:00:00:00:00:01".parse().unwrap()),
        vhost: None,
        queues: None,
        kind: None,
        macvtap: None,
    }];
    s
}

/// `GET /vm/config` as firecracker v1.16.1 answers it after a load
/// (the shape seen on this host; fields that name nothing trimmed).
fn vm_config() -> serde_json::Value {
    json!({
        "balloon": null,
        "drives": [
            { "drive_id": "disk0", "path_on_host": "/var/lib/vmwarden/web/root.img", "is_root_device": false, "is_read_only": false },
            { "drive_id": "disk1", "path_on_host": "/data/a,b.img", "is_root_device": false, "is_read_only": true }
        ],
        "boot-source": { "kernel_image_path": "/k/bzImage", "initrd_path": "/k/initrd", "boot_args": "console=ttyS0" },
        "machine-config": { "vcpu_count": 2, "mem_size_mib": 512, "smt": false, "huge_pages": "None" },
        "network-interfaces": [ { "iface_id": "net0", "host_dev_name": "vmw-web0", "guest_mac": "02:00:00:00:00:01" } ],
        "logger": null, "metrics": null, "vsock": null, "pmem": []
    })
}

fn check_of(s: &Spec, v: &serde_json::Value) -> Result<(), RestoreError> {
    check_config(s, Path::new(CONTROL), &v.to_string())
}

#[test]
fn the_same_devices_pass() {
    check_of(&fc_spec(), &vm_config()).unwrap();
}

#[test]
fn drives_are_matched_by_id_not_by_their_place_in_the_list() {
    // firecracker lists a restored VM's drives in no fixed order.
    let mut v = vm_config();
    v["drives"].as_array_mut().unwrap().reverse();
    check_of(&fc_spec(), &v).unwrap();
    // Two drives that trade paths are each named.
    let mut v = vm_config();
    v["drives"][0]["drive_id"] = json!("disk1");
    v["drives"][1]["drive_id"] = json!("disk0");
    let e = check_of(&fc_spec(), &v).unwrap_err().to_string();
    assert!(
        e.contains("drives[disk0].path_on_host") && e.contains("drives[disk1].path_on_host"),
        "{e}"
    );
}

#[test]
fn a_drive_tap_or_vsock_that_differs_is_refused_by_field() {
    let mut s = fc_spec();
    s.disks[0].path = "/var/lib/vmwarden/web/other.img".into();
    let e = check_of(&s, &vm_config()).unwrap_err().to_string();
    assert!(
        e.contains(r#"drives[disk0].path_on_host: the snapshot has "/var/lib/vmwarden/web/root.img", the spec now gives "/var/lib/vmwarden/web/other.img""#),
        "{e}"
    );
    let mut v = vm_config();
    v["network-interfaces"][0]["host_dev_name"] = json!("vmw-other0");
    let e = check_of(&fc_spec(), &v).unwrap_err().to_string();
    assert!(e.contains(r#"network-interfaces[net0].host_dev_name: the snapshot has "vmw-other0", the spec now gives "vmw-web0""#), "{e}");
    let mut v = vm_config();
    v["vsock"] = json!({ "guest_cid": 3, "uds_path": "/run/vmwarden/other/control/vsock.sock" });
    let e = check_of(&fc_spec(), &v).unwrap_err().to_string();
    assert!(e.contains(r#"vsock.uds_path: the snapshot has "/run/vmwarden/other/control/vsock.sock", the spec now gives nothing"#), "{e}");
}

#[test]
fn a_stray_path_and_an_unknown_boot_source_are_refused() {
    let mut v = vm_config();
    v["logger"] = json!({ "log_path": "/etc/shadow" });
    let e = check_of(&fc_spec(), &v).unwrap_err().to_string();
    assert!(
        e.contains(r#"/logger/log_path: the snapshot names the host path "/etc/shadow""#),
        "{e}"
    );
    let mut v = vm_config();
    v["boot-source"]["initrd_path"] = json!("/k/other");
    let e = check_of(&fc_spec(), &v).unwrap_err().to_string();
    assert!(e.contains("/boot-source/initrd_path"), "{e}");
    let e = check_config(&fc_spec(), Path::new(CONTROL), "[1")
        .unwrap_err()
        .to_string();
    assert!(e.contains("is not firecracker's"), "{e}");
}

#[test]
fn bodies_argv_and_refusals() {
    let d = Path::new("/s/.snap");
    let c: serde_json::Value = serde_json::from_str(&create_body(d)).unwrap();
    assert_eq!(
        c,
        json!({ "snapshot_type": "Full", "snapshot_path": "/s/.snap/vmstate", "mem_file_path": "/s/.snap/memory" })
    );
    let l: serde_json::Value = serde_json::from_str(&load_body(d)).unwrap();
    assert_eq!(l["resume_vm"], false);
    assert_eq!(
        l["mem_backend"],
        json!({ "backend_type": "File", "backend_path": "/s/.snap/memory" })
    );
    let mut s = fc_spec();
    s.hypervisor.binary = "/bin/firecracker".into();
    assert_eq!(
        restore_argv(&s, Path::new("/c/api.sock")),
        vec!["/bin/firecracker", "--api-sock", "/c/api.sock"]
    );
    assert!(refused_fields(&s).is_empty());
    s.hugepage_mem = true;
    assert_eq!(refused_fields(&s), vec!["hugepage_mem"]);
}
