//! Who holds a `flock` on a file: the kernel's `/proc/locks`, read to name
//! the holder in the error of a lock waited on too long. Best effort: a
//! line that cannot be parsed is skipped, and the pid the kernel shows is
//! the process that took the lock (its fd may have been passed on since).

use std::path::Path;

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

#[cfg(test)]
mod tests {
    use super::*;

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
        let _l = nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive).unwrap();
        let md = std::fs::metadata(&p).unwrap();
        let h = flock_holders(md.dev(), md.ino());
        assert!(h.iter().any(|(pid, _)| *pid == std::process::id()), "{h:?}");
    }
}
