//! The VM's principal: who the hypervisor runs as.
//!
//! A principal is a uid/gid pair that belongs to exactly one VM, is never
//! root, is not in a privileged group and gets `/dev/kvm` only through the
//! device's own group.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;

use crate::config::names::VmName;
use crate::config::paths::Roots;
use crate::config::rules;
use crate::config::spec::{Accel, Spec};
use crate::identity::accounts::{self, reserved_ids, Accounts};

/// Groups whose members can read raw disks, logs or shadow, administer the
/// host or become root. A VM principal in any of them is refused. The list
/// is `[groups] privileged` in `units/rules.toml`, shared with the NixOS
/// module.
pub const PRIVILEGED_GROUPS: &[&str] = rules::PRIVILEGED_GROUPS;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub uid: u32,
    pub gid: u32,
    /// The user name when the principal was given by name (or has one in NSS).
    pub user: Option<String>,
    /// Supplementary groups the hypervisor gets (only the `/dev/kvm` group).
    pub groups: Vec<u32>,
}

impl Principal {
    pub fn display(&self) -> String {
        match &self.user {
            Some(u) => format!("{u} ({}:{})", self.uid, self.gid),
            None => format!("{}:{}", self.uid, self.gid),
        }
    }
}

/// A principal refused, or one that cannot be resolved: always `EX_CONFIG`.
#[derive(Debug, thiserror::Error)]
#[error("principal {principal}: {problem}")]
pub struct PrincipalError {
    /// The principal as the spec or the registry names it.
    pub principal: String,
    #[source]
    pub problem: Box<Problem>,
}

/// What is wrong with a principal.
#[derive(Debug, thiserror::Error)]
pub enum Problem {
    /// NSS failed to answer for a user or group (`kind` says which).
    #[error("looking up {kind} {name:?}: {errno}")]
    Lookup {
        kind: &'static str,
        name: String,
        #[source]
        errno: Errno,
    },
    #[error("field `principal.user`: user {0:?} does not exist")]
    NoSuchUser(String),
    #[error("field `principal.group`: group {0:?} does not exist")]
    NoSuchGroup(String),
    /// `needs` names the missing alternatives (`` `user` or `uid` ``).
    #[error("field `principal`: needs {needs}")]
    Incomplete { needs: &'static str },
    #[error("field `principal`: resolves to uid 0; a VM never runs as root")]
    RootUid,
    #[error("field `principal`: resolves to gid 0; a VM never runs with the root group")]
    RootGid,
    /// 65534 (nobody/nogroup, the kernel's overflow id), 65535 or 2^32-1.
    #[error("field `principal`: {kind} {id} is the overflow/nobody id (or -1): it stands for every unmapped id and is shared by whatever runs as nobody, so it cannot be dedicated to one VM")]
    Overflow { kind: &'static str, id: u32 },
    #[error("field `principal`: uid {uid} is shared by the accounts {names:?} in {passwd}; a VM's principal must be a uid no other account has")]
    SharedAccount {
        uid: u32,
        names: Vec<String>,
        passwd: &'static str,
    },
    #[error("field `principal`: account {name:?} (uid {uid}) has the login shell {shell:?}; a VM's principal must not be an account anyone logs in as (give it nologin)")]
    LoginShell {
        name: String,
        uid: u32,
        shell: String,
    },
    #[error("is a member of group 0 (root); refused")]
    RootGroupMember,
    #[error(
        "is a member of the privileged group {name:?} (gid {gid}); a VM principal must not be"
    )]
    PrivilegedGroup { name: String, gid: u32 },
    #[error("uid {uid} is also the principal of VM {vm:?} ({}); every VM needs its own principal", .spec.display())]
    Shared { uid: u32, vm: String, spec: PathBuf },
    /// The uid was another VM's and that VM left residue (see the registry).
    #[error("uid {uid} {was} VM {vm:?} (generation {generation}) and that VM's residue still exists: {}; remove it with `vmwarden purge {vm}` or give VM {name:?} its own uid", .residue.join(", "))]
    Residue {
        uid: u32,
        /// "was retired with" or "belongs to".
        was: &'static str,
        vm: String,
        generation: u64,
        residue: Vec<String>,
        /// The VM being launched.
        name: String,
    },
}

