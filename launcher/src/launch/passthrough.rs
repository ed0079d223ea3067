//! The launch's side of `devices`: what the intent record names of each
//! device (with the driver it had, before anything changes), the step
//! that takes them, `RLIMIT_MEMLOCK` for what VFIO pins, and the Landlock
//! rules for exactly the nodes the hypervisor opens.

use std::path::{Path, PathBuf};

use nix::sys::resource::Resource as Rlimit;

use crate::devices::{self, pci, Plan};
use crate::host::sys::SysContext;
use crate::identity::principal::Principal;
use crate::instance::intent::Resource;
use crate::launch::landlock::{Grant, Policy, Rule};
use crate::launch::syscall::Syscall;
use crate::launch::StepError;

pub use crate::config::devices::MEMLOCK_MARGIN_MIB;

/// The intent record's entries for `plan`, in the order [`take`] makes
/// them the VM's.
pub fn records(plan: &Plan) -> Vec<Resource> {
    let pci = plan.pci.iter().map(|d| Resource::PciDevice {
        address: d.addr.to_string(),
        group: d.group,
        driver: d.driver.clone(),
        keep_on_vfio_pci: d.keep_on_vfio_pci,
    });
    let usb = plan.usb.iter().map(|d| Resource::UsbDevice {
        selector: d.selector.to_string(),
        node: d.node.clone(),
        uid: d.uid,
        gid: d.gid,
        mode: d.mode,
    });
    pci.chain(usb).collect()
}

/// The `devices` step: each PCI device on `vfio-pci`, its group's node and
/// each USB node the principal's.
pub fn take(
    claim: Option<&devices::claim::Claim>,
    plan: &Plan,
    principal: &Principal,
) -> Result<(), StepError> {
    let Some(claim) = claim else {
        return Ok(());
    };
    devices::take(claim, plan, principal.uid, principal.gid)?;
    tracing::info!(
        step = %"devices",
        pci = plan.pci.len(),
        groups = ?plan.groups(),
        usb = plan.usb.len(),
        "devices taken"
    );
    Ok(())
}

/// `RLIMIT_MEMLOCK` for a VM with a PCI device: VFIO pins all of the
/// guest's RAM for the device's DMA, counted against the principal.
pub fn set_memlock(sys: &dyn Syscall, plan: &Plan, memory_mib: u64) -> Result<(), StepError> {
    if plan.pci.is_empty() {
        return Ok(());
    }
    let bytes = (memory_mib + MEMLOCK_MARGIN_MIB) * 1024 * 1024;
    sys.setrlimit(Rlimit::RLIMIT_MEMLOCK, bytes, bytes)
        .sys("setrlimit(RLIMIT_MEMLOCK)", "/")?;
    Ok(())
}

/// The nodes the hypervisor opens, read-write, and nothing else of
/// `/dev/vfio` or `/dev/bus/usb`; each PCI device's sysfs directory, read.
pub fn landlock_rules(plan: &Plan) -> Vec<Rule> {
    let mut rules = Vec::new();
    let mut add = |path: PathBuf, grant| {
        rules.push(Rule {
            path,
            grant,
            field: Some("devices".into()),
        })
    };
    if !plan.pci.is_empty() {
        add(PathBuf::from(pci::VFIO_CONTAINER), Grant::Write);
    }
    for g in plan.groups() {
        add(pci::group_node(g), Grant::Write);
    }
    for d in &plan.pci {
        add(
            Path::new(pci::PCI_DEVICES).join(d.addr.as_str()),
            Grant::Read,
        );
    }
    for d in &plan.usb {
        add(d.node.clone(), Grant::Write);
    }
    rules
}

/// Add [`landlock_rules`] to `policy`.
pub fn extend_policy(policy: &mut Policy, plan: &Plan) {
    policy.rules.extend(landlock_rules(plan));
}

/// The USB nodes the hypervisor is given, in `devices` order.
pub fn usb_nodes(plan: &Plan) -> Vec<PathBuf> {
    plan.usb.iter().map(|d| d.node.clone()).collect()
}
