#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| agent_runtimes::fuzzing::python_object(data));
