//! The systemd-machined registration of a VM (`register_with_machined`),
//! as the teardown sees it.
//!
//! machined ends a registration when the unit of its leader stops (it
//! watches the unit, not the process: while `ExecStopPost=` cleanup runs,
//! the unit is still deactivating and the machine still listed, with a
//! dead leader). A VM launched by hand, or a launch that failed after
//! registering, leaves a registration until its scope ends. So cleanup
//! ends the instance's registration itself (`UnregisterMachine`: no
//! process is signalled) and checks that it is gone, and verify-clean
//! checks that no vmwarden registration of a stopped VM is left. A
//! machine of the same name that vmwarden did not register (another
//! service's, or one whose leader is not the instance's) is never touched.

use std::path::PathBuf;

use crate::config::names::VmName;
use crate::host::machined::{self, MachinedError, SERVICE};

/// machined's own record of a machine (what `machinectl` reads), named in
/// reports as the thing left behind.
pub fn state_path(name: &VmName) -> PathBuf {
    PathBuf::from("/run/systemd/machines").join(name.as_str())
}

/// End the registration instance `pid` made of VM `name`, and check that
/// it is gone. `Err` says what is left and why.
pub fn end_registration(name: &VmName, pid: u32) -> Result<(), String> {
    match machined::machine(name.as_str()) {
        Ok(None) => return Ok(()),
        Ok(Some(m)) if m.service != SERVICE || m.leader != pid => {
            tracing::info!(vm = %name, leader = m.leader, service = %m.service, "a machine of this name is not this instance's registration; left alone");
            return Ok(());
        }
        Ok(Some(_)) => {}
        // No machined: nothing can be registered there.
        Err(MachinedError::Unavailable { .. }) => return Ok(()),
        Err(e) => return Err(e.to_string()),
    }
    machined::unregister(name.as_str()).map_err(|e| e.to_string())?;
    match machined::machine(name.as_str()) {
        Ok(Some(m)) if m.service == SERVICE && m.leader == pid => {
            Err("still registered with systemd-machined after UnregisterMachine".into())
        }
        Ok(_) | Err(MachinedError::Unavailable { .. }) => {
            tracing::info!(vm = %name, "systemd-machined registration ended");
            Ok(())
        }
        Err(e) => Err(e.to_string()),
    }
}

/// verify-clean: no vmwarden registration of VM `name` is left. `Ok(None)`
/// when there is none (or no machined), `Ok(Some(leader))` when one is.
pub fn left_registration(name: &VmName) -> Result<Option<u32>, String> {
    match machined::machine(name.as_str()) {
        Ok(Some(m)) if m.service == SERVICE => Ok(Some(m.leader)),
        Ok(_) | Err(MachinedError::Unavailable { .. }) => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}
