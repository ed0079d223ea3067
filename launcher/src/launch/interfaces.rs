//! The VM's network interfaces and the kernel's vsock device: each tap
//! made, attached and raised (checked first by `launch::preflight`), and
//! `/dev/vhost-vsock` opened by root for the hypervisor.

use std::path::PathBuf;

use netlink_packet_route::link::InfoKind;
use nix::errno::Errno;

use crate::config::spec::{InterfaceSpec, Spec, VsockSpec};
use crate::host::net;
use crate::launch::StepError;

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

/// Create, address, attach and raise every tap of the spec, as fds for a
/// hypervisor that takes them so (QEMU, cloud-hypervisor). Firecracker's
/// interfaces are `launch::netns`'s.
pub fn create_taps(spec: &Spec) -> Result<Vec<net::Tap>> {
    if spec.interfaces.is_empty() {
        return Ok(Vec::new());
    }
    let mut rtnl = net::Rtnl::open()?;
    let mut taps = Vec::new();
    for (i, n) in spec.interfaces.iter().enumerate() {
        let tap = net::create_tap(&n.tap)?;
        let link = rtnl
            .link(n.tap.as_str())?
            .ok_or_else(|| StepError::TapVanished {
                tap: n.tap.to_string(),
            })?;
        let controller = bridge_index(&mut rtnl, i, n)?;
        let mac = spec.guest_mac(i).host_side();
        rtnl.configure(n.tap.as_str(), link.index, &mac.octets(), controller)?;
        tracing::info!(step = %"taps", tap = %n.tap, bridge = ?n.bridge, "tap created");
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
