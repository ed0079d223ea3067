//! `/proc/PID/mountinfo` parsing, used to verify the credential tmpfs and to
//! find credential mounts that survive in any mount namespace.

use std::path::PathBuf;

use crate::config::names::VmName;
use crate::config::paths::CREDENTIALS_DIR;

/// Mount source given to a VM's credential tmpfs: identifies it in every
/// namespace's mountinfo.
pub fn credential_source(name: &VmName) -> String {
    format!("vmwarden-creds:{name}")
}
pub const CREDENTIAL_SOURCE_PREFIX: &str = "vmwarden-creds:";
/// Mount source of the read-only tmpfs that masks other VMs' directories.
pub const MASK_SOURCE: &str = "vmwarden-mask";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub mount_id: u64,
    pub mount_point: PathBuf,
    pub mount_options: String,
    pub fstype: String,
    pub source: String,
    pub super_options: String,
}

impl Mount {
    pub fn has_option(&self, opt: &str) -> bool {
        self.mount_options.split(',').any(|o| o == opt)
            || self.super_options.split(',').any(|o| o == opt)
    }
}

/// Undo mountinfo's octal escapes (`\040` for space and friends).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub fn parse(text: &str) -> Vec<Mount> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let l: Vec<&str> = left.split(' ').collect();
        let r: Vec<&str> = right.split(' ').collect();
        if l.len() < 6 || r.len() < 3 {
            continue;
        }
        out.push(Mount {
            mount_id: l[0].parse().unwrap_or(0),
            mount_point: PathBuf::from(unescape(l[4])),
            mount_options: l[5].to_string(),
            fstype: r[0].to_string(),
            source: unescape(r[1]),
            super_options: r[2].to_string(),
        });
    }
    out
}

/// Mounts of process `pid` (`"self"` for the caller).
pub fn read(pid: &str) -> std::io::Result<Vec<Mount>> {
    Ok(parse(&std::fs::read_to_string(format!(
        "/proc/{pid}/mountinfo"
    ))?))
}

/// Mount namespace inode of a process (`/proc/PID/ns/mnt`).
pub fn mnt_ns(pid: &str) -> Option<String> {
    std::fs::read_link(format!("/proc/{pid}/ns/mnt"))
        .ok()
        .map(|p| p.to_string_lossy().into_owned())
}

/// Is `m` a vmwarden credential tmpfs (of VM `name`, or of any VM)? The
/// source string alone is not enough: anyone can name a tmpfs anything.
pub fn is_credential_mount(m: &Mount, name: Option<&VmName>) -> bool {
    credential_mount_vm(m).is_some_and(|vm| name.map_or(true, |n| n == &vm))
}

/// The VM whose credential tmpfs `m` is, if it is one (see
/// [`is_credential_mount`]).
pub fn credential_mount_vm(m: &Mount) -> Option<VmName> {
    let vm = VmName::parse(m.source.strip_prefix(CREDENTIAL_SOURCE_PREFIX)?).ok()?;
    (m.fstype == "tmpfs" && m.mount_point.ends_with(format!("{vm}/{}", CREDENTIALS_DIR)))
        .then_some(vm)
}

/// Thread ids of every process (a process whose main thread has exited
/// still runs, and still holds its namespaces, in its other threads).
pub fn all_tids() -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        match std::fs::read_dir(format!("/proc/{pid}/task")) {
            Ok(tasks) => out.extend(
                tasks
                    .flatten()
                    .filter_map(|t| t.file_name().to_str().and_then(|s| s.parse::<u32>().ok())),
            ),
            Err(_) => out.push(pid),
        }
    }
    out
}

/// One entry per credential mount per mount namespace: a thread in that
/// namespace, the namespace, and the mount of VM `name` (or of any VM when
/// `name` is `None`). Only namespaces of this (the initial) user namespace
/// count: an unprivileged user's namespace is not vmwarden's and cannot
/// hold a mount the launcher made.
pub fn credential_mounts_everywhere(name: Option<&VmName>) -> Vec<(u32, String, Mount)> {
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    let my_userns = std::fs::read_link("/proc/self/ns/user").ok();
    for tid in all_tids() {
        let base = format!("/proc/{tid}");
        let Some(ns) = std::fs::read_link(format!("{base}/ns/mnt"))
            .ok()
            .map(|p| p.to_string_lossy().into_owned())
        else {
            continue;
        };
        if std::fs::read_link(format!("{base}/ns/user")).ok() != my_userns {
            continue;
        }
        if !seen.insert(ns.clone()) {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(format!("{base}/mountinfo")) else {
            continue;
        };
        for m in parse(&text) {
            if is_credential_mount(&m, name) {
                out.push((tid, ns.clone(), m));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_tmpfs_line_with_optional_fields() {
        let t = "36 35 0:32 / /run/vmwarden/web/credentials ro,nosuid,nodev,noexec,relatime master:1 - tmpfs vmwarden-creds:web ro,size=20k,nr_inodes=18,mode=500,uid=61000,gid=61000,noswap\n";
        let m = &parse(t)[0];
        assert_eq!(
            m.mount_point,
            PathBuf::from("/run/vmwarden/web/credentials")
        );
        assert_eq!(m.fstype, "tmpfs");
        assert_eq!(m.source, "vmwarden-creds:web");
        assert!(m.has_option("noswap"));
        assert!(m.has_option("ro"));
        assert!(!m.has_option("rw"));
    }

    #[test]
    fn credential_mount_needs_tmpfs_valid_name_and_its_mount_point() {
        let m = |fstype: &str, source: &str, mp: &str| Mount {
            mount_id: 1,
            mount_point: PathBuf::from(mp),
            mount_options: "ro".into(),
            fstype: fstype.into(),
            source: source.into(),
            super_options: "noswap".into(),
        };
        assert!(is_credential_mount(
            &m(
                "tmpfs",
                "vmwarden-creds:web",
                "/run/vmwarden/web/credentials"
            ),
            Some(&VmName::parse("web").unwrap())
        ));
        assert!(is_credential_mount(
            &m(
                "tmpfs",
                "vmwarden-creds:web",
                "/run/vmwarden/web/credentials"
            ),
            None
        ));
        assert!(!is_credential_mount(
            &m(
                "tmpfs",
                "vmwarden-creds:web",
                "/run/vmwarden/web/credentials"
            ),
            Some(&VmName::parse("db").unwrap())
        ));
        assert!(!is_credential_mount(
            &m(
                "ramfs",
                "vmwarden-creds:web",
                "/run/vmwarden/web/credentials"
            ),
            None
        ));
        assert!(!is_credential_mount(
            &m("tmpfs", "vmwarden-creds:web", "/tmp"),
            None
        ));
        assert!(!is_credential_mount(
            &m("tmpfs", "vmwarden-creds:../x", "/x/credentials"),
            None
        ));
    }

    #[test]
    fn unescapes_spaces() {
        let t = "1 0 0:1 / /a\\040b rw - tmpfs x rw\n";
        assert_eq!(parse(t)[0].mount_point, PathBuf::from("/a b"));
    }
}
