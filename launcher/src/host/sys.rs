//! A failed system call or I/O operation, with the operation and the path it
//! was about: the building block every part's error enum wraps, so a printed
//! message always says what was being done to which path.

use std::path::PathBuf;

use nix::errno::Errno;

/// A system call that failed with `errno`.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {op}: {errno}")]
pub struct SysError {
    pub op: &'static str,
    pub path: PathBuf,
    #[source]
    pub errno: Errno,
}

/// An I/O operation that failed.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {op}: {source}")]
pub struct IoError {
    pub op: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// Attach a path and an operation name to a nix error.
pub trait SysContext<T> {
    fn sys(self, op: &'static str, path: impl Into<PathBuf>) -> Result<T, SysError>;
}

impl<T> SysContext<T> for Result<T, Errno> {
    fn sys(self, op: &'static str, path: impl Into<PathBuf>) -> Result<T, SysError> {
        self.map_err(|errno| SysError {
            op,
            path: path.into(),
            errno,
        })
    }
}

/// Attach a path and an operation name to an io error.
pub trait IoContext<T> {
    fn io(self, op: &'static str, path: impl Into<PathBuf>) -> Result<T, IoError>;
}

impl<T> IoContext<T> for Result<T, std::io::Error> {
    fn io(self, op: &'static str, path: impl Into<PathBuf>) -> Result<T, IoError> {
        self.map_err(|source| IoError {
            op,
            path: path.into(),
            source,
        })
    }
}
