//! Hypervisor command lines (and firecracker's config file) rendered from
//! the spec. Nothing secret is ever rendered: QEMU and cloud-hypervisor get
//! credentials as fw_cfg files named by paths into the VM's private tmpfs;
//! firecracker gets none (the spec refuses them). Taps are passed to QEMU
//! and cloud-hypervisor as inherited fd numbers.

pub mod api;
pub mod ch_reboot;
pub mod elf;
pub mod hibernate;
pub mod hibernate_chfc;
pub mod passthrough;
pub mod qmp;
pub mod snapshot_ch;
pub mod snapshot_fc;
pub mod snapshot_paths;
pub mod vmm_notify;

use std::path::{Path, PathBuf};

use serde_json::json;

use crate::config::memory::HUGEPAGE_MIB;
use crate::config::paths::{virtiofs_socket_name, VSOCK_SOCKET, VSOCK_VHOST_USER_SOCKET};
use crate::config::spec::{
    Accel, DiskSpec, HypervisorKind, Machine, ShareProto, Spec, VsockBackend,
    FW_CFG_CREDENTIAL_PREFIX,
};

/// libvirt's default `seccomp_sandbox = 1` set: QEMU's own seccomp filter.
pub const QEMU_SANDBOX: &str =
    "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny";

/// The device id of QEMU's virtio-balloon.
pub const QEMU_BALLOON_ID: &str = "balloon0";
/// What QEMU does when the guest resets or powers off the machine: a reset
/// in place, and the end of the process (`-action`, QEMU 6.0 and later).
pub const QEMU_ACTIONS: &str = "reboot=reset,shutdown=poweroff";

/// The chardev id of vmwarden's QMP monitor.
pub const QMP_CHARDEV: &str = "vmwarden-qmp";

/// Paths the rendered command line refers to.
#[derive(Debug, Clone)]
pub struct Layout {
    /// QMP: `control/qmp.sock`, bound by root (root's, mode 0600, so no
    /// process of the principal but the one holding this fd — not a
    /// helper in the same namespace — can connect) and handed over
    /// unlistened; QEMU listens on it, so its peer credentials are the
    /// principal's, which root's tools check.
    pub qmp_fd: i32,
    pub credentials_dir: PathBuf,
    /// cloud-hypervisor / firecracker API socket (`control/api.sock`).
    pub api_socket: PathBuf,
    /// firecracker's config file (`control/firecracker.json`).
    pub firecracker_config: PathBuf,
    /// Open tap fds, one per `spec.interfaces` entry, in order (a
    /// multi-queue tap's first queue).
    pub tap_fds: Vec<i32>,
    /// Each interface's further queues (`interfaces[i].queues` above 1);
    /// missing or empty: one queue.
    pub tap_queue_fds: Vec<Vec<i32>>,
    /// Each interface's `/dev/vhost-net` fds, one per queue, opened by
    /// root (`interfaces[i].vhost`); missing or empty: no vhost.
    pub vhost_net_fds: Vec<Vec<i32>>,
    /// The VM's `control/` directory: vhost-user and vsock sockets.
    pub control_dir: PathBuf,
    /// `/dev/vhost-vsock`, opened by root, for `vsock.backend = "vhost"`.
    pub vhost_vsock_fd: Option<i32>,
    /// QEMU's end of the socket pair whose other end passt serves, for
    /// `user_network`.
    pub user_net_fd: Option<i32>,
    /// cloud-hypervisor's end of the socket pair whose other end
    /// reboot-watch reads (`--event-monitor`, `config::reboot`).
    pub event_monitor_fd: Option<i32>,
    /// The nodes of the spec's USB devices, resolved by root, in order.
    pub usb_nodes: Vec<PathBuf>,
}

/// Whether the guest's memory must be shareable with another process
/// (vhost-user devices: virtiofsd, vhost-device-vsock).
pub fn needs_shared_memory(spec: &Spec) -> bool {
    spec.shares.iter().any(|s| s.proto == ShareProto::Virtiofs)
        || spec.vsock.as_ref().is_some_and(|v| {
            v.backend == VsockBackend::User && spec.hypervisor.kind == HypervisorKind::Qemu
        })
}

