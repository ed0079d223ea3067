//! `/proc/PID/mountinfo` parsing, used to verify the credential tmpfs and to
//! find credential mounts that survive in any mount namespace.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use crate::config::names::VmName;
use crate::config::paths::CREDENTIALS_DIR;
use crate::host::ns_mounts;
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
    /// mountinfo's id (reused once the mount is gone); 0: not read.
    pub mount_id: u64,
    /// The kernel's unique id (`STATX_MNT_ID_UNIQUE`, never reused);
    /// 0: not known.
    pub unique_id: u64,
    /// Its mount namespace's id (`NS_GET_MNTNS_ID`, never reused, unlike
    /// the `mnt:[INODE]` number); 0: not known.
    pub ns_id: u64,
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
        unique_id: 0,
        ns_id: 0,
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

/// The mount at `target` as the caller sees it (the topmost one mounted
/// there; `None` when nothing is mounted exactly at `target`), stated as
/// [`read_last_at`]`("self", target)` states it. Asked of the kernel with
/// `statx(2)` (the unique mount id) and `statmount(2)` (Linux 6.8; the
/// options and the source from 6.10 and 6.11): a few system calls, instead
/// of reading and searching the whole mount table. A kernel without them
/// (or a filter that refuses them) is answered from `/proc/self/mountinfo`.
pub fn own_mount_at(target: &Path) -> std::io::Result<Option<Mount>> {
    match statmount::at(target) {
        Ok(found) => Ok(found),
        Err(_) => read_last_at("self", target),
    }
}

/// `statmount(2)`, declared here: the `libc` crate has neither its
/// structures nor, on x86_64, its number (the same on every architecture
/// but alpha and mips, which the launcher does not build for).
mod statmount {
    use std::ffi::CString;
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    use std::path::{Path, PathBuf};

    use nix::errno::Errno;

    use super::Mount;

    use crate::host::statmount_abi::{
        MntIdReq, FS_TYPE, HEADER, MNT_BASIC, MNT_OPTS, MNT_POINT, OFF_FS_TYPE, OFF_MASK,
        OFF_MNT_ATTR, OFF_MNT_ID_OLD, OFF_MNT_OPTS, OFF_MNT_POINT, OFF_SB_FLAGS, OFF_SB_SOURCE,
        SB_BASIC, SB_SOURCE, SYS_STATMOUNT,
    };

    const WANT: u64 = SB_BASIC | MNT_BASIC | MNT_POINT | FS_TYPE | MNT_OPTS | SB_SOURCE;

    /// `ENOSYS` and friends: the caller falls back to mountinfo.
    pub fn at(target: &Path) -> Result<Option<Mount>, Errno> {
        let id = unique_mount_id(target)?;
        let mut buf = vec![0u64; 512];
        let req = MntIdReq::own_ns(id, WANT);
        let len = buf.len() * 8;
        // SAFETY: `req` is a valid mnt_id_req of the size it states; the
        // kernel writes at most `len` bytes into `buf`, which owns them.
        let rc =
            unsafe { libc::syscall(SYS_STATMOUNT, &raw const req, buf.as_mut_ptr(), len, 0u32) };
        if rc != 0 {
            return Err(Errno::last());
        }
        let bytes: Vec<u8> = buf.iter().flat_map(|w| w.to_ne_bytes()).collect();
        Ok(decode(&bytes, target)?.map(|m| Mount { unique_id: id, ..m }))
    }

    /// The unique id (`STATX_MNT_ID_UNIQUE`, Linux 6.8) of the mount `target`
    /// is on.
    fn unique_mount_id(target: &Path) -> Result<u64, Errno> {
        let c = CString::new(target.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)?;
        // SAFETY: an all-zero statx is a valid value for the kernel to fill.
        let mut stx: libc::statx = unsafe { std::mem::zeroed() };
        // SAFETY: `c` is NUL-terminated and `stx` is valid for writing.
        let rc = unsafe {
            libc::statx(
                libc::AT_FDCWD,
                c.as_ptr(),
                libc::AT_SYMLINK_NOFOLLOW | libc::AT_NO_AUTOMOUNT,
                libc::STATX_MNT_ID_UNIQUE,
                &raw mut stx,
            )
        };
        if rc != 0 {
            return Err(Errno::last());
        }
        if stx.stx_mask & libc::STATX_MNT_ID_UNIQUE == 0 {
            return Err(Errno::ENOSYS);
        }
        Ok(stx.stx_mnt_id)
    }

    fn u32_at(b: &[u8], off: usize) -> u32 {
        u32::from_ne_bytes(b[off..off + 4].try_into().unwrap_or_default())
    }

