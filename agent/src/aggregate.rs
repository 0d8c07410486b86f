//! The aggregator stage: counts identical stacks of one process image and
//! thread over one profile's interval, up to a bounded number of distinct
//! stacks.

use std::{
    collections::HashMap,
    hash::{Hash, Hasher},
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use crate::{
    labels::ProcessMetadata, process::ProcessImage, runtimes::UserFrame, sampler::Comm,
    stats::Stats,
};

/// A sample after unwinding: the plain value between the unwinder and the
/// aggregator.
#[derive(Clone, Debug)]
pub struct UnwoundSample {
    /// The process image the sample was taken under.
    pub image: Arc<ProcessImage>,
    /// The process's metadata (cgroups, command line) when it was sampled.
    pub metadata: Arc<ProcessMetadata>,
    pub tid: u32,
    /// The thread's name, when samples are labelled per thread (else
    /// `None`, so a renamed thread does not split its stacks).
    pub thread_name: Option<ThreadName>,
    /// Kernel frames, innermost first.
    pub kernel: Vec<u64>,
    /// User frames, innermost first; the first is the interrupted
    /// instruction, the rest are return addresses, with interpreted
    /// frames spliced in where their interpreter ran them.
    pub user: Vec<UserFrame>,
    /// How many samples this one counts for: 1 on the CPU, the periods of
    /// an off-CPU sample.
    pub weight: u64,
    /// Why an off-CPU sample's thread waited (`off_cpu_reason`).
    pub reason: Option<&'static str>,
}

/// A process image compared by identity: two images of one pid (before and
/// after an exec) are different keys.
#[derive(Clone, Debug)]
pub struct ImageRef(pub Arc<ProcessImage>);

impl PartialEq for ImageRef {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for ImageRef {}

impl Hash for ImageRef {
    fn hash<H: Hasher>(&self, state: &mut H) {
        Arc::as_ptr(&self.0).hash(state);
    }
}

/// Process metadata compared by identity: a re-read (the process moved to
/// another cgroup) starts new stacks, so each keeps the labels it was
/// sampled under.
#[derive(Clone, Debug)]
pub struct MetadataRef(pub Arc<ProcessMetadata>);

impl PartialEq for MetadataRef {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for MetadataRef {}

impl Hash for MetadataRef {
    fn hash<H: Hasher>(&self, state: &mut H) {
        Arc::as_ptr(&self.0).hash(state);
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct StackKey {
    pub image: ImageRef,
    pub metadata: MetadataRef,
    pub tid: u32,
    pub thread_name: Option<ThreadName>,
    pub kernel: Box<[u64]>,
    pub user: Box<[UserFrame]>,
    pub reason: Option<&'static str>,
}

/// Everything sampled during one interval.
#[derive(Debug)]
pub struct AggregatedProfile {
    pub start: SystemTime,
    pub duration: Duration,
    /// Samples aggregated (not counting dropped ones).
    pub samples: u64,
    /// Samples dropped because the stack limit was reached.
    pub dropped: u64,
    pub stacks: Vec<(StackKey, u64)>,
}

/// How much one profile may hold.
#[derive(Clone, Debug)]
pub struct AggregateConfig {
    /// Distinct stacks per profile; samples beyond are counted as dropped.
    pub max_stacks_per_profile: usize,
}

impl Default for AggregateConfig {
    fn default() -> Self {
        Self {
            max_stacks_per_profile: 200_000,
        }
    }
}

pub struct Aggregator {
    /// Hashed with foldhash (hashbrown's default, as `lru` re-exports it),
    /// seeded per process: a sample hashes its whole stack, Java and
    /// Python frames' names included, and SipHash was a tenth of firn's
    /// CPU per Java sample.
    stacks: HashMap<StackKey, u64, lru::DefaultHasher>,
    max_stacks: usize,
    samples: u64,
    dropped: u64,
    start_wall: SystemTime,
    start: Instant,
    stats: Arc<Stats>,
}

impl Aggregator {
    pub fn new(config: &AggregateConfig, stats: Arc<Stats>) -> Self {
        Self {
            stacks: HashMap::default(),
            max_stacks: config.max_stacks_per_profile,
            samples: 0,
            dropped: 0,
            start_wall: SystemTime::now(),
            start: Instant::now(),
            stats,
        }
    }

    pub fn samples(&self) -> u64 {
        self.samples
    }

    pub fn add(&mut self, sample: UnwoundSample) {
        let key = StackKey {
            image: ImageRef(sample.image),
            metadata: MetadataRef(sample.metadata),
            tid: sample.tid,
            thread_name: sample.thread_name,
            kernel: sample.kernel.into_boxed_slice(),
            user: sample.user.into_boxed_slice(),
            reason: sample.reason,
        };
        let weight = sample.weight;
        if let Some(count) = self.stacks.get_mut(&key) {
            *count += weight;
        } else if self.stacks.len() < self.max_stacks {
            self.stacks.insert(key, weight);
        } else {
            self.dropped += weight;
            Stats::add(&self.stats.samples_dropped_stack_limit, weight);
            return;
        }
        self.samples += weight;
    }

    /// Hands over the interval so far and starts the next one.
    pub fn take(&mut self) -> AggregatedProfile {
        let now = Instant::now();
        let profile = AggregatedProfile {
            start: self.start_wall,
            duration: now.duration_since(self.start),
            samples: self.samples,
            dropped: self.dropped,
            stacks: self.stacks.drain().collect(),
        };
        self.samples = 0;
        self.dropped = 0;
        self.start = now;
        self.start_wall = SystemTime::now();
        profile
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One metadata for all: stacks here differ by image.
    static METADATA: std::sync::LazyLock<Arc<ProcessMetadata>> =
        std::sync::LazyLock::new(|| Arc::new(ProcessMetadata::unknown(0)));

    fn image(tgid: u32) -> Arc<ProcessImage> {
        Arc::new(ProcessImage::new(tgid, "p".into(), Vec::new()))
    }

    fn limit(max_stacks_per_profile: usize) -> AggregateConfig {
        AggregateConfig {
            max_stacks_per_profile,
        }
    }

    fn sample(image: &Arc<ProcessImage>, user: &[u64]) -> UnwoundSample {
        UnwoundSample {
            image: image.clone(),
            metadata: METADATA.clone(),
            tid: image.tgid,
            thread_name: None,
            kernel: Vec::new(),
            user: user.iter().copied().map(UserFrame::Native).collect(),
            weight: 1,
            reason: None,
        }
    }

    #[test]
    fn identical_stacks_are_counted_together() {
        let mut aggregator = Aggregator::new(&limit(10), Arc::new(Stats::default()));
        let one = image(1);
        aggregator.add(sample(&one, &[1, 2, 3]));
        aggregator.add(sample(&one, &[1, 2, 3]));
        aggregator.add(sample(&one, &[1, 2]));
        let profile = aggregator.take();
        assert_eq!(profile.samples, 3);
        let mut counts: Vec<u64> = profile.stacks.iter().map(|(_, c)| *c).collect();
        counts.sort_unstable();
        assert_eq!(counts, vec![1, 2]);
        assert_eq!(aggregator.take().samples, 0, "take resets");
    }

    #[test]
    fn images_of_one_pid_across_exec_stay_apart() {
        let mut aggregator = Aggregator::new(&limit(10), Arc::new(Stats::default()));
        let (before, after) = (image(7), image(7));
        aggregator.add(sample(&before, &[1]));
        aggregator.add(sample(&after, &[1]));
        assert_eq!(aggregator.take().stacks.len(), 2);
    }

    #[test]
    fn the_stack_limit_drops_and_counts() {
        let stats = Arc::new(Stats::default());
        let mut aggregator = Aggregator::new(&limit(2), stats.clone());
        let one = image(1);
        for leaf in 0..5 {
            aggregator.add(sample(&one, &[leaf]));
        }
        aggregator.add(sample(&one, &[0]));
        let profile = aggregator.take();
        assert_eq!((profile.samples, profile.dropped), (3, 3));
        assert_eq!(stats.snapshot().samples_dropped_stack_limit, 3);
    }
}

/// A thread's name as labelled: the OS thread's (comm), or the longer one
/// its runtime gave it (a Java thread's).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ThreadName {
    Comm(Comm),
    Runtime(Arc<str>),
}

impl std::fmt::Display for ThreadName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ThreadName::Comm(comm) => comm.fmt(f),
            ThreadName::Runtime(name) => f.write_str(name),
        }
    }
}
