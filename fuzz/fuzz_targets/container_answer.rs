#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| agent_config::fuzzing::container_answer(data));
