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

use std::collections::BTreeSet;
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

/// Every string in `v` that is an absolute path and not in `allowed`,
/// with its JSON pointer (`/disks/0/path`).
pub fn stray_paths(v: &serde_json::Value, allowed: &BTreeSet<String>) -> Vec<Difference> {
    let mut out = Vec::new();
    walk(v, String::new(), allowed, &mut out);
    out
}

fn walk(v: &serde_json::Value, at: String, allowed: &BTreeSet<String>, out: &mut Vec<Difference>) {
    match v {
        serde_json::Value::String(s) if s.starts_with('/') && !allowed.contains(s) => {
            out.push(Difference::Stray {
                pointer: if at.is_empty() { "/".into() } else { at },
                path: s.clone(),
            });
        }
        serde_json::Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                walk(x, format!("{at}/{i}"), allowed, out);
            }
        }
        serde_json::Value::Object(o) => {
            for (k, x) in o {
                let k = k.replace('~', "~0").replace('/', "~1");
                walk(x, format!("{at}/{k}"), allowed, out);
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
    let mut allowed: BTreeSet<String> = now.iter().filter_map(|f| f.value.clone()).collect();
    allowed.extend(HYPERVISOR_DEFAULTS.iter().map(|s| s.to_string()));
    allowed.extend(also_allowed.iter().cloned());
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
