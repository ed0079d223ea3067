//! The helper daemons' one shape. Every kind of helper is one entry of
//! [`TABLE`]: its name, the spec field of its binary, how the hypervisor
//! reaches it ([`Channel`]), where its file system is rooted ([`Root`]),
//! which seccomp filter it gets ([`Filter`]), whether it needs `/proc/sys`,
//! what runs ([`Program`]: a binary the spec names, or vmwarden's own code)
//! and the functions that read its binary and its instances (with their
//! arguments) from the spec. Every consumer reads the entry — the plan,
//! the argv, the Landlock domain, the start and its wait
//! (`launch::helpers`), the trust walk of its binary (`launch::preflight`),
//! the intent record (`launch::resources`) — and none matches on the kind,
//! so a new helper is a new entry here, not new code there.

use std::os::fd::{OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use crate::config::paths::{
    hybrid_vsock_port_socket_name, virtiofs_socket_name, VSOCK_SOCKET, VSOCK_VHOST_USER_SOCKET,
};
use crate::config::spec::{HypervisorKind, ShareProto, Spec, VsockBackend};
use crate::hypervisor::{ch_reboot, vmm_notify};
use crate::launch::landlock::{self, Files, Tcp};

/// Which daemon a helper runs (an index into [`TABLE`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HelperKind {
    Virtiofsd,
    VhostDeviceVsock,
    Passt,
    VmmNotify,
    RebootWatch,
}

impl HelperKind {
    /// Its entry in [`TABLE`].
    pub fn shape(self) -> &'static Shape {
        // The table is in the enum's order (a unit test checks it).
        &TABLE[self as usize]
    }

    /// The name the intent record and the log use.
    pub fn as_str(self) -> &'static str {
        self.shape().name
    }
}

/// How the hypervisor reaches a helper.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    /// Root binds a listening socket at the helper's first socket path in
    /// `control/` (the principal's, 0600) and hands it over as an fd
    /// ([`Arg::Fd`]); the hypervisor connects to the path. The daemon
    /// makes nothing in `control/`.
    Listener,
    /// The daemon makes its sockets in `control/` itself: its Landlock
    /// domain may make sockets there, and the launcher waits until each
    /// of its socket paths is a socket.
    OwnSockets,
    /// A connected pair of Unix stream sockets, made by root: one end
    /// handed to the daemon as an fd ([`Arg::Fd`]), the other to the
    /// hypervisor (inherited across its `execve`). Nothing in `control/`,
    /// nothing to connect to.
    Pair,
}

/// Where a helper's file system is rooted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Root {
    /// A mount namespace of its own whose root is its share
    /// (`launch::helpers::share_root`); the launcher checks its root once
    /// it has started.
    Share,
    /// The VM's mount namespace, working directory `/`.
    Vm,
    /// The VM's mount namespace at `execve`; the daemon then makes a
    /// sandbox of its own (passt: user, mount, IPC, UTS and PID
    /// namespaces, its root an empty read-only tmpfs, then a seccomp
    /// filter of its own). Its Landlock domain handles no file access
    /// (Landlock would refuse it the `mount` and `pivot_root` that sandbox
    /// needs) and its seccomp filter lets it make those namespaces
    /// ([`Filter::SelfSandboxing`]); the launcher waits until it has a
    /// filter of its own on top of the launcher's and an empty root that
    /// is not the VM's, and fails the launch otherwise.
    OwnSandbox,
}

/// The seccomp filter a helper runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filter {
    /// The launcher's own, the hypervisor's (`launch::seccomp`).
    Launcher,
    /// The launcher's, but for the namespaces of the helper's own sandbox
    /// and IP and `NETLINK_ROUTE` sockets
    /// (`launch::seccomp::self_sandboxing_programs`).
    SelfSandboxing,
}

