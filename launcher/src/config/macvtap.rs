//! `interfaces[i].type = "macvtap"`: a macvtap link on a host NIC (its
//! `link`, the parent) instead of a tap on a bridge, as microvm.nix's
//! `interfaces.*.type = "macvtap"` with `macvtap.link` and `macvtap.mode`.
//! The types of the fields; their checks, which need nothing of the host,
//! are `config::validation_macvtap`'s, and the pre-flight
//! (`launch::macvtap`) looks the parent up.

use serde::{Deserialize, Serialize};

/// `interfaces[i].type`: what the launcher makes for the interface.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum InterfaceType {
    /// A tap (the default), on `bridge` if given.
    #[default]
    Tap,
    /// A macvtap on `macvtap.link`.
    Macvtap,
}

/// The macvlan mode of a macvtap (`ip link … type macvtap mode M`): every
/// mode microvm.nix accepts.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum MacvtapMode {
    /// No frames between the macvtaps of one parent, even through an
    /// outside switch.
    Private,
    /// Every frame leaves by the parent; an outside switch (802.1Qbg)
    /// reflects those between macvtaps of one parent.
    Vepa,
    /// Frames between the macvtaps of one parent go directly.
    Bridge,
    /// The one macvtap of its parent, which takes every frame the parent
    /// receives (the parent is made promiscuous while it exists).
    Passthru,
    /// Receives only frames from the source MACs the link lists (none
    /// when vmwarden makes it, as with microvm.nix) and those for its own
    /// MAC.
    Source,
}

impl MacvtapMode {
    pub fn as_str(self) -> &'static str {
        match self {
            MacvtapMode::Private => "private",
            MacvtapMode::Vepa => "vepa",
            MacvtapMode::Bridge => "bridge",
            MacvtapMode::Passthru => "passthru",
            MacvtapMode::Source => "source",
        }
    }
}

/// `interfaces[i].macvtap`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MacvtapSpec {
    /// The host interface the macvtap sits on (microvm.nix `macvtap.link`).
    pub link: String,
    pub mode: MacvtapMode,
}
