//! Teardown with proof: per-stop cleanup, the reaper, purge, verify-clean;
//! and adopt, which moves a stopped microvm.nix VM's state in.
//! Every destructive path asks `instance::liveness` first.

pub mod adopt;
pub mod cleanup;
pub mod purge;
pub mod reap;
pub mod taps;
pub mod verify;
