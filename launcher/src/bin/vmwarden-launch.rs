//! `vmwarden-launch NAME`: prepare the sandbox, drop to the VM's principal
//! and `execve` the hypervisor (or, with `--probe -- CMD…`, CMD).

use std::path::PathBuf;
use std::process::ExitCode;

use vmwarden::devices::claim;
use vmwarden::host::cgroup::Invocation;
use vmwarden::host::signals;
use vmwarden::identity::ranges;
use vmwarden::launch::{self, LaunchError, Options, StepError, STEPS};
use vmwarden::profile;
use vmwarden::Error;

#[path = "cli/launch.rs"]
mod cli;
#[path = "cli/common.rs"]
mod common;

/// Report a failed launch (naming its step) and exit with its status.
fn fail(e: LaunchError) -> ExitCode {
    vmwarden::report_launch_error("vmwarden-launch", &e);
    ExitCode::from(Error::from(e).exit_code())
}

fn main() -> ExitCode {
    profile::mark("exec-to-main");
    // 1. Single-threaded from here; inherited fds closed, environment captured then cleared.
    if let Err(e) = launch::sandbox::close_inherited_fds() {
        return fail(LaunchError::at(STEPS[0], e));
    }
    // Then the signal state it inherited: SIGCHLD not ignored, nothing
    // blocked (what the hypervisor inherits at its execve).
    if let Err(e) = signals::inherited_to_default() {
        return fail(LaunchError::at(STEPS[0], e));
    }
    profile::mark("fds-closed");
    let credentials_directory = std::env::var_os("CREDENTIALS_DIRECTORY").map(PathBuf::from);
    let fault_after = std::env::var("VMWARDEN_FAULT_AFTER").ok();
    let helper_openat2_enosys =
        std::env::var_os("VMWARDEN_TEST_HELPER_OPENAT2_ENOSYS").is_some_and(|v| v == "1");
    let invocation = Invocation::from_env(|k| std::env::var(k).ok());
    // The host-wide id ranges' directory, fixed before the environment goes.
    ranges::ranges_dir();
    // And the host-wide device lock's.
    claim::lock_dir();
    launch::reach::capture(std::env::var("VMWARDEN_TEST_REACH").ok());
    // clap reads the VMWARDEN_*_ROOT variables and logging VMWARDEN_LOG
    // and RUST_LOG, so both come before the environment is cleared.
    // A bad name is refused in the first step, as a configuration error
    // (EX_CONFIG, which the unit does not retry).
    // The unit's own command line without clap's tree; anything else,
    // and every error, through clap.
    let fast = cli::parse_fast(std::env::args_os(), |k| std::env::var_os(k));
    let args: cli::LaunchArgs = match fast.map_or_else(common::parse_args, Ok) {
        Ok(a) => a,
        Err(e) => return fail(LaunchError::at(STEPS[0], e)),
    };
    profile::mark("args-parsed");
    args.log
        .init("vmwarden-launch", args.name.as_ref().map(|n| n.as_str()));
    profile::mark("logging-set-up");
    for (k, _) in std::env::vars_os() {
        // SAFETY: the launcher is single-threaded (checked again before the
        // privilege drop); nothing else reads the environment concurrently.
        unsafe { std::env::remove_var(k) };
    }
    if args.list_steps {
        for s in STEPS {
            println!("{s}");
        }
        return ExitCode::SUCCESS;
    }
    let Some(name) = args.name.clone() else {
        return ExitCode::FAILURE;
    };
    let usage = |what| fail(LaunchError::at(STEPS[0], StepError::Usage(what)));
    if args.probe && args.cmd.is_empty() {
        return usage("--probe needs a command after --");
    }
    if !args.probe && !args.cmd.is_empty() {
        return usage("a command after -- needs --probe");
    }
    let opts = Options {
        name,
        roots: args.roots.roots(),
        spec: args.spec,
        probe: args.probe.then_some(args.cmd),
        credentials_directory,
        fault_after,
        helper_openat2_enosys,
        invocation,
        stdout_journal: vmwarden::stdout_is_journal(),
    };
    match launch::launch(opts) {
        Ok(never) => match never {},
        Err(e) => fail(e),
    }
}
