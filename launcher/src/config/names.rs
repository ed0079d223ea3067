//! The name and path rules every other part relies on: VM, credential, tap
//! and interface names, MAC addresses, and the syntax of a spec path. The
//! rules themselves (classes, lengths, prefixes) come from `units/rules.toml`
//! through `config::rules`, its only import from the crate.
//!
//! Parse, don't validate: a name is checked once, where it enters (the
//! command line through clap, a spec or record through serde, a directory
//! listing through `parse`), and from then on travels as [`VmName`],
//! [`CredentialName`], [`TapName`], [`BridgeName`] or [`Mac`]. A function
//! that joins a name into a path takes the type, so an unchecked string
//! cannot reach the join.

use std::ffi::OsStr;
use std::fmt;
use std::path::Path;
use std::str::FromStr;

use crate::config::rules;

/// Prefix of every tap vmwarden creates.
pub const TAP_PREFIX: &str = rules::TAP_PREFIX;

/// IFNAMSIZ (16) minus the NUL.
pub const IFNAME_MAX: usize = rules::IFNAME_MAX;

/// `^[a-z][a-z0-9-]{0,31}$`: VM names, also used in paths and unit names.
fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= rules::VM_NAME_MAX
        && rules::VM_NAME_FIRST.contains(b[0])
        && b[1..].iter().all(|c| rules::VM_NAME_REST.contains(*c))
}

/// Credential names end up as file names in the tmpfs and in fw_cfg.
fn valid_credential_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && rules::CREDENTIAL_NAME_FIRST.contains(b[0])
        && b[1..]
            .iter()
            .all(|c| rules::CREDENTIAL_NAME_REST.contains(*c))
}

/// Absolute, no `.`/`..` components, no empty components, no trailing slash.
pub fn check_abs_normalised(p: &Path) -> Result<(), &'static str> {
    let s = p.as_os_str().as_encoded_bytes();
    if !p.is_absolute() {
        return Err("must be an absolute path");
    }
    if s.contains(&0) {
        return Err("must not contain NUL");
    }
    if s.len() > 1 && s.ends_with(b"/") {
        return Err("must not end with '/'");
    }
    if s.windows(2).any(|w| w == b"//") {
        return Err("must not contain '//'");
    }
    // On the raw bytes: Path::components() silently drops interior "."
    // components, so "/a/./b" would pass a components() check.
    if s.split(|b| *b == b'/')
        .any(|seg| seg == b"." || seg == b"..")
    {
        return Err("must be normalised (no '.' or '..' components)");
    }
    Ok(())
}

/// `^vmw-[a-z0-9-]{1,11}$`.
fn valid_tap_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix(TAP_PREFIX) else {
        return false;
    };
    !rest.is_empty()
        && name.len() <= IFNAME_MAX
        && rest.bytes().all(|c| rules::TAP_REST.contains(c))
}

/// A Linux interface name that is safe to look up: 1..=15 bytes of
/// `[A-Za-z0-9_.-]`, not `.` or `..`.
fn valid_ifname(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= IFNAME_MAX
        && !rules::IFNAME_REFUSED.contains(&name)
        && name.bytes().all(|c| rules::IFNAME_CHARS.contains(c))
}

/// Parse `aa:bb:cc:dd:ee:ff` (hex, either case).
fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let parts: Vec<&str> = s.split(':').collect();
    if parts.len() != 6 {
        return None;
    }
    let mut mac = [0u8; 6];
    for (i, p) in parts.iter().enumerate() {
        if p.len() != 2 {
            return None;
        }
        mac[i] = u8::from_str_radix(p, 16).ok()?;
    }
    Some(mac)
}

