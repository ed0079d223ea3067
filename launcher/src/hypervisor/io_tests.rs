//! Unit tests of the I/O options, as each hypervisor is told: the disks'
//! `direct` and `discard`, the interfaces' `queues` and `vhost`
//! (virtiofsd's pool size: `launch/helpers/tests.rs`).

use std::path::Path;

use super::tests::layout;
use super::*;
use crate::config::spec::*;

fn spec(kind: &str, disks: serde_json::Value) -> Spec {
    let v = serde_json::json!({
        "version": 1, "name": "web",
        "principal": { "user": "vm-web", "group": "vm-web" },
        "hypervisor": { "kind": kind, "binary": "/usr/bin/hv" },
        "vcpus": 1, "memory_mib": 256, "kernel": "/k/vmlinux",
        "disks": disks
    });
    let p = Path::new("/etc/vmwarden/vms/web.json");
    let s = Spec::parse(p, &serde_json::to_vec(&v).unwrap()).unwrap();
    s.validate(p, &"web".parse().unwrap()).unwrap();
    s
}

fn drives(s: &Spec) -> Vec<String> {
    let a = qemu_argv(s, &layout(), false);
    a.iter()
        .zip(a.iter().skip(1))
        .filter(|(k, _)| *k == "-drive")
        .map(|(_, v)| v.clone())
        .collect()
}

#[test]
fn qemu_direct_is_cache_none_and_discard_is_unmap_absent_fields_keep_the_old_drive() {
    let s = spec(
        "qemu",
        serde_json::json!([
            { "path": "/i/a.img" },
            { "path": "/i/b.img", "direct": false, "discard": true },
            { "path": "/i/c.img", "direct": true, "discard": false, "read_only": true }
        ]),
    );
    assert_eq!(
        drives(&s),
        [
            "file=/i/a.img,format=raw,if=none,id=disk0,cache=none,aio=threads",
            "file=/i/b.img,format=raw,if=none,id=disk1,aio=threads,discard=unmap",
            "file=/i/c.img,format=raw,if=none,id=disk2,cache=none,aio=threads,readonly=on",
        ]
    );
}

#[test]
fn cloud_hypervisor_direct_is_direct_on_and_discard_is_sparse() {
    let s = spec(
        "cloud-hypervisor",
        serde_json::json!([
            { "path": "/i/a.img" },
            { "path": "/i/b.img", "direct": true, "discard": false },
            { "path": "/i/c.img", "direct": false, "discard": true }
        ]),
    );
    let a = cloud_hypervisor_argv(&s, &layout());
    let i = a.iter().position(|x| x == "--disk").unwrap();
    assert_eq!(
        a[i + 1..i + 4],
        [
            "path=/i/a.img",
            "path=/i/b.img,direct=on,sparse=off",
            "path=/i/c.img,sparse=on",
        ]
    );
}

#[test]
fn firecracker_refuses_direct_and_discard_by_field_and_takes_them_false() {
    let p = Path::new("/etc/vmwarden/vms/web.json");
    for (field, disk) in [
        (
            "disks[0].direct",
            serde_json::json!({ "path": "/i/a.img", "direct": true }),
        ),
        (
            "disks[0].discard",
            serde_json::json!({ "path": "/i/a.img", "discard": true }),
        ),
    ] {
        let mut v = serde_json::to_value(spec("firecracker", serde_json::json!([]))).unwrap();
        v["disks"] = serde_json::json!([disk]);
        let s = Spec::parse(p, &serde_json::to_vec(&v).unwrap()).unwrap();
        let e = s
            .validate(p, &"web".parse().unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(&format!(
                "spec {}: field `{field}` is true, but firecracker",
                p.display()
            )),
            "{e}"
        );
    }
    spec(
        "firecracker",
        serde_json::json!([{ "path": "/i/a.img", "direct": false, "discard": false }]),
    );
}

#[test]
fn an_old_spec_round_trips_without_the_new_fields() {
    let s = spec("qemu", serde_json::json!([{ "path": "/i/a.img" }]));
    let text = serde_json::to_string(&s).unwrap();
    assert!(
        !text.contains("direct") && !text.contains("discard"),
        "{text}"
    );
}

// Interfaces: queues (one tap fd each) and vhost-net (root's fds).

