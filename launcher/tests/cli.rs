//! The binaries as an operator meets them: every exit status of every
//! binary (against docs/exit-codes.md and the man pages' table), each
//! hypervisor's refusals (against docs/design/hypervisors.md's table), the
//! launcher's log lines, and the generated man pages and completions run
//! through groff and the three shells. Needs root (real launches), and
//! zsh, fish and groff (tests/setup-host.sh installs them).

mod common;

#[path = "../src/bin/cli/exit_codes.rs"]
#[allow(dead_code)]
mod exit_codes;

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use serde_json::json;
use vmwarden::config::capabilities;

/// The rows of docs/exit-codes.md's table: (binary, status, meaning).
fn doc_rows() -> Vec<(String, String, String)> {
    let text = std::fs::read_to_string(repo_root().join("docs/exit-codes.md")).unwrap();
    text.lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').splitn(3, " | ").collect();
            assert_eq!(cells.len(), 3, "{l}");
            let status = match cells[1].trim() {
                "the hypervisor's" => "hypervisor".to_string(),
                s => s.to_string(),
            };
            (
                cells[0].trim().trim_matches('`').to_string(),
                status,
                cells[2].trim().to_string(),
            )
        })
        .collect()
}

#[test]
fn the_exit_code_doc_is_the_table_the_man_pages_are_rendered_from() {
    let want: Vec<(String, String, String)> = exit_codes::EXIT_STATUSES
        .iter()
        .map(|r| (r.binary.into(), r.status.into(), r.meaning.into()))
        .collect();
    assert_eq!(
        doc_rows(),
        want,
        "docs/exit-codes.md and src/bin/cli/exit_codes.rs differ"
    );
}

/// The text between the `capabilities` markers in docs/design/hypervisors.md.
fn documented_refusal_table() -> String {
    const BEGIN: &str = "<!-- capabilities:begin -->\n";
    const END: &str = "<!-- capabilities:end -->";
    let path = repo_root().join("docs/design/hypervisors.md");
    let doc = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let start = doc
        .find(BEGIN)
        .unwrap_or_else(|| panic!("{}: no line `{}`", path.display(), BEGIN.trim_end()))
        + BEGIN.len();
    let len = doc[start..]
        .find(END)
        .unwrap_or_else(|| panic!("{}: no `{END}` after the begin marker", path.display()));
    doc[start..start + len].to_string()
}

/// Read from the source tree, not the package's: the Nix build runs only
/// `--lib` and `--bins` tests, on a source without docs/.
#[test]
fn the_documented_refusal_table_is_the_one_the_launcher_checks() {
    let table = capabilities::markdown();
    assert!(
        documented_refusal_table() == table,
        "docs/design/hypervisors.md's refusal table differs from \
         launcher/src/config/capabilities.rs's REFUSALS. Regenerate it: replace everything \
         between the lines `<!-- capabilities:begin -->` and `<!-- capabilities:end -->` with \
         exactly the table below (markdown(), ending in a newline):\n{table}"
    );
}

fn code(o: &std::process::Output) -> i32 {
    o.status
        .code()
        .unwrap_or_else(|| panic!("killed by a signal: {}", text(o)))
}

