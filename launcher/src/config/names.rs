//! The name and path rules every other part relies on: VM, credential, tap
//! and interface names, MAC addresses, and the syntax of a spec path. The
//! rules themselves (classes, lengths, prefixes) come from `units/rules.toml`
//! through `config::rules`, its only import from the crate.

use std::path::Path;

use crate::config::rules;

/// Prefix of every tap vmwarden creates.
pub const TAP_PREFIX: &str = rules::TAP_PREFIX;

/// IFNAMSIZ (16) minus the NUL.
pub const IFNAME_MAX: usize = rules::IFNAME_MAX;

/// `^[a-z][a-z0-9-]{0,31}$`: VM names, also used in paths and unit names.
pub fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= rules::VM_NAME_MAX
        && rules::VM_NAME_FIRST.contains(b[0])
        && b[1..].iter().all(|c| rules::VM_NAME_REST.contains(*c))
}

/// Credential names end up as file names in the tmpfs and in fw_cfg.
pub fn valid_credential_name(name: &str) -> bool {
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
pub fn valid_tap_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix(TAP_PREFIX) else {
        return false;
    };
    !rest.is_empty()
        && name.len() <= IFNAME_MAX
        && rest.bytes().all(|c| rules::TAP_REST.contains(c))
}

/// A Linux interface name that is safe to look up: 1..=15 bytes of
/// `[A-Za-z0-9_.-]`, not `.` or `..`.
pub fn valid_ifname(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= IFNAME_MAX
        && !rules::IFNAME_REFUSED.contains(&name)
        && name.bytes().all(|c| rules::IFNAME_CHARS.contains(c))
}

/// Parse `aa:bb:cc:dd:ee:ff` (hex, either case).
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
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

pub fn format_mac(mac: &[u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Why a guest MAC is unusable, if it is.
pub fn mac_problem(mac: &[u8; 6]) -> Option<&'static str> {
    if mac[0] & rules::MAC_GROUP_BIT != 0 {
        Some("is a multicast/broadcast address; a NIC needs a unicast MAC (the first octet's lowest bit must be 0)")
    } else if rules::MAC_REFUSE_ZERO && mac == &[0; 6] {
        Some("is all zeros")
    } else {
        None
    }
}

/// A stable, locally administered unicast MAC for a spec that gives none:
/// `02:` followed by 5 bytes of FNV-1a over "VM/TAP".
pub fn derived_mac(vm: &str, tap: &str) -> [u8; 6] {
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
pub fn host_side_mac(guest: &[u8; 6]) -> [u8; 6] {
    let mut m = *guest;
    // A guest MAC that already starts with 0xfe would equal the host side:
    // then 0xfa, as libvirt does.
    m[0] = if guest[0] == 0xfe { 0xfa } else { 0xfe };
    m
}

#[cfg(test)]
mod tests {
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
}
