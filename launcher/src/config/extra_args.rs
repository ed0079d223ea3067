//! `hypervisor.extra_args`, the escape hatch: arguments passed after
//! vmwarden's own, refused when they would undo a guarantee. Which options,
//! and why, is data shared with `extraArgsProblems` in modules/lib.nix:
//! units/extra-args.toml, turned into constants by build.rs. The checks of
//! a value (a socket path in control/, no fw_cfg file, no tap by name) are
//! code on both sides, with the same messages, so a spec written by hand
//! meets the module's refusals. Options are matched
//! written `-opt` or `--opt` (QEMU) or `--opt=value` (cloud-hypervisor,
//! firecracker); every element is looked at, also where it is another
//! option's value. A value is read the way QEMU reads it ([`keyval`]): the
//! effective `backend=`, `type=`, `name=`, `path=` and `abstract=`
//! wherever they stand, and what cannot be told for sure is refused.

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

/// A key=value list as QEMU's option parser (QemuOpts) reads it: elements
/// split at `,`, where `,,` is a literal comma (read left to right); an
/// element without `=` is the value of the implied key when it is the
/// first one and the option has an implied key (`socket,…` is
/// `backend=socket,…`), else a flag (`server` is `server=on`, `noX` is
/// `X=off`). Pure: what the fuzzer calls.
///
/// Refused, because what QEMU makes of it is not what a reader would
/// think or cannot be told for sure: a control character, `,,` in a key
/// (QEMU ends a key at the first comma) and a key given twice (QEMU takes
/// the last, a check reading the first would be fooled).
pub fn keyval(s: &str, implied: Option<&str>) -> Result<Vec<(String, String)>, String> {
    if s.chars().any(|c| c.is_ascii_control()) {
        return Err("it holds a control character".into());
    }
    let elems: Vec<String> = s
        .replace(",,", ESC)
        .split(',')
        .map(str::to_string)
        .collect();
    // A trailing "," ends the list; only the first element may be empty.
    let mut out: Vec<(String, String)> = Vec::new();
    for (i, e) in elems
        .iter()
        .enumerate()
        .filter(|(i, e)| *i == 0 || !e.is_empty())
    {
        out.push(match e.split_once('=') {
            Some((k, v)) => (k.to_string(), v.replace(ESC, ",")),
            None => match implied {
                Some(key) if i == 0 => (key.to_string(), e.replace(ESC, ",")),
                _ => match e.strip_prefix("no") {
                    Some(k) => (k.to_string(), "off".to_string()),
                    None => (e.to_string(), "on".to_string()),
                },
            },
        });
    }
    if let Some((k, _)) = out.iter().find(|(k, _)| k.contains(ESC)) {
        return Err(format!(
            "the key {} holds \",,\", which QEMU does not read as a comma there",
            shown(&k.replace(ESC, ",,"))
        ));
    }
    if let Some((k, _)) = out
        .iter()
        .find(|(k, _)| out.iter().filter(|(o, _)| o == k).count() > 1)
    {
        return Err(format!(
            "{} is given twice; QEMU takes the last, write it once",
            shown(k)
        ));
    }
    Ok(out)
}

/// Stands for an escaped comma while splitting (refused in the input).
const ESC: &str = "\u{1}";

fn get<'a>(kv: &'a [(String, String)], k: &str) -> Option<&'a str> {
    kv.iter().find(|(o, _)| o == k).map(|(_, v)| v.as_str())
}
fn in_control(p: &str, control: &Path) -> bool {
    let p = Path::new(p);
    check_abs_normalised(p).is_ok() && p.starts_with(control) && p != control
}
/// `abstract=` (or the flag) set to anything but one of QEMU's spellings
/// of off.
fn abstract_on(kv: &[(String, String)]) -> bool {
    get(kv, "abstract").is_some_and(|v| !matches!(v, "off" | "no" | "false" | "n"))
}
fn json_form(v: &str) -> Option<String> {
    v.starts_with('{')
        .then(|| "write it in the key=value form, which these checks read".into())
}

