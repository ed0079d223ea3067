//! Unit tests of `hypervisor/mod.rs`.

use super::*;
use crate::config::names::{Mac, VmName};
use crate::config::spec::*;

pub(super) fn spec() -> Spec {
    serde_json::from_str(
            r#"{"version":1,"name":"web","principal":{"user":"vm-web","group":"vm-web"},
            "hypervisor":{"kind":"qemu","binary":"/usr/bin/qemu-system-x86_64","accel":"tcg","machine":"microvm"},
            "vcpus":2,"memory_mib":512,"kernel":"/k/bzImage","initrd":"/k/initrd","cmdline":"console=ttyS0 quiet",
            "credentials":[{"name":"db-password","source":{"systemd":"db-password"}}],
            "disks":[{"path":"/var/lib/vmwarden/web/root.img","read_only":false},{"path":"/data/a,b.img","read_only":true}]}"#,
        )
        .unwrap()
}

/// A layout of made-up fds and paths (also for `io_tests`).
pub(super) fn layout() -> Layout {
    Layout {
        qmp_fd: 3,
        credentials_dir: "/run/vmwarden/web/credentials".into(),
        api_socket: "/run/vmwarden/web/control/api.sock".into(),
        firecracker_config: "/run/vmwarden/web/control/firecracker.json".into(),
        tap_fds: vec![],
        tap_queue_fds: vec![],
        vhost_net_fds: vec![],
        control_dir: "/run/vmwarden/web/control".into(),
        vhost_vsock_fd: None,
        user_net_fd: None,
        event_monitor_fd: None,
        usb_nodes: vec![],
    }
}

fn with_nics(mut s: Spec) -> Spec {
    s.interfaces = vec![
        InterfaceSpec {
            tap: "vmw-web0".parse().unwrap(),
            bridge: Some("br0".parse().unwrap()),
            mac: Some("02:00:00:00:00:01".parse().unwrap()),
            vhost: None,
            queues: None,
            kind: None,
            macvtap: None,
        },
        InterfaceSpec {
            tap: "vmw-web1".parse().unwrap(),
            bridge: None,
            mac: None,
            vhost: None,
            queues: None,
            kind: None,
            macvtap: None,
        },
    ];
    s
}

#[test]
fn a_user_network_is_a_stream_netdev_on_passts_socket_pair() {
    let mut s = spec();
    s.user_network = serde_json::from_value(serde_json::json!({
        "binary": "/usr/bin/passt", "id": "qemu", "mac": "02:00:00:01:01:01",
        "forward_ports": [{ "host": { "port": 2222 }, "guest": { "port": 22 } }]
    }))
    .unwrap();
    let l = Layout {
        user_net_fd: Some(9),
        event_monitor_fd: None,
        ..layout()
    };
    let argv = qemu_argv(&s, &l, false);
    let at = argv.iter().position(|a| a == "-netdev").unwrap();
    assert_eq!(
        argv[at..at + 4],
        [
            "-netdev",
            "stream,id=qemu,server=off,addr.type=fd,addr.str=9",
            "-device",
            "virtio-net-device,netdev=qemu,mac=02:00:00:01:01:01"
        ]
    );
    // No socket path, no user (SLIRP) netdev: QEMU opens no IP socket.
    assert!(!argv
        .iter()
        .any(|a| a.contains("user,") || a.contains("passt")));
}

#[test]
fn qemu_taps_are_inherited_fds() {
    let s = with_nics(spec());
    let l = Layout {
        tap_fds: vec![5, 6],
        ..layout()
    };
    let argv = qemu_argv(&s, &l, true);
    let derived = Mac::derived(&"web".parse().unwrap(), &"vmw-web1".parse().unwrap());
    let tail: Vec<&str> = argv[argv.len() - 10..].iter().map(|x| x.as_str()).collect();
    assert_eq!(
        tail,
        [
            "-netdev",
            "tap,id=net0,fd=5,vhost=off",
            "-device",
            "virtio-net-device,netdev=net0,mac=02:00:00:00:00:01",
            "-netdev",
            "tap,id=net1,fd=6,vhost=off",
            "-device",
            &format!("virtio-net-device,netdev=net1,mac={derived}"),
            "-sandbox",
            QEMU_SANDBOX,
        ]
    );
    let mut q = s.clone();
    q.hypervisor.machine = Machine::Q35;
    assert!(qemu_argv(&q, &l, false)
        .join(" ")
        .contains("-device virtio-net-pci,netdev=net0,mac=02:00:00:00:00:01"));
}

