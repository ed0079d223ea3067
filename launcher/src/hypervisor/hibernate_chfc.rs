//! cloud-hypervisor's and firecracker's [`Hibernator`]s: the framework's
//! slots filled with `snapshot_ch` and `snapshot_fc`. Both write their own
//! files into the snapshot directory (nothing precreated); both take
//! their devices from the snapshot, so each also checks them
//! ([`Hibernator::mismatches`] before the start for cloud-hypervisor,
//! whose `config.json` root reads; the paused load's `GET /vm/config`
//! for firecracker, whose VM state is binary).

use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
use std::path::Path;
use std::time::Duration;

use super::api;
use super::hibernate::{CaptureError, Hibernator};
use super::snapshot_ch::{self, CONFIG_JSON, MAX_CONFIG};
use super::snapshot_fc;
use crate::config::paths::{Roots, FIRECRACKER_CONFIG};
use crate::config::spec::{HypervisorKind, Spec};
use crate::config::text::excerpt;
use crate::host::dirs::{self, Dir};
use crate::host::{cgroup, peer};

/// cloud-hypervisor: `vm.snapshot` to a `file://` directory, `--restore`.
#[derive(Debug)]
pub struct ChHibernator;

/// firecracker: `/snapshot/create`, then a paused `/snapshot/load`.
#[derive(Debug)]
pub struct FcHibernator;

fn failed(e: impl std::fmt::Display) -> CaptureError {
    CaptureError::Failed(excerpt(&e.to_string(), 400))
}

/// The value after `flag` in `argv`.
fn value_of<'a>(argv: &'a [String], flag: &str) -> Option<&'a String> {
    argv.iter()
        .position(|a| a == flag)
        .and_then(|i| argv.get(i + 1))
}

/// The tap fds of each `--net fd=[a,b],mac=…` value of a boot argv.
pub fn net_fds_of(argv: &[String]) -> Vec<Vec<i32>> {
    let Some(i) = argv.iter().position(|a| a == "--net") else {
        return Vec::new();
    };
    argv[i + 1..]
        .iter()
        .take_while(|a| !a.starts_with("--"))
        .filter_map(|v| {
            let list = v.strip_prefix("fd=[")?.split(']').next()?;
            Some(list.split(',').filter_map(|n| n.parse().ok()).collect())
        })
        .collect()
}

