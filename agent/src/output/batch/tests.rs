use std::{
    path::PathBuf,
    time::{Duration, SystemTime},
};

use agent_elf::BuildId;

use agent_pprof::{Reader, decode};

use super::*;
use crate::{
    aggregate::{ImageRef, MetadataRef, StackKey},
    host::Host,
    labels::{
        MetadataConfig, MetadataLimits, MetadataReader, ProcessMetadata, Rule, relabel::RuleSpec,
    },
    process::{DebugFileConfig, ProcessImage, ProcessTable, ProcessTableConfig},
    symbolize::{Line, ObjectSource, PerfMapSource},
};

/// Names kernel frames only: every user frame stays unsymbolized.
struct KernelOnly;

impl FrameSymbolizer for KernelOnly {
    fn kernel(&mut self, address: u64) -> Option<Line> {
        Some(Line::named(&format!("k{address:x}")))
    }

    fn user(&mut self, _object: &dyn ObjectSource, _vaddr: u64) -> Vec<Line> {
        Vec::new()
    }

    fn jit(&mut self, _perf_map: &dyn PerfMapSource, _address: u64) -> Option<Line> {
        None
    }

    fn kernel_build_id(&self) -> Option<&BuildId> {
        None
    }
}

/// An address in this test's own executable.
fn own_code() {}

fn stacks_of_two_processes() -> (ProcessTable, Vec<(StackKey, u64)>) {
    // This test's own process, with real mappings, objects and /proc
    // metadata.
    let stats = Arc::new(Stats::default());
    let mut table = ProcessTable::new(
        PathBuf::from("/proc"),
        &ProcessTableConfig::default(),
        &DebugFileConfig {
            directories: Vec::new(),
        },
        stats.clone(),
    );
    let mut reader = MetadataReader::new(&Host::system(), &MetadataLimits::default(), stats);
    let code: fn() = own_code;
    let address = code as usize as u64;
    let own = table.image_covering(std::process::id(), "batch-test", address);
    let index = own.mapping_index(address).expect("own code is mapped");
    table.object(&own, index).expect("own executable opens");
    let own_metadata = reader.get(own.tgid, 1).0;
    let other = Arc::new(ProcessImage::new(99, "other".into(), Vec::new()));
    let other_metadata = Arc::new(ProcessMetadata::unknown(99));
    let key = |image: &Arc<ProcessImage>, metadata: &Arc<ProcessMetadata>, tid| StackKey {
        image: ImageRef(image.clone()),
        metadata: MetadataRef(metadata.clone()),
        tid,
        thread_name: None,
        kernel: vec![0xffff_ffff_8100_0000].into(),
        user: vec![crate::runtimes::UserFrame::Native(address)].into(),
        reason: None,
    };
    let stacks = vec![
        (key(&own, &own_metadata, own.tgid), 3),
        (key(&own, &own_metadata, own.tgid + 1), 2),
        (key(&other, &other_metadata, 99), 4),
    ];
    (table, stacks)
}

fn aggregated(stacks: Vec<(StackKey, u64)>) -> AggregatedProfile {
    AggregatedProfile {
        start: SystemTime::now(),
        duration: Duration::from_secs(10),
        samples: stacks.iter().map(|(_, count)| count).sum(),
        dropped: 0,
        stacks,
    }
}

/// The whole tail: symbolize -> label -> build.
fn build_batch(
    aggregated: AggregatedProfile,
    grouping: Grouping,
    period_ns: i64,
    labeler: &Labeler,
    symbolizer: &mut dyn FrameSymbolizer,
    stats: &Stats,
) -> (ProfileBatch, BuildSummary) {
    let mut cache = FrameCache::new(1 << 20, Arc::new(Stats::default()));
    let symbolized = symbolize_interval(aggregated, symbolizer, &mut cache);
    let labelled = label_interval(symbolized, grouping, labeler, stats);
    super::build_batch(labelled, period_ns, stats)
}

fn labeler(rules: &[RuleSpec]) -> Labeler {
    Labeler::new(
        &MetadataConfig {
            node: "node-a".into(),
            external_labels: vec![("suite".into(), "batch".into())],
            relabel_rules: rules
                .iter()
                .map(|spec| Rule::new(spec).expect("valid"))
                .collect(),
            kubernetes: None,
            runtime_sockets: Vec::new(),
        },
        &crate::host::Host::system(),
        None,
    )
}

fn label<'a>(labels: &'a [(String, String)], name: &str) -> Option<&'a str> {
    labels
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

