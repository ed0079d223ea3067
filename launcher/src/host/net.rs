//! Taps as file descriptors, and the rtnetlink calls around them.
//!
//! The launcher (root, before the privilege drop) opens `/dev/net/tun` once
//! per interface and creates the tap with `TUNSETIFF` (`IFF_TAP|IFF_NO_PI|
//! IFF_VNET_HDR|IFF_TUN_EXCL`, never persistent; with `IFF_MULTI_QUEUE` and
//! one more open per further queue when it has several), gives it root
//! as owner and group (so that no other user, the principal included, can
//! attach a queue to it by name: [`own_for`]; a multi-queue tap is made and
//! owned in a network namespace of the launcher's own and only then moved
//! into the host's, [`apart`]), sets its host-side MAC,
//! attaches it to the configured bridge and brings it up over rtnetlink, then
//! hands the open fd to the hypervisor across `execve`. The tap lives exactly
//! as long as some process holds that fd: when the hypervisor dies, whatever
//! killed it, the kernel deletes the tap.
//!
//! Firecracker cannot take an fd: it opens its tap by name. The kernel lets
//! a process without CAP_NET_ADMIN attach by name to a tap its uid owns
//! *and to any tap that has neither owner nor group* (`tun_not_capable` in
//! drivers/net/tun.c), which a VPN's tun or an `ip tuntap add` without
//! `user` is. So firecracker runs in a network namespace of its own that
//! holds nothing but its taps (made persistent and the principal's there,
//! [`persist_for`]), each joined to the host by a veth pair and tc
//! redirects ([`ns_link`]); `launch::netns` builds it.
//!
//! Netlink is spoken synchronously on one `NETLINK_ROUTE` socket
//! (`netlink-sys`'s blocking `Socket`, messages from `netlink-packet-route`):
//! no async runtime, no threads, no `ip` binary.
//!
//! Tap names are `^vmw-[a-z0-9-]{1,11}$` (15 bytes at most: IFNAMSIZ is 16
//! with the NUL). The `vmw-` prefix is what cleanup, reap and verify-clean
//! look for in `/sys/class/net`.

use std::os::fd::{AsRawFd, OwnedFd};

use netlink_packet_core::{
    DecodeError, NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_REQUEST,
};
use netlink_packet_route::link::{InfoKind, LinkAttribute, LinkFlags, LinkInfo, LinkMessage};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

use crate::config::names::{TapName, TAP_PREFIX};
use crate::host::sys::{IoContext, IoError, SysContext, SysError};

pub mod apart;
pub mod macvtap;
pub mod ns_link;

pub const TUN_DEVICE: &str = "/dev/net/tun";
pub const SYS_CLASS_NET: &str = "/sys/class/net";

// include/uapi/linux/if_tun.h
const TUNSETIFF: libc::Ioctl = 0x4004_54ca;
const TUNSETPERSIST: libc::Ioctl = 0x4004_54cb;
const TUNSETOWNER: libc::Ioctl = 0x4004_54cc;
const TUNSETGROUP: libc::Ioctl = 0x4004_54ce;
const IFF_TAP: libc::c_short = 0x0002;
const IFF_NO_PI: libc::c_short = 0x1000;
const IFF_VNET_HDR: libc::c_short = 0x4000;
/// One fd per queue pair: the first `TUNSETIFF` makes the device, each
/// further one on the same name attaches another queue.
const IFF_MULTI_QUEUE: libc::c_short = 0x0100;
/// Fail with EBUSY instead of attaching to an existing device of that name.
const IFF_TUN_EXCL: libc::c_short = -0x8000; // 0x8000 as a c_short

