//! The checks of the spec's `user_network` block (`config::user_net`):
//! every refusal names its field. Nothing on the host is read here; what
//! depends on the host (the unprivileged port start, user namespaces) is
//! the launcher's pre-flight.

use std::net::Ipv4Addr;
use std::path::Path;

use crate::config::capabilities::{self, Feature};
use crate::config::names::check_abs_normalised;
use crate::config::spec::{Spec, SpecError};
use crate::config::user_net::{ForwardFrom, Proto, GATEWAY, GUEST_ADDRESS, HOST_LOOPBACK, ID_MAX};

impl Spec {
    /// The `user_network` block's checks (no file system access).
    pub(crate) fn validate_user_network(&self, path: &Path) -> Result<(), SpecError> {
        let bad = |field: String, reason: String| SpecError::Invalid {
            path: path.to_path_buf(),
            field,
            reason,
        };
        let Some(u) = &self.user_network else {
            return Ok(());
        };
        if let Some(r) = capabilities::refusal(self.hypervisor.kind, Feature::UserNetwork) {
            return Err(bad(r.field.into(), r.reason.into()));
        }
        check_abs_normalised(&u.binary)
            .map_err(|r| bad("user_network.binary".into(), r.to_string()))?;
        check_id(&u.id).map_err(|r| bad("user_network.id".into(), r))?;
        let mut bound: Vec<(Proto, u16, Ipv4Addr, usize)> = Vec::new();
        for (i, f) in u.forward_ports.iter().enumerate() {
            let field = |s: &str| format!("user_network.forward_ports[{i}].{s}");
            for (end, e) in [("host", &f.host), ("guest", &f.guest)] {
                if e.port == 0 {
                    return Err(bad(
                        field(&format!("{end}.port")),
                        "is 0; give a port 1..=65535".into(),
                    ));
                }
                if !e.address.is_empty() && e.address.parse::<Ipv4Addr>().is_err() {
                    return Err(bad(
                        field(&format!("{end}.address")),
                        format!(
                            "is {:?}; give an IPv4 address (a.b.c.d) or leave it empty",
                            e.address
                        ),
                    ));
                }
            }
            match f.from {
                ForwardFrom::Host => {
                    if !f.guest.address.is_empty() && f.guest.address.parse() != Ok(GUEST_ADDRESS) {
                        return Err(bad(
                            field("guest.address"),
                            format!("is {:?}, but the guest's only address on the user network is {GUEST_ADDRESS}, where passt forwards to; leave it empty", f.guest.address),
                        ));
                    }
                    let addr = f.bind_address();
                    if let Some((_, _, _, j)) = bound.iter().find(|(p, port, a, _)| {
                        *p == f.proto
                            && *port == f.host.port
                            && (*a == addr || a.is_unspecified() || addr.is_unspecified())
                    }) {
                        return Err(bad(
                            field("host.port"),
                            format!(
                                "forwards {} port {} of {addr} again (forward_ports[{j}] has it); passt can bind it once",
                                f.proto.as_str(),
                                f.host.port
                            ),
                        ));
                    }
                    bound.push((f.proto, f.host.port, addr, i));
                }
                ForwardFrom::Guest => {
                    // passt forwards the guest's connections to the
                    // gateway to the host's loopback, port for port;
                    // SLIRP's `guestfwd` to any other address or port has
                    // no passt counterpart.
                    let how = format!("passt forwards from the guest only to the host's loopback, as the gateway {GATEWAY} with the same port: set guest.address = \"{GATEWAY}\", host.address = \"{HOST_LOOPBACK}\" and host.port = guest.port (the guest then reaches the host's service at {GATEWAY}), or use a tap interface");
                    if f.guest.address.parse() != Ok(GATEWAY) {
                        return Err(bad(
                            field("guest.address"),
                            format!("is {:?}, but {how}", f.guest.address),
                        ));
                    }
                    if f.host.address.parse() != Ok(HOST_LOOPBACK) {
                        return Err(bad(
                            field("host.address"),
                            format!("is {:?}, but {how}", f.host.address),
                        ));
                    }
                    if f.host.port != f.guest.port {
                        return Err(bad(
                            field("host.port"),
                            format!(
                                "is {}, not guest.port {}, but {how}",
                                f.host.port, f.guest.port
                            ),
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}

/// A QEMU id (a letter, then letters, digits, `-`, `.`, `_`) that is not
/// one of vmwarden's own tap netdev ids (`net0`, `net1`, ...).
fn check_id(id: &str) -> Result<(), String> {
    let ok = id.len() <= ID_MAX
        && id.bytes().next().is_some_and(|b| b.is_ascii_alphabetic())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
    if !ok {
        return Err(format!("{id:?} must be 1 to {ID_MAX} bytes: a letter, then letters, digits, '-', '.' or '_' (a QEMU id)"));
    }
    if id
        .strip_prefix("net")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(format!(
            "{id:?} is the id of a tap interface's netdev (net0, net1, ...); choose another"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::spec::tests::{base, check};
    use serde_json::json;

    fn with(forwards: serde_json::Value) -> serde_json::Value {
        let mut v = base();
        v["user_network"] = json!({
            "binary": "/usr/bin/passt", "id": "qemu", "mac": "02:00:00:01:01:01",
            "forward_ports": forwards
        });
        v
    }

    fn refused(v: serde_json::Value) -> (String, String) {
        match check(v) {
            Err(SpecError::Invalid { field, reason, .. }) => (field, reason),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn microvm_nix_defaults_become_passts_forwards_on_every_ipv4_address() {
        let s = check(with(json!([
            { "host": { "port": 2222 }, "guest": { "port": 22 } },
            { "proto": "udp", "host": { "address": "127.0.0.1", "port": 5353 },
              "guest": { "address": "10.0.2.15", "port": 53 } },
            { "from": "guest", "host": { "address": "127.0.0.1", "port": 8080 },
              "guest": { "address": "10.0.2.2", "port": 8080 } }
        ])))
        .unwrap();
        let u = s.user_network.as_ref().unwrap();
        let a = u.passt_args();
        let tail: Vec<&str> = a.iter().map(String::as_str).skip(a.len() - 4).collect();
        assert_eq!(
            tail,
            [
                "--tcp-ports",
                "0.0.0.0/2222:22",
                "--udp-ports",
                "127.0.0.1/5353:53"
            ]
        );
        assert!(a.windows(2).any(|w| w == ["--address", "10.0.2.15"]));
        assert!(a.windows(2).any(|w| w == ["--gateway", "10.0.2.2"]));
        assert!(a.windows(2).any(|w| w == ["--dns-forward", "10.0.2.3"]));
        assert!(a.contains(&"--foreground".to_string()));
        assert_eq!(u.tcp_host_ports(), [2222]);
        // Round trip: the defaults are filled in.
        let again: Spec = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(again, s);
    }

    #[test]
    fn each_refusal_names_its_field() {
        let fp = |f: serde_json::Value| with(json!([f]));
        let cases: Vec<(&str, serde_json::Value)> = vec![
            (
                "user_network.forward_ports[0].host.port",
                fp(json!({ "host": { "port": 0 }, "guest": { "port": 22 } })),
            ),
            (
                "user_network.forward_ports[0].guest.port",
                fp(json!({ "host": { "port": 2222 }, "guest": { "port": 0 } })),
            ),
            (
                "user_network.forward_ports[0].host.address",
                fp(
                    json!({ "host": { "address": "localhost", "port": 2222 }, "guest": { "port": 22 } }),
                ),
            ),
            (
                "user_network.forward_ports[0].guest.address",
                fp(
                    json!({ "host": { "port": 2222 }, "guest": { "address": "10.0.2.16", "port": 22 } }),
                ),
            ),
            (
                "user_network.forward_ports[0].guest.address",
                fp(
                    json!({ "from": "guest", "host": { "address": "127.0.0.1", "port": 80 }, "guest": { "address": "10.0.2.100", "port": 80 } }),
                ),
            ),
            (
                "user_network.forward_ports[0].host.address",
                fp(
                    json!({ "from": "guest", "host": { "address": "192.0.2.1", "port": 80 }, "guest": { "address": "10.0.2.2", "port": 80 } }),
                ),
            ),
            (
                "user_network.forward_ports[0].host.port",
                fp(
                    json!({ "from": "guest", "host": { "address": "127.0.0.1", "port": 8080 }, "guest": { "address": "10.0.2.2", "port": 80 } }),
                ),
            ),
            (
                "user_network.forward_ports[1].host.port",
                with(json!([
                    { "host": { "address": "127.0.0.1", "port": 2222 }, "guest": { "port": 22 } },
                    { "host": { "port": 2222 }, "guest": { "port": 23 } }
                ])),
            ),
        ];
        for (want, v) in cases {
            let (field, reason) = refused(v);
            assert_eq!(field, want, "{reason}");
        }
        // Another protocol, or two distinct addresses, bind the port twice
        // without a conflict.
        check(with(json!([
            { "host": { "port": 2222 }, "guest": { "port": 22 } },
            { "proto": "udp", "host": { "port": 2222 }, "guest": { "port": 22 } }
        ])))
        .unwrap();
        check(with(json!([
            { "host": { "address": "127.0.0.1", "port": 2222 }, "guest": { "port": 22 } },
            { "host": { "address": "127.0.0.2", "port": 2222 }, "guest": { "port": 23 } }
        ])))
        .unwrap();
        for (id, ok) in [
            ("qemu", true),
            ("u.1-x_y", true),
            ("net0", false),
            ("net", true),
            ("1a", false),
            ("a,b", false),
            ("", false),
        ] {
            let mut v = with(json!([]));
            v["user_network"]["id"] = json!(id);
            match ok {
                true => assert!(check(v).is_ok(), "{id}"),
                false => assert_eq!(refused(v).0, "user_network.id", "{id}"),
            }
        }
        let mut v = with(json!([]));
        v["user_network"]["binary"] = json!("passt");
        assert_eq!(refused(v).0, "user_network.binary");
        let mut v = with(json!([]));
        v["user_network"]["extra"] = json!(1);
        assert!(matches!(check(v), Err(SpecError::Parse { .. })));
    }
}
