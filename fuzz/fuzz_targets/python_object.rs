#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| firn::fuzzing::python_object(data));
