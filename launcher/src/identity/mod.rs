//! Who a VM runs as: principal resolution and the principal registry
//! (uid ↔ VM, generations, tombstones).

pub mod accounts;
pub mod host_ids;
pub mod principal;
pub mod ranges;
pub mod registry;
