//! The launch spec: `/etc/vmwarden/vms/NAME.json`, version 1.
//!
//! Field names are a contract shared with the NixOS module and operators'
//! tools: extend, never rename. Unknown fields are rejected. `load` reads and
//! validates; nothing on the host is created or changed by this module.

use std::ffi::OsStr;
use std::io::Read;
use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};

use nix::sys::stat::FileStat;
use serde::{Deserialize, Serialize};

use crate::config::devices::DeviceSpec;
use crate::config::files::{open_probed_at, open_regular_at, OpenError};
pub use crate::config::macvtap::{InterfaceType, MacvtapMode, MacvtapSpec};
use crate::config::names::{BridgeName, CredentialName, Mac, NameError, TapName, VmName};
use crate::config::resources::ResourcesSpec;
use crate::config::rules;
pub use crate::config::shares::{
    ShareProto, ShareSpec, ThreadPoolSize, VirtiofsdSpec, MAX_THREAD_POOL,
};
use crate::config::user_net::UserNetworkSpec;

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
    // -- The host's own tools (config/host_tools.rs checks these). --
    /// virtio-balloon (microvm.nix `balloon`), QEMU and cloud-hypervisor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub balloon: Option<BalloonSpec>,
    /// The serial console goes through a relay that `vmwarden console`
    /// attaches to (QEMU and cloud-hypervisor); the journal keeps its copy.
    #[serde(default, skip_serializing_if = "is_false")]
    pub console: bool,
    /// The launcher registers the VM with systemd-machined (microvm.nix
    /// `registerWithMachined`), class `vm`, leader the hypervisor.
    #[serde(default, skip_serializing_if = "is_false")]
    pub register_with_machined: bool,
    /// An interface on a user network served by passt (QEMU only; see
    /// `config::user_net`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_network: Option<UserNetworkSpec>,
    // -- Guest memory (config/memory.rs checks these). --
    /// Kernel same-page merging of the guest's memory (QEMU's `mem-merge`,
    /// cloud-hypervisor's `mergeable`); off unless asked for.
    #[serde(default, skip_serializing_if = "is_false")]
    pub mem_merge: bool,
    /// Guest memory from the host's pool of 2 MiB hugepages (microvm.nix
    /// `hugepageMem`), taken through an anonymous hugetlb memfd.
    #[serde(default, skip_serializing_if = "is_false")]
    pub hugepage_mem: bool,
    // -- Host devices (config/devices.rs, config/validation_devices.rs). --
    /// Host PCI and USB devices the VM holds for its life (see
    /// `config::devices`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<DeviceSpec>,
    /// Hand a PCI device to a VM on a host without interrupt remapping
    /// (vfio_iommu_type1's `allow_unsafe_interrupts`): the guest can then
    /// forge interrupts to the host. Refused unless true.
    #[serde(default, skip_serializing_if = "is_false")]
    pub allow_unsafe_interrupts: bool,
    // -- The unit's limits (config/resources.rs). --
    /// Limits on the VM's unit (`config::resources`), written into its
    /// drop-in by `render-unit --dropin` and the NixOS module.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourcesSpec>,
    /// `vmwarden hibernate` and restore on the next start
    /// (`config::hibernate`); absent = not allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hibernate: Option<crate::config::hibernate::HibernateSpec>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn default_true() -> bool {
    true
}

/// `balloon`: a virtio-balloon device the host sets through the control
/// socket (`vmwarden balloon NAME SIZE`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BalloonSpec {
    /// The balloon's size at boot, MiB taken from the guest (microvm.nix
    /// `initialBalloonMem`); below `memory_mib`.
    #[serde(default)]
    pub initial_mib: u64,
    /// The guest deflates the balloon when it runs out of memory
    /// (microvm.nix `deflateOnOOM`, default true as there).
    #[serde(default = "default_true")]
    pub deflate_on_oom: bool,
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
pub(crate) fn tag_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b == b'-'
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
    // -- The guest's notify socket (config/vmm_notify.rs). --
    /// The guest's systemd tells the host how it ends, over vsock;
    /// firecracker only; absent = on for firecracker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notify: Option<bool>,
    /// The host vsock port it connects to; absent = 8888.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notify_port: Option<u32>,
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
    /// O_DIRECT, bypassing the host's page cache (microvm.nix's `direct`):
    /// QEMU `cache=none`, cloud-hypervisor `direct=on`. Absent: as before
    /// the field existed ([`DiskSpec::direct`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direct: Option<bool>,
    /// The guest's discard (TRIM) frees the image's blocks: QEMU
    /// `discard=unmap`, cloud-hypervisor `sparse=on`. Absent: as before
    /// the field existed ([`DiskSpec::discard`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discard: Option<bool>,
}

