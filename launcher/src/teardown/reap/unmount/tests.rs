use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use std::cell::{Cell, RefCell};
use std::os::fd::OwnedFd;
use std::rc::Rc;

use super::*;
use crate::config::names::VmName;
use crate::config::paths::Roots;
use crate::host::dirs;
use crate::host::mountinfo;
use crate::instance::lease::Lease;

/// A test's hooks.
type MountHook = RefCell<Option<Box<dyn Fn(&Mount)>>>;
type Hook = RefCell<Option<Box<dyn Fn()>>>;
type PidHook = RefCell<Option<Box<dyn Fn(Pid)>>>;

thread_local! {
    /// What happens at the start of each unmount (a test's race).
    pub(super) static MEANWHILE: MountHook = const { RefCell::new(None) };
    /// The bound on the wait for the child, in place of [`UNMOUNT_WAIT`].
    pub(super) static WAIT: Cell<Option<Duration>> = const { Cell::new(None) };
    /// What happens once the wait has passed its bound, before the kill
    /// (given the child's pid).
    pub(super) static AT_TIMEOUT: PidHook = const { RefCell::new(None) };
    /// [`Between`] lets the child go only at [`AT_TIMEOUT`] (the write end
    /// of its pipe kept here), not before the wait.
    static LATE_GO: RefCell<Option<OwnedFd>> = const { RefCell::new(None) };
    static LET_GO_LATE: Cell<bool> = const { Cell::new(false) };
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

impl Holder {
    /// A holder with a tmpfs of `source` at `hang` (`DIR/VM/credentials`),
    /// then, in its namespace, a FUSE file system over `DIR/VM` whose
    /// `/dev/fuse` fd it holds and never reads: every lookup in it waits
    /// (killable) for an answer that never comes (no daemon at all). And,
    /// with `also`, a tmpfs of that source at that path, with no FUSE.
    fn with_hung_fuse(source: &str, hang: &Path, also: Option<(&str, &Path)>) -> Holder {
        let dir = hang.parent().expect("DIR/VM");
        let also = also.map_or(String::new(), |(source, at)| {
            format!("mount -t tmpfs -o size=4k {source} '{}' && ", at.display())
        });
        let mut c = Command::new("unshare")
            .args(["-m", "--propagation", "private", "sh", "-c"])
            .arg(format!(
                "mount -t tmpfs -o size=4k {source} '{hang}' && {also}\
                 exec 3<>/dev/fuse \
                 && mount -i -t fuse -o fd=3,rootmode=40000,user_id=0,group_id=0 vmw-hang '{dir}' \
                 && echo MOUNTED && exec sleep 600",
                hang = hang.display(),
                dir = dir.display(),
            ))
            .stdout(Stdio::piped())
            .spawn()
            .expect("unshare");
        let mut line = String::new();
        std::io::BufReader::new(c.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("read the holder's word");
        let h = Holder(c);
        assert_eq!(line.trim(), "MOUNTED", "the holder did not mount the FUSE");
        h
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
        let found = ns_mounts::id_of(
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
    let place = Place::new("lease");
    let a = Holder::new(CREDS, &place.at);
    let roots = Roots {
        config_dir: place.dir.join("config"),
        runtime_root: place.dir.clone(),
        state_root: place.dir.join("state"),
    };
    let rundir = place.at.parent().expect("rundir").to_path_buf();
    let free = Rc::new(RefCell::new(Vec::new()));
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
    let web = VmName::parse("rprweb").expect("name");
    super::super::reap_credential_mounts(&roots, &[web].into(), &mut r);
    MEANWHILE.with(|f| f.borrow_mut().take());
    assert_eq!(
        *free.borrow(),
        [(place.at.clone(), false)],
        "a launch of rprweb could take its lease while reap unmounted its tmpfs"
    );
    assert_eq!(r.deleted, std::slice::from_ref(&place.at), "{:?}", r.failed);
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
        let text = e.to_string();
        for word in [
            place.at.to_str().unwrap_or_default(),
            &ns,
            "a symlink is in the path now",
        ] {
            assert!(text.contains(word), "{word:?} not in {text:?}");
        }
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
        let text = e.to_string();
        for word in [at, &ns, "another mount is at the path now"] {
            assert!(text.contains(word), "{word:?} not in {text:?}");
        }
    }
}

/// A test's pause in [`in_namespace`]: the child, its check passed, waits
/// before it unmounts while the parent runs the hook.
pub(super) struct Between {
    hook: Box<dyn Fn()>,
    ready: (OwnedFd, OwnedFd),
    go: (OwnedFd, OwnedFd),
}

thread_local! {
    static BETWEEN: Hook = const { RefCell::new(None) };
}

impl Between {
    pub(super) fn take() -> Option<Between> {
        let hook = BETWEEN.with(|b| b.borrow_mut().take())?;
        let ready = nix::unistd::pipe().expect("pipe");
        let go = nix::unistd::pipe().expect("pipe");
        Some(Between { hook, ready, go })
    }

    /// In the child: only read and write.
    pub(super) fn child_waits(&self) {
        use std::os::fd::AsRawFd;
        let mut byte = [0u8; 1];
        // SAFETY: writes one byte of `byte` through an fd this struct
        // owns (async-signal-safe).
        unsafe { libc::write(self.ready.1.as_raw_fd(), byte.as_ptr().cast(), 1) };
        // SAFETY: reads one byte into `byte` through an fd this struct
        // owns (async-signal-safe).
        unsafe { libc::read(self.go.0.as_raw_fd(), byte.as_mut_ptr().cast(), 1) };
    }

    /// In the parent: the hook once the child's check passed.
    pub(super) fn parent_runs(self) {
        let Between { hook, ready, go } = self;
        drop(ready.1);
        let mut byte = [0u8; 1];
        if nix::unistd::read(&ready.0, &mut byte) == Ok(1) {
            hook();
        }
        if LET_GO_LATE.with(Cell::get) {
            LATE_GO.with(|g| *g.borrow_mut() = Some(go.1));
            return;
        }
        nix::unistd::write(&go.1, &byte).expect("let the child go");
    }
}

/// The scan found web's tmpfs in A's namespace and the child's check
/// passed; before it unmounts, a directory of the path is renamed away
/// (the tmpfs goes with it) and a symlink to a directory holding another
/// mount takes its name. The unmount does not look the path up again:
/// the tmpfs checked is unmounted, the other mount stays.
#[test]
fn a_symlink_swapped_into_the_path_after_the_check_is_not_followed() {
    let place = Place::new("swap");
    let a = Holder::new(CREDS, &place.at);
    let (ns, m) = a.scan(&place.at);
    let other = place.dir.join("other/credentials");
    std::fs::create_dir_all(&other).expect("mkdir other");
    let other_s = other.to_str().expect("utf-8 path").to_string();
    a.nsenter(&["mount", "-t", "tmpfs", "-o", "size=4k", "other", &other_s]);
    let (web, old) = (place.dir.join("rprweb"), place.dir.join("rprweb.old"));
    let swapped = Rc::new(Cell::new(false));
    let (w, o, s) = (web.clone(), old.clone(), swapped.clone());
    BETWEEN.with(|b| {
        *b.borrow_mut() = Some(Box::new(move || {
            std::fs::rename(&w, &o).expect("rename rprweb");
            std::os::unix::fs::symlink("other", &w).expect("symlink rprweb");
            s.set(true);
        }));
    });
    let r = in_namespace(a.pid(), &ns, &m);
    BETWEEN.with(|b| b.borrow_mut().take());
    assert!(swapped.get(), "the check did not pass: {r:?}");
    assert_eq!(
        a.sources_at(&other),
        ["other"],
        "the mount the swapped-in symlink leads to was unmounted ({r:?})"
    );
    r.expect("the tmpfs checked");
    assert!(a.sources_at(&old.join("credentials")).is_empty());
}

/// Has the process `pid` gone (no `/proc/PID`: not even a zombie)?
fn gone(pid: i32) -> bool {
    !Path::new(&format!("/proc/{pid}")).exists()
}

/// The scan found web's tmpfs in A's namespace; there, a FUSE file
/// system with no daemon (its fd held, never read) lies over the path's
/// directory, so the child's lookup never answers. The wait is bounded:
/// the typed timeout names the path, the pid, the namespace and the wait,
/// the child is killed and reaped (no process of reap's is left), and the
/// tmpfs is kept.
#[test]
fn a_lookup_that_never_answers_times_out_and_the_child_is_killed() {
    let place = Place::new("hang");
    let a = Holder::with_hung_fuse(CREDS, &place.at, None);
    let (ns, m) = a.scan(&place.at);
    let wait = Duration::from_millis(300);
    WAIT.with(|w| w.set(Some(wait)));
    let r = in_namespace(a.pid(), &ns, &m);
    WAIT.with(|w| w.set(None));
    let e = r.expect_err("the child's lookup in the hung FUSE answered?");
    let NsUnmountError::TimedOut {
        target,
        pid,
        ns: n,
        child,
        wait: waited,
        reaped,
    } = &e
    else {
        panic!("not the timed-out error: {e:?}");
    };
    assert_eq!(
        (target, *pid, n, *waited),
        (&place.at, a.pid(), &ns, wait),
        "{e}"
    );
    assert!(*reaped, "the killed child did not end (killable wait): {e}");
    assert!(gone(*child), "the child {child} is left: {e}");
    let text = e.to_string();
    for word in [
        place.at.to_str().unwrap_or_default(),
        &a.pid().to_string(),
        &ns,
        "300ms",
        "did not end within",
    ] {
        assert!(text.contains(word), "{word:?} not in {text:?}");
    }
    assert_eq!(
        a.sources_at(&place.at),
        [CREDS],
        "the tmpfs under the hung FUSE was unmounted"
    );
}

/// `reap --apply` with two stray tmpfs in one namespace, the first's path
/// under a FUSE that never answers: it reports the first failed (timed
/// out) and unmounts the second; no child of reap's is left.
#[test]
fn reap_apply_reports_a_hung_unmount_and_goes_on_with_the_rest() {
    let place = Place::new("hangreap");
    let web = place.dir.join("rprweb/credentials");
    std::fs::create_dir_all(&web).expect("mkdir web");
    // `place.at` is under rprweb: the hung one is rprhang's.
    let hang = place.dir.join("rprhang/credentials");
    std::fs::create_dir_all(&hang).expect("mkdir hang");
    let a = Holder::with_hung_fuse("vmwarden-creds:rprhang", &hang, Some((CREDS, &web)));
    let roots = Roots {
        config_dir: place.dir.join("config"),
        runtime_root: place.dir.clone(),
        state_root: place.dir.join("state"),
    };
    let seen = Rc::new(RefCell::new(Vec::new()));
    let s = seen.clone();
    MEANWHILE.with(|f| {
        *f.borrow_mut() = Some(Box::new(move |m: &Mount| {
            s.borrow_mut().push(m.mount_point.clone());
        }));
    });
    WAIT.with(|w| w.set(Some(Duration::from_millis(300))));
    let mut r = super::super::Report {
        apply: true,
        ..Default::default()
    };
    let names = ["rprweb", "rprhang"].map(|n| VmName::parse(n).expect("name"));
    super::super::reap_credential_mounts(&roots, &names.into(), &mut r);
    WAIT.with(|w| w.set(None));
    MEANWHILE.with(|f| f.borrow_mut().take());
    assert_eq!(
        *seen.borrow(),
        [hang.clone(), web.clone()],
        "not both mounts, the hung one first"
    );
    assert_eq!(r.deleted, std::slice::from_ref(&web), "{:?}", r.failed);
    assert_eq!(r.failed.len(), 1, "{:?}", r.failed);
    assert_eq!(r.failed[0].path, hang);
    assert!(
        r.failed[0].reason.contains("did not end within 300ms"),
        "{}",
        r.failed[0].reason
    );
    assert!(a.sources_at(&web).is_empty());
    assert_eq!(a.sources_at(&hang), ["vmwarden-creds:rprhang"]);
    let child: i32 = r.failed[0]
        .reason
        .split_once("SIGKILL to it (pid ")
        .and_then(|(_, rest)| rest.split_once(')'))
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("no child pid in {:?}", r.failed[0].reason));
    assert!(gone(child), "reap's child {child} is left");
}

/// The child, its check passed, ends on its own (it unmounted the tmpfs)
/// after the wait passed its bound and before the parent's `SIGKILL`
/// reaches it (the kill then finds a zombie): its own exit status is
/// what happened, so the tmpfs is reported unmounted, not timed out (the
/// status was thrown away: `did not end within`, "not unmounted", for a
/// mount that was gone). Here the child is held before its `umount2`
/// (real pipes) and let go, then waited for (`waitid` with `WNOWAIT`: not
/// reaped), at the bound.
#[test]
fn a_child_that_ends_on_its_own_at_the_bound_is_reported_by_its_status() {
    let place = Place::new("late");
    let a = Holder::new(CREDS, &place.at);
    let (ns, m) = a.scan(&place.at);
    let at_bound = Rc::new(Cell::new(false));
    let seen = at_bound.clone();
    BETWEEN.with(|b| *b.borrow_mut() = Some(Box::new(|| {})));
    LET_GO_LATE.with(|l| l.set(true));
    AT_TIMEOUT.with(|h| {
        *h.borrow_mut() = Some(Box::new(move |child: Pid| {
            let go = LATE_GO
                .with(|g| g.borrow_mut().take())
                .expect("the child held before its umount2");
            nix::unistd::write(&go, &[0u8]).expect("let the child go");
            nix::sys::wait::waitid(
                nix::sys::wait::Id::Pid(child),
                nix::sys::wait::WaitPidFlag::WEXITED | nix::sys::wait::WaitPidFlag::WNOWAIT,
            )
            .expect("wait for the child to end, not reaping it");
            seen.set(true);
        }));
    });
    WAIT.with(|w| w.set(Some(Duration::ZERO)));
    let r = in_namespace(a.pid(), &ns, &m);
    WAIT.with(|w| w.set(None));
    AT_TIMEOUT.with(|h| h.borrow_mut().take());
    LET_GO_LATE.with(|l| l.set(false));
    BETWEEN.with(|b| b.borrow_mut().take());
    assert!(at_bound.get(), "the wait did not reach its bound: {r:?}");
    assert!(
        a.sources_at(&place.at).is_empty(),
        "the child did not unmount it: {r:?}"
    );
    r.unwrap_or_else(|e| panic!("the child unmounted it, but it was reported: {e}"));
}
