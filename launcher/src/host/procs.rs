//! The /proc scans: which processes run as a uid, which task stands for
//! each mount namespace, a process's ancestors. Only facts about the host;
//! verdicts are `instance::liveness`.
//!
//! A scan reads the credentials of each *process*, not of each thread: a
//! process's threads share its credentials unless a privileged caller set
//! them apart, and what a VM can do it does with its own uid everywhere.
//! A live process's come from a pidfd (`PIDFD_GET_INFO`: four numbers, no
//! `status` text generated); the rest have their `status` read. The one
//! case where the thread-group leader does not speak for its threads is
//! kept: a leader that has exited (no address space; a zombie in `status`)
//! while other threads run on. Only then are the threads in `task/` read. So a
//! scan costs O(processes), whatever the number of threads on the host.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::CStr;
use std::path::Path;

use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::host::sys::read_path;

mod proc_dir;
pub use proc_dir::Unreadable;
use proc_dir::{Proc, Rel};

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
pub struct TaskStatus {
    /// `State:` Z or X: a zombie holds nothing (its fds, the lease among
    /// them, are closed); it only waits for its parent.
    pub dead: bool,
    /// `Threads:` of its thread group (a zombie leader with live threads
    /// says more than 1).
    pub threads: u32,
    /// Real, effective, saved and fs uid.
    pub uids: [u32; 4],
}

/// Parsed on bytes, line by line: a process names itself (`Name:`, any
/// bytes but NUL and newline), so the text need not be UTF-8, and only the
/// three lines wanted are looked at.
pub fn parse_status(bytes: &[u8]) -> Option<TaskStatus> {
    let mut dead = None;
    let mut threads = None;
    let mut uids = None;
    for l in bytes.split(|b| *b == b'\n') {
        if let Some(st) = l.strip_prefix(b"State:") {
            dead = Some(matches!(st.trim_ascii_start().first(), Some(b'Z' | b'X')));
        } else if let Some(ids) = l.strip_prefix(b"Uid:") {
            let mut it = ids
                .split(u8::is_ascii_whitespace)
                .filter(|f| !f.is_empty())
                .map(parse_u32);
            let mut u = [0u32; 4];
            for slot in &mut u {
                *slot = it.next()??;
            }
            uids = Some(u);
        } else if let Some(t) = l.strip_prefix(b"Threads:") {
            threads = parse_u32(t.trim_ascii());
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

fn parse_u32(b: &[u8]) -> Option<u32> {
    std::str::from_utf8(b).ok()?.parse().ok()
}

/// Which uids a [`Scan`] answers for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum UidFilter {
    /// None: no process's credentials are read.
    #[default]
    None,
    /// Only these: a process whose `/proc` entry belongs to neither one of
    /// them nor root is skipped unread (root's are read: a process running
    /// with euid 0 may hold the uid as its real, saved or fs uid).
    Of(BTreeSet<u32>),
    /// Every uid (reap, `status` of every VM).
    All,
}

/// What one pass over `/proc` gathers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Wants {
    pub uids: UidFilter,
    /// The mount namespaces (of this user namespace) tasks are in, with the
    /// tasks in each (see [`MountNamespace`]).
    pub mount_namespaces: bool,
}

impl Wants {
    /// The processes of `uids` and the mount namespaces: what `cleanup` and
    /// `verify-clean` ask. The namespaces are not walked when the kernel
    /// enumerates them itself ([`sees_every_mount_namespace`]): the search
    /// for credential mounts then walks `/proc` only to name a process of
    /// a namespace that holds one.
    /// No uid at all (a VM whose uid cannot be known) reads no process's
    /// credentials.
    pub fn uids_and_mounts(uids: impl IntoIterator<Item = u32>) -> Wants {
        let set: BTreeSet<u32> = uids.into_iter().collect();
        Wants {
            uids: if set.is_empty() {
                UidFilter::None
            } else {
                UidFilter::Of(set)
            },
            mount_namespaces: !sees_every_mount_namespace(),
        }
    }
}

/// Does the kernel enumerate every mount namespace of the host for this
/// caller (`host::ns_mounts`)? Only for root with `CAP_SYS_ADMIN` in its user namespace (it
/// then sees each namespace that user namespace and its children own);
/// anyone else is shown only some, so the `/proc` walk stays.
pub fn sees_every_mount_namespace() -> bool {
    nix::unistd::geteuid().is_root()
        && caps::has_cap(
            None,
            caps::CapSet::Effective,
            caps::Capability::CAP_SYS_ADMIN,
        )
        .unwrap_or(false)
}

/// One mount namespace that tasks of the host are in, owned by the
/// caller's user namespace (whatever user namespace its tasks are in
/// now; a namespace another user namespace owns is not vmwarden's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountNamespace {
    /// `mnt:[inode]`.
    pub ns: String,
    /// Tasks found in it, in scan order: the first one stands for it; the
    /// next ones are there in case it exits before its mountinfo is read.
    pub tasks: Vec<u32>,
}

