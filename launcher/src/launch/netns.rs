//! Firecracker's network: a namespace of its own that holds nothing but
//! its taps.
//!
//! firecracker opens its taps by name (`TUNSETIFF`) and cannot take an open
//! fd as QEMU and cloud-hypervisor do. Without CAP_NET_ADMIN the kernel
//! lets a process attach by name to a tap its uid owns, *and to any tap
//! that has neither owner nor group* (`tun_not_capable` in
//! drivers/net/tun.c): in the host's namespace that is a VPN's tun, an
//! `ip tuntap add` without `user`, another hypervisor's persistent tap
//! between its runs. A compromised firecracker there could read the host's
//! frames and inject its own. So the launcher moves itself, and with it the
//! hypervisor it becomes, into a new network namespace before it makes the
//! VM's taps, and makes them there; no device of the host is within reach
//! by name (`TUNSETIFF` on any other name would have to create a tap, which
//! needs CAP_NET_ADMIN).
//!
//! Interface `i` with tap `T` on bridge `B`:
//!
//! 1. host: a veth pair, `T` on the host and [`uplink_name`]`(i)` in the
//!    VM's namespace (one `RTM_NEWLINK`, `NLM_F_EXCL`);
//!    `T` is marked (its alias) with this instance's id from the intent
//!    record, the mark teardown checks before it deletes `T`: another set
//!    of roots may name a tap `T` too;
//! 2. host: `T` gets the guest MAC's host side, goes on `B` and up, as a
//!    tap of the other hypervisors does: the operator sees the same name on
//!    the same bridge;
//! 3. VM namespace: the tap `T` (`IFF_TUN_EXCL`), owned by the principal
//!    and persistent, so that firecracker can attach to it by name; the
//!    launcher's fd closes;
//! 4. VM namespace: the tap and the uplink without IPv6 addresses and up,
//!    and tc redirects both ways between them (`host::net::ns_link`), so
//!    the guest's frames reach `B` unchanged and `B`'s reach the guest.
//!
//! Lifetime: the namespace is held by the processes in it (the launcher,
//! then the hypervisor it becomes; nothing binds it to a path), and the
//! kernel destroys it with the last one, with everything inside: the taps
//! (persistent or not), both ends of each veth pair (a pair dies together),
//! the qdiscs and filters. Only the host end `T` is ever seen in the host's
//! namespace, and only until the kernel has finished tearing the namespace
//! down (it does so asynchronously); cleanup deletes it if it is still
//! there. The intent record names the namespace and each link before they
//! exist (`launch::resources`).

use netlink_packet_route::link::InfoKind;
use nix::sched::CloneFlags;

use crate::config::spec::Spec;
use crate::host::net;
use crate::host::sys::SysContext;
use crate::identity::principal::Principal;
use crate::launch::{interfaces, StepError};

type Result<T, E = StepError> = std::result::Result<T, E>;

/// The name of interface `i`'s uplink (the veth end inside the VM's
/// namespace, where names are its own).
pub fn uplink_name(i: usize) -> String {
    format!("uplink{i}")
}

/// Move this process into a network namespace of its own and build the
/// VM's interfaces there (see the module docs). Called with firecracker's
/// spec at the `taps` step; a spec without interfaces changes nothing (the
/// hypervisor then shares the host's namespace, where its seccomp filter
/// allows no socket but `AF_UNIX`).
pub fn firecracker_network(spec: &Spec, principal: &Principal, instance_id: &str) -> Result<()> {
    if spec.interfaces.is_empty() {
        return Ok(());
    }
    let mut host = net::Rtnl::open()?;
    let bridges = spec
        .interfaces
        .iter()
        .enumerate()
        .map(|(i, n)| interfaces::bridge_index(&mut host, i, n))
        .collect::<Result<Vec<_>>>()?;
    // From here on this process (and what it becomes) is in the VM's
    // namespace; `host` stays bound to the host's.
    nix::sched::unshare(CloneFlags::CLONE_NEWNET).sys(
        "unshare(CLONE_NEWNET) (a unit around the launcher needs RestrictNamespaces=net for a firecracker VM with interfaces: re-render its drop-in)",
        "/",
    )?;
    let mut vm = net::Rtnl::open()?;
    let me = std::process::id();
    for (i, (n, bridge)) in spec.interfaces.iter().zip(bridges).enumerate() {
        let tap = n.tap.as_str();
        let uplink = uplink_name(i);
        host.create_veth(tap, &uplink, me)?;
        let outside = link_of(&mut host, tap, InfoKind::Veth)?;
        host.set_alias(tap, outside.index, &net::ns_link::link_mark(instance_id))?;
        let mac = spec.guest_mac(i).host_side();
        host.configure(tap, outside.index, &mac.octets(), bridge)?;
        // /dev/net/tun opened now: the tap is made in this namespace.
        let t = net::create_tap(&n.tap)?;
        net::persist_for(&t, principal.uid, principal.gid)?;
        drop(t);
        let inner_tap = link_of(&mut vm, tap, InfoKind::Tun)?;
        let inner_up = link_of(&mut vm, &uplink, InfoKind::Veth)?;
        vm.up_silent(tap, inner_tap.index)?;
        vm.up_silent(&uplink, inner_up.index)?;
        vm.redirect_all(tap, inner_tap.index, inner_up.index)?;
        vm.redirect_all(&uplink, inner_up.index, inner_tap.index)?;
        tracing::info!(step = %"taps", tap = %n.tap, bridge = ?n.bridge, %uplink, "tap created in the VM's network namespace, linked to the host");
    }
    Ok(())
}

/// Link `name` of `rtnl`'s namespace, just made: it must still be there,
/// and of the `kind` made.
fn link_of(rtnl: &mut net::Rtnl, name: &str, kind: InfoKind) -> Result<net::Link> {
    match rtnl.link(name)? {
        Some(l) if l.kind.as_ref() == Some(&kind) => Ok(l),
        found => Err(StepError::LinkVanished {
            link: name.to_string(),
            kind,
            found: match found {
                None => "gone".into(),
                Some(l) => format!("a link of kind {:?} now", l.kind),
            },
        }),
    }
}
