//! A cloud-hypervisor guest that reboots with a virtiofs share: restarted
//! clean, as a firecracker guest is.
//!
//! cloud-hypervisor reboots in place: it drops the VM's devices and makes
//! them again in the same process. A virtio-fs device is a vhost-user
//! frontend, and virtiofsd serves one connection: it ends when the old
//! device lets go, and the new device retries its socket for about a
//! minute before cloud-hypervisor gives up with exit status 1. So for such
//! a VM the launcher hands cloud-hypervisor an event monitor
//! (`--event-monitor fd=N`, one end of a socket pair) and starts a helper,
//! `reboot-watch` (`launch::helpers`, `hypervisor::ch_reboot`), that reads
//! it and ends cloud-hypervisor with [`REBOOT_SIGNAL`] as soon as it says
//! `rebooting`. systemd counts that signal as a clean exit
//! (`Result=success`) and the VM's drop-in names it in
//! `RestartForceExitStatus=`: the unit cleans up and starts the VM again,
//! with a fresh virtiofsd in the same sandbox, as it does after a
//! firecracker guest's reboot. Without a unit the VM ends there, by that
//! signal, and nothing starts it again (docs/operating.md).

use crate::config::spec::{HypervisorKind, ShareProto, Spec};

/// The signal `reboot-watch` ends cloud-hypervisor with, as systemd names
/// it in `RestartForceExitStatus=`. cloud-hypervisor handles only SIGTERM
/// and SIGINT (a shutdown) and SIGWINCH: this one ends it by its default
/// action, and systemd counts it (with SIGTERM, SIGINT and SIGPIPE) as a
/// clean exit of a service's main process.
pub const REBOOT_SIGNAL: &str = "SIGHUP";

impl Spec {
    /// Whether a reboot of this VM's guest ends its hypervisor for the unit
    /// to start again (a cloud-hypervisor VM with a virtiofs share; the
    /// spec refuses such a share without `virtiofsd`).
    pub fn reboot_restarts_cloud_hypervisor(&self) -> bool {
        self.hypervisor.kind == HypervisorKind::CloudHypervisor
            && self.virtiofsd.is_some()
            && self.shares.iter().any(|s| s.proto == ShareProto::Virtiofs)
    }
}
