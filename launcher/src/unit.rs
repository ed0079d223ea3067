//! `vmwarden render-unit`: the systemd units for hosts without Nix.
//!
//! The keys of the three fixed units, each with the reason for it, are data
//! in `units/*.toml`, compiled in here and read by the NixOS module
//! (`modules/lib.nix`, `builtins.fromTOML`) too: change a key there and both
//! renderings change. `tests/nix/run.sh` shows that and compares the two
//! renderings key by key (`units.py parity`), with the per-VM drop-in, which
//! stays code on both sides.
//!
//! * default: `microvm@.service`, the template every VM runs from;
//! * `--target`: `microvms.target`;
//! * `--prefix vmwarden`: the same units as `vmwarden@.service` and
//!   `vmwarden-vms.target` (names per prefix: `units/unit-names.toml`, read
//!   by the module's `vmwarden.unitPrefix` too), for a host that runs
//!   microvm.nix's host module beside vmwarden;
//! * `--reap-report`: `vmwarden-reap-report.service` (boot-time dry-run reap);
//! * `--metrics-service`, `--metrics-timer`: `vmwarden-metrics.service` and
//!   its timer, which write `vmwarden metrics` into node-exporter's textfile
//!   collector directory (`--textfile-dir`) every `--interval`;
//! * `--hibernate-on-shutdown`: `vmwarden-hibernate-on-shutdown.service`,
//!   which hibernates the VMs that allow it at shutdown (each within
//!   `--hibernate-timeout` seconds) and starts them again at boot;
//! * `--dropin NAME`: the per-VM drop-in
//!   (`/etc/systemd/system/PREFIX@NAME.service.d/vmwarden.conf`) built from
//!   the VM's launch spec: `LoadCredential=` for every credential whose
//!   source is `{"systemd": C}` (read from `CREDENTIALS_DIR/NAME/C`, root-only
//!   files), and `ReadWritePaths=` for writable disks and `landlock.write`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::config::names::VmName;
use crate::config::paths::{Roots, DEFAULT_CONFIG_DIR};
use crate::config::reboot::REBOOT_SIGNAL;
use crate::config::spec::{
    CredentialSource, HypervisorKind, InterfaceSpec, ShareSpec, Spec, SpecError, VsockBackend,
};

/// Default directory of the three binaries on hosts without Nix.
pub const DEFAULT_BIN_DIR: &str = "/usr/local/bin";
/// Default root of the credential files `--dropin` points `LoadCredential=` at.
pub const DEFAULT_CREDENTIALS_DIR: &str = "/etc/vmwarden/credentials";

/// `units/microvm@.service.toml`, compiled in.
pub const TEMPLATE_DATA: &str = include_str!("../../units/microvm@.service.toml");
/// `units/vmwarden-reap-report.service.toml`, compiled in.
pub const REAP_REPORT_DATA: &str = include_str!("../../units/vmwarden-reap-report.service.toml");
/// `units/vmwarden-metrics.service.toml`, compiled in.
pub const METRICS_SERVICE_DATA: &str = include_str!("../../units/vmwarden-metrics.service.toml");
/// `units/vmwarden-metrics.timer.toml`, compiled in.
pub const METRICS_TIMER_DATA: &str = include_str!("../../units/vmwarden-metrics.timer.toml");
pub use shutdown::{DEFAULT_HIBERNATE_TIMEOUT, HIBERNATE_ON_SHUTDOWN_DATA};
/// Where Debian's prometheus-node-exporter reads textfiles from.
pub const DEFAULT_TEXTFILE_DIR: &str = "/var/lib/prometheus/node-exporter";
/// How often the metrics timer writes them.
pub const DEFAULT_METRICS_INTERVAL: &str = "30s";
/// Stand for the textfile directory and the interval in the metrics units.
const TEXTFILE_PLACEHOLDER: &str = "@textfile@";
const INTERVAL_PLACEHOLDER: &str = "@interval@";
/// `units/microvms.target.toml`, compiled in.
pub const TARGET_DATA: &str = include_str!("../../units/microvms.target.toml");
/// `units/unit-names.toml` (the template's and the target's names per unit
/// prefix), compiled in.
pub const NAMES_DATA: &str = include_str!("../../units/unit-names.toml");
/// Stands for the unit prefix in the unit data.
pub const PREFIX_PLACEHOLDER: &str = "@prefix@";
/// Stands for the target's unit name in the unit data.
pub const TARGET_PLACEHOLDER: &str = "@target@";

