//! Pure rendering of status records: the table, the `--all` notes and
//! JSON. No clock, no file system: everything shown is in the records.
//!
//! The table follows `machinectl list`/`systemctl list-units`: a header,
//! columns as wide as their widest cell and two spaces apart, `-` for
//! what is unknown or does not apply, no trailing blanks, no colour, and
//! an explicit sentence instead of an empty table.

use std::path::Path;

use super::{Registration, State, VmStatus};
use crate::config::rawpath::show;
use crate::config::text::{self, escape};

/// The columns, in order.
pub const COLUMNS: [&str; 8] = [
    "NAME",
    "STATE",
    "PID",
    "PRINCIPAL",
    "UPTIME",
    "SPEC",
    "CONTROL",
    "BALLOON",
];

/// What the table says when there is no VM to show.
pub fn nothing(config_dir: &Path, runtime_root: &Path, state_root: Option<&Path>) -> String {
    match state_root {
        None => format!(
            "No VM is configured in {} and no VM has a runtime dir in {}.\n",
            show(config_dir),
            show(runtime_root)
        ),
        Some(s) => format!(
            "No VM is configured in {}, no VM has a runtime dir in {}, and none left state or a principal registration in {}.\n",
            show(config_dir),
            show(runtime_root),
            show(s)
        ),
    }
}

/// `42s`, `3m07s`, `2h05m`, `3d04h`.
pub fn uptime(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    if secs < 60 {
        format!("{s}s")
    } else if secs < 3600 {
        format!("{m}m{s:02}s")
    } else if secs < 86400 {
        format!("{}h{m:02}m", secs / 3600)
    } else {
        format!("{d}d{h:02}h")
    }
}

/// The cells of one record, in [`COLUMNS`] order, each escaped
/// ([`escape`]): the CONTROL cell is what the VM's hypervisor answered.
pub fn cells(r: &VmStatus) -> [String; 8] {
    raw_cells(r).map(|c| escape(&c).into_owned())
}

fn raw_cells(r: &VmStatus) -> [String; 8] {
    let dash = || "-".to_string();
    let running = r.state == State::Running;
    [
        r.name.clone(),
        match &r.hibernated {
            Some(h) if r.state == State::Hibernated => format!(
                "hibernated:{}M/{}",
                h.bytes.div_ceil(1024 * 1024),
                uptime(h.age_seconds)
            ),
            _ => r.state.as_str().to_string(),
        },
        r.pid.map(|p| p.to_string()).unwrap_or_else(dash),
        r.principal
            .as_ref()
            .map(|p| p.user.clone().unwrap_or_else(|| p.uid.to_string()))
            .unwrap_or_else(dash),
        r.uptime_seconds.map(uptime).unwrap_or_else(dash),
        r.spec.as_str().to_string(),
        match (&r.control, running) {
            (Some(c), true) => c.to_lowercase(),
            (None, true) => "no-answer".to_string(),
            (_, false) => dash(),
        },
        r.balloon_mib
            .filter(|_| running)
            .map(|m| format!("{m}M"))
            .unwrap_or_else(dash),
    ]
}