/// The 9p security model of a writable share. `mapped-xattr`: QEMU stores
/// the guest's owner, mode and file type in `user.virtfs.*` xattrs and
/// creates every host file as a plain file or directory of the principal's
/// with mode 0600/0700, so a guest's `mknod` or `chmod u+s` never makes a
/// device node or a setuid file on the host (`passthrough` and `none` apply
/// the guest's mode bits, setuid included, to the host file).
pub const NINEP_SECURITY_MODEL: &str = "mapped-xattr";

/// The 9p security model of a read-only share. `none`: QEMU shows the
/// host's own owner and mode of every file (what `stat(2)` gives its
/// process) and reads no `user.virtfs.*` xattr. Under `mapped-xattr`
/// whoever may write the source (any build user, for the Nix store:
/// `root:nixbld 1775`) could set `user.virtfs.uid=0` and
/// `user.virtfs.mode=0104755` on a plain file of theirs and the guest would
/// see a root set-uid program. `passthrough` needs root; `none` needs
/// nothing, and a read-only share has no guest writes for it to apply.
pub const NINEP_READ_ONLY_SECURITY_MODEL: &str = "none";

/// QEMU option values escape ',' by doubling it.
fn qemu_escape(p: &Path) -> String {
    p.to_string_lossy().replace(',', ",,")
}

/// QEMU's cache, aio and discard options of a disk. O_DIRECT
/// (`cache=none`) when the disk asks for it; the host's page cache
/// (QEMU's default, writeback) otherwise. aio is always `threads`: the
/// launcher's seccomp filter refuses io_uring (see `launch::seccomp`), and
/// QEMU would refuse to start with `aio=io_uring`. `discard=unmap` passes
/// the guest's discards on to the image.
pub fn qemu_drive_io(d: &DiskSpec) -> String {
    let mut o = String::new();
    if d.direct(HypervisorKind::Qemu) {
        o.push_str(",cache=none");
    }
    o.push_str(",aio=threads");
    if d.discard(HypervisorKind::Qemu) {
        o.push_str(",discard=unmap");
    }
    o
}

/// Interface `i`'s tap fds, one per queue.
fn tap_fds_of(layout: &Layout, i: usize) -> Vec<i32> {
    std::iter::once(layout.tap_fds[i])
        .chain(layout.tap_queue_fds.get(i).into_iter().flatten().copied())
        .collect()
}

fn join_fds(fds: &[i32], sep: &str) -> String {
    fds.iter().map(i32::to_string).collect::<Vec<_>>().join(sep)
}

/// QEMU's `-netdev tap` for interface `i`: its fd (`fds=` with several
/// queues), and either `vhost=off` (the fds are all QEMU gets) or
/// `vhost=on` with root's `/dev/vhost-net` fds (`vhostfd=`/`vhostfds=`):
/// QEMU never opens the device itself.
fn qemu_netdev(layout: &Layout, i: usize) -> String {
    let fds = tap_fds_of(layout, i);
    let mut nd = match fds.as_slice() {
        [fd] => format!("tap,id=net{i},fd={fd}"),
        _ => format!("tap,id=net{i},fds={}", join_fds(&fds, ":")),
    };
    match layout.vhost_net_fds.get(i).map(Vec::as_slice) {
        None | Some([]) => nd.push_str(",vhost=off"),
        Some([v]) => nd.push_str(&format!(",vhost=on,vhostfd={v}")),
        Some(v) => nd.push_str(&format!(",vhost=on,vhostfds={}", join_fds(v, ":"))),
    }
    nd
}

