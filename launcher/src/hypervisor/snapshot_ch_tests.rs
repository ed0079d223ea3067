//! Unit tests of `snapshot_ch.rs`.

use super::*;
use crate::config::spec::{HypervisorKind, InterfaceSpec};
use crate::hypervisor::hibernate_chfc::ch_restore_argv;
use crate::hypervisor::tests::{layout, spec};
use serde_json::json;

fn ch_spec() -> Spec {
    let mut s = spec();
    s.hypervisor.kind = HypervisorKind::CloudHypervisor;
    s.hypervisor.binary = "/bin/cloud-hypervisor".into();
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

/// A `config.json` as cloud-hypervisor v53 writes it for `ch_spec()`
/// (fields it always writes, trimmed to the ones that name anything).
fn config() -> serde_json::Value {
    json!({
        "cpus": { "boot_vcpus": 2, "max_vcpus": 2, "nested": true },
        "memory": { "size": 536870912u64, "shared": false, "hugepages": false },
        "payload": { "kernel": "/k/bzImage", "initramfs": "/k/initrd", "cmdline": "console=ttyS0 quiet", "firmware": null },
        "rng": { "src": "/dev/urandom" },
        "disks": [
            { "path": "/var/lib/vmwarden/web/root.img", "readonly": false, "vhost_user": false, "vhost_socket": null, "id": "_disk0" },
            { "path": "/data/a,b.img", "readonly": true, "vhost_user": false, "vhost_socket": null, "id": "_disk1" }
        ],
        "net": [
            { "tap": null, "ip": "192.168.249.1", "mac": "02:00:00:00:00:01", "vhost_user": false, "vhost_socket": null, "id": "_net2", "fds": [-1] }
        ],
        "serial": { "file": null, "mode": "Tty", "socket": null },
        "console": { "file": null, "mode": "Off", "socket": null },
        "fs": null, "pmem": null, "vsock": null, "devices": null, "user_devices": null
    })
}

fn check_of(s: &Spec, v: &serde_json::Value) -> Result<Checked, ConfigError> {
    check(
        s,
        &layout(),
        "/state/web/snap/config.json",
        &serde_json::to_vec(v).unwrap(),
    )
}

#[test]
fn a_snapshot_of_the_same_spec_passes_and_gives_its_net_ids() {
    let c = check_of(&ch_spec(), &config()).unwrap();
    assert_eq!(c.net_ids, vec!["_net2".to_string()]);
}

#[test]
fn a_disk_path_that_differs_is_refused_by_field_and_file() {
    // The corruption case: the spec now names another disk at index 0.
    let mut s = ch_spec();
    s.disks[0].path = "/var/lib/vmwarden/web/other.img".into();
    let e = check_of(&s, &config()).unwrap_err().to_string();
    assert!(e.starts_with("/state/web/snap/config.json: "), "{e}");
    assert!(
        e.contains(r#"disks[0].path: the snapshot has "/var/lib/vmwarden/web/root.img", the spec now gives "/var/lib/vmwarden/web/other.img""#),
        "{e}"
    );
    // A disk removed from the spec: the snapshot's second one is named.
    let mut s = ch_spec();
    s.disks.pop();
    let e = check_of(&s, &config()).unwrap_err().to_string();
    assert!(
        e.contains(
            r#"disks[1].path: the snapshot has "/data/a,b.img", the spec now gives nothing"#
        ),
        "{e}"
    );
}

#[test]
fn a_tap_by_name_a_socket_or_a_path_in_an_unknown_field_is_refused() {
    let mut v = config();
    v["net"][0]["tap"] = json!("vmw-other0");
    let e = check_of(&ch_spec(), &v).unwrap_err().to_string();
    assert!(
        e.contains(r#"net[0].tap: the snapshot has "vmw-other0""#),
        "{e}"
    );
    let mut v = config();
    v["vsock"] = json!({ "cid": 3, "socket": "/run/vmwarden/other/control/vsock.sock" });
    let e = check_of(&ch_spec(), &v).unwrap_err().to_string();
    assert!(e.contains("vsock.socket: the snapshot has"), "{e}");
    let mut v = config();
    v["pmem"] = json!([{ "file": "/var/lib/vmwarden/other/pmem.img" }]);
    let e = check_of(&ch_spec(), &v).unwrap_err().to_string();
    assert!(
        e.contains(
            r#"/pmem/0/file: the snapshot names the host path "/var/lib/vmwarden/other/pmem.img""#
        ),
        "{e}"
    );
    let mut v = config();
    v["serial"] = json!({ "mode": "File", "file": "/etc/passwd" });
    let e = check_of(&ch_spec(), &v).unwrap_err().to_string();
    assert!(
        e.contains(r#"serial.mode: the snapshot has "File", the spec now gives "Tty""#),
        "{e}"
    );
    assert!(e.contains("/serial/file"), "{e}");
}

#[test]
fn a_file_the_spec_gives_reused_by_a_device_it_does_not_give_is_refused() {
    // The VM's own disk as a pmem device too, or as the file behind a
    // memory zone: every path is one the spec gives, so a plain
    // "allowed path" check lets the extra device through; the spec gives
    // each path once.
    let disk = "/var/lib/vmwarden/web/root.img";
    for (key, extra) in [
        ("pmem", json!([{ "file": disk, "discard_writes": false }])),
        (
            "memory",
            json!({ "size": 0, "zones": [{ "id": "z", "file": disk, "shared": true }] }),
        ),
        (
            "landlock_rules",
            json!([{ "path": "/k/bzImage", "access": "rw" }]),
        ),
    ] {
        let mut v = config();
        v[key] = extra;
        let e = check_of(&ch_spec(), &v).unwrap_err().to_string();
        assert!(
            e.contains("once more than the spec gives it (a device the spec does not give)"),
            "{key}: {e}"
        );
    }
    // A relative path is resolved against the state directory (where
    // the principal can plant a symlink): refused like an absolute one.
    let mut v = config();
    v["pmem"] = json!([{ "file": "../other/root.img" }]);
    let e = check_of(&ch_spec(), &v).unwrap_err().to_string();
    assert!(
        e.contains(r#"/pmem/0/file: the snapshot names the host path "../other/root.img""#),
        "{e}"
    );
    // The untouched snapshot still passes.
    check_of(&ch_spec(), &config()).unwrap();
}

#[test]
fn a_net_id_that_would_add_restore_options_is_refused_and_never_passed() {
    // cloud-hypervisor takes the last `source_url` of `--restore`: a net
    // id closing the `net_fds` list would restore another directory,
    // whose config.json nobody checked.
    let evil = "_net2@[7]],source_url=file:///state/web/evil,net_fds=[_net2";
    let mut v = config();
    v["net"][0]["id"] = json!(evil);
    let e = check_of(&ch_spec(), &v).unwrap_err().to_string();
    assert!(
        e.contains("net[0].id") && e.contains("would be read as options of --restore"),
        "{e}"
    );
    let boot: Vec<String> = ["/bin/ch", "--net", "fd=[7],mac=02:00:00:00:00:01"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let a = ch_restore_argv(
        &boot,
        Path::new("/state/web/.vmwarden-hibernate"),
        &[evil.to_string()],
    );
    let mut l = layout();
    l.tap_fds = vec![7];
    l.tap_queue_fds = vec![vec![]];
    let checked = Checked {
        net_ids: vec![evil.to_string()],
    };
    let b = restore_argv(
        &ch_spec(),
        &l,
        Path::new("/state/web/.vmwarden-hibernate"),
        &checked,
    );
    for argv in [a, b] {
        let restore = argv.last().unwrap();
        assert_eq!(restore.matches("source_url=").count(), 1, "{restore}");
        assert!(restore.contains("net_fds=[_net0@[7]]"), "{restore}");
    }
    assert!(plain_id("_net2") && plain_id("eth-0") && !plain_id("") && !plain_id("a,b"));
}

#[test]
fn garbage_is_refused_by_file() {
    let e = check(&ch_spec(), &layout(), "/s/config.json", b"\x00not json")
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("/s/config.json: not cloud-hypervisor's snapshot configuration"),
        "{e}"
    );
}

#[test]
fn the_restore_argv_has_no_vm_option_and_hands_the_taps_under_the_snapshots_ids() {
    let mut l = layout();
    l.tap_fds = vec![7];
    l.tap_queue_fds = vec![vec![8]];
    l.event_monitor_fd = Some(9);
    let checked = Checked {
        net_ids: vec!["_net2".into()],
    };
    let a = restore_argv(&ch_spec(), &l, Path::new("/state/web/.snap"), &checked);
    assert_eq!(
        a,
        vec![
            "/bin/cloud-hypervisor",
            "--api-socket",
            "path=/run/vmwarden/web/control/api.sock",
            "--event-monitor",
            "fd=9",
            "--seccomp",
            "true",
            "--restore",
            "source_url=file:///state/web/.snap,prefault=on,net_fds=[_net2@[7,8]],resume=true",
        ]
    );
}

#[test]
fn bodies_and_refusals() {
    assert_eq!(
        snapshot_body(Path::new("/s/d")),
        r#"{"destination_url":"file:///s/d"}"#
    );
    let mut s = ch_spec();
    assert!(refused_fields(&s).is_empty());
    s.hugepage_mem = true;
    assert_eq!(refused_fields(&s), vec!["hugepage_mem"]);
}
