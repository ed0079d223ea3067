//! Fuzz target `accounts`: see [`vmwarden_fuzz::accounts`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vmwarden_fuzz::accounts(data));
