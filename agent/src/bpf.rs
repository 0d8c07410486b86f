//! Loading and attaching firn's BPF programs, and reading their counters
//! and (when asked for) their log.

pub(crate) mod btf;
mod exit_maps;
mod follow;
mod maps;
mod offcpu;
mod probe;
mod program_log;

pub use self::maps::{BpfCopySizeMap, BpfExclusionMap, BpfInterpreterMap};
#[cfg(test)]
use self::probe::parse_run_time;
pub use self::probe::{BpfCounters, BpfProbe, ProgramRunTime};
use self::probe::{read_counters, run_time_stats};

use std::{
    io,
    os::fd::{AsFd, OwnedFd},
    time::{Duration, Instant},
};

use agent_common::{BpfConfig, MAX_PID_FILTER, names};
use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap as BpfHashMap, IterableMap, Map, MapData, PerCpuArray, ProgramArray, RingBuf},
    programs::{
        PerfEvent, RawTracePoint,
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
    },
};
use tracing::debug;

use self::program_log::{ProgramLog, ProgramLogError};
use crate::{
    privileges,
    sampler::{SamplingConfig, UnwindMode},
};

/// The BPF object built from `agent-ebpf/` (see `cargo xtask build-ebpf`).
static OBJECT: &[u8] = aya::include_bytes_aligned!("../bpf/firn.bpf.o");

#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    #[error(
        "firn needs {capabilities} to {action} (run it as root, or grant the capabilities, \
         e.g. `setcap cap_bpf,cap_perfmon,cap_sys_ptrace,cap_dac_read_search+ep firn`)"
    )]
    MissingPrivilege {
        capabilities: &'static str,
        action: &'static str,
        #[source]
        source: Option<io::Error>,
    },
    #[error("could not load firn's BPF object")]
    Load {
        #[source]
        source: aya::EbpfError,
    },
    #[error("BPF {kind} `{name}` is missing from firn's BPF object")]
    Missing {
        kind: &'static str,
        name: &'static str,
    },
    #[error("the kernel rejected BPF program `{name}`")]
    Program {
        name: &'static str,
        #[source]
        source: aya::programs::ProgramError,
    },
    #[error("could not attach the sampler to CPU {cpu}")]
    AttachCpu {
        cpu: u32,
        #[source]
        source: aya::programs::ProgramError,
    },
    #[error("BPF map `{name}`")]
    Map {
        name: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("could not list the online CPUs ({what})")]
    OnlineCpus {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("could not open the BPF counters for the metrics endpoint")]
    Probe {
        #[source]
        source: io::Error,
    },
    #[error("--pid accepts at most {MAX_PID_FILTER} processes, got {count}")]
    TooManyPids { count: usize },
    #[error("off-CPU profiling needs to know where a task's id is, from the kernel's BTF")]
    OffCpuBtf {
        #[source]
        source: btf::BtfError,
    },
    #[error("could not forward the BPF programs' log")]
    ProgramLog {
        #[source]
        source: ProgramLogError,
    },
}

const CAPABILITIES: &str = "CAP_BPF and CAP_PERFMON";
/// Scratch slots when the possible CPUs cannot be counted. A CPU beyond
/// them finds no slot, and its samples are counted as lost
/// (`scratch_unavailable`), not written over another CPU's.
const MAX_CPUS_FALLBACK: u32 = 256;

/// The loaded and attached programs. Dropping it detaches everything.
pub struct BpfSampler {
    ebpf: Ebpf,
    counters: PerCpuArray<MapData, u64>,
    cpus: Vec<u32>,
    ring_buffer_bytes: u32,
    /// Keeps the kernel's BPF run-time statistics on while held.
    stats: Option<OwnedFd>,
    /// Forwards the programs' log records, while `firn::bpf` debug is on.
    _program_log: Option<ProgramLog>,
    /// Processes were named but their children are not followed (said
    /// once, when loading).
    children_not_followed: bool,
    /// Off-CPU profiling is on: its programs are attached with the sampler.
    off_cpu: bool,
    /// `MAPS_COUNTERS`, when exiting processes' mappings are captured in
    /// the kernel (`process_exit_maps` attached).
    exit_maps: Option<PerCpuArray<MapData, u64>>,
}

