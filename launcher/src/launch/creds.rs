//! Credentials: read from their sources (as root, in the host namespace)
//! and written into the VM's private noswap tmpfs.
//!
//! Sources must be root's alone (see [`read_all`]), are never reached
//! through a symlink, are opened without blocking (a FIFO must not hang the
//! launch) and must be regular files of at most 1 MiB.

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{fchmod, Mode};
use nix::unistd::{fchown, Gid, Uid};

use crate::config::files::{open_probed_at, Distrust, OpenError};
use crate::config::names::CredentialName;
use crate::config::spec::{CredentialSource, CredentialSpec, MAX_CREDENTIAL_BYTES};
use crate::host::dirs::Dir;
use crate::host::sys::{IoContext, IoError, SysContext, SysError};
use crate::host::trust::{self, Policy};

/// A credential that cannot be read from its source (`EX_CONFIG`), or one
/// that cannot be written into the VM's tmpfs.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    #[error("credential {name} ({source_desc}): {problem}")]
    Source {
        name: String,
        /// The source in words (`path /etc/x`, `systemd credential "x"`).
        source_desc: String,
        #[source]
        problem: SourceProblem,
    },
    #[error(transparent)]
    Sys(#[from] SysError),
    #[error(transparent)]
    Io(#[from] IoError),
}

impl CredentialError {
    /// A credential source refused (`EX_CONFIG`).
    pub fn is_refusal(&self) -> bool {
        matches!(self, CredentialError::Source { .. })
    }
}

/// What is wrong with a credential's source.
#[derive(Debug, thiserror::Error)]
pub enum SourceProblem {
    #[error(
        "$CREDENTIALS_DIRECTORY is not set; give the credential with LoadCredential= in the unit"
    )]
    NoCredentialsDirectory,
    #[error("{path} does not exist")]
    Missing { path: PathBuf },
    /// Someone but root could change it, or what leads to it (the field is
    /// `credentials[N].source.path` or `.systemd`).
    #[error("field `{field}`: {cause}")]
    Untrusted {
        field: String,
        #[source]
        cause: Distrust,
    },
    #[error("{path} {cause}")]
    Open {
        path: PathBuf,
        #[source]
        cause: OpenError,
    },
    #[error("{path} was replaced while it was being opened")]
    Replaced { path: PathBuf },
    #[error("{path} is {size} bytes; the limit is {MAX_CREDENTIAL_BYTES}")]
    TooLarge { path: PathBuf, size: u64 },
    #[error("read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} grew past {MAX_CREDENTIAL_BYTES} bytes while read")]
    Grew { path: PathBuf },
}

/// A credential read into memory. The bytes never reach argv or environ;
/// `execve` discards this memory.
pub struct Loaded {
    pub name: CredentialName,
    pub bytes: Vec<u8>,
}

impl std::fmt::Debug for Loaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Loaded {{ name: {:?}, len: {} }}",
            self.name,
            self.bytes.len()
        )
    }
}

fn describe(src: &CredentialSource) -> String {
    match src {
        CredentialSource::Systemd(id) => format!("systemd credential {id:?}"),
        CredentialSource::Path(p) => format!("path {}", p.display()),
    }
}

