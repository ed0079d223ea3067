//! `vmwarden-cleanup`'s command line.

use vmwarden::config::names::VmName;

use super::common::{LogArgs, RootArgs};

#[derive(Debug, clap::Parser)]
#[command(
    name = "vmwarden-cleanup",
    version,
    about = "Tear down one VM's runtime state and prove it",
    long_about = "Tear down one VM's runtime state and prove it (the unit's ExecStopPost=+): \
unless the VM might be running, delete everything in its runtime dir but the keep set, check \
that no credential tmpfs and no tap of the VM survives, re-check every deletion and print one \
JSON report. Exits 0 only when the host is clean."
)]
pub struct CleanupArgs {
    /// VM name (the unit instance, %i).
    pub name: VmName,
    #[command(flatten)]
    pub roots: RootArgs,
    #[command(flatten)]
    pub log: LogArgs,
}
