//! cloud-hypervisor's snapshot and restore, as vmwarden drives them.
//!
//! Capture, through its API (`control/api.sock`): `vm.pause`, then
//! `vm.snapshot` with `destination_url=file://DIR`, an existing empty
//! directory the hypervisor writes as the principal (`config.json`,
//! `state.json`, one `memory-ranges` file); the VM is then shut down. A
//! failed `vm.snapshot` is followed by `vm.resume`: the VM runs on.
//!
//! Restore: cloud-hypervisor takes the VM's whole configuration from the
//! snapshot's `config.json`. Its command line then holds no VM option at
//! all (`--kernel`, `--disk`, `--serial`… belong to the group that
//! `--restore` cannot join): only `--api-socket`, `--event-monitor`,
//! `--seccomp` and `--restore source_url=file://DIR,prefault=on,net_fds=[…]`, the tap
//! fds root opened now handed over under the ids the snapshot gave its
//! nets. Every device path comes from `config.json`, unchecked by
//! cloud-hypervisor, so the launcher reads it first (root, from the
//! principal's directory, `openat` with no symlink followed, bounded) and
//! compares each device with what [`super::cloud_hypervisor_argv`] would
//! pass now ([`check`]): a mismatch is refused by field name.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use super::api::{self, ApiError};
use super::snapshot_paths::{self, Field, Mismatch};
use super::{tap_fds_of, Layout};
use crate::config::paths::{virtiofs_socket_name, VSOCK_SOCKET};
use crate::config::spec::{ShareProto, Spec};

pub const PAUSE: &str = "/api/v1/vm.pause";
pub const SNAPSHOT: &str = "/api/v1/vm.snapshot";
pub const RESUME: &str = "/api/v1/vm.resume";
/// The snapshot's configuration file, in the snapshot directory.
pub const CONFIG_JSON: &str = "config.json";
/// Largest `config.json` root reads (a VM's config is a few KiB).
pub const MAX_CONFIG: u64 = 1 << 20;

/// A `file://` URL of an absolute directory path.
pub fn file_url(dir: &Path) -> String {
    format!("file://{}", dir.display())
}

/// `vm.snapshot`'s body.
pub fn snapshot_body(dir: &Path) -> String {
    serde_json::json!({ "destination_url": file_url(dir) }).to_string()
}

/// Why a capture failed; the VM was resumed when `resumed` says so.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("pause: {0}")]
    Pause(#[source] ApiError),
    #[error("snapshot (the VM was resumed: {resumed}): {source}")]
    Snapshot {
        #[source]
        source: ApiError,
        resumed: bool,
    },
}

/// Pause, then snapshot into `dir` (the VM is left paused on success;
/// the caller stops it). A failed snapshot resumes the VM.
pub fn capture(sock: &Path, dir: &Path, timeout: Duration) -> Result<(), CaptureError> {
    api::expect_ok(sock, "PUT", PAUSE, None, timeout).map_err(CaptureError::Pause)?;
    let body = snapshot_body(dir);
    if let Err(source) = api::expect_ok(sock, "PUT", SNAPSHOT, Some(&body), timeout) {
        let resumed = api::expect_ok(sock, "PUT", RESUME, None, timeout).is_ok();
        return Err(CaptureError::Snapshot { source, resumed });
    }
    Ok(())
}

