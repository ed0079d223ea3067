//! User networking: the spec's `user_network` block and its checks. A VM
//! with it gets one network interface served by a helper daemon, passt,
//! run as the VM's principal; the guest sees the network QEMU's SLIRP
//! gives a microvm.nix guest with `type = "user"` (its address, gateway
//! and DNS below), and passt turns its traffic into the principal's own
//! sockets on the host. Separate from `interfaces` (taps): a VM may have
//! both, and nothing here touches the tap path.
//!
//! The names follow microvm.nix's `interfaces.*` (`id`, `mac`) and
//! `forwardPorts` (`from`, `proto`, `host.address`, `host.port`,
//! `guest.address`, `guest.port`), with the same defaults.

use std::net::Ipv4Addr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::config::names::Mac;
use crate::config::rules;

/// The guest's address on the user network (SLIRP's `10.0.2.15`). This
/// and the other addresses are data in `units/rules.toml`, which the NixOS
/// module reads too.
pub const GUEST_ADDRESS: Ipv4Addr = rules::USER_NET_GUEST_ADDRESS;
/// The network's prefix length (`10.0.2.0/24`).
pub const PREFIX_LEN: u8 = rules::USER_NET_PREFIX_LEN;
/// The gateway: connections to it reach the host's loopback (SLIRP's
/// `10.0.2.2`, "the host").
pub const GATEWAY: Ipv4Addr = rules::USER_NET_GATEWAY;
/// The DNS server the guest is given; queries to it go to the host's first
/// resolver (SLIRP's `10.0.2.3`).
pub const DNS: Ipv4Addr = rules::USER_NET_DNS;
/// The gateway's MAC address, as SLIRP answers for `10.0.2.2`.
pub const GATEWAY_MAC: &str = rules::USER_NET_GATEWAY_MAC;
/// The host address a `from = "host"` forward binds when `host.address`
/// is empty: every IPv4 address of the host, as QEMU's `hostfwd` does
/// with an empty address (microvm.nix's default).
pub const DEFAULT_BIND: Ipv4Addr = rules::USER_NET_DEFAULT_BIND;
/// The host address a `from = "guest"` forward can reach: passt maps the
/// gateway's address to the host's loopback.
pub const HOST_LOOPBACK: Ipv4Addr = rules::USER_NET_HOST_LOOPBACK;
/// Longest `id` (QEMU ids have no limit; this keeps messages short).
pub const ID_MAX: usize = rules::USER_NET_ID_MAX;
/// The kernel's default `net.ipv4.ip_unprivileged_port_start`.
pub const UNPRIVILEGED_PORT_START: u32 = rules::UNPRIVILEGED_PORT_START;

/// `user_network`: one interface on a user network served by passt.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct UserNetworkSpec {
    /// passt.
    pub binary: PathBuf,
    /// microvm.nix's `interfaces.*.id`: QEMU's netdev id.
    pub id: String,
    /// The guest's MAC address; QEMU's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<Mac>,
    /// microvm.nix's `forwardPorts`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forward_ports: Vec<ForwardPort>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum ForwardFrom {
    /// Traffic to the host's port goes to the guest's port.
    #[default]
    Host,
    /// Traffic from the guest to its port goes to the host's port.
    Guest,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Proto {
    #[default]
    Tcp,
    Udp,
}

impl Proto {
    pub fn as_str(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        }
    }
}

/// One end of a forward: microvm.nix's `host` or `guest` (`address` is an
/// IPv4 address or empty).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Endpoint {
    #[serde(default)]
    pub address: String,
    pub port: u16,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ForwardPort {
    #[serde(default)]
    pub from: ForwardFrom,
    #[serde(default)]
    pub proto: Proto,
    pub host: Endpoint,
    pub guest: Endpoint,
}

impl ForwardPort {
    /// The host address a `from = "host"` forward binds (validated).
    pub fn bind_address(&self) -> Ipv4Addr {
        self.host.address.parse().unwrap_or(DEFAULT_BIND)
    }
}

impl UserNetworkSpec {
    /// passt's arguments after its binary, but for the connected socket it
    /// is handed (`--fd`, which also makes it exit once QEMU's end closes):
    /// in the foreground, logging to stderr too, IPv4 only, with the network above whatever
    /// the host's own addresses and routes are (`-i lo`: passt needs a
    /// template interface only for what these options leave unset), and
    /// the `from = "host"` forwards (`from = "guest"` ones need nothing:
    /// the gateway always reaches the host's loopback).
    pub fn passt_args(&self) -> Vec<String> {
        let mut a: Vec<String> = [
            "--foreground",
            "--stderr",
            "--ipv4-only",
            "--interface",
            "lo",
            "--mac-addr",
            GATEWAY_MAC,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        a.extend([
            "--address".into(),
            GUEST_ADDRESS.to_string(),
            "--netmask".into(),
            PREFIX_LEN.to_string(),
            "--gateway".into(),
            GATEWAY.to_string(),
            "--dns".into(),
            DNS.to_string(),
            "--dns-forward".into(),
            DNS.to_string(),
        ]);
        for f in self
            .forward_ports
            .iter()
            .filter(|f| f.from == ForwardFrom::Host)
        {
            let flag = match f.proto {
                Proto::Tcp => "--tcp-ports",
                Proto::Udp => "--udp-ports",
            };
            a.push(flag.into());
            a.push(format!(
                "{}/{}:{}",
                f.bind_address(),
                f.host.port,
                f.guest.port
            ));
        }
        a
    }

    /// TCP ports passt binds on the host (what its Landlock domain lets it
    /// bind).
    pub fn tcp_host_ports(&self) -> Vec<u16> {
        self.forward_ports
            .iter()
            .filter(|f| f.from == ForwardFrom::Host && f.proto == Proto::Tcp)
            .map(|f| f.host.port)
            .collect()
    }
}
