//! The /proc scans: which processes run as a uid, which task stands for
//! each mount namespace, a process's ancestors. Only facts about the host;
//! verdicts are `instance::liveness`.
//!
//! A scan reads one `status` file per *process*, not per thread: a
//! process's threads share its credentials unless a privileged caller set
//! them apart, and what a VM can do it does with its own uid everywhere.
//! The one case where the thread-group leader does not speak for its
//! threads is kept: a leader that has exited (a zombie in `status`) while
//! other threads run on. Only then are the threads in `task/` read. So a
//! scan costs O(processes), whatever the number of threads on the host.

use std::collections::{BTreeSet, HashMap};
use std::ffi::CStr;
use std::fs::File;
use std::io::{ErrorKind, Read};
use std::os::fd::{AsFd, OwnedFd};

use nix::errno::Errno;
use nix::fcntl::{openat, OFlag, AT_FDCWD};
use nix::sys::signal::{kill, Signal};
use nix::sys::stat::Mode;
use nix::unistd::Pid;

/// SIGKILL process `pid`. A pid that `kill(2)` would read as a process group
/// or as "every process" (0, or one past `i32::MAX`) is refused with EINVAL.
pub fn sigkill(pid: u32) -> nix::Result<()> {
    match i32::try_from(pid) {
        Ok(p) if p > 0 => kill(Pid::from_raw(p), Signal::SIGKILL),
        _ => Err(Errno::EINVAL),
    }
}

/// What one task's `status` says about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TaskStatus {
    /// `State:` Z or X: a zombie holds nothing (its fds, the lease among
    /// them, are closed); it only waits for its parent.
    dead: bool,
    /// `Threads:` of its thread group (a zombie leader with live threads
    /// says more than 1).
    threads: u32,
    /// Real, effective, saved and fs uid.
    uids: [u32; 4],
}

fn parse_status(bytes: &[u8]) -> Option<TaskStatus> {
    let text = std::str::from_utf8(bytes).ok()?;
    let mut dead = None;
    let mut threads = None;
    let mut uids = None;
    for l in text.lines() {
        if let Some(st) = l.strip_prefix("State:") {
            dead = Some(matches!(
                st.trim_start().as_bytes().first(),
                Some(b'Z' | b'X')
            ));
        } else if let Some(ids) = l.strip_prefix("Uid:") {
            let mut it = ids.split_whitespace().map(|x| x.parse::<u32>());
            let mut u = [0u32; 4];
            for slot in &mut u {
                *slot = it.next()?.ok()?;
            }
            uids = Some(u);
        } else if let Some(t) = l.strip_prefix("Threads:") {
            threads = t.trim().parse().ok();
        }
        if dead.is_some() && uids.is_some() && threads.is_some() {
            break;
        }
    }
    Some(TaskStatus {
        dead: dead?,
        threads: threads.unwrap_or(1),
        uids: uids?,
    })
}

/// `/proc`, opened once per scan; every path below is relative to it.
#[derive(Debug)]
struct Proc {
    fd: OwnedFd,
    buf: Vec<u8>,
}

/// Why a scan could not tell everything: entries it could not read for a
/// reason other than the task having exited.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Unreadable(pub Vec<(String, Errno)>);

impl Proc {
    fn open() -> Result<Proc, Errno> {
        let fd = openat(
            AT_FDCWD,
            "/proc",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Proc {
            fd,
            buf: Vec::with_capacity(4096),
        })
    }