/// What one pass over `/proc` found: every check of a command (liveness,
/// the processes left, the credential mounts in every namespace) and every
/// VM it asks about share it. Per process, one `/proc` directory walk: the
/// owner of its entry (1 call) when only some uids are asked about; when
/// it may hold one of them, whether it has an address space (1 call), then
/// its credentials from a pidfd (open, ioctl, close) if it has, its
/// `status` (open, read, close) if not, and for kthreadd's children its
/// thread count first (1 call: a kernel thread is skipped); and its
/// `ns/mnt` link (1 call) when namespaces are asked about.
#[derive(Debug, Clone, Default)]
pub struct Scan {
    uids: UidFilter,
    by_uid: HashMap<u32, BTreeSet<u32>>,
    unreadable: Unreadable,
    mount_namespaces: Option<Vec<MountNamespace>>,
}

impl Scan {
    /// Walk `/proc` once for what `wants` names.
    pub fn take(wants: &Wants) -> Scan {
        let mut scan = Scan {
            uids: wants.uids.clone(),
            mount_namespaces: wants.mount_namespaces.then(Vec::new),
            ..Scan::default()
        };
        match Proc::open() {
            Ok(mut p) => {
                if let Err(e) = scan.walk(&mut p, wants) {
                    scan.unreadable.0.push(("/proc".into(), e));
                }
            }
            Err(e) => scan.unreadable.0.push(("/proc".into(), e)),
        }
        scan
    }

    /// Does this scan answer for `uid`?
    pub fn covers(&self, uid: u32) -> bool {
        match &self.uids {
            UidFilter::None => false,
            UidFilter::Of(set) => set.contains(&uid),
            UidFilter::All => true,
        }
    }

    /// The processes of `uid`; None when the scan was not asked about it.
    pub fn of(&self, uid: u32) -> Option<UidTasks> {
        self.covers(uid).then(|| UidTasks {
            pids: self
                .by_uid
                .get(&uid)
                .map(|s| s.iter().copied().collect())
                .unwrap_or_default(),
            unreadable: self.unreadable.clone(),
        })
    }

    /// Processes with a uid in `lo..hi` (a scan of every uid only, else
    /// none), by uid: a VM's own id range (`identity::registry`).
    pub fn in_range(&self, lo: u32, hi: u32) -> BTreeMap<u32, Vec<u32>> {
        if self.uids != UidFilter::All {
            return BTreeMap::new();
        }
        self.by_uid
            .iter()
            .filter(|(u, _)| (lo..hi).contains(*u))
            .map(|(u, pids)| (*u, pids.iter().copied().collect()))
            .collect()
    }

    /// What could not be read while scanning.
    pub fn unreadable(&self) -> &Unreadable {
        &self.unreadable
    }

    /// The mount namespaces, when the scan was asked for them.
    pub fn mount_namespaces(&self) -> Option<&[MountNamespace]> {
        self.mount_namespaces.as_deref()
    }

