//! Unit tests of the id ranges' record: validation, overlap, what
//! takes a range.

use super::book::Read;
use super::*;
use crate::host::locks::testing::HeldElsewhere;
use crate::host::procs::Scan;
use crate::identity::host_ids::HostIds;

fn rec(base: u32, vm: &str) -> RangeRecord {
    RangeRecord {
        base,
        count: RANGE_SIZE,
        vm: VmName::parse(vm).unwrap(),
        state_root: "/var/lib/vmwarden".into(),
        state: State::Active,
        retired_unix: None,
        shares: Vec::new(),
        legacy: false,
        recyclable: false,
        kept_by: Vec::new(),
    }
}

fn entry(dir: &str, r: RangeRecord) -> Read {
    (Path::new(dir).join(range_name(r.base)), Ok(r))
}

#[test]
fn a_range_maps_guest_root_to_the_principal_and_the_rest_to_itself() {
    let r = IdRange {
        base: POOL_FIRST,
        count: RANGE_SIZE,
    };
    assert_eq!(
        r.id_map(61021),
        format!("0 61021 1\n1 {} 65535\n", POOL_FIRST + 1)
    );
    assert!(!r.contains(POOL_FIRST));
    assert!(r.contains(POOL_FIRST + 1) && r.contains(POOL_FIRST + 65_535));
    assert!(!r.contains(POOL_FIRST + 65_536) && !r.contains(0));
    assert_eq!((POOL_END - POOL_FIRST) % RANGE_SIZE, 0);
    // The pool stays below the signed 2^31 - 1 that tools mistake for -1.
    const { assert!(POOL_END <= 0x7FFF_FFFF) };
}

#[test]
fn where_a_vm_starts_in_the_pool_depends_on_its_root_and_name() {
    let a = VmName::parse("web").unwrap();
    let b = VmName::parse("db").unwrap();
    let root = Path::new("/var/lib/vmwarden");
    assert!(first_index(root, &a) < POOL_RANGES);
    assert_eq!(first_index(root, &a), first_index(root, &a));
    assert_ne!(first_index(root, &a), first_index(root, &b));
    assert_ne!(
        first_index(root, &a),
        first_index(Path::new("/srv/vmwarden"), &a)
    );
}

/// A VM's id range is its alone: a record is used only in the pool,
/// of the right size, under its own base's file name.
#[test]
fn a_vms_id_range_is_its_alone_a_record_is_validated_before_use() {
    let good = rec(POOL_FIRST + 5 * RANGE_SIZE, "web");
    assert_eq!(validate(&range_name(good.base), &good), Ok(()));
    // Outside the pool: real accounts' ids.
    let low = rec(1000, "web");
    let e = validate(&range_name(1000), &low).unwrap_err();
    assert!(e.contains("not a range of the pool"), "{e}");
    // In the pool but not on a range's boundary.
    let mid = rec(POOL_FIRST + 7, "web");
    let e = validate(&range_name(mid.base), &mid).unwrap_err();
    assert!(e.contains("not a range of the pool"), "{e}");
    // Past the pool.
    let high = rec(POOL_END, "web");
    assert!(validate(&range_name(POOL_END), &high).is_err());
    // Too many ids.
    let big = RangeRecord {
        count: 2 * RANGE_SIZE,
        ..good.clone()
    };
    let e = validate(&range_name(big.base), &big).unwrap_err();
    assert!(e.contains("counts"), "{e}");
    let small = RangeRecord {
        count: 1,
        ..good.clone()
    };
    assert!(validate(&range_name(small.base), &small).is_err());
    // The name says another base.
    let e = validate(&range_name(POOL_FIRST), &good).unwrap_err();
    assert!(e.contains("file name"), "{e}");
    // A relative state root.
    let rel = RangeRecord {
        state_root: "state".into(),
        ..good.clone()
    };
    assert!(validate(&range_name(rel.base), &rel).is_err());
}

/// Two records of one range for two VMs: both are bad (which VM holds
/// it is ambiguous), each names the other, the range stays blocked and
/// each VM is refused; a third VM's record is untouched.
#[test]
fn a_vms_id_range_is_its_alone_overlapping_records_are_both_refused() {
    let b = POOL_FIRST + 9 * RANGE_SIZE;
    let book = Book::from_entries(vec![
        entry("/var/lib/vmwarden/.ranges", rec(b, "web")),
        entry("/srv/state/.principals", rec(b, "db")),
        entry("/var/lib/vmwarden/.ranges", rec(b + RANGE_SIZE, "other")),
    ]);
    assert_eq!(book.good.len(), 1, "{book:?}");
    assert_eq!(book.good[0].1.vm.as_str(), "other");
    assert_eq!(book.bad.len(), 2, "{book:?}");
    for bad in &book.bad {
        assert!(bad.why.contains("overlaps"), "{bad}");
        assert!(bad.why.contains("/srv/state/.principals"), "{bad}");
    }
    let r = IdRange {
        base: b,
        count: RANGE_SIZE,
    };
    assert!(book.blocked(&r));
    let roots = Roots::default();
    assert_eq!(book.bad_of(&roots, &VmName::parse("web").unwrap()).len(), 1);
    // The same record twice (moved, its old file not yet removed) is
    // one record.
    let book = Book::from_entries(vec![
        entry("/var/lib/vmwarden/.ranges", rec(b, "web")),
        entry("/var/lib/vmwarden/.principals", rec(b, "web")),
    ]);
    assert_eq!((book.good.len(), book.bad.len()), (1, 0), "{book:?}");
}

