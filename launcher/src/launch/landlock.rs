//! Landlock: the last restriction before `execve`. Applied once, in the
//! single-threaded launcher, so the domain covers the whole hypervisor.
//!
//! Read/execute: the system's program and library trees, the hypervisor
//! binary, kernel, initrd, read-only disks, the credential tmpfs and the
//! spec's `landlock.read`. Read/write: the VM's state dir, writable disks,
//! writable 9p share sources, the KVM device and the spec's `landlock.write`. The control
//! dir (on the runtime root, i.e. `/run`) takes only Unix sockets: read,
//! make a socket, remove an entry. cloud-hypervisor and firecracker need
//! nothing more: their API socket and firecracker's config file (written
//! by root before the drop) live in the control dir.
//!
//! With `landlock.mode = "best-effort"` on a kernel without Landlock none of
//! this holds: the control dir is then limited only by its owner's DAC
//! rights (the principal's 0700 directory), so the hypervisor could fill
//! the runtime root's file system. The launcher says so in its log.
//! TCP bind/connect are denied; signals and abstract sockets are scoped to
//! the domain where the ABI allows.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use landlock::{
    Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, NetPort, PathBeneath, Ruleset,
    RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};
use nix::errno::Errno;
use nix::fcntl::{openat, OFlag, OpenHow, ResolveFlag, AT_FDCWD};
use nix::sys::stat::{fstat, Mode, SFlag};

use crate::config::paths::CH_API_LOCK;
use crate::config::spec::{HypervisorKind, ShareProto};
use crate::config::spec::{LandlockMode, Spec};
use crate::host::dirs::{self, DirError};

/// Landlock could not be applied as the spec asks.
#[derive(Debug, thiserror::Error)]
pub enum LandlockError {
    /// A rule's path cannot be granted; `field` is the spec field it comes
    /// from ("system path" for the built-in ones).
    #[error("landlock: `{field}`: {path}: {problem}")]
    Rule {
        field: String,
        path: PathBuf,
        #[source]
        problem: RuleProblem,
    },
    #[error("landlock: {0}")]
    Ruleset(#[from] landlock::RulesetError),
    #[error("landlock: landlock.mode is \"required\" but this kernel does not enforce Landlock (enable CONFIG_SECURITY_LANDLOCK and lsm=landlock,...), or set landlock.mode = \"best-effort\"")]
    NotEnforced,
}

/// Why a rule's path cannot be granted.
#[derive(Debug, thiserror::Error)]
pub enum RuleProblem {
    /// Walking to it inside a VM tree.
    #[error(transparent)]
    Walk(DirError),
    #[error(transparent)]
    Open(Errno),
    #[error("fstat: {0}")]
    Fstat(#[source] Errno),
    #[error("is a symlink inside the VM's own directory; refusing to grant access through it")]
    Symlink,
}

type Result<T, E = LandlockError> = std::result::Result<T, E>;

/// The newest ABI this build knows; older kernels get the best they have.
const BEST_ABI: ABI = ABI::V6;

/// Program, library and system trees a dynamically linked hypervisor reads.
pub const SYSTEM_READ: &[&str] = &[
    "/usr",
    "/lib",
    "/lib64",
    "/bin",
    "/sbin",
    "/nix/store",
    "/run/current-system/sw",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/proc",
    "/sys/devices/system/cpu",
    "/sys/devices/system/node",
    "/sys/kernel/mm/transparent_hugepage",
    "/dev/null",
    "/dev/zero",
    "/dev/urandom",
    "/dev/random",
];

/// Devices a hypervisor opens read-write. No `/dev/net/tun` or
/// `/dev/vhost-net`: taps arrive as open fds (vhost off), so QEMU and
/// cloud-hypervisor never open a tun device themselves (firecracker with
/// interfaces gets [`TUN_DEVICE`] too, see [`policy`]).
pub const DEVICES_RW: &[&str] = &["/dev/null", "/dev/kvm"];

/// The tun device firecracker opens to attach to its taps by name. The
/// kernel looks the name up in the caller's network namespace and lets a
/// process without CAP_NET_ADMIN attach to a tap its uid and gid own *or to
/// one with neither owner nor group*: granting the device is safe only
/// because firecracker runs in a network namespace that holds nothing but
/// its own taps (`launch::netns`).
pub const TUN_DEVICE: &str = "/dev/net/tun";

/// What a rule grants beneath its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    /// Read and execute: program and library trees, the hypervisor binary.
    Exec,
    /// Read only, never execute: kernel, initrd, credentials, read-only disks.
    Read,
    /// Read and write, never execute: the state dir, writable disks,
    /// devices. A VM cannot run what it writes.
    Write,
    /// The control dir: read what is there (firecracker's config file),
    /// create Unix sockets and remove entries, nothing else. No regular
    /// file, FIFO, directory or symlink can be made there and nothing
    /// there can be written or truncated, so the hypervisor cannot fill
    /// the runtime root's file system (`/run`) through it, nor plant a link
    /// for root's tools to follow.
    Socket,
    /// One file in the control dir the launcher made for the hypervisor to
    /// lock (cloud-hypervisor's API socket lock): opened for writing only,
    /// never truncated, executed or read.
    Lock,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    pub path: PathBuf,
    pub grant: Grant,
    /// The spec field the path comes from; `None` for the built-in system
    /// paths, which are skipped when a host lacks them. A missing spec path
    /// is an error naming its field.
    pub field: Option<String>,
}

/// Whether a domain restricts file system access.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Files {
    /// Every file system access is handled: allowed beneath the rules only.
    #[default]
    ByRules,
    /// None is handled (and the domain has no file rules). For a helper
    /// that sandboxes itself (passt): Landlock refuses `mount(2)` and
    /// `pivot_root(2)` to any process whose domain handles a file system
    /// access, and passt's own sandbox, in which it serves the guest, is a
    /// mount namespace whose root is an empty tmpfs. The launcher checks
    /// that root before it goes on (`launch::helpers`).
    NotHandled,
}

