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

use crate::host::procs;

use crate::host::statmount_abi::{
    MntIdReq, FS_TYPE as STATMOUNT_FS_TYPE, HEADER, LSMT_ROOT, MNT_BASIC as STATMOUNT_MNT_BASIC,
    MNT_POINT as STATMOUNT_MNT_POINT, OFF_FS_TYPE, OFF_MASK, OFF_MNT_ID_OLD, OFF_MNT_PARENT_ID,
    OFF_MNT_POINT, OFF_SB_MAGIC, OFF_SB_SOURCE, SB_BASIC as STATMOUNT_SB_BASIC,
    SB_SOURCE as STATMOUNT_SB_SOURCE, SYS_LISTMOUNT, SYS_STATMOUNT,
};

/// `_IOR(0xb7, 5, __u64)`: a mount namespace's 64-bit id from its nsfs fd.
const NS_GET_MNTNS_ID: libc::c_ulong = 0x8008_b705;
/// Mount ids asked of `listmount` per call.
const BATCH: usize = 64;

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
    id_of(&f)
}

/// The id (`NS_GET_MNTNS_ID`, Linux 6.11; never reused) of the mount
/// namespace whose nsfs file `f` is.
pub fn id_of(f: &impl AsRawFd) -> Result<u64, Errno> {
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
    let req = MntIdReq::in_ns(parent, last, ns_id);
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
    let n = usize::try_from(rc)
        .map(|n| n.min(buf.len()))
        .map_err(|_| Errno::last())?;
    #[cfg(test)]
    tests::LISTED.with(|l| l.borrow_mut().push((ns_id, n)));
    Ok(n)
}

/// `statmount(2)` of mount `mnt_id` in namespace `ns_id`, asking `mask`,
/// into `buf`: the mask the kernel answered, or `None` when the mount is
/// gone (ENOENT).
fn statmount(mnt_id: u64, ns_id: u64, mask: u64, buf: &mut [u64]) -> Result<Option<u64>, Errno> {
    let req = MntIdReq::in_ns(mnt_id, mask, ns_id);
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
    Ok(Some(buf[OFF_MASK / 8]))
}

/// `buf`'s bytes, borrowed (no copy of the whole answer per mount).
fn bytes(buf: &[u64]) -> &[u8] {
    // SAFETY: the bytes of `buf` (u8 needs no alignment), borrowed no
    // longer than `buf` is.
    unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), size_of_val(buf)) }
}

/// The NUL-terminated string whose offset into statmount's string area
/// is the `u32` at header offset `off` of `b`; an offset or string that
/// does not fit in `b` is EOVERFLOW (the caller cannot answer, never an
/// empty string).
fn string_at(b: &[u8], off: usize) -> Result<Vec<u8>, Errno> {
    let rel = u32::from_ne_bytes(b[off..off + 4].try_into().unwrap_or_default());
    let start = HEADER + usize::try_from(rel).map_err(|_| Errno::EOVERFLOW)?;
    let rest = b.get(start..).ok_or(Errno::EOVERFLOW)?;
    let end = rest.iter().position(|c| *c == 0).ok_or(Errno::EOVERFLOW)?;
    Ok(rest[..end].to_vec())
}

/// The parent of mount `mnt_id` in namespace `ns_id` (itself for the
/// namespace's root mount).
fn parent_of(mnt_id: u64, ns_id: u64) -> Result<u64, Errno> {
    let mut buf = [0u64; HEADER / 8];
    let got = statmount(mnt_id, ns_id, STATMOUNT_MNT_BASIC, &mut buf)?.ok_or(Errno::ENOENT)?;
    if got & STATMOUNT_MNT_BASIC == 0 {
        return Err(Errno::ENOSYS);
    }
    Ok(buf[OFF_MNT_PARENT_ID / 8])
}

