//! Who a VM runs as: principal resolution and the principal registry
//! (uid ↔ VM, generations, tombstones).

pub mod accounts;
pub mod principal;
pub mod registry;