/// `struct ifreq` as TUNSETIFF reads it: the name, then `ifr_flags`, padded
/// to the union's 24 bytes.
#[repr(C)]
struct IfReq {
    name: [u8; 16],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// A network interface operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("network interface {what}: {op}: {source}")]
    Link {
        what: String,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("network interface {what}: {op}: {source}")]
    Decode {
        what: String,
        op: &'static str,
        #[source]
        source: DecodeError,
    },
    #[error("network interface {name}: {op}: {errno}{hint}")]
    Namespace {
        name: String,
        op: &'static str,
        errno: nix::errno::Errno,
        hint: &'static str,
    },
    #[error("network interface {name}: TUNSETIFF: kernel named the tap {got:?}")]
    Renamed { name: String, got: String },
    #[error("network interface {name}: its character device {path}: {reason}")]
    MacvtapNode {
        name: String,
        path: std::path::PathBuf,
        reason: String,
    },
    #[error(transparent)]
    Sys(#[from] SysError),
    #[error(transparent)]
    Io(#[from] IoError),
}

impl NetError {
    /// None is a refusal (`EX_CONFIG`): tap names are `TapName`s, refused
    /// where they were parsed.
    pub fn is_refusal(&self) -> bool {
        false
    }

    /// The kernel's errno for a failed link operation.
    fn link_errno(&self) -> Option<i32> {
        match self {
            NetError::Link { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

type Result<T, E = NetError> = std::result::Result<T, E>;

fn net_err(what: impl Into<String>, op: &'static str, source: std::io::Error) -> NetError {
    NetError::Link {
        what: what.into(),
        op,
        source,
    }
}

/// A blocking rtnetlink socket.
#[derive(Debug)]
pub struct Rtnl {
    sock: Socket,
    seq: u32,
}

/// What is known about an existing link.
#[derive(Debug, Clone)]
pub struct Link {
    pub index: u32,
    pub kind: Option<InfoKind>,
    pub controller: Option<u32>,
    /// `IFLA_LINK_NETNSID`: the link's peer (a veth's other end) is in
    /// another network namespace.
    pub peer_elsewhere: bool,
    /// `IFLA_IFALIAS`: for the host end of a link into a VM's namespace,
    /// the mark of the instance that made it (`ns_link::link_mark`).
    pub alias: Option<String>,
}

impl Rtnl {
    pub fn open() -> Result<Rtnl> {
        let mut sock = Socket::new(NETLINK_ROUTE)
            .map_err(|e| net_err("rtnetlink", "socket(NETLINK_ROUTE)", e))?;
        sock.bind_auto()
            .map_err(|e| net_err("rtnetlink", "bind", e))?;
        sock.connect(&SocketAddr::new(0, 0))
            .map_err(|e| net_err("rtnetlink", "connect", e))?;
        Ok(Rtnl { sock, seq: 0 })
    }

    /// Send one request with `NLM_F_ACK` and collect the replies until the
    /// kernel's ack (or error) for it.
    fn request(
        &mut self,
        what: &str,
        op: &'static str,
        msg: RouteNetlinkMessage,
        extra_flags: u16,
    ) -> Result<Vec<RouteNetlinkMessage>> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | NLM_F_ACK | extra_flags;
        header.sequence_number = seq;
        let mut nl = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(msg));
        nl.finalize();
        let mut buf = vec![0u8; nl.buffer_len()];
        nl.serialize(&mut buf);
        self.sock.send(&buf, 0).map_err(|e| net_err(what, op, e))?;
        let mut out = Vec::new();
        loop {
            let (data, _) = self
                .sock
                .recv_from_full()
                .map_err(|e| net_err(what, op, e))?;
            let mut off = 0;
            while off < data.len() {
                let m = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&data[off..]).map_err(
                    |source| NetError::Decode {
                        what: what.to_string(),
                        op,
                        source,
                    },
                )?;
                let len = m.header.length as usize;
                if len == 0 {
                    break;
                }
                off += (len + 3) & !3;
                if m.header.sequence_number != seq {
                    continue;
                }
                match m.payload {
                    NetlinkPayload::Error(e) => {
                        return match e.code {
                            None => Ok(out),
                            Some(_) => Err(net_err(what, op, e.to_io())),
                        }
                    }
                    NetlinkPayload::Done(_) => return Ok(out),
                    NetlinkPayload::InnerMessage(inner) => out.push(inner),
                    _ => {}
                }
            }
        }
    }

    /// Look a link up by name. `Ok(None)` when there is none.
    pub fn link(&mut self, name: &str) -> Result<Option<Link>> {
        let mut m = LinkMessage::default();
        m.attributes.push(LinkAttribute::IfName(name.to_string()));
        match self.request(name, "RTM_GETLINK", RouteNetlinkMessage::GetLink(m), 0) {
            Ok(replies) => {
                let Some(RouteNetlinkMessage::NewLink(l)) = replies.into_iter().next() else {
                    return Ok(None);
                };
                let mut kind = None;
                let mut controller = None;
                let mut peer_elsewhere = false;
                let mut alias = None;
                for a in &l.attributes {
                    match a {
                        LinkAttribute::LinkInfo(infos) => {
                            for i in infos {
                                if let LinkInfo::Kind(k) = i {
                                    kind = Some(k.clone());
                                }
                            }
                        }
                        LinkAttribute::Controller(c) => controller = Some(*c),
                        LinkAttribute::LinkNetNsId(_) => peer_elsewhere = true,
                        LinkAttribute::IfAlias(a) => alias = Some(a.clone()),
                        _ => {}
                    }
                }
                Ok(Some(Link {
                    index: l.header.index,
                    kind,
                    controller,
                    peer_elsewhere,
                    alias,
                }))
            }
            Err(e) if matches!(e.link_errno(), Some(libc::ENODEV | libc::ENOENT)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Set the link's MAC, attach it to `controller` (a bridge) if given, and
    /// bring it up: one RTM_SETLINK.
    pub fn configure(
        &mut self,
        name: &str,
        index: u32,
        mac: &[u8; 6],
        controller: Option<u32>,
    ) -> Result<()> {
        let mut m = LinkMessage::default();
        m.header.index = index;
        m.header.flags = LinkFlags::Up;
        m.header.change_mask = LinkFlags::Up;
        m.attributes.push(LinkAttribute::Address(mac.to_vec()));
        if let Some(c) = controller {
            m.attributes.push(LinkAttribute::Controller(c));
        }
        self.request(name, "RTM_SETLINK", RouteNetlinkMessage::SetLink(m), 0)
            .map(|_| ())
    }

    /// RTM_DELLINK of exactly the device with `index` (vetted beforehand),
    /// never of whatever holds `name` by now. `Ok(false)` when it was gone.
    pub fn delete_index(&mut self, name: &str, index: u32) -> Result<bool> {
        let mut m = LinkMessage::default();
        m.header.index = index;
        match self.request(name, "RTM_DELLINK", RouteNetlinkMessage::DelLink(m), 0) {
            Ok(_) => Ok(true),
            Err(e) if e.link_errno() == Some(libc::ENODEV) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// RTM_DELLINK by name. `Ok(false)` when it was already gone.
    pub fn delete(&mut self, name: &str) -> Result<bool> {
        let Some(l) = self.link(name)? else {
            return Ok(false);
        };
        let mut m = LinkMessage::default();
        m.header.index = l.index;
        match self.request(name, "RTM_DELLINK", RouteNetlinkMessage::DelLink(m), 0) {
            Ok(_) => Ok(true),
            Err(e) if e.link_errno() == Some(libc::ENODEV) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// One tap, created and open. Dropping the fd (and every copy of it) deletes
/// the tap.
#[derive(Debug)]
pub struct Tap {
    pub name: TapName,
    pub fd: OwnedFd,
    /// A multi-queue tap's other queues (`fd` is the first), in order.
    pub queues: Vec<OwnedFd>,
    /// `/dev/vhost-net`, one open per queue, for a hypervisor that runs the
    /// queues in the kernel's vhost-net (QEMU); empty without it.
    pub vhost: Vec<OwnedFd>,
}

impl Tap {
    /// Every fd the hypervisor inherits for this tap: its queues, then its
    /// vhost-net fds.
    pub fn fds(&self) -> impl Iterator<Item = &OwnedFd> {
        std::iter::once(&self.fd)
            .chain(&self.queues)
            .chain(&self.vhost)
    }
}

/// Create tap `name` (never persistent; EBUSY if a device of that name
/// exists) and return its open queue fd (close-on-exec until `execve`).
pub fn create_tap(tap: &TapName) -> Result<Tap> {
    create_tap_queues(tap, 1)
}

/// [`create_tap`] with `queues` queue pairs: a multi-queue tap when more
/// than one, whose first fd makes the device (`IFF_TUN_EXCL`: never an
/// existing one) and every further fd attaches one more queue to it.
/// The kernel lets *anyone* attach one more queue to a multi-queue tap
/// that has neither owner nor group (`tun_not_capable`: only a set owner
/// or group refuses a caller without CAP_NET_ADMIN), so a caller that
/// hands the fds on makes a multi-queue tap where no one else can name it
/// and gives it an owner and a group there ([`apart::create_apart`]); a
/// single-queue tap refuses a second attach by itself (EBUSY) while its
/// one queue is held, from the moment it exists.
pub fn create_tap_queues(tap: &TapName, queues: u32) -> Result<Tap> {
    let multi = if queues > 1 { IFF_MULTI_QUEUE } else { 0 };
    let fd = tun_set_iff(tap, IFF_TUN_EXCL | multi)?;
    let queues = (1..queues)
        .map(|_| tun_set_iff(tap, multi))
        .collect::<Result<Vec<_>>>()?;
    Ok(Tap {
        name: tap.clone(),
        fd,
        queues,
        vhost: Vec::new(),
    })
}

/// Open `/dev/net/tun` and `TUNSETIFF` it as tap `tap` with `extra` flags.
fn tun_set_iff(tap: &TapName, extra: libc::c_short) -> Result<OwnedFd> {
    let name = tap.as_str();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(TUN_DEVICE)
        .io("open", TUN_DEVICE)?;
    let mut req = IfReq {
        name: [0; 16],
        flags: IFF_TAP | IFF_NO_PI | IFF_VNET_HDR | extra,
        _pad: [0; 22],
    };
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: TUNSETIFF reads and writes one `struct ifreq`; `req` is a
    // properly sized, initialised #[repr(C)] ifreq that outlives the call,
    // and the fd is a valid open /dev/net/tun. The return value is checked.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), TUNSETIFF, std::ptr::addr_of_mut!(req)) };
    if rc < 0 {
        return Err(net_err(name, "TUNSETIFF", std::io::Error::last_os_error()));
    }
    let got = req.name.split(|b| *b == 0).next().unwrap_or(&[]);
    if got != name.as_bytes() {
        return Err(NetError::Renamed {
            name: name.to_string(),
            got: String::from_utf8_lossy(got).into_owned(),
        });
    }
    Ok(OwnedFd::from(f))
}

/// The kernel's vhost-net device.
pub const VHOST_NET: &str = "/dev/vhost-net";

/// Open `/dev/vhost-net` read-write, close-on-exec (cleared for the
/// hypervisor only, in `launch::exec`). Each open is one vhost-net
/// instance, for one queue pair.
pub fn open_vhost_net() -> std::result::Result<OwnedFd, nix::errno::Errno> {
    use nix::fcntl::{open, OFlag};
    use nix::sys::stat::Mode;
    open(
        VHOST_NET,
        OFlag::O_RDWR | OFlag::O_CLOEXEC | OFlag::O_NOCTTY,
        Mode::empty(),
    )
}

/// Make the open tap `tap` persistent and attachable by `uid`/`gid` alone,
/// for a hypervisor that opens its tap by name (firecracker): owner and
/// group first, persistence last, so a launch killed in between leaves no
/// tap (the kernel deletes a non-persistent one with its fd). Without
/// CAP_NET_ADMIN the kernel lets a process attach to a persistent tap only
/// when its euid is the owner and the group is among its groups.
pub fn persist_for(tap: &Tap, uid: u32, gid: u32) -> Result<()> {
    own_for(tap, uid, gid)?;
    tun_ioctls(tap, &[("TUNSETPERSIST", TUNSETPERSIST, 1)])
}

/// Give the open tap `tap` an owner (`uid`) and a group (`gid`), never
/// persistence: from then on the kernel refuses to attach a queue to it
/// (`TUNSETIFF` on its name) for any process without CAP_NET_ADMIN whose
/// euid is not `uid` or whose groups lack `gid` (`tun_not_capable`), and
/// so every way to reach the tap but its fds (`TUNSETPERSIST`,
/// `TUNSETOWNER` need an attached queue). Without an owner and a group a
/// multi-queue tap takes one more queue from any local user.
pub fn own_for(tap: &Tap, uid: u32, gid: u32) -> Result<()> {
    tun_ioctls(
        tap,
        &[
            ("TUNSETOWNER", TUNSETOWNER, libc::c_ulong::from(uid)),
            ("TUNSETGROUP", TUNSETGROUP, libc::c_ulong::from(gid)),
        ],
    )
}

/// Run tun ioctls that take an integer argument on `tap`'s first queue, in
/// order, stopping at the first that fails.
fn tun_ioctls(tap: &Tap, calls: &[(&'static str, libc::Ioctl, libc::c_ulong)]) -> Result<()> {
    for &(op, req, arg) in calls {
        // SAFETY: these three tun ioctls take their argument by value (an
        // integer, no pointer is dereferenced); the fd is the tap's open
        // /dev/net/tun queue. The return value is checked.
        let rc = unsafe { libc::ioctl(tap.fd.as_raw_fd(), req, arg) };
        if rc < 0 {
            return Err(net_err(
                tap.name.as_str(),
                op,
                std::io::Error::last_os_error(),
            ));
        }
    }
    Ok(())
}

/// The uid that owns tun/tap `name` (`/sys/class/net/NAME/owner`; `None`
/// when it has none, is not a tap, or is gone).
pub fn tun_owner(name: &str) -> Option<u32> {
    let p = std::path::Path::new(SYS_CLASS_NET).join(name).join("owner");
    let v: i64 = std::fs::read_to_string(p).ok()?.trim().parse().ok()?;
    u32::try_from(v).ok()
}

/// Clear close-on-exec on exactly `fd` (a tap the hypervisor inherits).
pub fn inherit_across_exec(fd: &OwnedFd) -> Result<i32> {
    use nix::fcntl::{fcntl, FcntlArg, FdFlag};
    fcntl(fd, FcntlArg::F_SETFD(FdFlag::empty()))
        .sys("fcntl(F_SETFD, 0) on a tap fd", TUN_DEVICE)?;
    Ok(fd.as_raw_fd())
}

/// Names of `vmw-*` interfaces in this network namespace, sorted, from
/// `/sys/class/net`.
pub fn vmwarden_links() -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(SYS_CLASS_NET)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().to_str().map(str::to_string))
                .filter(|n| n.starts_with(TAP_PREFIX))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// `IFF_PERSIST` in `/sys/class/net/NAME/tun_flags`.
const IFF_PERSIST: u32 = 0x0800;

/// A tun/tap device as sysfs shows it: its ifindex and whether it is
/// persistent. `None` when `name` is not a tun/tap device (or is gone).
/// Only a persistent tap can outlive every holder of its fd: a
/// non-persistent one that exists is, by definition, held open by someone.
pub fn tun_info(name: &str) -> Option<(u32, bool)> {
    let dir = std::path::Path::new(SYS_CLASS_NET).join(name);
    let flags = std::fs::read_to_string(dir.join("tun_flags")).ok()?;
    let flags = u32::from_str_radix(flags.trim().trim_start_matches("0x"), 16).ok()?;
    let index = std::fs::read_to_string(dir.join("ifindex"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some((index, flags & IFF_PERSIST != 0))
}

/// Is `/sys/class/net/NAME` a tun/tap device?
pub fn is_tun(name: &str) -> bool {
    std::path::Path::new(SYS_CLASS_NET)
        .join(name)
        .join("tun_flags")
        .exists()
}

/// Does interface `name` exist here? Netlink first (always this network
/// namespace); `/sys/class/net` if netlink cannot be opened.
pub fn link_exists(name: &str) -> Result<bool> {
    match Rtnl::open() {
        Ok(mut r) => r.link(name).map(|l| l.is_some()),
        Err(_) => Ok(std::path::Path::new(SYS_CLASS_NET).join(name).exists()),
    }
}