/// What a helper runs once it is confined.
#[derive(Debug, Clone, Copy)]
pub enum Program {
    /// The binary the spec names ([`Shape::binary_field`]), `execve`d.
    Exec,
    /// vmwarden's own code: `main` runs in the forked child itself, no
    /// `execve`, once the child is confined as an exec'd helper would be
    /// (the principal, no capability, the death signal, Landlock, seccomp)
    /// and holds no descriptor but stdin, stdout, stderr, the lease and
    /// what it is handed ([`Own`]). Its Landlock domain grants no file
    /// access at all (checked before `main` runs: it cannot open `/`); it
    /// reaches what it serves only through its descriptors. Its exit
    /// status is `main`'s. The launcher's memory it starts with is a copy
    /// of what the launcher held, so each entry says why that holds no
    /// secret its uid lacks.
    Own {
        main: fn(Own) -> i32,
        /// It may end the hypervisor: it gets a pidfd of the process that
        /// becomes the hypervisor ([`Own::hypervisor`]), and its Landlock
        /// domain leaves signals unscoped (the hypervisor's domain is not
        /// within the helper's, so a scoped domain could not signal it).
        /// What it may signal is then what its uid may: the processes of
        /// this VM's dedicated principal.
        ends_hypervisor: bool,
    },
}

/// What an [`Program::Own`] helper's `main` is given.
#[derive(Debug)]
pub struct Own {
    /// The descriptor root handed over ([`Channel::Listener`]: the
    /// listening socket).
    pub handed: Option<OwnedFd>,
    /// A pidfd of the process that becomes the hypervisor (the helper's
    /// parent), opened before the child checked that its parent is still
    /// the launcher; with `ends_hypervisor` only.
    pub hypervisor: Option<OwnedFd>,
}

/// What errors name as the binary of an [`Program::Own`] helper (and of
/// the console relay).
pub const OWN_CODE: &str = "the launcher's own code";

/// One kind of helper: everything the launch, the sandbox and the intent
/// record need to know about it.
#[derive(Debug)]
pub struct Shape {
    pub kind: HelperKind,
    /// The name the intent record and the log use.
    pub name: &'static str,
    /// What an instance's tag names in messages ("share": "virtiofsd for
    /// share `data`"); `None` for a kind with one instance.
    pub tag_noun: Option<&'static str>,
    /// The spec field naming its binary.
    pub binary_field: &'static str,
    pub channel: Channel,
    pub root: Root,
    pub filter: Filter,
    pub program: Program,
    /// It reads the VM's `/proc/sys` (virtiofsd reads
    /// `/proc/sys/fs/nr_open` at start and exits without it), which a
    /// `subset=pid` procfs does not have.
    pub proc_sys: bool,
    /// Its binary, when the spec names one (whether or not this spec
    /// starts it): root's trust walk checks it like the hypervisor's.
    pub binary: fn(spec: &Spec) -> Option<&Path>,
    /// A writable share of it is the guest's to own: its daemon runs as
    /// root of a user namespace mapping the VM's id range, beside a broker
    /// (`launch::helpers::owned`, `broker`).
    pub guest_owns_writable: bool,
    /// Host files it reads that no Landlock rule of its names (passt, whose
    /// domain handles no file access, reads the host's resolvers): the
    /// VM's root holds them (`launch::root`).
    pub host_reads: &'static [&'static str],
    /// Its instances for a spec, in start order (`control` is the VM's
    /// control dir).
    pub plan: fn(spec: &Spec, control: &Path) -> Vec<Helper>,
}

