//! firn: a whole-system sampling profiler for Linux.
//!
//! The stages, in the order data flows through them: [`bpf`] (load and
//! attach) -> [`sampler`] (ring buffer records) -> [`process`] (maps,
//! objects, exec/exit) -> [`unwind`] (with interpreter frames named and
//! spliced in by [`runtimes`]) -> [`aggregate`] -> [`symbolize`] ->
//! [`labels`] -> pprof (the `agent_pprof` crate) -> [`output`]. [`session`]
//! drives them up to the aggregate, [`output`]'s steps the rest; the
//! agent's [`http`] endpoint serves [`metrics`] from [`stats`].

pub mod aggregate;
pub mod allocator;
pub mod backoff;
pub mod bpf;
pub mod cli;
pub mod config;
pub mod config_file;
pub mod host;
pub mod http;
pub mod labels;
pub mod launch;
pub mod logging;
pub mod metrics;
pub mod offcpu;
pub mod output;
pub mod privileges;
pub mod process;
pub mod report;
pub mod runtimes;
pub mod sampler;
pub mod session;
pub mod stats;
pub mod symbolize;
pub mod untrusted;
pub mod unwind;
pub mod wall;
pub mod watchdog;