    fn record(&mut self, pid: u32, ids: &[u32; 4]) {
        for u in ids {
            if self.covers(*u) {
                self.by_uid.entry(*u).or_default().insert(pid);
            }
        }
    }

    fn walk(&mut self, p: &mut Proc, wants: &Wants) -> Result<(), Errno> {
        let my_userns = if wants.mount_namespaces {
            Some(p.link("self/ns/user")?)
        } else {
            None
        };
        let mut ns_index: BTreeMap<Vec<u8>, Option<usize>> = BTreeMap::new();
        let kthreads = match wants.uids {
            UidFilter::None => None,
            _ => p.kthreadd_children(),
        };
        for pid in p.ids("")? {
            let Some(threads) = self.credentials(p, pid, kthreads.as_deref()) else {
                continue; // exited meanwhile
            };
            if let Some(mine) = &my_userns {
                self.namespaces(p, pid, threads, mine, &mut ns_index);
            }
        }
        Ok(())
    }

    /// The uid part of one process: its credentials when it may hold one
    /// of the uids asked about. Returns what was learnt of its group's
    /// size (`Some(None)`: not asked), or None when it exited meanwhile.
    fn credentials(
        &mut self,
        p: &mut Proc,
        pid: u32,
        kthreads: Option<&[u32]>,
    ) -> Option<Option<u64>> {
        // Only kthreadd's children can be kernel threads: any other
        // process skips that test (and its status is read).
        let maybe_kthread = kthreads.is_none_or(|k| k.binary_search(&pid).is_ok());
        let test_kthread = match &self.uids {
            UidFilter::None => return Some(None),
            UidFilter::All => maybe_kthread,
            // Its kernel-thread test comes first; if it fails, its
            // status is read whoever owns it.
            UidFilter::Of(_) if maybe_kthread && kthreads.is_some() => true,
            UidFilter::Of(set) => match p.owner(pid) {
                Ok(o) if o != 0 && !set.contains(&o) => return Some(None),
                Ok(o) => o == 0 && maybe_kthread,
                Err(e) => {
                    return (!self.unreadable.gone_or(|| format!("/proc/{pid}"), e)).then_some(None)
                }
            },
        };
        // A process with an address space has a live leader, whose
        // credentials speak for its threads: they come from its pidfd and
        // its status is not read. Without one, it is a kernel thread (about
        // half the entries on a host: root's, one thread, skipped unread), a
        // zombie or past `exit_mm`: its status says which.
        match p.has_mm(pid) {
            Ok(true) => match p.creds(pid) {
                Ok(Some(uids)) => {
                    self.record(pid, &uids);
                    return Some(None);
                }
                Ok(None) => {}
                Err(e) => {
                    return (!self.unreadable.gone_or(|| format!("/proc/{pid}"), e)).then_some(None)
                }
            },
            Ok(false) if test_kthread && p.threads(pid).is_some_and(|n| n <= 1) => {
                return Some(Some(1));
            }
            Ok(false) | Err(_) => {}
        }
        let rel = Rel::pid(pid, "status");
        let st = match p.read(rel.c()).map(parse_status) {
            Ok(Some(st)) => st,
            Ok(None) => {
                self.unreadable.0.push((rel.show(), Errno::EINVAL));
                return Some(None);
            }
            Err(e) => return (!self.unreadable.gone_or(|| rel.show(), e)).then_some(None),
        };
        if !st.dead {
            self.record(pid, &st.uids);
        } else if st.threads > 1 {
            // The leader has exited, other threads run on: they count.
            for tid in p.other_threads(pid, &mut self.unreadable) {
                let rel = Rel::task(pid, tid, "status");
                match p.read(rel.c()).map(parse_status) {
                    Ok(Some(t)) if !t.dead => self.record(pid, &t.uids),
                    Ok(_) => {}
                    Err(e) => {
                        self.unreadable.gone_or(|| rel.show(), e);
                    }
                }
            }
        }
        Some(Some(u64::from(st.threads)))
    }

