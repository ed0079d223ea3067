//! A multi-queue tap made where no other user can name it, and moved into
//! the launcher's network namespace only once it refuses every other user.
//!
//! `TUNSETIFF` makes a tap in the network namespace its `/dev/net/tun` file
//! was opened in (the file's socket belongs to that namespace). In the
//! launcher's namespace a multi-queue tap would exist for a moment with
//! neither owner nor group, between the `TUNSETIFF` that makes it and the
//! `TUNSETOWNER`/`TUNSETGROUP` that follow, and the kernel lets any local
//! user attach one more queue by name to such a tap (`tun_not_capable` in
//! drivers/net/tun.c); an attached queue keeps every later tun ioctl on
//! it (`TUNSETPERSIST`, `TUNSETOWNER`, a re-attach by `TUNSETQUEUE`).
//!
//! So [`create_apart`]:
//!
//! 1. opens the launcher's network namespace (`/proc/thread-self/ns/net`,
//!    close-on-exec), the way back;
//! 2. `unshare(CLONE_NEWNET)`: a namespace of this process's own, with only
//!    a loopback in it; joining it needs CAP_SYS_ADMIN and a handle on it,
//!    which only this process has;
//! 3. opens `/dev/net/tun` once per queue there and makes the tap
//!    (`IFF_TUN_EXCL`) with all its queues, then gives it its owner and
//!    group ([`own_for`]);
//! 4. moves it into the launcher's namespace (`RTM_SETLINK` with
//!    `IFLA_NET_NS_FD`, from a netlink socket of the private namespace; the
//!    kernel refuses with EEXIST when a link of that name is there);
//! 5. `setns` back into the launcher's namespace, on every path, success
//!    or failure.
//!
//! The move keeps the queues attached and the owner and group set: a
//! local user's `TUNSETIFF` on the name in the launcher's namespace finds
//! a tap with an owner and group not theirs from its first moment there.
//! The queue fds' sockets stay in the private namespace (where they were
//! opened) and hold it: it lives as long as the hypervisor holds the fds,
//! with nothing in it but its loopback, and goes with the last fd. The tap,
//! never persistent, goes with the same fds in whichever namespace it then
//! is: a launcher killed at any point leaves neither behind, and nothing
//! names the private namespace (no bind mount, no process but this one
//! until `setns`), so there is nothing for cleanup to find.
//!
//! A single-queue tap needs none of this: the kernel attaches the
//! creator's queue before it registers the device, and refuses a second
//! attach (EBUSY) while that queue is held.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

use netlink_packet_route::link::{LinkAttribute, LinkMessage};
use netlink_packet_route::RouteNetlinkMessage;
use nix::errno::Errno;
use nix::fcntl::{open, OFlag};
use nix::sched::{setns, unshare, CloneFlags};
use nix::sys::stat::Mode;

use super::{create_tap_queues, own_for, NetError, Result, Rtnl, Tap};
use crate::config::names::TapName;

/// The calling thread's network namespace (`unshare` and `setns` change
/// the thread's, which in the one-threaded launcher is the process's).
pub const SELF_NET_NS: &str = "/proc/thread-self/ns/net";

/// Where [`create_apart`] stands when it calls its `at` hook: the tap made,
/// owned and still in the private namespace.
pub const AT_APART: &str = "apart";
/// The tap moved into the launcher's namespace; the launcher not yet back.
pub const AT_MOVED: &str = "moved";

/// What `unshare(CLONE_NEWNET)` needs under systemd.
const UNSHARE_HINT: &str = " (a unit around the launcher needs RestrictNamespaces=net for a VM with a multi-queue tap: re-render its drop-in)";

fn ns_err(tap: &TapName, op: &'static str, hint: &'static str) -> impl Fn(Errno) -> NetError {
    let name = tap.to_string();
    move |errno| NetError::Namespace {
        name: name.clone(),
        op,
        errno,
        hint,
    }
}

impl Rtnl {
    /// Move link `index` of this socket's namespace into the network
    /// namespace `ns` (an fd of it): one `RTM_SETLINK` with
    /// `IFLA_NET_NS_FD`. The kernel keeps the name, refuses with EEXIST
    /// when `ns` has a link of that name, and takes the link down.
    pub fn move_to_netns(&mut self, name: &str, index: u32, ns: BorrowedFd<'_>) -> Result<()> {
        let mut m = LinkMessage::default();
        m.header.index = index;
        m.attributes.push(LinkAttribute::NetNsFd(ns.as_raw_fd()));
        self.request(
            name,
            "RTM_SETLINK (IFLA_NET_NS_FD: into the launcher's network namespace)",
            RouteNetlinkMessage::SetLink(m),
            0,
        )
        .map(|_| ())
    }
}

