//! Unit tests of `unit.rs`.

use super::*;
use std::collections::BTreeMap;

type Parsed = BTreeMap<String, BTreeMap<String, Vec<String>>>;

fn parse(text: &str) -> Parsed {
    let mut out = Parsed::new();
    let mut section = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(s) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = s.to_string();
            continue;
        }
        let (k, v) = line.split_once('=').expect("key=value");
        out.entry(section.clone())
            .or_default()
            .entry(k.to_string())
            .or_default()
            .push(v.to_string());
    }
    out
}

/// A valid spec for VM `web`, as the NixOS module writes it, with
/// `patch` merged over the top level.
fn spec_json(patch: serde_json::Value) -> String {
    let mut v = serde_json::json!({
        "version": 1,
        "name": "web",
        "principal": {"user": "vm-web", "group": "vm-web"},
        "hypervisor": {"kind": "qemu", "binary": "/usr/bin/qemu-system-x86_64",
                       "accel": "kvm", "machine": "microvm"},
        "vcpus": 1,
        "memory_mib": 256,
        "kernel": "/srv/images/vmlinuz",
        "cmdline": "console=ttyS0",
        "credentials": [],
        "disks": [],
        "interfaces": [],
        "landlock": {"mode": "required", "read": [], "write": []},
        "keep_on_purge": ["identity"]
    });
    if let (Some(base), Some(extra)) = (v.as_object_mut(), patch.as_object()) {
        for (k, val) in extra {
            base.insert(k.clone(), val.clone());
        }
    }
    v.to_string()
}

fn spec_file(json: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().expect("temp file");
    std::io::Write::write_all(&mut f, json.as_bytes()).expect("write spec");
    f
}

fn dropin_args(name: &str, spec: &Path) -> RenderUnitArgs {
    RenderUnitArgs {
        dropin: Some(VmName::parse(name).unwrap()),
        spec: Some(spec.to_path_buf()),
        ..RenderUnitArgs::default()
    }
}

#[test]
fn template_has_the_launcher_commands_and_hardening() {
    let text = render_unit(&RenderUnitArgs::default()).expect("render");
    let u = parse(&text);
    let svc = &u["Service"];
    assert_eq!(svc["Type"], ["exec"]);
    assert_eq!(svc["ExecStart"], ["/usr/local/bin/vmwarden-launch %i"]);
    assert_eq!(
        svc["ExecStartPost"],
        ["+/usr/local/bin/vmwarden wait-ready %i"]
    );
    assert_eq!(svc["ExecStop"], ["/usr/local/bin/vmwarden stop %i"]);
    assert_eq!(svc["ExecStopPost"], ["+/usr/local/bin/vmwarden-cleanup %i"]);
    assert_eq!(svc["RestrictNamespaces"], ["mnt ipc"]);
    assert_eq!(svc["DeviceAllow"].len(), 3);
    assert!(
        !svc["DeviceAllow"].iter().any(|d| d.contains("vhost-vsock")),
        "only a VM with the vhost vsock backend gets the device, in its drop-in"
    );
    assert!(!svc.contains_key("MemoryDenyWriteExecute"), "breaks TCG");
    assert!(!svc.contains_key("User"), "the launcher drops privileges");
    assert!(!u.contains_key("Install"));
}

/// The compiled-in unit data, by file name.
const DATA: [(&str, &str); 6] = [
    ("microvm@.service.toml", TEMPLATE_DATA),
    ("vmwarden-reap-report.service.toml", REAP_REPORT_DATA),
    ("vmwarden-metrics.service.toml", METRICS_SERVICE_DATA),
    ("vmwarden-metrics.timer.toml", METRICS_TIMER_DATA),
    ("microvms.target.toml", TARGET_DATA),
    (
        "vmwarden-hibernate-on-shutdown.service.toml",
        HIBERNATE_ON_SHUTDOWN_DATA,
    ),
];

