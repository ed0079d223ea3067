//! Fuzz target `http`: see [`vmwarden_fuzz::http`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vmwarden_fuzz::http(data));
