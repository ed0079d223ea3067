//! `vmwarden-cleanup NAME` (ExecStopPost=+): tear down what the launch
//! created, verify, print one JSON report, exit 0 only when clean.

use std::process::ExitCode;

use vmwarden::config::rawpath::show;
use vmwarden::config::text::{self, escape};
use vmwarden::host::dirs;
use vmwarden::host::signals;
use vmwarden::teardown::cleanup::{cleanup, ServiceResult};

#[path = "cli/cleanup.rs"]
mod cli;
#[path = "cli/common.rs"]
mod common;

fn main() -> ExitCode {
    // SIGCHLD not ignored, nothing blocked, whatever started it
    // (host::signals): its waits for its own children read their status.
    if let Err(e) = signals::inherited_to_default() {
        vmwarden::report_error("vmwarden-cleanup", &e);
        return ExitCode::FAILURE;
    }
    let args: cli::CleanupArgs = match common::parse_args() {
        Ok(a) => a,
        Err(e) => {
            // A bad name exits 1, as every failure of cleanup does.
            vmwarden::report_error("vmwarden-cleanup", &e);
            return ExitCode::FAILURE;
        }
    };
    args.log.init("vmwarden-cleanup", Some(args.name.as_str()));
    let roots = args.roots.roots();
    if let Err(e) = roots.validate() {
        vmwarden::report_error("vmwarden-cleanup", &e);
        return ExitCode::FAILURE;
    }
    // A root others may write (`/tmp`) is not vmwarden's: nothing in it is
    // deleted.
    for (path, flag) in [
        (&roots.runtime_root, "--runtime-root"),
        (&roots.state_root, "--state-root"),
    ] {
        if let Err(e) = dirs::check_root(path, flag) {
            vmwarden::report_error("vmwarden-cleanup", &e);
            return ExitCode::FAILURE;
        }
    }
    let report = cleanup(&roots, &args.name, ServiceResult::from_env());
    vmwarden::print_report(&text::json(&report.to_json()));
    if report.clean {
        ExitCode::SUCCESS
    } else {
        for f in &report.failed {
            vmwarden::report_line(&format!(
                "vmwarden-cleanup: {}: {}",
                show(&f.path),
                escape(&f.reason)
            ));
        }
        if report.failed.is_empty() {
            vmwarden::report_line(&format!(
                "vmwarden-cleanup: {}: nothing deleted: {}",
                args.name,
                escape(&report.liveness)
            ));
        }
        ExitCode::FAILURE
    }
}
