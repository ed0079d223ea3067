//! Shares the guest owns: the virtiofsd of a writable virtiofs share runs
//! in a user namespace of its own, whose id map root writes: guest id 0 is
//! the VM's principal, guest ids 1 to 65535 are the VM's own id range
//! (`identity::registry`, `base + id`). Inside it virtiofsd is root with
//! six capabilities ([`KEPT_CAPS`]: `CHOWN`, `DAC_OVERRIDE`, `FOWNER`, `FSETID`, `SETGID`,
//! `SETUID`), so the guest's `chown`, `chgrp` and `chmod` work as under
//! microvm.nix's root virtiofsd, and the guest sees the ids it set. Those
//! capabilities hold only in that namespace and over files whose owner
//! and group it maps: on the host every file it makes or changes belongs
//! to the principal or the range, never root or another account, and in
//! the host's user namespace it has no capability at all.
//!
//! The order, in the helper child (root until the map is written):
//! 1. its mount namespace, as every virtiofsd's ([`super::share_root`]):
//!    a namespace made while still root belongs to the host's user
//!    namespace, so virtiofsd can never mount or unmount in it;
//! 2. `unshare(CLONE_NEWUSER)`: from here it has no capability in the
//!    host's user namespace; its namespace is owned by root, so no process
//!    of the principal (the hypervisor) has any capability in it;
//! 3. the launcher (root, the only writer allowed a map of several lines)
//!    writes `/proc/PID/uid_map` and `gid_map` ([`IdRange::id_map`]),
//!    reads them back, and says go;
//! 4. the child becomes the namespace's root (gids, no supplementary
//!    group, uids), keeps [`NS_CAPS`] in its bounding, permitted and
//!    effective sets (nothing inheritable or ambient), sets `no_new_privs`
//!    and checks all of it; then the usual death signal, Landlock and
//!    seccomp, and `execve`. As the namespace's root, virtiofsd execs with
//!    exactly [`NS_CAPS`] (its bounding set) and, at its start, drops to
//!    its own six with libcap-ng and empties its bounding set (`SETPCAP`
//!    is in [`NS_CAPS`] for that drop alone: without it libcap-ng takes a
//!    path that virtiofsd's own seccomp filter kills); `--modcaps` keeps
//!    it from asking for `MKNOD` and `SETFCAP`.
//!
//! A guest id beyond the map is refused by the kernel (EINVAL), as is any
//! change to a file whose owner or group is not mapped (a host file of
//! another uid that found its way into the share shows as 65534).

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::time::Instant;

use caps::{CapSet, Capability, CapsHashSet};
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{Gid, Pid, Uid};

use crate::identity::principal::Principal;
use crate::identity::registry::IdRange;
use crate::launch::seccomp;
use crate::launch::syscall::Syscall;

use super::{timeout, Helper, HelperError, POLL, START_TIMEOUT};

/// The capabilities virtiofsd execs with inside its namespace: its own
/// default set (`drop_capabilities` in its main.rs) without `MKNOD` (no
/// device node can be made in a user namespace or used on a `nodev`
/// mount) and `SETFCAP` (a guest's file capabilities would be stored for
/// the namespace's root, but nothing needs them), plus `SETPCAP`, which
/// it uses once to drop its bounding set to the other six, and drops.
/// [`KEPT_CAPS`] is what it serves the guest with.
pub const NS_CAPS: &[Capability] = &[
    Capability::CAP_CHOWN,
    Capability::CAP_DAC_OVERRIDE,
    Capability::CAP_FOWNER,
    Capability::CAP_FSETID,
    Capability::CAP_SETGID,
    Capability::CAP_SETUID,
    Capability::CAP_SETPCAP,
];

/// What virtiofsd keeps once started: [`NS_CAPS`] without `SETPCAP` (its
/// permitted and effective sets; its bounding set is then empty).
pub const KEPT_CAPS: &[Capability] = &[
    Capability::CAP_CHOWN,
    Capability::CAP_DAC_OVERRIDE,
    Capability::CAP_FOWNER,
    Capability::CAP_FSETID,
    Capability::CAP_SETGID,
    Capability::CAP_SETUID,
];

/// virtiofsd's own option that leaves the two out of what it asks for.
pub const MODCAPS: &str = "--modcaps=-mknod:-setfcap";