    /// Numeric entries of `/proc/REL` (`REL` = "" for `/proc` itself).
    fn ids(&self, rel: &str) -> Result<Vec<u32>, Errno> {
        let fd = openat(
            self.fd.as_fd(),
            if rel.is_empty() { "." } else { rel },
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        let mut d = nix::dir::Dir::from_fd(fd)?;
        let mut out = Vec::new();
        for e in d.iter() {
            let e = e?;
            if let Some(id) = parse_id(e.file_name()) {
                out.push(id);
            }
        }
        Ok(out)
    }

    /// Read `/proc/REL` whole into the scan's buffer. These files are
    /// generated whole on the first read (single_open): a short read is the
    /// end, no second read needed.
    fn read(&mut self, rel: &str) -> Result<&[u8], Errno> {
        let fd = openat(
            self.fd.as_fd(),
            rel,
            OFlag::O_RDONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        let mut f = File::from(fd);
        self.buf.clear();
        let mut chunk = [0u8; 4096];
        loop {
            match f.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    if n < chunk.len() {
                        break;
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(errno_of(&e)),
            }
        }
        Ok(&self.buf)
    }

    /// The owner of `/proc/PID`: the process's effective uid while it is
    /// dumpable, else root.
    fn owner(&self, pid: u32) -> Result<u32, Errno> {
        nix::sys::stat::fstatat(
            self.fd.as_fd(),
            pid.to_string().as_str(),
            nix::fcntl::AtFlags::empty(),
        )
        .map(|st| st.st_uid)
    }

    /// True for a task group without an address space and with one thread:
    /// a kernel thread, a zombie whose whole group has exited, or a process
    /// past `exit_mm` — none of them runs anything of a VM. Its `exe` link
    /// is ENOENT (a live process's is its binary, even when deleted) and its
    /// `task/` directory's link count is 2 + the number of threads. A
    /// zombie leader whose other threads run on has more than one: false,
    /// and its threads are read. Anything unclear: false (read status).
    /// (`exe` is followed, not read: the kernel then skips building the
    /// path string readlink would return, ~1 µs of the ~2.5 per process.)
    fn no_mm_single_thread(&self, pid: u32) -> bool {
        let exe = nix::unistd::faccessat(
            self.fd.as_fd(),
            format!("{pid}/exe").as_str(),
            nix::unistd::AccessFlags::F_OK,
            nix::fcntl::AtFlags::empty(),
        );
        if exe != Err(Errno::ENOENT) {
            return false;
        }
        nix::sys::stat::fstatat(
            self.fd.as_fd(),
            format!("{pid}/task").as_str(),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .is_ok_and(|st| st.st_nlink <= 3)
    }

    /// The children of kthreadd (pid 2), sorted: the kernel's threads,
    /// each but kthreadd itself, are among them. A hint, never a verdict: a
    /// pid listed here is still tested ([`Proc::no_mm_single_thread`]; a
    /// user-mode helper is kthreadd's child too), and one missing from it
    /// (a kernel thread started since, a list cut short, another pid 2 in
    /// a container) has its status read. None when it cannot be read
    /// (no `CONFIG_PROC_CHILDREN`): every process is tested.
    fn kthreadd_children(&mut self) -> Option<Vec<u32>> {
        let text = std::str::from_utf8(self.read("2/task/2/children").ok()?).ok()?;
        let mut pids: Vec<u32> = text
            .split_ascii_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        pids.sort_unstable();
        (!pids.is_empty()).then_some(pids)
    }

    /// The target of the symlink `/proc/REL`.
    fn link(&self, rel: &str) -> Result<String, Errno> {
        nix::fcntl::readlinkat(self.fd.as_fd(), rel).map(|t| t.to_string_lossy().into_owned())
    }

    /// Every live process (by thread-group id) with the uids it runs as:
    /// the leader's `status`, or for a zombie leader with live threads the
    /// union of those threads' uids. With `owner = Some(uid)`, processes
    /// whose `/proc` entry belongs to neither `uid` nor root are skipped
    /// unread (a non-dumpable process's entry belongs to root, so those are
    /// still read).
    fn processes(
        &mut self,
        owner: Option<u32>,
        mut f: impl FnMut(u32, &[u32; 4]),
    ) -> Result<Unreadable, Errno> {
        let mut unreadable = Unreadable::default();
        let gone_or = |what: String, e: Errno, u: &mut Unreadable| {
            // ENOENT/ESRCH: the task exited during the scan.
            if !matches!(e, Errno::ENOENT | Errno::ESRCH) {
                u.0.push((what, e));
            }
        };
        let kthreads = self.kthreadd_children();
        for pid in self.ids("")? {
            // Only kthreadd's children can be kernel threads: any other
            // process skips that test (and its status is read).
            let maybe_kthread = match &kthreads {
                Some(k) => k.binary_search(&pid).is_ok(),
                None => true,
            };
            let root_owned = match owner {
                None => true,
                // Its kernel-thread test comes first; if it fails, its
                // status is read whoever owns it.
                Some(_) if maybe_kthread && kthreads.is_some() => true,
                Some(uid) => match self.owner(pid) {
                    Ok(o) if o != 0 && o != uid => continue,
                    Ok(o) => o == 0,
                    Err(e) => {
                        gone_or(format!("/proc/{pid}"), e, &mut unreadable);
                        continue;
                    }
                },
            };
            // Kernel threads (about half the entries on a host) are
            // root's and have no address space: skipped without reading
            // their status.
            if root_owned && maybe_kthread && self.no_mm_single_thread(pid) {
                continue;
            }
            let rel = format!("{pid}/status");
            let st = match self.read(&rel).map(parse_status) {
                Ok(Some(st)) => st,
                Ok(None) => {
                    unreadable.0.push((format!("/proc/{rel}"), Errno::EINVAL));
                    continue;
                }
                Err(e) => {
                    gone_or(format!("/proc/{rel}"), e, &mut unreadable);
                    continue;
                }
            };
            if !st.dead {
                f(pid, &st.uids);
                continue;
            }
            if st.threads <= 1 {
                continue;
            }
            // The leader has exited, other threads run on: they count.
            let tids = match self.ids(&format!("{pid}/task")) {
                Ok(t) => t,
                Err(e) => {
                    gone_or(format!("/proc/{pid}/task"), e, &mut unreadable);
                    continue;
                }
            };
            for tid in tids.into_iter().filter(|t| *t != pid) {
                let rel = format!("{pid}/task/{tid}/status");
                match self.read(&rel).map(parse_status) {
                    Ok(Some(t)) if !t.dead => f(pid, &t.uids),
                    Ok(_) => {}
                    Err(e) => gone_or(format!("/proc/{rel}"), e, &mut unreadable),
                }
            }
        }
        Ok(unreadable)
    }
}

/// The errno of an io error from a system call (EIO if it has none).
fn errno_of(e: &std::io::Error) -> Errno {
    Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO))
}

fn parse_id(name: &CStr) -> Option<u32> {
    let b = name.to_bytes();
    if b.is_empty() || !b.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(b).ok()?.parse().ok()
}

/// Processes of one uid, and what could not be read while looking.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UidTasks {
    /// Live processes whose real, effective, saved or fs uid is the uid.
    pub pids: Vec<u32>,
    pub unreadable: Unreadable,
}

