//! `hypervisor.extra_args`, the escape hatch: arguments passed after
//! vmwarden's own, refused when they would undo a guarantee. Which options,
//! and why, is data shared with `extraArgsProblems` in modules/lib.nix:
//! units/extra-args.toml, turned into constants by build.rs. The checks of
//! a value (a socket path in control/, no fw_cfg file, no tap by name) are
//! code on both sides, with the same messages, so a spec written by hand
//! meets the module's refusals. Options are matched
//! written `-opt` or `--opt` (QEMU) or `--opt=value` (cloud-hypervisor,
//! firecracker); every element is looked at, also where it is another
//! option's value.

use std::path::Path;

use crate::config::names::check_abs_normalised;
use crate::config::rules::FW_CFG_CREDENTIAL_PREFIX;
use crate::config::spec::HypervisorKind;

// QEMU_ALWAYS, QEMU_VALUE, CH_REFUSED, FC_REFUSED: units/extra-args.toml,
// the data modules/lib.nix reads too.
include!(concat!(env!("OUT_DIR"), "/extra_args.rs"));

/// "@control@" in a reason is the VM's control directory.
const CONTROL: &str = "@control@";

fn lookup(table: &[(&str, &'static str)], o: &str) -> Option<&'static str> {
    table.iter().find(|(k, _)| *k == o).map(|(_, v)| *v)
}

fn reason(why: &str, control: &Path) -> String {
    why.replace(CONTROL, &control.to_string_lossy())
}

/// `(index, message)` for every refused argument, in order.
pub fn problems(kind: HypervisorKind, args: &[String], control: &Path) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (i, a) in args.iter().enumerate() {
        let why = match kind {
            HypervisorKind::Qemu => qemu_at(args, i, control),
            HypervisorKind::CloudHypervisor => table_at(CH_REFUSED, a, control),
            HypervisorKind::Firecracker => table_at(FC_REFUSED, a, control),
        };
        if let Some(w) = why {
            out.push((i, w));
        }
    }
    out
}

fn shown(a: &str) -> String {
    serde_json::to_string(a).unwrap_or_else(|_| format!("{a:?}"))
}

fn table_at(table: &[(&str, &'static str)], a: &str, control: &Path) -> Option<String> {
    let o = a.split('=').next().unwrap_or(a);
    lookup(table, o).map(|why| format!("{} is refused: {}", shown(a), reason(why, control)))
}

fn qemu_at(args: &[String], i: usize, control: &Path) -> Option<String> {
    let a = &args[i];
    // "--x" -> "-x": QEMU takes both.
    let o = a
        .strip_prefix('-')
        .filter(|r| r.starts_with('-'))
        .unwrap_or(a);
    if let Some(why) = lookup(QEMU_ALWAYS, o) {
        return Some(format!("{} is refused: {}", shown(a), reason(why, control)));
    }
    // build.rs admits only these check names.
    let check: fn(&str, &Path) -> Option<String> = match lookup(QEMU_VALUE, o)? {
        "monitor" => monitor,
        "chardev" => chardev,
        "fw_cfg" => fw_cfg,
        "netdev" => netdev,
        _ => chardev_spec,
    };
    let Some(v) = args.get(i + 1) else {
        return Some(format!("{} needs a value", shown(a)));
    };
    check(v, control).map(|why| format!("{} {} is refused: {why}", shown(a), shown(v)))
}

fn opts(s: &str) -> impl Iterator<Item = &str> {
    s.split(',')
}
fn kv<'a>(k: &str, s: &'a str) -> Option<&'a str> {
    opts(s).find_map(|o| o.strip_prefix(k)?.strip_prefix('='))
}
fn has_opt(k: &str, s: &str) -> bool {
    opts(s).any(|o| o == k || o.strip_prefix(k).is_some_and(|r| r.starts_with('=')))
}
/// The first element of -chardev (backend) or -netdev (type), which QEMU
/// also takes spelled out as `backend=`/`type=`.
fn implied<'a>(key: &str, s: &'a str) -> &'a str {
    let first = opts(s).next().unwrap_or("");
    first
        .strip_prefix(key)
        .and_then(|r| r.strip_prefix('='))
        .unwrap_or(first)
}
fn in_control(p: &str, control: &Path) -> bool {
    let p = Path::new(p);
    check_abs_normalised(p).is_ok() && p.starts_with(control) && p != control
}
fn abstract_on(v: &str) -> bool {
    has_opt("abstract", v) && kv("abstract", v) != Some("off")
}

