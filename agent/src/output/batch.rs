//! An aggregated interval -> the profiles an exporter takes: built,
//! checked against Parca's rules, gzipped, cut per process when the
//! exporter pushes series.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use tracing::error;

use super::{Grouping, ProfileBatch, SeriesProfile};
use crate::{
    aggregate::{AggregatedProfile, StackKey},
    pprof::{BuildSummary, build_profile, encode_gzip, proto, validate},
    process::ObjectFile,
    stats::Stats,
    symbolize::FrameSymbolizer,
};

/// The sample labels that become series labels with [`Grouping::PerProcess`].
const PROCESS_LABELS: [&str; 2] = ["pid", "comm"];
const KERNEL_MAPPING: &str = "[kernel.kallsyms]";

/// Builds the batch of one interval. A profile that breaks the pprof rules
/// (a bug in firn) is dropped, counted and logged; the rest still go.
pub fn build_batch(
    aggregated: AggregatedProfile,
    grouping: Grouping,
    period_ns: i64,
    symbolizer: &mut dyn FrameSymbolizer,
    stats: &Stats,
) -> (ProfileBatch, BuildSummary) {
    let start = aggregated.start;
    let groups = match grouping {
        Grouping::Whole => vec![(Vec::new(), aggregated)],
        Grouping::PerProcess => split_by_process(aggregated),
    };
    let mut batch = ProfileBatch {
        start,
        profiles: Vec::with_capacity(groups.len()),
        unsymbolized_objects: Vec::new(),
    };
    let mut total = BuildSummary::default();
    let mut seen_objects = HashSet::new();
    for (labels, group) in groups {
        let (mut profile, summary) = build_profile(&group, period_ns, symbolizer, stats);
        add_summary(&mut total, &summary);
        if !labels.is_empty() {
            strip_sample_labels(&mut profile, &PROCESS_LABELS);
        }
        if let Err(error) = validate(&profile) {
            Stats::inc(&stats.profiles_dropped);
            error!(%error, ?labels, "profile dropped: it breaks the pprof rules (a bug in firn)");
            continue;
        }
        for object in unsymbolized_objects(&profile, &group.stacks) {
            if let Some(build_id) = object.build_id()
                && seen_objects.insert(build_id.clone())
            {
                batch.unsymbolized_objects.push(object);
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

/// One group per process image, labelled `pid` and `comm`: the label sets
/// Parca's series are made of. Two images of one pid (before and after an
/// exec) with different names are two series.
fn split_by_process(
    aggregated: AggregatedProfile,
) -> Vec<(Vec<(String, String)>, AggregatedProfile)> {
    let mut groups: HashMap<(u32, String), Vec<(StackKey, u64)>> = HashMap::new();
    for (key, count) in aggregated.stacks {
        let image = &key.image.0;
        groups
            .entry((image.tgid, image.comm.clone()))
            .or_default()
            .push((key, count));
    }
    let mut groups: Vec<_> = groups.into_iter().collect();
    groups.sort_by(|a, b| a.0.cmp(&b.0));
    groups
        .into_iter()
        .map(|((pid, comm), stacks)| {
            let samples = stacks.iter().map(|(_, count)| count).sum();
            let labels = vec![
                ("pid".to_owned(), pid.to_string()),
                ("comm".to_owned(), comm),
            ];
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

fn strip_sample_labels(profile: &mut proto::Profile, keys: &[&str]) {
    let strings = &profile.string_table;
    let lifted: Vec<i64> = keys
        .iter()
        .filter_map(|key| strings.iter().position(|s| s == key))
        .filter_map(|index| i64::try_from(index).ok())
        .collect();
    for sample in &mut profile.sample {
        sample.label.retain(|label| !lifted.contains(&label.key));
    }
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

    use super::*;
    use crate::{
        aggregate::ImageRef,
        config::Limits,
        elf::BuildId,
        pprof::{decode, sample_label},
        process::{ProcessImage, ProcessTable},
        symbolize::Line,
    };

    /// Names kernel frames only: every user frame stays unsymbolized.
    struct KernelOnly;

    impl FrameSymbolizer for KernelOnly {
        fn kernel(&mut self, address: u64) -> Option<Line> {
            Some(Line::named(&format!("k{address:x}")))
        }

        fn user(&mut self, _object: &ObjectFile, _vaddr: u64) -> Vec<Line> {
            Vec::new()
        }

        fn kernel_build_id(&self) -> Option<&BuildId> {
            None
        }
    }

    /// An address in this test's own executable.
    fn own_code() {}

    fn stacks_of_two_processes() -> (ProcessTable, Vec<(StackKey, u64)>) {
        // This test's own process, with real mappings and objects.
        let stats = Arc::new(Stats::default());
        let mut table = ProcessTable::new(PathBuf::from("/proc"), &Limits::default(), stats);
        let code: fn() = own_code;
        let address = code as usize as u64;
        let own = table.image_covering(std::process::id(), "batch-test", address);
        let index = own.mapping_index(address).expect("own code is mapped");
        table.object(&own, index).expect("own executable opens");
        let other = Arc::new(ProcessImage::new(99, "other".into(), Vec::new()));
        let key = |image: &Arc<ProcessImage>, tid| StackKey {
            image: ImageRef(image.clone()),
            tid,
            kernel: vec![0xffff_ffff_8100_0000].into(),
            user: vec![address].into(),
        };
        let stacks = vec![
            (key(&own, own.tgid), 3),
            (key(&own, own.tgid + 1), 2),
            (key(&other, 99), 4),
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

    #[test]
    fn per_process_profiles_carry_pid_and_comm_as_series_labels() {
        let (_table, stacks) = stacks_of_two_processes();
        let own = std::process::id().to_string();
        let stats = Stats::default();
        let (batch, summary) = build_batch(
            aggregated(stacks),
            Grouping::PerProcess,
            10_000_000,
            &mut KernelOnly,
            &stats,
        );
        assert_eq!(summary.samples, 9);
        let comm = std::fs::read_to_string("/proc/self/comm").expect("own comm");
        let labels: HashSet<Vec<(String, String)>> =
            batch.profiles.iter().map(|p| p.labels.clone()).collect();
        assert_eq!(
            labels,
            HashSet::from([
                vec![("pid".into(), "99".into()), ("comm".into(), "other".into())],
                vec![
                    ("pid".into(), own.clone()),
                    ("comm".into(), comm.trim().into())
                ],
            ])
        );
        let mine = batch
            .profiles
            .iter()
            .find(|p| p.labels[0].1 == own)
            .expect("own profile");
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
        assert_eq!(batch.unsymbolized_objects.len(), 1);
        let object = &batch.unsymbolized_objects[0];
        assert!(object.build_id().is_some());
        let executable = std::env::current_exe().expect("own path");
        assert_eq!(
            std::fs::canonicalize(&object.path).ok(),
            std::fs::canonicalize(executable).ok()
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
            &mut KernelOnly,
            &stats,
        );
        assert_eq!(batch.profiles.len(), 1);
        assert!(batch.profiles[0].labels.is_empty());
        let profile = decode(&batch.profiles[0].gzipped).expect("gzipped pprof");
        let pids: HashSet<_> = profile
            .sample
            .iter()
            .filter_map(|s| sample_label(&profile, s, "pid"))
            .collect();
        assert_eq!(pids.len(), 2);
    }
}
