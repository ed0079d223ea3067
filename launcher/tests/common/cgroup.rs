//! A real kernel cgroup standing in for a systemd unit's, and the launch
//! as systemd starts a unit's process: in that cgroup, with the unit's
//! `$INVOCATION_ID` (also the cgroup's `trusted.invocation_id`, as systemd
//! sets it) and `$SYSTEMD_EXEC_PID` equal to the launcher's own pid.

use std::ffi::CStr;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use vmwarden::host::{cgroup, procs};

/// A cgroup made for one test, standing in for a unit's. Whatever is left
/// in it when dropped (only processes this test started) is killed by pid.
pub struct TestCgroup {
    pub path: PathBuf,
    /// The unit's invocation id, when [`TestCgroup::unit`] made it one.
    pub invocation: Option<String>,
}

impl TestCgroup {
    pub fn new(tag: &str) -> TestCgroup {
        let mount = cgroup::mount_point().expect(
            "this test needs a cgroup v2 hierarchy (/sys/fs/cgroup or /sys/fs/cgroup/unified)",
        );
        let path = mount.join(format!("vmwarden-test.{}.{tag}", std::process::id()));
        std::fs::create_dir(&path).unwrap();
        TestCgroup {
            path,
            invocation: None,
        }
    }

    /// A cgroup named `name` (a unit's: `PREFIX@NAME.service`).
    pub fn named(name: &str) -> TestCgroup {
        let mount = cgroup::mount_point().expect(
            "this test needs a cgroup v2 hierarchy (/sys/fs/cgroup or /sys/fs/cgroup/unified)",
        );
        let path = mount.join(name);
        std::fs::create_dir(&path).unwrap();
        TestCgroup {
            path,
            invocation: None,
        }
    }

    pub fn procs(&self) -> Vec<u32> {
        std::fs::read_to_string(self.path.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    pub fn id(&self) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(&self.path).unwrap().ino()
    }

    /// Make `c`'s child join this cgroup before it `execve`s.
    pub fn enter(&self, c: &mut Command) {
        let procs = std::ffi::CString::new(
            self.path
                .join("cgroup.procs")
                .into_os_string()
                .into_encoded_bytes(),
        )
        .unwrap();
        // SAFETY: the hook runs between fork and exec and only makes the
        // open/write/close system calls (no allocation: the path is a CStr).
        unsafe { c.pre_exec(move || join_cgroup(&procs)) };
    }
}

/// Move the calling process into the cgroup whose `cgroup.procs` is `procs`.
fn join_cgroup(procs: &CStr) -> std::io::Result<()> {
    let fd = nix::fcntl::open(procs, OFlag::O_WRONLY | OFlag::O_CLOEXEC, Mode::empty())?;
    nix::unistd::write(&fd, b"0")?;
    Ok(())
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        for pid in self.procs() {
            let _ = procs::sigkill(pid);
        }
        let end = Instant::now() + Duration::from_secs(10);
        while std::fs::remove_dir(&self.path).is_err() && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl TestCgroup {
    /// A cgroup named `name` (`PREFIX@NAME.service`) that systemd made for
    /// an invocation of that unit: its `trusted.invocation_id` is set.
    pub fn unit(name: &str, id: &str) -> TestCgroup {
        let mut cg = TestCgroup::named(name);
        cg.set_invocation_id(id);
        cg.invocation = Some(id.to_string());
        cg
    }

    /// Make `c` start in this cgroup; for a [`TestCgroup::unit`], as the
    /// unit's process ([`TestCgroup::as_unit_process`]).
    pub fn start_in(&self, c: Command) -> Command {
        match &self.invocation {
            Some(id) => self.as_unit_process(&c, id),
            None => {
                let mut c = c;
                self.enter(&mut c);
                c
            }
        }
    }

    /// Give the cgroup the `trusted.invocation_id` systemd gives a unit's
    /// (32 hex digits).
    pub fn set_invocation_id(&self, id: &str) {
        let path = std::ffi::CString::new(self.path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: setxattr(2) with NUL-terminated path and name and a value
        // buffer of the length given.
        let r = unsafe {
            libc::setxattr(
                path.as_ptr(),
                c"trusted.invocation_id".as_ptr(),
                id.as_ptr().cast(),
                id.len(),
                0,
            )
        };
        assert_eq!(
            r,
            0,
            "setxattr {}: {}",
            self.path.display(),
            std::io::Error::last_os_error()
        );
    }

    /// `c` run the way systemd runs a unit's `ExecStart=` in this cgroup:
    /// it joins the cgroup, `$INVOCATION_ID` is `id`, and
    /// `$SYSTEMD_EXEC_PID` is its own pid (a shell sets it to `$$` and
    /// `exec`s the program, which keeps the pid). Stdio is the caller's to
    /// set on the returned command.
    pub fn as_unit_process(&self, c: &Command, id: &str) -> Command {
        let mut w = Command::new("/bin/sh");
        w.args(["-c", "SYSTEMD_EXEC_PID=$$ exec \"$@\"", "sh"])
            .arg(c.get_program())
            .args(c.get_args());
        for (k, v) in c.get_envs() {
            match v {
                Some(v) => w.env(k, v),
                None => w.env_remove(k),
            };
        }
        if let Some(d) = c.get_current_dir() {
            w.current_dir(d);
        }
        w.env("INVOCATION_ID", id);
        self.enter(&mut w);
        w
    }
}
