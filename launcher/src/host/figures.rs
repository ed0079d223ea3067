//! Figures the kernel keeps about a cgroup and a network interface, as
//! `vmwarden metrics` reads them: a cgroup's CPU time, memory and block
//! I/O (cgroup v2's `cpu.stat`, `memory.current`, `memory.peak`,
//! `io.stat`) and an interface's byte counters
//! (`/sys/class/net/IF/statistics`). Only the kernel writes these files;
//! each is read once, bounded, never following a link out of the
//! directory. A figure the kernel does not offer (a controller not enabled
//! for the cgroup, a kernel without `memory.peak`) is `None`.

use std::os::fd::AsFd;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{openat, OFlag, AT_FDCWD};
use nix::sys::stat::{fstat, Mode};

use crate::host::cgroup::Cgroup;
use crate::host::sys::{read_fd_to_end, ReadEnd};

/// What the kernel says about one cgroup. Counters are since the cgroup
/// was made (the unit's start).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupFigures {
    /// `cpu.stat` `usage_usec`.
    pub cpu_usec: Option<u64>,
    /// `memory.current`, bytes.
    pub memory_bytes: Option<u64>,
    /// `memory.peak`, bytes (Linux 5.19 and later).
    pub memory_peak_bytes: Option<u64>,
    /// `io.stat` `rbytes`, summed over its devices.
    pub read_bytes: Option<u64>,
    /// `io.stat` `wbytes`, summed over its devices.
    pub written_bytes: Option<u64>,
    /// The processes in the cgroup (`cgroup.procs`).
    pub pids: Vec<u32>,
}

/// A kernfs or sysfs file is at most a page per device; io.stat with many
/// devices more. Nothing the kernel writes here is near this.
const LIMIT: usize = 64 * 1024;

fn read_at(dir: impl AsFd, name: &str) -> Option<String> {
    let fd = openat(
        dir.as_fd(),
        name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let mut buf = Vec::new();
    read_fd_to_end(fd.as_fd(), &mut buf, 4096, LIMIT, ReadEnd::Eof).ok()?;
    String::from_utf8(buf).ok()
}

/// `KEY VALUE` lines (`cpu.stat`): the value of `key`.
fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok())?
    })
}

/// `io.stat`: `MAJ:MIN rbytes=N wbytes=N rios=N …` per device; the sums of
/// `rbytes` and `wbytes`. An empty file (no I/O yet) is zero of each.
fn io_sums(text: &str) -> (u64, u64) {
    let (mut r, mut w) = (0u64, 0u64);
    for field in text.lines().flat_map(|l| l.split_whitespace().skip(1)) {
        let Some((k, v)) = field.split_once('=') else {
            continue;
        };
        let v: u64 = v.parse().unwrap_or(0);
        match k {
            "rbytes" => r = r.saturating_add(v),
            "wbytes" => w = w.saturating_add(v),
            _ => {}
        }
    }
    (r, w)
}

fn single(text: Option<String>) -> Option<u64> {
    text?.trim().parse().ok()
}

/// The figures of `cg` when it is still the cgroup recorded (same path,
/// same id); `Err(ENOENT)` when it is gone or another cgroup has its path.
pub fn of_cgroup(cg: &Cgroup) -> Result<CgroupFigures, Errno> {
    let dir = openat(
        AT_FDCWD,
        &cg.path,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    if fstat(dir.as_fd())?.st_ino != cg.id {
        return Err(Errno::ENOENT);
    }
    let io = read_at(&dir, "io.stat").map(|t| io_sums(&t));
    Ok(CgroupFigures {
        cpu_usec: read_at(&dir, "cpu.stat").and_then(|t| keyed(&t, "usage_usec")),
        memory_bytes: single(read_at(&dir, "memory.current")),
        memory_peak_bytes: single(read_at(&dir, "memory.peak")),
        read_bytes: io.map(|(r, _)| r),
        written_bytes: io.map(|(_, w)| w),
        pids: read_at(&dir, "cgroup.procs")
            .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default(),
    })
}

/// An interface's byte counters as the host counts them: what it received
/// (from the guest, for a tap) and what it transmitted (to the guest).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetFigures {
    pub rx_bytes: u64,
    pub tx_bytes: u64,
}

/// `sysfs/IFNAME/statistics/{rx,tx}_bytes` (`sysfs` is `/sys/class/net`
/// but in tests); `None` when the interface does not exist (now).
pub fn of_interface(sysfs: &Path, ifname: &str) -> Option<NetFigures> {
    let dir = openat(
        AT_FDCWD,
        &sysfs.join(ifname).join("statistics"),
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    Some(NetFigures {
        rx_bytes: single(read_at(&dir, "rx_bytes"))?,
        tx_bytes: single(read_at(&dir, "tx_bytes"))?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_stat_and_io_stat_are_read_as_the_kernel_writes_them() {
        let cpu = "usage_usec 1234567\nuser_usec 1000000\nsystem_usec 234567\n";
        assert_eq!(keyed(cpu, "usage_usec"), Some(1_234_567));
        assert_eq!(keyed(cpu, "nr_periods"), None);
        let io = "8:0 rbytes=4096 wbytes=8192 rios=1 wios=2 dbytes=0 dios=0\n\
                  253:1 rbytes=1 wbytes=2 rios=1 wios=1 dbytes=0 dios=0\n";
        assert_eq!(io_sums(io), (4097, 8194));
        assert_eq!(io_sums(""), (0, 0));
    }

    #[test]
    fn the_loopbacks_counters_are_read_and_a_missing_interface_is_none() {
        let sys = Path::new("/sys/class/net");
        assert!(of_interface(sys, "lo").is_some());
        assert_eq!(of_interface(sys, "vmw-nosuch0"), None);
    }

    #[test]
    fn a_cgroup_with_another_id_is_not_read() {
        // A directory whose inode is not the recorded id: another cgroup
        // made at the recorded path since.
        let cg = Cgroup {
            path: "/".into(),
            id: 0,
        };
        assert_eq!(of_cgroup(&cg), Err(Errno::ENOENT));
        let gone = Cgroup {
            path: "/nonexistent-cgroup".into(),
            id: 1,
        };
        assert_eq!(of_cgroup(&gone), Err(Errno::ENOENT));
    }
}
