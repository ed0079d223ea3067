//! The launch as far as the unit tests take it without root.

use super::*;
use crate::config::names::ArgNameError;
use crate::config::paths::CREDS_FLOOR_FILE;
use crate::devices::Plan;

pub(crate) fn spec_of(v: serde_json::Value) -> Spec {
    Spec::parse(
        Path::new("/etc/vmwarden/vms/web.json"),
        &serde_json::to_vec(&v).unwrap(),
    )
    .unwrap()
}

pub(crate) fn base_spec(kind: &str) -> serde_json::Value {
    serde_json::json!({
        "version": 1, "name": "web",
        "principal": { "uid": 61001, "gid": 61001 },
        "hypervisor": { "kind": kind, "binary": "/usr/bin/hv" },
        "vcpus": 1, "memory_mib": 256, "kernel": "/boot/vmlinuz"
    })
}

/// Options for VM `name` with every root in `dir` (nothing there yet).
fn options(dir: &Path, name: &str) -> Options {
    Options {
        name: VmName::parse(name).unwrap(),
        roots: Roots {
            config_dir: dir.join("config"),
            runtime_root: dir.join("run"),
            state_root: dir.join("state"),
        },
        spec: None,
        probe: Some(vec!["/bin/true".into()]),
        credentials_directory: None,
        fault_after: None,
        helper_openat2_enosys: false,
        invocation: Default::default(),
        stdout_journal: false,
    }
}

fn failure(opts: Options) -> LaunchError {
    match launch(opts) {
        Ok(never) => match never {},
        Err(e) => e,
    }
}

#[test]
fn steps_are_reported_in_order_and_exec_comes_last() {
    let mut steps = Steps::new(None);
    for step in STEPS {
        assert_eq!(steps.current(), *step);
        steps.after(step);
    }
    assert_eq!(steps.current(), EXEC_STEP);
    assert!(!STEPS.contains(&EXEC_STEP));
}

#[test]
fn a_launch_error_names_the_step_it_failed_in() {
    // Refusals that need neither root nor any host change: each fails
    // before anything is created.
    let dir = tempfile::tempdir().unwrap();
    // A bad name never reaches `launch`: clap's value parser refuses it
    // while the arguments are parsed, in the first step.
    let bad = ArgNameError {
        arg: "[NAME]".into(),
        error: VmName::parse("a/b").unwrap_err(),
    };
    let e = LaunchError::at(STEPS[0], bad);
    assert_eq!(e.step, "sanitized");
    assert!(e.is_refusal());
    assert_eq!(
        e.to_string(),
        "at step \"sanitized\": [NAME]: VM name \"a/b\" must match ^[a-z][a-z0-9-]{0,31}$ \
         (lowercase letter first, then lowercase letters, digits or '-', at most 32)"
    );

    let mut relative = options(dir.path(), "web");
    relative.roots.state_root = PathBuf::from("state");
    let e = failure(relative);
    assert_eq!(e.step, "spec-loaded");
    assert!(e.to_string().contains("--state-root state"), "{e}");

    let e = failure(options(dir.path(), "web"));
    assert_eq!(e.step, "spec-loaded");
    assert!(e.to_string().contains("web.json"), "{e}");

    // A valid spec whose principal does not resolve fails a step later.
    let config = dir.path().join("config");
    std::fs::create_dir(&config).unwrap();
    let kernel = dir.path().join("vmlinuz");
    std::fs::write(&kernel, b"").unwrap();
    let spec = serde_json::json!({
        "version": 1, "name": "web",
        "principal": { "user": "vmw-no-such-user", "gid": 61001 },
        "hypervisor": { "kind": "qemu", "binary": "/bin/sh", "accel": "tcg" },
        "vcpus": 1, "memory_mib": 64, "kernel": kernel,
    });
    std::fs::write(config.join("web.json"), spec.to_string()).unwrap();
    let e = failure(options(dir.path(), "web"));
    assert_eq!(e.step, "principal-resolved", "{e}");
    assert!(e.is_refusal());
    assert!(
        e.to_string()
            .starts_with("at step \"principal-resolved\": principal vmw-no-such-user:61001: "),
        "{e}"
    );
    assert!(!dir.path().join("run").exists() && !dir.path().join("state").exists());
}

