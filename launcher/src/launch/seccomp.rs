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
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

use crate::error::{Error, Result};

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
    TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|e| Error::Other(format!("seccomp: unsupported architecture: {e:?}")))
}

/// The compiled filter (built before it is installed, so a build error is
/// reported while nothing is restricted yet).
pub fn program() -> Result<BpfProgram> {
    let se = |e: seccompiler::BackendError| Error::Other(format!("seccomp: {e}"));
    let mut rules = Vec::new();
    for (_, cmd) in DENIED_IOCTLS {
        let c = SeccompCondition::new(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, *cmd)
            .map_err(se)?;
        rules.push(SeccompRule::new(vec![c]).map_err(se)?);
    }
    let mut map = BTreeMap::new();
    map.insert(libc::SYS_ioctl, rules);
    let filter = SeccompFilter::new(
        map,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch()?,
    )
    .map_err(se)?;
    filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| Error::Other(format!("seccomp: {e}")))
}

/// Install the filter on the calling (only) thread; `no_new_privs` must be
/// set already (it is, by the privilege drop).
pub fn apply(prog: &BpfProgram) -> Result<()> {
    seccompiler::apply_filter(prog).map_err(|e| Error::Other(format!("seccomp: {e}")))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_filter_compiles_for_this_architecture() {
        let p = super::program().unwrap();
        assert!(!p.is_empty());
    }
}
