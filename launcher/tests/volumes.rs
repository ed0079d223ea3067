//! Created volumes, `disks[].create`: the launcher makes the image (the
//! principal's, 0600, sparse, ext4 formatted by mkfs as the principal),
//! the guest sees it with its size and file system, what the guest writes
//! survives cleanup and a restart, purge deletes it unless kept, and a
//! launch killed after any step leaves no half-made image. Needs root and,
//! for the kill test, `--features fault-injection`.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use serde_json::json;

const BOOT: Duration = Duration::from_secs(180);
const SIZE_MIB: u64 = 24;

fn image(env: &Env) -> PathBuf {
    env.state.join("web/data.img")
}

fn temp(env: &Env) -> PathBuf {
    env.state.join("web/.data.img.vmwarden-new")
}

/// A 16 MiB ext4 image the launcher creates for VM `web` of `u`.
fn write_created_image_spec(env: &Env, u: u32) {
    let mut spec = env.spec("web", u);
    spec["disks"] =
        json!([{ "path": image(env), "create": { "size_mib": 16, "fs_type": "ext4" } }]);
    env.write_spec("web", &spec);
}

#[test]
fn a_created_volume_is_the_principals_sparse_ext4_and_survives_cleanup_restart_and_a_keeping_purge()
{
    let env = Env::new();
    let u = uid(41);
    let script = "\
if mount -t ext4 /dev/vda /mnt; then echo T-FS-EXT4; else echo T-MOUNT-FAILED; fi
echo \"T-BEFORE $(cat /mnt/mark 2>/dev/null || echo none)\"
echo persisted >/mnt/mark && echo T-WROTE
sync; umount /mnt
";
    let mut spec = env.shares_spec("web", u, "oneshot", script);
    spec["disks"] = json!([{ "path": image(&env), "serial": "vol-1",
                             "create": { "size_mib": SIZE_MIB, "fs_type": "ext4" } }]);
    spec["keep_on_purge"] = json!(["identity", "data.img"]);
    env.write_spec("web", &spec);

    assert!(!image(&env).exists());
    let out = boot_once_within(&env, "first", BOOT);
    let bytes = SIZE_MIB * 1024 * 1024;
    for want in [
        format!("VMWARDEN-DISK name=vda bytes={bytes} serial=vol-1"),
        "T-FS-EXT4".into(),
        "T-BEFORE none".into(),
        "T-WROTE".into(),
        "VMWARDEN-RUN-END rc=0".into(),
    ] {
        assert!(out.contains(&want), "guest output lacks {want:?}:\n{out}");
    }
    // On the host: the principal's, 0600, sized, sparse; no temp name left.
    let md = std::fs::symlink_metadata(image(&env)).unwrap();
    assert!(md.file_type().is_file());
    assert_eq!((md.uid(), md.gid(), md.mode() & 0o7777), (u, u, 0o600));
    assert_eq!(md.len(), bytes);
    let allocated = md.blocks() * 512;
    assert!(
        allocated < bytes / 2,
        "not sparse: {allocated} of {bytes} bytes allocated"
    );
    eprintln!(
        "measured: {SIZE_MIB} MiB ext4 image, {allocated} bytes allocated after the first boot"
    );
    assert!(!temp(&env).exists());
    let ino = md.ino();

    // Cleanup keeps it and says so.
    let rep = env.assert_clean("web");
    assert!(
        rep["kept"].to_string().contains("data.img"),
        "cleanup does not report the image kept: {rep}"
    );
    assert_eq!(std::fs::metadata(image(&env)).unwrap().ino(), ino);

    // A restart finds it (not re-made) with what the guest wrote.
    let out = boot_once_within(&env, "second", BOOT);
    assert!(out.contains("T-BEFORE persisted"), "{out}");
    assert!(out.contains("T-FS-EXT4"), "{out}");
    assert_eq!(std::fs::metadata(image(&env)).unwrap().ino(), ino);
    env.assert_clean("web");

    // purge --keep-identity keeps what keep_on_purge names...
    std::fs::write(env.state.join("web/scratch"), b"x").unwrap();
    let (ok, p) = purge_on_pty(&env, &["web", "--keep-identity"], "DELETE-EVERYTHING");
    assert!(ok, "{p}");
    assert!(!env.state.join("web/scratch").exists(), "{p}");
    assert_eq!(std::fs::metadata(image(&env)).unwrap().ino(), ino, "{p}");
    // ...a plain purge deletes it.
    let (ok, p) = purge_on_pty(&env, &["web"], "DELETE-EVERYTHING");
    assert!(ok, "{p}");
    assert!(!image(&env).exists(), "{p}");
}