    /// The mount-namespace part of one process: the namespace of its
    /// leader, or of each of its threads when the leader has exited (a
    /// zombie leader has no namespaces of its own while its threads keep
    /// theirs). `threads`: its group's size if the uid part learnt it.
    fn namespaces(
        &mut self,
        p: &Proc,
        pid: u32,
        threads: Option<u64>,
        my_userns: &str,
        index: &mut BTreeMap<Vec<u8>, Option<usize>>,
    ) {
        let Some(list) = self.mount_namespaces.as_mut() else {
            return;
        };
        let mut consider = |tid: Option<u32>| -> Result<(), Errno> {
            let rel = |tail| match tid {
                None => Rel::pid(pid, tail),
                Some(t) => Rel::task(pid, t, tail),
            };
            let mut link = [0u8; 64];
            let ns = p.link_into(rel("ns/mnt").c(), &mut link)?;
            let id = tid.unwrap_or(pid);
            match index.get(ns) {
                Some(Some(i)) => list[*i].tasks.push(id),
                Some(None) => {} // another user namespace's
                None => {
                    // Owned by this user namespace: the namespace's owner,
                    // not the user namespace its task is in now (a task
                    // may unshare that alone, as a helper does after its
                    // mount namespace, and stay in a namespace of ours).
                    let owner = p.ns_owner(rel("ns/mnt").c())?;
                    if my_userns.as_bytes() == format!("user:[{owner}]").as_bytes() {
                        index.insert(ns.to_vec(), Some(list.len()));
                        list.push(MountNamespace {
                            ns: String::from_utf8_lossy(ns).into_owned(),
                            tasks: vec![id],
                        });
                    } else {
                        index.insert(ns.to_vec(), None);
                    }
                }
            }
            Ok(())
        };
        match consider(None) {
            Ok(()) => {}
            // No namespaces: a zombie leader (or gone). Its threads, if any
            // run on, have theirs.
            Err(Errno::ENOENT) => {
                let others = match threads {
                    Some(n) => n > 1,
                    None => p.threads(pid).is_some_and(|n| n > 1),
                };
                if others {
                    for tid in p.other_threads(pid, &mut Unreadable::default()) {
                        let _ = consider(Some(tid));
                    }
                }
            }
            Err(_) => {}
        }
    }
}

/// A [`Scan`] taken on first need, for a command whose checks may or may
/// not need one (cleanup's liveness asks the recorded cgroup instead).
#[derive(Debug, Default)]
pub struct Scanner {
    wants: Wants,
    cell: std::cell::OnceCell<Scan>,
}

impl Scanner {
    pub fn new(wants: Wants) -> Scanner {
        Scanner {
            wants,
            cell: std::cell::OnceCell::new(),
        }
    }

    pub fn get(&self) -> &Scan {
        self.cell.get_or_init(|| Scan::take(&self.wants))
    }

    /// The processes of `uid`: from the shared scan when it answers for
    /// `uid`, else from a scan of their own.
    pub fn tasks_of(&self, uid: u32) -> UidTasks {
        match self.wants.uids {
            UidFilter::All => self.get().of(uid),
            UidFilter::Of(ref set) if set.contains(&uid) => self.get().of(uid),
            _ => None,
        }
        .unwrap_or_else(|| tasks_of_uid(uid))
    }
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
    Scan::take(&Wants {
        uids: UidFilter::Of(BTreeSet::from([uid])),
        mount_namespaces: false,
    })
    .of(uid)
    .unwrap_or_default()
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
    let Ok(Some(st)) = p.read(Rel::pid(pid, "status").c()).map(parse_status) else {
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
            p.read(Rel::task(pid, tid, "status").c()).map(parse_status),
            Ok(Some(t)) if !t.dead && t.uids.contains(&uid)
        )
    })
}

