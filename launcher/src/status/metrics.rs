//! `vmwarden metrics`: every VM `status` shows, as Prometheus' text
//! exposition format (version 0.0.4), for node-exporter's textfile
//! collector or anything that reads a `.prom` file.
//!
//! The records are `status`'s ([`super::gather`]: the one liveness probe,
//! the control socket asked with `status`'s bounds, never waiting on a
//! VM), and beside them only what the kernel and root wrote: the figures
//! of the cgroup the intent record names (`host::figures`, read only while
//! it is still that cgroup), the byte counters of the interfaces the
//! record names, and the last cleanup's record (`instance::last_cleanup`).
//! Nothing a VM wrote is read. [`render`] is pure.
//!
//! Conventions: base units (seconds, bytes), `_total` on counters, a `vm`
//! label on every sample, HELP and TYPE for every family, label values
//! escaped as the format says.

use std::fmt::Write as _;
use std::path::Path;

use crate::config::names::VmName;
use crate::config::paths::Roots;
use crate::host::dirs;
use crate::host::figures::{self, CgroupFigures, NetFigures};
use crate::instance::intent::{Intent, Resource};
use crate::instance::last_cleanup::LastCleanup;

use super::gather::gather;
use super::{State, VmStatus};

/// One VM's figures: its `status` record and what the kernel and the last
/// cleanup say.
#[derive(Debug, Clone)]
pub struct VmFigures {
    pub status: VmStatus,
    /// Instances started since the runtime root was made (a boot).
    pub starts: u64,
    pub last_cleanup: Option<LastCleanup>,
    /// The running instance's cgroup, while it is the one recorded.
    pub cgroup: Option<CgroupFigures>,
    /// Helpers the running instance's record lists.
    pub helpers_started: Option<u64>,
    /// Its interfaces in the host's network namespace, by name.
    pub interfaces: Vec<(String, NetFigures)>,
}

const SYS_CLASS_NET: &str = "/sys/class/net";

/// The figures of every VM `vmwarden status` shows by default.
pub fn collect(roots: &Roots) -> Vec<VmFigures> {
    gather(roots, &[], false)
        .records
        .into_iter()
        .map(|status| figures_of(roots, status, Path::new(SYS_CLASS_NET)))
        .collect()
}

fn figures_of(roots: &Roots, status: VmStatus, sys_net: &Path) -> VmFigures {
    let name = VmName::parse(&status.name).ok();
    let rundir = name.and_then(|n| dirs::open_dir(&roots.runtime_dir(&n)).ok());
    let last_cleanup = rundir.as_ref().and_then(LastCleanup::read);
    let running = status.state == State::Running;
    // The record of the running instance (the one `status` judged).
    let intent = rundir
        .as_ref()
        .and_then(|d| Intent::read(d).ok().flatten())
        .filter(|i| running && Some(&i.instance_id) == status.instance_id.as_ref());
    let counted = last_cleanup
        .as_ref()
        .and_then(|c| c.counted_instance.as_deref());
    let current = intent
        .as_ref()
        .is_some_and(|i| Some(i.instance_id.as_str()) != counted);
    let starts = last_cleanup.as_ref().map_or(0, |c| c.instances) + u64::from(current);
    let cgroup = intent
        .as_ref()
        .and_then(|i| i.cgroup.as_ref())
        .and_then(|cg| figures::of_cgroup(cg).ok());
    let helpers_started = intent.as_ref().map(|i| {
        i.resources
            .iter()
            .filter(|r| matches!(r, Resource::Helper { .. }))
            .count() as u64
    });
    let interfaces = intent
        .as_ref()
        .map(|i| {
            i.taps()
                .into_iter()
                .filter_map(|t| {
                    let name = t.to_string();
                    figures::of_interface(sys_net, &name).map(|f| (name, f))
                })
                .collect()
        })
        .unwrap_or_default();
    VmFigures {
        status,
        starts,
        last_cleanup,
        cgroup,
        helpers_started,
        interfaces,
    }
}