/// What a domain restricts of TCP.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Tcp {
    /// Bind and connect both handled, neither allowed.
    #[default]
    Denied,
    /// Only bind handled: these ports may be bound, no other. Connect is
    /// left to the process: passt connects wherever the guest does.
    BindOnly(Vec<u16>),
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Policy {
    pub rules: Vec<Rule>,
    pub files: Files,
    pub tcp: Tcp,
    /// Trees the VM's principal can write: rule paths inside them are
    /// opened without following any symlink (the VM could have planted one
    /// pointing at `/`).
    pub vm_trees: Vec<PathBuf>,
    /// Leave signals unscoped (abstract sockets stay scoped). Set for a
    /// hypervisor with helper daemons: their parent-death signal is sent
    /// as if by the dying hypervisor, and a scoped domain may not signal a
    /// process outside it, which each helper is (it has its own domain).
    /// What the hypervisor gains is only what DAC already limits it to:
    /// processes of its own dedicated uid, i.e. its helpers.
    pub signals_unscoped: bool,
    /// `no_new_privs` is known to be set: the caller applies this policy
    /// right after `sandbox::drop_privileges*`, which set it and saw it set
    /// in its self-check. The ruleset then skips its own
    /// `prctl(PR_SET_NO_NEW_PRIVS)` (which would change nothing). Left
    /// `false`, the ruleset sets it, as it always did.
    pub no_new_privs_set: bool,
}

