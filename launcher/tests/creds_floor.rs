//! The credential floor (`instance::creds_floor`) on the real kernel, from
//! a reviewer's side: what the launch does when the kernel cannot state a
//! unique mount id, and what cleanup says of the record it keeps. Needs
//! root.

mod common;

use std::os::unix::process::CommandExt;

use common::*;
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};
use serde_json::json;

fn spec_with_cred(env: &Env, name: &str, u: u32) {
    let src = env.secret(&format!("{name}.cred"), b"floor-secret");
    let mut s = env.spec(name, u);
    s["credentials"] = json!([{ "name": "key", "source": { "path": src } }]);
    env.write_spec(name, &s);
}

/// A kernel before 6.8 (the project needs 6.4, for `noswap`) has no
/// unique mount ids: `statx` asked for `STATX_MNT_ID_UNIQUE` (0x4000)
/// cannot state one. The launcher is run with a seccomp filter that
/// answers such a `statx` ENOSYS, as such a kernel cannot answer it.
fn without_unique_mount_ids() -> BpfProgram {
    let asks_unique_id = SeccompCondition::new(
        3,
        SeccompCmpArgLen::Dword,
        SeccompCmpOp::MaskedEq(0x4000),
        0x4000,
    )
    .unwrap();
    SeccompFilter::new(
        [(
            libc::SYS_statx,
            vec![SeccompRule::new(vec![asks_unique_id]).unwrap()],
        )]
        .into_iter()
        .collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        TargetArch::x86_64,
    )
    .unwrap()
    .try_into()
    .unwrap()
}

/// A launch on a kernel that cannot state the unique mount id goes on
/// with floor 0 (every mount searched, sound on any kernel); it was
/// refused at `namespace`, which made every launch fail on 6.4 to 6.7.
#[test]
fn a_kernel_without_unique_mount_ids_still_launches_with_floor_0() {
    assert!(nix::unistd::geteuid().is_root(), "this test needs root");
    let env = Env::new();
    spec_with_cred(&env, "web", uid(90));
    let prog = without_unique_mount_ids();
    let mut c = env.launch_cmd("web");
    c.arg("--probe").arg("--").arg("/bin/true");
    // SAFETY: between fork and exec the child only makes the one
    // prctl/seccomp call apply_filter makes on the prebuilt program.
    unsafe {
        c.pre_exec(move || seccompiler::apply_filter(&prog).map_err(std::io::Error::other));
    }
    let o = c.output().unwrap();
    assert!(o.status.success(), "the launch was refused: {}", text(&o));
    let floor: serde_json::Value =
        serde_json::from_slice(&std::fs::read(env.run.join("web/creds-floor.json")).unwrap())
            .unwrap();
    assert_eq!(
        (floor["floor"].as_u64(), floor["proven"].as_bool()),
        (Some(0), Some(false)),
        "{floor}"
    );
    env.cleanup_clean("web");
}

/// Cleanup's report says why it keeps the credential floor (it said the
/// last cleanup's record's reason: "it counts the instances torn down").
#[test]
fn cleanup_says_why_it_keeps_the_credential_floor() {
    assert!(nix::unistd::geteuid().is_root(), "this test needs root");
    let env = Env::new();
    spec_with_cred(&env, "web", uid(91));
    let o = env.probe("web", &["/bin/true"]);
    assert!(o.status.success(), "{}", text(&o));
    let rep = env.cleanup_clean("web");
    let floor = env.run.join("web/creds-floor.json");
    let kept = rep["kept"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["path"] == floor.to_str().unwrap())
        .unwrap_or_else(|| panic!("the credential floor is not reported kept: {rep:#}"));
    assert!(
        kept["reason"]
            .as_str()
            .is_some_and(|r| r.contains("credential floor")),
        "{kept:#}"
    );
}

/// A child killed and reaped when dropped, whatever the test's outcome.
struct Held(std::process::Child);

impl Drop for Held {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// web's tmpfs, at web's place, in a private mount namespace of the
/// initial user namespace whose only process, of uid 65534, has since
/// chrooted itself (`unshare -Ur`, then `chroot`, which any user may do
/// in a user namespace of its own) into a directory away from the
/// tmpfs: its mountinfo, which is all the search read of a namespace a
/// process is in, no longer shows the mount. The kernel still states it
/// (`statmount`), and the search now judges from that: verify-clean
/// passed, and cleanup proved a floor above what was left.
#[test]
fn a_namespace_whose_process_chrooted_away_from_the_tmpfs_is_still_found() {
    use std::io::BufRead;
    use std::process::{Command, Stdio};
    assert!(nix::unistd::geteuid().is_root(), "this test needs root");
    let env = Env::new();
    spec_with_cred(&env, "web", uid(92));
    let o = env.probe("web", &["/bin/true"]);
    assert!(o.status.success(), "{}", text(&o));
    env.cleanup_clean("web");
    // The jail: a static busybox, in a directory 65534 can reach.
    let jail = tempfile::Builder::new()
        .prefix("vmwarden-floor-jail")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::copy("/bin/busybox", jail.path().join("busybox")).unwrap();
    for p in [jail.path(), &jail.path().join("busybox")] {
        std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    let mp = env.run.join("web/credentials");
    std::fs::create_dir_all(&mp).unwrap();
    let mut c = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            "mount -t tmpfs vmwarden-creds:web '{}' && exec setpriv --reuid=65534 --regid=65534 --clear-groups unshare -Ur chroot '{}' /busybox sh -c 'echo MOUNTED; exec /busybox sleep 600'",
            mp.display(),
            jail.path().display()
        ))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = c.stdout.take().unwrap();
    let held = Held(c);
    let mut line = String::new();
    std::io::BufReader::new(out).read_line(&mut line).unwrap();
    assert_eq!(
        line.trim(),
        "MOUNTED",
        "the holder did not mount and chroot"
    );
    let pid = held.0.id();
    let shown = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    assert!(
        !shown.contains("vmwarden-creds:web"),
        "the chroot does not hide the mount from pid {pid}'s mountinfo: {shown}"
    );
    let v = env.verify_clean(&["web"]);
    assert!(
        text(&v).contains("no-credential-mount vm=web check=FAIL"),
        "web's tmpfs in pid {pid}'s namespace not found: {}",
        text(&v)
    );
    assert!(
        text(&v).contains(&format!("(pid {pid})")),
        "the process in the namespace, {pid}, is not named: {}",
        text(&v)
    );
    // Named, it is where reap --apply unmounts it (entering the namespace
    // puts the unmounter at the namespace's root, which sees it).
    let in_ns = || {
        let o = Command::new("nsenter")
            .args(["-t", &pid.to_string(), "-m", "cat", "/proc/self/mountinfo"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).contains("vmwarden-creds:web")
    };
    assert!(in_ns());
    let r = env.vmwarden(&["reap", "--apply"]);
    assert!(
        !in_ns(),
        "reap --apply left web's tmpfs in pid {pid}'s namespace: {}",
        text(&r)
    );
    drop(held);
    env.cleanup_clean("web");
}
