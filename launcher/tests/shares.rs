//! Shares, disks and vsock with a real TCG guest: 9p shares (QEMU's own -fsdev), a disk
//! serial and extra_args; virtiofs shares and the user vsock backend served
//! by helper daemons (virtiofsd, vhost-device-vsock) the launcher starts as
//! the principal. The guest is tests/assets/build-guest-shares.sh's (the
//! generic Debian kernel: the cloud kernel has no 9p). The daemons are
//! tests/setup-host.sh's. Needs root; the kill-after-every-step case needs
//! `--features fault-injection`.

mod common;

use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use serde_json::json;
use vmwarden::host::procs::processes_of_uid;
use vmwarden::launch::helpers::{BROKER_CAPS, KEPT_CAPS};

const BOOT: Duration = Duration::from_secs(180);

fn dir(env: &Env, rel: &str, owner: u32, mode: u32) -> PathBuf {
    let p = env.path(rel);
    std::fs::create_dir_all(&p).unwrap();
    std::os::unix::fs::chown(&p, Some(owner), Some(owner)).unwrap();
    std::fs::set_permissions(&p, PermissionsExt::from_mode(mode)).unwrap();
    p
}

/// A file of root's, 0644, in `dir`.
fn file(dir: &Path, name: &str, content: &[u8]) {
    std::fs::write(dir.join(name), content).unwrap();
    std::fs::set_permissions(dir.join(name), PermissionsExt::from_mode(0o644)).unwrap();
}

/// The read-only share's source (root's, with `hello`) and another VM's
/// share source (`other_uid`'s, with `secret`), world-readable, so only
/// the sandbox can keep this VM out of it.
fn ro_and_other(env: &Env, other_uid: u32) -> (PathBuf, PathBuf) {
    let ro = dir(env, "ro-src", 0, 0o755);
    file(&ro, "hello", b"from the host\n");
    let other = dir(env, "db-src", other_uid, 0o755);
    file(&other, "secret", b"db's\n");
    (ro, other)
}

/// The VM `web`'s sandbox (a probe instead of the hypervisor) cannot read
/// the other VM's `secret`.
fn assert_probe_cannot_read_secret(env: &Env, other: &Path) {
    let probe = env.probe(
        "web",
        &["/bin/cat", &other.join("secret").to_string_lossy()],
    );
    assert!(!probe.status.success(), "{}", text(&probe));
}

/// The guest's console has every line of `want` and no failed mount.
fn assert_guest_said(out: &str, want: &[&str]) {
    for want in want {
        assert!(out.contains(want), "guest output lacks {want:?}:\n{out}");
    }
    assert!(!out.contains("T-MOUNT-"), "{out}");
}

#[test]
fn a_guest_mounts_9p_shares_writes_as_its_principal_and_cannot_reach_another_vms_share() {
    let env = Env::new();
    let (ro, other) = ro_and_other(&env, uid(22));
    let rw = dir(&env, "rw-src", uid(21), 0o700);
    let img = env.path("data.img");
    let f = std::fs::File::create(&img).unwrap();
    f.set_len(8 * 1024 * 1024).unwrap();
    drop(f);
    std::os::unix::fs::chown(&img, Some(uid(21)), Some(uid(21))).unwrap();

    // The guest: mount both shares, read, write, try the read-only one,
    // try a device node and a setuid bit on the writable one.
    let script = "\
mount -t 9p -o trans=virtio,version=9p2000.L,ro ro /mnt || echo T-MOUNT-RO-FAILED
mkdir -p /rw && mount -t 9p -o trans=virtio,version=9p2000.L rw /rw || echo T-MOUNT-RW-FAILED
echo \"T-READ $(cat /mnt/hello)\"
echo guest-wrote >/rw/out && echo T-WROTE
if echo x >/mnt/evil 2>/dev/null; then echo T-RO-WRITE-SUCCEEDED; else echo T-RO-WRITE-REFUSED; fi
mknod /rw/node c 1 3 2>/dev/null; echo T-MKNOD rc=$?
echo '#!/bin/sh' >/rw/suid && chmod 4755 /rw/suid; echo T-CHMOD rc=$?
echo \"T-GUEST-SEES $(stat -c '%A' /rw/node) $(stat -c '%A' /rw/suid)\"
sync; umount /rw; umount /mnt
";
    let mut spec = env.shares_spec("web", uid(21), "hold", script);
    spec["shares"] = json!([
        { "tag": "ro", "source": ro, "proto": "9p", "read_only": true },
        { "tag": "rw", "source": rw, "proto": "9p", "read_only": false }
    ]);
    spec["disks"] = json!([{ "path": img, "serial": "data-1" }]);
    spec["hypervisor"]["extra_args"] = json!(["-device", "virtio-rng-pci"]);
    env.write_spec("web", &spec);

    // Another VM's share source is out of this VM's sandbox (Landlock):
    // the same launch, probing instead of exec'ing QEMU.
    assert_probe_cannot_read_secret(&env, &other);
    env.cleanup_clean("web");
    // ...while its own read-only share is readable there.
    let probe = env.probe("web", &["/bin/cat", &ro.join("hello").to_string_lossy()]);
    assert!(probe.status.success(), "{}", text(&probe));
    let (o, _) = env.cleanup("web");
    assert!(o.status.success(), "{}", text(&o));

    let mut g = env.start("web");
    g.wait_for("VMWARDEN-GUEST-READY", BOOT);
    assert_guest_said(
        &g.log_text(),
        &[
            "VMWARDEN-DISK name=vda bytes=8388608 serial=data-1",
            "T-READ from the host",
            "T-WROTE",
            "T-RO-WRITE-REFUSED",
            "T-MKNOD rc=0",
            "T-CHMOD rc=0",
            // The guest believes it made a device node and a setuid file...
            "T-GUEST-SEES crw-r--r-- -rwsr-xr-x",
            "VMWARDEN-RUN-END rc=0",
        ],
    );

    // The guest's write is the principal's file on the host.
    let md = std::fs::metadata(rw.join("out")).unwrap();
    assert_eq!((md.uid(), md.gid()), (uid(21), uid(21)));
    assert_eq!(std::fs::read(rw.join("out")).unwrap(), b"guest-wrote\n");
    // The read-only share is as it was.
    let names: Vec<_> = std::fs::read_dir(&ro)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["hello"]);
    // ...but with mapped-xattr neither exists on the host: both are plain
    // files of the principal's, their guest modes only in xattrs.
    assert!(rw.join("node").is_file() && rw.join("suid").is_file());
    for e in std::fs::read_dir(&rw).unwrap() {
        let e = e.unwrap();
        let md = std::fs::symlink_metadata(e.path()).unwrap();
        assert!(
            md.file_type().is_file() || md.file_type().is_dir(),
            "{:?} is {:?} on the host",
            e.path(),
            md.file_type()
        );
        assert_eq!(md.mode() & 0o6000, 0, "{:?} has a set-id bit", e.path());
        assert_eq!(md.uid(), uid(21), "{:?}", e.path());
    }

    let stop = env.vmwarden(&["stop", "web", "--timeout", "30"]);
    assert!(stop.status.success(), "{}", text(&stop));
    assert!(g.wait_exit(Duration::from_secs(10)).is_some());
    env.cleanup_clean("web");
    // Cleanup leaves the share sources and the disk alone.
    assert!(rw.join("out").is_file() && img.is_file());
}

/// A spec for VM `web` of `u` with one writable virtiofs share, `vrw`.
fn vrw_spec(env: &Env, u: u32) -> serde_json::Value {
    let rw = dir(env, "rw-src", u, 0o700);
    let mut spec = env.spec("web", u);
    spec["shares"] = json!([{ "tag": "vrw", "source": rw, "proto": "virtiofs" }]);
    spec
}

/// The spec fields of the helpers: virtiofsd and the user vsock backend.
fn with_helpers(spec: &mut serde_json::Value, cid: u64) {
    spec["virtiofsd"] = json!({ "binary": daemon("virtiofsd") });
    spec["vsock"] =
        json!({ "cid": cid, "backend": "user", "binary": daemon("vhost-device-vsock") });
}

/// Processes of `uid` other than `not`, with their `comm`.
fn helpers_of(uid: u32, not: u32) -> Vec<(u32, String)> {
    processes_of_uid(uid)
        .into_iter()
        .filter(|p| *p != not)
        .filter_map(|p| {
            let comm = std::fs::read_to_string(format!("/proc/{p}/comm")).ok()?;
            Some((p, comm.trim().to_string()))
        })
        .collect()
}

/// The one virtiofsd among the helpers of `u` (children of `parent`).
fn virtiofsd_of(u: u32, parent: u32) -> u32 {
    let v: Vec<u32> = helpers_of(u, parent)
        .into_iter()
        .filter(|(_, c)| c == "virtiofsd")
        .map(|(p, _)| p)
        .collect();
    assert_eq!(v.len(), 1, "{v:?}");
    v[0]
}

/// Wait (10 s at most) until no process of `u` is left.
fn wait_helpers_gone(u: u32, what: &str) {
    wait_until(what, Duration::from_secs(10), || {
        helpers_of(u, 0).is_empty()
    });
}

/// `vmwarden-launch web --probe -- /bin/sleep 600`, returned once the probe
/// sleeps with `helpers` processes of `u` beside it. The probe stands in
/// for the hypervisor: it never connects, so the daemons would wait for
/// ever; only the death signal ends them.
fn sleeping_probe(env: &Env, u: u32, helpers: usize, what: &str) -> Probe {
    sleeping_probe_with(env, u, helpers, what, &[])
}

/// [`sleeping_probe`] with `vars` in the launcher's environment.
fn sleeping_probe_with(
    env: &Env,
    u: u32,
    helpers: usize,
    what: &str,
    vars: &[(&str, &str)],
) -> Probe {
    let mut c = env.launch_cmd("web");
    c.args(["--probe", "--", "/bin/sleep", "600"]);
    c.envs(vars.iter().copied());
    let child = Probe(c.spawn().unwrap());
    let pid = child.id();
    wait_until(what, Duration::from_secs(30), || {
        helpers_of(u, pid).len() == helpers
            && std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "sleep")
    });
    child
}