/// The rule set for one VM, before it meets the kernel.
pub fn policy(spec: &Spec, state_dir: &Path, control_dir: &Path, creds_dir: &Path) -> Policy {
    let mut rules = Vec::new();
    let mut add = |path: &Path, grant, field: Option<String>| {
        rules.push(Rule {
            path: path.to_path_buf(),
            grant,
            field,
        })
    };
    for p in SYSTEM_READ {
        add(Path::new(p), Grant::Exec, None);
    }
    for p in DEVICES_RW {
        add(Path::new(p), Grant::Write, None);
    }
    if spec.hypervisor.kind == HypervisorKind::Firecracker && !spec.interfaces.is_empty() {
        add(
            Path::new(TUN_DEVICE),
            Grant::Write,
            Some("interfaces".into()),
        );
    }
    add(
        &spec.hypervisor.binary,
        Grant::Exec,
        Some("hypervisor.binary".into()),
    );
    add(&spec.kernel, Grant::Read, Some("kernel".into()));
    if let Some(i) = &spec.initrd {
        add(i, Grant::Read, Some("initrd".into()));
    }
    add(creds_dir, Grant::Read, Some("credentials dir".into()));
    add(state_dir, Grant::Write, Some("state dir".into()));
    add(control_dir, Grant::Socket, Some("control dir".into()));
    if spec.hypervisor.kind == HypervisorKind::CloudHypervisor {
        add(
            &control_dir.join(CH_API_LOCK),
            Grant::Lock,
            Some("control dir".into()),
        );
    }
    for (i, d) in spec.disks.iter().enumerate() {
        let g = if d.read_only {
            Grant::Read
        } else {
            Grant::Write
        };
        add(&d.path, g, Some(format!("disks[{i}].path")));
    }
    // 9p shares are served by QEMU itself (virtiofs shares by their own
    // virtiofsd, which the hypervisor never opens).
    for (i, sh) in spec.shares.iter().enumerate() {
        if sh.proto == ShareProto::NineP {
            let g = if sh.read_only {
                Grant::Read
            } else {
                Grant::Write
            };
            add(&sh.source, g, Some(format!("shares[{i}].source")));
        }
    }
    for (i, p) in spec.landlock.read.iter().enumerate() {
        add(p, Grant::Read, Some(format!("landlock.read[{i}]")));
    }
    for (i, p) in spec.landlock.write.iter().enumerate() {
        add(p, Grant::Write, Some(format!("landlock.write[{i}]")));
    }
    Policy {
        rules,
        vm_trees: vec![state_dir.to_path_buf(), control_dir.to_path_buf()],
        ..Policy::default()
    }
}

/// What any program the launcher runs as the principal besides the
/// hypervisor (a helper daemon, `mkfs`) needs: the system's program and
/// library trees, `/dev/null`, and its own binary (named by `field`).
pub fn program_rules(binary: &Path, field: String) -> Vec<Rule> {
    let mut rules: Vec<Rule> = SYSTEM_READ
        .iter()
        .map(|p| Rule {
            path: PathBuf::from(p),
            grant: Grant::Exec,
            field: None,
        })
        .collect();
    rules.push(Rule {
        path: PathBuf::from("/dev/null"),
        grant: Grant::Write,
        field: None,
    });
    rules.push(Rule {
        path: binary.to_path_buf(),
        grant: Grant::Exec,
        field: Some(field),
    });
    rules
}

/// The domain of one helper daemon (`launch::helpers`): the system's
/// program and library trees, its binary (`binary_field`), `/dev/null`, its
/// share (read-only or read-write, never execute) and, for a daemon that
/// makes its own sockets, the control dir (sockets only). Nothing of the
/// hypervisor's: no kernel, disk, credential or `/dev/kvm`.
pub fn helper_policy(
    binary: &Path,
    binary_field: &str,
    share: Option<(&Path, bool, String)>,
    control_dir: Option<&Path>,
    vm_trees: &[PathBuf],
) -> Policy {
    let mut rules = program_rules(binary, binary_field.to_string());
    if let Some((source, read_only, field)) = share {
        rules.push(Rule {
            path: source.to_path_buf(),
            grant: if read_only { Grant::Read } else { Grant::Write },
            field: Some(field),
        });
    }
    if let Some(c) = control_dir {
        rules.push(Rule {
            path: c.to_path_buf(),
            grant: Grant::Socket,
            field: Some("control dir".into()),
        });
    }
    Policy {
        rules,
        vm_trees: vm_trees.to_vec(),
        ..Policy::default()
    }
}

