//! An interface with `type = "macvtap"` (config/macvtap.rs): its parent
//! checked before anything is created ([`preflight`]), then at the `taps`
//! step the macvtap made on it by root, named as the spec's `tap` (which
//! the intent record already names), with the guest's MAC, brought up, and
//! its character device opened once per queue ([`create`]). The fds go to
//! the hypervisor exactly as a tap's; the principal never gets the node.
//! The link outlives its fds: cleanup deletes it (teardown/taps.rs).

use netlink_packet_route::link::InfoKind;

use crate::config::names::TAP_PREFIX;
use crate::config::spec::{InterfaceSpec, MacvtapMode, MacvtapSpec, Spec, SpecError};
use crate::host::net::{self, macvtap, Link, Rtnl};
use crate::launch::StepError;

type Result<T, E = StepError> = std::result::Result<T, E>;

/// Interface `i`'s parent (`macvtap.link`) exists in this network
/// namespace, is not one of vmwarden's own links (`vmw-*`: the spec
/// check refuses the name; this is the host's view), and is no bridge
/// when the mode is passthru. A refusal names
/// `interfaces[i].macvtap.link`.
pub fn preflight(
    rtnl: &mut Rtnl,
    spec_path: &std::path::Path,
    i: usize,
    m: &MacvtapSpec,
) -> Result<()> {
    let bad = |reason: String| {
        StepError::Spec(SpecError::Invalid {
            path: spec_path.to_path_buf(),
            field: format!("interfaces[{i}].macvtap.link"),
            reason,
        })
    };
    match rtnl.link(&m.link)? {
        None => Err(bad(format!(
            "{:?} does not exist on this host; name the host interface the macvtap sits on (`ip link` lists them)",
            m.link
        ))),
        Some(_) if m.link.starts_with(TAP_PREFIX) => Err(bad(format!(
            "{:?} is a VM's link; a macvtap's link must be a host interface",
            m.link
        ))),
        // A passthru macvtap makes its parent promiscuous; a promiscuous
        // bridge hands its own port (here the guest) every frame it
        // forwards between its other ports: every other VM's on it.
        Some(l) if m.mode == MacvtapMode::Passthru && l.kind == Some(InfoKind::Bridge) => {
            Err(bad(format!(
                "{:?} is a bridge, and a passthru macvtap would make it promiscuous: the guest would receive every frame the bridge forwards between its ports (other VMs' included); use mode \"bridge\" on it, or a tap on the bridge",
                m.link
            )))
        }
        Some(_) => Ok(()),
    }
}

/// The parent's ifindex, looked up again at the `taps` step (the
/// pre-flight ran before the lease).
fn parent(rtnl: &mut Rtnl, i: usize, m: &MacvtapSpec) -> Result<Link> {
    rtnl.link(&m.link)?
        .ok_or_else(|| StepError::MacvtapLinkGone {
            field: format!("interfaces[{i}].macvtap.link"),
            link: m.link.clone(),
        })
}

/// Make interface `i`'s macvtap and open its queues: what
/// `launch::interfaces::create_taps` hands the hypervisor for it.
pub fn create(
    rtnl: &mut Rtnl,
    spec: &Spec,
    instance_id: &str,
    i: usize,
    n: &InterfaceSpec,
    m: &MacvtapSpec,
) -> Result<net::Tap> {
    let name = n.tap.as_str();
    let lower = parent(rtnl, i, m)?;
    // The guest's own MAC: in bridge, VEPA and private mode the parent
    // delivers a frame to the macvtap whose address it is for.
    let mac = spec.guest_mac(i);
    // Its ifindex chosen: the kernel's next one may have its /dev/tapN
    // held by another user's macvtap (host/net/macvtap.rs).
    let index = macvtap::unclaimed_index(name)?;
    rtnl.create_macvtap(name, lower.index, m.mode, &mac.octets(), index)?;
    let link = rtnl
        .link(name)?
        .filter(|l| l.kind == Some(InfoKind::MacVtap))
        .ok_or_else(|| StepError::LinkVanished {
            link: name.to_string(),
            kind: InfoKind::MacVtap,
            found: "gone or of another kind".into(),
        })?;
    // The instance's mark, as on firecracker's links: teardown deletes a
    // macvtap of this name only when the mark is its own record's, never
    // another set of roots' VM's macvtap of the same name.
    rtnl.set_alias(name, link.index, &net::ns_link::link_mark(instance_id))?;
    rtnl.macvtap_up(name, link.index)?;
    let dev = macvtap::char_dev(name, link.index)?;
    let mut fds = macvtap::open_queues(name, link.index, dev, n.queues())?.into_iter();
    let Some(fd) = fds.next() else {
        return Err(StepError::LinkVanished {
            link: name.to_string(),
            kind: InfoKind::MacVtap,
            found: "without a queue".into(),
        });
    };
    tracing::info!(step = %"taps", macvtap = %n.tap, link = %m.link, mode = m.mode.as_str(), queues = n.queues(), vhost = n.vhost(), "macvtap created");
    Ok(net::Tap {
        name: n.tap.clone(),
        fd,
        queues: fds.collect(),
        vhost: Vec::new(),
    })
}
