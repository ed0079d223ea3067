//! The calls on the system bus, through `zbus`'s blocking API: no
//! hand-written protocol, no `busctl`. Linked into `vmwarden-machined`
//! alone (see the parent module): each call prints one line, `ok
//! <payload>`, `absent <detail>` or `err <detail>`, which the parent
//! module reads back.

use zbus::blocking::{Connection, Proxy};
use zbus::zvariant::OwnedObjectPath;

use super::{ABSENT, DEST, MACHINE, MANAGER, NO_SUCH_MACHINE, PATH, SERVICE};

/// Why a call failed in the child: no bus to talk to at all, or an error
/// on it.
#[derive(Debug)]
pub enum CallError {
    NoBus(zbus::Error),
    Call(zbus::Error),
}

impl From<zbus::Error> for CallError {
    fn from(e: zbus::Error) -> CallError {
        CallError::Call(e)
    }
}

/// What the binary prints: `ok <payload>`, `absent <detail>`, `err <detail>`.
pub fn line(r: Result<String, CallError>) -> String {
    match r {
        Ok(p) => format!("ok {p}"),
        Err(CallError::NoBus(e)) => format!("absent no system bus: {e}"),
        Err(CallError::Call(zbus::Error::MethodError(name, msg, _)))
            if ABSENT.contains(&name.as_str()) =>
        {
            format!("absent {name}: {}", msg.unwrap_or_default())
        }
        Err(CallError::Call(zbus::Error::MethodError(name, msg, _)))
            if name.as_str() == NO_SUCH_MACHINE =>
        {
            format!("ok none {}", msg.unwrap_or_default())
        }
        Err(CallError::Call(zbus::Error::MethodError(name, msg, _))) => {
            format!("err {name}: {}", msg.unwrap_or_default())
        }
        Err(CallError::Call(e)) => format!("err {e}"),
    }
}

/// The system bus; a failure to reach it at all (no socket, no daemon)
/// is the host having no machined.
fn system_bus() -> Result<Connection, CallError> {
    Connection::system().map_err(CallError::NoBus)
}

/// `RegisterMachine(name, id=[], service="vmwarden", class="vm", leader,
/// root_directory="")`: machined takes the leader's unit (its cgroup) as
/// the machine's unit, and ends the registration when that unit stops.
pub fn register(name: &str, leader: u32) -> Result<String, CallError> {
    let c = system_bus()?;
    c.call_method(
        Some(DEST),
        PATH,
        Some(MANAGER),
        "RegisterMachine",
        &(name, Vec::<u8>::new(), SERVICE, "vm", leader, ""),
    )?;
    Ok(String::new())
}

/// `GetMachine(name)` and the machine's `Leader` and `Service`:
/// `<leader> <service>`, or `none …` when machined has no such machine.
pub fn machine(name: &str) -> Result<String, CallError> {
    let c = system_bus()?;
    let m = c.call_method(Some(DEST), PATH, Some(MANAGER), "GetMachine", &(name,))?;
    let path: OwnedObjectPath = m.body().deserialize()?;
    let p = Proxy::new(&c, DEST, path, MACHINE)?;
    let leader: u32 = p.get_property("Leader")?;
    let service: String = p.get_property("Service")?;
    Ok(format!("{leader} {service}"))
}

/// `UnregisterMachine(name)`: the registration ends; no process is
/// signalled. A machine that is already gone is not an error.
pub fn unregister(name: &str) -> Result<String, CallError> {
    let c = system_bus()?;
    c.call_method(
        Some(DEST),
        PATH,
        Some(MANAGER),
        "UnregisterMachine",
        &(name,),
    )?;
    Ok(String::new())
}

/// systemd's manager on the bus (for `start_unit`).
const SYSTEMD_DEST: &str = "org.freedesktop.systemd1";
const SYSTEMD_PATH: &str = "/org/freedesktop/systemd1";
const SYSTEMD_MANAGER: &str = "org.freedesktop.systemd1.Manager";

/// `StartUnit(unit, "replace")` on systemd's manager: the start job is
/// queued and this returns at once with the job's path (what `systemctl
/// start --no-block UNIT` does). The caller builds `unit` from a prefix
/// `units/unit-names.toml` knows and a [`VmName`](crate::config::names::VmName).
pub fn start_unit(unit: &str) -> Result<String, CallError> {
    let c = system_bus()?;
    let m = c.call_method(
        Some(SYSTEMD_DEST),
        SYSTEMD_PATH,
        Some(SYSTEMD_MANAGER),
        "StartUnit",
        &(unit, "replace"),
    )?;
    let job: OwnedObjectPath = m.body().deserialize()?;
    Ok(job.as_str().to_string())
}

/// `StopUnit(unit, "replace")`: the stop job is queued and this returns
/// with the job's path; the unit's `ExecStop=` and `ExecStopPost=` run,
/// and its `Restart=` no longer applies to this end of the service.
pub fn stop_unit(unit: &str) -> Result<String, CallError> {
    let c = system_bus()?;
    let m = c.call_method(
        Some(SYSTEMD_DEST),
        SYSTEMD_PATH,
        Some(SYSTEMD_MANAGER),
        "StopUnit",
        &(unit, "replace"),
    )?;
    let job: OwnedObjectPath = m.body().deserialize()?;
    Ok(job.as_str().to_string())
}
