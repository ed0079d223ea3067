//! macvtap links: a network device on a host interface (its parent) whose
//! frames a process reads and writes through a character device, one open
//! per queue, as it would a tap's fd (`drivers/net/tap.c`: the same
//! `IFF_VNET_HDR` frames and the same ioctls).
//!
//! Unlike a non-persistent tap, a macvtap outlives every fd on it: it goes
//! with an RTM_DELLINK, or with its parent. So whoever makes one names it
//! first (the launcher, in the intent record) and cleanup deletes it.
//!
//! The character device: the kernel names it `tapN` (N the link's ifindex)
//! and devtmpfs makes `/dev/tapN`, root's and 0600, before the
//! `RTM_NEWLINK` returns. The ifindex is per network namespace, so
//! `/dev/tapN` may be another namespace's macvtap: the node is opened
//! `O_PATH` and checked against the device number sysfs gives for this
//! link (`/sys/class/net/NAME/macvtap/tapN/dev`) before it is reopened
//! (through `/proc/self/fd`) for each queue. No node is made or changed,
//! and none is given to anyone: the fds are.
//!
//! devtmpfs has one `/dev/tapN` for every namespace: when a node of that
//! name is there, the kernel makes none for the new macvtap. Any local
//! user may make a user and network namespace, a macvtap in it, and choose
//! its ifindex (`ip link add … index N`), and so hold `/dev/tapN` for the
//! ifindex the host's next link gets (the host's are sequential and in
//! sight): the launcher would then find only that user's node and refuse
//! every launch. So the launcher chooses its macvtap's ifindex
//! ([`unclaimed_index`]): drawn at random from a range the host's own links
//! never reach, and one whose node does not exist.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoMacVtap, LinkAttribute, LinkFlags, LinkInfo, LinkMessage, MacVtapMode,
};
use netlink_packet_route::RouteNetlinkMessage;
use nix::fcntl::{open, OFlag};
use nix::sys::stat::{fstat, major, minor, Mode, SFlag};

use super::{NetError, Result, Rtnl, SYS_CLASS_NET};
use crate::config::spec::MacvtapMode;
use crate::host::sys::{read_path, IoContext};

/// Where devtmpfs puts a macvtap's character device.
pub const DEV_DIR: &str = "/dev";

fn nl_mode(mode: MacvtapMode) -> MacVtapMode {
    match mode {
        MacvtapMode::Private => MacVtapMode::Private,
        MacvtapMode::Vepa => MacVtapMode::Vepa,
        MacvtapMode::Bridge => MacVtapMode::Bridge,
        MacvtapMode::Passthru => MacVtapMode::Passthrough,
        MacvtapMode::Source => MacVtapMode::Source,
    }
}

impl Rtnl {
    /// A macvtap `name` on link `parent` (an ifindex) in `mode`, with MAC
    /// `mac` from its creation (a passthru macvtap takes its parent's
    /// instead: the kernel never changes the parent's for it here).
    /// `NLM_F_EXCL`: an existing `name` is an error, never reused. Its
    /// ifindex is `index` ([`unclaimed_index`]; EEXIST if a link has it).
    pub fn create_macvtap(
        &mut self,
        name: &str,
        parent: u32,
        mode: MacvtapMode,
        mac: &[u8; 6],
        index: u32,
    ) -> Result<()> {
        let mut m = LinkMessage::default();
        m.header.index = index;
        m.attributes.push(LinkAttribute::IfName(name.to_string()));
        m.attributes.push(LinkAttribute::Link(parent));
        m.attributes.push(LinkAttribute::Address(mac.to_vec()));
        m.attributes.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::MacVtap),
            LinkInfo::Data(InfoData::MacVtap(vec![InfoMacVtap::Mode(nl_mode(mode))])),
        ]));
        self.request(
            name,
            "RTM_NEWLINK (macvtap)",
            RouteNetlinkMessage::NewLink(m),
            NLM_F_CREATE | NLM_F_EXCL,
        )
        .map(|_| ())
    }

    /// Bring macvtap `index` up as microvm.nix does, without the host's
    /// stack on it: no IPv6 address (the host would send duplicate address
    /// detection and router solicitations with the guest's MAC), and every
    /// multicast frame (the guest's IPv6 neighbour discovery) let through
    /// to the guest. Two requests: the address mode must hold before the
    /// link goes up.
    pub fn macvtap_up(&mut self, name: &str, index: u32) -> Result<()> {
        self.up_without_address(name, index, LinkFlags::Allmulti)
    }
}

