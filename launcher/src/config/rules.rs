//! The naming rules and limits shared with the NixOS module, from
//! `units/rules.toml`: `launcher/build.rs` turns the file into the
//! constants below at build time (nothing is parsed at start-up), and
//! `modules/lib.nix` builds its regexes and assertions from the same file.
//! A leaf: it imports nothing from the crate.

/// A set of ASCII bytes: one character class of `units/rules.toml`, e.g.
/// `a-z0-9-` (the inside of a regex bracket expression).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteClass {
    /// The class as written in `units/rules.toml`.
    pub pattern: &'static str,
    /// Bit `b` set: byte `b` is in the class.
    mask: u128,
}

impl ByteClass {
    pub const fn contains(self, b: u8) -> bool {
        b < 128 && (self.mask >> b) & 1 == 1
    }
}

include!(concat!(env!("OUT_DIR"), "/rules.rs"));

#[cfg(test)]
mod tests {
    use super::*;

    /// What a regex bracket expression with this body matches, by a second,
    /// independent reading of the syntax build.rs accepts.
    fn bracket(pattern: &str, b: u8) -> bool {
        let p = pattern.as_bytes();
        let mut i = 0;
        while i < p.len() {
            if i + 2 < p.len() && p[i + 1] == b'-' {
                if (p[i]..=p[i + 2]).contains(&b) {
                    return true;
                }
                i += 3;
            } else {
                if p[i] == b {
                    return true;
                }
                i += 1;
            }
        }
        false
    }

    #[test]
    fn classes_mean_what_the_regex_means() {
        for class in [
            VM_NAME_FIRST,
            VM_NAME_REST,
            CREDENTIAL_NAME_FIRST,
            CREDENTIAL_NAME_REST,
            TAP_REST,
            IFNAME_CHARS,
        ] {
            for b in 0..=255u8 {
                assert_eq!(
                    class.contains(b),
                    bracket(class.pattern, b),
                    "[{}] and byte {b:#04x}",
                    class.pattern
                );
            }
        }
    }

    #[test]
    fn patterns_are_built_from_the_pieces() {
        assert_eq!(
            VM_NAME_PATTERN,
            format!(
                "^[{}][{}]{{0,{}}}$",
                VM_NAME_FIRST.pattern,
                VM_NAME_REST.pattern,
                VM_NAME_MAX - 1
            )
        );
        assert_eq!(
            TAP_PATTERN,
            format!(
                "^{TAP_PREFIX}[{}]{{1,{}}}$",
                TAP_REST.pattern,
                IFNAME_MAX - TAP_PREFIX.len()
            )
        );
        assert!(FW_CFG_CREDENTIAL_PREFIX.len() < FW_CFG_NAME_MAX);
    }
}