/// Every mount id of namespace `ns_id` at or above `since` (0: every one).
/// `LSMT_ROOT` alone lists only what lies under the namespace's first
/// mount (a VM's namespace, whose tasks moved to another root, shows one
/// mount that way): the namespace's topmost mount is found by climbing
/// from that one through the parents, and everything under the topmost
/// is listed, the topmost with it. `listmount` lists in id order from the
/// id after the one it is given, so a `since` skips the older mounts in
/// the kernel, unlisted.
fn mount_ids(ns_id: u64, since: u64) -> Result<Vec<u64>, Errno> {
    Listing::start(ns_id, since)?.rest()
}

/// [`mount_ids`] one batch at a time: [`holding`] asks a namespace's
/// owner after its first batch, so a namespace another user namespace
/// owns is never listed further (its owner, any local user, may stack
/// mount-max mounts in it, each of which the kernel would check to lie
/// under the topmost, one parent at a time).
struct Listing {
    ns_id: u64,
    top: u64,
    last: u64,
    ids: Vec<u64>,
    done: bool,
}

impl Listing {
    /// The namespace's topmost mount and its first batch of ids.
    fn start(ns_id: u64, since: u64) -> Result<Listing, Errno> {
        let mut one = [0u64; 1];
        let mut top = match list(ns_id, LSMT_ROOT, 0, &mut one)? {
            0 => return Err(Errno::ENOENT),
            _ => one[0],
        };
        // A mount namespace is a tree of a few levels; the bound only
        // stops a loop the kernel would never make.
        for _ in 0..64 {
            let up = parent_of(top, ns_id)?;
            if up == top {
                let mut l = Listing {
                    ns_id,
                    top,
                    last: since.saturating_sub(1),
                    ids: Vec::new(),
                    done: false,
                };
                if top >= since {
                    l.ids.push(top);
                }
                l.next_batch()?;
                return Ok(l);
            }
            top = up;
        }
        Err(Errno::ELOOP)
    }

    fn next_batch(&mut self) -> Result<(), Errno> {
        let mut buf = [0u64; BATCH];
        let n = list(self.ns_id, self.top, self.last, &mut buf)?;
        self.ids.extend_from_slice(&buf[..n]);
        match n {
            BATCH => self.last = buf[n - 1],
            _ => self.done = true,
        }
        Ok(())
    }

    /// Every id, the first batch's and the rest.
    fn rest(mut self) -> Result<Vec<u64>, Errno> {
        while !self.done {
            self.next_batch()?;
        }
        Ok(self.ids)
    }
}

/// The source of mount `mnt_id` in namespace `ns_id`, into `buf`; `None`
/// when the mount is gone.
fn source_of(mnt_id: u64, ns_id: u64, buf: &mut [u64]) -> Result<Option<Vec<u8>>, Errno> {
    let Some(got) = statmount(mnt_id, ns_id, STATMOUNT_SB_SOURCE, buf)? else {
        return Ok(None);
    };
    if got & STATMOUNT_SB_SOURCE == 0 {
        // An older kernel without the source: it cannot answer.
        return Err(Errno::ENOSYS);
    }
    string_at(bytes(buf), OFF_SB_SOURCE).map(Some)
}

