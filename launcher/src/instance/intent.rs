//! The intent record: `RUNTIME/NAME/instance.json`, written durably (temp
//! file, fsync, rename, fsync of the directory) before any resource it names
//! exists, so a launch killed at any point leaves a record of what to look for.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::names::TapName;
use crate::config::paths::INTENT_FILE;
use crate::config::spec::HypervisorKind;
use crate::host::cgroup::Cgroup;
use crate::host::dirs::{self, Dir, DirError};
use crate::host::sys::{read_path, IoContext, IoError};

pub const MAX_INTENT_BYTES: u64 = 256 * 1024;

/// An intent record that cannot be made, written or read.
#[derive(Debug, thiserror::Error)]
pub enum IntentError {
    /// Drawing the instance id.
    #[error(transparent)]
    Io(#[from] IoError),
    #[error("intent record {path}: {source}")]
    Encode {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error(transparent)]
    Write(#[from] DirError),
    #[error("intent record {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: DirError,
    },
    #[error("intent record {path}: cannot be parsed: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

impl IntentError {
    /// Never a refusal of the configuration: the record is launch's own.
    pub fn is_refusal(&self) -> bool {
        match self {
            IntentError::Write(e) => e.is_refusal(),
            _ => false,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct IntentPrincipal {
    pub uid: u32,
    pub gid: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

/// One resource the launch is about to create.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Resource {
    /// A directory inside the runtime dir; removed by cleanup.
    RuntimeDir { path: PathBuf },
    /// A socket or file the hypervisor creates inside the runtime dir.
    RuntimeFile { path: PathBuf },
    /// A mount made only inside the VM's private mount namespace; gone with
    /// the namespace, verified absent by cleanup.
    PrivateMount { path: PathBuf, fstype: String },
    /// The persistent state dir; user-owned, never deleted by cleanup.
    StateDir { path: PathBuf },
    /// The copy of the exact spec bytes this instance was launched from
    /// (`launched-spec.json`, root 0600), read from `source`. `status`
    /// compares it with the configured spec; stop, cleanup, verify-clean,
    /// reap and purge read it instead of the configured spec while this
    /// record exists. Removed by cleanup with the rest of the runtime dir.
    LaunchedSpec { path: PathBuf, source: PathBuf },
    /// An image of `disks[].create` (a created volume), made under `temp` (next to
    /// it) and renamed to `path` once complete. `path` is persistent and
    /// the user's: cleanup never deletes it (only `purge` does). `temp` is
    /// what a launch killed while making the image leaves: cleanup removes
    /// it, and the next launch would replace it.
    CreatedImage { path: PathBuf, temp: PathBuf },
    /// The VM's hibernation snapshot (`config::hibernate`), named in the
    /// record of every instance whose spec allows it, before any capture
    /// can start: `path` the complete one (`STATE/NAME/.vmwarden-hibernate`,
    /// the user's data: cleanup keeps it, a restore consumes it, `purge`
    /// deletes it), `temp` the one being written
    /// (`.vmwarden-hibernate.new`), which cleanup deletes once the instance
    /// is dead and verify-clean reports. `restoring`: this instance was
    /// started from `path` (wait-ready consumes it once the guest runs).
    Snapshot {
        path: PathBuf,
        temp: PathBuf,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        restoring: bool,
    },
    /// A writable share's source that did not exist, made by the launcher
    /// (the principal's, 0700) at `share-sources-made`
    /// (`launch::share_sources`). Persistent and the VM's data: once the
    /// launch has recorded its identity in the state root
    /// (`instance::made_sources`) cleanup keeps it and only `purge`
    /// deletes it; one that record does not name (a launch killed right
    /// after the `mkdir`) cleanup removes while it is empty.
    ShareSource { path: PathBuf },
    /// A tap the launcher creates as a non-persistent fd for the
    /// hypervisor: the kernel deletes it when the last holder dies. Cleanup
    /// and verify-clean check it is gone; `reap --apply` deletes a survivor.
    Tap {
        name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        bridge: Option<String>,
    },
    /// A macvtap the launcher makes on the host interface `link` (in
    /// `mode`) at the `taps` step, its queues opened as fds for the
    /// hypervisor. It outlives them: cleanup deletes it (vetted: a macvtap
    /// of that name) once the instance is dead, verify-clean checks it is
    /// gone, `reap --apply` deletes one whose VMs are all dead.
    Macvtap {
        name: String,
        link: String,
        mode: String,
    },
    /// The hypervisor's own network namespace (firecracker with
    /// interfaces: it opens its taps by name, so it runs where no other tap
    /// exists; see `launch::netns`). Anonymous: it is held only by the
    /// processes in it and ends with the last of them, taking everything
    /// inside with it. Nothing to delete; its links are listed as
    /// `ns-link`s.
    NetNamespace {},
    /// An interface of a VM in its own network namespace: the tap `name`
    /// inside it (persistent, the principal's), and the veth pair joining
    /// it to the host, `name` on the host's side (on `bridge`, like a tap
    /// of the other hypervisors) and `peer` inside, with every frame
    /// redirected between `peer` and the tap. The host's side dies with its
    /// peer, which dies with the namespace; cleanup deletes a host side
    /// that outlives the instance (the kernel tears a namespace down
    /// asynchronously), verify-clean checks it is gone, `reap --apply`
    /// deletes one whose VMs are all dead.
    NsLink {
        name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        bridge: Option<String>,
        peer: String,
    },
    /// A helper daemon the launcher forks for the hypervisor, run as the
    /// principal (see launch::helpers; `helper` is its entry's name):
    /// `virtiofsd` for share `tag`, `vhost-device-vsock`, `passt` for
    /// the user network interface `tag`, `vmm-notify` or `reboot-watch`
    /// (vmwarden's own code, forked without `execve`). `socket` is
    /// the socket in `control/` the hypervisor connects to (removed by
    /// cleanup with the control dir), absent for a helper reached
    /// otherwise. It dies with the hypervisor (parent-death signal) and
    /// holds the lease meanwhile; cleanup and verify-clean prove no process
    /// of the principal is left.
    Helper {
        helper: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tag: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        socket: Option<PathBuf>,
    },
    /// A PCI device the VM holds through VFIO, recorded with the driver
    /// it had (`None`: none) before the launcher changes anything; its
    /// IOMMU group's node `/dev/vfio/GROUP` is the principal's for the
    /// VM's life. Cleanup proves no process holds the group, gives the node
    /// back to root `0600` and the device back to `driver` (or leaves it on
    /// `vfio-pci` with `keep_on_vfio_pci`); verify-clean reports one still
    /// held.
    PciDevice {
        address: String,
        group: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        driver: Option<String>,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        keep_on_vfio_pci: bool,
    },
    /// A USB device the VM holds: its usbfs `node`, the principal's for the
    /// VM's life, and the owner and mode it had, which cleanup gives back
    /// (a node gone because the device was unplugged is reported, not a
    /// failure).
    UsbDevice {
        selector: String,
        node: PathBuf,
        uid: u32,
        gid: u32,
        mode: u32,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Intent {
    pub version: u32,
    pub name: String,
    pub instance_id: String,
    /// The launcher's pid, which `execve` makes the hypervisor's pid.
    pub pid: u32,
    pub boot_id: String,
    pub created_unix: u64,
    pub principal: IntentPrincipal,
    /// The hypervisor kind (absent in records written before it existed:
    /// those are QEMU's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hypervisor: Option<HypervisorKind>,
    /// The launcher's own cgroup when it held nothing else at launch (a
    /// unit's cgroup at `ExecStart=`): every process of this instance is in
    /// it for as long as it exists, so liveness asks it first. Absent when
    /// the launch ran outside such a cgroup (liveness then scans `/proc`)
    /// and in records written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<Cgroup>,
    pub resources: Vec<Resource>,
}

impl Intent {
    /// The launched spec copy this record names, and where it was read from.
    pub fn launched_spec(&self) -> Option<(&Path, &Path)> {
        self.resources.iter().find_map(|r| match r {
            Resource::LaunchedSpec { path, source } => Some((path.as_path(), source.as_path())),
            _ => None,
        })
    }

    /// The snapshot this record names: (complete, being written, restoring).
    pub fn snapshot(&self) -> Option<(&Path, &Path, bool)> {
        self.resources.iter().find_map(|r| match r {
            Resource::Snapshot {
                path,
                temp,
                restoring,
            } => Some((path.as_path(), temp.as_path(), *restoring)),
            _ => None,
        })
    }

    /// The names of the VM's interfaces in the host's network namespace
    /// this record lists: its taps and the host sides of its namespace's
    /// links (a name that is not a tap name, which the launcher never
    /// writes, is not one of vmwarden's).
    pub fn taps(&self) -> Vec<TapName> {
        self.resources
            .iter()
            .filter_map(|r| match r {
                Resource::Tap { name, .. }
                | Resource::NsLink { name, .. }
                | Resource::Macvtap { name, .. } => TapName::parse(name).ok(),
                _ => None,
            })
            .collect()
    }

    /// The macvtaps this record lists.
    pub fn macvtaps(&self) -> Vec<TapName> {
        self.resources
            .iter()
            .filter_map(|r| match r {
                Resource::Macvtap { name, .. } => TapName::parse(name).ok(),
                _ => None,
            })
            .collect()
    }

    /// The host sides of the links of the VM's own network namespace this
    /// record lists (`ns-link`).
    pub fn ns_links(&self) -> Vec<TapName> {
        self.resources
            .iter()
            .filter_map(|r| match r {
                Resource::NsLink { name, .. } => TapName::parse(name).ok(),
                _ => None,
            })
            .collect()
    }
}

/// This boot's id (read once per process).
pub fn boot_id() -> String {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| {
        // 37 bytes: one read (`host::sys::read_path`).
        read_path(Path::new("/proc/sys/kernel/random/boot_id"), 64, 64)
            .map(|s| String::from_utf8_lossy(&s).trim().to_string())
            .unwrap_or_default()
    })
    .clone()
}

pub fn new_instance_id() -> Result<String, IntentError> {
    let mut b = [0u8; 16];
    // getrandom(2): one system call, no file to open (the kernel's pool is
    // initialised long before any unit starts; if it is not, this waits).
    // SAFETY: the kernel writes at most b.len() bytes into b.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if usize::try_from(n) != Ok(b.len()) {
        let mut f = std::fs::File::open("/dev/urandom").io("open", "/dev/urandom")?;
        std::io::Read::read_exact(&mut f, &mut b).io("read", "/dev/urandom")?;
    }
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

impl Intent {
    /// Write durably into `rundir` (root 0600).
    pub fn write(&self, rundir: &Dir) -> Result<(), IntentError> {
        let mut bytes = serde_json::to_vec_pretty(self).map_err(|source| IntentError::Encode {
            path: rundir.path.join(INTENT_FILE),
            source,
        })?;
        bytes.push(b'\n');
        Ok(dirs::durable_write(rundir, INTENT_FILE, &bytes, 0o600)?)
    }

    /// Read the record. `Ok(None)` when there is none; an unreadable or
    /// unparsable record is an error (the caller keeps what it cannot read).
    pub fn read(rundir: &Dir) -> Result<Option<Intent>, IntentError> {
        let path = rundir.path.join(INTENT_FILE);
        let Some(bytes) =
            dirs::read_small(rundir, INTENT_FILE, MAX_INTENT_BYTES).map_err(|source| {
                IntentError::Read {
                    path: path.clone(),
                    source,
                }
            })?
        else {
            return Ok(None);
        };
        Intent::parse(path, &bytes).map(Some)
    }

    /// Parse a record's bytes (what [`Intent::read`] read from `path`).
    pub fn parse(path: PathBuf, bytes: &[u8]) -> Result<Intent, IntentError> {
        serde_json::from_slice(bytes).map_err(|source| IntentError::Parse { path, source })
    }

    pub fn path(runtime_dir: &Path) -> PathBuf {
        runtime_dir.join(INTENT_FILE)
    }
}
