//! Aggregated stacks -> pprof, following the rules a Parca server enforces
//! (see PARCA.md): string 0 is "", ids sequential from 1, one value per
//! sample type, non-zero location ids, real mapping ranges and runtime
//! addresses, lines on every location firn could symbolize.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::UNIX_EPOCH,
};

use super::proto;
use crate::{
    aggregate::{AggregatedProfile, StackKey},
    process::{MappingKind, ObjectFile, ProcessImage},
    stats::Stats,
    symbolize::{FrameSymbolizer, Line},
};

/// Counts from one build, for the interval summary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BuildSummary {
    pub samples: u64,
    pub locations: usize,
    pub functions: usize,
    pub mappings: usize,
    /// Distinct user locations outside any known object.
    pub unknown_user_locations: usize,
    /// Distinct user locations in a known object without a symbol.
    pub unsymbolized_user_locations: usize,
    pub unsymbolized_kernel_locations: usize,
}

#[derive(Default)]
struct Strings {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    fn new() -> Self {
        let mut strings = Self::default();
        strings.intern("");
        strings
    }

    fn intern(&mut self, text: &str) -> i64 {
        if let Some(&index) = self.index.get(text) {
            return index;
        }
        let index = self.table.len() as i64;
        self.table.push(text.to_owned());
        self.index.insert(text.to_owned(), index);
        index
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum MappingKey {
    Kernel,
    User {
        image: *const ProcessImage,
        index: usize,
    },
}

struct Builder<'a> {
    symbolizer: &'a mut dyn FrameSymbolizer,
    strings: Strings,
    mappings: Vec<proto::Mapping>,
    mapping_ids: HashMap<MappingKey, u64>,
    locations: Vec<proto::Location>,
    location_ids: HashMap<(u64, u64), u64>,
    /// Unknown user addresses have no mapping; keyed by address alone.
    unmapped_ids: HashMap<u64, u64>,
    functions: Vec<proto::Function>,
    function_ids: HashMap<(i64, i64, i64), u64>,
    /// User frames symbolized ahead, object by object.
    user_lines: HashMap<(*const ObjectFile, u64), Vec<Line>>,
    summary: BuildSummary,
}

/// Gives the string labels of a stack's sample, name then value, to the
/// callback; `thread_id` is added after them for threads other than the
/// main one.
pub type SampleLabels<'a> = dyn Fn(&StackKey, &mut dyn FnMut(&str, &str)) + 'a;

/// The address to symbolize for a user frame: return addresses (all but
/// the innermost frame) point after the call, which may be the first
/// instruction of the next function or line.
fn lookup_address(address: u64, is_return: bool) -> u64 {
    if is_return {
        address.saturating_sub(1)
    } else {
        address
    }
}

/// Builds the profile of one interval with `pid` and `comm` as sample
/// labels. `period_ns` is the sampling period (1e9 / frequency).
pub fn build_profile(
    aggregated: &AggregatedProfile,
    period_ns: i64,
    symbolizer: &mut dyn FrameSymbolizer,
    stats: &Stats,
) -> (proto::Profile, BuildSummary) {
    let labels = |key: &StackKey, emit: &mut dyn FnMut(&str, &str)| {
        emit("pid", &key.image.0.tgid.to_string());
        emit("comm", &key.image.0.comm);
    };
    build_labelled_profile(aggregated, period_ns, &labels, symbolizer, stats)
}

/// Like [`build_profile`], each sample labelled by `sample_labels`.
pub fn build_labelled_profile(
    aggregated: &AggregatedProfile,
    period_ns: i64,
    sample_labels: &SampleLabels<'_>,
    symbolizer: &mut dyn FrameSymbolizer,
    stats: &Stats,
) -> (proto::Profile, BuildSummary) {
    let mut builder = Builder {
        symbolizer,
        strings: Strings::new(),
        mappings: Vec::new(),
        mapping_ids: HashMap::new(),
        locations: Vec::new(),
        location_ids: HashMap::new(),
        unmapped_ids: HashMap::new(),
        functions: Vec::new(),
        function_ids: HashMap::new(),
        user_lines: HashMap::new(),
        summary: BuildSummary::default(),
    };
    builder.symbolize_user_frames(aggregated);
    let samples_type = builder.value_type("samples", "count");
    let cpu_type = builder.value_type("cpu", "nanoseconds");
    let mut samples = Vec::with_capacity(aggregated.stacks.len());
    for (key, count) in &aggregated.stacks {
        let count = i64::try_from(*count).unwrap_or(i64::MAX);
        samples.push(proto::Sample {
            location_id: builder.stack_locations(key),
            value: vec![count, count.saturating_mul(period_ns)],
            label: builder.labels(key, sample_labels),
        });
        builder.summary.samples += count as u64;
    }
    // Samples with no frames at all cannot be sent (Parca rejects empty
    // stacks); they are impossible here since every sample has an ip.
    samples.retain(|s| !s.location_id.is_empty());

    let summary = BuildSummary {
        locations: builder.locations.len(),
        functions: builder.functions.len(),
        mappings: builder.mappings.len(),
        ..builder.summary
    };
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

    builder.symbolizer.end_of_profile();

    let time_nanos = aggregated
        .start
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0);
    let profile = proto::Profile {
        sample_type: vec![samples_type, cpu_type],
        sample: samples,
        mapping: builder.mappings,
        location: builder.locations,
        function: builder.functions,
        string_table: builder.strings.table,
        time_nanos,
        duration_nanos: i64::try_from(aggregated.duration.as_nanos())
            .unwrap_or(i64::MAX)
            .max(1),
        period_type: Some(cpu_type),
        period: period_ns,
        ..Default::default()
    };
    (profile, summary)
}

