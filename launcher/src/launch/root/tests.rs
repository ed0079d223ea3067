//! The plan against the walk it replaced, and the tree `enter` makes.

use std::path::Component;

use super::resolve::MAX_LINKS;
use crate::launch::syscall::{Call, LinuxSyscall, RecordingSyscall};

use super::*;

fn rule(path: &str, grant: Grant) -> Rule {
    Rule {
        path: PathBuf::from(path),
        grant,
        field: None,
    }
}

#[test]
fn the_plan_binds_each_real_path_once_and_keeps_the_symlinks_on_the_way() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir_all(d.join("usr/bin")).unwrap();
    std::fs::write(d.join("usr/bin/hv"), "").unwrap();
    std::os::unix::fs::symlink("usr/bin", d.join("bin")).unwrap();
    std::fs::create_dir_all(d.join("state/web")).unwrap();
    // Planted by the VM: never followed.
    std::os::unix::fs::symlink("/etc", d.join("state/web/disk")).unwrap();
    let p = |s: &str| d.join(s).to_string_lossy().into_owned();
    let got = plan(
        &[
            rule(&p("bin/hv"), Grant::Exec),
            rule(&p("usr"), Grant::Exec),
            rule(&p("state/web"), Grant::Write),
            rule(&p("state/web/disk"), Grant::Write),
            rule(&p("nowhere"), Grant::Read),
            rule("/proc", Grant::Exec),
        ],
        &[d.join("state/web")],
        &[],
    );
    assert_eq!(
        got.binds,
        [
            Need {
                path: d.join("state/web"),
                write: true
            },
            Need {
                path: d.join("usr"),
                write: false
            },
        ]
    );
    assert_eq!(got.links, [(d.join("bin"), PathBuf::from("usr/bin"))]);
}

#[test]
fn a_path_that_needs_writing_inside_a_read_only_one_is_bound_again() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir_all(d.join("a/b")).unwrap();
    let p = |s: &str| d.join(s).to_string_lossy().into_owned();
    let got = plan(
        &[rule(&p("a/b"), Grant::Write), rule(&p("a"), Grant::Read)],
        &[],
        &[],
    );
    let paths: Vec<(PathBuf, bool)> = got.binds.into_iter().map(|n| (n.path, n.write)).collect();
    assert_eq!(paths, [(d.join("a"), false), (d.join("a/b"), true)]);
}

/// The resolution before [`HostPaths`]: every rule's path walked from
/// `/`, each component `lstat`ed (and read, a symlink) again.
fn reference_resolve(path: &Path, links: &mut Vec<(PathBuf, PathBuf)>) -> Option<PathBuf> {
    let mut cur = PathBuf::from("/");
    let mut hops = 0;
    let mut pending: Vec<std::ffi::OsString> = path
        .components()
        .rev()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some("..".into()),
            _ => None,
        })
        .collect();
    while let Some(name) = pending.pop() {
        if name == ".." {
            cur.pop();
            continue;
        }
        let next = cur.join(&name);
        let md = std::fs::symlink_metadata(&next).ok()?;
        if md.file_type().is_symlink() {
            hops += 1;
            if hops > MAX_LINKS {
                return None;
            }
            let target = std::fs::read_link(&next).ok()?;
            links.push((next, target.clone()));
            if target.is_absolute() {
                cur = PathBuf::from("/");
            }
            for c in target.components().rev() {
                match c {
                    Component::Normal(n) => pending.push(n.to_os_string()),
                    Component::ParentDir => pending.push("..".into()),
                    _ => {}
                }
            }
        } else {
            cur = next;
        }
    }
    Some(cur)
}