/// The names of the units every VM runs under, for one unit prefix
/// (`units/unit-names.toml`, the one definition the NixOS module reads
/// too): the template `PREFIX@.service` and its target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitNames {
    prefix: String,
    target: String,
}

impl UnitNames {
    /// The names for `prefix`, which must be one `units/unit-names.toml`
    /// lists.
    pub fn for_prefix(prefix: &str) -> Result<UnitNames, UnitError> {
        Self::from_data(NAMES_DATA, prefix)
    }

    /// The default names (`default` in the data: microvm.nix's).
    pub fn default_names() -> UnitNames {
        let table: toml::Table = NAMES_DATA
            .parse()
            .expect("units/unit-names.toml is compiled in and unit-tested");
        let prefix = table
            .get("default")
            .and_then(|v| v.as_str())
            .expect("units/unit-names.toml has a default");
        Self::from_data(NAMES_DATA, prefix).expect("the default prefix is listed")
    }

    /// The prefixes the data lists, in byte order.
    pub fn prefixes() -> Vec<String> {
        let table: toml::Table = NAMES_DATA
            .parse()
            .expect("units/unit-names.toml is compiled in and unit-tested");
        table
            .get("prefix")
            .and_then(|v| v.as_table())
            .map(|t| t.keys().cloned().collect())
            .unwrap_or_default()
    }

    fn from_data(data: &str, prefix: &str) -> Result<UnitNames, UnitError> {
        let bad = |reason: String| UnitError::Data {
            file: "units/unit-names.toml".to_string(),
            reason,
        };
        let table: toml::Table = data.parse().map_err(|e| bad(format!("{e}")))?;
        let prefixes = table
            .get("prefix")
            .and_then(|v| v.as_table())
            .ok_or_else(|| bad("no [prefix.NAME] tables".to_string()))?;
        let Some(entry) = prefixes.get(prefix) else {
            return Err(UnitError::UnknownPrefix {
                prefix: prefix.to_string(),
                known: prefixes.keys().cloned().collect::<Vec<_>>().join(", "),
            });
        };
        let target = entry
            .get("target")
            .and_then(|v| v.as_str())
            .ok_or_else(|| bad(format!("[prefix.{prefix}] has no target string")))?;
        Ok(UnitNames {
            prefix: prefix.to_string(),
            target: target.to_string(),
        })
    }

    /// The prefix (`microvm`, `vmwarden`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The template's file name, `PREFIX@.service`.
    pub fn template(&self) -> String {
        format!("{}@.service", self.prefix)
    }

    /// VM `name`'s unit, `PREFIX@NAME.service`.
    pub fn instance(&self, name: &VmName) -> String {
        format!("{}@{name}.service", self.prefix)
    }

    /// The target's unit name (`microvms.target`, `vmwarden-vms.target`).
    pub fn target(&self) -> &str {
        &self.target
    }

    /// The placeholders of the unit data and their values.
    fn substitutions(&self) -> [(&'static str, &str); 2] {
        [
            (PREFIX_PLACEHOLDER, self.prefix.as_str()),
            (TARGET_PLACEHOLDER, self.target.as_str()),
        ]
    }
}
/// Stands for the binaries' directory in the unit data (`--bin-dir` here,
/// `${vmwarden.package}/bin` in the module).
pub const BIN_PLACEHOLDER: &str = "@bin@";

/// What `vmwarden render-unit` was asked for (plain data: the flags that
/// fill it are the binary's, in `src/bin/cli/vmwarden.rs`).
#[derive(Debug, Clone)]
pub struct RenderUnitArgs {
    /// Directory holding vmwarden-launch, vmwarden-cleanup and vmwarden
    /// (absolute).
    pub bin_dir: PathBuf,

    /// Print the target (microvms.target with the default prefix)
    /// instead of the template.
    pub target: bool,