/// A sleeping probe (the hypervisor's stand-in), killed when dropped: a
/// test that fails while it sleeps leaves no process of its uid behind.
struct Probe(std::process::Child);

impl std::ops::Deref for Probe {
    type Target = std::process::Child;
    fn deref(&self) -> &std::process::Child {
        &self.0
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Kill the probe and wait until its helpers are gone too.
fn kill_probe(child: Probe, u: u32) {
    drop(child);
    wait_helpers_gone(u, "helpers gone");
}

/// Each helper runs as the principal, with every capability set empty, no
/// supplementary group, no_new_privs and a seccomp filter, in the mount
/// namespace of `parent` (the hypervisor), as its child.
fn assert_sandboxed_helpers(u: u32, parent: u32, want: &[&str]) {
    let hs = helpers_of(u, parent);
    let mut names: Vec<_> = hs.iter().map(|(_, c)| c.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, want, "{hs:?}");
    let ns = |p: u32| std::fs::read_link(format!("/proc/{p}/ns/mnt")).unwrap();
    assert_ne!(
        ns(parent),
        ns(std::process::id()),
        "not in a private namespace"
    );
    let userns = |p: u32| std::fs::read_link(format!("/proc/{p}/ns/user")).unwrap();
    for (pid, comm) in &hs {
        // The virtiofsd of a share the guest owns: root of a user
        // namespace of its own, with six capabilities there and none in
        // the host's (see `owned_share_namespace`); every other helper has
        // none anywhere.
        let owned = userns(*pid) != userns(std::process::id());
        let kept = format!(
            "{:016x}",
            caps_mask(if comm == "vmwarden-broker" {
                BROKER_CAPS
            } else {
                KEPT_CAPS
            })
        );
        for key in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
            // (virtiofsd empties its bounding set itself once started.)
            let broker = comm == "vmwarden-broker";
            let want =
                if owned && (["CapPrm", "CapEff"].contains(&key) || broker && key == "CapBnd") {
                    kept.as_str()
                } else {
                    "0000000000000000"
                };
            assert_eq!(proc_status(*pid, key), want, "{comm} {pid}: {key}");
        }
        if owned {
            assert!(
                comm == "virtiofsd" || comm == "vmwarden-broker",
                "{comm} {pid} in a user namespace"
            );
            owned_share_namespace(*pid, u);
        }
        let us = format!("{u}\t{u}\t{u}\t{u}");
        assert_eq!(proc_status(*pid, "Uid"), us, "{comm}");
        assert_eq!(proc_status(*pid, "Gid"), us, "{comm}");
        assert_eq!(proc_status(*pid, "Groups"), "", "{comm}");
        assert_eq!(proc_status(*pid, "NoNewPrivs"), "1", "{comm}");
        assert_eq!(proc_status(*pid, "Seccomp"), "2", "{comm}");
        assert_eq!(proc_status(*pid, "PPid"), parent.to_string(), "{comm}");
        // virtiofsd has a namespace of its own, rooted in its share (its
        // broker joins it); the vsock daemon shares the hypervisor's.
        if comm == "virtiofsd" || comm == "vmwarden-broker" {
            assert_ne!(ns(*pid), ns(parent), "{comm} {pid}: mount namespace");
        } else {
            assert_eq!(ns(*pid), ns(parent), "{comm} {pid}: mount namespace");
        }
    }
}

/// The bits of `caps` in a `/proc/PID/status` capability mask.
fn caps_mask(caps: &[caps::Capability]) -> u64 {
    caps.iter().map(|c| 1u64 << c.index()).sum()
}

/// The virtiofsd `pid` of a share the guest owns runs in a user namespace
/// whose maps are root's: guest 0 is the principal `u`, guest 1 to 65535
/// the VM's own range; its parent namespace is the host's (so it has no
/// capability there).
fn owned_share_namespace(pid: u32, u: u32) {
    let map = |f: &str| -> Vec<Vec<u64>> {
        std::fs::read_to_string(format!("/proc/{pid}/{f}"))
            .unwrap()
            .lines()
            .map(|l| l.split_whitespace().map(|x| x.parse().unwrap()).collect())
            .collect()
    };
    for f in ["uid_map", "gid_map"] {
        let m = map(f);
        assert_eq!(m.len(), 2, "{f} of {pid}: {m:?}");
        assert_eq!(m[0], [0, u64::from(u), 1], "{f} of {pid}");
        assert_eq!((m[1][0], m[1][2]), (1, 65_535), "{f} of {pid}");
        assert!(
            m[1][1] > 0x7000_0000 && m[1][1] < 0x7FFE_0000,
            "{f} of {pid}"
        );
    }
    // Its namespace's owner is root, and its parent is the host's: from
    // the host's user namespace it is a process of uid u with no
    // capability (CapEff above counts in its own namespace only).
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(
        status.contains(&format!("\nUid:\t{u}\t{u}\t{u}\t{u}\n")),
        "{status}"
    );
}

#[test]
fn a_guest_mounts_virtiofs_and_9p_shares_and_talks_over_user_vsock_through_sandboxed_helpers() {
    let env = Env::new();
    let u = uid(160);
    let (ro, other) = ro_and_other(&env, uid(161));
    let rw = dir(&env, "rw-src", u, 0o700);
    let p9 = dir(&env, "p9-src", u, 0o700);

    let script = "\
mount -t virtiofs vro /mnt || echo T-MOUNT-VRO-FAILED
mkdir -p /vrw /p9
mount -t virtiofs vrw /vrw || echo T-MOUNT-VRW-FAILED
mount -t 9p -o trans=virtio,version=9p2000.L p9 /p9 || echo T-MOUNT-P9-FAILED
echo \"T-READ $(cat /mnt/hello)\"
echo guest-wrote >/vrw/out && echo T-WROTE
echo p9-wrote >/p9/out && echo T-P9-WROTE
if echo x >/mnt/evil 2>/dev/null; then echo T-RO-WRITE-SUCCEEDED; else echo T-RO-WRITE-REFUSED; fi
sync
/bin/vsock-echo 1234 &
";
    let mut spec = env.shares_spec("web", u, "hold", script);
    spec["shares"] = json!([
        { "tag": "vro", "source": ro, "proto": "virtiofs", "read_only": true },
        { "tag": "vrw", "source": rw, "proto": "virtiofs", "read_only": false },
        { "tag": "p9", "source": p9, "proto": "9p", "read_only": false }
    ]);
    with_helpers(&mut spec, 7);
    env.write_spec("web", &spec);

    // Another VM's share source is out of this VM's sandbox (Landlock).
    assert_probe_cannot_read_secret(&env, &other);
    // (The helpers of that probe die with it: their death signal is sent
    // as it exits, their own exit follows.)
    wait_helpers_gone(u, "the probe's helpers gone");
    env.cleanup_clean("web");

    let mut g = env.start("web");
    g.wait_for("VMWARDEN-GUEST-READY", BOOT);
    g.wait_for("VSOCK-ECHO listening port=1234", BOOT);
    assert_guest_said(
        &g.log_text(),
        &[
            "T-READ from the host",
            "T-WROTE",
            "T-P9-WROTE",
            "T-RO-WRITE-REFUSED",
            "VMWARDEN-VSOCK dev=present",
            "VSOCK-ECHO cid=7",
            "VMWARDEN-RUN-END rc=0",
        ],
    );

    // Hybrid vsock: the host side is a unix socket in control/.
    let sock = env.run.join("web/control/vsock.sock");
    let mut c = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    use std::io::{BufRead, Write};
    c.write_all(b"CONNECT 1234\n").unwrap();
    let mut r = std::io::BufReader::new(c.try_clone().unwrap());
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    assert!(line.starts_with("OK "), "{line:?}");
    c.write_all(b"ping-from-host\n").unwrap();
    line.clear();
    r.read_line(&mut line).unwrap();
    assert_eq!(line, "guest-got:ping-from-host\n");
    g.wait_for("VSOCK-ECHO got=ping-from-host", BOOT);

    // The helpers: two virtiofsd and the vsock daemon, sandboxed, children
    // of QEMU in its namespace; the socket virtiofsd serves is the
    // principal's.
    assert_sandboxed_helpers(
        u,
        g.pid(),
        &[
            "vhost-device-vs",
            "virtiofsd",
            "virtiofsd",
            "vmwarden-broker",
        ],
    );
    let md = std::fs::symlink_metadata(env.run.join("web/control/virtiofs-vrw.sock")).unwrap();
    assert_eq!((md.uid(), md.mode() & 0o777), (u, 0o600));
    let rec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(env.run.join("web/instance.json")).unwrap()).unwrap();
    let helpers: Vec<_> = rec["resources"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["kind"] == "helper")
        .map(|r| (r["helper"].as_str().unwrap(), r["tag"].as_str()))
        .collect();
    assert_eq!(
        helpers,
        [
            ("virtiofsd", Some("vro")),
            ("virtiofsd", Some("vrw")),
            ("vhost-device-vsock", None)
        ]
    );

    // The guest's writes are the principal's files on the host; the
    // read-only share is as it was.
    for (f, want) in [
        (rw.join("out"), "guest-wrote\n"),
        (p9.join("out"), "p9-wrote\n"),
    ] {
        let md = std::fs::metadata(&f).unwrap();
        assert_eq!((md.uid(), md.gid()), (u, u), "{f:?}");
        assert_eq!(std::fs::read_to_string(&f).unwrap(), want);
    }
    let names: Vec<_> = std::fs::read_dir(&ro)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["hello"]);

    let stop = env.vmwarden(&["stop", "web", "--timeout", "60"]);
    assert!(stop.status.success(), "{}", text(&stop));
    assert!(g.wait_exit(Duration::from_secs(10)).is_some());
    // Gone with the hypervisor: nothing of the principal is left.
    assert_eq!(helpers_of(u, 0), vec![]);
    env.assert_clean("web");
    assert!(rw.join("out").is_file());
}