/// A host tree with every kind of symlink a rule's path may go
/// through, and rules through it that share their prefixes; `d` is
/// its top.
fn symlink_tree(d: &Path) -> (Vec<Rule>, Vec<PathBuf>, Vec<PathBuf>) {
    use std::os::unix::fs::symlink;
    for dir in ["real/a/b", "real/c", "own/web", "etc", "creds"] {
        std::fs::create_dir_all(d.join(dir)).unwrap();
    }
    std::fs::write(d.join("real/a/b/file"), "").unwrap();
    std::fs::write(d.join("etc/resolv.conf"), "").unwrap();
    // Absolute, relative, with `..`, a chain of three, to a file,
    // dangling, a loop, a link to a link's parent.
    symlink(d.join("real"), d.join("abs")).unwrap();
    symlink("real/a", d.join("rel")).unwrap();
    symlink("../../real/c", d.join("real/a/up")).unwrap();
    symlink("c2", d.join("c1")).unwrap();
    symlink("c3", d.join("c2")).unwrap();
    symlink("abs/a/b", d.join("c3")).unwrap();
    symlink("real/a/b/file", d.join("flink")).unwrap();
    symlink("nowhere/x", d.join("dangle")).unwrap();
    symlink("loop2", d.join("loop1")).unwrap();
    symlink("loop1", d.join("loop2")).unwrap();
    symlink("../rel/up/..", d.join("real/c/back")).unwrap();
    symlink("/etc", d.join("own/web/disk")).unwrap();
    let p = |s: &str| d.join(s).to_string_lossy().into_owned();
    let rules = vec![
        rule(&p("abs/a/b/file"), Grant::Read),
        rule(&p("rel/b"), Grant::Exec),
        rule(&p("rel/up"), Grant::Write),
        rule(&p("c1/file"), Grant::Read),
        rule(&p("c1"), Grant::Exec),
        rule(&p("flink"), Grant::Write),
        rule(&p("dangle"), Grant::Read),
        rule(&p("dangle/more"), Grant::Read),
        rule(&p("loop1"), Grant::Read),
        rule(&p("loop2/x"), Grant::Read),
        rule(&p("real/c/back/a"), Grant::Read),
        rule(&p("rel/../etc/resolv.conf"), Grant::Read),
        rule(&p("abs/a/up/../a/b"), Grant::Socket),
        rule(&p("own/web"), Grant::Write),
        rule(&p("own/web/disk"), Grant::Write),
        rule(&p("creds"), Grant::Read),
        rule(&p("real/missing"), Grant::Read),
        rule("/proc", Grant::Exec),
    ];
    (rules, vec![d.join("own/web")], vec![d.join("creds")])
}

#[test]
fn the_plan_is_the_one_each_rule_walked_on_its_own_gives() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (rules, own, mount_points) = symlink_tree(d);
    let got = plan(&rules, &own, &mount_points);
    let want = plan_with(&rules, &own, &mount_points, reference_resolve);
    assert_eq!(got, want);
    // The reference met every kind of link (the comparison is not of
    // two empty plans): the chain, `..` in a target, the loop and the
    // dangling link left out.
    let bound: Vec<&Path> = got.binds.iter().map(|n| n.path.as_path()).collect();
    assert!(bound.contains(&d.join("real/a/b").as_path()), "{got:?}");
    assert!(bound.contains(&d.join("real/c").as_path()), "{got:?}");
    assert!(!bound
        .iter()
        .any(|b| b.ends_with("x") || b.ends_with("more")));
    for link in ["abs", "rel", "c1", "c2", "c3", "flink", "real/a/up"] {
        assert!(
            got.links.iter().any(|(at, _)| *at == d.join(link)),
            "{link}: {got:?}"
        );
    }
    // The rules one at a time, each with a fresh memo, give the
    // same links as the reference, in the order they were met.
    for r in &rules {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let mut host = HostPaths::default();
        assert_eq!(
            resolve(&r.path, &mut host, &mut a),
            reference_resolve(&r.path, &mut b),
            "{}",
            r.path.display()
        );
        assert_eq!(a, b, "{}", r.path.display());
    }
}

#[test]
fn a_host_path_shared_by_rules_is_looked_up_once_per_plan() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir_all(d.join("store/x/bin")).unwrap();
    std::fs::create_dir_all(d.join("store/y/lib")).unwrap();
    std::os::unix::fs::symlink("store/x", d.join("cur")).unwrap();
    let mut host = HostPaths::default();
    let mut links = Vec::new();
    let above = d.components().count() - 1;
    for path in ["store/x/bin", "store/y/lib", "cur/bin", "store/x"] {
        assert!(resolve(&d.join(path), &mut host, &mut links).is_some());
    }
    // `d` and each directory above it, store, x, bin, y, lib, cur:
    // once each, however many rules went through them.
    assert_eq!(host.lookups, above + 6, "{:?}", host.seen.keys());
    assert_eq!(links.len(), 1);
}

