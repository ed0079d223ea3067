//! `resources`: the limits systemd puts on the VM's unit (its cgroup), for
//! a host with many VMs: CPU quota and weight, memory max and high, I/O
//! weight, tasks max, the CPUs it may run on. The spec is the one source:
//! `render-unit --dropin` writes them into the VM's drop-in, and the NixOS
//! module renders the same drop-in from the same options (the parity test
//! compares the two). The launcher only checks them.

use serde::{Deserialize, Serialize};

/// A limit out of range: the field (under `resources.`) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("resources.{field}: {reason}")]
pub struct ResourceError {
    pub field: &'static str,
    pub reason: String,
}

/// systemd's range of `CPUWeight=` and `IOWeight=`.
pub const WEIGHT_MAX: u32 = 10_000;
/// Below this a hypervisor does not start (QEMU's own mappings and the
/// launcher's sandbox), whatever the guest's memory.
pub const MIN_MEMORY_MAX_MIB: u64 = 64;
/// The hypervisor's threads and the helper daemons need more than this.
pub const MIN_TASKS_MAX: u32 = 32;
/// `CPUQuota=` in percent of one CPU: at most 1024 CPUs' worth.
pub const MAX_CPU_QUOTA_PERCENT: u32 = 102_400;

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ResourcesSpec {
    /// `CPUQuota=`: percent of one CPU (200 = two CPUs' time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_quota_percent: Option<u32>,
    /// `CPUWeight=`, 1..=10000 (systemd's default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_weight: Option<u32>,
    /// `MemoryMax=` in MiB: past it the kernel's OOM killer ends the VM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_max_mib: Option<u64>,
    /// `MemoryHigh=` in MiB: past it the kernel throttles and reclaims.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_high_mib: Option<u64>,
    /// `IOWeight=`, 1..=10000 (systemd's default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_weight: Option<u32>,
    /// `TasksMax=`: processes and threads of the unit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks_max: Option<u32>,
    /// `AllowedCPUs=` and `CPUAffinity=`: a CPU list (`0-3,6`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<String>,
}

/// A CPU list as systemd and the kernel read it: numbers and ranges
/// `A-B` (A ≤ B), comma-separated, each CPU below 8192.
pub fn valid_cpu_list(s: &str) -> bool {
    let cpu = |p: &str| -> Option<u32> {
        (!p.is_empty() && p.len() <= 4 && p.bytes().all(|b| b.is_ascii_digit()))
            .then(|| p.parse().ok())
            .flatten()
            .filter(|n| *n < 8192)
    };
    !s.is_empty()
        && s.split(',').all(|part| match part.split_once('-') {
            Some((a, b)) => matches!((cpu(a), cpu(b)), (Some(a), Some(b)) if a <= b),
            None => cpu(part).is_some(),
        })
}

