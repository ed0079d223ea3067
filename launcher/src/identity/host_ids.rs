//! Every id some other party holds on this host, gathered once per
//! launch that uses a VM's own id range (`identity::ranges`): accounts of
//! `/etc/passwd` and `/etc/group` and every user and group NSS enumerates,
//! the subordinate ranges of `/etc/subuid` and `/etc/subgid`, and the
//! configured VMs' principals; with a `/proc` scan, what
//! [`HostIds::taken`] asks about a range.

use crate::config::names::VmName;
use crate::config::paths::Roots;
use crate::host::procs::Scan;
use crate::identity::accounts::Accounts;
use crate::identity::principal::{self, Principal};

/// At most this many NSS entries (users, then groups) are enumerated per
/// launch; more refuses every range (an incomplete enumeration proves
/// nothing).
pub const MAX_NSS_ENTRIES: usize = 1 << 20;

/// Every id some other party holds on this host, gathered once per launch.
#[derive(Debug, Default)]
pub struct HostIds {
    /// `(what, id)`: "user NAME" or "group NAME", from the files and NSS.
    pub accounts: Vec<(String, u32)>,
    /// `(file, start, end)` of `/etc/subuid` and `/etc/subgid`.
    pub subordinate: Vec<(String, u64, u64)>,
    /// `(VM, uid, gid)` of the other configured VMs and this one.
    pub principals: Vec<(String, u32, u32)>,
    /// NSS could not be enumerated in full: why.
    pub nss_incomplete: Option<String>,
}

/// Ranges (`start..end`) of `/etc/subuid` or `/etc/subgid`.
fn subordinate_ranges(path: &str) -> Vec<(String, u64, u64)> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.trim().split(':').collect();
            let start: u64 = f.get(1)?.parse().ok()?;
            let count: u64 = f.get(2)?.parse().ok()?;
            Some((format!("{path} ({})", f[0]), start, start + count))
        })
        .collect()
}

/// Every user and group NSS enumerates (`getpwent`, `getgrent`), at most
/// [`MAX_NSS_ENTRIES`] of each. A module that does not enumerate (SSSD
/// unless `enumerate = true`, winbind unless `winbind enum users`) shows
/// nothing here: its ids are checked only for the names the files hold.
/// Callers are single-threaded (the launcher, the tools).
fn nss_accounts(out: &mut Vec<(String, u32)>) -> Option<String> {
    let mut incomplete = None;
    // SAFETY: rewinds libc's static passwd enumeration; callers are
    // single-threaded, so nothing else uses it meanwhile.
    unsafe { libc::setpwent() };
    for n in 0.. {
        // SAFETY: as above; the entry lives in libc's static storage until
        // the next call, and is copied out below before that.
        let pw = unsafe { libc::getpwent() };
        if pw.is_null() {
            break;
        }
        if n >= MAX_NSS_ENTRIES {
            incomplete = Some(format!("more than {MAX_NSS_ENTRIES} users"));
            break;
        }
        // SAFETY: `pw` is non-null and points to the entry libc just filled.
        let pw = unsafe { &*pw };
        out.push((format!("user {}", c_name(pw.pw_name)), pw.pw_uid));
    }
    // SAFETY: ends the enumeration (frees libc's state); single-threaded.
    unsafe { libc::endpwent() };
    // SAFETY: as for the passwd database, for the group database.
    unsafe { libc::setgrent() };
    for n in 0.. {
        // SAFETY: as getpwent above.
        let gr = unsafe { libc::getgrent() };
        if gr.is_null() {
            break;
        }
        if n >= MAX_NSS_ENTRIES {
            incomplete = Some(format!("more than {MAX_NSS_ENTRIES} groups"));
            break;
        }
        // SAFETY: `gr` is non-null and points to the entry libc just filled.
        let gr = unsafe { &*gr };
        out.push((format!("group {}", c_name(gr.gr_name)), gr.gr_gid));
    }
    // SAFETY: ends the enumeration; single-threaded.
    unsafe { libc::endgrent() };
    incomplete
}

/// A name libc gave as a C string (`?` when null).
fn c_name(p: *const libc::c_char) -> String {
    if p.is_null() {
        return "?".into();
    }
    // SAFETY: non-null, NUL-terminated by libc, and read before the next
    // enumeration call can overwrite it.
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_string_lossy()
        .into_owned()
}

impl HostIds {
    /// The files, NSS's enumeration, the subordinate ranges and every
    /// configured principal (`p`, VM `name`'s, among them).
    pub fn gather(roots: &Roots, name: &VmName, p: &Principal) -> HostIds {
        let acc = Accounts::load();
        let mut accounts: Vec<(String, u32)> = acc
            .users
            .iter()
            .map(|u| (format!("user {}", u.name), u.uid))
            .chain(
                acc.groups
                    .iter()
                    .map(|g| (format!("group {}", g.name), g.gid)),
            )
            .collect();
        let nss_incomplete = nss_accounts(&mut accounts);
        let mut subordinate = subordinate_ranges("/etc/subuid");
        subordinate.extend(subordinate_ranges("/etc/subgid"));
        let mut principals = vec![(name.to_string(), p.uid, p.gid)];
        for (other, _, spec) in principal::configured_specs_except(roots, Some(name)) {
            if let Some(ids) = spec.and_then(|s| principal::resolve_ids_with(&s, &acc).ok()) {
                principals.push((other.to_string(), ids.0, ids.1));
            }
        }
        HostIds {
            accounts,
            subordinate,
            principals,
            nss_incomplete,
        }
    }

    /// Why the ids `base..end` (a range) are not free for a VM's files, if it is not: an
    /// account, a subordinate range, a principal or a running process has
    /// an id in it, or NSS could not be enumerated in full.
    pub fn taken(&self, base: u32, end: u32, scan: &Scan) -> Option<String> {
        let inside = |id: u32| id >= base && id < end;
        if let Some((what, id)) = self.accounts.iter().find(|(_, id)| inside(*id)) {
            return Some(format!("{what} has id {id}"));
        }
        let (lo, hi) = (u64::from(base), u64::from(end));
        if let Some((what, s, e)) = self.subordinate.iter().find(|(_, s, e)| *s < hi && lo < *e) {
            return Some(format!("the subordinate ids {s}..{e} of {what} overlap"));
        }
        if let Some((vm, u, g)) = self
            .principals
            .iter()
            .find(|(_, u, g)| inside(*u) || inside(*g))
        {
            return Some(format!("VM {vm}'s principal ({u}:{g}) is in it"));
        }
        let running = scan.in_range(base, end);
        if !running.is_empty() {
            return Some(format!("processes run with its uids: {running:?}"));
        }
        if let Some(why) = &self.nss_incomplete {
            return Some(format!("NSS could not be enumerated in full ({why})"));
        }
        None
    }
}
