//! The spec an instance was launched from. The launcher keeps a copy of
//! the exact bytes it validated (`RUNTIME/NAME/launched-spec.json`, root
//! 0600), named in the intent record before it is written. While that
//! record exists, the tools that act on the instance (stop, cleanup,
//! verify-clean, reap, purge) believe the copy rather than the configured
//! spec, which a rebuild may already have replaced (`restartIfChanged =
//! false`); `status` compares the two to say whether the VM is outdated.

use crate::config::names::VmName;
use crate::config::paths::{Roots, LAUNCHED_SPEC_FILE};
use crate::config::spec::{Spec, MAX_SPEC_BYTES};
use crate::host::dirs::{self, Dir, DirError};
use crate::instance::intent::Intent;

/// Where the spec a tool believes came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The launched copy named by the instance's intent record.
    Launched,
    /// The configured spec, `CONFIG_DIR/NAME.json`.
    Configured,
}

/// The bytes of the copy `intent` names, read from `rundir` by its fixed
/// name (never following a symlink or a path from the record). `Ok(None)`
/// when the record names no copy, or the copy does not exist (a launch
/// killed between writing the record and the copy).
pub fn copy_bytes(rundir: &Dir, intent: &Intent) -> Result<Option<Vec<u8>>, DirError> {
    if intent.launched_spec().is_none() {
        return Ok(None);
    }
    dirs::read_small(rundir, LAUNCHED_SPEC_FILE, MAX_SPEC_BYTES)
}

/// The spec to believe for VM `name`: the launched copy while the
/// instance's record (`intent`) names one that reads and parses, else the
/// configured spec; `None` when neither can be read.
pub fn effective_spec(
    roots: &Roots,
    name: &VmName,
    intent: Option<&Intent>,
) -> Option<(Spec, Origin)> {
    let launched = intent.and_then(|i| {
        let rundir = dirs::open_dir(&roots.runtime_dir(name)).ok()?;
        let bytes = copy_bytes(&rundir, i).ok()??;
        Spec::parse(&roots.launched_spec_path(name), &bytes).ok()
    });
    match launched {
        Some(spec) => Some((spec, Origin::Launched)),
        None => Spec::read(&roots.spec_path(name))
            .ok()
            .map(|s| (s, Origin::Configured)),
    }
}

/// [`effective_spec`], reading the intent record itself.
pub fn effective_spec_of(roots: &Roots, name: &VmName) -> Option<(Spec, Origin)> {
    let intent = dirs::open_dir(&roots.runtime_dir(name))
        .ok()
        .and_then(|d| Intent::read(&d).ok().flatten());
    effective_spec(roots, name, intent.as_ref())
}
