//! pprof for firn, without I/O of its own: the builder turns symbolized
//! stacks into a `perftools.profiles.Profile` that follows the rules a
//! Parca server enforces, [`validate`] checks those rules, [`encode_gzip`]
//! and [`decode`] move profiles to and from bytes, and [`Reader`] resolves
//! a profile's samples back into frames and labels for whoever reads one
//! (the flame graph, tools, tests).

mod builder;
mod input;
mod reader;
mod validate;

use std::io::{Read, Write};

use flate2::{Compression, read::GzDecoder, write::GzEncoder};
use prost::Message;

pub use builder::{BuildSummary, build};
pub use input::{Frame, Frames, Interval, Line, Mapping, Origin, Stack};
pub use reader::{FrameView, MappingView, Reader, SampleView};
pub use validate::{ProfileError, validate};

/// Types generated from `proto/google/pprof/profile.proto`.
#[allow(clippy::all, clippy::too_many_lines, missing_docs)]
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
