//! Host devices (`devices`) on a host without an IOMMU (this one): every
//! PCI or USB device is refused before anything is created, by name, with
//! exit 78, and the host — its files, mounts, processes and the device's
//! driver — left as it was. The give-back itself needs an IOMMU: the
//! systemd suite's `pci_passthrough` scenario, in an L2 guest with QEMU's
//! emulated intel-iommu. Needs root.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

const VM: &str = "web";

/// The first PCI device of this host that is neither a bridge nor the
/// root file system's disk, and its driver (the host's own, not the
/// test's: only read, and checked unchanged).
fn a_host_pci_device() -> (String, Option<String>) {
    let root_disk = root_disk_pci();
    let mut all: Vec<String> = std::fs::read_dir("/sys/bus/pci/devices")
        .expect("this test needs a host with a PCI bus")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|a| !is_bridge(a) && Some(a) != root_disk.as_ref())
        .collect();
    all.sort();
    let addr = all.into_iter().next().expect("a PCI device");
    (addr.clone(), driver(&addr))
}

fn is_bridge(addr: &str) -> bool {
    std::fs::read_to_string(Path::new("/sys/bus/pci/devices").join(addr).join("class"))
        .is_ok_and(|c| c.trim().starts_with("0x06"))
}

/// The PCI device the host's root file system's block device is below
/// (read from sysfs as lspci and lsblk would), if it is on PCI.
fn root_disk_pci() -> Option<String> {
    let dev = nix::sys::stat::stat("/").unwrap().st_dev;
    let sys = format!(
        "/sys/dev/block/{}:{}",
        nix::sys::stat::major(dev),
        nix::sys::stat::minor(dev)
    );
    let real = std::fs::canonicalize(sys).ok()?;
    real.components()
        .rev()
        .filter_map(|c| c.as_os_str().to_str())
        .find(|c| {
            let b = c.as_bytes();
            b.len() == 12 && b[4] == b':' && b[7] == b':' && b[10] == b'.'
        })
        .map(str::to_string)
}

fn driver(addr: &str) -> Option<String> {
    std::fs::read_link(Path::new("/sys/bus/pci/devices").join(addr).join("driver"))
        .ok()
        .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()))
}

/// Launch `web` with `devices` (and `edit` applied), expect exit 78 and
/// each of `expect` in the message, and the host unchanged.
fn refused(devices: Value, edit: impl Fn(&mut Value), expect: &[&str]) {
    let env = Env::new();
    let mut s = env.spec(VM, uid(1));
    s["hypervisor"]["machine"] = json!("q35");
    s["devices"] = devices;
    edit(&mut s);
    env.write_spec(VM, &s);
    let before = snapshot(&env, &[uid(1)]);
    let mut cmd = env.launch_cmd(VM);
    cmd.arg("--probe").arg("--").arg("/bin/true");
    let out = bounded(&mut cmd, Duration::from_secs(30)).expect("the launch hung");
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(78), "not a refusal: {err}");
    for e in expect {
        assert!(err.contains(e), "message lacks {e:?}: {err}");
    }
    assert_eq!(before, snapshot(&env, &[uid(1)]), "host changed: {err}");
    assert!(
        !env.run.join(VM).join("instance.json").exists(),
        "an intent record was written: {err}"
    );
}

#[test]
fn a_pci_device_that_does_not_exist_is_refused_by_address() {
    refused(
        json!([{ "bus": "pci", "path": "0000:ff:1f.7" }]),
        |_| {},
        &[
            "error at step \"principal-resolved\"",
            "PCI device 0000:ff:1f.7 does not exist",
        ],
    );
}

#[test]
fn a_pci_device_in_no_iommu_group_is_refused_and_keeps_its_driver() {
    // This host has no IOMMU: its devices are in no group.
    let (addr, drv) = a_host_pci_device();
    assert!(
        !Path::new("/sys/bus/pci/devices")
            .join(&addr)
            .join("iommu_group")
            .exists(),
        "this host has an IOMMU: the refusal cannot be shown here"
    );
    refused(
        json!([{ "bus": "pci", "path": addr }]),
        |_| {},
        &[
            &format!("PCI device {addr} is in no IOMMU group"),
            "intel_iommu=on",
        ],
    );
    assert_eq!(driver(&addr), drv, "the device's driver changed");
}

