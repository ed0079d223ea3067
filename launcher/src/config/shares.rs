//! The spec's shares (`shares[]`) and the daemon that serves the virtiofs
//! ones (`virtiofsd`): types and their serde forms. Re-exported from
//! `config::spec`, whose fields they are; their checks are in
//! `config::validation`.

use std::path::PathBuf;

use serde::de::{Error as DeError, Unexpected, Visitor};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub enum ShareProto {
    #[serde(rename = "virtiofs")]
    Virtiofs,
    #[serde(rename = "9p")]
    NineP,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ShareSpec {
    pub tag: String,
    pub source: PathBuf,
    pub proto: ShareProto,
    #[serde(default)]
    pub read_only: bool,
}

impl ShareSpec {
    /// A share the guest owns: writable virtiofs, whose virtiofsd runs in
    /// a user namespace mapping the guest's ids to the VM's own id range
    /// (`launch/helpers/owned.rs`). A writable 9p share keeps the guest's
    /// ids in extended attributes instead (`mapped-xattr`).
    pub fn guest_owned(&self) -> bool {
        self.proto == ShareProto::Virtiofs && !self.read_only
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct VirtiofsdSpec {
    pub binary: PathBuf,
    /// virtiofsd's `--thread-pool-size`: a count, or `"nproc"` for the
    /// host's CPUs at launch (microvm.nix's default). Absent: virtiofsd's
    /// own default, no pool (requests are served on the queue's thread).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_pool_size: Option<ThreadPoolSize>,
}

/// `virtiofsd.thread_pool_size`: a count, or `"nproc"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadPoolSize {
    Count(u32),
    /// As many threads as the launcher may run on (`sched_getaffinity`).
    Nproc,
}

impl Serialize for ThreadPoolSize {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            ThreadPoolSize::Count(n) => s.serialize_u32(*n),
            ThreadPoolSize::Nproc => s.serialize_str("nproc"),
        }
    }
}

impl<'de> Deserialize<'de> for ThreadPoolSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = ThreadPoolSize;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a thread count or \"nproc\" (virtiofsd.thread_pool_size)")
            }
            fn visit_u64<E: DeError>(self, n: u64) -> Result<ThreadPoolSize, E> {
                u32::try_from(n)
                    .map(ThreadPoolSize::Count)
                    .map_err(|_| E::invalid_value(Unexpected::Unsigned(n), &self))
            }
            fn visit_str<E: DeError>(self, s: &str) -> Result<ThreadPoolSize, E> {
                match s {
                    "nproc" => Ok(ThreadPoolSize::Nproc),
                    _ => Err(E::invalid_value(Unexpected::Str(s), &self)),
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// Most virtiofsd pool threads a spec may ask for.
pub const MAX_THREAD_POOL: u32 = 1024;

impl ThreadPoolSize {
    /// The count passed to virtiofsd; `cpus` is the host's, for `"nproc"`.
    pub fn resolve(self, cpus: usize) -> u32 {
        match self {
            ThreadPoolSize::Count(n) => n,
            ThreadPoolSize::Nproc => u32::try_from(cpus.max(1)).unwrap_or(MAX_THREAD_POOL),
        }
    }
}
