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

/// When [`read_fd_to_end`] is at the end of a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadEnd {
    /// At a read that returns 0: any file, and procfs seq_files that
    /// iterate records (`mountinfo`, `children`), whose read stops short
    /// before a record that does not fit.
    Eof,
    /// Also at the first read shorter than the room it had: procfs files
    /// generated whole on the first read (single_open: `status`, `stat`),
    /// which saves the read that would return 0.
    ShortRead,
}

/// Read `fd` from its offset to the end (see [`ReadEnd`]) into `buf`
/// (cleared first): at most `limit` bytes, starting with room for `hint`.
/// A file that fits takes one `read` and, with [`ReadEnd::Eof`], the one
/// that returns 0; the buffer doubles when full.
///
/// For what the launch reads on its hot path whose size it knows or can
/// bound: procfs and kernfs files (their `stat` size is 0) and small
/// records. `std::fs::read` would add a `statx` and, with no size, grow
/// from 32 bytes (eight reads for `/proc/self/status`).
pub fn read_fd_to_end(
    fd: std::os::fd::BorrowedFd<'_>,
    buf: &mut Vec<u8>,
    hint: usize,
    limit: usize,
    end: ReadEnd,
) -> Result<(), Errno> {
    buf.clear();
    let mut room = hint.clamp(1, limit.max(1));
    loop {
        let have = buf.len();
        if have >= limit {
            return Ok(());
        }
        if have == room {
            room = room.saturating_mul(2).min(limit);
        }
        buf.resize(room, 0);
        match nix::unistd::read(fd, &mut buf[have..]) {
            Ok(0) => {
                buf.truncate(have);
                return Ok(());
            }
            Ok(n) => {
                let short = n < room - have;
                buf.truncate(have + n);
                if short && end == ReadEnd::ShortRead {
                    return Ok(());
                }
            }
            Err(Errno::EINTR) => buf.truncate(have),
            Err(e) => {
                buf.truncate(have);
                return Err(e);
            }
        }
    }
}

/// Open `path` (`O_RDONLY|O_CLOEXEC`, following symlinks as `open(2)`
/// does) and read it whole with [`read_fd_to_end`]: for procfs files
/// (`/proc/self/status`, sysctls), 4 KiB covers them in one read.
pub fn read_path(path: &std::path::Path, hint: usize, limit: usize) -> Result<Vec<u8>, Errno> {
    use std::os::fd::AsFd;
    let fd = nix::fcntl::open(
        path,
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    let mut buf = Vec::new();
    read_fd_to_end(fd.as_fd(), &mut buf, hint, limit, ReadEnd::Eof)?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn reads_to_the_end_whatever_the_hint_and_stops_at_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&p, &data).unwrap();
        for hint in [0, 1, 32, 4096, 10_000, 10_001, 1 << 20] {
            assert_eq!(
                read_path(&p, hint, usize::MAX).unwrap(),
                data,
                "hint {hint}"
            );
        }
        assert_eq!(read_path(&p, 4096, 5000).unwrap(), data[..5000]);
        let f = std::fs::File::open(&p).unwrap();
        let mut buf = vec![1, 2, 3];
        read_fd_to_end(f.as_fd(), &mut buf, 16, 20_000, ReadEnd::Eof).unwrap();
        assert_eq!(buf, data);
        // procfs: stat says 0 bytes.
        let status = read_path(std::path::Path::new("/proc/self/status"), 4096, 1 << 20).unwrap();
        assert!(String::from_utf8_lossy(&status).contains("\nNoNewPrivs:"));
        assert_eq!(
            read_path(&dir.path().join("missing"), 64, 64).unwrap_err(),
            Errno::ENOENT
        );
    }
}
