//! The privilege drop's self-check, as the kernel states it: one thread,
//! every capability set empty, the ids exactly the principal's,
//! `no_new_privs` set and `setuid(0)` refused. The real implementations
//! behind the system-call seam's `LinuxSyscall`.

use std::path::Path;

use caps::errors::CapsError;
use caps::CapSet;
use nix::unistd::{getgroups, getresgid, getresuid, Gid, Uid};

use crate::host::sys::{read_path, SysContext};
use crate::identity::principal::Principal;
use crate::launch::sandbox_error::{DropFailure, SandboxError};

type Result<T, E = SandboxError> = std::result::Result<T, E>;

/// The launcher must be single-threaded from here to `execve`: `setresuid`
/// and friends, landlock and the capability calls act per thread.
pub fn assert_single_threaded() -> Result<()> {
    let n = std::fs::read_dir("/proc/self/task")
        .map(|rd| rd.count())
        .map_err(|e| SandboxError::Drop(DropFailure::CountThreads(e)))?;
    if n != 1 {
        return Err(SandboxError::Drop(DropFailure::Threads(n)));
    }
    Ok(())
}

fn caps_err(op: &'static str) -> impl FnOnce(CapsError) -> SandboxError {
    move |source| SandboxError::Caps { op, source }
}

/// Fail the launch unless every capability set is empty, the ids are exactly
/// the principal's, `no_new_privs` is set and `setuid(0)` fails. The kernel
/// states all of it in `/proc/self/status`, read once; without `/proc` each
/// is asked with its own system call.
pub fn verify_dropped(p: &Principal) -> Result<()> {
    // One read: the file is about 1.5 KiB (see `host::sys::read_path`).
    match read_path(Path::new("/proc/self/status"), 4096, 1 << 20) {
        Ok(status) => {
            verify_status(p, &String::from_utf8_lossy(&status)).map_err(SandboxError::Drop)?
        }
        Err(_) => verify_dropped_by_syscalls(p)?,
    }
    if nix::unistd::setuid(Uid::from_raw(0)).is_ok() {
        return Err(SandboxError::Drop(DropFailure::Setuid0));
    }
    if nix::unistd::setgid(Gid::from_raw(0)).is_ok() {
        return Err(SandboxError::Drop(DropFailure::Setgid0));
    }
    Ok(())
}

/// The drop as `/proc/self/status` states it.
fn verify_status(p: &Principal, status: &str) -> std::result::Result<(), DropFailure> {
    let field = |key: &'static str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
            .map(str::trim)
            .ok_or(DropFailure::StatusField { key })
    };
    for (key, set) in [
        ("CapInh", "inheritable"),
        ("CapPrm", "permitted"),
        ("CapEff", "effective"),
        ("CapBnd", "bounding"),
        ("CapAmb", "ambient"),
    ] {
        let mask = field(key)?;
        if u64::from_str_radix(mask, 16) != Ok(0) {
            return Err(DropFailure::CapMaskHeld {
                set,
                mask: mask.to_string(),
            });
        }
    }
    let ids = |key: &'static str| -> std::result::Result<Vec<u32>, DropFailure> {
        field(key)?
            .split_whitespace()
            .map(|x| x.parse().map_err(|_| DropFailure::StatusField { key }))
            .collect()
    };
    let uids = ids("Uid")?;
    if uids.len() != 4 || uids.iter().any(|u| *u != p.uid) {
        return Err(DropFailure::StatusIds {
            what: "uids",
            found: uids,
            expected: p.uid,
        });
    }
    let gids = ids("Gid")?;
    if gids.len() != 4 || gids.iter().any(|g| *g != p.gid) {
        return Err(DropFailure::StatusIds {
            what: "gids",
            found: gids,
            expected: p.gid,
        });
    }
    let mut have = ids("Groups")?;
    have.sort_unstable();
    let mut want = p.groups.clone();
    want.sort_unstable();
    if have != want {
        return Err(DropFailure::Groups {
            found: have,
            expected: want,
        });
    }
    if field("NoNewPrivs")? != "1" {
        return Err(DropFailure::NoNewPrivs);
    }
    Ok(())
}

/// The same checks, one system call each (a host without `/proc`).
fn verify_dropped_by_syscalls(p: &Principal) -> Result<()> {
    for (set, name) in [
        (CapSet::Effective, "effective"),
        (CapSet::Permitted, "permitted"),
        (CapSet::Inheritable, "inheritable"),
        (CapSet::Ambient, "ambient"),
        (CapSet::Bounding, "bounding"),
    ] {
        let have = caps::read(None, set).map_err(caps_err("read capability set"))?;
        if !have.is_empty() {
            return Err(SandboxError::Drop(DropFailure::CapsHeld {
                set: name,
                held: have,
            }));
        }
    }
    let r = getresuid().sys("getresuid", "/")?;
    if [r.real, r.effective, r.saved] != [Uid::from_raw(p.uid); 3] {
        return Err(SandboxError::Drop(DropFailure::Uids {
            found: r,
            expected: p.uid,
        }));
    }
    let r = getresgid().sys("getresgid", "/")?;
    if [r.real, r.effective, r.saved] != [Gid::from_raw(p.gid); 3] {
        return Err(SandboxError::Drop(DropFailure::Gids {
            found: r,
            expected: p.gid,
        }));
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
        return Err(SandboxError::Drop(DropFailure::Groups {
            found: have,
            expected: want,
        }));
    }
    if !nix::sys::prctl::get_no_new_privs().sys("prctl(PR_GET_NO_NEW_PRIVS)", "/")? {
        return Err(SandboxError::Drop(DropFailure::NoNewPrivs));
    }
    Ok(())
}
