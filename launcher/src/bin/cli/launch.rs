//! `vmwarden-launch`'s command line.

use std::path::PathBuf;

use vmwarden::config::names::VmName;

use super::common::{LogArgs, RootArgs};

#[derive(Debug, clap::Parser)]
#[command(
    name = "vmwarden-launch",
    version,
    about = "Launch one microVM in its own sandbox",
    long_about = "Launch one microVM in its own sandbox: validate the spec, take the VM's lease, \
record the intent, build the private mount namespace and credential tmpfs, drop to the VM's \
principal and execve the hypervisor (the unit's ExecStart=). On success the process is the \
hypervisor; see docs/exit-codes.md for the exit statuses."
)]
pub struct LaunchArgs {
    /// VM name (the unit instance, %i).
    #[arg(required_unless_present = "list_steps")]
    pub name: Option<VmName>,
    /// Spec path (default CONFIG_DIR/NAME.json).
    #[arg(long, value_name = "PATH")]
    pub spec: Option<PathBuf>,
    #[command(flatten)]
    pub roots: RootArgs,
    #[command(flatten)]
    pub log: LogArgs,
    /// Print the launch step names in order and exit.
    #[arg(long)]
    pub list_steps: bool,
    /// Run CMD in the identical sandbox instead of the hypervisor.
    #[arg(long, requires = "cmd")]
    pub probe: bool,
    /// The probe command (after `--`).
    #[arg(last = true, value_name = "CMD")]
    pub cmd: Vec<String>,
}
