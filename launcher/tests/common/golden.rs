//! Golden files for the real binaries' output (`launcher/tests/golden/`).
//!
//! A golden is the exact expected text with placeholders for what changes
//! from run to run. Exact ones are substituted before comparing:
//! `{dir}` (the test's temp dir), `{uid:N}` (`uid(N)`), and any the test
//! sets (`{pid:web}`). Pattern ones match a shape: `{uptime}` (a table
//! cell like `4s` or `1m05s`; in JSON a number of seconds under an hour),
//! `{started}` (in JSON, a Unix time within the test's run) and
//! `{instance_id}` (32 hex digits).
//!
//! Tables are compared cell by cell, and every row's cells must start at
//! the header's columns (alignment). Other lines are compared exactly.
//! JSON is compared as values, objects key by key.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

pub struct Golden {
    vars: BTreeMap<String, String>,
    /// The test's start, for `{started}`.
    t0: u64,
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

impl Golden {
    pub fn new(env: &super::Env) -> Golden {
        let mut g = Golden {
            vars: BTreeMap::new(),
            t0: now(),
        };
        g.set("{dir}", env.dir.path().display());
        g
    }

    pub fn set(&mut self, key: &str, value: impl std::fmt::Display) -> &mut Self {
        self.vars.insert(key.to_string(), value.to_string());
        self
    }

    /// The golden `name`'s text with the exact placeholders substituted.
    pub fn text(&self, name: &str) -> String {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/golden")
            .join(name);
        let mut t = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("golden {}: {e}", path.display()));
        for (k, v) in &self.vars {
            t = t.replace(k, v);
        }
        // {uid:N}
        while let Some(a) = t.find("{uid:") {
            let b = a + t[a..].find('}').expect("unclosed {uid:");
            let n: u32 = t[a + 5..b].parse().expect("{uid:N}");
            t.replace_range(a..=b, &super::uid(n).to_string());
        }
        t
    }

