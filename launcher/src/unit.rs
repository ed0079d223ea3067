//! `vmwarden render-unit`: the systemd units for hosts without Nix.
//!
//! The NixOS module (`modules/lib.nix`) renders the same units; the two are
//! kept identical key by key (sections, keys, values) and
//! `tests/nix/run.sh` compares them (`units.py parity`). Change both together.
//!
//! * default: `microvm@.service`, the template every VM runs from;
//! * `--target`: `microvms.target`;
//! * `--reap-report`: `vmwarden-reap-report.service` (boot-time dry-run reap);
//! * `--dropin NAME`: the per-VM drop-in
//!   (`/etc/systemd/system/microvm@NAME.service.d/vmwarden.conf`) built from
//!   the VM's launch spec: `LoadCredential=` for every credential whose
//!   source is `{"systemd": C}` (read from `CREDENTIALS_DIR/NAME/C`, root-only
//!   files), and `ReadWritePaths=` for writable disks and `landlock.write`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::config::names::VmName;
use crate::config::paths::DEFAULT_CONFIG_DIR;
use crate::config::spec::{CredentialSource, Spec, SpecError};

/// Default directory of the three binaries on hosts without Nix.
pub const DEFAULT_BIN_DIR: &str = "/usr/local/bin";
/// Default root of the credential files `--dropin` points `LoadCredential=` at.
pub const DEFAULT_CREDENTIALS_DIR: &str = "/etc/vmwarden/credentials";

/// Arguments of `vmwarden render-unit`.
#[derive(clap::Args, Debug, Clone)]
pub struct RenderUnitArgs {
    /// Directory holding vmwarden-launch, vmwarden-cleanup and vmwarden
    /// (absolute).
    #[arg(long, value_name = "DIR", default_value = DEFAULT_BIN_DIR)]
    pub bin_dir: PathBuf,

    /// Print microvms.target instead of microvm@.service.
    #[arg(long, conflicts_with_all = ["dropin", "reap_report"])]
    pub target: bool,

    /// Print vmwarden-reap-report.service (boot-time `vmwarden reap` dry
    /// run) instead of microvm@.service.
    #[arg(long, conflicts_with_all = ["dropin", "target"])]
    pub reap_report: bool,

    /// Print the drop-in of VM NAME (install it as
    /// /etc/systemd/system/microvm@NAME.service.d/vmwarden.conf).
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

    /// Directory of the launch specs, for the default `--spec` path; the
    /// caller fills it from the global `--config-dir` (None: the default,
    /// /etc/vmwarden/vms).
    #[arg(skip)]
    pub config_dir: Option<PathBuf>,
}