#[test]
fn the_host_s_own_disk_controller_is_refused_before_its_driver_is_touched() {
    // The host's root file system is on this PCI device (this host's
    // virtio-blk disk): binding it to vfio-pci would take the host's disk
    // from under it. Refused before the IOMMU is even asked.
    let addr = root_disk_pci().expect("this test needs a root file system on a PCI disk");
    let drv = driver(&addr);
    refused(
        json!([{ "bus": "pci", "path": addr }]),
        |_| {},
        &[
            &format!("PCI device {addr} carries the host's file system at /"),
            "would take it from the host",
        ],
    );
    // `/` itself, not only a mount below it.
    let out = {
        let env = Env::new();
        let mut s = env.spec(VM, uid(1));
        s["hypervisor"]["machine"] = json!("q35");
        s["devices"] = json!([{ "bus": "pci", "path": addr }]);
        env.write_spec(VM, &s);
        let mut cmd = env.launch_cmd(VM);
        cmd.arg("--probe").arg("--").arg("/bin/true");
        stderr(&bounded(&mut cmd, Duration::from_secs(30)).expect("the launch hung"))
    };
    assert!(
        out.contains("file system at /,") || out.contains("file system at /:"),
        "the root file system is not named: {out}"
    );
    assert_eq!(driver(&addr), drv, "the disk's driver changed");
}

#[test]
fn a_pci_bridge_is_refused_before_its_driver_is_touched() {
    let mut bridges: Vec<String> = std::fs::read_dir("/sys/bus/pci/devices")
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|a| is_bridge(a))
        .collect();
    bridges.sort();
    let addr = bridges
        .into_iter()
        .next()
        .expect("this test needs a host with a PCI bridge (a host bridge: every PC has one)");
    let drv = driver(&addr);
    refused(
        json!([{ "bus": "pci", "path": addr }]),
        |_| {},
        &[&format!("PCI device {addr} is a bridge")],
    );
    assert_eq!(driver(&addr), drv, "the bridge's driver changed");
}

#[test]
fn a_usb_device_that_is_not_plugged_in_is_refused_by_its_selector() {
    refused(
        json!([{ "bus": "usb", "path": "vendorid=0x0627,productid=0x0001" }]),
        |_| {},
        &["no USB device matches vendorid=0x0627,productid=0x0001"],
    );
    refused(
        json!([{ "bus": "usb", "path": "hostbus=9,hostaddr=99" }]),
        |_| {},
        &["no USB device matches hostbus=9,hostaddr=99"],
    );
}

#[test]
fn spec_refusals_name_the_field() {
    let pci = json!([{ "bus": "pci", "path": "0000:01:00.0" }]);
    refused(
        pci.clone(),
        |s| s["hypervisor"]["machine"] = json!("microvm"),
        &["field `devices`", "set hypervisor.machine to \"q35\""],
    );
    refused(
        pci.clone(),
        |s| {
            s["hypervisor"]["kind"] = json!("firecracker");
            s["hypervisor"]["accel"] = json!("kvm");
        },
        &[
            "field `devices[0].bus`",
            "firecracker has no PCI passthrough",
        ],
    );
    refused(
        json!([{ "bus": "pci", "path": "01:00.0" }]),
        |_| {},
        &["field `devices[0].path`", "DDDD:BB:DD.F"],
    );
    refused(
        json!([{ "bus": "pci", "path": "0000:01:00.0", "qemu_properties": ["romfile=/etc/shadow"] }]),
        |_| {},
        &[
            "field `devices[0].qemu_properties[0]`",
            "\"romfile\" is not a vfio-pci property",
        ],
    );
    refused(
        json!([{ "bus": "pci", "path": "0000:01:00.0" }, { "bus": "pci", "path": "0000:01:00.0" }]),
        |_| {},
        &["field `devices[1].path`", "list each device once"],
    );
    refused(
        json!([]),
        |s| s["allow_unsafe_interrupts"] = json!(true),
        &["field `allow_unsafe_interrupts`", "no PCI device"],
    );
}