fn ino(p: &Path) -> Option<u64> {
    std::fs::symlink_metadata(p).ok().map(|m| m.ino())
}

#[test]
fn kill_after_every_step_leaves_no_half_made_image_and_never_deletes_a_finished_one() {
    require_fault_injection();
    let env = Env::new();
    let u = uid(42);
    write_created_image_spec(&env, u);
    let steps = launch_steps();
    let made = steps.iter().position(|s| s == "images-made").unwrap();
    let placed = steps.iter().position(|s| s == "images-in-place").unwrap();
    assert_eq!(placed, made + 1, "{steps:?}");
    for (i, step) in steps.iter().enumerate() {
        // Each kill meets an image being made from nothing.
        if image(&env).exists() {
            std::fs::remove_file(image(&env)).unwrap();
        }
        env.launch_killed_after("web", step);
        let before = ino(&image(&env));
        if i < made {
            assert!(before.is_none() && !temp(&env).exists(), "step {step}");
        } else if i == made {
            // Made and formatted, not yet in place: only the temp name.
            assert!(before.is_none(), "step {step}: image under its final name");
            let md = std::fs::symlink_metadata(temp(&env)).unwrap();
            assert_eq!((md.uid(), md.mode() & 0o7777), (u, 0o600), "step {step}");
        } else {
            assert!(before.is_some() && !temp(&env).exists(), "step {step}");
        }
        let rep = env.assert_clean_after("web", step);
        // Cleanup removed the temp name (and reported it), never the image.
        assert!(!temp(&env).exists(), "step {step}: {rep}");
        if i == made {
            assert!(
                rep["deleted"]
                    .to_string()
                    .contains(".data.img.vmwarden-new"),
                "step {step}: {rep}"
            );
        }
        assert_eq!(ino(&image(&env)), before, "step {step}: {rep}");
        // The next launch makes (or keeps) the image and succeeds.
        let ok = env.probe("web", &["/bin/true"]);
        assert!(ok.status.success(), "relaunch after {step}: {}", text(&ok));
        let after = ino(&image(&env)).expect("image made by the relaunch");
        if let Some(b) = before {
            assert_eq!(after, b, "step {step}: a finished image was re-made");
        }
        env.assert_clean("web");
        assert_eq!(ino(&image(&env)), Some(after));
    }
}

#[test]
fn a_planted_temporary_name_is_replaced_never_followed() {
    // The state dir is the principal's: a VM could leave a symlink (or a
    // file) under the temporary name, pointing at something of root's.
    let env = Env::new();
    let u = uid(44);
    write_created_image_spec(&env, u);
    // A first launch makes the state dir (the principal's), then the image
    // goes so the next launch makes it again.
    assert!(env.probe("web", &["/bin/true"]).status.success());
    env.assert_clean("web");
    std::fs::remove_file(image(&env)).unwrap();
    let victim = env.path("root-file");
    std::fs::write(&victim, b"root's\n").unwrap();
    std::os::unix::fs::symlink(&victim, temp(&env)).unwrap();
    std::os::unix::fs::lchown(temp(&env), Some(u), Some(u)).unwrap();

    let ok = env.probe("web", &["/bin/true"]);
    assert!(ok.status.success(), "{}", text(&ok));
    assert_eq!(std::fs::read(&victim).unwrap(), b"root's\n");
    let md = std::fs::metadata(&victim).unwrap();
    assert_eq!((md.uid(), md.len()), (0, 7));
    let img = std::fs::symlink_metadata(image(&env)).unwrap();
    assert!(img.file_type().is_file());
    assert_eq!((img.uid(), img.mode() & 0o7777), (u, 0o600));
    std::fs::symlink_metadata(temp(&env)).unwrap_err();
    env.assert_clean("web");
}