    /// Print vmwarden-reap-report.service (boot-time `vmwarden reap` dry
    /// run) instead of the template.
    pub reap_report: bool,

    /// Print vmwarden-metrics.service or vmwarden-metrics.timer instead.
    pub metrics: Option<MetricsUnit>,

    /// node-exporter's textfile collector directory (the metrics service).
    pub textfile_dir: PathBuf,

    /// A systemd time span: how often the metrics timer fires.
    pub interval: String,

    /// Print vmwarden-hibernate-on-shutdown.service instead.
    pub hibernate_on_shutdown: bool,

    /// Seconds each VM's capture may take at shutdown.
    pub hibernate_timeout: u32,

    /// Print the drop-in of VM NAME (install it as
    /// /etc/systemd/system/PREFIX@NAME.service.d/vmwarden.conf).
    pub dropin: Option<VmName>,

    /// Launch spec the drop-in is built from [default:
    /// CONFIG_DIR/NAME.json, i.e. /etc/vmwarden/vms/NAME.json].
    pub spec: Option<PathBuf>,

    /// Directory of credential files: systemd credential C of VM NAME is
    /// loaded from DIR/NAME/C (keep them root-owned, mode 0400).
    pub credentials_dir: PathBuf,

    /// Directory of the launch specs, for the default `--spec` path; the
    /// caller fills it from the global `--config-dir` (None: the default,
    /// /etc/vmwarden/vms).
    pub config_dir: Option<PathBuf>,

    /// Read the unit data from DIR/*.toml instead of the copy compiled in
    /// (for tests/nix/run.sh: an edited key must change both renderings).
    pub units_dir: Option<PathBuf>,

    /// Unit prefix: the template is PREFIX@.service, the target the one
    /// `units/unit-names.toml` gives it (`microvm`: microvms.target,
    /// `vmwarden`: vmwarden-vms.target).
    pub prefix: String,
}

impl Default for RenderUnitArgs {
    fn default() -> Self {
        RenderUnitArgs {
            bin_dir: PathBuf::from(DEFAULT_BIN_DIR),
            target: false,
            reap_report: false,
            metrics: None,
            textfile_dir: PathBuf::from(DEFAULT_TEXTFILE_DIR),
            interval: DEFAULT_METRICS_INTERVAL.to_string(),
            hibernate_on_shutdown: false,
            hibernate_timeout: DEFAULT_HIBERNATE_TIMEOUT,
            dropin: None,
            spec: None,
            credentials_dir: PathBuf::from(DEFAULT_CREDENTIALS_DIR),
            config_dir: None,
            units_dir: None,
            prefix: UnitNames::default_names().prefix,
        }
    }
}

/// Why a unit could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum UnitError {
    #[error("--{option} {path}: {reason}")]
    BadDir {
        option: &'static str,
        path: PathBuf,
        reason: &'static str,
    },
    /// The spec could not be read, parsed or validated (the launcher's own
    /// checks, `Spec::read` + `Spec::validate`).
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error("spec {path}: field `{field}`: {value:?} cannot be written into a unit file unquoted (whitespace, '%', quotes or backslashes)")]
    UnitUnsafe {
        path: PathBuf,
        field: String,
        value: String,
    },
    /// The unit data (`units/*.toml`) could not be read or has a shape the
    /// renderers do not take.
    #[error("unit data {file}: {reason}")]
    Data { file: String, reason: String },
    #[error("--interval {0:?}: not a systemd time span of whole seconds, minutes or hours (30s, 5min, 1h)")]
    BadInterval(String),
    #[error("--prefix {prefix:?}: not a unit prefix vmwarden knows (units/unit-names.toml lists {known})")]
    UnknownPrefix { prefix: String, known: String },
}

/// The metrics units (`render-unit --metrics-service`, `--metrics-timer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricsUnit {
    Service,
    Timer,
}

/// Which unit file a `render_unit` call prints.
enum Which<'a> {
    Template,
    Target,
    ReapReport,
    Metrics(MetricsUnit),
    HibernateOnShutdown,
    Dropin(&'a VmName),
}

