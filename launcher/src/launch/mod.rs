//! The launch, in order (ARCHITECTURE.md "The launch, in order"). One linear
//! function that reads like the step list; each step that creates something
//! is in the intent record before it exists.

pub mod creds;
pub mod landlock;
pub mod sandbox;
pub mod seccomp;

use std::convert::Infallible;
use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::config::names::VmName;
use crate::config::paths::{Roots, API_SOCKET, CONTROL_DIR, CREDENTIALS_DIR, FIRECRACKER_CONFIG};
use crate::config::spec::{HypervisorKind, Spec, SpecError};
use crate::error::{Error, Result};
use crate::host::dirs::{self, Dir, Loose, Want};
use crate::host::net;
use crate::hypervisor::{self, Layout};
use crate::identity::principal::{self, Principal};
use crate::instance::intent::{self, Intent, IntentPrincipal, Resource};
use crate::instance::lease::Lease;
use crate::instance::liveness;

/// Step names, in order. `VMWARDEN_FAULT_AFTER=<step>` (builds with the
/// `fault-injection` feature) SIGKILLs the launcher right after that step.
pub const STEPS: &[&str] = &[
    "sanitized",
    "spec-loaded",
    "principal-resolved",
    "runtime-dir",
    "lease-taken",
    "intent-written",
    "state-dir",
    "control-dir",
    "credentials-dir",
    "taps",
    "hypervisor-config",
    "namespace",
    "masked",
    "credentials-mounted",
    "credentials-installed",
    "rlimits",
    "privileges-dropped",
    "landlock",
    "seccomp",
];

/// Environment the hypervisor (or probe command) gets: nothing but a PATH.
pub const EXEC_PATH: &str = "PATH=/run/current-system/sw/bin:/usr/local/bin:/usr/bin:/bin";

#[derive(Debug, Clone)]
pub struct Options {
    pub name: VmName,
    pub roots: Roots,
    /// Spec path; defaults to `CONFIG_DIR/NAME.json`.
    pub spec: Option<PathBuf>,
    /// `--probe -- CMD…`: run CMD in the identical sandbox.
    pub probe: Option<Vec<String>>,
    /// `$CREDENTIALS_DIRECTORY`, captured before the environment was cleared.
    pub credentials_directory: Option<PathBuf>,
    /// `$VMWARDEN_FAULT_AFTER`, captured likewise (honoured only with the
    /// `fault-injection` feature).
    pub fault_after: Option<String>,
}

struct Faults(Option<String>);

impl Faults {
    fn after(&self, step: &str) {
        debug_assert!(STEPS.contains(&step), "unknown step {step}");
        tracing::debug!(step, "launch step done");
        #[cfg(feature = "fault-injection")]
        if self.0.as_deref() == Some(step) {
            tracing::warn!(step, "fault injection: SIGKILL after step");
            let _ =
                nix::sys::signal::kill(nix::unistd::getpid(), nix::sys::signal::Signal::SIGKILL);
        }
        #[cfg(not(feature = "fault-injection"))]
        let _ = &self.0;
    }
}

fn root_want(mode: u32, loose: Loose) -> Want {
    Want {
        uid: 0,
        gid: 0,
        mode,
        loose,
    }
}

