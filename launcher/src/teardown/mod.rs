//! Teardown with proof: per-stop cleanup, the reaper, purge, verify-clean.
//! Every destructive path asks `instance::liveness` first.

pub mod cleanup;
pub mod purge;
pub mod reap;
pub mod taps;
pub mod verify;
