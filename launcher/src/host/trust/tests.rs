//! Unit tests of `host/trust.rs`.

use super::*;
use std::os::unix::fs::{symlink, PermissionsExt};

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A private tree standing for `/`, trusted as the test's own uid (so
/// these tests need no root; the root suites walk the real `/`).
struct Tree {
    t: tempfile::TempDir,
    me: u32,
}

impl Tree {
    fn new() -> Tree {
        let t = tempfile::tempdir().unwrap();
        chmod(t.path(), 0o755);
        Tree {
            t,
            me: nix::unistd::geteuid().as_raw(),
        }
    }
    fn p(&self, rel: &str) -> PathBuf {
        self.t.path().join(rel)
    }
    fn walk(&self, rel: &str, policy: Policy) -> Result<Walked, Distrust> {
        self.walk_as(rel, policy, self.me)
    }
    fn walk_as(&self, rel: &str, policy: Policy, owner: u32) -> Result<Walked, Distrust> {
        Walker::with_top(self.t.path(), owner)
            .walk_in(Path::new(rel), policy, End::Any)
            .and_then(require_regular)
    }
}

#[test]
fn owner_only_chains_pass_and_loose_ones_name_the_culprit() {
    let t = Tree::new();
    std::fs::write(t.p("ok"), b"x").unwrap();
    chmod(&t.p("ok"), 0o644);
    t.walk("/ok", Policy::Secret).unwrap();
    // Anyone else's file (here: the tree is not owned by the trusted uid).
    assert!(matches!(
        t.walk_as("/ok", Policy::Executable, t.me + 1),
        Err(Distrust::NotRootOwned { .. })
    ));
    // A group-writable file.
    std::fs::write(t.p("gw"), b"x").unwrap();
    chmod(&t.p("gw"), 0o664);
    assert!(matches!(
        t.walk("/gw", Policy::Executable),
        Err(Distrust::Writable {
            who: "its group",
            ..
        })
    ));
    // A world-writable sticky dir (like /tmp): refused under both.
    std::fs::create_dir(t.p("tmp")).unwrap();
    chmod(&t.p("tmp"), 0o1777);
    std::fs::write(t.p("tmp/f"), b"x").unwrap();
    chmod(&t.p("tmp/f"), 0o600);
    for pol in [Policy::Secret, Policy::Executable] {
        assert!(matches!(
            t.walk("/tmp/f", pol),
            Err(Distrust::Writable { who, .. }) if who.contains("everyone")
        ));
    }
    // A group-writable sticky dir (like the Nix store): executables only.
    std::fs::create_dir(t.p("store")).unwrap();
    chmod(&t.p("store"), 0o1775);
    std::fs::write(t.p("store/qemu"), b"x").unwrap();
    chmod(&t.p("store/qemu"), 0o555);
    t.walk("/store/qemu", Policy::Executable).unwrap();
    assert!(matches!(
        t.walk("/store/qemu", Policy::Secret),
        Err(Distrust::Writable {
            who: "its group",
            ..
        })
    ));
    // ... and not without the sticky bit.
    chmod(&t.p("store"), 0o775);
    t.walk("/store/qemu", Policy::Executable).unwrap_err();
    // Not a regular file.
    nix::unistd::mkfifo(&t.p("fifo"), Mode::from_bits_truncate(0o600)).unwrap();
    assert!(matches!(
        t.walk("/fifo", Policy::Secret),
        Err(Distrust::WrongKind {
            kind: Kind::Fifo,
            ..
        })
    ));
}

