#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| nodeward_agent::fuzzing::config(data));