/// The source of every mount of the namespace `ns` (`mnt:[INODE]`) that
/// task `tid` is in. `None`: the kernel could not tell (see the module's
/// header).
pub fn sources(tid: u32, ns: &str) -> Option<Vec<Vec<u8>>> {
    let id = ns_id(tid, ns).ok()?;
    let ids = mount_ids(id, 0).ok()?;
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

/// `_IOR(0xb7, 11, struct mnt_ns_info)` and `_IOR(0xb7, 12, …)`
/// (include/uapi/linux/nsfs.h, Linux 6.12): from a mount namespace's
/// nsfs fd, an fd of the next (previous) mount namespace of the host by
/// id, among those the caller has `CAP_SYS_ADMIN` over, with its
/// `struct mnt_ns_info`; `ENOENT` past the last (first).
const NS_MNT_GET_NEXT: libc::c_ulong = 0x8010_b70b;
const NS_MNT_GET_PREV: libc::c_ulong = 0x8010_b70c;
/// `_IO(0xb7, 0x1)`: an fd of the user namespace owning a namespace.
const NS_GET_USERNS: libc::c_ulong = 0xb701;

/// `struct mnt_ns_info` (`MNT_NS_INFO_SIZE_VER0`).
#[repr(C)]
struct MntNsInfo {
    size: u32,
    nr_mounts: u32,
    mnt_ns_id: u64,
}

/// A mount namespace the kernel listed that holds a mount whose source
/// was wanted (see [`holding`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holding {
    /// `mnt:[INODE]`, as `/proc/PID/ns/mnt` names it (the number is
    /// handed out again once the namespace is freed).
    pub ns: String,
    /// Its id (`NS_GET_MNTNS_ID`): never reused.
    pub ns_id: u64,
    /// Each such mount.
    pub mounts: Vec<HeldMount>,
}

/// A mount of a [`Holding`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldMount {
    /// Relative to the namespace's root mount.
    pub mount_point: std::path::PathBuf,
    pub fstype: String,
    pub source: String,
    /// Its unique id (never reused) and mountinfo's (`mnt_id_old`).
    pub id: u64,
    pub old_id: u64,
}

/// Every mount namespace of the host, enumerated by the kernel
/// (`NS_MNT_GET_PREV`/`NS_MNT_GET_NEXT` from the caller's own, Linux
/// 6.12), each asked with `listmount`/`statmount` for its mounts' file
/// systems and its tmpfs mounts' sources (a credential mount counts only
/// as a tmpfs): those holding a tmpfs whose source `wanted` accepts, owned
/// by the caller's user namespace (an unprivileged user's namespace is
/// not vmwarden's, and is passed unasked: see `visit`). A namespace
/// no process is in (kept alive by an nsfs bind mount or an fd) is listed
/// as any other. No `/proc` read. `None`: the kernel could not tell (not
/// [`procs::sees_every_mount_namespace`], an older kernel, a filter): the caller walks
/// `/proc` as before.
///
/// `since`: only mounts with a unique id at or above it are asked (0:
/// every mount). A VM's credential floor (`instance::creds_floor`) is
/// below every mount its credential tmpfs has or had, copies included
/// (mount ids only grow, and each mount gets its own when it is made),
/// so the older mounts of every namespace cannot be one.
pub fn holding(wanted: impl Fn(&[u8]) -> bool, since: u64) -> Option<Vec<Holding>> {
    use std::os::fd::{AsFd, FromRawFd, OwnedFd};
    if !procs::sees_every_mount_namespace() {
        return None;
    }
    let own = std::fs::File::open("/proc/thread-self/ns/mnt").ok()?;
    let my_userns = std::fs::metadata("/proc/thread-self/ns/user").ok()?;
    let my_userns = (my_userns.dev(), my_userns.ino());
    let mut out = Vec::new();
    let mut id: u64 = 0;
    // SAFETY: NS_GET_MNTNS_ID writes one u64 through the pointer, which
    // points to `id`; the fd is open for the call's whole length.
    if unsafe { libc::ioctl(own.as_raw_fd(), NS_GET_MNTNS_ID, &raw mut id) } != 0 {
        return None;
    }
    visit(own.as_fd(), id, since, my_userns, &wanted, &mut out)?;
    for step in [NS_MNT_GET_PREV, NS_MNT_GET_NEXT] {
        let mut cur: OwnedFd = own.try_clone().ok()?.into();
        loop {
            let mut info = MntNsInfo {
                size: size_of::<MntNsInfo>() as u32,
                nr_mounts: 0,
                mnt_ns_id: 0,
            };
            // SAFETY: the ioctl writes at most `info.size` bytes through
            // the pointer, which points to `info`, and returns a new fd
            // (or -1); `cur` is open for the call's whole length.
            let fd = unsafe { libc::ioctl(cur.as_raw_fd(), step, &raw mut info) };
            if fd < 0 {
                match Errno::last() {
                    Errno::ENOENT => break,
                    _ => return None,
                }
            }
            // SAFETY: a non-negative return is a new fd the kernel opened
            // for this caller, owned by nothing else.
            let next = unsafe { OwnedFd::from_raw_fd(fd) };
            visit(
                next.as_fd(),
                info.mnt_ns_id,
                since,
                my_userns,
                &wanted,
                &mut out,
            )?;
            cur = next;
        }
    }
    Some(out)
}