/// `enter` with a recorder for the mounts (none is made: the tree is
/// built in a plain directory) and real sources of each kind.
fn enter_into(at: &Path, plan: &Plan) -> (Result<()>, Vec<Call>) {
    let host = tempfile::tempdir().unwrap();
    std::fs::write(host.path().join("file"), "").unwrap();
    let sources = plan
        .binds
        .iter()
        .map(|n| {
            let file = n.path.extension().is_some();
            let src = if file {
                host.path().join("file")
            } else {
                host.path().to_path_buf()
            };
            let fd =
                nix::fcntl::open(&src, OFlag::O_PATH | OFlag::O_CLOEXEC, Mode::empty()).unwrap();
            (fd, if file { SFlag::S_IFREG } else { SFlag::S_IFDIR })
        })
        .collect();
    let journal =
        nix::fcntl::open(host.path(), OFlag::O_PATH | OFlag::O_CLOEXEC, Mode::empty()).unwrap();
    let sys = RecordingSyscall::new();
    let got = enter(&sys, at, plan, sources, Some(&journal));
    (got, sys.calls())
}

fn need(path: &str, write: bool) -> Need {
    Need {
        path: PathBuf::from(path),
        write,
    }
}

fn a_plan() -> Plan {
    Plan {
        binds: vec![
            need("/dev/kvm.node", true),
            need("/etc/hosts.conf", false),
            need("/nix/store/aaa-qemu", false),
            need("/nix/store/bbb-glibc", false),
            need("/run/vmwarden/web", true),
            need("/usr", false),
            need("/usr/share/rw", true),
        ],
        links: vec![
            (PathBuf::from("/bin"), PathBuf::from("usr/bin")),
            (
                PathBuf::from("/run/current-system"),
                PathBuf::from("/nix/store/ccc"),
            ),
        ],
        mount_points: vec![PathBuf::from("/run/credentials/vm")],
    }
}

#[test]
fn the_root_holds_each_bind_link_and_mount_point_at_its_own_path() {
    let dir = tempfile::tempdir().unwrap();
    let at = dir.path();
    let plan = a_plan();
    let (got, calls) = enter_into(at, &plan);
    got.unwrap();
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    for d in [
        "proc",
        "dev",
        "tmp",
        "etc",
        "nix",
        "nix/store",
        "nix/store/aaa-qemu",
        "nix/store/bbb-glibc",
        "run",
        "run/vmwarden",
        "run/vmwarden/web",
        "run/credentials",
        "run/credentials/vm",
        "usr",
        "usr/share",
        "usr/share/rw",
        "run/systemd/journal",
    ] {
        let md = std::fs::symlink_metadata(at.join(d)).unwrap();
        assert!(md.is_dir(), "{d}");
        assert_eq!(md.permissions().mode() & 0o7777, 0o755, "{d}");
    }
    for f in ["dev/kvm.node", "etc/hosts.conf"] {
        let md = std::fs::symlink_metadata(at.join(f)).unwrap();
        assert!(md.is_file() && md.size() == 0, "{f}");
        assert_eq!(md.permissions().mode() & 0o7777, 0o644, "{f}");
    }
    for (location, target) in plan.links.iter().chain(&[(
        PathBuf::from(JOURNAL_SOCKET),
        PathBuf::from("/proc/self/fd/0"),
    )]) {
        let here = at.join(location.strip_prefix("/").unwrap());
        let read = std::fs::read_link(&here).unwrap();
        if location == Path::new(JOURNAL_SOCKET) {
            assert!(read.starts_with("/proc/self/fd/"), "{read:?}");
        } else {
            assert_eq!(read, *target);
        }
    }
    // Nothing else: top-level entries are the binds', links' and
    // mount points' first components.
    let mut top: Vec<String> = std::fs::read_dir(at)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    top.sort();
    assert_eq!(
        top,
        ["bin", "dev", "etc", "nix", "proc", "run", "tmp", "usr"]
    );
    // The mounts: the tmpfs, a bind of each source at its own path,
    // the tmpfs read-only, pivot_root.
    let binds: Vec<String> = calls
        .iter()
        .filter(|c| c.name == "mount" && c.args.contains("MS_BIND | MS_REC"))
        .map(|c| c.args.split(' ').nth(1).unwrap().to_owned())
        .collect();
    let want: Vec<String> = plan
        .binds
        .iter()
        .map(|n| {
            at.join(n.path.strip_prefix("/").unwrap())
                .display()
                .to_string()
        })
        .collect();
    assert_eq!(binds, want);
    assert_eq!(calls.last().unwrap().name, "pivot_root");
    assert!(calls[0].args.contains("tmpfs"), "{calls:?}");
}