/// A time span systemd reads the same in every version: digits and one of
/// `s`, `min`, `h` (the module's `interval` option has the same rule).
pub fn valid_interval(s: &str) -> bool {
    let unit = s.trim_start_matches(|c: char| c.is_ascii_digit());
    let digits = &s[..s.len() - unit.len()];
    !digits.is_empty() && !digits.starts_with('0') && matches!(unit, "s" | "min" | "h")
}

/// Render the unit selected by `args` as the text of a unit file.
pub fn render_unit(args: &RenderUnitArgs) -> Result<String, UnitError> {
    let which = match (&args.dropin, args.target, args.reap_report, args.metrics) {
        (Some(name), ..) => Which::Dropin(name),
        (None, true, ..) => Which::Target,
        (None, false, true, _) => Which::ReapReport,
        (None, false, false, Some(unit)) => Which::Metrics(unit),
        (None, false, false, None) if args.hibernate_on_shutdown => Which::HibernateOnShutdown,
        (None, false, false, None) => Which::Template,
    };
    let names = UnitNames::for_prefix(&args.prefix)?;
    let (p, t) = (names.prefix(), names.target());
    match which {
        Which::Template => {
            let bin = unit_safe_dir("bin-dir", &args.bin_dir)?;
            let data = unit_data(args, "microvm@.service.toml", TEMPLATE_DATA)?;
            Ok(render(
                &format!(
                    "{p}@.service: the template every vmwarden microVM runs from.\n\
                     # Install as /etc/systemd/system/{p}@.service; start a VM with\n\
                     # `systemctl start {p}@NAME` (spec: /etc/vmwarden/vms/NAME.json),\n\
                     # autostart it with `systemctl add-wants {t} {p}@NAME.service`."
                ),
                &entries("microvm@.service.toml", &data, Some(&bin), &names)?,
            ))
        }
        Which::ReapReport => {
            let bin = unit_safe_dir("bin-dir", &args.bin_dir)?;
            let data = unit_data(args, "vmwarden-reap-report.service.toml", REAP_REPORT_DATA)?;
            Ok(render(
                "vmwarden-reap-report.service: `vmwarden reap` (dry run) once at boot.\n\
                 # Install as /etc/systemd/system/vmwarden-reap-report.service, then\n\
                 # `systemctl enable vmwarden-reap-report.service`.",
                &entries(
                    "vmwarden-reap-report.service.toml",
                    &data,
                    Some(&bin),
                    &names,
                )?,
            ))
        }
        Which::Metrics(unit) => {
            let bin = unit_safe_dir("bin-dir", &args.bin_dir)?;
            let textfile = unit_safe_dir("textfile-dir", &args.textfile_dir)?;
            if !valid_interval(&args.interval) {
                return Err(UnitError::BadInterval(args.interval.clone()));
            }
            let (file, compiled_in, what) = match unit {
                MetricsUnit::Service => (
                    "vmwarden-metrics.service.toml",
                    METRICS_SERVICE_DATA,
                    "vmwarden-metrics.service: `vmwarden metrics` into node-exporter's textfile directory.\n\
                     # Install as /etc/systemd/system/vmwarden-metrics.service beside its timer.",
                ),
                MetricsUnit::Timer => (
                    "vmwarden-metrics.timer.toml",
                    METRICS_TIMER_DATA,
                    "vmwarden-metrics.timer: starts vmwarden-metrics.service every interval.\n\
                     # Install as /etc/systemd/system/vmwarden-metrics.timer, then\n\
                     # `systemctl enable --now vmwarden-metrics.timer`.",
                ),
            };
            let data = unit_data(args, file, compiled_in)?
                .replace(TEXTFILE_PLACEHOLDER, &textfile)
                .replace(INTERVAL_PLACEHOLDER, &args.interval);
            Ok(render(what, &entries(file, &data, Some(&bin), &names)?))
        }
        Which::HibernateOnShutdown => shutdown::render_unit(args, &names),
        Which::Target => {
            let data = unit_data(args, "microvms.target.toml", TARGET_DATA)?;
            Ok(render(
                &format!(
                    "{t}: wants the VMs that start at boot.\n\
                     # Install as /etc/systemd/system/{t}, then\n\
                     # `systemctl enable {t}`."
                ),
                &entries("microvms.target.toml", &data, None, &names)?,
            ))
        }
        Which::Dropin(name) => {
            let creds = unit_safe_dir("credentials-dir", &args.credentials_dir)?;
            let path = match &args.spec {
                Some(p) => p.clone(),
                None => args
                    .config_dir
                    .clone()
                    .unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG_DIR))
                    .join(format!("{name}.json")),
            };
            // The launcher's own reading and validation (no file checks:
            // the images may not exist yet when the unit is installed).
            let spec = Spec::read(&path)?;
            spec.validate(&path, name)?;
            // The module writes specs for the default runtime root.
            spec.validate_extra_args(&path, &Roots::default().control_dir(name))?;
            let lines = dropin(name, &path, &spec, &creds)?;
            Ok(render(
                &format!(
                    "{p}@{name}.service.d/vmwarden.conf: credentials and writable paths of VM {name}.\n\
                     # Rendered from {} by `vmwarden render-unit --dropin {name}`.",
                    path.display()
                ),
                &lines,
            ))
        }
    }
}

