//! The sandbox around one VM: its private mount namespace, the credential
//! tmpfs, the masks over other VMs' directories, rlimits and the privilege
//! drop with its self-check.
//!
//! Every function here runs in the single-threaded launcher between taking
//! the lease and `execve`.

use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};

use caps::CapSet;
use nix::errno::Errno;
use nix::mount::{mount, MsFlags};
use nix::sched::{unshare, CloneFlags};
use nix::sys::resource::{setrlimit, Resource};
use nix::sys::stat::{mkdirat, Mode};
use nix::unistd::{getgroups, getresgid, getresuid, setgroups, setresgid, setresuid, Gid, Uid};

use crate::config::names::VmName;
use crate::error::{Error, Result, SysContext};
use crate::host::dirs::{self, Dir};
use crate::host::mountinfo;
use crate::identity::principal::Principal;

const NONE: Option<&str> = None;

/// `unshare(CLONE_NEWNS)` and make every mount a recursive slave: host mount
/// events still arrive, nothing made here leaks back (never shared).
pub fn enter_private_mount_namespace() -> Result<()> {
    unshare(CloneFlags::CLONE_NEWNS).sys("unshare(CLONE_NEWNS)", "/")?;
    mount(NONE, "/", NONE, MsFlags::MS_REC | MsFlags::MS_SLAVE, NONE)
        .sys("mount --make-rslave", "/")?;
    Ok(())
}

/// Mount the credential tmpfs on `target` with `noswap` (fail closed when the
/// kernel lacks it) and confirm the option took effect.
pub fn mount_credential_tmpfs(target: &Path, vm: &VmName, size: u64, files: usize) -> Result<()> {
    let data = format!("mode=0700,size={size},nr_inodes={},noswap", files + 16);
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    let source = mountinfo::credential_source(vm);
    match mount(
        Some(source.as_str()),
        target,
        Some("tmpfs"),
        flags,
        Some(data.as_str()),
    ) {
        Ok(()) => {}
        Err(errno @ Errno::EINVAL) => {
            return Err(Error::NoSwapUnsupported {
                path: target.to_path_buf(),
                errno,
            })
        }
        Err(e) => return Err(e).sys("mount credential tmpfs", target),
    }
    let mounts = mountinfo::read("self").map_err(|e| Error::Refused {
        path: target.to_path_buf(),
        reason: format!("cannot read /proc/self/mountinfo to confirm noswap: {e}"),
    })?;
    let found = mounts.into_iter().rev().find(|m| m.mount_point == target);
    match found {
        Some(m) if m.source == source && m.has_option("noswap") => {}
        other => {
            return Err(Error::Refused {
                path: target.to_path_buf(),
                reason: format!(
                    "the credential tmpfs was mounted but mountinfo does not show it with noswap ({other:?}); refusing to put credentials on swappable memory"
                ),
            })
        }
    }
    Ok(())
}

/// Make the mount at `target` read-only (per-mount flags: a bind remount
/// leaves the tmpfs superblock and its `noswap` alone).
pub fn remount_read_only(target: &Path) -> Result<()> {
    mount(
        NONE,
        target,
        NONE,
        MsFlags::MS_REMOUNT
            | MsFlags::MS_BIND
            | MsFlags::MS_RDONLY
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NODEV
            | MsFlags::MS_NOEXEC,
        NONE,
    )
    .sys("remount read-only", target)
}

/// Hide everything under `root` except `keep` (this VM's own directory):
/// an empty read-only tmpfs goes over `root` and the VM's directory is
/// bind-mounted back from an fd opened before the mask. VMs created later
/// are hidden too, since the mask covers the whole root.
pub fn mask_root_except(root: &Path, keep: &Dir) -> Result<()> {
    let keep_name = keep
        .path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| Error::Refused {
            path: keep.path.clone(),
            reason: "has no file name".into(),
        })?
        .to_string();
    // Re-open inside this namespace (a bind source must be a mount of the
    // current namespace) and check it is still the directory vetted before.
    // The fd stays valid after the mask hides its path.
    let here = dirs::open_dir(&keep.path)?;
    let (a, b) = (keep.stat()?, here.stat()?);
    if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino) {
        return Err(Error::Refused {
            path: keep.path.clone(),
            reason: "was replaced while the sandbox was being built".into(),
        });
    }
    let keep_src = PathBuf::from(format!("/proc/self/fd/{}", here.fd.as_raw_fd()));
    mount(
        Some(mountinfo::MASK_SOURCE),
        root,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("mode=0755,size=64k,nr_inodes=64"),
    )
    .sys("mount mask tmpfs", root)?;
    let mask = dirs::open_dir(root)?;
    mkdirat(
        mask.fd.as_fd(),
        keep_name.as_str(),
        Mode::from_bits_truncate(0o755),
    )
    .sys("mkdir in mask", root.join(&keep_name))?;
    let target = root.join(&keep_name);
    mount(
        Some(&keep_src),
        &target,
        NONE,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        NONE,
    )
    .sys("bind own directory back", &target)?;
    remount_read_only(root)?;
    Ok(())
}

