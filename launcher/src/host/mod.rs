//! The host as the launcher and the teardown tools see it: directories walked
//! with `openat`, ownership, mount tables, /proc, network links, socket peers.
//! Knows nothing of instances or hypervisors.

pub mod cgroup;
pub mod dirs;
pub mod figures;
pub mod leftovers;
pub mod locks;
pub mod machined;
pub mod mountinfo;
pub mod net;
pub mod ns_mounts;
pub mod ownership;
pub mod peer;
pub mod procs;
pub mod signals;
pub mod statmount_abi;
pub mod sys;
pub mod trust;
