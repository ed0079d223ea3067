//! `reap --apply`'s unmount of a stray credential tmpfs in another mount
//! namespace: only in the namespace the scan reported, and only the mount
//! the scan reported.
//!
//! The scan names a namespace (`mnt:[INODE]`) and a process in it. By
//! the time reap applies, that process may have left and its pid been
//! reused by a process in another namespace (the host's own, or a live
//! VM's), where the same path may hold another mount. So the namespace is
//! opened through the pid, and the open file, not the pid, is checked: an
//! nsfs file of the scan's inode and, where the scan has it, its id (the
//! kernel hands a freed namespace's inode number to the next one made;
//! the id is never reused), or nothing is entered. A forked child
//! enters it (the caller's namespace never changes) and, before it
//! unmounts, asks the kernel what is mounted at the path now
//! (`statx(STATX_MNT_ID_UNIQUE)`, `statmount(2)`: Linux 6.8): a tmpfs with
//! the credential source, mounted exactly there, with the scan's unique
//! mount id (which also proves the namespace: a mount is in one) and
//! mountinfo id when the scan has them. Anything else is kept and reported.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use nix::errno::Errno;
use nix::sys::wait::WaitStatus;

use crate::host::mountinfo::Mount;

/// The child's exit codes (anything else: it died otherwise).
const EXIT_UNMOUNTED: i32 = 0;
const EXIT_SETNS: i32 = 1;
const EXIT_UMOUNT: i32 = 2;
const EXIT_NOT_THE_MOUNT: i32 = 3;
const EXIT_CANNOT_STATE: i32 = 4;