fn ch_spec() -> Spec {
    let mut s = with_nics(spec());
    s.hypervisor.kind = HypervisorKind::CloudHypervisor;
    s.hypervisor.accel = Accel::Kvm;
    s.hypervisor.binary = "/usr/bin/cloud-hypervisor".into();
    s.credentials.clear();
    s.disks[1].path = "/data/b.img".into();
    s
}

#[test]
fn renders_golden_cloud_hypervisor_argv() {
    let s = ch_spec();
    let l = Layout {
        tap_fds: vec![5, 6],
        ..layout()
    };
    let derived = Mac::derived(&"web".parse().unwrap(), &"vmw-web1".parse().unwrap());
    let want = [
        "/usr/bin/cloud-hypervisor",
        "--api-socket",
        "path=/run/vmwarden/web/control/api.sock",
        "--kernel",
        "/k/bzImage",
        "--initramfs",
        "/k/initrd",
        "--cmdline",
        "console=ttyS0 quiet",
        "--cpus",
        "boot=2",
        "--memory",
        "size=512M",
        "--disk",
        "path=/var/lib/vmwarden/web/root.img",
        "path=/data/b.img,readonly=on",
        "--net",
        "fd=[5],mac=02:00:00:00:00:01",
        &format!("fd=[6],mac={derived}"),
        "--serial",
        "tty",
        "--console",
        "off",
        "--seccomp",
        "true",
    ];
    assert_eq!(argv(&s, &l, true), want);
}

#[test]
fn cloud_hypervisor_credentials_are_fw_cfg_files_on_the_tmpfs() {
    let mut s = ch_spec();
    s.interfaces.clear();
    s.credentials = spec().credentials;
    s.credentials.push(CredentialSpec {
        name: "token".parse().unwrap(),
        source: CredentialSource::Path("/run/secrets/token".into()),
    });
    let argv = argv(&s, &layout(), true);
    let i = argv.iter().position(|a| a == "--fw-cfg-config").unwrap();
    assert_eq!(
            argv[i + 1],
            "kernel=off,cmdline=off,initramfs=off,items=[\
             name=opt/io.systemd.credentials/db-password,file=/run/vmwarden/web/credentials/db-password:\
             name=opt/io.systemd.credentials/token,file=/run/vmwarden/web/credentials/token]"
        );
    assert!(!argv.join(" ").contains("/run/secrets"));
}

#[test]
fn renders_golden_firecracker_config_and_argv() {
    let mut s = spec();
    s.hypervisor.kind = HypervisorKind::Firecracker;
    s.hypervisor.binary = "/usr/bin/firecracker".into();
    s.credentials.clear();
    assert_eq!(
        argv(&s, &layout(), true),
        [
            "/usr/bin/firecracker",
            "--api-sock",
            "/run/vmwarden/web/control/api.sock",
            "--config-file",
            "/run/vmwarden/web/control/firecracker.json",
        ]
    );
    let want = r#"{
  "boot-source": {
    "boot_args": "console=ttyS0 quiet",
    "initrd_path": "/k/initrd",
    "kernel_image_path": "/k/bzImage"
  },
  "drives": [
    {
      "drive_id": "disk0",
      "is_read_only": false,
      "is_root_device": false,
      "path_on_host": "/var/lib/vmwarden/web/root.img"
    },
    {
      "drive_id": "disk1",
      "is_read_only": true,
      "is_root_device": false,
      "path_on_host": "/data/a,b.img"
    }
  ],
  "machine-config": {
    "mem_size_mib": 512,
    "vcpu_count": 2
  },
  "network-interfaces": []
}
"#;
    assert_eq!(firecracker_config(&s, &layout().control_dir), want);
}