fn format_mac(mac: &[u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Why a guest MAC is unusable, if it is.
fn mac_problem(mac: &[u8; 6]) -> Option<NameRule> {
    if mac[0] & rules::MAC_GROUP_BIT != 0 {
        Some(NameRule::MacUnicast)
    } else if rules::MAC_REFUSE_ZERO && mac == &[0; 6] {
        Some(NameRule::MacNonZero)
    } else {
        None
    }
}

/// A stable, locally administered unicast MAC for a spec that gives none:
/// `02:` followed by 5 bytes of FNV-1a over "VM/TAP".
fn derived_mac(vm: &str, tap: &str) -> [u8; 6] {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in vm.bytes().chain([b'/']).chain(tap.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let b = h.to_be_bytes();
    [0x02, b[0], b[1], b[2], b[3], b[4]]
}

/// The host side of the tap gets the guest MAC with its first octet set to
/// 0xfe (libvirt's convention): unicast, locally administered, distinct from
/// the guest's, and high enough that a bridge never adopts it as its own
/// address (a bridge takes the lowest port MAC).
fn host_side_mac(guest: &[u8; 6]) -> [u8; 6] {
    let mut m = *guest;
    // A guest MAC that already starts with 0xfe would equal the host side:
    // then 0xfa, as libvirt does.
    m[0] = if guest[0] == 0xfe { 0xfa } else { 0xfe };
    m
}

/// The rule a name broke. Each rule's text is the one every message about
/// such a name uses: the spec's field errors and the binaries' argument
/// errors alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameRule {
    /// `^[a-z][a-z0-9-]{0,31}$`
    VmName,
    /// `^[A-Za-z0-9][A-Za-z0-9_.-]*$`
    CredentialName,
    /// `^vmw-[a-z0-9-]{1,11}$`
    TapName,
    /// An interface name (1..=15 of `[A-Za-z0-9_.-]`, not `.`/`..`) that is
    /// not one of vmwarden's taps.
    BridgeName,
    /// Six hex pairs separated by `:`.
    MacSyntax,
    /// The first octet's lowest bit is 0.
    MacUnicast,
    /// Not `00:00:00:00:00:00`.
    MacNonZero,
}

impl NameRule {
    /// What kind of name it is, for a message that does not already say so.
    pub fn what(self) -> &'static str {
        match self {
            NameRule::VmName => "VM name",
            NameRule::CredentialName => "credential name",
            NameRule::TapName => "tap name",
            NameRule::BridgeName => "bridge name",
            NameRule::MacSyntax | NameRule::MacUnicast | NameRule::MacNonZero => "MAC",
        }
    }

    /// The rule, as it follows the offending value in a message.
    pub fn text(self) -> &'static str {
        match self {
            NameRule::VmName => "must match ^[a-z][a-z0-9-]{0,31}$ (lowercase letter first, then lowercase letters, digits or '-', at most 32)",
            NameRule::CredentialName => "must be letters, digits, '-', '_' or '.', starting with a letter or digit",
            NameRule::TapName => "must match ^vmw-[a-z0-9-]{1,11}$ (the vmw- prefix marks vmwarden's taps; 15 bytes at most, the kernel's IFNAMSIZ)",
            NameRule::BridgeName => "is not a usable bridge name (1-15 bytes of letters, digits, '_', '.', '-', not starting with vmw-)",
            NameRule::MacSyntax => "is not a MAC address (six hex pairs separated by ':')",
            NameRule::MacUnicast => "is a multicast/broadcast address; a NIC needs a unicast MAC (the first octet's lowest bit must be 0)",
            NameRule::MacNonZero => "is all zeros",
        }
    }
}

/// A value refused by one of the name types: `VM name "a/b" must match …`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} {value:?} {}", rule.what(), rule.text())]
pub struct NameError {
    pub rule: NameRule,
    pub value: String,
}

impl NameError {
    fn new(rule: NameRule, value: &str) -> Self {
        NameError {
            rule,
            value: value.to_string(),
        }
    }

    /// `"VALUE" RULE`, for a message that already names the field (the
    /// spec's `field `name` "Web" must match …`).
    pub fn reason(&self) -> String {
        format!("{:?} {}", self.value, self.rule.text())
    }
}

/// A command-line argument whose name type refused its value:
/// `<NAME>: VM name "a/b" must match …`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{arg}: {error}")]
pub struct ArgNameError {
    /// The argument as clap shows it (`<NAME>`, `--dropin <NAME>`).
    pub arg: String,
    #[source]
    pub error: NameError,
}

