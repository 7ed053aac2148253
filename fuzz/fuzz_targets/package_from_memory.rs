#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| tolk_fuzz::package_from_memory(data));
