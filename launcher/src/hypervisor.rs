//! Hypervisor command lines rendered from the spec. Nothing secret is ever
//! rendered: credentials are passed as paths into the VM's private tmpfs.

use std::path::{Path, PathBuf};

use crate::spec::{Accel, Machine, Spec, FW_CFG_CREDENTIAL_PREFIX};

/// libvirt's default `seccomp_sandbox = 1` set: QEMU's own seccomp filter.
pub const QEMU_SANDBOX: &str =
    "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny";

/// Paths the rendered command line refers to.
#[derive(Debug, Clone)]
pub struct Layout {
    pub qmp_socket: PathBuf,
    pub credentials_dir: PathBuf,
}

/// QEMU option values escape ',' by doubling it.
fn qemu_escape(p: &Path) -> String {
    p.to_string_lossy().replace(',', ",,")
}

/// The QEMU argv (argv[0] is the binary). `seccomp` says whether to add
/// `-sandbox` (the binary was built with seccomp support).
pub fn qemu_argv(spec: &Spec, layout: &Layout, seccomp: bool) -> Vec<String> {
    let mut a: Vec<String> = Vec::new();
    let mut push = |xs: &[&str]| a.extend(xs.iter().map(|s| s.to_string()));
    push(&[&spec.hypervisor.binary.to_string_lossy()]);
    push(&["-name", &format!("guest={},debug-threads=on", spec.name)]);
    push(&["-nodefaults", "-no-user-config", "-display", "none"]);
    let machine = match spec.hypervisor.machine {
        Machine::Microvm => "microvm",
        Machine::Pc => "pc",
        Machine::Q35 => "q35",
    };
    push(&["-machine", machine]);
    match spec.hypervisor.accel {
        Accel::Kvm => push(&["-accel", "kvm", "-cpu", "host"]),
        Accel::Tcg => push(&["-accel", "tcg", "-cpu", "max"]),
    }
    push(&["-smp", &spec.vcpus.to_string()]);
    push(&["-m", &format!("{}M", spec.memory_mib)]);
    push(&["-kernel", &spec.kernel.to_string_lossy()]);
    if let Some(initrd) = &spec.initrd {
        push(&["-initrd", &initrd.to_string_lossy()]);
    }
    if !spec.cmdline.is_empty() {
        push(&["-append", &spec.cmdline]);
    }
    push(&["-serial", "stdio", "-no-reboot"]);
    push(&[
        "-qmp",
        &format!(
            "unix:{},server=on,wait=off",
            qemu_escape(&layout.qmp_socket)
        ),
    ]);
    let blk = match spec.hypervisor.machine {
        Machine::Microvm => "virtio-blk-device",
        Machine::Pc | Machine::Q35 => "virtio-blk-pci",
    };
    for (i, d) in spec.disks.iter().enumerate() {
        let ro = if d.read_only { ",readonly=on" } else { "" };
        push(&[
            "-drive",
            &format!(
                "file={},format=raw,if=none,id=disk{i},cache=none,aio=threads{ro}",
                qemu_escape(&d.path)
            ),
        ]);
        push(&["-device", &format!("{blk},drive=disk{i}")]);
    }
    for c in &spec.credentials {
        push(&[
            "-fw_cfg",
            &format!(
                "name={FW_CFG_CREDENTIAL_PREFIX}{},file={}",
                c.name,
                qemu_escape(&layout.credentials_dir.join(&c.name))
            ),
        ]);
    }
    if seccomp {
        push(&["-sandbox", QEMU_SANDBOX]);
    }
    a
}

/// Whether `qemu -help` lists `-sandbox` (QEMU built with seccomp). Runs the
/// binary with an empty environment, after the privilege drop.
pub fn qemu_has_seccomp(binary: &Path) -> bool {
    std::process::Command::new(binary)
        .arg("-help")
        .env_clear()
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .any(|l| l.starts_with("-sandbox on"))
        })
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::*;

    fn spec() -> Spec {
        serde_json::from_str(
            r#"{"version":1,"name":"web","principal":{"user":"vm-web","group":"vm-web"},
            "hypervisor":{"kind":"qemu","binary":"/usr/bin/qemu-system-x86_64","accel":"tcg","machine":"microvm"},
            "vcpus":2,"memory_mib":512,"kernel":"/k/bzImage","initrd":"/k/initrd","cmdline":"console=ttyS0 quiet",
            "credentials":[{"name":"db-password","source":{"systemd":"db-password"}}],
            "disks":[{"path":"/var/lib/vmwarden/web/root.img","read_only":false},{"path":"/data/a,b.img","read_only":true}]}"#,
        )
        .unwrap()
    }

    fn layout() -> Layout {
        Layout {
            qmp_socket: "/run/vmwarden/web/control/qmp.sock".into(),
            credentials_dir: "/run/vmwarden/web/credentials".into(),
        }
    }

    #[test]
    fn renders_golden_argv() {
        let argv = qemu_argv(&spec(), &layout(), true);
        let want = [
            "/usr/bin/qemu-system-x86_64",
            "-name", "guest=web,debug-threads=on",
            "-nodefaults", "-no-user-config", "-display", "none",
            "-machine", "microvm",
            "-accel", "tcg", "-cpu", "max",
            "-smp", "2", "-m", "512M",
            "-kernel", "/k/bzImage", "-initrd", "/k/initrd",
            "-append", "console=ttyS0 quiet",
            "-serial", "stdio", "-no-reboot",
            "-qmp", "unix:/run/vmwarden/web/control/qmp.sock,server=on,wait=off",
            "-drive", "file=/var/lib/vmwarden/web/root.img,format=raw,if=none,id=disk0,cache=none,aio=threads",
            "-device", "virtio-blk-device,drive=disk0",
            "-drive", "file=/data/a,,b.img,format=raw,if=none,id=disk1,cache=none,aio=threads,readonly=on",
            "-device", "virtio-blk-device,drive=disk1",
            "-fw_cfg", "name=opt/io.systemd.credentials/db-password,file=/run/vmwarden/web/credentials/db-password",
            "-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
        ];
        assert_eq!(argv, want);
    }

    #[test]
    fn kvm_and_pci_machines() {
        let mut s = spec();
        s.hypervisor.accel = Accel::Kvm;
        s.hypervisor.machine = Machine::Q35;
        let argv = qemu_argv(&s, &layout(), false).join(" ");
        assert!(argv.contains("-accel kvm -cpu host"));
        assert!(argv.contains("virtio-blk-pci,drive=disk0"));
        assert!(!argv.contains("-sandbox"));
    }

    #[test]
    fn no_secret_material_in_argv() {
        // Only credential names and tmpfs paths appear, never a source path.
        let mut s = spec();
        s.credentials[0].source = CredentialSource::Path("/run/secrets/token".into());
        let argv = qemu_argv(&s, &layout(), true).join(" ");
        assert!(!argv.contains("/run/secrets"));
    }
}
