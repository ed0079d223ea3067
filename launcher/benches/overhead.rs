//! `cargo bench` (as root): what vmwarden costs, each figure against a
//! baseline measured in the same run. Prints tables and ratios and the
//! issue's goals beside them; asserts nothing (these machines are noisy —
//! compare ratios within one run, not seconds across runs).
//!
//! The runtime root is a tmpfs (as `/run` is in production). A launch is
//! measured two ways: spawned into a cgroup of its own, as systemd starts
//! `ExecStart=` in the unit's cgroup (liveness then asks that cgroup), and
//! from the bench's own cgroup, where liveness falls back to `/proc`.
//!
//! 1. Launch overhead: `vmwarden-launch --probe -- /bin/true` against
//!    `/bin/true` started the same way, paired, interleaved in each round
//!    with its two yardsticks: the floor program (`launch-floor.c` from
//!    `../shared/bench`, built here with `gcc -O2`: the launch's kernel work
//!    in one C process) against `/bin/true`, and Firecracker's jailer
//!    (`../shared/hypervisors/bin`, no cgroups) against its exec file run
//!    bare. Every figure is an overhead over its own baseline (the median
//!    of pair differences, wall and CPU), and the launch's is given as a
//!    ratio to the floor's and to the jailer's from the same rounds. Again
//!    with 2,000 extra sleeping threads.
//! 2. Teardown: `vmwarden-cleanup` and `vmwarden verify-clean NAME` per VM,
//!    in the same rounds, as ratios to the floor's overhead. Every row is
//!    given in CPU time too (wait4 rusage): on a guest whose host steals
//!    time, wall clock moves by more than a change does.
//! 3. `vmwarden reap` (dry run) over 10, 100 and 1,000 orphaned runtime dirs
//!    shaped like real ones, and 1,000 again with the 2,000 threads.
//! 4. `vmwarden status` of 100 configured VMs.
//! 5. Start → QMP `running`: through the launcher against bare QEMU with the
//!    same argv, paired (needs QEMU and the test guest's kernel).
//! 6. Peak RSS of the launcher before `execve`; vmwarden processes left while
//!    the VM runs.
//! 7. The syscalls of one launch (strace, when installed).
//!
//! `cargo bench --bench overhead -- --quick` runs fewer iterations (a bare `cargo bench -- --quick` also hands `--quick` to the library's test harness, which refuses it).

use std::ffi::{CStr, CString};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use vmwarden::config::spec::Spec;
use vmwarden::host::cgroup;
use vmwarden::hypervisor::qmp::Qmp;
use vmwarden::hypervisor::{self, Layout};

/// The binary `name`: beside this bench (cargo bench builds them into the
/// same target dir), or in `$VMWARDEN_BENCH_BIN_DIR` (to measure another
/// build, e.g. an older commit's, with this bench).
fn bin(name: &str) -> PathBuf {
    let dir = match std::env::var_os("VMWARDEN_BENCH_BIN_DIR") {
        Some(d) => PathBuf::from(d),
        None => {
            let exe = std::env::current_exe().unwrap();
            exe.parent().unwrap().parent().unwrap().to_path_buf()
        }
    };
    let p = dir.join(name);
    assert!(
        p.exists(),
        "{} not built: run `cargo build --release` first (cargo bench does)",
        p.display()
    );
    p
}

fn pct(v: &[Duration], p: f64) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    let last = v.len() - 1;
    // The rank p·last, rounded, in exact integer steps of 1/1000.
    let per_mille = (0..=1000u32)
        .min_by(|a, b| {
            let da = (f64::from(*a) / 1000.0 - p).abs();
            let db = (f64::from(*b) / 1000.0 - p).abs();
            da.partial_cmp(&db).unwrap()
        })
        .unwrap();
    let i = (last * usize::try_from(per_mille).unwrap() + 500) / 1000;
    v[i.min(last)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Median of signed per-pair differences, in ms.
fn median_diff_ms(a: &[Duration], b: &[Duration]) -> f64 {
    let mut d: Vec<f64> = a.iter().zip(b).map(|(x, y)| ms(*x) - ms(*y)).collect();
    d.sort_by(|x, y| x.partial_cmp(y).unwrap());
    d[d.len() / 2]
}

/// What one [`run`] took.
#[derive(Clone, Copy, Debug)]
struct Ran {
    /// Wall time, spawn to reap.
    wall: Duration,
    /// Peak RSS in KiB (the kernel keeps the pre-`execve` peak in it).
    rss_kib: u64,
    /// CPU time, user + system (wait4 rusage): what the command itself
    /// cost, without the time the hypervisor under this VM gave to
    /// others (steal moves the wall-clock rows by more than a change).
    cpu: Duration,
}

/// Run `c` to completion (stdio to /dev/null).
fn run(c: &mut Command) -> Ran {
    c.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let t = Instant::now();
    // Reaped by the wait4 below (it also gives the rusage).
    #[allow(clippy::zombie_processes)]
    let child = c.spawn().unwrap();
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to fill.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waiting for our own child, filling locals.
    let r = unsafe {
        libc::wait4(
            i32::try_from(child.id()).unwrap(),
            &raw mut status,
            0,
            &raw mut ru,
        )
    };
    let d = t.elapsed();
    assert!(r > 0, "wait4 failed");
    if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
        // Run it again with its output to say why.
        let o = c
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        panic!(
            "{c:?} failed ({status}): {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let tv = |t: libc::timeval| {
        Duration::from_secs(u64::try_from(t.tv_sec).unwrap_or(0))
            + Duration::from_micros(u64::try_from(t.tv_usec).unwrap_or(0))
    };
    Ran {
        wall: d,
        rss_kib: u64::try_from(ru.ru_maxrss).unwrap_or(0),
        cpu: tv(ru.ru_utime) + tv(ru.ru_stime),
    }
}

/// Root-owned 0755 (not the world-writable /tmp): the launcher refuses
/// credential files in a directory anyone but root can write.
fn bench_base() -> &'static Path {
    let base = Path::new("/var/lib/vmwarden-test");
    if let Err(e) = std::fs::create_dir(base) {
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists, "{e}");
    }
    std::fs::set_permissions(base, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    base
}

/// Private config, runtime (a tmpfs) and state roots.
struct Roots {
    dir: tempfile::TempDir,
    config: PathBuf,
    run: PathBuf,
    state: PathBuf,
}

impl Roots {
    fn new() -> Roots {
        let dir = tempfile::Builder::new()
            .prefix("vmwarden-bench.")
            .tempdir_in(bench_base())
            .unwrap();
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let config = dir.path().join("config");
        let run = dir.path().join("run");
        std::fs::create_dir(&config).unwrap();
        std::fs::create_dir(&run).unwrap();
        nix::mount::mount(
            Some("tmpfs"),
            &run,
            Some("tmpfs"),
            nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
            Some("mode=0755,size=256m"),
        )
        .expect("mount a tmpfs for the runtime root");
        Roots {
            config,
            run,
            state: dir.path().join("state"),
            dir,
        }
    }
    fn args<'a>(&self, c: &'a mut Command) -> &'a mut Command {
        c.arg("--config-dir")
            .arg(&self.config)
            .arg("--runtime-root")
            .arg(&self.run)
            .arg("--state-root")
            .arg(&self.state)
    }
    fn spec_value(&self, name: &str, uid: u32) -> serde_json::Value {
        serde_json::json!({
            "version": 1, "name": name,
            "principal": { "uid": uid, "gid": uid },
            "hypervisor": { "kind": "qemu", "binary": "/usr/bin/qemu-system-x86_64", "accel": "tcg", "machine": "microvm" },
            "vcpus": 1, "memory_mib": 128,
            "kernel": "/bin/true",
            "credentials": [ { "name": "key", "source": { "path": self.config.join("key") } } ]
        })
    }
    fn write_spec(&self, name: &str, v: &serde_json::Value) {
        let key = self.config.join("key");
        if !key.exists() {
            std::fs::write(&key, b"bench-secret").unwrap();
            std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600))
                .unwrap();
        }
        std::fs::write(
            self.config.join(format!("{name}.json")),
            serde_json::to_vec(v).unwrap(),
        )
        .unwrap();
    }
    fn spec(&self, name: &str, uid: u32) {
        self.write_spec(name, &self.spec_value(name, uid));
    }
}