#[test]
fn helpers_die_with_a_sigkilled_hypervisor_and_cleanup_is_clean() {
    let env = Env::new();
    let u = uid(162);
    let mut spec = vrw_spec(&env, u);
    with_helpers(&mut spec, 8);
    env.write_spec("web", &spec);
    for _ in 0..2 {
        let child = sleeping_probe(&env, u, 3, "four processes of the uid");
        assert_sandboxed_helpers(
            u,
            child.id(),
            &["vhost-device-vs", "virtiofsd", "vmwarden-broker"],
        );
        // Live: cleanup refuses.
        let (o, _) = env.cleanup("web");
        assert!(!o.status.success(), "{}", text(&o));
        kill_probe(child, u);
        env.assert_clean("web");
    }
}

#[test]
fn a_helper_that_fails_to_start_fails_the_launch_naming_it() {
    let env = Env::new();
    let u = uid(163);
    let mut spec = env.spec("web", u);
    with_helpers(&mut spec, 9);
    // Root's, executable, exits at once: never makes its sockets.
    spec["vsock"]["binary"] = json!("/bin/false");
    env.write_spec("web", &spec);
    let o = env.probe("web", &["/bin/true"]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("at step \"helpers-started\"")
            && e.contains("vhost-device-vsock (/bin/false) exited"),
        "{}",
        text(&o)
    );
    assert_eq!(helpers_of(u, 0), vec![]);
    env.cleanup_clean("web");
}

#[test]
fn kill_at_every_launch_step_with_helpers_leaves_no_helper() {
    require_fault_injection();
    let env = Env::new();
    let u = uid(164);
    let mut spec = vrw_spec(&env, u);
    with_helpers(&mut spec, 10);
    env.write_spec("web", &spec);
    let steps = launch_steps();
    assert!(steps.iter().any(|s| s == "helpers-started"), "{steps:?}");
    for step in &steps {
        env.launch_killed_after("web", step);
        // The death signal reached every helper (it is delivered as the
        // launcher exits; the helper's own exit follows).
        wait_helpers_gone(u, &format!("helpers gone after {step}"));
        env.assert_clean_after("web", step);
    }
    let ok = env.probe("web", &["/bin/true"]);
    assert!(ok.status.success(), "{}", text(&ok));
    wait_helpers_gone(u, "helpers gone after the probe");
    env.cleanup_clean("web");
}

#[test]
fn cloud_hypervisor_gets_a_virtiofsd_per_share_and_serves_its_vsock_itself() {
    let env = Env::new();
    let u = uid(165);
    let mut spec = vrw_spec(&env, u);
    spec["hypervisor"] =
        json!({ "kind": "cloud-hypervisor", "binary": "/bin/true", "accel": "kvm" });
    spec["virtiofsd"] = json!({ "binary": daemon("virtiofsd") });
    spec["vsock"] = json!({ "cid": 11, "backend": "user" });
    env.write_spec("web", &spec);
    // The probe stands in for cloud-hypervisor (none is installed here).
    // reboot-watch reads its event monitor (config::reboot).
    let child = sleeping_probe(
        &env,
        u,
        3,
        "the probe, its virtiofsd, broker and reboot-watch",
    );
    assert_sandboxed_helpers(
        u,
        child.id(),
        &["reboot-watch", "virtiofsd", "vmwarden-broker"],
    );
    assert!(env.run.join("web/control/virtiofs-vrw.sock").exists());
    assert!(!env.run.join("web/control/vsock-vhost-user.sock").exists());
    kill_probe(child, u);
    env.cleanup_clean("web");
}

/// `(st_dev, st_ino)` of `p`, following links (`/proc/PID/root` is one).
fn ident(p: &Path) -> std::io::Result<(u64, u64)> {
    std::fs::metadata(p).map(|m| (m.dev(), m.ino()))
}

/// `/proc/PID/root` joined with the absolute `p`: `p` as process `pid`
/// resolves it (the kernel walks it from that process's root).
fn as_seen_by(pid: u32, p: &Path) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/root")).join(p.strip_prefix("/").unwrap())
}

/// virtiofsd (`pid`) is confined to `share`: its root is the share, `..`
/// of its root is its root, nothing else is mounted in its namespace (the
/// one mount is nosuid,nodev), and `gone` (the control dir, the host's
/// files) does not exist for it.
fn assert_rooted_in_share(pid: u32, share: &Path, gone: &[&Path]) {
    let root = PathBuf::from(format!("/proc/{pid}/root"));
    assert_eq!(
        ident(&root).unwrap(),
        ident(share).unwrap(),
        "root of {pid}"
    );
    assert_eq!(
        ident(&root.join("..")).unwrap(),
        ident(share).unwrap(),
        ".. of the root of {pid}"
    );
    for p in gone {
        let seen = as_seen_by(pid, p);
        assert!(
            std::fs::symlink_metadata(&seen)
                .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound),
            "{} is reachable from virtiofsd {pid}'s root ({})",
            p.display(),
            seen.display()
        );
    }
    let mi = String::from_utf8(read_proc_bytes(pid, "mountinfo")).unwrap();
    let mounts: Vec<(&str, &str)> = mi
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            Some((*f.get(4)?, *f.get(5)?))
        })
        .collect();
    assert_eq!(
        mounts.len(),
        1,
        "virtiofsd {pid} sees more than its share:\n{mi}"
    );
    let (at, opts) = mounts[0];
    assert_eq!(at, "/", "{mi}");
    assert!(
        opts.split(',').any(|o| o == "nosuid") && opts.split(',').any(|o| o == "nodev"),
        "{mi}"
    );
}