/// Every kind of helper, in start order (and in [`HelperKind`]'s order).
pub static TABLE: &[Shape] = &[
    Shape {
        kind: HelperKind::Virtiofsd,
        name: "virtiofsd",
        tag_noun: Some("share"),
        binary_field: "virtiofsd.binary",
        // virtiofsd gets its listening socket from root (`--fd`): given a
        // path it would also create `<socket>.pid`, a regular file, and
        // the helper's domain allows no regular file in `control/`.
        channel: Channel::Listener,
        root: Root::Share,
        filter: Filter::Launcher,
        program: Program::Exec,
        proc_sys: true,
        binary: |spec| spec.virtiofsd.as_ref().map(|v| v.binary.as_path()),
        guest_owns_writable: true,
        host_reads: &[],
        plan: plan_virtiofsd,
    },
    Shape {
        kind: HelperKind::VhostDeviceVsock,
        name: "vhost-device-vsock",
        tag_noun: None,
        binary_field: "vsock.binary",
        // It has no fd option: it makes its two sockets itself.
        channel: Channel::OwnSockets,
        root: Root::Vm,
        filter: Filter::Launcher,
        program: Program::Exec,
        proc_sys: false,
        binary: |spec| spec.vsock.as_ref().and_then(|v| v.binary.as_deref()),
        guest_owns_writable: false,
        host_reads: &[],
        plan: plan_vhost_device_vsock,
    },
    Shape {
        kind: HelperKind::Passt,
        name: "passt",
        tag_noun: Some("interface"),
        binary_field: "user_network.binary",
        // QEMU's `-netdev stream` takes a connected socket as an fd, and
        // passt one as `--fd`: no socket path for anyone to reach.
        channel: Channel::Pair,
        root: Root::OwnSandbox,
        filter: Filter::SelfSandboxing,
        program: Program::Exec,
        proc_sys: false,
        binary: |spec| spec.user_network.as_ref().map(|u| u.binary.as_path()),
        guest_owns_writable: false,
        host_reads: &["/etc/resolv.conf"],
        plan: plan_passt,
    },
    // -- vmm-notify: a firecracker guest's poweroff ends its VM
    //    (config::vmm_notify, hypervisor::vmm_notify). --
    Shape {
        kind: HelperKind::VmmNotify,
        name: "vmm-notify",
        tag_noun: None,
        binary_field: "vsock.notify",
        // Root binds `control/vsock.sock_PORT`, where firecracker's hybrid
        // vsock delivers the guest's connections to host port PORT.
        channel: Channel::Listener,
        root: Root::Vm,
        filter: Filter::Launcher,
        // Firecracker VMs have no credentials (the spec refuses them): the
        // launcher's memory this child starts with holds no secret.
        program: Program::Own {
            main: vmm_notify_main,
            ends_hypervisor: true,
        },
        proc_sys: false,
        // No binary: the launcher's own, trusted as the launcher is.
        binary: |_| None,
        guest_owns_writable: false,
        host_reads: &[],
        plan: plan_vmm_notify,
    },
    // -- reboot-watch: a cloud-hypervisor guest with a virtiofs share that
    //    reboots is restarted clean (config::reboot, hypervisor::ch_reboot). --
    Shape {
        kind: HelperKind::RebootWatch,
        name: "reboot-watch",
        tag_noun: None,
        // The field whose virtiofs share brings it.
        binary_field: "shares",
        // cloud-hypervisor's `--event-monitor fd=N` is the hypervisor's end
        // of the pair: nothing in `control/`, nothing to connect to.
        channel: Channel::Pair,
        root: Root::Vm,
        filter: Filter::Launcher,
        // Forked after the launcher dropped the credentials it read (they
        // are on the VM's tmpfs by then, which the hypervisor reads as the
        // same principal): whatever of them a copy of the launcher's
        // memory still holds is nothing this uid cannot read anyway.
        program: Program::Own {
            main: reboot_watch_main,
            ends_hypervisor: true,
        },
        proc_sys: false,
        // No binary: the launcher's own, trusted as the launcher is.
        binary: |_| None,
        guest_owns_writable: false,
        host_reads: &[],
        plan: plan_reboot_watch,
    },
];

