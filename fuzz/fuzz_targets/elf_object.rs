#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| agent_elf::fuzzing::elf_object(data));