/// The nets' ids `config.json` (read from its inherited fd) gives, in
/// order; empty when it cannot be read (the restore then fails in
/// cloud-hypervisor, which names the net it lacks).
fn net_ids_from_fd(fds: &[(String, i32)]) -> Vec<String> {
    let Some((_, fd)) = fds.iter().find(|(n, _)| n == CONFIG_JSON) else {
        return Vec::new();
    };
    let mut buf = vec![0u8; usize::try_from(MAX_CONFIG).unwrap_or(1 << 20)];
    // SAFETY: `fd` is one of the snapshot's files root opened and holds
    // (`launch::restore::Restore`) for as long as this call runs.
    let file = unsafe { BorrowedFd::borrow_raw(*fd) };
    let mut got = 0;
    while got < buf.len() {
        match nix::sys::uio::pread(file, &mut buf[got..], i64::try_from(got).unwrap_or(0)) {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
    }
    buf.truncate(got);
    let c: snapshot_ch::SnapshotConfig = serde_json::from_slice(&buf).unwrap_or_default();
    snapshot_ch::net_ids(&c)
}

/// A pidfd of `pid` when that process runs as `owner` (real and
/// effective uid) now. `SO_PEERCRED` names the process that called
/// `listen()`, as it was then: a principal that listened in one process
/// and kept the socket in another could die and leave its pid to anyone,
/// root's processes included. The uid is read after the pidfd pins the
/// process and confirmed alive through it after, so it is that
/// process's.
/// Send `sig` to the hypervisor listening on `control`: the socket's peer,
/// pinned by a pidfd and signalled only while it runs as the peer's uid
/// ([`own_process`]).
fn signal_own_process(control: &Path, timeout: Duration, sig: i32) -> Result<(), CaptureError> {
    let s = peer::connect(control, timeout).map_err(failed)?;
    let cred = getsockopt(&s, PeerCredentials).map_err(failed)?;
    drop(s);
    let pid = u32::try_from(cred.pid()).map_err(failed)?;
    let fd = own_process(pid, cred.uid())?;
    cgroup::pidfd_signal(fd.as_raw_fd(), sig).map_err(failed)?;
    Ok(())
}

pub fn own_process(pid: u32, owner: u32) -> Result<OwnedFd, CaptureError> {
    let fd = cgroup::pidfd_open(pid).ok_or_else(|| failed(format!("pidfd_open({pid}) failed")))?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let uids: Vec<u32> = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .map(|l| {
            l.split_whitespace()
                .filter_map(|n| n.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    cgroup::pidfd_signal(fd.as_raw_fd(), 0).map_err(failed)?;
    match uids.get(..2) {
        Some([r, e]) if *r == owner && *e == owner => Ok(fd),
        _ => Err(failed(format!(
            "the API socket's listener, pid {pid}, now runs as uid {uids:?}, not the VM's uid {owner}: not signalled (its pid reused?)"
        ))),
    }
}

/// cloud-hypervisor's restore argv from its boot argv: the binary, API
/// socket and event monitor kept, every VM option dropped, the taps
/// handed over under the snapshot's net ids.
pub fn ch_restore_argv(argv: &[String], dir: &Path, net_ids: &[String]) -> Vec<String> {
    let mut a: Vec<String> = argv.iter().take(1).cloned().collect();
    if let Some(s) = value_of(argv, "--api-socket") {
        a.extend(["--api-socket".into(), s.clone()]);
    }
    // prefault: the guest's memory is populated in one mmap before the
    // copy, not one fault per page while it is read in (the copy mode
    // stays: `ondemand` needs a userfaultfd the principal may not open).
    let mut restore = format!("source_url={},prefault=on", snapshot_ch::file_url(dir));
    let nets: Vec<String> = net_fds_of(argv)
        .iter()
        .enumerate()
        .map(|(i, fds)| {
            // Only a plain name goes into the option string (the check
            // before the start refused any other; this is its backstop).
            let id = net_ids
                .get(i)
                .filter(|id| snapshot_ch::plain_id(id))
                .cloned()
                .unwrap_or_else(|| format!("_net{i}"));
            let fds: Vec<String> = fds.iter().map(i32::to_string).collect();
            format!("{id}@[{}]", fds.join(","))
        })
        .collect();
    if !nets.is_empty() {
        restore.push_str(&format!(",net_fds=[{}]", nets.join(",")));
    }
    // Restored paused (cloud-hypervisor's default): `wait-ready` consumes
    // the snapshot, then resumes it (`run_loaded`).
    if let Some(e) = value_of(argv, "--event-monitor") {
        a.extend(["--event-monitor".into(), e.clone()]);
    }
    a.extend(["--seccomp".into(), "true".into()]);
    a.extend(["--restore".into(), restore]);
    a
}

impl Hibernator for ChHibernator {
    fn precreated(&self) -> &'static [&'static str] {
        &[]
    }

    fn capture(
        &self,
        control: &Path,
        dir: &Path,
        _files: &[OwnedFd],
        timeout: Duration,
        started: &dyn Fn(),
    ) -> Result<(), CaptureError> {
        api::expect_ok(control, "PUT", snapshot_ch::PAUSE, None, timeout)?;
        started();
        let body = snapshot_ch::snapshot_body(dir);
        api::expect_ok(control, "PUT", snapshot_ch::SNAPSHOT, Some(&body), timeout)?;
        Ok(())
    }

    fn resume(&self, control: &Path, timeout: Duration) -> Result<(), CaptureError> {
        api::expect_ok(control, "PUT", snapshot_ch::RESUME, None, timeout)?;
        Ok(())
    }

    fn quit(&self, control: &Path, timeout: Duration) -> Result<(), CaptureError> {
        // SIGHUP, which cloud-hypervisor does not handle (the reboot-watch
        // helper ends it the same way), through a pidfd of the API
        // socket's peer while it still runs as the VM's uid: its exit code
        // is not run. Through `vm.shutdown` and `vmm.shutdown`, v53 died of
        // SIGSYS in its own exit (a thread panicking under its seccomp
        // filter) in two systemd-suite runs of three: a failed unit, which
        // `Restart=on-failure` answered by restoring the snapshot at once.
        // A death by SIGHUP is a clean one for the unit.
        signal_own_process(control, timeout, libc::SIGHUP)
    }

    fn restore_argv(&self, argv: Vec<String>, dir: &Path, fds: &[(String, i32)]) -> Vec<String> {
        ch_restore_argv(&argv, dir, &net_ids_from_fd(fds))
    }

    fn restored(&self, control: &Path, timeout: Duration) -> Result<bool, CaptureError> {
        if !self.loaded(control, Path::new(""), timeout)? {
            return Ok(false);
        }
        self.run_loaded(control, timeout)?;
        Ok(true)
    }

    /// Restored paused: loaded once the API answers Paused (or Running).
    fn loaded(
        &self,
        control: &Path,
        _snapshot: &Path,
        timeout: Duration,
    ) -> Result<bool, CaptureError> {
        let st = api::vm_state(control, HypervisorKind::CloudHypervisor, timeout)?;
        Ok(st == "Paused" || st == "Running")
    }

    fn run_loaded(&self, control: &Path, timeout: Duration) -> Result<(), CaptureError> {
        if api::vm_state(control, HypervisorKind::CloudHypervisor, timeout)? == "Paused" {
            api::expect_ok(control, "PUT", "/api/v1/vm.resume", None, timeout)?;
        }
        Ok(())
    }

    fn mismatches(&self, spec: &Spec, roots: &Roots, snapshot: &Dir) -> Vec<String> {
        let file = snapshot.path.join(CONFIG_JSON);
        let bytes = match dirs::read_small(snapshot, CONFIG_JSON, MAX_CONFIG) {
            Ok(Some(b)) => b,
            Ok(None) => return vec![format!("{}: missing", file.display())],
            Err(e) => return vec![e.to_string()],
        };
        let control = roots.control_dir(&spec.name);
        let creds = roots.credentials_dir(&spec.name);
        match snapshot_ch::check_paths(spec, &control, &creds, &file.display().to_string(), &bytes)
        {
            Ok(_) => Vec::new(),
            Err(e) => vec![e.to_string()],
        }
    }
}

impl Hibernator for FcHibernator {
    fn precreated(&self) -> &'static [&'static str] {
        &[]
    }

    fn capture(
        &self,
        control: &Path,
        dir: &Path,
        _files: &[OwnedFd],
        timeout: Duration,
        started: &dyn Fn(),
    ) -> Result<(), CaptureError> {
        let pause = snapshot_fc::pause_body();
        api::expect_ok(control, "PATCH", snapshot_fc::VM, Some(pause), timeout)?;
        started();
        let body = snapshot_fc::create_body(dir);
        api::expect_ok(control, "PUT", snapshot_fc::CREATE, Some(&body), timeout)?;
        Ok(())
    }

    fn resume(&self, control: &Path, timeout: Duration) -> Result<(), CaptureError> {
        let body = snapshot_fc::resume_body();
        api::expect_ok(control, "PATCH", snapshot_fc::VM, Some(body), timeout)?;
        Ok(())
    }

    fn quit(&self, control: &Path, timeout: Duration) -> Result<(), CaptureError> {
        // firecracker has no API to end its process: SIGTERM, which it
        // does not handle, through a pidfd of the API socket's peer. Ended
        // by SIGTERM, its unit counts a clean exit and
        // `Restart=on-failure` does not restore the snapshot at once (a
        // SIGKILL would).
        signal_own_process(control, timeout, libc::SIGTERM)
    }

    fn restore_argv(&self, argv: Vec<String>, _dir: &Path, _fds: &[(String, i32)]) -> Vec<String> {
        // No `--config-file`: a load must be firecracker's first request.
        let mut out = Vec::with_capacity(argv.len());
        let mut it = argv.into_iter();
        while let Some(a) = it.next() {
            if a == "--config-file" {
                it.next();
                continue;
            }
            out.push(a);
        }
        out
    }

    fn restored(&self, control: &Path, timeout: Duration) -> Result<bool, CaptureError> {
        let st = api::vm_state(control, HypervisorKind::Firecracker, timeout)?;
        Ok(st == "Running")
    }

    /// Loaded paused and checked (the snapshot is consumed before the
    /// guest runs an instruction); [`Hibernator::run_loaded`] resumes it.
    fn loaded(
        &self,
        control: &Path,
        snapshot: &Path,
        timeout: Duration,
    ) -> Result<bool, CaptureError> {
        let st = api::vm_state(control, HypervisorKind::Firecracker, timeout)?;
        if st != "Not started" {
            return Ok(st == "Running" || st == "Paused");
        }
        // What the launcher rendered for this start, from this spec: the
        // devices the restored VM must have.
        let control_dir = control.parent().unwrap_or(Path::new("/"));
        let cdir = dirs::open_dir(control_dir).map_err(failed)?;
        let now = dirs::read_small(&cdir, FIRECRACKER_CONFIG, MAX_CONFIG)
            .map_err(failed)?
            .ok_or_else(|| failed("the rendered firecracker config is missing"))?;
        snapshot_fc::load_paused_checked(
            control,
            snapshot,
            &String::from_utf8_lossy(&now),
            timeout,
        )
        .map_err(failed)?;
        Ok(true)
    }

    fn run_loaded(&self, control: &Path, timeout: Duration) -> Result<(), CaptureError> {
        if api::vm_state(control, HypervisorKind::Firecracker, timeout)? == "Paused" {
            snapshot_fc::resume(control, timeout).map_err(failed)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn v(xs: &[&str]) -> Vec<String> {
        xs.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn cloud_hypervisors_restore_argv_keeps_no_vm_option_of_the_boot() {
        let boot = v(&[
            "/bin/ch",
            "--api-socket",
            "path=/r/c/api.sock",
            "--kernel",
            "/k",
            "--disk",
            "path=/d",
            "--net",
            "fd=[7,8],mac=02:00:00:00:00:01,num_queues=4",
            "fd=[9],mac=02:00:00:00:00:02",
            "--event-monitor",
            "fd=5",
            "--serial",
            "tty",
            "--console",
            "off",
            "--seccomp",
            "true",
            "--extra",
        ]);
        assert_eq!(net_fds_of(&boot), vec![vec![7, 8], vec![9]]);
        let a = ch_restore_argv(&boot, Path::new("/s/.vmwarden-hibernate"), &v(&["_net3"]));
        assert_eq!(
            a,
            v(&[
                "/bin/ch",
                "--api-socket",
                "path=/r/c/api.sock",
                "--event-monitor",
                "fd=5",
                "--seccomp",
                "true",
                "--restore",
                "source_url=file:///s/.vmwarden-hibernate,prefault=on,net_fds=[_net3@[7,8],_net1@[9]]",
            ])
        );
    }

    #[test]
    fn firecrackers_restore_argv_has_no_config_file() {
        let boot = v(&[
            "/bin/fc",
            "--api-sock",
            "/r/c/api.sock",
            "--config-file",
            "/r/c/firecracker.json",
            "--level",
            "Info",
        ]);
        let a = FcHibernator.restore_argv(boot, Path::new("/s"), &[]);
        assert_eq!(
            a,
            v(&["/bin/fc", "--api-sock", "/r/c/api.sock", "--level", "Info"])
        );
        assert!(FcHibernator.precreated().is_empty() && ChHibernator.precreated().is_empty());
    }

    #[test]
    fn cloud_hypervisors_mismatches_read_the_snapshots_config_json_and_name_the_field() {
        // A real directory and root's bounded, no-symlink read of it.
        let d = tempfile::tempdir().unwrap();
        let roots = Roots {
            config_dir: "/etc/vmwarden".into(),
            runtime_root: "/run/vmwarden".into(),
            state_root: d.path().into(),
        };
        let mut spec = super::super::tests::spec();
        spec.hypervisor.kind = HypervisorKind::CloudHypervisor;
        spec.credentials.clear();
        let dir = dirs::open_dir(d.path()).unwrap();
        let found = ChHibernator.mismatches(&spec, &roots, &dir);
        assert!(
            found.len() == 1 && found[0].ends_with("config.json: missing"),
            "{found:?}"
        );
        let config = serde_json::json!({
            "payload": { "kernel": "/k/bzImage", "initramfs": "/k/initrd" },
            "disks": [
                { "path": "/data/a,b.img", "readonly": true },
                { "path": "/var/lib/vmwarden/web/root.img", "readonly": false }
            ],
            "serial": { "mode": "Tty" }, "console": { "mode": "Off" }
        });
        std::fs::write(d.path().join(CONFIG_JSON), config.to_string()).unwrap();
        let found = ChHibernator.mismatches(&spec, &roots, &dir).join("\n");
        assert!(
            found.contains(r#"disks[0].path: the snapshot has "/data/a,b.img", the spec now gives "/var/lib/vmwarden/web/root.img""#),
            "{found}"
        );
        // A symlink in its place is not followed.
        std::fs::remove_file(d.path().join(CONFIG_JSON)).unwrap();
        symlink("/etc/passwd", d.path().join(CONFIG_JSON)).unwrap();
        let found = ChHibernator.mismatches(&spec, &roots, &dir);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(!found[0].contains("root:"), "{found:?}");
    }
}