impl ResourcesSpec {
    /// Ranges; the error names the offender.
    pub fn validate(&self) -> Result<(), ResourceError> {
        let bad = |field: &'static str, reason: String| ResourceError { field, reason };
        let weight = |field: &'static str, w: Option<u32>| match w {
            Some(w) if w == 0 || w > WEIGHT_MAX => {
                Err(bad(field, format!("is {w}; must be 1..={WEIGHT_MAX}")))
            }
            _ => Ok(()),
        };
        weight("cpu_weight", self.cpu_weight)?;
        weight("io_weight", self.io_weight)?;
        if let Some(q) = self.cpu_quota_percent {
            if q == 0 || q > MAX_CPU_QUOTA_PERCENT {
                return Err(bad(
                    "cpu_quota_percent",
                    format!("is {q}; must be 1..={MAX_CPU_QUOTA_PERCENT} (percent of one CPU)"),
                ));
            }
        }
        for (field, v) in [
            ("memory_max_mib", self.memory_max_mib),
            ("memory_high_mib", self.memory_high_mib),
        ] {
            if let Some(m) = v.filter(|m| *m < MIN_MEMORY_MAX_MIB) {
                return Err(bad(
                    field,
                    format!("is {m}; a hypervisor needs at least {MIN_MEMORY_MAX_MIB} MiB"),
                ));
            }
        }
        if let (Some(h), Some(m)) = (self.memory_high_mib, self.memory_max_mib) {
            if h > m {
                return Err(bad(
                    "memory_high_mib",
                    format!("is {h}, above memory_max_mib {m}: it would never apply"),
                ));
            }
        }
        if let Some(t) = self.tasks_max.filter(|t| *t < MIN_TASKS_MAX) {
            return Err(bad(
                "tasks_max",
                format!("is {t}; the hypervisor's threads and its helpers need at least {MIN_TASKS_MAX}"),
            ));
        }
        if let Some(c) = self.cpus.as_deref().filter(|c| !valid_cpu_list(c)) {
            return Err(bad(
                "cpus",
                format!("{c:?} is not a CPU list (numbers and ranges A-B, comma-separated, e.g. \"0-3,6\")"),
            ));
        }
        Ok(())
    }

    /// The drop-in's `[Service]` lines, in the order both renderers write
    /// them (byte order of the keys).
    pub fn unit_lines(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if let Some(c) = &self.cpus {
            out.push(("AllowedCPUs", c.clone()));
            out.push(("CPUAffinity", c.clone()));
        }
        if let Some(q) = self.cpu_quota_percent {
            out.push(("CPUQuota", format!("{q}%")));
        }
        if let Some(w) = self.cpu_weight {
            out.push(("CPUWeight", w.to_string()));
        }
        if let Some(w) = self.io_weight {
            out.push(("IOWeight", w.to_string()));
        }
        if let Some(m) = self.memory_high_mib {
            out.push(("MemoryHigh", format!("{m}M")));
        }
        if let Some(m) = self.memory_max_mib {
            out.push(("MemoryMax", format!("{m}M")));
        }
        if let Some(t) = self.tasks_max {
            out.push(("TasksMax", t.to_string()));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(r: &ResourcesSpec) -> Option<String> {
        r.validate().err().map(|e| format!("resources.{}", e.field))
    }

    #[test]
    fn limits_are_checked_by_name() {
        let ok = ResourcesSpec {
            cpu_quota_percent: Some(150),
            cpu_weight: Some(50),
            memory_max_mib: Some(512),
            memory_high_mib: Some(384),
            io_weight: Some(10),
            tasks_max: Some(256),
            cpus: Some("0-1,3".into()),
        };
        assert_eq!(field_of(&ok), None);
        assert_eq!(
            ok.unit_lines()
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>(),
            [
                "AllowedCPUs=0-1,3",
                "CPUAffinity=0-1,3",
                "CPUQuota=150%",
                "CPUWeight=50",
                "IOWeight=10",
                "MemoryHigh=384M",
                "MemoryMax=512M",
                "TasksMax=256"
            ]
        );
        for (r, want) in [
            (
                ResourcesSpec {
                    cpu_weight: Some(0),
                    ..ok.clone()
                },
                "resources.cpu_weight",
            ),
            (
                ResourcesSpec {
                    io_weight: Some(10_001),
                    ..ok.clone()
                },
                "resources.io_weight",
            ),
            (
                ResourcesSpec {
                    cpu_quota_percent: Some(0),
                    ..ok.clone()
                },
                "resources.cpu_quota_percent",
            ),
            (
                ResourcesSpec {
                    memory_max_mib: Some(8),
                    memory_high_mib: None,
                    ..ok.clone()
                },
                "resources.memory_max_mib",
            ),
            (
                ResourcesSpec {
                    memory_high_mib: Some(1024),
                    ..ok.clone()
                },
                "resources.memory_high_mib",
            ),
            (
                ResourcesSpec {
                    tasks_max: Some(4),
                    ..ok.clone()
                },
                "resources.tasks_max",
            ),
            (
                ResourcesSpec {
                    cpus: Some("3-1".into()),
                    ..ok.clone()
                },
                "resources.cpus",
            ),
            (
                ResourcesSpec {
                    cpus: Some("0,,1".into()),
                    ..ok.clone()
                },
                "resources.cpus",
            ),
            (
                ResourcesSpec {
                    cpus: Some("all".into()),
                    ..ok.clone()
                },
                "resources.cpus",
            ),
        ] {
            assert_eq!(field_of(&r).as_deref(), Some(want), "{r:?}");
        }
    }
}