#[test]
fn firecracker_names_its_taps_and_puts_its_vsock_in_control() {
    let mut s = with_nics(spec());
    s.hypervisor.kind = HypervisorKind::Firecracker;
    s.hypervisor.accel = Accel::Kvm;
    s.credentials.clear();
    s.disks.truncate(1);
    s.vsock = Some(VsockSpec {
        cid: 7,
        backend: VsockBackend::User,
        binary: None,
        notify: None,
        notify_port: None,
    });
    s.validate(
        Path::new("/etc/vmwarden/vms/web.json"),
        &VmName::parse("web").unwrap(),
    )
    .unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&firecracker_config(&s, &layout().control_dir)).unwrap();
    let derived = Mac::derived(&"web".parse().unwrap(), &"vmw-web1".parse().unwrap());
    assert_eq!(
        v["network-interfaces"],
        json!([
            { "iface_id": "net0", "host_dev_name": "vmw-web0", "guest_mac": "02:00:00:00:00:01" },
            { "iface_id": "net1", "host_dev_name": "vmw-web1", "guest_mac": derived.to_string() },
        ])
    );
    assert_eq!(
        v["vsock"],
        json!({ "guest_cid": 7, "uds_path": "/run/vmwarden/web/control/vsock.sock" })
    );
    // A VM with vsock gets the guest's notify credential on its kernel
    // command line (config::vmm_notify), after the spec's own.
    assert_eq!(
        v["boot-source"]["boot_args"],
        "console=ttyS0 quiet systemd.set_credential=vmm.notify_socket:vsock-stream:2:8888"
    );
    // No tap fd on its command line: it opens them by name.
    assert_eq!(argv(&s, &layout(), true).len(), 5);
}

#[test]
fn spec_refuses_what_these_hypervisors_cannot_do_safely() {
    let p = Path::new("/etc/vmwarden/vms/web.json");
    let web = &VmName::parse("web").unwrap();
    // Credentials on cloud-hypervisor pass (fw_cfg); on firecracker the
    // reason is that it has no channel for them.
    let mut s = ch_spec();
    s.credentials = spec().credentials;
    s.validate(p, web).unwrap();
    s.interfaces.clear();
    s.hypervisor.kind = HypervisorKind::Firecracker;
    let e = s.validate(p, web).unwrap_err().to_string();
    assert!(
        e.contains("`credentials`") && e.contains("no fw_cfg"),
        "{e}"
    );
    // TCG on cloud-hypervisor.
    let mut s = ch_spec();
    s.hypervisor.accel = Accel::Tcg;
    let e = s.validate(p, web).unwrap_err().to_string();
    assert!(
        e.contains("`hypervisor.accel`") && e.contains("only on KVM"),
        "{e}"
    );
    // Interfaces on firecracker pass (taps of its own network namespace).
    let mut s = ch_spec();
    s.hypervisor.kind = HypervisorKind::Firecracker;
    s.validate(p, web).unwrap();
    // The plain cloud-hypervisor spec passes.
    ch_spec().validate(p, web).unwrap();
}

#[test]
fn renders_golden_argv() {
    let argv = qemu_argv(&spec(), &layout(), true);
    let want = [
            "/usr/bin/qemu-system-x86_64",
            "-name", "guest=web,debug-threads=on",
            "-nodefaults", "-no-user-config", "-display", "none",
            "-machine", "microvm,mem-merge=off",
            "-accel", "tcg", "-cpu", "max",
            "-smp", "2", "-m", "512M",
            "-kernel", "/k/bzImage", "-initrd", "/k/initrd",
            "-append", "console=ttyS0 quiet",
            "-serial", "stdio", "-action", "reboot=reset,shutdown=poweroff",
            "-chardev", "socket,id=vmwarden-qmp,fd=3,server=on,wait=off",
            "-mon", "chardev=vmwarden-qmp,mode=control",
            "-drive", "file=/var/lib/vmwarden/web/root.img,format=raw,if=none,id=disk0,cache=none,aio=threads",
            "-device", "virtio-blk-device,drive=disk0",
            "-drive", "file=/data/a,,b.img,format=raw,if=none,id=disk1,cache=none,aio=threads,readonly=on",
            "-device", "virtio-blk-device,drive=disk1",
            "-fw_cfg", "name=opt/io.systemd.credentials/db-password,file=/run/vmwarden/web/credentials/db-password",
            "-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
        ];
    assert_eq!(argv, want);
}

