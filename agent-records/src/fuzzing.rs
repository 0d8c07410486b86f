//! Entry point of the fuzz target (`fuzz/`, `cargo xtask fuzz`) for the
//! ring buffer records: what the kernel handed the BPF program about a
//! task. It may not panic, hang or allocate without bound on any input.

/// One BPF ring buffer record.
pub fn ring_record(data: &[u8]) {
    let _ = crate::decode(data);
}

#[cfg(test)]
agent_fixtures::replays! { "ring_record" => ring_record }
