#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| agent_runtimes::fuzzing::ruby_object(data));
