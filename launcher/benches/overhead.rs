//! `cargo bench` (as root): what vmwarden costs, measured against a baseline
//! taken in the same run. Prints tables and ratios; asserts nothing (these
//! machines are noisy — compare ratios, not seconds).
//!
//! 1. Launcher setup overhead: `vmwarden-launch --probe -- /bin/true`
//!    against `/bin/true` started directly.
//! 2. Teardown: `vmwarden-cleanup` and `vmwarden verify-clean` per VM,
//!    against `/bin/true`.
//! 3. `vmwarden reap` (dry run) over 10, 100 and 1000 synthetic runtime dirs,
//!    with the 1000/100 ratio (linear growth ⇒ about 10).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn bin(name: &str) -> PathBuf {
    // cargo bench builds the binaries into the same target dir.
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let p = dir.join(name);
    assert!(
        p.exists(),
        "{} not built: run `cargo build --release` first (cargo bench does)",
        p.display()
    );
    p
}

fn time(mut f: impl FnMut()) -> Duration {
    let t = Instant::now();
    f();
    t.elapsed()
}

// `p` is in 0..=1, so the rounded index is in 0..len.
#[allow(clippy::cast_sign_loss)]
fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn run_ok(c: &mut Command) {
    let o = c
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{:?} failed: {}",
        c,
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Root-owned 0755 (not the world-writable /tmp): the launcher refuses
/// credential files in a directory anyone but root can write.
fn bench_base() -> &'static std::path::Path {
    let base = std::path::Path::new("/var/lib/vmwarden-test");
    if let Err(e) = std::fs::create_dir(base) {
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists, "{e}");
    }
    std::fs::set_permissions(base, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    base
}

struct Roots {
    _dir: tempfile::TempDir,
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
        std::fs::create_dir(&config).unwrap();
        Roots {
            config,
            run: dir.path().join("run"),
            state: dir.path().join("state"),
            _dir: dir,
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
    fn spec(&self, name: &str, uid: u32) {
        let s = serde_json::json!({
            "version": 1, "name": name,
            "principal": { "uid": uid, "gid": uid },
            "hypervisor": { "kind": "qemu", "binary": "/usr/bin/qemu-system-x86_64", "accel": "tcg", "machine": "microvm" },
            "vcpus": 1, "memory_mib": 128,
            "kernel": "/bin/true",
            "credentials": [ { "name": "key", "source": { "path": self.config.join("key") } } ]
        });
        std::fs::write(self.config.join("key"), b"bench-secret").unwrap();
        std::fs::write(
            self.config.join(format!("{name}.json")),
            serde_json::to_vec(&s).unwrap(),
        )
        .unwrap();
    }
}

fn row(label: &str, v: &mut [Duration], base_p50: Option<Duration>) {
    let (p50, p95) = (pct(v, 0.5), pct(v, 0.95));
    match base_p50 {
        Some(b) => println!(
            "{label:<44} p50 {:>8.2} ms  p95 {:>8.2} ms  ratio(p50) {:>6.1}x",
            ms(p50),
            ms(p95),
            ms(p50) / ms(b)
        ),
        None => println!(
            "{label:<44} p50 {:>8.2} ms  p95 {:>8.2} ms  (baseline)",
            ms(p50),
            ms(p95)
        ),
    }
}

fn launch_overhead(n: usize) {
    let r = Roots::new();
    r.spec("bench", 61900);
    let launch = bin("vmwarden-launch");
    let cleanup = bin("vmwarden-cleanup");
    let vmw = bin("vmwarden");
    // Warm up caches.
    for _ in 0..3 {
        run_ok(
            r.args(Command::new(&launch).arg("bench"))
                .args(["--probe", "--", "/bin/true"]),
        );
    }
    let mut base = Vec::new();
    let mut probe = Vec::new();
    let mut clean = Vec::new();
    let mut verify = Vec::new();
    for _ in 0..n {
        base.push(time(|| run_ok(&mut Command::new("/bin/true"))));
        probe.push(time(|| {
            run_ok(
                r.args(Command::new(&launch).arg("bench"))
                    .args(["--probe", "--", "/bin/true"]),
            )
        }));
        clean.push(time(|| run_ok(r.args(Command::new(&cleanup).arg("bench")))));
        verify.push(time(|| {
            run_ok(
                r.args(&mut Command::new(&vmw))
                    .args(["verify-clean", "bench"]),
            )
        }));
    }
    let b = pct(&mut base, 0.5);
    println!("\n== launcher setup overhead ({n} runs each, interleaved)");
    row("/bin/true (direct)", &mut base, None);
    row("vmwarden-launch --probe -- /bin/true", &mut probe, Some(b));
    println!("\n== teardown per VM ({n} runs each)");
    row(
        "vmwarden-cleanup (after one probe launch)",
        &mut clean,
        Some(b),
    );
    row("vmwarden verify-clean NAME", &mut verify, Some(b));
}

/// N dead VMs: a runtime dir each with a lease file, an intent record and a
/// leftover control dir; every VM configured.
fn synthetic(r: &Roots, n: usize) {
    std::fs::create_dir_all(&r.run).unwrap();
    for i in 0..n {
        let name = format!("vm{i}");
        let d = r.run.join(&name);
        std::fs::create_dir_all(d.join("control")).unwrap();
        std::fs::write(d.join("instance.lock"), b"").unwrap();
        let intent = serde_json::json!({
            "version": 1, "name": name, "instance_id": format!("{i:032x}"), "pid": 1, "boot_id": "",
            "created_unix": 0, "principal": { "uid": 62000 + i, "gid": 62000 + i }, "resources": []
        });
        std::fs::write(
            d.join("instance.json"),
            serde_json::to_vec(&intent).unwrap(),
        )
        .unwrap();
        r.spec(&name, 62000 + i as u32);
    }
}

fn reap_scaling() {
    let vmw = bin("vmwarden");
    println!("\n== reap dry run over synthetic runtime dirs (3 runs each, median)");
    let mut medians = Vec::new();
    for n in [10usize, 100, 1000] {
        let r = Roots::new();
        synthetic(&r, n);
        let mut v: Vec<Duration> = (0..3)
            .map(|_| time(|| run_ok(r.args(&mut Command::new(&vmw)).args(["reap", "--json"]))))
            .collect();
        let m = pct(&mut v, 0.5);
        println!(
            "{:>5} runtime dirs  median {:>9.1} ms  ({:.3} ms per dir)",
            n,
            ms(m),
            ms(m) / n as f64
        );
        medians.push(m);
    }
    println!(
        "ratio 100/10 = {:.1}x, 1000/100 = {:.1}x (linear growth ⇒ about 10x)",
        ms(medians[1]) / ms(medians[0]),
        ms(medians[2]) / ms(medians[1])
    );
}

fn main() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("bench: needs root (the launcher builds real namespaces and mounts)");
        std::process::exit(1);
    }
    // `cargo bench` passes --bench; `--quick` runs fewer iterations.
    let quick = std::env::args().any(|a| a == "--quick");
    launch_overhead(if quick { 10 } else { 50 });
    reap_scaling();
}