/// One `Key=value` line of a unit section.
type Entry = (&'static str, String, String);

fn e(section: &'static str, key: &str, value: impl Into<String>) -> Entry {
    (section, key.to_string(), value.into())
}

/// The text of unit data file `file`: the compiled-in copy, or the file in
/// `--units-dir`.
fn unit_data(
    args: &RenderUnitArgs,
    file: &str,
    compiled_in: &'static str,
) -> Result<std::borrow::Cow<'static, str>, UnitError> {
    let Some(dir) = &args.units_dir else {
        return Ok(compiled_in.into());
    };
    let path = dir.join(file);
    std::fs::read_to_string(&path)
        .map(Into::into)
        .map_err(|err| UnitError::Data {
            file: path.display().to_string(),
            reason: err.to_string(),
        })
}

/// The lines of a unit from its data (`units/*.toml`): tables `[Unit]`,
/// `[Service]`, `[Install]`; a string, integer or boolean is one line, a
/// list one line per element; `@bin@` in a string becomes `bin`. Keys come
/// out in byte order within each section, the order NixOS prints them in,
/// so the two texts match line by line. `mkNixosUnit` in modules/lib.nix
/// reads the same data with the same rules.
/// `@prefix@` and `@target@` become the names in `names`.
fn entries(
    file: &str,
    text: &str,
    bin: Option<&str>,
    names: &UnitNames,
) -> Result<Vec<Entry>, UnitError> {
    let bad = |reason: String| UnitError::Data {
        file: file.to_string(),
        reason,
    };
    let table: toml::Table = text.parse().map_err(|err| bad(format!("{err}")))?;
    let subst = |s: &str| {
        names
            .substitutions()
            .iter()
            .fold(s.to_string(), |acc, (from, to)| acc.replace(from, to))
    };
    let scalar = |key: &str, v: &toml::Value| -> Result<String, UnitError> {
        match v {
            toml::Value::String(s) if s.contains(BIN_PLACEHOLDER) => match bin {
                Some(b) => Ok(subst(s).replace(BIN_PLACEHOLDER, b)),
                None => Err(bad(format!(
                    "{key}: {BIN_PLACEHOLDER} has no value in this unit"
                ))),
            },
            toml::Value::String(s) => Ok(subst(s)),
            toml::Value::Integer(i) => Ok(i.to_string()),
            toml::Value::Boolean(b) => Ok(b.to_string()),
            v => Err(bad(format!(
                "{key}: {} is not a string, integer, boolean or a list of them",
                v.type_str()
            ))),
        }
    };
    let mut out = Vec::new();
    for (name, keys) in &table {
        let Some(section) = SECTIONS.iter().find(|s| **s == name.as_str()) else {
            return Err(bad(format!("[{name}]: the sections are {SECTIONS:?}")));
        };
        let toml::Value::Table(keys) = keys else {
            return Err(bad(format!("{name} is not a [section]")));
        };
        let mut sorted: Vec<(&String, &toml::Value)> = keys.iter().collect();
        sorted.sort_by(|a, b| a.0.cmp(b.0));
        for (key, value) in sorted {
            match value {
                toml::Value::Array(items) => {
                    for item in items {
                        out.push(e(section, key, scalar(key, item)?));
                    }
                }
                v => out.push(e(section, key, scalar(key, v)?)),
            }
        }
    }
    Ok(out)
}