/// Make tap `tap` with `queues` queue pairs, owned by `owner` and `group`,
/// in a network namespace of this process's own, and move it into the
/// namespace this process is in (see the module docs). Returns with this
/// process back in its own namespace, whatever happened; on an error the
/// tap's fds are closed and the tap is gone. `at` is called with
/// [`AT_APART`] and [`AT_MOVED`] (the launcher's kill points). One thread:
/// `unshare` and `setns` change only the calling thread's namespace.
pub fn create_apart(
    tap: &TapName,
    queues: u32,
    owner: u32,
    group: u32,
    at: &mut dyn FnMut(&'static str),
) -> Result<Tap> {
    let home = open(
        SELF_NET_NS,
        OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOCTTY,
        Mode::empty(),
    )
    .map_err(ns_err(tap, "open /proc/thread-self/ns/net", ""))?;
    unshare(CloneFlags::CLONE_NEWNET).map_err(ns_err(
        tap,
        "unshare(CLONE_NEWNET) to make the tap apart",
        UNSHARE_HINT,
    ))?;
    let made = make_and_move(tap, queues, owner, group, home.as_fd(), at);
    let back = setns(&home, CloneFlags::CLONE_NEWNET).map_err(ns_err(
        tap,
        "setns back into the launcher's network namespace",
        "",
    ));
    match (made, back) {
        (Ok(t), Ok(())) => Ok(t),
        (Err(e), Ok(())) => Err(e),
        (made, Err(e)) => {
            if let Err(first) = made {
                tracing::error!(tap = %tap, error = %first, "making the tap apart failed");
            }
            Err(e)
        }
    }
}

/// Steps 3 and 4 of the module docs, in the private namespace.
fn make_and_move(
    tap: &TapName,
    queues: u32,
    owner: u32,
    group: u32,
    home: BorrowedFd<'_>,
    at: &mut dyn FnMut(&'static str),
) -> Result<Tap> {
    // /dev/net/tun opened now, once per queue: the tap is made here.
    let t = create_tap_queues(tap, queues)?;
    own_for(&t, owner, group)?;
    let mut rtnl = Rtnl::open()?;
    let Some(link) = rtnl.link(tap.as_str())? else {
        return Err(ns_err(tap, "RTM_GETLINK in the private namespace", "")(
            Errno::ENODEV,
        ));
    };
    at(AT_APART);
    rtnl.move_to_netns(tap.as_str(), link.index, home)?;
    at(AT_MOVED);
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::net::create_tap;

    /// The inode of this thread's network namespace.
    fn netns_inode() -> u64 {
        let fd = open(
            SELF_NET_NS,
            OFlag::O_RDONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .unwrap();
        nix::sys::stat::fstat(&fd).unwrap().st_ino
    }

    /// Runs `f` on a thread of its own in a network namespace of that
    /// thread's own (gone with it): nothing here touches the host's.
    fn in_throwaway_netns(f: impl FnOnce() + Send + 'static) {
        assert!(nix::unistd::geteuid().is_root(), "this test needs root");
        std::thread::spawn(move || {
            unshare(CloneFlags::CLONE_NEWNET).unwrap();
            f()
        })
        .join()
        .unwrap();
    }

    fn name(s: &str) -> TapName {
        TapName::parse(s).unwrap()
    }

    #[test]
    fn a_tap_made_apart_arrives_owned_with_its_queues_and_the_thread_comes_back() {
        in_throwaway_netns(|| {
            let before = netns_inode();
            let mut seen = Vec::new();
            let t = create_apart(&name("vmw-apart0"), 3, 0, 0, &mut |at| {
                seen.push((at, netns_inode()))
            })
            .unwrap();
            assert_eq!(netns_inode(), before, "the thread did not come back");
            // Both hooks ran in the private namespace, not this one.
            assert_eq!(
                seen.iter().map(|s| s.0).collect::<Vec<_>>(),
                [AT_APART, AT_MOVED]
            );
            assert!(seen.iter().all(|s| s.1 != before), "{seen:?}");
            assert_eq!(t.queues.len(), 2);
            let mut rtnl = Rtnl::open().unwrap();
            assert!(rtnl.link("vmw-apart0").unwrap().is_some());
            drop(t);
            assert!(
                rtnl.link("vmw-apart0").unwrap().is_none(),
                "the tap outlived its fds"
            );
        });
    }

    #[test]
    fn a_failed_move_leaves_the_thread_home_and_no_tap_of_its_making() {
        in_throwaway_netns(|| {
            let before = netns_inode();
            // A link of that name is here already: the move fails (EEXIST).
            let squatter = create_tap(&name("vmw-apart1")).unwrap();
            let mut rtnl = Rtnl::open().unwrap();
            let index = rtnl.link("vmw-apart1").unwrap().unwrap().index;
            let mut seen = Vec::new();
            let e = create_apart(&name("vmw-apart1"), 2, 0, 0, &mut |at| seen.push(at))
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with("network interface vmw-apart1: RTM_SETLINK (IFLA_NET_NS_FD")
                    && e.contains("File exists"),
                "{e}"
            );
            assert_eq!(seen, [AT_APART]);
            assert_eq!(netns_inode(), before, "the thread did not come back");
            // The link here is still the one that was here, single-queue.
            assert_eq!(rtnl.link("vmw-apart1").unwrap().unwrap().index, index);
            drop(squatter);
            assert!(rtnl.link("vmw-apart1").unwrap().is_none());
        });
    }
}