/// The socket checks of a unix socket chardev (`-chardev socket,…` and
/// the `unix:PATH,…` shorthand of -qmp, -monitor, -serial, …).
fn socket(kv: &[(String, String)], control: &Path, what: &str) -> Option<String> {
    if get(kv, "host").is_some() || get(kv, "port").is_some() {
        return Some("a TCP socket is reachable from outside the VM's control/ directory (and the unit allows no IP sockets)".into());
    }
    if abstract_on(kv) {
        return Some("an abstract socket is reachable from the whole network namespace, not only through control/".into());
    }
    if !in_control(get(kv, "path").unwrap_or(""), control) {
        return Some(format!(
            "{what} outside {0}/ is reachable by others than vmwarden's tools; put it in {0}/",
            control.display()
        ));
    }
    None
}

/// A chardev in the shorthand of -qmp, -monitor, -serial, -parallel,
/// -debugcon and -gdb: `unix:PATH,…` (the rest a key=value list whose
/// implied key is `path`), `mon:` before it (a monitor multiplexed on it)
/// read through.
fn compat(v: &str, control: &Path, what: &str) -> Option<String> {
    let v = v.strip_prefix("mon:").unwrap_or(v);
    if ["tcp:", "telnet:", "udp:", "websocket:"]
        .iter()
        .any(|p| v.starts_with(p))
    {
        return Some("a network socket is reachable from outside the VM's control/ directory (and the unit allows no IP sockets)".into());
    }
    let rest = v.strip_prefix("unix:")?;
    match keyval(rest, Some("path")) {
        Err(why) => Some(why),
        Ok(kv) => socket(&kv, control, what),
    }
}

fn monitor(v: &str, control: &Path) -> Option<String> {
    if v == "none" {
        return None;
    }
    if !v.strip_prefix("mon:").unwrap_or(v).starts_with("unix:") {
        return Some(format!("a monitor is the VM's control plane; only a unix socket in {}/ (or none) keeps it to vmwarden's tools", control.display()));
    }
    compat(v, control, "a monitor socket")
}

fn chardev(v: &str, control: &Path) -> Option<String> {
    if let Some(why) = json_form(v) {
        return Some(why);
    }
    let kv = match keyval(v, Some("backend")) {
        Ok(kv) => kv,
        Err(why) => return Some(why),
    };
    match get(&kv, "backend") {
        None | Some("") => Some("it names no backend".into()),
        Some("udp") => Some("a network socket is reachable from outside the VM's control/ directory (and the unit allows no IP sockets)".into()),
        Some("socket") => socket(&kv, control, "a socket"),
        Some(_) => None,
    }
}

fn fw_cfg(v: &str, _control: &Path) -> Option<String> {
    let kv = match keyval(v, Some("name")) {
        Ok(kv) => kv,
        Err(why) => return Some(why),
    };
    if get(&kv, "file").is_some() {
        return Some("fw_cfg files are read by QEMU from a host path at start; give the guest a file through `credentials` (a tmpfs of the VM's own), or use string=".into());
    }
    if get(&kv, "name")
        .unwrap_or("")
        .starts_with(FW_CFG_CREDENTIAL_PREFIX)
    {
        return Some(format!(
            "names under {FW_CFG_CREDENTIAL_PREFIX} are vmwarden's credentials; use `credentials`"
        ));
    }
    None
}

fn netdev(v: &str, _control: &Path) -> Option<String> {
    if let Some(why) = json_form(v) {
        return Some(why);
    }
    let kv = match keyval(v, Some("type")) {
        Ok(kv) => kv,
        Err(why) => return Some(why),
    };
    match get(&kv, "type") {
        None | Some("") => Some("it names no type".into()),
        Some("tap" | "bridge") => Some("QEMU would open a tap (or run the bridge helper) by name; use `interfaces`, whose taps the launcher creates and hands over as file descriptors".into()),
        Some("socket" | "stream" | "dgram") => Some("QEMU would put the VM's network on a host socket (abstract, outside control/ or IP); use `interfaces`".into()),
        Some(_) => None,
    }
}