/// One namespace of [`holding`]: the first batch of its mount ids at or
/// above `since` (none: done), then its owner (another user namespace's
/// is passed, listed no further and its mounts' sources unasked, as is
/// one whose ids the kernel would not list), then the rest of its ids,
/// those mounts' sources, and when one is wanted, the wanted mounts'
/// places. `None`: the kernel could not tell.
fn visit(
    fd: std::os::fd::BorrowedFd<'_>,
    id: u64,
    since: u64,
    my_userns: (u64, u64),
    wanted: &impl Fn(&[u8]) -> bool,
    out: &mut Vec<Holding>,
) -> Option<()> {
    // Its first batch of mount ids (listmount, and statmount's MNT_BASIC
    // for the parents: no string is formatted): a namespace with no mount
    // at or above `since` holds nothing to ask, whoever owns it. Its
    // owner is asked before any more is listed: another user namespace's
    // is passed, as is one whose ids the kernel will not list (its owner
    // may not make the whole enumeration unknown, see [`ours`], nor make
    // it list mount-max mounts one parent at a time, see [`Listing`]).
    let first = match Listing::start(id, since) {
        Ok(first) => first,
        // Emptied meanwhile (its last user left): no mount to hold.
        Err(Errno::ENOENT) => return Some(()),
        Err(_) => return if ours(fd, my_userns)? { None } else { Some(()) },
    };
    if first.ids.is_empty() || !ours(fd, my_userns)? {
        return Some(());
    }
    let ids = match first.rest() {
        Ok(ids) => ids,
        Err(Errno::ENOENT) => return Some(()),
        Err(_) => return None,
    };
    let mut small = vec![0u64; (HEADER + 256) / 8];
    let mut big = Vec::new();
    let mut hits = Vec::new();
    for m in ids {
        // Only a tmpfs can be a credential tmpfs: another file system's
        // mount is passed on its superblock's magic, a call that makes the
        // kernel format no string (and allocate no page for one).
        match may_be_tmpfs(m, id) {
            Ok(false) | Err(Errno::ENOENT) => continue,
            Ok(true) => {}
            Err(_) => return None,
        }
        let src = match source_of(m, id, &mut small) {
            Err(Errno::EOVERFLOW) => {
                big.resize((HEADER + 4096) / 8, 0u64);
                source_of(m, id, &mut big)
            }
            r => r,
        };
        match src {
            Ok(Some(src)) if wanted(&src) => hits.push(m),
            Ok(_) => {}
            Err(_) => return None,
        }
    }
    if hits.is_empty() {
        return Some(());
    }
    let ns = nix::sys::stat::fstat(fd).ok()?;
    let mut mounts = Vec::new();
    for m in hits {
        if let Some(place) = place_of(m, id).ok()? {
            mounts.push(place);
        }
    }
    out.push(Holding {
        ns: format!("mnt:[{}]", ns.st_ino),
        ns_id: id,
        mounts,
    });
    Some(())
}

