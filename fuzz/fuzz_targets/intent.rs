//! Fuzz target `intent`: see [`vmwarden_fuzz::intent`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vmwarden_fuzz::intent(data));