/// A label value as the text format wants it: `\`, `"` and a line feed
/// escaped.
pub fn escape_label(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Gauge,
    Counter,
}

struct Family {
    name: &'static str,
    help: &'static str,
    kind: Kind,
    samples: Vec<(Vec<(&'static str, String)>, String)>,
}

impl Family {
    fn new(name: &'static str, kind: Kind, help: &'static str) -> Family {
        Family {
            name,
            help,
            kind,
            samples: Vec::new(),
        }
    }

    fn add(&mut self, vm: &str, labels: &[(&'static str, &str)], value: impl ToString) {
        let mut l = vec![("vm", vm.to_string())];
        l.extend(labels.iter().map(|(k, v)| (*k, v.to_string())));
        self.samples.push((l, value.to_string()));
    }

    fn write(&self, out: &mut String) {
        let kind = match self.kind {
            Kind::Gauge => "gauge",
            Kind::Counter => "counter",
        };
        let _ = writeln!(out, "# HELP {} {}", self.name, self.help);
        let _ = writeln!(out, "# TYPE {} {kind}", self.name);
        for (labels, value) in &self.samples {
            let labels: Vec<String> = labels
                .iter()
                .map(|(k, v)| format!("{k}=\"{}\"", escape_label(v)))
                .collect();
            let _ = writeln!(out, "{}{{{}}} {value}", self.name, labels.join(","));
        }
    }
}

/// Microseconds as seconds, exactly (`12.000345`).
fn seconds(usec: u64) -> String {
    format!("{}.{:06}", usec / 1_000_000, usec % 1_000_000)
}

const MIB: u64 = 1024 * 1024;

const STATES: [State; 5] = [
    State::Running,
    State::Stopped,
    State::Ambiguous,
    State::Retired,
    State::Hibernated,
];

/// The exposition text for `vms` (sorted as given: `status`' order).
pub fn render(vms: &[VmFigures]) -> String {
    use Kind::{Counter, Gauge};
    let mut state = Family::new(
        "vmwarden_vm_state",
        Gauge,
        "The VM's state as vmwarden status shows it: 1 for the state it is in, 0 for the others.",
    );
    let mut info = Family::new(
        "vmwarden_vm_info",
        Gauge,
        "Always 1: the VM's hypervisor and its SPEC column (outdated: a restart applies a changed spec).",
    );
    let mut uptime = Family::new(
        "vmwarden_vm_uptime_seconds",
        Gauge,
        "Seconds since the running instance was launched.",
    );
    let mut started = Family::new(
        "vmwarden_vm_start_time_seconds",
        Gauge,
        "When the running instance was launched, in Unix seconds.",
    );
    let mut starts = Family::new(
        "vmwarden_vm_starts_total",
        Counter,
        "Instances started since the runtime root was made (the host's boot).",
    );
    let mut restarts = Family::new(
        "vmwarden_vm_restarts_total",
        Counter,
        "Starts after the first since the runtime root was made: systemd's restarts and an operator's alike.",
    );
    let mut cpu = Family::new(
        "vmwarden_vm_cpu_seconds_total",
        Counter,
        "CPU time of every process in the running instance's cgroup (cpu.stat usage_usec).",
    );
    let mut mem = Family::new(
        "vmwarden_vm_memory_bytes",
        Gauge,
        "Memory the running instance's cgroup uses now (memory.current).",
    );
    let mut mem_peak = Family::new(
        "vmwarden_vm_memory_peak_bytes",
        Gauge,
        "The most memory the running instance's cgroup has used (memory.peak).",
    );
    let mut blk_r = Family::new(
        "vmwarden_vm_block_read_bytes_total",
        Counter,
        "Bytes the running instance's cgroup read from block devices (io.stat rbytes).",
    );
    let mut blk_w = Family::new(
        "vmwarden_vm_block_written_bytes_total",
        Counter,
        "Bytes the running instance's cgroup wrote to block devices (io.stat wbytes).",
    );
    let mut net_rx = Family::new(
        "vmwarden_vm_network_receive_bytes_total",
        Counter,
        "Bytes the host received on the VM's interface (what the guest sent).",
    );
    let mut net_tx = Family::new(
        "vmwarden_vm_network_transmit_bytes_total",
        Counter,
        "Bytes the host transmitted on the VM's interface (what the guest was sent).",
    );
    let mut balloon = Family::new(
        "vmwarden_vm_balloon_bytes",
        Gauge,
        "Memory the balloon takes from the running guest, as the guest acknowledged it.",
    );
    let mut clean = Family::new(
        "vmwarden_vm_last_cleanup_clean",
        Gauge,
        "1 when the last vmwarden-cleanup of the VM proved nothing was left, else 0.",
    );
    let mut residue = Family::new(
        "vmwarden_vm_last_cleanup_residue",
        Gauge,
        "What the last vmwarden-cleanup of the VM could not delete or found left (its report's failed).",
    );
    let mut cleaned_at = Family::new(
        "vmwarden_vm_last_cleanup_time_seconds",
        Gauge,
        "When the last vmwarden-cleanup of the VM finished, in Unix seconds.",
    );
    let mut helpers = Family::new(
        "vmwarden_vm_helpers_started",
        Gauge,
        "Helper daemons (virtiofsd, vhost-device-vsock, passt, vmm-notify, reboot-watch) the running instance started.",
    );
    let mut helpers_running = Family::new(
        "vmwarden_vm_helpers_running",
        Gauge,
        "Processes in the running instance's cgroup besides the hypervisor.",
    );
    for v in vms {
        let s = &v.status;
        let vm = s.name.as_str();
        for st in STATES {
            state.add(vm, &[("state", st.as_str())], u8::from(s.state == st));
        }
        let hv = s.hypervisor.map_or("", |h| h.as_str());
        info.add(vm, &[("hypervisor", hv), ("spec", s.spec.as_str())], 1);
        let running = s.state == State::Running;
        if let (true, Some(u)) = (running, s.uptime_seconds) {
            uptime.add(vm, &[], u);
        }
        if let (true, Some(t)) = (running, s.started_unix) {
            started.add(vm, &[], t);
        }
        starts.add(vm, &[], v.starts);
        restarts.add(vm, &[], v.starts.saturating_sub(1));
        if let Some(cg) = &v.cgroup {
            if let Some(u) = cg.cpu_usec {
                cpu.add(vm, &[], seconds(u));
            }
            if let Some(b) = cg.memory_bytes {
                mem.add(vm, &[], b);
            }
            if let Some(b) = cg.memory_peak_bytes {
                mem_peak.add(vm, &[], b);
            }
            if let Some(b) = cg.read_bytes {
                blk_r.add(vm, &[], b);
            }
            if let Some(b) = cg.written_bytes {
                blk_w.add(vm, &[], b);
            }
            let others = cg.pids.iter().filter(|p| Some(**p) != s.pid).count();
            helpers_running.add(vm, &[], others);
        }
        for (ifname, f) in &v.interfaces {
            net_rx.add(vm, &[("interface", ifname)], f.rx_bytes);
            net_tx.add(vm, &[("interface", ifname)], f.tx_bytes);
        }
        if let (true, Some(b)) = (running, s.balloon_mib) {
            balloon.add(vm, &[], b.saturating_mul(MIB));
        }
        if let Some(c) = &v.last_cleanup {
            clean.add(vm, &[], u8::from(c.clean));
            residue.add(vm, &[], c.residue);
            cleaned_at.add(vm, &[], c.finished_unix);
        }
        if let (true, Some(h)) = (running, v.helpers_started) {
            helpers.add(vm, &[], h);
        }
    }
    let mut out = String::new();
    for f in [
        &state,
        &info,
        &uptime,
        &started,
        &starts,
        &restarts,
        &cpu,
        &mem,
        &mem_peak,
        &blk_r,
        &blk_w,
        &net_rx,
        &net_tx,
        &balloon,
        &clean,
        &residue,
        &cleaned_at,
        &helpers,
        &helpers_running,
    ] {
        f.write(&mut out);
    }
    out
}

/// Write `text` to `path` atomically for a collector that may read it at
/// any moment: a temporary name in the same directory (`.NAME.tmp`, which
/// node-exporter's `*.prom` glob does not match), then a rename.
pub fn write_textfile(path: &Path, text: &str) -> Result<(), dirs::DirError> {
    let (dir, name) = dirs::split_parent(path)?;
    dirs::durable_write(&dir, &name, text.as_bytes(), 0o644)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::spec::HypervisorKind;
    use crate::status::SpecState;

    fn status(name: &str, state: State) -> VmStatus {
        VmStatus {
            name: name.into(),
            state,
            liveness: String::new(),
            pid: (state == State::Running).then_some(40),
            principal: None,
            started_unix: (state == State::Running).then_some(1000),
            uptime_seconds: (state == State::Running).then_some(7),
            spec: SpecState::Current,
            spec_path: "/etc/vmwarden/vms/x.json".into(),
            configured: true,
            launched_spec: None,
            hypervisor: Some(HypervisorKind::Qemu),
            control: None,
            balloon_mib: Some(64),
            instance_id: None,
            leftovers: None,
            hibernated: None,
        }
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape_label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn a_running_vm_has_its_figures_and_a_stopped_one_its_verdict() {
        let web = VmFigures {
            status: status("web", State::Running),
            starts: 2,
            last_cleanup: Some(LastCleanup::next(None, Some("a"), false, 3, 900)),
            cgroup: Some(CgroupFigures {
                cpu_usec: Some(2_000_345),
                memory_bytes: Some(4096),
                memory_peak_bytes: None,
                read_bytes: Some(1),
                written_bytes: Some(2),
                pids: vec![40, 41],
            }),
            helpers_started: Some(1),
            interfaces: vec![(
                "vmw-web0".into(),
                NetFigures {
                    rx_bytes: 5,
                    tx_bytes: 6,
                },
            )],
        };
        let db = VmFigures {
            status: status("db", State::Stopped),
            starts: 0,
            last_cleanup: None,
            cgroup: None,
            helpers_started: None,
            interfaces: vec![],
        };
        let t = render(&[web, db]);
        for line in [
            "vmwarden_vm_state{vm=\"web\",state=\"running\"} 1",
            "vmwarden_vm_state{vm=\"db\",state=\"running\"} 0",
            "vmwarden_vm_state{vm=\"db\",state=\"stopped\"} 1",
            "vmwarden_vm_info{vm=\"web\",hypervisor=\"qemu\",spec=\"current\"} 1",
            "vmwarden_vm_cpu_seconds_total{vm=\"web\"} 2.000345",
            "vmwarden_vm_restarts_total{vm=\"web\"} 1",
            "vmwarden_vm_restarts_total{vm=\"db\"} 0",
            "vmwarden_vm_network_receive_bytes_total{vm=\"web\",interface=\"vmw-web0\"} 5",
            "vmwarden_vm_balloon_bytes{vm=\"web\"} 67108864",
            "vmwarden_vm_last_cleanup_residue{vm=\"web\"} 3",
            "vmwarden_vm_helpers_running{vm=\"web\"} 1",
            "# TYPE vmwarden_vm_block_written_bytes_total counter",
        ] {
            assert!(t.lines().any(|l| l == line), "{line} not in:\n{t}");
        }
        // A stopped VM has no uptime, balloon or memory, and no peak is
        // made up where the kernel has none.
        assert!(!t.contains("uptime_seconds{vm=\"db\"}"), "{t}");
        assert!(!t.contains("balloon_bytes{vm=\"db\"}"), "{t}");
        assert!(!t.contains("memory_peak_bytes{"), "{t}");
    }
}
