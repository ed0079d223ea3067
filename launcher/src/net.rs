//! Taps as file descriptors, and the rtnetlink calls around them.
//!
//! The launcher (root, before the privilege drop) opens `/dev/net/tun` once
//! per interface and creates the tap with `TUNSETIFF` (`IFF_TAP|IFF_NO_PI|
//! IFF_VNET_HDR|IFF_TUN_EXCL`, never persistent), sets its host-side MAC,
//! attaches it to the configured bridge and brings it up over rtnetlink, then
//! hands the open fd to the hypervisor across `execve`. The tap lives exactly
//! as long as some process holds that fd: when the hypervisor dies, whatever
//! killed it, the kernel deletes the tap.
//!
//! Netlink is spoken synchronously on one `NETLINK_ROUTE` socket
//! (`netlink-sys`'s blocking `Socket`, messages from `netlink-packet-route`):
//! no async runtime, no threads, no `ip` binary.
//!
//! Tap names are `^vmw-[a-z0-9-]{1,11}$` (15 bytes at most: IFNAMSIZ is 16
//! with the NUL). The `vmw-` prefix is what cleanup, reap and verify-clean
//! look for in `/sys/class/net`.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;

use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_REQUEST,
};
use netlink_packet_route::link::{InfoKind, LinkAttribute, LinkFlags, LinkInfo, LinkMessage};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

use crate::error::{Error, Result};

/// Prefix of every tap vmwarden creates.
pub const TAP_PREFIX: &str = "vmw-";
/// IFNAMSIZ (16) minus the NUL.
pub const IFNAME_MAX: usize = 15;
pub const TUN_DEVICE: &str = "/dev/net/tun";
pub const SYS_CLASS_NET: &str = "/sys/class/net";

// include/uapi/linux/if_tun.h
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const IFF_TAP: libc::c_short = 0x0002;
const IFF_NO_PI: libc::c_short = 0x1000;
const IFF_VNET_HDR: libc::c_short = 0x4000;
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

/// `^vmw-[a-z0-9-]{1,11}$`.
pub fn valid_tap_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix(TAP_PREFIX) else {
        return false;
    };
    !rest.is_empty()
        && name.len() <= IFNAME_MAX
        && rest
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
}

/// A Linux interface name that is safe to look up: 1..=15 bytes of
/// `[A-Za-z0-9_.-]`, not `.` or `..`.
pub fn valid_ifname(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= IFNAME_MAX
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
}

/// Parse `aa:bb:cc:dd:ee:ff` (hex, either case).
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let parts: Vec<&str> = s.split(':').collect();
    if parts.len() != 6 {
        return None;
    }
    let mut mac = [0u8; 6];
    for (i, p) in parts.iter().enumerate() {
        if p.len() != 2 {
            return None;
        }
        mac[i] = u8::from_str_radix(p, 16).ok()?;
    }
    Some(mac)
}

pub fn format_mac(mac: &[u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Why a guest MAC is unusable, if it is.
pub fn mac_problem(mac: &[u8; 6]) -> Option<&'static str> {
    if mac[0] & 1 != 0 {
        Some("is a multicast/broadcast address; a NIC needs a unicast MAC (the first octet's lowest bit must be 0)")
    } else if mac == &[0; 6] {
        Some("is all zeros")
    } else {
        None
    }
}

/// A stable, locally administered unicast MAC for a spec that gives none:
/// `02:` followed by 5 bytes of FNV-1a over "VM/TAP".
pub fn derived_mac(vm: &str, tap: &str) -> [u8; 6] {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in vm.bytes().chain([b'/']).chain(tap.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let b = h.to_be_bytes();
    [0x02, b[0], b[1], b[2], b[3], b[4]]
}

/// The host side of the tap gets the guest MAC with its first octet set to
/// 0xfe (libvirt's convention): unicast, locally administered, distinct from
/// the guest's, and high enough that a bridge never adopts it as its own
/// address (a bridge takes the lowest port MAC).
pub fn host_side_mac(guest: &[u8; 6]) -> [u8; 6] {
    let mut m = *guest;
    // A guest MAC that already starts with 0xfe would equal the host side:
    // then 0xfa, as libvirt does.
    m[0] = if guest[0] == 0xfe { 0xfa } else { 0xfe };
    m
}

fn net_err(what: impl Into<String>, op: &'static str, source: std::io::Error) -> Error {
    Error::Net {
        what: what.into(),
        op,
        source,
    }
}

/// A blocking rtnetlink socket.
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
                let m = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&data[off..])
                    .map_err(|e| net_err(what, op, std::io::Error::other(e.to_string())))?;
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
                        _ => {}
                    }
                }
                Ok(Some(Link {
                    index: l.header.index,
                    kind,
                    controller,
                }))
            }
            Err(Error::Net { source, .. })
                if matches!(
                    source.raw_os_error(),
                    Some(libc::ENODEV) | Some(libc::ENOENT)
                ) =>
            {
                Ok(None)
            }
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
            Err(Error::Net { source, .. }) if source.raw_os_error() == Some(libc::ENODEV) => {
                Ok(false)
            }
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
            Err(Error::Net { source, .. }) if source.raw_os_error() == Some(libc::ENODEV) => {
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }
}

/// One tap, created and open. Dropping the fd (and every copy of it) deletes
/// the tap.
#[derive(Debug)]
pub struct Tap {
    pub name: String,
    pub fd: OwnedFd,
}