impl Drop for Roots {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.run, nix::mount::MntFlags::MNT_DETACH);
        let _ = &self.dir;
    }
}

/// A cgroup of the bench's own, standing in for a unit's: each launch is
/// spawned into it (as systemd spawns `ExecStart=`), alone.
///
/// Moving a process between cgroups takes a lock whose first writer after
/// a quiet spell waits for an RCU grace period (~10 ms here); later
/// writers within the same grace window do not. So that neither side of a
/// pair pays it by chance, [`UnitCgroup::enter`] first moves a helper
/// process between two side cgroups, and the measured child's own move
/// then finds the lock warm.
struct UnitCgroup {
    path: PathBuf,
    procs: CString,
    side: [PathBuf; 2],
    helper: std::process::Child,
    flip: std::cell::Cell<usize>,
}

impl UnitCgroup {
    fn new() -> Option<UnitCgroup> {
        let mount = cgroup::mount_point()?;
        let base = format!("vmwarden-bench.{}", std::process::id());
        let path = mount.join(&base);
        std::fs::create_dir(&path).ok()?;
        let side = [
            mount.join(format!("{base}.side0")),
            mount.join(format!("{base}.side1")),
        ];
        for d in &side {
            std::fs::create_dir(d).ok()?;
        }
        let helper = Command::new("/bin/sleep")
            .arg("36000")
            .stdin(Stdio::null())
            .spawn()
            .ok()?;
        let procs = CString::new(path.join("cgroup.procs").as_os_str().as_encoded_bytes()).ok()?;
        Some(UnitCgroup {
            path,
            procs,
            side,
            helper,
            flip: std::cell::Cell::new(0),
        })
    }
    /// Make `c`'s child join this cgroup before it `execve`s.
    fn enter(&self, c: &mut Command) {
        let i = self.flip.get();
        self.flip.set(1 - i);
        let _ = std::fs::write(
            self.side[i].join("cgroup.procs"),
            self.helper.id().to_string(),
        );
        let procs = self.procs.clone();
        // SAFETY: the hook runs between fork and exec and only makes the
        // open/write/close system calls (no allocation: the path is a CStr).
        unsafe { c.pre_exec(move || join_cgroup(&procs)) };
    }
}

/// Clear close-on-exec on `fd`.
fn inherit_fd(fd: i32) -> std::io::Result<()> {
    // SAFETY: `fd` stays open in the caller until the exec that inherits it.
    let b = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    nix::fcntl::fcntl(
        b,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
    )?;
    Ok(())
}

/// Move the calling process into the cgroup whose `cgroup.procs` is `procs`.
fn join_cgroup(procs: &CStr) -> std::io::Result<()> {
    let fd = nix::fcntl::open(procs, OFlag::O_WRONLY | OFlag::O_CLOEXEC, Mode::empty())?;
    nix::unistd::write(&fd, b"0")?;
    Ok(())
}