#[test]
fn per_process_profiles_carry_the_process_labels_as_series_labels() {
    let (_table, stacks) = stacks_of_two_processes();
    let own = std::process::id().to_string();
    let stats = Stats::default();
    let (batch, summary) = build_batch(
        aggregated(stacks),
        Grouping::PerProcess,
        10_000_000,
        &labeler(&[]),
        &mut KernelOnly,
        &stats,
    );
    assert_eq!(summary.samples, 9);
    assert_eq!(batch.profiles.len(), 2);
    let comm = std::fs::read_to_string("/proc/self/comm").expect("own comm");
    let mine = batch
        .profiles
        .iter()
        .find(|p| label(&p.labels, "pid") == Some(own.as_str()))
        .expect("own profile");
    let labels = &mine.labels;
    assert_eq!(label(labels, "comm"), Some(comm.trim()));
    assert_eq!(label(labels, "node"), Some("node-a"));
    assert_eq!(label(labels, "suite"), Some("batch"));
    let exe = std::env::current_exe().expect("own path");
    assert_eq!(
        label(labels, "executable"),
        exe.file_name().and_then(|n| n.to_str())
    );
    assert!(label(labels, "cgroup").is_some_and(|p| p.starts_with('/')));
    assert!(label(labels, "kernel_release").is_some());
    let mut names: Vec<&str> = labels.iter().map(|(n, _)| n.as_str()).collect();
    let count = names.len();
    names.dedup();
    assert_eq!(names.len(), count, "no duplicate label names");
    assert!(
        names
            .iter()
            .all(|n| crate::labels::relabel::is_valid_name(n))
    );
    assert!(names.iter().all(|n| !n.starts_with("__")));

    assert_eq!(mine.samples, 5);
    let profile = decode(&mine.gzipped).expect("gzipped pprof");
    validate(&profile).expect("Parca's rules");
    let reader = Reader::new(&profile);
    for sample in reader.samples() {
        assert_eq!(sample.label("pid"), None, "lifted to the series");
        assert_eq!(sample.label("comm"), None);
    }
    let threads: Vec<_> = reader
        .samples()
        .filter_map(|s| s.label("thread_id"))
        .collect();
    assert_eq!(threads.len(), 1, "other threads keep their label");

    // Only the object that has a build id and unnamed frames is offered;
    // the process without objects has none to offer.
    assert_eq!(batch.unsymbolized_objects, 1);
    let object = &batch.debuginfo_candidates[0];
    assert!(object.build_id().is_some());
    assert_eq!(
        std::fs::canonicalize(&object.path).ok(),
        std::fs::canonicalize(exe).ok()
    );
}

#[test]
fn the_whole_interval_is_one_profile_with_sample_labels() {
    let (_table, stacks) = stacks_of_two_processes();
    let stats = Stats::default();
    let (batch, _) = build_batch(
        aggregated(stacks),
        Grouping::Whole,
        10_000_000,
        &labeler(&[]),
        &mut KernelOnly,
        &stats,
    );
    assert_eq!(batch.profiles.len(), 1);
    assert!(batch.profiles[0].labels.is_empty());
    let profile = decode(&batch.profiles[0].gzipped).expect("gzipped pprof");
    validate(&profile).expect("Parca's rules");
    let reader = Reader::new(&profile);
    let pids: HashSet<_> = reader.samples().filter_map(|s| s.label("pid")).collect();
    assert_eq!(pids.len(), 2);
    for sample in reader.samples() {
        assert_eq!(sample.label("node"), Some("node-a"));
    }
}

#[test]
fn thread_labels_name_every_thread_when_asked() {
    let (_table, mut stacks) = stacks_of_two_processes();
    for (key, _) in &mut stacks {
        key.thread_name = Some(crate::aggregate::ThreadName::Comm(
            crate::sampler::Comm::from(format!("worker-{}", key.tid).as_str()),
        ));
    }
    let stats = Stats::default();
    let (batch, _) = build_batch(
        aggregated(stacks),
        Grouping::PerProcess,
        10_000_000,
        &labeler(&[]),
        &mut KernelOnly,
        &stats,
    );
    for series in &batch.profiles {
        let profile = decode(&series.gzipped).expect("gzipped pprof");
        for sample in Reader::new(&profile).samples() {
            let tid = sample.label("thread_id").expect("every thread has its id");
            assert_eq!(
                sample.label("thread_name"),
                Some(format!("worker-{tid}").as_str())
            );
        }
        assert!(
            series
                .labels
                .iter()
                .all(|(name, _)| !name.starts_with("thread_"))
        );
    }
}

#[test]
fn relabeling_drops_and_merges_processes() {
    let (_table, stacks) = stacks_of_two_processes();
    let stats = Stats::default();
    let drop_other = RuleSpec {
        source_labels: vec!["comm".into()],
        regex: Some("other".into()),
        action: Some("drop".into()),
        ..RuleSpec::default()
    };
    let (batch, summary) = build_batch(
        aggregated(stacks.clone()),
        Grouping::PerProcess,
        10_000_000,
        &labeler(std::slice::from_ref(&drop_other)),
        &mut KernelOnly,
        &stats,
    );
    assert_eq!(batch.profiles.len(), 1);
    assert_eq!(summary.samples, 5);
    assert_eq!(stats.snapshot().samples_dropped_relabel, 4);
    let (batch, _) = build_batch(
        aggregated(stacks.clone()),
        Grouping::Whole,
        10_000_000,
        &labeler(&[drop_other]),
        &mut KernelOnly,
        &stats,
    );
    let profile = decode(&batch.profiles[0].gzipped).expect("gzipped pprof");
    assert!(
        Reader::new(&profile)
            .samples()
            .all(|s| s.label("comm") != Some("other"))
    );

    // Without pid, comm and the rest, both processes are one series.
    let keep_node = RuleSpec {
        action: Some("labelkeep".into()),
        regex: Some("node".into()),
        ..RuleSpec::default()
    };
    let (batch, _) = build_batch(
        aggregated(stacks),
        Grouping::PerProcess,
        10_000_000,
        &labeler(&[keep_node]),
        &mut KernelOnly,
        &stats,
    );
    assert_eq!(batch.profiles.len(), 1);
    assert_eq!(
        batch.profiles[0].labels,
        [("node".to_owned(), "node-a".to_owned())]
    );
    assert_eq!(batch.profiles[0].samples, 9);
}