#[test]
fn every_binary_exits_with_every_documented_status() {
    let env = Env::new();
    let mut seen: BTreeSet<(String, String)> = BTreeSet::new();
    let mut saw = |bin: &str, status: &str, o: &std::process::Output, want: i32| {
        assert_eq!(code(o), want, "{bin} for status {status}: {}", text(o));
        seen.insert((bin.to_string(), status.to_string()));
    };
    let launch = "vmwarden-launch";
    let cleanup = "vmwarden-cleanup";
    let vmw = "vmwarden";

    env.write_spec("web", &env.spec("web", uid(71)));
    // The launcher is the probe command after execve: its status is the command's.
    let o = env.probe("web", &["/bin/sh", "-c", "exit 7"]);
    saw(launch, "hypervisor", &o, 7);
    let o = Command::new(LAUNCH).arg("--list-steps").output().unwrap();
    saw(launch, "0", &o, 0);
    let o = Command::new(LAUNCH).arg("--frobnicate").output().unwrap();
    saw(launch, "2", &o, 2);
    let mut bad = env.spec("bad", uid(72));
    bad["memory_mib"] = json!(4);
    env.write_spec("bad", &bad);
    let o = env.probe("bad", &["/bin/true"]);
    saw(launch, "78", &o, 78);
    assert!(stderr(&o).contains("memory_mib"), "{}", text(&o));

    // The previous probe is over: cleanup is clean.
    let o = env.cleanup_cmd().arg("web").output().unwrap();
    saw(cleanup, "0", &o, 0);
    let o = Command::new(CLEANUP).output().unwrap();
    saw(cleanup, "2", &o, 2);

    // A running instance (a probe that sleeps holds the lease).
    let mut held = env.launch_cmd("web");
    held.args(["--probe", "--", "sleep", "60"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut held = held.spawn().unwrap();
    let lease_held = || {
        env.vmwarden(&["status", "web", "--json"])
            .stdout
            .windows(17)
            .any(|w| w == b"\"state\": \"running")
    };
    let end = std::time::Instant::now() + Duration::from_secs(10);
    while !lease_held() {
        assert!(
            std::time::Instant::now() < end,
            "the probe never held its lease"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let o = env.probe("web", &["/bin/true"]);
    saw(launch, "1", &o, 1);
    assert!(stderr(&o).contains("already running"), "{}", text(&o));
    let o = env.cleanup_cmd().arg("web").output().unwrap();
    saw(cleanup, "1", &o, 1);
    let o = env.vmwarden(&["verify-clean", "web"]);
    saw(vmw, "1", &o, 1);
    let o = env.vmwarden(&["status"]);
    saw(vmw, "0", &o, 0);
    let o = env.vmwarden(&["status", "web", "nosuch"]);
    saw(vmw, "4", &o, 4);
    let o = env.vmwarden(&["frobnicate"]);
    saw(vmw, "2", &o, 2);
    let _ = held.kill();
    let _ = held.wait();
    assert!(env.cleanup("web").0.status.success());

    let want: BTreeSet<(String, String)> = exit_codes::EXIT_STATUSES
        .iter()
        .map(|r| (r.binary.to_string(), r.status.to_string()))
        .collect();
    assert_eq!(
        seen, want,
        "tested statuses differ from the documented ones"
    );
}

fn info_lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.trim_start().starts_with("INFO"))
        .collect()
}

#[test]
fn launcher_log_lines_name_the_vm_and_the_step() {
    let env = Env::new();
    env.write_spec("web", &env.spec("web", uid(73)));
    let run = |extra: &[&str], vars: &[(&str, &str)]| {
        let mut c = env.launch_cmd("web");
        c.args(extra).args(["--probe", "--", "/bin/true"]);
        c.env_remove("VMWARDEN_LOG").env_remove("RUST_LOG");
        for (k, v) in vars {
            c.env(k, v);
        }
        let o = c.output().unwrap();
        assert!(o.status.success(), "{}", text(&o));
        assert!(env.cleanup("web").0.status.success());
        stderr(&o)
    };
    let steps: Vec<String> = String::from_utf8(
        Command::new(LAUNCH)
            .arg("--list-steps")
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
    .lines()
    .map(str::to_string)
    .collect();

    // Default (info): every INFO line is in launch{vm=web} and names its step.
    let e = run(&[], &[]);
    let info = info_lines(&e);
    assert!(info.len() >= 4, "{e}");
    for l in &info {
        let step = l
            .split_whitespace()
            .find_map(|w| w.strip_prefix("step="))
            .unwrap_or_else(|| panic!("no step= in {l:?}"));
        assert!(l.contains("launch{vm=web}:"), "{l}");
        assert!(
            steps.iter().any(|s| s == step) || step == "exec",
            "{step} is not a launch step: {l}"
        );
    }
    assert!(!e.contains("DEBUG"), "{e}");

    // --quiet: warnings and errors only, whatever the environment says.
    let e = run(&["--quiet"], &[("VMWARDEN_LOG", "debug")]);
    assert!(info_lines(&e).is_empty() && !e.contains("DEBUG"), "{e}");

    // VMWARDEN_LOG, else RUST_LOG: debug shows every step done, in order.
    for vars in [
        &[("VMWARDEN_LOG", "debug")][..],
        &[("RUST_LOG", "debug")][..],
        &[("VMWARDEN_LOG", "debug"), ("RUST_LOG", "warn")][..],
    ] {
        let e = run(&[], vars);
        let done: Vec<&str> = e
            .lines()
            .filter(|l| l.contains("launch step done"))
            .filter_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("step=")))
            .collect();
        assert_eq!(done, steps, "{vars:?}: {e}");
    }
    let e = run(&[], &[("VMWARDEN_LOG", "warn"), ("RUST_LOG", "debug")]);
    assert!(
        info_lines(&e).is_empty(),
        "VMWARDEN_LOG must win over RUST_LOG: {e}"
    );
}

/// `vmwarden generate --out DIR` into a fresh dir.
fn generated() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let o = Command::new(VMWARDEN)
        .args(["generate", "--out"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    dir
}

fn need(tool: &str) {
    assert!(
        Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .unwrap()
            .status
            .success(),
        "{tool} is missing: tests/setup-host.sh installs it"
    );
}

#[test]
fn man_pages_render_without_warnings() {
    need("groff");
    let dir = generated();
    let mut pages = 0;
    for e in std::fs::read_dir(dir.path().join("man/man1"))
        .unwrap()
        .flatten()
    {
        let o = Command::new("groff")
            .args(["-mandoc", "-ww", "-z"])
            .arg(e.path())
            .output()
            .unwrap();
        assert!(
            o.status.success() && o.stderr.is_empty(),
            "{}: {}",
            e.path().display(),
            text(&o)
        );
        pages += 1;
    }
    // Three binaries and vmwarden's fifteen subcommands.
    assert_eq!(pages, 18);
}

/// Ask bash's completion function of `bin` for the words completing `line`.
fn bash_complete(script: &std::path::Path, bin: &str, line: &[&str]) -> Vec<String> {
    let source = std::fs::read_to_string(script).unwrap();
    let func = source
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("complete -F ")
                .and_then(|r| r.split_whitespace().next())
        })
        .expect("complete -F line");
    let words: Vec<String> = line.iter().map(|w| format!("'{w}'")).collect();
    let prog = format!(
        "source '{}'; COMP_WORDS=({}); COMP_CWORD={}; {func} '{bin}' '{}' '{}'; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        script.display(),
        words.join(" "),
        line.len() - 1,
        line[line.len() - 1],
        line[line.len() - 2],
    );
    let o = Command::new("bash").args(["-c", &prog]).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn completions_load_in_bash_zsh_and_fish_and_complete() {
    need("bash");
    need("zsh");
    need("fish");
    let dir = generated();
    let c = dir.path().join("completions");
    for bin in ["vmwarden", "vmwarden-launch", "vmwarden-cleanup"] {
        let o = Command::new("zsh")
            .arg("-n")
            .arg(c.join(format!("zsh/_{bin}")))
            .output()
            .unwrap();
        assert!(o.status.success(), "zsh -n _{bin}: {}", text(&o));
        let o = Command::new("fish")
            .arg("-n")
            .arg(c.join(format!("fish/{bin}.fish")))
            .output()
            .unwrap();
        assert!(o.status.success(), "fish -n {bin}.fish: {}", text(&o));
    }
    let bash = c.join("bash/vmwarden.bash");
    assert_eq!(
        bash_complete(&bash, "vmwarden", &["vmwarden", "st"]),
        ["status", "stop", "start-hibernated"]
    );
    assert_eq!(
        bash_complete(&bash, "vmwarden", &["vmwarden", "status", "--a"]),
        ["--all"]
    );
    assert_eq!(
        bash_complete(
            &c.join("bash/vmwarden-launch.bash"),
            "vmwarden-launch",
            &["vmwarden-launch", "--pro"]
        ),
        ["--probe"]
    );
    // fish, really completing: the subcommands of `vmwarden st`.
    let o = Command::new("fish")
        .arg("-c")
        .arg(format!(
            "source {}; complete -C 'vmwarden st'",
            c.join("fish/vmwarden.fish").display()
        ))
        .output()
        .unwrap();
    let got: Vec<String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| l.split('\t').next().unwrap_or("").to_string())
        .collect();
    assert_eq!(got, ["start-hibernated", "status", "stop"], "{}", text(&o));
}

