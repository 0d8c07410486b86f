//! firn's pprof profiles as one OTLP `ExportProfilesServiceRequest`: one
//! resource per series (its labels as the semantic conventions name them),
//! one profile of `samples/count` each, every string, function, mapping,
//! location, stack and attribute once in the request's dictionary. The
//! dictionary's tables start with the zero entry the specification asks
//! for, so index 0 means "none".

use std::collections::HashMap;

use agent_pprof::proto as pprof;

use super::proto::{
    AnyValue, ExportProfilesServiceRequest, Function, InstrumentationScope, KeyValue,
    KeyValueAndUnit, Line, Location, Mapping, Profile, ProfilesDictionary, Resource,
    ResourceProfiles, Sample, ScopeProfiles, Stack, ValueType, any_value,
};

/// The attribute OpenTelemetry's eBPF profiler gives every frame.
pub const FRAME_TYPE: &str = "profile.frame.type";
/// A mapping's GNU build id, hex, as backends look it up.
pub const BUILD_ID: &str = "process.executable.build_id.gnu";

/// How firn's label names map onto OpenTelemetry's semantic conventions;
/// other labels keep their names.
const RESOURCE_NAMES: [(&str, &str); 7] = [
    ("service_name", "service.name"),
    ("node", "host.name"),
    ("pid", "process.pid"),
    ("executable", "process.executable.name"),
    ("container_id", "container.id"),
    ("namespace", "k8s.namespace.name"),
    ("pod", "k8s.pod.name"),
];

#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error("the profile of series {series} could not be read")]
    Pprof {
        series: usize,
        #[source]
        source: agent_pprof::PprofError,
    },
    #[error("the profile of series {series} refers to a {what} it does not hold")]
    Dangling { series: usize, what: &'static str },
}

#[derive(Clone, PartialEq, Eq, Hash)]
enum Value {
    Str(String),
    Int(i64),
}

impl Value {
    fn any(self) -> AnyValue {
        AnyValue {
            value: Some(match self {
                Self::Str(text) => any_value::Value::StringValue(text),
                Self::Int(number) => any_value::Value::IntValue(number),
            }),
        }
    }
}

/// A location: its mapping, address, lines (function, line) and
/// attributes.
type LocationKey = (i32, u64, Vec<(i32, i64)>, Vec<i32>);

/// The request being built and the dictionary's indices.
pub struct RequestBuilder {
    dictionary: ProfilesDictionary,
    strings: HashMap<String, i32>,
    attributes: HashMap<(i32, Value), i32>,
    functions: HashMap<(i32, i32, i32, i64), i32>,
    mappings: HashMap<(u64, u64, u64, i32, Vec<i32>), i32>,
    locations: HashMap<LocationKey, i32>,
    stacks: HashMap<Vec<i32>, i32>,
    resources: Vec<ResourceProfiles>,
}

impl Default for RequestBuilder {
    fn default() -> Self {
        let mut builder = Self {
            dictionary: ProfilesDictionary {
                mapping_table: vec![Mapping::default()],
                location_table: vec![Location::default()],
                function_table: vec![Function::default()],
                link_table: vec![Default::default()],
                string_table: Vec::new(),
                attribute_table: vec![KeyValueAndUnit::default()],
                stack_table: vec![Stack::default()],
            },
            strings: HashMap::new(),
            attributes: HashMap::new(),
            functions: HashMap::new(),
            mappings: HashMap::new(),
            locations: HashMap::new(),
            stacks: HashMap::new(),
            resources: Vec::new(),
        };
        builder.string("");
        builder
    }
}

/// One series' pprof, decoded, with the indices of its tables.
struct Source<'a> {
    profile: &'a pprof::Profile,
    series: usize,
    functions: HashMap<u64, &'a pprof::Function>,
    mappings: HashMap<u64, &'a pprof::Mapping>,
    locations: HashMap<u64, &'a pprof::Location>,
}

impl Source<'_> {
    fn text(&self, index: i64) -> &str {
        usize::try_from(index)
            .ok()
            .and_then(|index| self.profile.string_table.get(index))
            .map_or("", String::as_str)
    }
}

