//! The host paths and names a cloud-hypervisor or firecracker snapshot
//! will open on restore, checked against what the launcher would pass
//! now. Both hypervisors take their devices from the snapshot, not from
//! their command line: a disk, socket or tap named there is opened as
//! named, unchecked. A snapshot whose devices differ from the current
//! spec's would attach the guest's memory image to other files — state
//! corruption, not an error either hypervisor reports. The launcher
//! compares every device field one by one ([`compare`]), and refuses any
//! host path in the snapshot's configuration that the spec does not give
//! ([`stray_paths`]), so a field this code does not know cannot slip a
//! path through.

use std::collections::BTreeMap;
use std::fmt;

/// Paths a hypervisor names in its configuration by itself, not from
/// the spec: cloud-hypervisor's default entropy source.
pub const HYPERVISOR_DEFAULTS: &[&str] = &["/dev/urandom"];

/// One device field: its place in the snapshot's configuration
/// (`disks[0].path`) and its value, `None` when absent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub name: String,
    pub value: Option<String>,
}

impl Field {
    pub fn new(name: impl Into<String>, value: Option<impl Into<String>>) -> Field {
        Field {
            name: name.into(),
            value: value.map(Into::into),
        }
    }
}

/// One way the snapshot differs from the spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Difference {
    /// A field both know of, with different values (or present on one
    /// side only).
    Field {
        name: String,
        snapshot: Option<String>,
        now: Option<String>,
    },
    /// A host path in the snapshot's configuration that nothing in the
    /// spec gives, at this JSON pointer.
    Stray { pointer: String, path: String },
    /// A host path the spec gives, named once more than the spec names
    /// it: another device on the same file (a `pmem` or memory zone on
    /// the VM's own disk, a serial file over a credential).
    Repeated { pointer: String, path: String },
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |v: &Option<String>| match v {
            Some(v) => format!("{v:?}"),
            None => "nothing".to_string(),
        };
        match self {
            Difference::Field {
                name,
                snapshot,
                now,
            } => write!(
                f,
                "{name}: the snapshot has {}, the spec now gives {}",
                show(snapshot),
                show(now)
            ),
            Difference::Stray { pointer, path } => write!(
                f,
                "{pointer}: the snapshot names the host path {path:?}, which the spec does not give"
            ),
            Difference::Repeated { pointer, path } => write!(
                f,
                "{pointer}: the snapshot names the host path {path:?} once more than the spec gives it (a device the spec does not give)"
            ),
        }
    }
}

/// The snapshot's devices are not the spec's: the restore is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the snapshot's devices differ from the spec's (restoring would attach the guest to other files): {}", list(.0))]
pub struct Mismatch(pub Vec<Difference>);

fn list(d: &[Difference]) -> String {
    d.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Every field of `now` and of `snapshot`, compared by name: each must
/// be present on both sides with equal values. Order of the report:
/// `now`'s fields, then those only the snapshot has.
pub fn compare(snapshot: &[Field], now: &[Field]) -> Vec<Difference> {
    let mut out = Vec::new();
    let find = |fs: &[Field], name: &str| fs.iter().find(|f| f.name == name).cloned();
    for n in now {
        let s = find(snapshot, &n.name).and_then(|f| f.value);
        if s != n.value {
            out.push(Difference::Field {
                name: n.name.clone(),
                snapshot: s,
                now: n.value.clone(),
            });
        }
    }
    for s in snapshot {
        if s.value.is_some() && find(now, &s.name).is_none() {
            out.push(Difference::Field {
                name: s.name.clone(),
                snapshot: s.value.clone(),
                now: None,
            });
        }
    }
    out
}

/// Keys whose string value either hypervisor opens as a host path (or
/// resolves against its working directory, the VM's state directory,
/// when relative): such a value is checked even without a leading `/`.
pub const PATH_KEYS: &[&str] = &[
    "path",
    "file",
    "socket",
    "src",
    "kernel",
    "initramfs",
    "firmware",
    "igvm",
    "vhost_socket",
    "path_on_host",
    "uds_path",
    "kernel_image_path",
    "initrd_path",
    "backend_path",
    "log_path",
    "metrics_path",
];

/// Every host path in `v` (a string that is absolute, or any string
/// under one of [`PATH_KEYS`]) beyond what `allowed` gives: each allowed
/// path may occur as many times as it is counted there, so an allowed
/// file reused by a device the spec does not give is refused too. Each
/// with its JSON pointer (`/disks/0/path`).
pub fn stray_paths(v: &serde_json::Value, allowed: &BTreeMap<String, usize>) -> Vec<Difference> {
    let mut out = Vec::new();
    let mut left = allowed.clone();
    walk(v, String::new(), false, &mut left, &mut out);
    out
}

fn walk(
    v: &serde_json::Value,
    at: String,
    path_key: bool,
    left: &mut BTreeMap<String, usize>,
    out: &mut Vec<Difference>,
) {
    match v {
        serde_json::Value::String(s) if s.starts_with('/') || path_key => {
            let pointer = if at.is_empty() { "/".into() } else { at };
            match left.get_mut(s) {
                Some(n) if *n > 0 => *n -= 1,
                Some(_) => out.push(Difference::Repeated {
                    pointer,
                    path: s.clone(),
                }),
                None => out.push(Difference::Stray {
                    pointer,
                    path: s.clone(),
                }),
            }
        }
        serde_json::Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                walk(x, format!("{at}/{i}"), path_key, left, out);
            }
        }
        serde_json::Value::Object(o) => {
            for (k, x) in o {
                let is_path = PATH_KEYS.contains(&k.as_str());
                let k = k.replace('~', "~0").replace('/', "~1");
                walk(x, format!("{at}/{k}"), is_path, left, out);
            }
        }
        _ => {}
    }
}