/// What of `config.json` the check reads (serde ignores the rest; the
/// whole file is also scanned for stray paths).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct SnapshotConfig {
    pub payload: Payload,
    pub disks: Option<Vec<Disk>>,
    pub net: Option<Vec<Net>>,
    pub fs: Option<Vec<Fs>>,
    pub vsock: Option<Vsock>,
    pub devices: Option<Vec<PathOnly>>,
    pub serial: Console,
    pub console: Console,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Payload {
    pub kernel: Option<String>,
    pub initramfs: Option<String>,
    pub firmware: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Disk {
    pub path: Option<String>,
    pub readonly: bool,
    pub vhost_user: bool,
    pub vhost_socket: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Net {
    pub id: Option<String>,
    pub tap: Option<String>,
    pub mac: Option<String>,
    pub vhost_user: bool,
    pub vhost_socket: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Fs {
    pub tag: Option<String>,
    pub socket: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Vsock {
    pub cid: Option<u64>,
    pub socket: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct PathOnly {
    pub path: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Console {
    pub mode: Option<String>,
    pub file: Option<String>,
    pub socket: Option<String>,
}

fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// The device fields [`super::cloud_hypervisor_argv`] gives for `spec`
/// now, named as `config.json` names them.
pub fn fields_now(spec: &Spec, control_dir: &Path) -> Vec<Field> {
    let mut f = vec![
        Field::new("payload.kernel", Some(s(&spec.kernel))),
        Field::new("payload.initramfs", spec.initrd.as_deref().map(s)),
        Field::new("payload.firmware", None::<String>),
        Field::new("serial.mode", Some("Tty")),
        Field::new("console.mode", Some("Off")),
    ];
    for (i, d) in spec.disks.iter().enumerate() {
        f.push(Field::new(format!("disks[{i}].path"), Some(s(&d.path))));
        f.push(Field::new(
            format!("disks[{i}].readonly"),
            Some(d.read_only.to_string()),
        ));
        f.push(Field::new(format!("disks[{i}].vhost_user"), Some("false")));
    }
    for i in 0..spec.interfaces.len() {
        f.push(Field::new(
            format!("net[{i}].mac"),
            Some(spec.guest_mac(i).to_string()),
        ));
        // Tap fds, never a tap name cloud-hypervisor would open itself.
        f.push(Field::new(format!("net[{i}].tap"), None::<String>));
        f.push(Field::new(format!("net[{i}].vhost_user"), Some("false")));
    }
    for (i, sh) in spec
        .shares
        .iter()
        .filter(|s| s.proto == ShareProto::Virtiofs)
        .enumerate()
    {
        f.push(Field::new(format!("fs[{i}].tag"), Some(sh.tag.clone())));
        f.push(Field::new(
            format!("fs[{i}].socket"),
            Some(s(&control_dir.join(virtiofs_socket_name(&sh.tag)))),
        ));
    }
    if let Some(v) = &spec.vsock {
        f.push(Field::new("vsock.cid", Some(v.cid.to_string())));
        f.push(Field::new(
            "vsock.socket",
            Some(s(&control_dir.join(VSOCK_SOCKET))),
        ));
    }
    for (i, a) in spec.devices.iter().filter_map(|d| d.pci()).enumerate() {
        f.push(Field::new(
            format!("devices[{i}].path"),
            Some(format!("/sys/bus/pci/devices/{a}/")),
        ));
    }
    f
}

/// The same fields as the snapshot's `config.json` has them.
pub fn fields_of(c: &SnapshotConfig) -> Vec<Field> {
    let mut f = vec![
        Field::new("payload.kernel", c.payload.kernel.clone()),
        Field::new("payload.initramfs", c.payload.initramfs.clone()),
        Field::new("payload.firmware", c.payload.firmware.clone()),
        Field::new("serial.mode", c.serial.mode.clone()),
        Field::new("console.mode", c.console.mode.clone()),
    ];
    for (i, d) in c.disks.iter().flatten().enumerate() {
        f.push(Field::new(format!("disks[{i}].path"), d.path.clone()));
        f.push(Field::new(
            format!("disks[{i}].readonly"),
            Some(d.readonly.to_string()),
        ));
        f.push(Field::new(
            format!("disks[{i}].vhost_user"),
            Some(d.vhost_user.to_string()),
        ));
    }
    for (i, n) in c.net.iter().flatten().enumerate() {
        f.push(Field::new(format!("net[{i}].mac"), n.mac.clone()));
        f.push(Field::new(format!("net[{i}].tap"), n.tap.clone()));
        f.push(Field::new(
            format!("net[{i}].vhost_user"),
            Some(n.vhost_user.to_string()),
        ));
    }
    for (i, x) in c.fs.iter().flatten().enumerate() {
        f.push(Field::new(format!("fs[{i}].tag"), x.tag.clone()));
        f.push(Field::new(format!("fs[{i}].socket"), x.socket.clone()));
    }
    if let Some(v) = &c.vsock {
        f.push(Field::new("vsock.cid", v.cid.map(|c| c.to_string())));
        f.push(Field::new("vsock.socket", v.socket.clone()));
    }
    for (i, d) in c.devices.iter().flatten().enumerate() {
        f.push(Field::new(format!("devices[{i}].path"), d.path.clone()));
    }
    f
}

/// Why a snapshot's `config.json` cannot be restored.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{file}: not cloud-hypervisor's snapshot configuration: {source}")]
    Parse {
        file: String,
        #[source]
        source: serde_json::Error,
    },
    /// A net id that is not a plain name: it is written into
    /// `--restore …,net_fds=[ID@[FDS]]`, where a `,` or `]` would end
    /// the list and add options (a second `source_url`, which
    /// cloud-hypervisor takes over the first: a directory never checked).
    #[error("{file}: net[{index}].id {id:?} is not a plain name (letters, digits, `_`, `-`, at most 64): refused, it would be read as options of --restore")]
    NetId {
        file: String,
        index: usize,
        id: String,
    },
    #[error("{file}: {source}")]
    Mismatch {
        file: String,
        #[source]
        source: Mismatch,
    },
}

/// What a checked snapshot tells the restore: its nets' ids, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    pub net_ids: Vec<String>,
}

/// Parse `config.json` (`bytes`, read by root from `file`) and compare
/// its devices with what the launcher would pass now. The credentials'
/// fw_cfg files are allowed paths (the tmpfs is built again at this
/// start, at the same place).
pub fn check(
    spec: &Spec,
    layout: &Layout,
    file: &str,
    bytes: &[u8],
) -> Result<Checked, ConfigError> {
    check_paths(
        spec,
        &layout.control_dir,
        &layout.credentials_dir,
        file,
        bytes,
    )
}

/// [`check`] with the VM's `control/` and credentials directories.
pub fn check_paths(
    spec: &Spec,
    control_dir: &Path,
    credentials_dir: &Path,
    file: &str,
    bytes: &[u8],
) -> Result<Checked, ConfigError> {
    let parse = |source| ConfigError::Parse {
        file: file.to_string(),
        source,
    };
    let raw: serde_json::Value = serde_json::from_slice(bytes).map_err(parse)?;
    let c: SnapshotConfig = serde_json::from_value(raw.clone()).map_err(parse)?;
    let creds: Vec<String> = spec
        .credentials
        .iter()
        .map(|c| s(&credentials_dir.join(&c.name)))
        .collect();
    snapshot_paths::check(&raw, &fields_of(&c), &fields_now(spec, control_dir), &creds).map_err(
        |source| ConfigError::Mismatch {
            file: file.to_string(),
            source,
        },
    )?;
    let net_ids = net_ids(&c);
    if let Some((index, id)) = net_ids.iter().enumerate().find(|(_, id)| !plain_id(id)) {
        return Err(ConfigError::NetId {
            file: file.to_string(),
            index,
            id: id.clone(),
        });
    }
    Ok(Checked { net_ids })
}

/// The nets' ids of `c`, in order (`_netI` for one without).
pub fn net_ids(c: &SnapshotConfig) -> Vec<String> {
    c.net
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, n)| n.id.clone().unwrap_or_else(|| format!("_net{i}")))
        .collect()
}

/// An id that can stand in `--restore`'s option string as itself:
/// letters, digits, `_` and `-`, 1 to 64 of them.
pub fn plain_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The restore argv: no VM option (the snapshot holds the VM), the tap
/// fds root opened for this start under the snapshot's net ids, the
/// event monitor when the launcher gives one, cloud-hypervisor's own
/// seccomp filter on, and the VM resumed once restored. The spec's
/// `extra_args` are not passed: they are VM options `--restore` refuses.
pub fn restore_argv(spec: &Spec, layout: &Layout, dir: &Path, checked: &Checked) -> Vec<String> {
    let mut a = vec![
        s(&spec.hypervisor.binary),
        "--api-socket".into(),
        format!("path={}", s(&layout.api_socket)),
    ];
    let mut restore = format!("source_url={},prefault=on", file_url(dir));
    let nets: Vec<String> = (0..layout.tap_fds.len())
        .map(|i| {
            let fds: Vec<String> = tap_fds_of(layout, i).iter().map(i32::to_string).collect();
            let id = checked
                .net_ids
                .get(i)
                .filter(|id| plain_id(id))
                .cloned()
                .unwrap_or_else(|| format!("_net{i}"));
            format!("{id}@[{}]", fds.join(","))
        })
        .collect();
    if !nets.is_empty() {
        restore.push_str(&format!(",net_fds=[{}]", nets.join(",")));
    }
    restore.push_str(",resume=true");
    if let Some(fd) = layout.event_monitor_fd {
        a.extend(["--event-monitor".into(), format!("fd={fd}")]);
    }
    a.extend(["--seccomp".into(), "true".into()]);
    a.extend(["--restore".into(), restore]);
    a
}

/// What of a spec cloud-hypervisor cannot snapshot, by field: virtiofs
/// shares (virtiofsd keeps the guest's open files, which no snapshot
/// holds), passed-through devices (VFIO state is the device's), and
/// hugepage memory (restored by copy into anonymous memory).
pub fn refused_fields(spec: &Spec) -> Vec<&'static str> {
    let mut r = Vec::new();
    if spec.shares.iter().any(|s| s.proto == ShareProto::Virtiofs) {
        r.push("shares");
    }
    if !spec.devices.is_empty() {
        r.push("devices");
    }
    if spec.hugepage_mem {
        r.push("hugepage_mem");
    }
    r
}

#[cfg(test)]
#[path = "snapshot_ch_tests.rs"]
mod tests;