/// The launch tail as far as the unit tests can take it without root:
/// every privileged call recorded, every other call real (inside a
/// temporary directory). The roots hold no VM dir, so the masks' mkdir
/// finds room where the recorded tmpfs would be.
fn run_tail(sys: &dyn Syscall) -> (std::result::Result<Infallible, StepError>, &'static str) {
    let (got, step, _) = run_tail_floor(sys);
    (got, step)
}

/// [`run_tail`], and the credential floor record it left in the runtime
/// dir, if any.
fn run_tail_floor(
    sys: &dyn Syscall,
) -> (
    std::result::Result<Infallible, StepError>,
    &'static str,
    Option<String>,
) {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = options(dir.path(), "web");
    for d in [&opts.roots.runtime_root, &opts.roots.state_root] {
        std::fs::create_dir(d).unwrap();
    }
    let vm_run = dir.path().join("vm-run/web");
    let vm_state = dir.path().join("vm-state/web");
    std::fs::create_dir_all(vm_run.join(CREDENTIALS_DIR)).unwrap();
    std::fs::create_dir_all(vm_run.join(CONTROL_DIR)).unwrap();
    std::fs::create_dir_all(&vm_state).unwrap();
    opts.probe = Some(vec!["/bin/true".into()]);
    let spec = spec_of(base_spec("qemu"));
    // The principal is the caller: installing credentials chowns to it.
    let principal = Principal {
        uid: nix::unistd::getuid().as_raw(),
        gid: nix::unistd::getgid().as_raw(),
        user: None,
        groups: Vec::new(),
    };
    let rundir = dirs::open_dir(&vm_run).unwrap();
    let state_dir = dirs::open_dir(&vm_state).unwrap();
    let lease = Lease::acquire_unchecked_for_tests(vm_run.join(LEASE_FILE));
    let mut steps = Steps::new(None);
    while steps.current() != "namespace" {
        let s = steps.current();
        steps.after(s);
    }
    let got = confine_and_exec(
        sys,
        &mut steps,
        Confine {
            opts: &opts,
            spec: &spec,
            principal: &principal,
            rundir: &rundir,
            state_dir: &state_dir,
            loaded: Vec::new(),
            lease: &lease,
            taps: &[],
            vhost_vsock: None,
            qmp: None,
            qemu_sandbox: false,
            ids: None,
            devices: &Plan::default(),
            restore: None,
        },
    );
    let floor = std::fs::read_to_string(vm_run.join(CREDS_FLOOR_FILE)).ok();
    (got, steps.current(), floor)
}

/// The names of the calls, each run of one name (the mounts, one
/// seccomp load per filter, one close-on-exec range per gap between
/// inherited fds) folded into one entry: how many masks there are
/// depends on the host (`/run/credentials` is masked only where it
/// exists).
fn phases(sys: &syscall::RecordingSyscall) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = sys
        .names()
        .into_iter()
        .map(|n| match n {
            // A bind's flags (`root::remount`) are part of the mounts.
            "mount" | "mount_setattr" => "mounts",
            n => n,
        })
        .collect();
    out.dedup();
    out
}

/// The launch tail: unshare before mounts, setgroups < setresgid < bounding and
/// ambient clear < securebits < no_new_privs < setresuid < self-check <
/// Landlock < seccomp < execve: the privilege drop's own order
/// (`sandbox::tests::DROP_ORDER`) between the namespace and the exec.
fn tail_order() -> Vec<&'static str> {
    let mut order = vec![
        "unshare",
        "mounts",
        "root_mount_id",
        "mounts",
        "pivot_root",
        "mounts",
        "setrlimit",
    ];
    order.extend_from_slice(sandbox::tests::DROP_ORDER);
    order.extend_from_slice(&[
        "landlock_restrict",
        "seccomp_load",
        "chdir",
        "cloexec_range",
        "execve",
    ]);
    order
}