/// The sections unit data may have, in the order they are printed.
const SECTIONS: [&str; 4] = ["Unit", "Service", "Timer", "Install"];

/// The per-VM drop-in; `dropin` in modules/lib.nix, with credential
/// sources at `creds/NAME/C` instead of the module's per-credential paths.
/// `spec` has passed `Spec::validate`.
fn dropin(name: &VmName, path: &Path, spec: &Spec, creds: &str) -> Result<Vec<Entry>, UnitError> {
    let mut out = Vec::new();
    // The unit's limits (`resources`): systemd puts them on its cgroup.
    for (key, value) in spec.resources.iter().flat_map(|r| r.unit_lines()) {
        out.push(e("Service", key, value));
    }
    // -- The host's own tools: register_with_machined. The launcher
    //    registers the VM on the system bus (AF_UNIX, which the template
    //    allows) before its drop: machined must be up first (as
    //    microvm.nix's host module orders it).
    if spec.register_with_machined {
        out.push(e("Unit", "After", "systemd-machined.service"));
        out.push(e("Unit", "Wants", "systemd-machined.service"));
    }
    // Taps: the launcher creates them (root, before its drop) through
    // /dev/net/tun, already in the template's DeviceAllow, and configures
    // them over rtnetlink. Both settings merge with the template's.
    let taps = !spec.interfaces.is_empty();
    if taps {
        out.push(e("Service", "CapabilityBoundingSet", "CAP_NET_ADMIN"));
    }
    for c in &spec.credentials {
        // {"systemd": C}: PID 1 reads the root-only file and hands it to the
        // launcher in $CREDENTIALS_DIRECTORY. {"path": P}: the launcher
        // reads P itself; nothing for systemd.
        if let CredentialSource::Systemd(sd) = &c.source {
            out.push(e(
                "Service",
                "LoadCredential",
                format!("{sd}:{creds}/{name}/{sd}"),
            ));
        }
    }
    let writable = spec
        .disks
        .iter()
        .enumerate()
        .filter(|(_, d)| !d.read_only)
        .map(|(i, d)| (format!("disks[{i}].path"), d.path.as_path()))
        .chain(
            spec.landlock
                .write
                .iter()
                .enumerate()
                .map(|(i, p)| (format!("landlock.write[{i}]"), p.as_path())),
        )
        // Writable share sources: virtiofsd and QEMU's 9p write there as
        // the principal.
        .chain(
            spec.shares
                .iter()
                .enumerate()
                .filter(|(_, s)| !s.read_only)
                .map(|(i, s)| (format!("shares[{i}].source"), s.source.as_path())),
        )
        // ...and their parents: the launcher makes a missing source there,
        // only in a parent of root's alone (launch::share_sources).
        .chain(
            spec.shares
                .iter()
                .enumerate()
                .filter(|(_, s)| !s.read_only)
                .filter_map(|(i, s)| Some((format!("shares[{i}].source"), s.source.parent()?)))
                .filter(|(_, p)| p.parent().is_some()),
        );
    for (field, p) in writable {
        let unsafe_err = || UnitError::UnitUnsafe {
            path: path.to_path_buf(),
            field: field.clone(),
            value: p.display().to_string(),
        };
        let s = p.to_str().ok_or_else(unsafe_err)?;
        if !unit_safe_path(s) {
            return Err(unsafe_err());
        }
        // '-': a missing image is the launcher's error to report, not a
        // namespace setup failure.
        out.push(e("Service", "ReadWritePaths", format!("-{s}")));
    }
    if taps && spec.user_network.is_none() {
        out.push(e("Service", "RestrictAddressFamilies", "AF_NETLINK"));
    }
    // Firecracker's taps live in a network namespace of its own, which the
    // launcher makes (launch::netns); a multi-queue tap is made in one of
    // the launcher's own and moved out (host::net::apart). Merges with the
    // template's "mnt ipc".
    if taps
        && (spec.hypervisor.kind == HypervisorKind::Firecracker
            || spec.interfaces.iter().any(InterfaceSpec::tap_made_apart))
    {
        out.push(e("Service", "RestrictNamespaces", "net"));
    }
    // vsock with the kernel backend: the launcher (root, in this unit)
    // opens /dev/vhost-vsock and hands QEMU the fd; the template no longer
    // allows the device to every VM.
    if spec
        .vsock
        .as_ref()
        .is_some_and(|v| v.backend == VsockBackend::Vhost)
    {
        out.push(e("Service", "DeviceAllow", "/dev/vhost-vsock rw"));
    }
    // A macvtap: the launcher (root, before its drop) opens its character
    // device, /dev/tapN, whose major the kernel names "macvtap" in
    // /proc/devices (launch::macvtap). Merges with the template's.
    if spec.interfaces.iter().any(|n| n.macvtap().is_some()) {
        out.push(e("Service", "DeviceAllow", MACVTAP_DEVICE_ALLOW));
    }
    // Host devices: the launcher (root, before its drop) rebinds each PCI
    // device through sysfs (read-only under ProtectKernelTunables= but for
    // these trees) and the hypervisor opens the VFIO nodes or the USB node;
    // VFIO pins the guest's RAM, which the launcher's own limit bounds.
    out.extend(devices_dropin(spec));
    // A reboot inside the guest: QEMU and cloud-hypervisor reset the machine
    // in place; firecracker ends with status 0 (as after `vmwarden stop`'s
    // Ctrl-Alt-Del, which its guest answers with a reboot), and the unit
    // starts it again after such an exit of its own; a stop through systemd
    // is never restarted. A guest poweroff halts a firecracker guest, and
    // firecracker, which has no ACPI power-off, runs on
    // (docs/design/systemd-units.md).
    if spec.hypervisor.kind == HypervisorKind::Firecracker {
        out.push(e(
            "Service",
            "RestartForceExitStatus",
            FIRECRACKER_RESTART_FORCE,
        ));
    }
    // cloud-hypervisor with a virtiofs share cannot reboot in place (its
    // virtiofsd serves one connection): the launcher's reboot-watch ends it
    // with this signal, a clean exit, which the unit starts again
    // (config::reboot).
    if spec.reboot_restarts_cloud_hypervisor() {
        out.push(e("Service", "RestartForceExitStatus", REBOOT_SIGNAL));
    }
    out.extend(user_network_dropin(spec));
    out.extend(owned_share_entries(spec));
    Ok(out)
}

