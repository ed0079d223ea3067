//! A VM's id range is its alone, for as long as it holds one: the range a
//! writable virtiofs share's virtiofsd maps the guest's ids onto
//! (`identity::ranges`). Each launch is a `--probe` in the VM's real
//! sandbox with its real virtiofsd and broker (tests/setup-host.sh's); no
//! guest boots.
//!
//! Needs root. The tests that add accounts change `/etc/passwd`,
//! `/etc/group`, `/etc/subuid` and `/etc/nsswitch.conf` (restored exactly,
//! even on a panic, by [`HostFiles`]): run them under the host-wide lock,
//! `flock /var/lock/vmwarden-roottests.lock cargo test --test id_ranges`.
//! The NSS case needs `libnss-extrausers` (tests/setup-host.sh).

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use serde_json::json;

const POOL_FIRST: u32 = 0x7000_0000;
const POOL_END: u32 = 0x7FFE_0000;
const RANGE_SIZE: u32 = 65_536;
const POOL_RANGES: u32 = (POOL_END - POOL_FIRST) / RANGE_SIZE;

/// VM `name` of principal `u` with one share the guest owns, in its state
/// dir (made here, the principal's).
fn owned_vm(env: &Env, name: &str, u: u32) -> PathBuf {
    owned_vm_at(env, name, u, &env.state.join(name).join("data"))
}

/// [`owned_vm`] with the share at `share`.
fn owned_vm_at(env: &Env, name: &str, u: u32, share: &Path) -> PathBuf {
    let mut spec = env.spec(name, u);
    spec["shares"] = json!([{ "tag": "data", "source": share, "proto": "virtiofs" }]);
    spec["virtiofsd"] = json!({ "binary": daemon("virtiofsd") });
    env.write_spec(name, &spec);
    std::fs::create_dir_all(&env.state).unwrap();
    for d in [env.state.join(name), share.to_path_buf()] {
        std::fs::create_dir_all(&d).unwrap();
        std::os::unix::fs::chown(&d, Some(u), Some(u)).unwrap();
        std::fs::set_permissions(&d, PermissionsExt::from_mode(0o700)).unwrap();
    }
    share.to_path_buf()
}

/// Launch VM `name` (principal `u`) once: `--probe -- /bin/true` in its
/// sandbox, its virtiofsd and broker beside it. Returns the launcher's
/// output once its helpers are gone and cleanup found it clean.
fn launch_once(env: &Env, name: &str, u: u32) -> std::process::Output {
    let out = env.probe(name, &["/bin/true"]);
    wait_until("the helpers gone", Duration::from_secs(15), || {
        others_of(u, 0).is_empty()
    });
    env.cleanup_clean(name);
    out
}

#[track_caller]
fn assert_launched(out: &std::process::Output) {
    assert!(out.status.success(), "{}", text(out));
}

#[track_caller]
fn assert_refused(out: &std::process::Output, code: i32, says: &[&str]) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(code), "{}", text(out));
    for s in says {
        assert!(err.contains(s), "stderr lacks {s:?}:\n{err}");
    }
}

/// Host files a test changes, restored byte for byte (and mode) when it
/// ends, also by a panic; a file that did not exist is removed again.
struct HostFiles(Vec<(PathBuf, Saved)>);

/// A file's bytes and mode, or `None`: it did not exist.
type Saved = Option<(Vec<u8>, u32)>;

impl HostFiles {
    fn save(paths: &[&str]) -> HostFiles {
        HostFiles(
            paths
                .iter()
                .map(|p| {
                    let saved = std::fs::read(p).ok().map(|b| {
                        let mode = std::fs::metadata(p).unwrap().permissions().mode();
                        (b, mode)
                    });
                    (PathBuf::from(p), saved)
                })
                .collect(),
        )
    }
}

