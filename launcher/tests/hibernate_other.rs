//! cloud-hypervisor's and firecracker's snapshots, the real binaries, in
//! vmwarden's sandbox on the host.
//!
//! On this host (a paravirtual KVM) neither boots a guest, but firecracker
//! runs a configured VM's vCPU far enough to pause and snapshot it, and
//! loads the snapshot again: the capture into the VM's state directory
//! (written by firecracker as the principal, under the launcher's Landlock
//! and seccomp) and the restore (a paused load, the device check, the
//! resume) run for real. cloud-hypervisor's `vm.snapshot` needs the
//! vCPU's nested state, which this KVM refuses: its capture fails, and
//! the test proves the VM runs on. Where KVM boots guests (the systemd
//! suite's L2 guest) the same code restores a running guest. The test
//! drives each API as vmwarden's helper would, with vmwarden's own
//! functions. Needs root.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use vmwarden::config::spec::{HypervisorKind, Spec};
use vmwarden::control::hibernate::{KILL_POINTS, UNWRITABLE};
use vmwarden::hypervisor::hibernate::Hibernator;
use vmwarden::hypervisor::hibernate_chfc::FcHibernator;
use vmwarden::hypervisor::{api, snapshot_ch, snapshot_fc, Layout};

const T: Duration = Duration::from_secs(20);

/// The test kernel as an ELF vmlinux (firecracker takes nothing else).
fn vmlinux(env: &Env) -> PathBuf {
    let out = env.path("vmlinux");
    asset_script(
        "extract-vmlinux.sh",
        &[
            &assets().kernel.display().to_string(),
            &out.display().to_string(),
        ],
    );
    std::fs::set_permissions(&out, PermissionsExt::from_mode(0o644)).unwrap();
    out
}

/// A read-only disk image (root's, world-readable).
fn disk(env: &Env, name: &str) -> PathBuf {
    let p = env.path(name);
    std::fs::write(&p, vec![0u8; 1 << 20]).unwrap();
    std::fs::set_permissions(&p, PermissionsExt::from_mode(0o644)).unwrap();
    p
}

fn typed(s: &serde_json::Value) -> Spec {
    serde_json::from_value(s.clone()).unwrap()
}