/// Whether helper `h` serves a share the guest owns: a writable share of
/// a kind whose shape says so (virtiofsd's).
pub fn guest_owned(h: &Helper) -> bool {
    h.shape().guest_owns_writable && h.share.as_ref().is_some_and(|s| !s.read_only)
}

/// Between the launcher and the helper child: two pipes while the id
/// map is written (the child says "unshared", the launcher "mapped"), and
/// a socket pair on which the child hands over the listener of the filter
/// that sends its set-group-ID chmods to the broker (`broker`).
pub(super) struct Sync {
    unshared: (OwnedFd, OwnedFd),
    mapped: (OwnedFd, OwnedFd),
    listener: (OwnedFd, OwnedFd),
}

/// The child's ends.
pub(super) struct ChildSync {
    unshared: OwnedFd,
    mapped: OwnedFd,
    listener: OwnedFd,
}

/// The launcher's ends.
pub(super) struct ParentSync {
    unshared: OwnedFd,
    mapped: OwnedFd,
    listener: OwnedFd,
}

/// The child once it is its namespace's root: what is left to do before
/// its `execve` ([`Entered::filters`]).
pub(super) struct Entered {
    listener: OwnedFd,
}

const UNSHARED: u8 = b'U';
const MAPPED: u8 = b'M';

impl Sync {
    pub(super) fn new() -> Result<Sync, Errno> {
        use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
        Ok(Sync {
            unshared: nix::unistd::pipe2(OFlag::O_CLOEXEC)?,
            mapped: nix::unistd::pipe2(OFlag::O_CLOEXEC)?,
            listener: socketpair(
                AddressFamily::Unix,
                SockType::SeqPacket,
                None,
                SockFlag::SOCK_CLOEXEC,
            )?,
        })
    }

    /// Split after `fork`: each side keeps its ends (the others close).
    pub(super) fn child(self) -> ChildSync {
        ChildSync {
            unshared: self.unshared.1,
            mapped: self.mapped.0,
            listener: self.listener.1,
        }
    }

    pub(super) fn parent(self) -> ParentSync {
        ParentSync {
            unshared: self.unshared.0,
            mapped: self.mapped.1,
            listener: self.listener.0,
        }
    }
}

impl Entered {
    /// The child's filters, last before `execve`: the launcher's for this
    /// role (`progs`), then the one that hands its set-group-ID chmods to
    /// the broker, whose listener goes to the launcher.
    pub(super) fn filters(
        self,
        sys: &dyn Syscall,
        progs: &[seccompiler::BpfProgram],
    ) -> Result<(), String> {
        use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
        seccomp::apply(sys, progs).map_err(|e| e.to_string())?;
        let notify = seccomp::notify::program();
        let fd =
            seccomp::notify::install(&notify).map_err(|e| format!("seccomp(NEW_LISTENER): {e}"))?;
        let fds = [fd.as_raw_fd()];
        sendmsg::<()>(
            self.listener.as_raw_fd(),
            &[std::io::IoSlice::new(b"L")],
            &[ControlMessage::ScmRights(&fds)],
            MsgFlags::empty(),
            None,
        )
        .map_err(|e| format!("hand over the listener: {e}"))?;
        Ok(())
    }
}

/// The listener the child handed over before its `execve`.
pub(super) fn listener(h: &Helper, sync: &ParentSync) -> Result<OwnedFd, HelperError> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let fail = |detail: String| HelperError::Setup {
        helper: h.name(),
        binary: h.binary.clone(),
        detail,
    };
    let mut buf = [0u8; 1];
    let mut iov = [std::io::IoSliceMut::new(&mut buf)];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let msg = recvmsg::<()>(
        sync.listener.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(|e| fail(format!("no listener of its chmod filter: {e}")))?;
    let mut got = None;
    for c in msg.cmsgs().map_err(|e| fail(e.to_string()))? {
        if let ControlMessageOwned::ScmRights(fds) = c {
            for fd in fds {
                // SAFETY: SCM_RIGHTS gave this process a new fd that
                // nothing else owns.
                let fd = unsafe { OwnedFd::from_raw_fd(fd) };
                if got.is_none() {
                    got = Some(fd);
                }
            }
        }
    }
    got.ok_or_else(|| fail("no listener of its chmod filter".into()))
}