/// Why a credential tmpfs in another namespace was not unmounted.
#[derive(Debug, thiserror::Error)]
pub enum NsUnmountError {
    #[error("{target}: the scan's mount namespace {ns:?} is not `mnt:[INODE]`; nothing unmounted")]
    BadNamespace { target: PathBuf, ns: String },
    #[error("open mount namespace of pid {pid} ({path}): {source}; nothing unmounted")]
    OpenNamespace {
        pid: u32,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    StatNamespace {
        path: PathBuf,
        #[source]
        source: Errno,
    },
    /// The pid the scan named is now in another namespace: its holder
    /// left (the pid may be reused). Ambiguity keeps.
    #[error("{target}: pid {pid} is now in mount namespace {found}, not in {expected} where the scan found the tmpfs: the holder left (its pid may be reused); nothing unmounted")]
    HolderLeft {
        target: PathBuf,
        pid: u32,
        expected: String,
        found: String,
    },
    /// The pid the scan named is in a namespace with the scan's inode
    /// number but another id: the scan's namespace was freed and a new one
    /// (a relaunch's, say) was handed its number.
    #[error("{target}: pid {pid} is in mount namespace {ns} with id {found_id}, not the scan's namespace {ns} with id {scan_id}: the holder left, its namespace was freed and its inode number handed out again; nothing unmounted")]
    NamespaceReplaced {
        target: PathBuf,
        pid: u32,
        ns: String,
        scan_id: u64,
        found_id: u64,
    },
    #[error("fork: {0}")]
    Fork(#[source] Errno),
    #[error("{target}: cannot enter mount namespace {ns} of pid {pid}; nothing unmounted")]
    Enter {
        target: PathBuf,
        pid: u32,
        ns: String,
    },
    /// What is mounted at the path in the scan's namespace now is not the
    /// credential tmpfs the scan reported.
    #[error("{target} in mount namespace {ns} (pid {pid}) is no longer the mount the scan reported (a tmpfs with source {mount_source}{id}): not unmounted")]
    NotTheMount {
        target: PathBuf,
        pid: u32,
        ns: String,
        mount_source: String,
        id: String,
    },
    #[error("{target} in mount namespace {ns} (pid {pid}): the kernel cannot state what is mounted there (statx and statmount, Linux 6.8), so it cannot be told to be the credential tmpfs: not unmounted")]
    CannotState {
        target: PathBuf,
        pid: u32,
        ns: String,
    },
    #[error("unmount {target} in mount namespace {ns} of pid {pid} failed: {status:?}")]
    Unmount {
        target: PathBuf,
        pid: u32,
        ns: String,
        status: Result<WaitStatus, Errno>,
    },
}

/// Unmount `m`, the credential tmpfs the scan found in mount namespace
/// `ns` (`mnt:[INODE]`) through process `pid`, inside that namespace (in a
/// child, so the caller's namespace never changes); only when the
/// namespace `pid` is in now is `ns`, and the mount at `m.mount_point`
/// there is still `m`.
///
/// No pidfd: the check is on the namespace's open file, which pins the
/// namespace whatever the pid names later, and it is that file the child
/// enters. A pidfd would tell only that the process behind the pid did not
/// change after it was opened, not that it is the scan's.
pub(crate) fn in_namespace(pid: u32, ns: &str, m: &Mount) -> Result<(), NsUnmountError> {
    use nix::sys::wait::waitpid;
    use nix::unistd::{fork, ForkResult};
    #[cfg(test)]
    tests::MEANWHILE.with(|f| f.borrow().as_ref().map(|f| f(m)));
    let target = m.mount_point.clone();
    let expected_ino: u64 = ns
        .strip_prefix("mnt:[")
        .and_then(|s| s.strip_suffix(']'))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| NsUnmountError::BadNamespace {
            target: target.clone(),
            ns: ns.to_string(),
        })?;
    let path = PathBuf::from(format!("/proc/{pid}/ns/mnt"));
    let file = std::fs::File::open(&path).map_err(|source| NsUnmountError::OpenNamespace {
        pid,
        path: path.clone(),
        source,
    })?;
    let stat_err = |source| NsUnmountError::StatNamespace {
        path: path.clone(),
        source,
    };
    let st = nix::sys::stat::fstat(&file).map_err(stat_err)?;
    let fs = nix::sys::statfs::fstatfs(&file).map_err(stat_err)?;
    let is_nsfs = fs.filesystem_type() == nix::sys::statfs::NSFS_MAGIC;
    if !is_nsfs || st.st_ino != expected_ino {
        return Err(NsUnmountError::HolderLeft {
            target,
            pid,
            expected: ns.to_string(),
            found: if is_nsfs {
                format!("mnt:[{}]", st.st_ino)
            } else {
                format!("(not a namespace: {} is no nsfs file)", path.display())
            },
        });
    }
    // The inode number is handed out again as soon as a namespace is
    // freed: the id (never reused) tells the scan's, where the scan has it.
    if m.ns_id != 0 {
        let found_id = crate::host::ns_mounts::id_of(&file).map_err(stat_err)?;
        if found_id != m.ns_id {
            return Err(NsUnmountError::NamespaceReplaced {
                target,
                pid,
                ns: ns.to_string(),
                scan_id: m.ns_id,
                found_id,
            });
        }
    }
    // Everything the child needs is made here: it only makes system calls.
    let Ok(target_c) = CString::new(target.as_os_str().as_bytes()) else {
        return Err(NsUnmountError::CannotState {
            target,
            pid,
            ns: ns.to_string(),
        });
    };
    let want = Want {
        target: target_c,
        source: m.source.as_bytes().to_vec(),
        old_id: m.mount_id,
        unique_id: m.unique_id,
    };
    let mut buf = vec![0u64; (HEADER + 4096) / 8];
    // SAFETY: the child allocates nothing and takes no lock (sound even
    // beside other threads, as in the unit tests; reap itself is
    // single-threaded): it only makes system calls (setns, statx,
    // statmount, umount2) on memory made before the fork, compares bytes
    // at offsets inside that memory (no panic), and calls _exit.
    match unsafe { fork() } {
        Ok(ForkResult::Child) => {
            let code = match nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNS) {
                Err(_) => EXIT_SETNS,
                Ok(()) => match is_wanted_mount(&want, &mut buf) {
                    Err(_) => EXIT_CANNOT_STATE,
                    Ok(false) => EXIT_NOT_THE_MOUNT,
                    Ok(true) => {
                        // SAFETY: `want.target` is NUL-terminated and lives
                        // for the call.
                        let rc = unsafe {
                            libc::umount2(
                                want.target.as_ptr(),
                                libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW,
                            )
                        };
                        if rc == 0 {
                            EXIT_UNMOUNTED
                        } else {
                            EXIT_UMOUNT
                        }
                    }
                },
            };
            // SAFETY: _exit ends the child without running parent state's destructors.
            unsafe { libc::_exit(code) }
        }
        Ok(ForkResult::Parent { child }) => {
            let ns = ns.to_string();
            match waitpid(child, None) {
                Ok(WaitStatus::Exited(_, EXIT_UNMOUNTED)) => Ok(()),
                Ok(WaitStatus::Exited(_, EXIT_SETNS)) => {
                    Err(NsUnmountError::Enter { target, pid, ns })
                }
                Ok(WaitStatus::Exited(_, EXIT_NOT_THE_MOUNT)) => Err(NsUnmountError::NotTheMount {
                    target,
                    pid,
                    ns,
                    mount_source: m.source.clone(),
                    id: match (m.unique_id, m.mount_id) {
                        (0, 0) => String::new(),
                        (0, old) => format!(", mountinfo id {old}"),
                        (id, old) => format!(", unique mount id {id}, mountinfo id {old}"),
                    },
                }),
                Ok(WaitStatus::Exited(_, EXIT_CANNOT_STATE)) => {
                    Err(NsUnmountError::CannotState { target, pid, ns })
                }
                status => Err(NsUnmountError::Unmount {
                    target,
                    pid,
                    ns,
                    status,
                }),
            }
        }
        Err(e) => Err(NsUnmountError::Fork(e)),
    }
}