/// One `/proc` scan answering "which processes run as uid X" for every X:
/// reap and `status` of all VMs share one.
#[derive(Debug, Clone, Default)]
pub struct Snapshot(Scan);

impl Snapshot {
    /// The scan itself.
    pub fn scan(&self) -> &Scan {
        &self.0
    }

    pub fn take() -> Snapshot {
        Snapshot(Scan::take(&Wants {
            uids: UidFilter::All,
            mount_namespaces: false,
        }))
    }

    pub fn of(&self, uid: u32) -> UidTasks {
        self.0.of(uid).unwrap_or_default()
    }
}

/// The caller's ancestors (parent, grandparent, … up to pid 1).
pub fn ancestors() -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(mut p) = Proc::open() else {
        return out;
    };
    let mut rel = "self/stat".to_string();
    while let Some(ppid) = p.read(rel.as_str()).ok().and_then(parse_ppid) {
        if ppid == 0 || out.contains(&ppid) {
            break;
        }
        out.push(ppid);
        rel = format!("{ppid}/stat");
    }
    out
}

/// Live (not zombie) processes whose process group is `pgid`, from each
/// `/proc/PID/stat`. A zombie counts as gone: it holds nothing, and this
/// host's PID 1 may reap an orphan late; but not a zombie leader with a
/// live thread (`num_threads` above 1: its main thread exited first), which
/// runs as much as any process (as [`process_runs_as`] counts it). A
/// process that cannot be read is gone (it exited between the listing and
/// the read).
pub fn live_in_group(pgid: u32) -> Vec<u32> {
    let Ok(mut p) = Proc::open() else {
        return Vec::new();
    };
    p.ids("")
        .unwrap_or_default()
        .into_iter()
        .filter(|pid| in_group_alive(&mut p, *pid, pgid))
        .collect()
}

/// Is `pid` alive, in process group `pgid`? (See [`live_in_group`].)
pub fn is_alive_in_group(pid: u32, pgid: u32) -> bool {
    Proc::open().is_ok_and(|mut p| in_group_alive(&mut p, pid, pgid))
}

fn in_group_alive(p: &mut Proc, pid: u32, pgid: u32) -> bool {
    p.read(Rel::pid(pid, "stat").c())
        .ok()
        .and_then(parse_state_pgrp)
        .is_some_and(|(state, pgrp, threads)| {
            pgrp == pgid && (!matches!(state, b'Z' | b'X') || threads > 1)
        })
}

/// The state letter, the process group and the thread count in a
/// `/proc/PID/stat` line (`pid (comm) S ppid pgrp … num_threads …`, the
/// 20th field, split after the last `)`).
fn parse_state_pgrp(stat: &[u8]) -> Option<(u8, u32, u32)> {
    let close = stat.iter().rposition(|b| *b == b')')?;
    let rest = std::str::from_utf8(&stat[close + 1..]).ok()?;
    let mut f = rest.split_whitespace();
    let state = *f.next()?.as_bytes().first()?;
    let pgrp = f.nth(1)?.parse().ok()?;
    // After pgrp: session … nice (14 fields), then num_threads.
    let threads = f.nth(14)?.parse().ok()?;
    Some((state, pgrp, threads))
}