#[test]
fn a_shared_walker_checks_every_walk_against_its_own_policy() {
    let t = Tree::new();
    std::fs::create_dir_all(t.p("store/pkg")).unwrap();
    chmod(&t.p("store"), 0o1775);
    std::fs::write(t.p("store/pkg/qemu"), b"x").unwrap();
    chmod(&t.p("store/pkg/qemu"), 0o555);
    std::fs::write(t.p("store/pkg/key"), b"x").unwrap();
    chmod(&t.p("store/pkg/key"), 0o600);
    std::fs::create_dir(t.p("etc")).unwrap();
    symlink("/store/pkg/key", t.p("etc/key")).unwrap();
    let mut w = Walker::with_top(t.t.path(), t.me);
    let walk = |w: &mut Walker, rel: &str, pol| {
        w.walk_in(Path::new(rel), pol, End::Any)
            .and_then(require_regular)
    };
    walk(&mut w, "/store/pkg/qemu", Policy::Executable).unwrap();
    // The same (kept) group-writable sticky directory, now for a secret.
    assert!(matches!(
        walk(&mut w, "/store/pkg/key", Policy::Secret),
        Err(Distrust::Writable {
            who: "its group",
            ..
        })
    ));
    // A kept symlink is followed for executables only.
    let got = walk(&mut w, "/etc/key/../key", Policy::Executable);
    assert!(
        matches!(
            got,
            Err(Distrust::Sys {
                errno: Errno::ENOTDIR,
                ..
            })
        ),
        "{got:?}"
    );
    walk(&mut w, "/etc/key", Policy::Executable).unwrap();
    assert!(matches!(
        walk(&mut w, "/etc/key", Policy::Secret),
        Err(Distrust::Symlink { .. })
    ));
    // What a fresh walk refuses, a kept way refuses too: the final
    // entry is stat'ed anew.
    chmod(&t.p("store/pkg/qemu"), 0o777);
    assert!(matches!(
        walk(&mut w, "/store/pkg/qemu", Policy::Executable),
        Err(Distrust::Writable { .. })
    ));
}

/// An ACL's bytes as the kernel hands them out.
fn acl_bytes(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut b = ACL_XATTR_VERSION.to_le_bytes().to_vec();
    for (tag, perm, id) in entries {
        b.extend_from_slice(&tag.to_le_bytes());
        b.extend_from_slice(&perm.to_le_bytes());
        b.extend_from_slice(&id.to_le_bytes());
    }
    b
}

#[test]
fn an_acls_writers_are_its_named_entries_through_the_mask() {
    const USER_OBJ: u16 = 0x01;
    const OTHER: u16 = 0x20;
    let (rwx, rx) = (7, 5);
    // u::rwx, u:61009:rwx, g::r-x, g:61010:rwx, m::rwx, o::r-x
    let full = acl_bytes(&[
        (USER_OBJ, rwx, u32::MAX),
        (ACL_USER, rwx, 61009),
        (ACL_GROUP_OBJ, rx, u32::MAX),
        (ACL_GROUP, rwx, 61010),
        (ACL_MASK, rwx, u32::MAX),
        (OTHER, rx, u32::MAX),
    ]);
    let acl = Acl::parse(&full).unwrap();
    assert_eq!(acl.users, [61009]);
    assert_eq!(acl.groups, [61010]);
    assert_eq!(acl.owning_group, Some(false));
    // The mode's group bits are the mask (rwx): the owning group's own
    // entry (r-x) is what counts.
    assert!(!acl.owning_group_writes(0o775));
    let p = Path::new("/srv/share");
    assert!(matches!(
        acl.check(p, Policy::Executable, 0),
        Err(Distrust::AclWritable {
            who: AclWriter::User(61009),
            ..
        })
    ));
    // The principal's own uid and gid are trusted under its policy.
    acl.check(
        p,
        Policy::Principal {
            uid: 61009,
            gid: 61010,
        },
        0,
    )
    .unwrap();
    assert!(matches!(
        acl.check(p, Policy::Principal { uid: 61009, gid: 1 }, 0),
        Err(Distrust::AclWritable {
            who: AclWriter::Group(61010),
            ..
        })
    ));
    // A mask without write takes it from every named entry.
    let masked = acl_bytes(&[
        (USER_OBJ, rwx, u32::MAX),
        (ACL_USER, rwx, 61009),
        (ACL_GROUP_OBJ, rwx, u32::MAX),
        (ACL_MASK, rx, u32::MAX),
        (OTHER, 0, u32::MAX),
    ]);
    let acl = Acl::parse(&masked).unwrap();
    assert!(acl.users.is_empty() && acl.owning_group == Some(false));
    acl.check(p, Policy::Secret, 0).unwrap();
    // A minimal ACL (no mask) is the mode bits alone; garbage is none.
    let minimal = acl_bytes(&[(USER_OBJ, rwx, u32::MAX), (ACL_GROUP_OBJ, rwx, u32::MAX)]);
    assert_eq!(Acl::parse(&minimal), Some(Acl::default()));
    assert_eq!(Acl::parse(&[1, 0, 0, 0]), None);
    assert_eq!(Acl::parse(&full[..9]), None);
}