impl Drop for HostFiles {
    fn drop(&mut self) {
        for (p, saved) in &self.0 {
            match saved {
                Some((bytes, mode)) => {
                    let tmp = p.with_extension("vmwarden-test-restore");
                    std::fs::write(&tmp, bytes).unwrap();
                    std::fs::set_permissions(&tmp, PermissionsExt::from_mode(*mode)).unwrap();
                    std::fs::rename(&tmp, p).unwrap();
                    assert_eq!(&std::fs::read(p).unwrap(), bytes, "{p:?} not restored");
                }
                None => {
                    let _ = std::fs::remove_file(p);
                }
            }
        }
    }
}

/// Append `line` to the host file `path`.
fn append(path: &str, line: &str) {
    let mut t = std::fs::read_to_string(path).unwrap_or_default();
    if !t.is_empty() && !t.ends_with('\n') {
        t.push('\n');
    }
    t.push_str(line);
    t.push('\n');
    let tmp = format!("{path}.vmwarden-test-new");
    std::fs::write(&tmp, t).unwrap();
    std::fs::set_permissions(&tmp, PermissionsExt::from_mode(0o644)).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A VM's range, checked at its first launch, is checked again at every
/// launch: an account added to `/etc/passwd` or `/etc/group` since, or a
/// subordinate range of `/etc/subuid`, with an id in it refuses the launch
/// (EX_CONFIG) naming the account; without it the VM launches again on
/// the same range.
#[test]
fn a_vms_id_range_is_its_alone_an_account_added_later_refuses_the_launch() {
    let env = Env::new();
    let u = uid(350);
    owned_vm(&env, "web", u);
    assert_launched(&launch_once(&env, "web", u));
    let (base, count) = id_range_in(&env, "web").expect("a range recorded");
    assert_eq!(count, RANGE_SIZE);
    let guest = base + 1000;
    {
        let _files = HostFiles::save(&["/etc/passwd"]);
        append(
            "/etc/passwd",
            &format!("vmw-idr-user:x:{guest}:{guest}::/nonexistent:/usr/sbin/nologin"),
        );
        let out = launch_once(&env, "web", u);
        assert_refused(
            &out,
            78,
            &[
                &format!("user vmw-idr-user has id {guest}"),
                "is no longer its alone",
            ],
        );
    }
    {
        let _files = HostFiles::save(&["/etc/group"]);
        append("/etc/group", &format!("vmw-idr-group:x:{}:", base + 190));
        let out = launch_once(&env, "web", u);
        assert_refused(
            &out,
            78,
            &[&format!("group vmw-idr-group has id {}", base + 190)],
        );
    }
    {
        let _files = HostFiles::save(&["/etc/subuid"]);
        append(
            "/etc/subuid",
            &format!("vmw-idr-sub:{}:65536", base + 30_000),
        );
        let out = launch_once(&env, "web", u);
        assert_refused(&out, 78, &["/etc/subuid (vmw-idr-sub)"]);
    }
    // Restored: the VM launches on its range again.
    assert_launched(&launch_once(&env, "web", u));
    assert_eq!(id_range_in(&env, "web"), Some((base, count)));
}

/// An account only NSS serves (here `extrausers`, as SSSD's id mapping
/// would) with an id in the range refuses the launch, named: the launcher
/// enumerates NSS (getpwent, getgrent) once per launch. A module that does
/// not enumerate (SSSD's default) cannot be seen this way.
#[test]
fn a_vms_id_range_is_its_alone_an_account_nss_serves_refuses_the_launch() {
    let env = Env::new();
    let u = uid(351);
    assert!(
        Path::new("/usr/lib/libnss_extrausers.so.2").exists()
            || Path::new("/usr/lib/x86_64-linux-gnu/libnss_extrausers.so.2").exists(),
        "libnss-extrausers is not installed (tests/setup-host.sh installs it)"
    );
    owned_vm(&env, "web", u);
    assert_launched(&launch_once(&env, "web", u));
    let (base, _) = id_range_in(&env, "web").expect("a range recorded");
    let made_dir = !Path::new("/var/lib/extrausers").exists();
    std::fs::create_dir_all("/var/lib/extrausers").unwrap();
    {
        let _files = HostFiles::save(&[
            "/etc/nsswitch.conf",
            "/var/lib/extrausers/passwd",
            "/var/lib/extrausers/group",
        ]);
        let ns = std::fs::read_to_string("/etc/nsswitch.conf").unwrap();
        let ns: String = ns
            .lines()
            .map(|l| {
                if l.starts_with("passwd:") || l.starts_with("group:") {
                    format!("{l} extrausers\n")
                } else {
                    format!("{l}\n")
                }
            })
            .collect();
        std::fs::write("/etc/nsswitch.conf.vmwarden-test-new", ns).unwrap();
        std::fs::rename("/etc/nsswitch.conf.vmwarden-test-new", "/etc/nsswitch.conf").unwrap();
        let id = base + 4242;
        append(
            "/var/lib/extrausers/passwd",
            &format!("vmw-idr-nss:x:{id}:{id}::/nonexistent:/usr/sbin/nologin"),
        );
        // NSS serves it, the files do not.
        let getent = std::process::Command::new("getent")
            .args(["passwd", "vmw-idr-nss"])
            .output()
            .unwrap();
        assert!(getent.status.success(), "{}", text(&getent));
        assert!(!std::fs::read_to_string("/etc/passwd")
            .unwrap()
            .contains("vmw-idr-nss"));
        let out = launch_once(&env, "web", u);
        assert_refused(&out, 78, &[&format!("user vmw-idr-nss has id {id}")]);
        std::fs::write("/var/lib/extrausers/passwd", b"").unwrap();
        append(
            "/var/lib/extrausers/group",
            &format!("vmw-idr-nssg:x:{id}:"),
        );
        let out = launch_once(&env, "web", u);
        assert_refused(&out, 78, &[&format!("group vmw-idr-nssg has id {id}")]);
    }
    if made_dir {
        std::fs::remove_dir("/var/lib/extrausers").unwrap();
    }
    assert_launched(&launch_once(&env, "web", u));
}

/// A range record is used only as valid: one that says VM `web`'s range
/// is host ids 1001.. (real accounts' ids, outside the pool) refuses web's
/// launch naming the record, instead of mapping the guest's ids there; a
/// record whose name is not its base, or of the wrong size, likewise. A
/// valid record an older vmwarden kept in the state root is moved to the
/// host-wide record and used.
#[test]
fn a_vms_id_range_is_its_alone_a_record_is_used_only_as_valid() {
    let env = Env::new();
    let (uw, ud, ua) = (uid(352), uid(353), uid(354));
    owned_vm(&env, "web", uw);
    owned_vm(&env, "db", ud);
    owned_vm(&env, "app", ua);
    let old = env.state.join(".principals");
    std::fs::create_dir_all(&old).unwrap();
    std::fs::set_permissions(&old, PermissionsExt::from_mode(0o700)).unwrap();
    let legacy = |base: u32, count: u32, vm: &str| json!({ "base": base, "count": count, "vm": vm, "state": "active" });
    let bad = old.join("range-1000.json");
    std::fs::write(&bad, legacy(1000, RANGE_SIZE, "web").to_string()).unwrap();
    let out = launch_once(&env, "web", uw);
    assert_refused(
        &out,
        78,
        &[
            &bad.display().to_string(),
            "is not a range of the pool",
            "fix or remove it by hand",
        ],
    );
    std::fs::remove_file(&bad).unwrap();
    // Named for another base than its own.
    let b = POOL_FIRST + 17 * RANGE_SIZE;
    let misnamed = old.join(format!("range-{}.json", b + RANGE_SIZE));
    std::fs::write(&misnamed, legacy(b, RANGE_SIZE, "web").to_string()).unwrap();
    assert_refused(
        &launch_once(&env, "web", uw),
        78,
        &[&misnamed.display().to_string(), "file name"],
    );
    std::fs::remove_file(&misnamed).unwrap();
    // The wrong size.
    let big = old.join(format!("range-{b}.json"));
    std::fs::write(&big, legacy(b, 2 * RANGE_SIZE, "web").to_string()).unwrap();
    assert_refused(
        &launch_once(&env, "web", uw),
        78,
        &[&big.display().to_string(), "counts 131072 ids"],
    );
    std::fs::remove_file(&big).unwrap();
    // Fixed, web gets a range of the pool.
    assert_launched(&launch_once(&env, "web", uw));
    let (wb, _) = id_range_in(&env, "web").unwrap();
    assert!((POOL_FIRST..POOL_END).contains(&wb) && (wb - POOL_FIRST).is_multiple_of(RANGE_SIZE));
    // An older vmwarden's valid record of db: moved and used.
    let db_base = POOL_FIRST + 100 * RANGE_SIZE;
    let db_old = old.join(format!("range-{db_base}.json"));
    std::fs::write(&db_old, legacy(db_base, RANGE_SIZE, "db").to_string()).unwrap();
    assert_launched(&launch_once(&env, "db", ud));
    assert_eq!(id_range_in(&env, "db"), Some((db_base, RANGE_SIZE)));
    assert!(!db_old.exists(), "the old record is moved");
    // One whose range another record already holds: app is refused, named.
    let clash = old.join(format!("range-{wb}.json"));
    std::fs::write(&clash, legacy(wb, RANGE_SIZE, "app").to_string()).unwrap();
    assert_refused(
        &launch_once(&env, "app", ua),
        78,
        &[&clash.display().to_string(), "overlaps"],
    );
}

/// FNV-1a of the state root, a zero byte and the VM name, modulo the
/// pool: where a VM starts looking (`identity::ranges::first_index`).
fn first_index(state_root: &Path, name: &str) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let bytes = state_root.as_os_str().as_encoded_bytes();
    for b in bytes.iter().chain(&[0u8]).chain(name.as_bytes()) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    u32::try_from(h % u64::from(POOL_RANGES)).unwrap()
}