/// A cleanup that gives a USB node back after its device was unplugged
/// and another device enumerated at the same bus and address (a device in
/// DFU mode re-enumerates by itself; usbfs numbers wrap at 127) must not
/// put the old device's owner and mode on the new device's node: a node
/// the VM's principal does not own is not the one the launch gave it.
///
/// This host has no USB bus, so the usbfs nodes are character devices
/// made with mknod in a temporary directory (usb_device's major, 189),
/// standing in for /dev/bus/usb/BBB/DDD; cleanup's give-back runs for real
/// on them through the intent record, as vmwarden-cleanup calls it.
#[test]
fn a_usb_node_replaced_by_another_device_keeps_its_own_mode_at_cleanup() {
    use nix::sys::stat::{mknod, Mode, SFlag};
    use std::os::unix::fs::MetadataExt;
    use vmwarden::instance::intent::Resource;
    use vmwarden::teardown::devices::give_back;

    require_root();
    let dir = tempfile::tempdir().unwrap();
    let node = dir.path().join("005");
    let rdev = nix::sys::stat::makedev(189, 4);
    let principal = uid(1);
    // The device the VM was given: udev left it 0666 (a dev board's rule);
    // the launch recorded root:root 0666 and gave it to the principal.
    mknod(&node, SFlag::S_IFCHR, Mode::from_bits_truncate(0o600), rdev).unwrap();
    nix::unistd::chown(&node, Some(principal.into()), Some(principal.into())).unwrap();
    // Unplugged while the VM ran; another device took bus 1 address 5:
    // devtmpfs made its node root's 0600.
    std::fs::remove_file(&node).unwrap();
    mknod(&node, SFlag::S_IFCHR, Mode::from_bits_truncate(0o600), rdev).unwrap();
    let ino = std::fs::metadata(&node).unwrap().ino();
    // Beside it, a device still plugged in: its node is the principal's
    // and goes back to what the record says.
    let kept = dir.path().join("006");
    mknod(&kept, SFlag::S_IFCHR, Mode::from_bits_truncate(0o600), rdev).unwrap();
    nix::unistd::chown(&kept, Some(principal.into()), Some(principal.into())).unwrap();
    // And one another VM took (its principal owns the node now): that VM's
    // to give back, never this cleanup's.
    let taken = dir.path().join("007");
    mknod(
        &taken,
        SFlag::S_IFCHR,
        Mode::from_bits_truncate(0o600),
        rdev,
    )
    .unwrap();
    nix::unistd::chown(&taken, Some(uid(2).into()), Some(uid(2).into())).unwrap();

    let intent = intent_of(
        VM,
        principal,
        vec![
            Resource::UsbDevice {
                selector: "hostbus=1,hostaddr=5".into(),
                node: node.clone(),
                uid: 0,
                gid: 0,
                mode: 0o666,
            },
            Resource::UsbDevice {
                selector: "hostbus=1,hostaddr=6".into(),
                node: kept.clone(),
                uid: 0,
                gid: 0,
                mode: 0o664,
            },
            Resource::UsbDevice {
                selector: "hostbus=1,hostaddr=7".into(),
                node: taken.clone(),
                uid: 0,
                gid: 0,
                mode: 0o664,
            },
        ],
    );
    let given = give_back(Some(&intent));
    let m = std::fs::metadata(&node).unwrap();
    assert_eq!(m.ino(), ino, "the test's node was replaced");
    assert_eq!(
        (m.uid(), m.gid(), m.mode() & 0o7777),
        (0, 0, 0o600),
        "cleanup put the unplugged device's mode on another device's node: {given:?}"
    );
    assert_eq!(given.failed.len(), 1, "{:?}", given.failed);
    assert!(
        given.failed[0].path == taken && given.failed[0].reason.contains("another VM's now"),
        "{:?}",
        given.failed
    );
    let t = std::fs::metadata(&taken).unwrap();
    assert_eq!(
        (t.uid(), t.mode() & 0o7777),
        (uid(2), 0o600),
        "cleanup took another VM's node"
    );
    let k = std::fs::metadata(&kept).unwrap();
    assert_eq!(
        (k.uid(), k.gid(), k.mode() & 0o7777),
        (0, 0, 0o664),
        "the node still the VM's was not given back: {given:?}"
    );
}
