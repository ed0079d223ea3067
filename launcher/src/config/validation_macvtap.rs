//! The checks of an interface's `type` and `macvtap` fields
//! (`config::macvtap`): every refusal names its field. Nothing on the host
//! is read here: the parent's name is a usable interface name and never
//! one of vmwarden's own links (`vmw-*`, another VM's tap or macvtap);
//! whether it exists is the launcher's pre-flight (`launch::macvtap`).

use std::path::Path;

use crate::config::capabilities::{self, Feature};
use crate::config::macvtap::{InterfaceType, MacvtapMode};
use crate::config::names::{BridgeName, TAP_PREFIX};
use crate::config::spec::{Spec, SpecError};

impl Spec {
    /// Interface `i`'s `type` and `macvtap` fields: a macvtap has a usable
    /// parent that is not one of vmwarden's links, no bridge, a
    /// hypervisor that takes its fds, and passthru at most once per parent.
    pub(crate) fn validate_macvtap(&self, path: &Path, i: usize) -> Result<(), SpecError> {
        let bad = |field: &str, reason: String| SpecError::Invalid {
            path: path.to_path_buf(),
            field: format!("interfaces[{i}].{field}"),
            reason,
        };
        let n = &self.interfaces[i];
        let m = match (n.kind.unwrap_or_default(), &n.macvtap) {
            (InterfaceType::Tap, None) => return Ok(()),
            (InterfaceType::Tap, Some(_)) => return Err(bad(
                "macvtap",
                "is set, but the interface's type is \"tap\"; set type = \"macvtap\" or drop it"
                    .into(),
            )),
            (InterfaceType::Macvtap, None) => {
                return Err(bad(
                    "macvtap",
                    "is missing: a macvtap needs its link (the host interface it sits on) and mode"
                        .into(),
                ))
            }
            (InterfaceType::Macvtap, Some(m)) => m,
        };
        if let Some(r) = capabilities::refusal(self.hypervisor.kind, Feature::Macvtap) {
            return Err(bad("type", r.reason.into()));
        }
        if n.bridge.is_some() {
            return Err(bad(
                "bridge",
                "is set, but a macvtap sits on its macvtap.link, never on a bridge; drop the bridge (or use type = \"tap\")".into(),
            ));
        }
        if m.link.starts_with(TAP_PREFIX) {
            return Err(bad(
                "macvtap.link",
                format!(
                    "{:?} is a VM's link ({TAP_PREFIX}*: another VM's tap or macvtap); a macvtap's link must be a host interface (a NIC, a bond, a VLAN, a bridge)",
                    m.link
                ),
            ));
        }
        if BridgeName::parse(&m.link).is_err() {
            return Err(bad(
                "macvtap.link",
                format!(
                    "{:?} is not a usable interface name (1-15 bytes of letters, digits, '_', '.', '-')",
                    m.link
                ),
            ));
        }
        let passthru_on_link = self.interfaces[..i].iter().any(|o| {
            o.macvtap().is_some_and(|om| {
                om.link == m.link
                    && (om.mode == MacvtapMode::Passthru || m.mode == MacvtapMode::Passthru)
            })
        });
        if passthru_on_link {
            return Err(bad(
                "macvtap.mode",
                format!(
                    "puts a second macvtap on {:?}, which has a passthru one: a passthru macvtap is the only one of its link",
                    m.link
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::spec::tests::{base, check};
    use serde_json::json;

    fn with(ifaces: serde_json::Value) -> String {
        let mut v = base();
        v["interfaces"] = ifaces;
        match check(v) {
            Ok(_) => "ok".into(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn every_mode_microvm_nix_accepts_is_a_macvtap() {
        for mode in ["private", "vepa", "bridge", "passthru", "source"] {
            let got = with(json!([{ "tap": "vmw-a", "type": "macvtap",
                "macvtap": { "link": "enp3s0", "mode": mode } }]));
            assert_eq!(got, "ok", "{mode}");
        }
        let mut v = base();
        v["interfaces"] = json!([{ "tap": "vmw-a", "type": "macvtap",
            "macvtap": { "link": "enp3s0", "mode": "bridge" } }]);
        let s = check(v).unwrap();
        assert_eq!(s.interfaces[0].macvtap().unwrap().link, "enp3s0");
        // A tap has none; an older spec (no type) is a tap.
        let mut v = base();
        v["interfaces"] = json!([{ "tap": "vmw-a" }]);
        assert!(check(v).unwrap().interfaces[0].macvtap().is_none());
    }

    #[test]
    fn each_refusal_names_its_field() {
        let p = "spec /etc/vmwarden/vms/web.json: field";
        let cases = [
            (
                json!([{ "tap": "vmw-a", "type": "macvtap" }]),
                "`interfaces[0].macvtap` is missing",
            ),
            (
                json!([{ "tap": "vmw-a", "macvtap": { "link": "eth0", "mode": "bridge" } }]),
                "`interfaces[0].macvtap` is set, but the interface's type is \"tap\"",
            ),
            (
                json!([{ "tap": "vmw-a", "type": "macvtap", "bridge": "br0",
                    "macvtap": { "link": "eth0", "mode": "bridge" } }]),
                "`interfaces[0].bridge` is set, but a macvtap sits on its macvtap.link",
            ),
            (
                json!([{ "tap": "vmw-a" }, { "tap": "vmw-b", "type": "macvtap",
                    "macvtap": { "link": "vmw-a", "mode": "bridge" } }]),
                "`interfaces[1].macvtap.link` \"vmw-a\" is a VM's link",
            ),
            (
                json!([{ "tap": "vmw-a", "type": "macvtap",
                    "macvtap": { "link": "eth/0", "mode": "bridge" } }]),
                "`interfaces[0].macvtap.link` \"eth/0\" is not a usable interface name",
            ),
            (
                json!([{ "tap": "vmw-a", "type": "macvtap",
                    "macvtap": { "link": "a-name-far-too-long", "mode": "bridge" } }]),
                "`interfaces[0].macvtap.link` \"a-name-far-too-long\" is not a usable",
            ),
            (
                json!([{ "tap": "vmw-a", "type": "macvtap", "macvtap": { "link": "eth0", "mode": "passthru" } },
                       { "tap": "vmw-b", "type": "macvtap", "macvtap": { "link": "eth0", "mode": "bridge" } }]),
                "`interfaces[1].macvtap.mode` puts a second macvtap on \"eth0\", which has a passthru one",
            ),
        ];
        for (ifaces, want) in cases {
            let got = with(ifaces);
            assert!(got.starts_with(&format!("{p} {want}")), "{got}");
        }
        // Two bridge-mode macvtaps on one parent are fine.
        assert_eq!(
            with(
                json!([{ "tap": "vmw-a", "type": "macvtap", "macvtap": { "link": "eth0", "mode": "bridge" } },
                        { "tap": "vmw-b", "type": "macvtap", "macvtap": { "link": "eth0", "mode": "bridge" } }])
            ),
            "ok"
        );
    }

    #[test]
    fn an_unknown_mode_or_type_is_refused() {
        for ifaces in [
            json!([{ "tap": "vmw-a", "type": "macvtap", "macvtap": { "link": "eth0", "mode": "vlan" } }]),
            json!([{ "tap": "vmw-a", "type": "bridge" }]),
        ] {
            assert!(with(ifaces).contains("is not valid"));
        }
    }
}