/// unix:PATH only in control/; no network sockets; the rest (stdio, null,
/// file:..., pty, ...) stays inside the sandbox.
fn chardev_spec(v: &str, control: &Path) -> Option<String> {
    compat(v, control, "a socket")
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
    fn values_are_read_as_qemu_reads_them() {
        use HypervisorKind::Qemu;
        // A monitor on an abstract socket, keys not in first place: the
        // attack that passed when only the implied first key was read.
        for args in [
            &[
                "-chardev",
                "id=m,backend=socket,path=/run/vmwarden/web/control/m.sock,abstract=on,server=on",
                "-mon",
                "chardev=m,mode=control",
            ][..],
            &[
                "-chardev",
                "id=m,backend=socket,path=/run/vmwarden/web/control/m.sock,abstract,server=on",
            ],
            &["-chardev", "id=m,path=/tmp/m.sock,server=on,backend=socket"],
            &["-chardev", "id=m,backend=udp,host=1.2.3.4,port=9"],
            &["-chardev", "file,id=f,path=/tmp/x,backend=socket"],
            &["-chardev", "id=f,path=/tmp/x"],
            &[
                "-chardev",
                "socket,id=c,path=/run/vmwarden/web/control/c.sock,abstract=yes",
            ],
            &["-chardev", "socket,id=c,pa,,th=/tmp/x"],
            &[
                "-chardev",
                "socket,id=c,path=/run/vmwarden/web/control/c.sock,path=/tmp/x",
            ],
            &[
                "-chardev",
                "socket,id=c,path=/run/vmwarden/web/control/c.sock\n",
            ],
            &["-mon", "m"],
            &["--mon", "chardev=m"],
            &[
                "-qmp",
                "unix:/run/vmwarden/web/control/q.sock,server=on,path=/tmp/q.sock",
            ],
            &["-qmp", "unix:/run/vmwarden/web/control/q.sock,abstract=on"],
            &["-serial", "mon:unix:/tmp/s.sock,server=on"],
            &["-serial", "mon:tcp:0.0.0.0:4444"],
            &["-fw_cfg", "opt/io.systemd.credentials/x,string=a"],
            &["-fw_cfg", "string=a,name=opt/io.systemd.credentials/x"],
            &["-fw_cfg", "opt/x,string=a,file=/etc/shadow"],
            &["-netdev", "id=n,type=tap,ifname=tap0"],
            &["-netdev", "id=n"],
            &[
                "-netdev",
                "stream,id=n,addr.type=unix,addr.path=/tmp/n,addr.abstract=on",
            ],
            &["-nic", "id=n,type=bridge,br=br0"],
        ] {
            assert!(
                !refused(Qemu, args).is_empty(),
                "{args:?} should be refused"
            );
        }
        for args in [
            &[
                "-chardev",
                "id=c,backend=socket,path=/run/vmwarden/web/control/c.sock,server=on,abstract=off",
            ][..],
            &[
                "-chardev",
                "socket,id=c,path=/run/vmwarden/web/control/c.sock,noabstract,server,nowait",
            ],
            &["-chardev", "file,id=f,path=/tmp/a,,b"],
            &["-fw_cfg", "opt/org.example/a,,b,string=x,,y"],
            &["-serial", "mon:stdio"],
            &["-netdev", "id=n,type=user"],
        ] {
            assert_eq!(refused(Qemu, args), vec![], "{args:?}");
        }
    }

    #[test]
    fn keyval_as_qemu() {
        let kv = |s: &str, i| keyval(s, i).unwrap();
        let pairs = |v: &[(&str, &str)]| -> Vec<(String, String)> {
            v.iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect()
        };
        assert_eq!(
            kv("socket,id=a,,b,server,nowait", Some("backend")),
            pairs(&[
                ("backend", "socket"),
                ("id", "a,b"),
                ("server", "on"),
                ("wait", "off")
            ])
        );
        // The implied key only for a first element without "=".
        assert_eq!(
            kv("id=x,socket", Some("backend")),
            pairs(&[("id", "x"), ("socket", "on")])
        );
        // ",,," is a comma, then the end of the value.
        assert_eq!(kv("a=x,,,b=y", None), pairs(&[("a", "x,"), ("b", "y")]));
        assert_eq!(kv("a=1,", None), pairs(&[("a", "1")]));
        keyval("a=1,a=2", None).unwrap_err();
        keyval("x,,y=1", None).unwrap_err();
        keyval("a=\u{1b}", None).unwrap_err();
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