#[test]
fn the_principal_policy_trusts_the_principal_and_nobody_else() {
    let t = Tree::new();
    // Here the test's own uid stands for the principal and a uid that
    // owns nothing for root.
    let nobody = t.me + 1;
    let gid = nix::unistd::getegid().as_raw();
    let pol = Policy::Principal { uid: t.me, gid };
    std::fs::create_dir(t.p("vm")).unwrap();
    chmod(&t.p("vm"), 0o700);
    std::fs::write(t.p("vm/disk.img"), b"x").unwrap();
    chmod(&t.p("vm/disk.img"), 0o600);
    t.walk_as("/vm/disk.img", pol, nobody).unwrap();
    // The principal's group may write; everyone may not, sticky or not.
    chmod(&t.p("vm"), 0o770);
    t.walk_as("/vm/disk.img", pol, nobody).unwrap();
    chmod(&t.p("vm"), 0o1777);
    assert!(matches!(
        t.walk_as("/vm/disk.img", pol, nobody),
        Err(Distrust::Writable { who, .. }) if who.contains("everyone")
    ));
    chmod(&t.p("vm"), 0o700);
    chmod(&t.p("vm/disk.img"), 0o606);
    assert!(matches!(
        t.walk_as("/vm/disk.img", pol, nobody),
        Err(Distrust::Writable {
            who: "everyone",
            ..
        })
    ));
    // Another principal's policy: the entries are nobody's it trusts.
    chmod(&t.p("vm/disk.img"), 0o600);
    assert!(matches!(
        t.walk_as(
            "/vm/disk.img",
            Policy::Principal { uid: nobody, gid },
            nobody + 1
        ),
        Err(Distrust::NotOwnersOwn { .. })
    ));
}

#[test]
fn symlinks_are_followed_and_every_directory_they_cross_is_checked() {
    let t = Tree::new();
    std::fs::create_dir_all(t.p("store/pkg/bin")).unwrap();
    std::fs::write(t.p("store/pkg/bin/qemu"), b"x").unwrap();
    chmod(&t.p("store/pkg/bin/qemu"), 0o555);
    std::fs::create_dir_all(t.p("sw/bin")).unwrap();
    symlink("../../store/pkg/bin/qemu", t.p("sw/bin/qemu")).unwrap();
    // An absolute target restarts at the top.
    symlink("/sw", t.p("current")).unwrap();
    let w = t.walk("/current/bin/qemu", Policy::Executable).unwrap();
    assert_eq!(w.resolved, Path::new("/store/pkg/bin/qemu"));
    // Secrets never go through a link.
    assert!(matches!(
        t.walk("/current/bin/qemu", Policy::Secret),
        Err(Distrust::Symlink { .. })
    ));
    // A directory the link leads through that others can write.
    chmod(&t.p("store/pkg"), 0o777);
    assert!(matches!(
        t.walk("/current/bin/qemu", Policy::Executable),
        Err(Distrust::Writable { .. })
    ));
    chmod(&t.p("store/pkg"), 0o755);
    // A link loop ends.
    symlink("loop-b", t.p("loop-a")).unwrap();
    symlink("loop-a", t.p("loop-b")).unwrap();
    assert!(matches!(
        t.walk("/loop-a", Policy::Executable),
        Err(Distrust::TooManyLinks { .. })
    ));
}

/// `walk_store` from the tree's top, trusting `owner`.
fn walk_store_in(t: &Tree, rel: &str, policy: Policy) -> Result<Walked, Distrust> {
    Walker::with_top(t.t.path(), t.me).walk_in(Path::new(rel), policy, End::StickyStore)
}