    fn u64_at(b: &[u8], off: usize) -> u64 {
        u64::from_ne_bytes(b[off..off + 8].try_into().unwrap_or_default())
    }

    /// The NUL-terminated string whose offset into the string area is at
    /// `off`.
    fn str_at(b: &[u8], off: usize) -> Result<&[u8], Errno> {
        let start = HEADER + usize::try_from(u32_at(b, off)).map_err(|_| Errno::EOVERFLOW)?;
        let rest = b.get(start..).ok_or(Errno::EOVERFLOW)?;
        let end = rest.iter().position(|c| *c == 0).ok_or(Errno::EOVERFLOW)?;
        Ok(&rest[..end])
    }

    /// The per-mount flags as mountinfo's sixth field spells them.
    fn mount_options(attr: u64) -> String {
        const RDONLY: u64 = 0x1;
        const NOSUID: u64 = 0x2;
        const NODEV: u64 = 0x4;
        const NOEXEC: u64 = 0x8;
        const ATIME: u64 = 0x70;
        const NOATIME: u64 = 0x10;
        const RELATIME: u64 = 0x0;
        const NODIRATIME: u64 = 0x80;
        const NOSYMFOLLOW: u64 = 0x20_0000;
        let mut o = String::from(if attr & RDONLY != 0 { "ro" } else { "rw" });
        for (bit, name) in [(NOSUID, "nosuid"), (NODEV, "nodev"), (NOEXEC, "noexec")] {
            if attr & bit != 0 {
                o.push(',');
                o.push_str(name);
            }
        }
        if attr & ATIME == NOATIME {
            o.push_str(",noatime");
        }
        if attr & NODIRATIME != 0 {
            o.push_str(",nodiratime");
        }
        if attr & ATIME == RELATIME {
            o.push_str(",relatime");
        }
        if attr & NOSYMFOLLOW != 0 {
            o.push_str(",nosymfollow");
        }
        o
    }

