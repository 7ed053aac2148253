#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| tolk_fuzz::shortlist(data));