/// `DeviceAllow=` of a VM with a macvtap: every macvtap character device.
pub const MACVTAP_DEVICE_ALLOW: &str = "char-macvtap rw";

/// `RestartForceExitStatus=` of a firecracker VM's drop-in: firecracker's
/// own exit (a reboot or poweroff inside the guest) restarts the VM.
pub const FIRECRACKER_RESTART_FORCE: &str = "0";

/// User networking (`userNetworkDropin` in modules/lib.nix): passt runs in
/// the unit's cgroup and under its seccomp filters. It is the guest's
/// network, so it opens IPv4 and IPv6 sockets and reads routes over
/// NETLINK_ROUTE (merged with the template's AF_UNIX; AF_NETLINK covers
/// taps too), its sockets need the IP traffic the template's
/// `IPAddressDeny=any` refuses (`IPAddressAllow=any` wins over it, the
/// loopback the gateway reaches included), and its own sandbox is a user
/// namespace with mount, IPC, UTS and PID namespaces in it (merged with
/// the template's "mnt ipc"). The launcher's own seccomp filter still keeps
/// the hypervisor to AF_UNIX and no namespaces, and passt off network,
/// cgroup and time namespaces.
fn user_network_dropin(spec: &Spec) -> Vec<Entry> {
    if spec.user_network.is_none() {
        return Vec::new();
    }
    vec![
        e("Service", "IPAddressAllow", "any"),
        e(
            "Service",
            "RestrictAddressFamilies",
            "AF_INET AF_INET6 AF_NETLINK",
        ),
        e("Service", "RestrictNamespaces", "user uts pid"),
    ]
}

