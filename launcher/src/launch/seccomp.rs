//! A small seccomp filter the launcher installs last, on top of whatever the
//! hypervisor installs itself (filters stack; the strictest answer wins).
//!
//! It closes what the hypervisor could otherwise do with the tap fds it
//! inherits, with no capability at all: make a tap persistent (so it
//! outlives the VM), hand it to another owner, or set the host-side MAC
//! (a tap claiming the router's MAC takes a bridge's traffic). The ioctls a
//! hypervisor uses on a tap (TUNGETIFF, TUNGETFEATURES, TUNSETOFFLOAD,
//! TUNSETVNETHDRSZ, TUNSETSNDBUF, …) stay allowed.

use std::collections::BTreeMap;

use seccompiler::{
    BackendError, BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition,
    SeccompFilter, SeccompRule, TargetArch,
};

/// The filter could not be built or installed.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("seccomp: unsupported architecture: {0:?}")]
    Arch(#[source] BackendError),
    #[error("seccomp: {0}")]
    Compile(#[from] BackendError),
    #[error("seccomp: {0}")]
    Install(#[from] seccompiler::Error),
}

type Result<T, E = SeccompError> = std::result::Result<T, E>;

/// `ioctl` requests refused with EPERM (include/uapi/linux/if_tun.h,
/// sockios.h): the low 32 bits are compared, as the kernel reads `cmd` as
/// an unsigned int.
pub const DENIED_IOCTLS: &[(&str, u64)] = &[
    ("TUNSETIFF", 0x4004_54ca),
    ("TUNSETPERSIST", 0x4004_54cb),
    ("TUNSETOWNER", 0x4004_54cc),
    ("TUNSETLINK", 0x4004_54cd),
    ("TUNSETGROUP", 0x4004_54ce),
    ("TUNSETIFINDEX", 0x4004_54da),
    ("TUNSETCARRIER", 0x4004_54e2),
    ("SIOCSIFHWADDR", 0x8924),
];

fn arch() -> Result<TargetArch> {
    TargetArch::try_from(std::env::consts::ARCH).map_err(SeccompError::Arch)
}

/// The compiled filter (built before it is installed, so a build error is
/// reported while nothing is restricted yet).
pub fn program() -> Result<BpfProgram> {
    let mut rules = Vec::new();
    for (_, cmd) in DENIED_IOCTLS {
        let c = SeccompCondition::new(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, *cmd)?;
        rules.push(SeccompRule::new(vec![c])?);
    }
    let mut map = BTreeMap::new();
    map.insert(libc::SYS_ioctl, rules);
    let filter = SeccompFilter::new(
        map,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch()?,
    )?;
    Ok(filter.try_into()?)
}

/// Install the filter on the calling (only) thread; `no_new_privs` must be
/// set already (it is, by the privilege drop).
pub fn apply(prog: &BpfProgram) -> Result<()> {
    Ok(seccompiler::apply_filter(prog)?)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_filter_compiles_for_this_architecture() {
        let p = super::program().unwrap();
        assert!(!p.is_empty());
    }
}