fn mode_of(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

/// What a guest sends to virtiofsd, raw: `..` at the share's root, names
/// with `/` that climb out, a SETATTR on the root's parent and a set-id
/// SETATTR. `share` holds `hello`; its parent is the test's directory.
fn guest_attacks(share: &Path, socket: &Path) {
    const ENOENT: i32 = libc::ENOENT;
    let parent = share.parent().unwrap();
    let (share_ino, parent_mode) = (ident(share).unwrap().1, mode_of(parent));
    let mut g = frontend::Frontend::connect(socket);
    g.init();
    // LOOKUP ".." at the root is the root.
    let (up, ino) = g.lookup(1, b"..").unwrap();
    assert_eq!(
        ino, share_ino,
        "LOOKUP .. at the share's root left the share"
    );
    let (_, ino) = g.lookup(up, b"..").unwrap();
    assert_eq!(ino, share_ino, "LOOKUP .. of .. left the share");
    // Names with "/" that climb out find nothing of the host.
    for name in [
        &b"../../../../../../etc/passwd"[..],
        b"../../../../../../proc/net/unix",
        b"/etc/passwd",
        b"../rw-src/hello",
    ] {
        let got = g.lookup(1, name);
        assert!(
            matches!(got, Err(e) if e == ENOENT || e == libc::EINVAL),
            "LOOKUP {:?}: {got:?}",
            String::from_utf8_lossy(name)
        );
    }
    // The share itself is there.
    let (hello, _) = g.lookup(1, b"hello").unwrap();
    // SETATTR on the root's parent changes the share, never its parent.
    assert_eq!(g.chmod(up, 0o750), 0);
    assert_eq!(mode_of(share), 0o750);
    assert_eq!(
        mode_of(parent),
        parent_mode,
        "the share's parent changed mode"
    );
    // A set-id mode through the share is refused (the helpers' filter),
    // whether set on a file or given to the call that creates it.
    assert_eq!(g.chmod(hello, 0o4755), libc::EPERM);
    assert_eq!(g.chmod(hello, 0o2755), libc::EPERM);
    assert_eq!(mode_of(&share.join("hello")) & 0o6000, 0);
    assert_eq!(g.create(1, b"c-suid", 0o104_755), libc::EPERM);
    assert_eq!(g.mknod(1, b"m-sgid", 0o102_755), libc::EPERM);
    assert_eq!(g.create(1, b"c-plain", 0o100_644), 0);
    for e in std::fs::read_dir(share).unwrap().flatten() {
        let mode = mode_of(&e.path());
        assert_eq!(mode & 0o6000, 0, "{:?} has mode {mode:o}", e.path());
    }
    assert!(!share.join("c-suid").exists() && !share.join("m-sgid").exists());
}

/// A guest stays inside its virtiofs share: each virtiofsd runs in a mount
/// namespace of its own whose root is its share, made before the guest
/// can send anything, so what keeps its lookups inside is the kernel's
/// `..` at a process's root, not virtiofsd's `openat2(RESOLVE_IN_ROOT)`
/// guard. Once as the launcher starts it, once with every helper's
/// `openat2` answering ENOSYS (as under systemd's `RestrictSUIDSGID=`,
/// which makes virtiofsd fall back to plain `openat`): the same root.
/// Each time a vhost-user frontend standing for the guest sends the raw
/// FUSE requests of the attack ([`guest_attacks`]).
#[test]
fn a_guest_stays_inside_its_virtiofs_share() {
    let mut filters = Vec::new();
    for enosys in [false, true] {
        let env = Env::new();
        let u = uid(166);
        let mut spec = vrw_spec(&env, u);
        spec["virtiofsd"] = json!({ "binary": daemon("virtiofsd") });
        env.write_spec("web", &spec);
        let share = env.path("rw-src");
        std::fs::write(share.join("hello"), b"in the share").unwrap();
        // The principal's, so a set-id SETATTR fails for the filter, not
        // for the owner.
        std::os::unix::fs::chown(share.join("hello"), Some(u), Some(u)).unwrap();
        let vars: &[(&str, &str)] = if enosys {
            &[("VMWARDEN_TEST_HELPER_OPENAT2_ENOSYS", "1")]
        } else {
            &[]
        };
        let child = sleeping_probe_with(&env, u, 2, "the probe and its virtiofsd", vars);
        let pid = virtiofsd_of(u, child.id());
        let control = env.run.join("web/control");
        assert_rooted_in_share(
            pid,
            &share,
            &[
                &control,
                &env.state,
                Path::new("/etc/passwd"),
                Path::new("/proc/net/unix"),
            ],
        );
        // Its share is there, by its root.
        assert_eq!(
            std::fs::read(as_seen_by(pid, Path::new("/hello"))).unwrap(),
            b"in the share"
        );
        filters.push(seccomp_filters(pid));
        guest_attacks(&share, &control.join("virtiofs-vrw.sock"));
        kill_probe(child, u);
        env.cleanup_clean("web");
    }
    // The second virtiofsd ran under one filter more: the ENOSYS one.
    assert_eq!(filters[1], filters[0] + 1, "{filters:?}");
}

/// A helper cannot reach the hypervisor's control socket: a compromised
/// virtiofsd connected to `control/qmp.sock` (Landlock does not mediate
/// `connect(2)` on a path) and had QEMU read a credential its own domain
/// denies. In its own namespace there is no `control/`: the socket the
/// hypervisor's namespace reaches does not exist for it, and it holds no
/// fd of the control dir.
#[test]
fn a_helper_cannot_reach_the_hypervisors_control_socket() {
    let env = Env::new();
    let u = uid(167);
    let mut spec = vrw_spec(&env, u);
    spec["virtiofsd"] = json!({ "binary": daemon("virtiofsd") });
    env.write_spec("web", &spec);
    let child = sleeping_probe(&env, u, 2, "the probe and its virtiofsd");
    let pid = virtiofsd_of(u, child.id());
    // A listening socket where the hypervisor's QMP socket lives (the probe
    // stands in for QEMU, which would make it).
    let control = env.run.join("web/control");
    let qmp = control.join("qmp.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&qmp).unwrap();
    // The hypervisor's namespace reaches it...
    std::fs::symlink_metadata(as_seen_by(child.id(), &qmp)).unwrap();
    // ... the helper's does not, nor anything of the control dir.
    assert_rooted_in_share(pid, &env.path("rw-src"), &[&qmp, &control]);
    let ctl = ident(&control).unwrap();
    for e in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
    {
        assert_ne!(
            ident(&e.path()).ok(),
            Some(ctl),
            "fd {:?} is the control dir",
            e.path()
        );
    }
    std::fs::remove_file(&qmp).unwrap();
    kill_probe(child, u);
    env.cleanup_clean("web");
}

/// The same property for the helper that shares QEMU's mount namespace:
/// vhost-device-vsock (QEMU's user vsock backend) runs as the principal
/// beside a real QEMU and reaches `control/` by path, so the QMP socket
/// is root's, mode 0600, bound by the launcher and handed to QEMU as an
/// fd: the helper's `connect(2)` is refused (EACCES), root's answers, and
/// root's tools still take QEMU (which listened on it) as the VM's peer.
#[test]
fn a_helper_cannot_reach_the_hypervisors_control_socket_beside_qemu() {
    let env = Env::new();
    let u = uid(218);
    let mut spec = env.spec("web", u);
    spec["vsock"] = json!({ "cid": 9, "backend": "user", "binary": daemon("vhost-device-vsock") });
    env.write_spec("web", &spec);
    let mut g = env.start("web");
    let qemu = g.pid();
    let qmp = env.run.join("web/control/qmp.sock");
    wait_until("QEMU's QMP answers root", Duration::from_secs(30), || {
        env.vmwarden(&["status", "web"]).status.success()
            && helpers_of(u, qemu).len() == 1
            && std::os::unix::net::UnixStream::connect(&qmp).is_ok()
    });
    let (helper, comm) = helpers_of(u, qemu).pop().unwrap();
    assert!(comm.starts_with("vhost-device"), "{comm}");
    // From where the helper stands: its mount namespace, its uid and gid.
    let connect = |as_helper: bool| {
        let mut c = std::process::Command::new("nsenter");
        c.args(["--target", &helper.to_string(), "--mount"]);
        if as_helper {
            c.args(["--setuid", &u.to_string(), "--setgid", &u.to_string()]);
        }
        c.args([
            "--",
            "python3",
            "-c",
            "import socket,sys\n\
s=socket.socket(socket.AF_UNIX)\n\
try: s.connect(sys.argv[1])\n\
except PermissionError: print('EACCES'); sys.exit(13)\n\
s.settimeout(10); print(s.recv(200).decode(errors='replace'))",
            &qmp.to_string_lossy(),
        ]);
        c.output().unwrap()
    };
    let refused = connect(true);
    assert_eq!(refused.status.code(), Some(13), "{}", text(&refused));
    let root = connect(false);
    assert!(
        root.status.success() && text(&root).contains("\"QMP\""),
        "{}",
        text(&root)
    );
    let md = std::fs::symlink_metadata(&qmp).unwrap();
    assert!(md.file_type().is_socket(), "{qmp:?}");
    assert_eq!((md.uid(), md.mode() & 0o7777), (0, 0o600), "{qmp:?}");
    let stop = env.vmwarden(&["stop", "web", "--timeout", "30"]);
    assert!(stop.status.success(), "{}", text(&stop));
    assert!(g.wait_exit(Duration::from_secs(10)).is_some());
    assert_eq!(helpers_of(u, 0), vec![]);
    env.assert_clean("web");
}

/// A minimal vhost-user-fs frontend: what a guest's virtio-fs driver
/// sends, without a guest kernel in between (the guest's FUSE client
/// normalizes `..` and `/` in names, so it cannot send the attacks). Hand
/// written, std and libc only: the handful of messages a split virtqueue
/// needs (features, owner, one memory region, one ring's num, addresses,
/// base, call and kick), then FUSE requests in that ring. The rust-vmm
/// crates (`vhost`'s frontend, `vm-memory`, `virtio-queue`) would add a
/// dependency tree for ~150 lines of protocol.
mod frontend {
    use std::io::{IoSlice, Read, Write};
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::net::UnixStream;
    use std::path::Path;
    use std::time::{Duration, Instant};

    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};

    const MEM: usize = 1 << 20;
    const QSIZE: u16 = 8;
    const DESC: usize = 0;
    const AVAIL: usize = 0x1000;
    const USED: usize = 0x2000;
    const REQ: usize = 0x10000;
    const RESP: usize = 0x40000;
    const RESP_LEN: u32 = 0x40000;
    /// The request queue (0 is the high-priority one).
    const QUEUE: u32 = 1;

    pub struct Frontend {
        sock: UnixStream,
        mem: *mut u8,
        _memfd: OwnedFd,
        kick: OwnedFd,
        _call: OwnedFd,
        next: u16,
        unique: u64,
    }

    /// A FUSE reply: its error (0 or a negative errno) and body.
    pub struct Reply {
        pub error: i32,
        pub body: Vec<u8>,
    }

    fn eventfd() -> OwnedFd {
        // SAFETY: eventfd has no pointer arguments; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        assert!(fd >= 0, "eventfd: {}", std::io::Error::last_os_error());
        // SAFETY: `fd` was just returned by eventfd and is owned by no one else.
        unsafe { OwnedFd::from_raw_fd(fd) }
    }

    impl Frontend {
        pub fn connect(socket: &Path) -> Frontend {
            let sock = UnixStream::connect(socket).unwrap();
            sock.set_read_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            // SAFETY: a NUL-terminated name and flags; the result is checked.
            let fd =
                unsafe { libc::memfd_create(c"vmwarden-test-guest".as_ptr(), libc::MFD_CLOEXEC) };
            assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
            // SAFETY: `fd` was just returned by memfd_create, owned by no one else.
            let memfd = unsafe { OwnedFd::from_raw_fd(fd) };
            nix::unistd::ftruncate(&memfd, i64::try_from(MEM).unwrap()).unwrap();
            // SAFETY: a fresh shared mapping of the whole memfd, at an
            // address the kernel picks; unmapped never (the test ends).
            let mem = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    MEM,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    memfd.as_raw_fd(),
                    0,
                )
            };
            assert_ne!(mem, libc::MAP_FAILED);
            let mut f = Frontend {
                sock,
                mem: mem.cast(),
                _memfd: memfd,
                kick: eventfd(),
                _call: eventfd(),
                next: 0,
                unique: 1,
            };
            f.handshake();
            f
        }

        fn send(&mut self, req: u32, body: &[u8], fds: &[i32]) {
            let mut msg = Vec::new();
            msg.extend_from_slice(&req.to_le_bytes());
            msg.extend_from_slice(&1u32.to_le_bytes());
            msg.extend_from_slice(&u32::try_from(body.len()).unwrap().to_le_bytes());
            msg.extend_from_slice(body);
            if fds.is_empty() {
                self.sock.write_all(&msg).unwrap();
            } else {
                let cmsg = [ControlMessage::ScmRights(fds)];
                let n = sendmsg::<()>(
                    self.sock.as_raw_fd(),
                    &[IoSlice::new(&msg)],
                    &cmsg,
                    MsgFlags::empty(),
                    None,
                )
                .unwrap();
                assert_eq!(n, msg.len());
            }
        }

        fn reply_u64(&mut self, req: u32) -> u64 {
            let mut hdr = [0u8; 12];
            self.sock.read_exact(&mut hdr).unwrap();
            assert_eq!(u32::from_le_bytes(hdr[0..4].try_into().unwrap()), req);
            let mut v = [0u8; 8];
            self.sock.read_exact(&mut v).unwrap();
            u64::from_le_bytes(v)
        }

        fn handshake(&mut self) {
            const GET_FEATURES: u32 = 1;
            const SET_FEATURES: u32 = 2;
            const SET_OWNER: u32 = 3;
            const SET_MEM_TABLE: u32 = 5;
            const SET_VRING_NUM: u32 = 8;
            const SET_VRING_ADDR: u32 = 9;
            const SET_VRING_BASE: u32 = 10;
            const SET_VRING_KICK: u32 = 12;
            const SET_VRING_CALL: u32 = 13;
            const VERSION_1: u64 = 1 << 32;
            self.send(GET_FEATURES, &[], &[]);
            let offered = self.reply_u64(GET_FEATURES);
            assert_ne!(offered & VERSION_1, 0, "{offered:#x}");
            // No VHOST_USER_F_PROTOCOL_FEATURES: the ring starts enabled.
            self.send(SET_FEATURES, &VERSION_1.to_le_bytes(), &[]);
            self.send(SET_OWNER, &[], &[]);
            let mut region = Vec::new();
            region.extend_from_slice(&1u32.to_le_bytes());
            region.extend_from_slice(&0u32.to_le_bytes());
            region.extend_from_slice(&0u64.to_le_bytes()); // guest address
            region.extend_from_slice(&(MEM as u64).to_le_bytes());
            region.extend_from_slice(&(self.mem as u64).to_le_bytes());
            region.extend_from_slice(&0u64.to_le_bytes()); // mmap offset
            let fd = self._memfd.as_raw_fd();
            self.send(SET_MEM_TABLE, &region, &[fd]);
            let state = |num: u32| {
                let mut b = QUEUE.to_le_bytes().to_vec();
                b.extend_from_slice(&num.to_le_bytes());
                b
            };
            self.send(SET_VRING_NUM, &state(u32::from(QSIZE)), &[]);
            let mut addr = QUEUE.to_le_bytes().to_vec();
            addr.extend_from_slice(&0u32.to_le_bytes());
            for off in [DESC, USED, AVAIL] {
                addr.extend_from_slice(&(self.mem as u64 + off as u64).to_le_bytes());
            }
            addr.extend_from_slice(&0u64.to_le_bytes());
            self.send(SET_VRING_ADDR, &addr, &[]);
            self.send(SET_VRING_BASE, &state(0), &[]);
            let call = self._call.as_raw_fd();
            self.send(SET_VRING_CALL, &u64::from(QUEUE).to_le_bytes(), &[call]);
            let kick = self.kick.as_raw_fd();
            self.send(SET_VRING_KICK, &u64::from(QUEUE).to_le_bytes(), &[kick]);
        }

        fn put(&mut self, off: usize, b: &[u8]) {
            assert!(off + b.len() <= MEM);
            let dst = self.mem.wrapping_add(off);
            // SAFETY: `off..off+len` is inside the mapping (checked above);
            // the backend reads it only after the kick that follows.
            unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), dst, b.len()) };
        }

        fn get(&self, off: usize, len: usize) -> Vec<u8> {
            assert!(off + len <= MEM);
            let mut v = vec![0u8; len];
            let src = self.mem.wrapping_add(off);
            // SAFETY: inside the mapping (checked above); read after the
            // backend published the used entry.
            unsafe { std::ptr::copy_nonoverlapping(src, v.as_mut_ptr(), len) };
            v
        }

        fn used_idx(&self) -> u16 {
            let at = self.mem.wrapping_add(USED + 2).cast::<u16>();
            // SAFETY: an aligned u16 inside the mapping, written by the backend.
            unsafe { std::ptr::read_volatile(at) }
        }

        /// Send FUSE request `opcode` for `nodeid` with `body`; its reply.
        pub fn request(&mut self, opcode: u32, nodeid: u64, body: &[u8]) -> Reply {
            let unique = self.unique;
            self.unique += 1;
            let len = 40 + body.len();
            let mut req = Vec::with_capacity(len);
            req.extend_from_slice(&u32::try_from(len).unwrap().to_le_bytes());
            req.extend_from_slice(&opcode.to_le_bytes());
            req.extend_from_slice(&unique.to_le_bytes());
            req.extend_from_slice(&nodeid.to_le_bytes());
            for _ in 0..4 {
                req.extend_from_slice(&0u32.to_le_bytes()); // uid gid pid pad
            }
            req.extend_from_slice(body);
            self.put(REQ, &req);
            let desc = |addr: u64, len: u32, flags: u16, next: u16| {
                let mut d = addr.to_le_bytes().to_vec();
                d.extend_from_slice(&len.to_le_bytes());
                d.extend_from_slice(&flags.to_le_bytes());
                d.extend_from_slice(&next.to_le_bytes());
                d
            };
            self.put(DESC, &desc(REQ as u64, u32::try_from(len).unwrap(), 1, 1));
            self.put(DESC + 16, &desc(RESP as u64, RESP_LEN, 2, 0));
            let slot = usize::from(self.next % QSIZE);
            self.put(AVAIL + 4 + 2 * slot, &0u16.to_le_bytes());
            let before = self.used_idx();
            std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
            self.next = self.next.wrapping_add(1);
            self.put(AVAIL + 2, &self.next.to_le_bytes());
            std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
            nix::unistd::write(&self.kick, &1u64.to_ne_bytes()).unwrap();
            let end = Instant::now() + Duration::from_secs(10);
            // Yield rather than sleep: a reply takes tens of microseconds,
            // which the measurement below times.
            while self.used_idx() == before {
                assert!(Instant::now() < end, "no reply to FUSE opcode {opcode}");
                std::thread::yield_now();
            }
            std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
            let hdr = self.get(RESP, 16);
            let out_len = u32::from_le_bytes(hdr[0..4].try_into().unwrap()) as usize;
            let error = i32::from_le_bytes(hdr[4..8].try_into().unwrap());
            assert_eq!(u64::from_le_bytes(hdr[8..16].try_into().unwrap()), unique);
            Reply {
                error,
                body: self.get(RESP + 16, out_len.saturating_sub(16)),
            }
        }

        /// FUSE_INIT (7.33) with what the launcher's `--posix-acl`
        /// requires of a client: POSIX_ACL, DONT_MASK, SETXATTR_EXT.
        pub fn init(&mut self) {
            const FLAGS: u32 = 1 << 20 | 1 << 6 | 1 << 29;
            let mut b = 7u32.to_le_bytes().to_vec();
            b.extend_from_slice(&33u32.to_le_bytes());
            b.extend_from_slice(&0u32.to_le_bytes());
            b.extend_from_slice(&FLAGS.to_le_bytes());
            let r = self.request(26, 0, &b);
            assert_eq!(r.error, 0, "FUSE_INIT");
        }

        /// FUSE_LOOKUP of `name` (raw bytes) in `parent`: its node id and
        /// inode number, or the errno.
        pub fn lookup(&mut self, parent: u64, name: &[u8]) -> Result<(u64, u64), i32> {
            let mut b = name.to_vec();
            b.push(0);
            let r = self.request(1, parent, &b);
            if r.error != 0 {
                return Err(-r.error);
            }
            let u = |o: usize| u64::from_le_bytes(r.body[o..o + 8].try_into().unwrap());
            Ok((u(0), u(40)))
        }

        /// FUSE_CREATE of `name` in `parent` with `mode` (opened read-write):
        /// 0 or the errno.
        pub fn create(&mut self, parent: u64, name: &[u8], mode: u32) -> i32 {
            let mut b = Vec::new();
            for v in [2u32, mode, 0, 0] {
                b.extend_from_slice(&v.to_le_bytes()); // flags mode umask open_flags
            }
            b.extend_from_slice(name);
            b.push(0);
            -self.request(35, parent, &b).error
        }

        /// FUSE_MKNOD of `name` in `parent` with `mode`: 0 or the errno.
        pub fn mknod(&mut self, parent: u64, name: &[u8], mode: u32) -> i32 {
            let mut b = Vec::new();
            for v in [mode, 0u32, 0, 0] {
                b.extend_from_slice(&v.to_le_bytes()); // mode rdev umask padding
            }
            b.extend_from_slice(name);
            b.push(0);
            -self.request(8, parent, &b).error
        }

        /// FUSE_CREATE's node id, or the errno.
        pub fn create_node(&mut self, parent: u64, name: &[u8], mode: u32) -> Result<u64, i32> {
            let mut b = Vec::new();
            for v in [2u32, mode, 0, 0] {
                b.extend_from_slice(&v.to_le_bytes());
            }
            b.extend_from_slice(name);
            b.push(0);
            let r = self.request(35, parent, &b);
            if r.error != 0 {
                return Err(-r.error);
            }
            Ok(u64::from_le_bytes(r.body[0..8].try_into().unwrap()))
        }

        /// FUSE_MKDIR's node id, or the errno.
        pub fn mkdir(&mut self, parent: u64, name: &[u8], mode: u32) -> Result<u64, i32> {
            let mut b = Vec::new();
            for v in [mode, 0u32] {
                b.extend_from_slice(&v.to_le_bytes()); // mode umask
            }
            b.extend_from_slice(name);
            b.push(0);
            let r = self.request(9, parent, &b);
            if r.error != 0 {
                return Err(-r.error);
            }
            Ok(u64::from_le_bytes(r.body[0..8].try_into().unwrap()))
        }

        /// FUSE_SETATTR of the owner and group of `node`: 0 or the errno.
        pub fn chown(&mut self, node: u64, uid: u32, gid: u32) -> i32 {
            let mut b = vec![0u8; 88];
            b[0..4].copy_from_slice(&(2u32 | 4).to_le_bytes()); // FATTR_UID | FATTR_GID
            b[76..80].copy_from_slice(&uid.to_le_bytes());
            b[80..84].copy_from_slice(&gid.to_le_bytes());
            -self.request(4, node, &b).error
        }

        /// FUSE_GETATTR: the owner and group the guest sees.
        pub fn owner(&mut self, node: u64) -> (u32, u32) {
            let r = self.request(3, node, &[0u8; 16]);
            assert_eq!(r.error, 0, "GETATTR");
            // fuse_attr_out: attr_valid, attr_valid_nsec, dummy, then
            // fuse_attr (ino size blocks atime mtime ctime, three nsecs,
            // mode nlink uid gid).
            let u = |o: usize| u32::from_le_bytes(r.body[o..o + 4].try_into().unwrap());
            (u(16 + 68), u(16 + 72))
        }

        /// FUSE_SETATTR of the mode of `node`: 0 or the errno.
        pub fn chmod(&mut self, node: u64, mode: u32) -> i32 {
            let mut b = vec![0u8; 88];
            b[0..4].copy_from_slice(&1u32.to_le_bytes()); // FATTR_MODE
            b[68..72].copy_from_slice(&mode.to_le_bytes());
            -self.request(4, node, &b).error
        }
    }
}

