//! Whether a mount namespace holds a mount with a given source, asked of
//! the kernel with `listmount(2)` and `statmount(2)` (Linux 6.8; another
//! namespace's mounts by its id, `NS_GET_MNTNS_ID`, from 6.11): a few
//! small system calls per mount, no text. Reading the namespace's
//! `/proc/PID/mountinfo` instead makes the kernel print every mount's
//! paths and options (a third of a millisecond per namespace of a VM
//! here), which the teardown tools paid once per namespace on the host.
//!
//! This is only a filter in front of the mountinfo read
//! (`mountinfo::credential_mounts_in`): a namespace is skipped only when
//! the kernel listed every one of its mounts and none has a wanted source.
//! `statmount`'s `sb_source` is mountinfo's source field (both are the
//! superblock's `show_devname`, else the mount's device name; a bind
//! mount and a moved mount keep it), and `listmount` lists every mount of
//! the namespace, also those a task's root or a chroot hides from its
//! mountinfo. Anything the kernel will not answer (an older kernel, a
//! filter, a namespace gone or a pid reused meanwhile, a source too long)
//! answers `None`, and the caller reads the mountinfo as before.

use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;

use nix::errno::Errno;

/// `statmount(2)` and `listmount(2)`: the `libc` crate has neither's
/// number on x86_64 nor their structures (the numbers are the same on
/// every architecture but alpha and mips, which the launcher does not
/// build for).
const SYS_STATMOUNT: libc::c_long = 457;
const SYS_LISTMOUNT: libc::c_long = 458;
/// `_IOR(0xb7, 5, __u64)`: a mount namespace's 64-bit id from its nsfs fd.
const NS_GET_MNTNS_ID: libc::c_ulong = 0x8008_b705;
/// `LSMT_ROOT`: list from the namespace's root mount.
const LSMT_ROOT: u64 = u64::MAX;
const STATMOUNT_MNT_BASIC: u64 = 0x2;
const STATMOUNT_SB_SOURCE: u64 = 0x200;
/// `sizeof(struct statmount)`: its strings start here.
const HEADER: usize = 512;
const OFF_MASK: usize = 8;
const OFF_MNT_PARENT_ID: usize = 48;
const OFF_SB_SOURCE: usize = 124;
/// Mount ids asked of `listmount` per call.
const BATCH: usize = 64;

/// `struct mnt_id_req` with the namespace id (`MNT_ID_REQ_SIZE_VER1`).
#[repr(C)]
struct MntIdReq {
    size: u32,
    spare: u32,
    mnt_id: u64,
    param: u64,
    mnt_ns_id: u64,
}

impl MntIdReq {
    fn new(mnt_id: u64, param: u64, mnt_ns_id: u64) -> MntIdReq {
        MntIdReq {
            size: size_of::<MntIdReq>() as u32,
            spare: 0,
            mnt_id,
            param,
            mnt_ns_id,
        }
    }
}

/// The 64-bit id of the mount namespace task `tid` is in, when that is
/// still the namespace `ns` (`mnt:[INODE]`, as the scan read it): a task
/// that exited or changed namespace since, or a reused pid, is an error.
fn ns_id(tid: u32, ns: &str) -> Result<u64, Errno> {
    let ino: u64 = ns
        .strip_prefix("mnt:[")
        .and_then(|s| s.strip_suffix(']'))
        .and_then(|s| s.parse().ok())
        .ok_or(Errno::EINVAL)?;
    let f = std::fs::File::open(format!("/proc/{tid}/ns/mnt"))
        .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))?;
    let md = f
        .metadata()
        .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))?;
    if md.ino() != ino {
        return Err(Errno::ESTALE);
    }
    let mut id: u64 = 0;
    // SAFETY: NS_GET_MNTNS_ID writes one u64 through the pointer, which
    // points to `id`; the fd is open for the call's whole length.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), NS_GET_MNTNS_ID, &raw mut id) };
    if rc != 0 {
        return Err(Errno::last());
    }
    Ok(id)
}

/// Up to [`BATCH`] mount ids of namespace `ns_id` under mount `parent`
/// (`LSMT_ROOT`: the namespace's first mount under its root), after
/// `last` (0: from the first).
fn list(ns_id: u64, parent: u64, last: u64, buf: &mut [u64]) -> Result<usize, Errno> {
    let req = MntIdReq::new(parent, last, ns_id);
    // SAFETY: `req` is a valid mnt_id_req of the size it states; the
    // kernel writes at most `buf.len()` u64s into `buf`, which owns them.
    let rc = unsafe {
        libc::syscall(
            SYS_LISTMOUNT,
            &raw const req,
            buf.as_mut_ptr(),
            buf.len(),
            0u32,
        )
    };
    usize::try_from(rc)
        .map(|n| n.min(buf.len()))
        .map_err(|_| Errno::last())
}

/// The parent of mount `mnt_id` in namespace `ns_id` (itself for the
/// namespace's root mount).
fn parent_of(mnt_id: u64, ns_id: u64) -> Result<u64, Errno> {
    let mut buf = [0u64; HEADER / 8];
    let req = MntIdReq::new(mnt_id, STATMOUNT_MNT_BASIC, ns_id);
    // SAFETY: `req` is a valid mnt_id_req of the size it states; the
    // kernel writes at most `size_of_val(&buf)` bytes into `buf`.
    let rc = unsafe {
        libc::syscall(
            SYS_STATMOUNT,
            &raw const req,
            buf.as_mut_ptr(),
            size_of_val(&buf),
            0u32,
        )
    };
    if rc != 0 {
        return Err(Errno::last());
    }
    if buf[OFF_MASK / 8] & STATMOUNT_MNT_BASIC == 0 {
        return Err(Errno::ENOSYS);
    }
    Ok(buf[OFF_MNT_PARENT_ID / 8])
}