fn monitor(v: &str, control: &Path) -> Option<String> {
    if v == "none" {
        return None;
    }
    let Some(rest) = v.strip_prefix("unix:") else {
        return Some(format!("a monitor is the VM's control plane; only a unix socket in {}/ (or none) keeps it to vmwarden's tools", control.display()));
    };
    if abstract_on(v) {
        return Some("an abstract socket is reachable from the whole network namespace".into());
    }
    let path = opts(rest).next().unwrap_or("");
    if !in_control(path, control) {
        return Some(format!("a monitor socket outside {0}/ gives control of the VM to whoever reaches it; put it in {0}/", control.display()));
    }
    None
}

fn chardev(v: &str, control: &Path) -> Option<String> {
    if v.starts_with('{') {
        return Some("write it in the key=value form, which these checks read".into());
    }
    if implied("backend", v) != "socket" {
        return None;
    }
    if kv("host", v).is_some() || kv("port", v).is_some() {
        return Some("a TCP socket is reachable from outside the VM's control/ directory (and the unit allows no IP sockets)".into());
    }
    if abstract_on(v) {
        return Some("an abstract socket is reachable from the whole network namespace, not only through control/".into());
    }
    if !in_control(kv("path", v).unwrap_or(""), control) {
        return Some(format!(
            "a socket outside {0}/ is reachable by others than vmwarden's tools; put it in {0}/",
            control.display()
        ));
    }
    None
}

fn fw_cfg(v: &str, _control: &Path) -> Option<String> {
    if opts(v).any(|o| o.starts_with("file=")) {
        return Some("fw_cfg files are read by QEMU from a host path at start; give the guest a file through `credentials` (a tmpfs of the VM's own), or use string=".into());
    }
    let first = opts(v).next().unwrap_or("");
    let name = first.strip_prefix("name=").unwrap_or(first);
    if name.starts_with(FW_CFG_CREDENTIAL_PREFIX) {
        return Some(format!(
            "names under {FW_CFG_CREDENTIAL_PREFIX} are vmwarden's credentials; use `credentials`"
        ));
    }
    None
}

fn netdev(v: &str, _control: &Path) -> Option<String> {
    if v.starts_with('{') {
        return Some("write it in the key=value form, which these checks read".into());
    }
    if matches!(implied("type", v), "tap" | "bridge") {
        return Some("QEMU would open a tap (or run the bridge helper) by name; use `interfaces`, whose taps the launcher creates and hands over as file descriptors".into());
    }
    None
}