/// One argument of a helper's command line after its binary.
#[derive(Debug, Clone, PartialEq)]
pub enum Arg {
    Lit(String),
    /// The fd root hands over ([`Channel::Listener`], [`Channel::Pair`]),
    /// after this prefix.
    Fd(&'static str),
}

/// The share a helper serves ([`Root::Share`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Share {
    /// Its index in `shares` (what errors and Landlock rules name).
    pub index: usize,
    pub source: PathBuf,
    pub read_only: bool,
}

/// One helper the launch starts.
#[derive(Debug, Clone, PartialEq)]
pub struct Helper {
    pub kind: HelperKind,
    /// Which instance: the share's tag (virtiofsd), the interface's id
    /// (passt).
    pub tag: Option<String>,
    pub binary: PathBuf,
    /// Its sockets in `control/`. The first is the one the hypervisor
    /// connects to (the intent record names it); for
    /// [`Channel::Listener`] it is the one root binds.
    pub sockets: Vec<PathBuf>,
    pub share: Option<Share>,
    /// What its Landlock domain lets it do with TCP (passt: bind its
    /// forwarded ports; every other helper: nothing).
    pub tcp: Tcp,
    /// Its arguments after the binary.
    pub args: Vec<Arg>,
}

impl Helper {
    pub fn shape(&self) -> &'static Shape {
        self.kind.shape()
    }

    /// "virtiofsd for share `data`", "vhost-device-vsock": what errors name.
    pub fn name(&self) -> String {
        let shape = self.shape();
        match (&self.tag, shape.tag_noun) {
            (Some(t), Some(noun)) => format!("{} for {noun} `{t}`", shape.name),
            _ => shape.name.to_string(),
        }
    }

    /// The spec field naming its binary.
    pub fn binary_field(&self) -> &'static str {
        self.shape().binary_field
    }

    /// The socket the hypervisor connects to, if the helper has one.
    pub fn socket(&self) -> Option<&Path> {
        self.sockets.first().map(PathBuf::as_path)
    }

    /// The daemon's argv; `fd` is the fd root hands over.
    pub fn argv(&self, fd: Option<RawFd>) -> Vec<String> {
        std::iter::once(self.binary.to_string_lossy().into_owned())
            .chain(self.args.iter().map(|a| match a {
                Arg::Lit(s) => s.clone(),
                Arg::Fd(prefix) => format!("{prefix}{}", fd.unwrap_or(-1)),
            }))
            .collect()
    }

    /// What the VM's root must hold for it (`launch::root`): the rules of
    /// its Landlock domain (a self-sandboxing helper's too: it is
    /// `execve`d in the VM's root before its own sandbox takes the files
    /// away) and its [`Shape::host_reads`]; nothing for vmwarden's own code.
    pub fn root_rules(&self, control_dir: &Path, vm_trees: &[PathBuf]) -> Vec<landlock::Rule> {
        let shape = self.shape();
        if let Program::Own { .. } = shape.program {
            return Vec::new();
        }
        let mut rules = self.domain(control_dir, vm_trees).rules;
        rules.extend(shape.host_reads.iter().map(|p| landlock::Rule {
            path: PathBuf::from(p),
            grant: landlock::Grant::Read,
            field: None,
        }));
        rules
    }

    /// `landlock::helper_policy` for this helper.
    fn domain(&self, control_dir: &Path, vm_trees: &[PathBuf]) -> landlock::Policy {
        let shape = self.shape();
        let share = self.share.as_ref().map(|s| {
            (
                s.source.as_path(),
                s.read_only,
                format!("shares[{}].source", s.index),
            )
        });
        let control = (shape.channel == Channel::OwnSockets).then_some(control_dir);
        landlock::helper_policy(&self.binary, shape.binary_field, share, control, vm_trees)
    }

    /// The helper's own Landlock domain: its binary and the system's
    /// trees, its share, and the control dir when it makes its own sockets;
    /// for vmwarden's own code, nothing (see [`Program::Own`]).
    pub fn policy(&self, control_dir: &Path, vm_trees: &[PathBuf]) -> landlock::Policy {
        let shape = self.shape();
        if let Program::Own {
            ends_hypervisor, ..
        } = shape.program
        {
            return landlock::Policy {
                rules: Vec::new(),
                // Every file access handled, none allowed; no TCP.
                files: Files::ByRules,
                tcp: Tcp::Denied,
                vm_trees: Vec::new(),
                signals_unscoped: ends_hypervisor,
                // Applied right after the drop, which set it.
                no_new_privs_set: true,
            };
        }
        let mut policy = self.domain(control_dir, vm_trees);
        policy.tcp = self.tcp.clone();
        if shape.root == Root::OwnSandbox {
            policy.files = Files::NotHandled;
            policy.rules.clear();
        }
        policy
    }
}