#[test]
fn the_launch_tail_makes_its_privileged_calls_in_order() {
    let sys = syscall::RecordingSyscall::new();
    let (got, step, floor) = run_tail_floor(&sys);
    let floor: serde_json::Value =
        serde_json::from_str(&floor.expect("no credential floor recorded")).unwrap();
    assert_eq!(
        (floor["floor"].as_u64(), floor["proven"].as_bool()),
        (Some(syscall::RECORDED_ROOT_MOUNT_ID), Some(false)),
        "{floor}"
    );
    // The recorder fails execve: the launch reports it at "exec".
    assert!(matches!(got, Err(StepError::Exec { .. })), "{got:?}");
    assert_eq!(step, EXEC_STEP);
    assert_eq!(phases(&sys), tail_order());
    let calls = sys.calls();
    let args = |name: &str| -> Vec<String> {
        calls
            .iter()
            .filter(|c| c.name == name)
            .map(|c| c.args.clone())
            .collect()
    };
    assert_eq!(args("unshare"), ["CloneFlags(CLONE_NEWNS | CLONE_NEWIPC)"]);
    // Every mount comes after the unshare: the first makes "/" a slave.
    let mounts = args("mount");
    assert!(mounts[0].contains("MS_REC | MS_SLAVE"), "{mounts:?}");
    assert!(
        mounts.iter().any(|m| m.contains("noswap")),
        "the credential tmpfs: {mounts:?}"
    );
    // The credential floor is read once, after the unshare made the root
    // it reads and before the credential tmpfs exists, and recorded in
    // the runtime dir (instance::creds_floor: intent before the resource).
    let names = sys.names();
    let floor_at = names.iter().position(|n| *n == "root_mount_id").unwrap();
    let tmpfs_at = calls
        .iter()
        .position(|c| c.name == "mount" && c.args.contains("noswap"))
        .unwrap();
    assert!(
        names.iter().position(|n| *n == "unshare").unwrap() < floor_at && floor_at < tmpfs_at,
        "{names:?}"
    );
    assert_eq!(args("root_mount_id").len(), 1);
    assert_eq!(args("setrlimit"), ["RLIMIT_CORE 0 0"]);
    assert_eq!(
        args("seccomp_load").len(),
        seccomp::programs().unwrap().len(),
        "every filter is loaded"
    );
    assert!(args("execve")[0].contains("/bin/true"), "{calls:?}");
}

#[test]
fn a_failed_privileged_call_ends_the_launch_tail_at_its_step() {
    let full = syscall::RecordingSyscall::new();
    let _ = run_tail(&full);
    let names = full.names();
    // The step an error at each call is reported at.
    let step_of = |name: &str| match name {
        "unshare" => "namespace",
        "setrlimit" => "rlimits",
        "pivot_root" => "rooted",
        "landlock_restrict" => "landlock",
        "seccomp_load" => "seccomp",
        "chdir" | "cloexec_range" | "execve" => EXEC_STEP,
        "mount" => "namespace",
        _ => "privileges-dropped",
    };
    // A failed root_mount_id is no refusal (see the test below).
    for name in tail_order()
        .into_iter()
        .filter(|n| *n != "root_mount_id")
        .map(|n| if n == "mounts" { "mount" } else { n })
    {
        let k = names.iter().position(|n| *n == name).unwrap();
        let sys = syscall::RecordingSyscall::failing_at(name);
        let (got, step) = run_tail(&sys);
        assert!(got.is_err(), "{name}");
        assert_eq!(sys.names(), names[..=k], "failing at {name}");
        assert_eq!(step, step_of(name), "failing at {name}");
    }
}

/// A kernel that cannot state the unique mount id (before 6.8: the
/// project needs 6.4) does not stop the launch: its floor is 0, every
/// mount, sound on any kernel (instance::creds_floor).
#[test]
fn a_root_mount_id_the_kernel_cannot_state_is_floor_0_and_the_launch_goes_on() {
    let full = syscall::RecordingSyscall::new();
    let _ = run_tail(&full);
    let sys = syscall::RecordingSyscall::failing_at("root_mount_id");
    let (got, step, floor) = run_tail_floor(&sys);
    assert!(matches!(got, Err(StepError::Exec { .. })), "{got:?}");
    assert_eq!(step, EXEC_STEP);
    assert_eq!(sys.names(), full.names());
    let floor: serde_json::Value =
        serde_json::from_str(&floor.expect("no credential floor recorded")).unwrap();
    assert_eq!(
        (floor["floor"].as_u64(), floor["proven"].as_bool()),
        (Some(0), Some(false)),
        "{floor}"
    );
}