/// Create tap `name` (never persistent; EBUSY if a device of that name
/// exists) and return its open queue fd (close-on-exec until `execve`).
pub fn create_tap(name: &str) -> Result<Tap> {
    if !valid_tap_name(name) {
        return Err(Error::Usage {
            what: format!("tap name {name:?}"),
            reason: "must match ^vmw-[a-z0-9-]{1,11}$".into(),
        });
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(TUN_DEVICE)
        .map_err(|source| Error::Io {
            op: "open",
            path: PathBuf::from(TUN_DEVICE),
            source,
        })?;
    let mut req = IfReq {
        name: [0; 16],
        flags: IFF_TAP | IFF_NO_PI | IFF_VNET_HDR | IFF_TUN_EXCL,
        _pad: [0; 22],
    };
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: TUNSETIFF reads and writes one `struct ifreq`; `req` is a
    // properly sized, initialised #[repr(C)] ifreq that outlives the call,
    // and the fd is a valid open /dev/net/tun. The return value is checked.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), TUNSETIFF as _, &mut req as *mut IfReq) };
    if rc < 0 {
        return Err(net_err(name, "TUNSETIFF", std::io::Error::last_os_error()));
    }
    let got = req.name.split(|b| *b == 0).next().unwrap_or(&[]);
    if got != name.as_bytes() {
        return Err(net_err(
            name,
            "TUNSETIFF",
            std::io::Error::other(format!(
                "kernel named the tap {:?}",
                String::from_utf8_lossy(got)
            )),
        ));
    }
    Ok(Tap {
        name: name.to_string(),
        fd: OwnedFd::from(f),
    })
}

/// Clear close-on-exec on exactly `fd` (a tap the hypervisor inherits).
pub fn inherit_across_exec(fd: &OwnedFd) -> Result<i32> {
    use nix::fcntl::{fcntl, FcntlArg, FdFlag};
    fcntl(fd, FcntlArg::F_SETFD(FdFlag::empty())).map_err(|errno| Error::Sys {
        op: "fcntl(F_SETFD, 0) on a tap fd",
        path: PathBuf::from(TUN_DEVICE),
        errno,
    })?;
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

/// The taps VM `name` has or may have: its intent record's and its spec's.
pub fn vm_taps(
    roots: &crate::paths::Roots,
    name: &str,
    intent: Option<&crate::intent::Intent>,
) -> Vec<String> {
    let mut out: Vec<String> = intent.map(|i| i.taps()).unwrap_or_default();
    if let Ok(spec) = crate::spec::Spec::read(&roots.spec_path(name)) {
        out.extend(spec.interfaces.into_iter().map(|n| n.tap));
    }
    out.retain(|t| valid_tap_name(t));
    out.sort();
    out.dedup();
    out
}

/// Of `taps`, those that exist in this network namespace (an error to check
/// counts as existing: keep, and say so).
pub fn surviving(taps: &[String]) -> Vec<(String, String)> {
    taps.iter()
        .filter_map(|t| match link_exists(t) {
            Ok(false) => None,
            Ok(true) => Some((t.clone(), "exists".to_string())),
            Err(e) => Some((t.clone(), format!("cannot tell: {e}"))),
        })
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tap_names() {
        for ok in ["vmw-a", "vmw-web0", "vmw-abcdefghijk", "vmw-a-1"] {
            assert!(valid_tap_name(ok), "{ok}");
        }
        for bad in [
            "vmw-",
            "vmw-abcdefghijkl",
            "tap0",
            "vmw-Web",
            "vmw-a_b",
            "vmw-a/b",
            "vmw-a b",
            "",
        ] {
            assert!(!valid_tap_name(bad), "{bad}");
        }
    }

    #[test]
    fn ifnames() {
        assert!(valid_ifname("br0"));
        assert!(valid_ifname("br-lan.10"));
        assert!(!valid_ifname(".."));
        assert!(!valid_ifname("a/b"));
        assert!(!valid_ifname("a234567890123456"));
        assert!(!valid_ifname(""));
    }

    #[test]
    fn macs() {
        let m = parse_mac("02:00:00:00:00:01").unwrap();
        assert_eq!(format_mac(&m), "02:00:00:00:00:01");
        assert_eq!(parse_mac("02:AA:bb:00:00:01").unwrap()[1], 0xaa);
        assert!(parse_mac("02:00:00:00:00").is_none());
        assert!(parse_mac("02:00:00:00:00:001").is_none());
        assert!(parse_mac("02-00-00-00-00-01").is_none());
        assert!(mac_problem(&parse_mac("01:00:5e:00:00:01").unwrap()).is_some());
        assert!(mac_problem(&parse_mac("ff:ff:ff:ff:ff:ff").unwrap()).is_some());
        assert!(mac_problem(&[0; 6]).is_some());
        assert!(mac_problem(&parse_mac("52:54:00:12:34:56").unwrap()).is_none());
        let d = derived_mac("web", "vmw-web0");
        assert_eq!(d, derived_mac("web", "vmw-web0"));
        assert_ne!(d, derived_mac("db", "vmw-web0"));
        assert_eq!(d[0], 0x02);
        assert!(mac_problem(&d).is_none());
        let h = host_side_mac(&d);
        assert_eq!(h[0], 0xfe);
        let g = [0xfe, 0, 0, 0, 0, 1];
        assert_ne!(host_side_mac(&g), g, "host side must differ from the guest");
        assert!(mac_problem(&h).is_none());
        assert_eq!(h[1..], d[1..]);
    }
}