/// One `/proc` scan for a single uid.
pub fn tasks_of_uid(uid: u32) -> UidTasks {
    let mut pids = BTreeSet::new();
    let unreadable = match Proc::open() {
        Ok(mut p) => p
            .processes(Some(uid), |pid, ids| {
                if ids.contains(&uid) {
                    pids.insert(pid);
                }
            })
            .unwrap_or_else(|e| Unreadable(vec![("/proc".into(), e)])),
        Err(e) => Unreadable(vec![("/proc".into(), e)]),
    };
    UidTasks {
        pids: pids.into_iter().collect(),
        unreadable,
    }
}

/// Pids of live (non-zombie) processes whose real, effective, saved or fs
/// uid is `uid` (a process whose leader exited counts while a thread runs).
pub fn processes_of_uid(uid: u32) -> Vec<u32> {
    tasks_of_uid(uid).pids
}

/// Does process `pid` run now with `uid` as a real, effective, saved or fs
/// uid (its leader, or a live thread behind an exited leader)?
pub fn process_runs_as(pid: u32, uid: u32) -> bool {
    let Ok(mut p) = Proc::open() else {
        return false;
    };
    let Ok(Some(st)) = p.read(&format!("{pid}/status")).map(parse_status) else {
        return false;
    };
    if !st.dead {
        return st.uids.contains(&uid);
    }
    if st.threads <= 1 {
        return false;
    }
    let Ok(tids) = p.ids(&format!("{pid}/task")) else {
        return false;
    };
    tids.into_iter().filter(|t| *t != pid).any(|tid| {
        matches!(
            p.read(&format!("{pid}/task/{tid}/status")).map(parse_status),
            Ok(Some(t)) if !t.dead && t.uids.contains(&uid)
        )
    })
}

/// One `/proc` scan answering "which processes run as uid X" for every X:
/// reap, `status` of all VMs and `verify-clean` of all VMs share one.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    by_uid: HashMap<u32, BTreeSet<u32>>,
    unreadable: Unreadable,
}

impl Snapshot {
    pub fn take() -> Snapshot {
        let mut by_uid: HashMap<u32, BTreeSet<u32>> = HashMap::new();
        let unreadable = match Proc::open() {
            Ok(mut p) => p
                .processes(None, |pid, ids| {
                    for u in ids {
                        by_uid.entry(*u).or_default().insert(pid);
                    }
                })
                .unwrap_or_else(|e| Unreadable(vec![("/proc".into(), e)])),
            Err(e) => Unreadable(vec![("/proc".into(), e)]),
        };
        Snapshot { by_uid, unreadable }
    }

    pub fn of(&self, uid: u32) -> UidTasks {
        UidTasks {
            pids: self
                .by_uid
                .get(&uid)
                .map(|s| s.iter().copied().collect())
                .unwrap_or_default(),
            unreadable: self.unreadable.clone(),
        }
    }
}

/// The caller's ancestors (parent, grandparent, … up to pid 1).
pub fn ancestors() -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(mut p) = Proc::open() else {
        return out;
    };
    let mut rel = "self/stat".to_string();
    while let Some(ppid) = p.read(&rel).ok().and_then(parse_ppid) {
        if ppid == 0 || out.contains(&ppid) {
            break;
        }
        out.push(ppid);
        rel = format!("{ppid}/stat");
    }
    out
}