#[test]
fn keys_are_in_nixos_order() {
    // NixOS prints each section's keys in byte order; keeping the same
    // order here makes the two texts comparable line by line.
    for (file, data) in DATA {
        let entries = entries(file, data, Some("/b"), &UnitNames::default_names()).expect(file);
        for section in SECTIONS {
            let keys: Vec<&str> = entries
                .iter()
                .filter(|en| en.0 == section)
                .map(|en| en.1.as_str())
                .collect();
            let mut sorted = keys.clone();
            sorted.sort();
            assert_eq!(keys, sorted, "{file} [{section}] keys out of order");
        }
    }
}

#[test]
fn every_key_in_the_data_says_why() {
    for (file, data) in DATA {
        let mut previous = "";
        for line in data.lines() {
            let is_key = line.contains(" = ") && !line.starts_with('#') && !line.starts_with('[');
            assert!(
                !is_key || previous.starts_with("# "),
                "{file}: `{line}` has no comment line above it saying why"
            );
            previous = line;
        }
    }
}

#[test]
fn one_changed_key_in_the_data_changes_the_unit() {
    let edited = TEMPLATE_DATA.replace("TimeoutStopSec = 150", "TimeoutStopSec = 151");
    assert_ne!(edited, TEMPLATE_DATA);
    let before = entries("t", TEMPLATE_DATA, Some("/b"), &UnitNames::default_names())
        .expect("compiled-in data");
    let after =
        entries("t", &edited, Some("/b"), &UnitNames::default_names()).expect("edited data");
    let changed: Vec<_> = before.iter().zip(&after).filter(|(a, b)| a != b).collect();
    assert_eq!(before.len(), after.len());
    assert_eq!(changed.len(), 1, "{changed:?}");
    assert_eq!(changed[0].1 .1, "TimeoutStopSec");
    assert_eq!(changed[0].1 .2, "151");
}

#[test]
fn data_of_the_wrong_shape_is_refused() {
    for (text, want) in [
        ("[Unit]\nA = 1.5\n", "A: float"),
        ("[Unit]\nA = [[1]]\n", "A: array"),
        ("[Unit]\nA = {b = 1}\n", "A: table"),
        ("[Socket]\nA = 1\n", "[Socket]"),
        ("A = 1\n", "[A]"),
        ("[Service]\nExecStart = \"@bin@/x\"\n", "@bin@ has no value"),
        ("[Unit\n", "f.toml"),
    ] {
        let err = entries("f.toml", text, None, &UnitNames::default_names())
            .expect_err(text)
            .to_string();
        assert!(err.contains(want), "{text:?}: {err}");
        assert!(err.contains("f.toml"), "{text:?}: {err}");
    }
    let ok = entries(
        "f.toml",
        "[Service]\nA = [\"x\", 2, true]\n",
        None,
        &UnitNames::default_names(),
    )
    .expect("list");
    let values: Vec<&str> = ok.iter().map(|en| en.2.as_str()).collect();
    assert_eq!(values, ["x", "2", "true"]);
}

#[test]
fn units_dir_replaces_the_compiled_in_data() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        dir.path().join("microvms.target.toml"),
        TARGET_DATA.replace("vmwarden microVMs", "edited"),
    )
    .expect("write");
    let args = RenderUnitArgs {
        target: true,
        units_dir: Some(dir.path().to_path_buf()),
        ..RenderUnitArgs::default()
    };
    let t = parse(&render_unit(&args).expect("render"));
    assert_eq!(t["Unit"]["Description"], ["edited"]);
    let err = render_unit(&RenderUnitArgs {
        target: false,
        ..args
    })
    .expect_err("no microvm@.service.toml there");
    assert!(err.to_string().contains("microvm@.service.toml"), "{err}");
}

#[test]
fn bin_dir_is_used_and_checked() {
    let args = RenderUnitArgs {
        bin_dir: PathBuf::from("/opt/vmwarden/bin/"),
        ..RenderUnitArgs::default()
    };
    let text = render_unit(&args).expect("render");
    assert!(text.contains("ExecStart=/opt/vmwarden/bin/vmwarden-launch %i\n"));
    for bad in ["relative/bin", "/with space", "/per%cent", "/a/../b"] {
        let args = RenderUnitArgs {
            bin_dir: PathBuf::from(bad),
            ..RenderUnitArgs::default()
        };
        let err = render_unit(&args).expect_err(bad);
        assert!(err.to_string().contains(bad), "{err}");
    }
}