/// unix:PATH only in control/; no network sockets; the rest (stdio, null,
/// file:..., pty, ...) stays inside the sandbox.
fn chardev_spec(v: &str, control: &Path) -> Option<String> {
    if ["tcp:", "telnet:", "udp:", "websocket:"]
        .iter()
        .any(|p| v.starts_with(p))
    {
        return Some("a network socket is reachable from outside the VM's control/ directory (and the unit allows no IP sockets)".into());
    }
    if v.starts_with("unix:") {
        return monitor(v, control);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONTROL: &str = "/run/vmwarden/web/control";

    fn refused(kind: HypervisorKind, args: &[&str]) -> Vec<(usize, String)> {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        problems(kind, &args, Path::new(CONTROL))
    }

    /// Found by the `extra_args` fuzz target: an argument that spells the
    /// reason's placeholder is shown as written, and only the reason's own
    /// placeholder becomes the control directory.
    #[test]
    fn arguments_are_shown_verbatim_even_with_the_placeholder() {
        use HypervisorKind::Qemu;
        let v = "socket,id=c,path=/re@control@/w";
        let found = refused(Qemu, &["-device", "virtio-rng-pci", "-chardev", v]);
        assert_eq!(found.len(), 1, "{found:?}");
        let (i, why) = &found[0];
        assert_eq!(*i, 2);
        assert_eq!(
            why,
            &format!(
                "\"-chardev\" \"{v}\" is refused: a socket outside {CONTROL}/ is reachable by others than \
                 vmwarden's tools; put it in {CONTROL}/"
            )
        );
    }

    #[test]
    fn qemu_refusals_in_both_spellings() {
        use HypervisorKind::Qemu;
        for args in [
            &["-sandbox", "off"][..],
            &["--sandbox", "off"],
            &["-runas", "root"],
            &["-chroot", "/"],
            &["-daemonize"],
            &["--daemonize"],
            &["-run-with", "user=root"],
            &["-readconfig", "/etc/q.cfg"],
            &["-set", "device.x.y=z"],
            &["-qmp", "tcp:127.0.0.1:4444,server=on"],
            &["-qmp", "unix:/tmp/q.sock,server=on"],
            &["-monitor", "stdio"],
            &["-chardev", "socket,id=c,path=/tmp/c.sock,server=on"],
            &["-chardev", "backend=socket,id=c,host=0.0.0.0,port=1"],
            &[
                "-chardev",
                "socket,id=c,path=/run/vmwarden/web/control/../x",
            ],
            &["-chardev", "{\"backend\":\"socket\"}"],
            &["-fw_cfg", "name=opt/x,file=/etc/shadow"],
            &["-fw_cfg", "name=opt/io.systemd.credentials/x,string=a"],
            &["-netdev", "tap,id=n,ifname=tap0"],
            &["--netdev", "type=bridge,id=n,br=br0"],
            &["-nic", "tap,ifname=x"],
            &["-net", "bridge,br=br0"],
            &["-serial", "tcp:0.0.0.0:4444"],
            &["-gdb", "unix:/tmp/g.sock"],
            &["-device", "virtio-rng-pci", "-qmp"],
        ] {
            assert!(
                !refused(Qemu, args).is_empty(),
                "{args:?} should be refused"
            );
        }
    }

    #[test]
    fn qemu_allows_what_keeps_the_guarantees() {
        use HypervisorKind::Qemu;
        for args in [
            &["-device", "virtio-rng-device"][..],
            &[
                "-qmp",
                "unix:/run/vmwarden/web/control/extra-qmp.sock,server=on,wait=off",
            ],
            &["-fw_cfg", "name=opt/org.example/role,string=web"],
            &[
                "-chardev",
                "socket,id=c,path=/run/vmwarden/web/control/c.sock,server=on",
            ],
            &["-chardev", "file,id=f,path=/tmp/x"],
            &["-netdev", "user,id=n"],
            &["-monitor", "none"],
            &["-cpu", "max"],
        ] {
            assert_eq!(refused(Qemu, args), vec![], "{args:?}");
        }
    }

    #[test]
    fn the_message_shows_the_argument_and_its_value() {
        let r = refused(HypervisorKind::Qemu, &["-device", "x", "--sandbox", "off"]);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].0, 2);
        assert!(
            r[0].1
                .starts_with("\"--sandbox\" is refused: vmwarden starts QEMU"),
            "{}",
            r[0].1
        );
        let r = refused(HypervisorKind::Qemu, &["-netdev", "tap,id=n"]);
        assert!(
            r[0].1
                .starts_with("\"-netdev\" \"tap,id=n\" is refused: QEMU would open a tap"),
            "{}",
            r[0].1
        );
    }

    #[test]
    fn cloud_hypervisor_and_firecracker_tables() {
        assert!(refused(
            HypervisorKind::CloudHypervisor,
            &["--rng", "src=/dev/urandom"]
        )
        .is_empty());
        assert_eq!(
            refused(HypervisorKind::CloudHypervisor, &["--seccomp=false"]).len(),
            1
        );
        assert_eq!(
            refused(HypervisorKind::CloudHypervisor, &["--fs", "tag=x"]).len(),
            1
        );
        assert_eq!(
            refused(HypervisorKind::Firecracker, &["--no-seccomp"]).len(),
            1
        );
        assert!(refused(HypervisorKind::Firecracker, &["--level", "Debug"]).is_empty());
        // "@control@" in the shared data is this VM's control/.
        let r = refused(HypervisorKind::CloudHypervisor, &["--api-socket=path=/x"]);
        assert!(
            r[0].1
                .ends_with("vmwarden's control socket in /run/vmwarden/web/control/"),
            "{}",
            r[0].1
        );
    }
}
