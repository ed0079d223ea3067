//! The guest's notify socket (`vsock.notify`, `vsock.notify_port`): how a
//! firecracker guest's poweroff ends its VM.
//!
//! systemd in a guest (254 and later) reads the credential
//! `vmm.notify_socket` and sends its service manager's notifications to
//! that address; with `vsock-stream:2:PORT` it connects to the host (CID 2)
//! on vsock port PORT, once per message. Shortly before the guest ends,
//! systemd-shutdown sends `X_SYSTEMD_SHUTDOWN=poweroff` (or `halt`,
//! `reboot`, `kexec`, `exit`; systemd 256 and later): systemd-vmspawn learns
//! so how its guest ended. Firecracker has no ACPI power-off: a poweroff
//! halts the guest and firecracker runs on. So for a firecracker VM with
//! vsock the launcher puts the credential on the kernel command line
//! (firecracker has neither fw_cfg nor SMBIOS; the value is no secret) and
//! starts a helper (`vmm-notify`, `launch::helpers`) that listens where
//! firecracker's hybrid vsock delivers a guest's connection to host port
//! PORT, `control/vsock.sock_PORT`, and ends firecracker when the guest
//! says it powers off (`hypervisor::vmm_notify`).
//!
//! A guest without systemd never reads the credential: the kernel keeps a
//! dotted parameter such as `systemd.set_credential=` away from init's
//! arguments and environment, and nothing connects; its poweroff halts, as
//! before.

use std::path::Path;

use crate::config::spec::{HypervisorKind, Spec, SpecError, MAX_CMDLINE_BYTES};

/// The host port of the guest's notify socket when the spec names none:
/// microvm.nix's (its cloud-hypervisor runner's `vsock-stream:2:8888`).
pub const DEFAULT_PORT: u32 = 8888;
/// The highest vsock port: `u32::MAX` is `VMADDR_PORT_ANY`.
pub const PORT_MAX: u32 = u32::MAX - 1;
/// The credential systemd reads its notify address from.
pub const CREDENTIAL: &str = "vmm.notify_socket";

/// The kernel command-line parameter that gives the guest's systemd its
/// notify address: the host (CID 2) on vsock `port`, a stream connection
/// per message.
pub fn kernel_param(port: u32) -> String {
    format!("systemd.set_credential={CREDENTIAL}:vsock-stream:2:{port}")
}

/// Whether a command-line word sets the notify credential itself.
fn sets_credential(word: &str) -> bool {
    let w = word.trim_matches('"');
    ["systemd.set_credential=", "systemd.set_credential_binary="]
        .iter()
        .any(|p| {
            w.strip_prefix(p)
                .and_then(|rest| rest.strip_prefix(CREDENTIAL))
                .is_some_and(|rest| rest.starts_with(':'))
        })
}

impl Spec {
    /// The host vsock port on which the guest's notify messages arrive:
    /// `Some` for a firecracker VM with vsock unless `vsock.notify` is
    /// false; `None` for every other VM.
    pub fn vmm_notify_port(&self) -> Option<u32> {
        let v = self.vsock.as_ref()?;
        let firecracker = self.hypervisor.kind == HypervisorKind::Firecracker;
        (firecracker && v.notify.unwrap_or(true)).then(|| v.notify_port.unwrap_or(DEFAULT_PORT))
    }

    /// The guest's kernel command line as the hypervisor is given it:
    /// `cmdline`, and the notify credential when the VM has a notify socket.
    pub fn boot_cmdline(&self) -> String {
        match self.vmm_notify_port() {
            None => self.cmdline.clone(),
            Some(port) if self.cmdline.is_empty() => kernel_param(port),
            Some(port) => format!("{} {}", self.cmdline, kernel_param(port)),
        }
    }

