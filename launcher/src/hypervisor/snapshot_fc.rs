//! firecracker's snapshot and restore, as vmwarden drives them.
//!
//! Capture, through its API (`control/api.sock`): `PATCH /vm
//! {"state":"Paused"}`, then `PUT /snapshot/create` (a full snapshot: the
//! VM state file and the guest memory file, both written by firecracker
//! as the principal into the snapshot directory); the VM is then ended.
//! A failed create is followed by `PATCH /vm {"state":"Resumed"}`.
//!
//! Restore: `PUT /snapshot/load` must be firecracker's first request,
//! before any configuration, so firecracker is started without
//! `--config-file` ([`restore_argv`]) and something must send the load
//! once it listens: the launcher `execve`s firecracker and is gone, so a
//! helper of its own does, in the sandbox ([`restore`]). The load names
//! no device: firecracker opens the drives, taps (by name) and vsock
//! socket its binary VM state recorded, unchecked. Its state file is a
//! versioned binary serialization, not parsed here; instead the load
//! leaves the VM paused (`resume_vm: false`), `GET /vm/config` then shows
//! the devices the VM now has, each compared with what
//! [`super::firecracker_config`] would give now ([`check_config`]), and
//! only a match is resumed. A mismatch leaves the guest paused, never
//! run, for the helper to end. Root also keeps what was given at capture
//! in its match record, compared before the start.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use super::api::{self, ApiError};
use super::snapshot_paths::{self, Field, Mismatch};
use crate::config::spec::Spec;

pub const VM: &str = "/vm";
pub const CREATE: &str = "/snapshot/create";
pub const LOAD: &str = "/snapshot/load";
pub const VM_CONFIG: &str = "/vm/config";
/// The VM state file and the guest memory file, in the snapshot
/// directory.
pub const VMSTATE: &str = "vmstate";
pub const MEMORY: &str = "memory";

pub fn pause_body() -> &'static str {
    r#"{"state":"Paused"}"#
}

pub fn resume_body() -> &'static str {
    r#"{"state":"Resumed"}"#
}

/// `PUT /snapshot/create`'s body: a full snapshot into `dir`.
pub fn create_body(dir: &Path) -> String {
    serde_json::json!({
        "snapshot_type": "Full",
        "snapshot_path": dir.join(VMSTATE),
        "mem_file_path": dir.join(MEMORY),
    })
    .to_string()
}