fn node_err(name: &str, path: &Path, reason: String) -> NetError {
    NetError::MacvtapNode {
        name: name.to_string(),
        path: path.to_path_buf(),
        reason,
    }
}

/// The lowest ifindex [`unclaimed_index`] draws: far above what a host's
/// sequential ifindexes reach.
pub const FIRST_DRAWN_INDEX: u32 = 1 << 24;
/// How many draws [`unclaimed_index`] makes before it gives up.
const DRAWS: usize = 16;

/// An ifindex for macvtap `name`: drawn at random (the kernel's
/// `/dev/urandom`) from [`FIRST_DRAWN_INDEX`] to `i32::MAX`, with no
/// `/dev/tapN` node (another namespace's macvtap) there now. Another user
/// who would hold that node first must guess it among about 2^31.
pub fn unclaimed_index(name: &str) -> Result<u32> {
    let span = i32::MAX.unsigned_abs() - FIRST_DRAWN_INDEX + 1;
    let urandom = Path::new("/dev/urandom");
    let mut f = std::fs::File::open(urandom).io("open", urandom)?;
    for _ in 0..DRAWS {
        let mut b = [0u8; 4];
        std::io::Read::read_exact(&mut f, &mut b).io("read", urandom)?;
        let index = FIRST_DRAWN_INDEX + u32::from_ne_bytes(b) % span;
        let node = Path::new(DEV_DIR).join(format!("tap{index}"));
        if std::fs::symlink_metadata(&node).is_err() {
            return Ok(index);
        }
    }
    Err(node_err(
        name,
        Path::new(DEV_DIR),
        format!("each of {DRAWS} ifindexes drawn at random has its /dev/tapN already (macvtaps of other network namespaces)"),
    ))
}

/// The character device of macvtap `name` (ifindex `index`), as sysfs of
/// this network namespace gives it: (major, minor).
pub fn char_dev(name: &str, index: u32) -> Result<(u64, u64)> {
    let dir = Path::new(SYS_CLASS_NET).join(name);
    let read = |p: PathBuf| -> Result<String> {
        let b = read_path(&p, 32, 64).map_err(|e| node_err(name, &p, e.to_string()))?;
        Ok(String::from_utf8_lossy(&b).trim().to_string())
    };
    let ifindex = dir.join("ifindex");
    if read(ifindex.clone())? != index.to_string() {
        return Err(node_err(
            name,
            &ifindex,
            format!("is no longer the macvtap of ifindex {index}"),
        ));
    }
    let dev = dir.join("macvtap").join(format!("tap{index}")).join("dev");
    let text = read(dev.clone())?;
    let parsed = text
        .split_once(':')
        .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)));
    parsed.ok_or_else(|| node_err(name, &dev, format!("{text:?} is not MAJOR:MINOR")))
}

/// Open macvtap `name`'s character device `queues` times (each open is one
/// queue), read-write and close-on-exec (cleared for the hypervisor only):
/// `/dev/tapINDEX`, checked to be the character device `dev` (from
/// [`char_dev`]) before any open that reaches the driver.
pub fn open_queues(name: &str, index: u32, dev: (u64, u64), queues: u32) -> Result<Vec<OwnedFd>> {
    let path = Path::new(DEV_DIR).join(format!("tap{index}"));
    let probe = open(
        &path,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| {
        node_err(
            name,
            &path,
            format!("cannot find it ({e}): the kernel's devtmpfs makes it, so /dev must be one"),
        )
    })?;
    let is_dev = |fd: &OwnedFd| -> Result<()> {
        let st = fstat(fd).map_err(|e| node_err(name, &path, format!("fstat: {e}")))?;
        let chr = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFCHR;
        let got = (major(st.st_rdev), minor(st.st_rdev));
        if !chr || got != dev {
            return Err(node_err(
                name,
                &path,
                format!(
                    "is not this macvtap's character device {}:{} (it is {} {}:{}): another network namespace's macvtap has the same ifindex",
                    dev.0,
                    dev.1,
                    if chr { "the character device" } else { "not a character device, but" },
                    got.0,
                    got.1
                ),
            ));
        }
        Ok(())
    };
    is_dev(&probe)?;
    let reopen = PathBuf::from(format!("/proc/self/fd/{}", probe.as_raw_fd()));
    (0..queues)
        .map(|_| {
            let fd = open(
                &reopen,
                OFlag::O_RDWR | OFlag::O_CLOEXEC | OFlag::O_NOCTTY,
                Mode::empty(),
            )
            .map_err(|e| node_err(name, &path, format!("open: {e}")))?;
            is_dev(&fd)?;
            Ok(fd)
        })
        .collect()
}
