//! User and group accounts, read from `/etc/passwd` and `/etc/group`
//! directly; NSS only as a fallback for a *name* the files do not have.
//!
//! NSS is slow for a launcher (it reads nsswitch.conf and dlopens a module
//! per source), and most principals live in the files: NixOS writes its
//! users there, and so do `useradd` and `systemd-sysusers`. A numeric
//! principal never touches NSS. What the files alone cannot show is noted
//! where it matters: memberships that only another NSS source grants to a
//! user who is in `/etc/passwd`, and a uid that only another source gives
//! to a second account.

use std::path::Path;

use nix::errno::Errno;

use crate::host::sys::read_path;

pub const PASSWD: &str = "/etc/passwd";
pub const GROUP: &str = "/etc/group";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub shell: String,
    /// `true` when found in `/etc/passwd`, `false` when NSS gave it.
    pub from_files: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    pub name: String,
    pub gid: u32,
    pub members: Vec<String>,
}

/// The two files, parsed. Lines that do not parse are skipped (as NSS's
/// files module does).
#[derive(Debug, Clone, Default)]
pub struct Accounts {
    pub users: Vec<User>,
    pub groups: Vec<Group>,
}

fn parse_passwd(text: &str) -> Vec<User> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with('+') && !l.starts_with('-'))
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            if f.len() < 7 || f[0].is_empty() {
                return None;
            }
            Some(User {
                name: f[0].to_string(),
                uid: f[2].parse().ok()?,
                gid: f[3].parse().ok()?,
                shell: f[6].to_string(),
                from_files: true,
            })
        })
        .collect()
}

fn parse_group(text: &str) -> Vec<Group> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with('+') && !l.starts_with('-'))
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            if f.len() < 4 || f[0].is_empty() {
                return None;
            }
            Some(Group {
                name: f[0].to_string(),
                gid: f[2].parse().ok()?,
                members: f[3]
                    .split(',')
                    .filter(|m| !m.is_empty())
                    .map(str::to_string)
                    .collect(),
            })
        })
        .collect()
}

impl Accounts {
    /// Read `/etc/passwd` and `/etc/group` (a missing file reads as empty).
    pub fn load() -> Accounts {
        Accounts::from_files(Path::new(PASSWD), Path::new(GROUP))
    }

    pub fn from_files(passwd: &Path, group: &Path) -> Accounts {
        // One read for files up to 16 KiB (no statx first: host::sys::read_path).
        let read = |p: &Path| {
            read_path(p, 16 * 1024, usize::MAX).map(|b| String::from_utf8_lossy(&b).into_owned())
        };
        Accounts {
            users: read(passwd).map(|t| parse_passwd(&t)).unwrap_or_default(),
            groups: read(group).map(|t| parse_group(&t)).unwrap_or_default(),
        }
    }

    pub fn from_text(passwd: &str, group: &str) -> Accounts {
        Accounts {
            users: parse_passwd(passwd),
            groups: parse_group(group),
        }
    }

    /// The user `name`: the files first, NSS when the files lack it.
    pub fn user_by_name(&self, name: &str) -> Result<Option<User>, Errno> {
        if let Some(u) = self.users.iter().find(|u| u.name == name) {
            return Ok(Some(u.clone()));
        }
        match nix::unistd::User::from_name(name) {
            Ok(Some(u)) => Ok(Some(User {
                name: u.name,
                uid: u.uid.as_raw(),
                gid: u.gid.as_raw(),
                shell: u.shell.to_string_lossy().into_owned(),
                from_files: false,
            })),
            Ok(None) => Ok(None),
            Err(errno) => Err(errno),
        }
    }

    /// The gid of group `name`: the files first, NSS when the files lack it.
    pub fn gid_by_name(&self, name: &str) -> Result<Option<u32>, Errno> {
        if let Some(g) = self.groups.iter().find(|g| g.name == name) {
            return Ok(Some(g.gid));
        }
        Ok(nix::unistd::Group::from_name(name)?.map(|g| g.gid.as_raw()))
    }

    /// Every `/etc/passwd` entry with uid `uid`.
    pub fn users_with_uid(&self, uid: u32) -> Vec<&User> {
        self.users.iter().filter(|u| u.uid == uid).collect()
    }