/// Is the namespace `fd` owned by the caller's user namespace? Any other
/// is skipped before its mounts' sources are asked, as the `/proc` walk
/// skips it: a local user's own namespace may hold a mount whose source
/// the kernel will not state (empty, or over 4 KiB), which would
/// otherwise make the whole enumeration unknown and send every caller
/// back to the walk, blind to a namespace no process is in. `None`: the
/// kernel could not tell.
fn ours(fd: std::os::fd::BorrowedFd<'_>, my_userns: (u64, u64)) -> Option<bool> {
    // SAFETY: NS_GET_USERNS takes no argument and returns a new fd (or
    // -1); `fd` is open for the call's whole length.
    let user = unsafe { libc::ioctl(fd.as_raw_fd(), NS_GET_USERNS) };
    if user < 0 {
        return None;
    }
    // SAFETY: a non-negative return is a new fd owned by nothing else.
    let user = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(user) };
    let st = nix::sys::stat::fstat(&user).ok()?;
    Some((st.st_dev, st.st_ino) == my_userns)
}

/// Is mount `mnt_id` of namespace `ns_id` on a superblock that can be a
/// `tmpfs`? A tmpfs's superblock has `TMPFS_MAGIC` (shmem sets it
/// always), or `RAMFS_MAGIC` on a kernel built without shmem, where
/// "tmpfs" is ramfs; any other magic is another file system.
fn may_be_tmpfs(mnt_id: u64, ns_id: u64) -> Result<bool, Errno> {
    const TMPFS_MAGIC: u64 = 0x0102_1994;
    const RAMFS_MAGIC: u64 = 0x8584_58f6;
    let mut buf = [0u64; HEADER / 8];
    let got = statmount(mnt_id, ns_id, STATMOUNT_SB_BASIC, &mut buf)?.ok_or(Errno::ENOENT)?;
    if got & STATMOUNT_SB_BASIC == 0 {
        return Err(Errno::ENOSYS);
    }
    Ok(matches!(buf[OFF_SB_MAGIC / 8], TMPFS_MAGIC | RAMFS_MAGIC))
}

