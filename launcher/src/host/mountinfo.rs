//! `/proc/PID/mountinfo` parsing, used to verify the credential tmpfs and to
//! find credential mounts that survive in any mount namespace.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use crate::config::names::VmName;
use crate::config::paths::CREDENTIALS_DIR;
use crate::host::procs::{self, MountNamespace, Scan, UidFilter, Wants};

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

/// Undo mountinfo's octal escapes (`\040` for space and friends), on raw
/// bytes: a mount point need not be UTF-8.
fn unescape(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if let (Some(b'\\'), Some(oct)) = (s.get(i), s.get(i + 1..i + 4)) {
            if let Some(v) = octal_byte(oct) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(s[i]);
        i += 1;
    }
    out
}

/// Three octal digits as one byte (`None` above 0o377 or on a non-digit).
fn octal_byte(oct: &[u8]) -> Option<u8> {
    let text = std::str::from_utf8(oct).ok()?;
    u8::from_str_radix(text, 8).ok()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(&unescape(b)).into_owned()
}

/// Parse mountinfo from raw bytes. Mount points keep their exact bytes; one
/// line that is not UTF-8 never hides the others.
pub fn parse(data: &[u8]) -> Vec<Mount> {
    data.split(|b| *b == b'\n').filter_map(parse_line).collect()
}

/// One mountinfo line (`None` for one that does not parse).
fn parse_line(line: &[u8]) -> Option<Mount> {
    let sep = line.windows(3).position(|w| w == b" - ")?;
    let (left, right) = (&line[..sep], &line[sep + 3..]);
    let l: Vec<&[u8]> = left.split(|b| *b == b' ').collect();
    let r: Vec<&[u8]> = right.split(|b| *b == b' ').collect();
    if l.len() < 6 || r.len() < 3 {
        return None;
    }
    Some(Mount {
        mount_id: std::str::from_utf8(l[0])
            .ok()
            .and_then(|t| t.parse().ok())
            .unwrap_or(0),
        mount_point: PathBuf::from(OsString::from_vec(unescape(l[4]))),
        mount_options: text(l[5]),
        fstype: text(r[0]),
        source: text(r[1]),
        super_options: text(r[2]),
    })
}

/// The last mount at `target` in mountinfo `data`, as [`parse`] would give
/// it (`parse(data).into_iter().rev().find(|m| m.mount_point == target)`),
/// without building every other mount: lines are taken from the end and
/// only the one whose mount point is `target` is parsed whole.
pub fn last_at(data: &[u8], target: &Path) -> Option<Mount> {
    data.rsplit(|b| *b == b'\n')
        .filter(|line| {
            line.split(|b| *b == b' ')
                .nth(4)
                .is_some_and(|mp| Path::new(OsStr::from_bytes(&unescape(mp))) == target)
        })
        .find_map(parse_line)
        .filter(|m| m.mount_point == target)
}

/// The last mount at `target` in process `pid`'s table ([`last_at`]).
pub fn read_last_at(pid: &str, target: &Path) -> std::io::Result<Option<Mount>> {
    Ok(last_at(
        &read_bytes(&format!("/proc/{pid}/mountinfo"))?,
        target,
    ))
}

/// Mounts of process `pid` (`"self"` for the caller).
pub fn read(pid: &str) -> std::io::Result<Vec<Mount>> {
    Ok(parse(&read_bytes(&format!("/proc/{pid}/mountinfo"))?))
}

/// A /proc file whole (see [`procs::read_proc_file`]).
fn read_bytes(path: &str) -> std::io::Result<Vec<u8>> {
    procs::read_proc_file(path).map_err(std::io::Error::from)
}

/// Mount namespace inode of a process (`/proc/PID/ns/mnt`).
pub fn mnt_ns(pid: &str) -> Option<String> {
    std::fs::read_link(format!("/proc/{pid}/ns/mnt"))
        .ok()
        .map(|p| p.to_string_lossy().into_owned())
}

