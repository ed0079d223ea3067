//! Landlock: the last restriction before `execve`. Applied once, in the
//! single-threaded launcher, so the domain covers the whole hypervisor.
//!
//! Read/execute: the system's program and library trees, the hypervisor
//! binary, kernel, initrd, read-only disks, the credential tmpfs and the
//! spec's `landlock.read`. Read/write: the VM's state and control dirs,
//! writable disks, the KVM and vsock devices and the spec's `landlock.write`.
//! cloud-hypervisor and firecracker need nothing more: their API socket and
//! firecracker's config file live in the control dir.
//! TCP bind/connect are denied; signals and abstract sockets are scoped to
//! the domain where the ABI allows.

use std::path::{Path, PathBuf};

use landlock::{
    path_beneath_rules, Access, AccessFs, AccessNet, CompatLevel, Compatible, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};

use crate::error::{Error, Result};
use crate::spec::{LandlockMode, Spec};

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
/// `/dev/vhost-net`: taps arrive as open fds (vhost off), so the hypervisor
/// never opens a tun device itself.
pub const DEVICES_RW: &[&str] = &["/dev/null", "/dev/kvm", "/dev/vhost-vsock"];

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Policy {
    pub read: Vec<PathBuf>,
    pub write: Vec<PathBuf>,
}

/// The rule set for one VM, before it meets the kernel.
pub fn policy(spec: &Spec, state_dir: &Path, control_dir: &Path, creds_dir: &Path) -> Policy {
    let mut read: Vec<PathBuf> = SYSTEM_READ.iter().map(PathBuf::from).collect();
    read.push(spec.hypervisor.binary.clone());
    read.push(spec.kernel.clone());
    if let Some(i) = &spec.initrd {
        read.push(i.clone());
    }
    read.push(creds_dir.to_path_buf());
    let mut write: Vec<PathBuf> = DEVICES_RW.iter().map(PathBuf::from).collect();
    write.push(state_dir.to_path_buf());
    write.push(control_dir.to_path_buf());
    for d in &spec.disks {
        if d.read_only {
            read.push(d.path.clone());
        } else {
            write.push(d.path.clone());
        }
    }
    read.extend(spec.landlock.read.iter().cloned());
    write.extend(spec.landlock.write.iter().cloned());
    Policy { read, write }
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
    let le = |e: landlock::RulesetError| Error::Landlock(e.to_string());
    let compat = match mode {
        LandlockMode::Required => CompatLevel::BestEffort,
        LandlockMode::BestEffort => CompatLevel::BestEffort,
    };
    let rs = Ruleset::default()
        .set_compatibility(compat)
        .handle_access(AccessFs::from_all(abi))
        .map_err(le)?
        .handle_access(AccessNet::from_all(abi))
        .map_err(le)?
        .scope(Scope::from_all(abi))
        .map_err(le)?
        .create()
        .map_err(le)?
        .add_rules(path_beneath_rules(&p.read, AccessFs::from_read(abi)))
        .map_err(le)?
        .add_rules(path_beneath_rules(&p.write, AccessFs::from_all(abi)))
        .map_err(le)?;
    let status = rs.restrict_self().map_err(le)?;
    let outcome = match status.ruleset {
        RulesetStatus::FullyEnforced => Outcome::Full,
        RulesetStatus::PartiallyEnforced => Outcome::Partial,
        RulesetStatus::NotEnforced => Outcome::NotEnforced,
    };
    match (mode, &outcome) {
        (LandlockMode::Required, Outcome::NotEnforced) => Err(Error::Landlock(
            "landlock.mode is \"required\" but this kernel does not enforce Landlock (enable CONFIG_SECURITY_LANDLOCK and lsm=landlock,...), or set landlock.mode = \"best-effort\"".into(),
        )),
        (_, Outcome::Partial) => {
            tracing::warn!("landlock: partially enforced (kernel ABI older than {abi:?}); some restrictions are missing");
            Ok(outcome)
        }
        (LandlockMode::BestEffort, Outcome::NotEnforced) => {
            tracing::warn!("landlock: not enforced by this kernel; continuing because landlock.mode is \"best-effort\"");
            Ok(outcome)
        }
        _ => Ok(outcome),
    }
}