/// Mount `mnt_id`'s mount point, file system type, source and
/// mountinfo id in namespace `ns_id`; `None` when the mount is gone.
fn place_of(mnt_id: u64, ns_id: u64) -> Result<Option<HeldMount>, Errno> {
    use std::os::unix::ffi::OsStringExt;
    let mut buf = vec![0u64; (HEADER + 4096) / 8];
    let want = STATMOUNT_MNT_BASIC | STATMOUNT_MNT_POINT | STATMOUNT_FS_TYPE | STATMOUNT_SB_SOURCE;
    let Some(got) = statmount(mnt_id, ns_id, want, &mut buf)? else {
        return Ok(None);
    };
    let b = bytes(&buf);
    // A string the kernel had nothing for (a mount point outside the
    // namespace's root) is not flagged in the mask: empty.
    let str_at = |off: usize, flag: u64| -> Result<Vec<u8>, Errno> {
        if got & flag == 0 {
            return Ok(Vec::new());
        }
        string_at(b, off)
    };
    let text = |v: Vec<u8>| String::from_utf8_lossy(&v).into_owned();
    let old_id = match got & STATMOUNT_MNT_BASIC {
        0 => 0,
        _ => u64::from(u32::from_ne_bytes(
            b[OFF_MNT_ID_OLD..OFF_MNT_ID_OLD + 4]
                .try_into()
                .unwrap_or_default(),
        )),
    };
    Ok(Some(HeldMount {
        mount_point: std::path::PathBuf::from(std::ffi::OsString::from_vec(str_at(
            OFF_MNT_POINT,
            STATMOUNT_MNT_POINT,
        )?)),
        fstype: text(str_at(OFF_FS_TYPE, STATMOUNT_FS_TYPE)?),
        source: text(str_at(OFF_SB_SOURCE, STATMOUNT_SB_SOURCE)?),
        id: mnt_id,
        old_id,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        /// Each `listmount` of this thread: the namespace's id and how
        /// many ids it listed (a recording seam beside the real calls).
        pub(super) static LISTED: std::cell::RefCell<Vec<(u64, usize)>> =
            const { std::cell::RefCell::new(Vec::new()) };
    }

    /// A local user's own namespace (`unshare -Urm`, as uid 65534) with
    /// far more mounts than one batch, bind mounts stacked on one
    /// directory: the enumeration lists its first batch only, then its
    /// owner passes it. Listed whole, each of its mounts is checked by
    /// the kernel to lie under the topmost one parent at a time: with
    /// 20,000 stacked, one enumeration took 2.3 s instead of 0.1 ms, and
    /// mount-max (100,000) in a few namespaces outlasts the unit's stop
    /// timeout, for every VM's cleanup and every `verify-clean`.
    #[test]
    fn a_local_users_namespace_is_not_listed_past_its_first_batch() {
        use std::io::BufRead;
        use std::process::{Command, Stdio};
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test needs root (it runs a local user and enumerates every namespace)"
        );
        struct Held(std::process::Child);
        impl Drop for Held {
            fn drop(&mut self) {
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
        let stack = BATCH * 4;
        let mut c = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .args(["unshare", "-Urm", "sh", "-c"])
            .arg(format!(
                "mount -t tmpfs stack /tmp || exit 1; i=0; while [ $i -lt {stack} ]; do mount --bind /tmp /tmp || exit 1; i=$((i+1)); done; echo STACKED; exec sleep 600"
            ))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = c.stdout.take().unwrap();
        let held = Held(c);
        let mut line = String::new();
        std::io::BufReader::new(out).read_line(&mut line).unwrap();
        assert_eq!(
            line.trim(),
            "STACKED",
            "the local user did not stack mounts"
        );
        let pid = held.0.id();
        let ns = std::fs::read_link(format!("/proc/{pid}/ns/mnt")).unwrap();
        let id = ns_id(pid, &ns.to_string_lossy()).unwrap();
        let all = mount_ids(id, 0).unwrap().len();
        assert!(all > stack, "{all} mounts listed of the user's {stack}");
        LISTED.with(|l| l.borrow_mut().clear());
        assert!(holding(|_| true, 0).is_some());
        let listed: usize = LISTED.with(|l| {
            l.borrow()
                .iter()
                .filter(|(ns, _)| *ns == id)
                .map(|(_, n)| n)
                .sum()
        });
        assert!(
            listed <= BATCH + 1,
            "{listed} of the {all} mount ids of a local user's namespace listed"
        );
        drop(held);
    }

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

    /// Every mount namespace a process of this user namespace is in that
    /// holds a tmpfs is among those the kernel enumerates as holding one
    /// (as root: anyone else is told `None`), and nothing is held where
    /// no source is wanted.
    #[test]
    fn the_kernel_enumerates_every_namespace_the_proc_walk_finds() {
        let Some(all) = holding(|_| true, 0) else {
            assert!(
                !procs::sees_every_mount_namespace(),
                "root, and the kernel did not enumerate"
            );
            return;
        };
        assert_eq!(holding(|_| false, 0), Some(Vec::new()));
        let own = std::fs::read_link("/proc/self/ns/mnt").unwrap();
        let listed: Vec<&str> = all.iter().map(|h| h.ns.as_str()).collect();
        assert!(
            listed.contains(&own.to_string_lossy().as_ref()),
            "{listed:?}"
        );
        let mut missing = Vec::new();
        for (tid, ns) in procs::mount_namespace_holders() {
            // One that came after the enumeration, with its process, is
            // not a miss: it must have been made since.
            let tmpfs = std::fs::read_to_string(format!("/proc/{tid}/mountinfo"))
                .is_ok_and(|t| t.contains(" - tmpfs "));
            if tmpfs
                && !listed.contains(&ns.as_str())
                && std::fs::read_link(format!("/proc/{tid}/ns/mnt")).is_ok()
                && holding(|_| true, 0).unwrap().iter().all(|h| h.ns != ns)
            {
                missing.push((tid, ns));
            }
        }
        assert!(missing.is_empty(), "not enumerated: {missing:?}");
        assert!(all.iter().all(|h| !h.mounts.is_empty()));
    }
}
