//! Reading and checking a launch spec: [`Spec::load`] reads, parses and
//! checks every field and the files the spec names; the per-hypervisor
//! refusals come from the table in [`crate::config::capabilities`].
//! Nothing on the host is created or changed here.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;

use crate::config::capabilities::{self, Feature};
use crate::config::extra_args;
use crate::config::names::{check_abs_normalised, VmName};
use crate::config::spec::{
    tag_byte, Accel, CredentialSource, DiskFormat, FsTypeField, HypervisorKind, ShareProto, Spec,
    SpecError, ThreadPoolSize, VsockBackend, DISK_SERIAL_MAX, FW_CFG_CREDENTIAL_PREFIX,
    FW_CFG_NAME_MAX, MAX_CMDLINE_BYTES, MAX_MEMORY_MIB, MAX_QUEUES, MAX_THREAD_POOL, MAX_VCPUS,
    MIN_MEMORY_MIB, NIX_STORE, SHARE_TAG_MAX, VSOCK_CID_MAX, VSOCK_CID_MIN,
};

impl Spec {
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
        if let Some(r) = &self.resources {
            r.validate()
                .map_err(|e| bad(&format!("resources.{}", e.field), e.reason))?;
        }
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
        self.validate_vmm_notify(path)?;
        self.validate_host_tools(path)?;
        self.validate_memory(path)?;
        self.validate_interfaces(path)?;
        self.validate_user_network(path)?;
        self.validate_devices(path)?;
        crate::config::hibernate::check(self, path)?;
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
        if self.hypervisor.accel != Accel::Kvm {
            if let Some(r) = capabilities::refusal(kind, Feature::Tcg) {
                return Err(bad(
                    r.field,
                    r.reason_with(&format!("{:?}", self.hypervisor.accel)),
                ));
            }
        }
        if !self.credentials.is_empty() {
            if let Some(r) = capabilities::refusal(kind, Feature::Credentials) {
                return Err(bad(r.field, r.reason.to_string()));
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
        let kind = self.hypervisor.kind;
        for (i, d) in self.disks.iter().enumerate() {
            if d.format() == DiskFormat::Qcow2 {
                if let Some(r) = capabilities::refusal(kind, Feature::Qcow2) {
                    return Err(bad(r.field_at(i), r.reason.into()));
                }
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
                if let Some(r) = capabilities::refusal(kind, Feature::DiskSerial) {
                    return Err(bad(r.field_at(i), r.reason.into()));
                }
            }
            for (on, feature) in [
                (d.direct == Some(true), Feature::DirectIo),
                (d.discard == Some(true), Feature::Discard),
            ] {
                if let Some(r) = capabilities::refusal(kind, feature).filter(|_| on) {
                    return Err(bad(r.field_at(i), r.reason.into()));
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
        if !self.shares.is_empty() {
            if let Some(r) = capabilities::refusal(kind, Feature::Shares) {
                return Err(bad(r.field.into(), r.reason.into()));
            }
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
                        "is false, but {} is under {NIX_STORE}, which a guest may only read (its build users' group can add paths to it, and everything the host runs comes from it); set read_only = true",
                        sh.source.display()
                    ),
                ));
            }
            match sh.proto {
                ShareProto::NineP => {
                    if let Some(r) = capabilities::refusal(kind, Feature::NinePShares) {
                        return Err(bad(r.field_at(i), r.reason.into()));
                    }
                }
                ShareProto::Virtiofs if self.virtiofsd.is_none() => {
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
            if let Some(ThreadPoolSize::Count(n)) = v.thread_pool_size {
                if n > MAX_THREAD_POOL {
                    return Err(bad(
                        "virtiofsd.thread_pool_size".into(),
                        format!("is {n}; at most {MAX_THREAD_POOL} threads (0 for no pool, \"nproc\" for one per CPU)"),
                    ));
                }
            }
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
        if v.backend == VsockBackend::Vhost {
            if let Some(r) = capabilities::refusal(kind, Feature::VhostVsock) {
                return Err(bad(r.field, r.reason.to_string()));
            }
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
        let kind = self.hypervisor.kind;
        for (i, n) in self.interfaces.iter().enumerate() {
            if !seen.insert(n.tap.clone()) {
                return Err(bad(
                    format!("interfaces[{i}].tap"),
                    format!("{:?} appears twice", n.tap),
                ));
            }
            let q = n.queues();
            if !(1..=MAX_QUEUES).contains(&q) {
                return Err(bad(
                    format!("interfaces[{i}].queues"),
                    format!("is {q}; give 1 to {MAX_QUEUES} (microvm.nix uses one per vCPU)"),
                ));
            }
            for (on, feature) in [(n.vhost(), Feature::VhostNet), (q > 1, Feature::Multiqueue)] {
                if let Some(r) = capabilities::refusal(kind, feature).filter(|_| on) {
                    return Err(bad(r.field_at(i), r.reason.into()));
                }
            }
            self.validate_macvtap(path, i)?;
        }
        Ok(())
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
        if let Some(u) = &self.user_network {
            regular("user_network.binary", &u.binary, true)?;
        }
        for (i, sh) in self.shares.iter().enumerate() {
            let field = format!("shares[{i}].source");
            let md = match std::fs::metadata(&sh.source) {
                // Made at launch, or refused by name (`launch::share_sources`).
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && !sh.read_only => continue,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(bad(&field, &sh.source, format!("does not exist; the source of a read-only share (tag {:?}) must exist (vmwarden makes only a writable share's missing source)", sh.tag)))
                }
                r => r.map_err(|e| bad(&field, &sh.source, e.to_string()))?,
            };
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::spec::tests::{base, check};
    use serde_json::json;

    fn field_of(v: serde_json::Value) -> String {
        match check(v) {
            Err(SpecError::Invalid { field, .. }) => field,
            other => panic!("expected an invalid field, got {other:?}"),
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

    /// Every row of the capability table is what the check says, to the
    /// byte: each feature asked of a hypervisor without it is refused with
    /// the row's field and reason, and QEMU takes them all.
    #[test]
    fn each_capability_refusal_is_the_tables_row() {
        let with = |kind: HypervisorKind, feature: Feature| {
            let mut v = base();
            v["hypervisor"]["kind"] = json!(kind.as_str());
            match feature {
                Feature::Tcg => v["hypervisor"]["accel"] = json!("tcg"),
                Feature::Credentials => {
                    v["credentials"] = json!([{ "name": "a", "source": { "systemd": "a" } }])
                }
                Feature::Qcow2 => {
                    v["disks"] =
                        json!([{ "path": "/var/lib/vmwarden/web/a.img", "format": "qcow2" }])
                }
                Feature::DiskSerial => {
                    v["disks"] = json!([{ "path": "/var/lib/vmwarden/web/a.img", "serial": "s1" }])
                }
                Feature::Shares | Feature::NinePShares => {
                    v["shares"] = json!([{ "tag": "t", "source": "/srv/t", "proto": "9p" }])
                }
                Feature::VhostVsock => v["vsock"] = json!({ "cid": 3, "backend": "vhost" }),
                Feature::Balloon => v["balloon"] = json!({}),
                Feature::Console => v["console"] = json!(true),
                Feature::UserNetwork => {
                    v["user_network"] = json!({ "binary": "/usr/bin/passt", "id": "qemu" })
                }
                Feature::DirectIo => {
                    v["disks"] = json!([{ "path": "/var/lib/vmwarden/web/a.img", "direct": true }])
                }
                Feature::Discard => {
                    v["disks"] = json!([{ "path": "/var/lib/vmwarden/web/a.img", "discard": true }])
                }
                Feature::VhostNet => v["interfaces"] = json!([{ "tap": "vmw-a", "vhost": true }]),
                Feature::Multiqueue => v["interfaces"] = json!([{ "tap": "vmw-a", "queues": 2 }]),
                Feature::MemMerge => v["mem_merge"] = json!(true),
                Feature::Macvtap => {
                    v["interfaces"] = json!([{ "tap": "vmw-a", "type": "macvtap",
                        "macvtap": { "link": "eth0", "mode": "bridge" } }])
                }
                Feature::PciPassthrough | Feature::UsbPassthrough => {
                    let bus = if feature == Feature::PciPassthrough {
                        "pci"
                    } else {
                        "usb"
                    };
                    let path = if bus == "pci" {
                        "0000:01:00.0"
                    } else {
                        "hostbus=1,hostaddr=2"
                    };
                    v["hypervisor"]["machine"] = json!("q35");
                    v["devices"] = json!([{ "bus": bus, "path": path }])
                }
            }
            v
        };
        for r in capabilities::REFUSALS {
            let got = check(with(r.kind, r.feature)).unwrap_err().to_string();
            let want = format!(
                "spec /etc/vmwarden/vms/web.json: field `{}` {}",
                r.field_at(0),
                r.reason_with("Tcg")
            );
            assert_eq!(got, want, "{:?} {:?}", r.kind, r.feature);
        }
        for feature in [
            Feature::Tcg,
            Feature::Credentials,
            Feature::Qcow2,
            Feature::DiskSerial,
            Feature::Shares,
            Feature::VhostVsock,
            Feature::Balloon,
            Feature::Console,
            Feature::UserNetwork,
            Feature::DirectIo,
            Feature::Discard,
            Feature::VhostNet,
            Feature::Multiqueue,
            Feature::MemMerge,
            Feature::Macvtap,
        ] {
            let spec = check(with(HypervisorKind::Qemu, feature));
            assert!(spec.is_ok(), "qemu {feature:?}: {spec:?}");
        }
    }
}