#[test]
fn kvm_and_pci_machines() {
    let mut s = spec();
    s.hypervisor.accel = Accel::Kvm;
    s.hypervisor.machine = Machine::Q35;
    let argv = qemu_argv(&s, &layout(), false).join(" ");
    assert!(argv.contains("-accel kvm -cpu host"));
    assert!(argv.contains("virtio-blk-pci,drive=disk0"));
    assert!(!argv.contains("-sandbox"));
}

/// The device fields on QEMU: shares of both protocols, disks with
/// format and serial, the user vsock backend, extra_args last.
fn devices_spec() -> Spec {
    serde_json::from_str(
            r#"{"version":1,"name":"web","principal":{"user":"vm-web","group":"vm-web"},
            "hypervisor":{"kind":"qemu","binary":"/usr/bin/qemu-system-x86_64","accel":"tcg","machine":"microvm",
              "extra_args":["-device","virtio-rng-device"]},
            "vcpus":1,"memory_mib":256,"kernel":"/k/bzImage",
            "disks":[{"path":"/var/lib/vmwarden/web/var.img","serial":"var","create":{"size_mib":64}},
                     {"path":"/srv/base.qcow2","read_only":true,"format":"qcow2"}],
            "shares":[{"tag":"ro-store","source":"/nix/store","proto":"virtiofs","read_only":true},
                      {"tag":"data","source":"/var/lib/vmwarden/web/data","proto":"9p"}],
            "virtiofsd":{"binary":"/usr/libexec/virtiofsd"},
            "vsock":{"cid":5,"backend":"user","binary":"/usr/libexec/vhost-device-vsock"}}"#,
        )
        .unwrap()
}

#[test]
fn renders_golden_qemu_argv_with_shares_disks_vsock_and_extra_args() {
    let argv = qemu_argv(&devices_spec(), &layout(), true);
    #[rustfmt::skip]
        let want = [
            "/usr/bin/qemu-system-x86_64",
            "-name", "guest=web,debug-threads=on",
            "-nodefaults", "-no-user-config", "-display", "none",
            "-machine", "microvm,memory-backend=mem,mem-merge=off",
            "-object", "memory-backend-memfd,id=mem,size=256M,share=on",
            "-accel", "tcg", "-cpu", "max",
            "-smp", "1", "-m", "256M",
            "-kernel", "/k/bzImage",
            "-serial", "stdio", "-action", "reboot=reset,shutdown=poweroff",
            "-chardev", "socket,id=vmwarden-qmp,fd=3,server=on,wait=off",
            "-mon", "chardev=vmwarden-qmp,mode=control",
            "-drive", "file=/var/lib/vmwarden/web/var.img,format=raw,if=none,id=disk0,cache=none,aio=threads",
            "-device", "virtio-blk-device,drive=disk0,serial=var",
            "-drive", "file=/srv/base.qcow2,format=qcow2,if=none,id=disk1,cache=none,aio=threads,readonly=on",
            "-device", "virtio-blk-device,drive=disk1",
            "-chardev", "socket,id=fs0,path=/run/vmwarden/web/control/virtiofs-ro-store.sock",
            "-device", "vhost-user-fs-device,chardev=fs0,tag=ro-store",
            "-fsdev", "local,id=p9fs1,path=/var/lib/vmwarden/web/data,security_model=mapped-xattr",
            "-device", "virtio-9p-device,fsdev=p9fs1,mount_tag=data",
            "-chardev", "socket,id=vsock,path=/run/vmwarden/web/control/vsock-vhost-user.sock",
            "-device", "vhost-user-vsock-device,chardev=vsock",
            "-sandbox", QEMU_SANDBOX,
            "-device", "virtio-rng-device",
        ];
    assert_eq!(argv, want);
    let p = Path::new("/etc/vmwarden/vms/web.json");
    devices_spec()
        .validate(p, &VmName::parse("web").unwrap())
        .unwrap();
}