fn access(grant: Grant, abi: ABI) -> BitFlags<AccessFs> {
    let mut a = match grant {
        Grant::Exec | Grant::Read => AccessFs::from_read(abi),
        Grant::Write => AccessFs::from_all(abi),
        Grant::Socket => {
            AccessFs::ReadFile | AccessFs::ReadDir | AccessFs::MakeSock | AccessFs::RemoveFile
        }
        Grant::Lock => AccessFs::WriteFile.into(),
    };
    if grant != Grant::Exec {
        a.remove(AccessFs::Execute);
    }
    a
}

/// Open a rule's path as an `O_PATH` fd: inside a VM tree without following
/// any symlink, elsewhere normally (root-controlled paths such as
/// `/run/current-system/sw/bin/qemu` are symlinks into the store).
/// `Ok(None)`: a built-in path this host lacks.
fn open_rule(r: &Rule, vm_trees: &[PathBuf]) -> Result<Option<(OwnedFd, bool)>> {
    let bad = |problem: RuleProblem| LandlockError::Rule {
        field: r.field.as_deref().unwrap_or("system path").to_string(),
        path: r.path.clone(),
        problem,
    };
    let flags = OFlag::O_PATH | OFlag::O_CLOEXEC;
    let opened = if vm_trees.iter().any(|t| r.path.starts_with(t)) {
        // One openat2 that follows no symlink on the way; with
        // O_PATH|O_NOFOLLOW a symlink as the last component is opened
        // itself (and refused below), as the walk's openat would open it.
        // Anything but success takes the walk, which says what is wrong.
        let how = OpenHow::new()
            .flags(flags | OFlag::O_NOFOLLOW)
            .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS);
        match nix::fcntl::openat2(AT_FDCWD, &r.path, how) {
            Ok(fd) => Ok(fd),
            Err(_) => {
                let (parent, name) =
                    dirs::split_parent(&r.path).map_err(|e| bad(RuleProblem::Walk(e)))?;
                openat(
                    parent.fd.as_fd(),
                    name.as_str(),
                    flags | OFlag::O_NOFOLLOW,
                    Mode::empty(),
                )
            }
        }
    } else {
        openat(AT_FDCWD, &r.path, flags, Mode::empty())
    };
    let fd = match opened {
        Ok(fd) => fd,
        Err(Errno::ENOENT) if r.field.is_none() => return Ok(None),
        Err(e) => return Err(bad(RuleProblem::Open(e))),
    };
    let st = fstat(fd.as_fd()).map_err(|e| bad(RuleProblem::Fstat(e)))?;
    let kind = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits());
    if kind == SFlag::S_IFLNK {
        return Err(bad(RuleProblem::Symlink));
    }
    Ok(Some((fd, kind == SFlag::S_IFDIR)))
}

/// The rules with one entry per path, in the order paths first appear:
/// rules naming the same path (`/dev/null` is read by every program and
/// written by the hypervisor) become one, allowed the union of their
/// accesses — what the kernel grants for two rules on one inode anyway,
/// at one open and one `landlock_add_rule`. The merged rule names the
/// first spec field among them (so a missing path is still an error when
/// any spec field names it; built-in paths alone are skipped when absent).
fn merged(rules: &[Rule], abi: ABI) -> Vec<(Rule, BitFlags<AccessFs>)> {
    let mut out: Vec<(Rule, BitFlags<AccessFs>)> = Vec::with_capacity(rules.len());
    for r in rules {
        let a = access(r.grant, abi);
        // Byte equality (not Path's component-wise ==): the paths are
        // normalised, and this runs for every pair of rules.
        match out
            .iter_mut()
            .find(|(m, _)| m.path.as_os_str() == r.path.as_os_str())
        {
            Some((m, acc)) => {
                *acc |= a;
                if m.field.is_none() {
                    m.field.clone_from(&r.field);
                }
            }
            None => out.push((r.clone(), a)),
        }
    }
    out
}

/// What was enforced, for the launch log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Full,
    Partial,
    NotEnforced,
}