/// The ppid in a `/proc/PID/stat` line (`pid (comm) S ppid …`; comm may
/// hold spaces and parentheses, so split after the last `)`).
fn parse_ppid(stat: &[u8]) -> Option<u32> {
    let close = stat.iter().rposition(|b| *b == b')')?;
    let rest = std::str::from_utf8(&stat[close + 1..]).ok()?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// One task for each mount namespace that a task of the host is in, among
/// namespaces owned by the caller's user namespace (one another user
/// namespace owns is not vmwarden's; see [`MountNamespace`]):
/// `(task id, "mnt:[inode]")`. One link is read per process; the threads of
/// a process are read only when its leader has exited (a zombie leader has
/// no namespaces of its own while its threads keep theirs).
pub fn mount_namespace_holders() -> Vec<(u32, String)> {
    Scan::take(&Wants {
        uids: UidFilter::None,
        mount_namespaces: true,
    })
    .mount_namespaces
    .unwrap_or_default()
    .into_iter()
    .filter_map(|m| Some((*m.tasks.first()?, m.ns)))
    .collect()
}

/// Read the /proc file `path` whole (a seq_file such as `mountinfo`: only
/// a read of 0 ends it), with one buffer that usually takes it in one call
/// (`std::fs::read` starts from a 32-byte probe on a file that reports size
/// 0, and doubles: nine reads for a typical mountinfo).
pub fn read_proc_file(path: &str) -> Result<Vec<u8>, Errno> {
    read_path(Path::new(path), 16 * 1024, usize::MAX)
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
        // A name that is not UTF-8 hides nothing.
        let mut odd = STATUS.as_bytes().to_vec();
        odd.splice(6..10, b"\xff\xfe".iter().copied());
        assert_eq!(parse_status(&odd).unwrap().uids, s.uids);
    }

    #[test]
    fn state_and_group_survive_a_hostile_comm() {
        assert_eq!(
            parse_state_pgrp(b"42 (a) Z 9) D 17 40 42 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 3 0"),
            Some((b'D', 40, 3))
        );
        assert_eq!(parse_state_pgrp(b"42 (a) Z 17"), None);
        assert_eq!(parse_state_pgrp(b"42 (a) Z 17 40 42 0"), None);
        let own = std::fs::read(format!("/proc/{}/stat", std::process::id())).unwrap();
        assert!(parse_state_pgrp(&own).is_some_and(|(_, _, t)| t >= 1));
        let me = std::process::id();
        let pgid = u32::try_from(nix::unistd::getpgrp().as_raw()).unwrap();
        assert!(live_in_group(pgid).contains(&me));
        assert!(is_alive_in_group(me, pgid));
        assert!(!is_alive_in_group(me, pgid + 1));
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
    fn one_scan_answers_the_uid_and_the_mount_namespaces() {
        let me = std::process::id();
        let uid = nix::unistd::getuid().as_raw();
        let scan = Scan::take(&Wants {
            mount_namespaces: true,
            ..Wants::uids_and_mounts([uid])
        });
        assert!(scan.of(uid).unwrap().pids.contains(&me));
        // Not asked about: no answer, rather than an empty one.
        assert!(scan.of(uid.wrapping_add(1)).is_none());
        let mine = std::fs::read_link("/proc/self/ns/mnt").unwrap();
        let ns = scan
            .mount_namespaces()
            .unwrap()
            .iter()
            .find(|n| Path::new(&n.ns) == mine)
            .expect("this process's mount namespace");
        assert!(ns.tasks.contains(&me));
        let holders = mount_namespace_holders();
        assert!(holders.iter().any(|(_, n)| Path::new(n) == mine));
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

    /// A mount namespace of this user namespace whose only process has
    /// since unshared a user namespace of its own (`unshare -U`) is still
    /// one of ours, and that process stands for it. Needs root.
    #[test]
    fn a_namespace_whose_process_unshared_its_user_namespace_is_ours() {
        use std::io::BufRead;
        let mut c = std::process::Command::new("unshare")
            .args([
                "-m",
                "--propagation",
                "private",
                "unshare",
                "-U",
                "sh",
                "-c",
            ])
            .arg("echo UP; exec sleep 60")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(c.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let pid = c.id();
        let ns = std::fs::read_link(format!("/proc/{pid}/ns/mnt"));
        let found = mount_namespace_holders();
        let _ = c.kill();
        let _ = c.wait();
        assert_eq!(line.trim(), "UP", "unshare -m (needs root) failed");
        let ns = ns.unwrap().to_string_lossy().into_owned();
        assert!(
            found.contains(&(pid, ns.clone())),
            "{ns} of pid {pid} not found: {found:?}"
        );
    }
}
