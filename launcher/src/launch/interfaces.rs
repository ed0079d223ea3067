//! The VM's network interfaces and the kernel's vhost devices: each tap
//! made (one fd per queue), attached and raised (checked first by
//! `launch::preflight`), and `/dev/vhost-net` (per queue, where an
//! interface asks for it) and `/dev/vhost-vsock` opened by root for the
//! hypervisor.

use std::path::PathBuf;

use netlink_packet_route::link::InfoKind;
use nix::errno::Errno;

use crate::config::spec::{InterfaceSpec, Spec, VsockSpec};
use crate::host::net;
use crate::launch::steps::Steps;
use crate::launch::{macvtap, StepError};

type Result<T, E = StepError> = std::result::Result<T, E>;

/// The kernel's vhost-vsock device (`vsock.backend = "vhost"`), opened
/// read-write and close-on-exec (cleared for the hypervisor only, in
/// `launch::exec`).
pub const VHOST_VSOCK: &str = "/dev/vhost-vsock";

/// The device for the spec's `vsock`, when its backend is `"vhost"`.
pub fn open_vhost_vsock(vsock: Option<&VsockSpec>) -> Result<Option<std::os::fd::OwnedFd>> {
    use crate::config::spec::VsockBackend;
    use nix::fcntl::{open, OFlag};
    use nix::sys::stat::Mode;
    if !vsock.is_some_and(|v| v.backend == VsockBackend::Vhost) {
        return Ok(None);
    }
    match open(
        VHOST_VSOCK,
        OFlag::O_RDWR | OFlag::O_CLOEXEC | OFlag::O_NOCTTY,
        Mode::empty(),
    ) {
        Ok(fd) => Ok(Some(fd)),
        Err(errno) => Err(StepError::VhostVsock {
            path: PathBuf::from(VHOST_VSOCK),
            errno,
            hint: match errno {
                Errno::ENOENT | Errno::ENODEV | Errno::ENXIO => {
                    ": the kernel has no vhost-vsock here (modprobe vhost_vsock), or use backend \"user\""
                }
                Errno::EPERM | Errno::EACCES => {
                    ": the unit must allow the device (DeviceAllow=/dev/vhost-vsock rw, which `vmwarden render-unit --dropin` writes)"
                }
                _ => "",
            },
        }),
    }
}

/// `/dev/vhost-net`, opened by root once per queue of every interface that
/// asks for it (`interfaces[i].vhost`), before anything is created: a host
/// without the device refuses here and changes nothing. The fds go to
/// QEMU with the taps (`vhostfd=`/`vhostfds=`); the principal never opens
/// the node (the unit allows it to the launcher: `DeviceAllow=`).
pub fn open_vhost_net(spec: &Spec) -> Result<Vec<Vec<std::os::fd::OwnedFd>>> {
    spec.interfaces
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let count = if n.vhost() { n.queues() } else { 0 };
            (0..count)
                .map(|_| {
                    net::open_vhost_net().map_err(|errno| StepError::VhostNet {
                        field: format!("interfaces[{i}].vhost"),
                        path: PathBuf::from(net::VHOST_NET),
                        errno,
                        hint: match errno {
                            Errno::ENOENT | Errno::ENODEV | Errno::ENXIO => {
                                ": the kernel has no vhost-net here (modprobe vhost_net), or set it to false"
                            }
                            Errno::EPERM | Errno::EACCES => {
                                ": the unit must allow the device (DeviceAllow=/dev/vhost-net rw, which microvm@.service has)"
                            }
                            _ => "",
                        },
                    })
                })
                .collect()
        })
        .collect()
}

/// The owner and group of a tap whose fds the hypervisor inherits: root
/// (uid and gid 0), never the principal. The hypervisor never attaches to
/// its tap by name (its `TUNSETIFF` is refused by the seccomp filter) and
/// re-attaching one of its own queues (`TUNSETQUEUE`) checks no owner, so
/// it needs none; a tap owned by the principal would let a process of the
/// principal's uid that the filter does not hold attach a queue by name
/// and then make the tap persistent, hand it away or set its MAC, the
/// ioctls the filter refuses the hypervisor.
pub const TAP_OWNER: u32 = 0;

/// Create, address, attach and raise every tap of the spec (or make its
/// macvtap, `launch::macvtap`, marked with `instance_id`), as fds for a
/// hypervisor that takes them so (QEMU, cloud-hypervisor): one per queue
/// (`interfaces[i].queues`), with interface `i`'s vhost-net fds from
/// [`open_vhost_net`] (`vhost[i]`). Firecracker's interfaces are
/// `launch::netns`'s. Each tap gets root as owner and group
/// ([`TAP_OWNER`]) before anything else happens to it (`net::own_for`):
/// a tap of several queues would otherwise take one more from any local
/// user, so it is made and owned where no one else can name it, a network
/// namespace of the launcher's own, and only then moved into the host's
/// (`net::apart`; kill points `taps:TAP:apart` and `taps:TAP:moved`).
pub(crate) fn create_taps(
    spec: &Spec,
    instance_id: &str,
    vhost: Vec<Vec<std::os::fd::OwnedFd>>,
    steps: &Steps,
) -> Result<Vec<net::Tap>> {
    if spec.interfaces.is_empty() {
        return Ok(Vec::new());
    }
    let mut rtnl = net::Rtnl::open()?;
    let mut taps = Vec::new();
    let mut vhost = vhost.into_iter();
    for (i, n) in spec.interfaces.iter().enumerate() {
        if let Some(m) = n.macvtap() {
            let mut tap = macvtap::create(&mut rtnl, spec, instance_id, i, n, m)?;
            tap.vhost = vhost.next().unwrap_or_default();
            taps.push(tap);
            continue;
        }
        let mut tap = if n.tap_made_apart() {
            let mut at = |at: &'static str| steps.within(&format!("{}:{at}", n.tap));
            net::apart::create_apart(&n.tap, n.queues(), TAP_OWNER, TAP_OWNER, &mut at)?
        } else {
            let tap = net::create_tap_queues(&n.tap, n.queues())?;
            net::own_for(&tap, TAP_OWNER, TAP_OWNER)?;
            tap
        };
        tap.vhost = vhost.next().unwrap_or_default();
        let link = rtnl
            .link(n.tap.as_str())?
            .ok_or_else(|| StepError::TapVanished {
                tap: n.tap.to_string(),
            })?;
        let controller = bridge_index(&mut rtnl, i, n)?;
        let mac = spec.guest_mac(i).host_side();
        rtnl.configure(n.tap.as_str(), link.index, &mac.octets(), controller)?;
        tracing::info!(step = %"taps", tap = %n.tap, bridge = ?n.bridge, queues = n.queues(), vhost = n.vhost(), "tap created");
        taps.push(tap);
    }
    Ok(taps)
}

/// The ifindex of interface `i`'s bridge (`n`), if it names one.
/// Re-checked here (the pre-flight ran before the lease): whatever holds
/// the name now must still be a bridge.
pub fn bridge_index(rtnl: &mut net::Rtnl, i: usize, n: &InterfaceSpec) -> Result<Option<u32>> {
    let Some(b) = &n.bridge else {
        return Ok(None);
    };
    let field = format!("interfaces[{i}].bridge");
    match rtnl.link(b.as_str())? {
        None => Err(StepError::BridgeGone {
            field,
            bridge: b.to_string(),
        }),
        Some(l) if l.kind != Some(InfoKind::Bridge) => Err(StepError::NoLongerABridge {
            field,
            bridge: b.to_string(),
            kind: l.kind,
        }),
        Some(l) => Ok(Some(l.index)),
    }
}