fn perr(who: &str, problem: Problem) -> PrincipalError {
    PrincipalError {
        principal: who.to_string(),
        problem: Box::new(problem),
    }
}

type Result<T, E = PrincipalError> = std::result::Result<T, E>;

/// Resolve the uid/gid a spec names, without policy checks: names from
/// `/etc/passwd` and `/etc/group` first, NSS only for a name the files lack;
/// numeric ids need no lookup at all.
pub fn resolve_ids(spec: &Spec) -> Result<(u32, u32, Option<String>)> {
    resolve_ids_with(spec, &Accounts::load())
}

fn lookup(who: &str, kind: &'static str, name: &str) -> impl FnOnce(Errno) -> PrincipalError {
    let (who, name) = (who.to_string(), name.to_string());
    move |errno| perr(&who, Problem::Lookup { kind, name, errno })
}

pub fn resolve_ids_with(spec: &Spec, acc: &Accounts) -> Result<(u32, u32, Option<String>)> {
    let who = spec.principal_display();
    let p = &spec.principal;
    let (uid, user) = match (&p.user, p.uid) {
        (Some(name), _) => {
            let u = acc
                .user_by_name(name)
                .map_err(lookup(&who, "user", name))?
                .ok_or_else(|| perr(&who, Problem::NoSuchUser(name.clone())))?;
            (u.uid, Some(name.clone()))
        }
        (None, Some(uid)) => {
            // The name, when exactly one /etc/passwd entry has this uid
            // (for messages and the login-shell check); never NSS.
            let entries = acc.users_with_uid(uid);
            let name = match entries.as_slice() {
                [one] => Some(one.name.clone()),
                _ => None,
            };
            (uid, name)
        }
        (None, None) => {
            return Err(perr(
                &who,
                Problem::Incomplete {
                    needs: "`user` or `uid`",
                },
            ))
        }
    };
    let gid = match (&p.group, p.gid) {
        (Some(name), _) => acc
            .gid_by_name(name)
            .map_err(lookup(&who, "group", name))?
            .ok_or_else(|| perr(&who, Problem::NoSuchGroup(name.clone())))?,
        (None, Some(gid)) => gid,
        (None, None) => {
            return Err(perr(
                &who,
                Problem::Incomplete {
                    needs: "`group` or `gid`",
                },
            ))
        }
    };
    Ok((uid, gid, user))
}

/// Only the uid a spec names: no lookup at all when the spec gives it as a
/// number (liveness, reap and status ask this for every VM; resolving reads
/// /etc/passwd and /etc/group).
pub fn uid_of(spec: &Spec) -> Result<u32> {
    match (&spec.principal.user, spec.principal.uid) {
        (None, Some(uid)) => Ok(uid),
        _ => resolve_ids(spec).map(|(u, _, _)| u),
    }
}

/// [`uid_of`] against accounts the caller has already read (a scan of
/// every configured spec reads /etc/passwd and /etc/group once, not once
/// per spec).
pub fn uid_of_with(spec: &Spec, acc: &Accounts) -> Result<u32> {
    match (&spec.principal.user, spec.principal.uid) {
        (None, Some(uid)) => Ok(uid),
        _ => resolve_ids_with(spec, acc).map(|(u, _, _)| u),
    }
}

/// Where the kernel's overflow ids are configured.
const OVERFLOW_UID: &str = "/proc/sys/kernel/overflowuid";
const OVERFLOW_GID: &str = "/proc/sys/kernel/overflowgid";

