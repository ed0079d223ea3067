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