impl Drop for UnitCgroup {
    fn drop(&mut self) {
        let _ = self.helper.kill();
        let _ = self.helper.wait();
        for d in self.side.iter().chain(std::iter::once(&self.path)) {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// Sleeping threads in separate processes (this binary re-run with
/// `--sleeper N`), killed by pid when dropped.
struct Sleepers(Vec<std::process::Child>);

impl Sleepers {
    fn start(procs: usize, threads_each: usize) -> Sleepers {
        let me = std::env::current_exe().unwrap();
        let mut v = Vec::new();
        for _ in 0..procs {
            let mut c = Command::new(&me)
                .args(["--sleeper", &threads_each.to_string()])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let mut line = String::new();
            std::io::BufRead::read_line(
                &mut std::io::BufReader::new(c.stdout.take().unwrap()),
                &mut line,
            )
            .unwrap();
            assert_eq!(line.trim(), "READY");
            v.push(c);
        }
        Sleepers(v)
    }
}

impl Drop for Sleepers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn sleeper_main(n: usize) -> ! {
    for _ in 0..n {
        std::thread::Builder::new()
            .stack_size(64 * 1024)
            .spawn(|| loop {
                std::thread::sleep(Duration::from_secs(3600))
            })
            .unwrap();
    }
    println!("READY");
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

fn host_threads() -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .map(|e| {
            std::fs::read_dir(e.path().join("task"))
                .map(|t| t.count())
                .unwrap_or(0)
        })
        .sum()
}

/// One result row: p50, p95, and the ratio of p50s against `base`.
fn row(label: &str, v: &[Duration], base: Option<&[Duration]>) {
    let (p50, p95) = (pct(v, 0.5), pct(v, 0.95));
    match base {
        Some(b) => println!(
            "  {label:<52} p50 {:>8.2} ms  p95 {:>8.2} ms  {:>6.1}x",
            ms(p50),
            ms(p95),
            ms(p50) / ms(pct(b, 0.5))
        ),
        None => println!(
            "  {label:<52} p50 {:>8.2} ms  p95 {:>8.2} ms  (baseline)",
            ms(p50),
            ms(p95)
        ),
    }
}

/// Results the summary quotes.
#[derive(Default)]
struct Summary {
    lines: Vec<(String, String, String)>,
}

impl Summary {
    fn add(&mut self, what: &str, measured: String, goal: &str) {
        self.lines.push((what.into(), measured, goal.into()));
    }
}

/// Wall and CPU time of one command over many rounds, in round order (so
/// two of them pair up round by round).
#[derive(Default)]
struct Samples {
    wall: Vec<Duration>,
    cpu: Vec<Duration>,
    max_rss_kib: u64,
}

impl Samples {
    fn push(&mut self, r: Ran) -> Ran {
        self.wall.push(r.wall);
        self.cpu.push(r.cpu);
        self.max_rss_kib = self.max_rss_kib.max(r.rss_kib);
        r
    }
    fn is_empty(&self) -> bool {
        self.wall.is_empty()
    }
}

/// What a command costs over its baseline in the same rounds: the medians
/// of the pair differences, wall and CPU, in ms.
#[derive(Clone, Copy, Debug)]
struct Overhead {
    wall: f64,
    cpu: f64,
}

fn overhead(v: &Samples, base: &Samples) -> Overhead {
    Overhead {
        wall: median_diff_ms(&v.wall, &base.wall),
        cpu: median_diff_ms(&v.cpu, &base.cpu),
    }
}

impl Overhead {
    /// This overhead as a multiple of `of`'s, wall and CPU.
    fn ratio(self, of: Overhead) -> String {
        format!(
            "{:.2}× wall, {:.2}× CPU",
            self.wall / of.wall,
            self.cpu / of.cpu
        )
    }
    fn show(self) -> String {
        format!("{:.2} ms wall, {:.2} ms CPU", self.wall, self.cpu)
    }
}

/// The floor program (`launch-floor.c`, beside the repository in
/// `../shared/bench`) and Firecracker's binaries (`../shared/hypervisors/bin`).
fn shared_dir() -> PathBuf {
    match std::env::var_os("VMWARDEN_BENCH_SHARED") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared"),
    }
}

/// A missing input: NOT RUN here, a failure in CI.
fn missing(what: &str) {
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "CI: {what} is missing"
    );
    println!("\nNOT RUN: {what}");
}

/// Build the floor program with `gcc -O2` into `dir`.
fn build_floor(dir: &Path) -> Option<PathBuf> {
    let src = shared_dir().join("bench/launch-floor.c");
    if !src.is_file() {
        missing(&format!("the floor program ({} not found)", src.display()));
        return None;
    }
    let out = dir.join("launch-floor");
    let st = Command::new("gcc")
        .args(["-O2", "-o"])
        .arg(&out)
        .arg(&src)
        .status();
    if !st.is_ok_and(|s| s.success()) {
        missing(&format!(
            "the floor program (gcc -O2 {} failed)",
            src.display()
        ));
        return None;
    }
    Some(out)
}

/// Firecracker's jailer over its exec file, the way the comparison runs
/// it: `jailer --id ID --exec-file firecracker --uid U --gid U
/// --chroot-base-dir DIR -- --version` (no cgroups, no network namespace;
/// it copies the exec file into a fresh chroot, makes its device nodes,
/// pivots into it, drops to the uid and execs), against `firecracker
/// --version` run bare.
struct Jailer {
    jailer: PathBuf,
    firecracker: PathBuf,
    base: PathBuf,
    next: std::cell::Cell<u64>,
}

impl Jailer {
    fn find(base: PathBuf) -> Option<Jailer> {
        let bin = shared_dir().join("hypervisors/bin");
        let (jailer, firecracker) = (bin.join("jailer"), bin.join("firecracker"));
        if !jailer.is_file() || !firecracker.is_file() {
            missing(&format!(
                "Firecracker's jailer ({} not found)",
                bin.display()
            ));
            return None;
        }
        std::fs::create_dir_all(&base).unwrap();
        Some(Jailer {
            jailer,
            firecracker,
            base,
            next: std::cell::Cell::new(0),
        })
    }
    fn bare(&self) -> Ran {
        run(Command::new(&self.firecracker).arg("--version"))
    }
    /// One jailed start, in a chroot of its own (removed after, unmeasured).
    fn jailed(&self) -> Ran {
        let id = self.next.get();
        self.next.set(id + 1);
        let id = format!("bench{id}");
        let r = run(Command::new(&self.jailer)
            .args(["--id", &id, "--exec-file"])
            .arg(&self.firecracker)
            .args(["--uid", "61951", "--gid", "61951", "--chroot-base-dir"])
            .arg(&self.base)
            .args(["--", "--version"]));
        let _ = std::fs::remove_dir_all(self.base.join("firecracker").join(&id));
        r
    }
}

struct LaunchRun {
    /// `/bin/true` and a probe launch spawned into the unit-like cgroup,
    /// and the cleanup of a record naming it.
    base_unit: Samples,
    launch_unit: Samples,
    cleanup_unit: Samples,
    /// From the bench's cgroup: `/bin/true`, the floor program over it,
    /// firecracker bare and jailed, the probe launch, cleanup (liveness
    /// from `/proc`) and verify-clean.
    base: Samples,
    floor: Samples,
    fc_bare: Samples,
    jailer: Samples,
    launch: Samples,
    cleanup: Samples,
    verify: Samples,
}

/// `n` interleaved rounds: /bin/true and a probe launch in the unit
/// cgroup, cleanup; /bin/true, the floor program, firecracker bare and
/// jailed, a probe launch, cleanup, verify-clean from the bench's cgroup.
fn launch_rounds(
    r: &Roots,
    cg: Option<&UnitCgroup>,
    floor: Option<&Path>,
    jail: Option<&Jailer>,
    n: usize,
) -> LaunchRun {
    let launch = bin("vmwarden-launch");
    let cleanup = bin("vmwarden-cleanup");
    let vmw = bin("vmwarden");
    let probe = |cg: Option<&UnitCgroup>| {
        let mut c = Command::new(&launch);
        r.args(c.arg("bench")).args(["--probe", "--", "/bin/true"]);
        if let Some(cg) = cg {
            cg.enter(&mut c);
        }
        run(&mut c)
    };
    let truth = |cg: Option<&UnitCgroup>| {
        let mut c = Command::new("/bin/true");
        if let Some(cg) = cg {
            cg.enter(&mut c);
        }
        run(&mut c)
    };
    let floor_dir = r.run.join("floor");
    std::fs::create_dir_all(&floor_dir).unwrap();
    let floor_run = |f: &Path| {
        run(Command::new(f)
            .arg(&floor_dir)
            .arg("61950")
            .arg("/bin/true"))
    };
    let clean = || run(r.args(Command::new(&cleanup).arg("bench")));
    for _ in 0..3 {
        probe(cg);
        clean();
        if let Some(f) = floor {
            floor_run(f);
        }
        if let Some(j) = jail {
            j.jailed();
        }
    }
    let mut out = LaunchRun {
        base_unit: Samples::default(),
        launch_unit: Samples::default(),
        cleanup_unit: Samples::default(),
        base: Samples::default(),
        floor: Samples::default(),
        fc_bare: Samples::default(),
        jailer: Samples::default(),
        launch: Samples::default(),
        cleanup: Samples::default(),
        verify: Samples::default(),
    };
    for _ in 0..n {
        if cg.is_some() {
            out.base_unit.push(truth(cg));
            out.launch_unit.push(probe(cg));
            out.cleanup_unit.push(clean());
        }
        out.base.push(truth(None));
        if let Some(f) = floor {
            out.floor.push(floor_run(f));
        }
        out.launch.push(probe(None));
        out.cleanup.push(clean());
        out.verify.push(run(r
            .args(&mut Command::new(&vmw))
            .args(["verify-clean", "bench"])));
        if let Some(j) = jail {
            out.fc_bare.push(j.bare());
            out.jailer.push(j.jailed());
        }
    }
    out
}

/// The ratios one [`LaunchRun`] gives (see [`print_launch`]).
struct Ratios {
    floor: Option<Overhead>,
    jailer: Option<Overhead>,
    launch: Overhead,
    launch_unit: Option<Overhead>,
    cleanup: Overhead,
    cleanup_unit: Option<Overhead>,
    verify: Overhead,
}

impl LaunchRun {
    fn ratios(&self) -> Ratios {
        fn nonempty(s: &Samples) -> Option<&Samples> {
            (!s.is_empty()).then_some(s)
        }
        Ratios {
            floor: nonempty(&self.floor).map(|f| overhead(f, &self.base)),
            jailer: nonempty(&self.jailer).map(|j| overhead(j, &self.fc_bare)),
            launch: overhead(&self.launch, &self.base),
            launch_unit: nonempty(&self.launch_unit).map(|l| overhead(l, &self.base_unit)),
            cleanup: overhead(&self.cleanup, &self.base),
            cleanup_unit: nonempty(&self.cleanup_unit).map(|c| overhead(c, &self.base)),
            verify: overhead(&self.verify, &self.base),
        }
    }
}

fn print_launch(lr: &LaunchRun, title: &str) -> Ratios {
    println!("\n== {title}");
    println!("  wall p50/p95 and p50 ÷ the baseline's p50; overhead = median of pair differences (wall, CPU)");
    let line = |label: &str, v: &Samples, base: Option<&Samples>| {
        row(label, &v.wall, base.map(|b| &b.wall[..]));
        if let Some(b) = base {
            println!("  {:<52} overhead {}", "", overhead(v, b).show());
        }
    };
    if !lr.launch_unit.is_empty() {
        line("/bin/true, spawned into a cgroup", &lr.base_unit, None);
        line(
            "launch --probe -- /bin/true, own cgroup (as a unit)",
            &lr.launch_unit,
            Some(&lr.base_unit),
        );
    }
    line("/bin/true, bench's cgroup", &lr.base, None);
    if !lr.floor.is_empty() {
        line(
            "launch-floor RUNDIR UID /bin/true (the floor)",
            &lr.floor,
            Some(&lr.base),
        );
    }
    line(
        "launch --probe -- /bin/true, shared cgroup (/proc)",
        &lr.launch,
        Some(&lr.base),
    );
    if !lr.cleanup_unit.is_empty() {
        line(
            "vmwarden-cleanup, record with a cgroup",
            &lr.cleanup_unit,
            Some(&lr.base),
        );
    }
    line(
        "vmwarden-cleanup, record without one (/proc)",
        &lr.cleanup,
        Some(&lr.base),
    );
    line("vmwarden verify-clean NAME", &lr.verify, Some(&lr.base));
    if !lr.jailer.is_empty() {
        line("firecracker --version, bare", &lr.fc_bare, None);
        line(
            "jailer … --exec-file firecracker -- --version",
            &lr.jailer,
            Some(&lr.fc_bare),
        );
    }
    println!(
        "  CPU time p50 (wait4 rusage): /bin/true {:.2} ms; launch {:.2} ms; peak RSS of the launcher {} KiB",
        ms(pct(&lr.base.cpu, 0.5)),
        ms(pct(&lr.launch.cpu, 0.5)),
        lr.launch.max_rss_kib
    );
    let x = lr.ratios();
    println!("  ratios, each overhead over its baseline's in this run:");
    if let Some(f) = x.floor {
        println!("    launch ÷ floor (/proc)         {}", x.launch.ratio(f));
        if let Some(u) = x.launch_unit {
            println!("    launch ÷ floor (own cgroup)    {}", u.ratio(f));
        }
        if let Some(c) = x.cleanup_unit {
            println!("    cleanup (cgroup) ÷ floor       {}", c.ratio(f));
        }
        println!("    cleanup (/proc) ÷ floor        {}", x.cleanup.ratio(f));
        println!("    verify-clean ÷ floor           {}", x.verify.ratio(f));
    }
    if let Some(j) = x.jailer {
        println!("    launch ÷ jailer (/proc)        {}", x.launch.ratio(j));
        if let Some(u) = x.launch_unit {
            println!("    launch ÷ jailer (own cgroup)   {}", u.ratio(j));
        }
    }
    x
}

/// Where tests/setup-host.sh installs virtiofsd.
fn virtiofsd() -> Option<PathBuf> {
    let root = std::env::var("VMWARDEN_TEST_CARGO_ROOT")
        .unwrap_or_else(|_| "/var/cache/vmwarden-test/cargo".into());
    let p = PathBuf::from(root).join("bin/virtiofsd");
    p.is_file().then_some(p)
}

/// Whether any process runs with effective uid `uid` (owner of /proc/PID).
fn uid_has_processes(uid: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
        e.file_name().to_string_lossy().parse::<u32>().is_ok()
            && e.metadata().is_ok_and(|m| m.uid() == uid)
    })
}

