//! Root's host locks, taken one way ([`lock_file`], [`lock_dir`]): the
//! file (or directory) is opened without following a link or blocking on
//! a FIFO, refused unless it is root's, with no group or other bits (and a
//! regular file with one link, or more where any user may add one:
//! `others_may_link`), and its exclusive `flock` is waited on for
//! a bounded time, after which the error names the path and who holds it.
//! A lock file another user could open is one they could hold forever;
//! one a link planted names is another file's lock; and an unbounded wait
//! on any of them turns a stuck holder into a launch or cleanup that
//! hangs without saying why.
//!
//! Who holds a `flock` on a file: the kernel's `/proc/locks`, read to name
//! the holder in the error of a lock waited on too long. Best effort: a
//! line that cannot be parsed is skipped, and the pid the kernel shows is
//! the process that took the lock (its fd may have been passed on since).

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{openat, Flock, FlockArg, OFlag};
use nix::sys::stat::{fstat, FileStat, Mode};

use crate::host::dirs::Dir;

/// A host lock that was refused, could not be taken, or stayed held.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Opening, `fstat` or `flock` failed (a symlink at the name: `open`
    /// fails with `ELOOP`; a directory where a file is wanted: `EISDIR`).
    #[error("{path}: cannot {op} the lock: {errno}")]
    Sys {
        op: &'static str,
        path: PathBuf,
        #[source]
        errno: Errno,
    },
    /// Not the file (or directory) vmwarden makes: refused, never locked.
    #[error("{path}: refused: the lock is {why}, not {want}")]
    Bad {
        path: PathBuf,
        why: String,
        want: &'static str,
    },
    /// Another process held the lock for the whole bounded wait.
    #[error("{path}: the lock is still held after {:.1} s, by {holders}", .waited.as_secs_f64())]
    Busy {
        path: PathBuf,
        waited: Duration,
        holders: String,
    },
}

/// What [`lock_file`] requires.
pub const FILE_WANT: &str = "root's regular 0600 file with one link";
/// What [`lock_dir`] requires.
pub const DIR_WANT: &str = "root's directory with no group or other bits";

/// Open (make if missing, root's `0600`) the lock file `name` in `dir` (a
/// directory the caller opened and checked) and lock it exclusively,
/// waiting for another holder at most `wait`. Refused
/// ([`LockError::Bad`]) unless it is [`FILE_WANT`]; a symlink fails the
/// open (`O_NOFOLLOW`), a FIFO is opened without blocking and refused.
pub fn lock_file(dir: &Dir, name: &str, wait: Duration) -> Result<Flock<OwnedFd>, LockError> {
    let path = dir.path.join(name);
    let sys = |op, errno| LockError::Sys {
        op,
        path: path.clone(),
        errno,
    };
    let fd = openat(
        dir.fd.as_fd(),
        name,
        OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    )
    .map_err(|e| sys("open", e))?;
    let st = fstat(&fd).map_err(|e| sys("fstat", e))?;
    let links_anyones = st.st_nlink > 1 && others_may_link();
    if let Some(why) = refusal(&st, libc::S_IFREG, links_anyones) {
        return Err(LockError::Bad {
            path,
            why,
            want: FILE_WANT,
        });
    }
    if links_anyones {
        tracing::warn!(
            lock = %path.display(),
            links = st.st_nlink,
            "a lock file with more than one link, locked all the same: \
             fs.protected_hardlinks is 0, so any user may have linked it"
        );
    }
    lock_within(fd, &path, &st, wait)
}

/// Lock the directory `dir` itself exclusively (its own fd, duplicated),
/// waiting for another holder at most `wait`. Refused unless it is
/// [`DIR_WANT`] (a directory has more than one link by nature; no hard
/// link can be made to one).
pub fn lock_dir(dir: &Dir, wait: Duration) -> Result<Flock<OwnedFd>, LockError> {
    let sys = |op, errno| LockError::Sys {
        op,
        path: dir.path.clone(),
        errno,
    };
    let fd = dir
        .fd
        .try_clone()
        .map_err(|e| sys("dup", Errno::from_raw(e.raw_os_error().unwrap_or(0))))?;
    let st = fstat(&fd).map_err(|e| sys("fstat", e))?;
    if let Some(why) = refusal(&st, libc::S_IFDIR, false) {
        return Err(LockError::Bad {
            path: dir.path.clone(),
            why,
            want: DIR_WANT,
        });
    }
    lock_within(fd, &dir.path, &st, wait)
}