#[test]
fn qemu_pci_machines_read_only_9p_and_the_vhost_vsock_fd() {
    let mut s = devices_spec();
    s.hypervisor.machine = Machine::Q35;
    s.shares[1].read_only = true;
    s.vsock = Some(VsockSpec {
        cid: 7,
        backend: VsockBackend::Vhost,
        binary: None,
        notify: None,
        notify_port: None,
    });
    let l = Layout {
        vhost_vsock_fd: Some(9),
        ..layout()
    };
    let argv = qemu_argv(&s, &l, false).join(" ");
    assert!(
        argv.contains("-machine q35,memory-backend=mem,mem-merge=off "),
        "{argv}"
    );
    assert!(argv.contains("-device vhost-user-fs-pci,chardev=fs0,tag=ro-store"));
    assert!(argv.contains(
        "security_model=none,readonly=on -device virtio-9p-pci,fsdev=p9fs1,mount_tag=data"
    ));
    assert!(
        argv.contains("-device vhost-vsock-pci,guest-cid=7,vhostfd=9"),
        "{argv}"
    );
    assert!(argv.contains("-device virtio-blk-pci,drive=disk0,serial=var"));
    assert!(!argv.contains("vsock-vhost-user.sock"));
    // aarch64's virt: PCI devices too.
    s.hypervisor.machine = Machine::Virt;
    let argv = qemu_argv(&s, &l, false).join(" ");
    assert!(
        argv.contains("-machine virt,memory-backend=mem,mem-merge=off "),
        "{argv}"
    );
    assert!(argv.contains("virtio-blk-pci,drive=disk0"));
    // No vhost-user device: no shared memory backend.
    let mut plain = spec();
    plain.hypervisor.machine = Machine::Virt;
    let argv = qemu_argv(&plain, &layout(), false).join(" ");
    assert!(
        argv.contains("-machine virt,mem-merge=off -accel"),
        "{argv}"
    );
    assert!(!argv.contains("memory-backend"));
}

#[test]
fn renders_golden_cloud_hypervisor_argv_with_fs_vsock_and_extra_args() {
    let mut s = ch_spec();
    s.interfaces.clear();
    s.disks[0].serial = Some("root".into());
    s.shares = vec![ShareSpec {
        tag: "ro-store".into(),
        source: "/nix/store".into(),
        proto: ShareProto::Virtiofs,
        read_only: true,
    }];
    s.virtiofsd = Some(VirtiofsdSpec {
        binary: "/usr/libexec/virtiofsd".into(),
        thread_pool_size: None,
    });
    s.vsock = Some(VsockSpec {
        cid: 5,
        backend: VsockBackend::User,
        binary: None,
        notify: None,
        notify_port: None,
    });
    s.hypervisor.extra_args = vec!["--rng".into(), "src=/dev/urandom".into()];
    let p = Path::new("/etc/vmwarden/vms/web.json");
    s.validate(p, &VmName::parse("web").unwrap()).unwrap();
    #[rustfmt::skip]
        let want = [
            "/usr/bin/cloud-hypervisor",
            "--api-socket", "path=/run/vmwarden/web/control/api.sock",
            "--kernel", "/k/bzImage",
            "--initramfs", "/k/initrd",
            "--cmdline", "console=ttyS0 quiet",
            "--cpus", "boot=2",
            "--memory", "size=512M,shared=on",
            "--disk", "path=/var/lib/vmwarden/web/root.img,serial=root", "path=/data/b.img,readonly=on",
            "--fs", "tag=ro-store,socket=/run/vmwarden/web/control/virtiofs-ro-store.sock",
            "--vsock", "cid=5,socket=/run/vmwarden/web/control/vsock.sock",
            "--serial", "tty", "--console", "off",
            "--seccomp", "true",
            "--rng", "src=/dev/urandom",
        ];
    assert_eq!(argv(&s, &layout(), true), want);
    // With reboot-watch's end of the pair: the event monitor, before the
    // serial (config::reboot).
    assert!(s.reboot_restarts_cloud_hypervisor());
    let l = Layout {
        event_monitor_fd: Some(11),
        ..layout()
    };
    let a = argv(&s, &l, true);
    let at = a.iter().position(|x| x == "--event-monitor").unwrap();
    assert_eq!(a[at + 1], "fd=11");
    assert_eq!(a[at + 2], "--serial");
}

