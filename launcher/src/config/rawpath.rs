//! Paths are bytes. File names a VM creates need not be UTF-8, and every
//! report that names one must name exactly that file.
//!
//! In JSON a path whose bytes are valid UTF-8 is a plain string (the common
//! case, unchanged). Any other path is an object carrying the exact bytes
//! in hex and a lossy rendering for people:
//!
//! ```json
//! {"bytes_hex": "2f72756e2f78ff", "lossy": "/run/x\ufffd"}
//! ```
//!
//! In text output such a path is shown with Rust's escaping (`"/run/x\xFF"`,
//! quotes included), which is also lossless; a UTF-8 path with control
//! characters in it is shown through [`crate::config::text::escape`]. A leaf
//! like the rest of `config`.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use serde::ser::{SerializeMap, SerializeSeq, Serializer};

use crate::config::text::escape;

/// A path for a human line: as is when UTF-8 (its control characters
/// escaped, [`escape`]), escaped and quoted otherwise.
pub fn show(p: &Path) -> String {
    show_os(p.as_os_str())
}

/// [`show`] for a bare name.
pub fn show_os(s: &OsStr) -> String {
    match s.to_str() {
        Some(t) => escape(t).into_owned(),
        None => format!("{s:?}"),
    }
}

/// Lower-case hex of `b`.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn ser_os<S: Serializer>(s: &OsStr, ser: S) -> Result<S::Ok, S::Error> {
    match s.to_str() {
        Some(t) => ser.serialize_str(t),
        None => {
            let mut m = ser.serialize_map(Some(2))?;
            m.serialize_entry("bytes_hex", &hex(s.as_bytes()))?;
            m.serialize_entry("lossy", &s.to_string_lossy())?;
            m.end()
        }
    }
}

/// A lossless path, for `#[serde(serialize_with = ...)]`.
pub fn path<S: Serializer>(p: &Path, ser: S) -> Result<S::Ok, S::Error> {
    ser_os(p.as_os_str(), ser)
}

struct Ser<'a>(&'a OsStr);

impl serde::Serialize for Ser<'_> {
    fn serialize<S: Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        ser_os(self.0, ser)
    }
}

/// A list of lossless paths.
pub fn paths<S: Serializer>(v: &[PathBuf], ser: S) -> Result<S::Ok, S::Error> {
    let mut seq = ser.serialize_seq(Some(v.len()))?;
    for p in v {
        seq.serialize_element(&Ser(p.as_os_str()))?;
    }
    seq.end()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt;

    #[derive(serde::Serialize)]
    struct R {
        #[serde(serialize_with = "path")]
        p: PathBuf,
        #[serde(serialize_with = "paths")]
        v: Vec<PathBuf>,
    }

    #[test]
    fn utf8_paths_stay_strings_and_others_keep_their_bytes() {
        let bad = PathBuf::from(OsString::from_vec(b"/run/x\xff".to_vec()));
        let r = R {
            p: "/run/ok".into(),
            v: vec![bad.clone(), "/a b".into()],
        };
        let j = serde_json::to_value(&r).unwrap();
        assert_eq!(j["p"], "/run/ok");
        assert_eq!(j["v"][0]["bytes_hex"], "2f72756e2f78ff");
        assert_eq!(j["v"][0]["lossy"], "/run/x\u{fffd}");
        assert_eq!(j["v"][1], "/a b");
        assert_eq!(show(&bad), "\"/run/x\\xFF\"");
        assert_eq!(show(Path::new("/run/ok")), "/run/ok");
    }
}