#[test]
fn a_file_where_the_root_needs_a_directory_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let at = dir.path();
    std::fs::write(at.join("nix"), "").unwrap();
    let (got, calls) = enter_into(at, &a_plan());
    match got {
        Err(SandboxError::Sys(e)) => {
            assert_eq!(
                (e.op, e.path.as_path(), e.errno),
                (
                    "mkdir in the VM's root",
                    at.join("nix").as_path(),
                    Errno::EEXIST
                )
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(!calls.iter().any(|c| c.name == "pivot_root"), "{calls:?}");
}

/// A small deterministic generator (no dependency for one test).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) as usize) % n
    }
}

/// The plan's real path of a rule is the kernel's (`realpath(3)`,
/// `std::fs::canonicalize`) for random trees of directories, files and
/// symlinks (relative, absolute, with `..` and `.`, chains, loops,
/// dangling; paths with `.`, `..` and a trailing `/`: after a file, the
/// kernel's `ENOTDIR`),
/// one memo shared by every path of a tree, as one plan shares it: where
/// the kernel finds no path, neither does the plan.
#[test]
fn the_plan_resolves_each_path_as_the_kernel_does() {
    const NAMES: [&str; 5] = ["a", "b", "c", "d", "e"];
    let mut rng = Lcg(0x5eed);
    let mut compared = (0, 0);
    for _tree in 0..150 {
        let dir = tempfile::tempdir().unwrap();
        let top = dir.path();
        let mut dirs = vec![top.to_path_buf()];
        for _ in 0..12 {
            let parent = dirs[rng.below(dirs.len())].clone();
            let at = parent.join(NAMES[rng.below(NAMES.len())]);
            if std::fs::symlink_metadata(&at).is_ok() {
                continue;
            }
            match rng.below(4) {
                0 | 1 => {
                    std::fs::create_dir(&at).unwrap();
                    dirs.push(at);
                }
                2 => std::fs::write(&at, "").unwrap(),
                _ => {
                    let mut target = PathBuf::new();
                    if rng.below(3) == 0 {
                        target.push(dirs[rng.below(dirs.len())].clone());
                    }
                    for _ in 0..1 + rng.below(3) {
                        target.push(match rng.below(7) {
                            0 | 1 => "..",
                            2 => ".",
                            n => NAMES[n % NAMES.len()],
                        });
                    }
                    std::os::unix::fs::symlink(&target, &at).unwrap();
                }
            }
        }
        let mut host = HostPaths::default();
        for _ in 0..30 {
            let mut path = top.to_path_buf();
            for _ in 0..1 + rng.below(4) {
                path.push(match rng.below(7) {
                    0 => "..",
                    1 => ".",
                    n => NAMES[n % NAMES.len()],
                });
            }
            if rng.below(5) == 0 {
                path.as_mut_os_string().push("/");
            }
            let got = resolve(&path, &mut host, &mut Vec::new());
            let kernel = std::fs::canonicalize(&path).ok();
            assert_eq!(got, kernel, "{} in {:?}", path.display(), tree_of(top));
            compared.0 += 1;
            compared.1 += usize::from(kernel.is_some());
        }
    }
    // Both outcomes were compared often.
    assert!(
        compared.1 > 500 && compared.0 - compared.1 > 500,
        "{compared:?}"
    );
}

