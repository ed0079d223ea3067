//! Unit tests of `launch/helpers.rs`.

use super::*;
use crate::config::spec::{Spec, SpecError, ThreadPoolSize, MAX_THREAD_POOL};

fn spec(v: serde_json::Value) -> Spec {
    Spec::parse(
        Path::new("/etc/vmwarden/vms/web.json"),
        &serde_json::to_vec(&v).unwrap(),
    )
    .unwrap()
}

#[test]
fn one_virtiofsd_per_virtiofs_share_and_the_vsock_daemon_for_qemu_only() {
    let mut v = serde_json::json!({
        "version": 1, "name": "web",
        "principal": { "uid": 61001, "gid": 61001 },
        "hypervisor": { "kind": "qemu", "binary": "/usr/bin/hv" },
        "vcpus": 1, "memory_mib": 256, "kernel": "/boot/vmlinuz",
        "shares": [
            { "tag": "ro", "source": "/srv/ro", "proto": "virtiofs", "read_only": true },
            { "tag": "p9", "source": "/srv/p9", "proto": "9p" },
            { "tag": "rw", "source": "/srv/rw", "proto": "virtiofs" }
        ],
        "virtiofsd": { "binary": "/usr/libexec/virtiofsd" },
        "vsock": { "cid": 5, "backend": "user", "binary": "/usr/bin/vhost-device-vsock" }
    });
    let control = Path::new("/run/vmwarden/web/control");
    let got = plan(&spec(v.clone()), control);
    let names: Vec<_> = got.iter().map(Helper::name).collect();
    assert_eq!(
        names,
        [
            "virtiofsd for share `ro`",
            "virtiofsd for share `rw`",
            "vhost-device-vsock"
        ]
    );
    assert_eq!(
        got[0].argv(Some(9)),
        [
            "/usr/libexec/virtiofsd",
            "--fd=9",
            "--shared-dir=/",
            "--sandbox=none",
            "--xattr",
            "--posix-acl",
            "--inode-file-handles=never",
            "--readonly"
        ]
    );
    assert!(!got[1].argv(Some(9)).contains(&"--readonly".to_string()));
    assert_eq!(
        got[2].argv(None),
        [
            "/usr/bin/vhost-device-vsock",
            "--guest-cid=5",
            "--socket=/run/vmwarden/web/control/vsock-vhost-user.sock",
            "--uds-path=/run/vmwarden/web/control/vsock.sock"
        ]
    );
    // Each domain: its own share only; the control dir for vsock only.
    let trees = [
        PathBuf::from("/var/lib/vmwarden/web"),
        control.to_path_buf(),
    ];
    let p = got[0].policy(control, &trees);
    assert!(p.rules.iter().any(|r| r.path == Path::new("/srv/ro")
        && r.grant == landlock::Grant::Read
        && r.field.as_deref() == Some("shares[0].source")));
    assert!(!p
        .rules
        .iter()
        .any(|r| r.path.starts_with("/srv/rw") || r.path == control));
    let p = got[1].policy(control, &trees);
    assert!(p
        .rules
        .iter()
        .any(|r| r.path == Path::new("/srv/rw") && r.grant == landlock::Grant::Write));
    let p = got[2].policy(control, &trees);
    assert!(p
        .rules
        .iter()
        .any(|r| r.path == control && r.grant == landlock::Grant::Socket));
    assert!(!p.rules.iter().any(|r| r.path.starts_with("/srv")));

    // cloud-hypervisor serves its hybrid vsock itself (its other helper,
    // reboot-watch, is for the share's reboots).
    v["hypervisor"]["kind"] = serde_json::json!("cloud-hypervisor");
    v["hypervisor"]["accel"] = serde_json::json!("kvm");
    v["shares"] = serde_json::json!([{ "tag": "rw", "source": "/srv/rw", "proto": "virtiofs" }]);
    v["vsock"] = serde_json::json!({ "cid": 5, "backend": "user" });
    let got = plan(&spec(v), control);
    let kinds: Vec<_> = got.iter().map(|h| h.kind).collect();
    assert_eq!(kinds, [HelperKind::Virtiofsd, HelperKind::RebootWatch]);
}

#[test]
fn the_table_is_in_the_kinds_order_with_one_entry_each() {
    for (i, s) in TABLE.iter().enumerate() {
        assert_eq!(s.kind as usize, i, "{}", s.name);
        assert!(std::ptr::eq(s.kind.shape(), s));
    }
    let mut names: Vec<_> = TABLE.iter().map(|s| s.name).collect();
    names.dedup();
    assert_eq!(names.len(), TABLE.len());
}