#[test]
fn no_secret_material_in_argv() {
    // Only credential names and tmpfs paths appear, never a source path.
    let mut s = spec();
    s.credentials[0].source = CredentialSource::Path("/run/secrets/token".into());
    let argv = qemu_argv(&s, &layout(), true).join(" ");
    assert!(!argv.contains("/run/secrets"));
}

#[test]
fn the_balloon_is_rendered_with_microvm_nix_flags_and_the_serial_stays_stdio() {
    let mut s = spec();
    s.balloon = Some(BalloonSpec {
        initial_mib: 128,
        deflate_on_oom: true,
    });
    s.console = true;
    let a = qemu_argv(&s, &layout(), false);
    assert!(
        a.windows(2).any(|w| w
            == [
                "-device",
                "virtio-balloon-device,id=balloon0,free-page-reporting=on,deflate-on-oom=on"
            ]),
        "{a:?}"
    );
    // The console relay takes the hypervisor's stdio: the argv keeps it.
    assert!(a.windows(2).any(|w| w == ["-serial", "stdio"]), "{a:?}");
    s.hypervisor.machine = Machine::Pc;
    s.balloon.as_mut().unwrap().deflate_on_oom = false;
    let a = qemu_argv(&s, &layout(), false);
    assert!(
        a.windows(2).any(|w| w
            == [
                "-device",
                "virtio-balloon-pci,id=balloon0,free-page-reporting=on"
            ]),
        "{a:?}"
    );
    let mut c = ch_spec();
    c.balloon = Some(BalloonSpec {
        initial_mib: 128,
        deflate_on_oom: true,
    });
    let a = cloud_hypervisor_argv(&c, &layout());
    assert!(
        a.windows(2).any(|w| w
            == [
                "--balloon",
                "size=128M,free_page_reporting=on,deflate_on_oom=on"
            ]),
        "{a:?}"
    );
    assert!(a.windows(2).any(|w| w == ["--serial", "tty"]), "{a:?}");
    // Without a balloon, no device.
    let a = qemu_argv(&spec(), &layout(), false);
    assert!(!a.iter().any(|x| x.contains("balloon")), "{a:?}");
}

/// `mem_merge` and `hugepage_mem` as each hypervisor spells them: KSM off
/// unless asked (QEMU's own default is on), hugepages through a hugetlb
/// memfd (QEMU, cloud-hypervisor) or firecracker's `huge_pages`, never a
/// hugetlbfs path.
#[test]
fn guest_memory_merges_only_when_asked_and_takes_hugepages_without_a_path() {
    let mut s = spec();
    s.mem_merge = true;
    let a = qemu_argv(&s, &layout(), false).join(" ");
    assert!(a.contains("-machine microvm,mem-merge=on -accel"), "{a}");
    s.mem_merge = false;
    s.hugepage_mem = true;
    let a = qemu_argv(&s, &layout(), false).join(" ");
    assert!(
        a.contains(
            "-machine microvm,memory-backend=mem,mem-merge=off \
             -object memory-backend-memfd,id=mem,size=512M,hugetlb=on,hugetlbsize=2M -accel"
        ),
        "{a}"
    );
    assert!(!a.contains("mem-path"), "{a}");
    let mut c = ch_spec();
    let a = cloud_hypervisor_argv(&c, &layout());
    assert!(
        a.windows(2).any(|w| w == ["--memory", "size=512M"]),
        "{a:?}"
    );
    c.mem_merge = true;
    c.hugepage_mem = true;
    let a = cloud_hypervisor_argv(&c, &layout());
    assert!(
        a.windows(2).any(|w| w
            == [
                "--memory",
                "size=512M,mergeable=on,hugepages=on,hugepage_size=2M"
            ]),
        "{a:?}"
    );
    let mut f = spec();
    f.hypervisor.kind = HypervisorKind::Firecracker;
    let v: serde_json::Value =
        serde_json::from_str(&firecracker_config(&f, &layout().control_dir)).unwrap();
    assert!(v["machine-config"].get("huge_pages").is_none(), "{v}");
    f.hugepage_mem = true;
    let v: serde_json::Value =
        serde_json::from_str(&firecracker_config(&f, &layout().control_dir)).unwrap();
    assert_eq!(v["machine-config"]["huge_pages"], json!("2M"), "{v}");
}