#[test]
fn only_a_store_walk_may_end_at_the_sticky_store_and_only_as_nix_makes_it() {
    let t = Tree::new();
    // The test's uid stands for root; the principal and its group own
    // nothing here, so the store's group is somebody else's (nixbld's).
    let egid = nix::unistd::getegid().as_raw();
    let pol = Policy::Principal {
        uid: t.me + 1,
        gid: egid + 1,
    };
    std::fs::create_dir_all(t.p("nix/store")).unwrap();
    chmod(&t.p("nix/store"), 0o1775);
    // A plain walk refuses it at its end, naming its group...
    assert!(matches!(
        Walker::with_top(t.t.path(), t.me).walk_in(Path::new("/nix/store"), pol, End::Any),
        Err(Distrust::Writable {
            who: "its group",
            mode: 0o1775,
            ..
        })
    ));
    // ... a store walk takes it, root's, sticky, its group writing.
    let w = walk_store_in(&t, "/nix/store", pol).unwrap();
    assert_eq!(w.resolved, Path::new("/nix/store"));
    assert_eq!(w.stat.st_mode & 0o7777, 0o1775);
    // Everyone writing it: never, sticky or not.
    chmod(&t.p("nix/store"), 0o1777);
    assert!(matches!(
        walk_store_in(&t, "/nix/store", pol),
        Err(Distrust::Writable { who, .. }) if who.contains("everyone")
    ));
    // Without the sticky bit its group could rename and delete root's
    // paths: refused.
    chmod(&t.p("nix/store"), 0o775);
    assert!(matches!(
        walk_store_in(&t, "/nix/store", pol),
        Err(Distrust::Writable {
            who: "its group",
            ..
        })
    ));
    // Not root's: a sticky directory of the principal's own (the tree is
    // the principal's, root owns nothing) is no store.
    chmod(&t.p("nix/store"), 0o1775);
    assert!(matches!(
        Walker::with_top(t.t.path(), t.me + 7).walk_in(
            Path::new("/nix/store"),
            Policy::Principal {
                uid: t.me,
                gid: egid + 1
            },
            End::StickyStore
        ),
        Err(Distrust::Writable {
            who: "its group",
            ..
        })
    ));
    // The way above it is checked as in every walk.
    chmod(&t.p("nix"), 0o775);
    assert!(matches!(
        walk_store_in(&t, "/nix/store", pol),
        Err(Distrust::Writable { path, .. }) if path.ends_with("nix")
    ));
    chmod(&t.p("nix"), 0o755);
    walk_store_in(&t, "/nix/store", pol).unwrap();
    // Under another policy the exception does not exist.
    assert!(matches!(
        walk_store_in(&t, "/nix/store", Policy::Secret),
        Err(Distrust::Writable { .. })
    ));
}

#[test]
fn a_share_the_guest_owns_may_be_the_vms_own_ids_and_nobody_elses() {
    let t = Tree::new();
    // The test's uid stands for root; the principal and the range are ids
    // that own nothing here but the share (chown needs root: the share
    // keeps the test's uid and the range is made to contain it).
    let me = t.me;
    let egid = nix::unistd::getegid().as_raw();
    let pol = Policy::Principal {
        uid: me + 1,
        gid: egid + 1,
    };
    std::fs::create_dir_all(t.p("vm/share")).unwrap();
    chmod(&t.p("vm/share"), 0o2770);
    let owned = |ids: std::ops::Range<u32>| {
        Walker::with_top(t.t.path(), me + 7).walk_in(Path::new("/vm/share"), pol, End::Owned(ids))
    };
    // Above the share only root and the principal: here the tree is the
    // test's, which is neither, so the top itself is refused...
    assert!(matches!(
        owned(me..me + 1),
        Err(Distrust::NotOwnersOwn { .. })
    ));
    // ... while with the test's uid as root, a share of an id in the
    // range, its group in the range and writing, is the VM's own.
    let w = Walker::with_top(t.t.path(), me).walk_in(
        Path::new("/vm/share"),
        Policy::Principal {
            uid: me + 1,
            gid: egid + 1,
        },
        End::Owned(egid..egid + 1),
    );
    w.unwrap();
    // Its group outside the range and writing: refused, as anywhere.
    assert!(matches!(
        Walker::with_top(t.t.path(), me).walk_in(
            Path::new("/vm/share"),
            pol,
            End::Owned(egid + 10..egid + 11)
        ),
        Err(Distrust::Writable {
            who: "its group",
            ..
        })
    ));
    // Everyone writing: never.
    chmod(&t.p("vm/share"), 0o777);
    assert!(matches!(
        Walker::with_top(t.t.path(), me).walk_in(Path::new("/vm/share"), pol, End::Owned(egid..egid + 1)),
        Err(Distrust::Writable { who, .. }) if who.contains("everyone")
    ));
    // A plain walk does not take the range's group.
    chmod(&t.p("vm/share"), 0o770);
    assert!(matches!(
        Walker::with_top(t.t.path(), me).walk_in(Path::new("/vm/share"), pol, End::Any),
        Err(Distrust::Writable {
            who: "its group",
            ..
        })
    ));
}
