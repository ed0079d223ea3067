//! Fuzz target `qmp`: see [`vmwarden_fuzz::qmp`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vmwarden_fuzz::qmp(data));