/// Every mount id of namespace `ns_id`. `LSMT_ROOT` alone lists only what
/// lies under the namespace's first mount (a VM's namespace, whose tasks
/// moved to another root, shows one mount that way): the namespace's
/// topmost mount is found by climbing from that one through the parents,
/// and everything under the topmost is listed, the topmost with it.
fn mount_ids(ns_id: u64) -> Result<Vec<u64>, Errno> {
    let mut buf = vec![0u64; BATCH];
    let mut top = match list(ns_id, LSMT_ROOT, 0, &mut buf)? {
        0 => return Err(Errno::ENOENT),
        _ => buf[0],
    };
    // A mount namespace is a tree of a few levels; the bound only stops
    // a loop the kernel would never make.
    for _ in 0..64 {
        let up = parent_of(top, ns_id)?;
        if up == top {
            let mut all = vec![top];
            let mut last = 0u64;
            loop {
                let n = list(ns_id, top, last, &mut buf)?;
                all.extend_from_slice(&buf[..n]);
                if n < buf.len() {
                    return Ok(all);
                }
                last = buf[n - 1];
            }
        }
        top = up;
    }
    Err(Errno::ELOOP)
}

/// The source of mount `mnt_id` in namespace `ns_id`, into `buf`; `None`
/// when the mount is gone.
fn source_of(mnt_id: u64, ns_id: u64, buf: &mut [u64]) -> Result<Option<Vec<u8>>, Errno> {
    let req = MntIdReq::new(mnt_id, STATMOUNT_SB_SOURCE, ns_id);
    let len = size_of_val(buf);
    // SAFETY: `req` is a valid mnt_id_req of the size it states; the
    // kernel writes at most `len` bytes into `buf`, which owns them.
    let rc = unsafe { libc::syscall(SYS_STATMOUNT, &raw const req, buf.as_mut_ptr(), len, 0u32) };
    if rc != 0 {
        return match Errno::last() {
            Errno::ENOENT => Ok(None),
            e => Err(e),
        };
    }
    let b: Vec<u8> = buf.iter().flat_map(|w| w.to_ne_bytes()).collect();
    let at = |off: usize| u64::from_ne_bytes(b[off..off + 8].try_into().unwrap_or_default());
    if at(OFF_MASK) & STATMOUNT_SB_SOURCE == 0 {
        // An older kernel without the source: it cannot answer.
        return Err(Errno::ENOSYS);
    }
    let rel = u32::from_ne_bytes(
        b[OFF_SB_SOURCE..OFF_SB_SOURCE + 4]
            .try_into()
            .unwrap_or_default(),
    );
    let start = HEADER + usize::try_from(rel).map_err(|_| Errno::EOVERFLOW)?;
    let rest = b.get(start..).ok_or(Errno::EOVERFLOW)?;
    let end = rest.iter().position(|c| *c == 0).ok_or(Errno::EOVERFLOW)?;
    Ok(Some(rest[..end].to_vec()))
}

/// The source of every mount of the namespace `ns` (`mnt:[INODE]`) that
/// task `tid` is in. `None`: the kernel could not tell (see the module's
/// header).
pub fn sources(tid: u32, ns: &str) -> Option<Vec<Vec<u8>>> {
    let id = ns_id(tid, ns).ok()?;
    let ids = mount_ids(id).ok()?;
    // The kernel allocates what the caller offers, for every call: 256
    // bytes of strings take any source a VM's mount has; a longer one is
    // asked again with 4 KiB (longer still: EOVERFLOW, the mountinfo is read).
    let mut small = vec![0u64; (HEADER + 256) / 8];
    let mut big = Vec::new();
    let mut out = Vec::with_capacity(ids.len());
    for m in ids {
        let src = match source_of(m, id, &mut small) {
            Err(Errno::EOVERFLOW) => {
                big.resize((HEADER + 4096) / 8, 0u64);
                source_of(m, id, &mut big)
            }
            r => r,
        };
        match src {
            Ok(Some(src)) => out.push(src),
            Ok(None) => {}
            Err(_) => return None,
        }
    }
    Some(out)
}

/// Does the namespace `ns` that task `tid` is in hold a mount whose
/// source `wanted` accepts? `None`: the kernel could not tell; read its
/// mountinfo.
pub fn holds_source(tid: u32, ns: &str, wanted: impl Fn(&[u8]) -> bool) -> Option<bool> {
    sources(tid, ns).map(|all| all.iter().any(|s| wanted(s)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_own_namespace_holds_its_root_and_not_a_made_up_source() {
        let ns = std::fs::read_link("/proc/self/ns/mnt").unwrap();
        let ns = ns.to_string_lossy();
        let me = std::process::id();
        // A kernel without listmount (before 6.8) or namespace ids (before
        // 6.11) answers None; this host's answers.
        let any = holds_source(me, &ns, |_| true);
        let none = holds_source(me, &ns, |s| s == b"no such source here \x01");
        assert_eq!((any, none), (Some(true), Some(false)));
        // Another namespace's inode for this task: not answered.
        assert_eq!(holds_source(me, "mnt:[1]", |_| true), None);
    }
}
