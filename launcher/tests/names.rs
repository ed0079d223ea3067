//! Names are parsed where they enter. A bad VM name on the command line of
//! any binary is refused by clap's value parser, before a root is looked at;
//! a bad credential, tap, bridge or MAC name in a spec is refused while the
//! spec is parsed, by every binary that reads one. Each refusal names the
//! argument or field and the rule, exits with the status that binary has
//! always given a bad name, and creates nothing under the roots.
//!
//! No root needed: every refusal here comes before anything that needs it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::{json, Value};

const LAUNCH: &str = env!("CARGO_BIN_EXE_vmwarden-launch");
const CLEANUP: &str = env!("CARGO_BIN_EXE_vmwarden-cleanup");
const VMWARDEN: &str = env!("CARGO_BIN_EXE_vmwarden");

/// `EX_CONFIG`: vmwarden-launch's status for a refused configuration.
const EX_CONFIG: i32 = 78;

/// Private roots: the config dir exists, the runtime and state roots do not
/// (whatever a binary created would show in [`Roots::listing`]).
struct Roots {
    dir: tempfile::TempDir,
}

impl Roots {
    fn new() -> Roots {
        let dir = tempfile::Builder::new()
            .prefix("vmwarden-names.")
            .tempdir()
            .unwrap();
        std::fs::create_dir(dir.path().join("config")).unwrap();
        Roots { dir }
    }

    fn config(&self) -> PathBuf {
        self.dir.path().join("config")
    }

