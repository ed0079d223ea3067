//! Which taps belong to a VM and which of them still exist, the host
//! sides of the links into a VM's own network namespace, and the VM's
//! macvtaps: the teardown side of `host::net`, which itself knows nothing
//! of specs or instances.

use netlink_packet_route::link::InfoKind;

use crate::config::names::{TapName, VmName};
use crate::config::paths::Roots;
use crate::config::spec::Spec;
use crate::host::net::{link_exists, ns_link, Link, Rtnl, SYS_CLASS_NET};
use crate::host::ownership::Failed;
use crate::instance::intent::Intent;
use crate::instance::launched::effective_spec;

/// The taps VM `name` has or may have: its intent record's and its spec's
/// (the launched copy while the record names one, else the configured spec).
pub fn vm_taps(roots: &Roots, name: &VmName, intent: Option<&Intent>) -> Vec<TapName> {
    let spec = effective_spec(roots, name, intent).map(|(s, _)| s);
    vm_taps_with(intent, spec.as_ref())
}

/// [`vm_taps`] with the spec to believe already read.
pub fn vm_taps_with(intent: Option<&Intent>, spec: Option<&Spec>) -> Vec<TapName> {
    let mut out: Vec<TapName> = intent.map(|i| i.taps()).unwrap_or_default();
    if let Some(spec) = spec {
        out.extend(spec.interfaces.iter().map(|n| n.tap.clone()));
    }
    out.sort();
    out.dedup();
    out
}

/// Of `taps`, those that exist in this network namespace (an error to check
/// counts as existing: keep, and say so).
pub fn surviving(taps: &[TapName]) -> Vec<(TapName, String)> {
    taps.iter()
        .filter_map(|t| match link_exists(t.as_str()) {
            Ok(false) => None,
            Ok(true) => Some((t.clone(), "exists".to_string())),
            Err(e) => Some((t.clone(), format!("cannot tell: {e}"))),
        })
        .collect()
}

/// Is `link` the host side of a link into a VM's own network namespace
/// (`launch::netns`): a veth whose other end is in another namespace?
pub fn is_ns_link_end(link: &Link) -> bool {
    link.kind == Some(InfoKind::Veth) && link.peer_elsewhere
}

/// Is `link` the host side of a link into the namespace of the instance
/// `intent` records: such a link ([`is_ns_link_end`]) carrying that
/// instance's mark? A link of the same name made by another set of roots'
/// instance (or by none) is not.
pub fn is_ns_link_end_of(link: &Link, intent: &Intent) -> bool {
    is_ns_link_end(link)
        && link.alias.as_deref() == Some(ns_link::link_mark(&intent.instance_id).as_str())
}

/// Delete link `name`, vetted by the caller as the device with `index`, by
/// that index (never whatever holds the name by now), and check it is
/// gone. `Ok(true)`: deleted here; `Ok(false)`: it was already gone (the
/// kernel removes a namespace's links with it, asynchronously).
pub fn delete_vetted(rtnl: &mut Rtnl, name: &str, index: u32) -> Result<bool, String> {
    let deleted = rtnl.delete_index(name, index).map_err(|e| e.to_string())?;
    match rtnl.link(name) {
        Ok(Some(l)) if l.index == index => {
            Err("RTM_DELLINK succeeded but the link still exists".into())
        }
        Ok(_) => Ok(deleted),
        Err(e) => Err(format!("deleted, but cannot check it is gone: {e}")),
    }
}

/// Is `link` a macvtap (what the launcher makes for `type = "macvtap"`)?
pub fn is_macvtap(link: &Link) -> bool {
    link.kind == Some(InfoKind::MacVtap)
}

/// Is `link` a macvtap the instance `intent` records made: one carrying
/// that instance's mark ([`ns_link::link_mark`])?
pub fn is_macvtap_of(link: &Link, intent: &Intent) -> bool {
    is_macvtap(link)
        && link.alias.as_deref() == Some(ns_link::link_mark(&intent.instance_id).as_str())
}

/// Delete the macvtaps `names` (an intent record's) that are still here,
/// each vetted (a macvtap by that name) and deleted by its index. A
/// macvtap outlives the fds on it, so after the hypervisor, whatever ended
/// it, this is what removes it. Only called with the instance dead and the
/// lease held. Returns the paths deleted and the failures; a link of that
/// name that is not a macvtap of this instance (another set of roots' VM
/// may have a macvtap of the same name) is left to the survivor check.
pub fn delete_macvtaps(intent: &Intent) -> (Vec<std::path::PathBuf>, Vec<Failed>) {
    let names = intent.macvtaps();
    let (mut deleted, mut failed) = (Vec::new(), Vec::new());
    if names.is_empty() {
        return (deleted, failed);
    }
    let path = |n: &TapName| std::path::Path::new(SYS_CLASS_NET).join(n.as_str());
    let mut rtnl = match Rtnl::open() {
        Ok(r) => r,
        Err(e) => {
            failed.extend(names.iter().map(|n| Failed {
                path: path(n),
                reason: e.to_string(),
            }));
            return (deleted, failed);
        }
    };
    for n in &names {
        let outcome = match rtnl.link(n.as_str()) {
            Ok(Some(l)) if is_macvtap_of(&l, intent) => {
                delete_vetted(&mut rtnl, n.as_str(), l.index)
            }
            Ok(_) => continue,
            Err(e) => Err(e.to_string()),
        };
        match outcome {
            Ok(true) => deleted.push(path(n)),
            Ok(false) => {}
            Err(reason) => failed.push(Failed {
                path: path(n),
                reason,
            }),
        }
    }
    (deleted, failed)
}
