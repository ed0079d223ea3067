//! Shared harness for the root integration tests: private roots per test,
//! specs, the real binaries, the test guest, and host-state snapshots.
//!
//! These tests need root (namespaces, mounts, setresuid, landlock on real
//! paths). They fail loudly without it; run them as the README says.
#![allow(dead_code)]

pub mod cgroup;
pub mod golden;
pub mod hibernate;

use std::collections::BTreeSet;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use vmwarden::host::mountinfo;
use vmwarden::host::net::vmwarden_links;
use vmwarden::host::procs::processes_of_uid;
use vmwarden::instance::intent::{Intent, IntentPrincipal, Resource};

pub const LAUNCH: &str = env!("CARGO_BIN_EXE_vmwarden-launch");
pub const CLEANUP: &str = env!("CARGO_BIN_EXE_vmwarden-cleanup");
pub const VMWARDEN: &str = env!("CARGO_BIN_EXE_vmwarden");
pub const QEMU: &str = "/usr/bin/qemu-system-x86_64";

pub fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root (mount namespaces, tmpfs, setresuid, landlock): run `sudo tests/run-tests.sh` as the README says"
    );
}

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The test guest: kernel, initramfs and the kernel command line.
#[derive(Debug, Clone)]
pub struct Assets {
    pub kernel: PathBuf,
    pub initrd: PathBuf,
}

pub fn assets() -> Assets {
    let dir = std::env::var("VMWARDEN_TEST_ASSETS")
        .unwrap_or_else(|_| "/var/cache/vmwarden/test-assets".into());
    let a = Assets {
        kernel: Path::new(&dir).join("vmlinuz"),
        initrd: Path::new(&dir).join("initramfs.img"),
    };
    assert!(
        a.kernel.is_file() && a.initrd.is_file(),
        "guest assets missing in {dir}: run tests/assets/build-guest.sh (tests/run-tests.sh does)"
    );
    a
}

