//! Fuzz target `mountinfo`: see [`vmwarden_fuzz::mountinfo`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vmwarden_fuzz::mountinfo(data));