/// In the helper child, after its mount namespace (steps 2 and 4 of the
/// module docs): a user namespace, the launcher's map awaited, then its
/// root with [`NS_CAPS`] and `no_new_privs`, checked.
pub(super) fn enter(sys: &dyn Syscall, sync: ChildSync, p: &Principal) -> Result<Entered, String> {
    use nix::sched::CloneFlags;
    sys.assert_single_threaded().map_err(|e| e.to_string())?;
    sys.unshare(CloneFlags::CLONE_NEWUSER)
        .map_err(|e| format!("unshare(CLONE_NEWUSER): {e}"))?;
    write_byte(&sync.unshared, UNSHARED).map_err(|e| format!("tell the launcher: {e}"))?;
    drop(sync.unshared);
    let mut b = [0u8; 1];
    match nix::unistd::read(&sync.mapped, &mut b) {
        Ok(1) if b[0] == MAPPED => {}
        Ok(_) => return Err("the launcher wrote no id map".into()),
        Err(e) => return Err(format!("wait for the id map: {e}")),
    }
    drop(sync.mapped);
    let keep = become_root_keeping(sys, NS_CAPS)?;
    check(p, &keep)?;
    Ok(Entered {
        listener: sync.listener,
    })
}

/// In a user namespace this process has just entered: become its root
/// (gid, no supplementary group, uid), keep only `caps` in the bounding,
/// permitted and effective sets (every other capability the kernel knows,
/// known to the caps crate or not, leaves the bounding set), none
/// inheritable or ambient, and set `no_new_privs`. virtiofsd's child and
/// its broker both start so. Returns the kept set.
pub(super) fn become_root_keeping(
    sys: &dyn Syscall,
    caps: &[Capability],
) -> Result<CapsHashSet, String> {
    sys.setresgid(Gid::from_raw(0))
        .map_err(|e| format!("setresgid(0) in the namespace: {e}"))?;
    sys.setgroups(&[])
        .map_err(|e| format!("setgroups([]) in the namespace: {e}"))?;
    sys.setresuid(Uid::from_raw(0))
        .map_err(|e| format!("setresuid(0) in the namespace: {e}"))?;
    let keep: CapsHashSet = caps.iter().copied().collect();
    // Numbered from 0; EINVAL past the last one the kernel knows ends the
    // loop.
    let kept: Vec<u8> = caps.iter().map(|c| c.index()).collect();
    for cap in (0..=63u8).filter(|c| !kept.contains(c)) {
        // SAFETY: prctl(PR_CAPBSET_DROP) takes a capability number and no
        // pointers; the return value is checked.
        let rc = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, libc::c_ulong::from(cap), 0, 0, 0) };
        match Errno::result(rc) {
            Ok(_) => {}
            Err(Errno::EINVAL) if cap > 0 => break,
            Err(e) => return Err(format!("drop capability {cap} from the bounding set: {e}")),
        }
    }
    sys.clear_ambient()
        .map_err(|e| format!("prctl(PR_CAP_AMBIENT_CLEAR_ALL): {e}"))?;
    caps::clear(None, CapSet::Inheritable).map_err(|e| format!("capset: {e}"))?;
    caps::set(None, CapSet::Effective, &keep).map_err(|e| format!("capset: {e}"))?;
    caps::set(None, CapSet::Permitted, &keep).map_err(|e| format!("capset: {e}"))?;
    sys.set_no_new_privs()
        .map_err(|e| format!("prctl(PR_SET_NO_NEW_PRIVS): {e}"))?;
    Ok(keep)
}

