//! `vmwarden-machined`: the systemd-machined calls of the launcher,
//! cleanup and verify-clean (and the one systemd call of `vmwarden
//! start-hibernated`: starting a VM's unit), in a binary of their own so that only it
//! links zbus (see `vmwarden::host::machined`). Not for operators: its
//! callers find it beside their own executable, run it with an empty
//! environment and read the one line it prints (`ok …`, `absent …`,
//! `err …`). It exits 0 whenever it printed that line, 2 on a command
//! line it does not know.

use std::process::ExitCode;

use clap::Parser;
use vmwarden::config::names::VmName;
use vmwarden::host::machined::bus;
use vmwarden::unit::UnitNames;

/// systemd-machined calls for vmwarden's own binaries (internal).
#[derive(Debug, Parser)]
#[command(name = "vmwarden-machined", version)]
enum Call {
    /// RegisterMachine: class vm, service vmwarden, LEADER as its leader.
    Register { name: VmName, leader: u32 },
    /// GetMachine and its Leader and Service: `ok LEADER SERVICE` or `ok none`.
    Machine { name: VmName },
    /// UnregisterMachine.
    Unregister { name: VmName },
    /// systemd's StartUnit(PREFIX@NAME.service, "replace"): `ok JOB`.
    /// PREFIX is one units/unit-names.toml lists.
    StartVmUnit { prefix: String, name: VmName },
    /// systemd's StopUnit(PREFIX@NAME.service, "replace"): `ok JOB`.
    StopVmUnit { prefix: String, name: VmName },
}

fn main() -> ExitCode {
    let call = Call::parse();
    let r = match &call {
        Call::Register { name, leader } => bus::register(name.as_str(), *leader),
        Call::Machine { name } => bus::machine(name.as_str()),
        Call::Unregister { name } => bus::unregister(name.as_str()),
        Call::StartVmUnit { prefix, name } | Call::StopVmUnit { prefix, name } => {
            let stop = matches!(call, Call::StopVmUnit { .. });
            match UnitNames::for_prefix(prefix) {
                Ok(names) if stop => bus::stop_unit(&names.instance(name)),
                Ok(names) => bus::start_unit(&names.instance(name)),
                Err(e) => {
                    println!("err {e}");
                    return ExitCode::SUCCESS;
                }
            }
        }
    };
    println!("{}", bus::line(r));
    ExitCode::SUCCESS
}
