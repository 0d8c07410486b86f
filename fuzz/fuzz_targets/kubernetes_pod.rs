#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| agent_config::fuzzing::kubernetes_pod(data));
