//! The launch's registration with systemd-machined
//! (`register_with_machined`), only from a cgroup of the VM's own.
//!
//! machined takes the unit of the leader's cgroup as the machine's unit:
//! what `machinectl terminate` stops and what `machinectl status` shows.
//! Under the VM's own unit (or alone in a scope of its own, `systemd-run
//! --scope`) that is the VM. A launch by hand from a login shell runs in
//! the session's scope: machined would take the session for the machine,
//! and `machinectl terminate` would end the session with everything in it.
//! So the launch registers only when its cgroup stands for the VM
//! ([`crate::host::cgroup::own_dedicated`], the
//! same judgement the intent record's cgroup is), and otherwise goes on
//! unregistered with a warning that says how to get the registration.

use crate::host::cgroup;
use crate::host::machined::{self, MachinedError};

/// Whether this launch registered, or why not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Registration {
    Registered,
    /// The launcher's cgroup is not the VM's own (`cgroup_said`: why).
    Skipped {
        cgroup_said: String,
    },
}

/// Register VM `name` (leader: this process, which becomes the hypervisor)
/// when `own_cgroup`; `cgroup_said` is the intent record's word on the
/// cgroup. The caller is single-threaded (checked before).
pub fn register(
    name: &str,
    own_cgroup: bool,
    cgroup_said: &str,
) -> Result<Registration, MachinedError> {
    if !own_cgroup {
        let at = cgroup::own_path().unwrap_or_else(|| "unknown".into());
        tracing::warn!(
            step = %"machine-registered",
            cgroup = %cgroup_said,
            "not registered with systemd-machined (register_with_machined): the launcher's cgroup {at} is not the VM's own, and machined would take its unit (a login session's scope, say) for the machine's, which `machinectl terminate` would end; start the VM with its unit (systemctl start), or alone in a scope (systemd-run --scope)"
        );
        return Ok(Registration::Skipped {
            cgroup_said: cgroup_said.to_string(),
        });
    }
    machined::register(name, std::process::id())?;
    tracing::info!(step = %"machine-registered", class = "vm", "registered with systemd-machined");
    Ok(Registration::Registered)
}