    fn cell_matches(&self, want: &str, got: &str) -> bool {
        match want {
            "{uptime}" => {
                let digits = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit());
                match got.strip_suffix('s') {
                    Some(s) if digits(s) => true,
                    Some(s) => s
                        .split_once('m')
                        .is_some_and(|(m, s)| digits(m) && s.len() == 2 && digits(s)),
                    None => false,
                }
            }
            _ => want == got,
        }
    }

    /// Compare `actual` (stdout of a table command) with golden `name`.
    pub fn assert_table(&self, name: &str, actual: &str) {
        let want = self.text(name);
        let ctx = || format!("golden {name}:\n--- want\n{want}--- got\n{actual}---");
        let (want_table, want_rest) = split_table(&want);
        let (got_table, got_rest) = split_table(actual);
        assert_eq!(
            want_table.len(),
            got_table.len(),
            "table rows differ; {}",
            ctx()
        );
        // Column starts, from the header.
        let starts = |line: &str| -> Vec<usize> {
            let mut v = Vec::new();
            let mut prev = ' ';
            for (i, c) in line.char_indices() {
                if c != ' ' && prev == ' ' {
                    v.push(i);
                }
                prev = c;
            }
            v
        };
        let header = got_table.first().map(|h| starts(h)).unwrap_or_default();
        for (w, g) in want_table.iter().zip(&got_table) {
            let wc: Vec<&str> = w.split_whitespace().collect();
            let gc: Vec<&str> = g.split_whitespace().collect();
            assert_eq!(wc.len(), gc.len(), "cells of {g:?}; {}", ctx());
            for (a, b) in wc.iter().zip(&gc) {
                assert!(
                    self.cell_matches(a, b),
                    "cell {b:?} is not {a:?}; {}",
                    ctx()
                );
            }
            assert_eq!(starts(g), header, "row {g:?} is not aligned; {}", ctx());
            assert_eq!(g.trim_end(), *g, "trailing blanks in {g:?}; {}", ctx());
        }
        assert_eq!(want_rest, got_rest, "{}", ctx());
    }

    /// Compare `actual` (Prometheus' text format) with golden `name`, line
    /// by line. A sample whose golden value is `{n}` may have any
    /// non-negative number; one whose value is `{n?}` is a figure not every
    /// host's kernel offers for the cgroup (memory and I/O when those
    /// controllers are not enabled for cgroup v2 there): absent, or any
    /// non-negative number.
    pub fn assert_prom(&self, name: &str, actual: &str) {
        let want = self.text(name);
        let ctx = || format!("golden {name}:\n--- want\n{want}--- got\n{actual}---");
        let mut got = actual.lines().peekable();
        for w in want.lines() {
            let (series, value) = w.rsplit_once(' ').unwrap_or((w, ""));
            let number = |g: &str| {
                g.strip_prefix(series)
                    .and_then(|v| v.strip_prefix(' '))
                    .and_then(|v| v.parse::<f64>().ok())
                    .is_some_and(|v| v >= 0.0)
            };
            match value {
                "{n?}" if w.starts_with('#') => panic!("{{n?}} in a comment; {}", ctx()),
                "{n?}" => {
                    if got
                        .peek()
                        .is_some_and(|g| g.starts_with(&format!("{series} ")))
                    {
                        let g = got.next().unwrap_or_default();
                        assert!(number(g), "{g:?} is not {w:?}; {}", ctx());
                    }
                }
                "{n}" => {
                    let g = got.next().unwrap_or_default();
                    assert!(number(g), "{g:?} is not {w:?}; {}", ctx());
                }
                _ => assert_eq!(got.next(), Some(w), "{}", ctx()),
            }
        }
        assert_eq!(got.next(), None, "lines beyond the golden; {}", ctx());
    }

    /// Compare `actual` (stdout of a `--json` command) with golden `name`.
    pub fn assert_json(&self, name: &str, actual: &str) {
        let want_text = self.text(name);
        let want: Value = serde_json::from_str(&want_text).unwrap_or_else(|e| {
            panic!("golden {name} is not JSON after substitution ({e}):\n{want_text}")
        });
        let got: Value = serde_json::from_str(actual)
            .unwrap_or_else(|e| panic!("output is not JSON ({e}):\n{actual}"));
        if let Err(e) = self.value_matches(&want, &got, "$") {
            panic!("golden {name}: {e}\n--- want\n{want_text}--- got\n{actual}---");
        }
    }

    fn value_matches(&self, want: &Value, got: &Value, at: &str) -> Result<(), String> {
        match (want, got) {
            (Value::String(p), Value::Number(n)) if p == "{uptime}" => match n.as_u64() {
                Some(s) if s < 3600 => Ok(()),
                _ => Err(format!("{at}: {n} is not an uptime")),
            },
            (Value::String(p), Value::Number(n)) if p == "{started}" => match n.as_u64() {
                Some(t) if t + 5 >= self.t0 && t <= now() => Ok(()),
                _ => Err(format!("{at}: {n} is not a start time within the test")),
            },
            (Value::String(p), Value::String(s)) if p == "{instance_id}" => {
                if s.len() == 32 && s.chars().all(|c| c.is_ascii_hexdigit()) {
                    Ok(())
                } else {
                    Err(format!("{at}: {s:?} is not an instance id"))
                }
            }
            (Value::Object(w), Value::Object(g)) => {
                let wk: Vec<&String> = w.keys().collect();
                let gk: Vec<&String> = g.keys().collect();
                if wk != gk {
                    return Err(format!("{at}: keys {gk:?}, want {wk:?}"));
                }
                for (k, v) in w {
                    self.value_matches(v, &g[k], &format!("{at}.{k}"))?;
                }
                Ok(())
            }
            (Value::Array(w), Value::Array(g)) => {
                if w.len() != g.len() {
                    return Err(format!("{at}: {} elements, want {}", g.len(), w.len()));
                }
                for (i, (a, b)) in w.iter().zip(g).enumerate() {
                    self.value_matches(a, b, &format!("{at}[{i}]"))?;
                }
                Ok(())
            }
            (a, b) if a == b => Ok(()),
            (a, b) => Err(format!("{at}: {b}, want {a}")),
        }
    }
}

/// The table (header and rows, up to the first blank line, when the text
/// starts with the header) and the rest.
fn split_table(text: &str) -> (Vec<&str>, String) {
    if !text.starts_with("NAME ") {
        return (Vec::new(), text.to_string());
    }
    let mut table = Vec::new();
    let mut lines = text.split_inclusive('\n');
    let mut rest = String::new();
    for l in lines.by_ref() {
        if l.trim().is_empty() {
            rest.push_str(l);
            break;
        }
        table.push(l.trim_end_matches('\n'));
    }
    for l in lines {
        rest.push_str(l);
    }
    (table, rest)
}