/// Two state roots on one host (two installations, or an operator's own
/// roots beside the system's), with two VMs that start looking for a
/// range at the same place: they get two ranges, because the ranges are
/// recorded once per host, not per state root.
#[test]
fn a_vms_id_range_is_its_alone_across_state_roots() {
    let env = Env::new();
    let other = env.sibling();
    let (ua, ub) = (uid(355), uid(356));
    let want = first_index(&env.state, "web");
    let name = (0..200_000)
        .map(|i| format!("v{i}"))
        .find(|n| first_index(&other.state, n) == want)
        .expect("a name that starts where web does");
    owned_vm(&env, "web", ua);
    owned_vm(&other, &name, ub);
    assert_launched(&launch_once(&env, "web", ua));
    assert_launched(&launch_once(&other, &name, ub));
    let a = id_range_in(&env, "web").expect("web's range");
    let b = id_range_in(&other, &name).expect("the other root's VM's range");
    assert_eq!(
        a.0,
        POOL_FIRST + want * RANGE_SIZE,
        "web got its first choice"
    );
    assert_ne!(a.0, b.0, "two state roots handed out one range");
    // Both records are in the one host-wide directory.
    assert!(env.ranges.join(format!("range-{}.json", a.0)).is_file());
    assert!(env.ranges.join(format!("range-{}.json", b.0)).is_file());
}