/// The host's Nix store, shared read-only over 9p and over virtiofs, as
/// microvm.nix's flake template shares it (`ro-store`): the store is
/// `root:nixbld 1775` as Nix makes it (the launcher's one exception to
/// "nothing the VM is given may be writable by a group other than its
/// principal's"). The guest reads a file of the store through both, sees
/// the store's own owner, group and mode, and cannot write either; the
/// store is as it was afterwards and the stop is clean.
#[test]
fn the_host_store_is_shared_read_only_over_9p_and_virtiofs() {
    let env = Env::new();
    let store = NixStore::ensure();
    let before = NixStore::stat();
    assert_eq!((before.0, before.2), (0, 0o1775));
    let u = uid(168);
    let name = store
        .file
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let script = format!(
        "\
mkdir -p /p9 /vfs
mount -t 9p -o trans=virtio,version=9p2000.L,ro ro-store /p9 || echo T-MOUNT-P9-FAILED
mount -t virtiofs -o ro vstore /vfs || echo T-MOUNT-VFS-FAILED
for m in p9 vfs; do
  echo \"T-READ-$m $(cat /$m/{name})\"
  echo \"T-STAT-$m $(stat -c '%u %g %a' /$m)\"
  if touch /$m/evil 2>/dev/null; then echo T-WRITE-$m-SUCCEEDED; else echo T-WRITE-$m-REFUSED; fi
done
umount /p9; umount /vfs
"
    );
    let mut spec = env.shares_spec("web", u, "hold", &script);
    spec["shares"] = json!([
        { "tag": "ro-store", "source": NIX_STORE, "proto": "9p", "read_only": true },
        { "tag": "vstore", "source": NIX_STORE, "proto": "virtiofs", "read_only": true }
    ]);
    spec["virtiofsd"] = json!({ "binary": daemon("virtiofsd") });
    env.write_spec("web", &spec);
    let mut g = env.start("web");
    g.wait_for("VMWARDEN-GUEST-READY", BOOT);
    let stat = format!("0 {} 1775", store.gid);
    assert_guest_said(
        &g.log_text(),
        &[
            "T-READ-p9 from the store",
            "T-READ-vfs from the store",
            &format!("T-STAT-p9 {stat}"),
            &format!("T-STAT-vfs {stat}"),
            "T-WRITE-p9-REFUSED",
            "T-WRITE-vfs-REFUSED",
            "VMWARDEN-RUN-END rc=0",
        ],
    );
    let stop = env.vmwarden(&["stop", "web", "--timeout", "60"]);
    assert!(stop.status.success(), "{}", text(&stop));
    assert!(g.wait_exit(Duration::from_secs(10)).is_some());
    assert_eq!(helpers_of(u, 0), vec![]);
    env.assert_clean("web");
    assert_eq!(NixStore::stat(), before);
    assert!(!Path::new(NIX_STORE).join("evil").exists());
    assert_eq!(std::fs::read(&store.file).unwrap(), b"from the store\n");
}