/// Whether any user may make a hard link to a file they cannot open:
/// `fs.protected_hardlinks` is 0 (the kernel's default; systemd sets 1).
/// Then a user who can reach root's lock file (the state root and
/// `/var/lib/vmwarden` are `0755`) may link it from a directory of theirs
/// on the same file system (a VM's own state dir, beside it): a second
/// link is no sign of a plant, and refusing it let them stop every launch
/// with devices, `hibernate-all`, `start-hibernated` and cleanup of a
/// hibernated VM. The lock is the inode's and only root may open it, so
/// their link holds nothing. Unreadable: `false` (refused as before).
fn others_may_link() -> bool {
    others_may_link_in(
        std::fs::read_to_string("/proc/sys/fs/protected_hardlinks")
            .ok()
            .as_deref(),
    )
}

/// [`others_may_link`] from the sysctl's text.
fn others_may_link_in(sysctl: Option<&str>) -> bool {
    sysctl.map(str::trim) == Some("0")
}

/// Why `st` is not root's `kind` with no group or other bits (and, for a
/// regular file, one link; more when `links_anyones`: any user may have
/// added them, [`others_may_link`]), or `None`.
fn refusal(st: &FileStat, kind: libc::mode_t, links_anyones: bool) -> Option<String> {
    let t = st.st_mode & libc::S_IFMT;
    if t != kind {
        return Some(match t {
            libc::S_IFIFO => "a FIFO".to_string(),
            libc::S_IFSOCK => "a socket".to_string(),
            libc::S_IFCHR | libc::S_IFBLK => "a device node".to_string(),
            libc::S_IFDIR => "a directory".to_string(),
            libc::S_IFREG => "a regular file".to_string(),
            t => format!("of another type ({t:o})"),
        });
    }
    if st.st_uid != 0 {
        return Some(format!("owned by uid {}", st.st_uid));
    }
    if st.st_mode & 0o077 != 0 {
        return Some(format!("mode {:o}", st.st_mode & 0o7777));
    }
    if kind == libc::S_IFREG && st.st_nlink != 1 && !(links_anyones && st.st_nlink > 1) {
        return Some(format!("a file with {} links", st.st_nlink));
    }
    None
}

/// The pause before a busy lock's first retry; each next one doubles, up
/// to [`RETRY_MAX`], and each is jittered ([`pause`]).
const RETRY_FIRST: Duration = Duration::from_millis(1);
/// The longest pause between two tries of a busy lock.
const RETRY_MAX: Duration = Duration::from_millis(10);

/// The pause before try `n` (0: the first retry) of a busy lock: a random
/// part (from `rand`) of the second half of `RETRY_FIRST * 2^n`, capped at
/// [`RETRY_MAX`]. A fixed pause kept launches that found the lock busy at
/// the same instant (50 started at once) trying it at the same instants
/// too: one got it per pause and the lock sat free between, 50 launches
/// holding it 2 ms each queued 560 to 990 ms instead of ~105 ms (a
/// blocking `flock`'s), ~130 ms with these pauses
/// (`launcher/examples/lock_contention.rs`). Short first pauses hand a lock held briefly over at once;
/// the jitter spreads the long waiters' tries, so one comes soon after any
/// release; the cap bounds the wakeups of a wait on a stuck holder.
fn pause(n: u32, rand: u64) -> Duration {
    let step = RETRY_FIRST.saturating_mul(1u32 << n.min(16)).min(RETRY_MAX);
    let half = step / 2;
    let nanos = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX).max(1);
    half + Duration::from_nanos(rand % (nanos + 1))
}

/// The next of a sequence of pseudo-random numbers (xorshift64; `x` not 0).
fn next_rand(x: u64) -> u64 {
    let mut x = x;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    x
}

/// The exclusive `flock` of `fd` (at `path`, `st` its `fstat`), tried
/// without blocking until `wait` has passed, then [`LockError::Busy`]
/// naming the holders the kernel shows.
fn lock_within(
    fd: OwnedFd,
    path: &Path,
    st: &FileStat,
    wait: Duration,
) -> Result<Flock<OwnedFd>, LockError> {
    let end = Instant::now() + wait;
    let mut fd = fd;
    let mut said = false;
    let mut tries = 0u32;
    // Seeded from the OS's randomness, as std's hash maps are: no two
    // launches pause alike.
    let mut rand = {
        use std::hash::{BuildHasher, Hasher};
        std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish()
            | 1
    };
    loop {
        match Flock::lock(fd, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => return Ok(lock),
            Err((f, Errno::EWOULDBLOCK)) if Instant::now() < end => {
                if !said {
                    // Once: a launch or cleanup that waits says on what.
                    said = true;
                    tracing::info!(
                        lock = %path.display(),
                        holders = %describe(&flock_holders(st.st_dev, st.st_ino)),
                        waiting_at_most_s = wait.as_secs(),
                        "waiting for a lock another process holds"
                    );
                }
                fd = f;
                rand = next_rand(rand);
                let p = pause(tries, rand);
                tries = tries.saturating_add(1);
                std::thread::sleep(p.min(end.saturating_duration_since(Instant::now())));
            }
            Err((_, Errno::EWOULDBLOCK)) => {
                return Err(LockError::Busy {
                    path: path.to_path_buf(),
                    waited: wait,
                    holders: describe(&flock_holders(st.st_dev, st.st_ino)),
                })
            }
            Err((_, errno)) => {
                return Err(LockError::Sys {
                    op: "flock",
                    path: path.to_path_buf(),
                    errno,
                })
            }
        }
    }
}