/// Every entry under `top`, and a symlink's target, for a failure's message.
fn tree_of(top: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![top.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            let md = std::fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(top).unwrap().display().to_string();
            if md.is_symlink() {
                out.push(format!(
                    "{rel} -> {}",
                    std::fs::read_link(&p).unwrap().display()
                ));
            } else if md.is_dir() {
                out.push(format!("{rel}/"));
                todo.push(p);
            } else {
                out.push(rel);
            }
        }
    }
    out
}

/// A symlink inside a tree the VM may write (a rule granting writing, or
/// one of its own trees, by any name) is the VM's to have planted: a rule
/// that followed one binds nothing (before: its target, a host socket or
/// `/run`, was bound). A rule through a host symlink elsewhere still is.
#[test]
fn a_rule_through_a_symlink_the_vm_may_have_planted_binds_nothing() {
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for sub in ["shared", "own/web", "host/dir", "real"] {
        std::fs::create_dir_all(d.join(sub)).unwrap();
    }
    symlink(d.join("host"), d.join("shared/evil")).unwrap();
    symlink(d.join("host/dir"), d.join("own/web/evil")).unwrap();
    symlink("own", d.join("alias")).unwrap();
    symlink("real", d.join("bin")).unwrap();
    let p = |s: &str| d.join(s).to_string_lossy().into_owned();
    let got = plan(
        &[
            rule(&p("shared"), Grant::Write),
            rule(&p("shared/evil/dir"), Grant::Read),
            rule(&p("alias/web/evil"), Grant::Read),
            rule(&p("bin"), Grant::Exec),
        ],
        &[d.join("own/web")],
        &[],
    );
    let bound: Vec<&Path> = got.binds.iter().map(|n| n.path.as_path()).collect();
    assert_eq!(bound, [d.join("real"), d.join("shared")], "{got:?}");
}

/// A mount point's path that is a symlink already (inside a tree bound
/// before it, one the host changed since the plan) is never followed nor
/// the file it leads to opened: the mount point was made as
/// `File::create` makes one, `O_CREAT|O_TRUNC` through the link, and root
/// emptied whatever file it named.
#[test]
fn a_symlink_where_a_mount_point_goes_is_refused_and_its_target_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let at = dir.path();
    let outside = tempfile::tempdir().unwrap();
    let victim = outside.path().join("victim");
    std::fs::write(&victim, "VMWT-KEEP").unwrap();
    std::fs::create_dir(at.join("etc")).unwrap();
    std::os::unix::fs::symlink(&victim, at.join("etc/hosts.conf")).unwrap();
    let (got, calls) = enter_into(at, &a_plan());
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "VMWT-KEEP");
    match got {
        Err(SandboxError::Sys(e)) => assert_eq!(
            (e.op, e.path.as_path(), e.errno),
            (
                "make a mount point in the VM's root",
                at.join("etc/hosts.conf").as_path(),
                Errno::EEXIST
            )
        ),
        other => panic!("{other:?}"),
    }
    assert!(!calls.iter().any(|c| c.name == "pivot_root"), "{calls:?}");
}

/// How the host may have changed a bound tree between a bind and its
/// flags: what was at the bind's path moved away and, in its place, a
/// symlink to another bind's directory, or that directory itself.
#[derive(Debug, Clone, Copy)]
enum Swap {
    Symlink,
    Rename,
}