/// `n` interleaved pairs: a probe launch of a VM without shares and one of
/// a VM with two read-only virtiofs shares, each followed by its cleanup
/// once its helpers are gone (they die with the probe). `None`, with a
/// NOT RUN line, without virtiofsd.
fn shares_rounds(r: &Roots, n: usize) -> Option<(Vec<Duration>, Vec<Duration>)> {
    let Some(daemon) = virtiofsd() else {
        println!(
            "\nNOT RUN: launch with two virtiofs shares (no virtiofsd: run tests/setup-host.sh)"
        );
        return None;
    };
    let uid = 61901;
    let mut v = r.spec_value("shares", uid);
    v["shares"] = serde_json::json!([
        { "tag": "doc", "source": "/usr/share/doc", "proto": "virtiofs", "read_only": true },
        { "tag": "lib", "source": "/usr/lib", "proto": "virtiofs", "read_only": true }
    ]);
    v["virtiofsd"] = serde_json::json!({ "binary": daemon });
    r.write_spec("shares", &v);
    let launch = bin("vmwarden-launch");
    let cleanup = bin("vmwarden-cleanup");
    let probe = |name: &str| {
        let mut c = Command::new(&launch);
        r.args(c.arg(name)).args(["--probe", "--", "/bin/true"]);
        run(&mut c).wall
    };
    let clean = |name: &str, uid: u32| {
        let end = Instant::now() + Duration::from_secs(10);
        while uid_has_processes(uid) && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(2));
        }
        let out = r.args(Command::new(&cleanup).arg(name)).output().unwrap();
        assert!(
            out.status.success(),
            "cleanup {name}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    };
    for _ in 0..3 {
        probe("shares");
        clean("shares", uid);
    }
    let (mut plain, mut shared) = (Vec::new(), Vec::new());
    for _ in 0..n {
        plain.push(probe("bench"));
        clean("bench", 61900);
        shared.push(probe("shares"));
        clean("shares", uid);
    }
    Some((plain, shared))
}