impl Builder<'_> {
    fn value_type(&mut self, kind: &str, unit: &str) -> proto::ValueType {
        proto::ValueType {
            r#type: self.strings.intern(kind),
            unit: self.strings.intern(unit),
        }
    }

    fn labels(&mut self, key: &StackKey, sample_labels: &SampleLabels<'_>) -> Vec<proto::Label> {
        let mut labels = Vec::new();
        sample_labels(key, &mut |name, value| {
            labels.push(self.label(name, value));
        });
        if key.tid != key.image.0.tgid {
            labels.push(self.label("thread_id", &key.tid.to_string()));
        }
        labels
    }

    fn label(&mut self, key: &str, value: &str) -> proto::Label {
        proto::Label {
            key: self.strings.intern(key),
            str: self.strings.intern(value),
            ..Default::default()
        }
    }

    /// Symbolizes every distinct user frame in object order before the
    /// profile is assembled: each object's tables are then built at most
    /// once per profile, even when the caches cannot hold all of them at
    /// once (frames of big objects interleave in the stacks).
    fn symbolize_user_frames(&mut self, aggregated: &AggregatedProfile) {
        let mut seen = HashSet::new();
        let mut wanted: Vec<(Arc<ObjectFile>, u64)> = Vec::new();
        for (key, _) in &aggregated.stacks {
            let image = &key.image.0;
            for (depth, &address) in key.user.iter().enumerate() {
                let Some(index) = image.mapping_index(address) else {
                    continue;
                };
                let mapping = &image.mappings[index];
                let lookup = lookup_address(address, depth > 0);
                if let (Some(object), Some(vaddr)) =
                    (mapping.object(), mapping.object_vaddr(lookup))
                    && seen.insert((Arc::as_ptr(object), vaddr))
                {
                    wanted.push((object.clone(), vaddr));
                }
            }
        }
        wanted.sort_unstable_by_key(|(object, vaddr)| (Arc::as_ptr(object), *vaddr));
        for (object, vaddr) in wanted {
            let lines = self.symbolizer.user(&object, vaddr);
            self.user_lines.insert((Arc::as_ptr(&object), vaddr), lines);
        }
    }

    /// Location ids, leaf first: kernel frames, then user frames.
    fn stack_locations(&mut self, key: &StackKey) -> Vec<u64> {
        let mut ids = Vec::with_capacity(key.kernel.len() + key.user.len());
        for &address in key.kernel.iter() {
            ids.push(self.kernel_location(address));
        }
        for (depth, &address) in key.user.iter().enumerate() {
            ids.push(self.user_location(&key.image.0, address, depth > 0));
        }
        ids
    }

    fn kernel_location(&mut self, address: u64) -> u64 {
        let mapping_id = self.kernel_mapping();
        if let Some(&id) = self.location_ids.get(&(mapping_id, address)) {
            return id;
        }
        let lines: Vec<Line> = self.symbolizer.kernel(address).into_iter().collect();
        if lines.is_empty() {
            self.summary.unsymbolized_kernel_locations += 1;
        }
        let id = self.push_location(mapping_id, address, &lines);
        self.location_ids.insert((mapping_id, address), id);
        id
    }

    /// `is_return`: the address is a return address; the call lies just
    /// before it, which matters when the call is a function's last
    /// instruction.
    fn user_location(&mut self, image: &Arc<ProcessImage>, address: u64, is_return: bool) -> u64 {
        let Some(index) = image.mapping_index(address) else {
            if let Some(&id) = self.unmapped_ids.get(&address) {
                return id;
            }
            self.summary.unknown_user_locations += 1;
            let id = self.push_location(0, address, &[]);
            self.unmapped_ids.insert(address, id);
            return id;
        };
        let mapping_id = self.user_mapping(image, index);
        if let Some(&id) = self.location_ids.get(&(mapping_id, address)) {
            return id;
        }
        let mapping = &image.mappings[index];
        let lookup = lookup_address(address, is_return);
        let lines = match (mapping.object(), mapping.object_vaddr(lookup)) {
            (Some(object), Some(vaddr)) => {
                let lines = match self.user_lines.get(&(Arc::as_ptr(object), vaddr)) {
                    Some(lines) => lines.clone(),
                    None => self.symbolizer.user(object, vaddr),
                };
                if lines.is_empty() {
                    self.summary.unsymbolized_user_locations += 1;
                }
                lines
            }
            // JIT code: named by the process's perf map, if it keeps one.
            _ if mapping.spec.kind == MappingKind::Anonymous => {
                let line = image
                    .perf_map()
                    .and_then(|perf_map| self.symbolizer.jit(&perf_map, lookup));
                if line.is_none() {
                    self.summary.unknown_user_locations += 1;
                }
                line.into_iter().collect()
            }
            _ => {
                self.summary.unknown_user_locations += 1;
                Vec::new()
            }
        };
        if !lines.is_empty()
            && let Some(pprof_mapping) = self.mappings.get_mut((mapping_id - 1) as usize)
        {
            pprof_mapping.has_functions = true;
            pprof_mapping.has_filenames |= lines.iter().any(|line| line.file.is_some());
            pprof_mapping.has_line_numbers |= lines.iter().any(|line| line.line.is_some());
            pprof_mapping.has_inline_frames |= lines.len() > 1;
        }
        let id = self.push_location(mapping_id, address, &lines);
        self.location_ids.insert((mapping_id, address), id);
        id
    }

    fn kernel_mapping(&mut self) -> u64 {
        if let Some(&id) = self.mapping_ids.get(&MappingKey::Kernel) {
            return id;
        }
        let filename = self.strings.intern("[kernel.kallsyms]");
        let build_id = self
            .symbolizer
            .kernel_build_id()
            .map(|id| id.to_hex())
            .unwrap_or_default();
        let build_id = self.strings.intern(&build_id);
        let id = self.mappings.len() as u64 + 1;
        self.mappings.push(proto::Mapping {
            id,
            memory_start: 0xffff_8000_0000_0000,
            memory_limit: u64::MAX,
            file_offset: 0,
            filename,
            build_id,
            has_functions: true,
            ..Default::default()
        });
        self.mapping_ids.insert(MappingKey::Kernel, id);
        id
    }

    fn user_mapping(&mut self, image: &Arc<ProcessImage>, index: usize) -> u64 {
        let key = MappingKey::User {
            image: Arc::as_ptr(image),
            index,
        };
        if let Some(&id) = self.mapping_ids.get(&key) {
            return id;
        }
        let mapping = &image.mappings[index];
        let spec = &mapping.spec;
        let filename = match spec.kind {
            MappingKind::File | MappingKind::Vdso => spec.path.clone(),
            MappingKind::Anonymous if spec.path.is_empty() => "[anon]".to_owned(),
            MappingKind::Anonymous => spec.path.clone(),
        };
        let filename = self.strings.intern(&filename);
        let build_id = mapping
            .object()
            .and_then(|object| object.build_id())
            .map(|id| id.to_hex())
            .unwrap_or_default();
        let build_id = self.strings.intern(&build_id);
        let id = self.mappings.len() as u64 + 1;
        self.mappings.push(proto::Mapping {
            id,
            memory_start: spec.start,
            memory_limit: spec.end,
            file_offset: spec.offset,
            filename,
            build_id,
            ..Default::default()
        });
        self.mapping_ids.insert(key, id);
        id
    }

    fn push_location(&mut self, mapping_id: u64, address: u64, lines: &[Line]) -> u64 {
        let lines = lines
            .iter()
            .map(|line| proto::Line {
                function_id: self.function(line),
                line: line.line.map_or(0, i64::from),
                column: 0,
            })
            .collect();
        let id = self.locations.len() as u64 + 1;
        self.locations.push(proto::Location {
            id,
            mapping_id,
            address,
            line: lines,
            is_folded: false,
        });
        id
    }

    fn function(&mut self, line: &Line) -> u64 {
        let name = self.strings.intern(&line.function);
        let system_name = self.strings.intern(&line.system_name);
        let filename = self.strings.intern(line.file.as_deref().unwrap_or(""));
        let key = (name, system_name, filename);
        if let Some(&id) = self.function_ids.get(&key) {
            return id;
        }
        let id = self.functions.len() as u64 + 1;
        self.functions.push(proto::Function {
            id,
            name,
            system_name,
            filename,
            start_line: 0,
        });
        self.function_ids.insert(key, id);
        id
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use agent_elf::BuildId;

    use super::*;
    use crate::{
        aggregate::{ImageRef, MetadataRef},
        labels::ProcessMetadata,
        pprof::sample_function_names,
        process::MappingSpec,
        symbolize::{ObjectSource, PerfMapSource},
    };

    /// Names kernel addresses `k<hex>` and user addresses `u<hex>`.
    struct FakeSymbolizer {
        build_id: BuildId,
    }

    impl FrameSymbolizer for FakeSymbolizer {
        fn kernel(&mut self, address: u64) -> Option<Line> {
            (address != 0xffff_ffff_dead_0000).then(|| Line::named(&format!("k{address:x}")))
        }

        fn user(&mut self, _object: &dyn ObjectSource, vaddr: u64) -> Vec<Line> {
            vec![Line::named(&format!("u{vaddr:x}"))]
        }

        fn jit(&mut self, _perf_map: &dyn PerfMapSource, address: u64) -> Option<Line> {
            Some(Line::named(&format!("jit{address:x}")))
        }

        fn kernel_build_id(&self) -> Option<&BuildId> {
            Some(&self.build_id)
        }
    }

    fn image_without_objects() -> Arc<ProcessImage> {
        Arc::new(ProcessImage::new(
            42,
            "worker".into(),
            vec![MappingSpec {
                start: 0x400000,
                end: 0x500000,
                offset: 0,
                dev: 0,
                inode: 0,
                path: "/bin/worker".into(),
                kind: MappingKind::File,
                deleted: false,
            }],
        ))
    }

    fn aggregated(stacks: Vec<(StackKey, u64)>) -> AggregatedProfile {
        AggregatedProfile {
            start: SystemTime::now(),
            duration: Duration::from_secs(10),
            samples: stacks.iter().map(|(_, c)| c).sum(),
            dropped: 0,
            stacks,
        }
    }

    #[test]
    fn profile_follows_the_parca_rules() {
        let image = image_without_objects();
        let metadata = MetadataRef(Arc::new(ProcessMetadata::unknown(42)));
        let key = |tid, kernel: &[u64], user: &[u64]| StackKey {
            image: ImageRef(image.clone()),
            metadata: metadata.clone(),
            tid,
            kernel: kernel.into(),
            user: user.into(),
        };
        let input = aggregated(vec![
            (key(42, &[0xffff_ffff_8100_0010], &[0x401000, 0x402000]), 3),
            (key(43, &[0xffff_ffff_dead_0000], &[0x401000, 0x900000]), 2),
        ]);
        let mut symbolizer = FakeSymbolizer {
            build_id: BuildId::new(&[0xab, 0xcd]),
        };
        let stats = Stats::default();
        let (profile, summary) = build_profile(&input, 10_000_000, &mut symbolizer, &stats);

        crate::pprof::validate(&profile).expect("the profile follows the Parca rules");
        for sample in &profile.sample {
            assert_eq!(sample.value[1], sample.value[0] * 10_000_000);
        }
        let string = |i: i64| profile.string_table[i as usize].as_str();
        let types: Vec<(&str, &str)> = profile
            .sample_type
            .iter()
            .map(|t| (string(t.r#type), string(t.unit)))
            .collect();
        assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
        let period_type = profile.period_type.expect("period type");
        assert_eq!(
            (string(period_type.r#type), string(period_type.unit)),
            ("cpu", "nanoseconds")
        );
        assert_eq!(profile.period, 10_000_000);
        assert!(profile.time_nanos > 0 && profile.duration_nanos == 10_000_000_000);

        assert_eq!(summary.samples, 5);
        assert_eq!(summary.unsymbolized_kernel_locations, 1);
        // 0x900000 lies outside every mapping; 0x401000 has no object here.
        assert_eq!(summary.unknown_user_locations, 3);
        assert_eq!(stats.snapshot().user_frames_unknown, 3);

        // Labels: pid and comm always, thread_id only for other threads.
        let labels = |sample: &proto::Sample| -> Vec<(String, String)> {
            sample
                .label
                .iter()
                .map(|l| (string(l.key).to_owned(), string(l.str).to_owned()))
                .collect()
        };
        let main_thread = profile
            .sample
            .iter()
            .find(|s| s.value[0] == 3)
            .expect("sample");
        assert_eq!(
            labels(main_thread),
            [
                ("pid".into(), "42".into()),
                ("comm".into(), "worker".into())
            ]
        );
        let other_thread = profile
            .sample
            .iter()
            .find(|s| s.value[0] == 2)
            .expect("sample");
        assert!(labels(other_thread).contains(&("thread_id".into(), "43".into())));

        // Kernel frame named, unknown frames keep their addresses.
        let names = sample_function_names(&profile, main_thread);
        assert_eq!(names[0], "kffffffff81000010");
        let unknown = sample_function_names(&profile, other_thread);
        assert_eq!(unknown[0], "0xffffffffdead0000");
        assert_eq!(unknown.last().map(String::as_str), Some("0x900000"));
        let kernel_mapping = &profile.mapping[0];
        assert_eq!(string(kernel_mapping.filename), "[kernel.kallsyms]");
        assert_eq!(string(kernel_mapping.build_id), "abcd");
        let user_mapping = &profile.mapping[1];
        assert_eq!(
            (user_mapping.memory_start, user_mapping.memory_limit),
            (0x400000, 0x500000)
        );
        assert_eq!(string(user_mapping.filename), "/bin/worker");
    }
}
