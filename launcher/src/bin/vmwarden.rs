//! `vmwarden`: operator commands. Destructive ones use the launcher's own
//! ownership and liveness code.

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use vmwarden::config::rawpath::show;
use vmwarden::config::text::{self, escape};
use vmwarden::host::dirs;
use vmwarden::host::signals;
use vmwarden::teardown::{adopt, purge, reap, verify};
use vmwarden::unit;
use vmwarden::{control, Error};

mod cli;

use cli::vmwarden::{Cli, Cmd};
use vmwarden::config::names::VmName;
use vmwarden::config::paths::Roots;
use vmwarden::status::gather::{default_names, gather};
use vmwarden::status::metrics;
use vmwarden::status::render;

/// `status NAME` for a NAME vmwarden does not know, like `systemctl
/// status` for a unit that does not exist (docs/exit-codes.md).
const EXIT_NO_SUCH_VM: u8 = 4;

fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string_pretty(v)
        .map(|s| text::json(&s))
        .unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

/// `vmwarden console NAME`: attach, until Ctrl-] or the VM's end.
fn console(roots: &Roots, name: &VmName) -> Result<ExitCode, Error> {
    use control::console::{attach, connect, Ended, DETACH_NAME};
    let conn = connect(roots, name)?;
    eprintln!("Connected to the console of {name}; {DETACH_NAME} detaches (the VM runs on).");
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout().lock();
    let ended = attach(name, conn, std::os::fd::AsFd::as_fd(&stdin), &mut stdout)?;
    eprintln!(
        "\r\n{}",
        match ended {
            Ended::Detached => format!("Detached from the console of {name}; the VM runs on."),
            Ended::Closed => format!(
                "The console of {name} closed (the VM stopped, or another console is attached)."
            ),
            Ended::InputEnded => format!("Input ended; detached from the console of {name}."),
        }
    );
    Ok(ExitCode::SUCCESS)
}

/// `vmwarden status`: the records are decided by `status::gather` and
/// rendered by `status::render` (pure). Exit 0 whatever state the VMs are
/// in; 4 when a NAME is not a VM vmwarden knows (the others still shown).
fn status(roots: &Roots, names: &[VmName], all: bool, as_json: bool) -> Result<ExitCode, Error> {
    let g = gather(roots, names, all);
    if as_json {
        print!("{}", render::json(&g.records));
    } else {
        // The sentence is for "nothing to show", not for unknown NAMEs
        // (those are reported on stderr).
        let empty = if names.is_empty() {
            render::nothing(
                &roots.config_dir,
                &roots.runtime_root,
                all.then_some(roots.state_root.as_path()),
            )
        } else {
            String::new()
        };
        print!("{}", render::table(&g.records, &empty));
        if all {
            print!("{}", render::notes(&g.records));
        }
    }
    for n in &g.unknown {
        eprintln!(
            "vmwarden: status: no VM {n:?}: no spec {}, no runtime dir, no state dir, no principal registration",
            show(&roots.spec_path(n))
        );
    }
    Ok(if g.unknown.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_NO_SUCH_VM)
    })
}