/// `PUT /snapshot/load`'s body: the memory file mapped privately
/// (`File`), the VM left paused for the check.
pub fn load_body(dir: &Path) -> String {
    serde_json::json!({
        "snapshot_path": dir.join(VMSTATE),
        "mem_backend": { "backend_type": "File", "backend_path": dir.join(MEMORY) },
        "resume_vm": false,
    })
    .to_string()
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

/// Pause, then snapshot into `dir` (left paused on success; the caller
/// ends it). A failed snapshot resumes the VM.
pub fn capture(sock: &Path, dir: &Path, timeout: Duration) -> Result<(), CaptureError> {
    api::expect_ok(sock, "PATCH", VM, Some(pause_body()), timeout).map_err(CaptureError::Pause)?;
    if let Err(source) = api::expect_ok(sock, "PUT", CREATE, Some(&create_body(dir)), timeout) {
        let resumed = api::expect_ok(sock, "PATCH", VM, Some(resume_body()), timeout).is_ok();
        return Err(CaptureError::Snapshot { source, resumed });
    }
    Ok(())
}

/// What of `GET /vm/config` the check reads.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct VmConfig {
    #[serde(rename = "boot-source")]
    pub boot_source: BootSource,
    pub drives: Vec<Drive>,
    #[serde(rename = "network-interfaces")]
    pub network_interfaces: Vec<Nic>,
    pub vsock: Option<Vsock>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct BootSource {
    pub kernel_image_path: Option<String>,
    pub initrd_path: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Drive {
    pub drive_id: Option<String>,
    pub path_on_host: Option<String>,
    pub is_read_only: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Nic {
    pub iface_id: Option<String>,
    pub host_dev_name: Option<String>,
    pub guest_mac: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Vsock {
    pub guest_cid: Option<u64>,
    pub uds_path: Option<String>,
}

fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// The same fields as the restored VM has them.
pub fn fields_of(c: &VmConfig) -> Vec<Field> {
    let mut f = Vec::new();
    for (i, d) in c.drives.iter().enumerate() {
        let id = d.drive_id.clone().unwrap_or_else(|| format!("#{i}"));
        let name = |k: &str| format!("drives[{id}].{k}");
        f.push(Field::new(name("path_on_host"), d.path_on_host.clone()));
        f.push(Field::new(
            name("is_read_only"),
            d.is_read_only.map(|b| b.to_string()),
        ));
    }
    for (i, n) in c.network_interfaces.iter().enumerate() {
        let id = n.iface_id.clone().unwrap_or_else(|| format!("#{i}"));
        let name = |k: &str| format!("network-interfaces[{id}].{k}");
        f.push(Field::new(name("host_dev_name"), n.host_dev_name.clone()));
        f.push(Field::new(name("guest_mac"), n.guest_mac.clone()));
    }
    if let Some(v) = &c.vsock {
        f.push(Field::new(
            "vsock.guest_cid",
            v.guest_cid.map(|c| c.to_string()),
        ));
        f.push(Field::new("vsock.uds_path", v.uds_path.clone()));
    }
    f
}

/// Compare the restored VM's configuration (`GET /vm/config`'s body)
/// with the spec's devices. Paths allowed beyond the device fields: the
/// boot source's (not opened on restore; root's match record checks
/// them).
pub fn check_config(spec: &Spec, control_dir: &Path, body: &str) -> Result<(), RestoreError> {
    check_against(&super::firecracker_config(spec, control_dir), body)
}

/// [`check_config`] against `now`, the config file the launcher rendered
/// for this start (`control/firecracker.json`, same keys).
pub fn check_against(now: &str, body: &str) -> Result<(), RestoreError> {
    let parse = |e: serde_json::Error| RestoreError::Parse(e.to_string());
    let raw: serde_json::Value = serde_json::from_str(body).map_err(parse)?;
    let c: VmConfig = serde_json::from_value(raw.clone()).map_err(parse)?;
    let n: VmConfig = serde_json::from_str(now).map_err(parse)?;
    let boot: Vec<String> = [&n.boot_source.kernel_image_path, &n.boot_source.initrd_path]
        .into_iter()
        .flatten()
        .cloned()
        .collect();
    snapshot_paths::check(&raw, &fields_of(&c), &fields_of(&n), &boot)
        .map_err(RestoreError::Mismatch)
}

/// Why a restore did not resume the VM.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("load: {0}")]
    Load(#[source] ApiError),
    #[error("read the restored VM's configuration: {0}")]
    Config(#[source] ApiError),
    #[error("the restored VM's configuration (GET /vm/config) is not firecracker's: {0}")]
    Parse(String),
    #[error("{0}")]
    Mismatch(#[source] Mismatch),
    #[error("resume: {0}")]
    Resume(#[source] ApiError),
}

/// The restore, over the API of a firecracker started by
/// [`restore_argv`]: wait until it answers (up to `timeout`), load the
/// snapshot paused, check its devices against `spec`'s, resume. On `Err`
/// the VM was never resumed.
pub fn restore(
    sock: &Path,
    dir: &Path,
    spec: &Spec,
    control_dir: &Path,
    timeout: Duration,
) -> Result<(), RestoreError> {
    load_checked(
        sock,
        dir,
        &super::firecracker_config(spec, control_dir),
        timeout,
    )
}

/// [`load_paused_checked`], then the resume.
pub fn load_checked(
    sock: &Path,
    dir: &Path,
    now: &str,
    timeout: Duration,
) -> Result<(), RestoreError> {
    load_paused_checked(sock, dir, now, timeout)?;
    resume(sock, timeout)
}

/// Resume a VM loaded paused.
pub fn resume(sock: &Path, timeout: Duration) -> Result<(), RestoreError> {
    api::expect_ok(sock, "PATCH", VM, Some(resume_body()), timeout)
        .map_err(RestoreError::Resume)?;
    Ok(())
}

/// The snapshot in `dir` loaded paused and checked against `now`, a
/// rendered firecracker config; the VM is left paused (a mismatch too).
pub fn load_paused_checked(
    sock: &Path,
    dir: &Path,
    now: &str,
    timeout: Duration,
) -> Result<(), RestoreError> {
    let end = std::time::Instant::now() + timeout;
    while !api::answers(sock) && std::time::Instant::now() < end {
        std::thread::sleep(Duration::from_millis(5));
    }
    api::expect_ok(sock, "PUT", LOAD, Some(&load_body(dir)), timeout)
        .map_err(RestoreError::Load)?;
    let cfg =
        api::expect_ok(sock, "GET", VM_CONFIG, None, timeout).map_err(RestoreError::Config)?;
    check_against(now, &cfg.body)
}

/// The restore argv: the API socket alone, no `--config-file` (a load
/// must be the first request).
pub fn restore_argv(spec: &Spec, api_socket: &Path) -> Vec<String> {
    let mut a = vec![
        s(&spec.hypervisor.binary),
        "--api-sock".into(),
        s(api_socket),
    ];
    a.extend(spec.hypervisor.extra_args.iter().cloned());
    a
}

/// What of a spec firecracker cannot snapshot here, by field: hugepage
/// memory (its `File` memory backend does not take hugepages; only a
/// userfaultfd handler would).
pub fn refused_fields(spec: &Spec) -> Vec<&'static str> {
    let mut r = Vec::new();
    if spec.hugepage_mem {
        r.push("hugepage_mem");
    }
    r
}

#[cfg(test)]
#[path = "snapshot_fc_tests.rs"]
mod tests;