/// `n` dead VMs shaped like real orphans: a runtime dir each with a lease
/// file, an intent record and a leftover control dir; every VM configured.
/// With `cgroup`, each record names the unit cgroup a launch under systemd
/// records (long gone); without, the record is one of a launch outside a
/// cgroup of its own (liveness then asks `/proc`).
/// `VMWARDEN_BENCH_LEGACY_RECORDS=1` never writes the `cgroup` field (older
/// builds reject it).
fn synthetic(r: &Roots, n: usize, cgroup: bool) {
    let cgroup = cgroup && std::env::var_os("VMWARDEN_BENCH_LEGACY_RECORDS").is_none();
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    for i in 0..n {
        let name = format!("vm{i}");
        let d = r.run.join(&name);
        std::fs::create_dir_all(d.join("control")).unwrap();
        std::fs::write(d.join("instance.lock"), b"").unwrap();
        std::fs::set_permissions(
            d.join("instance.lock"),
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .unwrap();
        let mut intent = serde_json::json!({
            "version": 1, "name": name, "instance_id": format!("{i:032x}"), "pid": 1,
            "boot_id": boot.trim(), "created_unix": 0,
            "principal": { "uid": 62000 + i, "gid": 62000 + i },
            "hypervisor": "qemu",
            "resources": [
                { "kind": "state-dir", "path": r.state.join(&name) },
                { "kind": "runtime-dir", "path": d.join("control") },
                { "kind": "runtime-file", "path": d.join("control/qmp.sock") },
                { "kind": "runtime-dir", "path": d.join("credentials") },
                { "kind": "private-mount", "path": d.join("credentials"), "fstype": "tmpfs" }
            ]
        });
        if cgroup {
            intent["cgroup"] = serde_json::json!({
                "path": format!("/sys/fs/cgroup/machine.slice/microvm@{name}.service"),
                "id": 1_000_000 + i
            });
        }
        std::fs::write(
            d.join("instance.json"),
            serde_json::to_vec_pretty(&intent).unwrap(),
        )
        .unwrap();
        r.spec(&name, 62000 + i as u32);
    }
}

fn reap_median(vmw: &Path, r: &Roots, runs: usize) -> Duration {
    let v: Vec<Duration> = (0..runs)
        .map(|_| run(r.args(&mut Command::new(vmw)).args(["reap", "--json"])).wall)
        .collect();
    pct(&v, 0.5)
}

/// Start → QMP `running`: the launcher against bare QEMU with the argv the
/// launcher renders, paired. `None` without QEMU or the guest kernel.
fn qmp_running(n: usize, cg: Option<&UnitCgroup>) -> Option<(Vec<Duration>, Vec<Duration>)> {
    let qemu = Path::new("/usr/bin/qemu-system-x86_64");
    let assets = PathBuf::from(
        std::env::var("VMWARDEN_TEST_ASSETS")
            .unwrap_or_else(|_| "/var/cache/vmwarden/test-assets".into()),
    );
    let (kernel, initrd) = (assets.join("vmlinuz"), assets.join("initramfs.img"));
    if !qemu.exists() || !kernel.exists() || !initrd.exists() {
        println!(
            "\n== start → QMP running: skipped (needs {} and the test guest in {}: tests/assets/build-guest.sh)",
            qemu.display(),
            assets.display()
        );
        return None;
    }
    let r = Roots::new();
    let mut spec = r.spec_value("qmpb", 61901);
    spec["kernel"] = serde_json::json!(kernel);
    spec["initrd"] = serde_json::json!(initrd);
    spec["cmdline"] = serde_json::json!("console=ttyS0 panic=-1");
    spec["credentials"] = serde_json::json!([]);
    r.write_spec("qmpb", &spec);
    let parsed: Spec = serde_json::from_value(spec).unwrap();
    let bare_dir = r.dir.path().join("bare");
    std::fs::create_dir_all(bare_dir.join("credentials")).unwrap();
    let layout = |d: &Path, qmp_fd: i32| Layout {
        qmp_fd,
        credentials_dir: d.join("credentials"),
        api_socket: d.join("api.sock"),
        firecracker_config: d.join("firecracker.json"),
        tap_fds: vec![],
        tap_queue_fds: vec![],
        vhost_net_fds: vec![],
        control_dir: d.to_path_buf(),
        vhost_vsock_fd: None,
        user_net_fd: None,
        event_monitor_fd: None,
        usb_nodes: vec![],
    };
    // What the launcher decides for this binary: it links libseccomp.
    let seccomp = hypervisor::elf::links_libseccomp(qemu).unwrap_or(false);
    // Bare QEMU gets its QMP socket as the launcher hands it over: bound
    // by the caller, passed as an fd.
    let bare_qemu = |qmp: &std::os::unix::net::UnixListener| {
        use std::os::fd::AsRawFd;
        use std::os::unix::process::CommandExt;
        let fd = qmp.as_raw_fd();
        let argv = hypervisor::argv(&parsed, &layout(&bare_dir, fd), seccomp);
        let mut c = Command::new(&argv[0]);
        c.args(&argv[1..]);
        // SAFETY: the hook runs between fork and exec and only makes one
        // fcntl call on an fd this process owns (no allocation).
        unsafe { c.pre_exec(move || inherit_fd(fd)) };
        c
    };
    let wait_running = |sock: &Path, t0: Instant| -> Duration {
        let end = t0 + Duration::from_secs(60);
        loop {
            if let Ok(mut q) = Qmp::connect(sock, Duration::from_secs(2)) {
                if q.status().map(|s| s == "running").unwrap_or(false) {
                    return t0.elapsed();
                }
            }
            assert!(Instant::now() < end, "QMP never said running");
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    let launch = bin("vmwarden-launch");
    let cleanup = bin("vmwarden-cleanup");
    // A step-profile build prints its marks to stderr: kept, to split each
    // start into the launcher's part (spawn to its execve) and QEMU's.
    let errfile = r.dir.path().join("launch.err");
    let steps: std::cell::RefCell<Vec<(String, f64, f64)>> = Default::default();
    let via_once = |split: &mut Vec<(Duration, Duration)>| {
        let mut c = Command::new(&launch);
        r.args(c.arg("qmpb"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&errfile).unwrap());
        if let Some(cg) = cg {
            cg.enter(&mut c);
        }
        let t0 = Instant::now();
        let m0 = monotonic_ns();
        let mut child = c.spawn().unwrap();
        let d = wait_running(&r.run.join("qmpb/control/qmp.sock"), t0);
        let _ = child.kill();
        let _ = child.wait();
        run(r.args(Command::new(&cleanup).arg("qmpb")));
        if let Some(exec_at) = profile_mark_at(&errfile, "seccomp") {
            let to_exec = Duration::from_nanos(exec_at.saturating_sub(m0));
            split.push((to_exec, d.saturating_sub(to_exec)));
            if let Some(main_at) = profile_mark_at(&errfile, "exec-to-main") {
                steps.borrow_mut().push((
                    "spawn → main()".to_string(),
                    0.0,
                    main_at.saturating_sub(m0) as f64 / 1e3,
                ));
            }
            for l in std::fs::read_to_string(&errfile)
                .unwrap_or_default()
                .lines()
            {
                let w: Vec<&str> = l.split_whitespace().collect();
                if w.len() == 5 && w[0] == "vmwarden-profile" {
                    let (c, wl) = (w[2].parse().unwrap_or(0.0), w[3].parse().unwrap_or(0.0));
                    steps
                        .borrow_mut()
                        .push((w[1].to_string(), c / 1e3, wl / 1e3));
                }
            }
        }
        d
    };
    let (mut bare, mut via) = (Vec::new(), Vec::new());
    let mut split = Vec::new();
    for i in 0..n + 1 {
        // Alternate which of the pair starts first.
        let bare_first = i % 2 == 0;
        let mut d_via = Duration::ZERO;
        if !bare_first {
            d_via = via_once(&mut split);
        }
        let _ = std::fs::remove_file(bare_dir.join("qmp.sock"));
        let qmp = std::os::unix::net::UnixListener::bind(bare_dir.join("qmp.sock")).unwrap();
        let mut c = bare_qemu(&qmp);
        c.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(cg) = cg {
            cg.enter(&mut c);
        }
        let t0 = Instant::now();
        let mut child = c.spawn().unwrap();
        drop(qmp);
        let d_bare = wait_running(&bare_dir.join("qmp.sock"), t0);
        let _ = child.kill();
        let _ = child.wait();

        if bare_first {
            d_via = via_once(&mut split);
        }
        if i > 0 {
            // The first pair warms the caches.
            bare.push(d_bare);
            via.push(d_via);
        }
    }
    let steps = steps.into_inner();
    if !steps.is_empty() {
        let mut order: Vec<&str> = Vec::new();
        for (n, _, _) in &steps {
            if !order.contains(&n.as_str()) {
                order.push(n);
            }
        }
        println!("  per step through the launcher (median µs, CPU / wall):");
        for n in order {
            let mut c: Vec<f64> = steps.iter().filter(|x| x.0 == n).map(|x| x.1).collect();
            let mut w: Vec<f64> = steps.iter().filter(|x| x.0 == n).map(|x| x.2).collect();
            c.sort_by(|a, b| a.partial_cmp(b).unwrap());
            w.sort_by(|a, b| a.partial_cmp(b).unwrap());
            println!(
                "    {n:<24} {:>8.0} {:>8.0}",
                c[c.len() / 2],
                w[w.len() / 2]
            );
        }
    }
    if split.len() > 1 {
        split.remove(0);
        let (a, b): (Vec<_>, Vec<_>) = split.into_iter().unzip();
        println!(
            "  through the launcher, p50: spawn → the launcher's execve {:.2} ms, its execve → QMP running {:.2} ms (step-profile marks)",
            ms(pct(&a, 0.5)),
            ms(pct(&b, 0.5))
        );
    }
    Some((bare, via))
}

/// `CLOCK_MONOTONIC` in ns (the clock of the step-profile marks).
fn monotonic_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec for the kernel to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut t) };
    u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(t.tv_nsec).unwrap_or(0)
}

/// The `CLOCK_MONOTONIC` time of step `step` in a step-profile build's
/// stderr (`vmwarden-profile STEP CPU_NS WALL_NS AT_NS`).
fn profile_mark_at(errfile: &Path, step: &str) -> Option<u64> {
    std::fs::read_to_string(errfile)
        .ok()?
        .lines()
        .find_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w.len() == 5 && w[0] == "vmwarden-profile" && w[1] == step)
                .then(|| w[4].parse().ok())
                .flatten()
        })
}

/// Syscalls of one launch, from its own `execve` up to the `execve` of the
/// probe command (strace -f), and the commonest ones.
fn count_syscalls(r: &Roots, cg: Option<&UnitCgroup>) -> Option<(usize, String)> {
    let out = r.dir.path().join("strace.out");
    let launch = bin("vmwarden-launch");
    // strace must not share the launch's cgroup: a shell joins it first,
    // then becomes the launcher.
    let script = match cg {
        Some(cg) => format!(
            "echo $$ > {} && exec \"$0\" \"$@\"",
            cg.path.join("cgroup.procs").display()
        ),
        None => "exec \"$0\" \"$@\"".into(),
    };
    let mut c = Command::new("strace");
    c.arg("-f")
        .arg("-o")
        .arg(&out)
        .args(["/bin/sh", "-c", &script])
        .arg(&launch)
        .arg("bench");
    r.args(&mut c).args(["--probe", "--", "/bin/true"]);
    let st = c
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .ok()?;
    if !st.success() {
        return None;
    }
    let text = std::fs::read_to_string(&out).ok()?;
    let lines: Vec<&str> = text.lines().collect();
    // The execve whose program (its first argument) is the launcher; the
    // shell that joins the cgroup first names it only among its arguments.
    let execs = |l: &&str, prog: &str| {
        l.contains("execve(\"") && l.split('"').nth(1).is_some_and(|p| p.ends_with(prog))
    };
    let start = lines.iter().position(|l| execs(l, "/vmwarden-launch"))?;
    let end = lines.iter().position(|l| execs(l, "/bin/true"))?;
    let mut counts: std::collections::BTreeMap<String, usize> = Default::default();
    for l in &lines[start..end] {
        // "PID  name(args) = ret" (strace pads the pid).
        let rest = l.split_once(' ').map_or(*l, |x| x.1).trim_start();
        if let Some(name) = rest.split('(').next() {
            if !name.starts_with('+') && !name.starts_with('<') && !name.contains(' ') {
                *counts.entry(name.to_string()).or_default() += 1;
            }
        }
    }
    let mut top: Vec<(String, usize)> = counts.into_iter().collect();
    top.sort_by_key(|b| std::cmp::Reverse(b.1));
    let top = top
        .iter()
        .take(12)
        .map(|(n, c)| format!("{n} {c}"))
        .collect::<Vec<_>>()
        .join(", ");
    Some((end - start, top))
}

