#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| agent_unwind::fuzzing::unwind_stack(data));