    /// The name of group `gid` in `/etc/group` (no NSS).
    pub fn group_name(&self, gid: u32) -> Option<&str> {
        self.groups
            .iter()
            .find(|g| g.gid == gid)
            .map(|g| g.name.as_str())
    }

    /// Supplementary groups of `user` (not its primary group): from
    /// `/etc/group` for a user found in the files, from NSS
    /// (`getgrouplist`) for one that only NSS knows.
    pub fn supplementary_gids(&self, user: &User) -> Vec<u32> {
        if user.from_files {
            return self
                .groups
                .iter()
                .filter(|g| g.members.contains(&user.name))
                .map(|g| g.gid)
                .collect();
        }
        let Ok(cname) = std::ffi::CString::new(user.name.as_str()) else {
            return Vec::new();
        };
        nix::unistd::getgrouplist(&cname, nix::unistd::Gid::from_raw(user.gid))
            .map(|gs| gs.into_iter().map(|g| g.as_raw()).collect())
            .unwrap_or_default()
    }
}

/// A shell that lets nobody log in: `nologin` or `false`, wherever it lives
/// (`/usr/sbin/nologin`, `/sbin/nologin`, NixOS's
/// `/run/current-system/sw/bin/nologin`, `/bin/false`, a store path).
/// An empty shell field means `/bin/sh` (passwd(5)), a login shell.
pub fn is_no_login_shell(shell: &str) -> bool {
    matches!(
        Path::new(shell).file_name().and_then(|n| n.to_str()),
        Some("nologin" | "false")
    )
}

/// The kernel's overflow ids (what an unmapped id shows as; 65534 unless
/// changed), and the ids that can never name one principal: 65534
/// (`nobody`/`nogroup`), 65535 (the 16-bit -1) and 2^32-1 (-1: "leave
/// unchanged" to setresuid).
pub fn reserved_ids(sysctl: &str) -> Vec<u32> {
    let mut v = vec![65534, 65535, u32::MAX];
    // A sysctl is a few bytes: one read (`host::sys::read_path`).
    if let Ok(t) = read_path(Path::new(sysctl), 64, 64) {
        if let Ok(x) = String::from_utf8_lossy(&t).trim().parse::<u32>() {
            v.push(x);
        }
    }
    v.sort_unstable();
    v.dedup();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    const PW: &str = "root:x:0:0:root:/root:/bin/bash\n\
        nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n\
        vm-web:x:61000:61000::/var/empty:/run/current-system/sw/bin/nologin\n\
        alias:x:61000:61000::/var/empty:/usr/sbin/nologin\n\
        human:x:1000:1000::/home/human:/bin/bash\n\
        broken line\n\
        noshell:x:61002:61002::/:\n";
    const GR: &str = "root:x:0:\nwheel:x:10:human\nkvm:x:78:vm-web,other\nvm-web:x:61000:\n";

    #[test]
    fn parses_the_files_and_finds_shared_uids() {
        let a = Accounts::from_text(PW, GR);
        assert_eq!(a.users.len(), 6);
        let names: Vec<&str> = a
            .users_with_uid(61000)
            .iter()
            .map(|u| u.name.as_str())
            .collect();
        assert_eq!(names, ["vm-web", "alias"]);
        let web = a.user_by_name("vm-web").unwrap().unwrap();
        assert!(web.from_files);
        assert_eq!(a.supplementary_gids(&web), vec![78]);
        assert_eq!(a.gid_by_name("kvm").unwrap(), Some(78));
        assert_eq!(a.group_name(10), Some("wheel"));
    }

    #[test]
    fn login_shells() {
        for s in [
            "/usr/sbin/nologin",
            "/sbin/nologin",
            "/run/current-system/sw/bin/nologin",
            "/nix/store/abc-shadow-4.14/bin/nologin",
            "/bin/false",
            "/usr/bin/false",
        ] {
            assert!(is_no_login_shell(s), "{s}");
        }
        for s in ["/bin/bash", "/bin/sh", "", "/bin/sync", "/bin/true"] {
            assert!(!is_no_login_shell(s), "{s:?}");
        }
    }

    #[test]
    fn reserved_ids_always_hold_nobody_and_minus_one() {
        let r = reserved_ids("/nonexistent");
        assert!(r.contains(&65534) && r.contains(&u32::MAX) && r.contains(&65535));
    }
}