/// The QEMU argv (`argv[0]` is the binary). `seccomp` says whether to add
/// `-sandbox` (the binary was built with seccomp support).
pub fn qemu_argv(spec: &Spec, layout: &Layout, seccomp: bool) -> Vec<String> {
    let mut a: Vec<String> = Vec::new();
    let mut push = |xs: &[&str]| a.extend(xs.iter().map(|s| s.to_string()));
    push(&[&spec.hypervisor.binary.to_string_lossy()]);
    push(&["-name", &format!("guest={},debug-threads=on", spec.name)]);
    push(&["-nodefaults", "-no-user-config", "-display", "none"]);
    let machine = match spec.hypervisor.machine {
        Machine::Microvm => "microvm",
        Machine::Pc => "pc",
        Machine::Q35 => "q35",
        Machine::Virt => "virt",
    };
    // Same-page merging only when the spec asks (QEMU's default is on).
    let merge = if spec.mem_merge { "on" } else { "off" };
    let shared = needs_shared_memory(spec);
    if shared || spec.hugepage_mem {
        // vhost-user daemons map the guest's RAM: a shareable memfd
        // backend; hugepages come from the host's pool through the same
        // memfd (MFD_HUGETLB), so no hugetlbfs path is opened.
        push(&[
            "-machine",
            &format!("{machine},memory-backend=mem,mem-merge={merge}"),
        ]);
        let mut backend = format!("memory-backend-memfd,id=mem,size={}M", spec.memory_mib);
        if spec.hugepage_mem {
            backend.push_str(&format!(",hugetlb=on,hugetlbsize={HUGEPAGE_MIB}M"));
        }
        if shared {
            backend.push_str(",share=on");
        }
        push(&["-object", &backend]);
    } else {
        push(&["-machine", &format!("{machine},mem-merge={merge}")]);
    }
    match spec.hypervisor.accel {
        Accel::Kvm => push(&["-accel", "kvm", "-cpu", "host"]),
        Accel::Tcg => push(&["-accel", "tcg", "-cpu", "max"]),
    }
    push(&["-smp", &spec.vcpus.to_string()]);
    push(&["-m", &format!("{}M", spec.memory_mib)]);
    push(&["-kernel", &spec.kernel.to_string_lossy()]);
    if let Some(initrd) = &spec.initrd {
        push(&["-initrd", &initrd.to_string_lossy()]);
    }
    if !spec.cmdline.is_empty() {
        push(&["-append", &spec.cmdline]);
    }
    push(&["-serial", "stdio"]);
    // A reboot inside the guest resets the machine in place: the same
    // process, sandbox, lease, helpers and credentials (QEMU read the fw_cfg
    // files at start), a new boot. A poweroff ends QEMU with status 0, which
    // the unit does not restart. (microvm.nix passes -no-reboot and restarts
    // every exit with Restart=always; docs/design/systemd-units.md.)
    push(&["-action", QEMU_ACTIONS]);
    push(&[
        "-chardev",
        &format!(
            "socket,id={QMP_CHARDEV},fd={},server=on,wait=off",
            layout.qmp_fd
        ),
        "-mon",
        &format!("chardev={QMP_CHARDEV},mode=control"),
    ]);
    // virtio-mmio on microvm, PCI elsewhere.
    let bus = match spec.hypervisor.machine {
        Machine::Microvm => "device",
        Machine::Pc | Machine::Q35 | Machine::Virt => "pci",
    };
    for (i, d) in spec.disks.iter().enumerate() {
        let ro = if d.read_only { ",readonly=on" } else { "" };
        push(&[
            "-drive",
            &format!(
                "file={},format={},if=none,id=disk{i}{}{ro}",
                qemu_escape(&d.path),
                d.format().as_str(),
                qemu_drive_io(d)
            ),
        ]);
        let serial = d
            .serial
            .as_ref()
            .map(|s| format!(",serial={s}"))
            .unwrap_or_default();
        push(&[
            "-device",
            &format!("virtio-blk-{bus},drive=disk{i}{serial}"),
        ]);
    }
    for (i, sh) in spec.shares.iter().enumerate() {
        match sh.proto {
            ShareProto::Virtiofs => {
                let sock = layout.control_dir.join(virtiofs_socket_name(&sh.tag));
                push(&[
                    "-chardev",
                    &format!("socket,id=fs{i},path={}", qemu_escape(&sock)),
                ]);
                push(&[
                    "-device",
                    &format!("vhost-user-fs-{bus},chardev=fs{i},tag={}", sh.tag),
                ]);
            }
            ShareProto::NineP => {
                // -fsdev + -device rather than -virtfs: the same backend,
                // but -virtfs always makes a PCI device, which microvm lacks.
                let (model, ro) = if sh.read_only {
                    (NINEP_READ_ONLY_SECURITY_MODEL, ",readonly=on")
                } else {
                    (NINEP_SECURITY_MODEL, "")
                };
                push(&[
                    "-fsdev",
                    &format!(
                        "local,id=p9fs{i},path={},security_model={model}{ro}",
                        qemu_escape(&sh.source)
                    ),
                ]);
                push(&[
                    "-device",
                    &format!("virtio-9p-{bus},fsdev=p9fs{i},mount_tag={}", sh.tag),
                ]);
            }
        }
    }
    if let Some(v) = &spec.vsock {
        match v.backend {
            VsockBackend::User => {
                let sock = layout.control_dir.join(VSOCK_VHOST_USER_SOCKET);
                push(&[
                    "-chardev",
                    &format!("socket,id=vsock,path={}", qemu_escape(&sock)),
                ]);
                push(&["-device", &format!("vhost-user-vsock-{bus},chardev=vsock")]);
            }
            VsockBackend::Vhost => {
                // The fd is root's open /dev/vhost-vsock; the principal has
                // no access to the device node itself.
                let fd = layout.vhost_vsock_fd.unwrap_or(-1);
                push(&[
                    "-device",
                    &format!("vhost-vsock-{bus},guest-cid={},vhostfd={fd}", v.cid),
                ]);
            }
        }
    }
    for c in &spec.credentials {
        push(&[
            "-fw_cfg",
            &format!(
                "name={FW_CFG_CREDENTIAL_PREFIX}{},file={}",
                c.name,
                qemu_escape(&layout.credentials_dir.join(&c.name))
            ),
        ]);
    }
    let nic = format!("virtio-net-{bus}");
    for i in 0..layout.tap_fds.len() {
        push(&["-netdev", &qemu_netdev(layout, i)]);
        let fds = tap_fds_of(layout, i);
        // Multi-queue on PCI, as microvm.nix: two vectors per queue pair,
        // one for config and one for control. (On virtio-mmio the device
        // uses the first queue.)
        let mq = if fds.len() > 1 && bus == "pci" {
            format!(",mq=on,vectors={}", 2 * fds.len() + 2)
        } else {
            String::new()
        };
        push(&[
            "-device",
            &format!("{nic},netdev=net{i},mac={}{mq}", spec.guest_mac(i)),
        ]);
    }
    if let Some(u) = &spec.user_network {
        // passt's connected socket, an fd: QEMU opens no socket and
        // connects to nothing for it (`server=off` with an fd address takes
        // the socket as connected).
        push(&[
            "-netdev",
            &format!(
                "stream,id={},server=off,addr.type=fd,addr.str={}",
                u.id,
                layout.user_net_fd.unwrap_or(-1)
            ),
        ]);
        let mac = u.mac.map(|m| format!(",mac={m}")).unwrap_or_default();
        push(&["-device", &format!("{nic},netdev={}{mac}", u.id)]);
    }
    // -- The host's own tools: the balloon (microvm.nix's device). --
    if let Some(b) = &spec.balloon {
        let oom = if b.deflate_on_oom {
            ",deflate-on-oom=on"
        } else {
            ""
        };
        push(&[
            "-device",
            &format!("virtio-balloon-{bus},id={QEMU_BALLOON_ID},free-page-reporting=on{oom}"),
        ]);
    }
    let devices = passthrough::qemu_args(spec, &layout.usb_nodes);
    push(&devices.iter().map(String::as_str).collect::<Vec<_>>());
    if seccomp {
        push(&["-sandbox", QEMU_SANDBOX]);
    }
    // The escape hatch, last (Spec::validate_extra_args refused what would
    // undo the arguments above).
    a.extend(spec.hypervisor.extra_args.iter().cloned());
    a
}