/// What the child looks for at its path, made before the fork.
struct Want {
    target: CString,
    source: Vec<u8>,
    /// mountinfo's id of the scan's mount (`statmount`'s `mnt_id_old`);
    /// 0: the scan read none.
    old_id: u64,
    /// The kernel's unique id of the scan's mount (never reused, and a
    /// mount is in one namespace only: it also proves the namespace);
    /// 0: the kernel did not state it (before Linux 6.8, or no
    /// enumeration of the namespaces: the `/proc` walk).
    unique_id: u64,
}

const SYS_STATMOUNT: libc::c_long = 457;
/// `sizeof(struct statmount)`: its strings start here.
const HEADER: usize = 512;
const MNT_BASIC: u64 = 0x2;
const MNT_POINT: u64 = 0x10;
const FS_TYPE: u64 = 0x20;
const SB_SOURCE: u64 = 0x200;
const ASK: u64 = MNT_BASIC | MNT_POINT | FS_TYPE | SB_SOURCE;
/// Byte offsets in `struct statmount` (include/uapi/linux/mount.h).
const OFF_MASK: usize = 8;
const OFF_FS_TYPE: usize = 36;
const OFF_MNT_ID_OLD: usize = 56;
const OFF_MNT_POINT: usize = 108;
const OFF_SB_SOURCE: usize = 124;

/// `struct mnt_id_req`, its first published size (`MNT_ID_REQ_SIZE_VER0`:
/// the caller's own namespace, the one the child entered).
#[repr(C)]
struct MntIdReq {
    size: u32,
    spare: u32,
    mnt_id: u64,
    param: u64,
}

/// Is the topmost mount at `want.target`, in the caller's mount namespace,
/// a tmpfs mounted exactly there with the source (and, when known, the
/// unique id and the mountinfo id) the scan reported? Allocates nothing: `buf` is the
/// statmount buffer. An error: the kernel cannot state it.
fn is_wanted_mount(want: &Want, buf: &mut [u64]) -> Result<bool, Errno> {
    // SAFETY: an all-zero statx is a valid value for the kernel to fill.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `want.target` is NUL-terminated and `stx` is valid for writing.
    let rc = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            want.target.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW | libc::AT_NO_AUTOMOUNT,
            libc::STATX_MNT_ID_UNIQUE,
            &raw mut stx,
        )
    };
    if rc != 0 {
        return match Errno::last() {
            // Nothing there any more: not the mount.
            Errno::ENOENT | Errno::ENOTDIR => Ok(false),
            e => Err(e),
        };
    }
    if stx.stx_mask & libc::STATX_MNT_ID_UNIQUE == 0 {
        return Err(Errno::ENOSYS);
    }
    if want.unique_id != 0 && stx.stx_mnt_id != want.unique_id {
        return Ok(false);
    }
    let req = MntIdReq {
        size: size_of::<MntIdReq>() as u32,
        spare: 0,
        mnt_id: stx.stx_mnt_id,
        param: ASK,
    };
    let len = size_of_val(buf);
    // SAFETY: `req` is a valid mnt_id_req of the size it states; the
    // kernel writes at most `len` bytes into `buf`, which owns them.
    let rc = unsafe { libc::syscall(SYS_STATMOUNT, &raw const req, buf.as_mut_ptr(), len, 0u32) };
    if rc != 0 {
        return Err(Errno::last());
    }
    // SAFETY: the bytes of `buf` (u8 needs no alignment), borrowed no
    // longer than `buf` is.
    let b = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), len) };
    let u32_at = |off: usize| u32::from_ne_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]]);
    let u64_at = |off: usize| u64::from(u32_at(off)) | (u64::from(u32_at(off + 4)) << 32);
    if u64_at(OFF_MASK) & ASK != ASK {
        return Err(Errno::ENOSYS);
    }
    let str_at = |off: usize| -> Result<&[u8], Errno> {
        let start = HEADER + u32_at(off) as usize;
        let rest = b.get(start..).ok_or(Errno::EOVERFLOW)?;
        let end = rest.iter().position(|c| *c == 0).ok_or(Errno::EOVERFLOW)?;
        Ok(&rest[..end])
    };
    Ok(str_at(OFF_MNT_POINT)? == want.target.as_bytes()
        && str_at(OFF_FS_TYPE)? == b"tmpfs"
        && str_at(OFF_SB_SOURCE)? == want.source.as_slice()
        && (want.old_id == 0 || u64::from(u32_at(OFF_MNT_ID_OLD)) == want.old_id))
}

