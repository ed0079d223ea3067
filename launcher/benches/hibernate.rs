//! `sudo cargo bench --bench hibernate`: QEMU's restore from a hibernation
//! snapshot against a cold boot of the same guest in the same run, each
//! from the launch to the guest's ready marker (a cold boot's
//! `VMWARDEN-GUEST-READY`; a restored guest's first tick after the start,
//! the restored guest being the very one that printed READY before),
//! including `wait-ready`, which the unit runs and which runs a loaded
//! guest. Prints
//! `restore: start → guest ready R ms vs cold boot R ms (ratio R)` with the
//! medians of `VMWARDEN_BENCH_ROUNDS` rounds (default 3). Asserts nothing.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::json;

const TICKER: &str = "cat /proc/sys/kernel/random/uuid >/marker\n\
(while :; do read -r up _ </proc/uptime; echo \"VMWARDEN-TICK up=$up\"; sleep 0.05; done) </dev/null &\n";

fn until(g: &mut Guest, marker: &str, start: Instant) -> Duration {
    g.wait_for(marker, Duration::from_secs(180));
    start.elapsed()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    require_root();
    let rounds: usize = std::env::var("VMWARDEN_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(3);
    let env = Env::new();
    let mut spec = env.shares_spec("bench", uid(90), "hold", TICKER);
    spec["hibernate"] = json!({ "allowed": true });
    env.write_spec("bench", &spec);
    let (mut cold, mut restore) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let t = Instant::now();
        let mut g = spawn_logged(
            env.launch_cmd("bench"),
            env.path(&format!("cold.{round}.log")),
        );
        cold.push(until(&mut g, "VMWARDEN-GUEST-READY", t));
        let r = env.vmwarden(&["wait-ready", "bench", "--timeout", "60"]);
        assert!(r.status.success(), "{}", text(&r));
        g.wait_for("VMWARDEN-TICK", Duration::from_secs(30));
        let h = env.vmwarden(&["hibernate", "bench", "--timeout", "120"]);
        assert!(h.status.success(), "{}", text(&h));
        g.wait_exit(Duration::from_secs(15));
        env.cleanup("bench");
        let t = Instant::now();
        let mut g = spawn_logged(
            env.launch_cmd("bench"),
            env.path(&format!("restore.{round}.log")),
        );
        let r = env.vmwarden(&["wait-ready", "bench", "--timeout", "120"]);
        assert!(r.status.success(), "{}", text(&r));
        restore.push(until(&mut g, "VMWARDEN-TICK", t));
        assert!(
            !g.log_text().contains("VMWARDEN-GUEST-READY"),
            "booted, not restored"
        );
        g.kill();
        env.cleanup("bench");
        eprintln!(
            "round {round}: cold {} ms, restore {} ms",
            cold[round].as_millis(),
            restore[round].as_millis()
        );
    }
    let (c, r) = (median(cold), median(restore));
    println!(
        "restore: start → guest ready {} ms vs cold boot {} ms (ratio {:.2}) [qemu, TCG, 256 MiB, median of {rounds}]",
        r.as_millis(),
        c.as_millis(),
        r.as_secs_f64() / c.as_secs_f64()
    );
}