/// The ppid in a `/proc/PID/stat` line (`pid (comm) S ppid …`; comm may
/// hold spaces and parentheses, so split after the last `)`).
fn parse_ppid(stat: &[u8]) -> Option<u32> {
    let close = stat.iter().rposition(|b| *b == b')')?;
    let rest = std::str::from_utf8(&stat[close + 1..]).ok()?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// One task for each mount namespace that a task of the host is in, among
/// namespaces owned by the caller's user namespace (an unprivileged user's
/// namespace is not vmwarden's and cannot hold a mount the launcher made):
/// `(task id, "mnt:[inode]")`. One link is read per process; the threads of
/// a process are read only when its leader has exited (a zombie leader has
/// no namespaces of its own while its threads keep theirs).
pub fn mount_namespace_holders() -> Vec<(u32, String)> {
    let mut out = Vec::new();
    let Ok(p) = Proc::open() else {
        return out;
    };
    let Ok(my_userns) = p.link("self/ns/user") else {
        return out;
    };
    let mut seen = BTreeSet::new();
    let mut consider =
        |rel_task: &str, id: u32, seen: &mut BTreeSet<String>| -> Result<(), Errno> {
            let ns = p.link(&format!("{rel_task}/ns/mnt"))?;
            if seen.contains(&ns) {
                return Ok(());
            }
            let userns = p.link(&format!("{rel_task}/ns/user"))?;
            seen.insert(ns.clone());
            if userns == my_userns {
                out.push((id, ns));
            }
            Ok(())
        };
    let Ok(pids) = p.ids("") else {
        return Vec::new();
    };
    for pid in pids {
        match consider(&pid.to_string(), pid, &mut seen) {
            Ok(()) => {}
            // No namespaces: a zombie leader (or gone). Its threads, if any
            // run on, have theirs.
            Err(Errno::ENOENT) => {
                if let Ok(tids) = p.ids(&format!("{pid}/task")) {
                    for tid in tids.into_iter().filter(|t| *t != pid) {
                        let _ = consider(&format!("{pid}/task/{tid}"), tid, &mut seen);
                    }
                }
            }
            Err(_) => {}
        }
    }
    out
}

/// Is `pid` a live (non-zombie) process? A pid that cannot be read counts as
/// gone.
pub fn is_alive(pid: u32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("State:"))
        .is_some_and(|st| !matches!(st.trim_start().chars().next(), Some('Z' | 'X')))
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str = "Name:\tqemu\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t7\nNgid:\t0\nPid:\t7\nPPid:\t1\nTracerPid:\t0\nUid:\t61000\t61001\t61002\t61003\nGid:\t5\t5\t5\t5\nFDSize:\t64\nGroups:\t\nThreads:\t9\n";

    #[test]
    fn status_gives_state_uids_and_threads() {
        let s = parse_status(STATUS.as_bytes()).unwrap();
        assert!(!s.dead);
        assert_eq!(s.uids, [61000, 61001, 61002, 61003]);
        assert_eq!(s.threads, 9);
        let z = STATUS.replace("S (sleeping)", "Z (zombie)");
        assert!(parse_status(z.as_bytes()).unwrap().dead);
        let x = STATUS.replace("S (sleeping)", "X (dead)");
        assert!(parse_status(x.as_bytes()).unwrap().dead);
        assert!(parse_status(b"Name:\tx\n").is_none());
    }

    #[test]
    fn ppid_survives_a_hostile_comm() {
        assert_eq!(parse_ppid(b"42 (a) b) S 17 42 42 0"), Some(17));
        assert_eq!(parse_ppid(b"1 (systemd) S 0 1 1 0"), Some(0));
    }

    #[test]
    fn this_process_is_found_under_its_own_uid() {
        let me = std::process::id();
        let uid = nix::unistd::getuid().as_raw();
        assert!(processes_of_uid(uid).contains(&me));
        assert!(Snapshot::take().of(uid).pids.contains(&me));
        assert!(!ancestors().is_empty());
    }

    #[test]
    fn a_zombie_leader_with_a_live_thread_still_counts() {
        // A process whose main thread exits while another thread sleeps.
        let script = "import threading, time, ctypes\n\
            threading.Thread(target=time.sleep, args=(30,)).start()\n\
            ctypes.CDLL(None).syscall(60, 0)\n";
        let mut child = std::process::Command::new("python3")
            .args(["-c", script])
            .spawn()
            .expect("python3");
        let pid = child.id();
        let uid = nix::unistd::getuid().as_raw();
        let mut zombie = false;
        for _ in 0..500 {
            let st = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
            if st.contains("State:\tZ") {
                zombie = true;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let found = processes_of_uid(uid).contains(&pid);
        let snap = Snapshot::take().of(uid).pids.contains(&pid);
        let _ = child.kill();
        let _ = child.wait();
        assert!(zombie, "the leader never exited");
        assert!(found && snap, "a live thread of a zombie leader was missed");
    }
}
