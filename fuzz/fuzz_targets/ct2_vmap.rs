#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| tolk_fuzz::ct2_vmap(data));