/// In a private mount namespace (this forked child's), two binds on the
/// root's tmpfs, `s`'s at `/a/b` and `t`'s at `/c/b`; then `swap`; then
/// `s`'s bind's flags set (read-only) as [`enter`] sets them. 0: the
/// flags went to `s`'s bind, or none was set and the launch failed;
/// 1: they went to `t`'s; 2: neither got them and no error; 3: setting
/// up failed.
fn flags_after_a_swap(at: &Path, s: &Path, t: &Path, swap: Swap) -> i32 {
    use nix::mount::mount;
    use nix::sys::statvfs::{statvfs, FsFlags};
    let setup = || -> std::result::Result<Tree<'_>, Box<dyn std::error::Error>> {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)?;
        let private = MsFlags::MS_REC | MsFlags::MS_PRIVATE;
        mount(None::<&str>, "/", None::<&str>, private, None::<&str>)?;
        mount(
            Some("vmwt-rvs"),
            at,
            Some("tmpfs"),
            MsFlags::empty(),
            None::<&str>,
        )?;
        let mut tree = Tree::open(at)?;
        for (src, dir) in [(s, "/a"), (t, "/c")] {
            tree.dir(Path::new(dir))?;
            let b = Path::new(dir).join("b");
            tree.mount_point(&b, true)?;
            let bind = MsFlags::MS_BIND | MsFlags::MS_REC;
            mount(Some(src), &tree.shown(&b), None::<&str>, bind, None::<&str>)?;
        }
        std::fs::rename(at.join("a"), at.join("a2"))?;
        match swap {
            Swap::Symlink => std::os::unix::fs::symlink("c", at.join("a"))?,
            Swap::Rename => std::fs::rename(at.join("c"), at.join("a"))?,
        }
        Ok(tree)
    };
    let Ok(tree) = setup() else { return 3 };
    let Ok(src) = nix::fcntl::open(s, OFlag::O_PATH | OFlag::O_CLOEXEC, Mode::empty()) else {
        return 3;
    };
    let got = remount(&LinuxSyscall, &tree, Path::new("/a/b"), &src, true, false);
    let ro = |p: &Path| statvfs(p).is_ok_and(|v| v.flags().contains(FsFlags::ST_RDONLY));
    let t_at = at.join(match swap {
        Swap::Symlink => "c/b",
        Swap::Rename => "a/b",
    });
    match (ro(&at.join("a2/b")), ro(&t_at), got.is_ok()) {
        (_, true, _) => 1,
        (true, false, _) | (false, false, false) => 0,
        (false, false, true) => 2,
    }
}

/// A bind's flags are set through a descriptor of that bind: a symlink,
/// or another bind's directory, put at its path since it was bound (the
/// bind's path may go through a host tree bound before it, one another
/// process may change) fails the launch. Named again by path from the
/// host's `/`, the walk followed the change: the other mount was made
/// read-only, `nosuid`, `nodev`, and the bind kept the host's `rw`,
/// set-uid and devices. Needs root (mounts, in a forked child's own
/// mount namespace, gone with it).
#[test]
fn a_binds_flags_go_to_that_bind_whatever_was_put_at_its_path_since() {
    use nix::sys::wait::{waitpid, WaitStatus};
    use nix::unistd::{fork, ForkResult};
    assert!(
        nix::unistd::geteuid().is_root(),
        "needs root: mounts in a mount namespace of its own"
    );
    for swap in [Swap::Symlink, Swap::Rename] {
        let dir = tempfile::tempdir().unwrap();
        let (at, s, t) = (
            dir.path().join("root"),
            dir.path().join("s"),
            dir.path().join("t"),
        );
        for d in [&at, &s, &t] {
            std::fs::create_dir(d).unwrap();
        }
        // SAFETY: the child makes system calls and `_exit`s, never
        // returning into the test harness.
        match unsafe { fork() }.unwrap() {
            ForkResult::Child => {
                let code = std::panic::catch_unwind(|| flags_after_a_swap(&at, &s, &t, swap));
                // SAFETY: ends the child without running the harness's
                // exit handlers.
                unsafe { libc::_exit(code.unwrap_or(4)) }
            }
            ForkResult::Parent { child } => match waitpid(child, None).unwrap() {
                WaitStatus::Exited(_, 0) => {}
                WaitStatus::Exited(_, 1) => panic!(
                    "{swap:?}: the bind's flags went to the mount the changed path led to, \
                     the bind kept the host's"
                ),
                other => panic!("{swap:?}: {other:?} (2: no flags and no error; 3: setup)"),
            },
        }
    }
}

