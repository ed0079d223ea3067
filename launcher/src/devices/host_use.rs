//! What of the host itself sits on a PCI device: a bridge (every device
//! behind it), or a block device under a mounted file system or active
//! swap (the host's own disk controller). Either is refused before any
//! driver is touched: binding it to `vfio-pci` would take the host's disk
//! or its devices from under it.

use std::path::{Component, Path, PathBuf};

use crate::config::devices::PciAddress;
use crate::devices::sysfs::{self, SysDir};
use crate::host::procs::read_proc_file;

/// PCI class 0x06: bridges (host, ISA, PCI-to-PCI, …).
const BRIDGE_CLASS: &str = "0x06";

/// Whether the device (its sysfs directory `dir`) is a bridge.
pub fn is_bridge(dir: &SysDir) -> bool {
    sysfs::read_attr(dir, "class")
        .ok()
        .flatten()
        .is_some_and(|c| c.to_ascii_lowercase().starts_with(BRIDGE_CLASS))
}

/// The host's uses of block devices below PCI device `addr`: each mount
/// point (of the host's mount namespace, pid 1's) and swap whose device,
/// or a device it is stacked on (dm, md), is below it.
pub fn host_uses(addr: &PciAddress) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(info) = read_proc_file("/proc/1/mountinfo") {
        for line in String::from_utf8_lossy(&info).lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(dev), Some(at)) = (f.get(2), f.get(4)) else {
                continue;
            };
            if !dev.starts_with("0:") && below(&format!("/sys/dev/block/{dev}"), addr, 0) {
                out.push(format!("the host's file system at {at}"));
            }
        }
    }
    if let Ok(swaps) = read_proc_file("/proc/swaps") {
        for line in String::from_utf8_lossy(&swaps).lines().skip(1) {
            let Some(dev) = line.split_whitespace().next() else {
                continue;
            };
            let Ok(st) = nix::sys::stat::stat(dev) else {
                continue;
            };
            let (maj, min) = (
                nix::sys::stat::major(st.st_rdev),
                nix::sys::stat::minor(st.st_rdev),
            );
            if maj != 0 && below(&format!("/sys/dev/block/{maj}:{min}"), addr, 0) {
                out.push(format!("the host's swap {dev}"));
            }
        }
    }
    out.sort();
    out.dedup();
    if out.len() > 4 {
        let more = out.len() - 3;
        out.truncate(3);
        out.push(format!("{more} more"));
    }
    out
}

/// Whether block device `sys` (a `/sys/dev/block/MAJ:MIN` link) is below
/// `addr`, itself or through what it is stacked on (`slaves/`).
fn below(sys: &str, addr: &PciAddress, depth: u32) -> bool {
    let Ok(real) = std::fs::canonicalize(sys) else {
        return false;
    };
    if has_component(&real, addr.as_str()) {
        return true;
    }
    if depth >= 8 {
        return false;
    }
    // A partition's slaves are its disk's: look at both.
    let dirs = [
        real.join("slaves"),
        real.parent().map_or(PathBuf::new(), |p| p.join("slaves")),
    ];
    dirs.iter().any(|d| {
        sysfs::entries(d)
            .unwrap_or_default()
            .iter()
            .any(|s| below(&d.join(s).to_string_lossy(), addr, depth + 1))
    })
}

fn has_component(p: &Path, name: &str) -> bool {
    p.components()
        .any(|c| matches!(c, Component::Normal(n) if n == name))
}
