//! Fuzz target `proc_status`: see [`vmwarden_fuzz::proc_status`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vmwarden_fuzz::proc_status(data));
