//! Unit tests of the block I/O options `disks[].direct` and
//! `disks[].discard`, as each hypervisor is told (virtiofsd's pool size:
//! `launch/helpers/tests.rs`).

use std::path::Path;

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

fn layout() -> Layout {
    Layout {
        qmp_fd: 3,
        credentials_dir: "/run/vmwarden/web/credentials".into(),
        api_socket: "/run/vmwarden/web/control/api.sock".into(),
        firecracker_config: "/run/vmwarden/web/control/firecracker.json".into(),
        tap_fds: vec![],
        control_dir: "/run/vmwarden/web/control".into(),
        vhost_vsock_fd: None,
    }
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
