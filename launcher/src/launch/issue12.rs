//! Launch-time checks of the issue-12 fields (shares, created disks, vsock,
//! `extra_args`) that need the roots, the other specs or the principal.
//! Nothing here creates or changes anything on the host.

use std::path::Path;

use crate::config::files::Kind;
use crate::config::paths::Roots;
use crate::config::spec::{Spec, SpecError};
use crate::host::trust::{self, Policy};
use crate::identity::principal::Principal;

fn bad(spec_path: &Path, field: String, reason: String) -> SpecError {
    SpecError::Invalid {
        path: spec_path.to_path_buf(),
        field,
        reason,
    }
}

/// Before the principal is known: `extra_args` against this VM's actual
/// `control/`, share sources and created images inside this VM's own
/// directories only, and the vsock CID unique across the config dir.
pub fn check_roots(spec: &Spec, spec_path: &Path, roots: &Roots) -> Result<(), SpecError> {
    spec.validate_extra_args(spec_path, &roots.control_dir(&spec.name))?;
    let own_state = roots.state_dir(&spec.name);
    for (i, sh) in spec.shares.iter().enumerate() {
        let field = format!("shares[{i}].source");
        let src = &sh.source;
        if src.starts_with(&roots.runtime_root) {
            return Err(bad(
                spec_path,
                field,
                format!(
                    "{} is inside the runtime root {} (control sockets, leases and credentials); share a directory of the VM's state dir {} instead",
                    src.display(),
                    roots.runtime_root.display(),
                    own_state.display()
                ),
            ));
        }
        if src.starts_with(&roots.state_root) && !src.starts_with(&own_state) {
            return Err(bad(
                spec_path,
                field,
                format!(
                    "{} is inside another VM's directory (only {} belongs to this VM)",
                    src.display(),
                    own_state.display()
                ),
            ));
        }
        for (what, root) in [
            ("state root", &roots.state_root),
            ("runtime root", &roots.runtime_root),
            ("config dir", &roots.config_dir),
        ] {
            if root.starts_with(src) {
                return Err(bad(
                    spec_path,
                    field,
                    format!(
                        "{} contains vmwarden's {what} {}, with every VM's files; share a directory below it",
                        src.display(),
                        root.display()
                    ),
                ));
            }
        }
    }
    for (i, d) in spec.disks.iter().enumerate() {
        if d.create.is_some() && !(d.path.starts_with(&own_state) && d.path != own_state) {
            return Err(bad(
                spec_path,
                format!("disks[{i}].create"),
                format!(
                    "is set for {}, but vmwarden creates images only strictly inside the VM's own state dir {}/; create the image yourself (owned by the VM's principal, mode 0600) and drop `create`",
                    d.path.display(),
                    own_state.display()
                ),
            ));
        }
    }
    if let Some(v) = &spec.vsock {
        check_cid_unique(spec, spec_path, roots, v.cid)?;
    }
    Ok(())
}

/// No other spec in the config dir claims the same CID: two guests with one
/// CID would see each other's host traffic (vhost backend) or fail to start.
fn check_cid_unique(
    spec: &Spec,
    spec_path: &Path,
    roots: &Roots,
    cid: u64,
) -> Result<(), SpecError> {
    let Ok(entries) = std::fs::read_dir(&roots.config_dir) else {
        return Ok(());
    };
    let mut others: Vec<_> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json") && p.as_path() != spec_path)
        .collect();
    others.sort();
    for p in others {
        // Only a spec that reads as one counts; its own launch reports
        // whatever else is wrong with it.
        let Ok(other) = Spec::read(&p) else { continue };
        if other.name == spec.name {
            continue;
        }
        if other.vsock.as_ref().is_some_and(|o| o.cid == cid) {
            return Err(bad(
                spec_path,
                "vsock.cid".into(),
                format!(
                    "{cid} is also the CID of VM {:?} ({}); CIDs must be unique across {}",
                    other.name.as_str(),
                    p.display(),
                    roots.config_dir.display()
                ),
            ));
        }
    }
    Ok(())
}

/// After the principal is resolved, one trusted walk (`host::trust`,
/// [`Policy::Principal`]) per share source and disk image: every entry on
/// the way root's or the principal's, nothing writable by anyone else
/// (mode bits and POSIX ACLs alike; see the policy). A writable share is
/// moreover the principal's own. Images of `disks[].create` are
/// `volumes::preflight`'s.
pub fn check_principal(
    spec: &Spec,
    spec_path: &Path,
    principal: &Principal,
) -> Result<(), SpecError> {
    let policy = Policy::Principal {
        uid: principal.uid,
        gid: principal.gid,
    };
    for (i, sh) in spec.shares.iter().enumerate() {
        let field = format!("shares[{i}].source");
        let w = trust::walk(&sh.source, policy).map_err(|cause| {
            bad(
                spec_path,
                field.clone(),
                format!(
                    "cannot be shared: {cause}; a share (and every directory above it) may be owned and writable only by root and the VM's principal"
                ),
            )
        })?;
        if Kind::of(w.stat.st_mode) != Kind::Directory {
            return Err(bad(
                spec_path,
                field,
                format!("{} is not a directory", sh.source.display()),
            ));
        }
        if !sh.read_only && w.stat.st_uid != principal.uid {
            return Err(bad(
                spec_path,
                field,
                format!(
                    "{} is writable for the guest but owned by uid {}, not the VM's principal {}; chown it to the principal (or put it in the VM's state dir), or share it read-only",
                    sh.source.display(),
                    w.stat.st_uid,
                    principal.uid
                ),
            ));
        }
    }
    for (i, d) in spec.disks.iter().enumerate() {
        // An image vmwarden creates is strictly inside the VM's own state
        // dir (`check_roots`), and `volumes::preflight` holds an existing
        // one to the principal's own regular file, reached without a link.
        if d.create.is_some() {
            continue;
        }
        trust::walk(&d.path, policy).map_err(|cause| {
            bad(
                spec_path,
                format!("disks[{i}].path"),
                format!(
                    "cannot be given to the VM: {cause}; a disk image (and every directory above it) may be owned and writable only by root and the VM's principal"
                ),
            )
        })?;
    }
    Ok(())
}
