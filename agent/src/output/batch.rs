//! The build step of the pipeline's tail: a labelled interval -> the
//! profiles an exporter takes, built, checked against Parca's rules and
//! gzipped, with the objects whose debug information a server may want.

use std::{collections::HashSet, sync::Arc};

use agent_pprof::{BuildSummary, Interval, encode_gzip, proto, validate};
use tracing::error;

use super::{
    Grouping, ProfileBatch, ProfileKind, SeriesProfile,
    labelled::{LabelledInterval, SeriesStacks, label_interval},
    symbolized::{FrameCache, FrameTable, symbolize_interval},
};
use crate::{
    aggregate::AggregatedProfile, labels::Labeler, process::ObjectFile, stats::Stats,
    symbolize::FrameSymbolizer,
};

/// Builds the profile of one series and publishes what the build counted.
fn build_series(
    labelled: &LabelledInterval,
    series: &SeriesStacks,
    period_ns: i64,
    stats: &Stats,
) -> (proto::Profile, BuildSummary) {
    let interval = Interval {
        start: labelled.start,
        duration: labelled.duration,
        period_ns,
    };
    let (profile, summary) = agent_pprof::build(&labelled.table.frames, &series.stacks, interval);
    Stats::add(
        &stats.user_frames_unknown,
        summary.unknown_user_locations as u64,
    );
    Stats::add(
        &stats.user_frames_unsymbolized,
        summary.unsymbolized_user_locations as u64,
    );
    Stats::add(
        &stats.kernel_frames_unsymbolized,
        summary.unsymbolized_kernel_locations as u64,
    );
    (profile, summary)
}

/// One profile for the whole interval, each sample labelled with its
/// process's labels (`firn record`): the whole tail, symbolize -> label ->
/// build.
pub fn build_whole_profile(
    aggregated: AggregatedProfile,
    period_ns: i64,
    labeler: &Labeler,
    symbolizer: &mut dyn FrameSymbolizer,
    stats: &Stats,
) -> (proto::Profile, BuildSummary) {
    // One profile: nothing to keep for a next one.
    let mut cache = FrameCache::new(0, Arc::new(Stats::default()));
    let symbolized = symbolize_interval(aggregated, symbolizer, &mut cache);
    let labelled = label_interval(symbolized, Grouping::Whole, labeler, stats);
    match labelled.series.first() {
        Some(series) => build_series(&labelled, series, period_ns, stats),
        None => build_series(&labelled, &SeriesStacks::default(), period_ns, stats),
    }
}

/// Builds the batch of one interval. A profile that breaks the pprof rules
/// (a bug in firn) is dropped, counted and logged; the rest still go.
pub fn build_batch(
    labelled: LabelledInterval,
    period_ns: i64,
    stats: &Stats,
) -> (ProfileBatch, BuildSummary) {
    build_batch_of(ProfileKind::Cpu, labelled, period_ns, stats)
}

/// [`build_batch`] for the off-CPU samples of an interval (`--off-cpu`),
/// each stack's count in periods of `period_ns` waited.
pub fn build_off_cpu_batch(
    labelled: LabelledInterval,
    period_ns: i64,
    stats: &Stats,
) -> (ProfileBatch, BuildSummary) {
    build_batch_of(ProfileKind::OffCpu, labelled, period_ns, stats)
}

fn build_batch_of(
    kind: ProfileKind,
    labelled: LabelledInterval,
    period_ns: i64,
    stats: &Stats,
) -> (ProfileBatch, BuildSummary) {
    let mut batch = ProfileBatch {
        kind,
        start: labelled.start,
        profiles: Vec::with_capacity(labelled.series.len()),
        debuginfo_candidates: Vec::new(),
        symbolized_objects: Vec::new(),
        unsymbolized_objects: 0,
    };
    let mut total = BuildSummary::default();
    let mut seen_objects = HashSet::new();
    let mut sampled = Vec::new();
    for series in &labelled.series {
        let (mut profile, summary) = build_series(&labelled, series, period_ns, stats);
        if kind == ProfileKind::OffCpu {
            crate::offcpu::mark_profile(&mut profile);
        }
        total.add(&summary);
        if let Err(error) = validate(&profile) {
            Stats::inc(&stats.profiles_dropped);
            let labels = &series.labels;
            error!(%error, ?labels, "profile dropped: it breaks the pprof rules (a bug in firn)");
            continue;
        }
        // Objects with unnamed frames first: the server needs those most.
        for object in unsymbolized_objects(&labelled.table, series) {
            if let Some(build_id) = object.build_id()
                && seen_objects.insert(build_id.clone())
            {
                batch.unsymbolized_objects += 1;
                batch.debuginfo_candidates.push(object);
            }
        }
        sampled.extend(sampled_objects(&labelled.table, series));
        batch.profiles.push(SeriesProfile {
            labels: series.labels.clone(),
            gzipped: encode_gzip(&profile),
            samples: summary.samples,
        });
    }
    // Every other object, for an exporter told to offer those too: named
    // in full wherever the interval has frames in it.
    for object in sampled {
        if let Some(build_id) = object.build_id()
            && seen_objects.insert(build_id.clone())
        {
            batch.symbolized_objects.push(object);
        }
    }
    (batch, total)
}

/// The objects with a build id that the series has frames in, in the
/// order of their first frame.
fn series_objects<'a>(
    table: &'a FrameTable,
    series: &'a SeriesStacks,
) -> impl Iterator<Item = (usize, &'a Arc<ObjectFile>)> + 'a {
    series
        .stacks
        .iter()
        .flat_map(|stack| stack.frames.iter())
        .filter_map(|&frame| Some((frame, table.object(frame)?)))
        .filter(|(_, object)| object.build_id().is_some())
}

/// The objects whose frames the symbolize step could not name in this
/// series: what a server could symbolize given their debug information.
/// The kernel is not among them.
fn unsymbolized_objects(table: &FrameTable, series: &SeriesStacks) -> Vec<Arc<ObjectFile>> {
    let mut wanted: HashSet<_> = series_objects(table, series)
        .filter(|&(frame, _)| table.unnamed_in_object(frame))
        .filter_map(|(_, object)| object.build_id())
        .collect();
    let mut objects = Vec::new();
    for (_, object) in series_objects(table, series) {
        if wanted.is_empty() {
            break;
        }
        if object.build_id().is_some_and(|id| wanted.remove(id)) {
            objects.push(object.clone());
        }
    }
    objects
}

/// Every object with a build id that the series has user frames in.
fn sampled_objects(table: &FrameTable, series: &SeriesStacks) -> Vec<Arc<ObjectFile>> {
    let mut seen = HashSet::new();
    series_objects(table, series)
        .filter(|(_, object)| object.build_id().is_some_and(|id| seen.insert(id.clone())))
        .map(|(_, object)| object.clone())
        .collect()
}

#[cfg(test)]
mod tests;