/// `bash tests/assets/SCRIPT ARGS…`, asserted to succeed; its stdout, trimmed.
pub fn asset_script(script: &str, args: &[&str]) -> String {
    let out = Command::new("bash")
        .arg(repo_root().join("tests/assets").join(script))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {script}: {e}"));
    assert!(
        out.status.success(),
        "{script} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Kernel command line for the test guest on `machine` in `mode`.
pub fn guest_cmdline(machine: &str, mode: &str) -> String {
    asset_script("guest-cmdline.sh", &[machine, mode, "tcg"])
}

/// KERNEL and INITRD of the shares guest (tests/assets/build-guest-shares.sh:
/// the generic kernel with the 9p, virtiofs, vsock and ext4 modules, and an
/// /init that runs `vmwarden.run=` and prints `VMWARDEN-DISK` per disk),
/// built and cached on first use.
pub fn shares_assets() -> (PathBuf, PathBuf) {
    let env_path = asset_script("build-guest-shares.sh", &[]);
    let text = std::fs::read_to_string(&env_path).unwrap();
    let get = |k: &str| -> PathBuf {
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .unwrap_or_else(|| panic!("{k} missing in {env_path}"));
        PathBuf::from(line.trim_matches('\''))
    };
    (get("KERNEL"), get("INITRD"))
}

/// Standard base64 with padding (for `vmwarden.run=` on a kernel command line).
pub fn b64(s: &str) -> String {
    const T: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let b = s.as_bytes();
    let mut o = String::new();
    for c in b.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                o.push(char::from(T[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                o.push('=');
            }
        }
    }
    o
}

/// The launcher's steps, in order (`vmwarden-launch --list-steps`).
pub fn launch_steps() -> Vec<String> {
    let out = Command::new(LAUNCH).arg("--list-steps").output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

/// For the kill-after-every-step tests: they need the fault-injection build.
#[allow(clippy::assertions_on_constants)]
pub fn require_fault_injection() {
    assert!(
        cfg!(feature = "fault-injection"),
        "this test needs the fault-injection build: cargo test --features fault-injection"
    );
}

/// Where every test's roots live: a root-owned 0755 directory whose whole
/// chain is root-owned and writable by root only, so credential files,
/// kernels and helper binaries placed under it pass the launcher's trust
/// checks (a world-writable /tmp, sticky or not, does not).
pub const TEST_BASE: &str = "/var/lib/vmwarden-test";

pub fn test_base() -> &'static Path {
    let base = Path::new(TEST_BASE);
    match std::fs::create_dir(base) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => panic!("create {TEST_BASE}: {e}"),
    }
    let md = std::fs::symlink_metadata(base).unwrap();
    assert!(md.is_dir(), "{TEST_BASE} is not a directory");
    assert_eq!(md.uid(), 0, "{TEST_BASE} must be owned by root");
    if md.mode() & 0o7777 != 0o755 {
        std::fs::set_permissions(base, PermissionsExt::from_mode(0o755)).unwrap();
    }
    base
}

/// Root tests share host-wide state (processes of test uids, mounts in
/// every namespace), so they run one at a time even within one binary.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// One test's private config, runtime and state roots.
pub struct Env {
    _serial: Option<std::sync::MutexGuard<'static, ()>>,
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    pub run: PathBuf,
    pub state: PathBuf,
    /// The host-wide id ranges' directory this test's binaries use
    /// (`VMWARDEN_TEST_RANGES_DIR`, honoured by fault-injection builds
    /// only): private to the test, shared with its siblings.
    pub ranges: PathBuf,
}

impl Env {
    pub fn new() -> Env {
        require_root();
        let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        Env::with_guard(Some(serial), None)
    }

    /// A second, independent set of roots for a test that already holds an
    /// [`Env`] (two operators' roots on one host). It runs under the first
    /// one's lock, so it takes none itself.
    pub fn sibling(&self) -> Env {
        Env::with_guard(None, Some(self.ranges.clone()))
    }

    fn with_guard(
        serial: Option<std::sync::MutexGuard<'static, ()>>,
        ranges: Option<PathBuf>,
    ) -> Env {
        let dir = tempfile::Builder::new()
            .prefix("vmwarden-test.")
            .tempdir_in(test_base())
            .unwrap();
        // Principals must be able to traverse to their own dirs.
        std::fs::set_permissions(dir.path(), PermissionsExt::from_mode(0o755)).unwrap();
        let config = dir.path().join("config");
        std::fs::create_dir(&config).unwrap();
        Env {
            _serial: serial,
            config,
            run: dir.path().join("run"),
            state: dir.path().join("state"),
            ranges: ranges.unwrap_or_else(|| dir.path().join("ranges")),
            dir,
        }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// A spec for the test guest (TCG, microvm, hold mode).
    pub fn spec(&self, name: &str, uid: u32) -> Value {
        let a = assets();
        json!({
            "version": 1,
            "name": name,
            "principal": { "uid": uid, "gid": uid },
            "hypervisor": { "kind": "qemu", "binary": QEMU, "accel": "tcg", "machine": "microvm" },
            "vcpus": 1,
            "memory_mib": 256,
            "kernel": a.kernel,
            "initrd": a.initrd,
            "cmdline": guest_cmdline("microvm", "hold"),
            "credentials": [],
            "landlock": { "mode": "required", "read": [], "write": [] }
        })
    }

    /// A spec for the shares guest ([`shares_assets`]) on the `pc` machine
    /// in `mode`, running the shell `script` before its ready marker.
    pub fn shares_spec(&self, name: &str, uid: u32, mode: &str, script: &str) -> Value {
        let (kernel, initrd) = shares_assets();
        let mut spec = self.spec(name, uid);
        spec["hypervisor"]["machine"] = json!("pc");
        spec["kernel"] = json!(kernel);
        spec["initrd"] = json!(initrd);
        spec["cmdline"] = json!(format!(
            "{} vmwarden.run={}",
            guest_cmdline("pc", mode),
            b64(script)
        ));
        spec
    }

    pub fn write_spec(&self, name: &str, spec: &Value) -> PathBuf {
        let p = self.config.join(format!("{name}.json"));
        std::fs::write(&p, serde_json::to_vec_pretty(spec).unwrap()).unwrap();
        p
    }

    /// A root-only credential file with `content`.
    pub fn secret(&self, name: &str, content: &[u8]) -> PathBuf {
        let p = self.path(name);
        std::fs::write(&p, content).unwrap();
        std::fs::set_permissions(&p, PermissionsExt::from_mode(0o600)).unwrap();
        p
    }

    pub fn with_roots(&self, c: &mut Command) {
        c.arg("--config-dir")
            .arg(&self.config)
            .arg("--runtime-root")
            .arg(&self.run)
            .arg("--state-root")
            .arg(&self.state)
            .env_remove("CREDENTIALS_DIRECTORY")
            .env_remove("VMWARDEN_FAULT_AFTER")
            .env("VMWARDEN_TEST_RANGES_DIR", &self.ranges)
            .env(
                "VMWARDEN_TEST_DEVICES_LOCK_DIR",
                self.dir.path().join("devices-lock"),
            );
    }

    pub fn launch_cmd(&self, name: &str) -> Command {
        let mut c = Command::new(LAUNCH);
        c.arg(name);
        self.with_roots(&mut c);
        c
    }

    /// `vmwarden-launch NAME --probe -- CMD…`, waited for.
    pub fn probe(&self, name: &str, cmd: &[&str]) -> Output {
        let mut c = self.launch_cmd(name);
        c.arg("--probe").arg("--").args(cmd);
        c.output().unwrap()
    }

    /// `vmwarden` with this env's roots (arguments still to add).
    pub fn vmwarden_cmd(&self) -> Command {
        let mut c = Command::new(VMWARDEN);
        self.with_roots(&mut c);
        c
    }

    pub fn vmwarden(&self, args: &[&str]) -> Output {
        self.vmwarden_cmd()
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// `vmwarden ARGS…`, killed if it has not returned within `limit`:
    /// `None` means it hung (the caller asserts it did not).
    pub fn vmwarden_bounded(&self, args: &[&str], limit: Duration) -> Option<Output> {
        bounded(self.vmwarden_cmd().args(args), limit)
    }

    /// `vmwarden-cleanup` with this env's roots (arguments still to add).
    pub fn cleanup_cmd(&self) -> Command {
        let mut c = Command::new(CLEANUP);
        self.with_roots(&mut c);
        c
    }

    pub fn cleanup(&self, name: &str) -> (Output, Value) {
        let out = self.cleanup_cmd().arg(name).output().unwrap();
        let v: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("cleanup printed no JSON ({e}): {}", text(&out)));
        (out, v)
    }

    pub fn verify_clean(&self, names: &[&str]) -> Output {
        let mut args = vec!["verify-clean"];
        args.extend_from_slice(names);
        self.vmwarden(&args)
    }

    /// `vmwarden-cleanup NAME` succeeds and reports clean; returns the report.
    #[track_caller]
    pub fn cleanup_clean(&self, name: &str) -> Value {
        self.cleanup_clean_after(name, "")
    }

    /// [`Env::cleanup_clean`], and `vmwarden verify-clean NAME` agrees.
    #[track_caller]
    pub fn assert_clean(&self, name: &str) -> Value {
        self.assert_clean_after(name, "")
    }

    /// [`Env::assert_clean`], its messages saying what came before (a
    /// launch step it was killed after, say).
    #[track_caller]
    pub fn assert_clean_after(&self, name: &str, after: &str) -> Value {
        let rep = self.cleanup_clean_after(name, after);
        let v = self.verify_clean(&[name]);
        assert!(
            v.status.success(),
            "verify-clean {name}{}: {}",
            after_text(after),
            text(&v)
        );
        assert!(String::from_utf8_lossy(&v.stdout).contains("result=clean"));
        rep
    }

    #[track_caller]
    fn cleanup_clean_after(&self, name: &str, after: &str) -> Value {
        let (o, rep) = self.cleanup(name);
        let after = after_text(after);
        assert!(
            o.status.success(),
            "cleanup of {name}{after} not clean: {}",
            text(&o)
        );
        assert_eq!(rep["clean"], true, "{name}{after}: {rep}");
        rep
    }

    /// `vmwarden-launch NAME` with the fault injected after `step`: it must
    /// SIGKILL itself there.
    #[track_caller]
    pub fn launch_killed_after(&self, name: &str, step: &str) {
        let out = self
            .launch_cmd(name)
            .env("VMWARDEN_FAULT_AFTER", step)
            .output()
            .unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            out.status.signal(),
            Some(9),
            "step {step}: launcher should SIGKILL itself: {}",
            text(&out)
        );
    }

    /// Start the hypervisor for `name`, serial console to a log file.
    pub fn start(&self, name: &str) -> Guest {
        spawn_logged(
            self.launch_cmd(name),
            self.path(&format!("{name}.serial.log")),
        )
    }
}

fn after_text(after: &str) -> String {
    if after.is_empty() {
        String::new()
    } else {
        format!(" after {after}")
    }
}

/// Spawn `cmd` (a launch) with stdin from /dev/null and stdout and stderr
/// to the file `log`.
pub fn spawn_logged(mut cmd: Command, log: PathBuf) -> Guest {
    let f = std::fs::File::create(&log).unwrap();
    cmd.stdin(Stdio::null())
        .stdout(f.try_clone().unwrap())
        .stderr(f);
    Guest {
        child: cmd.spawn().unwrap(),
        log,
    }
}

/// Run `cmd` (stdin from /dev/null, stdout and stderr captured), killed if
/// it has not returned within `limit`: `None` means it hung.
pub fn bounded(cmd: &mut Command, limit: Duration) -> Option<Output> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if child.try_wait().unwrap().is_some() {
            return Some(child.wait_with_output().unwrap());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

pub struct Guest {
    pub child: Child,
    pub log: PathBuf,
}

impl Guest {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
    /// Wait until the serial log has a line starting with `marker`.
    pub fn wait_for(&mut self, marker: &str, timeout: Duration) -> String {
        let end = Instant::now() + timeout;
        loop {
            let t = self.log_text();
            if let Some(l) = t.lines().find(|l| l.starts_with(marker)) {
                return l.to_string();
            }
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!("guest exited ({st}) before {marker:?}; log:\n{t}");
            }
            assert!(
                Instant::now() < end,
                "no {marker:?} within {timeout:?}; log:\n{t}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            if let Ok(Some(st)) = self.child.try_wait() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill();
        }
    }
}

pub fn text(o: &Output) -> String {
    format!(
        "status={} stdout={} stderr={}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    let mut c = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    c.stdin.take().unwrap().write_all(bytes).unwrap();
    let out = c.wait_with_output().unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// `/proc/PID/status` field values.
pub fn proc_status(pid: u32, key: &str) -> String {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"))
        .trim()
        .to_string()
}

/// How many seccomp filters `pid` runs under.
pub fn seccomp_filters(pid: u32) -> u32 {
    proc_status(pid, "Seccomp_filters").parse().unwrap()
}

/// Poll `f` every 20 ms until it holds; fail naming `what` after `limit`.
#[track_caller]
pub fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < end, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The processes of `uid` other than `not`, sorted.
pub fn others_of(uid: u32, not: u32) -> Vec<u32> {
    let mut v: Vec<u32> = processes_of_uid(uid)
        .into_iter()
        .filter(|p| *p != not)
        .collect();
    v.sort_unstable();
    v
}

/// A helper daemon `tests/setup-host.sh` installs with `cargo install`
/// (virtiofsd, vhost-device-vsock).
pub fn daemon(name: &str) -> PathBuf {
    let root = std::env::var("VMWARDEN_TEST_CARGO_ROOT")
        .unwrap_or_else(|_| "/var/cache/vmwarden-test/cargo".into());
    let p = PathBuf::from(root).join("bin").join(name);
    assert!(
        p.is_file(),
        "{} missing: run tests/setup-host.sh",
        p.display()
    );
    p
}

/// The interface each tun fd of `pid` is attached to, per /proc fdinfo.
pub fn tun_fds_of(pid: u32) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .unwrap()
        .flatten()
    {
        if let Ok(t) = std::fs::read_to_string(e.path()) {
            if let Some(l) = t.lines().find_map(|l| l.strip_prefix("iff:")) {
                out.push(l.trim().to_string());
            }
        }
    }
    out.sort();
    out
}

pub fn read_proc_bytes(pid: u32, what: &str) -> Vec<u8> {
    let mut v = Vec::new();
    std::fs::File::open(format!("/proc/{pid}/{what}"))
        .unwrap()
        .read_to_end(&mut v)
        .unwrap();
    v
}

/// Everything a failed launch could have left: files under the test's
/// roots (with owner and mode), mounts in every namespace that mention the
/// test dir or vmwarden, and processes of the given uids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub files: BTreeSet<String>,
    pub mounts: BTreeSet<String>,
    pub procs: BTreeSet<u32>,
    /// `vmw-*` interfaces in this network namespace.
    pub links: BTreeSet<String>,
}

fn walk(p: &Path, out: &mut BTreeSet<String>) {
    let Ok(md) = std::fs::symlink_metadata(p) else {
        return;
    };
    out.insert(format!(
        "{} {:o} {}:{}",
        p.display(),
        md.mode(),
        md.uid(),
        md.gid()
    ));
    if md.is_dir() {
        if let Ok(rd) = std::fs::read_dir(p) {
            for e in rd.flatten() {
                walk(&e.path(), out);
            }
        }
    }
}

pub fn snapshot(env: &Env, uids: &[u32]) -> Snapshot {
    let mut files = BTreeSet::new();
    walk(env.dir.path(), &mut files);
    // Test logs are ours, not the launcher's.
    files.retain(|f| !f.contains(".serial.log"));
    let mut mounts = BTreeSet::new();
    let dir = env.dir.path().to_string_lossy().into_owned();
    for (_, ns, m) in mountinfo::credential_mounts_everywhere(Some(&env.run), None) {
        mounts.insert(format!("{ns} {} {}", m.source, m.mount_point.display()));
    }
    for m in mountinfo::read("self").unwrap() {
        if m.mount_point.to_string_lossy().starts_with(&dir) || m.source.starts_with("vmwarden") {
            mounts.insert(format!("self {} {}", m.source, m.mount_point.display()));
        }
    }
    let mut procs = BTreeSet::new();
    for u in uids {
        procs.extend(processes_of_uid(*u));
    }
    Snapshot {
        files,
        mounts,
        procs,
        links: vmwarden_links().into_iter().collect(),
    }
}

/// A network namespace the test creates (`ip netns add`) and deletes on drop,
/// with helpers to run commands and vmwarden's binaries inside it.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new(tag: &str) -> Netns {
        let name = format!("vmwt-{tag}-{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        let out = Command::new("ip")
            .args(["netns", "add", &name])
            .output()
            .expect("run ip netns add (iproute2)");
        assert!(out.status.success(), "ip netns add: {}", text(&out));
        let ns = Netns { name };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    /// `ip -n NS ARGS…`, asserted to succeed; returns stdout.
    pub fn ip(&self, args: &[&str]) -> String {
        let out = self.ip_output(args);
        assert!(
            out.status.success(),
            "ip -n {} {args:?}: {}",
            self.name,
            text(&out)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn ip_output(&self, args: &[&str]) -> Output {
        Command::new("ip")
            .arg("-n")
            .arg(&self.name)
            .args(args)
            .output()
            .unwrap()
    }

    /// Does interface `name` exist in the namespace?
    pub fn has_link(&self, name: &str) -> bool {
        self.ip_output(&["link", "show", "dev", name])
            .status
            .success()
    }

    /// A bridge, up.
    pub fn bridge(&self, name: &str) {
        self.ip(&["link", "add", name, "type", "bridge"]);
        self.ip(&["link", "set", name, "up"]);
    }

    /// `ip netns exec NS PROGRAM` with the env's roots (the launcher's pid
    /// stays the child's: `ip netns exec` execs).
    pub fn cmd(&self, env: &Env, program: &str, first: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]).args(first);
        env.with_roots(&mut c);
        c
    }

    pub fn vmwarden(&self, env: &Env, args: &[&str]) -> Output {
        let mut c = self.cmd(env, VMWARDEN, &[]);
        c.args(args).stdin(Stdio::null()).output().unwrap()
    }

    pub fn cleanup(&self, env: &Env, name: &str) -> (Output, Value) {
        let out = self.cmd(env, CLEANUP, &[name]).output().unwrap();
        let v: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("cleanup printed no JSON ({e}): {}", text(&out)));
        (out, v)
    }

    /// Start VM `name`'s hypervisor inside the namespace, serial to a log.
    pub fn start(&self, env: &Env, name: &str) -> Guest {
        spawn_logged(
            self.cmd(env, LAUNCH, &[name]),
            env.path(&format!("{name}.serial.log")),
        )
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// Run `vmwarden purge ARGS` on a pseudo-terminal, typing `answer`.
pub fn purge_on_pty(env: &Env, args: &[&str], answer: &str) -> (bool, String) {
    let pty = nix::pty::openpty(None, None).unwrap();
    let slave = std::fs::File::from(pty.slave);
    let mut c = env.vmwarden_cmd();
    c.arg("purge")
        .args(args)
        .stdin(slave.try_clone().unwrap())
        .stdout(slave.try_clone().unwrap())
        .stderr(slave);
    let mut child = c.spawn().unwrap();
    drop(c);
    let mut master = std::fs::File::from(pty.master);
    std::thread::sleep(Duration::from_millis(300));
    std::io::Write::write_all(&mut master, format!("{answer}\n").as_bytes()).unwrap();
    let ok = child.wait().unwrap().success();
    let mut out = Vec::new();
    // Non-blocking drain of what the child printed.
    let fd = std::os::fd::AsFd::as_fd(&master);
    nix::fcntl::fcntl(
        fd,
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
    )
    .unwrap();
    let mut buf = [0u8; 4096];
    while let Ok(n) = master.read(&mut buf) {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    (ok, String::from_utf8_lossy(&out).into_owned())
}

/// Fresh principal uids per test, away from real users. Two checkouts
/// testing on one machine at once set `VMWARDEN_TEST_UID_BASE` apart (by
/// 1000 or more) so neither sees the other's VMs as processes of its uids.
pub fn uid(n: u32) -> u32 {
    let base = std::env::var("VMWARDEN_TEST_UID_BASE")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .unwrap_or(61000);
    base + n
}

/// The real `name` binary, copied into `env`'s root-owned directory; `None`
/// after a loud `NOT RUN:` line when it is missing outside CI.
pub fn real_binary(env: &Env, var: &str, name: &str) -> Option<PathBuf> {
    let src = match std::env::var_os(var) {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => repo_root().join("../shared/hypervisors/bin").join(name),
    };
    if !src.is_file() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{name} missing at {} (CI=true: a missing binary is a failure; set {var} or provide ../shared/hypervisors/bin)",
            src.display()
        );
        use std::io::Write;
        // Not eprintln!: the harness captures that; this line must show.
        let _ = writeln!(
            std::io::stderr(),
            "NOT RUN: {name} real-binary test ({} missing; set {var})",
            src.display()
        );
        return None;
    }
    let dst = env.path(name);
    std::fs::copy(&src, &dst).unwrap_or_else(|e| panic!("copy {}: {e}", src.display()));
    std::fs::set_permissions(&dst, PermissionsExt::from_mode(0o755)).unwrap();
    Some(dst)
}

/// Grants /dev/kvm to `uid` for the life of the value.
pub struct KvmAcl(DevAcl);

impl KvmAcl {
    pub fn grant(uid: u32) -> KvmAcl {
        KvmAcl(DevAcl::grant("/dev/kvm", uid))
    }
}

/// Grants `path` (a device node) read-write to `uid` with an ACL for the
/// life of the value (this host has no udev, so /dev/net/tun is 0600).
/// Dropping it puts the node's ACL back as it was: without an extended ACL
/// before, none after (`setfacl -x` alone would leave a mask entry behind,
/// and with it a group permission that `chmod` no longer grants).
pub struct DevAcl {
    path: PathBuf,
    uid: u32,
    had_extended: bool,
}

impl DevAcl {
    pub fn grant(path: &str, uid: u32) -> DevAcl {
        let before = Command::new("getfacl")
            .args(["--skip-base", "--omit-header", path])
            .output()
            .expect("getfacl (acl package; tests/setup-host.sh installs it)");
        assert!(before.status.success(), "getfacl {path}: {}", text(&before));
        let had_extended = !String::from_utf8_lossy(&before.stdout).trim().is_empty();
        let out = Command::new("setfacl")
            .args(["-m", &format!("u:{uid}:rw"), path])
            .output()
            .expect("setfacl (acl package; tests/setup-host.sh installs it)");
        assert!(out.status.success(), "setfacl {path}: {}", text(&out));
        DevAcl {
            path: PathBuf::from(path),
            uid,
            had_extended,
        }
    }
}

impl Drop for DevAcl {
    fn drop(&mut self) {
        let args = if self.had_extended {
            vec!["-x".to_string(), format!("u:{}", self.uid)]
        } else {
            vec!["-b".to_string()]
        };
        let _ = Command::new("setfacl").args(args).arg(&self.path).output();
    }
}

/// The host's Nix store as Nix makes it (`/nix/store`, `root:nixbld`,
/// 1775), with one file of the test's in it, for as long as the guard
/// lives. A store that exists (Debian's nix-bin, NixOS) is used as it is
/// and must be made that way; where there is none, the guard makes `/nix`,
/// `/nix/store` and the group `nixbld` as Nix would, and puts back exactly
/// what was there when dropped (a panicking test included). Test processes
/// take turns through an exclusive lock on a file of [`TEST_BASE`], so one
/// never removes the store another is using.
pub struct NixStore {
    _lock: std::fs::File,
    /// The test's file in the store.
    pub file: PathBuf,
    /// What this guard made, to be removed in this order (deepest first).
    made_dirs: Vec<PathBuf>,
    made_group: bool,
    /// The store's gid.
    pub gid: u32,
}

pub const NIX_STORE: &str = "/nix/store";

/// The gid of group `name` in /etc/group.
fn group_gid(name: &str) -> Option<u32> {
    std::fs::read_to_string("/etc/group")
        .unwrap()
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.len() >= 3 && f[0] == name).then(|| f[2].parse().ok())?
        })
}