impl BpfSampler {
    pub fn load(config: &SamplingConfig) -> Result<Self, BpfError> {
        if !privileges::can_use_bpf() {
            return Err(BpfError::MissingPrivilege {
                capabilities: CAPABILITIES,
                action: "load its BPF program and open perf events",
                source: None,
            });
        }
        if config.pids.len() > MAX_PID_FILTER as usize {
            return Err(BpfError::TooManyPids {
                count: config.pids.len(),
            });
        }
        privileges::raise_memlock_limit();

        let cpus = aya::util::online_cpus()
            .map_err(|(what, source)| BpfError::OnlineCpus { what, source })?;
        let ring_buffer_bytes = config
            .ring_buffer_bytes
            .unwrap_or_else(|| default_ring_buffer_bytes(cpus.len()));
        // Children are followed only of processes that were named.
        let follow = !config.pids.is_empty();
        let task_tgid_offset = match follow {
            true => follow::tgid_offset(),
            false => None,
        };
        let bpf_config =
            offcpu::with_pid_offset(bpf_config(config, ring_buffer_bytes, task_tgid_offset))?;
        let log_level = program_log::level();
        // Only with user stacks, which are what the mappings place.
        let exit_walk = config.user_stacks.then(exit_maps::prepare).flatten();
        let mut ebpf = load_object(&bpf_config, exit_walk, ring_buffer_bytes, log_level)?;

        if !config.pids.is_empty() {
            let mut filter: BpfHashMap<_, u32, u8> =
                BpfHashMap::try_from(ebpf.map_mut(names::PID_FILTER).ok_or(BpfError::Missing {
                    kind: "map",
                    name: names::PID_FILTER,
                })?)
                .map_err(|source| BpfError::Map {
                    name: names::PID_FILTER,
                    source,
                })?;
            for &pid in &config.pids {
                filter.insert(pid, 1, 0).map_err(|source| BpfError::Map {
                    name: names::PID_FILTER,
                    source,
                })?;
            }
        }

        let counters =
            PerCpuArray::try_from(ebpf.take_map(names::COUNTERS).ok_or(BpfError::Missing {
                kind: "map",
                name: names::COUNTERS,
            })?)
            .map_err(|source| BpfError::Map {
                name: names::COUNTERS,
                source,
            })?;

        let program_log = match log_level {
            0 => None,
            _ => Some(
                ProgramLog::start(&mut ebpf).map_err(|source| BpfError::ProgramLog { source })?,
            ),
        };

        let stats = run_time_stats();

        let mut sampler = Self {
            ebpf,
            counters,
            cpus,
            ring_buffer_bytes,
            stats,
            _program_log: program_log,
            children_not_followed: false,
            off_cpu: bpf_config.off_cpu_period_ns != 0,
            exit_maps: None,
        };
        // The exit walk before the exit event's program (see `exit_maps`).
        sampler.exit_maps = exit_maps::attach(&mut sampler.ebpf, exit_walk.is_some())?;
        // Process events first, so no exec is missed between the first
        // sample and the hooks being in place.
        sampler.attach_process_events()?;
        sampler.children_not_followed = match task_tgid_offset {
            Some(_) => !follow::attach(&mut sampler.ebpf),
            None => follow,
        };
        Ok(sampler)
    }

    /// True when processes were named (`--pid`, `record`'s command) but
    /// the processes they start are not profiled: the kernel's BTF did not
    /// say where a task's tgid is, or `follow_fork` could not be attached.
    pub fn children_not_followed(&self) -> bool {
        self.children_not_followed
    }

    /// Starts sampling every CPU, and following threads off the CPU when
    /// off-CPU profiling is on; until then only process events flow.
    pub fn start_sampling(&mut self, frequency_hz: u64) -> Result<(), BpfError> {
        self.attach_sampler(frequency_hz)?;
        if self.off_cpu {
            offcpu::attach(&mut self.ebpf)?;
        }
        Ok(())
    }

