//! Issue 12 with a real TCG guest, the parts the launcher runs without
//! helper processes: 9p shares (QEMU's own -fsdev), a disk serial and
//! extra_args. The guest is tests/assets/build-guest-shares.sh's (the
//! generic Debian kernel: the cloud kernel has no 9p). Needs root.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::*;
use serde_json::json;

const BOOT: Duration = Duration::from_secs(180);

/// KERNEL and INITRD of the shares guest (built and cached on first use).
fn shares_assets() -> (PathBuf, PathBuf) {
    let out = Command::new("bash")
        .arg(repo_root().join("tests/assets/build-guest-shares.sh"))
        .output()
        .expect("run build-guest-shares.sh");
    assert!(
        out.status.success(),
        "build-guest-shares.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let env_path = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let text = std::fs::read_to_string(&env_path).unwrap();
    let get = |k: &str| -> PathBuf {
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .unwrap_or_else(|| panic!("{k} missing in {env_path}"));
        PathBuf::from(line.trim_matches('\''))
    };
    (get("KERNEL"), get("INITRD"))
}

fn b64(s: &str) -> String {
    const T: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let b = s.as_bytes();
    let mut o = String::new();
    for c in b.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                o.push(char::from(T[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                o.push('=');
            }
        }
    }
    o
}

fn dir(env: &Env, rel: &str, owner: u32, mode: u32) -> PathBuf {
    let p = env.path(rel);
    std::fs::create_dir_all(&p).unwrap();
    std::os::unix::fs::chown(&p, Some(owner), Some(owner)).unwrap();
    std::fs::set_permissions(&p, PermissionsExt::from_mode(mode)).unwrap();
    p
}

#[test]
fn a_guest_mounts_9p_shares_writes_as_its_principal_and_cannot_reach_another_vms_share() {
    let env = Env::new();
    let (kernel, initrd) = shares_assets();
    let ro = dir(&env, "ro-src", 0, 0o755);
    std::fs::write(ro.join("hello"), b"from the host\n").unwrap();
    std::fs::set_permissions(ro.join("hello"), PermissionsExt::from_mode(0o644)).unwrap();
    let rw = dir(&env, "rw-src", uid(21), 0o700);
    // World-readable, so only the sandbox can keep this VM out of it.
    let other = dir(&env, "db-src", uid(22), 0o755);
    std::fs::write(other.join("secret"), b"db's\n").unwrap();
    std::fs::set_permissions(other.join("secret"), PermissionsExt::from_mode(0o644)).unwrap();
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
    let mut spec = env.spec("web", uid(21));
    spec["hypervisor"]["machine"] = json!("pc");
    spec["kernel"] = json!(kernel);
    spec["initrd"] = json!(initrd);
    spec["cmdline"] = json!(format!(
        "{} vmwarden.run={}",
        guest_cmdline("pc", "hold"),
        b64(script)
    ));
    spec["shares"] = json!([
        { "tag": "ro", "source": ro, "proto": "9p", "read_only": true },
        { "tag": "rw", "source": rw, "proto": "9p", "read_only": false }
    ]);
    spec["disks"] = json!([{ "path": img, "serial": "data-1" }]);
    spec["hypervisor"]["extra_args"] = json!(["-device", "virtio-rng-pci"]);
    env.write_spec("web", &spec);

    // Another VM's share source is out of this VM's sandbox (Landlock):
    // the same launch, probing instead of exec'ing QEMU.
    let probe = env.probe(
        "web",
        &["/bin/cat", &other.join("secret").to_string_lossy()],
    );
    assert!(!probe.status.success(), "{}", text(&probe));
    let (o, rep) = env.cleanup("web");
    assert!(o.status.success() && rep["clean"] == true, "{}", text(&o));
    // ...while its own read-only share is readable there.
    let probe = env.probe("web", &["/bin/cat", &ro.join("hello").to_string_lossy()]);
    assert!(probe.status.success(), "{}", text(&probe));
    let (o, _) = env.cleanup("web");
    assert!(o.status.success(), "{}", text(&o));

    let log = env.path("web.serial.log");
    let f = std::fs::File::create(&log).unwrap();
    let mut cmd = env.launch_cmd("web");
    cmd.stdin(std::process::Stdio::null())
        .stdout(f.try_clone().unwrap())
        .stderr(f);
    let mut g = Guest {
        child: cmd.spawn().unwrap(),
        log,
    };
    g.wait_for("VMWARDEN-GUEST-READY", BOOT);
    let out = g.log_text();
    for want in [
        "VMWARDEN-DISK name=vda bytes=8388608 serial=data-1",
        "T-READ from the host",
        "T-WROTE",
        "T-RO-WRITE-REFUSED",
        "T-MKNOD rc=0",
        "T-CHMOD rc=0",
        // The guest believes it made a device node and a setuid file...
        "T-GUEST-SEES crw-r--r-- -rwsr-xr-x",
        "VMWARDEN-RUN-END rc=0",
    ] {
        assert!(out.contains(want), "guest output lacks {want:?}:\n{out}");
    }
    assert!(!out.contains("T-MOUNT-"), "{out}");

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
    let (o, rep) = env.cleanup("web");
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(rep["clean"], true, "{rep}");
    // Cleanup leaves the share sources and the disk alone.
    assert!(rw.join("out").is_file() && img.is_file());
}