/// A read-only store share shows the guest nothing a build user wrote into
/// xattrs. The store is `root:nixbld 1775`: any build (a member of
/// `nixbld`) may add a file to it. Under 9p's `mapped-xattr` QEMU took a
/// file's owner and mode from its `user.virtfs.*` xattrs, which the file's
/// owner may set: a plain 0755 file of a build user's, with
/// `user.virtfs.uid=0` and `user.virtfs.mode=0104755`, was a root set-uid
/// program in the guest. The guest must see the host's own owner and mode
/// (the build user's, 0755, no set-id bit).
#[test]
fn a_read_only_store_share_shows_the_guest_nothing_a_build_user_wrote_into_xattrs() {
    let env = Env::new();
    let store = NixStore::ensure();
    let (u, builder) = (uid(176), uid(177));
    let planted = Path::new(NIX_STORE).join(format!("vmwarden-test-{}-suid", std::process::id()));
    struct Remove(PathBuf);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let _remove = Remove(planted.clone());
    // The build user plants it: its own plain file, and the xattrs QEMU's
    // mapped-xattr reads (uid_t and mode_t, native byte order).
    let plant = format!(
        "import os, struct\n\
         p = {planted:?}\n\
         fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o755)\n\
         os.write(fd, b'#!/bin/sh\\nid\\n'); os.close(fd); os.chmod(p, 0o755)\n\
         os.setxattr(p, 'user.virtfs.uid', struct.pack('=I', 0))\n\
         os.setxattr(p, 'user.virtfs.gid', struct.pack('=I', 0))\n\
         os.setxattr(p, 'user.virtfs.mode', struct.pack('=I', 0o104755))\n\
         print('PLANTED')\n"
    );
    let out = std::process::Command::new("setpriv")
        .arg(format!("--reuid={builder}"))
        .arg(format!("--regid={}", store.gid))
        .arg("--clear-groups")
        .args(["/usr/bin/python3", "-c", &plant])
        .current_dir("/")
        .output()
        .unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("PLANTED"),
        "the build user could not plant its file: {}",
        text(&out)
    );
    let md = std::fs::symlink_metadata(&planted).unwrap();
    assert_eq!(
        (md.uid(), md.gid(), md.mode() & 0o7777),
        (builder, store.gid, 0o755)
    );
    let name = planted.file_name().unwrap().to_string_lossy().into_owned();
    let script = format!(
        "\
mkdir -p /p9
mount -t 9p -o trans=virtio,version=9p2000.L,ro ro-store /p9 || echo T-MOUNT-P9-FAILED
echo \"T-PLANTED $(stat -c '%u %g %a' /p9/{name})\"
echo \"T-STORE $(stat -c '%u %g %a' /p9)\"
umount /p9
"
    );
    let mut spec = env.shares_spec("web", u, "hold", &script);
    spec["shares"] = json!([
        { "tag": "ro-store", "source": NIX_STORE, "proto": "9p", "read_only": true }
    ]);
    env.write_spec("web", &spec);
    let mut g = env.start("web");
    g.wait_for("VMWARDEN-GUEST-READY", BOOT);
    let log = g.log_text();
    let seen = log
        .lines()
        .find_map(|l| {
            l.split_once("T-PLANTED ")
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| panic!("the guest did not stat the planted file:\n{log}"));
    assert_eq!(
        seen,
        format!("{builder} {} 755", store.gid),
        "the guest sees the build user's file as uid/gid/mode {seen} (the host has {builder} {} 755): \
         the xattrs a build user wrote decide what the guest sees",
        store.gid
    );
    assert_guest_said(
        &log,
        &[
            &format!("T-STORE 0 {} 1775", store.gid),
            "VMWARDEN-RUN-END rc=0",
        ],
    );
    let stop = env.vmwarden(&["stop", "web", "--timeout", "60"]);
    assert!(stop.status.success(), "{}", text(&stop));
    assert!(g.wait_exit(Duration::from_secs(10)).is_some());
    env.assert_clean("web");
}

/// The fds of process `pid`, each duplicated into this process
/// (`pidfd_getfd`: root may take them), with their numbers there.
fn fds_of(pid: u32) -> Vec<(i32, std::os::fd::OwnedFd)> {
    use std::os::fd::FromRawFd;
    // SAFETY: pidfd_open takes a pid and flags; the result is checked.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    assert!(
        pidfd >= 0,
        "pidfd_open: {}",
        std::io::Error::last_os_error()
    );
    let pidfd = i32::try_from(pidfd).unwrap();
    // SAFETY: just returned by pidfd_open, owned by nobody else.
    let pidfd = unsafe { std::os::fd::OwnedFd::from_raw_fd(pidfd) };
    let mut out = Vec::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
    {
        let Ok(n) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        use std::os::fd::AsRawFd;
        // SAFETY: a pidfd we own and an fd number; the result is checked.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), n, 0) };
        if fd >= 0 {
            // SAFETY: just returned by pidfd_getfd, owned by nobody else.
            out.push((n, unsafe {
                std::os::fd::OwnedFd::from_raw_fd(i32::try_from(fd).unwrap())
            }));
        }
    }
    out
}

/// virtiofsd sees nothing but its share: the attack of a compromised
/// virtiofsd, re-run with its own descriptors. It keeps `/proc/self/fd`
/// (opened at start, before it is rooted in its share) to reopen its fds;
/// `..` from that descriptor walked up the VM's procfs to `/proc/net/unix`
/// (every unix socket of the host's network namespace) and `/proc/sys`.
/// The test takes every fd of the real virtiofsd the launcher started
/// (`pidfd_getfd`: the same open file, so the same mount and place) and
/// walks `..` from each directory on procfs: it must stay where it is,
/// and nothing but virtiofsd's own fds may be behind it. Its other
/// descriptors (its share, its socket, the lease) reach nothing else.
#[test]
fn virtiofsd_sees_nothing_but_its_share() {
    const PROC_SUPER_MAGIC: i64 = 0x9fa0;
    let env = Env::new();
    let u = uid(169);
    let mut spec = vrw_spec(&env, u);
    spec["virtiofsd"] = json!({ "binary": daemon("virtiofsd") });
    env.write_spec("web", &spec);
    let child = sleeping_probe(&env, u, 2, "the probe and its virtiofsd");
    let pid = virtiofsd_of(u, child.id());
    let share = env.path("rw-src");
    let mut proc_dirs = 0;
    for (n, fd) in fds_of(pid) {
        use std::os::fd::AsRawFd;
        let st = nix::sys::stat::fstat(&fd).unwrap();
        if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            continue;
        }
        let fs = nix::sys::statfs::fstatfs(&fd).unwrap();
        let on_proc = fs.filesystem_type().0 == PROC_SUPER_MAGIC;
        let at = |rel: &str| {
            nix::fcntl::openat(
                &fd,
                rel,
                nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_CLOEXEC,
                nix::sys::stat::Mode::empty(),
            )
        };
        for target in ["../../net/unix", "../../sys/fs/nr_open", "../../1/root"] {
            assert!(
                at(target).is_err(),
                "from virtiofsd's fd {n} ({}), {target} is reachable",
                if on_proc {
                    "its /proc/self/fd"
                } else {
                    "a directory"
                }
            );
        }
        // `..`, again and again, stays where it is (the share's root or
        // the fd directory).
        let up = at("../../../..").unwrap();
        let ust = nix::sys::stat::fstat(&up).unwrap();
        assert_eq!(
            (ust.st_dev, ust.st_ino),
            (st.st_dev, st.st_ino),
            "`..` from virtiofsd's fd {n} left the directory it names"
        );
        if on_proc {
            proc_dirs += 1;
            // Behind it: virtiofsd's own fds, nothing else.
            let list = std::fs::read_dir(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
            for e in list.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                assert!(name.parse::<u32>().is_ok(), "{name:?} behind fd {n}");
            }
        } else {
            assert_eq!(
                ident(&PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))).unwrap(),
                ident(&share).unwrap(),
                "virtiofsd's directory fd {n} is not its share"
            );
        }
    }
    assert_eq!(proc_dirs, 1, "virtiofsd keeps one /proc/self/fd");
    kill_probe(child, u);
    env.cleanup_clean("web");
}