#[cfg(test)]
mod tests {
    use std::io::BufRead;
    use std::path::{Path, PathBuf};
    use std::process::{Child, Command, Stdio};

    use super::*;
    use crate::host::mountinfo;

    thread_local! {
        /// What happens at the start of each unmount (a test's race).
        pub(super) static MEANWHILE: std::cell::RefCell<Option<Box<dyn Fn(&Mount)>>> =
            const { std::cell::RefCell::new(None) };
    }

    /// The credential tmpfs source these tests mount (a name no VM of
    /// another test has).
    const CREDS: &str = "vmwarden-creds:rprweb";

    /// A process in a mount namespace of its own (`unshare -m`, private)
    /// holding a tmpfs with `source` at `at`; killed and reaped on drop.
    struct Holder(Child);

    impl Holder {
        fn new(source: &str, at: &Path) -> Holder {
            let mut c = Command::new("unshare")
                .args(["-m", "--propagation", "private", "sh", "-c"])
                .arg(format!(
                    "mount -t tmpfs -o size=4k {source} '{}' && echo MOUNTED && exec sleep 600",
                    at.display()
                ))
                .stdout(Stdio::piped())
                .spawn()
                .expect("unshare");
            let mut line = String::new();
            std::io::BufReader::new(c.stdout.take().expect("stdout"))
                .read_line(&mut line)
                .expect("read the holder's word");
            let h = Holder(c);
            assert_eq!(line.trim(), "MOUNTED", "the holder did not mount {source}");
            h
        }

        fn pid(&self) -> u32 {
            self.0.id()
        }

        /// The namespace and the mount at `at`, as reap's scan reports them
        /// (`at` is `ROOT/rprweb/credentials`).
        fn scan(&self, at: &Path) -> (String, Mount) {
            let root = at.parent().and_then(Path::parent).expect("ROOT");
            let ns = mountinfo::mnt_ns(&self.pid().to_string()).expect("ns/mnt");
            let found = mountinfo::credential_mounts_everywhere(Some(root), None);
            let (_, _, m) = found
                .into_iter()
                .find(|(_, n, _)| *n == ns)
                .unwrap_or_else(|| panic!("the scan did not find the tmpfs in {ns}"));
            assert_ne!(m.unique_id, 0, "the scan stated no unique mount id");
            assert_ne!(m.mount_id, 0, "the scan read no mountinfo id");
            assert_ne!(m.ns_id, 0, "the scan stated no namespace id");
            (ns, m)
        }

        /// The sources mounted at `at` in its namespace, bottom first.
        fn sources_at(&self, at: &Path) -> Vec<String> {
            mountinfo::read(&self.pid().to_string())
                .expect("mountinfo")
                .into_iter()
                .filter(|m| m.mount_point == at)
                .map(|m| m.source)
                .collect()
        }

        /// Run `args` in its mount namespace.
        fn nsenter(&self, args: &[&str]) {
            let o = Command::new("nsenter")
                .args(["-t", &self.pid().to_string(), "-m"])
                .args(args)
                .output()
                .expect("nsenter");
            assert!(o.status.success(), "nsenter {args:?}: {o:?}");
        }
    }

