//! Guest memory, `mem_merge` and `hugepage_mem`, on the real kernel with
//! real QEMU guests: the guest's RAM is marked mergeable for KSM only when
//! the spec asks (QEMU's own default marks it), hugepages come from the
//! host's pool through a hugetlb memfd (no hugetlbfs path in the sandbox),
//! and a pool too small is refused by name before anything is made. Needs
//! root (it sets the host's `vm.nr_hugepages` for the test and puts it back).

mod common;

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::time::Duration;

use common::*;
use serde_json::json;

const BOOT: Duration = Duration::from_secs(180);
const NR_HUGEPAGES: &str = "/proc/sys/vm/nr_hugepages";
const FREE_HUGEPAGES: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages";

fn read_number(p: &str) -> u64 {
    std::fs::read_to_string(p)
        .unwrap_or_else(|e| panic!("{p}: {e}"))
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{p}: {e}"))
}

/// The host's 2 MiB pool grown by `extra` pages for as long as the guard
/// lives, then put back as it was (a panicking test included). Tests
/// that change the pool take turns through a lock file of the test base.
struct Pool {
    _lock: std::fs::File,
    before: u64,
}

impl Pool {
    fn grow(extra: u64) -> Pool {
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(test_base().join("hugepages.lock"))
            .unwrap();
        nix::fcntl::Flock::lock(
            lock.try_clone().unwrap(),
            nix::fcntl::FlockArg::LockExclusive,
        )
        .map(std::mem::forget)
        .map_err(|(_, e)| e)
        .unwrap();
        let before = read_number(NR_HUGEPAGES);
        set_pool(before + extra);
        let free = read_number(FREE_HUGEPAGES);
        assert!(
            free >= extra,
            "the host gave its pool only {free} free 2 MiB pages of the {extra} asked (memory too fragmented?)"
        );
        Pool {
            _lock: lock,
            before,
        }
    }
}

fn set_pool(n: u64) {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(NR_HUGEPAGES)
        .unwrap();
    writeln!(f, "{n}").unwrap();
}

impl Drop for Pool {
    fn drop(&mut self) {
        set_pool(self.before);
    }
}

/// The VmFlags and kernel page size of QEMU's mapping of the guest's RAM:
/// the one mapping of exactly `mib` MiB.
fn ram_mapping(pid: u32, mib: u64) -> (String, String) {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let want_kb = mib * 1024;
    let mut found = Vec::new();
    let chunks: Vec<&str> = smaps.split_inclusive("VmFlags:").collect();
    // Each chunk is one mapping up to its "VmFlags:"; its flags open the
    // next chunk.
    for pair in chunks.windows(2) {
        let field = |name: &str| -> Option<&str> {
            pair[0]
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(str::trim)
        };
        let size_kb =
            field("Size:").and_then(|v| v.trim_end_matches("kB").trim().parse::<u64>().ok());
        if size_kb == Some(want_kb) {
            let page = field("KernelPageSize:").unwrap_or("").to_string();
            let flags = pair[1].lines().next().unwrap_or("").trim().to_string();
            found.push((flags, page));
        }
    }
    assert_eq!(
        found.len(),
        1,
        "one mapping of {mib} MiB in QEMU's smaps, found {found:?}"
    );
    found.remove(0)
}

fn boot(env: &Env, tag: &str) -> Guest {
    let mut g = spawn_logged(env.launch_cmd("web"), env.path(&format!("web.{tag}.log")));
    g.wait_for("VMWARDEN-GUEST-READY", BOOT);
    g
}

#[test]
fn guest_memory_is_mergeable_only_when_asked_and_hugepages_come_from_the_hosts_pool() {
    let env = Env::new();
    let u = uid(71);
    let mut spec = env.spec("web", u);
    let mib = spec["memory_mib"].as_u64().unwrap();

    // Off by default: QEMU's default would mark the RAM mergeable ("mg").
    env.write_spec("web", &spec);
    let mut g = boot(&env, "plain");
    let (flags, page) = ram_mapping(g.pid(), mib);
    assert!(!flags.split_whitespace().any(|f| f == "mg"), "{flags}");
    assert_eq!(page, "4 kB");
    g.kill();
    env.assert_clean("web");

    spec["mem_merge"] = json!(true);
    env.write_spec("web", &spec);
    let mut g = boot(&env, "merge");
    let (flags, _) = ram_mapping(g.pid(), mib);
    assert!(flags.split_whitespace().any(|f| f == "mg"), "{flags}");
    g.kill();
    env.assert_clean("web");

    // Hugepages: the RAM is one hugetlb mapping ("ht", 2 MiB pages) from
    // the pool, and the sandbox opened no hugetlbfs path for it.
    spec["mem_merge"] = json!(false);
    spec["hugepage_mem"] = json!(true);
    env.write_spec("web", &spec);
    let pool = Pool::grow(mib / 2);
    let mut g = boot(&env, "huge");
    let (flags, page) = ram_mapping(g.pid(), mib);
    assert!(flags.split_whitespace().any(|f| f == "ht"), "{flags}");
    assert_eq!(page, "2048 kB");
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", g.pid())).unwrap();
    assert!(maps.contains("/memfd:"), "the RAM is a memfd: {maps}");
    assert!(!maps.contains("/dev/hugepages"), "{maps}");
    g.kill();
    env.assert_clean("web");
    drop(pool);
}

#[test]
fn a_hugepage_pool_too_small_is_refused_by_name_and_leaves_nothing() {
    let env = Env::new();
    let u = uid(72);
    let mut spec = env.spec("web", u);
    // More pages than any pool here has free: the whole of the largest guest.
    spec["memory_mib"] = json!(1_048_576);
    spec["hugepage_mem"] = json!(true);
    env.write_spec("web", &spec);
    let before = snapshot(&env, &[u]);
    let mut cmd = env.launch_cmd("web");
    cmd.arg("--probe").arg("--").arg("/bin/true");
    let out = bounded(&mut cmd, Duration::from_secs(30)).expect("a refusal is immediate");
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(
        err.contains("field `hugepage_mem`") && err.contains("524288 free 2 MiB hugepages"),
        "{err}"
    );
    assert_eq!(snapshot(&env, &[u]), before, "{err}");
}