/// `(uid, gid, mode)` of `p` on the host, not following a link.
fn owner_mode(p: &Path) -> (u32, u32, u32) {
    let md = std::fs::symlink_metadata(p).unwrap();
    (md.uid(), md.gid(), md.mode() & 0o7777)
}

/// A share the guest owns, over virtiofs: the guest's chown, chgrp and
/// chmod work as under microvm.nix's root virtiofsd, a setgid directory
/// hands its group to what is made in it, and the guest sees the ids it
/// set. On the host every file belongs to the principal (guest 0) or to
/// the VM's own range (guest id + base), never to root or another
/// account, and no regular file is set-id: a set-id mode on a file, or an
/// id beyond the range, is refused to the guest.
#[test]
fn a_guest_owns_its_writable_virtiofs_share_with_ids_of_its_own() {
    let env = Env::new();
    let u = uid(171);
    let own = dir(&env, "own-src", u, 0o700);
    let script = "\
mkdir -p /own && mount -t virtiofs vown /own || echo T-MOUNT-FAILED
cd /own
echo data >f && chown 1000:100 f && echo T-CHOWN-OK
chgrp 190 f && echo T-CHGRP-OK
chmod 640 f && echo T-CHMOD-OK
mkdir j && chown 0:190 j && chmod 2755 j && echo T-SETGID-DIR-OK
echo x >j/made && mkdir j/sub
chown 1000 j && chmod 2750 j && echo T-SETGID-DIR-AGAIN-OK
if chmod 4755 f 2>/dev/null; then echo T-SUID-FILE-SET; else echo T-SUID-FILE-REFUSED; fi
if chmod 2755 f 2>/dev/null; then echo T-SGID-FILE-SET; else echo T-SGID-FILE-REFUSED; fi
if chown 70000 f 2>/dev/null; then echo T-BEYOND-SET; else echo T-BEYOND-REFUSED; fi
echo \"T-SEE f=$(stat -c '%u:%g:%a' f) j=$(stat -c '%u:%g:%a' j) made=$(stat -c '%u:%g' j/made) sub=$(stat -c '%u:%g:%a' j/sub)\"
cd /; sync; umount /own
";
    let mut spec = env.shares_spec("web", u, "hold", script);
    spec["shares"] = json!([{ "tag": "vown", "source": own, "proto": "virtiofs" }]);
    spec["virtiofsd"] = json!({ "binary": daemon("virtiofsd") });
    env.write_spec("web", &spec);
    let mut g = env.start("web");
    g.wait_for("VMWARDEN-GUEST-READY", BOOT);
    assert_sandboxed_helpers(u, g.pid(), &["virtiofsd", "vmwarden-broker"]);
    assert_guest_said(
        &g.log_text(),
        &[
            "T-CHOWN-OK",
            "T-CHGRP-OK",
            "T-CHMOD-OK",
            "T-SETGID-DIR-OK",
            "T-SETGID-DIR-AGAIN-OK",
            "T-SUID-FILE-REFUSED",
            "T-SGID-FILE-REFUSED",
            "T-BEYOND-REFUSED",
            // The guest sees the ids it set; what it made in its setgid
            // directory has the directory's group, a directory the bit.
            "T-SEE f=1000:190:640 j=1000:190:2750 made=0:190 sub=0:190:2755",
            "VMWARDEN-RUN-END rc=0",
        ],
    );
    let (base, count) = id_range_in(&env, "web").expect("the VM's id range");
    assert_eq!(count, 65_536);
    // On the host: base + guest id, guest 0 the principal.
    assert_eq!(owner_mode(&own.join("f")), (base + 1000, base + 190, 0o640));
    assert_eq!(
        owner_mode(&own.join("j")),
        (base + 1000, base + 190, 0o2750)
    );
    assert_eq!(owner_mode(&own.join("j/made")), (u, base + 190, 0o644));
    assert_eq!(owner_mode(&own.join("j/sub")).1, base + 190);
    // Nothing is root's or another account's, no regular file is set-id.
    let mine = |id: u32| id == u || (id > base && id < base + count);
    let mut all = vec![own.clone()];
    while let Some(p) = all.pop() {
        let md = std::fs::symlink_metadata(&p).unwrap();
        assert!(
            mine(md.uid()) && mine(md.gid()),
            "{p:?}: {}:{}",
            md.uid(),
            md.gid()
        );
        if md.is_dir() {
            all.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
        } else {
            assert_eq!(md.mode() & 0o6000, 0, "{p:?} is set-id on the host");
        }
    }
    let stop = env.vmwarden(&["stop", "web", "--timeout", "60"]);
    assert!(stop.status.success(), "{}", text(&stop));
    assert!(g.wait_exit(Duration::from_secs(10)).is_some());
    assert_eq!(helpers_of(u, 0), vec![]);
    env.assert_clean("web");
}

/// The VM's own id range is identity: allocated (recorded) at the first
/// launch with a share the guest owns and kept across launches; with the
/// VM stopped, verify-clean finds no process of it; `purge` deletes what
/// the guest owned in the state dir (files of the range's ids) and retires
/// the range (a tombstone), and `--keep-identity` keeps it; the VM made
/// again gets a range never handed out before.
#[test]
fn purge_deletes_what_the_guest_owned_and_retires_its_id_range() {
    let env = Env::new();
    let u = uid(172);
    let mut spec = env.spec("web", u);
    let share = env.state.join("web/data");
    spec["shares"] = json!([{ "tag": "data", "source": share, "proto": "virtiofs" }]);
    spec["virtiofsd"] = json!({ "binary": daemon("virtiofsd") });
    env.write_spec("web", &spec);
    // The state dir and the share in it, the principal's.
    let state_dir = || {
        for d in [env.state.clone(), env.state.join("web"), share.clone()] {
            std::fs::create_dir_all(&d).unwrap();
        }
        for d in [env.state.join("web"), share.clone()] {
            std::os::unix::fs::chown(&d, Some(u), Some(u)).unwrap();
            std::fs::set_permissions(&d, PermissionsExt::from_mode(0o700)).unwrap();
        }
    };
    state_dir();
    let child = sleeping_probe(&env, u, 2, "the probe, its virtiofsd and broker");
    let first = id_range_in(&env, "web").expect("a range recorded");
    kill_probe(child, u);
    // What a guest leaves: files of its own ids, a setgid directory, a
    // share root it chowned (the next launch accepts it).
    let (b, _) = first;
    std::fs::create_dir(share.join("j")).unwrap();
    std::fs::write(share.join("j/f"), b"x").unwrap();
    for (p, o, g) in [
        ("j", b + 1000, b + 190),
        ("j/f", b + 1000, b + 190),
        ("", b + 1000, b + 100),
    ] {
        std::os::unix::fs::chown(share.join(p), Some(o), Some(g)).unwrap();
    }
    std::fs::set_permissions(share.join("j"), PermissionsExt::from_mode(0o2750)).unwrap();
    let child = sleeping_probe(&env, u, 2, "launched again on a share the guest chowned");
    assert_eq!(id_range_in(&env, "web"), Some(first), "the range is kept");
    kill_probe(child, u);
    let rep = env.assert_clean("web");
    assert_eq!(rep["clean"], true);
    let v = env.verify_clean(&["web"]);
    assert!(
        String::from_utf8_lossy(&v.stdout).contains("no-range-process vm=web check=ok"),
        "{}",
        text(&v)
    );
    // --keep-identity keeps the range (and the files).
    let (ok, out) = purge_on_pty(&env, &["web", "--keep-identity"], "DELETE-EVERYTHING");
    assert!(ok, "{out}");
    assert!(!out.contains("retire id range"), "{out}");
    assert_eq!(id_range_in(&env, "web"), Some(first));
    // Without it: the files go, the range is retired.
    let (ok, out) = purge_on_pty(&env, &["web"], "DELETE-EVERYTHING");
    assert!(ok, "{out}");
    assert!(
        out.contains(&format!("retire id range {}..{}", b + 1, b + 65_536))
            && out.contains(&format!("retired id range {}..{}", b + 1, b + 65_536)),
        "{out}"
    );
    assert!(!share.exists(), "{out}");
    assert_eq!(id_range_in(&env, "web"), None);
    let tomb: serde_json::Value =
        serde_json::from_slice(&std::fs::read(env.ranges.join(format!("range-{b}.json"))).unwrap())
            .unwrap();
    assert_eq!(tomb["state"], "retired", "{tomb}");
    // Made again, the VM gets a range never handed out before.
    state_dir();
    let child = sleeping_probe(&env, u, 2, "the VM made again");
    let second = id_range_in(&env, "web").expect("a new range");
    assert_ne!(second.0, first.0);
    kill_probe(child, u);
    env.assert_clean("web");
}