    /// `PROG --config-dir … --runtime-root … --state-root … ARGS…`.
    fn run(&self, prog: &str, args: &[&str]) -> Output {
        Command::new(prog)
            .arg("--config-dir")
            .arg(self.config())
            .arg("--runtime-root")
            .arg(self.dir.path().join("run"))
            .arg("--state-root")
            .arg(self.dir.path().join("state"))
            .args(args)
            .env_remove("VMWARDEN_CONFIG_DIR")
            .env_remove("VMWARDEN_RUNTIME_ROOT")
            .env_remove("VMWARDEN_STATE_ROOT")
            .env_remove("VMWARDEN_FAULT_AFTER")
            .env_remove("CREDENTIALS_DIRECTORY")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// Every path under the temp dir, with its size for files.
    fn listing(&self) -> Vec<(PathBuf, u64)> {
        fn walk(d: &Path, out: &mut Vec<(PathBuf, u64)>) {
            for e in std::fs::read_dir(d).unwrap().flatten() {
                let md = std::fs::symlink_metadata(e.path()).unwrap();
                out.push((e.path(), if md.is_file() { md.len() } else { 0 }));
                if md.is_dir() {
                    walk(&e.path(), out);
                }
            }
        }
        let mut out = Vec::new();
        walk(self.dir.path(), &mut out);
        out.sort();
        out
    }
}

fn prog_name(prog: &str) -> &str {
    Path::new(prog).file_name().unwrap().to_str().unwrap()
}

/// Run `prog args` and check it was refused with `code`, a message that
/// starts like every error of that binary (the launcher's names the launch
/// `step`) and contains each of `expect`, and nothing created or changed
/// under the roots.
fn refused(
    roots: &Roots,
    (prog, args): (&str, &[&str]),
    code: i32,
    step: &str,
    expect: &[&str],
) -> Vec<String> {
    let before = roots.listing();
    let out = roots.run(prog, args);
    let after = roots.listing();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let mut why = Vec::new();
    if out.status.code() != Some(code) {
        why.push(format!("expected exit {code}, got {}", out.status));
    }
    let prefix = if prog == LAUNCH {
        format!("vmwarden-launch: error at step {step:?}: ")
    } else {
        format!("{}: error: ", prog_name(prog))
    };
    if !err.starts_with(&prefix) {
        why.push(format!("message does not start with {prefix:?}"));
    }
    for e in expect {
        if !err.contains(e) {
            why.push(format!("message lacks {e:?}"));
        }
    }
    if !out.stdout.is_empty() {
        why.push(format!(
            "printed to stdout: {}",
            String::from_utf8_lossy(&out.stdout)
        ));
    }
    if before != after {
        why.push(format!(
            "the roots changed:\nbefore={before:#?}\nafter={after:#?}"
        ));
    }
    if why.is_empty() {
        Vec::new()
    } else {
        vec![format!(
            "{} {args:?}: {}\n  stderr: {err}",
            prog_name(prog),
            why.join("; ")
        )]
    }
}

const VM_RULE: &str = "^[a-z][a-z0-9-]{0,31}$";

#[test]
fn a_bad_vm_name_is_refused_at_parse_time_by_every_binary_that_takes_one() {
    // (program, arguments with NAME for the name, the argument as clap
    // names it, the exit status of a bad name: 78 for the launcher, whose
    // unit does not retry it, 1 for the rest, as before).
    let invocations: &[(&str, &[&str], &str, i32)] = &[
        (LAUNCH, &["NAME"], "[NAME]", EX_CONFIG),
        (
            LAUNCH,
            &["NAME", "--probe", "--", "/bin/true"],
            "[NAME]",
            EX_CONFIG,
        ),
        (CLEANUP, &["NAME"], "<NAME>", 1),
        (VMWARDEN, &["status", "NAME"], "[NAME]...", 1),
        (VMWARDEN, &["status", "NAME", "--json"], "[NAME]...", 1),
        (
            VMWARDEN,
            &["status", "web", "NAME", "--all"],
            "[NAME]...",
            1,
        ),
        (
            VMWARDEN,
            &["wait-ready", "NAME", "--timeout", "1"],
            "<NAME>",
            1,
        ),
        (VMWARDEN, &["stop", "NAME", "--timeout", "1"], "<NAME>", 1),
        (VMWARDEN, &["purge", "NAME"], "<NAME>", 1),
        (VMWARDEN, &["purge", "NAME", "--keep-identity"], "<NAME>", 1),
        (VMWARDEN, &["verify-clean", "NAME"], "[NAME]...", 1),
        (VMWARDEN, &["verify-clean", "web", "NAME"], "[NAME]...", 1),
        (
            VMWARDEN,
            &["render-unit", "--dropin", "NAME"],
            "--dropin <NAME>",
            1,
        ),
    ];
    let too_long = "a".repeat(33);
    let bad = [
        "a/b", "..", ".", "Web", "1web", "a_b", "", "web\n", &too_long,
    ];
    let roots = Roots::new();
    // A spec for "web" exists: a refusal is not for want of one.
    std::fs::write(roots.config().join("web.json"), b"{}").unwrap();
    let mut failures = Vec::new();
    for (prog, args, arg, code) in invocations {
        for name in bad {
            let args: Vec<&str> = args
                .iter()
                .map(|a| if *a == "NAME" { name } else { a })
                .collect();
            let value = format!("{name:?}");
            let expect = [&format!("{arg}: VM name {value} must match {VM_RULE}")[..]];
            // The launcher refuses it in its first step, with the arguments.
            failures.extend(refused(&roots, (prog, &args), *code, "sanitized", &expect));
        }
    }
    assert!(
        failures.is_empty(),
        "{} refusals went wrong:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// A spec for VM "web" that parses, but for what `f` does to it.
fn spec_with(f: impl Fn(&mut Value)) -> Vec<u8> {
    let mut v = json!({
        "version": 1, "name": "web",
        "principal": { "uid": 61990, "gid": 61990 },
        "hypervisor": { "kind": "qemu", "binary": "/usr/bin/qemu-system-x86_64" },
        "vcpus": 1, "memory_mib": 256, "kernel": "/boot/vmlinuz"
    });
    f(&mut v);
    serde_json::to_vec_pretty(&v).unwrap()
}

/// (field, what the message says after the field, how the spec is spoiled).
type SpecCase<'a> = (&'a str, &'a str, fn(&mut Value));

/// Both binaries that read a spec (the launcher, and `render-unit --dropin`)
/// refuse each spec with the field and `expect`.
fn spec_refused_by_every_reader(cases: &[SpecCase<'_>]) {
    let mut failures = Vec::new();
    for (field, expect, f) in cases {
        let roots = Roots::new();
        let spec = roots.config().join("web.json");
        std::fs::write(&spec, spec_with(f)).unwrap();
        let field = format!("spec {}: field `{field}` {expect}", spec.display());
        for (prog, args, code) in [
            (
                LAUNCH,
                &["web", "--probe", "--", "/bin/true"][..],
                EX_CONFIG,
            ),
            (LAUNCH, &["web"][..], EX_CONFIG),
            (VMWARDEN, &["render-unit", "--dropin", "web"][..], 1),
        ] {
            failures.extend(refused(
                &roots,
                (prog, args),
                code,
                "spec-loaded",
                &[&field],
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} refusals went wrong:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn a_bad_vm_name_in_a_spec_is_refused_by_every_binary_that_reads_one() {
    spec_refused_by_every_reader(&[
        ("name", "\"Web\" must match ^[a-z][a-z0-9-]{0,31}$", |v| {
            v["name"] = json!("Web")
        }),
        (
            "name",
            "\"../web\" must match ^[a-z][a-z0-9-]{0,31}$",
            |v| v["name"] = json!("../web"),
        ),
    ]);
}

#[test]
fn a_bad_credential_name_is_refused_by_every_binary_that_reads_a_spec() {
    const RULE: &str = "must be letters, digits, '-', '_' or '.', starting with a letter or digit";
    spec_refused_by_every_reader(&[
        (
            "credentials[0].name",
            &format!("\"../token\" {RULE}"),
            |v| {
                v["credentials"] = json!([{ "name": "../token", "source": { "systemd": "token" } }])
            },
        ),
        ("credentials[0].name", &format!("\".token\" {RULE}"), |v| {
            v["credentials"] = json!([{ "name": ".token", "source": { "path": "/etc/token" } }])
        }),
        (
            "credentials[0].source.systemd",
            &format!("\"a/b\" {RULE}"),
            |v| v["credentials"] = json!([{ "name": "token", "source": { "systemd": "a/b" } }]),
        ),
    ]);
}

#[test]
fn a_bad_tap_name_is_refused_by_every_binary_that_reads_a_spec() {
    const RULE: &str = "must match ^vmw-[a-z0-9-]{1,11}$ (the vmw- prefix marks vmwarden's taps; 15 bytes at most, the kernel's IFNAMSIZ)";
    spec_refused_by_every_reader(&[
        ("interfaces[0].tap", &format!("\"tap0\" {RULE}"), |v| {
            v["interfaces"] = json!([{ "tap": "tap0" }])
        }),
        (
            "interfaces[1].tap",
            &format!("\"vmw-abcdefghijkl\" {RULE}"),
            |v| v["interfaces"] = json!([{ "tap": "vmw-a" }, { "tap": "vmw-abcdefghijkl" }]),
        ),
        ("interfaces[0].tap", &format!("\"vmw-a/b\" {RULE}"), |v| {
            v["interfaces"] = json!([{ "tap": "vmw-a/b" }])
        }),
    ]);
}

#[test]
fn a_bad_bridge_name_is_refused_by_every_binary_that_reads_a_spec() {
    const RULE: &str = "is not a usable bridge name (1-15 bytes of letters, digits, '_', '.', '-', not starting with vmw-)";
    spec_refused_by_every_reader(&[
        ("interfaces[0].bridge", &format!("\"../br\" {RULE}"), |v| {
            v["interfaces"] = json!([{ "tap": "vmw-a", "bridge": "../br" }])
        }),
        ("interfaces[0].bridge", &format!("\"vmw-br\" {RULE}"), |v| {
            v["interfaces"] = json!([{ "tap": "vmw-a", "bridge": "vmw-br" }])
        }),
    ]);
}

#[test]
fn a_bad_mac_is_refused_by_every_binary_that_reads_a_spec() {
    spec_refused_by_every_reader(&[
        (
            "interfaces[0].mac",
            "\"02:00:00:00:00\" is not a MAC address (six hex pairs separated by ':')",
            |v| v["interfaces"] = json!([{ "tap": "vmw-a", "mac": "02:00:00:00:00" }]),
        ),
        (
            "interfaces[0].mac",
            "\"01:00:5e:00:00:01\" is a multicast/broadcast address; a NIC needs a unicast MAC",
            |v| v["interfaces"] = json!([{ "tap": "vmw-a", "mac": "01:00:5e:00:00:01" }]),
        ),
        (
            "interfaces[0].mac",
            "\"00:00:00:00:00:00\" is all zeros",
            |v| v["interfaces"] = json!([{ "tap": "vmw-a", "mac": "00:00:00:00:00:00" }]),
        ),
    ]);
}
