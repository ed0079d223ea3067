//! Fuzz target `spec`: see [`vmwarden_fuzz::spec`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vmwarden_fuzz::spec(data));
