//! Who a VM runs as: principal resolution and the principal registry
//! (uid ↔ VM, generations, tombstones).

pub mod principal;
pub mod registry;