/// The pids holding (not waiting for) a `FLOCK` on the inode `ino` of the
/// file system `dev`, each with its `comm` when it can still be read.
pub fn flock_holders(dev: u64, ino: u64) -> Vec<(u32, Option<String>)> {
    let text = std::fs::read_to_string("/proc/locks").unwrap_or_default();
    holders_in(&text, dev, ino)
        .into_iter()
        .map(|pid| (pid, comm(pid)))
        .collect()
}

/// `pid 12 (flock), pid 40`, or `no process the kernel names` when none.
pub fn describe(holders: &[(u32, Option<String>)]) -> String {
    if holders.is_empty() {
        return "no process the kernel names (an fd passed on, or just released)".into();
    }
    holders
        .iter()
        .map(|(pid, comm)| match comm {
            Some(c) => format!("pid {pid} ({c})"),
            None => format!("pid {pid}"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn comm(pid: u32) -> Option<String> {
    let p = Path::new("/proc").join(pid.to_string()).join("comm");
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim_end().to_string())
}

/// The lines of `/proc/locks` of a granted `FLOCK` on `dev`/`ino`:
/// `1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF` (major and minor in
/// hex, the inode in decimal); a waiter's line has `->` after the number.
fn holders_in(text: &str, dev: u64, ino: u64) -> Vec<u32> {
    let want = format!(
        "{:02x}:{:02x}:{ino}",
        nix::sys::stat::major(dev),
        nix::sys::stat::minor(dev)
    );
    let mut out = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.get(1) != Some(&"FLOCK") || f.get(5) != Some(&want.as_str()) {
            continue;
        }
        if let Some(pid) = f.get(4).and_then(|p| p.parse::<u32>().ok()) {
            if !out.contains(&pid) {
                out.push(pid);
            }
        }
    }
    out
}

/// For tests of the callers: a lock held by another process.
#[cfg(test)]
pub mod testing {
    use std::os::unix::fs::MetadataExt;
    use std::path::Path;
    use std::process::{Child, Command};
    use std::time::{Duration, Instant};

    /// `flock --no-fork PATH sleep 60`: the process that holds the lock
    /// is the child itself (its pid is the one the kernel names). Killed
    /// and reaped when dropped.
    #[derive(Debug)]
    pub struct HeldElsewhere {
        pub child: Child,
    }

    impl HeldElsewhere {
        pub fn hold(path: &Path) -> HeldElsewhere {
            let child = Command::new("flock")
                .args(["--no-fork", "--exclusive"])
                .arg(path)
                .args(["sleep", "60"])
                .spawn()
                .expect("flock(1) from util-linux");
            let held = HeldElsewhere { child };
            let md = std::fs::metadata(path).unwrap();
            let end = Instant::now() + Duration::from_secs(10);
            while !super::flock_holders(md.dev(), md.ino())
                .iter()
                .any(|(pid, _)| *pid == held.child.id())
            {
                assert!(Instant::now() < end, "flock(1) never took {path:?}");
                std::thread::sleep(Duration::from_millis(10));
            }
            held
        }

        pub fn pid(&self) -> u32 {
            self.child.id()
        }
    }

    impl Drop for HeldElsewhere {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::dirs::open_dir;

    #[test]
    fn names_the_holders_of_that_inode_and_not_the_waiters_or_others() {
        let dev = nix::sys::stat::makedev(0xfd, 1);
        let text = "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF\n\
                    1: -> FLOCK  ADVISORY  WRITE 99 fd:01:5678 0 EOF\n\
                    2: POSIX  ADVISORY  WRITE 77 fd:01:5678 0 EOF\n\
                    3: FLOCK  ADVISORY  WRITE 55 fd:01:5679 0 EOF\n\
                    4: FLOCK  ADVISORY  READ 8 08:01:5678 0 EOF\n";
        assert_eq!(holders_in(text, dev, 5678), vec![1234]);
    }

    #[test]
    fn a_lock_this_process_holds_is_named_with_its_pid() {
        use std::os::unix::fs::MetadataExt;
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("l");
        let f = std::fs::File::create(&p).unwrap();
        let _l = Flock::lock(f, FlockArg::LockExclusive).unwrap();
        let md = std::fs::metadata(&p).unwrap();
        let h = flock_holders(md.dev(), md.ino());
        assert!(h.iter().any(|(pid, _)| *pid == std::process::id()), "{h:?}");
    }

    #[test]
    fn a_busy_locks_pauses_start_short_double_to_the_cap_and_differ() {
        assert!(pause(0, 0) >= RETRY_FIRST / 2 && pause(0, u64::MAX) <= RETRY_FIRST);
        assert!(pause(3, 0) >= RETRY_FIRST * 4 && pause(3, u64::MAX) <= RETRY_FIRST * 8);
        for n in [5, 16, 40, u32::MAX] {
            let p = pause(n, next_rand(u64::from(n) + 1));
            assert!(p >= RETRY_MAX / 2 && p <= RETRY_MAX, "{n}: {p:?}");
        }
        assert_ne!(pause(9, 12345), pause(9, next_rand(12345)));
    }

    #[test]
    fn a_second_link_is_refused_only_where_no_other_user_could_have_made_it() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test needs root (the lock file must be root's)"
        );
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("l");
        std::fs::write(&p, b"").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        let one = fstat(std::fs::File::open(&p).unwrap()).unwrap();
        assert_eq!(refusal(&one, libc::S_IFREG, false), None);
        std::fs::hard_link(&p, t.path().join("users-link")).unwrap();
        let two = fstat(std::fs::File::open(&p).unwrap()).unwrap();
        // fs.protected_hardlinks = 1: only root could have linked it.
        assert_eq!(
            refusal(&two, libc::S_IFREG, false).as_deref(),
            Some("a file with 2 links")
        );
        // = 0: any user could have, from a directory of theirs.
        assert_eq!(
            refusal(&two, libc::S_IFREG, true),
            None,
            "a second link any user may add (fs.protected_hardlinks = 0) refused the lock: \
             they could stop every launch that takes it"
        );
        assert!(others_may_link_in(Some("0\n")));
        for text in [Some("1\n"), Some("2\n"), None] {
            assert!(!others_may_link_in(text), "{text:?}");
        }
        // Another owner's or a loose mode is refused whatever the sysctl.
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let loose = fstat(std::fs::File::open(&p).unwrap()).unwrap();
        assert_eq!(
            refusal(&loose, libc::S_IFREG, true).as_deref(),
            Some("mode 644")
        );
    }

    fn dir_at(p: &Path) -> Dir {
        open_dir(p).unwrap()
    }

    #[test]
    fn a_locked_directory_must_be_roots_with_no_group_or_other_bits() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test needs root (it gives the directory to another uid)"
        );
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("d");
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        let text = lock_dir(&dir_at(&d), Duration::ZERO)
            .unwrap_err()
            .to_string();
        assert!(
            text.contains(&d.display().to_string()) && text.contains("mode 755"),
            "{text}"
        );
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::lchown(&d, Some(4_610_001), None).unwrap();
        let text = lock_dir(&dir_at(&d), Duration::ZERO)
            .unwrap_err()
            .to_string();
        assert!(text.contains("owned by uid 4610001"), "{text}");
        std::os::unix::fs::lchown(&d, Some(0), None).unwrap();
        lock_dir(&dir_at(&d), Duration::ZERO).unwrap();
        // A regular file is not a directory lock, nor a directory a file lock.
        std::fs::write(d.join("f"), b"").unwrap();
        std::fs::set_permissions(d.join("f"), std::fs::Permissions::from_mode(0o600)).unwrap();
        lock_file(&dir_at(&d), "f", Duration::ZERO).unwrap();
        std::fs::create_dir(d.join("sub")).unwrap();
        let e = lock_file(&dir_at(&d), "sub", Duration::ZERO).unwrap_err();
        assert!(matches!(e, LockError::Sys { op: "open", .. }), "{e}");
    }

    #[test]
    fn a_lock_another_process_holds_fails_after_the_wait_naming_it() {
        let t = tempfile::tempdir().unwrap();
        let d = dir_at(t.path());
        drop(lock_file(&d, "l", Duration::ZERO).unwrap());
        let other = testing::HeldElsewhere::hold(&t.path().join("l"));
        let t0 = Instant::now();
        let e = lock_file(&d, "l", Duration::from_millis(200)).unwrap_err();
        let waited = t0.elapsed();
        let text = e.to_string();
        assert!(
            matches!(e, LockError::Busy { .. })
                && text.contains(&format!("pid {} (sleep)", other.pid()))
                && text.contains(&t.path().join("l").display().to_string()),
            "{text}"
        );
        assert!(
            waited >= Duration::from_millis(200) && waited < Duration::from_secs(5),
            "{waited:?}"
        );
        drop(other);
        lock_file(&d, "l", Duration::from_millis(200)).unwrap();
    }
}
