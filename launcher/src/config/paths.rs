//! The three roots every binary works under, and the paths derived from them.
//!
//! Defaults are the production paths; tests, demos and benchmarks override
//! each root with a flag or the matching `VMWARDEN_*` environment variable so
//! many VMs can run side by side without touching the real roots (the flags
//! are the binaries' own, in `src/bin/cli/`: this part is plain data).

use std::path::{Path, PathBuf};

use crate::config::names::{check_abs_normalised, VmName};

pub const DEFAULT_CONFIG_DIR: &str = "/etc/vmwarden/vms";
pub const DEFAULT_RUNTIME_ROOT: &str = "/run/vmwarden";
pub const DEFAULT_STATE_ROOT: &str = "/var/lib/vmwarden";

/// Entry names inside one VM's runtime directory.
pub const LEASE_FILE: &str = "instance.lock";
pub const INTENT_FILE: &str = "instance.json";
/// The last cleanup's verdict, its residue count and how many instances it
/// has torn down since the runtime root was made (root's, 0644; written by
/// `vmwarden-cleanup` under the lease, read by `vmwarden metrics`). In the
/// keep set with the lease file: it outlives the instances it counts.
pub const LAST_CLEANUP_FILE: &str = "last-cleanup.json";
/// The credential floor: a mount id below every mount of the VM's
/// credential tmpfs this boot (root's, 0644; see
/// `instance::creds_floor`). In the keep set: it bounds what an instance
/// may have left after the instance is gone.
pub const CREDS_FLOOR_FILE: &str = "creds-floor.json";
/// The exact bytes of the spec the running instance was launched from
/// (root 0600): `status` compares it with the configured spec, and the
/// teardown tools read it while the intent record exists.
pub const LAUNCHED_SPEC_FILE: &str = "launched-spec.json";
pub const CONTROL_DIR: &str = "control";
pub const CREDENTIALS_DIR: &str = "credentials";
pub const QMP_SOCKET: &str = "qmp.sock";
/// The console relay's socket, in `control/`: bound by root (root's, 0600,
/// like QMP's) and handed to the relay as an fd; `vmwarden console`
/// connects to it.
pub const CONSOLE_SOCKET: &str = "console.sock";
/// cloud-hypervisor's and firecracker's HTTP API socket, in `control/`.
pub const API_SOCKET: &str = "api.sock";
/// cloud-hypervisor's lock beside its API socket (`<socket>.lock`: it opens
/// it write-only and takes an OFD write lock before binding). Made empty by
/// the launcher (principal's, 0600), so that control/ still admits no
/// regular file the hypervisor creates.
pub const CH_API_LOCK: &str = "api.sock.lock";
/// firecracker's `--config-file`, in `control/` (principal's, 0600).
pub const FIRECRACKER_CONFIG: &str = "firecracker.json";
/// vhost-device-vsock's vhost-user socket (QEMU connects), in `control/`.
pub const VSOCK_VHOST_USER_SOCKET: &str = "vsock-vhost-user.sock";
/// The host side of the VM's hybrid vsock (vhost-device-vsock's `uds-path`,
/// cloud-hypervisor's `--vsock socket=`): connect and send
/// `CONNECT <port>\n`. In `control/`.
pub const VSOCK_SOCKET: &str = "vsock.sock";

/// Where a hybrid vsock (firecracker's, cloud-hypervisor's) delivers a
/// guest's connection to host port `port`: `<VSOCK_SOCKET>_<port>`, in
/// `control/` (the guest's notify socket, `config::vmm_notify`).
pub fn hybrid_vsock_port_socket_name(port: u32) -> String {
    format!("{VSOCK_SOCKET}_{port}")
}

/// The vhost-user socket of the virtiofsd serving share `tag`, in
/// `control/` (tags are `[A-Za-z0-9_.-]`, at most 31 bytes; never `.`/`..`
/// as a whole name because of the prefix).
pub fn virtiofs_socket_name(tag: &str) -> String {
    format!("virtiofs-{tag}.sock")
}

/// Inside the state root: the principal registry (root 0700).
pub const PRINCIPALS_DIR: &str = ".principals";

/// The record of an adoption in progress, in the state root
/// (`teardown::adopt`): while it names items still to move, the launch
/// makes none of them itself.
pub fn adopt_record_name(name: &VmName) -> String {
    format!(".adopt-{name}.json")
}

/// A root flag that cannot be used (`EX_CONFIG`).
#[derive(Debug, thiserror::Error)]
#[error("{flag} {path}: {reason}")]
pub struct RootError {
    pub flag: &'static str,
    pub path: PathBuf,
    pub reason: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Roots {
    pub config_dir: PathBuf,
    pub runtime_root: PathBuf,
    pub state_root: PathBuf,
}

impl Default for Roots {
    fn default() -> Self {
        Roots {
            config_dir: DEFAULT_CONFIG_DIR.into(),
            runtime_root: DEFAULT_RUNTIME_ROOT.into(),
            state_root: DEFAULT_STATE_ROOT.into(),
        }
    }
}

impl Roots {
    pub fn spec_path(&self, name: &VmName) -> PathBuf {
        self.config_dir.join(format!("{name}.json"))
    }
    pub fn runtime_dir(&self, name: &VmName) -> PathBuf {
        self.runtime_root.join(name)
    }
    pub fn state_dir(&self, name: &VmName) -> PathBuf {
        self.state_root.join(name)
    }
    pub fn control_dir(&self, name: &VmName) -> PathBuf {
        self.runtime_dir(name).join(CONTROL_DIR)
    }
    pub fn credentials_dir(&self, name: &VmName) -> PathBuf {
        self.runtime_dir(name).join(CREDENTIALS_DIR)
    }
    pub fn qmp_socket(&self, name: &VmName) -> PathBuf {
        self.control_dir(name).join(QMP_SOCKET)
    }
    pub fn console_socket(&self, name: &VmName) -> PathBuf {
        self.control_dir(name).join(CONSOLE_SOCKET)
    }
    pub fn api_socket(&self, name: &VmName) -> PathBuf {
        self.control_dir(name).join(API_SOCKET)
    }
    pub fn lease_path(&self, name: &VmName) -> PathBuf {
        self.runtime_dir(name).join(LEASE_FILE)
    }
    pub fn intent_path(&self, name: &VmName) -> PathBuf {
        self.runtime_dir(name).join(INTENT_FILE)
    }
    pub fn launched_spec_path(&self, name: &VmName) -> PathBuf {
        self.runtime_dir(name).join(LAUNCHED_SPEC_FILE)
    }
    pub fn principals_dir(&self) -> PathBuf {
        self.state_root.join(PRINCIPALS_DIR)
    }
    /// Checks every root is absolute and normalised; a relative root would
    /// make every later openat walk depend on the working directory.
    pub fn validate(&self) -> Result<(), RootError> {
        for (flag, p) in [
            ("--config-dir", &self.config_dir),
            ("--runtime-root", &self.runtime_root),
            ("--state-root", &self.state_root),
        ] {
            let refuse = |reason| RootError {
                flag,
                path: p.clone(),
                reason,
            };
            check_abs_normalised(p).map_err(refuse)?;
            if p == Path::new("/") {
                return Err(refuse("must not be /"));
            }
        }
        Ok(())
    }
}