/// Hide a directory entirely (e.g. `/run/credentials`) with an empty,
/// read-only, mode 000 tmpfs. Missing directories need no mask.
pub fn mask_dir(path: &Path) -> Result<bool> {
    match std::fs::symlink_metadata(path) {
        Ok(md) if md.is_dir() => {}
        _ => return Ok(false),
    }
    mount(
        Some(mountinfo::MASK_SOURCE),
        path,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC | MsFlags::MS_RDONLY,
        Some("mode=000,size=4k,nr_inodes=1"),
    )
    .sys("mount mask tmpfs", path)?;
    Ok(true)
}

/// `RLIMIT_CORE=0`: guest memory never lands in a core file.
pub fn set_rlimits() -> Result<()> {
    setrlimit(Resource::RLIMIT_CORE, 0, 0).sys("setrlimit(RLIMIT_CORE)", "/")
}

/// The launcher must be single-threaded from here to `execve`: `setresuid`
/// and friends, landlock and the capability calls act per thread.
pub fn assert_single_threaded() -> Result<()> {
    let n = std::fs::read_dir("/proc/self/task")
        .map(|rd| rd.count())
        .map_err(|e| Error::Drop(format!("cannot count threads: {e}")))?;
    if n != 1 {
        return Err(Error::Drop(format!(
            "the launcher has {n} threads; it must be single-threaded to drop privileges"
        )));
    }
    Ok(())
}

// Securebits (include/uapi/linux/securebits.h).
const SECBIT_NOROOT: u64 = 1 << 0;
const SECBIT_NOROOT_LOCKED: u64 = 1 << 1;
const SECBIT_NO_SETUID_FIXUP_LOCKED: u64 = 1 << 3;
const SECBIT_KEEP_CAPS_LOCKED: u64 = 1 << 5;
const SECBIT_NO_CAP_AMBIENT_RAISE: u64 = 1 << 6;
const SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED: u64 = 1 << 7;
/// uid 0 gets no special powers, the setuid fixup (which clears the
/// capability sets when the uid leaves 0) stays on, keep-caps stays off, no
/// ambient raise, and all of it locked.
pub const SECUREBITS: u64 = SECBIT_NOROOT
    | SECBIT_NOROOT_LOCKED
    | SECBIT_NO_SETUID_FIXUP_LOCKED
    | SECBIT_KEEP_CAPS_LOCKED
    | SECBIT_NO_CAP_AMBIENT_RAISE
    | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED;

fn caps_err(op: &'static str) -> impl FnOnce(caps::errors::CapsError) -> Error {
    move |source| Error::Caps { op, source }
}

