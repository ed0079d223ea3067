//! Fuzz target `vmm_notify`: see [`vmwarden_fuzz::vmm_notify`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vmwarden_fuzz::vmm_notify(data));