    pub(crate) fn validate_vmm_notify(&self, path: &Path) -> Result<(), SpecError> {
        let bad = |field: &str, reason: String| SpecError::Invalid {
            path: path.to_path_buf(),
            field: field.to_string(),
            reason,
        };
        let Some(v) = &self.vsock else { return Ok(()) };
        let kind = self.hypervisor.kind;
        if v.notify == Some(true) && kind != HypervisorKind::Firecracker {
            return Err(bad(
                "vsock.notify",
                format!(
                    "is true, but {} needs no notify socket: a poweroff inside its guest ends it through ACPI (exit 0); \
                     only firecracker, which has no ACPI power-off, gets one. Remove vsock.notify",
                    kind.as_str()
                ),
            ));
        }
        if let Some(p) = v.notify_port {
            if self.vmm_notify_port().is_none() {
                return Err(bad(
                    "vsock.notify_port",
                    "is set, but the VM has no notify socket (vsock.notify is false, or the hypervisor is not firecracker); remove it"
                        .into(),
                ));
            }
            if p == 0 || p > PORT_MAX {
                return Err(bad(
                    "vsock.notify_port",
                    format!("is {p}; must be 1..={PORT_MAX} (4294967295 is VMADDR_PORT_ANY)"),
                ));
            }
        }
        let Some(port) = self.vmm_notify_port() else {
            return Ok(());
        };
        if self.cmdline.split_whitespace().any(sets_credential) {
            return Err(bad(
                "cmdline",
                format!(
                    "sets the {CREDENTIAL} credential itself, which vsock.notify (on by default for firecracker with vsock) \
                     sets to the host's listener; remove it from cmdline, or set vsock.notify = false"
                ),
            ));
        }
        let len = self.boot_cmdline().len();
        if len > MAX_CMDLINE_BYTES {
            return Err(bad(
                "cmdline",
                format!(
                    "is {} bytes, and with vsock.notify's `{}` the guest's command line would be {len}; the limit is \
                     {MAX_CMDLINE_BYTES}: shorten it, or set vsock.notify = false",
                    self.cmdline.len(),
                    kernel_param(port)
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(v: serde_json::Value) -> Spec {
        Spec::parse(
            Path::new("/etc/vmwarden/vms/web.json"),
            &serde_json::to_vec(&v).unwrap(),
        )
        .unwrap()
    }

    fn base(kind: &str) -> serde_json::Value {
        json!({
            "version": 1, "name": "web",
            "principal": { "uid": 61001, "gid": 61001 },
            "hypervisor": { "kind": kind, "binary": "/usr/bin/hv", "accel": "kvm" },
            "vcpus": 1, "memory_mib": 256, "kernel": "/boot/vmlinux",
            "cmdline": "console=ttyS0 reboot=k",
            "vsock": { "cid": 5, "backend": "user" }
        })
    }

    fn refusal(v: serde_json::Value) -> (String, String) {
        match spec(v).validate_vmm_notify(Path::new("/etc/vmwarden/vms/web.json")) {
            Err(SpecError::Invalid { field, reason, .. }) => (field, reason),
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn a_firecracker_vm_with_vsock_gets_the_credential_on_its_command_line_by_default() {
        let s = spec(base("firecracker"));
        assert_eq!(s.vmm_notify_port(), Some(8888));
        assert_eq!(
            s.boot_cmdline(),
            "console=ttyS0 reboot=k systemd.set_credential=vmm.notify_socket:vsock-stream:2:8888"
        );
        s.validate_vmm_notify(Path::new("/x")).unwrap();
        // Its own port; an empty command line gets the parameter alone.
        let mut v = base("firecracker");
        v["vsock"]["notify_port"] = json!(1234);
        v["cmdline"] = json!("");
        let s = spec(v);
        assert_eq!(
            s.boot_cmdline(),
            "systemd.set_credential=vmm.notify_socket:vsock-stream:2:1234"
        );
        // Off by the spec, or no vsock: the command line as written.
        let mut v = base("firecracker");
        v["vsock"]["notify"] = json!(false);
        let s = spec(v);
        assert_eq!(s.vmm_notify_port(), None);
        assert_eq!(s.boot_cmdline(), "console=ttyS0 reboot=k");
        let mut v = base("firecracker");
        v.as_object_mut().unwrap().remove("vsock");
        assert_eq!(spec(v).vmm_notify_port(), None);
        // QEMU and cloud-hypervisor power off through ACPI: never.
        for kind in ["qemu", "cloud-hypervisor"] {
            let s = spec(base(kind));
            assert_eq!(s.vmm_notify_port(), None, "{kind}");
            assert_eq!(s.boot_cmdline(), "console=ttyS0 reboot=k");
        }
    }

    #[test]
    fn what_the_notify_fields_refuse_names_the_field_and_what_to_change() {
        let mut v = base("cloud-hypervisor");
        v["vsock"]["notify"] = json!(true);
        let (f, r) = refusal(v);
        assert_eq!(f, "vsock.notify");
        assert!(
            r.contains("cloud-hypervisor") && r.contains("Remove vsock.notify"),
            "{r}"
        );

        let mut v = base("firecracker");
        v["vsock"]["notify"] = json!(false);
        v["vsock"]["notify_port"] = json!(9000);
        assert_eq!(refusal(v).0, "vsock.notify_port");
        let mut v = base("qemu");
        v["vsock"]["notify_port"] = json!(9000);
        assert_eq!(refusal(v).0, "vsock.notify_port");

        for p in [0u64, 4_294_967_295] {
            let mut v = base("firecracker");
            v["vsock"]["notify_port"] = json!(p);
            let (f, r) = refusal(v);
            assert_eq!(f, "vsock.notify_port");
            assert!(r.contains("must be 1..=4294967294"), "{r}");
        }

        for own in [
            "systemd.set_credential=vmm.notify_socket:vsock-stream:2:1",
            "\"systemd.set_credential=vmm.notify_socket:vsock:2:1\"",
            "systemd.set_credential_binary=vmm.notify_socket:dnNvY2s=",
        ] {
            let mut v = base("firecracker");
            v["cmdline"] = json!(format!("console=ttyS0 {own}"));
            let (f, r) = refusal(v);
            assert_eq!(f, "cmdline", "{own}");
            assert!(r.contains("vsock.notify = false"), "{r}");
        }
        // Another credential, or the notify credential with notify off: fine.
        let mut v = base("firecracker");
        v["cmdline"] = json!("systemd.set_credential=vmm.notify_socketx:1");
        spec(v).validate_vmm_notify(Path::new("/x")).unwrap();
        let mut v = base("firecracker");
        v["vsock"]["notify"] = json!(false);
        v["cmdline"] = json!("systemd.set_credential=vmm.notify_socket:vsock-stream:2:1");
        spec(v).validate_vmm_notify(Path::new("/x")).unwrap();

        // Room for the parameter within the limit.
        let mut v = base("firecracker");
        v["cmdline"] = json!("x".repeat(MAX_CMDLINE_BYTES - 10));
        let (f, r) = refusal(v);
        assert_eq!(f, "cmdline");
        assert!(r.contains("shorten it, or set vsock.notify = false"), "{r}");
    }
}