/// The cloud-hypervisor argv. Its own seccomp filter stays on; its
/// `--landlock` is not used: the launcher's Landlock domain already covers
/// the whole process (applied before `execve`, single-threaded).
pub fn cloud_hypervisor_argv(spec: &Spec, layout: &Layout) -> Vec<String> {
    let mut a: Vec<String> = vec![spec.hypervisor.binary.to_string_lossy().into_owned()];
    let mut push = |xs: &[&str]| a.extend(xs.iter().map(|s| s.to_string()));
    push(&[
        "--api-socket",
        &format!("path={}", layout.api_socket.to_string_lossy()),
    ]);
    push(&["--kernel", &spec.kernel.to_string_lossy()]);
    if let Some(initrd) = &spec.initrd {
        push(&["--initramfs", &initrd.to_string_lossy()]);
    }
    if !spec.cmdline.is_empty() {
        push(&["--cmdline", &spec.cmdline]);
    }
    push(&["--cpus", &format!("boot={}", spec.vcpus)]);
    let mut memory = format!("size={}M", spec.memory_mib);
    if needs_shared_memory(spec) {
        memory.push_str(",shared=on");
    }
    if spec.mem_merge {
        memory.push_str(",mergeable=on");
    }
    if spec.hugepage_mem {
        memory.push_str(&format!(",hugepages=on,hugepage_size={HUGEPAGE_MIB}M"));
    }
    push(&["--memory", &memory]);
    if !spec.disks.is_empty() {
        push(&["--disk"]);
        for d in &spec.disks {
            let ro = if d.read_only { ",readonly=on" } else { "" };
            let serial = d
                .serial
                .as_ref()
                .map(|s| format!(",serial={s}"))
                .unwrap_or_default();
            let kind = HypervisorKind::CloudHypervisor;
            let direct = if d.direct(kind) { ",direct=on" } else { "" };
            // Its own default is sparse=on (discards punch holes): said
            // only when the spec says.
            let sparse = match d.discard {
                None => "",
                Some(_) if d.discard(kind) => ",sparse=on",
                Some(_) => ",sparse=off",
            };
            push(&[&format!(
                "path={}{ro}{serial}{direct}{sparse}",
                d.path.to_string_lossy()
            )]);
        }
    }
    // Only virtiofs shares reach here (the spec refuses 9p on cloud-hypervisor).
    let fs: Vec<String> = spec
        .shares
        .iter()
        .filter(|s| s.proto == ShareProto::Virtiofs)
        .map(|s| {
            format!(
                "tag={},socket={}",
                s.tag,
                layout
                    .control_dir
                    .join(virtiofs_socket_name(&s.tag))
                    .to_string_lossy()
            )
        })
        .collect();
    if !fs.is_empty() {
        push(&["--fs"]);
        a.extend(fs);
    }
    let mut push = |xs: &[&str]| a.extend(xs.iter().map(|s| s.to_string()));
    if let Some(v) = &spec.vsock {
        // cloud-hypervisor serves the hybrid vsock itself on this socket.
        push(&[
            "--vsock",
            &format!(
                "cid={},socket={}",
                v.cid,
                layout.control_dir.join(VSOCK_SOCKET).to_string_lossy()
            ),
        ]);
    }
    let devices = passthrough::cloud_hypervisor_args(spec);
    push(&devices.iter().map(String::as_str).collect::<Vec<_>>());
    if !layout.tap_fds.is_empty() {
        push(&["--net"]);
        for i in 0..layout.tap_fds.len() {
            // cloud-hypervisor counts each queue pair as two queues.
            let fds = tap_fds_of(layout, i);
            let queues = if fds.len() > 1 {
                format!(",num_queues={}", 2 * fds.len())
            } else {
                String::new()
            };
            push(&[&format!(
                "fd=[{}],mac={}{queues}",
                join_fds(&fds, ","),
                spec.guest_mac(i)
            )]);
        }
    }
    if !spec.credentials.is_empty() {
        // Credentials as fw_cfg files read from the private tmpfs, named
        // where systemd in the guest looks (as QEMU's `-fw_cfg`). The
        // kernel, command line and initramfs stay direct-boot only.
        let items: Vec<String> = spec
            .credentials
            .iter()
            .map(|c| {
                format!(
                    "name={FW_CFG_CREDENTIAL_PREFIX}{},file={}",
                    c.name,
                    layout.credentials_dir.join(&c.name).to_string_lossy()
                )
            })
            .collect();
        push(&[
            CH_FW_CFG_OPTION,
            &format!(
                "kernel=off,cmdline=off,initramfs=off,items=[{}]",
                items.join(":")
            ),
        ]);
    }
    // -- The host's own tools: the balloon (microvm.nix's flags). --
    if let Some(b) = &spec.balloon {
        let oom = if b.deflate_on_oom {
            ",deflate_on_oom=on"
        } else {
            ""
        };
        push(&[
            "--balloon",
            &format!("size={}M,free_page_reporting=on{oom}", b.initial_mib),
        ]);
    }
    if let Some(fd) = layout.event_monitor_fd {
        push(&["--event-monitor", &format!("fd={fd}")]);
    }
    push(&["--serial", "tty", "--console", "off"]);
    push(&["--seccomp", "true"]);
    a.extend(spec.hypervisor.extra_args.iter().cloned());
    a
}

