//! An aggregated interval -> the profiles an exporter takes: built,
//! checked against Parca's rules, gzipped, cut per process when the
//! exporter pushes series.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::Arc,
};

use tracing::error;

use super::{Grouping, ProfileBatch, SeriesProfile};
use crate::{
    aggregate::{AggregatedProfile, StackKey},
    labels::{LabelSet, Labeler, ProcessMetadata},
    pprof::{BuildSummary, build_labelled_profile, encode_gzip, proto, validate},
    process::{ObjectFile, ProcessImage},
    stats::Stats,
    symbolize::FrameSymbolizer,
};

const KERNEL_MAPPING: &str = "[kernel.kallsyms]";

/// A process image as sampled under one metadata read.
type ProcessKey = (*const ProcessImage, *const ProcessMetadata);

fn process_key(key: &StackKey) -> ProcessKey {
    (Arc::as_ptr(&key.image.0), Arc::as_ptr(&key.metadata.0))
}

/// Labels every process of the interval once, and leaves out the stacks of
/// processes relabeling dropped (their samples are counted).
fn label_processes(
    mut aggregated: AggregatedProfile,
    labeler: &Labeler,
    stats: &Stats,
) -> (AggregatedProfile, HashMap<ProcessKey, Arc<LabelSet>>) {
    let mut labels: HashMap<ProcessKey, Option<Arc<LabelSet>>> = HashMap::new();
    let mut dropped = 0;
    aggregated.stacks.retain(|(key, count)| {
        let kept = labels
            .entry(process_key(key))
            .or_insert_with(|| labeler.labels(&key.image.0, &key.metadata.0).map(Arc::new))
            .is_some();
        if !kept {
            dropped += count;
        }
        kept
    });
    aggregated.samples = aggregated.samples.saturating_sub(dropped);
    Stats::add(&stats.samples_dropped_relabel, dropped);
    let labels = labels
        .into_iter()
        .filter_map(|(key, set)| Some((key, set?)))
        .collect();
    (aggregated, labels)
}

/// One profile for the whole interval, each sample labelled with its
/// process's labels (`firn record`, the local store).
pub fn build_whole_profile(
    aggregated: AggregatedProfile,
    period_ns: i64,
    labeler: &Labeler,
    symbolizer: &mut dyn FrameSymbolizer,
    stats: &Stats,
) -> (proto::Profile, BuildSummary, AggregatedProfile) {
    let (aggregated, labels) = label_processes(aggregated, labeler, stats);
    let sample_labels = |key: &StackKey, emit: &mut dyn FnMut(&str, &str)| {
        if let Some(set) = labels.get(&process_key(key)) {
            for (name, value) in set.iter() {
                emit(name, value);
            }
        }
    };
    let (profile, summary) =
        build_labelled_profile(&aggregated, period_ns, &sample_labels, symbolizer, stats);
    (profile, summary, aggregated)
}

/// Builds the batch of one interval. A profile that breaks the pprof rules
/// (a bug in firn) is dropped, counted and logged; the rest still go.
pub fn build_batch(
    aggregated: AggregatedProfile,
    grouping: Grouping,
    period_ns: i64,
    labeler: &Labeler,
    symbolizer: &mut dyn FrameSymbolizer,
    stats: &Stats,
) -> (ProfileBatch, BuildSummary) {
    let start = aggregated.start;
    let built = match grouping {
        Grouping::Whole => {
            let (profile, summary, group) =
                build_whole_profile(aggregated, period_ns, labeler, symbolizer, stats);
            vec![(Vec::new(), profile, summary, group)]
        }
        Grouping::PerProcess => {
            let (aggregated, labels) = label_processes(aggregated, labeler, stats);
            // Series labels only: the samples keep just `thread_id`.
            let no_labels = |_: &StackKey, _: &mut dyn FnMut(&str, &str)| {};
            split_by_labels(aggregated, &labels)
                .into_iter()
                .map(|(labels, group)| {
                    let (profile, summary) =
                        build_labelled_profile(&group, period_ns, &no_labels, symbolizer, stats);
                    (labels, profile, summary, group)
                })
                .collect()
        }
    };
    let mut batch = ProfileBatch {
        start,
        profiles: Vec::with_capacity(built.len()),
        debuginfo_candidates: Vec::new(),
        unsymbolized_objects: 0,
    };
    let mut total = BuildSummary::default();
    let mut seen_objects = HashSet::new();
    for (labels, profile, summary, group) in built {
        add_summary(&mut total, &summary);
        if let Err(error) = validate(&profile) {
            Stats::inc(&stats.profiles_dropped);
            error!(%error, ?labels, "profile dropped: it breaks the pprof rules (a bug in firn)");
            continue;
        }
        // Objects with unnamed frames first: the server needs those most.
        for object in unsymbolized_objects(&profile, &group.stacks) {
            if let Some(build_id) = object.build_id()
                && seen_objects.insert(build_id.clone())
            {
                batch.unsymbolized_objects += 1;
                batch.debuginfo_candidates.push(object);
            }
        }
        // Then every other object: the server may want it too (it answers
        // ShouldInitiateUpload), as Parca Agent offers all of them.
        for object in sampled_objects(&group.stacks) {
            if let Some(build_id) = object.build_id()
                && seen_objects.insert(build_id.clone())
            {
                batch.debuginfo_candidates.push(object);
            }
        }
        batch.profiles.push(SeriesProfile {
            labels,
            gzipped: encode_gzip(&profile),
            samples: summary.samples,
        });
    }
    (batch, total)
}

