//! The label step of the pipeline's tail: a symbolized interval -> the
//! series an exporter takes, each with its stacks and their sample labels.
//! Every process is labelled (and relabeled) once; the stacks of processes
//! relabeling drops are left out and their samples counted.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::{Duration, SystemTime},
};

use agent_pprof::Stack;

use super::{
    Grouping,
    symbolized::{FrameTable, SymbolizedInterval, SymbolizedStack},
};
use crate::{
    labels::{LabelSet, Labeler, ProcessMetadata},
    process::ProcessImage,
    stats::Stats,
};

/// The stacks of one series.
#[derive(Debug, Default)]
pub struct SeriesStacks {
    /// The series labels; empty for [`Grouping::Whole`].
    pub labels: Vec<(String, String)>,
    pub stacks: Vec<Stack>,
}

/// An interval after the label step: what the builder takes.
#[derive(Debug)]
pub struct LabelledInterval {
    pub start: SystemTime,
    pub duration: Duration,
    pub table: FrameTable,
    /// [`Grouping::Whole`]: exactly one, even when empty.
    pub series: Vec<SeriesStacks>,
}

/// A process image as sampled under one metadata read.
type ProcessKey = (*const ProcessImage, *const ProcessMetadata);

fn process_key(stack: &SymbolizedStack) -> ProcessKey {
    (Arc::as_ptr(&stack.image), Arc::as_ptr(&stack.metadata))
}

/// A sample's thread labels: `thread_id` alone for threads other than the
/// main one; with per-thread labels on, `thread_id` and `thread_name` for
/// every thread.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Thread {
    tid: u32,
    name: Option<crate::aggregate::ThreadName>,
    /// An off-CPU sample's `off_cpu_reason`.
    reason: Option<&'static str>,
}

fn thread(stack: &SymbolizedStack) -> Option<Thread> {
    (stack.thread_name.is_some() || stack.tid != stack.image.tgid || stack.reason.is_some())
        .then_some(Thread {
            tid: stack.tid,
            name: stack.thread_name.clone(),
            reason: stack.reason,
        })
}

type SampleLabels = Arc<[(String, String)]>;

/// `labels` then the thread's; built once per label set and thread.
fn sample_labels<'a>(
    labels: impl Iterator<Item = (&'a String, &'a String)>,
    thread: Option<Thread>,
) -> SampleLabels {
    let thread_labels = thread.into_iter().flat_map(|thread| {
        std::iter::once(("thread_id".to_owned(), thread.tid.to_string()))
            .chain(
                thread
                    .name
                    .map(|name| ("thread_name".to_owned(), name.to_string())),
            )
            .chain(
                thread
                    .reason
                    .map(|reason| ("off_cpu_reason".to_owned(), reason.to_owned())),
            )
    });
    labels
        .map(|(name, value)| (name.clone(), value.clone()))
        .chain(thread_labels)
        .collect()
}

pub fn label_interval(
    symbolized: SymbolizedInterval,
    grouping: Grouping,
    labeler: &Labeler,
    stats: &Stats,
) -> LabelledInterval {
    let kept = label_processes(symbolized.stacks, labeler, stats);
    let series = match grouping {
        Grouping::Whole => vec![whole(kept)],
        Grouping::PerProcess => per_label_set(kept),
    };
    LabelledInterval {
        start: symbolized.start,
        duration: symbolized.duration,
        table: symbolized.table,
        series,
    }
}

/// Each kept stack with its process's label set.
fn label_processes(
    stacks: Vec<SymbolizedStack>,
    labeler: &Labeler,
    stats: &Stats,
) -> Vec<(Arc<LabelSet>, SymbolizedStack)> {
    let mut sets: HashMap<ProcessKey, Option<Arc<LabelSet>>> = HashMap::new();
    let mut dropped = 0;
    let mut kept = Vec::with_capacity(stacks.len());
    for stack in stacks {
        let set = sets
            .entry(process_key(&stack))
            .or_insert_with(|| labeler.labels(&stack.image, &stack.metadata).map(Arc::new));
        match set {
            Some(set) => kept.push((set.clone(), stack)),
            None => dropped += stack.count,
        }
    }
    Stats::add(&stats.samples_dropped_relabel, dropped);
    kept
}

/// One series for everything; processes told apart by sample labels.
fn whole(kept: Vec<(Arc<LabelSet>, SymbolizedStack)>) -> SeriesStacks {
    // The set is kept in the value so its address is not reused while it
    // is a key.
    type BySetAndThread = HashMap<(*const LabelSet, Option<Thread>), (Arc<LabelSet>, SampleLabels)>;
    let mut cache = BySetAndThread::new();
    let stacks = kept
        .into_iter()
        .map(|(set, stack)| {
            let labels = cache
                .entry((Arc::as_ptr(&set), thread(&stack)))
                .or_insert_with(|| (set.clone(), sample_labels(set.iter(), thread(&stack))))
                .1
                .clone();
            Stack {
                count: stack.count,
                labels,
                frames: stack.frames,
            }
        })
        .collect();
    SeriesStacks {
        labels: Vec::new(),
        stacks,
    }
}

/// One series per label set, in label order: the series Parca keeps
/// apart. Processes that relabeling left with equal labels share one.
fn per_label_set(kept: Vec<(Arc<LabelSet>, SymbolizedStack)>) -> Vec<SeriesStacks> {
    let mut threads: HashMap<Option<Thread>, SampleLabels> = HashMap::new();
    let mut groups: BTreeMap<Arc<LabelSet>, Vec<Stack>> = BTreeMap::new();
    for (set, stack) in kept {
        // Series labels only: the samples keep just their thread's.
        let labels = threads
            .entry(thread(&stack))
            .or_insert_with(|| sample_labels(std::iter::empty(), thread(&stack)))
            .clone();
        groups.entry(set).or_default().push(Stack {
            count: stack.count,
            labels,
            frames: stack.frames,
        });
    }
    groups
        .into_iter()
        .map(|(set, stacks)| SeriesStacks {
            labels: set
                .iter()
                .map(|(name, value)| (name.clone(), value.clone()))
                .collect(),
            stacks,
        })
        .collect()
}