    /// Samples for `duration` as `config` says and returns the ring
    /// buffer's raw records, for captures and replays (the tools that
    /// write fixtures and benchmark the unwinder).
    pub fn record(config: &SamplingConfig, duration: Duration) -> Result<Vec<Vec<u8>>, BpfError> {
        let mut bpf = Self::load(config)?;
        let mut ring = bpf.take_ring_buffer()?;
        bpf.start_sampling(config.frequency_hz)?;
        let deadline = Instant::now() + duration;
        let mut records = Vec::new();
        while Instant::now() < deadline {
            while let Some(item) = ring.next() {
                records.push(item.to_vec());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        drop(bpf);
        while let Some(item) = ring.next() {
            records.push(item.to_vec());
        }
        Ok(records)
    }

    fn attach_process_events(&mut self) -> Result<(), BpfError> {
        for (name, tracepoint) in [
            (names::PROG_EXEC, "sched_process_exec"),
            (names::PROG_EXIT, "sched_process_exit"),
        ] {
            let program: &mut RawTracePoint = program_mut(&mut self.ebpf, name)?;
            load_logged(program, name, RawTracePoint::load, RawTracePoint::info)?;
            program
                .attach(tracepoint)
                .map_err(|source| program_error(name, source))?;
        }
        Ok(())
    }

    /// Loads the programs `sample_cpu` hands samples over to and puts them
    /// in its program array; without them it writes samples itself.
    fn load_tail_calls(&mut self) -> Result<(), BpfError> {
        let mut walkers = Vec::new();
        for name in names::PROG_WALKERS {
            let program: &mut PerfEvent = program_mut(&mut self.ebpf, name)?;
            load_logged(program, name, PerfEvent::load, PerfEvent::info)?;
            walkers.push(
                program
                    .fd()
                    .and_then(|fd| fd.try_clone().map_err(aya::programs::ProgramError::IOError))
                    .map_err(|source| program_error(name, source))?,
            );
        }
        let map_name = names::TAIL_CALLS;
        let mut calls =
            ProgramArray::try_from(self.ebpf.map_mut(map_name).ok_or(BpfError::Missing {
                kind: "map",
                name: map_name,
            })?)
            .map_err(|source| BpfError::Map {
                name: map_name,
                source,
            })?;
        // The walkers are in `InterpreterKind` order: each one's index.
        for (kind, walker) in (0u32..).zip(&walkers) {
            calls.set(kind, walker, 0).map_err(|source| BpfError::Map {
                name: map_name,
                source,
            })?;
        }
        Ok(())
    }

    fn attach_sampler(&mut self, frequency_hz: u64) -> Result<(), BpfError> {
        self.load_tail_calls()?;
        let name = names::PROG_SAMPLE;
        let program: &mut PerfEvent = program_mut(&mut self.ebpf, name)?;
        load_logged(program, name, PerfEvent::load, PerfEvent::info)?;
        for &cpu in &self.cpus {
            program
                .attach(
                    PerfEventConfig::Software(SoftwareEvent::CpuClock),
                    PerfEventScope::AllProcessesOneCpu { cpu },
                    SamplePolicy::Frequency(frequency_hz),
                    false,
                )
                .map_err(|source| {
                    if is_permission_denied(&source) {
                        BpfError::MissingPrivilege {
                            capabilities: "CAP_PERFMON",
                            action: "open perf events on every CPU",
                            source: None,
                        }
                    } else {
                        BpfError::AttachCpu { cpu, source }
                    }
                })?;
        }
        debug!(cpus = self.cpus.len(), frequency_hz, "sampler attached");
        Ok(())
    }

    /// Takes the ring buffer out, for the reader task to own.
    pub fn take_ring_buffer(&mut self) -> Result<RingBuf<MapData>, BpfError> {
        let map = self.ebpf.take_map(names::EVENTS).ok_or(BpfError::Missing {
            kind: "map",
            name: names::EVENTS,
        })?;
        RingBuf::try_from(map).map_err(|source| BpfError::Map {
            name: names::EVENTS,
            source,
        })
    }

    pub fn cpus(&self) -> &[u32] {
        &self.cpus
    }

    /// Whether the off-CPU programs are attached (`--off-cpu`).
    pub fn off_cpu(&self) -> bool {
        self.off_cpu
    }

    pub fn ring_buffer_bytes(&self) -> u32 {
        self.ring_buffer_bytes
    }

    pub fn counters(&self) -> BpfCounters {
        read_counters(&self.counters)
    }

    /// True when exiting processes' mappings are captured in the kernel.
    pub fn captures_exit_maps(&self) -> bool {
        self.exit_maps.is_some()
    }

    /// Totals of the exit walk's counters (zeros when it is off), by
    /// [`agent_common::MapsCounter`].
    pub fn exit_maps_counters(&self) -> [u64; agent_common::MapsCounter::COUNT as usize] {
        self.exit_maps
            .as_ref()
            .map(exit_maps::read_counters)
            .unwrap_or_default()
    }

    /// A reader of the counters and the sampler's run time for another
    /// thread, with file descriptors of its own so it never touches the
    /// sampling side.
    pub fn probe(&self) -> Result<BpfProbe, BpfError> {
        let map_error = |source| BpfError::Map {
            name: names::COUNTERS,
            source,
        };
        let map_fd = self
            .counters
            .map()
            .fd()
            .as_fd()
            .try_clone_to_owned()
            .map_err(|source| BpfError::Probe { source })?;
        let counters = PerCpuArray::try_from(Map::PerCpuArray(
            MapData::from_fd(map_fd).map_err(map_error)?,
        ))
        .map_err(map_error)?;
        let name = names::PROG_SAMPLE;
        let program: &PerfEvent = self
            .ebpf
            .program(name)
            .ok_or(BpfError::Missing {
                kind: "program",
                name,
            })?
            .try_into()
            .map_err(|source| BpfError::Program { name, source })?;
        let program = program
            .fd()
            .map_err(|source| BpfError::Program { name, source })?
            .as_fd()
            .try_clone_to_owned()
            .map_err(|source| BpfError::Probe { source })?;
        Ok(BpfProbe {
            counters,
            program,
            stats_held: self.stats.is_some(),
        })
    }

    /// Total run time of the sampling program since it was loaded, when the
    /// kernel keeps statistics.
    pub fn sampler_run_time(&self) -> Option<ProgramRunTime> {
        self.stats.as_ref()?;
        let program: &PerfEvent = self.ebpf.program(names::PROG_SAMPLE)?.try_into().ok()?;
        let info = program.info().ok()?;
        Some(ProgramRunTime {
            run_time_ns: u64::try_from(info.run_time().as_nanos()).unwrap_or(u64::MAX),
            run_count: info.run_count(),
        })
    }
}

/// One scratch slot per possible CPU (the BPF program indexes them by CPU
/// number).
fn scratch_slots() -> u32 {
    aya::util::nr_cpus()
        .ok()
        .and_then(|cpus| u32::try_from(cpus).ok())
        .unwrap_or(MAX_CPUS_FALLBACK)
}

/// Loads the object with its settings written in; the programs are not
/// loaded into the kernel yet, only the maps are created.
fn load_object(
    bpf_config: &BpfConfig,
    exit_walk: Option<(agent_common::MapsConfig, [u32; 6])>,
    ring_buffer_bytes: u32,
    log_level: u8,
) -> Result<Ebpf, BpfError> {
    let mut loader = EbpfLoader::new();
    loader
        // The object carries no BTF relocations: no kernel BTF is read or
        // parsed for it (third_party/aya parses it in `load`, and only for
        // an object that needs it; aya 0.14 parsed it in `new`, 11-18 ms).
        .btf(None)
        .override_global(names::CONFIG, bpf_config, true)
        // Always written: the object's default level logs everything.
        .override_global(aya_log::LEVEL, &log_level, true)
        .map_max_entries(names::EVENTS, ring_buffer_bytes)
        .map_max_entries(names::SCRATCH, scratch_slots());
    let object = match &exit_walk {
        Some((maps, ids)) => {
            loader.override_global(names::MAPS_CONFIG, maps, true);
            exit_maps::patch(OBJECT, *ids)
        }
        None => std::borrow::Cow::Borrowed(OBJECT),
    };
    // Off-CPU samples' own scratch slots, only when they are taken.
    if bpf_config.off_cpu_period_ns != 0 {
        loader.map_max_entries(names::OFFCPU_SCRATCH, scratch_slots());
    }
    if log_level == 0 {
        loader.map_max_entries(program_log::LOG_MAP, program_log::map_bytes_when_off());
    }
    loader.load(&object).map_err(|source| match source {
        aya::EbpfError::MapError(aya::maps::MapError::CreateError { ref io_error, .. })
            if privileges::is_permission_error(io_error) =>
        {
            BpfError::MissingPrivilege {
                capabilities: CAPABILITIES,
                action: "create BPF maps",
                source: Some(io::Error::from_raw_os_error(
                    io_error.raw_os_error().unwrap_or(libc::EPERM),
                )),
            }
        }
        source => BpfError::Load { source },
    })
}

/// The program `name` as its concrete type.
fn program_mut<'a, P>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut P, BpfError>
where
    &'a mut P: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    ebpf.program_mut(name)
        .ok_or(BpfError::Missing {
            kind: "program",
            name,
        })?
        .try_into()
        .map_err(|source| BpfError::Program { name, source })
}

/// What the BPF program is told before it is loaded; `task_tgid_offset`
/// when the children of the named processes are followed.
fn bpf_config(
    config: &SamplingConfig,
    ring_buffer_bytes: u32,
    task_tgid_offset: Option<u32>,
) -> BpfConfig {
    let (stack_copy_bytes, exec_copy_bytes) = match config.unwind {
        _ if !config.user_stacks => (0, 0),
        UnwindMode::FramePointers => (config.leaf_stack_copy_bytes, 0),
        UnwindMode::Dwarf => (config.stack_copy_bytes, 0),
        // Undecided processes get the full copy; the daemon writes the
        // decided ones' sizes into UNWIND_COPY.
        UnwindMode::Auto => (config.stack_copy_bytes, config.stack_copy_bytes),
    };
    let mut stacks_off = 0;
    if !config.kernel_stacks {
        stacks_off |= agent_common::stacks_off::KERNEL;
    }
    if !config.user_stacks {
        stacks_off |= agent_common::stacks_off::USER;
    }
    BpfConfig {
        filter_pids: u32::from(!config.pids.is_empty()),
        stack_copy_bytes,
        exec_copy_bytes,
        stacks_off,
        task_tgid_offset: task_tgid_offset.unwrap_or(0),
        task_pid_offset: 0,
        // Wake the reader at an eighth full; it drains on a timer too.
        wakeup_bytes: u64::from(ring_buffer_bytes / 8),
        off_cpu_period_ns: config.off_cpu_period.map_or(0, offcpu::period_ns),
    }
}

/// 1 MiB per CPU, at least 2 MiB: records are sized to their stacks (a
/// frame-pointer sample takes about 1.5 KiB), and the ring's pages count
/// twice in firn's RSS (the kernel maps them twice, so records may wrap).
fn default_ring_buffer_bytes(cpus: usize) -> u32 {
    let wanted = (cpus.max(1) as u64) << 20;
    let bytes = wanted.clamp(2 << 20, 256 << 20).next_power_of_two();
    u32::try_from(bytes).unwrap_or(256 << 20)
}

fn is_permission_denied(error: &aya::programs::ProgramError) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(current) = source {
        if let Some(io) = current.downcast_ref::<io::Error>()
            && privileges::is_permission_error(io)
        {
            return true;
        }
        source = current.source();
    }
    false
}

/// Loads `program` into the kernel, logging how long the kernel took to
/// check it and how much it looked at: verification is most of firn's
/// start-up.
fn load_logged<P>(
    program: &mut P,
    name: &'static str,
    load: impl FnOnce(&mut P) -> Result<(), aya::programs::ProgramError>,
    info: impl FnOnce(&P) -> Result<aya::programs::ProgramInfo, aya::programs::ProgramError>,
) -> Result<(), BpfError> {
    let started = Instant::now();
    load(program).map_err(|source| program_error(name, source))?;
    let verified_instructions = info(program)
        .ok()
        .and_then(|info| info.verified_instruction_count());
    debug!(
        program = name,
        load_ms = started.elapsed().as_secs_f64() * 1e3,
        verified_instructions,
        "BPF program loaded"
    );
    Ok(())
}

fn program_error(name: &'static str, source: aya::programs::ProgramError) -> BpfError {
    if is_permission_denied(&source) {
        BpfError::MissingPrivilege {
            capabilities: CAPABILITIES,
            action: "load its BPF programs",
            source: None,
        }
    } else {
        BpfError::Program { name, source }
    }
}

#[cfg(test)]
mod tests;