fn wait_state(sock: &Path, kind: HypervisorKind, want: &str, g: &mut Guest) {
    let end = Instant::now() + T;
    loop {
        let st = api::vm_state(sock, kind, Duration::from_secs(2));
        if st.as_deref().ok() == Some(want) {
            return;
        }
        if let Ok(Some(x)) = g.child.try_wait() {
            panic!("exited ({x}) before state {want}:\n{}", g.log_text());
        }
        assert!(
            Instant::now() < end,
            "state {st:?}, not {want}:\n{}",
            g.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The snapshot directory, made as the framework makes it: the
/// principal's, 0700, in the VM's state directory.
fn snapshot_dir(env: &Env, name: &str, u: u32) -> PathBuf {
    let d = env.state.join(name).join(".vmwarden-hibernate");
    std::fs::create_dir(&d).unwrap();
    std::os::unix::fs::chown(&d, Some(u), Some(u)).unwrap();
    std::fs::set_permissions(&d, PermissionsExt::from_mode(0o700)).unwrap();
    d
}

fn assert_confined(pid: u32, u: u32) {
    assert_eq!(proc_status(pid, "Uid"), format!("{0}\t{0}\t{0}\t{0}", u));
    assert_eq!(proc_status(pid, "CapEff"), "0000000000000000");
    assert_eq!(proc_status(pid, "NoNewPrivs"), "1");
    assert_eq!(proc_status(pid, "Seccomp"), "2");
    let own = std::fs::read_link(format!("/proc/{pid}/ns/mnt")).unwrap();
    assert_ne!(own, std::fs::read_link("/proc/self/ns/mnt").unwrap());
}

/// firecracker unconfigured (its restore argv) through the full sandbox.
fn start_unconfigured(env: &Env, name: &str, spec: &Spec, tag: &str) -> Guest {
    let sock = env.run.join(name).join("control/api.sock");
    let mut c = env.launch_cmd(name);
    c.arg("--probe")
        .arg("--")
        .args(snapshot_fc::restore_argv(spec, &sock));
    spawn_logged(c, env.path(&format!("{name}.{tag}.log")))
}

#[test]
fn firecracker_snapshots_as_the_principal_and_restores_only_a_matching_snapshot() {
    let env = Env::new();
    let Some(bin) = real_binary(&env, "VMWARDEN_TEST_FIRECRACKER", "firecracker") else {
        return;
    };
    let name = "fchib";
    let u = uid(600);
    let _acl = KvmAcl::grant(u);
    let (a, b) = (disk(&env, "a.img"), disk(&env, "b.img"));
    let mut s = env.spec(name, u);
    s["hypervisor"] = json!({ "kind": "firecracker", "binary": bin, "accel": "kvm" });
    s["kernel"] = json!(vmlinux(&env));
    s["cmdline"] = json!("console=ttyS0 panic=-1");
    s["disks"] = json!([{ "path": a, "read_only": true }, { "path": b, "read_only": true }]);
    env.write_spec(name, &s);
    let spec = typed(&s);
    let sock = env.run.join(name).join("control/api.sock");
    let control = env.run.join(name).join("control");
    let fc = HypervisorKind::Firecracker;

    // -- Capture: the real launch (its --config-file), then pause and a
    //    full snapshot into the state dir. --
    let mut g = env.start(name);
    wait_state(&sock, fc, "Running", &mut g);
    let dir = snapshot_dir(&env, name, u);
    snapshot_fc::capture(&sock, &dir, T).unwrap_or_else(|e| panic!("{e}\n{}", g.log_text()));
    for f in [snapshot_fc::VMSTATE, snapshot_fc::MEMORY] {
        let m = std::fs::metadata(dir.join(f)).unwrap();
        // Written by firecracker itself, as the principal: never root.
        assert_eq!((m.uid(), m.gid()), (u, u), "{f}");
        assert_eq!(m.mode() & 0o077, 0, "{f}: mode {:o}", m.mode());
    }
    assert_eq!(
        std::fs::metadata(dir.join(snapshot_fc::MEMORY))
            .unwrap()
            .len(),
        256 << 20
    );
    g.kill();
    let (o, rep) = env.cleanup(name);
    assert!(o.status.success() && rep["clean"] == true, "{}", text(&o));

    // -- Restore: firecracker without a config; the load, paused; the
    //    device check; the resume. In the same sandbox. --
    let mut g = start_unconfigured(&env, name, &spec, "restore");
    let t0 = Instant::now();
    snapshot_fc::restore(&sock, &dir, &spec, &control, T)
        .unwrap_or_else(|e| panic!("{e}\n{}", g.log_text()));
    let took = t0.elapsed();
    wait_state(&sock, fc, "Running", &mut g);
    assert_confined(g.pid(), u);
    println!("firecracker: load + check + resume of a 256 MiB snapshot in the sandbox: {took:?}");
    g.kill();
    let (o, rep) = env.cleanup(name);
    assert!(o.status.success() && rep["clean"] == true, "{}", text(&o));

    // -- The corruption case: the spec now swaps the disks. firecracker
    //    would attach each to the other's place; the check names the
    //    field and the VM stays paused, never run. --
    let mut s2 = s.clone();
    s2["disks"] = json!([{ "path": b, "read_only": true }, { "path": a, "read_only": true }]);
    env.write_spec(name, &s2);
    let spec2 = typed(&s2);
    let mut g = start_unconfigured(&env, name, &spec2, "mismatch");
    let e = snapshot_fc::restore(&sock, &dir, &spec2, &control, T).unwrap_err();
    let e_text = e.to_string();
    assert!(
        matches!(e, snapshot_fc::RestoreError::Mismatch(_))
            && e_text.contains(&format!(
                "drives[disk0].path_on_host: the snapshot has {:?}, the spec now gives {:?}",
                a.display().to_string(),
                b.display().to_string()
            )),
        "{e_text}"
    );
    wait_state(&sock, fc, "Paused", &mut g);
    g.kill();
    let (o, rep) = env.cleanup(name);
    assert!(o.status.success() && rep["clean"] == true, "{}", text(&o));
}

#[test]
fn cloud_hypervisor_capture_failure_leaves_the_vm_running_and_nothing_written() {
    let env = Env::new();
    let Some(bin) = real_binary(&env, "VMWARDEN_TEST_CLOUD_HYPERVISOR", "cloud-hypervisor") else {
        return;
    };
    let name = "chhib";
    let u = uid(601);
    let _acl = KvmAcl::grant(u);
    let mut s = env.spec(name, u);
    s["hypervisor"] = json!({ "kind": "cloud-hypervisor", "binary": bin, "accel": "kvm" });
    s["kernel"] = json!(vmlinux(&env));
    s["cmdline"] = json!("console=ttyS0 panic=-1");
    env.write_spec(name, &s);
    let spec = typed(&s);
    let sock = env.run.join(name).join("control/api.sock");
    let ch = HypervisorKind::CloudHypervisor;
    let mut g = env.start(name);
    wait_state(&sock, ch, "Running", &mut g);
    assert_confined(g.pid(), u);
    let dir = snapshot_dir(&env, name, u);
    match snapshot_ch::capture(&sock, &dir, T) {
        // This host's KVM: the vCPU's nested state cannot be read.
        Err(snapshot_ch::CaptureError::Snapshot { source, resumed }) => {
            assert!(resumed, "{source}");
            wait_state(&sock, ch, "Running", &mut g);
            assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
            println!("cloud-hypervisor: capture refused by this KVM, VM resumed: {source}");
        }
        Err(e) => panic!("{e}\n{}", g.log_text()),
        // A KVM that snapshots: the snapshot's own config.json passes the
        // device check against the spec it was taken from.
        Ok(()) => {
            let layout_dir = env.run.join(name);
            let bytes = std::fs::read(dir.join(snapshot_ch::CONFIG_JSON)).unwrap();
            let layout = Layout {
                qmp_fd: -1,
                credentials_dir: layout_dir.join("credentials"),
                api_socket: sock.clone(),
                firecracker_config: layout_dir.join("control/firecracker.json"),
                tap_fds: vec![],
                tap_queue_fds: vec![],
                vhost_net_fds: vec![],
                control_dir: layout_dir.join("control"),
                vhost_vsock_fd: None,
                user_net_fd: None,
                event_monitor_fd: None,
                usb_nodes: vec![],
            };
            snapshot_ch::check(&spec, &layout, "config.json", &bytes).unwrap();
        }
    }
    g.kill();
    let (o, rep) = env.cleanup(name);
    assert!(o.status.success() && rep["clean"] == true, "{}", text(&o));
}

/// A firecracker spec that may hibernate, with two read-only disks.
fn fc_hibernate_spec(env: &Env, name: &str, u: u32, bin: &Path) -> serde_json::Value {
    let mut s = env.spec(name, u);
    s["hypervisor"] = json!({ "kind": "firecracker", "binary": bin, "accel": "kvm" });
    s["kernel"] = json!(vmlinux(env));
    s["cmdline"] = json!("console=ttyS0 panic=-1");
    let (a, b) = (disk(env, "a.img"), disk(env, "b.img"));
    s["disks"] = json!([{ "path": a, "read_only": true }, { "path": b, "read_only": true }]);
    s["hibernate"] = json!({ "allowed": true });
    env.write_spec(name, &s);
    s
}

#[test]
fn firecracker_hibernate_then_start_restores_in_the_sandbox_and_consumes_the_snapshot() {
    let env = Env::new();
    let Some(bin) = real_binary(&env, "VMWARDEN_TEST_FIRECRACKER", "firecracker") else {
        return;
    };
    let name = "fcfw";
    let u = uid(602);
    let _acl = KvmAcl::grant(u);
    fc_hibernate_spec(&env, name, u, &bin);
    let sock = env.run.join(name).join("control/api.sock");
    let fc = HypervisorKind::Firecracker;
    let snap = env.state.join(name).join(".vmwarden-hibernate");
    let record = env.state.join(format!(".hibernated-{name}.json"));

    let mut g = env.start(name);
    wait_state(&sock, fc, "Running", &mut g);
    let h = env.vmwarden(&["hibernate", name, "--timeout", "60"]);
    assert!(h.status.success(), "hibernate: {}", text(&h));
    let st = g
        .wait_exit(Duration::from_secs(15))
        .expect("firecracker runs on");
    // Ended by SIGTERM: a clean exit for its unit, not restarted (and so
    // not restored at once) by `Restart=on-failure`.
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(st.signal(), Some(libc::SIGTERM), "{st:?}");
    for f in [snapshot_fc::VMSTATE, snapshot_fc::MEMORY] {
        let m = std::fs::symlink_metadata(snap.join(f)).unwrap();
        assert_eq!((m.uid(), m.mode() & 0o7777), (u, 0o600), "{f}");
    }
    assert!(record.is_file());
    let rep = env.assert_clean(name);
    assert!(
        rep["kept"].to_string().contains(".vmwarden-hibernate"),
        "{rep}"
    );

    // The start restores: firecracker without its config file, the
    // paused load, the device check and the resume by the first
    // restored poll (wait-ready), in the same sandbox.
    let mut g2 = spawn_logged(env.launch_cmd(name), env.path("fcfw.2.log"));
    let t0 = Instant::now();
    let r = env.vmwarden(&["wait-ready", name, "--timeout", "60"]);
    assert!(r.status.success(), "{}\n{}", text(&r), g2.log_text());
    println!(
        "firecracker: start -> restored and running: {:?}",
        t0.elapsed()
    );
    wait_state(&sock, fc, "Running", &mut g2);
    let cmd = String::from_utf8_lossy(&read_proc_bytes(g2.pid(), "cmdline")).into_owned();
    assert!(!cmd.contains("--config-file"), "{cmd}");
    assert!(
        g2.log_text().contains("/snapshot/load"),
        "{}",
        g2.log_text()
    );
    assert_confined(g2.pid(), u);
    assert!(
        !snap.exists() && !record.exists(),
        "the snapshot was not consumed"
    );
    g2.kill();
    env.assert_clean(name);
}

#[test]
fn a_kill_at_every_firecracker_capture_kill_point_then_cleanup_is_clean() {
    require_fault_injection();
    let env = Env::new();
    let Some(bin) = real_binary(&env, "VMWARDEN_TEST_FIRECRACKER", "firecracker") else {
        return;
    };
    let name = "fckill";
    let u = uid(603);
    let _acl = KvmAcl::grant(u);
    fc_hibernate_spec(&env, name, u, &bin);
    let sock = env.run.join(name).join("control/api.sock");
    let fc = HypervisorKind::Firecracker;
    let snap = env.state.join(name).join(".vmwarden-hibernate");
    let partial = env.state.join(name).join(".vmwarden-hibernate.new");
    let record = env.state.join(format!(".hibernated-{name}.json"));
    for at in KILL_POINTS {
        let mut g = spawn_logged(env.launch_cmd(name), env.path(&format!("{name}.{at}.log")));
        if snap.exists() {
            // A snapshot kept by an earlier kill point: this start restores it.
            let r = env.vmwarden(&["wait-ready", name, "--timeout", "60"]);
            assert!(r.status.success(), "{at}: {}", text(&r));
        }
        wait_state(&sock, fc, "Running", &mut g);
        let h = env
            .vmwarden_cmd()
            .args(["hibernate", name, "--timeout", "60"])
            .env("VMWARDEN_FAULT_AFTER", format!("hibernate:{at}"))
            .output()
            .unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(h.status.signal(), Some(9), "{at}: {}", text(&h));
        g.kill();
        env.assert_clean_after(name, &format!("hibernate:{at}"));
        assert!(!partial.exists(), "{at}: the partial snapshot is left");
        assert_eq!(
            snap.exists(),
            record.exists(),
            "{at}: snapshot and record disagree"
        );
    }
}

#[test]
fn a_firecracker_capture_that_fails_resumes_the_vm_and_leaves_nothing_written() {
    require_fault_injection();
    let env = Env::new();
    let Some(bin) = real_binary(&env, "VMWARDEN_TEST_FIRECRACKER", "firecracker") else {
        return;
    };
    let name = "fcfail";
    let u = uid(607);
    let _acl = KvmAcl::grant(u);
    fc_hibernate_spec(&env, name, u, &bin);
    let sock = env.run.join(name).join("control/api.sock");
    let fc = HypervisorKind::Firecracker;
    let mut g = env.start(name);
    wait_state(&sock, fc, "Running", &mut g);
    // Firecracker writes its snapshot's files itself, into a directory the
    // fault makes read-only to the principal: its own capture fails.
    hibernate::failed_capture(&env, name, "60", UNWRITABLE, "the capture failed (");
    wait_state(&sock, fc, "Running", &mut g);
    assert!(!hibernate::partial(&env, name).exists());
    assert!(!hibernate::snap(&env, name).exists());
    assert!(!hibernate::record(&env, name).exists());
    g.kill();
    let (o, rep) = env.cleanup(name);
    assert!(o.status.success() && rep["clean"] == true, "{}", text(&o));
}

/// A guest that, before READY, keeps a random marker in its memory (the
/// initramfs is RAM) and prints it with its uptime every half second:
/// the restored guest's first tick is its "ready".
const TICKER: &str = "cat /proc/sys/kernel/random/uuid >/marker\n\
(while :; do read -r up _ </proc/uptime; echo \"VMWARDEN-TICK up=$up marker=$(cat /marker)\"; sleep 0.5; done) </dev/null &\n";

/// The first tick in `g`'s log after byte `from`: (uptime, marker).
fn tick_after(g: &mut Guest, from: usize, limit: Duration) -> (f64, String) {
    let end = Instant::now() + limit;
    loop {
        let log = g.log_text();
        let t = hibernate::whole_lines(log.get(from..).unwrap_or(""))
            .lines()
            .find_map(|l| {
                let l = l.strip_prefix("VMWARDEN-TICK up=")?;
                let (up, marker) = l.split_once(" marker=")?;
                Some((up.parse().ok()?, marker.trim().to_string()))
            });
        if let Some(t) = t {
            return t;
        }
        if let Ok(Some(x)) = g.child.try_wait() {
            panic!("exited ({x}) before a tick:\n{log}");
        }
        assert!(Instant::now() < end, "no tick within {limit:?}:\n{log}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Cold boot vs restore of the same guest in the same run, for `kind`:
/// start → the guest's first tick. Prints the README's bench line.
fn restore_vs_cold_boot(kind: &str, var: &str, n: u32) {
    let env = Env::new();
    let Some(bin) = real_binary(&env, var, kind) else {
        return;
    };
    let name = format!("bench{n}");
    let u = uid(n);
    let _acl = KvmAcl::grant(u);
    let (kernel, _) = shares_assets();
    let vmlinux = env.path("vmlinux");
    asset_script(
        "extract-vmlinux.sh",
        &[
            &kernel.display().to_string(),
            &vmlinux.display().to_string(),
        ],
    );
    std::fs::set_permissions(&vmlinux, PermissionsExt::from_mode(0o644)).unwrap();
    let mut s = env.shares_spec(&name, u, "hold", TICKER);
    s["hypervisor"] = json!({ "kind": kind, "binary": bin, "accel": "kvm" });
    s["kernel"] = json!(vmlinux);
    s["hibernate"] = json!({ "allowed": true });
    env.write_spec(&name, &s);
    let boot = Duration::from_secs(300);

    let t0 = Instant::now();
    let mut g = spawn_logged(env.launch_cmd(&name), env.path(&format!("{name}.1.log")));
    let (up1, marker) = tick_after(&mut g, 0, boot);
    let cold = t0.elapsed();
    let h = env.vmwarden(&["hibernate", &name, "--timeout", "120"]);
    assert!(h.status.success(), "hibernate: {}", text(&h));
    g.wait_exit(Duration::from_secs(15));
    env.assert_clean(&name);

    let t1 = Instant::now();
    let mut g2 = spawn_logged(env.launch_cmd(&name), env.path(&format!("{name}.2.log")));
    // firecracker loads on the first restored poll: wait-ready, as the
    // unit's ExecStartPost runs it.
    let r = env.vmwarden(&["wait-ready", &name, "--timeout", "120"]);
    assert!(r.status.success(), "{}", text(&r));
    let (up2, marker2) = tick_after(&mut g2, 0, boot);
    let restore = t1.elapsed();
    assert_eq!(marker2, marker, "the in-memory marker did not survive");
    assert!(up2 >= up1, "uptime went back: {up1} then {up2}");
    assert!(!g2.log_text().contains("VMWARDEN-GUEST-READY"), "it booted");
    assert_confined(g2.pid(), u);
    println!(
        "{kind} restore: start → guest ready {} ms vs cold boot {} ms (ratio {:.2})",
        restore.as_millis(),
        cold.as_millis(),
        restore.as_secs_f64() / cold.as_secs_f64()
    );
    g2.kill();
    env.assert_clean(&name);
}

#[test]
#[ignore = "boots a guest: needs a KVM that runs one (not this host's PVM); run with --ignored where KVM boots guests"]
fn bench_cloud_hypervisor_restore_vs_cold_boot() {
    restore_vs_cold_boot("cloud-hypervisor", "VMWARDEN_TEST_CLOUD_HYPERVISOR", 604);
}

#[test]
#[ignore = "boots a guest: needs a KVM that runs one (not this host's PVM); run with --ignored where KVM boots guests"]
fn bench_firecracker_restore_vs_cold_boot() {
    restore_vs_cold_boot("firecracker", "VMWARDEN_TEST_FIRECRACKER", 605);
}

/// A process of root's that takes `pid` (the next pid set through
/// `ns_last_pid`, retried while other forks on the host win the race).
fn root_process_at(pid: i32) -> Option<std::process::Child> {
    for _ in 0..200 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string()).unwrap();
        let mut c = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        if i32::try_from(c.id()).ok() == Some(pid) {
            return Some(c);
        }
        c.kill().unwrap();
        c.wait().unwrap();
    }
    None
}

#[test]
fn firecrackers_quit_signals_no_process_but_the_vms_own_when_the_listeners_pid_is_reused() {
    // `SO_PEERCRED` names the process that called listen(), as it was
    // then: a principal that listens in one process and keeps the socket
    // in another can die and leave its pid to anyone, root's processes
    // included. The quit must not SIGTERM whoever has the pid now.
    use nix::sys::socket::{bind, listen, socket, AddressFamily, Backlog, SockFlag, SockType};
    use std::os::fd::AsRawFd;
    let env = Env::new();
    let u = uid(602);
    let control = env.path("fcpeer/control");
    std::fs::create_dir_all(&control).unwrap();
    std::os::unix::fs::chown(&control, Some(u), Some(u)).unwrap();
    let sock = control.join("api.sock");
    let s = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .unwrap();
    let addr = nix::sys::socket::UnixAddr::new(&sock).unwrap();
    // SAFETY: the child calls only async-signal-safe syscalls (setresgid,
    // setresuid, bind, listen, _exit) on memory prepared before the fork.
    let child = unsafe { libc::fork() };
    if child == 0 {
        let ok = nix::unistd::setresgid(u.into(), u.into(), u.into()).is_ok()
            && nix::unistd::setresuid(u.into(), u.into(), u.into()).is_ok()
            && bind(s.as_raw_fd(), &addr).is_ok()
            && listen(&s, Backlog::new(8).unwrap()).is_ok();
        // SAFETY: _exit in the forked child, no destructors run.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    assert!(child > 0, "fork failed");
    let st = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(child), None).unwrap();
    assert_eq!(
        st,
        nix::sys::wait::WaitStatus::Exited(nix::unistd::Pid::from_raw(child), 0)
    );
    // The listener is gone; its socket (held here) still names its pid,
    // which a root process now has.
    let mut victim = root_process_at(child).expect("no process got the listener's pid");
    let e = FcHibernator
        .quit(&sock, T)
        .expect_err("signalled the process that now has the listener's pid");
    std::thread::sleep(Duration::from_millis(300));
    let alive = victim.try_wait().unwrap().is_none();
    victim.kill().unwrap();
    victim.wait().unwrap();
    assert!(alive, "root's process at the reused pid was signalled");
    let e = e.to_string();
    assert!(e.contains(&format!("not the VM's uid {u}")), "{e}");
    drop(s);
}

#[test]
fn firecrackers_load_cannot_open_a_snapshot_drive_outside_its_sandbox() {
    // The load opens the drives the VM state names before any check can
    // run: what confines it is the sandbox, whose root binds only the
    // current spec's disks. A snapshot naming a disk the spec no longer
    // gives (here made root's 0600, as another VM's disk would be its
    // principal's) fails in the load itself and nothing runs.
    let env = Env::new();
    let Some(bin) = real_binary(&env, "VMWARDEN_TEST_FIRECRACKER", "firecracker") else {
        return;
    };
    let name = "fcout";
    let u = uid(603);
    let _acl = KvmAcl::grant(u);
    // Driven by hand as in the first test (no `hibernate` field: cleanup
    // keeps the snapshot directory, which no record names).
    let mut s = fc_hibernate_spec(&env, name, u, &bin);
    s.as_object_mut().unwrap().remove("hibernate");
    env.write_spec(name, &s);
    let sock = env.run.join(name).join("control/api.sock");
    let control = env.run.join(name).join("control");
    let fc = HypervisorKind::Firecracker;
    let mut g = env.start(name);
    wait_state(&sock, fc, "Running", &mut g);
    let dir = snapshot_dir(&env, name, u);
    snapshot_fc::capture(&sock, &dir, T).unwrap_or_else(|e| panic!("{e}\n{}", g.log_text()));
    g.kill();
    let (o, rep) = env.cleanup(name);
    assert!(o.status.success() && rep["clean"] == true, "{}", text(&o));

    let b = env.path("b.img");
    std::fs::set_permissions(&b, PermissionsExt::from_mode(0o600)).unwrap();
    let c = disk(&env, "c.img");
    let mut s2 = s.clone();
    s2["disks"][1] = json!({ "path": c, "read_only": true });
    env.write_spec(name, &s2);
    let spec2 = typed(&s2);
    let mut g = start_unconfigured(&env, name, &spec2, "outside");
    let e = snapshot_fc::restore(&sock, &dir, &spec2, &control, T).unwrap_err();
    let e_text = e.to_string();
    println!("firecracker's load of a drive outside its sandbox: {e_text}");
    assert!(
        matches!(e, snapshot_fc::RestoreError::Load(_)),
        "the load opened a disk outside the sandbox: {e_text}\n{}",
        g.log_text()
    );
    let st = api::vm_state(&sock, fc, T);
    assert!(st.as_deref().ok() != Some("Running"), "{st:?}: {e_text}");
    // firecracker ends after a failed load: the guest never ran.
    assert!(e_text.contains("Block"), "{e_text}");
    g.kill();
    let (o, rep) = env.cleanup(name);
    assert!(o.status.success() && rep["clean"] == true, "{}", text(&o));
}

/// `hibernate-all` at a shutdown leaves a firecracker VM to its unit: its
/// snapshot is bound to this boot of the host and would only be refused
/// after the reboot. It runs on, nothing is written, nothing recorded.
#[test]
fn hibernate_all_leaves_a_vm_whose_snapshot_is_bound_to_this_boot_to_its_unit() {
    let env = Env::new();
    let Some(bin) = real_binary(&env, "VMWARDEN_TEST_FIRECRACKER", "firecracker") else {
        return;
    };
    let name = "fcall";
    let u = uid(606);
    let _acl = KvmAcl::grant(u);
    fc_hibernate_spec(&env, name, u, &bin);
    let sock = env.run.join(name).join("control/api.sock");
    let mut g = env.start(name);
    wait_state(&sock, HypervisorKind::Firecracker, "Running", &mut g);
    let out = env.vmwarden(&["hibernate-all", "--timeout", "60"]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(
        t.contains(&format!(
            "{name}: left to its unit (firecracker snapshots are bound to the host's boot"
        )),
        "{t}"
    );
    wait_state(&sock, HypervisorKind::Firecracker, "Running", &mut g);
    assert!(!env.state.join(name).join(".vmwarden-hibernate").exists());
    assert!(!env.state.join(".hibernated-at-shutdown.json").exists());
    let s = env.vmwarden(&["stop", name, "--timeout", "10"]);
    assert!(s.status.success(), "{}", text(&s));
    let _ = g.wait_exit(Duration::from_secs(15));
    env.assert_clean(name);
}
