//! Fuzz target `extra_args`: see [`vmwarden_fuzz::extra_args`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vmwarden_fuzz::extra_args(data));