#[test]
fn the_prefix_names_the_template_and_the_target_everywhere() {
    let d = UnitNames::default_names();
    assert_eq!(
        (d.template().as_str(), d.target()),
        ("microvm@.service", "microvms.target")
    );
    let v = UnitNames::for_prefix("vmwarden").expect("listed");
    assert_eq!(
        (v.template().as_str(), v.target()),
        ("vmwarden@.service", "vmwarden-vms.target")
    );
    assert_eq!(UnitNames::prefixes(), ["microvm", "vmwarden"]);
    let with = |prefix: &str, target: bool, reap_report: bool| {
        render_unit(&RenderUnitArgs {
            prefix: prefix.to_string(),
            target,
            reap_report,
            ..RenderUnitArgs::default()
        })
    };
    let t = with("vmwarden", false, false).expect("render");
    let u = parse(&t);
    assert_eq!(u["Unit"]["Before"], ["vmwarden-vms.target"]);
    assert_eq!(u["Unit"]["PartOf"], ["vmwarden-vms.target"]);
    assert_eq!(u["Service"]["SyslogIdentifier"], ["vmwarden@%i"]);
    assert!(t.starts_with("# vmwarden@.service:"), "{t}");
    // No name of microvm.nix's (microvm@, microvms.target) is left in
    // any unit rendered with the other prefix, comments included.
    for text in [
        t,
        with("vmwarden", true, false).expect("target"),
        with("vmwarden", false, true).expect("reap report"),
    ] {
        assert!(!text.contains("microvm@"), "{text}");
        assert!(!text.contains("microvms.target"), "{text}");
    }
    let r = parse(&with("vmwarden", false, true).expect("reap report"));
    assert_eq!(r["Unit"]["Before"], ["vmwarden-vms.target"]);
    let m = parse(&with("microvm", false, false).expect("render"));
    assert_eq!(m["Unit"]["PartOf"], ["microvms.target"]);
    assert_eq!(m["Service"]["SyslogIdentifier"], ["microvm@%i"]);
    let err = with("microvms", false, false).expect_err("unknown prefix");
    assert!(
        err.to_string().contains("\"microvms\"") && err.to_string().contains("microvm, vmwarden"),
        "{err}"
    );
}

#[test]
fn target_and_reap_report() {
    let t = parse(
        &render_unit(&RenderUnitArgs {
            target: true,
            ..RenderUnitArgs::default()
        })
        .expect("render"),
    );
    assert_eq!(t["Install"]["WantedBy"], ["multi-user.target"]);
    let r = parse(
        &render_unit(&RenderUnitArgs {
            reap_report: true,
            ..RenderUnitArgs::default()
        })
        .expect("render"),
    );
    assert_eq!(r["Service"]["ExecStart"], ["/usr/local/bin/vmwarden reap"]);
    assert_eq!(r["Service"]["Type"], ["oneshot"]);
}

#[test]
fn dropin_loads_systemd_credentials_and_opens_writable_paths() {
    let f = spec_file(&spec_json(serde_json::json!({
        "credentials": [{"name": "db", "source": {"systemd": "db"}},
                        {"name": "tok", "source": {"path": "/run/secrets/tok"}}],
        "disks": [{"path": "/var/lib/vmwarden/web/root.img", "read_only": false},
                  {"path": "/srv/ro.img", "read_only": true}],
        "landlock": {"mode": "required", "read": [], "write": ["/srv/scratch"]}
    })));
    let text = render_unit(&dropin_args("web", f.path())).expect("render");
    let u = parse(&text);
    assert_eq!(
        u["Service"]["LoadCredential"],
        ["db:/etc/vmwarden/credentials/web/db"]
    );
    assert_eq!(
        u["Service"]["ReadWritePaths"],
        ["-/var/lib/vmwarden/web/root.img", "-/srv/scratch"]
    );
    assert!(!u.contains_key("Unit"));
}

