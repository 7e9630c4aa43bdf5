#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tessera_fuzz::targets::gateway_http1::run(data));