/// firecracker's `--config-file` contents: no secrets. Its taps are named
/// (firecracker opens them itself; the launcher made them, persistent and
/// the principal's, in the network namespace firecracker runs in, which
/// holds no other tap), its hybrid vsock is a unix socket in `control_dir`.
pub fn firecracker_config(spec: &Spec, control_dir: &Path) -> String {
    let mut boot = json!({
        "kernel_image_path": spec.kernel,
        // With the guest's notify credential when it has a notify socket
        // (config::vmm_notify).
        "boot_args": spec.boot_cmdline(),
    });
    if let Some(i) = &spec.initrd {
        boot["initrd_path"] = json!(i);
    }
    let drives: Vec<serde_json::Value> = spec
        .disks
        .iter()
        .enumerate()
        .map(|(i, d)| {
            json!({
                "drive_id": format!("disk{i}"),
                "path_on_host": d.path,
                "is_root_device": false,
                "is_read_only": d.read_only,
            })
        })
        .collect();
    let nics: Vec<serde_json::Value> = spec
        .interfaces
        .iter()
        .enumerate()
        .map(|(i, n)| {
            json!({
                "iface_id": format!("net{i}"),
                "host_dev_name": n.tap.as_str(),
                "guest_mac": spec.guest_mac(i).to_string(),
            })
        })
        .collect();
    let mut cfg = json!({
        "boot-source": boot,
        "drives": drives,
        "machine-config": {
            "vcpu_count": spec.vcpus,
            "mem_size_mib": spec.memory_mib,
        },
        "network-interfaces": nics,
    });
    if spec.hugepage_mem {
        cfg["machine-config"]["huge_pages"] = json!(format!("{HUGEPAGE_MIB}M"));
    }
    if let Some(v) = &spec.vsock {
        cfg["vsock"] = json!({
            "guest_cid": v.cid,
            "uds_path": control_dir.join(VSOCK_SOCKET),
        });
    }
    let mut text = serde_json::to_string_pretty(&cfg).unwrap_or_default();
    text.push('\n');
    text
}