/// Fill every range of the pool but `free` with active records of VMs of
/// another state root.
fn fill_pool_but(env: &Env, free: &[u32]) {
    std::fs::create_dir_all(&env.ranges).unwrap();
    std::fs::set_permissions(&env.ranges, PermissionsExt::from_mode(0o700)).unwrap();
    for i in 0..POOL_RANGES {
        let base = POOL_FIRST + i * RANGE_SIZE;
        let p = env.ranges.join(format!("range-{base}.json"));
        if free.contains(&base) || p.exists() {
            continue;
        }
        let rec = json!({
            "base": base, "count": RANGE_SIZE, "vm": format!("f{i}"),
            "state_root": "/srv/elsewhere", "state": "active", "shares": []
        });
        std::fs::write(p, rec.to_string()).unwrap();
    }
}

/// A purged range whose shares all lay in the VM's state dir (deleted and
/// verified by purge) is handed out again once no fresh range is left; a
/// purged range whose share lay outside the state dir never is. With the
/// pool full, the refusal names what would free a range.
#[test]
fn a_vms_id_range_is_its_alone_a_purged_range_is_recycled_and_exhaustion_names_what_frees_one() {
    let env = Env::new();
    let (uw, ue, ud, ua) = (uid(357), uid(358), uid(359), uid(360));
    owned_vm(&env, "web", uw);
    let outside = env.path("ext-src");
    owned_vm_at(&env, "ext", ue, &outside);
    assert_launched(&launch_once(&env, "web", uw));
    assert_launched(&launch_once(&env, "ext", ue));
    let (web, _) = id_range_in(&env, "web").unwrap();
    let (ext, _) = id_range_in(&env, "ext").unwrap();
    for vm in ["web", "ext"] {
        let (ok, out) = purge_on_pty(&env, &[vm], "DELETE-EVERYTHING");
        assert!(ok, "{out}");
    }
    let tomb = |b: u32| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(env.ranges.join(format!("range-{b}.json"))).unwrap())
            .unwrap()
    };
    assert_eq!(tomb(web)["recyclable"], true, "{}", tomb(web));
    assert_eq!(
        tomb(ext)["recyclable"],
        serde_json::Value::Null,
        "{}",
        tomb(ext)
    );
    assert_eq!(tomb(ext)["kept_by"], json!([outside]), "{}", tomb(ext));
    fill_pool_but(&env, &[web, ext]);
    // db gets web's old range: the only one nothing can carry ids of.
    owned_vm(&env, "db", ud);
    assert_launched(&launch_once(&env, "db", ud));
    assert_eq!(id_range_in(&env, "db"), Some((web, RANGE_SIZE)));
    // Now none is free: the refusal says what would free one.
    owned_vm(&env, "app", ua);
    let out = launch_once(&env, "app", ua);
    assert_refused(
        &out,
        78,
        &[
            "no id range is free for VM \"app\"",
            "purge NAME",
            "of /srv/elsewhere",
            &format!("range-{ext}.json (files in {})", outside.display()),
        ],
    );
    assert_eq!(id_range_in(&env, "app"), None);
}

