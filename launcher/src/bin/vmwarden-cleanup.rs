//! `vmwarden-cleanup NAME` (ExecStopPost=+): tear down what the launch
//! created, verify, print one JSON report, exit 0 only when clean.

use std::process::ExitCode;

use clap::Parser;
use vmwarden::config::names::VmName;
use vmwarden::config::paths::{RootArgs, Roots};
use vmwarden::teardown::cleanup::{cleanup, ServiceResult};

#[derive(Debug, Parser)]
#[command(
    name = "vmwarden-cleanup",
    version,
    about = "Tear down one VM's runtime state and prove it"
)]
struct Args {
    /// VM name (the unit instance, %i).
    name: VmName,
    #[command(flatten)]
    roots: RootArgs,
}

fn main() -> ExitCode {
    // A bad name exits 1 (EXIT_FAILURE), as every failure of cleanup does.
    let args: Args = vmwarden::parse_args("vmwarden-cleanup", 1);
    vmwarden::init_logging(std::env::var("VMWARDEN_LOG").ok().as_deref());
    let roots = Roots::from(&args.roots);
    if let Err((flag, path, reason)) = roots.validate() {
        eprintln!(
            "vmwarden-cleanup: error: {flag} {}: {reason}",
            path.display()
        );
        return ExitCode::FAILURE;
    }
    let report = cleanup(&roots, &args.name, ServiceResult::from_env());
    println!("{}", report.to_json());
    if report.clean {
        ExitCode::SUCCESS
    } else {
        for f in &report.failed {
            eprintln!("vmwarden-cleanup: {}: {}", f.path.display(), f.reason);
        }
        if report.failed.is_empty() {
            eprintln!(
                "vmwarden-cleanup: {}: nothing deleted: {}",
                args.name, report.liveness
            );
        }
        ExitCode::FAILURE
    }
}
