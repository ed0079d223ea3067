//! What a uid can leave behind outside any directory vmwarden owns: kernel
//! keys (the per-uid keyrings outlive every process of the uid) and IPC
//! objects in this IPC namespace (SysV shared memory, semaphores, message
//! queues; POSIX message queues and shared memory files). The launcher's
//! seccomp filter and private IPC namespace keep a VM from making any of
//! these on the host; `verify-clean` proves it with these readers, and the
//! principal registry counts them as residue of a retired uid.

use std::os::unix::fs::MetadataExt;

use crate::config::rawpath;
use crate::host::procs::read_proc_file;

/// The keys `uid` owns, from `/proc/key-users` (readable by anyone; reading
/// it creates nothing). `None` when the uid has no key at all.
pub fn keys_of_uid(uid: u32) -> Option<u32> {
    parse_key_users(&read_text("/proc/key-users")?, uid)
}

/// A /proc seq file as text, read with one buffer that usually takes it in
/// one call (`std::fs::read_to_string` probes from 32 bytes up on a file
/// that reports size 0).
fn read_text(path: &str) -> Option<String> {
    String::from_utf8(read_proc_file(path).ok()?).ok()
}

fn parse_key_users(text: &str, uid: u32) -> Option<u32> {
    text.lines().find_map(|l| {
        let (u, rest) = l.trim().split_once(':')?;
        if u.trim().parse::<u32>().ok()? != uid {
            return None;
        }
        // "<usage> <nkeys>/<nikeys> <qnkeys>/<maxkeys> <qnbytes>/<maxbytes>"
        rest.split_whitespace()
            .nth(1)?
            .split('/')
            .next()?
            .parse()
            .ok()
    })
}

/// A uid's own two keyrings (user and user-session), which the kernel
/// creates for it on first use and never deletes. Any key beyond them is
/// data someone put there: adding a key to either creates both keyrings
/// first, so a stash always shows as more than two.
pub const USER_KEYRINGS: u32 = 2;

/// Keys of `uid` beyond its own (empty) user keyrings, if any.
pub fn stashed_keys(uid: u32) -> Option<u32> {
    keys_of_uid(uid).filter(|n| *n > USER_KEYRINGS)
}

/// SysV IPC objects in the caller's IPC namespace owned or created by
/// `uid`, one line each ("shm 32768 key=0x…").
pub fn sysv_objects_of_uid(uid: u32) -> Vec<String> {
    let mut out = Vec::new();
    for kind in ["shm", "sem", "msg"] {
        if let Some(text) = read_text(&format!("/proc/sysvipc/{kind}")) {
            out.extend(parse_sysvipc(kind, &text, uid));
        }
    }
    out
}

fn parse_sysvipc(kind: &str, text: &str, uid: u32) -> Vec<String> {
    let mut lines = text.lines();
    let Some(header) = lines.next() else {
        return Vec::new();
    };
    let header: Vec<&str> = header.split_whitespace().collect();
    let col = |name: &str| header.iter().position(|h| *h == name);
    let (Some(u), Some(cu), Some(key), Some(id)) = (
        col("uid"),
        col("cuid"),
        col("key"),
        col(if kind == "sem" {
            "semid"
        } else if kind == "msg" {
            "msqid"
        } else {
            "shmid"
        }),
    ) else {
        return Vec::new();
    };
    lines
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let is = |i: usize| f.get(i).and_then(|x| x.parse::<u32>().ok()) == Some(uid);
            (is(u) || is(cu)).then(|| {
                format!(
                    "{kind} id={} key={}",
                    f.get(id).unwrap_or(&"?"),
                    f.get(key).unwrap_or(&"?")
                )
            })
        })
        .collect()
}

/// Files owned by `uid` directly in the POSIX IPC file systems
/// (`/dev/mqueue`, `/dev/shm`).
pub fn posix_ipc_of_uid(uid: u32) -> Vec<String> {
    let mut out = Vec::new();
    for dir in ["/dev/mqueue", "/dev/shm"] {
        let Ok(rd) = std::fs::read_dir(dir) else {
            continue;
        };
        for e in rd.flatten() {
            if e.metadata().map(|m| m.uid() == uid).unwrap_or(false) {
                out.push(rawpath::show(&e.path()));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_users_lines() {
        let t = "    0:     9 8/8 3/1000000 40/25000000\n62990:     3 3/3 3/200 51/20000\n";
        assert_eq!(parse_key_users(t, 62990), Some(3));
        assert_eq!(parse_key_users(t, 0), Some(8));
        assert_eq!(parse_key_users(t, 5), None);
    }

    #[test]
    fn sysvipc_lines() {
        let t = "       key      shmid perms                  size  cpid  lpid nattch   uid   gid  cuid  cgid      atime      dtime      ctime                   rss                  swap\n\
                 -1001302231          0   644                  4096 16529     0      0 62001 62001 62001 62001          0          0 1764500000                     0                     0\n";
        let v = parse_sysvipc("shm", t, 62001);
        assert_eq!(v, vec!["shm id=0 key=-1001302231".to_string()]);
        assert!(parse_sysvipc("shm", t, 62002).is_empty());
    }
}