/// Read every credential the spec names (its `credentials`). `credentials_directory` is the
/// `$CREDENTIALS_DIRECTORY` the launcher was started with, if any; `walker`
/// is the launch's (directories on the way are opened once per launch).
///
/// A source must be trustworthy: its whole path, from `/`, owned by root
/// and writable by root only, with no symlink anywhere and no sticky
/// world-writable directory (`/tmp`, `/dev/shm`) on the way
/// (`host::trust`, [`Policy::Secret`]). Whoever could replace it would
/// choose what the VM is given as its secret, or learn which file root
/// copies into a VM. It is opened without following a link and without
/// blocking, and must be a regular file.
pub fn read_all(
    credentials: &[CredentialSpec],
    credentials_directory: Option<&Path>,
    walker: &mut trust::Walker,
) -> Result<Vec<Loaded>, CredentialError> {
    let mut out = Vec::with_capacity(credentials.len());
    for (i, c) in credentials.iter().enumerate() {
        let desc = describe(&c.source);
        let err = |problem: SourceProblem| CredentialError::Source {
            name: c.name.to_string(),
            source_desc: desc.clone(),
            problem,
        };
        let (path, field) = match &c.source {
            CredentialSource::Systemd(id) => {
                let dir = credentials_directory
                    .ok_or_else(|| err(SourceProblem::NoCredentialsDirectory))?;
                (dir.join(id), format!("credentials[{i}].source.systemd"))
            }
            CredentialSource::Path(p) => (p.clone(), format!("credentials[{i}].source.path")),
        };
        let walked = walker.walk(&path, Policy::Secret).map_err(|cause| {
            err(match cause {
                Distrust::Sys {
                    errno: Errno::ENOENT,
                    path,
                    ..
                } => SourceProblem::Missing { path },
                cause => SourceProblem::Untrusted {
                    field: field.clone(),
                    cause,
                },
            })
        })?;
        // The walk's O_PATH open and fstat of the source were the probe
        // (`walked.fd` stays open until the inode check).
        let (f, st) = open_probed_at(
            Some(walked.parent.as_fd()),
            &walked.name,
            false,
            &walked.stat,
        )
        .map_err(|cause| {
            err(match cause {
                OpenError::Sys(Errno::ENOENT) => SourceProblem::Missing { path: path.clone() },
                cause => SourceProblem::Open {
                    path: path.clone(),
                    cause,
                },
            })
        })?;
        if (st.st_dev, st.st_ino) != (walked.stat.st_dev, walked.stat.st_ino) {
            return Err(err(SourceProblem::Replaced { path }));
        }
        let len = u64::try_from(st.st_size).unwrap_or(0);
        if len > MAX_CREDENTIAL_BYTES {
            return Err(err(SourceProblem::TooLarge { path, size: len }));
        }
        let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
        f.take(MAX_CREDENTIAL_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|source| {
                err(SourceProblem::Read {
                    path: path.clone(),
                    source,
                })
            })?;
        if u64::try_from(bytes.len()).unwrap_or(u64::MAX) > MAX_CREDENTIAL_BYTES {
            return Err(err(SourceProblem::Grew { path }));
        }
        out.push(Loaded {
            name: c.name.clone(),
            bytes,
        });
    }
    Ok(out)
}

/// tmpfs size for a credential set: each file rounded up to pages, plus slack.
pub fn tmpfs_size(creds: &[Loaded]) -> u64 {
    let page = 4096u64;
    let files: u64 = creds
        .iter()
        .map(|c| (c.bytes.len() as u64).div_ceil(page).max(1) * page)
        .sum();
    files + 4 * page
}

/// Write each credential into the (still writable, root-owned 0700) tmpfs:
/// created `O_EXCL` 0600 by root, written, then owned by the principal and
/// made 0400. The directory becomes the principal's, 0500.
pub fn install(
    dir: &Dir,
    creds: &[Loaded],
    uid: u32,
    gid: u32,
) -> Result<Vec<PathBuf>, CredentialError> {
    let mut written = Vec::new();
    for c in creds {
        let path = dir.path.join(&c.name);
        let fd = openat(
            dir.fd.as_fd(),
            c.name.as_str(),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .sys("create credential", &path)?;
        let mut f = std::fs::File::from(fd);
        f.write_all(&c.bytes).io("write credential", &path)?;
        fchown(
            f.as_fd(),
            Some(Uid::from_raw(uid)),
            Some(Gid::from_raw(gid)),
        )
        .sys("fchown", &path)?;
        fchmod(f.as_fd(), Mode::from_bits_truncate(0o400)).sys("fchmod", &path)?;
        written.push(path);
    }
    fchown(
        dir.fd.as_fd(),
        Some(Uid::from_raw(uid)),
        Some(Gid::from_raw(gid)),
    )
    .sys("fchown", &dir.path)?;
    fchmod(dir.fd.as_fd(), Mode::from_bits_truncate(0o500)).sys("fchmod", &dir.path)?;
    Ok(written)
}
