#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| shared::proto::fuzzing::frames(data));
