use super::*;
use agent_symbolize::SymbolConfig;

use crate::{
    host::Host,
    labels::{Labeler, MetadataConfig},
    output::build_whole_profile,
    sampler::RawSample,
    symbolize::HostSymbolizer,
};

/// A sample of a process that exited before firn read its maps: the
/// frames stay, as unknown addresses, and the loss is counted.
#[test]
fn vanished_process_yields_unknown_frames_not_a_crash() {
    let stats = Arc::new(Stats::default());
    let mut pipeline = Pipeline::new(&PipelineConfig::default(), stats.clone());
    // Beyond pid_max: no such process can exist.
    let ghost = 4_194_305;
    pipeline.sample(RawSample {
        tgid: ghost,
        tid: ghost,
        comm: "ghost".into(),
        user_stack: vec![0x5555_0000_1000, 0x5555_0000_2000],
        ..RawSample::default()
    });
    let aggregated = pipeline.take_profile();
    assert_eq!(aggregated.samples, 1);
    let mut symbolizer =
        HostSymbolizer::new(&Host::system(), &SymbolConfig::default(), stats.clone());
    let metadata = MetadataConfig {
        node: "node".into(),
        external_labels: Vec::new(),
        relabel_rules: Vec::new(),
        kubernetes: None,
        runtime_sockets: Vec::new(),
    };
    let labeler = Labeler::new(&metadata, &Host::system(), None);
    let (profile, summary) =
        build_whole_profile(aggregated, 10_000_000, &labeler, &mut symbolizer, &stats);
    assert_eq!(summary.unknown_user_locations, 2);
    let names = agent_pprof::Reader::new(&profile)
        .samples()
        .next()
        .map(|sample| sample.function_names())
        .unwrap_or_default();
    assert_eq!(names, ["0x555500001000", "0x555500002000"]);
    let snapshot = stats.snapshot();
    assert_eq!(snapshot.processes_gone, 1);
    assert_eq!(snapshot.user_frames_unknown, 2);
}

#[test]
fn a_drain_pass_yields_even_when_records_never_stop() {
    // Slow records arriving faster than they are handled: the pass must
    // end after its slice and report what is left.
    // Sleeps only ever run long (a loaded machine), so: at most 7
    // batches of at least 5 ms fit before the 30 ms check stops it, and
    // it never stops before its slice is used.
    let mut batches = 0;
    let started = Instant::now();
    let pending = drain_for(Duration::from_millis(30), |limit| {
        batches += 1;
        std::thread::sleep(Duration::from_millis(5));
        limit
    });
    assert!(pending);
    assert!(started.elapsed() >= Duration::from_millis(30));
    assert!(
        (1..=7).contains(&batches),
        "{batches} batches in a 30 ms slice"
    );
    let mut calls = 0;
    let pending = drain_for(Duration::from_secs(60), |limit| {
        calls += 1;
        if calls < 3 { limit } else { 7 }
    });
    assert!(!pending, "a short batch means the ring is empty");
    assert_eq!(calls, 3);
}

/// Code mapped after firn read the process's maps (a dlopen): the
/// unwind that runs into it has the maps read again and starts over.
#[test]
fn an_unmapped_address_has_the_maps_read_again_once() {
    use agent_common::UserRegs;

    let stats = Arc::new(Stats::default());
    let policy = UnwindPolicy::new(UnwindMode::Dwarf, 16384, 8, stats.clone());
    let mut pipeline = Pipeline::new(&PipelineConfig::default(), stats.clone()).with_unwind(policy);
    let pid = std::process::id();
    let before = pipeline.processes.image(pid, "test");
    let code = memmap2::MmapMut::map_anon(4096)
        .and_then(|map| map.make_exec())
        .expect("executable memory");
    let ip = code.as_ptr() as u64 + 16;
    assert!(before.mapping_index(ip).is_none());
    // Maps are read again at most once a second.
    std::thread::sleep(Duration::from_millis(1100));
    let sample = RawSample {
        tgid: pid,
        tid: pid,
        user_regs: Some(UserRegs {
            ip,
            sp: 0x7ffd_0000,
            bp: 0,
        }),
        stack_copy: &[0; 64],
        ..RawSample::default()
    };
    pipeline.sample(sample.clone());
    let snapshot = stats.snapshot();
    assert_eq!(snapshot.maps_refreshed, 1);
    // Over the fresh maps the address is code without CFI, not unmapped.
    assert_eq!(
        (
            snapshot.unwind_failed_no_cfi,
            snapshot.unwind_failed_unmapped
        ),
        (1, 0)
    );
    let after = pipeline
        .processes
        .lookup(pid)
        .expect("the process is known");
    assert!(after.mapping_index(ip).is_some());

    // Nowhere mapped: read again only once the second has passed.
    let nowhere = RawSample {
        user_regs: Some(UserRegs {
            ip: 16,
            ..sample.user_regs.expect("registers")
        }),
        ..sample
    };
    pipeline.sample(nowhere);
    let snapshot = stats.snapshot();
    assert_eq!(
        (snapshot.maps_refreshed, snapshot.unwind_failed_unmapped),
        (1, 1)
    );
    drop(code);
}