/// A writable virtiofs share, which the guest owns: its virtiofsd unshares
/// a user namespace of its own, and its broker reads the virtiofsd's
/// memory and fds and makes directories set-group-ID
/// (launch/helpers/owned.rs, broker.rs). The launcher's own filters
/// confine both and every other process of the VM as before; these lines
/// merge with the template's (`ownedShareDropin` in modules/lib.nix).
fn owned_share_entries(spec: &Spec) -> Vec<Entry> {
    if !spec.shares.iter().any(ShareSpec::guest_owned) {
        return Vec::new();
    }
    let mut out = Vec::new();
    // A VM with user networking has "user" already, with passt's others.
    if spec.user_network.is_none() {
        out.push(e("Service", "RestrictNamespaces", "user"));
    }
    out.extend([
        e("Service", "RestrictSUIDSGID", "false"),
        e(
            "Service",
            "SystemCallFilter",
            "process_vm_readv pidfd_getfd",
        ),
    ]);
    out
}

/// `# comment` header, then the sections in the order [Unit], [Service],
/// [Install], each followed by a blank line, like NixOS's unit text.
fn render(header: &str, entries: &[Entry]) -> String {
    let mut out = format!("# {header}\n");
    for section in SECTIONS {
        let lines: Vec<&Entry> = entries.iter().filter(|en| en.0 == section).collect();
        if lines.is_empty() {
            continue;
        }
        let _ = writeln!(out, "[{section}]");
        for (_, key, value) in lines {
            let _ = writeln!(out, "{key}={value}");
        }
        out.push('\n');
    }
    out
}

/// Normalised absolute path that can stand in a unit file unquoted:
/// no whitespace or control characters, no '%' (specifiers), quotes or
/// backslashes; no empty, `.` or `..` components; no trailing '/'.
fn unit_safe_path(p: &str) -> bool {
    p.starts_with('/')
        && !p
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '%' | '"' | '\'' | '\\'))
        && (p == "/"
            || p[1..]
                .split('/')
                .all(|c| !c.is_empty() && c != "." && c != ".."))
}

fn unit_safe_dir(option: &'static str, dir: &Path) -> Result<String, UnitError> {
    let bad = |reason| UnitError::BadDir {
        option,
        path: dir.to_path_buf(),
        reason,
    };
    let s = dir.to_str().ok_or_else(|| bad("not valid UTF-8"))?;
    // "/opt/bin/" names the same directory as "/opt/bin".
    let s = match s.trim_end_matches('/') {
        "" => "/",
        t => t,
    };
    if !unit_safe_path(s) {
        return Err(bad(
            "must be a normalised absolute path without whitespace, '%', quotes or backslashes",
        ));
    }
    Ok(s.trim_end_matches('/').to_string())
}

mod shutdown;
#[cfg(test)]
mod tests;

/// The drop-in's lines for `devices` (`devicesDropin` in modules/lib.nix).
fn devices_dropin(spec: &Spec) -> Vec<Entry> {
    use crate::config::devices::{DeviceBus, MEMLOCK_MARGIN_MIB};
    let mut out = Vec::new();
    if spec.devices.iter().any(|d| d.bus == DeviceBus::Pci) {
        out.push(e("Service", "ReadWritePaths", "/sys/bus/pci /sys/devices"));
        out.push(e("Service", "DeviceAllow", "/dev/vfio/vfio rw"));
        out.push(e("Service", "DeviceAllow", "char-vfio rw"));
        out.push(e(
            "Service",
            "LimitMEMLOCK",
            ((spec.memory_mib + MEMLOCK_MARGIN_MIB) * 1024 * 1024).to_string(),
        ));
    }
    if spec.devices.iter().any(|d| d.bus == DeviceBus::Usb) {
        out.push(e("Service", "DeviceAllow", "char-usb_device rw"));
        // libusb's hotplug monitor, a uevent socket, without which QEMU's
        // usb-host does not start (launch::seccomp allows that protocol
        // only); taps and user networking already add the family.
        if spec.interfaces.is_empty() && spec.user_network.is_none() {
            out.push(e("Service", "RestrictAddressFamilies", "AF_NETLINK"));
        }
    }
    out
}