fn run(cli: Cli) -> Result<ExitCode, Error> {
    let roots = cli.roots.roots();
    roots.validate()?;
    // Every command that reads or changes the roots refuses one that is
    // not vmwarden's alone (`/tmp` given as a root) before it starts.
    if !matches!(cli.cmd, Cmd::RenderUnit(_) | Cmd::Generate { .. }) {
        check_roots(&roots)?;
    }
    match cli.cmd {
        Cmd::Status {
            names,
            all,
            json: as_json,
        } => status(&roots, &names, all, as_json),
        Cmd::Metrics { output } => {
            let text = metrics::render(&metrics::collect(&roots));
            match output {
                Some(path) => metrics::write_textfile(&path, &text)?,
                None => print!("{text}"),
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::WaitReady { name, timeout } => wait_ready(&roots, &name, timeout),
        Cmd::Stop { name, timeout } => stop(&roots, &name, timeout),
        Cmd::Hibernate {
            name,
            timeout,
            keep_after_restore,
        } => {
            let h = control::hibernate::hibernate(
                &roots,
                &name,
                Duration::from_secs_f64(timeout),
                keep_after_restore,
            )
            .map_err(|e| control::ControlError::from(Box::new(e)))?;
            vmwarden::print_report(&format!(
                "{name}: hibernated to {} ({} bytes, captured in {} ms)",
                h.snapshot.display(),
                h.bytes,
                h.capture_ms
            ));
            Ok(ExitCode::SUCCESS)
        }
        Cmd::HibernateAll { timeout } => hibernate_all(&roots, timeout),
        Cmd::StartHibernated { prefix } => start_hibernated(&roots, &prefix),
        Cmd::Balloon { name, size } => {
            control::balloon::set_balloon(&roots, &name, size)?;
            vmwarden::print_report(&format!(
                "{name}: balloon target {size} MiB (`vmwarden status {name}` shows where the guest is)"
            ));
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Console { name } => console(&roots, &name),
        Cmd::Reap {
            apply,
            kill,
            json: as_json,
        } => reap_cmd(&roots, apply, kill, as_json),
        Cmd::Purge {
            name,
            keep_identity,
        } => purge_cmd(&roots, &name, keep_identity),
        Cmd::VerifyClean {
            names,
            protected,
            since,
            json: as_json,
        } => verify_clean(&roots, &names, &protected, since, as_json),
        Cmd::Adopt {
            name,
            from,
            apply,
            json: as_json,
        } => adopt_cmd(&roots, &name, &from, apply, as_json),
        Cmd::RenderUnit(args) => {
            let text = unit::render_unit(&args.request(roots.config_dir.clone()))?;
            print!("{text}");
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Generate { out } => generate(&out),
    }
}

/// Both roots, when they exist, are root's and writable by nobody else.
fn check_roots(roots: &Roots) -> Result<(), Error> {
    dirs::check_root(&roots.runtime_root, "--runtime-root")?;
    dirs::check_root(&roots.state_root, "--state-root")?;
    Ok(())
}

fn ok_or_failure(ok: bool) -> ExitCode {
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `wait-ready NAME` (ExecStartPost).
fn wait_ready(roots: &Roots, name: &VmName, timeout: f64) -> Result<ExitCode, Error> {
    // systemd gives ExecStartPost= the launcher's pid as $MAINPID.
    let launcher = std::env::var("MAINPID")
        .ok()
        .and_then(|p| p.parse::<u32>().ok());
    let status = control::wait_ready(roots, name, Duration::from_secs_f64(timeout), launcher)?;
    // The state is what the VM's hypervisor answered.
    vmwarden::print_report(&format!("{name}: ready (qmp status {})", escape(&status)));
    Ok(ExitCode::SUCCESS)
}

/// `stop NAME` (ExecStop): power button, then quit, then SIGKILL.
fn stop(roots: &Roots, name: &VmName, timeout: f64) -> Result<ExitCode, Error> {
    let by = control::stop(roots, name, Duration::from_secs_f64(timeout))?;
    vmwarden::print_report(&format!(
        "{name}: stopped by {}",
        serde_json::to_value(by)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default()
    ));
    Ok(ExitCode::SUCCESS)
}

/// `hibernate-all [--timeout S]`: one line per VM; non-zero when a VM
/// was neither hibernated nor stopped, or hibernated but not recorded.
fn hibernate_all(roots: &Roots, timeout: f64) -> Result<ExitCode, Error> {
    use control::at_shutdown::Outcome;
    let names = default_names(roots);
    let done = control::at_shutdown::hibernate_all(roots, &names, Duration::from_secs_f64(timeout))
        .map_err(|e| control::ControlError::from(Box::new(e)))?;
    let mut failed = false;
    for (name, o) in done {
        let line = match o {
            Outcome::Hibernated { bytes, ms } => {
                format!("{name}: hibernated ({bytes} bytes, {ms} ms)")
            }
            Outcome::NotRecorded { bytes, ms, why } => {
                failed = true;
                format!("{name}: hibernated ({bytes} bytes, {ms} ms) but NOT recorded for the next boot ({why}): start-hibernated will not start it; a start of its unit restores it from its snapshot")
            }
            Outcome::NotRunning => continue,
            Outcome::NotAllowed => {
                format!("{name}: left to its unit (hibernate.allowed is not set)")
            }
            Outcome::BootBound(kind) => format!(
                "{name}: left to its unit ({} snapshots are bound to the host's boot and would be refused after the reboot)",
                kind.as_str()
            ),
            Outcome::Stopped { why, by } => format!(
                "{name}: stopped ({}) after: {why}",
                serde_json::to_value(by)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default()
            ),
            Outcome::Failed { why, stop } => {
                failed = true;
                format!("{name}: NOT hibernated ({why}) and not stopped ({stop})")
            }
        };
        vmwarden::print_report(&line);
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// `start-hibernated [--prefix P]`: one line per VM; non-zero when a unit
/// could not be started.
fn start_hibernated(roots: &Roots, prefix: &str) -> Result<ExitCode, Error> {
    unit::UnitNames::for_prefix(prefix)?;
    let done = control::at_shutdown::start_hibernated(roots, prefix)
        .map_err(|e| control::ControlError::from(Box::new(e)))?;
    let mut failed = false;
    for (name, r) in done {
        let line = match r {
            None => format!("{name}: not started (its snapshot is no longer recorded)"),
            Some(Ok(job)) => format!("{name}: its unit is starting ({job})"),
            Some(Err(e)) => {
                failed = true;
                format!("{name}: its unit could not be started: {e}")
            }
        };
        vmwarden::print_report(&line);
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// `reap [--apply] [--kill] [--json]`: a dry run unless `--apply`.
fn reap_cmd(roots: &Roots, apply: bool, kill: bool, as_json: bool) -> Result<ExitCode, Error> {
    let r = reap::reap(roots, apply, kill);
    if as_json {
        println!("{}", json(&r));
    } else {
        print_reap(&r, apply);
    }
    Ok(ok_or_failure(r.ok()))
}

fn print_reap(r: &reap::Report, apply: bool) {
    let verb = if apply { "deleting" } else { "would delete" };
    for o in &r.orphans {
        println!(
            "{verb} {:?} {} ({})",
            o.kind,
            show(&o.path),
            escape(&o.reason)
        );
    }
    for k in &r.kept {
        println!(
            "keeping {:?} {} ({})",
            k.kind,
            show(&k.path),
            escape(&k.reason)
        );
    }
    for p in &r.killed {
        println!("killed pid {p}");
    }
    for f in &r.failed {
        println!("FAILED {} ({})", show(&f.path), escape(&f.reason));
    }
    println!(
        "reap: {} orphan(s), {} kept, {} deleted, {} failed{}",
        r.orphans.len(),
        r.kept.len(),
        r.deleted.len(),
        r.failed.len(),
        if apply {
            ""
        } else {
            " (dry run: nothing changed; --apply to delete)"
        }
    );
}

/// `purge NAME [--keep-identity]`: print the plan, ask for the typed
/// confirmation on a terminal, execute, report.
fn purge_cmd(roots: &Roots, name: &VmName, keep_identity: bool) -> Result<ExitCode, Error> {
    let plan = purge::plan(roots, name, keep_identity)?;
    print_purge_plan(name, &plan, keep_identity);
    if !confirmed()? {
        println!("purge: not confirmed; nothing deleted");
        return Ok(ExitCode::FAILURE);
    }
    let rep = purge::execute(roots, name, plan)?;
    for d in &rep.outcome.deleted {
        println!("deleted {}", show(d));
    }
    for f in &rep.outcome.failed {
        println!("FAILED {} ({})", show(&f.path), escape(&f.reason));
    }
    if let Some(e) = &rep.retire_error {
        println!("NOT RETIRED: {}", escape(&e.to_string()));
    }
    if let Some(r) = &rep.retired {
        println!(
            "retired principal uid {} (generation {})",
            r.uid, r.generation
        );
    }
    for r in &rep.retired_ranges {
        let ids = r.range();
        if r.recyclable {
            println!(
                "retired id range {}..{} (recyclable: no file can carry its ids)",
                ids.base + 1,
                ids.end()
            );
        } else {
            println!(
                "retired id range {}..{} (kept out of use: files outside the state dir may carry its ids)",
                ids.base + 1,
                ids.end()
            );
        }
    }
    let ok = rep.ok();
    println!("purge: {}", if ok { "done" } else { "INCOMPLETE" });
    Ok(ok_or_failure(ok))
}

fn print_purge_plan(name: &VmName, plan: &purge::Plan, keep_identity: bool) {
    println!(
        "purge plan for {name}: state dir {} stays",
        show(&plan.state_dir)
    );
    for k in &plan.keep {
        println!("  keep   {}", escape(&k.to_string()));
    }
    for d in &plan.delete {
        println!("  delete {}", show(d));
    }
    match plan.retire_uid {
        Some(uid) => println!(
            "  retire principal uid {uid} (tombstone; the uid is not reused while residue exists)"
        ),
        None if keep_identity => println!("  keep the principal's registration (--keep-identity)"),
        None => println!("  no principal to retire could be determined"),
    }
    if let Some(r) = plan.retire_range {
        println!(
            "  retire id range {}..{} (what the guest owned on its virtiofs shares; handed out again only if every share it served lay in the state dir)",
            r.base + 1,
            r.end()
        );
    }
    if let Some(p) = &plan.range_problem {
        println!("  leave  a range record that cannot be used: {}", escape(p));
    }
    for f in &plan.share_sources {
        println!(
            "  {:<6} {} (share source: {})",
            f.action,
            show(&f.path),
            escape(&f.reason)
        );
    }
    for o in &plan.outside {
        println!(
            "  leave  {} (a share the guest owns, outside the state dir: its files keep the range's ids)",
            show(o)
        );
    }
}

/// The typed confirmation: only on a terminal, only the exact phrase.
fn confirmed() -> Result<bool, Error> {
    if !std::io::stdin().is_terminal() {
        return Err(Error::NoTerminal {
            phrase: purge::CONFIRM_PHRASE,
        });
    }
    print!("Type {} to proceed: ", purge::CONFIRM_PHRASE);
    let _ = std::io::stdout().flush();
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .map_err(Error::Confirm)?;
    Ok(line.trim_end_matches(['\n', '\r']) == purge::CONFIRM_PHRASE)
}

/// `verify-clean [NAME…]`: one line per check; exit 1 when dirty.
fn verify_clean(
    roots: &Roots,
    names: &[VmName],
    protected: &[PathBuf],
    since: Option<f64>,
    as_json: bool,
) -> Result<ExitCode, Error> {
    let r = verify::verify(roots, names, protected, since);
    if as_json {
        println!("{}", json(&r));
    } else {
        print!("{}", r.lines());
    }
    Ok(ok_or_failure(r.clean))
}

/// microvm.nix's unit of VM `name`, asked of systemd (only here, in the
/// command layer): `Err` when it is active (or activating, reloading,
/// deactivating), else what was found, for the report.
fn microvm_nix_unit(name: &VmName, from: &Path) -> Result<String, Error> {
    let unit = format!("microvm@{name}.service");
    if !Path::new("/run/systemd/system").exists() {
        return Ok(format!("systemd is not running here ({unit} not asked)"));
    }
    let out = std::process::Command::new("systemctl")
        .args(["is-active", &unit])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output();
    let state = match out {
        Ok(o) => String::from_utf8_lossy(&o.stdout).trim().to_string(),
        Err(e) => {
            return Err(adopt::AdoptError::Refused {
                name: name.to_string(),
                path: from.to_path_buf(),
                why: format!("cannot ask systemd whether {unit} is active (systemctl: {e})"),
            }
            .into())
        }
    };
    match state.as_str() {
        "inactive" | "failed" | "unknown" | "" => Ok(format!(
            "{unit} is {}",
            if state.is_empty() { "unknown" } else { &state }
        )),
        s => Err(adopt::AdoptError::Refused {
            name: name.to_string(),
            path: from.to_path_buf(),
            why: format!("{unit} is {s}; stop microvm.nix's VM first (systemctl stop {unit})"),
        }
        .into()),
    }
}

/// `adopt NAME --from DIR [--apply] [--json]`.
fn adopt_cmd(
    roots: &Roots,
    name: &VmName,
    from: &Path,
    apply: bool,
    as_json: bool,
) -> Result<ExitCode, Error> {
    let systemd = microvm_nix_unit(name, from)?;
    let opts = adopt::Options {
        apply,
        fault_after: std::env::var("VMWARDEN_FAULT_AFTER").ok(),
        fault_stop: std::env::var("VMWARDEN_FAULT_STOP").ok(),
    };
    let plan = adopt::adopt(roots, name, from, &opts)?;
    if as_json {
        println!("{}", json(&plan));
    } else {
        print!("{}", adopt::render(&plan, &systemd));
    }
    Ok(ExitCode::SUCCESS)
}

/// `generate --out DIR`: man pages and shell completions.
fn generate(out: &Path) -> Result<ExitCode, Error> {
    match cli::generate::write(out) {
        Ok(written) => {
            for p in written {
                println!("{}", p.display());
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            vmwarden::report_error("vmwarden", &e);
            Ok(ExitCode::FAILURE)
        }
    }
}

fn main() -> ExitCode {
    // SIGCHLD not ignored, nothing blocked, whatever started it
    // (host::signals): its waits for its own children read their status.
    if let Err(e) = signals::inherited_to_default() {
        vmwarden::report_error("vmwarden", &e);
        return ExitCode::FAILURE;
    }
    let cli: Cli = match cli::common::parse_args() {
        Ok(c) => c,
        Err(e) => {
            // A bad name exits 1, like every refused command.
            vmwarden::report_error("vmwarden", &e);
            return ExitCode::FAILURE;
        }
    };
    cli.log
        .init("vmwarden", cli.cmd.vm_name().map(|n| n.as_str()));
    match run(cli) {
        Ok(c) => c,
        Err(e) => {
            vmwarden::report_error("vmwarden", &e);
            ExitCode::FAILURE
        }
    }
}
