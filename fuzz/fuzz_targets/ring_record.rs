#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| agent_records::fuzzing::ring_record(data));