impl NixStore {
    pub fn ensure() -> NixStore {
        require_root();
        use std::os::fd::AsRawFd;
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(test_base().join("nix-store.lock"))
            .unwrap();
        // SAFETY: flock on an fd this function owns; no pointer arguments.
        let r = unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) };
        assert_eq!(r, 0, "flock: {}", std::io::Error::last_os_error());
        let store = Path::new(NIX_STORE);
        let mut made_dirs = Vec::new();
        let mut made_group = false;
        let gid = match std::fs::symlink_metadata(store) {
            Ok(md) => {
                // Somebody's real store: used only if made as Nix makes it.
                assert!(
                    md.is_dir() && md.uid() == 0 && md.mode() & 0o7777 == 0o1775,
                    "{NIX_STORE} exists but is not root's, mode 1775 (it is uid {} mode {:o}); \
                     the store tests need it as Nix makes it",
                    md.uid(),
                    md.mode() & 0o7777
                );
                md.gid()
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let gid = match group_gid("nixbld") {
                    Some(g) => g,
                    None => {
                        let out = Command::new("groupadd")
                            .args(["--system", "nixbld"])
                            .output()
                            .unwrap();
                        assert!(out.status.success(), "groupadd nixbld: {}", text(&out));
                        made_group = true;
                        group_gid("nixbld").expect("nixbld after groupadd")
                    }
                };
                if std::fs::symlink_metadata("/nix").is_err() {
                    std::fs::create_dir("/nix").unwrap();
                    std::fs::set_permissions("/nix", PermissionsExt::from_mode(0o755)).unwrap();
                    made_dirs.push(PathBuf::from("/nix"));
                }
                std::fs::create_dir(store).unwrap();
                made_dirs.push(store.to_path_buf());
                std::os::unix::fs::chown(store, Some(0), Some(gid)).unwrap();
                std::fs::set_permissions(store, PermissionsExt::from_mode(0o1775)).unwrap();
                gid
            }
            Err(e) => panic!("{NIX_STORE}: {e}"),
        };
        let file = store.join(format!("vmwarden-test-{}-hello", std::process::id()));
        std::fs::write(&file, b"from the store\n").unwrap();
        std::fs::set_permissions(&file, PermissionsExt::from_mode(0o444)).unwrap();
        made_dirs.reverse();
        NixStore {
            _lock: lock,
            file,
            made_dirs,
            made_group,
            gid,
        }
    }

    /// `(uid, gid, mode)` of the store now.
    pub fn stat() -> (u32, u32, u32) {
        let md = std::fs::symlink_metadata(NIX_STORE).unwrap();
        (md.uid(), md.gid(), md.mode() & 0o7777)
    }
}

