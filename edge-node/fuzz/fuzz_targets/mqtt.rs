#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| edge_node::broker::fuzzing::client_bytes(data));