/// One record that cannot be read (garbage in the host-wide directory and
/// in the state root's old one) stops neither launches nor purges: each
/// names it, its range stays unused, every other VM works.
#[test]
fn a_vms_id_range_is_its_alone_one_unreadable_record_blocks_nothing_else() {
    let env = Env::new();
    let u = uid(361);
    owned_vm(&env, "web", u);
    std::fs::create_dir_all(&env.ranges).unwrap();
    std::fs::set_permissions(&env.ranges, PermissionsExt::from_mode(0o700)).unwrap();
    let garbage_base = POOL_FIRST + first_index(&env.state, "web") * RANGE_SIZE;
    let g1 = env.ranges.join(format!("range-{garbage_base}.json"));
    std::fs::write(&g1, b"{ not json").unwrap();
    let old = env.state.join(".principals");
    std::fs::create_dir_all(&old).unwrap();
    std::fs::set_permissions(&old, PermissionsExt::from_mode(0o700)).unwrap();
    let g2 = old.join(format!("range-{}.json", POOL_FIRST + RANGE_SIZE));
    std::fs::write(&g2, b"\xff\xfe").unwrap();
    let out = launch_once(&env, "web", u);
    assert_launched(&out);
    for g in [&g1, &g2] {
        assert!(
            stderr(&out).contains(&g.display().to_string()),
            "the launch does not name {g:?}:\n{}",
            text(&out)
        );
    }
    let (b, _) = id_range_in(&env, "web").unwrap();
    assert_ne!(
        b, garbage_base,
        "the unreadable record's range was handed out"
    );
    let v = env.verify_clean(&["web"]);
    assert!(v.status.success(), "{}", text(&v));
    let (ok, out) = purge_on_pty(&env, &["web"], "DELETE-EVERYTHING");
    assert!(ok, "{out}");
    assert!(out.contains("retired id range"), "{out}");
    assert!(out.contains(&g1.display().to_string()), "{out}");
    // Both are still there, as they were.
    assert_eq!(std::fs::read(&g1).unwrap(), b"{ not json");
    assert_eq!(std::fs::read(&g2).unwrap(), b"\xff\xfe");
}