impl Default for RenderUnitArgs {
    fn default() -> Self {
        RenderUnitArgs {
            bin_dir: PathBuf::from(DEFAULT_BIN_DIR),
            target: false,
            reap_report: false,
            dropin: None,
            spec: None,
            credentials_dir: PathBuf::from(DEFAULT_CREDENTIALS_DIR),
            config_dir: None,
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
}

/// Which unit file a `render_unit` call prints.
enum Which<'a> {
    Template,
    Target,
    ReapReport,
    Dropin(&'a VmName),
}

/// Render the unit selected by `args` as the text of a unit file.
pub fn render_unit(args: &RenderUnitArgs) -> Result<String, UnitError> {
    let which = match (&args.dropin, args.target, args.reap_report) {
        (Some(name), _, _) => Which::Dropin(name),
        (None, true, _) => Which::Target,
        (None, false, true) => Which::ReapReport,
        (None, false, false) => Which::Template,
    };
    match which {
        Which::Template => {
            let bin = unit_safe_dir("bin-dir", &args.bin_dir)?;
            Ok(render(
                "microvm@.service: the template every vmwarden microVM runs from.\n\
                 # Install as /etc/systemd/system/microvm@.service; start a VM with\n\
                 # `systemctl start microvm@NAME` (spec: /etc/vmwarden/vms/NAME.json),\n\
                 # autostart it with `systemctl add-wants microvms.target microvm@NAME.service`.",
                &template(&bin),
            ))
        }
        Which::ReapReport => {
            let bin = unit_safe_dir("bin-dir", &args.bin_dir)?;
            Ok(render(
                "vmwarden-reap-report.service: `vmwarden reap` (dry run) once at boot.\n\
                 # Install as /etc/systemd/system/vmwarden-reap-report.service, then\n\
                 # `systemctl enable vmwarden-reap-report.service`.",
                &reap_report(&bin),
            ))
        }
        Which::Target => Ok(render(
            "microvms.target: wants the VMs that start at boot.\n\
             # Install as /etc/systemd/system/microvms.target, then\n\
             # `systemctl enable microvms.target`.",
            &target(),
        )),
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
            let lines = dropin(name, &path, &spec, &creds)?;
            Ok(render(
                &format!(
                    "microvm@{name}.service.d/vmwarden.conf: credentials and writable paths of VM {name}.\n\
                     # Rendered from {} by `vmwarden render-unit --dropin {name}`.",
                    path.display()
                ),
                &lines,
            ))
        }
    }
}

/// One `Key=value` line of a unit section.
type Entry = (&'static str, &'static str, String);

fn e(section: &'static str, key: &'static str, value: impl Into<String>) -> Entry {
    (section, key, value.into())
}

/// microvm@.service; the same keys and values as `template` in
/// modules/lib.nix, with `bin` for "${package}/bin". Keys are listed in the
/// order NixOS prints them (byte order), so the two texts match line by line.
fn template(bin: &str) -> Vec<Entry> {
    let s = "Service";
    vec![
        e("Unit", "After", "network.target vmwarden-reap-report.service"),
        e("Unit", "Before", "microvms.target"),
        e("Unit", "ConditionPathExists", "/etc/vmwarden/vms/%i.json"),
        e("Unit", "Description", "vmwarden microVM %i"),
        e("Unit", "PartOf", "microvms.target"),
        e("Unit", "StartLimitBurst", "3"),
        e("Unit", "StartLimitIntervalSec", "600"),
        e(
            s,
            "CapabilityBoundingSet",
            "CAP_CHOWN CAP_DAC_OVERRIDE CAP_FOWNER CAP_KILL CAP_SETGID CAP_SETPCAP CAP_SETUID CAP_SYS_ADMIN",
        ),
        e(s, "DeviceAllow", "/dev/kvm rw"),
        e(s, "DeviceAllow", "/dev/net/tun rw"),
        e(s, "DeviceAllow", "/dev/vhost-net rw"),
        e(s, "DeviceAllow", "/dev/vhost-vsock rw"),
        e(s, "DevicePolicy", "closed"),
        e(s, "ExecStart", format!("{bin}/vmwarden-launch %i")),
        e(s, "ExecStartPost", format!("+{bin}/vmwarden wait-ready %i")),
        e(s, "ExecStop", format!("{bin}/vmwarden stop %i")),
        e(s, "ExecStopPost", format!("+{bin}/vmwarden-cleanup %i")),
        e(s, "IPAddressDeny", "any"),
        e(s, "KillMode", "mixed"),
        e(s, "LimitCORE", "0"),
        e(s, "LockPersonality", "true"),
        e(s, "NoNewPrivileges", "true"),
        e(s, "PrivateIPC", "true"),
        e(s, "PrivateMounts", "true"),
        e(s, "PrivateTmp", "true"),
        e(s, "ProtectClock", "true"),
        e(s, "ProtectControlGroups", "true"),
        e(s, "ProtectHome", "true"),
        e(s, "ProtectHostname", "true"),
        e(s, "ProtectKernelLogs", "true"),
        e(s, "ProtectKernelModules", "true"),
        e(s, "ProtectKernelTunables", "true"),
        e(s, "ProtectSystem", "strict"),
        e(s, "Restart", "on-failure"),
        e(s, "RestartPreventExitStatus", "78"),
        e(s, "RestartSec", "5s"),
        e(s, "RestrictAddressFamilies", "AF_UNIX"),
        e(s, "RestrictNamespaces", "mnt"),
        e(s, "RestrictRealtime", "true"),
        e(s, "RestrictSUIDSGID", "true"),
        e(s, "RuntimeDirectory", "vmwarden"),
        e(s, "RuntimeDirectoryMode", "0755"),
        e(s, "RuntimeDirectoryPreserve", "true"),
        e(s, "Slice", "machine.slice"),
        e(s, "StateDirectory", "vmwarden"),
        e(s, "StateDirectoryMode", "0755"),
        e(s, "SyslogIdentifier", "microvm@%i"),
        e(s, "SystemCallArchitectures", "native"),
        e(
            s,
            "SystemCallFilter",
            "~@clock @cpu-emulation @debug @module @obsolete @raw-io @reboot @swap",
        ),
        e(s, "TimeoutStartSec", "300"),
        e(s, "TimeoutStopSec", "150"),
        e(s, "Type", "exec"),
        e(s, "UMask", "0077"),
    ]
}

/// vmwarden-reap-report.service; `reapReport` in modules/lib.nix.
fn reap_report(bin: &str) -> Vec<Entry> {
    let s = "Service";
    vec![
        e("Unit", "After", "local-fs.target"),
        e("Unit", "Before", "microvms.target"),
        e(
            "Unit",
            "Description",
            "vmwarden: report leftovers of stopped or removed microVMs (dry run)",
        ),
        e(
            s,
            "CapabilityBoundingSet",
            "CAP_DAC_OVERRIDE CAP_DAC_READ_SEARCH CAP_SYS_PTRACE",
        ),
        e(s, "ExecStart", format!("{bin}/vmwarden reap")),
        e(s, "IPAddressDeny", "any"),
        e(s, "LockPersonality", "true"),
        e(s, "MemoryDenyWriteExecute", "true"),
        e(s, "NoNewPrivileges", "true"),
        e(s, "PrivateDevices", "true"),
        e(s, "PrivateTmp", "true"),
        e(s, "ProtectClock", "true"),
        e(s, "ProtectControlGroups", "true"),
        e(s, "ProtectHome", "true"),
        e(s, "ProtectHostname", "true"),
        e(s, "ProtectKernelLogs", "true"),
        e(s, "ProtectKernelModules", "true"),
        e(s, "ProtectKernelTunables", "true"),
        e(s, "ProtectSystem", "strict"),
        e(s, "RestrictAddressFamilies", "AF_UNIX AF_NETLINK"),
        e(s, "RestrictNamespaces", "true"),
        e(s, "RestrictRealtime", "true"),
        e(s, "RestrictSUIDSGID", "true"),
        e(s, "SystemCallArchitectures", "native"),
        e(s, "SystemCallFilter", "@system-service"),
        e(s, "Type", "oneshot"),
        e(s, "UMask", "0077"),
        e("Install", "WantedBy", "multi-user.target"),
    ]
}

/// microvms.target; `target` in modules/lib.nix. NixOS expresses WantedBy=
/// as a symlink, here it is the [Install] section `systemctl enable` reads;
/// the VMs it wants are added with `systemctl add-wants`.
fn target() -> Vec<Entry> {
    vec![
        e("Unit", "Description", "vmwarden microVMs"),
        e("Install", "WantedBy", "multi-user.target"),
    ]
}

/// The per-VM drop-in; `dropin` in modules/lib.nix, with credential
/// sources at `creds/NAME/C` instead of the module's per-credential paths.
/// `spec` has passed `Spec::validate`.
fn dropin(name: &VmName, path: &Path, spec: &Spec, creds: &str) -> Result<Vec<Entry>, UnitError> {
    let mut out = Vec::new();
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
        .map(|(i, d)| (format!("disks[{i}].path"), &d.path))
        .chain(
            spec.landlock
                .write
                .iter()
                .enumerate()
                .map(|(i, p)| (format!("landlock.write[{i}]"), p)),
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
    if taps {
        out.push(e("Service", "RestrictAddressFamilies", "AF_NETLINK"));
    }
    Ok(out)
}

/// `# comment` header, then the sections in the order [Unit], [Service],
/// [Install], each followed by a blank line, like NixOS's unit text.
fn render(header: &str, entries: &[Entry]) -> String {
    let mut out = format!("# {header}\n");
    for section in ["Unit", "Service", "Install"] {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    type Parsed = BTreeMap<String, BTreeMap<String, Vec<String>>>;

    fn parse(text: &str) -> Parsed {
        let mut out = Parsed::new();
        let mut section = String::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if let Some(s) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                section = s.to_string();
                continue;
            }
            let (k, v) = line.split_once('=').expect("key=value");
            out.entry(section.clone())
                .or_default()
                .entry(k.to_string())
                .or_default()
                .push(v.to_string());
        }
        out
    }

    /// A valid spec for VM `web`, as the NixOS module writes it, with
    /// `patch` merged over the top level.
    fn spec_json(patch: serde_json::Value) -> String {
        let mut v = serde_json::json!({
            "version": 1,
            "name": "web",
            "principal": {"user": "vm-web", "group": "vm-web"},
            "hypervisor": {"kind": "qemu", "binary": "/usr/bin/qemu-system-x86_64",
                           "accel": "kvm", "machine": "microvm"},
            "vcpus": 1,
            "memory_mib": 256,
            "kernel": "/srv/images/vmlinuz",
            "cmdline": "console=ttyS0",
            "credentials": [],
            "disks": [],
            "interfaces": [],
            "landlock": {"mode": "required", "read": [], "write": []},
            "keep_on_purge": ["identity"]
        });
        if let (Some(base), Some(extra)) = (v.as_object_mut(), patch.as_object()) {
            for (k, val) in extra {
                base.insert(k.clone(), val.clone());
            }
        }
        v.to_string()
    }

    fn spec_file(json: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().expect("temp file");
        std::io::Write::write_all(&mut f, json.as_bytes()).expect("write spec");
        f
    }

    fn dropin_args(name: &str, spec: &Path) -> RenderUnitArgs {
        RenderUnitArgs {
            dropin: Some(VmName::parse(name).unwrap()),
            spec: Some(spec.to_path_buf()),
            ..RenderUnitArgs::default()
        }
    }

    #[test]
    fn template_has_the_launcher_commands_and_hardening() {
        let text = render_unit(&RenderUnitArgs::default()).expect("render");
        let u = parse(&text);
        let svc = &u["Service"];
        assert_eq!(svc["Type"], ["exec"]);
        assert_eq!(svc["ExecStart"], ["/usr/local/bin/vmwarden-launch %i"]);
        assert_eq!(
            svc["ExecStartPost"],
            ["+/usr/local/bin/vmwarden wait-ready %i"]
        );
        assert_eq!(svc["ExecStop"], ["/usr/local/bin/vmwarden stop %i"]);
        assert_eq!(svc["ExecStopPost"], ["+/usr/local/bin/vmwarden-cleanup %i"]);
        assert_eq!(svc["RestrictNamespaces"], ["mnt"]);
        assert_eq!(svc["DeviceAllow"].len(), 4);
        assert!(!svc.contains_key("MemoryDenyWriteExecute"), "breaks TCG");
        assert!(!svc.contains_key("User"), "the launcher drops privileges");
        assert!(!u.contains_key("Install"));
    }

    #[test]
    fn keys_are_in_nixos_order() {
        // NixOS prints each section's keys in byte order; keeping the same
        // order here makes the two texts comparable line by line.
        for entries in [template("/b"), reap_report("/b"), target()] {
            for section in ["Unit", "Service", "Install"] {
                let keys: Vec<&str> = entries
                    .iter()
                    .filter(|en| en.0 == section)
                    .map(|en| en.1)
                    .collect();
                let mut sorted = keys.clone();
                sorted.sort();
                assert_eq!(keys, sorted, "[{section}] keys out of order");
            }
        }
    }

    #[test]
    fn bin_dir_is_used_and_checked() {
        let args = RenderUnitArgs {
            bin_dir: PathBuf::from("/opt/vmwarden/bin/"),
            ..RenderUnitArgs::default()
        };
        let text = render_unit(&args).expect("render");
        assert!(text.contains("ExecStart=/opt/vmwarden/bin/vmwarden-launch %i\n"));
        for bad in ["relative/bin", "/with space", "/per%cent", "/a/../b"] {
            let args = RenderUnitArgs {
                bin_dir: PathBuf::from(bad),
                ..RenderUnitArgs::default()
            };
            let err = render_unit(&args).expect_err(bad);
            assert!(err.to_string().contains(bad), "{err}");
        }
    }

    #[test]
    fn target_and_reap_report() {
        let t = parse(
            &render_unit(&RenderUnitArgs {
                target: true,
                ..RenderUnitArgs::default()
            })
            .expect("render"),
        );
        assert_eq!(t["Install"]["WantedBy"], ["multi-user.target"]);
        let r = parse(
            &render_unit(&RenderUnitArgs {
                reap_report: true,
                ..RenderUnitArgs::default()
            })
            .expect("render"),
        );
        assert_eq!(r["Service"]["ExecStart"], ["/usr/local/bin/vmwarden reap"]);
        assert_eq!(r["Service"]["Type"], ["oneshot"]);
    }

    #[test]
    fn dropin_loads_systemd_credentials_and_opens_writable_paths() {
        let f = spec_file(&spec_json(serde_json::json!({
            "credentials": [{"name": "db", "source": {"systemd": "db"}},
                            {"name": "tok", "source": {"path": "/run/secrets/tok"}}],
            "disks": [{"path": "/var/lib/vmwarden/web/root.img", "read_only": false},
                      {"path": "/srv/ro.img", "read_only": true}],
            "landlock": {"mode": "required", "read": [], "write": ["/srv/scratch"]}
        })));
        let text = render_unit(&dropin_args("web", f.path())).expect("render");
        let u = parse(&text);
        assert_eq!(
            u["Service"]["LoadCredential"],
            ["db:/etc/vmwarden/credentials/web/db"]
        );
        assert_eq!(
            u["Service"]["ReadWritePaths"],
            ["-/var/lib/vmwarden/web/root.img", "-/srv/scratch"]
        );
        assert!(!u.contains_key("Unit"));
    }

    #[test]
    fn dropin_grants_net_admin_and_netlink_only_to_vms_with_interfaces() {
        let plain = parse(
            &render_unit(&dropin_args(
                "web",
                spec_file(&spec_json(serde_json::json!({}))).path(),
            ))
            .expect("render"),
        );
        let svc = plain.get("Service").cloned().unwrap_or_default();
        assert!(!svc.contains_key("CapabilityBoundingSet"));
        assert!(!svc.contains_key("RestrictAddressFamilies"));
        let f = spec_file(&spec_json(serde_json::json!({
            "interfaces": [{"tap": "vmw-web0", "bridge": "br0", "mac": "02:00:00:00:00:01"}]
        })));
        let u = parse(&render_unit(&dropin_args("web", f.path())).expect("render"));
        assert_eq!(u["Service"]["CapabilityBoundingSet"], ["CAP_NET_ADMIN"]);
        assert_eq!(u["Service"]["RestrictAddressFamilies"], ["AF_NETLINK"]);
    }

    #[test]
    fn dropin_refuses_what_the_launcher_refuses() {
        let cases: Vec<(String, &str)> = vec![
            ("{".to_string(), "not valid"),
            (spec_json(serde_json::json!({"name": "db"})), "field `name`"),
            (spec_json(serde_json::json!({"bogus": 1})), "bogus"),
            (
                spec_json(serde_json::json!({"credentials": [
                    {"name": "abcdefghijklmnopqrstuvwxyz0123", "source": {"systemd": "x"}}]})),
                "credentials",
            ),
            (
                spec_json(serde_json::json!({"disks": [{"path": "rel.img"}]})),
                "disks[0].path",
            ),
            (
                spec_json(serde_json::json!({"disks": [{"path": "/a b.img"}]})),
                "disks[0].path",
            ),
            (
                spec_json(serde_json::json!({"landlock": {"mode": "required", "write": ["/x%y"]}})),
                "landlock.write[0]",
            ),
        ];
        for (json, want) in &cases {
            let f = spec_file(json);
            let err = render_unit(&dropin_args("web", f.path())).expect_err(json);
            let msg = err.to_string();
            assert!(msg.contains(want), "{json}: {msg}");
            assert!(
                msg.contains(&f.path().display().to_string()),
                "{json}: {msg}"
            );
        }
    }

    #[test]
    fn dropin_checks_the_name_and_reports_missing_spec() {
        // The name is checked where it is parsed: `--dropin Bad_Name` never
        // becomes a `RenderUnitArgs` (tests/names.rs runs the binary).
        let err = "Bad_Name".parse::<VmName>().expect_err("bad name");
        assert!(err.to_string().contains("^[a-z][a-z0-9-]{0,31}$"), "{err}");
        let err = render_unit(&RenderUnitArgs {
            dropin: Some(VmName::parse("web").unwrap()),
            config_dir: Some(PathBuf::from("/nonexistent/vmwarden/vms")),
            ..RenderUnitArgs::default()
        })
        .expect_err("missing spec");
        assert!(
            err.to_string()
                .contains("/nonexistent/vmwarden/vms/web.json"),
            "{err}"
        );
    }

    #[test]
    fn unit_safe_paths() {
        assert!(unit_safe_path("/var/lib/vmwarden/web/root.img"));
        assert!(unit_safe_path("/"));
        for bad in [
            "rel", "/a b", "/a%i", "/a\"b", "/a\\b", "/a//b", "/a/", "/a/./b", "/a/../b",
        ] {
            assert!(!unit_safe_path(bad), "{bad}");
        }
    }
}