#[test]
fn passt_gets_one_end_of_a_pair_its_forwards_and_a_domain_without_files() {
    let v = serde_json::json!({
        "version": 1, "name": "web",
        "principal": { "uid": 61001, "gid": 61001 },
        "hypervisor": { "kind": "qemu", "binary": "/usr/bin/hv" },
        "vcpus": 1, "memory_mib": 256, "kernel": "/boot/vmlinuz",
        "user_network": {
            "binary": "/usr/bin/passt", "id": "qemu",
            "forward_ports": [
                { "host": { "port": 2222 }, "guest": { "port": 22 } },
                { "proto": "udp", "host": { "port": 5353 }, "guest": { "port": 53 } }
            ]
        }
    });
    let control = Path::new("/run/vmwarden/web/control");
    let got = plan(&spec(v), control);
    assert_eq!(got.len(), 1);
    let p = &got[0];
    assert_eq!(p.name(), "passt for interface `qemu`");
    assert_eq!(p.shape().channel, Channel::Pair);
    assert_eq!(p.shape().filter, Filter::SelfSandboxing);
    assert!(p.sockets.is_empty() && p.socket().is_none());
    let argv = p.argv(Some(7));
    assert_eq!(argv[..3], ["/usr/bin/passt", "--fd=7", "--foreground"]);
    assert!(argv
        .windows(2)
        .any(|w| w == ["--tcp-ports", "0.0.0.0/2222:22"]));
    assert!(argv
        .windows(2)
        .any(|w| w == ["--udp-ports", "0.0.0.0/5353:53"]));
    let pol = p.policy(control, &[control.to_path_buf()]);
    assert_eq!(pol.files, landlock::Files::NotHandled);
    assert!(pol.rules.is_empty());
    // Only the forwarded TCP port may be bound.
    assert_eq!(pol.tcp, landlock::Tcp::BindOnly(vec![2222]));
    // The other helpers' domains still deny TCP and handle files.
    assert!(!need_proc_sys(&got));
}

// virtiofsd.thread_pool_size: the pool virtiofsd is given.
fn shares_spec(pool: serde_json::Value) -> Result<Spec, SpecError> {
    let v = serde_json::json!({
        "version": 1, "name": "web",
        "principal": { "user": "vm-web", "group": "vm-web" },
        "hypervisor": { "kind": "qemu", "binary": "/usr/bin/hv" },
        "vcpus": 1, "memory_mib": 256, "kernel": "/k/vmlinux",
        "shares": [{ "tag": "data", "source": "/srv/data", "proto": "virtiofs" }],
        "virtiofsd": { "binary": "/usr/libexec/virtiofsd", "thread_pool_size": pool }
    });
    let p = Path::new("/etc/vmwarden/vms/web.json");
    let s = Spec::parse(p, &serde_json::to_vec(&v).unwrap())?;
    s.validate(p, &"web".parse().unwrap())?;
    Ok(s)
}

#[test]
fn virtiofsd_gets_the_pool_size_a_count_or_one_per_cpu() {
    let control = Path::new("/run/vmwarden/web/control");
    let pool_arg = |s: &Spec| {
        plan(s, control)[0]
            .argv(Some(9))
            .into_iter()
            .filter(|a| a.starts_with("--thread-pool-size"))
            .collect::<Vec<_>>()
    };
    let s = shares_spec(serde_json::json!(8)).unwrap();
    assert_eq!(pool_arg(&s), ["--thread-pool-size=8"]);
    assert_eq!(
        serde_json::to_value(&s).unwrap()["virtiofsd"]["thread_pool_size"],
        8
    );
    let s = shares_spec(serde_json::json!("nproc")).unwrap();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert_eq!(pool_arg(&s), [format!("--thread-pool-size={cpus}")]);
    assert_eq!(
        serde_json::to_value(&s).unwrap()["virtiofsd"]["thread_pool_size"],
        "nproc"
    );
    assert_eq!(ThreadPoolSize::Nproc.resolve(0), 1);
    // Absent: virtiofsd's own default, and the spec writes nothing.
    let mut v = serde_json::to_value(shares_spec(serde_json::json!(0)).unwrap()).unwrap();
    v["virtiofsd"]
        .as_object_mut()
        .unwrap()
        .remove("thread_pool_size");
    let s: Spec = serde_json::from_value(v).unwrap();
    assert!(pool_arg(&s).is_empty());
    assert!(!serde_json::to_string(&s).unwrap().contains("thread_pool"));
}

#[test]
fn a_bad_pool_size_is_refused_and_says_what_to_give() {
    let e = shares_spec(serde_json::json!("many"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("invalid value: string \"many\", expected a thread count or \"nproc\" (virtiofsd.thread_pool_size)"),
        "{e}"
    );
    let e = shares_spec(serde_json::json!(5000))
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        format!("spec /etc/vmwarden/vms/web.json: field `virtiofsd.thread_pool_size` is 5000; at most {} threads (0 for no pool, \"nproc\" for one per CPU)", MAX_THREAD_POOL)
    );
    shares_spec(serde_json::json!(-1)).unwrap_err();
}