    impl Drop for Holder {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// A directory `DIR/rprweb/credentials` that is deleted on drop, and
    /// the host-wide lock of tests that mount credential tmpfs.
    struct Place {
        dir: PathBuf,
        at: PathBuf,
        _lock: nix::fcntl::Flock<std::fs::File>,
    }

    impl Place {
        fn new(tag: &str) -> Place {
            assert!(nix::unistd::geteuid().is_root(), "this test needs root");
            let f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open("/var/lock/vmwarden-roottests.lock")
                .expect("the root tests' lock");
            let lock = nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive)
                .map_err(|(_, e)| e)
                .expect("flock");
            let dir = std::env::temp_dir().join(format!("vmw-rpr-{tag}-{}", std::process::id()));
            let at = dir.join("rprweb/credentials");
            std::fs::create_dir_all(&at).expect("mkdir");
            Place {
                dir,
                at,
                _lock: lock,
            }
        }
    }

    impl Drop for Place {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// The scan found web's tmpfs in A's namespace through A's pid; before
    /// apply, that pid is B's, a process in another namespace with a tmpfs
    /// of the same source at the same path (a live VM's, say). Reap does
    /// not enter B's namespace: the error names the pid and both
    /// namespaces, and B's mount stays, whether the scan has the mount's
    /// ids (unique and mountinfo's, as here) or none (where only the
    /// namespace check stands between).
    #[test]
    fn a_pid_now_in_another_namespace_is_not_entered() {
        let place = Place::new("ns");
        let a = Holder::new(CREDS, &place.at);
        let b = Holder::new(CREDS, &place.at);
        let (ns_a, m_a) = a.scan(&place.at);
        let (ns_b, _) = b.scan(&place.at);
        assert_ne!(ns_a, ns_b);
        // A scan that has no id of the mount (the `/proc` walk of a
        // kernel before 6.8 reads mountinfo's; this has neither).
        let no_ids = Mount {
            mount_id: 0,
            unique_id: 0,
            ..m_a.clone()
        };
        for m in [&no_ids, &m_a] {
            let e = in_namespace(b.pid(), &ns_a, m).expect_err("entered B's namespace");
            let text = e.to_string();
            assert!(
                matches!(&e, NsUnmountError::HolderLeft { pid, expected, found, .. }
                    if *pid == b.pid() && *expected == ns_a && *found == ns_b),
                "not the holder-left error naming pid {} ({ns_b}) and {ns_a}: {e:?}",
                b.pid()
            );
            for word in [&b.pid().to_string(), &ns_a, &ns_b, "the holder left"] {
                assert!(text.contains(word), "{word:?} not in {text:?}");
            }
            assert_eq!(
                b.sources_at(&place.at),
                [CREDS],
                "B's tmpfs was unmounted from the wrong namespace ({text})"
            );
            assert_eq!(a.sources_at(&place.at), [CREDS]);
        }
        // Through A's own pid, it is unmounted in A's namespace alone.
        in_namespace(a.pid(), &ns_a, &m_a).expect("unmount in A's namespace");
        assert!(a.sources_at(&place.at).is_empty());
        assert_eq!(b.sources_at(&place.at), [CREDS]);
    }

    /// The scan found web's tmpfs in A's namespace; before apply, the path
    /// there holds another mount on top of it: a tmpfs of another source
    /// (told by its source, whatever ids the scan has), then a new tmpfs
    /// of the credential source (told by either id the scan has: the
    /// unique one, or mountinfo's). Neither is unmounted, with a typed
    /// error; once the tmpfs the scan found is on top again, it is.
    #[test]
    fn another_mount_at_the_path_in_the_scans_namespace_is_not_unmounted() {
        let place = Place::new("mount");
        let a = Holder::new(CREDS, &place.at);
        let (ns, m) = a.scan(&place.at);
        let no_ids = Mount {
            mount_id: 0,
            unique_id: 0,
            ..m.clone()
        };
        // The `/proc` walk (a kernel before 6.12) reads mountinfo's id only.
        let old_id = Mount {
            unique_id: 0,
            ..m.clone()
        };
        let unique_id = Mount {
            mount_id: 0,
            ..m.clone()
        };
        let at = place.at.to_str().expect("utf-8 path");
        // Another source is told by its source, whatever the scan has;
        // the same source only by an id the scan has, either.
        let cases = [
            ("other", [CREDS, "other"], vec![&m, &no_ids]),
            (CREDS, [CREDS, CREDS], vec![&m, &old_id, &unique_id]),
        ];
        for (source, stack, scans) in cases {
            a.nsenter(&["mount", "-t", "tmpfs", "-o", "size=4k", source, at]);
            for scanned in scans {
                let e = in_namespace(a.pid(), &ns, scanned).expect_err(&format!(
                    "unmounted the {source} tmpfs on top (scan's ids: unique {}, mountinfo {})",
                    scanned.unique_id, scanned.mount_id
                ));
                assert!(
                    matches!(&e, NsUnmountError::NotTheMount { pid, ns: n, .. }
                        if *pid == a.pid() && *n == ns),
                    "not the not-the-mount error: {e:?}"
                );
                assert!(e
                    .to_string()
                    .contains("no longer the mount the scan reported"));
                assert_eq!(
                    a.sources_at(&place.at),
                    stack,
                    "the {source} tmpfs on top of the scan's was unmounted ({e})"
                );
            }
            a.nsenter(&["umount", at]);
        }
        in_namespace(a.pid(), &ns, &m).expect("the scan's own mount");
        assert!(a.sources_at(&place.at).is_empty());
    }