/// The table: a header and one aligned row per record, or [`nothing`]'s
/// sentence (passed in as `empty`) when there are no records.
pub fn table(records: &[VmStatus], empty: &str) -> String {
    if records.is_empty() {
        return empty.to_string();
    }
    let rows: Vec<[String; 8]> = std::iter::once(COLUMNS.map(str::to_string))
        .chain(records.iter().map(cells))
        .collect();
    let mut widths = [0usize; 8];
    for row in &rows {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    for row in &rows {
        let mut line = String::new();
        for (i, c) in row.iter().enumerate() {
            if i + 1 < row.len() {
                line.push_str(&format!("{c:<w$}  ", w = widths[i]));
            } else {
                line.push_str(c);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// With `--all`: for each VM that is no longer configured, what it left
/// and what `reap` and `purge` would do. Empty when there is none. The
/// values in it are escaped ([`escape`]) where they are put in, so none
/// can break a line in two, and each line again as a whole.
pub fn notes(records: &[VmStatus]) -> String {
    notes_raw(records)
        .split_inclusive('\n')
        .map(|l| match l.strip_suffix('\n') {
            Some(l) => format!("{}\n", escape(l)),
            None => escape(l).into_owned(),
        })
        .collect()
}

fn notes_raw(records: &[VmStatus]) -> String {
    let mut out = String::new();
    for r in records.iter().filter(|r| !r.configured) {
        let Some(l) = &r.leftovers else { continue };
        out.push('\n');
        let mut head = format!("{}: not configured", r.name);
        match &l.state_dir {
            Some(sd) => head.push_str(&format!(
                "; state dir {} holds {} {}",
                show(&sd.path),
                sd.entries,
                if sd.entries == 1 { "entry" } else { "entries" }
            )),
            None => head.push_str("; no state dir"),
        }
        if let Some(p) = &r.principal {
            let who = match &p.user {
                Some(u) => format!("{u} (uid {})", p.uid),
                None => format!("uid {}", p.uid),
            };
            head.push_str(&format!("; principal {who}"));
            head.push_str(match p.registration {
                Some(Registration::Retired) => " retired",
                Some(Registration::Active) => " still registered",
                None => "",
            });
        }
        out.push_str(&head);
        out.push('\n');
        if l.reap.is_empty() {
            out.push_str("  reap:  nothing to do (reap never deletes in a state dir)\n");
        }
        for i in &l.reap {
            let verb = match i.action.as_str() {
                "keep" => "keeps",
                "kill" => "kills (with --apply --kill)",
                _ => "deletes (with --apply)",
            };
            out.push_str(&format!(
                "  reap:  {verb} {} {} ({})\n",
                i.kind,
                show(&i.path),
                escape(&i.reason)
            ));
        }
        let p = &l.purge;
        match &p.refused {
            Some(why) => out.push_str(&format!(
                "  purge: `{}` refuses: {}\n",
                p.command,
                escape(why)
            )),
            None => {
                let mut line = if p.delete.is_empty() {
                    format!("  purge: `{}` would delete nothing", p.command)
                } else {
                    let names: Vec<String> = p
                        .delete
                        .iter()
                        .take(5)
                        .map(|d| {
                            d.file_name()
                                .map(|n| show(Path::new(n)))
                                .unwrap_or_else(|| show(d))
                        })
                        .collect();
                    format!(
                        "  purge: `{}` would delete {} {} ({}{})",
                        p.command,
                        p.delete.len(),
                        if p.delete.len() == 1 {
                            "entry"
                        } else {
                            "entries"
                        },
                        names.join(", "),
                        if p.delete.len() > 5 { ", …" } else { "" }
                    )
                };
                let retired = r.principal.as_ref().and_then(|p| p.registration)
                    == Some(Registration::Retired);
                match (p.retire_uid, retired) {
                    (Some(uid), true) => line.push_str(&format!("; uid {uid} is already retired")),
                    (Some(uid), false) => line.push_str(&format!(" and retire uid {uid}")),
                    (None, _) => {}
                }
                if let Some(r) = p.retire_range {
                    line.push_str(&format!(
                        "; retire its id range {}..{}",
                        r.base,
                        u64::from(r.base) + u64::from(r.count)
                    ));
                }
                out.push_str(&line);
                out.push('\n');
            }
        }
    }
    out
}

/// The `--json` output: a list of records, pretty-printed, one trailing
/// newline; `[]` when there are none.
pub fn json(records: &[VmStatus]) -> String {
    let mut s = serde_json::to_string_pretty(records)
        .map(|s| text::json(&s))
        .unwrap_or_else(|e| format!("{{\"error\":\"cannot serialise status: {e}\"}}"));
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    //! Goldens of the pure renderer. The root suite `launcher/tests/status.rs`
    //! checks the real binary's output for real VMs against the goldens in
    //! `launcher/tests/golden/`.
    use std::path::PathBuf;

    use super::super::*;
    use super::*;

    fn rec(name: &str, state: State, spec: SpecState) -> VmStatus {
        VmStatus {
            name: name.into(),
            state,
            liveness: "dead".into(),
            pid: None,
            principal: Some(PrincipalInfo {
                uid: 61000,
                gid: Some(61000),
                user: Some(format!("vm-{name}")),
                registration: Some(Registration::Active),
            }),
            started_unix: None,
            uptime_seconds: None,
            spec,
            spec_path: PathBuf::from(format!("/etc/vmwarden/vms/{name}.json")),
            configured: true,
            launched_spec: None,
            hypervisor: Some(HypervisorKind::Qemu),
            control: None,
            balloon_mib: None,
            instance_id: None,
            leftovers: None,
            hibernated: None,
        }
    }

    fn running(name: &str, pid: u32, up: u64, spec: SpecState) -> VmStatus {
        VmStatus {
            liveness: format!("live: lease /run/vmwarden/{name}/instance.lock is held"),
            pid: Some(pid),
            started_unix: Some(1_700_000_000),
            uptime_seconds: Some(up),
            control: Some("running".into()),
            launched_spec: Some(PathBuf::from(format!(
                "/run/vmwarden/{name}/launched-spec.json"
            ))),
            instance_id: Some("0123456789abcdef0123456789abcdef".into()),
            ..rec(name, State::Running, spec)
        }
    }

    #[test]
    fn nothing_configured_is_a_sentence_not_an_empty_table() {
        let empty = nothing(
            Path::new("/etc/vmwarden/vms"),
            Path::new("/run/vmwarden"),
            None,
        );
        assert_eq!(
            table(&[], &empty),
            "No VM is configured in /etc/vmwarden/vms and no VM has a runtime dir in /run/vmwarden.\n"
        );
        assert_eq!(json(&[]), "[]\n");
        assert_eq!(notes(&[]), "");
    }

    #[test]
    fn table_golden() {
        let mut chapi = running("api", 7, 3 * 86400 + 4 * 3600 + 5, SpecState::Current);
        chapi.control = Some("Running".into());
        chapi.principal.as_mut().unwrap().user = None;
        chapi.principal.as_mut().unwrap().uid = 61002;
        let mut hung = rec("hung", State::Ambiguous, SpecState::Unknown);
        hung.pid = Some(4242);
        let mut web_ballooned = running("web", 12345, 192, SpecState::Outdated);
        web_ballooned.balloon_mib = Some(128);
        let recs = vec![
            chapi,
            rec("db", State::Stopped, SpecState::Configured),
            web_ballooned,
            hung,
            running("cache", 99, 5, SpecState::Current),
        ];
        let want = "\
NAME   STATE      PID    PRINCIPAL  UPTIME  SPEC        CONTROL  BALLOON
api    running    7      61002      3d04h   current     running  -
db     stopped    -      vm-db      -       configured  -        -
web    running    12345  vm-web     3m12s   outdated    running  128M
hung   ambiguous  4242   vm-hung    -       unknown     -        -
cache  running    99     vm-cache   5s      current     running  -
";
        assert_eq!(table(&recs, "unused"), want);
    }

    #[test]
    fn a_running_vm_whose_socket_does_not_answer_says_so() {
        let mut r = running("web", 1, 1, SpecState::Current);
        r.control = None;
        assert_eq!(cells(&r)[6], "no-answer");
    }

    #[test]
    fn uptimes() {
        assert_eq!(uptime(0), "0s");
        assert_eq!(uptime(59), "59s");
        assert_eq!(uptime(60), "1m00s");
        assert_eq!(uptime(3599), "59m59s");
        assert_eq!(uptime(3600), "1h00m");
        assert_eq!(uptime(86399), "23h59m");
        assert_eq!(uptime(86400), "1d00h");
    }

    #[test]
    fn retired_vm_notes_golden() {
        let mut old = rec("old", State::Retired, SpecState::None);
        old.configured = false;
        old.hypervisor = None;
        old.principal = Some(PrincipalInfo {
            uid: 61005,
            gid: None,
            user: None,
            registration: Some(Registration::Retired),
        });
        old.leftovers = Some(Leftovers {
            state_dir: Some(StateDirInfo {
                path: "/var/lib/vmwarden/old".into(),
                entries: 2,
            }),
            reap: vec![],
            purge: PurgeInfo {
                command: "vmwarden purge old".into(),
                delete: vec![
                    "/var/lib/vmwarden/old/disk.img".into(),
                    "/var/lib/vmwarden/old/identity".into(),
                ],
                retire_uid: Some(61005),
                retire_range: None,
                refused: None,
                share_sources: Vec::new(),
            },
        });
        let mut gone = rec("gone", State::Stopped, SpecState::None);
        gone.configured = false;
        gone.leftovers = Some(Leftovers {
            state_dir: None,
            reap: vec![ReapItem {
                action: "delete".into(),
                kind: "unconfigured-runtime-dir".into(),
                path: "/run/vmwarden/gone".into(),
                reason: "VM is no longer configured and has no live instance".into(),
            }],
            purge: PurgeInfo {
                command: "vmwarden purge gone".into(),
                delete: vec![],
                retire_uid: None,
                retire_range: None,
                refused: Some("/var/lib/vmwarden/gone: open: ENOENT".into()),
                share_sources: Vec::new(),
            },
        });
        let recs = vec![gone, old];
        assert_eq!(
            table(&recs, ""),
            "\
NAME  STATE    PID  PRINCIPAL  UPTIME  SPEC  CONTROL  BALLOON
gone  stopped  -    vm-gone    -       none  -        -
old   retired  -    61005      -       none  -        -
"
        );
        assert_eq!(
            notes(&recs),
            "
gone: not configured; no state dir; principal vm-gone (uid 61000) still registered
  reap:  deletes (with --apply) unconfigured-runtime-dir /run/vmwarden/gone (VM is no longer configured and has no live instance)
  purge: `vmwarden purge gone` refuses: /var/lib/vmwarden/gone: open: ENOENT

old: not configured; state dir /var/lib/vmwarden/old holds 2 entries; principal uid 61005 retired
  reap:  nothing to do (reap never deletes in a state dir)
  purge: `vmwarden purge old` would delete 2 entries (disk.img, identity); uid 61005 is already retired
"
        );
    }

    #[test]
    fn json_golden_has_every_field_in_order() {
        let r = running("web", 12345, 192, SpecState::Outdated);
        assert_eq!(
            json(&[r]),
            r#"[
  {
    "name": "web",
    "state": "running",
    "liveness": "live: lease /run/vmwarden/web/instance.lock is held",
    "pid": 12345,
    "principal": {
      "uid": 61000,
      "gid": 61000,
      "user": "vm-web",
      "registration": "active"
    },
    "started_unix": 1700000000,
    "uptime_seconds": 192,
    "spec": "outdated",
    "spec_path": "/etc/vmwarden/vms/web.json",
    "configured": true,
    "launched_spec": "/run/vmwarden/web/launched-spec.json",
    "hypervisor": "qemu",
    "control": "running",
    "balloon_mib": null,
    "instance_id": "0123456789abcdef0123456789abcdef",
    "leftovers": null
  }
]
"#
        );
        let back: Vec<VmStatus> =
            serde_json::from_str(&json(&[rec("db", State::Stopped, SpecState::Configured)]))
                .unwrap();
        assert_eq!(back, vec![rec("db", State::Stopped, SpecState::Configured)]);
    }

    #[test]
    fn a_state_entry_that_is_not_utf8_is_named_exactly() {
        use std::os::unix::ffi::OsStrExt;
        let odd = PathBuf::from(std::ffi::OsStr::from_bytes(b"/var/lib/vmwarden/old/x\xff"));
        let mut old = rec("old", State::Retired, SpecState::None);
        old.configured = false;
        old.leftovers = Some(Leftovers {
            state_dir: None,
            reap: vec![],
            purge: PurgeInfo {
                command: "vmwarden purge old".into(),
                delete: vec![odd],
                retire_uid: None,
                retire_range: None,
                refused: None,
                share_sources: Vec::new(),
            },
        });
        let j = json(std::slice::from_ref(&old));
        assert!(
            j.contains("\"bytes_hex\": \"2f7661722f6c69622f766d77617264656e2f6f6c642f78ff\""),
            "{j}"
        );
        assert!(notes(&[old]).contains("(\"x\\xFF\")"));
    }
}