#[test]
fn a_firecracker_vm_with_vsock_gets_vmm_notify_confined_to_its_descriptors() {
    let mut v = serde_json::json!({
        "version": 1, "name": "web",
        "principal": { "uid": 61001, "gid": 61001 },
        "hypervisor": { "kind": "firecracker", "binary": "/usr/bin/firecracker", "accel": "kvm" },
        "vcpus": 1, "memory_mib": 256, "kernel": "/boot/vmlinux",
        "vsock": { "cid": 5, "backend": "user" }
    });
    let control = Path::new("/run/vmwarden/web/control");
    let got = plan(&spec(v.clone()), control);
    assert_eq!(got.len(), 1);
    let h = &got[0];
    assert_eq!(h.kind, HelperKind::VmmNotify);
    assert_eq!(h.name(), "vmm-notify");
    // The socket root binds: where firecracker's hybrid vsock delivers the
    // guest's connection to host port 8888.
    assert_eq!(
        h.socket(),
        Some(Path::new("/run/vmwarden/web/control/vsock.sock_8888"))
    );
    assert_eq!(h.shape().channel, Channel::Listener);
    assert!(matches!(
        h.shape().program,
        Program::Own {
            ends_hypervisor: true,
            ..
        }
    ));
    // No file access at all; signals unscoped, to end the hypervisor.
    let p = h.policy(control, &[control.to_path_buf()]);
    assert!(p.rules.is_empty() && p.vm_trees.is_empty());
    assert_eq!(p.files, landlock::Files::ByRules);
    assert_eq!(p.tcp, landlock::Tcp::Denied);
    assert!(p.signals_unscoped && p.no_new_privs_set);
    // Its own port.
    v["vsock"]["notify_port"] = serde_json::json!(1234);
    let got = plan(&spec(v.clone()), control);
    assert_eq!(
        got[0].socket(),
        Some(Path::new("/run/vmwarden/web/control/vsock.sock_1234"))
    );
    // Off by the spec, or no vsock: no helper.
    v["vsock"]["notify"] = serde_json::json!(false);
    v["vsock"].as_object_mut().unwrap().remove("notify_port");
    assert!(plan(&spec(v.clone()), control).is_empty());
    v.as_object_mut().unwrap().remove("vsock");
    assert!(plan(&spec(v), control).is_empty());
}

#[test]
fn exec_d_helpers_stay_signal_scoped() {
    let v = serde_json::json!({
        "version": 1, "name": "web",
        "principal": { "uid": 61001, "gid": 61001 },
        "hypervisor": { "kind": "qemu", "binary": "/usr/bin/hv" },
        "vcpus": 1, "memory_mib": 256, "kernel": "/boot/vmlinuz",
        "shares": [ { "tag": "rw", "source": "/srv/rw", "proto": "virtiofs" } ],
        "virtiofsd": { "binary": "/usr/libexec/virtiofsd" },
        "vsock": { "cid": 5, "backend": "user", "binary": "/usr/bin/vhost-device-vsock" },
        "user_network": { "binary": "/usr/bin/passt", "id": "qemu" }
    });
    let control = Path::new("/run/vmwarden/web/control");
    let got = plan(&spec(v), control);
    assert_eq!(got.len(), 3);
    for h in got {
        assert!(!h.policy(control, &[]).signals_unscoped, "{}", h.name());
    }
}

#[test]
fn a_cloud_hypervisor_vm_with_a_virtiofs_share_gets_reboot_watch_on_a_pair() {
    let mut v = serde_json::json!({
        "version": 1, "name": "web",
        "principal": { "uid": 61001, "gid": 61001 },
        "hypervisor": { "kind": "cloud-hypervisor", "binary": "/usr/bin/cloud-hypervisor", "accel": "kvm" },
        "vcpus": 1, "memory_mib": 256, "kernel": "/boot/vmlinux",
        "shares": [ { "tag": "rw", "source": "/srv/rw", "proto": "virtiofs" } ],
        "virtiofsd": { "binary": "/usr/libexec/virtiofsd" }
    });
    let control = Path::new("/run/vmwarden/web/control");
    let got = plan(&spec(v.clone()), control);
    let kinds: Vec<_> = got.iter().map(|h| h.kind).collect();
    // After the virtiofsd it watches for.
    assert_eq!(kinds, [HelperKind::Virtiofsd, HelperKind::RebootWatch]);
    let h = &got[1];
    assert_eq!(h.name(), "reboot-watch");
    assert_eq!(h.socket(), None);
    assert_eq!(h.shape().channel, Channel::Pair);
    assert!(matches!(
        h.shape().program,
        Program::Own {
            ends_hypervisor: true,
            ..
        }
    ));
    let p = h.policy(control, &[control.to_path_buf()]);
    assert!(p.rules.is_empty() && p.vm_trees.is_empty());
    assert_eq!(p.files, landlock::Files::ByRules);
    assert_eq!(p.tcp, landlock::Tcp::Denied);
    assert!(p.signals_unscoped && p.no_new_privs_set);
    // QEMU keeps its virtiofsd across a reset in place; no share, no
    // virtiofsd to lose: no helper.
    v["hypervisor"]["kind"] = serde_json::json!("qemu");
    assert!(plan(&spec(v.clone()), control)
        .iter()
        .all(|h| h.kind != HelperKind::RebootWatch));
    v["hypervisor"]["kind"] = serde_json::json!("cloud-hypervisor");
    v.as_object_mut().unwrap().remove("shares");
    v.as_object_mut().unwrap().remove("virtiofsd");
    assert!(plan(&spec(v), control).is_empty());
}
