//! `vmwarden`'s command line: the operator commands.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use vmwarden::config::names::VmName;
use vmwarden::unit::{
    MetricsUnit, RenderUnitArgs, DEFAULT_BIN_DIR, DEFAULT_CREDENTIALS_DIR,
    DEFAULT_METRICS_INTERVAL, DEFAULT_TEXTFILE_DIR,
};

use super::common::{LogArgs, RootArgs};

#[derive(Debug, Parser)]
#[command(
    name = "vmwarden",
    version,
    about = "Operate vmwarden microVMs",
    long_about = "Operate vmwarden microVMs: status, readiness, stop, and teardown with proof \
(reap, purge, verify-clean). Destructive commands use the launcher's own liveness and \
ownership code: a VM that might be running is never touched. Exit statuses: docs/exit-codes.md."
)]
pub struct Cli {
    #[command(flatten)]
    pub roots: RootArgs,
    #[command(flatten)]
    pub log: LogArgs,
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// Show every VM (or the named ones): state, pid, principal, uptime,
    /// whether it runs the configured spec, and its control socket's answer.
    #[command(
        long_about = "Show every VM (or the named ones) as a table: NAME, STATE \
(running|stopped|ambiguous|retired), PID, PRINCIPAL, UPTIME, SPEC \
(current|outdated|removed|unknown|configured|invalid|none) and CONTROL (the control socket's \
answer). `outdated` means the VM runs a spec that differs from the one configured now: \
restart it to apply the change. Exits 0 whatever state the VMs are in, 4 when a NAME is not \
a VM vmwarden knows."
    )]
    Status {
        /// VM names (default: every configured VM and every VM with a runtime dir).
        #[arg(value_name = "NAME")]
        names: Vec<VmName>,
        /// Also VMs that are not configured but left state or a principal
        /// registration behind, with what `reap` and `purge` would do.
        #[arg(short, long)]
        all: bool,
        /// Print JSON (a list of records; fields in docs/operating.md).
        #[arg(long)]
        json: bool,
    },
    /// Print every VM's figures in Prometheus' text format (state, uptime,
    /// starts, CPU, memory, block and network bytes, balloon, last cleanup).
    #[command(
        long_about = "Print the figures of every VM `vmwarden status` shows in Prometheus' text \
exposition format: state and uptime, starts and restarts, CPU seconds, memory, block read and \
written bytes (from the running instance's cgroup), network bytes per interface, the balloon, \
the last cleanup's verdict and residue, and the helpers running. Never waits on a VM beyond \
`status`' bounds. With --output FILE, the text replaces FILE atomically (a temporary name in \
the same directory, then a rename), as node-exporter's textfile collector wants it."
    )]
    Metrics {
        /// Write to FILE (atomically) instead of standard output.
        #[arg(long, value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// Return once the VM's control socket answers (ExecStartPost).
    WaitReady {
        /// VM name.
        name: VmName,
        /// Seconds to wait.
        #[arg(long, default_value_t = 60.0, value_name = "SECONDS")]
        timeout: f64,
    },
    /// Graceful power-down through the control socket, then quit, then SIGKILL (ExecStop).
    Stop {
        /// VM name.
        name: VmName,
        /// Seconds to wait for the guest to power off.
        #[arg(long, default_value_t = 30.0, value_name = "SECONDS")]
        timeout: f64,
    },
    /// Put a running VM down to disk: pause, capture its memory into its
    /// state dir, stop it; the next start restores it.
    #[command(
        long_about = "Hibernate a running VM whose spec has hibernate.allowed: pause it, let its \
hypervisor write the snapshot (the principal's, 0600) into STATE/NAME/.vmwarden-hibernate.new, \
rename it to .vmwarden-hibernate once complete, record what it must match in \
STATE/.hibernated-NAME.json, and end the hypervisor. If the capture fails, the VM runs again and \
the partial snapshot is deleted. The next start restores from the snapshot when it still \
matches, and the restore consumes it (unless --keep-after-restore)."
    )]
    Hibernate {
        /// VM name.
        name: VmName,
        /// Seconds the capture may take.
        #[arg(long, default_value_t = 300.0, value_name = "SECONDS")]
        timeout: f64,
        /// Keep the snapshot after a successful restore (a second restore
        /// is still refused once the guest has written to a disk).
        #[arg(long)]
        keep_after_restore: bool,
    },
    /// Set a running VM's memory balloon: SIZE (MiB, or with a K/M/G
    /// suffix) is the memory taken from the guest.
    #[command(
        long_about = "Set the memory balloon of a running VM through its control socket: SIZE is \
the memory the balloon takes from the guest (MiB; K, M and G suffixes are read), the same \
measure as microvm.nix's initialBalloonMem; 0 gives the guest all its memory back. The guest \
inflates or deflates the balloon in its own time: `vmwarden status` shows the size it has \
reached (BALLOON). Needs `balloon` in the VM's launched spec (NixOS: microvm.balloon); refused \
for a SIZE that would leave the guest less than 16 MiB. Each attempt on the control socket is \
bounded as `stop`'s are."
    )]
    Balloon {
        /// VM name.
        name: VmName,
        /// The balloon's size: memory taken from the guest (MiB, or 512M, 1G).
        #[arg(value_name = "SIZE", value_parser = parse_mib)]
        size: u64,
    },
    /// Attach this terminal to a running VM's serial console (Ctrl-] detaches).
    #[command(
        long_about = "Attach this terminal to the serial console of a running VM (QEMU or \
cloud-hypervisor, with `console` in its spec: NixOS vmwarden.vms.NAME.console). What the guest \
prints reaches this terminal unescaped (the one place vmwarden shows a VM's bytes as they are, \
because the operator asked for them), and every key goes to the guest, Ctrl-C included. \
Ctrl-] detaches; the VM runs on, and its serial output stays in the journal whether or not a \
console is attached. One console at a time."
    )]
    Console {
        /// VM name.
        name: VmName,
    },
    /// Find (and with --apply remove) what no live instance owns.
    Reap {
        /// Delete what the dry run lists (default: a dry run that changes nothing).
        #[arg(long)]
        apply: bool,
        /// Also kill processes of principals with no live instance.
        #[arg(long)]
        kill: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete a stopped VM's persistent state (asks for DELETE-EVERYTHING on a terminal).
    Purge {
        /// VM name.
        name: VmName,
        /// Keep identity/ and keep_on_purge, and the principal's registration.
        #[arg(long)]
        keep_identity: bool,
    },
    /// Check that nothing of the VMs was left running or behind.
    VerifyClean {
        /// VM names (default: every known VM).
        #[arg(value_name = "NAME")]
        names: Vec<VmName>,
        /// Directories that must be untouched since --since.
        #[arg(long = "protected", value_name = "DIR")]
        protected: Vec<PathBuf>,
        /// Unix time (seconds) the protected dirs must be unchanged since.
        #[arg(long, value_name = "UNIX_SECONDS")]
        since: Option<f64>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Move a stopped microvm.nix VM's disk images and share sources into
    /// vmwarden's state dir and give them to the VM's principal (dry run
    /// unless --apply).
    #[command(
        long_about = "Move a stopped microvm.nix VM's state into vmwarden's: every disk \
image and share source the VM's spec places under STATE_ROOT/NAME/ (STATE_ROOT/NAME/X comes from \
DIR/X), re-owned to the VM's principal without following links and without crossing file \
systems. Everything else in DIR is listed and left. Refused when either side's VM might be \
running (vmwarden's liveness, microvm@NAME.service active, a process holding DIR's files open), \
when a target exists, for a symlink, a hard-linked file or a device node. A dry run unless \
--apply; an interrupted --apply is finished by running it again. See docs/microvm-nix.md."
    )]
    Adopt {
        /// VM name (its spec must be configured).
        name: VmName,
        /// microvm.nix's state dir of the VM, e.g. /var/lib/microvms/NAME.
        #[arg(long, value_name = "DIR")]
        from: PathBuf,
        /// Move (default: a dry run that changes nothing).
        #[arg(long)]
        apply: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print the systemd units for hosts without Nix.
    RenderUnit(RenderUnitCli),
    /// Write the man pages and shell completions of the three binaries
    /// (the package builds run it; see docs/operating.md).
    Generate {
        /// Output directory: man/man1/*.1 and completions/{bash,zsh,fish}/.
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
}

/// Arguments of `vmwarden render-unit`.
#[derive(clap::Args, Debug, Clone)]
pub struct RenderUnitCli {
    /// Directory holding vmwarden-launch, vmwarden-cleanup and vmwarden
    /// (absolute).
    #[arg(long, value_name = "DIR", default_value = DEFAULT_BIN_DIR)]
    pub bin_dir: PathBuf,

    /// Print the target (microvms.target) instead of the template.
    #[arg(long, conflicts_with_all = ["dropin", "reap_report"])]
    pub target: bool,

    /// Print vmwarden-reap-report.service (boot-time `vmwarden reap` dry
    /// run) instead of the template.
    #[arg(long, conflicts_with_all = ["dropin", "target"])]
    pub reap_report: bool,

    /// Print vmwarden-metrics.service (`vmwarden metrics --output` into
    /// node-exporter's textfile directory) instead of the template.
    #[arg(long, conflicts_with_all = ["dropin", "target", "reap_report", "metrics_timer"])]
    pub metrics_service: bool,

    /// Print vmwarden-metrics.timer (starts the metrics service every
    /// --interval) instead of the template.
    #[arg(long, conflicts_with_all = ["dropin", "target", "reap_report"])]
    pub metrics_timer: bool,

    /// node-exporter's textfile collector directory, for --metrics-service.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_TEXTFILE_DIR)]
    pub textfile_dir: PathBuf,

    /// How often the timer writes the metrics (30s, 5min, 1h), for
    /// --metrics-timer.
    #[arg(long, value_name = "SPAN", default_value = DEFAULT_METRICS_INTERVAL)]
    pub interval: String,

    /// Print the drop-in of VM NAME (install it as
    /// /etc/systemd/system/PREFIX@NAME.service.d/vmwarden.conf).
    #[arg(long, value_name = "NAME")]
    pub dropin: Option<VmName>,

    /// Launch spec the drop-in is built from [default:
    /// CONFIG_DIR/NAME.json, i.e. /etc/vmwarden/vms/NAME.json].
    #[arg(long, value_name = "PATH", requires = "dropin")]
    pub spec: Option<PathBuf>,

    /// Directory of credential files: systemd credential C of VM NAME is
    /// loaded from DIR/NAME/C (keep them root-owned, mode 0400).
    #[arg(long, value_name = "DIR", default_value = DEFAULT_CREDENTIALS_DIR)]
    pub credentials_dir: PathBuf,

    /// Read the unit data from DIR/*.toml instead of the copy compiled in
    /// (for tests/nix/run.sh: an edited key must change both renderings).
    #[arg(long, value_name = "DIR", hide = true)]
    pub units_dir: Option<PathBuf>,

    /// Unit prefix: `microvm` (microvm@.service, microvms.target) or
    /// `vmwarden` (vmwarden@.service, vmwarden-vms.target, for a host
    /// that also runs microvm.nix's host module); the NixOS module's
    /// vmwarden.unitPrefix.
    #[arg(long, value_name = "PREFIX", default_value = "microvm", value_parser = ["microvm", "vmwarden"])]
    pub prefix: String,
}

impl RenderUnitCli {
    /// The library's request; `--dropin` reads specs from `config_dir`, the
    /// same config dir as every command.
    pub fn request(self, config_dir: PathBuf) -> RenderUnitArgs {
        RenderUnitArgs {
            bin_dir: self.bin_dir,
            target: self.target,
            reap_report: self.reap_report,
            metrics: match (self.metrics_service, self.metrics_timer) {
                (true, _) => Some(MetricsUnit::Service),
                (false, true) => Some(MetricsUnit::Timer),
                (false, false) => None,
            },
            textfile_dir: self.textfile_dir,
            interval: self.interval,
            dropin: self.dropin,
            spec: self.spec,
            credentials_dir: self.credentials_dir,
            config_dir: Some(config_dir),
            units_dir: self.units_dir,
            prefix: self.prefix,
        }
    }
}

/// `512`, `512M`, `512MiB`, `1G`, `1GiB`, `65536K`: a size in MiB.
pub fn parse_mib(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size: give MiB, or a number with K, M or G"))?;
    let mib = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "M" | "MB" | "MIB" => Some(n),
        "G" | "GB" | "GIB" => n.checked_mul(1024),
        "K" | "KB" | "KIB" if n.is_multiple_of(1024) => Some(n / 1024),
        "K" | "KB" | "KIB" => return Err(format!("{s:?} is not a whole number of MiB")),
        _ => return Err(format!("{s:?}: unknown unit {unit:?}; use K, M or G")),
    };
    mib.ok_or_else(|| format!("{s:?} is too large"))
}