/// A range record is read bounded, as the file it is: one that is no
/// small regular file (a FIFO, a symlink) is reported by its path and
/// names no VM, and nothing opens it again to find out whose it is (a
/// FIFO opened to read blocks until a writer comes, under the host-wide
/// lock at a launch; a symlink would be followed, a huge file read whole).
#[test]
fn range_records_are_read_bounded_a_fifo_or_symlink_record_is_never_opened_again() {
    let env = Env::new();
    let u = uid(362);
    owned_vm(&env, "web", u);
    std::fs::create_dir_all(&env.ranges).unwrap();
    std::fs::set_permissions(&env.ranges, PermissionsExt::from_mode(0o700)).unwrap();
    let fifo = env
        .ranges
        .join(format!("range-{}.json", POOL_FIRST + 3 * RANGE_SIZE));
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    // A symlink to a file whose bytes claim web's range: followed, it
    // would make web's range ambiguous.
    let claim = env.path("claim.json");
    std::fs::write(
        &claim,
        json!({ "vm": "web", "state_root": env.state, "base": 1 }).to_string(),
    )
    .unwrap();
    let link = env
        .ranges
        .join(format!("range-{}.json", POOL_FIRST + 5 * RANGE_SIZE));
    std::os::unix::fs::symlink(&claim, &link).unwrap();
    let out = env.vmwarden_bounded(&["verify-clean", "web"], Duration::from_secs(60));
    let out = out.expect("vmwarden verify-clean hung on a FIFO in the ranges' record");
    assert!(out.status.success(), "{}", text(&out));
    for p in [&fifo, &link] {
        assert!(
            stderr(&out).contains(&p.display().to_string()),
            "{p:?} not reported:\n{}",
            text(&out)
        );
    }
}

/// The ranges' record is root's: a directory another user owns there (who
/// could then write any record) is refused by whatever reads it, as the
/// launch that writes it refuses it, never taken for the record.
#[test]
fn the_ranges_record_is_roots_a_directory_another_user_owns_is_refused_by_its_readers() {
    let env = Env::new();
    let (u, other) = (uid(363), uid(364));
    owned_vm(&env, "web", u);
    std::fs::create_dir_all(&env.ranges).unwrap();
    std::fs::set_permissions(&env.ranges, PermissionsExt::from_mode(0o700)).unwrap();
    let base = POOL_FIRST + 9 * RANGE_SIZE;
    let rec = env.ranges.join(format!("range-{base}.json"));
    std::fs::write(
        &rec,
        json!({ "base": base, "count": RANGE_SIZE, "vm": "web", "state_root": env.state, "state": "active" })
            .to_string(),
    )
    .unwrap();
    std::os::unix::fs::chown(&env.ranges, Some(other), Some(other)).unwrap();
    std::os::unix::fs::chown(&rec, Some(other), Some(other)).unwrap();
    let v = env.verify_clean(&["web"]);
    assert!(!v.status.success(), "{}", text(&v));
    let says = format!("is owned by uid {other}");
    assert!(text(&v).contains(&says), "lacks {says:?}:\n{}", text(&v));
}

/// The older records' directory, `STATE_ROOT/.principals`, is root's as
/// well: one another user owns is refused by whatever reads it, never
/// read, nor moved into the host-wide record.
#[test]
fn the_ranges_record_is_roots_an_old_records_directory_another_user_owns_is_refused() {
    let env = Env::new();
    let (u, other) = (uid(365), uid(366));
    owned_vm(&env, "web", u);
    let old = env.state.join(".principals");
    std::fs::create_dir_all(&old).unwrap();
    std::fs::set_permissions(&old, PermissionsExt::from_mode(0o700)).unwrap();
    let base = POOL_FIRST + 11 * RANGE_SIZE;
    let rec = old.join(format!("range-{base}.json"));
    std::fs::write(
        &rec,
        json!({ "base": base, "count": RANGE_SIZE, "vm": "web", "state": "active" }).to_string(),
    )
    .unwrap();
    std::os::unix::fs::chown(&old, Some(other), Some(other)).unwrap();
    std::os::unix::fs::chown(&rec, Some(other), Some(other)).unwrap();
    let v = env.verify_clean(&["web"]);
    assert!(!v.status.success(), "{}", text(&v));
    let says = format!("is owned by uid {other}");
    assert!(text(&v).contains(&says), "lacks {says:?}:\n{}", text(&v));
}

