//! Fuzz target `launched_spec`: see [`vmwarden_fuzz::launched_spec`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vmwarden_fuzz::launched_spec(data));
