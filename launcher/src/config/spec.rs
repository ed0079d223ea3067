//! The launch spec: `/etc/vmwarden/vms/NAME.json`, version 1.
//!
//! Field names are a contract shared with the NixOS module and operators'
//! tools: extend, never rename. Unknown fields are rejected. `load` reads and
//! validates; nothing on the host is created or changed by this module.

use std::ffi::OsStr;
use std::io::Read;
use std::os::fd::BorrowedFd;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::sys::stat::FileStat;
use serde::{Deserialize, Serialize};

use crate::config::extra_args;
use crate::config::files::{open_probed_at, open_regular_at, OpenError};
use crate::config::names::{
    check_abs_normalised, BridgeName, CredentialName, Mac, NameError, TapName, VmName,
};
use crate::config::rules;

/// Largest spec file accepted.
pub const MAX_SPEC_BYTES: u64 = 64 * 1024;
/// fw_cfg file names are at most 55 bytes (56 with the NUL) in QEMU.
pub const FW_CFG_NAME_MAX: usize = rules::FW_CFG_NAME_MAX;
/// Prefix systemd's guest side reads credentials from.
pub const FW_CFG_CREDENTIAL_PREFIX: &str = rules::FW_CFG_CREDENTIAL_PREFIX;
/// Largest credential file copied into the VM's tmpfs.
pub const MAX_CREDENTIAL_BYTES: u64 = 1024 * 1024;
/// Longest kernel command line accepted.
pub const MAX_CMDLINE_BYTES: usize = 4096;
pub const MAX_VCPUS: u32 = 255;
pub const MIN_MEMORY_MIB: u64 = 16;
pub const MAX_MEMORY_MIB: u64 = 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("cannot read spec {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("spec {path} {cause}; refusing to read it")]
    NotRegular { path: PathBuf, cause: OpenError },
    #[error("spec {path} is {size} bytes; the limit is {MAX_SPEC_BYTES}")]
    TooLarge { path: PathBuf, size: u64 },
    #[error("spec {path} is not valid: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("spec {path}: field `{field}` {reason}")]
    Invalid {
        path: PathBuf,
        field: String,
        reason: String,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    pub version: u32,
    pub name: VmName,
    pub principal: PrincipalSpec,
    pub hypervisor: HypervisorSpec,
    pub vcpus: u32,
    pub memory_mib: u64,
    pub kernel: PathBuf,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initrd: Option<PathBuf>,
    #[serde(default)]
    pub cmdline: String,
    #[serde(default)]
    pub credentials: Vec<CredentialSpec>,
    #[serde(default)]
    pub disks: Vec<DiskSpec>,
    #[serde(default)]
    pub interfaces: Vec<InterfaceSpec>,
    #[serde(default)]
    pub landlock: LandlockSpec,
    #[serde(default = "default_keep_on_purge")]
    pub keep_on_purge: Vec<String>,
    /// Host directories the guest mounts (shares). Absent = none; the
    /// new fields are left out when unset, so an older spec round-trips
    /// byte for byte.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shares: Vec<ShareSpec>,
    /// The daemon serving `virtiofs` shares (one per share).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtiofsd: Option<VirtiofsdSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vsock: Option<VsockSpec>,
}

/// Longest share tag: QEMU's 9p `mount_tag` limit (virtio-fs allows 36).
pub const SHARE_TAG_MAX: usize = 31;
/// Longest disk serial: virtio-blk's `VIRTIO_BLK_ID_BYTES`.
pub const DISK_SERIAL_MAX: usize = 20;
/// vsock CIDs 0 (hypervisor), 1 (loopback) and 2 (host) are reserved, and
/// `u32::MAX` is `VMADDR_CID_ANY`.
pub const VSOCK_CID_MIN: u64 = 3;
pub const VSOCK_CID_MAX: u64 = 4_294_967_294;
/// The read-only host store a NixOS guest boots from.
pub const NIX_STORE: &str = "/nix/store";

/// Share tags and disk serials: `[A-Za-z0-9_.-]`, which is safe inside
/// QEMU's and cloud-hypervisor's `key=value,...` arguments.
fn tag_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b == b'-'
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub enum ShareProto {
    #[serde(rename = "virtiofs")]
    Virtiofs,
    #[serde(rename = "9p")]
    NineP,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ShareSpec {
    pub tag: String,
    pub source: PathBuf,
    pub proto: ShareProto,
    #[serde(default)]
    pub read_only: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct VirtiofsdSpec {
    pub binary: PathBuf,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum VsockBackend {
    /// vhost-user-vsock served by a daemon run as the principal (QEMU), or
    /// cloud-hypervisor's and firecracker's own hybrid vsock: a unix socket
    /// in `control/`.
    User,
    /// The kernel's vhost-vsock: `/dev/vhost-vsock` opened by root.
    Vhost,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct VsockSpec {
    pub cid: u64,
    pub backend: VsockBackend,
    /// vhost-device-vsock, for QEMU with the user backend only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binary: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum DiskFormat {
    #[default]
    Raw,
    Qcow2,
}

impl DiskFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            DiskFormat::Raw => "raw",
            DiskFormat::Qcow2 => "qcow2",
        }
    }
}

/// `disks[].create.fs_type`. Read as any string, so that a file system
/// vmwarden cannot make is refused by its field (`validate_disks`) rather
/// than by the parser with no field name.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum FsType {
    Ext4,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum FsTypeField {
    Known(FsType),
    Unsupported(String),
}

impl FsTypeField {
    /// The file system to make, or `None` for one vmwarden cannot make.
    pub fn known(&self) -> Option<FsType> {
        match self {
            FsTypeField::Known(f) => Some(*f),
            FsTypeField::Unsupported(_) => None,
        }
    }
}

/// `disks[].create`: the launcher makes the image (sparse, the principal's,
/// 0600) when it does not exist.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CreateSpec {
    pub size_mib: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fs_type: Option<FsTypeField>,
}

impl CreateSpec {
    /// The file system to make (validated: never an unsupported one).
    pub fn fs(&self) -> Option<FsType> {
        self.fs_type.as_ref().and_then(FsTypeField::known)
    }
}

fn default_keep_on_purge() -> Vec<String> {
    vec!["identity".to_string()]
}

/// `{"user": "vm-web", "group": "vm-web"}` or `{"uid": 61000, "gid": 61000}`
/// (a name and a number may be mixed: one of user/uid, one of group/gid).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PrincipalSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum HypervisorKind {
    Qemu,
    CloudHypervisor,
    Firecracker,
}