    /// The scan found web's tmpfs in A's namespace through A's pid; before
    /// apply, A exits, its namespace is freed, and a new one, B, gets the
    /// freed inode number (the kernel hands it out again at once), with a
    /// process at the scan's pid (pids are reused too: `pid_max` may be
    /// 32768) and a tmpfs of the same source at the same path: a relaunch
    /// of the same VM. B is not entered whatever ids of the mount the scan
    /// has (none, or mountinfo's alone, also handed out again): its tmpfs
    /// stays, and the error names the pid and both namespaces.
    #[test]
    fn a_namespace_that_took_the_scans_namespace_inode_is_not_entered() {
        let place = Place::new("reuse");
        let a = Holder::new(CREDS, &place.at);
        let (ns_a, m_a) = a.scan(&place.at);
        drop(a);
        let mut tries = 0;
        let b = loop {
            let b = Holder::new(CREDS, &place.at);
            if mountinfo::mnt_ns(&b.pid().to_string()).as_deref() == Some(ns_a.as_str()) {
                break b;
            }
            drop(b);
            tries += 1;
            assert!(
                tries < 200,
                "no new namespace took {ns_a}'s inode in 200 tries (another namespace has it)"
            );
        };
        let no_ids = Mount {
            mount_id: 0,
            unique_id: 0,
            ..m_a.clone()
        };
        let old_id = Mount {
            unique_id: 0,
            ..m_a.clone()
        };
        for m in [&old_id, &no_ids, &m_a] {
            let e = in_namespace(b.pid(), &ns_a, m).expect_err(&format!(
                "entered B, which took {ns_a}'s inode (scan's ids: unique {}, mountinfo {})",
                m.unique_id, m.mount_id
            ));
            assert_eq!(
                b.sources_at(&place.at),
                [CREDS],
                "B's tmpfs was unmounted: B took the inode of the scan's namespace {ns_a} ({e})"
            );
            let found = crate::host::ns_mounts::id_of(
                &std::fs::File::open(format!("/proc/{}/ns/mnt", b.pid())).expect("B's ns"),
            )
            .expect("B's namespace id");
            assert!(
                matches!(&e, NsUnmountError::NamespaceReplaced { pid, ns, scan_id, found_id, .. }
                    if *pid == b.pid() && *ns == ns_a && *scan_id == m_a.ns_id && *found_id == found),
                "not the namespace-replaced error naming pid {} and {ns_a} with ids {} and {found}: {e:?}",
                b.pid(),
                m_a.ns_id
            );
            let text = e.to_string();
            for word in [
                &b.pid().to_string(),
                &ns_a,
                &m_a.ns_id.to_string(),
                &found.to_string(),
            ] {
                assert!(text.contains(word.as_str()), "{word:?} not in {text:?}");
            }
        }
    }

