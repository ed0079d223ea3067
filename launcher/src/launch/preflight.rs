//! The checks before anything is created, in two calls of the step list:
//! [`check_against_roots`] once the spec is loaded (its paths scoped to
//! this VM; shares, created disks, vsock and `extra_args` against the
//! roots and the other specs) and [`check_with_principal`] once the
//! principal is known (bridges and taps, what root hands to the hypervisor
//! walked and trusted, the hypervisor binary asked about its sandbox and
//! its fw_cfg, what the principal must own). Nothing here creates or
//! changes anything on the host.

use std::path::Path;
use std::time::Instant;

use netlink_packet_route::link::InfoKind;

use crate::config::files::{Distrust, Kind};
use crate::config::paths::Roots;
use crate::config::spec::{
    CredentialSource, HypervisorKind, SandboxMode, ShareSpec, Spec, SpecError, NIX_STORE,
};
use crate::config::user_net::{ForwardFrom, UNPRIVILEGED_PORT_START};
use crate::host::net;
use crate::host::sys::read_path;
use crate::host::trust::{self, Policy};
use crate::hypervisor::{self, SandboxProbe};
use crate::identity::principal::{self, Principal};
use crate::identity::ranges;
use crate::identity::registry::{self, IdRange};
use crate::launch::{helpers, macvtap, probe, share_sources, volumes, StepError};

type Result<T, E = StepError> = std::result::Result<T, E>;

fn bad(spec_path: &Path, field: String, reason: String) -> SpecError {
    SpecError::Invalid {
        path: spec_path.to_path_buf(),
        field,
        reason,
    }
}

/// Step 2, once the spec is loaded: its paths inside this VM's own
/// directories only (`check_spec_paths_scoped`), then its shares,
/// created images, vsock and `extra_args` against the roots
/// (`check_roots`).
pub fn check_against_roots(spec: &Spec, spec_path: &Path, roots: &Roots) -> Result<()> {
    check_spec_paths_scoped(spec, spec_path, roots)?;
    check_roots(spec, spec_path, roots)?;
    Ok(())
}

/// Step 3, once the principal is known and the directories that exist are
/// vetted, in order: the interfaces (`preflight_interfaces`) and the
/// user network (`preflight_user_network`); what root
/// hands to the hypervisor (binary, kernel, initrd, helpers) root's alone
/// (`check_trusted_files`, the last walk of `walker`); the host's
/// hugepage pool and KSM (`preflight_memory`); the binary asked
/// about its sandbox (`qemu_sandbox`) and, with credentials, its fw_cfg
/// (`cloud_hypervisor_credentials`); the shares and images the principal
/// must own (`check_principal`); the room for created volumes
/// (`volumes::preflight`). Returns whether QEMU gets `-sandbox`.
pub fn check_with_principal(
    spec: &Spec,
    spec_path: &Path,
    spec_walk: std::result::Result<(), Distrust>,
    roots: &Roots,
    mut walker: trust::Walker,
    principal: &Principal,
    to_make: &share_sources::Plan,
) -> Result<bool> {
    preflight_interfaces(spec, spec_path, roots)?;
    preflight_user_network(spec, spec_path)?;
    preflight_memory(spec, spec_path)?;
    check_trusted_files(spec, spec_path, spec_walk, roots, &mut walker)?;
    drop(walker);
    let qemu_sandbox = qemu_sandbox(spec, spec_path, principal, roots)?;
    cloud_hypervisor_credentials(spec, spec_path, principal, roots)?;
    // The VM's own id range, if it has one yet: what the guest owns on its
    // writable virtiofs shares belongs to it.
    // Checked again at every launch: an account added since, or one NSS
    // serves, in the range refuses the launch, named.
    let ids = if spec.shares.iter().any(ShareSpec::guest_owned) {
        let ids = registry::range_of(roots, &spec.name)?;
        if let Some(r) = ids {
            ranges::check_again(roots, &spec.name, principal, r)
                .map_err(registry::RegistryError::from)?;
        }
        ids
    } else {
        None
    };
    check_principal(spec, spec_path, principal, ids, to_make)?;
    volumes::preflight(spec, spec_path, principal, &roots.state_dir(&spec.name))?;
    Ok(qemu_sandbox)
}

