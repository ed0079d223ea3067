//! The runtime-dir protocol that launch and teardown share: the flock lease,
//! the intent record written before any resource exists, the one
//! liveness probe every tool believes, and the marks that tell a runtime
//! dir vmwarden made from one it did not.

pub mod at_shutdown;
pub mod creds_floor;
pub mod hibernated;
pub mod intent;
pub mod last_cleanup;
pub mod launched;
pub mod lease;
pub mod liveness;
pub mod made_sources;
pub mod marks;

use crate::config::names::VmName;
use crate::config::paths::Roots;
use crate::identity::principal::configured_specs;

/// Every VM that is configured or has a runtime dir, sorted by name.
pub fn known_vms(roots: &Roots) -> Vec<VmName> {
    let mut names: Vec<VmName> = configured_specs(roots)
        .into_iter()
        .map(|(n, _, _)| n)
        .collect();
    if let Ok(rd) = std::fs::read_dir(&roots.runtime_root) {
        for e in rd.flatten() {
            if let Some(n) = e.file_name().to_str().and_then(|n| VmName::parse(n).ok()) {
                if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    names.push(n);
                }
            }
        }
    }
    names.sort();
    names.dedup();
    names
}