/// The firecracker argv: the API socket stays on (graceful stop and
/// wait-ready use it); the VM is configured from the file and starts at once.
pub fn firecracker_argv(spec: &Spec, layout: &Layout) -> Vec<String> {
    let mut a = vec![
        spec.hypervisor.binary.to_string_lossy().into_owned(),
        "--api-sock".into(),
        layout.api_socket.to_string_lossy().into_owned(),
        "--config-file".into(),
        layout.firecracker_config.to_string_lossy().into_owned(),
    ];
    a.extend(spec.hypervisor.extra_args.iter().cloned());
    a
}

/// The argv for the spec's hypervisor kind. `qemu_seccomp` only matters
/// for QEMU.
pub fn argv(spec: &Spec, layout: &Layout, qemu_seccomp: bool) -> Vec<String> {
    match spec.hypervisor.kind {
        HypervisorKind::Qemu => qemu_argv(spec, layout, qemu_seccomp),
        HypervisorKind::CloudHypervisor => cloud_hypervisor_argv(spec, layout),
        HypervisorKind::Firecracker => firecracker_argv(spec, layout),
    }
}

/// What `BINARY -sandbox QEMU_SANDBOX -version` said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SandboxProbe {
    /// Exit 0: the options parsed, so this QEMU has seccomp and knows every
    /// sub-option vmwarden passes.
    Supported,
    /// A clean non-zero exit: QEMU refused the option (built without
    /// seccomp: "-sandbox support is not enabled in this QEMU binary", or
    /// too old for a sub-option). Carries its first line of stderr.
    Unsupported(String),
}