/// Before the principal is known: `extra_args` against this VM's actual
/// `control/`, share sources and created images inside this VM's own
/// directories only, and the vsock CID unique across the config dir.
fn check_roots(spec: &Spec, spec_path: &Path, roots: &Roots) -> Result<(), SpecError> {
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
fn check_principal(
    spec: &Spec,
    spec_path: &Path,
    principal: &Principal,
    ids: Option<IdRange>,
    to_make: &share_sources::Plan,
) -> Result<(), SpecError> {
    let policy = Policy::Principal {
        uid: principal.uid,
        gid: principal.gid,
    };
    for (i, sh) in spec.shares.iter().enumerate() {
        // Missing, and made by this launch in a parent of root's alone.
        if to_make.makes(i) {
            continue;
        }
        let field = format!("shares[{i}].source");
        // The one exception: the Nix store, read-only, as Nix makes it
        // (root's, sticky, its build users' group may add paths). Its
        // group cannot rename, delete or replace a path root owns, and the
        // guest reads only (`host::trust::walk_store`; the threat model).
        // `validate_shares` already refused a writable share under it.
        let store = sh.read_only && sh.source == Path::new(NIX_STORE);
        // A share the guest owns may belong to the VM's own ids (the
        // guest's chown and chgrp through its virtiofsd leave it so).
        let owned = ids.filter(|_| sh.guest_owned());
        let walked = match (store, owned) {
            (true, _) => trust::walk_store(&sh.source, policy),
            (false, Some(r)) => trust::walk_owned(&sh.source, policy, r.base + 1..r.end()),
            (false, None) => trust::walk(&sh.source, policy),
        };
        let w = walked.map_err(|cause| {
            // A sticky directory its group writes looks like a store: say
            // which one is accepted.
            let sticky = matches!(&cause, Distrust::Writable { mode, .. } if mode & 0o1000 != 0);
            let hint = if sticky && !store {
                format!(" (a sticky directory its group may write is accepted as a share only as the Nix store itself, {NIX_STORE}, shared read-only)")
            } else {
                String::new()
            };
            bad(
                spec_path,
                field.clone(),
                format!(
                    "cannot be shared: {cause}; a share (and every directory above it) may be owned and writable only by root and the VM's principal{hint}"
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
        let own =
            w.stat.st_uid == principal.uid || owned.is_some_and(|r| r.contains(w.stat.st_uid));
        if !sh.read_only && !own {
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

/// Spec paths must not point into another VM's runtime or state directory:
/// those are masked inside the sandbox (and are not this VM's).
fn check_spec_paths_scoped(spec: &Spec, spec_path: &Path, roots: &Roots) -> Result<(), SpecError> {
    let own_state = roots.state_dir(&spec.name);
    let own_run = roots.runtime_dir(&spec.name);
    let mut fields: Vec<(String, &Path)> = vec![
        ("kernel".into(), &spec.kernel),
        ("hypervisor.binary".into(), &spec.hypervisor.binary),
    ];
    for (i, c) in spec.credentials.iter().enumerate() {
        if let CredentialSource::Path(p) = &c.source {
            fields.push((format!("credentials[{i}].source.path"), p));
        }
    }
    if let Some(i) = &spec.initrd {
        fields.push(("initrd".into(), i));
    }
    for (i, d) in spec.disks.iter().enumerate() {
        fields.push((format!("disks[{i}].path"), &d.path));
    }
    for (i, p) in spec.landlock.read.iter().enumerate() {
        fields.push((format!("landlock.read[{i}]"), p));
    }
    for (i, p) in spec.landlock.write.iter().enumerate() {
        fields.push((format!("landlock.write[{i}]"), p));
    }
    for (field, p) in fields {
        // What root trusts (the hypervisor binary, kernel and initrd it
        // hands over) must not lie where any VM, this one included, can
        // write: vmwarden's state and runtime roots hold only VM dirs.
        let executed = matches!(field.as_str(), "hypervisor.binary" | "kernel" | "initrd");
        if executed && (p.starts_with(&roots.state_root) || p.starts_with(&roots.runtime_root)) {
            return Err(SpecError::Invalid {
                path: spec_path.to_path_buf(),
                field,
                reason: format!(
                    "{} is inside vmwarden's state or runtime root ({} or {}), where VMs write; \
                     nothing a VM can write is executed or trusted by root",
                    p.display(),
                    roots.state_root.display(),
                    roots.runtime_root.display()
                ),
            });
        }
        let foreign = (p.starts_with(&roots.state_root) && !p.starts_with(&own_state))
            || (p.starts_with(&roots.runtime_root) && !p.starts_with(&own_run));
        if foreign {
            return Err(SpecError::Invalid {
                path: spec_path.to_path_buf(),
                field,
                reason: format!(
                    "{} is inside another VM's directory (only {} and {} belong to this VM)",
                    p.display(),
                    own_state.display(),
                    own_run.display()
                ),
            });
        }
    }
    Ok(())
}

/// The spec, the hypervisor binary, kernel and initrd: every component from `/`
/// owned by root and writable by root only (symlinks followed one
/// component at a time, each directory they lead through checked; see
/// `host::trust`), and not inside vmwarden's roots once resolved.
fn check_trusted_files(
    spec: &Spec,
    spec_path: &Path,
    spec_walk: std::result::Result<(), Distrust>,
    roots: &Roots,
    walker: &mut trust::Walker,
) -> Result<()> {
    // The spec itself decides what root runs and reads: it must be root's
    // alone too (on NixOS a chain of links into the Nix store, which
    // passes). `spec_walk`: its walk, made before it was read.
    spec_walk.map_err(|cause| StepError::UntrustedSpec {
        path: spec_path.to_path_buf(),
        cause,
    })?;
    let mut fields: Vec<(&'static str, &Path)> = vec![
        ("hypervisor.binary", &spec.hypervisor.binary),
        ("kernel", &spec.kernel),
    ];
    if let Some(i) = &spec.initrd {
        fields.push(("initrd", i));
    }
    // The helpers root starts for the VM (each entry of the helper table
    // whose binary the spec names) are trusted like the hypervisor: root's
    // alone.
    for shape in helpers::TABLE {
        if let Some(b) = (shape.binary)(spec) {
            fields.push((shape.binary_field, b));
        }
    }
    for (field, p) in fields {
        let w = walker
            .regular_file(p, Policy::Executable)
            .map_err(|cause| StepError::Untrusted {
                spec: spec_path.to_path_buf(),
                field,
                cause,
            })?;
        if w.resolved.starts_with(&roots.state_root) || w.resolved.starts_with(&roots.runtime_root)
        {
            return Err(StepError::Spec(SpecError::Invalid {
                path: spec_path.to_path_buf(),
                field: field.to_string(),
                reason: format!(
                    "{} resolves to {}, inside vmwarden's state or runtime root, where VMs write",
                    p.display(),
                    w.resolved.display()
                ),
            }));
        }
    }
    Ok(())
}

/// Ask the hypervisor binary with `args`, as the principal in the
/// hypervisor's own confinement, under [`probe::PROBE_TIMEOUT`]
/// (`launch::probe`).
fn ask(
    spec: &Spec,
    principal: &Principal,
    roots: &Roots,
    args: &[&str],
) -> std::result::Result<probe::Answer, String> {
    let t0 = Instant::now();
    let got = probe::run(&probe::Probe {
        binary: &spec.hypervisor.binary,
        args,
        principal,
        roots,
        landlock: spec.landlock.mode,
        timeout: probe::PROBE_TIMEOUT,
    });
    tracing::debug!(
        binary = %spec.hypervisor.binary.display(),
        ?args,
        ms = t0.elapsed().as_secs_f64() * 1000.0,
        ok = got.is_ok(),
        "asked the hypervisor binary in its sandbox"
    );
    got
}

/// Whether QEMU gets `-sandbox`: probed once, before anything is created,
/// so a QEMU without seccomp is refused with the host untouched unless the
/// spec says `hypervisor.seccomp = "best-effort"`.
fn qemu_sandbox(
    spec: &Spec,
    spec_path: &Path,
    principal: &Principal,
    roots: &Roots,
) -> Result<bool> {
    if spec.hypervisor.kind != HypervisorKind::Qemu {
        return Ok(false);
    }
    let bin = &spec.hypervisor.binary;
    // A QEMU that links libseccomp was built with -sandbox (QEMU links it
    // only then): read from its ELF headers in microseconds. Anything else
    // (a static build, a wrapper script) is asked, which means starting it
    // (~40 ms), in its sandbox. QEMU older than 3.1 with seccomp lacks
    // `resourcecontrol` and would then fail at its own start, naming the
    // option.
    if hypervisor::elf::links_libseccomp(bin) == Some(true) {
        return Ok(true);
    }
    let answer = ask(spec, principal, roots, &hypervisor::QEMU_SANDBOX_PROBE)
        .map(|a| hypervisor::qemu_sandbox_verdict(a.code, &a.stderr));
    match answer {
        Ok(SandboxProbe::Supported) => Ok(true),
        Ok(SandboxProbe::Unsupported(why)) => match spec.hypervisor.seccomp {
            SandboxMode::Required => Err(StepError::Spec(SpecError::Invalid {
                path: spec_path.to_path_buf(),
                field: "hypervisor.binary".into(),
                reason: format!(
                    "{} refuses `-sandbox {}` ({why}): QEMU built without seccomp support, or too \
                     old for these options. Use a QEMU with seccomp, or set hypervisor.seccomp = \
                     \"best-effort\" to run it without its own filter",
                    bin.display(),
                    hypervisor::QEMU_SANDBOX
                ),
            })),
            SandboxMode::BestEffort => {
                tracing::warn!(binary = %bin.display(), %why, "QEMU refuses -sandbox; running without its own seccomp filter (hypervisor.seccomp = \"best-effort\")");
                Ok(false)
            }
        },
        Err(reason) => Err(StepError::HypervisorProbe {
            path: bin.clone(),
            what: "its own sandbox",
            reason,
        }),
    }
}

/// cloud-hypervisor with credentials: they go in as fw_cfg files, which
/// only a binary built with the `fw_cfg` feature has. Asked once, before
/// anything is created, so a binary without it is refused with the host
/// untouched. The tmpfs paths go into `--fw-cfg-config items=[…]`, where
/// ',' ':' '[' ']' would split the list: a runtime root containing one is
/// refused too.
fn cloud_hypervisor_credentials(
    spec: &Spec,
    spec_path: &Path,
    principal: &Principal,
    roots: &Roots,
) -> Result<()> {
    if spec.hypervisor.kind != HypervisorKind::CloudHypervisor || spec.credentials.is_empty() {
        return Ok(());
    }
    let dir = roots.credentials_dir(&spec.name);
    if dir
        .as_os_str()
        .as_encoded_bytes()
        .iter()
        .any(|b| b",:[]".contains(b))
    {
        return Err(StepError::Spec(SpecError::Invalid {
            path: spec_path.to_path_buf(),
            field: "credentials".into(),
            reason: format!(
                "cannot reach cloud-hypervisor: their directory {} contains one of ',' ':' '[' ']', \
                 which split its --fw-cfg-config list; use a runtime root without them",
                dir.display()
            ),
        }));
    }
    let bin = &spec.hypervisor.binary;
    // Read from the binary's read-only data, without running it; a binary
    // this cannot judge (not found there, a wrapper script) is asked for
    // its --help, in its sandbox.
    if hypervisor::cloud_hypervisor_fw_cfg_in_elf(bin) {
        return Ok(());
    }
    let answer = ask(spec, principal, roots, &hypervisor::CH_FW_CFG_PROBE)
        .and_then(|a| hypervisor::cloud_hypervisor_help_has_fw_cfg(a.code, &a.stdout, &a.stderr));
    match answer {
        Ok(true) => Ok(()),
        Ok(false) => Err(StepError::Spec(SpecError::Invalid {
            path: spec_path.to_path_buf(),
            field: "credentials".into(),
            reason: format!(
                "need cloud-hypervisor's `fw_cfg` feature, but {} was built without it (its --help has no {}); \
                 build it with `--features fw_cfg` (the NixOS module does when a VM has credentials), or drop the credentials",
                bin.display(),
                hypervisor::CH_FW_CFG_OPTION
            ),
        })),
        Err(reason) => Err(StepError::HypervisorProbe {
            path: bin.clone(),
            what: "fw_cfg (credentials)",
            reason,
        }),
    }
}

/// Before anything is created: every bridge exists and is a bridge, every
/// macvtap's link exists and is the host's, no tap name is taken on this host or claimed by another configured VM.
fn preflight_interfaces(spec: &Spec, spec_path: &Path, roots: &Roots) -> Result<()> {
    if spec.interfaces.is_empty() {
        return Ok(());
    }
    let bad = |field: String, reason: String| {
        StepError::Spec(SpecError::Invalid {
            path: spec_path.to_path_buf(),
            field,
            reason,
        })
    };
    let others = principal::configured_specs_except(roots, Some(&spec.name));
    let mut rtnl = net::Rtnl::open()?;
    for (i, n) in spec.interfaces.iter().enumerate() {
        for (other, _, other_spec) in &others {
            if let Some(o) = other_spec {
                if o.interfaces.iter().any(|x| x.tap == n.tap) {
                    return Err(bad(
                        format!("interfaces[{i}].tap"),
                        format!("{:?} is also a tap of VM {other:?}; tap names must be unique across VMs", n.tap),
                    ));
                }
            }
        }
        if rtnl.link(n.tap.as_str())?.is_some() {
            return Err(bad(
                format!("interfaces[{i}].tap"),
                format!(
                    "{:?} already exists on this host (a leftover of a stopped VM is deleted by `vmwarden reap --apply`)",
                    n.tap
                ),
            ));
        }
        if let Some(m) = n.macvtap() {
            macvtap::preflight(&mut rtnl, spec_path, i, m)?;
        }
        if let Some(b) = &n.bridge {
            match rtnl.link(b.as_str())? {
                None => {
                    return Err(bad(
                        format!("interfaces[{i}].bridge"),
                        format!("{b:?} does not exist; create the bridge first (vmwarden attaches taps to it, it does not make bridges)"),
                    ))
                }
                Some(l) if l.kind != Some(InfoKind::Bridge) => {
                    return Err(bad(
                        format!("interfaces[{i}].bridge"),
                        format!("{b:?} is not a bridge (its kind is {:?})", l.kind),
                    ))
                }
                Some(_) => {}
            }
        }
    }
    Ok(())
}

/// What passt needs of this host, which the spec cannot say: a user
/// namespace the principal may make for passt's own sandbox, and for each `from = "host"` forward a
/// host port the principal may bind (passt has no CAP_NET_BIND_SERVICE), by
/// this network namespace's `net.ipv4.ip_unprivileged_port_start` (which
/// governs TCP and UDP alike).
fn preflight_user_network(spec: &Spec, spec_path: &Path) -> Result<(), SpecError> {
    let Some(u) = &spec.user_network else {
        return Ok(());
    };
    let sysctl = |p: &str| -> Option<u32> {
        let b = read_path(Path::new(p), 32, 64).ok()?;
        String::from_utf8_lossy(&b).trim().parse().ok()
    };
    if sysctl("/proc/sys/user/max_user_namespaces") == Some(0) {
        return Err(bad(
            spec_path,
            "user_network".into(),
            "needs user namespaces (passt's own sandbox is one), but this host's user.max_user_namespaces is 0; allow them (NixOS: security.allowUserNamespaces = true)".into(),
        ));
    }
    // Debian's and Ubuntu's kernels: an unprivileged process (passt, as the
    // principal) may make one only with this set.
    if sysctl("/proc/sys/kernel/unprivileged_userns_clone") == Some(0) {
        return Err(bad(
            spec_path,
            "user_network".into(),
            "needs a user namespace made by the VM's principal (passt's own sandbox is one), but this host's kernel.unprivileged_userns_clone is 0; set it to 1".into(),
        ));
    }
    let start =
        sysctl("/proc/sys/net/ipv4/ip_unprivileged_port_start").unwrap_or(UNPRIVILEGED_PORT_START);
    for (i, f) in u.forward_ports.iter().enumerate() {
        if f.from == ForwardFrom::Host && u32::from(f.host.port) < start {
            return Err(bad(
                spec_path,
                format!("user_network.forward_ports[{i}].host.port"),
                format!(
                    "is {}, below this host's net.ipv4.ip_unprivileged_port_start ({start}): passt binds it as the VM's principal, without CAP_NET_BIND_SERVICE; use a port of {start} or above, or lower that sysctl (NixOS: boot.kernel.sysctl.\"net.ipv4.ip_unprivileged_port_start\")",
                    f.host.port
                ),
            ));
        }
    }
    Ok(())
}

/// The host's 2 MiB hugepage pool, as the kernel counts it.
const HUGEPAGES_FREE: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages";
/// Whether the kernel's KSM thread merges pages (1) or not.
const KSM_RUN: &str = "/sys/kernel/mm/ksm/run";

/// `hugepage_mem`: the host's pool has a free page for each 2 MiB of the
/// guest now (another VM may take them before the hypervisor does; the
/// hypervisor then fails its start and says so). `mem_merge`: KSM is on
/// (a warning only: the guest runs either way, unmerged).
fn preflight_memory(spec: &Spec, spec_path: &Path) -> Result<(), SpecError> {
    let number = |p: &str| -> Option<u64> {
        let b = read_path(Path::new(p), 32, 64).ok()?;
        String::from_utf8_lossy(&b).trim().parse().ok()
    };
    let needed = spec.hugepages_needed();
    if needed > 0 {
        let free = number(HUGEPAGES_FREE);
        if !matches!(free, Some(f) if f >= needed) {
            let have = free.map_or_else(
                || format!("no 2 MiB hugepage pool ({HUGEPAGES_FREE} cannot be read)"),
                |f| format!("{f} free 2 MiB hugepages"),
            );
            return Err(bad(
                spec_path,
                "hugepage_mem".into(),
                format!(
                    "is true, so the guest's {} MiB need {needed} free 2 MiB hugepages, but this host has {have}; \
                     reserve them (vm.nr_hugepages, NixOS: boot.kernelParams = [ \"hugepages=N\" ]) or drop hugepage_mem",
                    spec.memory_mib
                ),
            ));
        }
    }
    if spec.mem_merge && number(KSM_RUN) != Some(1) {
        tracing::warn!(
            "mem_merge is set, but this host's KSM is not running ({KSM_RUN} is not 1): the guest's memory is marked mergeable and nothing merges it (NixOS: hardware.ksm.enable)"
        );
    }
    Ok(())
}
