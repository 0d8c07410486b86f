//! The pprof stage: builds `perftools.profiles.Profile` from an aggregated
//! interval, and encodes / decodes it (gzip).

mod builder;
mod validate;

use std::io::{Read, Write};

use flate2::{Compression, read::GzDecoder, write::GzEncoder};
use prost::Message;

pub use builder::{BuildSummary, SampleLabels, build_labelled_profile, build_profile};
pub use validate::{ProfileError, validate};

/// Types generated from `proto/google/pprof/profile.proto`.
#[allow(clippy::all, missing_docs)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/perftools.profiles.rs"));
}

#[derive(Debug, thiserror::Error)]
pub enum PprofError {
    #[error("could not decompress the profile")]
    Gzip {
        #[source]
        source: std::io::Error,
    },
    #[error("not a pprof profile")]
    Decode {
        #[source]
        source: prost::DecodeError,
    },
}

/// Serializes and gzips (fast level, as Parca expects).
pub fn encode_gzip(profile: &proto::Profile) -> Vec<u8> {
    let raw = profile.encode_to_vec();
    let mut encoder = GzEncoder::new(Vec::with_capacity(raw.len() / 4), Compression::fast());
    // Writing into a Vec cannot fail.
    let _ = encoder.write_all(&raw);
    encoder.finish().unwrap_or_default()
}

/// Decodes a profile, gzipped (`1f 8b`) or not.
pub fn decode(bytes: &[u8]) -> Result<proto::Profile, PprofError> {
    if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut raw = Vec::new();
        GzDecoder::new(bytes)
            .read_to_end(&mut raw)
            .map_err(|source| PprofError::Gzip { source })?;
        proto::Profile::decode(raw.as_slice()).map_err(|source| PprofError::Decode { source })
    } else {
        proto::Profile::decode(bytes).map_err(|source| PprofError::Decode { source })
    }
}

/// A read-only view for tests and tools: names of a sample's frames, leaf
/// first, inlined functions before the function they were inlined into.
pub fn sample_function_names(profile: &proto::Profile, sample: &proto::Sample) -> Vec<String> {
    let string = |index: i64| {
        profile
            .string_table
            .get(usize::try_from(index).unwrap_or(0))
            .cloned()
            .unwrap_or_default()
    };
    let mut names = Vec::new();
    for &id in &sample.location_id {
        let Some(location) = profile
            .location
            .get(usize::try_from(id).unwrap_or(0).wrapping_sub(1))
        else {
            continue;
        };
        if location.line.is_empty() {
            names.push(format!("0x{:x}", location.address));
        }
        for line in &location.line {
            let function = profile.function.get(
                usize::try_from(line.function_id)
                    .unwrap_or(0)
                    .wrapping_sub(1),
            );
            names.push(function.map(|f| string(f.name)).unwrap_or_default());
        }
    }
    names
}

/// A sample's string label by key.
pub fn sample_label<'a>(
    profile: &'a proto::Profile,
    sample: &proto::Sample,
    key: &str,
) -> Option<&'a str> {
    sample.label.iter().find_map(|label| {
        let name = profile.string_table.get(usize::try_from(label.key).ok()?)?;
        (name == key).then(|| {
            profile
                .string_table
                .get(usize::try_from(label.str).ok()?)
                .map(String::as_str)
        })?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gzip_round_trip() {
        let profile = proto::Profile {
            string_table: vec![String::new(), "samples".into()],
            period: 10_000_000,
            ..Default::default()
        };
        let bytes = encode_gzip(&profile);
        assert_eq!(&bytes[..2], &[0x1f, 0x8b]);
        assert_eq!(decode(&bytes).expect("decodes"), profile);
        assert_eq!(
            decode(&profile.encode_to_vec()).expect("plain decodes"),
            profile
        );
        assert!(decode(&[0x1f, 0x8b, 0, 1, 2]).is_err());
        assert!(decode(&[0xff; 7]).is_err());
    }
}
