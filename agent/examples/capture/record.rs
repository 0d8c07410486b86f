//! Samples of one process as firn's BPF program takes them in DWARF mode:
//! registers, the kernel's frame-pointer walk and a copy of the stack.

use std::time::Duration;

use agent_fixtures::capture::SampleLine;
use anyhow::{Context, Result};
use firn::{
    bpf::BpfSampler,
    sampler::{self, Record, SamplingConfig, UnwindMode},
};

/// A sample with its stack copy.
pub struct Recorded {
    pub line: SampleLine,
    pub stack: Vec<u8>,
}

/// The samples of `pid` with user registers and a stack copy, over
/// `seconds` at `frequency` Hz.
pub fn record(pid: u32, seconds: f64, frequency: u64) -> Result<Vec<Recorded>> {
    let sampling = SamplingConfig {
        frequency_hz: frequency,
        pids: vec![pid],
        unwind: UnwindMode::Dwarf,
        ..SamplingConfig::default()
    };
    let records = BpfSampler::record(&sampling, Duration::from_secs_f64(seconds))
        .context("could not sample with firn's BPF program")?;
    Ok(records
        .iter()
        .filter_map(|record| match sampler::decode(record) {
            Ok(Record::Sample(sample)) if sample.tgid == pid => Some(sample),
            _ => None,
        })
        .filter(|sample| !sample.stack_copy.is_empty())
        .filter_map(|sample| {
            let regs = sample.user_regs?;
            Some(Recorded {
                line: SampleLine {
                    tid: sample.tid,
                    ip: regs.ip,
                    sp: regs.sp,
                    bp: regs.bp,
                    stack_len: sample.stack_copy.len(),
                    walk: sample.user_stack,
                },
                stack: sample.stack_copy.to_vec(),
            })
        })
        .collect())
}

/// `count` of `samples` with distinct registers, evenly spread over the
/// recording (a spinning leaf is often caught at the same instruction).
pub fn spread(samples: Vec<Recorded>, count: usize) -> Vec<Recorded> {
    let mut seen = std::collections::HashSet::new();
    let mut distinct: Vec<Recorded> = samples
        .into_iter()
        .filter(|sample| seen.insert((sample.line.ip, sample.line.sp)))
        .collect();
    if distinct.len() <= count {
        return distinct;
    }
    let step = distinct.len() as f64 / count as f64;
    let picked: Vec<usize> = (0..count).map(|i| (i as f64 * step) as usize).collect();
    let mut index = 0;
    distinct.retain(|_| {
        index += 1;
        picked.contains(&(index - 1))
    });
    distinct
}