/// Drop to the principal: supplementary groups, gids, bounding and ambient
/// sets, securebits, `no_new_privs`, uids, then the remaining sets; then
/// [`verify_dropped`].
pub fn drop_privileges(p: &Principal) -> Result<()> {
    assert_single_threaded()?;
    let groups: Vec<Gid> = p.groups.iter().map(|g| Gid::from_raw(*g)).collect();
    setgroups(&groups).sys("setgroups", "/")?;
    let g = Gid::from_raw(p.gid);
    setresgid(g, g, g).sys("setresgid", "/")?;
    caps::clear(None, CapSet::Ambient).map_err(caps_err("clear ambient set"))?;
    caps::clear(None, CapSet::Bounding).map_err(caps_err("clear bounding set"))?;
    // SAFETY: prctl(PR_SET_SECUREBITS) takes an integer bit mask and no
    // pointers; the return value is checked.
    let rc = unsafe {
        libc::prctl(
            libc::PR_SET_SECUREBITS,
            SECUREBITS as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    Errno::result(rc).sys("prctl(PR_SET_SECUREBITS)", "/")?;
    nix::sys::prctl::set_no_new_privs().sys("prctl(PR_SET_NO_NEW_PRIVS)", "/")?;
    let u = Uid::from_raw(p.uid);
    setresuid(u, u, u).sys("setresuid", "/")?;
    for set in [CapSet::Effective, CapSet::Permitted, CapSet::Inheritable] {
        caps::clear(None, set).map_err(caps_err("clear capability set"))?;
    }
    verify_dropped(p)
}

/// Fail the launch unless every capability set is empty, the ids are exactly
/// the principal's, `no_new_privs` is set and `setuid(0)` fails.
pub fn verify_dropped(p: &Principal) -> Result<()> {
    for (set, name) in [
        (CapSet::Effective, "effective"),
        (CapSet::Permitted, "permitted"),
        (CapSet::Inheritable, "inheritable"),
        (CapSet::Ambient, "ambient"),
        (CapSet::Bounding, "bounding"),
    ] {
        let have = caps::read(None, set).map_err(caps_err("read capability set"))?;
        if !have.is_empty() {
            return Err(Error::Drop(format!(
                "the {name} capability set still holds {have:?}"
            )));
        }
    }
    let r = getresuid().sys("getresuid", "/")?;
    if [r.real, r.effective, r.saved] != [Uid::from_raw(p.uid); 3] {
        return Err(Error::Drop(format!("uids are {r:?}, expected {}", p.uid)));
    }
    let r = getresgid().sys("getresgid", "/")?;
    if [r.real, r.effective, r.saved] != [Gid::from_raw(p.gid); 3] {
        return Err(Error::Drop(format!("gids are {r:?}, expected {}", p.gid)));
    }
    let mut have: Vec<u32> = getgroups()
        .sys("getgroups", "/")?
        .into_iter()
        .map(|g| g.as_raw())
        .collect();
    have.sort_unstable();
    let mut want = p.groups.clone();
    want.sort_unstable();
    if have != want {
        return Err(Error::Drop(format!(
            "supplementary groups are {have:?}, expected {want:?}"
        )));
    }
    if !nix::sys::prctl::get_no_new_privs().sys("prctl(PR_GET_NO_NEW_PRIVS)", "/")? {
        return Err(Error::Drop("no_new_privs is not set".into()));
    }
    if nix::unistd::setuid(Uid::from_raw(0)).is_ok() {
        return Err(Error::Drop("setuid(0) succeeded after the drop".into()));
    }
    if nix::unistd::setgid(Gid::from_raw(0)).is_ok() {
        return Err(Error::Drop("setgid(0) succeeded after the drop".into()));
    }
    Ok(())
}

/// Mark every fd ≥ 3 except `keep` close-on-exec, as late as possible.
pub fn cloexec_all_but(keep: &[i32]) -> Result<()> {
    let mut keep: Vec<u32> = keep.iter().map(|k| *k as u32).filter(|k| *k >= 3).collect();
    keep.sort_unstable();
    let mut first = 3u32;
    for k in keep.iter().copied().chain(std::iter::once(u32::MAX)) {
        if k > first {
            let last = if k == u32::MAX { u32::MAX } else { k - 1 };
            // SAFETY: close_range only changes the fd table; with
            // CLOSE_RANGE_CLOEXEC it closes nothing and the return is checked.
            let rc =
                unsafe { libc::close_range(first, last, libc::CLOSE_RANGE_CLOEXEC as libc::c_int) };
            Errno::result(rc).sys("close_range(CLOEXEC)", "/proc/self/fd")?;
        }
        first = k.saturating_add(1);
    }
    Ok(())
}

/// Close every inherited fd ≥ 3 (the first thing the launcher does).
pub fn close_inherited_fds() -> Result<()> {
    // SAFETY: nothing in this process holds an fd ≥ 3 yet (called before
    // anything is opened); close_range touches only the fd table.
    let rc = unsafe { libc::close_range(3, u32::MAX, 0) };
    Errno::result(rc).sys("close_range", "/proc/self/fd")?;
    Ok(())
}