#[test]
fn dropin_grants_net_admin_and_netlink_only_to_vms_with_interfaces() {
    let plain = parse(
        &render_unit(&dropin_args(
            "web",
            spec_file(&spec_json(serde_json::json!({}))).path(),
        ))
        .expect("render"),
    );
    let svc = plain.get("Service").cloned().unwrap_or_default();
    assert!(!svc.contains_key("CapabilityBoundingSet"));
    assert!(!svc.contains_key("RestrictAddressFamilies"));
    let f = spec_file(&spec_json(serde_json::json!({
        "interfaces": [{"tap": "vmw-web0", "bridge": "br0", "mac": "02:00:00:00:00:01"}]
    })));
    let u = parse(&render_unit(&dropin_args("web", f.path())).expect("render"));
    assert_eq!(u["Service"]["CapabilityBoundingSet"], ["CAP_NET_ADMIN"]);
    assert_eq!(u["Service"]["RestrictAddressFamilies"], ["AF_NETLINK"]);
    assert!(!u["Service"].contains_key("RestrictNamespaces"));
}

#[test]
fn dropin_lets_only_a_vm_with_a_macvtap_open_macvtap_devices() {
    let f = spec_file(&spec_json(serde_json::json!({
        "interfaces": [{"tap": "vmw-web0", "bridge": "br0"}]
    })));
    let u = parse(&render_unit(&dropin_args("web", f.path())).expect("render"));
    assert!(!u["Service"].contains_key("DeviceAllow"));
    let f = spec_file(&spec_json(serde_json::json!({
        "interfaces": [{"tap": "vmw-web0", "type": "macvtap",
                        "macvtap": {"link": "enp3s0", "mode": "bridge"}}]
    })));
    let u = parse(&render_unit(&dropin_args("web", f.path())).expect("render"));
    assert_eq!(u["Service"]["DeviceAllow"], ["char-macvtap rw"]);
    assert_eq!(u["Service"]["CapabilityBoundingSet"], ["CAP_NET_ADMIN"]);
    assert_eq!(u["Service"]["RestrictAddressFamilies"], ["AF_NETLINK"]);
}

#[test]
fn dropin_gives_a_usb_device_s_vm_its_node_and_libusb_s_uevent_socket() {
    let usb = serde_json::json!([{ "bus": "usb", "path": "vendorid=0x0627,productid=0x0001" }]);
    let mut v: serde_json::Value =
        serde_json::from_str(&spec_json(serde_json::json!({ "devices": usb }))).unwrap();
    v["hypervisor"]["machine"] = serde_json::json!("q35");
    let f = spec_file(&v.to_string());
    let u = parse(&render_unit(&dropin_args("web", f.path())).expect("render"));
    assert_eq!(u["Service"]["DeviceAllow"], ["char-usb_device rw"]);
    assert_eq!(u["Service"]["RestrictAddressFamilies"], ["AF_NETLINK"]);
    assert!(!u["Service"].contains_key("CapabilityBoundingSet"));
    // With a tap too: one RestrictAddressFamilies=AF_NETLINK.
    v["interfaces"] = serde_json::json!([{"tap": "vmw-web0", "bridge": "br0"}]);
    let f = spec_file(&v.to_string());
    let u = parse(&render_unit(&dropin_args("web", f.path())).expect("render"));
    assert_eq!(u["Service"]["RestrictAddressFamilies"], ["AF_NETLINK"]);
}

#[test]
fn dropin_lets_firecracker_with_interfaces_make_its_network_namespace() {
    let fc = |extra: serde_json::Value| {
        let mut v: serde_json::Value = serde_json::from_str(&spec_json(extra)).unwrap();
        v["hypervisor"] = serde_json::json!({
            "kind": "firecracker", "binary": "/usr/bin/firecracker", "accel": "kvm"
        });
        let f = spec_file(&v.to_string());
        parse(&render_unit(&dropin_args("web", f.path())).expect("render"))
    };
    let u = fc(serde_json::json!({"interfaces": [{"tap": "vmw-web0", "bridge": "br0"}]}));
    assert_eq!(u["Service"]["RestrictNamespaces"], ["net"]);
    let u = fc(serde_json::json!({}));
    let svc = u.get("Service").cloned().unwrap_or_default();
    assert!(!svc.contains_key("RestrictNamespaces"));
}