/// One group per label set: the series Parca keeps apart. Processes that
/// relabeling left with equal labels share a series.
fn split_by_labels(
    aggregated: AggregatedProfile,
    labels: &HashMap<ProcessKey, Arc<LabelSet>>,
) -> Vec<(Vec<(String, String)>, AggregatedProfile)> {
    let mut groups: BTreeMap<Arc<LabelSet>, Vec<(StackKey, u64)>> = BTreeMap::new();
    for (key, count) in aggregated.stacks {
        if let Some(set) = labels.get(&process_key(&key)) {
            groups.entry(set.clone()).or_default().push((key, count));
        }
    }
    groups
        .into_iter()
        .map(|(set, stacks)| {
            let samples = stacks.iter().map(|(_, count)| count).sum();
            let labels = set
                .iter()
                .map(|(name, value)| (name.clone(), value.clone()))
                .collect();
            let group = AggregatedProfile {
                start: aggregated.start,
                duration: aggregated.duration,
                samples,
                dropped: 0,
                stacks,
            };
            (labels, group)
        })
        .collect()
}

/// The objects behind `stacks` whose frames the profile holds without a
/// name but with a build id: what a server could symbolize given their
/// debug information. The kernel is not among them.
pub fn unsymbolized_objects(
    profile: &proto::Profile,
    stacks: &[(StackKey, u64)],
) -> Vec<Arc<ObjectFile>> {
    let string = |index: i64| {
        usize::try_from(index)
            .ok()
            .and_then(|i| profile.string_table.get(i))
            .map_or("", String::as_str)
    };
    let mut wanted: HashSet<&str> = profile
        .location
        .iter()
        .filter(|location| location.line.is_empty() && location.mapping_id != 0)
        .filter_map(|location| {
            profile
                .mapping
                .get(usize::try_from(location.mapping_id - 1).ok()?)
        })
        .filter(|mapping| string(mapping.filename) != KERNEL_MAPPING)
        .map(|mapping| string(mapping.build_id))
        .filter(|build_id| !build_id.is_empty())
        .collect();
    let mut objects = Vec::new();
    for (key, _) in stacks {
        if wanted.is_empty() {
            break;
        }
        let image = &key.image.0;
        for &address in key.user.iter() {
            let Some(object) = image
                .mapping_index(address)
                .and_then(|index| image.mappings[index].object())
            else {
                continue;
            };
            let Some(build_id) = object.build_id().map(|id| id.to_hex()) else {
                continue;
            };
            if wanted.remove(build_id.as_str()) {
                objects.push(object.clone());
            }
        }
    }
    objects
}

/// Every object with a build id that `stacks` have user frames in.
fn sampled_objects(stacks: &[(StackKey, u64)]) -> Vec<Arc<ObjectFile>> {
    let mut seen = HashSet::new();
    let mut objects = Vec::new();
    for (key, _) in stacks {
        let image = &key.image.0;
        for &address in key.user.iter() {
            let Some(object) = image
                .mapping_index(address)
                .and_then(|index| image.mappings[index].object())
            else {
                continue;
            };
            if let Some(build_id) = object.build_id()
                && seen.insert(build_id.clone())
            {
                objects.push(object.clone());
            }
        }
    }
    objects
}

fn add_summary(total: &mut BuildSummary, part: &BuildSummary) {
    total.samples += part.samples;
    total.locations += part.locations;
    total.functions += part.functions;
    total.mappings += part.mappings;
    total.unknown_user_locations += part.unknown_user_locations;
    total.unsymbolized_user_locations += part.unsymbolized_user_locations;
    total.unsymbolized_kernel_locations += part.unsymbolized_kernel_locations;
}

#[cfg(test)]
mod tests {
    use std::{
        path::PathBuf,
        time::{Duration, SystemTime},
    };

    use agent_elf::BuildId;

    use super::*;
    use crate::{
        aggregate::{ImageRef, MetadataRef},
        config::{Limits, MetadataConfig},
        labels::{MetadataLimits, MetadataReader, Rule, relabel::RuleSpec},
        pprof::{decode, sample_label},
        process::ProcessTable,
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
            &Limits::default(),
            &[],
            stats.clone(),
        );
        let mut reader =
            MetadataReader::new(PathBuf::from("/proc"), &MetadataLimits::default(), stats);
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
            kernel: vec![0xffff_ffff_8100_0000].into(),
            user: vec![address].into(),
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
            },
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
        crate::pprof::validate(&profile).expect("Parca's rules");
        for sample in &profile.sample {
            assert_eq!(
                sample_label(&profile, sample, "pid"),
                None,
                "lifted to the series"
            );
            assert_eq!(sample_label(&profile, sample, "comm"), None);
        }
        let threads: Vec<_> = profile
            .sample
            .iter()
            .filter_map(|s| sample_label(&profile, s, "thread_id"))
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
        crate::pprof::validate(&profile).expect("Parca's rules");
        let pids: HashSet<_> = profile
            .sample
            .iter()
            .filter_map(|s| sample_label(&profile, s, "pid"))
            .collect();
        assert_eq!(pids.len(), 2);
        for sample in &profile.sample {
            assert_eq!(sample_label(&profile, sample, "node"), Some("node-a"));
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
            profile
                .sample
                .iter()
                .all(|s| sample_label(&profile, s, "comm") != Some("other"))
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
}