    fn decode(b: &[u8], target: &Path) -> Result<Option<Mount>, Errno> {
        if u64_at(b, OFF_MASK) & WANT != WANT {
            // An older kernel that leaves some of them out.
            return Err(Errno::ENOSYS);
        }
        let text = |off| str_at(b, off).map(|s| String::from_utf8_lossy(s).into_owned());
        let mount_point = PathBuf::from(std::ffi::OsString::from_vec(
            str_at(b, OFF_MNT_POINT)?.to_vec(),
        ));
        if mount_point != target {
            // `target` is not a mount point: the mount it lies on is above.
            return Ok(None);
        }
        // The superblock's flags, then the filesystem's own options, as
        // mountinfo's last field has them.
        const SB_RDONLY: u32 = 0x1;
        const SB_SYNCHRONOUS: u32 = 0x10;
        const SB_DIRSYNC: u32 = 0x80;
        const SB_LAZYTIME: u32 = 0x200_0000;
        let flags = u32_at(b, OFF_SB_FLAGS);
        let mut super_options = String::from(if flags & SB_RDONLY != 0 { "ro" } else { "rw" });
        for (bit, name) in [
            (SB_SYNCHRONOUS, "sync"),
            (SB_DIRSYNC, "dirsync"),
            (SB_LAZYTIME, "lazytime"),
        ] {
            if flags & bit != 0 {
                super_options.push(',');
                super_options.push_str(name);
            }
        }
        let fs = text(OFF_MNT_OPTS)?;
        if !fs.is_empty() {
            super_options.push(',');
            super_options.push_str(&fs);
        }
        Ok(Some(Mount {
            mount_id: u64::from(u32_at(b, OFF_MNT_ID_OLD)),
            unique_id: 0,
            ns_id: 0,
            mount_point,
            mount_options: mount_options(u64_at(b, OFF_MNT_ATTR)),
            fstype: text(OFF_FS_TYPE)?,
            source: text(OFF_SB_SOURCE)?,
            super_options,
        }))
    }
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
    credential_mount_vm(m, runtime_root).is_some_and(|vm| name.is_none_or(|n| n == &vm))
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
/// Only namespaces this (the initial) user namespace owns count: one
/// another user namespace owns is not vmwarden's (a copy of a VM's tmpfs
/// there, made by root with `unshare -Urm`, is not looked for).
pub fn credential_mounts_everywhere(
    runtime_root: Option<&Path>,
    name: Option<&VmName>,
) -> Vec<(u32, String, Mount)> {
    // No /proc walk up front: the kernel enumerates the namespaces, and
    // the walk runs only to name a process of one that holds a mount.
    credential_mounts_in(&Scan::default(), runtime_root, name, 0)
}

/// [`credential_mounts_everywhere`] from the namespaces a scan found (one
/// scan shared by a command's checks). A scan taken without namespaces
/// takes its own. `since`: the kernel is asked only for mounts with a
/// unique id at or above it (a credential floor, `instance::creds_floor`;
/// 0: every mount); the `/proc` walk, when the kernel cannot answer,
/// reads every mount.
pub fn credential_mounts_in(
    scan: &Scan,
    runtime_root: Option<&Path>,
    name: Option<&VmName>,
    since: u64,
) -> Vec<(u32, String, Mount)> {
    match name {
        Some(n) => credential_mounts_of_vms(scan, runtime_root, std::slice::from_ref(n), since),
        None => credential_mounts_filtered(scan, runtime_root, None, since),
    }
}

/// [`credential_mounts_in`] of the VMs `names` (their mounts, in one pass).
pub fn credential_mounts_of_vms(
    scan: &Scan,
    runtime_root: Option<&Path>,
    names: &[VmName],
    since: u64,
) -> Vec<(u32, String, Mount)> {
    credential_mounts_filtered(scan, runtime_root, Some(names), since)
}

fn credential_mounts_filtered(
    scan: &Scan,
    runtime_root: Option<&Path>,
    names: Option<&[VmName]>,
    since: u64,
) -> Vec<(u32, String, Mount)> {
    if let Some(held) = ns_mounts::holding(|src| wanted_source(src, names), since) {
        return credential_mounts_held(scan, held, runtime_root, names);
    }
    match scan.mount_namespaces() {
        Some(nss) => nss
            .iter()
            .flat_map(|ns| credential_mounts_of(ns, runtime_root, names, false))
            .collect(),
        None => {
            let scan = Scan::take(&Wants {
                uids: UidFilter::None,
                mount_namespaces: true,
            });
            credential_mounts_filtered(&scan, runtime_root, names, since)
        }
    }
}

/// The credential mounts in the namespaces the kernel enumerated that
/// hold a wanted source ([`ns_mounts::holding`]; none, the usual answer,
/// costs no `/proc` read). Where a process is in one, it is named and
/// its mountinfo read as the `/proc` walk would ([`credential_mounts_of`]);
/// a namespace no process is in (kept by an nsfs bind mount or an fd) is
/// judged from what the kernel stated of each mount, with pid 0.
fn credential_mounts_held(
    scan: &Scan,
    held: Vec<ns_mounts::Holding>,
    runtime_root: Option<&Path>,
    names: Option<&[VmName]>,
) -> Vec<(u32, String, Mount)> {
    if held.is_empty() {
        return Vec::new();
    }
    let walked;
    let nss = match scan.mount_namespaces() {
        Some(nss) => nss,
        None => {
            walked = Scan::take(&Wants {
                uids: UidFilter::None,
                mount_namespaces: true,
            });
            walked.mount_namespaces().unwrap_or_default()
        }
    };
    let wanted = |m: &Mount| match names {
        None => is_credential_mount(m, runtime_root, None),
        Some(ns) => ns
            .iter()
            .any(|n| is_credential_mount(m, runtime_root, Some(n))),
    };
    let mut out = Vec::new();
    for h in held {
        let ns = nss.iter().find(|n| n.ns == h.ns);
        let read = ns.map(|ns| credential_mounts_of(ns, runtime_root, names, true));
        match read {
            // Each with the namespace's id and the unique id the kernel
            // stated for its mountinfo id.
            Some(read) if !read.is_empty() => out.extend(read.into_iter().map(|(p, n, m)| {
                let unique = |k: &ns_mounts::HeldMount| (k.old_id == m.mount_id).then_some(k.id);
                let unique_id = h.mounts.iter().find_map(unique).unwrap_or(0);
                (
                    p,
                    n,
                    Mount {
                        unique_id,
                        ns_id: h.ns_id,
                        ..m
                    },
                )
            })),
            // No process in it, or its processes' mountinfo shows none of
            // what the kernel stated (a process chrooted away from the
            // mount, or gone since the scan): judged from the kernel's
            // word, the first process named.
            _ => {
                let still_in = |t: &u32| mnt_ns(&t.to_string()).as_deref() == Some(h.ns.as_str());
                let pid = ns
                    .and_then(|ns| ns.tasks.iter().copied().find(still_in))
                    .unwrap_or(0);
                out.extend(
                    h.mounts
                        .into_iter()
                        .map(|k| Mount {
                            mount_id: k.old_id,
                            unique_id: k.id,
                            ns_id: h.ns_id,
                            mount_point: k.mount_point,
                            mount_options: String::new(),
                            fstype: k.fstype,
                            source: k.source,
                            super_options: String::new(),
                        })
                        .filter(|m| wanted(m))
                        .map(|m| (pid, h.ns.clone(), m)),
                )
            }
        }
    }
    out
}

/// Who keeps a namespace of [`credential_mounts_in`]'s answer: `pid N`,
/// or for pid 0 none (an nsfs bind mount or an fd holds it).
pub fn holder(pid: u32) -> String {
    match pid {
        0 => "no process in it: held by an nsfs bind mount or an fd".into(),
        p => format!("pid {p}"),
    }
}

/// Could a mount with source `src` be the credential tmpfs of one of
/// `names` (of any VM when `None`)? What the kernel's filter in front of
/// the mountinfo read asks ([`ns_mounts::holds_source`]); the mountinfo
/// then decides as ever.
fn wanted_source(src: &[u8], names: Option<&[VmName]>) -> bool {
    let Some(rest) = src.strip_prefix(CREDENTIAL_SOURCE_PREFIX.as_bytes()) else {
        return false;
    };
    match names {
        None => true,
        Some(names) => names.iter().any(|n| n.as_str().as_bytes() == rest),
    }
}

/// The credential mounts in one namespace, read from the mountinfo of the
/// first of its tasks that can still be read (one task per namespace: the
/// cost does not grow with the processes or threads sharing it). A
/// namespace the kernel says holds no mount with one of the VMs' sources
/// ([`ns_mounts::holds_source`]) is not read, unless `held` (the kernel
/// has just said it holds one).
fn credential_mounts_of(
    ns: &MountNamespace,
    runtime_root: Option<&Path>,
    names: Option<&[VmName]>,
    held: bool,
) -> Vec<(u32, String, Mount)> {
    for tid in &ns.tasks {
        if !held
            && ns_mounts::holds_source(*tid, &ns.ns, |src| wanted_source(src, names)) == Some(false)
        {
            return Vec::new();
        }
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
            .filter(|m| match names {
                None => is_credential_mount(m, runtime_root, None),
                Some(ns) => ns
                    .iter()
                    .any(|n| is_credential_mount(m, runtime_root, Some(n))),
            })
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
            unique_id: 0,
            ns_id: 0,
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
    fn statmount_states_a_mount_as_mountinfo_does() {
        // Mounts every process has, read both ways (no root needed); a
        // kernel without statmount answers from mountinfo for both.
        let opts = |s: &str| {
            let mut v: Vec<String> = s.split(',').map(str::to_string).collect();
            v.sort();
            v
        };
        let mut compared = 0;
        for target in ["/", "/proc", "/sys", "/dev", "/run"] {
            let target = Path::new(target);
            let via_table = read_last_at("self", target).unwrap();
            let via_kernel = own_mount_at(target).unwrap();
            let (Some(t), Some(k)) = (&via_table, &via_kernel) else {
                assert_eq!(via_table, via_kernel, "{}", target.display());
                continue;
            };
            assert_eq!(
                (t.mount_id, &t.mount_point, &t.fstype, &t.source),
                (k.mount_id, &k.mount_point, &k.fstype, &k.source),
                "{}",
                target.display()
            );
            assert_eq!(opts(&t.mount_options), opts(&k.mount_options));
            assert_eq!(opts(&t.super_options), opts(&k.super_options));
            compared += 1;
        }
        assert!(compared >= 2, "no mount point to compare");
        // Not a mount point: nothing is mounted exactly there.
        assert_eq!(own_mount_at(Path::new("/proc/self")).unwrap(), None);
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

    /// Every source any namespace's mountinfo shows is among the kernel's
    /// answer for that namespace: on this host, its own namespace and
    /// every other one of this user namespace (each running VM's, whose
    /// tasks moved to another root, among them).
    #[test]
    fn the_kernel_lists_every_source_each_namespace_mountinfo_shows() {
        let scan = Scan::take(&Wants {
            uids: UidFilter::None,
            mount_namespaces: true,
        });
        let mut compared = 0;
        for ns in scan.mount_namespaces().unwrap() {
            let tid = ns.tasks[0];
            let (Some(listed), Ok(shown)) =
                (ns_mounts::sources(tid, &ns.ns), read(&tid.to_string()))
            else {
                continue; // exited meanwhile
            };
            for m in shown.iter().filter(|m| !m.source.contains('\\')) {
                assert!(
                    listed.iter().any(|s| s == m.source.as_bytes()),
                    "{}: {} at {} is not in {:?}",
                    ns.ns,
                    m.source,
                    m.mount_point.display(),
                    listed
                        .iter()
                        .map(|s| String::from_utf8_lossy(s).into_owned())
                        .collect::<Vec<_>>()
                );
            }
            assert!(listed.len() >= shown.len(), "{}", ns.ns);
            compared += 1;
        }
        assert!(compared > 0);
    }
}