/// A start by hand may pass SIGCHLD ignored and signals blocked: both
/// survive `execve`. With SIGCHLD ignored the kernel reaps the launch's
/// children itself, so its wait for the probe read no status; a blocked
/// SIGTERM would reach the hypervisor. The binaries reset both first
/// (`host::signals`): the probe, standing where the hypervisor would,
/// inherits neither, and its launch ends with its status.
#[test]
fn an_inherited_ignored_sigchld_and_blocked_signals_are_reset() {
    use nix::sys::signal::{signal, sigprocmask, SigHandler, SigSet, SigmaskHow, Signal};
    use std::os::unix::process::CommandExt;
    let env = Env::new();
    env.write_spec("sig", &env.spec("sig", uid(131)));
    let mut c = env.launch_cmd("sig");
    c.args([
        "--probe",
        "--",
        "/bin/grep",
        "-E",
        "^Sig(Blk|Ign):",
        "/proc/self/status",
    ]);
    let hand_start = || {
        // SAFETY: SIG_IGN installs no handler.
        unsafe { signal(Signal::SIGCHLD, SigHandler::SigIgn) }?;
        let mut set = SigSet::empty();
        set.add(Signal::SIGTERM);
        set.add(Signal::SIGINT);
        sigprocmask(SigmaskHow::SIG_BLOCK, Some(&set), None)?;
        Ok(())
    };
    // SAFETY: between fork and exec the child calls only sigaction and
    // sigprocmask (`hand_start`), which are async-signal-safe.
    unsafe { c.pre_exec(hand_start) };
    let o = c.output().unwrap();
    assert!(o.status.success(), "the probe's launch: {}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let field = |k: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .unwrap_or_else(|| panic!("no {k} in the probe's status: {}", text(&o)))
    };
    assert_eq!(
        field("SigBlk:"),
        0,
        "the probe inherited blocked signals: {out}"
    );
    let chld = 1u64 << (Signal::SIGCHLD as u32 - 1);
    assert_eq!(
        field("SigIgn:") & chld,
        0,
        "the probe inherited SIGCHLD ignored: {out}"
    );
    let (c, v) = env.cleanup("sig");
    assert!(c.status.success() && v["clean"] == true, "{}", text(&c));
}
