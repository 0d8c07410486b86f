#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| agent_proc::fuzzing::cgroup(data));
