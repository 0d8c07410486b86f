//! The first stage: ring buffer records from the BPF program, decoded into
//! plain values by `agent_records`; `RingReader` owns the ring buffer.
//! [`SamplingConfig`] says what the BPF program samples.

use std::io;

pub use agent_records::{Comm, DecodeError, ProcessEvent, RawSample, Record, decode};
use aya::maps::{MapData, RingBuf};
use tokio::io::{Interest, unix::AsyncFd};

/// What the BPF side samples and how.
#[derive(Clone, Debug)]
pub struct SamplingConfig {
    /// Samples per second per CPU.
    pub frequency_hz: u64,
    /// Only these processes (tgids), filtered in the kernel; empty = all.
    pub pids: Vec<u32>,
    /// Ring buffer size in bytes (a power of two, at least a page);
    /// `None` sizes it from the CPU count.
    pub ring_buffer_bytes: Option<u32>,
    /// User stack bytes copied per sample for unwinding the leaf frame with
    /// CFI (frame-pointer walks lose the caller of a leaf without a frame).
    pub leaf_stack_copy_bytes: u32,
    /// How user stacks are unwound.
    pub unwind: UnwindMode,
    /// User stack bytes copied per sample of a process unwound with DWARF.
    pub stack_copy_bytes: u32,
    /// Kernel stacks walked (in the BPF program: off costs nothing).
    pub kernel_stacks: bool,
    /// User stacks walked, copied and unwound.
    pub user_stacks: bool,
    /// Off-CPU profiling's period `T` (`--off-cpu`): each off-CPU sample
    /// stands for this much time waited. `None`: off, nothing attached to
    /// the scheduler.
    pub off_cpu_period: Option<std::time::Duration>,
}

impl Default for SamplingConfig {
    fn default() -> Self {
        Self {
            frequency_hz: 100,
            pids: Vec::new(),
            ring_buffer_bytes: None,
            leaf_stack_copy_bytes: 1024,
            unwind: UnwindMode::Auto,
            stack_copy_bytes: agent_common::MAX_STACK_COPY as u32,
            kernel_stacks: true,
            user_stacks: true,
            off_cpu_period: None,
        }
    }
}

/// How user stacks are unwound. Here rather than with the unwinder: it
/// decides what the BPF program copies with each sample.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UnwindMode {
    /// Per process: DWARF where its code lacks frame pointers.
    #[default]
    Auto,
    /// The kernel's frame-pointer walk, leaf repaired with CFI.
    FramePointers,
    /// DWARF CFI over a copy of the stack, for every process.
    Dwarf,
}

/// The ring buffer, readable from tokio.
pub struct RingReader {
    ring: AsyncFd<RingBuf<MapData>>,
}

impl RingReader {
    pub fn new(ring: RingBuf<MapData>) -> io::Result<Self> {
        // SAFETY: the ring buffer owns its map's file descriptor, which stays
        // open and unchanged until the ring buffer (and this AsyncFd) drops.
        let ring = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
            .map_err(|error| error.into_parts().1)?;
        Ok(Self { ring })
    }

    /// Waits until the BPF side signals data. It wakes the reader only once
    /// enough has accumulated, so callers also drain on a timer.
    pub async fn readable(&mut self) -> io::Result<()> {
        let mut guard = self.ring.readable_mut().await?;
        guard.clear_ready();
        Ok(())
    }

    /// Hands at most `limit` waiting records to `handle`; returns how many
    /// it handed.
    pub fn drain(&mut self, limit: usize, mut handle: impl FnMut(&[u8])) -> usize {
        let ring = self.ring.get_mut();
        let mut count = 0;
        while count < limit {
            let Some(item) = ring.next() else { break };
            handle(&item);
            count += 1;
        }
        count
    }
}