/// Is `m` a vmwarden credential tmpfs (of VM `name`, or of any VM) under
/// `runtime_root`? See [`credential_mount_vm`].
pub fn is_credential_mount(m: &Mount, runtime_root: Option<&Path>, name: Option<&VmName>) -> bool {
    credential_mount_vm(m, runtime_root).is_some_and(|vm| name.map_or(true, |n| n == &vm))
}

/// The VM whose credential tmpfs `m` is, if it is one. The source string
/// alone is not enough: anyone can name a tmpfs anything. With a
/// `runtime_root`, only a mount exactly at `RUNTIME_ROOT/VM/credentials`
/// counts: another set of roots with a VM of the same name is not ours to
/// report or unmount. `None` (any root) is for audits of the whole host.
pub fn credential_mount_vm(m: &Mount, runtime_root: Option<&Path>) -> Option<VmName> {
    let vm = VmName::parse(m.source.strip_prefix(CREDENTIAL_SOURCE_PREFIX)?).ok()?;
    let at_its_place = match runtime_root {
        Some(root) => m.mount_point == root.join(vm.as_str()).join(CREDENTIALS_DIR),
        None => m.mount_point.ends_with(format!("{vm}/{CREDENTIALS_DIR}")),
    };
    (m.fstype == "tmpfs" && at_its_place).then_some(vm)
}

/// One entry per credential mount per mount namespace: a thread in that
/// namespace, the namespace, and the mount of VM `name` (or of any VM when
/// `name` is `None`) under `runtime_root` (or under any root when `None`).
/// Only namespaces of this (the initial) user namespace count: an
/// unprivileged user's namespace is not vmwarden's and cannot hold a mount
/// the launcher made.
pub fn credential_mounts_everywhere(
    runtime_root: Option<&Path>,
    name: Option<&VmName>,
) -> Vec<(u32, String, Mount)> {
    let scan = Scan::take(&Wants {
        uids: UidFilter::None,
        mount_namespaces: true,
    });
    credential_mounts_in(&scan, runtime_root, name)
}

/// [`credential_mounts_everywhere`] from the namespaces a scan found (one
/// scan shared by a command's checks). A scan taken without namespaces
/// takes its own.
pub fn credential_mounts_in(
    scan: &Scan,
    runtime_root: Option<&Path>,
    name: Option<&VmName>,
) -> Vec<(u32, String, Mount)> {
    match scan.mount_namespaces() {
        Some(nss) => nss
            .iter()
            .flat_map(|ns| credential_mounts_of(ns, runtime_root, name))
            .collect(),
        None => credential_mounts_everywhere(runtime_root, name),
    }
}

