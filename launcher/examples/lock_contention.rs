//! How long launches queue on one host lock: `THREADS` contenders (each
//! its own open file description, as separate launches have) released at
//! once, each holding the lock `HOLD_MS` then letting go, through
//! `host::locks::lock_dir` (mode `lib`) or a blocking `flock` (mode
//! `block`, the old way). Prints, per round, the time until the last one
//! got it and the median / 90th percentile / max of each one's wait.
//!
//!   lock_contention MODE [THREADS] [HOLD_MS] [ROUNDS]   (as root)
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};
use vmwarden::host::{dirs, locks};

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let mode = a.get(1).cloned().unwrap_or_else(|| "lib".into());
    let n: usize = a.get(2).and_then(|s| s.parse().ok()).unwrap_or(50);
    let hold =
        Duration::from_secs_f64(a.get(3).and_then(|s| s.parse::<f64>().ok()).unwrap_or(2.0) / 1e3);
    let rounds: usize = a.get(4).and_then(|s| s.parse().ok()).unwrap_or(5);
    let t = tempfile::Builder::new()
        .prefix("vmwarden-lock-contention")
        .tempdir_in("/var/tmp")
        .unwrap();
    let dir = t.path().to_path_buf();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    for _ in 0..rounds {
        let bar = Arc::new(Barrier::new(n));
        let hs: Vec<_> = (0..n)
            .map(|_| {
                let (bar, dir, mode) = (bar.clone(), dir.clone(), mode.clone());
                std::thread::spawn(move || {
                    let d = dirs::open_dir(&dir).unwrap();
                    bar.wait();
                    let t0 = Instant::now();
                    let l = if mode == "block" {
                        Flock::lock(d.fd.try_clone().unwrap(), FlockArg::LockExclusive).unwrap()
                    } else {
                        locks::lock_dir(&d, Duration::from_secs(30)).unwrap()
                    };
                    let got = t0.elapsed();
                    std::thread::sleep(hold);
                    drop(l);
                    got
                })
            })
            .collect();
        let mut w: Vec<f64> = hs
            .into_iter()
            .map(|h| h.join().unwrap().as_secs_f64() * 1e3)
            .collect();
        w.sort_by(|x, y| x.partial_cmp(y).unwrap());
        println!(
            "{mode} n={n} hold={:.1}ms: last got it {:.1} ms (ideal {:.1}); wait median {:.1} p90 {:.1} max {:.1} ms",
            hold.as_secs_f64() * 1e3,
            w[n - 1],
            (n - 1) as f64 * hold.as_secs_f64() * 1e3,
            w[n / 2],
            w[n * 9 / 10],
            w[n - 1]
        );
    }
}