/// Restrict the calling (single) thread and its future `execve`.
pub fn apply(p: &Policy, mode: LandlockMode) -> Result<Outcome> {
    let abi = BEST_ABI;
    let compat = match mode {
        LandlockMode::Required => CompatLevel::BestEffort,
        LandlockMode::BestEffort => CompatLevel::BestEffort,
    };
    let mut scopes = Scope::from_all(abi);
    if p.signals_unscoped {
        scopes.remove(Scope::Signal);
    }
    let mut attr = Ruleset::default().set_compatibility(compat);
    if p.files == Files::ByRules {
        attr = attr.handle_access(AccessFs::from_all(abi))?;
    }
    attr = match &p.tcp {
        Tcp::Denied => attr.handle_access(AccessNet::from_all(abi))?,
        Tcp::BindOnly(_) => attr.handle_access(AccessNet::BindTcp)?,
    };
    let mut rs = attr
        .scope(scopes)?
        .create()?
        .no_new_privs(!p.no_new_privs_set);
    if let Tcp::BindOnly(ports) = &p.tcp {
        for port in ports {
            rs = rs.add_rule(NetPort::new(*port, AccessNet::BindTcp))?;
        }
    }
    let rules: &[Rule] = match p.files {
        Files::ByRules => &p.rules,
        Files::NotHandled => &[],
    };
    for (r, a) in merged(rules, abi) {
        let Some((fd, is_dir)) = open_rule(&r, &p.vm_trees)? else {
            continue;
        };
        let mut a = a;
        if !is_dir {
            a &= AccessFs::from_file(abi);
        }
        rs = rs.add_rule(PathBeneath::new(fd, a))?;
    }
    let status = rs.restrict_self()?;
    let outcome = match status.ruleset {
        RulesetStatus::FullyEnforced => Outcome::Full,
        RulesetStatus::PartiallyEnforced => Outcome::Partial,
        RulesetStatus::NotEnforced => Outcome::NotEnforced,
    };
    match (mode, &outcome) {
        (LandlockMode::Required, Outcome::NotEnforced) => Err(LandlockError::NotEnforced),
        (_, Outcome::Partial) => {
            tracing::warn!("landlock: partially enforced (kernel ABI older than {abi:?}); some restrictions are missing");
            Ok(outcome)
        }
        (LandlockMode::BestEffort, Outcome::NotEnforced) => {
            tracing::warn!("landlock: not enforced by this kernel; continuing because landlock.mode is \"best-effort\": the hypervisor can read what its uid can read and write anything into its control dir (on the runtime root's file system)");
            Ok(outcome)
        }
        _ => Ok(outcome),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(path: &str, grant: Grant, field: Option<&str>) -> Rule {
        Rule {
            path: PathBuf::from(path),
            grant,
            field: field.map(str::to_string),
        }
    }

    #[test]
    fn rules_on_one_path_merge_into_the_union_of_their_accesses() {
        let abi = BEST_ABI;
        let got = merged(
            &[
                rule("/usr", Grant::Exec, None),
                rule("/dev/null", Grant::Exec, None),
                rule("/dev/kvm", Grant::Write, None),
                rule("/dev/null", Grant::Write, None),
                rule("/usr", Grant::Read, Some("landlock.read[0]")),
            ],
            abi,
        );
        let paths: Vec<&Path> = got.iter().map(|(r, _)| r.path.as_path()).collect();
        assert_eq!(
            paths,
            [
                Path::new("/usr"),
                Path::new("/dev/null"),
                Path::new("/dev/kvm")
            ]
        );
        assert_eq!(
            got[1].1,
            access(Grant::Exec, abi) | access(Grant::Write, abi)
        );
        assert!(got[1].1.contains(AccessFs::Execute) && got[1].1.contains(AccessFs::WriteFile));
        assert_eq!(got[2].1, access(Grant::Write, abi));
        // A spec field among merged rules names the merged rule (a missing
        // path it names stays an error).
        assert_eq!(got[0].0.field.as_deref(), Some("landlock.read[0]"));
        assert_eq!(got[0].1, access(Grant::Exec, abi));
        // The launch's own policy names /dev/null twice.
        assert_eq!(
            DEVICES_RW
                .iter()
                .filter(|d| SYSTEM_READ.contains(d))
                .count(),
            1
        );
    }
}
