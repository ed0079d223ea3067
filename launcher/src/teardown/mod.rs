//! Teardown with proof: per-stop cleanup, the reaper, purge, verify-clean;
//! and adopt, which moves a stopped microvm.nix VM's state in.
//! Every destructive path asks `instance::liveness` first.

pub mod adopt;
pub mod cleanup;
pub mod devices;
pub mod hibernate;
pub mod machine;
pub mod made_sources;
pub mod purge;
pub mod reap;
pub mod taps;
pub mod verify;

use crate::config::names::VmName;
use crate::config::paths::Roots;
use crate::host::dirs::{self, DirError, Loose, Want};
use crate::instance::lease::{Lease, LeaseError};

/// The VM's lease, taken as a launch takes it: the runtime root (root's;
/// refused when others may write it) and the VM's runtime dir (root's, 0755) made if
/// missing, then the lease file locked. `None`: something holds it (a
/// launch started meanwhile). The destructive tools (purge, adopt) hold it
/// for their whole change, so no launch starts in between.
pub(crate) fn lease_as_a_launch<E>(roots: &Roots, name: &VmName) -> Result<Option<Lease>, E>
where
    E: From<DirError> + From<LeaseError>,
{
    let want = Want {
        uid: 0,
        gid: 0,
        mode: 0o755,
        loose: Loose::Refuse,
    };
    let (rt_parent, rt_name) = dirs::split_parent(&roots.runtime_root)?;
    let (runtime_root, _) = dirs::ensure(&rt_parent, &rt_name, &dirs::root_want("--runtime-root"))?;
    let (rundir, _) = dirs::ensure(&runtime_root, name.as_str(), &want)?;
    Ok(Lease::acquire(&rundir)?)
}