/// A name held as a `String` that passed `$check` (`$rule` otherwise):
/// `parse`, `as_str`, `Display` and `Debug` as the string, `AsRef<str>`,
/// `AsRef<Path>`, `FromStr` (clap's `value_parser`), serde as a string
/// (deserialising through `parse`).
macro_rules! string_name {
    ($(#[$doc:meta])* $name:ident, $check:expr, $rule:expr) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Deserialize)]
        #[serde(try_from = "String")]
        pub struct $name(String);

        impl $name {
            pub fn parse(s: &str) -> Result<Self, NameError> {
                if $check(s) {
                    Ok($name(s.to_string()))
                } else {
                    Err(NameError::new($rule, s))
                }
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        /// As the string (quoted), so `{:?}` in a message reads as before.
        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&self.0, f)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<Path> for $name {
            fn as_ref(&self) -> &Path {
                Path::new(&self.0)
            }
        }

        impl AsRef<OsStr> for $name {
            fn as_ref(&self) -> &OsStr {
                OsStr::new(&self.0)
            }
        }

        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl FromStr for $name {
            type Err = NameError;
            fn from_str(s: &str) -> Result<Self, NameError> {
                $name::parse(s)
            }
        }

        impl TryFrom<String> for $name {
            type Error = NameError;
            fn try_from(s: String) -> Result<Self, NameError> {
                $name::parse(&s)
            }
        }

        impl From<$name> for String {
            fn from(n: $name) -> String {
                n.0
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }
    };
}

string_name!(
    /// A VM name, `^[a-z][a-z0-9-]{0,31}$`: one path component under every
    /// root, and the instance of `microvm@NAME.service`.
    VmName,
    valid_name,
    NameRule::VmName
);

string_name!(
    /// A credential name: a file name in the VM's credential tmpfs and in
    /// `$CREDENTIALS_DIRECTORY`, and part of an fw_cfg name.
    CredentialName,
    valid_credential_name,
    NameRule::CredentialName
);

string_name!(
    /// A tap vmwarden creates, `^vmw-[a-z0-9-]{1,11}$`.
    TapName,
    valid_tap_name,
    NameRule::TapName
);

string_name!(
    /// A bridge a tap is attached to: an interface name safe to look up
    /// that is not one of vmwarden's taps.
    BridgeName,
    |s: &str| valid_ifname(s) && !s.starts_with(TAP_PREFIX),
    NameRule::BridgeName
);

/// A guest NIC's MAC address: unicast and not all zeros. Parsed from
/// `aa:bb:cc:dd:ee:ff` (hex, either case), shown in lowercase.
#[derive(Clone, Copy, PartialEq, Eq, Hash, serde::Deserialize)]
#[serde(try_from = "String")]
pub struct Mac([u8; 6]);

impl Mac {
    pub fn parse(s: &str) -> Result<Self, NameError> {
        let mac = parse_mac(s).ok_or_else(|| NameError::new(NameRule::MacSyntax, s))?;
        match mac_problem(&mac) {
            Some(rule) => Err(NameError::new(rule, s)),
            None => Ok(Mac(mac)),
        }
    }

    pub fn octets(&self) -> [u8; 6] {
        self.0
    }

    /// The stable MAC of a spec interface that gives none (see `derived_mac`).
    pub fn derived(vm: &VmName, tap: &TapName) -> Mac {
        Mac(derived_mac(vm.as_str(), tap.as_str()))
    }

    /// The host side of the tap (see `host_side_mac`).
    pub fn host_side(&self) -> Mac {
        Mac(host_side_mac(&self.0))
    }
}

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_mac(&self.0))
    }
}

impl fmt::Debug for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&format_mac(&self.0), f)
    }
}

impl FromStr for Mac {
    type Err = NameError;
    fn from_str(s: &str) -> Result<Self, NameError> {
        Mac::parse(s)
    }
}

impl TryFrom<String> for Mac {
    type Error = NameError;
    fn try_from(s: String) -> Result<Self, NameError> {
        Mac::parse(&s)
    }
}

impl serde::Serialize for Mac {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_mac(&self.0))
    }
}

#[cfg(test)]
mod tests {
    use serde::de::DeserializeOwned;

    use super::*;

    #[test]
    fn tap_names() {
        for ok in ["vmw-a", "vmw-web0", "vmw-abcdefghijk", "vmw-a-1"] {
            assert!(valid_tap_name(ok), "{ok}");
        }
        for bad in [
            "vmw-",
            "vmw-abcdefghijkl",
            "tap0",
            "vmw-Web",
            "vmw-a_b",
            "vmw-a/b",
            "vmw-a b",
            "",
        ] {
            assert!(!valid_tap_name(bad), "{bad}");
        }
    }