fn nic_spec(kind: &str, machine: &str, iface: serde_json::Value) -> Spec {
    let v = serde_json::json!({
        "version": 1, "name": "web",
        "principal": { "user": "vm-web", "group": "vm-web" },
        "hypervisor": { "kind": kind, "binary": "/usr/bin/hv", "machine": machine },
        "vcpus": 2, "memory_mib": 256, "kernel": "/k/vmlinux",
        "interfaces": [iface]
    });
    let p = Path::new("/etc/vmwarden/vms/web.json");
    let s = Spec::parse(p, &serde_json::to_vec(&v).unwrap()).unwrap();
    s.validate(p, &"web".parse().unwrap()).unwrap();
    s
}

fn nic_layout(queues: Vec<i32>, vhost: Vec<i32>) -> Layout {
    Layout {
        tap_fds: vec![5],
        tap_queue_fds: vec![queues],
        vhost_net_fds: vec![vhost],
        ..layout()
    }
}

fn after(a: &[String], key: &str) -> Vec<String> {
    a.iter()
        .zip(a.iter().skip(1))
        .filter(|(k, _)| *k == key)
        .map(|(_, v)| v.clone())
        .collect()
}

#[test]
fn qemu_gets_one_tap_fd_per_queue_and_root_s_vhost_net_fds() {
    let mac = "02:00:00:00:00:07";
    let iface = serde_json::json!({ "tap": "vmw-web0", "mac": mac, "vhost": true, "queues": 2 });
    // q35 (PCI): fds, vhostfds, and the device in multi-queue mode with
    // 2 × 2 + 2 vectors, as microvm.nix's runner.
    let s = nic_spec("qemu", "q35", iface.clone());
    let a = qemu_argv(&s, &nic_layout(vec![6], vec![7, 8]), false);
    assert_eq!(
        after(&a, "-netdev"),
        ["tap,id=net0,fds=5:6,vhost=on,vhostfds=7:8"]
    );
    assert!(
        after(&a, "-device").contains(&format!(
            "virtio-net-pci,netdev=net0,mac={mac},mq=on,vectors=6"
        )),
        "{a:?}"
    );
    // microvm (virtio-mmio): the same fds, no PCI vectors.
    let s = nic_spec("qemu", "microvm", iface);
    let a = qemu_argv(&s, &nic_layout(vec![6], vec![7, 8]), false);
    assert_eq!(
        after(&a, "-netdev"),
        ["tap,id=net0,fds=5:6,vhost=on,vhostfds=7:8"]
    );
    assert!(after(&a, "-device").contains(&format!("virtio-net-device,netdev=net0,mac={mac}")));
    // One queue with vhost: vhostfd; without: vhost=off, as before.
    let one = serde_json::json!({ "tap": "vmw-web0", "mac": mac, "vhost": true });
    let a = qemu_argv(
        &nic_spec("qemu", "q35", one),
        &nic_layout(vec![], vec![7]),
        false,
    );
    assert_eq!(
        after(&a, "-netdev"),
        ["tap,id=net0,fd=5,vhost=on,vhostfd=7"]
    );
    let plain = serde_json::json!({ "tap": "vmw-web0", "mac": mac, "queues": 1, "vhost": false });
    let a = qemu_argv(
        &nic_spec("qemu", "q35", plain),
        &nic_layout(vec![], vec![]),
        false,
    );
    assert_eq!(after(&a, "-netdev"), ["tap,id=net0,fd=5,vhost=off"]);
    assert!(after(&a, "-device").contains(&format!("virtio-net-pci,netdev=net0,mac={mac}")));
}

#[test]
fn cloud_hypervisor_counts_two_queues_per_tap_fd() {
    let mac = "02:00:00:00:00:07";
    let s = nic_spec(
        "cloud-hypervisor",
        "microvm",
        serde_json::json!({ "tap": "vmw-web0", "mac": mac, "queues": 3 }),
    );
    let a = cloud_hypervisor_argv(&s, &nic_layout(vec![6, 9], vec![]));
    assert_eq!(
        after(&a, "--net"),
        [format!("fd=[5,6,9],mac={mac},num_queues=6")]
    );
}

#[test]
fn queues_out_of_range_are_refused_by_field() {
    let p = Path::new("/etc/vmwarden/vms/web.json");
    for q in [0, MAX_QUEUES + 1] {
        let mut v = serde_json::to_value(nic_spec(
            "qemu",
            "q35",
            serde_json::json!({ "tap": "vmw-web0" }),
        ))
        .unwrap();
        v["interfaces"][0]["queues"] = serde_json::json!(q);
        let s = Spec::parse(p, &serde_json::to_vec(&v).unwrap()).unwrap();
        let e = s
            .validate(p, &"web".parse().unwrap())
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            format!("spec {}: field `interfaces[0].queues` is {q}; give 1 to {MAX_QUEUES} (microvm.nix uses one per vCPU)", p.display())
        );
    }
}