/// The helpers `spec` needs, in start order: every entry of [`TABLE`]'s
/// instances, entry by entry.
pub fn plan(spec: &Spec, control_dir: &Path) -> Vec<Helper> {
    TABLE
        .iter()
        .flat_map(|s| (s.plan)(spec, control_dir))
        .collect()
}

/// Whether the VM's private `/proc` must keep its global files (see
/// [`Shape::proc_sys`]).
pub fn need_proc_sys(helpers: &[Helper]) -> bool {
    helpers.iter().any(|h| h.shape().proc_sys)
}

/// A virtiofsd per virtiofs share (QEMU and cloud-hypervisor alike).
fn plan_virtiofsd(spec: &Spec, control_dir: &Path) -> Vec<Helper> {
    let Some(v) = &spec.virtiofsd else {
        return Vec::new();
    };
    let lit = |s: &str| Arg::Lit(s.to_string());
    spec.shares
        .iter()
        .enumerate()
        .filter(|(_, sh)| sh.proto == ShareProto::Virtiofs)
        .map(|(i, sh)| {
            let mut args = vec![
                Arg::Fd("--fd="),
                // Its root is the share (see share_root); it touches
                // nothing under the share's host path.
                lit("--shared-dir=/"),
                // The launcher's sandbox replaces virtiofsd's own (which
                // needs a user namespace or CAP_SYS_ADMIN).
                lit("--sandbox=none"),
                lit("--xattr"),
                lit("--posix-acl"),
                // File handles need CAP_DAC_READ_SEARCH (open_by_handle_at),
                // which it never has: `prefer` would try once, warn and
                // fall back to this.
                lit("--inode-file-handles=never"),
            ];
            if let Some(t) = v.thread_pool_size {
                args.push(Arg::Lit(format!(
                    "--thread-pool-size={}",
                    t.resolve(cpus_available())
                )));
            }
            if sh.read_only {
                args.push(lit("--readonly"));
            } else {
                // A share the guest owns: root of its own user namespace,
                // with no MKNOD or SETFCAP (see `owned`).
                args.push(lit(super::owned::MODCAPS));
            }
            Helper {
                kind: HelperKind::Virtiofsd,
                tag: Some(sh.tag.clone()),
                binary: v.binary.clone(),
                sockets: vec![control_dir.join(virtiofs_socket_name(&sh.tag))],
                share: Some(Share {
                    index: i,
                    source: sh.source.clone(),
                    read_only: sh.read_only,
                }),
                tcp: Tcp::Denied,
                args,
            }
        })
        .collect()
}

/// The CPUs this process may run on (`sched_getaffinity`), for a pool of
/// `"nproc"` threads; 1 when the kernel does not say.
fn cpus_available() -> usize {
    nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0))
        .map(|set| {
            (0..nix::sched::CpuSet::count())
                .filter(|&c| set.is_set(c).unwrap_or(false))
                .count()
        })
        .unwrap_or(1)
        .max(1)
}

