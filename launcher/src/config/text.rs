//! The one escape for text a person reads. Root's tools print values a VM
//! controls — its hypervisor's QMP and API answers, names of files it made,
//! error text that quotes them — and a control character among them (ESC,
//! CR, BEL, a C1 CSI) would be a command to the operator's terminal: it can
//! rewrite a row, hide a line or retitle the window. Every text output
//! (status cells and notes, reap and purge plans and reports, verify-clean
//! lines, wait-ready and stop messages, error reports) goes through
//! [`escape`]. JSON output is escaped by the serialiser, which leaves DEL
//! and the C1 controls raw; [`json`] escapes those too.
//!
//! Each control character (Unicode category Cc: U+0000–U+001F, U+007F,
//! U+0080–U+009F) becomes `\xNN` (below U+0080) or `\u{NN}` (C1). Nothing
//! else changes, so text without control characters is shown as is and the
//! escape is idempotent: escaping escaped text changes nothing, and a value
//! may pass through it at more than one layer. A leaf like the rest of
//! `config`.

use std::borrow::Cow;
use std::fmt::Write;

/// `s` with every control character escaped (see the module docs).
pub fn escape(s: &str) -> Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if !c.is_control() {
            out.push(c);
        } else if (c as u32) < 0x80 {
            let _ = write!(out, "\\x{:02x}", c as u32);
        } else {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
    }
    Cow::Owned(out)
}

/// Serialised JSON with DEL and the C1 controls (which serde_json writes
/// raw) written as `\u00NN`. They can only stand inside JSON strings, so
/// the document means the same; C0 controls are escaped already.
pub fn json(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() && (c as u32) >= 0x7f {
            let _ = write!(out, "\\u{:04x}", c as u32);
        } else {
            out.push(c);
        }
    }
    out
}

/// [`escape`], keeping the line breaks of a text vmwarden composed itself
/// (a report of several lines). Only `\n` is kept; a CR is still escaped.
pub fn escape_lines(s: &str) -> String {
    s.split('\n').map(escape).collect::<Vec<_>>().join("\n")
}

/// A value a VM wrote, cut to `max` characters (`…` marks the cut) and
/// escaped: what an error message or a status cell quotes of it.
pub fn excerpt(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        None => escape(s).into_owned(),
        Some((i, _)) => format!("{}…", escape(&s[..i])),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_control_character_is_escaped_and_nothing_else() {
        assert_eq!(escape("web-1 running"), "web-1 running");
        assert!(matches!(escape("plain"), Cow::Borrowed(_)));
        assert_eq!(escape("a\x1b[2Jb"), "a\\x1b[2Jb");
        assert_eq!(escape("run\rstopped\x07"), "run\\x0dstopped\\x07");
        assert_eq!(escape("x\ny\tz\x7f"), "x\\x0ay\\x09z\\x7f");
        assert_eq!(escape("\u{9b}31m"), "\\u{9b}31m");
        assert_eq!(escape("é ü ✓"), "é ü ✓");
        for c in (0u32..0x110000).filter_map(char::from_u32) {
            let e = escape(c.encode_utf8(&mut [0; 4])).into_owned();
            assert!(!e.chars().any(char::is_control), "{c:?} -> {e:?}");
            assert_eq!(escape(&e), e, "not idempotent for {c:?}");
        }
    }

    #[test]
    fn json_means_the_same_without_raw_controls() {
        let v = serde_json::json!({"s": "a\u{1b}b\u{7f}c\u{9b}d\r"});
        let j = json(&serde_json::to_string(&v).unwrap());
        assert!(!j.chars().any(char::is_control), "{j}");
        assert_eq!(serde_json::from_str::<serde_json::Value>(&j).unwrap(), v);
    }

    #[test]
    fn lines_keep_only_their_newlines() {
        assert_eq!(escape_lines("a\x1b\nb\r\n"), "a\\x1b\nb\\x0d\n");
    }

    #[test]
    fn excerpts_are_cut_and_escaped() {
        assert_eq!(excerpt("abc", 5), "abc");
        assert_eq!(excerpt("abcdef", 3), "abc…");
        assert_eq!(excerpt("\x1b\x1b\x1b\x1b", 2), "\\x1b\\x1b…");
    }
}