#[test]
fn dropin_lets_a_vm_with_a_multi_queue_tap_make_it_apart_in_a_network_namespace() {
    let dropin = |v: serde_json::Value| {
        let f = spec_file(&spec_json(v));
        parse(&render_unit(&dropin_args("web", f.path())).expect("render"))
    };
    // One queue, or a macvtap of several: no namespace.
    for ifs in [
        serde_json::json!([{"tap": "vmw-web0", "bridge": "br0", "queues": 1}]),
        serde_json::json!([{"tap": "vmw-web0", "type": "macvtap", "queues": 2,
                            "macvtap": {"link": "enp3s0", "mode": "bridge"}}]),
    ] {
        let u = dropin(serde_json::json!({"vcpus": 2, "interfaces": ifs}));
        assert!(!u["Service"].contains_key("RestrictNamespaces"), "{u:?}");
    }
    let u = dropin(serde_json::json!({"vcpus": 2, "interfaces": [
        {"tap": "vmw-web0", "bridge": "br0"},
        {"tap": "vmw-web1", "bridge": "br0", "queues": 2}
    ]}));
    assert_eq!(u["Service"]["RestrictNamespaces"], ["net"]);
    // With passt's namespaces too: both lines (modules/lib.nix keeps both).
    let u = dropin(serde_json::json!({"vcpus": 2,
        "interfaces": [{"tap": "vmw-web0", "queues": 2}],
        "user_network": {"binary": "/usr/bin/passt", "id": "qemu"}
    }));
    assert_eq!(u["Service"]["RestrictNamespaces"], ["net", "user uts pid"]);
}

#[test]
fn dropin_restarts_firecracker_and_cloud_hypervisor_with_virtiofs_after_their_own_exit_only() {
    // QEMU and cloud-hypervisor reset the machine in place on a guest
    // reboot, and end only on a poweroff, which must leave the VM off.
    for kind in ["qemu", "cloud-hypervisor"] {
        let mut patch = serde_json::json!({
            "hypervisor": {"kind": kind, "binary": "/usr/bin/hv"}
        });
        if kind == "qemu" {
            patch["hypervisor"]["accel"] = "kvm".into();
            patch["hypervisor"]["machine"] = "microvm".into();
        }
        let f = spec_file(&spec_json(patch));
        let u = parse(&render_unit(&dropin_args("web", f.path())).expect("render"));
        let svc = u.get("Service").cloned().unwrap_or_default();
        assert!(
            !svc.contains_key("RestartForceExitStatus"),
            "{kind}: {svc:?}"
        );
    }
    // firecracker ends on a guest reboot: its exit with 0 restarts it.
    let f = spec_file(&spec_json(serde_json::json!({
        "hypervisor": {"kind": "firecracker", "binary": "/usr/bin/firecracker"}
    })));
    let u = parse(&render_unit(&dropin_args("web", f.path())).expect("render"));
    assert_eq!(u["Service"]["RestartForceExitStatus"], ["0"]);
    // cloud-hypervisor with a virtiofs share cannot reboot in place: its
    // reboot-watch's SIGHUP (a clean exit) restarts it.
    let f = spec_file(&spec_json(serde_json::json!({
        "hypervisor": {"kind": "cloud-hypervisor", "binary": "/usr/bin/hv"},
        "shares": [{"tag": "store", "source": "/nix/store", "proto": "virtiofs", "read_only": true}],
        "virtiofsd": {"binary": "/usr/libexec/virtiofsd"}
    })));
    let u = parse(&render_unit(&dropin_args("web", f.path())).expect("render"));
    assert_eq!(u["Service"]["RestartForceExitStatus"], ["SIGHUP"]);
    // The template's own policy is unchanged: a crash restarts, a refused
    // spec does not, a clean exit does not.
    let t = parse(&render_unit(&RenderUnitArgs::default()).expect("render"));
    assert_eq!(t["Service"]["Restart"], ["on-failure"]);
    assert_eq!(t["Service"]["RestartPreventExitStatus"], ["78"]);
    assert!(!t["Service"].contains_key("RestartForceExitStatus"));
}