    #[test]
    fn ifnames() {
        assert!(valid_ifname("br0"));
        assert!(valid_ifname("br-lan.10"));
        assert!(!valid_ifname(".."));
        assert!(!valid_ifname("a/b"));
        assert!(!valid_ifname("a234567890123456"));
        assert!(!valid_ifname(""));
    }

    #[test]
    fn macs() {
        let m = parse_mac("02:00:00:00:00:01").unwrap();
        assert_eq!(format_mac(&m), "02:00:00:00:00:01");
        assert_eq!(parse_mac("02:AA:bb:00:00:01").unwrap()[1], 0xaa);
        assert!(parse_mac("02:00:00:00:00").is_none());
        assert!(parse_mac("02:00:00:00:00:001").is_none());
        assert!(parse_mac("02-00-00-00-00-01").is_none());
        assert!(mac_problem(&parse_mac("01:00:5e:00:00:01").unwrap()).is_some());
        assert!(mac_problem(&parse_mac("ff:ff:ff:ff:ff:ff").unwrap()).is_some());
        assert!(mac_problem(&[0; 6]).is_some());
        assert!(mac_problem(&parse_mac("52:54:00:12:34:56").unwrap()).is_none());
        let d = derived_mac("web", "vmw-web0");
        assert_eq!(d, derived_mac("web", "vmw-web0"));
        assert_ne!(d, derived_mac("db", "vmw-web0"));
        assert_eq!(d[0], 0x02);
        assert!(mac_problem(&d).is_none());
        let h = host_side_mac(&d);
        assert_eq!(h[0], 0xfe);
        let g = [0xfe, 0, 0, 0, 0, 1];
        assert_ne!(host_side_mac(&g), g, "host side must differ from the guest");
        assert!(mac_problem(&h).is_none());
        assert_eq!(h[1..], d[1..]);
    }

    /// Every `ok` parses and shows as given; every `bad` is refused by
    /// `parse`, `FromStr` and serde alike, with `rule` and the value.
    fn table<T>(rule: NameRule, ok: &[&str], bad: &[&str])
    where
        T: FromStr<Err = NameError>
            + fmt::Display
            + fmt::Debug
            + serde::Serialize
            + DeserializeOwned,
    {
        for s in ok {
            let v: T = s.parse().unwrap_or_else(|e| panic!("{s:?}: {e}"));
            assert_eq!(v.to_string(), *s);
            assert_eq!(format!("{v:?}"), format!("{s:?}"), "Debug as the string");
            let json = serde_json::to_string(&v).unwrap();
            assert_eq!(json, format!("{s:?}"), "serialised as a string");
            assert_eq!(
                serde_json::from_str::<T>(&json).unwrap().to_string(),
                v.to_string()
            );
        }
        for s in bad {
            let e = s.parse::<T>().expect_err(s);
            assert_eq!(e.rule, rule, "{s:?}: {e}");
            assert_eq!(e.value, *s);
            let msg = e.to_string();
            assert!(
                msg.starts_with(&format!("{} {s:?} ", rule.what())) && msg.ends_with(rule.text()),
                "{msg}"
            );
            assert_eq!(e.reason(), format!("{s:?} {}", rule.text()));
            let de = serde_json::from_str::<T>(&serde_json::to_string(s).unwrap())
                .expect_err(s)
                .to_string();
            assert!(de.starts_with(&msg), "serde refuses with the rule: {de}");
        }
    }

    /// The rule texts are literal (they say the rule in words too): a change
    /// to `units/rules.toml` must change them with it.
    #[test]
    fn rule_texts_say_what_the_rules_file_says() {
        let vm = NameRule::VmName.text();
        assert!(
            vm.contains(&format!("must match {} ", rules::VM_NAME_PATTERN)),
            "{vm}"
        );
        assert!(
            vm.contains(&format!("at most {})", rules::VM_NAME_MAX)),
            "{vm}"
        );
        let tap = NameRule::TapName.text();
        assert!(
            tap.contains(&format!("must match {} ", rules::TAP_PATTERN)),
            "{tap}"
        );
        assert!(
            tap.contains(&format!("{} bytes at most", rules::IFNAME_MAX)),
            "{tap}"
        );
        let bridge = NameRule::BridgeName.text();
        assert!(
            bridge.contains(&format!("(1-{} bytes", rules::IFNAME_MAX)),
            "{bridge}"
        );
        assert!(
            bridge.contains(&format!("not starting with {})", rules::TAP_PREFIX)),
            "{bridge}"
        );
        // The classes the words describe.
        assert_eq!(rules::IFNAME_CHARS.pattern, "A-Za-z0-9_.-", "{bridge}");
        assert_eq!(
            (
                rules::CREDENTIAL_NAME_FIRST.pattern,
                rules::CREDENTIAL_NAME_REST.pattern
            ),
            ("A-Za-z0-9", "A-Za-z0-9_.-"),
            "{}",
            NameRule::CredentialName.text()
        );
        assert_eq!(rules::MAC_GROUP_BIT, 1, "{}", NameRule::MacUnicast.text());
    }