/// Of `pids` (the VM's: the launched pid and whatever its cgroup holds),
/// those running one of vmwarden's binaries, and their resident KiB. Other
/// checkouts' vmwarden processes on the same host are not this VM's.
fn vmwarden_processes(pids: &[u32]) -> (usize, u64) {
    let mut n = 0;
    let mut kib = 0;
    for pid in pids {
        let Ok(exe) = std::fs::read_link(format!("/proc/{pid}/exe")) else {
            continue;
        };
        let f = exe.file_name().map(|f| f.to_string_lossy().into_owned());
        if matches!(
            f.as_deref(),
            Some("vmwarden-launch" | "vmwarden" | "vmwarden-cleanup")
        ) {
            n += 1;
            if let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
                kib += s
                    .lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
    }
    (n, kib)
}

/// `--steps`: the per-step cost of one launch, from a build with the
/// `step-profile` feature (`cargo bench --bench overhead --features
/// step-profile -- --steps`): `n` probe launches from the bench's cgroup,
/// each printing its marks (see `vmwarden::profile`), interleaved with
/// `/bin/true`, the floor program and Firecracker's jailer (with its bare
/// exec file), so that the steps stand beside both yardsticks from the
/// same rounds; the median CPU time of each step.
fn steps_main(n: usize) {
    let r = Roots::new();
    r.spec("bench", 61900);
    let floor = build_floor(r.dir.path());
    let jail = Jailer::find(r.run.join("jail"));
    let (mut fc_bare, mut jailed) = (Samples::default(), Samples::default());
    let floor_dir = r.run.join("floor");
    std::fs::create_dir_all(&floor_dir).unwrap();
    let launch = bin("vmwarden-launch");
    let cleanup = bin("vmwarden-cleanup");
    let mut order: Vec<String> = Vec::new();
    let mut cpu: std::collections::HashMap<String, Vec<f64>> = Default::default();
    let mut wall: std::collections::HashMap<String, Vec<f64>> = Default::default();
    let (mut base, mut fl) = (Samples::default(), Samples::default());
    for i in 0..n + 3 {
        let t = run(&mut Command::new("/bin/true"));
        let f = floor.as_ref().map(|f| {
            run(Command::new(f)
                .arg(&floor_dir)
                .arg("61950")
                .arg("/bin/true"))
        });
        let mut c = Command::new(&launch);
        r.args(c.arg("bench")).args(["--probe", "--", "/bin/true"]);
        let out = c.stdin(Stdio::null()).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        run(r.args(Command::new(&cleanup).arg("bench")));
        let j = jail.as_ref().map(|j| (j.bare(), j.jailed()));
        if i < 3 {
            continue;
        }
        base.push(t);
        if let Some(f) = f {
            fl.push(f);
        }
        if let Some((b, j)) = j {
            fc_bare.push(b);
            jailed.push(j);
        }
        let text = String::from_utf8_lossy(&out.stderr);
        let mut sum = 0.0;
        for l in text.lines() {
            let mut w = l.split_whitespace();
            if w.next() != Some("vmwarden-profile") {
                continue;
            }
            let (Some(step), Some(ns)) = (w.next(), w.next().and_then(|x| x.parse::<f64>().ok()))
            else {
                continue;
            };
            if !cpu.contains_key(step) {
                order.push(step.to_string());
            }
            cpu.entry(step.to_string()).or_default().push(ns / 1e3);
            if let Some(wns) = w.next().and_then(|x| x.parse::<f64>().ok()) {
                wall.entry(step.to_string()).or_default().push(wns / 1e3);
            }
            sum += ns / 1e3;
        }
        assert!(
            sum > 0.0,
            "no vmwarden-profile lines: build with --features step-profile"
        );
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[v.len() / 2]
    };
    println!(
        "== CPU and wall time per launch step ({n} launches from the bench's cgroup, median µs)"
    );
    println!(
        "  {:<24} {:>8} {:>8}",
        "step (ends at)", "CPU µs", "wall µs"
    );
    let (mut sum, mut wsum) = (0.0, 0.0);
    for s in &order {
        let m = med(cpu.get_mut(s).unwrap());
        let w = wall.get_mut(s).map_or(0.0, med);
        sum += m;
        wsum += w;
        println!("  {s:<24} {m:>8.0} {w:>8.0}");
    }
    println!(
        "  {:<24} {sum:>8.0} {wsum:>8.0}  (sums of the medians; then the execve of the probe; the first step's wall time is not known)",
        "total"
    );
    println!(
        "  /bin/true {:.0} µs CPU; the floor program's overhead over it {:.0} µs CPU",
        ms(pct(&base.cpu, 0.5)) * 1e3,
        if fl.is_empty() {
            f64::NAN
        } else {
            median_diff_ms(&fl.cpu, &base.cpu) * 1e3
        }
    );
    if !jailed.is_empty() {
        println!(
            "  firecracker --version {:.0} µs CPU; the jailer's overhead over it {:.0} µs CPU (same rounds)",
            ms(pct(&fc_bare.cpu, 0.5)) * 1e3,
            median_diff_ms(&jailed.cpu, &fc_bare.cpu) * 1e3
        );
    }
}

/// `--compare DIR`: this build's binaries (B) against those in `DIR` (A,
/// e.g. a copy of main's `target/release`), interleaved round by round
/// with `/bin/true` and the floor program, all from the bench's cgroup:
/// each one's CPU and wall overhead over `/bin/true`, its ratio to the
/// floor's, and the median of the pair differences B − A. How a change
/// to the launcher is judged on a busy machine.
fn compare_main(a_dir: &Path, n: usize) {
    let r = Roots::new();
    r.spec("bench", 61900);
    let floor = build_floor(r.dir.path());
    let floor_dir = r.run.join("floor");
    std::fs::create_dir_all(&floor_dir).unwrap();
    let b_dir = bin("vmwarden-launch").parent().unwrap().to_path_buf();
    // Both builds run from copies made here, side by side: a binary the
    // linker has just written (B in target/release) starts ~0.1 ms of CPU
    // slower than a byte-identical copy of it (`--list-steps`, 400
    // interleaved runs on the test machine), which counted against
    // whichever build was the one just built.
    let copy = |from: &Path, name: &str| {
        let to = r.dir.path().join(name);
        std::fs::create_dir_all(&to).unwrap();
        for b in [
            "vmwarden-launch",
            "vmwarden-cleanup",
            "vmwarden",
            "vmwarden-machined",
        ] {
            if from.join(b).is_file() {
                std::fs::copy(from.join(b), to.join(b)).unwrap();
            }
        }
        to
    };
    let builds = [copy(a_dir, "build-a"), copy(&b_dir, "build-b")];
    // Launch, cleanup, verify-clean: each build's three in a row, as a
    // VM's life goes.
    let three = |d: &Path| {
        let mut c = Command::new(d.join("vmwarden-launch"));
        r.args(c.arg("bench")).args(["--probe", "--", "/bin/true"]);
        let l = run(&mut c);
        let c = run(r.args(Command::new(d.join("vmwarden-cleanup")).arg("bench")));
        let v = run(r
            .args(&mut Command::new(d.join("vmwarden")))
            .args(["verify-clean", "bench"]));
        [l, c, v]
    };
    let (mut base, mut fl) = (Samples::default(), Samples::default());
    let mut launch: [Samples; 2] = Default::default();
    let mut clean: [Samples; 2] = Default::default();
    let mut ver: [Samples; 2] = Default::default();
    for i in 0..n + 3 {
        // Alternate which build goes first, so neither always follows
        // the other.
        let order = if i % 2 == 0 { [0, 1] } else { [1, 0] };
        let t = run(&mut Command::new("/bin/true"));
        let f = floor.as_ref().map(|f| {
            run(Command::new(f)
                .arg(&floor_dir)
                .arg("61950")
                .arg("/bin/true"))
        });
        let mut got = [None; 2];
        for k in order {
            got[k] = Some(three(&builds[k]));
        }
        if i < 3 {
            continue;
        }
        base.push(t);
        if let Some(f) = f {
            fl.push(f);
        }
        for (k, g) in got.into_iter().enumerate() {
            let [l, c, v] = g.unwrap();
            launch[k].push(l);
            clean[k].push(c);
            ver[k].push(v);
        }
    }
    println!(
        "== A = {}, B = {} (copies of each side by side; {n} rounds, interleaved, bench's cgroup)",
        a_dir.display(),
        b_dir.display()
    );
    println!(
        "  /bin/true {:.2} ms wall, {:.2} ms CPU (p50)",
        ms(pct(&base.wall, 0.5)),
        ms(pct(&base.cpu, 0.5))
    );
    let fo = (!fl.is_empty()).then(|| overhead(&fl, &base));
    if let Some(f) = fo {
        println!("  floor overhead                 {}", f.show());
    }
    for (what, s) in [
        ("launch", &launch),
        ("cleanup", &clean),
        ("verify-clean", &ver),
    ] {
        for (k, name) in ["A", "B"].iter().enumerate() {
            let o = overhead(&s[k], &base);
            let ratio = fo.map(|f| o.ratio(f)).unwrap_or_default();
            println!(
                "  {what:<12} {name} overhead {}   ÷ floor {ratio}",
                o.show()
            );
        }
        println!(
            "  {what:<12} median(B − A) {:+.3} ms wall, {:+.3} ms CPU",
            median_diff_ms(&s[1].wall, &s[0].wall),
            median_diff_ms(&s[1].cpu, &s[0].cpu)
        );
    }
}

/// Start → QMP running, `n` pairs, printed; the median of pair ratios.
fn print_qmp(n: usize, cg: Option<&UnitCgroup>) -> Option<f64> {
    let (bare, via) = qmp_running(n, cg)?;
    println!(
        "\n== start → QMP `running` ({} pairs; QEMU TCG, spawned into the unit-like cgroup)",
        bare.len()
    );
    row("bare QEMU, same argv, as root", &bare, None);
    row("through vmwarden-launch", &via, Some(&bare));
    let mut ratios: Vec<f64> = bare
        .iter()
        .zip(&via)
        .map(|(b, v)| ms(*v) / ms(*b))
        .collect();
    ratios.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let med = ratios[ratios.len() / 2];
    println!(
        "  median of pair ratios {med:.3}; median of pair differences {:+.2} ms",
        median_diff_ms(&via, &bare)
    );
    Some(med)
}

/// `--launch RUNS ROUNDS`: the launch rounds (launch, cleanup, verify-clean,
/// the floor program and the jailer, interleaved) RUNS times, each run's
/// launch ÷ jailer and ÷ floor ratios, and their medians over the runs (the
/// jailer's own overhead moves by several ms from one run to the next).
fn launch_main(runs: usize, rounds: usize) {
    let cg = UnitCgroup::new();
    let r = Roots::new();
    r.spec("bench", 61900);
    let floor = build_floor(r.dir.path());
    let jail = Jailer::find(r.run.join("jail"));
    let mut got: Vec<Ratios> = Vec::new();
    for k in 0..runs {
        let lr = launch_rounds(&r, cg.as_ref(), floor.as_deref(), jail.as_ref(), rounds);
        let x = print_launch(
            &lr,
            &format!("run {} of {runs}: {rounds} rounds, interleaved", k + 1),
        );
        got.push(x);
    }
    let med = |f: &dyn Fn(&Ratios) -> Option<f64>| {
        let mut v: Vec<f64> = got.iter().filter_map(f).collect();
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let list = |f: &dyn Fn(&Ratios) -> Option<f64>| {
        got.iter()
            .filter_map(f)
            .map(|x| format!("{x:.2}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!("\n== {runs} runs of {rounds} rounds: ratios per run, then their median");
    type Pick = Box<dyn Fn(&Ratios) -> Option<f64>>;
    let rows: Vec<(&str, Pick)> = vec![
        (
            "launch ÷ jailer (/proc), wall",
            Box::new(|x: &Ratios| x.jailer.map(|j| x.launch.wall / j.wall)),
        ),
        (
            "launch ÷ jailer (/proc), CPU",
            Box::new(|x: &Ratios| x.jailer.map(|j| x.launch.cpu / j.cpu)),
        ),
        (
            "launch ÷ jailer (own cgroup), wall",
            Box::new(|x: &Ratios| Some(x.launch_unit?.wall / x.jailer?.wall)),
        ),
        (
            "launch ÷ jailer (own cgroup), CPU",
            Box::new(|x: &Ratios| Some(x.launch_unit?.cpu / x.jailer?.cpu)),
        ),
        (
            "launch ÷ floor (/proc), CPU",
            Box::new(|x: &Ratios| x.floor.map(|f| x.launch.cpu / f.cpu)),
        ),
        (
            "jailer overhead, wall ms",
            Box::new(|x: &Ratios| x.jailer.map(|j| j.wall)),
        ),
        (
            "launch overhead (/proc), wall ms",
            Box::new(|x: &Ratios| Some(x.launch.wall)),
        ),
    ];
    for (what, f) in &rows {
        println!(
            "  {what:<40} {:<36} median {:.2}",
            list(f.as_ref()),
            med(f.as_ref())
        );
    }
}

/// `--qmp N`: only start → QMP running, N pairs.
fn qmp_main(n: usize) {
    let cg = UnitCgroup::new();
    print_qmp(n, cg.as_ref());
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--sleeper") {
        sleeper_main(args[i + 1].parse().unwrap());
    }
    if !nix::unistd::geteuid().is_root() {
        eprintln!("bench: needs root (the launcher builds real namespaces and mounts)");
        std::process::exit(1);
    }
    // `cargo bench` passes --bench; `--quick` runs fewer iterations.
    let quick = args.iter().any(|a| a == "--quick");
    let n = if quick { 20 } else { 150 };
    if let Some(i) = args.iter().position(|a| a == "--compare") {
        let dir = args.get(i + 1).expect("--compare DIR");
        compare_main(Path::new(dir), if quick { 40 } else { 200 });
        return;
    }
    if args.iter().any(|a| a == "--steps") {
        steps_main(if quick { 50 } else { 300 });
        return;
    }
    if let Some(i) = args.iter().position(|a| a == "--launch") {
        // Only the launch rounds with their yardsticks, RUNS times.
        let runs = args.get(i + 1).and_then(|x| x.parse().ok()).unwrap_or(5);
        let rounds = args.get(i + 2).and_then(|x| x.parse().ok()).unwrap_or(60);
        launch_main(runs, rounds);
        return;
    }
    if let Some(i) = args.iter().position(|a| a == "--qmp") {
        // Only start → QMP running, with N pairs (default 60).
        let n = args.get(i + 1).and_then(|x| x.parse().ok()).unwrap_or(60);
        qmp_main(n);
        return;
    }
    let mut sum = Summary::default();
    let cg = UnitCgroup::new();
    if cg.is_none() {
        println!("(no cgroup v2 hierarchy to make a unit-like cgroup in: own-cgroup rows skipped)");
    }
    println!(
        "host: {} threads in {} processes; runtime root on tmpfs",
        host_threads(),
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
            .count()
    );

    // 1–2. Launch, cleanup, verify-clean, the floor and the jailer,
    // interleaved; then again with 2,000 sleeping threads.
    let r = Roots::new();
    r.spec("bench", 61900);
    let floor = build_floor(r.dir.path());
    let jail = Jailer::find(r.run.join("jail"));
    let quiet = launch_rounds(&r, cg.as_ref(), floor.as_deref(), jail.as_ref(), n);
    let q = print_launch(
        &quiet,
        &format!("launch overhead and teardown per VM ({n} rounds, interleaved)"),
    );
    let loaded = {
        let _s = Sleepers::start(10, 200);
        println!(
            "\n(2,000 sleeping threads started in 10 processes: host now {} threads)",
            host_threads()
        );
        launch_rounds(&r, cg.as_ref(), floor.as_deref(), jail.as_ref(), n)
    };
    let l = print_launch(&loaded, "the same with 2,000 extra sleeping threads");
    sum.add(
        "/bin/true baseline (same run), wall / CPU",
        format!(
            "{:.2} ms / {:.2} ms",
            ms(pct(&quiet.base.wall, 0.5)),
            ms(pct(&quiet.base.cpu, 0.5))
        ),
        "",
    );
    if let Some(f) = q.floor {
        sum.add("floor program overhead", f.show(), "");
    }
    if let Some(j) = q.jailer {
        sum.add("jailer overhead over firecracker", j.show(), "");
    }
    sum.add("launch overhead (/proc)", q.launch.show(), "");
    if let Some(u) = q.launch_unit {
        sum.add("launch overhead (own cgroup)", u.show(), "");
    }
    if let Some(f) = q.floor {
        sum.add("launch ÷ floor (/proc)", q.launch.ratio(f), "≤ 2.0 (1.5)");
        if let Some(u) = q.launch_unit {
            sum.add("launch ÷ floor (own cgroup)", u.ratio(f), "≤ 2.0 (1.5)");
        }
    }
    if let Some(j) = q.jailer {
        sum.add("launch ÷ jailer (/proc)", q.launch.ratio(j), "< 1");
        if let Some(u) = q.launch_unit {
            sum.add("launch ÷ jailer (own cgroup)", u.ratio(j), "< 1");
        }
    }
    if let Some(f) = q.floor {
        if let Some(c) = q.cleanup_unit {
            sum.add("cleanup (cgroup) ÷ floor", c.ratio(f), "");
        }
        sum.add("cleanup (/proc) ÷ floor", q.cleanup.ratio(f), "");
        sum.add("verify-clean ÷ floor", q.verify.ratio(f), "");
    }
    let loaded_ratio = |what: &str, a: Overhead, b: Overhead| {
        (
            format!("  {what}, 2,000 threads ÷ without"),
            format!("{:.2} wall, {:.2} CPU", a.wall / b.wall, a.cpu / b.cpu),
        )
    };
    let mut threads = vec![
        loaded_ratio("launch (/proc)", l.launch, q.launch),
        loaded_ratio("cleanup (/proc)", l.cleanup, q.cleanup),
        loaded_ratio("verify-clean", l.verify, q.verify),
    ];
    if let (Some(a), Some(b)) = (l.launch_unit, q.launch_unit) {
        threads.insert(0, loaded_ratio("launch (own cgroup)", a, b));
    }
    for (what, m) in threads {
        sum.add(&what, m, "≤ 1.1");
    }

    // 2b. Shares: the same launch with two virtiofs shares (one virtiofsd
    // each, forked as the principal before the exec).
    if let Some((plain, shared)) = shares_rounds(&r, n) {
        println!("\n== launch with two virtiofs shares ({n} rounds, interleaved, bench's cgroup)");
        row("launch --probe, no shares", &plain, Some(&quiet.base.wall));
        row("launch --probe, two virtiofs shares", &shared, Some(&plain));
        let d = median_diff_ms(&shared, &plain);
        println!(
            "  {:<52} median of pair differences {d:.2} ms ({:.2} ms per share)",
            "  two shares over none",
            d / 2.0
        );
        sum.add(
            "launch with two virtiofs shares, over none",
            format!("{d:.2} ms ({:.2} ms per virtiofsd)", d / 2.0),
            "",
        );
    }

    // 3. reap dry run.
    let vmw = bin("vmwarden");
    let runs = if quick { 3 } else { 5 };
    for (shape, with_cg) in [
        ("records naming their unit's cgroup", true),
        ("records without a cgroup (/proc)", false),
    ] {
        println!("\n== reap dry run over orphaned runtime dirs, {shape} (median of {runs})");
        let mut medians = Vec::new();
        for k in [10usize, 100, 1000] {
            let rr = Roots::new();
            synthetic(&rr, k, with_cg);
            let m = reap_median(&vmw, &rr, runs);
            println!(
                "  {k:>5} runtime dirs  median {:>9.1} ms  ({:.3} ms per dir)",
                ms(m),
                ms(m) / k as f64
            );
            medians.push(m);
        }
        let loaded_reap = {
            let rr = Roots::new();
            synthetic(&rr, 1000, with_cg);
            let _s = Sleepers::start(10, 200);
            reap_median(&vmw, &rr, runs)
        };
        println!(
            "  {:>5} runtime dirs  median {:>9.1} ms  with 2,000 sleeping threads",
            1000,
            ms(loaded_reap)
        );
        println!(
            "  ratio 100/10 = {:.1}x, 1000/100 = {:.1}x (linear ⇒ about 10x); 2,000 threads: {:.2}x",
            ms(medians[1]) / ms(medians[0]),
            ms(medians[2]) / ms(medians[1]),
            ms(loaded_reap) / ms(medians[2])
        );
        sum.add(
            &format!("reap dry run, 1,000 dirs, {shape}"),
            format!(
                "{:.0} ms; 1000/100 = {:.1}; 2,000 threads {:.0} ms",
                ms(medians[2]),
                ms(medians[2]) / ms(medians[1]),
                ms(loaded_reap)
            ),
            "1000/100 ≤ 11",
        );
    }

    // 4. status of 100 configured VMs.
    {
        let rr = Roots::new();
        synthetic(&rr, 100, true);
        let v: Vec<Duration> = (0..if quick { 5 } else { 10 })
            .map(|_| run(rr.args(&mut Command::new(&vmw)).arg("status")).wall)
            .collect();
        println!("\n== vmwarden status, 100 configured VMs (orphaned runtime dirs)");
        row("vmwarden status", &v, Some(&quiet.base.wall));
        sum.add(
            "vmwarden status, 100 configured VMs",
            format!("{:.1} ms", ms(pct(&v, 0.5))),
            "",
        );
    }

    // 5. start → QMP running.
    if let Some(med) = print_qmp(if quick { 8 } else { 30 }, cg.as_ref()) {
        sum.add(
            "start → QMP running, launcher / bare",
            format!("{med:.3}"),
            "≤ 1.04",
        );
    }

    // 6. Memory.
    {
        let launch = bin("vmwarden-launch");
        let mut c = Command::new(&launch);
        r.args(c.arg("bench"))
            .args(["--probe", "--", "/bin/sleep", "30"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(cg) = &cg {
            cg.enter(&mut c);
        }
        let mut child = c.spawn().unwrap();
        let pid = child.id();
        let end = Instant::now() + Duration::from_secs(10);
        while std::fs::read_link(format!("/proc/{pid}/exe"))
            .map(|e| !e.ends_with("sleep"))
            .unwrap_or(true)
        {
            assert!(Instant::now() < end, "the probe never exec'd sleep");
            std::thread::sleep(Duration::from_millis(2));
        }
        let mut pids = vec![pid];
        if let Some(cg) = &cg {
            pids.extend(
                std::fs::read_to_string(cg.path.join("cgroup.procs"))
                    .unwrap_or_default()
                    .lines()
                    .filter_map(|l| l.trim().parse::<u32>().ok()),
            );
        }
        pids.sort_unstable();
        pids.dedup();
        let (procs, kib) = vmwarden_processes(&pids);
        let _ = child.kill();
        let _ = child.wait();
        run(r.args(Command::new(bin("vmwarden-cleanup")).arg("bench")));
        println!("\n== memory");
        println!(
            "  peak RSS of the launcher (wait4 ru_maxrss, which keeps the pre-execve peak; /bin/true's own is smaller): {} KiB",
            quiet.launch.max_rss_kib
        );
        println!(
            "  while the VM runs: {procs} vmwarden processes among its {} ({kib} KiB resident; pid {pid} is /bin/sleep: the launcher exec'd away)",
            pids.len()
        );
        sum.add(
            "peak RSS of the launcher before execve",
            format!("{:.1} MiB", quiet.launch.max_rss_kib as f64 / 1024.0),
            "≤ 4 MiB",
        );
        sum.add(
            "vmwarden resident while the VM runs",
            format!("{kib} KiB in {procs} processes"),
            "0",
        );
    }

    // 7. Syscalls.
    println!("\n== syscalls of one launch (strace -f, launcher execve → probe execve)");
    for (label, c) in [("own cgroup", cg.as_ref()), ("no own cgroup", None)] {
        if label == "own cgroup" && c.is_none() {
            continue;
        }
        match count_syscalls(&r, c) {
            Some((count, top)) => {
                println!("  {label}: {count} syscalls ({top})");
                sum.add(
                    &format!("syscalls per launch, {label}"),
                    count.to_string(),
                    "",
                );
            }
            None => println!("  {label}: strace not available (apt-get install strace)"),
        }
        run(r.args(Command::new(bin("vmwarden-cleanup")).arg("bench")));
    }

    println!("\n== summary (this run)");
    for (what, m, goal) in &sum.lines {
        println!("  {what:<50} {m:<44} {goal}");
    }
}