/// Median of `v` (microseconds).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Per-operation samples (µs) of `n` rounds of: CREATE a file, SETATTR
/// its owner to 1000:100, MKDIR, SETATTR the directory's mode to 02775;
/// with what the guest then sees of the file's owner and whether the
/// chown and the setgid chmod worked. `tag` keeps the names of several
/// runs on one share apart.
fn time_ops(socket: &Path, n: usize, tag: usize) -> (Vec<Vec<f64>>, (u32, u32), i32, i32) {
    let mut g = frontend::Frontend::connect(socket);
    g.init();
    let mut t = vec![Vec::new(), Vec::new(), Vec::new(), Vec::new()];
    let (mut seen, mut chown_err, mut sgid_err) = ((0, 0), 0, 0);
    for i in 0..n {
        let t0 = std::time::Instant::now();
        let f = g
            .create_node(1, format!("f{tag}-{i}").as_bytes(), 0o100_644)
            .unwrap();
        t[0].push(t0.elapsed().as_secs_f64() * 1e6);
        let t0 = std::time::Instant::now();
        chown_err = g.chown(f, 1000, 100);
        t[1].push(t0.elapsed().as_secs_f64() * 1e6);
        let t0 = std::time::Instant::now();
        let d = g.mkdir(1, format!("d{tag}-{i}").as_bytes(), 0o755).unwrap();
        t[2].push(t0.elapsed().as_secs_f64() * 1e6);
        let t0 = std::time::Instant::now();
        sgid_err = g.chmod(d, 0o2775);
        t[3].push(t0.elapsed().as_secs_f64() * 1e6);
        seen = g.owner(f);
    }
    (t, seen, chown_err, sgid_err)
}

/// Samples of several runs of [`time_ops`], joined.
type Timed = (Vec<Vec<f64>>, (u32, u32), i32, i32);
fn join(runs: Vec<Timed>) -> (Vec<f64>, (u32, u32), i32, i32) {
    let last = runs.last().cloned().unwrap();
    let mut all = vec![Vec::new(); 4];
    for r in runs {
        for (a, b) in all.iter_mut().zip(r.0) {
            a.extend(b);
        }
    }
    (
        all.into_iter().map(median).collect(),
        last.1,
        last.2,
        last.3,
    )
}

/// Measures the ways of giving the guest its own ids on a writable
/// virtiofs share, in one run, against today's virtiofsd as the principal
/// without capabilities (the baseline): (b) the chosen one, the launcher's
/// virtiofsd in a user namespace of its own mapping the VM's range, with
/// its broker; (c) virtiofsd's own `--translate-uid`/`--translate-gid`
/// (`squash-guest` to the principal, `squash-host` back to guest 0: an
/// unprivileged virtiofsd can make no file of another uid, and the
/// options exclude `--posix-acl`). Prints per-operation medians, ratios
/// to the baseline, the launcher's start time of each kind of virtiofsd,
/// and what the guest sees after its chown. Run by hand:
/// `cargo test --features fault-injection --test shares -- --ignored --test-threads=1 measure`.
#[test]
#[ignore = "a measurement, run by hand (prints figures)"]
fn measure_owned_share_options() {
    const N: usize = 400;
    let env = Env::new();
    let u = uid(173);
    let vd = daemon("virtiofsd");
    // (a) and (c): virtiofsd started by hand as the principal.
    let by_hand = |name: &str, extra: &[&str], tag: usize| -> Timed {
        let d = dir(&env, &format!("{name}-src"), u, 0o700);
        let sock = env.path(&format!("{name}.sock"));
        let mut c = std::process::Command::new("setpriv");
        c.args([
            &format!("--reuid={u}"),
            &format!("--regid={u}"),
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--",
        ]);
        c.arg(&vd).arg(format!("--socket-path={}", sock.display()));
        c.arg(format!("--shared-dir={}", d.display()));
        c.args(["--sandbox=none", "--xattr", "--inode-file-handles=never"]);
        c.args(extra);
        c.stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        std::fs::set_permissions(env.dir.path(), PermissionsExt::from_mode(0o777)).unwrap();
        let mut child = c.spawn().unwrap();
        wait_until("its socket", Duration::from_secs(10), || sock.exists());
        std::fs::set_permissions(env.dir.path(), PermissionsExt::from_mode(0o755)).unwrap();
        let got = time_ops(&sock, N, tag);
        child.kill().unwrap();
        child.wait().unwrap();
        std::fs::remove_file(&sock).unwrap();
        got
    };
    let all = u32::MAX.to_string();
    let squash_guest = format!("squash-guest:0:{u}:{all}");
    let squash_host = format!("squash-host:{u}:0:1");
    let translate = [
        "--translate-uid",
        &squash_guest,
        "--translate-gid",
        &squash_guest,
        "--translate-uid",
        &squash_host,
        "--translate-gid",
        &squash_host,
    ];
    // (b) the launcher's, with its start time beside a read-only share's
    // (a virtiofsd as the principal) over 10 launches.
    let ro = dir(&env, "ro-src", 0, 0o755);
    let own = dir(&env, "own-src", u, 0o700);
    let mut spec = env.spec("web", u);
    spec["shares"] = json!([
        { "tag": "vro", "source": ro, "proto": "virtiofs", "read_only": true },
        { "tag": "vown", "source": own, "proto": "virtiofs" }
    ]);
    spec["virtiofsd"] = json!({ "binary": vd });
    env.write_spec("web", &spec);
    let (mut start_ro, mut start_own) = (Vec::new(), Vec::new());
    for _ in 0..10 {
        let o = env.probe("web", &["/bin/true"]);
        assert!(o.status.success(), "{}", text(&o));
        for l in stderr(&o).lines().filter(|l| l.contains("helper started")) {
            let ms: f64 = l.split("ms=").nth(1).unwrap().trim().parse().unwrap();
            if l.contains("`vro`") {
                start_ro.push(ms);
            } else {
                start_own.push(ms);
            }
        }
        wait_helpers_gone(u, "the probe's helpers");
        env.cleanup_clean("web");
    }
    // Three rounds of each, interleaved: what one run warms, all share.
    let (mut base, mut translated, mut owned) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..3 {
        base.push(by_hand("plain", &["--posix-acl"], round));
        translated.push(by_hand("translate", &translate, round));
        let child = sleeping_probe(&env, u, 3, "the probe and its helpers");
        owned.push(time_ops(
            &env.run.join("web/control/virtiofs-vown.sock"),
            N,
            round,
        ));
        kill_probe(child, u);
        env.cleanup_clean("web");
    }
    let (base, translated, owned) = (join(base), join(translated), join(owned));
    let ops = ["create", "chown 1000:100", "mkdir", "chmod 02775 dir"];
    println!("MEASURE owned share options, 3 x {N} rounds, medians in µs (ratio to the principal's virtiofsd)");
    for (name, r) in [
        ("principal, no caps (baseline)", &base),
        ("user namespace + broker (chosen)", &owned),
        ("--translate-uid/gid squash", &translated),
    ] {
        let cells: Vec<String> = ops
            .iter()
            .zip(&r.0)
            .zip(&base.0)
            .map(|((op, t), b)| format!("{op} {t:.0} ({:.2}x)", t / b))
            .collect();
        println!(
            "MEASURE {name}: {}; chown errno {}; setgid chmod errno {}; guest sees the file as {}:{}",
            cells.join(", "),
            r.2,
            r.3,
            r.1 .0,
            r.1 .1
        );
    }
    println!(
        "MEASURE start (launcher, fork to ready, 10 launches, median ms): read-only share's virtiofsd {:.1}, owned share's virtiofsd with its user namespace and broker {:.1} ({:.2}x)",
        median(start_ro.clone()),
        median(start_own.clone()),
        median(start_own) / median(start_ro)
    );
}

/// 9p's `mapped-xattr` (the security model vmwarden gives QEMU) already
/// lets the guest own a writable 9p share: its chown, chgrp and chmod,
/// setgid directories included, are kept in extended attributes
/// (`user.virtfs.*`) and the guest sees the ids and modes it set, while on
/// the host every file stays the principal's, with no set-id bit and no
/// range needed.
#[test]
fn a_guest_owns_its_writable_9p_share_in_extended_attributes() {
    let env = Env::new();
    let u = uid(174);
    let p9 = dir(&env, "p9-src", u, 0o700);
    let script = "\
mkdir -p /own && mount -t 9p -o trans=virtio,version=9p2000.L own /own || echo T-MOUNT-FAILED
cd /own
echo data >f && chown 1000:100 f && chgrp 190 f && chmod 640 f && echo T-OWN-OK
mkdir j && chown 0:190 j && chmod 2755 j && echo T-SETGID-DIR-OK
echo x >j/made && mkdir j/sub
echo \"T-SEE f=$(stat -c '%u:%g:%a' f) j=$(stat -c '%u:%g:%a' j) made=$(stat -c '%g' j/made) sub=$(stat -c '%g:%a' j/sub)\"
cd /; sync; umount /own
";
    let mut spec = env.shares_spec("web", u, "hold", script);
    spec["shares"] = json!([{ "tag": "own", "source": p9, "proto": "9p" }]);
    env.write_spec("web", &spec);
    let mut g = env.start("web");
    g.wait_for("VMWARDEN-GUEST-READY", BOOT);
    assert_guest_said(
        &g.log_text(),
        &[
            "T-OWN-OK",
            "T-SETGID-DIR-OK",
            "T-SEE f=1000:190:640 j=0:190:2755 made=190 sub=190:2755",
            "VMWARDEN-RUN-END rc=0",
        ],
    );
    let mut all = vec![p9.clone()];
    while let Some(p) = all.pop() {
        let md = std::fs::symlink_metadata(&p).unwrap();
        assert_eq!((md.uid(), md.gid()), (u, u), "{p:?}");
        assert_eq!(md.mode() & 0o6000, 0, "{p:?} is set-id on the host");
        if md.is_dir() {
            all.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
        }
    }
    // No id range: nothing on the host carries the guest's ids.
    assert_eq!(id_range_in(&env, "web"), None);
    let stop = env.vmwarden(&["stop", "web", "--timeout", "60"]);
    assert!(stop.status.success(), "{}", text(&stop));
    assert!(g.wait_exit(Duration::from_secs(10)).is_some());
    env.assert_clean("web");
}