/// A record that fails validation or cannot be parsed blocks its
/// range (named by the file and by its content) and nothing else.
#[test]
fn a_vms_id_range_is_its_alone_a_bad_record_blocks_only_its_range() {
    let b = POOL_FIRST + 3 * RANGE_SIZE;
    let wrong = RangeRecord {
        count: 7,
        ..rec(b, "web")
    };
    let book = Book::from_entries(vec![
        entry("/var/lib/vmwarden/.ranges", wrong),
        (
            Path::new("/var/lib/vmwarden/.ranges").join(range_name(b + 2 * RANGE_SIZE)),
            Err(("cannot be parsed".into(), Vec::new())),
        ),
    ]);
    assert!(book.good.is_empty());
    assert_eq!(book.bad.len(), 2);
    let at = |k: u32| IdRange {
        base: b + k * RANGE_SIZE,
        count: RANGE_SIZE,
    };
    assert!(book.blocked(&at(0)) && book.blocked(&at(2)));
    assert!(!book.blocked(&at(1)) && !book.blocked(&at(3)));
    assert!(book.bad[0]
        .to_string()
        .starts_with("/var/lib/vmwarden/.ranges/range-"));
}

#[test]
fn an_account_or_subordinate_range_in_a_range_takes_it() {
    let r = IdRange {
        base: POOL_FIRST,
        count: RANGE_SIZE,
    };
    let scan = Scan::default();
    let mut ids = HostIds::default();
    assert_eq!(ids.taken(r.base, r.end(), &scan), None);
    ids.accounts
        .push(("user sssd-alice".into(), POOL_FIRST + 1000));
    assert_eq!(
        ids.taken(r.base, r.end(), &scan).as_deref(),
        Some(format!("user sssd-alice has id {}", POOL_FIRST + 1000).as_str())
    );
    ids.accounts.clear();
    ids.subordinate.push((
        "/etc/subuid (alice)".into(),
        u64::from(POOL_FIRST) - 10,
        u64::from(POOL_FIRST) + 10,
    ));
    assert!(ids.taken(r.base, r.end(), &scan).unwrap().contains("alice"));
    ids.subordinate.clear();
    ids.nss_incomplete = Some("more than 1 users".into());
    assert!(ids.taken(r.base, r.end(), &scan).unwrap().contains("NSS"));
}

/// The host-wide lock (the directory itself) in `t`, waited on briefly.
fn lock_at(dir: &Path) -> Result<(), RangeError> {
    open_locked_at(dir, std::time::Duration::from_millis(300)).map(drop)
}

#[test]
fn a_planted_ranges_directory_is_refused_naming_it() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root (it gives the directory to another uid)"
    );
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join(".ranges");
    // A symlink to another of root's directories: not followed.
    let victim = t.path().join("victim");
    std::fs::create_dir(&victim).unwrap();
    std::os::unix::fs::symlink(&victim, &dir).unwrap();
    let text = lock_at(&dir).unwrap_err().to_string();
    assert!(text.contains(&dir.display().to_string()), "{text}");
    std::fs::remove_file(&dir).unwrap();
    // Another user's: they could hold it, and write any record.
    std::fs::create_dir(&dir).unwrap();
    std::os::unix::fs::lchown(&dir, Some(4_610_003), None).unwrap();
    let text = lock_at(&dir).unwrap_err().to_string();
    assert!(
        text.contains(&dir.display().to_string()) && text.contains("4610003"),
        "{text}"
    );
    std::os::unix::fs::lchown(&dir, Some(0), None).unwrap();
    lock_at(&dir).unwrap();
}

#[test]
fn a_ranges_lock_held_elsewhere_fails_after_the_wait_naming_the_holder() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join(".ranges");
    lock_at(&dir).unwrap();
    // A process that opened the directory while it was loose (or root's
    // own stuck one) and holds its lock.
    let other = HeldElsewhere::hold(&dir);
    let t0 = std::time::Instant::now();
    let e = lock_at(&dir).unwrap_err();
    let waited = t0.elapsed();
    assert!(
        waited >= std::time::Duration::from_millis(300)
            && waited < std::time::Duration::from_secs(10),
        "{waited:?}"
    );
    let text = e.to_string();
    assert!(
        matches!(e, RangeError::Lock(LockError::Busy { .. }))
            && text.contains(&dir.display().to_string())
            && text.contains(&format!("pid {}", other.pid())),
        "{text}"
    );
    drop(other);
    lock_at(&dir).unwrap();
}