#[test]
fn dropin_lets_only_a_user_network_vm_open_ip_sockets_and_passts_namespaces() {
    let plain = parse(
        &render_unit(&dropin_args(
            "web",
            spec_file(&spec_json(serde_json::json!({}))).path(),
        ))
        .expect("render"),
    );
    let svc = plain.get("Service").cloned().unwrap_or_default();
    for key in ["IPAddressAllow", "RestrictNamespaces"] {
        assert!(!svc.contains_key(key), "{key}");
    }
    // With taps too: one RestrictAddressFamilies= that covers both.
    let f = spec_file(&spec_json(serde_json::json!({
        "interfaces": [{"tap": "vmw-web0"}],
        "user_network": {"binary": "/usr/bin/passt", "id": "qemu"}
    })));
    let u = parse(&render_unit(&dropin_args("web", f.path())).expect("render"));
    assert_eq!(u["Service"]["IPAddressAllow"], ["any"]);
    assert_eq!(
        u["Service"]["RestrictAddressFamilies"],
        ["AF_INET AF_INET6 AF_NETLINK"]
    );
    assert_eq!(u["Service"]["RestrictNamespaces"], ["user uts pid"]);
    assert_eq!(u["Service"]["CapabilityBoundingSet"], ["CAP_NET_ADMIN"]);
}

#[test]
fn dropin_refuses_what_the_launcher_refuses() {
    let cases: Vec<(String, &str)> = vec![
        ("{".to_string(), "not valid"),
        (spec_json(serde_json::json!({"name": "db"})), "field `name`"),
        (spec_json(serde_json::json!({"bogus": 1})), "bogus"),
        (
            spec_json(serde_json::json!({"credentials": [
                {"name": "abcdefghijklmnopqrstuvwxyz0123", "source": {"systemd": "x"}}]})),
            "credentials",
        ),
        (
            spec_json(serde_json::json!({"disks": [{"path": "rel.img"}]})),
            "disks[0].path",
        ),
        (
            spec_json(serde_json::json!({"disks": [{"path": "/a b.img"}]})),
            "disks[0].path",
        ),
        (
            spec_json(serde_json::json!({"landlock": {"mode": "required", "write": ["/x%y"]}})),
            "landlock.write[0]",
        ),
    ];
    for (json, want) in &cases {
        let f = spec_file(json);
        let err = render_unit(&dropin_args("web", f.path())).expect_err(json);
        let msg = err.to_string();
        assert!(msg.contains(want), "{json}: {msg}");
        assert!(
            msg.contains(&f.path().display().to_string()),
            "{json}: {msg}"
        );
    }
}

#[test]
fn dropin_checks_the_name_and_reports_missing_spec() {
    // The name is checked where it is parsed: `--dropin Bad_Name` never
    // becomes a `RenderUnitArgs` (tests/names.rs runs the binary).
    let err = "Bad_Name".parse::<VmName>().expect_err("bad name");
    assert!(err.to_string().contains("^[a-z][a-z0-9-]{0,31}$"), "{err}");
    let err = render_unit(&RenderUnitArgs {
        dropin: Some(VmName::parse("web").unwrap()),
        config_dir: Some(PathBuf::from("/nonexistent/vmwarden/vms")),
        ..RenderUnitArgs::default()
    })
    .expect_err("missing spec");
    assert!(
        err.to_string()
            .contains("/nonexistent/vmwarden/vms/web.json"),
        "{err}"
    );
}

#[test]
fn unit_safe_paths() {
    assert!(unit_safe_path("/var/lib/vmwarden/web/root.img"));
    assert!(unit_safe_path("/"));
    for bad in [
        "rel", "/a b", "/a%i", "/a\"b", "/a\\b", "/a//b", "/a/", "/a/./b", "/a/../b",
    ] {
        assert!(!unit_safe_path(bad), "{bad}");
    }
}

