//! `vmwarden-cleanup NAME` (ExecStopPost=+): tear down what the launch
//! created, verify, print one JSON report, exit 0 only when clean.

use std::process::ExitCode;

use clap::Parser;
use vmwarden::config::names::VmName;
use vmwarden::config::paths::{RootArgs, Roots};
use vmwarden::config::rawpath::show;
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
    let args: Args = match vmwarden::parse_args() {
        Ok(a) => a,
        Err(e) => {
            // A bad name exits 1, as every failure of cleanup does.
            vmwarden::report_error("vmwarden-cleanup", &e);
            return ExitCode::FAILURE;
        }
    };
    vmwarden::init_logging(std::env::var("VMWARDEN_LOG").ok().as_deref());
    let roots = Roots::from(&args.roots);
    if let Err(e) = roots.validate() {
        vmwarden::report_error("vmwarden-cleanup", &e);
        return ExitCode::FAILURE;
    }
    let report = cleanup(&roots, &args.name, ServiceResult::from_env());
    println!("{}", report.to_json());
    if report.clean {
        ExitCode::SUCCESS
    } else {
        for f in &report.failed {
            eprintln!("vmwarden-cleanup: {}: {}", show(&f.path), f.reason);
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