/// Resolve and check the principal of `spec`. It must belong to this VM
/// alone and be usable by nothing else:
///
/// * uid/gid ≠ 0, and not an id that names no one in particular: 65534
///   (`nobody`/`nogroup`, the kernel's overflow id, which also stands for
///   every unmapped id), 65535 or 2^32-1;
/// * no other `/etc/passwd` entry with the same uid;
/// * no login shell (the account's shell is `nologin` or `false`);
/// * not a member of a privileged group;
/// * not the principal of another configured VM.
///
/// A uid that owns processes at launch is refused when the lease is taken
/// (`liveness::probe_with_lease_held`). `/dev/kvm`'s group is added when the
/// device is group-owned and group read-write.
pub fn resolve(spec: &Spec, roots: &Roots) -> Result<Principal> {
    let who = spec.principal_display();
    let acc = Accounts::load();
    let (uid, gid, user) = resolve_ids_with(spec, &acc)?;
    if uid == 0 {
        return Err(perr(&who, Problem::RootUid));
    }
    if gid == 0 {
        return Err(perr(&who, Problem::RootGid));
    }
    if reserved_ids(OVERFLOW_UID).contains(&uid) {
        return Err(perr(
            &who,
            Problem::Overflow {
                kind: "uid",
                id: uid,
            },
        ));
    }
    if reserved_ids(OVERFLOW_GID).contains(&gid) {
        return Err(perr(
            &who,
            Problem::Overflow {
                kind: "gid",
                id: gid,
            },
        ));
    }
    let same_uid = acc.users_with_uid(uid);
    if same_uid.len() > 1 {
        let names = same_uid.iter().map(|u| u.name.clone()).collect();
        return Err(perr(
            &who,
            Problem::SharedAccount {
                uid,
                names,
                passwd: accounts::PASSWD,
            },
        ));
    }
    // The account behind the uid: the named user, else the one
    // /etc/passwd entry with this uid.
    let account = match &user {
        Some(name) => acc.user_by_name(name).map_err(lookup(&who, "user", name))?,
        None => None,
    };
    if let Some(a) = &account {
        if !accounts::is_no_login_shell(&a.shell) {
            return Err(perr(
                &who,
                Problem::LoginShell {
                    name: a.name.clone(),
                    uid,
                    shell: a.shell.clone(),
                },
            ));
        }
    }
    // Primary and supplementary groups must not be privileged.
    let mut member_of = vec![gid];
    if let Some(a) = &account {
        member_of.push(a.gid);
        member_of.extend(acc.supplementary_gids(a));
    }
    member_of.sort_unstable();
    member_of.dedup();
    for g in &member_of {
        if *g == 0 {
            return Err(perr(&who, Problem::RootGroupMember));
        }
        if let Some(name) = acc.group_name(*g) {
            if PRIVILEGED_GROUPS.contains(&name) {
                let name = name.to_string();
                return Err(perr(&who, Problem::PrivilegedGroup { name, gid: *g }));
            }
        }
    }
    // Shared with another VM's principal?
    if let Some((vm, spec)) = uid_owner_elsewhere(roots, &spec.name, uid, &acc) {
        let vm = vm.to_string();
        return Err(perr(&who, Problem::Shared { uid, vm, spec }));
    }
    let mut groups = Vec::new();
    if spec.hypervisor.accel == Accel::Kvm {
        if let Some(g) = kvm_device_group(Path::new("/dev/kvm")) {
            groups.push(g);
        }
    }
    Ok(Principal {
        uid,
        gid,
        user,
        groups,
    })
}

/// `Some(gid)` when `/dev/kvm` is owned by a non-root group with group
/// read-write: the only way a principal gets KVM access from vmwarden.
pub fn kvm_device_group(dev: &Path) -> Option<u32> {
    let md = std::fs::metadata(dev).ok()?;
    (md.gid() != 0 && md.mode() & 0o060 == 0o060).then_some(md.gid())
}