/// vhost-device-vsock for QEMU's user vsock backend (cloud-hypervisor
/// serves its hybrid vsock itself).
fn plan_vhost_device_vsock(spec: &Spec, control_dir: &Path) -> Vec<Helper> {
    let Some(v) = &spec.vsock else {
        return Vec::new();
    };
    let (HypervisorKind::Qemu, VsockBackend::User, Some(b)) =
        (spec.hypervisor.kind, v.backend, &v.binary)
    else {
        return Vec::new();
    };
    let socket = control_dir.join(VSOCK_VHOST_USER_SOCKET);
    let host = control_dir.join(VSOCK_SOCKET);
    vec![Helper {
        kind: HelperKind::VhostDeviceVsock,
        tag: None,
        binary: b.clone(),
        args: vec![
            Arg::Lit(format!("--guest-cid={}", v.cid)),
            Arg::Lit(format!("--socket={}", socket.display())),
            Arg::Lit(format!("--uds-path={}", host.display())),
        ],
        sockets: vec![socket, host],
        share: None,
        tcp: Tcp::Denied,
    }]
}

/// passt for QEMU's user network interface (`config::user_net`); the
/// spec refuses it for the other hypervisors.
fn plan_passt(spec: &Spec, _control_dir: &Path) -> Vec<Helper> {
    let Some(u) = &spec.user_network else {
        return Vec::new();
    };
    if spec.hypervisor.kind != HypervisorKind::Qemu {
        return Vec::new();
    }
    let mut args = vec![Arg::Fd("--fd=")];
    args.extend(u.passt_args().into_iter().map(Arg::Lit));
    vec![Helper {
        kind: HelperKind::Passt,
        tag: Some(u.id.clone()),
        binary: u.binary.clone(),
        sockets: Vec::new(),
        share: None,
        tcp: Tcp::BindOnly(u.tcp_host_ports()),
        args,
    }]
}

/// `vmm-notify`, for a firecracker VM with vsock unless its spec turns it
/// off (`Spec::vmm_notify_port`): vmwarden's own code listening where the
/// guest's notify connections arrive.
fn plan_vmm_notify(spec: &Spec, control_dir: &Path) -> Vec<Helper> {
    let Some(port) = spec.vmm_notify_port() else {
        return Vec::new();
    };
    vec![Helper {
        kind: HelperKind::VmmNotify,
        tag: None,
        binary: PathBuf::from(OWN_CODE),
        sockets: vec![control_dir.join(hybrid_vsock_port_socket_name(port))],
        share: None,
        tcp: Tcp::Denied,
        args: Vec::new(),
    }]
}

/// `reboot-watch`, for a cloud-hypervisor VM with a virtiofs share
/// (`Spec::reboot_restarts_cloud_hypervisor`): vmwarden's own code reading
/// cloud-hypervisor's event monitor.
fn plan_reboot_watch(spec: &Spec, _control_dir: &Path) -> Vec<Helper> {
    if !spec.reboot_restarts_cloud_hypervisor() {
        return Vec::new();
    }
    vec![Helper {
        kind: HelperKind::RebootWatch,
        tag: None,
        binary: PathBuf::from(OWN_CODE),
        sockets: Vec::new(),
        share: None,
        tcp: Tcp::Denied,
        args: Vec::new(),
    }]
}

/// reboot-watch's `main`: read the event monitor until the VM reboots,
/// then end the hypervisor.
fn reboot_watch_main(own: Own) -> i32 {
    match (own.handed, own.hypervisor) {
        (Some(events), Some(hypervisor)) => ch_reboot::serve(events, hypervisor),
        _ => 1,
    }
}

/// vmm-notify's `main`: serve the listening socket until the guest powers
/// off, then end the hypervisor.
fn vmm_notify_main(own: Own) -> i32 {
    match (own.handed, own.hypervisor) {
        (Some(listener), Some(hypervisor)) => vmm_notify::serve(listener, hypervisor),
        _ => 1,
    }
}
