//! Reading a profile back: samples resolved into their frames (function,
//! file, line, mapping, address) and labels, whoever built the profile.
//! Indices a profile gets wrong read as empty strings or are skipped; the
//! reader never panics on them ([`crate::validate`] says what is wrong).

use crate::{input::KERNEL_MAPPING, proto};

/// A read-only view of one profile.
#[derive(Clone, Copy, Debug)]
pub struct Reader<'a> {
    profile: &'a proto::Profile,
}

/// One mapping, its strings resolved.
#[derive(Clone, Copy, Debug)]
pub struct MappingView<'a> {
    pub mapping: &'a proto::Mapping,
    pub filename: &'a str,
    /// Hex as the profile holds it; empty when unknown.
    pub build_id: &'a str,
}

impl MappingView<'_> {
    pub fn is_kernel(&self) -> bool {
        self.filename == KERNEL_MAPPING
    }
}

/// One sample, resolved on demand.
#[derive(Clone, Copy, Debug)]
pub struct SampleView<'a> {
    reader: Reader<'a>,
    pub sample: &'a proto::Sample,
}

/// One source-level frame of a sample: a location's line, or the location
/// itself when it has none.
#[derive(Clone, Copy, Debug)]
pub struct FrameView<'a> {
    /// The runtime address of the frame's location.
    pub address: u64,
    pub mapping: Option<MappingView<'a>>,
    /// `None` when the location has no lines: nobody named it.
    pub name: Option<&'a str>,
    pub system_name: &'a str,
    /// The source file; empty when unknown.
    pub file: &'a str,
    /// The source line; 0 when unknown.
    pub line: i64,
}

impl FrameView<'_> {
    /// The function's name, or the address (`0x1234`) of an unnamed frame.
    pub fn display_name(&self) -> String {
        match self.name {
            Some(name) => name.to_owned(),
            None => format!("0x{:x}", self.address),
        }
    }

    pub fn is_kernel(&self) -> bool {
        self.mapping.is_some_and(|mapping| mapping.is_kernel())
    }
}

/// The element with 1-based `id` of a table whose ids are positions.
fn by_id<T>(items: &[T], id: u64) -> Option<&T> {
    usize::try_from(id)
        .ok()?
        .checked_sub(1)
        .and_then(|i| items.get(i))
}

impl<'a> Reader<'a> {
    pub fn new(profile: &'a proto::Profile) -> Self {
        Self { profile }
    }

    pub fn profile(&self) -> &'a proto::Profile {
        self.profile
    }

    /// A string by index; empty when out of range.
    pub fn string(&self, index: i64) -> &'a str {
        usize::try_from(index)
            .ok()
            .and_then(|i| self.profile.string_table.get(i))
            .map_or("", String::as_str)
    }

    fn value_type(&self, value_type: &proto::ValueType) -> (&'a str, &'a str) {
        (self.string(value_type.r#type), self.string(value_type.unit))
    }

    /// `(type, unit)` of each sample value.
    pub fn sample_types(&self) -> Vec<(&'a str, &'a str)> {
        self.profile
            .sample_type
            .iter()
            .map(|value_type| self.value_type(value_type))
            .collect()
    }

    /// `(type, unit)` of the sampling period.
    pub fn period_type(&self) -> Option<(&'a str, &'a str)> {
        self.profile
            .period_type
            .as_ref()
            .map(|value_type| self.value_type(value_type))
    }

    pub fn mappings(&self) -> impl Iterator<Item = MappingView<'a>> + 'a {
        let reader = *self;
        self.profile
            .mapping
            .iter()
            .map(move |mapping| reader.mapping_view(mapping))
    }

    fn mapping_view(&self, mapping: &'a proto::Mapping) -> MappingView<'a> {
        MappingView {
            mapping,
            filename: self.string(mapping.filename),
            build_id: self.string(mapping.build_id),
        }
    }

    pub fn samples(&self) -> impl Iterator<Item = SampleView<'a>> + 'a {
        let reader = *self;
        self.profile
            .sample
            .iter()
            .map(move |sample| SampleView { reader, sample })
    }

    /// Frames of a location: its lines, innermost (inlined) first, or the
    /// location alone when it has none.
    fn location_frames(&self, location: &'a proto::Location, frames: &mut Vec<FrameView<'a>>) {
        let mapping =
            by_id(&self.profile.mapping, location.mapping_id).map(|m| self.mapping_view(m));
        let frame = FrameView {
            address: location.address,
            mapping,
            name: None,
            system_name: "",
            file: "",
            line: 0,
        };
        if location.line.is_empty() {
            frames.push(frame);
            return;
        }
        for line in &location.line {
            let function = by_id(&self.profile.function, line.function_id);
            let string = |field: fn(&proto::Function) -> i64| {
                function.map_or("", |function| self.string(field(function)))
            };
            frames.push(FrameView {
                name: Some(string(|f| f.name)),
                system_name: string(|f| f.system_name),
                file: string(|f| f.filename),
                line: line.line,
                ..frame
            });
        }
    }
}

impl<'a> SampleView<'a> {
    /// The first value: the sample count for firn's profiles.
    pub fn count(&self) -> i64 {
        self.sample.value.first().copied().unwrap_or(0)
    }

    /// The sample's string label `key`.
    pub fn label(&self, key: &str) -> Option<&'a str> {
        self.labels()
            .find_map(|(name, value)| (name == key).then_some(value))
    }

    /// The sample's numeric label `key` (as Go's profiles carry `pid`).
    pub fn num_label(&self, key: &str) -> Option<i64> {
        self.sample
            .label
            .iter()
            .find(|label| label.str == 0 && self.reader.string(label.key) == key)
            .map(|label| label.num)
    }

    /// The sample's labels as strings, `(key, value)`, in order; a numeric
    /// label reads with an empty value.
    pub fn labels(&self) -> impl Iterator<Item = (&'a str, &'a str)> + 'a {
        let reader = self.reader;
        self.sample
            .label
            .iter()
            .map(move |label| (reader.string(label.key), reader.string(label.str)))
    }

    /// Frames, leaf first; a location's inlined functions come before the
    /// function they were inlined into. Unknown location ids are skipped.
    pub fn frames(&self) -> Vec<FrameView<'a>> {
        let mut frames = Vec::with_capacity(self.sample.location_id.len());
        for &id in &self.sample.location_id {
            if let Some(location) = by_id(&self.reader.profile.location, id) {
                self.reader.location_frames(location, &mut frames);
            }
        }
        frames
    }

    /// [`FrameView::display_name`] of every frame, leaf first.
    pub fn function_names(&self) -> Vec<String> {
        self.frames().iter().map(FrameView::display_name).collect()
    }
}

#[cfg(test)]
mod tests;