impl HypervisorKind {
    pub fn as_str(self) -> &'static str {
        match self {
            HypervisorKind::Qemu => "qemu",
            HypervisorKind::CloudHypervisor => "cloud-hypervisor",
            HypervisorKind::Firecracker => "firecracker",
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Accel {
    Kvm,
    Tcg,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Machine {
    Microvm,
    Pc,
    Q35,
    /// aarch64's QEMU machine (qemu-system-aarch64).
    Virt,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HypervisorSpec {
    pub kind: HypervisorKind,
    pub binary: PathBuf,
    #[serde(default = "default_accel")]
    pub accel: Accel,
    #[serde(default = "default_machine")]
    pub machine: Machine,
    /// The hypervisor's own seccomp filter (QEMU's `-sandbox`): required
    /// by default; a QEMU built without it is refused unless this says
    /// "best-effort". (cloud-hypervisor and firecracker always run theirs.)
    #[serde(default, skip_serializing_if = "SandboxMode::is_default")]
    pub seccomp: SandboxMode,
    /// Passed after vmwarden's own arguments; `extra_args::problems` lists
    /// what is refused (the escape hatch's limits).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_args: Vec<String>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum SandboxMode {
    /// Refuse a hypervisor that cannot apply its own seccomp filter.
    #[default]
    Required,
    /// Run it without its own filter when it has none (the launcher's
    /// filter, Landlock and the principal still apply), with a warning.
    BestEffort,
}

impl SandboxMode {
    pub fn is_default(&self) -> bool {
        *self == SandboxMode::Required
    }
}

fn default_accel() -> Accel {
    Accel::Kvm
}
fn default_machine() -> Machine {
    Machine::Microvm
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CredentialSpec {
    pub name: CredentialName,
    pub source: CredentialSource,
}

/// `{"systemd": "NAME"}` reads `$CREDENTIALS_DIRECTORY/NAME` (LoadCredential=);
/// `{"path": "/abs"}` reads a root-owned file.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub enum CredentialSource {
    Systemd(CredentialName),
    Path(PathBuf),
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DiskSpec {
    pub path: PathBuf,
    #[serde(default)]
    pub read_only: bool,
    /// Absent = raw.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<DiskFormat>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create: Option<CreateSpec>,
}

impl DiskSpec {
    pub fn format(&self) -> DiskFormat {
        self.format.unwrap_or_default()
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct InterfaceSpec {
    pub tap: TapName,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bridge: Option<BridgeName>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<Mac>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum LandlockMode {
    /// Refuse to run without Landlock.
    #[default]
    Required,
    /// Apply what the kernel supports and log what could not be applied.
    BestEffort,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct LandlockSpec {
    #[serde(default)]
    pub mode: LandlockMode,
    #[serde(default)]
    pub read: Vec<PathBuf>,
    #[serde(default)]
    pub write: Vec<PathBuf>,
}

impl Spec {
    /// Parse from bytes without touching the file system beyond nothing.
    /// The name types refuse a bad name here, reported as an invalid field.
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<Spec, SpecError> {
        serde_json::from_slice(bytes).map_err(|source| match refused_name(bytes, &source) {
            Some((field, e)) => SpecError::Invalid {
                path: path.to_path_buf(),
                field,
                reason: e.reason(),
            },
            None => SpecError::Parse {
                path: path.to_path_buf(),
                source,
            },
        })
    }

    /// Read (size-capped) and parse, without validating.
    pub fn read(path: &Path) -> Result<Spec, SpecError> {
        Spec::parse(path, &Spec::read_bytes(path)?)
    }

    /// The spec file's bytes, size-capped: what a launch keeps a copy of,
    /// and what `status` compares that copy with.
    pub fn read_bytes(path: &Path) -> Result<Vec<u8>, SpecError> {
        // Never blocks: a FIFO, socket or device at the spec path is refused
        // at once (the path may be a symlink, into the Nix store on NixOS).
        Spec::read_opened(path, open_regular_at(None, path.as_os_str(), true))
    }

    /// [`Spec::read_bytes`] of a spec file the caller has probed itself:
    /// `probe` is the stat of an `O_PATH` open of `dir/name` that is still
    /// open (a trusted walk's last step). `dir/name` is opened for reading
    /// without following a link, and must be that inode.
    pub fn read_bytes_probed(
        path: &Path,
        dir: BorrowedFd<'_>,
        name: &OsStr,
        probe: &FileStat,
    ) -> Result<Vec<u8>, SpecError> {
        Spec::read_opened(path, open_probed_at(Some(dir), name, false, probe))
    }

    fn read_opened(
        path: &Path,
        opened: Result<(std::fs::File, FileStat), OpenError>,
    ) -> Result<Vec<u8>, SpecError> {
        let read_err = |source| SpecError::Read {
            path: path.to_path_buf(),
            source,
        };
        let (f, st) = opened.map_err(|e| match e {
            OpenError::Sys(errno) => read_err(std::io::Error::from_raw_os_error(errno as i32)),
            cause => SpecError::NotRegular {
                path: path.to_path_buf(),
                cause,
            },
        })?;
        let len = u64::try_from(st.st_size).unwrap_or(0);
        if len > MAX_SPEC_BYTES {
            return Err(SpecError::TooLarge {
                path: path.to_path_buf(),
                size: len,
            });
        }
        let mut bytes = Vec::with_capacity(len as usize);
        f.take(MAX_SPEC_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(read_err)?;
        if bytes.len() as u64 > MAX_SPEC_BYTES {
            return Err(SpecError::TooLarge {
                path: path.to_path_buf(),
                size: bytes.len() as u64,
            });
        }
        Ok(bytes)
    }

    /// Read, parse and validate every field, including the files the spec
    /// names (kernel, initrd, hypervisor binary, disks). `expected_name` is
    /// the unit instance name: the spec must describe that VM.
    pub fn load(path: &Path, expected_name: &VmName) -> Result<Spec, SpecError> {
        Spec::load_with_bytes(path, expected_name).map(|(spec, _)| spec)
    }

    /// [`Spec::load`], also returning the exact bytes the spec was parsed
    /// from (one read: the launch keeps a copy of what it validated).
    pub fn load_with_bytes(
        path: &Path,
        expected_name: &VmName,
    ) -> Result<(Spec, Vec<u8>), SpecError> {
        Spec::load_bytes(path, expected_name, Spec::read_bytes(path)?)
    }

    /// [`Spec::load_with_bytes`] from bytes already read (by
    /// [`Spec::read_bytes`] or [`Spec::read_bytes_probed`]).
    pub fn load_bytes(
        path: &Path,
        expected_name: &VmName,
        bytes: Vec<u8>,
    ) -> Result<(Spec, Vec<u8>), SpecError> {
        let spec = Spec::parse(path, &bytes)?;
        spec.validate(path, expected_name)?;
        spec.validate_files(path)?;
        Ok((spec, bytes))
    }

    /// Field checks that need no file system access.
    pub fn validate(&self, path: &Path, expected_name: &VmName) -> Result<(), SpecError> {
        let bad = |field: &str, reason: String| SpecError::Invalid {
            path: path.to_path_buf(),
            field: field.to_string(),
            reason,
        };
        if self.version != 1 {
            return Err(bad(
                "version",
                format!("is {}; this vmwarden understands version 1", self.version),
            ));
        }
        if &self.name != expected_name {
            return Err(bad(
                "name",
                format!(
                    "is {:?} but the VM being started is {:?}",
                    self.name, expected_name
                ),
            ));
        }
        self.validate_principal(path)?;
        self.validate_hypervisor(path)?;
        if self.vcpus == 0 || self.vcpus > MAX_VCPUS {
            return Err(bad(
                "vcpus",
                format!("is {}; must be 1..={MAX_VCPUS}", self.vcpus),
            ));
        }
        if self.memory_mib < MIN_MEMORY_MIB || self.memory_mib > MAX_MEMORY_MIB {
            return Err(bad(
                "memory_mib",
                format!(
                    "is {}; must be {MIN_MEMORY_MIB}..={MAX_MEMORY_MIB}",
                    self.memory_mib
                ),
            ));
        }
        check_abs_normalised(&self.kernel).map_err(|r| bad("kernel", r.to_string()))?;
        if let Some(initrd) = &self.initrd {
            check_abs_normalised(initrd).map_err(|r| bad("initrd", r.to_string()))?;
        }
        if self.cmdline.len() > MAX_CMDLINE_BYTES {
            return Err(bad(
                "cmdline",
                format!(
                    "is {} bytes; the limit is {MAX_CMDLINE_BYTES}",
                    self.cmdline.len()
                ),
            ));
        }
        if self.cmdline.chars().any(|c| c.is_control()) {
            return Err(bad(
                "cmdline",
                "must not contain control characters".to_string(),
            ));
        }
        self.validate_credentials(path)?;
        for (i, d) in self.disks.iter().enumerate() {
            check_abs_normalised(&d.path)
                .map_err(|r| bad(&format!("disks[{i}].path"), r.to_string()))?;
            if d.path.as_os_str().as_encoded_bytes().contains(&b',') {
                return Err(bad(
                    &format!("disks[{i}].path"),
                    "must not contain ',' (the option separator of QEMU and cloud-hypervisor)"
                        .to_string(),
                ));
            }
        }
        self.validate_disks(path)?;
        self.validate_shares(path)?;
        self.validate_vsock(path)?;
        self.validate_interfaces(path)?;
        for (i, p) in self.landlock.read.iter().enumerate() {
            check_abs_normalised(p)
                .map_err(|r| bad(&format!("landlock.read[{i}]"), r.to_string()))?;
        }
        for (i, p) in self.landlock.write.iter().enumerate() {
            check_abs_normalised(p)
                .map_err(|r| bad(&format!("landlock.write[{i}]"), r.to_string()))?;
        }
        for (i, k) in self.keep_on_purge.iter().enumerate() {
            let field = format!("keep_on_purge[{i}]");
            let p = Path::new(k);
            if k.is_empty() || p.is_absolute() {
                return Err(bad(
                    &field,
                    format!("{k:?} must be a relative path inside the VM's state directory"),
                ));
            }
            if k.split('/')
                .any(|seg| seg.is_empty() || seg == "." || seg == "..")
            {
                return Err(bad(
                    &field,
                    format!(
                        "{k:?} must be normalised (no '.', '..', empty components or trailing '/')"
                    ),
                ));
            }
        }
        Ok(())
    }

    fn validate_principal(&self, path: &Path) -> Result<(), SpecError> {
        let bad = |field: &str, reason: &str| SpecError::Invalid {
            path: path.to_path_buf(),
            field: field.to_string(),
            reason: reason.to_string(),
        };
        let p = &self.principal;
        match (&p.user, p.uid) {
            (Some(_), Some(_)) => {
                return Err(bad("principal", "sets both `user` and `uid`; give one"))
            }
            (None, None) => return Err(bad("principal", "needs `user` or `uid`")),
            (Some(u), None) if u.is_empty() || u.contains(['/', ':', '\n', '\0']) => {
                return Err(bad("principal.user", "is not a valid user name"))
            }
            (None, Some(0)) => return Err(bad("principal.uid", "is 0; a VM never runs as root")),
            _ => {}
        }
        match (&p.group, p.gid) {
            (Some(_), Some(_)) => {
                return Err(bad("principal", "sets both `group` and `gid`; give one"))
            }
            (None, None) => return Err(bad("principal", "needs `group` or `gid`")),
            (Some(g), None) if g.is_empty() || g.contains(['/', ':', '\n', '\0']) => {
                return Err(bad("principal.group", "is not a valid group name"))
            }
            (None, Some(0)) => {
                return Err(bad(
                    "principal.gid",
                    "is 0; a VM never runs with the root group",
                ))
            }
            _ => {}
        }
        Ok(())
    }

    fn validate_hypervisor(&self, path: &Path) -> Result<(), SpecError> {
        let bad = |field: &str, reason: String| SpecError::Invalid {
            path: path.to_path_buf(),
            field: field.to_string(),
            reason,
        };
        let kind = self.hypervisor.kind;
        if kind != HypervisorKind::Qemu {
            if self.hypervisor.accel != Accel::Kvm {
                return Err(bad(
                    "hypervisor.accel",
                    format!(
                        "is {:?}, but {} runs only on KVM; use \"kvm\" (or hypervisor.kind \"qemu\" for TCG)",
                        self.hypervisor.accel,
                        kind.as_str()
                    ),
                ));
            }
            if !self.credentials.is_empty() && kind == HypervisorKind::Firecracker {
                return Err(bad(
                    "credentials",
                    "cannot be passed to firecracker safely: it has no fw_cfg and no SMBIOS, so no channel keeps a \
                     secret off its command line and out of the host's mount namespace (systemd takes credentials from \
                     an initrd's /.extra/credentials/ only as encrypted ones, for services to decrypt with the guest's \
                     own key). Use hypervisor.kind \"qemu\" or \"cloud-hypervisor\" (fw_cfg from a private tmpfs) or \
                     deliver the secret over the network or a disk"
                        .to_string(),
                ));
            }
        }
        check_abs_normalised(&self.hypervisor.binary)
            .map_err(|r| bad("hypervisor.binary", r.to_string()))?;
        Ok(())
    }

    fn validate_disks(&self, path: &Path) -> Result<(), SpecError> {
        let bad = |field: String, reason: String| SpecError::Invalid {
            path: path.to_path_buf(),
            field,
            reason,
        };
        let fc = self.hypervisor.kind == HypervisorKind::Firecracker;
        for (i, d) in self.disks.iter().enumerate() {
            if fc && d.format() != DiskFormat::Raw {
                return Err(bad(
                    format!("disks[{i}].format"),
                    "is qcow2, but firecracker reads raw images only; convert it (qemu-img convert -O raw)"
                        .into(),
                ));
            }
            if let Some(serial) = &d.serial {
                if serial.is_empty()
                    || serial.len() > DISK_SERIAL_MAX
                    || !serial.bytes().all(tag_byte)
                {
                    return Err(bad(
                        format!("disks[{i}].serial"),
                        format!("{serial:?} must be 1 to {DISK_SERIAL_MAX} bytes of [A-Za-z0-9_.-] (virtio-blk keeps 20 bytes; ',' would split QEMU's -drive)"),
                    ));
                }
                if fc {
                    return Err(bad(
                        format!("disks[{i}].serial"),
                        "is not supported with firecracker: its drives have no serial".into(),
                    ));
                }
            }
            if let Some(c) = &d.create {
                if c.size_mib == 0 {
                    return Err(bad(
                        format!("disks[{i}].create.size_mib"),
                        "is 0; an image needs at least 1 MiB".into(),
                    ));
                }
                if d.format() != DiskFormat::Raw {
                    return Err(bad(
                        format!("disks[{i}].create"),
                        "cannot make a qcow2 image; vmwarden creates sparse raw images only (drop `format` or create the qcow2 yourself)".into(),
                    ));
                }
                if d.read_only {
                    return Err(bad(
                        format!("disks[{i}].create"),
                        "makes an empty image, which is useless read-only; set read_only false or drop `create`".into(),
                    ));
                }
                if let Some(FsTypeField::Unsupported(fs)) = &c.fs_type {
                    return Err(bad(
                        format!("disks[{i}].create.fs_type"),
                        format!("is {fs:?}; vmwarden formats \"ext4\" only (drop fs_type for an unformatted image, or make the image yourself)"),
                    ));
                }
                if c.size_mib > u64::MAX / (1024 * 1024) {
                    return Err(bad(
                        format!("disks[{i}].create.size_mib"),
                        format!("is {}; too large", c.size_mib),
                    ));
                }
            }
        }
        Ok(())
    }

    fn validate_shares(&self, path: &Path) -> Result<(), SpecError> {
        let bad = |field: String, reason: String| SpecError::Invalid {
            path: path.to_path_buf(),
            field,
            reason,
        };
        let kind = self.hypervisor.kind;
        if !self.shares.is_empty() && kind == HypervisorKind::Firecracker {
            return Err(bad(
                "shares".into(),
                "is not supported with firecracker: it has neither virtio-fs nor 9p; give the guest a disk, or use qemu or cloud-hypervisor".into(),
            ));
        }
        let mut tags = std::collections::BTreeSet::new();
        for (i, sh) in self.shares.iter().enumerate() {
            let t = &sh.tag;
            if t.is_empty() || t.len() > SHARE_TAG_MAX || !t.bytes().all(tag_byte) {
                return Err(bad(
                    format!("shares[{i}].tag"),
                    format!("{t:?} must be 1 to {SHARE_TAG_MAX} bytes of [A-Za-z0-9_.-] (QEMU's 9p mount_tag limit; ',' and '=' would split its arguments)"),
                ));
            }
            if !tags.insert(t.as_str()) {
                return Err(bad(
                    format!("shares[{i}].tag"),
                    format!("{t:?} appears twice"),
                ));
            }
            let field = format!("shares[{i}].source");
            check_abs_normalised(&sh.source).map_err(|r| bad(field.clone(), r.to_string()))?;
            if sh.source.as_os_str().as_encoded_bytes().contains(&b',') {
                return Err(bad(
                    field,
                    "must not contain ',' (the option separator of QEMU and cloud-hypervisor)"
                        .into(),
                ));
            }
            if sh.source == Path::new("/") {
                return Err(bad(
                    field,
                    "is the host's root directory; share a directory of the VM's own".into(),
                ));
            }
            if !sh.read_only && sh.source.starts_with(NIX_STORE) {
                return Err(bad(
                    format!("shares[{i}].read_only"),
                    format!(
                        "is false, but {} is under {NIX_STORE}, which a guest may only read",
                        sh.source.display()
                    ),
                ));
            }
            match (sh.proto, kind) {
                (ShareProto::NineP, HypervisorKind::CloudHypervisor) => {
                    return Err(bad(
                        format!("shares[{i}].proto"),
                        "is 9p, which cloud-hypervisor does not have; use \"virtiofs\"".into(),
                    ))
                }
                (ShareProto::Virtiofs, _) if self.virtiofsd.is_none() => {
                    return Err(bad(
                        "virtiofsd".into(),
                        format!("is missing, but shares[{i}] ({t:?}) is a virtiofs share; name the daemon in virtiofsd.binary"),
                    ))
                }
                _ => {}
            }
        }
        if let Some(v) = &self.virtiofsd {
            check_abs_normalised(&v.binary)
                .map_err(|r| bad("virtiofsd.binary".into(), r.to_string()))?;
        }
        Ok(())
    }

    fn validate_vsock(&self, path: &Path) -> Result<(), SpecError> {
        let bad = |field: &str, reason: String| SpecError::Invalid {
            path: path.to_path_buf(),
            field: field.to_string(),
            reason,
        };
        let Some(v) = &self.vsock else { return Ok(()) };
        let kind = self.hypervisor.kind;
        if !(VSOCK_CID_MIN..=VSOCK_CID_MAX).contains(&v.cid) {
            return Err(bad(
                "vsock.cid",
                format!("is {}; must be {VSOCK_CID_MIN}..={VSOCK_CID_MAX} (0-2 are the hypervisor, loopback and host; 2^32-1 is VMADDR_CID_ANY)", v.cid),
            ));
        }
        let daemon = kind == HypervisorKind::Qemu && v.backend == VsockBackend::User;
        match (&v.binary, daemon) {
            (None, true) => {
                return Err(bad(
                    "vsock.binary",
                    "is missing: QEMU's user backend needs the vhost-device-vsock daemon".into(),
                ))
            }
            (Some(_), false) => {
                return Err(bad(
                    "vsock.binary",
                    format!(
                        "is set, but only QEMU's user backend runs a daemon ({} with backend {:?} does not)",
                        kind.as_str(),
                        v.backend
                    ),
                ))
            }
            (Some(b), true) => {
                check_abs_normalised(b).map_err(|r| bad("vsock.binary", r.to_string()))?
            }
            (None, false) => {}
        }
        if kind != HypervisorKind::Qemu && v.backend == VsockBackend::Vhost {
            return Err(bad(
                "vsock.backend",
                format!(
                    "is \"vhost\", but {} serves vsock itself on a unix socket in control/; use \"user\"",
                    kind.as_str()
                ),
            ));
        }
        Ok(())
    }

    /// `hypervisor.extra_args` against the escape hatch's limits; `control`
    /// is the VM's `control/` directory (the only place for extra sockets).
    pub fn validate_extra_args(&self, path: &Path, control: &Path) -> Result<(), SpecError> {
        match extra_args::problems(self.hypervisor.kind, &self.hypervisor.extra_args, control)
            .into_iter()
            .next()
        {
            None => Ok(()),
            Some((i, why)) => Err(SpecError::Invalid {
                path: path.to_path_buf(),
                field: format!("hypervisor.extra_args[{i}]"),
                reason: why,
            }),
        }
    }

    fn validate_interfaces(&self, path: &Path) -> Result<(), SpecError> {
        let bad = |field: String, reason: String| SpecError::Invalid {
            path: path.to_path_buf(),
            field,
            reason,
        };
        let mut seen = std::collections::BTreeSet::new();
        for (i, n) in self.interfaces.iter().enumerate() {
            if !seen.insert(n.tap.clone()) {
                return Err(bad(
                    format!("interfaces[{i}].tap"),
                    format!("{:?} appears twice", n.tap),
                ));
            }
        }
        Ok(())
    }

    /// The guest MAC of interface `i`: the spec's, or one derived from the
    /// VM and tap names (stable across boots).
    pub fn guest_mac(&self, i: usize) -> Mac {
        let n = &self.interfaces[i];
        n.mac.unwrap_or_else(|| Mac::derived(&self.name, &n.tap))
    }

    fn validate_credentials(&self, path: &Path) -> Result<(), SpecError> {
        let bad = |field: String, reason: String| SpecError::Invalid {
            path: path.to_path_buf(),
            field,
            reason,
        };
        let mut seen = std::collections::BTreeSet::new();
        for (i, c) in self.credentials.iter().enumerate() {
            let field = format!("credentials[{i}].name");
            let fw = FW_CFG_CREDENTIAL_PREFIX.len() + c.name.as_str().len();
            if fw > FW_CFG_NAME_MAX {
                return Err(bad(
                    field,
                    format!(
                        "{:?} makes the fw_cfg name {FW_CFG_CREDENTIAL_PREFIX}{} {fw} bytes; QEMU allows {FW_CFG_NAME_MAX} (credential names up to {} bytes)",
                        c.name,
                        c.name,
                        FW_CFG_NAME_MAX - FW_CFG_CREDENTIAL_PREFIX.len()
                    ),
                ));
            }
            if !seen.insert(c.name.clone()) {
                return Err(bad(field, format!("{:?} appears twice", c.name)));
            }
            if let CredentialSource::Path(p) = &c.source {
                check_abs_normalised(p)
                    .map_err(|r| bad(format!("credentials[{i}].source.path"), r.to_string()))?;
            }
        }
        Ok(())
    }

    /// Checks that the files the spec names exist and have the right type.
    /// Credentials are checked when they are read (`creds::read_all`).
    pub fn validate_files(&self, path: &Path) -> Result<(), SpecError> {
        let bad = |field: &str, p: &Path, reason: String| SpecError::Invalid {
            path: path.to_path_buf(),
            field: field.to_string(),
            reason: format!("{}: {reason}", p.display()),
        };
        let regular = |field: &str, p: &Path, exec: bool| -> Result<(), SpecError> {
            let md = std::fs::metadata(p).map_err(|e| bad(field, p, e.to_string()))?;
            if !md.is_file() {
                return Err(bad(field, p, "is not a regular file".to_string()));
            }
            if exec && md.permissions().mode() & 0o111 == 0 {
                return Err(bad(field, p, "is not executable".to_string()));
            }
            Ok(())
        };
        for (field, paths) in [
            ("landlock.read", &self.landlock.read),
            ("landlock.write", &self.landlock.write),
        ] {
            for (i, p) in paths.iter().enumerate() {
                std::fs::symlink_metadata(p)
                    .map_err(|e| bad(&format!("{field}[{i}]"), p, e.to_string()))?;
            }
        }
        regular("hypervisor.binary", &self.hypervisor.binary, true)?;
        regular("kernel", &self.kernel, false)?;
        if let Some(initrd) = &self.initrd {
            regular("initrd", initrd, false)?;
        }
        if let Some(v) = &self.virtiofsd {
            regular("virtiofsd.binary", &v.binary, true)?;
        }
        if let Some(b) = self.vsock.as_ref().and_then(|v| v.binary.as_ref()) {
            regular("vsock.binary", b, true)?;
        }
        for (i, sh) in self.shares.iter().enumerate() {
            let field = format!("shares[{i}].source");
            let md = std::fs::metadata(&sh.source)
                .map_err(|e| bad(&field, &sh.source, e.to_string()))?;
            if !md.is_dir() {
                return Err(bad(&field, &sh.source, "is not a directory".to_string()));
            }
        }
        for (i, d) in self.disks.iter().enumerate() {
            let field = format!("disks[{i}].path");
            if d.create.is_some() && std::fs::symlink_metadata(&d.path).is_err() {
                // Created by the launcher, as the principal, at launch.
                continue;
            }
            let md = std::fs::metadata(&d.path).map_err(|e| bad(&field, &d.path, e.to_string()))?;
            let ft = md.file_type();
            if !(ft.is_file() || ft.is_block_device()) {
                return Err(bad(
                    &field,
                    &d.path,
                    "is neither a regular file nor a block device".to_string(),
                ));
            }
        }
        Ok(())
    }

    /// The principal spec rendered for messages.
    pub fn principal_display(&self) -> String {
        let p = &self.principal;
        let u = p
            .user
            .clone()
            .unwrap_or_else(|| p.uid.map(|u| u.to_string()).unwrap_or_default());
        let g = p
            .group
            .clone()
            .unwrap_or_else(|| p.gid.map(|g| g.to_string()).unwrap_or_default());
        format!("{u}:{g}")
    }
}

/// The field whose name type refused its value, when that refusal is what
/// failed `serde_json` (which reports only a line and a column), so it reads
/// like every other field error. The spec's name fields, in document order.
fn refused_name(bytes: &[u8], err: &serde_json::Error) -> Option<(String, NameError)> {
    if !err.is_data() {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    type Check = fn(&str) -> Option<NameError>;
    let vm: Check = |s| VmName::parse(s).err();
    let cred: Check = |s| CredentialName::parse(s).err();
    let tap: Check = |s| TapName::parse(s).err();
    let bridge: Check = |s| BridgeName::parse(s).err();
    let mac: Check = |s| Mac::parse(s).err();
    let mut fields: Vec<(String, &serde_json::Value, Check)> =
        vec![("name".into(), &v["name"], vm)];
    let items = |key: &str| v[key].as_array().into_iter().flatten().enumerate();
    for (i, c) in items("credentials") {
        fields.push((format!("credentials[{i}].name"), &c["name"], cred));
        fields.push((
            format!("credentials[{i}].source.systemd"),
            &c["source"]["systemd"],
            cred,
        ));
    }
    for (i, n) in items("interfaces") {
        fields.push((format!("interfaces[{i}].tap"), &n["tap"], tap));
        fields.push((format!("interfaces[{i}].bridge"), &n["bridge"], bridge));
        fields.push((format!("interfaces[{i}].mac"), &n["mac"], mac));
    }
    let msg = err.to_string();
    fields.into_iter().find_map(|(field, value, check)| {
        let e = check(value.as_str()?)?;
        msg.starts_with(&e.to_string()).then_some((field, e))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> serde_json::Value {
        json!({
            "version": 1, "name": "web",
            "principal": { "user": "vm-web", "group": "vm-web" },
            "hypervisor": { "kind": "qemu", "binary": "/usr/bin/qemu-system-x86_64" },
            "vcpus": 2, "memory_mib": 512, "kernel": "/boot/vmlinuz"
        })
    }

    fn check(v: serde_json::Value) -> Result<Spec, SpecError> {
        let p = Path::new("/etc/vmwarden/vms/web.json");
        let s = Spec::parse(p, &serde_json::to_vec(&v).unwrap())?;
        s.validate(p, &VmName::parse("web").unwrap())?;
        Ok(s)
    }

    fn field_of(v: serde_json::Value) -> String {
        match check(v) {
            Err(SpecError::Invalid { field, .. }) => field,
            other => panic!("expected an invalid field, got {other:?}"),
        }
    }

    #[test]
    fn defaults_fill_the_optional_fields() {
        let s = check(base()).unwrap();
        assert_eq!(s.hypervisor.accel, Accel::Kvm);
        assert_eq!(s.hypervisor.machine, Machine::Microvm);
        assert_eq!(s.landlock.mode, LandlockMode::Required);
        assert_eq!(s.keep_on_purge, vec!["identity".to_string()]);
        assert!(s.credentials.is_empty() && s.disks.is_empty() && s.interfaces.is_empty());
    }

    #[test]
    fn names() {
        for ok in ["a", "web", "db-1", &format!("a{}", "b".repeat(31))] {
            assert!(VmName::parse(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "Web",
            "1web",
            "-a",
            "a/b",
            "a.b",
            "a_b",
            &"a".repeat(33),
        ] {
            assert!(VmName::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn paths_must_be_absolute_and_normalised() {
        check_abs_normalised(Path::new("/a/b")).unwrap();
        for bad in ["a/b", "/a/../b", "/a/./b", "/a//b", "/a/b/", ""] {
            assert!(check_abs_normalised(Path::new(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn fw_cfg_name_limit_is_55_bytes() {
        let mut v = base();
        v["credentials"] = json!([{ "name": "a".repeat(28), "source": { "systemd": "x" } }]);
        assert!(check(v.clone()).is_ok(), "27 + 28 = 55 bytes fits");
        v["credentials"] = json!([{ "name": "a".repeat(29), "source": { "systemd": "x" } }]);
        assert_eq!(field_of(v), "credentials[0].name");
    }

    #[test]
    fn each_rejection_names_its_field() {
        type Mutate = fn(&mut serde_json::Value);
        let cases: Vec<(&str, Mutate)> = vec![
            ("version", |v| v["version"] = json!(2)),
            ("name", |v| v["name"] = json!("db")),
            ("principal.uid", |v| {
                v["principal"] = json!({ "uid": 0, "gid": 1 })
            }),
            ("principal.gid", |v| {
                v["principal"] = json!({ "uid": 1, "gid": 0 })
            }),
            ("principal", |v| {
                v["principal"] = json!({ "user": "a", "uid": 5, "gid": 1 })
            }),
            ("vcpus", |v| v["vcpus"] = json!(0)),
            ("memory_mib", |v| v["memory_mib"] = json!(8)),
            ("kernel", |v| v["kernel"] = json!("vmlinuz")),
            ("hypervisor.binary", |v| {
                v["hypervisor"]["binary"] = json!("qemu")
            }),
            ("cmdline", |v| v["cmdline"] = json!("a\nb")),
            ("keep_on_purge[0]", |v| v["keep_on_purge"] = json!(["../x"])),
            ("landlock.write[0]", |v| {
                v["landlock"] = json!({ "write": ["rel"] })
            }),
            ("disks[0].path", |v| {
                v["disks"] = json!([{ "path": "/a,b" }])
            }),
            ("disks[0].serial", |v| {
                v["disks"] = json!([{ "path": "/a", "serial": "a".repeat(21) }])
            }),
            ("disks[0].serial", |v| {
                v["disks"] = json!([{ "path": "/a", "serial": "a,b" }])
            }),
            ("disks[0].create.size_mib", |v| {
                v["disks"] = json!([{ "path": "/a", "create": { "size_mib": 0 } }])
            }),
            (
                "disks[0].create",
                |v| {
                    v["disks"] =
                        json!([{ "path": "/a", "format": "qcow2", "create": { "size_mib": 1 } }])
                },
            ),
            (
                "shares[0].tag",
                |v| v["shares"] = json!([{ "tag": "a".repeat(32), "source": "/s", "proto": "9p" }]),
            ),
            ("shares[0].tag", |v| {
                v["shares"] = json!([{ "tag": "a=b", "source": "/s", "proto": "9p" }])
            }),
            ("shares[1].tag", |v| {
                v["shares"] = json!([{ "tag": "t", "source": "/s", "proto": "9p" },
                                      { "tag": "t", "source": "/u", "proto": "9p" }])
            }),
            (
                "shares[0].source",
                |v| v["shares"] = json!([{ "tag": "t", "source": "/s/../x", "proto": "9p" }]),
            ),
            ("shares[0].source", |v| {
                v["shares"] = json!([{ "tag": "t", "source": "/a,b", "proto": "9p" }])
            }),
            (
                "shares[0].read_only",
                |v| v["shares"] = json!([{ "tag": "t", "source": "/nix/store", "proto": "9p" }]),
            ),
            (
                "virtiofsd",
                |v| v["shares"] = json!([{ "tag": "t", "source": "/s", "proto": "virtiofs" }]),
            ),
            ("shares", |v| {
                v["hypervisor"]["kind"] = json!("firecracker");
                v["shares"] = json!([{ "tag": "t", "source": "/s", "proto": "9p" }])
            }),
            ("shares[0].proto", |v| {
                v["hypervisor"]["kind"] = json!("cloud-hypervisor");
                v["shares"] = json!([{ "tag": "t", "source": "/s", "proto": "9p" }])
            }),
            ("vsock.cid", |v| {
                v["vsock"] = json!({ "cid": 2, "backend": "vhost" })
            }),
            ("vsock.cid", |v| {
                v["vsock"] = json!({ "cid": 4294967295u64, "backend": "vhost" })
            }),
            ("vsock.binary", |v| {
                v["vsock"] = json!({ "cid": 3, "backend": "user" })
            }),
            ("vsock.binary", |v| {
                v["vsock"] = json!({ "cid": 3, "backend": "vhost", "binary": "/b" })
            }),
            ("vsock.backend", |v| {
                v["hypervisor"]["kind"] = json!("firecracker");
                v["vsock"] = json!({ "cid": 3, "backend": "vhost" })
            }),
            ("credentials", |v| {
                v["hypervisor"]["kind"] = json!("firecracker");
                v["hypervisor"]["accel"] = json!("kvm");
                v["credentials"] = json!([{ "name": "t", "source": { "systemd": "t" } }])
            }),
            ("disks[0].format", |v| {
                v["hypervisor"]["kind"] = json!("firecracker");
                v["disks"] = json!([{ "path": "/a", "format": "qcow2" }])
            }),
        ];
        for (want, f) in cases {
            let mut v = base();
            f(&mut v);
            assert_eq!(field_of(v), want);
        }
    }

    #[test]
    fn a_bad_name_is_refused_while_parsing_with_its_field_and_rule() {
        type Mutate = fn(&mut serde_json::Value);
        let cases: Vec<(&str, &str, Mutate)> = vec![
            ("name", "\"Web\" must match ^[a-z][a-z0-9-]{0,31}$", |v| {
                v["name"] = json!("Web")
            }),
            ("name", "\"\" must match", |v| v["name"] = json!("")),
            (
                "credentials[1].name",
                "\"a/b\" must be letters, digits",
                |v| {
                    v["credentials"] = json!([
                        { "name": "ok", "source": { "systemd": "ok" } },
                        { "name": "a/b", "source": { "systemd": "x" } }
                    ])
                },
            ),
            (
                "credentials[0].source.systemd",
                "\"../x\" must be letters",
                |v| v["credentials"] = json!([{ "name": "t", "source": { "systemd": "../x" } }]),
            ),
            (
                "interfaces[0].tap",
                "\"tap0\" must match ^vmw-[a-z0-9-]{1,11}$",
                |v| v["interfaces"] = json!([{ "tap": "tap0" }]),
            ),
            (
                "interfaces[1].bridge",
                "\"vmw-x\" is not a usable bridge name",
                |v| {
                    v["interfaces"] =
                        json!([{ "tap": "vmw-a" }, { "tap": "vmw-b", "bridge": "vmw-x" }])
                },
            ),
            ("interfaces[0].mac", "\"02:00\" is not a MAC address", |v| {
                v["interfaces"] = json!([{ "tap": "vmw-a", "mac": "02:00" }])
            }),
            (
                "interfaces[0].mac",
                "\"ff:ff:ff:ff:ff:ff\" is a multicast",
                |v| v["interfaces"] = json!([{ "tap": "vmw-a", "mac": "ff:ff:ff:ff:ff:ff" }]),
            ),
            (
                "interfaces[0].mac",
                "\"00:00:00:00:00:00\" is all zeros",
                |v| v["interfaces"] = json!([{ "tap": "vmw-a", "mac": "00:00:00:00:00:00" }]),
            ),
        ];
        let p = Path::new("/etc/vmwarden/vms/web.json");
        for (want, reason, f) in cases {
            let mut v = base();
            f(&mut v);
            let err = Spec::parse(p, &serde_json::to_vec(&v).unwrap()).expect_err(want);
            let msg = err.to_string();
            match err {
                SpecError::Invalid { field, .. } => assert_eq!(field, want, "{msg}"),
                other => panic!("{want}: expected an invalid field, got {other:?}"),
            }
            assert!(
                msg.starts_with(&format!("spec {}: field `{want}` {reason}", p.display())),
                "{msg}"
            );
        }
        // A bad name in a spec that fails earlier (keys are serialised in
        // order, so `extra` comes first): serde's first error is reported.
        let mut v = base();
        v["name"] = json!("Web");
        v["extra"] = json!(1);
        assert!(matches!(check(v), Err(SpecError::Parse { .. })));
        // A name of the wrong JSON type is a parse error, not a name error.
        let mut v = base();
        v["name"] = json!(7);
        assert!(matches!(check(v), Err(SpecError::Parse { .. })));
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let mut v = base();
        v["extra"] = json!(1);
        assert!(matches!(check(v), Err(SpecError::Parse { .. })));
        let mut v = base();
        v["hypervisor"]["cpu"] = json!("host");
        assert!(matches!(check(v), Err(SpecError::Parse { .. })));
    }

    #[test]
    fn round_trips_through_json() {
        let s = check(base()).unwrap();
        let again: Spec = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(s, again);
    }
}