/// The child's own view, read back: root of a namespace whose map is the
/// principal and the range, exactly [`NS_CAPS`], `no_new_privs`.
fn check(p: &Principal, keep: &CapsHashSet) -> Result<(), String> {
    let (r, e, s) = (
        nix::unistd::getuid(),
        nix::unistd::geteuid(),
        nix::unistd::getresuid().map_err(|e| e.to_string())?.saved,
    );
    if [r, e, s].iter().any(|u| !u.is_root()) {
        return Err(format!("not the namespace's root: uids {r} {e} {s}"));
    }
    if !nix::unistd::getgroups()
        .map_err(|e| e.to_string())?
        .is_empty()
    {
        return Err("supplementary groups left".into());
    }
    for set in [CapSet::Bounding, CapSet::Permitted, CapSet::Effective] {
        let got = caps::read(None, set).map_err(|e| e.to_string())?;
        if &got != keep {
            return Err(format!("{set:?} capabilities are {got:?}"));
        }
    }
    for set in [CapSet::Inheritable, CapSet::Ambient] {
        if !caps::read(None, set).map_err(|e| e.to_string())?.is_empty() {
            return Err(format!("{set:?} capabilities left"));
        }
    }
    if !nix::sys::prctl::get_no_new_privs().map_err(|e| e.to_string())? {
        return Err("no_new_privs is not set".into());
    }
    // Guest 0 is the principal on the host: the map took.
    let map = std::fs::read_to_string("/proc/self/uid_map").map_err(|e| e.to_string())?;
    let first: Vec<&str> = map.split_whitespace().take(3).collect();
    if first != ["0", &p.uid.to_string(), "1"] {
        return Err(format!("uid_map is {map:?}"));
    }
    Ok(())
}

/// In the launcher, right after the fork (step 3): wait for the child's
/// user namespace, write its maps, read them back, say go. `Ok(false)`:
/// the child ended before it got there (its own error is in the status
/// pipe).
pub(super) fn map_ids(
    h: &Helper,
    pid: Pid,
    ids: &IdRange,
    p: &Principal,
    sync: &ParentSync,
    t0: Instant,
) -> Result<bool, HelperError> {
    let fail = |detail: String| HelperError::Setup {
        helper: h.name(),
        binary: h.binary.clone(),
        detail,
    };
    nix::fcntl::fcntl(
        &sync.unshared,
        nix::fcntl::FcntlArg::F_SETFL(OFlag::O_NONBLOCK),
    )
    .map_err(|e| fail(format!("fcntl: {e}")))?;
    let mut b = [0u8; 1];
    loop {
        match nix::unistd::read(&sync.unshared, &mut b) {
            Ok(1) if b[0] == UNSHARED => break,
            Ok(0) => return Ok(false),
            Ok(_) => return Err(fail("unexpected byte from the helper child".into())),
            Err(Errno::EAGAIN | Errno::EINTR) => {}
            Err(e) => return Err(fail(format!("read: {e}"))),
        }
        if let Ok(WaitStatus::StillAlive) = waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
        } else {
            return Ok(false);
        }
        if t0.elapsed() >= START_TIMEOUT {
            return Err(timeout(h, "did not enter its user namespace".into()));
        }
        std::thread::sleep(POLL);
    }
    for (file, root) in [("uid_map", p.uid), ("gid_map", p.gid)] {
        let path = format!("/proc/{pid}/{file}");
        let want = ids.id_map(root);
        write_map(&path, &want).map_err(|e| fail(format!("write {path}: {e}")))?;
        let got = std::fs::read_to_string(&path).map_err(|e| fail(format!("read {path}: {e}")))?;
        let norm = |s: &str| -> Vec<String> {
            s.lines()
                .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
                .collect()
        };
        if norm(&got) != norm(&want) {
            return Err(fail(format!("{path} reads {got:?}, not {want:?}")));
        }
    }
    write_byte(&sync.mapped, MAPPED).map_err(|e| fail(format!("say go: {e}")))?;
    Ok(true)
}

/// One `write(2)` of the whole map, as the kernel requires.
fn write_map(path: &str, map: &str) -> Result<(), Errno> {
    let fd = nix::fcntl::open(
        path,
        OFlag::O_WRONLY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW,
        nix::sys::stat::Mode::empty(),
    )?;
    let n = nix::unistd::write(&fd, map.as_bytes())?;
    if n != map.len() {
        return Err(Errno::EIO);
    }
    Ok(())
}

fn write_byte(fd: &OwnedFd, b: u8) -> Result<(), Errno> {
    loop {
        match nix::unistd::write(fd.as_fd(), &[b]) {
            Ok(1) => return Ok(()),
            Ok(_) => return Err(Errno::EIO),
            Err(Errno::EINTR) => {}
            Err(e) => return Err(e),
        }
    }
}