#[test]
fn malformed_records_are_counted() {
    let stats = Arc::new(Stats::default());
    let mut pipeline = Pipeline::new(&PipelineConfig::default(), stats.clone());
    pipeline.handle(&[1, 0, 0, 0, 9]);
    pipeline.handle(&[]);
    assert_eq!(stats.snapshot().records_malformed, 2);
    assert_eq!(pipeline.take_profile().samples, 0);
}

/// A runtime that counts its looks at processes, and claims them or not.
struct Counting {
    looks: Arc<std::sync::atomic::AtomicUsize>,
    seen: std::collections::HashSet<u32>,
    claims: bool,
}

impl crate::runtimes::RuntimeSupport for Counting {
    fn runtime(&self) -> crate::runtimes::Runtime {
        crate::runtimes::Runtime::Python
    }

    fn observe(
        &mut self,
        image: &Arc<crate::process::ProcessImage>,
        _: &mut crate::process::ProcessTable,
    ) {
        self.looks
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.seen.insert(image.tgid);
    }

    fn forget(&mut self, tgid: u32) {
        self.seen.remove(&tgid);
    }

    fn passed_over(&self, tgid: u32) -> bool {
        !self.claims && self.seen.contains(&tgid)
    }

    fn splice(&mut self, _: &RawSample, native: Vec<u64>) -> crate::runtimes::Spliced {
        crate::runtimes::Spliced::NotMine(native)
    }
}

/// A pipeline with only a [`Counting`] runtime, counting into `looks`.
fn counting_pipeline(claims: bool, looks: Arc<std::sync::atomic::AtomicUsize>) -> Pipeline {
    let stats = Arc::new(Stats::default());
    Pipeline::new(&PipelineConfig::default(), stats).with_runtime(Box::new(Counting {
        looks,
        seen: Default::default(),
        claims,
    }))
}

/// A sample of this test process with `code` as its one user frame.
fn own_sample(code: u64) -> RawSample<'static> {
    let pid = std::process::id();
    RawSample {
        tgid: pid,
        tid: pid,
        comm: "test".into(),
        user_stack: vec![code],
        ..RawSample::default()
    }
}

/// A process every runtime passed over costs them no look at its later
/// samples; one a runtime keeps is looked at each time, as before.
#[test]
fn runtimes_look_again_only_at_processes_not_passed_over() {
    let code = runtimes_look_again_only_at_processes_not_passed_over as *const () as usize as u64;
    for (claims, expected) in [(false, 1), (true, 3)] {
        let looks = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut pipeline = counting_pipeline(claims, looks.clone());
        for _ in 0..3 {
            pipeline.sample(own_sample(code));
        }
        let looked = looks.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(looked, expected, "claims: {claims}");
        assert_eq!(pipeline.take_profile().samples, 3);
    }
}

/// A sample of a process a runtime names keeps the drain prompt for a
/// while; samples of processes every runtime passed over do not.
#[test]
fn only_runtime_samples_keep_the_drain_prompt() {
    let code = only_runtime_samples_keep_the_drain_prompt as *const () as usize as u64;
    for claims in [false, true] {
        let mut pipeline = counting_pipeline(claims, Default::default());
        let sampled_at = Instant::now();
        for _ in 0..2 {
            pipeline.sample(own_sample(code));
        }
        // Past the start's prompt window, within the sample's.
        let later = sampled_at + pipeline::PROMPT_AFTER_RUNTIME_SAMPLE;
        assert_eq!(
            pipeline.wants_prompt_drain(later),
            claims,
            "claims: {claims}"
        );
    }
}

/// A kernel thread's samples (no user frames) give a runtime nothing to
/// look at or name: they neither cost the runtimes a look nor keep the
/// drain prompt (an otherwise quiet host's kernel threads would wake firn
/// ten times a second).
#[test]
fn kernel_thread_samples_leave_the_drain_quiet() {
    let looks = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // Even a runtime that would claim every process it looks at.
    let mut pipeline = counting_pipeline(true, looks.clone());
    let sampled_at = Instant::now();
    for _ in 0..3 {
        pipeline.sample(RawSample {
            tgid: 2,
            tid: 2,
            comm: "kthreadd".into(),
            kernel_stack: vec![0xffff_ffff_8100_0000],
            ..RawSample::default()
        });
    }
    let later = sampled_at + pipeline::PROMPT_AFTER_RUNTIME_SAMPLE;
    assert!(!pipeline.wants_prompt_drain(later));
    assert_eq!(looks.load(std::sync::atomic::Ordering::Relaxed), 0);
    assert_eq!(pipeline.take_profile().samples, 3);
}