impl DiskSpec {
    pub fn format(&self) -> DiskFormat {
        self.format.unwrap_or_default()
    }

    /// Whether `kind` opens the image with O_DIRECT. Absent, each
    /// hypervisor keeps what it did before the field existed: QEMU yes
    /// (`cache=none`), cloud-hypervisor no, firecracker no (it has no
    /// such mode).
    pub fn direct(&self, kind: HypervisorKind) -> bool {
        self.direct.unwrap_or(kind == HypervisorKind::Qemu)
    }

    /// Whether the guest's discards free blocks of the image. Absent, each
    /// hypervisor keeps its own default: QEMU ignores them, cloud-hypervisor
    /// punches holes (`sparse=on`), firecracker has no discard.
    pub fn discard(&self, kind: HypervisorKind) -> bool {
        self.discard
            .unwrap_or(kind == HypervisorKind::CloudHypervisor)
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
    /// The kernel's vhost-net (QEMU): root opens `/dev/vhost-net` once per
    /// queue and hands QEMU the fds. Absent: off (docs/networking.md says
    /// why it is not the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vhost: Option<bool>,
    /// Queue pairs, one tap fd each, all opened by root (microvm.nix:
    /// the VM's vCPUs). Absent: 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queues: Option<u32>,
    /// `"tap"` (absent) or `"macvtap"` (config/macvtap.rs): `tap` is then
    /// the name of the macvtap root makes on `macvtap.link`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<InterfaceType>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub macvtap: Option<MacvtapSpec>,
}

/// Most queue pairs an interface may ask for (one per vCPU at most).
pub const MAX_QUEUES: u32 = MAX_VCPUS;

impl InterfaceSpec {
    pub fn vhost(&self) -> bool {
        self.vhost == Some(true)
    }

    pub fn queues(&self) -> u32 {
        self.queues.unwrap_or(1)
    }

    /// A tap of several queues (not a macvtap): made in a network namespace
    /// of the launcher's own, then moved (`host::net::apart`).
    pub fn tap_made_apart(&self) -> bool {
        self.macvtap().is_none() && self.queues() > 1
    }

    /// The macvtap of a `type = "macvtap"` interface (validated: present
    /// exactly then).
    pub fn macvtap(&self) -> Option<&MacvtapSpec> {
        match self.kind.unwrap_or_default() {
            InterfaceType::Macvtap => self.macvtap.as_ref(),
            InterfaceType::Tap => None,
        }
    }
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

    /// The guest MAC of interface `i`: the spec's, or one derived from the
    /// VM and tap names (stable across boots).
    pub fn guest_mac(&self, i: usize) -> Mac {
        let n = &self.interfaces[i];
        n.mac.unwrap_or_else(|| Mac::derived(&self.name, &n.tap))
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
    fields.push(("user_network.mac".into(), &v["user_network"]["mac"], mac));
    let msg = err.to_string();
    fields.into_iter().find_map(|(field, value, check)| {
        let e = check(value.as_str()?)?;
        msg.starts_with(&e.to_string()).then_some((field, e))
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::config::names::check_abs_normalised;
    use serde_json::json;

    /// A valid QEMU spec of VM `web`, as JSON (the spec tests and the
    /// validation tests start from it).
    pub(crate) fn base() -> serde_json::Value {
        json!({
            "version": 1, "name": "web",
            "principal": { "user": "vm-web", "group": "vm-web" },
            "hypervisor": { "kind": "qemu", "binary": "/usr/bin/qemu-system-x86_64" },
            "vcpus": 2, "memory_mib": 512, "kernel": "/boot/vmlinuz"
        })
    }

    /// Parse and validate `v` as `/etc/vmwarden/vms/web.json`.
    pub(crate) fn check(v: serde_json::Value) -> Result<Spec, SpecError> {
        let p = Path::new("/etc/vmwarden/vms/web.json");
        let s = Spec::parse(p, &serde_json::to_vec(&v).unwrap())?;
        s.validate(p, &VmName::parse("web").unwrap())?;
        Ok(s)
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