impl Cmd {
    /// The one VM the command is about, if it is about one: its log lines
    /// carry it in the journal (`VMWARDEN_VM=`).
    pub fn vm_name(&self) -> Option<&VmName> {
        match self {
            Cmd::WaitReady { name, .. }
            | Cmd::Stop { name, .. }
            | Cmd::Hibernate { name, .. }
            | Cmd::Balloon { name, .. }
            | Cmd::Console { name }
            | Cmd::Purge { name, .. }
            | Cmd::Adopt { name, .. } => Some(name),
            Cmd::Status { names, .. } | Cmd::VerifyClean { names, .. } if names.len() == 1 => {
                names.first()
            }
            Cmd::RenderUnit(a) => a.dropin.as_ref(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_mib;

    #[test]
    fn balloon_sizes_are_mib_with_or_without_a_unit() {
        assert_eq!(parse_mib("512"), Ok(512));
        assert_eq!(parse_mib("512M"), Ok(512));
        assert_eq!(parse_mib("512MiB"), Ok(512));
        assert_eq!(parse_mib("1G"), Ok(1024));
        assert_eq!(parse_mib("65536K"), Ok(64));
        assert!(parse_mib("1000K")
            .unwrap_err()
            .contains("whole number of MiB"));
        assert!(parse_mib("1T").unwrap_err().contains("unknown unit"));
        assert!(parse_mib("lots").unwrap_err().contains("is not a size"));
    }
}
