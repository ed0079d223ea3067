//! Helpers of the hibernation tests (hibernate.rs, hibernate_attacks.rs,
//! hibernate_other.rs): a QEMU guest that ticks with an in-memory marker,
//! the snapshot's paths, a capture made to fail.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{spawn_logged, text, uid, Env, Guest};

/// How long a boot to READY may take.
pub const BOOT: Duration = Duration::from_secs(120);

/// A guest that, before READY, keeps a random marker in its memory (the
/// initramfs is RAM) and prints it with its uptime every half second.
pub const TICKER: &str = "cat /proc/sys/kernel/random/uuid >/marker\n\
(while :; do read -r up _ </proc/uptime; echo \"VMWARDEN-TICK up=$up marker=$(cat /marker)\"; sleep 0.5; done) </dev/null &\n";

pub fn spec(env: &Env, name: &str, n: u32) -> Value {
    let mut s = env.shares_spec(name, uid(n), "hold", TICKER);
    s["hibernate"] = json!({ "allowed": true });
    env.write_spec(name, &s);
    s
}

/// The last tick in `log` after byte `from`: (uptime, marker). Only
/// whole lines count: the guest may be halfway through writing the last
/// one (a marker cut short there failed a comparison once).
pub fn last_tick(log: &str, from: usize) -> Option<(f64, String)> {
    whole_lines(log.get(from..)?).lines().rev().find_map(|l| {
        let l = l.strip_prefix("VMWARDEN-TICK up=")?;
        let (up, marker) = l.split_once(" marker=")?;
        Some((up.parse().ok()?, marker.trim().to_string()))
    })
}

/// `text` up to its last newline: the lines a writer has finished.
pub fn whole_lines(text: &str) -> &str {
    &text[..text.rfind('\n').map_or(0, |i| i + 1)]
}

/// Wait for a tick past byte `from` of the guest's log.
pub fn tick_after(g: &mut Guest, from: usize, limit: Duration) -> (f64, String) {
    let end = Instant::now() + limit;
    loop {
        if let Some(t) = last_tick(&g.log_text(), from) {
            return t;
        }
        assert!(Instant::now() < end, "no tick; log:\n{}", g.log_text());
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub fn snap(env: &Env, name: &str) -> PathBuf {
    env.state.join(name).join(".vmwarden-hibernate")
}

pub fn partial(env: &Env, name: &str) -> PathBuf {
    env.state.join(name).join(".vmwarden-hibernate.new")
}

pub fn record(env: &Env, name: &str) -> PathBuf {
    env.state.join(format!(".hibernated-{name}.json"))
}

/// Boot `name`, wait for READY, wait-ready and a first tick.
pub fn boot(env: &Env, name: &str, log: &str) -> (Guest, (f64, String)) {
    let mut g = spawn_logged(env.launch_cmd(name), env.path(log));
    g.wait_for("VMWARDEN-GUEST-READY", BOOT);
    let r = env.vmwarden(&["wait-ready", name, "--timeout", "30"]);
    assert!(r.status.success(), "{}", text(&r));
    let t = tick_after(&mut g, 0, Duration::from_secs(30));
    (g, t)
}

/// `vmwarden hibernate NAME --timeout TIMEOUT` under the fault
/// `hibernate:FAULT` (a fault-injection build), which must fail in the
/// capture (its error names `cause`) with the VM resumed and the partial
/// snapshot deleted. Returns what it said (printed too).
pub fn failed_capture(env: &Env, name: &str, timeout: &str, fault: &str, cause: &str) -> String {
    let h = env
        .vmwarden_cmd()
        .args(["hibernate", name, "--timeout", timeout])
        .env("VMWARDEN_FAULT_AFTER", format!("hibernate:{fault}"))
        .output()
        .unwrap();
    let said = text(&h);
    assert!(!h.status.success(), "{said}");
    assert!(
        said.contains(cause) && said.contains("the VM was resumed and the partial snapshot"),
        "not the capture's own failure ({cause}), resumed: {said}"
    );
    println!("{said}");
    said
}