/// Spec paths must not point into another VM's runtime or state directory:
/// those are masked inside the sandbox (and are not this VM's).
fn check_spec_paths_scoped(spec: &Spec, spec_path: &Path, roots: &Roots) -> Result<()> {
    let own_state = roots.state_dir(&spec.name);
    let own_run = roots.runtime_dir(&spec.name);
    let mut fields: Vec<(String, &Path)> = vec![
        ("kernel".into(), &spec.kernel),
        ("hypervisor.binary".into(), &spec.hypervisor.binary),
    ];
    for (i, c) in spec.credentials.iter().enumerate() {
        if let crate::config::spec::CredentialSource::Path(p) = &c.source {
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
        let foreign = (p.starts_with(&roots.state_root) && !p.starts_with(&own_state))
            || (p.starts_with(&roots.runtime_root) && !p.starts_with(&own_run));
        if foreign {
            return Err(Error::Spec(SpecError::Invalid {
                path: spec_path.to_path_buf(),
                field,
                reason: format!(
                    "{} is inside another VM's directory (only {} and {} belong to this VM)",
                    p.display(),
                    own_state.display(),
                    own_run.display()
                ),
            }));
        }
    }
    Ok(())
}

/// Everything up to `execve`. Returns only on error.
pub fn launch(opts: Options) -> Result<Infallible> {
    let faults = Faults(opts.fault_after.clone());
    faults.after("sanitized");

    // 2. Spec: every field, and the files it names. Nothing is created yet.
    let roots = &opts.roots;
    roots
        .validate()
        .map_err(|(flag, path, reason)| Error::Root { flag, path, reason })?;
    // A running VM is reported as running before anything else is judged
    // (its taps exist, its credentials may be unavailable to a second caller).
    if let Ok(d) = dirs::open_dir(&roots.runtime_dir(&opts.name)) {
        if matches!(
            crate::instance::lease::state(&d),
            Ok(crate::instance::lease::LeaseState::Held)
        ) {
            return Err(Error::AlreadyRunning {
                name: opts.name.to_string(),
                reason: format!(
                    "its lease {} is held",
                    d.path.join(crate::config::paths::LEASE_FILE).display()
                ),
            });
        }
    }
    let spec_path = opts
        .spec
        .clone()
        .unwrap_or_else(|| roots.spec_path(&opts.name));
    let spec = Spec::load(&spec_path, &opts.name)?;
    check_spec_paths_scoped(&spec, &spec_path, roots)?;
    let loaded = creds::read_all(&spec, opts.credentials_directory.as_deref())?;
    faults.after("spec-loaded");

    // 3. Principal.
    let principal = principal::resolve(&spec, roots)?;
    crate::identity::registry::check_launch(roots, &spec.name, &principal)?;
    // Pre-flight the directories that already exist, so a refusal leaves
    // nothing behind (no runtime dir, lease or intent record yet).
    let vm_want = |mode| Want {
        uid: principal.uid,
        gid: principal.gid,
        mode,
        loose: Loose::Tighten,
    };
    dirs::preflight(&roots.state_dir(&spec.name), &vm_want(0o700))?;
    dirs::preflight(&roots.runtime_root, &root_want(0o755, Loose::Tighten))?;
    dirs::preflight(
        &roots.runtime_dir(&spec.name),
        &root_want(0o755, Loose::Refuse),
    )?;
    preflight_interfaces(&spec, &spec_path, roots)?;
    faults.after("principal-resolved");

    // 4. Runtime root and this VM's runtime dir, then the lease.
    let (rt_parent, rt_name) = dirs::split_parent(&roots.runtime_root)?;
    let (runtime_root, _) = dirs::ensure(&rt_parent, &rt_name, &root_want(0o755, Loose::Tighten))?;
    let (rundir, _) = dirs::ensure(
        &runtime_root,
        spec.name.as_str(),
        &root_want(0o755, Loose::Refuse),
    )?;
    faults.after("runtime-dir");
    let lease = match Lease::acquire(&rundir)? {
        Some(l) => l,
        None => {
            return Err(Error::AlreadyRunning {
                name: spec.name.to_string(),
                reason: format!(
                    "its lease {} is held",
                    rundir.path.join(crate::config::paths::LEASE_FILE).display()
                ),
            })
        }
    };
    if let liveness::Verdict::Ambiguous(reason) | liveness::Verdict::Live(reason) =
        liveness::probe_with_lease_held(roots, &spec.name, principal.uid)
    {
        return Err(Error::Ambiguous {
            name: spec.name.to_string(),
            reason,
        });
    }
    faults.after("lease-taken");

    // 5. Intent record, before any resource exists.
    let state_dir_path = roots.state_dir(&spec.name);
    let control_path = rundir.path.join(CONTROL_DIR);
    let creds_path = rundir.path.join(CREDENTIALS_DIR);
    let qmp_path = control_path.join(crate::config::paths::QMP_SOCKET);
    let api_path = control_path.join(API_SOCKET);
    let fc_config_path = control_path.join(FIRECRACKER_CONFIG);
    let kind = spec.hypervisor.kind;
    let mut resources = vec![
        Resource::StateDir {
            path: state_dir_path.clone(),
        },
        Resource::RuntimeDir {
            path: control_path.clone(),
        },
        Resource::RuntimeFile {
            path: match kind {
                HypervisorKind::Qemu => qmp_path.clone(),
                _ => api_path.clone(),
            },
        },
    ];
    if kind == HypervisorKind::Firecracker {
        resources.push(Resource::RuntimeFile {
            path: fc_config_path.clone(),
        });
    }
    resources.extend([
        Resource::RuntimeDir {
            path: creds_path.clone(),
        },
        Resource::PrivateMount {
            path: creds_path.clone(),
            fstype: "tmpfs".into(),
        },
    ]);
    resources.extend(spec.interfaces.iter().map(|n| Resource::Tap {
        name: n.tap.to_string(),
        bridge: n.bridge.as_ref().map(|b| b.to_string()),
    }));
    let record = Intent {
        version: 1,
        name: spec.name.to_string(),
        instance_id: intent::new_instance_id()?,
        pid: std::process::id(),
        boot_id: intent::boot_id(),
        created_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        principal: IntentPrincipal {
            uid: principal.uid,
            gid: principal.gid,
            user: principal.user.clone(),
        },
        hypervisor: Some(kind),
        resources,
    };
    record.write(&rundir)?;
    faults.after("intent-written");

    // 6. Host resources: state dir (principal's, 0700), control dir, the
    //    credential mount point (root 0700 on the host side).
    let (st_parent, st_name) = dirs::split_parent(&roots.state_root)?;
    let (state_root, _) = dirs::ensure(&st_parent, &st_name, &root_want(0o755, Loose::Tighten))?;
    crate::identity::registry::register(roots, &state_root, &spec.name, &principal)?;
    let (state_dir, _) = dirs::ensure(&state_root, spec.name.as_str(), &vm_want(0o700))?;
    faults.after("state-dir");
    let (control, _) = dirs::ensure(
        &rundir,
        CONTROL_DIR,
        &Want {
            loose: Loose::Refuse,
            ..vm_want(0o700)
        },
    )?;
    faults.after("control-dir");
    let (_creds_mountpoint, _) =
        dirs::ensure(&rundir, CREDENTIALS_DIR, &root_want(0o700, Loose::Refuse))?;
    faults.after("credentials-dir");

    //    Taps: created here as non-persistent fds (close-on-exec until the
    //    exec below), MAC set, attached to their bridge, up. From now on the
    //    kernel deletes each tap when its last fd holder dies.
    let taps = create_taps(&spec)?;
    faults.after("taps");

    //    The control dir holds only what this instance's hypervisor makes:
    //    stale sockets of a dead instance go (a hypervisor cannot bind over
    //    them), and firecracker's config file is written for the principal.
    for stale in [API_SOCKET, FIRECRACKER_CONFIG] {
        remove_stale(&control, stale)?;
    }
    if kind == HypervisorKind::Firecracker {
        write_private(
            &control,
            FIRECRACKER_CONFIG,
            hypervisor::firecracker_config(&spec).as_bytes(),
            &principal,
        )?;
    }
    faults.after("hypervisor-config");

    // 7. Private mount namespace, credential tmpfs, masks.
    sandbox::enter_private_mount_namespace()?;
    faults.after("namespace");
    sandbox::mask_root_except(&roots.runtime_root, &rundir)?;
    sandbox::mask_root_except(&roots.state_root, &state_dir)?;
    sandbox::mask_dir(Path::new("/run/credentials"))?;
    faults.after("masked");
    sandbox::mount_credential_tmpfs(
        &creds_path,
        &spec.name,
        creds::tmpfs_size(&loaded),
        loaded.len(),
    )?;
    faults.after("credentials-mounted");
    let creds_dir = dirs::open_dir(&creds_path)?;
    creds::install(&creds_dir, &loaded, principal.uid, principal.gid)?;
    drop(creds_dir);
    drop(loaded);
    sandbox::remount_read_only(&creds_path)?;
    faults.after("credentials-installed");

    // 8. rlimits.
    sandbox::set_rlimits()?;
    faults.after("rlimits");

    // The seccomp filter is compiled while a failure can still be reported
    // cleanly, and installed after Landlock.
    let seccomp_prog = seccomp::program()?;

    // 9. Drop to the principal and prove it.
    sandbox::drop_privileges(&principal)?;
    faults.after("privileges-dropped");

    // 10. Landlock.
    let policy = landlock::policy(&spec, &state_dir_path, &control_path, &creds_path);
    let outcome = landlock::apply(&policy, spec.landlock.mode)?;
    tracing::info!(?outcome, "landlock applied");
    faults.after("landlock");

    // 10b. seccomp: no tap fd can be made persistent, re-owned or re-MACed.
    seccomp::apply(&seccomp_prog)?;
    faults.after("seccomp");

    // 11. execve: the lease fd is inherited, everything else is closed.
    let argv: Vec<String> = match &opts.probe {
        Some(cmd) => cmd.clone(),
        None => {
            let seccomp = kind == HypervisorKind::Qemu
                && hypervisor::qemu_has_seccomp(&spec.hypervisor.binary);
            if kind == HypervisorKind::Qemu && !seccomp {
                tracing::warn!(binary = %spec.hypervisor.binary.display(), "QEMU lacks seccomp support: running without -sandbox");
            }
            hypervisor::argv(
                &spec,
                &Layout {
                    qmp_socket: qmp_path.clone(),
                    credentials_dir: creds_path.clone(),
                    api_socket: api_path.clone(),
                    firecracker_config: fc_config_path.clone(),
                    tap_fds: taps.iter().map(|t| t.fd.as_raw_fd()).collect(),
                },
                seccomp,
            )
        }
    };
    exec(&argv, &lease, &taps, &principal, &state_dir)
}

/// Before anything is created: every bridge exists and is a bridge, no tap
/// name is taken on this host or claimed by another configured VM.
fn preflight_interfaces(spec: &Spec, spec_path: &Path, roots: &Roots) -> Result<()> {
    if spec.interfaces.is_empty() {
        return Ok(());
    }
    let bad = |field: String, reason: String| {
        Error::Spec(SpecError::Invalid {
            path: spec_path.to_path_buf(),
            field,
            reason,
        })
    };
    let others = crate::identity::principal::configured_specs(roots);
    let mut rtnl = net::Rtnl::open()?;
    for (i, n) in spec.interfaces.iter().enumerate() {
        for (other, _, other_spec) in &others {
            if other == &spec.name {
                continue;
            }
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
        if let Some(b) = &n.bridge {
            match rtnl.link(b.as_str())? {
                None => {
                    return Err(bad(
                        format!("interfaces[{i}].bridge"),
                        format!("{b:?} does not exist; create the bridge first (vmwarden attaches taps to it, it does not make bridges)"),
                    ))
                }
                Some(l) if l.kind != Some(netlink_packet_route::link::InfoKind::Bridge) => {
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

/// Create, address, attach and raise every tap of the spec.
fn create_taps(spec: &Spec) -> Result<Vec<net::Tap>> {
    if spec.interfaces.is_empty() {
        return Ok(Vec::new());
    }
    let mut rtnl = net::Rtnl::open()?;
    let mut taps = Vec::new();
    for (i, n) in spec.interfaces.iter().enumerate() {
        let tap = net::create_tap(&n.tap)?;
        let link = rtnl.link(n.tap.as_str())?.ok_or_else(|| Error::Net {
            what: n.tap.to_string(),
            op: "RTM_GETLINK",
            source: std::io::Error::other("the tap vanished right after TUNSETIFF"),
        })?;
        // Re-checked here (the pre-flight ran before the lease): whatever
        // holds the name now must still be a bridge.
        let controller = match &n.bridge {
            Some(b) => {
                let field = format!("interfaces[{i}].bridge");
                let gone = |reason: String| Error::Net {
                    what: format!("{field} {b:?}"),
                    op: "RTM_GETLINK",
                    source: std::io::Error::other(reason),
                };
                match rtnl.link(b.as_str())? {
                    None => return Err(gone("the bridge disappeared during the launch".into())),
                    Some(l) if l.kind != Some(netlink_packet_route::link::InfoKind::Bridge) => {
                        return Err(gone(format!(
                            "is no longer a bridge (its kind is {:?})",
                            l.kind
                        )))
                    }
                    Some(l) => Some(l.index),
                }
            }
            None => None,
        };
        let mac = spec.guest_mac(i).host_side();
        rtnl.configure(n.tap.as_str(), link.index, &mac.octets(), controller)?;
        tracing::info!(tap = %n.tap, bridge = ?n.bridge, "tap created");
        taps.push(tap);
    }
    Ok(taps)
}

/// Remove `dir/name` if it exists (never following a symlink).
fn remove_stale(dir: &Dir, name: &str) -> Result<()> {
    use std::os::fd::AsFd;
    match nix::unistd::unlinkat(
        dir.fd.as_fd(),
        name,
        nix::unistd::UnlinkatFlags::NoRemoveDir,
    ) {
        Ok(()) | Err(nix::errno::Errno::ENOENT) => Ok(()),
        Err(errno) => Err(Error::Sys {
            op: "unlink stale",
            path: dir.path.join(name),
            errno,
        }),
    }
}

/// Create `dir/name` (`O_EXCL|O_NOFOLLOW`, 0600), owned by the principal.
fn write_private(dir: &Dir, name: &str, bytes: &[u8], p: &Principal) -> Result<()> {
    use nix::fcntl::{openat, OFlag};
    use nix::sys::stat::Mode;
    use std::io::Write;
    use std::os::fd::AsFd;
    let path = dir.path.join(name);
    let fd = openat(
        dir.fd.as_fd(),
        name,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    )
    .map_err(|errno| Error::Sys {
        op: "create",
        path: path.clone(),
        errno,
    })?;
    nix::unistd::fchown(
        &fd,
        Some(nix::unistd::Uid::from_raw(p.uid)),
        Some(nix::unistd::Gid::from_raw(p.gid)),
    )
    .map_err(|errno| Error::Sys {
        op: "fchown",
        path: path.clone(),
        errno,
    })?;
    let mut f = std::fs::File::from(fd);
    f.write_all(bytes).map_err(|source| Error::Io {
        op: "write",
        path: path.clone(),
        source,
    })?;
    f.sync_all().map_err(|source| Error::Io {
        op: "fsync",
        path,
        source,
    })
}

fn resolve_program(arg0: &str) -> PathBuf {
    if arg0.contains('/') {
        return PathBuf::from(arg0);
    }
    for dir in EXEC_PATH.trim_start_matches("PATH=").split(':') {
        let p = Path::new(dir).join(arg0);
        if p.is_file() {
            return p;
        }
    }
    PathBuf::from(arg0)
}

fn exec(
    argv: &[String],
    lease: &Lease,
    taps: &[net::Tap],
    principal: &Principal,
    state_dir: &Dir,
) -> Result<Infallible> {
    let Some(arg0) = argv.first() else {
        return Err(Error::Usage {
            what: "--probe".into(),
            reason: "needs a command after --".into(),
        });
    };
    let program = resolve_program(arg0);
    let cstr = |s: &str| {
        CString::new(s).map_err(|_| Error::Usage {
            what: format!("argument {s:?}"),
            reason: "contains a NUL byte".into(),
        })
    };
    let c_argv = argv.iter().map(|a| cstr(a)).collect::<Result<Vec<_>>>()?;
    let c_env = [cstr(EXEC_PATH)?];
    let c_prog =
        CString::new(program.as_os_str().as_encoded_bytes()).map_err(|_| Error::Usage {
            what: format!("program {}", program.display()),
            reason: "contains a NUL byte".into(),
        })?;
    // The working directory is the VM's state dir (the principal's own),
    // by path: inside this namespace it is reached through the bind mount.
    nix::unistd::chdir(&state_dir.path).map_err(|errno| Error::Sys {
        op: "chdir",
        path: state_dir.path.clone(),
        errno,
    })?;
    let mut keep = vec![lease.inherit_across_exec()?];
    for t in taps {
        keep.push(net::inherit_across_exec(&t.fd)?);
    }
    sandbox::cloexec_all_but(&keep)?;
    tracing::info!(uid = principal.uid, program = %program.display(), "exec");
    let errno = match nix::unistd::execve(&c_prog, &c_argv, &c_env) {
        Ok(never) => match never {},
        Err(e) => e,
    };
    Err(Error::Exec {
        path: program,
        errno,
    })
}