impl Drop for NixStore {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.file);
        for d in &self.made_dirs {
            // Only if empty: what another process put there stays.
            if let Err(e) = std::fs::remove_dir(d) {
                eprintln!("NixStore: leaving {} ({e})", d.display());
            }
        }
        if self.made_group {
            let out = Command::new("groupdel").arg("nixbld").output();
            if !out.as_ref().is_ok_and(|o| o.status.success()) {
                eprintln!("NixStore: groupdel nixbld failed: {out:?}");
            }
        }
    }
}

/// The active id range (base, count) of VM `vm` of `env`'s state root, from
/// the ranges' record `env.ranges`.
pub fn id_range_in(env: &Env, vm: &str) -> Option<(u32, u32)> {
    std::fs::read_dir(&env.ranges)
        .ok()?
        .flatten()
        .find_map(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            if !n.starts_with("range-") {
                return None;
            }
            let v: Value = serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok()?;
            if v["vm"] != vm || v["state"] != "active" || v["state_root"] != json!(env.state) {
                return None;
            }
            let id = |k: &str| v[k].as_u64().and_then(|x| u32::try_from(x).ok());
            Some((id("base")?, id("count")?))
        })
}

/// An intent record of VM `name` run by `principal` (uid and gid) holding
/// `resources`, as a launch writes it: for tests that hand cleanup's parts
/// a record of their own.
pub fn intent_of(name: &str, principal: u32, resources: Vec<Resource>) -> Intent {
    Intent {
        version: 1,
        name: name.into(),
        instance_id: "0123456789abcdef0123456789abcdef".into(),
        pid: 1,
        boot_id: "boot".into(),
        created_unix: 0,
        principal: IntentPrincipal {
            uid: principal,
            gid: principal,
            user: None,
        },
        hypervisor: None,
        cgroup: None,
        resources,
    }
}

/// Boot VM `web`'s oneshot guest once (it powers off after its script;
/// `boot` bounds its readiness) and return its console output, logged to
/// `web.TAG.log`.
pub fn boot_once_within(env: &Env, tag: &str, boot: Duration) -> String {
    let mut g = spawn_logged(env.launch_cmd("web"), env.path(&format!("web.{tag}.log")));
    g.wait_for("VMWARDEN-GUEST-READY", boot);
    let status = g
        .wait_exit(Duration::from_secs(60))
        .expect("the oneshot guest powers off");
    assert!(status.success(), "QEMU: {status:?}\n{}", g.log_text());
    g.log_text()
}