    /// `reap --apply` finds web's tmpfs in A's namespace, web's lease free:
    /// until the unmount is done, web's lease stays reap's, so no launch
    /// of web (whose namespace would hold a tmpfs of the same source at the
    /// same path) starts between the check and the unmount.
    #[test]
    fn reap_apply_holds_the_vms_lease_while_it_unmounts() {
        use crate::host::dirs;
        use crate::instance::lease::Lease;
        let place = Place::new("lease");
        let a = Holder::new(CREDS, &place.at);
        let roots = crate::config::paths::Roots {
            config_dir: place.dir.join("config"),
            runtime_root: place.dir.clone(),
            state_root: place.dir.join("state"),
        };
        let rundir = place.at.parent().expect("rundir").to_path_buf();
        let free = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let seen = free.clone();
        MEANWHILE.with(|f| {
            *f.borrow_mut() = Some(Box::new(move |m: &Mount| {
                let d = dirs::open_dir(&rundir).expect("web's runtime dir");
                let launch = Lease::acquire(&d).expect("a launch's lease");
                seen.borrow_mut()
                    .push((m.mount_point.clone(), launch.is_some()));
            }));
        });
        let mut r = super::super::Report {
            apply: true,
            ..Default::default()
        };
        let web = crate::config::names::VmName::parse("rprweb").expect("name");
        super::super::reap_credential_mounts(&roots, &[web].into(), &mut r);
        MEANWHILE.with(|f| f.borrow_mut().take());
        assert_eq!(
            *free.borrow(),
            [(place.at.clone(), false)],
            "a launch of rprweb could take its lease while reap unmounted its tmpfs"
        );
        assert_eq!(r.deleted, [place.at.clone()], "{:?}", r.failed);
        assert!(a.sources_at(&place.at).is_empty());
    }

    /// The scan found web's tmpfs in A's namespace; before apply, a
    /// directory of its path there is renamed away (the tmpfs goes with
    /// it) and a symlink to a directory holding another tmpfs of the
    /// credential source takes its name. The path now resolves to that
    /// mount, which the scan did not report: kept, whatever ids the scan
    /// has (none: its mount point tells it), and the scan's too.
    #[test]
    fn a_symlink_in_the_path_to_another_mount_is_not_followed_to_unmount_it() {
        let place = Place::new("link");
        let a = Holder::new(CREDS, &place.at);
        let (ns, m) = a.scan(&place.at);
        let other = place.dir.join("other/credentials");
        std::fs::create_dir_all(&other).expect("mkdir other");
        let other_s = other.to_str().expect("utf-8 path");
        a.nsenter(&["mount", "-t", "tmpfs", "-o", "size=4k", CREDS, other_s]);
        let (web, old) = (place.dir.join("rprweb"), place.dir.join("rprweb.old"));
        std::fs::rename(&web, &old).expect("rename rprweb");
        std::os::unix::fs::symlink("other", &web).expect("symlink rprweb");
        let no_ids = Mount {
            mount_id: 0,
            unique_id: 0,
            ..m.clone()
        };
        for scanned in [&no_ids, &m] {
            let e = in_namespace(a.pid(), &ns, scanned).expect_err(&format!(
                "unmounted through the symlink (scan's ids: unique {}, mountinfo {})",
                scanned.unique_id, scanned.mount_id
            ));
            assert!(
                matches!(&e, NsUnmountError::NotTheMount { .. }),
                "not the not-the-mount error: {e:?}"
            );
            assert_eq!(
                a.sources_at(&other),
                [CREDS],
                "the tmpfs the symlink leads to was unmounted ({e})"
            );
            assert_eq!(a.sources_at(&old.join("credentials")), [CREDS]);
        }
    }

    /// The scan found web's tmpfs in A's namespace; before apply, a mount
    /// of another file system (ramfs) with the credential source goes on
    /// top: kept, whatever ids the scan has (none: its type tells it).
    #[test]
    fn another_file_system_with_the_credential_source_is_not_unmounted() {
        let place = Place::new("ramfs");
        let a = Holder::new(CREDS, &place.at);
        let (ns, m) = a.scan(&place.at);
        let at = place.at.to_str().expect("utf-8 path");
        a.nsenter(&["mount", "-t", "ramfs", CREDS, at]);
        let no_ids = Mount {
            mount_id: 0,
            unique_id: 0,
            ..m.clone()
        };
        for scanned in [&no_ids, &m] {
            let e = in_namespace(a.pid(), &ns, scanned).expect_err(&format!(
                "unmounted the ramfs on top (scan's ids: unique {}, mountinfo {})",
                scanned.unique_id, scanned.mount_id
            ));
            assert!(
                matches!(&e, NsUnmountError::NotTheMount { .. }),
                "not the not-the-mount error: {e:?}"
            );
            assert_eq!(
                a.sources_at(&place.at),
                [CREDS, CREDS],
                "the ramfs on top of the scan's tmpfs was unmounted ({e})"
            );
        }
    }
}