/// Launches do not queue on the host-wide lock of the ranges directory:
/// a VM whose range is recorded and already names its share launches
/// while another holder (here the test) keeps that lock; a VM that needs
/// a new range waits for it, and gets one once the lock is let go.
#[test]
fn a_relaunch_whose_range_is_recorded_takes_no_host_wide_lock() {
    let env = Env::new();
    let (u, v) = (uid(356), uid(357));
    owned_vm(&env, "again", u);
    owned_vm(&env, "fresh", v);
    assert_launched(&launch_once(&env, "again", u));
    let dir = std::fs::File::open(&env.ranges).unwrap();
    let lock = nix::fcntl::Flock::lock(dir, nix::fcntl::FlockArg::LockExclusiveNonblock)
        .expect("the ranges directory's lock");
    let spawn = |name: &str| {
        let mut c = env.launch_cmd(name);
        c.args(["--probe", "--", "/bin/true"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        c.spawn().unwrap()
    };
    let mut fresh = spawn("fresh");
    let again = spawn("again");
    let out = wait_exit(again, Duration::from_secs(120))
        .expect("the relaunch of a VM with its range recorded waited on the host-wide ranges lock");
    assert_launched(&out);
    // The lock still held, the VM that needs a new range is still waiting.
    assert!(
        fresh.try_wait().unwrap().is_none(),
        "a VM without a range launched while the ranges lock was held"
    );
    drop(lock);
    let out = wait_exit(fresh, Duration::from_secs(120))
        .expect("the fresh VM's launch once the lock was let go");
    assert_launched(&out);
    assert!(
        id_range_in(&env, "fresh").is_some(),
        "no range recorded for the fresh VM"
    );
    for (name, w) in [("again", u), ("fresh", v)] {
        wait_until("the helpers gone", Duration::from_secs(15), || {
            others_of(w, 0).is_empty()
        });
        env.cleanup_clean(name);
    }
}

/// The ids of a fresh range are read before the host-wide lock: what came
/// to hold one of them while the launch waited on the lock is seen before
/// the launch goes on with that range (read again once it is recorded),
/// and the VM gets another. Here a process runs with a uid of the range
/// the VM would get first, started while its launch waits on the lock.
#[test]
fn a_fresh_range_taken_while_the_launch_waited_on_the_lock_is_not_handed_out() {
    let env = Env::new();
    let u = uid(358);
    owned_vm(&env, "late", u);
    std::fs::create_dir_all(&env.ranges).unwrap();
    let dir = std::fs::File::open(&env.ranges).unwrap();
    let lock = nix::fcntl::Flock::lock(dir, nix::fcntl::FlockArg::LockExclusiveNonblock)
        .expect("the ranges directory's lock");
    // Its log in a file, read while it runs.
    let log = env.dir.path().join("late.log");
    let mut c = env.launch_cmd("late");
    c.args(["--probe", "--", "/bin/true"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap());
    let launch = c.spawn().unwrap();
    // Waiting on the lock (it says so once, naming it): its early scan of
    // the host's ids is done.
    wait_until(
        "the launch waits on the ranges lock",
        Duration::from_secs(60),
        || {
            std::fs::read_to_string(&log).is_ok_and(|l| {
                l.contains("waiting for a lock another process holds")
                    && l.contains(&env.ranges.display().to_string())
            })
        },
    );
    let base = POOL_FIRST + first_index(&env.state, "late") * RANGE_SIZE;
    let held = base + 100;
    let mut holder = {
        use std::os::unix::process::CommandExt;
        std::process::Command::new("sleep")
            .arg("600")
            .uid(held)
            .gid(held)
            .spawn()
            .unwrap()
    };
    wait_until(
        "the holder runs as its uid",
        Duration::from_secs(10),
        || {
            std::fs::read_to_string(format!("/proc/{}/status", holder.id())).is_ok_and(|s| {
                s.lines()
                    .any(|l| l.starts_with("Uid:") && l.contains(&held.to_string()))
            })
        },
    );
    drop(lock);
    let out =
        wait_exit(launch, Duration::from_secs(120)).expect("the launch once the lock was let go");
    let _ = holder.kill();
    let _ = holder.wait();
    assert_launched(&out);
    let (b, count) = id_range_in(&env, "late").expect("no range recorded for the VM");
    assert!(
        !(b..b + count).contains(&held),
        "VM late was handed the range {b}..{} although a process ran with its uid {held} before the range was recorded:\n{}\n{}",
        b + count,
        text(&out),
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    wait_until("the helpers gone", Duration::from_secs(15), || {
        others_of(u, 0).is_empty()
    });
    env.cleanup_clean("late");
}

/// The child's output once it exits, or `None` (the child killed) past `limit`.
fn wait_exit(mut c: std::process::Child, limit: Duration) -> Option<std::process::Output> {
    let end = std::time::Instant::now() + limit;
    while c.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > end {
            let _ = c.kill();
            let _ = c.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Some(c.wait_with_output().unwrap())
}

/// A first launch killed right after `lease-taken` (the fault-injection
/// build's `VMWARDEN_FAULT_AFTER`, a `SIGKILL`): its id range is taken
/// there, before the intent record and before the VM's state dir exists
/// (`launch::lock_order`). What it leaves is accounted for: the cleanup
/// after it is clean, and `purge` of the VM, which has no state dir,
/// retires the range instead of refusing for the missing directory (the
/// range would stay active, its 65536 ids lost, for a VM that never ran).
#[test]
fn a_range_taken_by_a_launch_killed_before_its_state_dir_is_retired_by_purge() {
    let env = Env::new();
    let u = uid(362);
    let share = env.path("ks-src");
    let mut spec = env.spec("ks", u);
    spec["shares"] = json!([{ "tag": "data", "source": share, "proto": "virtiofs" }]);
    spec["virtiofsd"] = json!({ "binary": daemon("virtiofsd") });
    env.write_spec("ks", &spec);
    std::fs::create_dir_all(&share).unwrap();
    std::os::unix::fs::chown(&share, Some(u), Some(u)).unwrap();
    std::fs::set_permissions(&share, PermissionsExt::from_mode(0o700)).unwrap();
    let mut c = env.launch_cmd("ks");
    c.env("VMWARDEN_FAULT_AFTER", "lease-taken")
        .args(["--probe", "--", "/bin/true"]);
    let out = c.output().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&out.status),
        Some(9),
        "not killed after lease-taken: {}",
        text(&out)
    );
    env.cleanup_clean("ks");
    assert!(
        !env.state.join("ks").exists(),
        "the killed launch made the state dir"
    );
    // The range is taken at lease-taken (launch::lock_order), so the
    // killed launch left one.
    let (base, _) = id_range_in(&env, "ks").expect("no range after lease-taken");
    // status says what purge would do: retire it, not refuse.
    let st = env.vmwarden(&["status", "--all", "--json", "ks"]);
    let v: serde_json::Value = serde_json::from_slice(&st.stdout)
        .unwrap_or_else(|e| panic!("status printed no JSON ({e}): {}", text(&st)));
    let purge = &v[0]["leftovers"]["purge"];
    assert_eq!(purge["refused"], serde_json::Value::Null, "{v}");
    assert_eq!(purge["retire_range"]["base"], json!(base), "{v}");
    let (ok, said) = purge_on_pty(&env, &["ks"], "DELETE-EVERYTHING");
    assert!(
        ok,
        "purge of the VM whose killed launch left range {base} refused: {said}"
    );
    assert_eq!(
        id_range_in(&env, "ks"),
        None,
        "purge left range {base} active: {said}"
    );
    let tomb: serde_json::Value = serde_json::from_slice(
        &std::fs::read(env.ranges.join(format!("range-{base}.json"))).unwrap(),
    )
    .unwrap();
    assert_eq!(tomb["state"], "retired", "{tomb}");
    env.cleanup_clean("ks");
}