/// [`compare`] and [`stray_paths`] together: `Ok` only when both find
/// nothing. The paths allowed are the values of `now` and
/// [`HYPERVISOR_DEFAULTS`].
pub fn check(
    raw: &serde_json::Value,
    snapshot: &[Field],
    now: &[Field],
    also_allowed: &[String],
) -> Result<(), Mismatch> {
    let mut allowed: BTreeMap<String, usize> = BTreeMap::new();
    let paths = now.iter().filter_map(|f| f.value.clone());
    let extra = HYPERVISOR_DEFAULTS.iter().map(|s| s.to_string());
    for p in paths.chain(extra).chain(also_allowed.iter().cloned()) {
        *allowed.entry(p).or_default() += 1;
    }
    let mut d = compare(snapshot, now);
    d.extend(stray_paths(raw, &allowed));
    if d.is_empty() {
        Ok(())
    } else {
        Err(Mismatch(d))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn f(n: &str, v: Option<&str>) -> Field {
        Field::new(n, v)
    }

    #[test]
    fn equal_fields_pass_and_each_difference_is_named() {
        let now = [f("disks[0].path", Some("/a")), f("payload.initramfs", None)];
        assert!(compare(&now, &now).is_empty());
        let snap = [
            f("disks[0].path", Some("/b")),
            f("payload.initramfs", Some("/i")),
            f("disks[1].path", Some("/c")),
        ];
        let d = compare(&snap, &now);
        let text = Mismatch(d.clone()).to_string();
        assert_eq!(d.len(), 3, "{text}");
        assert!(
            text.contains(r#"disks[0].path: the snapshot has "/b", the spec now gives "/a""#),
            "{text}"
        );
        assert!(
            text.contains(
                r#"payload.initramfs: the snapshot has "/i", the spec now gives nothing"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"disks[1].path: the snapshot has "/c", the spec now gives nothing"#),
            "{text}"
        );
        // A field the spec gives and the snapshot lacks is a difference too.
        let d = compare(&[], &now);
        assert_eq!(d.len(), 1);
    }

    #[test]
    fn a_path_in_a_field_nobody_knows_is_refused_by_its_pointer() {
        let raw = json!({
            "disks": [{ "path": "/a" }],
            "rng": { "src": "/dev/urandom" },
            "pmem": [{ "file": "/etc/shadow" }],
            "a/b": "/x",
            "serial": { "mode": "Tty", "file": null },
            "cmdline": "console=ttyS0 root=/dev/vda",
        });
        let now = [f("disks[0].path", Some("/a"))];
        let e = check(&raw, &now, &now, &[]).unwrap_err();
        assert_eq!(
            e.0,
            vec![
                Difference::Stray {
                    pointer: "/a~1b".into(),
                    path: "/x".into()
                },
                Difference::Stray {
                    pointer: "/pmem/0/file".into(),
                    path: "/etc/shadow".into()
                },
            ]
        );
        let ok = json!({ "disks": [{ "path": "/a" }], "rng": { "src": "/dev/urandom" } });
        check(&ok, &now, &now, &[]).unwrap();
        check(&json!({ "x": "/cred" }), &[], &[], &["/cred".into()]).unwrap();
    }
}