/// The arguments that ask a QEMU whether it accepts `-sandbox
/// QEMU_SANDBOX`. `-help` is no answer: QEMU lists `-sandbox` there whether
/// or not it was built with seccomp. QEMU parses options in order and exits
/// on an unsupported `-sandbox` before it reaches `-version`, which prints
/// and exits before anything is set up. Asked only when the ELF cannot
/// tell ([`elf::links_libseccomp`]), in the sandbox (`launch::probe`).
pub const QEMU_SANDBOX_PROBE: [&str; 3] = ["-sandbox", QEMU_SANDBOX, "-version"];

/// [`QEMU_SANDBOX_PROBE`]'s answer from the exit code and stderr of a QEMU
/// that exited by itself.
pub fn qemu_sandbox_verdict(code: i32, stderr: &str) -> SandboxProbe {
    match code {
        0 => SandboxProbe::Supported,
        _ => SandboxProbe::Unsupported(first_line(stderr)),
    }
}

/// The cloud-hypervisor option that exists only in a build with the
/// `fw_cfg` feature (credentials need it).
pub const CH_FW_CFG_OPTION: &str = "--fw-cfg-config";

/// Does this cloud-hypervisor binary hold its `fw_cfg` option's name in its
/// read-only data? Every place cloud-hypervisor's sources spell
/// `fw-cfg-config` (the clap argument, its parser and its errors) is
/// compiled only with the `fw_cfg` feature, and the option cannot exist
/// without the name: `true` answers for the build without running it
/// (well under a millisecond). `false` (not found, or not an ELF file this
/// reader knows, e.g. a wrapper script): ask the binary
/// ([`CH_FW_CFG_PROBE`], in the sandbox).
pub fn cloud_hypervisor_fw_cfg_in_elf(binary: &Path) -> bool {
    let name = CH_FW_CFG_OPTION.trim_start_matches('-');
    elf::contains(binary, name.as_bytes()) == Some(true)
}

/// The arguments that ask a cloud-hypervisor for its options: its `--help`
/// lists every option the build has (clap renders the help from the
/// options compiled in).
pub const CH_FW_CFG_PROBE: [&str; 1] = ["--help"];

/// [`CH_FW_CFG_PROBE`]'s answer from a cloud-hypervisor that exited by
/// itself: does its help list [`CH_FW_CFG_OPTION`]? `Err` when `--help`
/// failed.
pub fn cloud_hypervisor_help_has_fw_cfg(
    code: i32,
    stdout: &str,
    stderr: &str,
) -> Result<bool, String> {
    if code != 0 {
        return Err(format!(
            "`--help` exited with status {code}: {}",
            first_line(stderr)
        ));
    }
    Ok(stdout
        .lines()
        .any(|l| l.split_whitespace().next() == Some(CH_FW_CFG_OPTION)))
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or("").trim().to_string()
}

#[cfg(test)]
mod io_tests;
#[cfg(test)]
mod tests;