    #[test]
    fn vm_name_table() {
        let longest = format!("a{}", "b".repeat(31));
        let too_long = "a".repeat(33);
        table::<VmName>(
            NameRule::VmName,
            &["a", "web", "db-1", "a-", &longest],
            &[
                "", "Web", "1web", "-a", "a/b", "a.b", "a_b", "..", ".", "a b", "wéb", "a\n",
                &too_long,
            ],
        );
        let e = VmName::parse("a/b").unwrap_err();
        assert_eq!(
            e.to_string(),
            "VM name \"a/b\" must match ^[a-z][a-z0-9-]{0,31}$ (lowercase letter first, then lowercase letters, digits or '-', at most 32)"
        );
        let web = VmName::parse("web").unwrap();
        assert_eq!(web, "web");
        assert_eq!(web.as_str(), "web");
        assert_eq!(
            Path::new("/run/vmwarden").join(&web),
            Path::new("/run/vmwarden/web")
        );
    }

    #[test]
    fn credential_name_table() {
        table::<CredentialName>(
            NameRule::CredentialName,
            &["t", "db-password", "A.b_c-1", "0"],
            &["", ".hidden", "-a", "_a", "a/b", "..", "a b", "a:b", "ä"],
        );
    }

    #[test]
    fn tap_name_table() {
        table::<TapName>(
            NameRule::TapName,
            &["vmw-a", "vmw-web0", "vmw-abcdefghijk", "vmw-a-1"],
            &[
                "vmw-",
                "vmw-abcdefghijkl",
                "tap0",
                "vmw-Web",
                "vmw-a_b",
                "vmw-a/b",
                "vmw-a b",
                "",
            ],
        );
    }

    #[test]
    fn bridge_name_table() {
        table::<BridgeName>(
            NameRule::BridgeName,
            &["br0", "br-lan.10", "virbr_0", "a23456789012345"],
            &[
                "",
                ".",
                "..",
                "../br",
                "a/b",
                "a b",
                "a234567890123456",
                "vmw-x",
                "vmw-",
            ],
        );
    }

    #[test]
    fn mac_table() {
        table::<Mac>(
            NameRule::MacSyntax,
            &["02:00:00:00:00:01", "52:54:00:12:34:56"],
            &[
                "",
                "02:00:00:00:00",
                "02:00:00:00:00:001",
                "02-00-00-00-00-01",
                "0g:00:00:00:00:01",
            ],
        );
        table::<Mac>(
            NameRule::MacUnicast,
            &[],
            &["01:00:5e:00:00:01", "ff:ff:ff:ff:ff:ff"],
        );
        table::<Mac>(NameRule::MacNonZero, &[], &["00:00:00:00:00:00"]);
        let m = Mac::parse("02:AA:bb:00:00:01").unwrap();
        assert_eq!(
            m.to_string(),
            "02:aa:bb:00:00:01",
            "either case in, lowercase out"
        );
        let vm = VmName::parse("web").unwrap();
        let tap = TapName::parse("vmw-web0").unwrap();
        let d = Mac::derived(&vm, &tap);
        assert_eq!(d.octets(), derived_mac("web", "vmw-web0"));
        assert_eq!(Mac::parse(&d.to_string()), Ok(d), "a derived MAC is usable");
        let h = d.host_side();
        assert_eq!(h.octets(), host_side_mac(&d.octets()));
        assert_eq!(Mac::parse(&h.to_string()), Ok(h), "the host side is usable");
    }
}