/// Another VM in the config dir whose principal resolves to `uid`.
/// Specs that cannot be read are skipped (they are not this VM's to judge).
/// `name`'s own spec is not read again (the launch has read it), nor are
/// the accounts: `acc` resolves every other spec's user and group.
pub fn uid_owner_elsewhere(
    roots: &Roots,
    name: &VmName,
    uid: u32,
    acc: &Accounts,
) -> Option<(VmName, PathBuf)> {
    for (other, path, spec) in configured_specs_except(roots, Some(name)) {
        let Some(spec) = spec else { continue };
        if let Ok(ouid) = uid_of_with(&spec, acc) {
            if ouid == uid {
                return Some((other, path));
            }
        }
    }
    None
}

/// Every `NAME.json` in the config dir with a valid VM name, parsed when
/// possible (`None` when the spec cannot be read or parsed).
pub fn configured_specs(roots: &Roots) -> Vec<(VmName, PathBuf, Option<Spec>)> {
    configured_specs_except(roots, None)
}

/// [`configured_specs`] without VM `except`, whose spec is not even read:
/// a launch compares its VM, whose spec it has already read and validated,
/// with the others.
pub fn configured_specs_except(
    roots: &Roots,
    except: Option<&VmName>,
) -> Vec<(VmName, PathBuf, Option<Spec>)> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(&roots.config_dir) else {
        return out;
    };
    for e in rd.flatten() {
        let fname = e.file_name();
        let Some(fname) = fname.to_str() else {
            continue;
        };
        let Some(name) = fname
            .strip_suffix(".json")
            .and_then(|stem| VmName::parse(stem).ok())
        else {
            continue;
        };
        if except == Some(&name) {
            continue;
        }
        let path = e.path();
        let spec = Spec::read(&path).ok();
        out.push((name, path, spec));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn write_spec(dir: &Path, name: &str, principal: serde_json::Value) {
        let v = json!({
            "version": 1, "name": name, "principal": principal,
            "hypervisor": { "kind": "qemu", "binary": "/usr/bin/hv" },
            "vcpus": 1, "memory_mib": 256, "kernel": "/boot/vmlinuz"
        });
        std::fs::write(
            dir.join(format!("{name}.json")),
            serde_json::to_vec(&v).unwrap(),
        )
        .unwrap();
    }

    /// Another VM's principal named by user and group resolves through the
    /// accounts the launch read once (these, not the host's files); the
    /// VM's own spec is never compared with itself.
    #[test]
    fn another_vms_principal_by_name_is_found_in_the_accounts_given() {
        let d = tempfile::tempdir().unwrap();
        let roots = Roots {
            config_dir: d.path().to_path_buf(),
            runtime_root: d.path().join("run"),
            state_root: d.path().join("state"),
        };
        write_spec(
            d.path(),
            "db",
            json!({ "user": "vmw-test-db", "group": "vmw-test-db" }),
        );
        write_spec(d.path(), "web", json!({ "uid": 61001, "gid": 61001 }));
        let acc = Accounts::from_text(
            "vmw-test-db:x:61001:61001::/nonexistent:/usr/sbin/nologin\n",
            "vmw-test-db:x:61001:\n",
        );
        let web = VmName::parse("web").unwrap();
        let (vm, path) =
            uid_owner_elsewhere(&roots, &web, 61001, &acc).expect("db's principal is uid 61001");
        assert_eq!((vm.as_str(), path), ("db", d.path().join("db.json")));
        assert!(uid_owner_elsewhere(&roots, &web, 61002, &acc).is_none());
        // Without the account, db's user does not resolve: not counted.
        let none = Accounts::from_text("", "");
        assert!(uid_owner_elsewhere(&roots, &web, 61001, &none).is_none());
        let db = VmName::parse("db").unwrap();
        let (vm, _) = uid_owner_elsewhere(&roots, &db, 61001, &acc).expect("web's uid is 61001");
        assert_eq!(vm.as_str(), "web");
    }
}