/// A symlink anyone but root could have made or swapped (not root's, or
/// in a directory that is not root's or that group or others may write,
/// sticky aside) is never followed, whether or not this VM's rules grant
/// writing there: another VM's writable share holding a socket this VM is
/// granted, or the VM's own tree named by a host bind mount's other name
/// (no symlink on the way, so not seen as its tree), is a place a
/// compromised principal plants a link to a host socket; the rule that
/// followed it bound that socket into this VM's root. Root's links in
/// root's directories are followed as before (`bin` below).
#[test]
fn a_rule_through_a_symlink_only_root_could_not_have_made_binds_nothing() {
    use std::os::unix::fs::{lchown, symlink, PermissionsExt};
    let other = 5_400_001;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for sub in ["share", "loose", "real"] {
        std::fs::create_dir(d.join(sub)).unwrap();
    }
    let _host = std::os::unix::net::UnixListener::bind(d.join("host.sock")).unwrap();
    // Another principal's share, a link of theirs; root's link in their
    // directory; root's link in a directory others may write.
    std::os::unix::fs::chown(d.join("share"), Some(other), Some(other)).unwrap();
    symlink(d.join("host.sock"), d.join("share/theirs")).unwrap();
    lchown(d.join("share/theirs"), Some(other), Some(other)).unwrap();
    symlink(d.join("host.sock"), d.join("share/roots")).unwrap();
    std::fs::set_permissions(d.join("loose"), PermissionsExt::from_mode(0o777)).unwrap();
    symlink(d.join("host.sock"), d.join("loose/roots")).unwrap();
    symlink("real", d.join("bin")).unwrap();
    let p = |s: &str| d.join(s).to_string_lossy().into_owned();
    for planted in ["share/theirs", "share/roots", "loose/roots"] {
        let got = plan(
            &[
                rule(&p(planted), Grant::Socket),
                rule(&p("bin"), Grant::Exec),
            ],
            &[],
            &[],
        );
        let bound: Vec<&Path> = got.binds.iter().map(|n| n.path.as_path()).collect();
        assert_eq!(bound, [d.join("real")], "{planted}: {got:?}");
    }
}

/// Where openat2 answers ENOSYS or EPERM (the systemd suite's unit), a
/// bind is opened by a walk that follows nothing: the same file as
/// openat2's, and a symlink on the way or at the end, or a name that
/// climbs out, is never what it opens.
#[test]
fn the_walk_without_openat2_opens_what_openat2_does_and_follows_nothing() {
    use std::os::unix::fs::MetadataExt;
    let d = tempfile::tempdir().expect("tempdir");
    let at = d.path();
    std::fs::create_dir_all(at.join("usr/lib")).expect("mkdir");
    std::fs::write(at.join("usr/lib/file"), b"x").expect("write");
    std::os::unix::fs::symlink("usr", at.join("lnk")).expect("symlink");
    std::os::unix::fs::symlink("file", at.join("usr/lib/last")).expect("symlink");
    let tree = Tree::open(at).expect("open the tree");
    let ino = |fd: &OwnedFd| nix::sys::stat::fstat(fd).map(|s| (s.st_dev, s.st_ino));
    let walked = tree
        .walk_unfollowed(Path::new("usr/lib/file"))
        .expect("walk to usr/lib/file");
    let opened = tree
        .open_mounted(Path::new("/usr/lib/file"))
        .expect("openat2 to usr/lib/file");
    assert_eq!(ino(&walked), ino(&opened));
    let md = std::fs::metadata(at.join("usr/lib/file")).expect("stat");
    assert_eq!(ino(&walked), Ok((md.dev(), md.ino())));
    assert!(
        tree.walk_unfollowed(Path::new("lnk/lib/file")).is_err(),
        "the walk went through the symlink lnk"
    );
    let last = tree
        .walk_unfollowed(Path::new("usr/lib/last"))
        .expect("a symlink at the end is opened itself");
    assert_ne!(
        ino(&last),
        ino(&walked),
        "the walk followed the symlink at the end"
    );
    assert!(
        tree.walk_unfollowed(Path::new("usr/../usr/lib/file"))
            .is_err(),
        "the walk took a .. component"
    );
}