impl RequestBuilder {
    fn string(&mut self, text: &str) -> i32 {
        if let Some(&index) = self.strings.get(text) {
            return index;
        }
        let index = table_index(self.dictionary.string_table.len());
        self.dictionary.string_table.push(text.to_owned());
        self.strings.insert(text.to_owned(), index);
        index
    }

    fn attribute(&mut self, key: &str, value: Value) -> i32 {
        let key = self.string(key);
        if let Some(&index) = self.attributes.get(&(key, value.clone())) {
            return index;
        }
        let index = table_index(self.dictionary.attribute_table.len());
        self.dictionary.attribute_table.push(KeyValueAndUnit {
            key_strindex: key,
            value: Some(value.clone().any()),
            unit_strindex: 0,
        });
        self.attributes.insert((key, value), index);
        index
    }

    /// Adds one series: `labels` describe the process (the resource),
    /// `profile` its samples. Samples keep their `samples/count` values, so
    /// a series' total is the pprof's; an off-CPU profile's keep their
    /// `off_cpu/nanoseconds` (time waited), as OpenTelemetry's eBPF
    /// profiler reports off-CPU samples.
    pub fn add(
        &mut self,
        labels: &[(String, String)],
        profile: &pprof::Profile,
        series: usize,
    ) -> Result<(), ConvertError> {
        let source = Source {
            profile,
            series,
            functions: profile.function.iter().map(|f| (f.id, f)).collect(),
            mappings: profile.mapping.iter().map(|m| (m.id, m)).collect(),
            locations: profile.location.iter().map(|l| (l.id, l)).collect(),
        };
        let (kind, unit) = value_kind(&source);
        let samples = self.samples(&source, kind, unit)?;
        let value_type = |builder: &mut Self, kind: &str, unit: &str| ValueType {
            type_strindex: builder.string(kind),
            unit_strindex: builder.string(unit),
        };
        let period_type = profile.period_type.as_ref().map(|period| {
            let (kind, unit) = (source.text(period.r#type), source.text(period.unit));
            value_type(self, kind, unit)
        });
        let otlp_profile = Profile {
            sample_type: Some(value_type(self, kind, unit)),
            samples,
            time_unix_nano: u64::try_from(profile.time_nanos).unwrap_or(0),
            duration_nano: u64::try_from(profile.duration_nanos).unwrap_or(0),
            period_type,
            period: profile.period,
            profile_id: fastrand_id(),
            dropped_attributes_count: 0,
            original_payload_format: String::new(),
            original_payload: Vec::new(),
            attribute_indices: Vec::new(),
        };
        self.resources.push(ResourceProfiles {
            resource: Some(Resource {
                attributes: resource_attributes(labels, executable_path(&source, labels)),
                dropped_attributes_count: 0,
                entity_refs: Vec::new(),
            }),
            scope_profiles: vec![ScopeProfiles {
                scope: Some(InstrumentationScope {
                    name: "firn".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    attributes: Vec::new(),
                    dropped_attributes_count: 0,
                }),
                profiles: vec![otlp_profile],
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        });
        Ok(())
    }

    /// The samples with a `kind/unit` value, their stacks and thread
    /// attributes in the dictionary.
    fn samples(
        &mut self,
        source: &Source<'_>,
        kind: &str,
        unit: &str,
    ) -> Result<Vec<Sample>, ConvertError> {
        let profile = source.profile;
        let count = profile
            .sample_type
            .iter()
            .position(|t| source.text(t.r#type) == kind && source.text(t.unit) == unit)
            .unwrap_or(0);
        let mut samples = Vec::with_capacity(profile.sample.len());
        let mut stacks: HashMap<&[u64], i32> = HashMap::new();
        for sample in &profile.sample {
            let value = sample.value.get(count).copied().unwrap_or(0);
            if value == 0 {
                continue;
            }
            let stack_index = match stacks.get(sample.location_id.as_slice()) {
                Some(&index) => index,
                None => {
                    let index = self.stack(source, &sample.location_id)?;
                    stacks.insert(&sample.location_id, index);
                    index
                }
            };
            let attribute_indices = sample
                .label
                .iter()
                .filter_map(|label| sample_attribute(source, label))
                .map(|(key, value)| self.attribute(key, value))
                .collect();
            samples.push(Sample {
                stack_index,
                attribute_indices,
                link_index: 0,
                values: vec![value],
                timestamps_unix_nano: Vec::new(),
            });
        }
        Ok(samples)
    }

    fn stack(&mut self, source: &Source<'_>, location_ids: &[u64]) -> Result<i32, ConvertError> {
        let mut indices = Vec::with_capacity(location_ids.len());
        for id in location_ids {
            let location = source.locations.get(id).ok_or(ConvertError::Dangling {
                series: source.series,
                what: "location",
            })?;
            indices.push(self.location(source, location)?);
        }
        if let Some(&index) = self.stacks.get(&indices) {
            return Ok(index);
        }
        let index = table_index(self.dictionary.stack_table.len());
        self.dictionary.stack_table.push(Stack {
            location_indices: indices.clone(),
        });
        self.stacks.insert(indices, index);
        Ok(index)
    }

    fn location(
        &mut self,
        source: &Source<'_>,
        location: &pprof::Location,
    ) -> Result<i32, ConvertError> {
        let dangling = |what| ConvertError::Dangling {
            series: source.series,
            what,
        };
        let (mapping_index, frame_type) = match location.mapping_id {
            0 => (0, "native"),
            id => {
                let mapping = source.mappings.get(&id).ok_or(dangling("mapping"))?;
                (
                    self.mapping(source, mapping),
                    frame_type(source.text(mapping.filename)),
                )
            }
        };
        let mut lines = Vec::with_capacity(location.line.len());
        for line in &location.line {
            let function = source
                .functions
                .get(&line.function_id)
                .ok_or(dangling("function"))?;
            lines.push((self.function(source, function), line.line));
        }
        let attributes = vec![self.attribute(FRAME_TYPE, Value::Str(frame_type.into()))];
        let key = (mapping_index, location.address, lines, attributes);
        if let Some(&index) = self.locations.get(&key) {
            return Ok(index);
        }
        let index = table_index(self.dictionary.location_table.len());
        self.dictionary.location_table.push(Location {
            mapping_index,
            address: key.1,
            lines: key
                .2
                .iter()
                .map(|&(function_index, line)| Line {
                    function_index,
                    line,
                    column: 0,
                })
                .collect(),
            attribute_indices: key.3.clone(),
        });
        self.locations.insert(key, index);
        Ok(index)
    }

    fn function(&mut self, source: &Source<'_>, function: &pprof::Function) -> i32 {
        let key = (
            self.string(source.text(function.name)),
            self.string(source.text(function.system_name)),
            self.string(source.text(function.filename)),
            function.start_line,
        );
        if let Some(&index) = self.functions.get(&key) {
            return index;
        }
        let index = table_index(self.dictionary.function_table.len());
        self.dictionary.function_table.push(Function {
            name_strindex: key.0,
            system_name_strindex: key.1,
            filename_strindex: key.2,
            start_line: key.3,
        });
        self.functions.insert(key, index);
        index
    }

    fn mapping(&mut self, source: &Source<'_>, mapping: &pprof::Mapping) -> i32 {
        let filename = self.string(source.text(mapping.filename));
        let build_id = source.text(mapping.build_id);
        let attributes = if build_id.is_empty() {
            Vec::new()
        } else {
            vec![self.attribute(BUILD_ID, Value::Str(build_id.to_owned()))]
        };
        let key = (
            mapping.memory_start,
            mapping.memory_limit,
            mapping.file_offset,
            filename,
            attributes,
        );
        if let Some(&index) = self.mappings.get(&key) {
            return index;
        }
        let index = table_index(self.dictionary.mapping_table.len());
        self.dictionary.mapping_table.push(Mapping {
            memory_start: key.0,
            memory_limit: key.1,
            file_offset: key.2,
            filename_strindex: key.3,
            attribute_indices: key.4.clone(),
        });
        self.mappings.insert(key, index);
        index
    }

    pub fn finish(self) -> ExportProfilesServiceRequest {
        ExportProfilesServiceRequest {
            resource_profiles: self.resources,
            dictionary: Some(self.dictionary),
        }
    }
}

/// A sample label as an attribute: the thread's under their semantic
/// convention names, others as they are.
/// The value a series carries: time waited for an off-CPU profile,
/// otherwise the count of samples.
fn value_kind(source: &Source<'_>) -> (&'static str, &'static str) {
    let off_cpu = source.profile.sample_type.iter().any(|t| {
        source.text(t.r#type) == crate::offcpu::SAMPLE_TYPE && source.text(t.unit) == "nanoseconds"
    });
    if off_cpu {
        (crate::offcpu::SAMPLE_TYPE, "nanoseconds")
    } else {
        ("samples", "count")
    }
}

fn sample_attribute<'a>(source: &'a Source<'_>, label: &pprof::Label) -> Option<(&'a str, Value)> {
    let key = source.text(label.key);
    let text = source.text(label.str);
    Some(match key {
        "" => return None,
        "thread_name" => ("thread.name", Value::Str(text.to_owned())),
        "thread_id" => ("thread.id", Value::Int(text.parse().unwrap_or(label.num))),
        other if label.str != 0 => (other, Value::Str(text.to_owned())),
        other => (other, Value::Int(label.num)),
    })
}

/// Tables are indexed by `int32`; a request never holds 2^31 entries (it
/// is cut at a few MiB), so saturating is only a guard.
fn table_index(len: usize) -> i32 {
    i32::try_from(len).unwrap_or(i32::MAX)
}

fn fastrand_id() -> Vec<u8> {
    (0..16).map(|_| fastrand::u8(..)).collect()
}

/// What a frame is, by the mapping that holds it, in the words of
/// OpenTelemetry's eBPF profiler: `kernel`, a runtime's own type for the
/// mappings of interpreted frames (`cpython`, `jvm`, `v8js`, `ruby`: see
/// [`crate::runtimes::Runtime::frame_type`]), `native`, and `jit` for code
/// in anonymous memory (JIT compilers without a runtime of their own here).
pub fn frame_type(mapping: &str) -> &'static str {
    if let Some(runtime) = crate::runtimes::Runtime::of_mapping(mapping) {
        return runtime.frame_type();
    }
    match mapping {
        "[kernel.kallsyms]" => "kernel",
        "[vdso]" | "[vsyscall]" => "native",
        other if other.starts_with('[') => "jit",
        _ => "native",
    }
}

/// The executable's path: the mapping whose file has the `executable`
/// label's name.
fn executable_path(source: &Source<'_>, labels: &[(String, String)]) -> Option<String> {
    let executable = labels
        .iter()
        .find(|(name, _)| name == "executable")
        .map(|(_, value)| value.as_str())?;
    source
        .profile
        .mapping
        .iter()
        .map(|mapping| source.text(mapping.filename))
        .find(|path| path.starts_with('/') && path.rsplit('/').next() == Some(executable))
        .map(str::to_owned)
}

/// The resource of one series: its labels under their semantic-convention
/// names (`pid` as an integer), `container` as `k8s.container.name` in a
/// pod and `container.name` outside, the executable's path when known.
pub fn resource_attributes(
    labels: &[(String, String)],
    executable_path: Option<String>,
) -> Vec<KeyValue> {
    let in_pod = labels.iter().any(|(name, _)| name == "pod");
    let mut attributes: Vec<KeyValue> = labels
        .iter()
        .map(|(name, value)| {
            let key = match RESOURCE_NAMES.iter().find(|(firn, _)| firn == name) {
                Some((_, otel)) => (*otel).to_owned(),
                None if name == "container" && in_pod => "k8s.container.name".to_owned(),
                None if name == "container" => "container.name".to_owned(),
                None => name.clone(),
            };
            let value = match (key.as_str(), value.parse::<i64>()) {
                ("process.pid", Ok(pid)) => Value::Int(pid),
                _ => Value::Str(value.clone()),
            };
            KeyValue {
                key,
                value: Some(value.any()),
                key_strindex: 0,
            }
        })
        .collect();
    if let Some(path) = executable_path {
        attributes.push(KeyValue {
            key: "process.executable.path".into(),
            value: Some(Value::Str(path).any()),
            key_strindex: 0,
        });
    }
    attributes
}