#[test]
fn the_metrics_units_take_the_textfile_directory_and_the_interval() {
    let args = |metrics, dir: &str, interval: &str| RenderUnitArgs {
        metrics: Some(metrics),
        textfile_dir: dir.into(),
        interval: interval.into(),
        bin_dir: "/opt/vmwarden/bin".into(),
        ..RenderUnitArgs::default()
    };
    let service = render_unit(&args(MetricsUnit::Service, "/srv/textfiles", "1min")).unwrap();
    assert!(
        service.contains(
            "ExecStart=/opt/vmwarden/bin/vmwarden metrics --output /srv/textfiles/vmwarden.prom\n"
        ) && service.contains("ReadWritePaths=/srv/textfiles\n"),
        "{service}"
    );
    let timer = render_unit(&args(MetricsUnit::Timer, "/srv/textfiles", "1min")).unwrap();
    assert!(
        timer
            .contains("[Timer]\nAccuracySec=1s\nOnBootSec=1min\nOnUnitActiveSec=1min\n\n[Install]"),
        "{timer}"
    );
    for bad in ["", "0s", "30", "1 min", "5m", "%s"] {
        assert!(!valid_interval(bad), "{bad:?}");
        render_unit(&args(MetricsUnit::Timer, "/srv", bad)).unwrap_err();
    }
    render_unit(&args(MetricsUnit::Service, "/srv/a b", "30s")).unwrap_err();
}

#[test]
fn dropin_puts_the_specs_limits_on_the_unit_and_refuses_bad_ones() {
    let f = spec_file(&spec_json(serde_json::json!({
        "resources": {"cpu_quota_percent": 150, "cpu_weight": 50, "memory_max_mib": 768,
                      "memory_high_mib": 640, "io_weight": 20, "tasks_max": 256, "cpus": "2-3"}
    })));
    let u = parse(&render_unit(&dropin_args("web", f.path())).expect("render"));
    let svc = &u["Service"];
    for (k, v) in [
        ("AllowedCPUs", "2-3"),
        ("CPUAffinity", "2-3"),
        ("CPUQuota", "150%"),
        ("CPUWeight", "50"),
        ("IOWeight", "20"),
        ("MemoryHigh", "640M"),
        ("MemoryMax", "768M"),
        ("TasksMax", "256"),
    ] {
        assert_eq!(svc[k], [v], "{k}");
    }
    let plain = spec_file(&spec_json(serde_json::json!({})));
    let u = parse(&render_unit(&dropin_args("web", plain.path())).expect("render"));
    assert!(!u
        .get("Service")
        .is_some_and(|s| s.contains_key("MemoryMax")));
    let bad = spec_file(&spec_json(serde_json::json!({
        "resources": {"memory_max_mib": 256, "memory_high_mib": 512}
    })));
    let e = render_unit(&dropin_args("web", bad.path())).unwrap_err();
    assert!(e.to_string().contains("resources.memory_high_mib"), "{e}");
}

#[test]
fn the_shutdown_unit_hibernates_at_stop_and_starts_at_boot() {
    let text = render_unit(&RenderUnitArgs {
        hibernate_on_shutdown: true,
        hibernate_timeout: 120,
        prefix: "vmwarden".into(),
        ..RenderUnitArgs::default()
    })
    .expect("renders");
    for line in [
        "ExecStop=/usr/local/bin/vmwarden hibernate-all --timeout 120",
        "ExecStart=/usr/local/bin/vmwarden start-hibernated --prefix vmwarden",
        "After=local-fs.target dbus.service vmwarden-vms.target",
        "X-StopOnRemoval=false",
        "RemainAfterExit=true",
        "WantedBy=multi-user.target",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "{line} missing in:\n{text}"
        );
    }
    for placeholder in ["@timeout@", "@bin@", "@prefix@", "@target@"] {
        assert!(
            !text.contains(placeholder),
            "{placeholder} left in:\n{text}"
        );
    }
}