/// The credential mounts in one namespace, read from the mountinfo of the
/// first of its tasks that can still be read (one task per namespace: the
/// cost does not grow with the processes or threads sharing it).
fn credential_mounts_of(
    ns: &MountNamespace,
    runtime_root: Option<&Path>,
    name: Option<&VmName>,
) -> Vec<(u32, String, Mount)> {
    for tid in &ns.tasks {
        let Ok(data) = read_bytes(&format!("/proc/{tid}/mountinfo")) else {
            continue;
        };
        // Only a line naming the credential source can be one (the source
        // field is escaped only for space, tab, newline and backslash, none
        // of which the prefix holds): the rest is not parsed.
        let needle = CREDENTIAL_SOURCE_PREFIX.as_bytes();
        return data
            .split(|b| *b == b'\n')
            .filter(|l| l.windows(needle.len()).any(|w| w == needle))
            .flat_map(parse)
            .filter(|m| is_credential_mount(m, runtime_root, name))
            .map(|m| (*tid, ns.ns.clone(), m))
            .collect();
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn web() -> VmName {
        VmName::parse("web").unwrap()
    }

    fn mount(fstype: &str, source: &str, mp: &str) -> Mount {
        Mount {
            mount_id: 1,
            mount_point: PathBuf::from(mp),
            mount_options: "ro".into(),
            fstype: fstype.into(),
            source: source.into(),
            super_options: "noswap".into(),
        }
    }

    #[test]
    fn the_last_mount_at_a_path_is_found_without_parsing_the_rest() {
        let t = "1 0 8:1 / / rw - ext4 /dev/sda1 rw\n\
            36 1 0:32 / /run/vm\\040x/credentials rw - tmpfs first rw,size=4k\n\
            broken /run/vm\\040x/credentials line\n\
            37 1 0:33 / /run/vm\\040x/credentials rw master:1 - tmpfs vmwarden-creds:web rw,noswap\n\
            38 37 0:34 / /run/vm\\040x/credentials/sub rw - tmpfs other rw\n\
            39 1 0:35 / /run/vm\\040x/credentials/ - \n";
        for target in [
            "/run/vm x/credentials",
            "/",
            "/run/vm x/credentials/sub",
            "/nowhere",
        ] {
            let target = Path::new(target);
            let want = parse(t.as_bytes())
                .into_iter()
                .rev()
                .find(|m| m.mount_point == target);
            assert_eq!(last_at(t.as_bytes(), target), want, "{}", target.display());
        }
        let m = last_at(t.as_bytes(), Path::new("/run/vm x/credentials")).unwrap();
        assert_eq!((m.mount_id, m.source.as_str()), (37, "vmwarden-creds:web"));
        assert!(m.has_option("noswap"));
        assert_eq!(last_at(t.as_bytes(), Path::new("/nowhere")), None);
    }

    #[test]
    fn parses_tmpfs_line_with_optional_fields() {
        let t = "36 35 0:32 / /run/vmwarden/web/credentials ro,nosuid,nodev,noexec,relatime master:1 - tmpfs vmwarden-creds:web ro,size=20k,nr_inodes=18,mode=500,uid=61000,gid=61000,noswap\n";
        let m = &parse(t.as_bytes())[0];
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
        let w = mount(
            "tmpfs",
            "vmwarden-creds:web",
            "/run/vmwarden/web/credentials",
        );
        let root = Some(Path::new("/run/vmwarden"));
        assert!(is_credential_mount(&w, root, Some(&web())));
        assert!(is_credential_mount(&w, root, None));
        assert!(is_credential_mount(&w, None, None));
        assert!(!is_credential_mount(
            &w,
            root,
            Some(&VmName::parse("db").unwrap())
        ));
        let ramfs = mount(
            "ramfs",
            "vmwarden-creds:web",
            "/run/vmwarden/web/credentials",
        );
        assert!(!is_credential_mount(&ramfs, None, None));
        assert!(!is_credential_mount(
            &mount("tmpfs", "vmwarden-creds:web", "/tmp"),
            None,
            None
        ));
        assert!(!is_credential_mount(
            &mount("tmpfs", "vmwarden-creds:../x", "/x/credentials"),
            None,
            None
        ));
    }

    #[test]
    fn another_set_of_roots_with_the_same_vm_name_is_not_ours() {
        let other = mount(
            "tmpfs",
            "vmwarden-creds:web",
            "/srv/other/run/web/credentials",
        );
        assert!(!is_credential_mount(
            &other,
            Some(Path::new("/run/vmwarden")),
            Some(&web())
        ));
        // Nor a root that merely ends like ours.
        assert!(!is_credential_mount(
            &other,
            Some(Path::new("/run")),
            Some(&web())
        ));
        assert!(is_credential_mount(
            &other,
            Some(Path::new("/srv/other/run")),
            Some(&web())
        ));
    }

    #[test]
    fn unescapes_spaces() {
        let t = b"1 0 0:1 / /a\\040b rw - tmpfs x rw\n";
        assert_eq!(parse(t)[0].mount_point, PathBuf::from("/a b"));
    }

    #[test]
    fn a_line_that_is_not_utf8_keeps_its_bytes_and_hides_nothing() {
        use std::os::unix::ffi::OsStrExt;
        let t = b"1 0 0:1 / /x\xff rw - tmpfs x rw\n2 0 0:2 / /run/vmwarden/web/credentials ro - tmpfs vmwarden-creds:web ro,noswap\n";
        let ms = parse(t);
        assert_eq!(ms.len(), 2);
        assert_eq!(ms[0].mount_point.as_os_str().as_bytes(), b"/x\xff");
        assert!(is_credential_mount(
            &ms[1],
            Some(Path::new("/run/vmwarden")),
            Some(&web())
        ));
    }
}
