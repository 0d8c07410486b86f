#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| agent_unwind::fuzzing::cfi_rows(data));
