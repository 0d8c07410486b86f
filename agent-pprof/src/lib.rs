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

use std::{
    cell::RefCell,
    io::{Read, Write},
};

use flate2::{
    Compress, Compression, Crc, FlushCompress, Status, read::GzDecoder, write::GzEncoder,
};
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
    #[error("the profile inflates to more than {limit} bytes, more than a profile firn reads")]
    TooLarge { limit: u64 },
    #[error("not a pprof profile")]
    Decode {
        #[source]
        source: prost::DecodeError,
    },
}

/// Serializes and gzips (fast level, as Parca expects).
pub fn encode_gzip(profile: &proto::Profile) -> Vec<u8> {
    gzip(&profile.encode_to_vec())
}

thread_local! {
    /// The deflate state, kept per thread and reset between profiles: a
    /// fresh one allocates and clears about 300 KiB, which costs more than
    /// compressing the small profile of a short-lived process (an agent
    /// builds hundreds of them per interval on a busy host).
    static DEFLATE: RefCell<Compress> = RefCell::new(Compress::new(Compression::fast(), false));
}

/// `raw` as a gzip member (RFC 1952): header, raw deflate, CRC-32 and
/// length.
fn gzip(raw: &[u8]) -> Vec<u8> {
    // No name, no time, no extra flags; OS "unknown", as `GzEncoder` writes.
    const HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];
    let mut out = Vec::with_capacity(HEADER.len() + raw.len() / 4 + 64);
    out.extend_from_slice(&HEADER);
    DEFLATE.with(|deflate| {
        let mut deflate = deflate.borrow_mut();
        deflate.reset();
        loop {
            let consumed = deflate.total_in() as usize;
            out.reserve(raw.len().saturating_sub(consumed) / 4 + 64);
            match deflate.compress_vec(&raw[consumed..], &mut out, FlushCompress::Finish) {
                Ok(Status::StreamEnd) => break,
                Ok(Status::Ok | Status::BufError) => {}
                // Deflating into a Vec has no way to fail; should it, the
                // stream-at-once encoder says why.
                Err(_) => return fallback_gzip(raw),
            }
        }
        let mut crc = Crc::new();
        crc.update(raw);
        out.extend_from_slice(&crc.sum().to_le_bytes());
        // ISIZE is the length modulo 2^32.
        out.extend_from_slice(&(raw.len() as u32).to_le_bytes());
        out
    })
}

fn fallback_gzip(raw: &[u8]) -> Vec<u8> {
    let mut encoder = GzEncoder::new(Vec::with_capacity(raw.len() / 4), Compression::fast());
    // Writing into a Vec cannot fail.
    let _ = encoder.write_all(raw);
    encoder.finish().unwrap_or_default()
}

/// What a gzipped profile may inflate to: 1 GiB, as much as `firn report`
/// reads of a file, so gzip lets no larger profile in than a plain file
/// could be, and a few kilobytes of gzip cannot ask for all memory.
pub const MAX_INFLATED_BYTES: u64 = 1 << 30;

/// Decodes a profile, gzipped (`1f 8b`) or not, inflated to at most
/// [`MAX_INFLATED_BYTES`].
pub fn decode(bytes: &[u8]) -> Result<proto::Profile, PprofError> {
    decode_within(bytes, MAX_INFLATED_BYTES)
}

/// [`decode`] with the bound on the inflated size given: inflating stops
/// one byte past it.
pub fn decode_within(bytes: &[u8], max_inflated: u64) -> Result<proto::Profile, PprofError> {
    if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut raw = Vec::new();
        GzDecoder::new(bytes)
            .take(max_inflated.saturating_add(1))
            .read_to_end(&mut raw)
            .map_err(|source| PprofError::Gzip { source })?;
        if raw.len() as u64 > max_inflated {
            return Err(PprofError::TooLarge {
                limit: max_inflated,
            });
        }
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

    /// The deflate state is reused: profiles of any size one after the
    /// other (one larger than the first output reservation, one empty)
    /// each come out a whole gzip member, checked by a decoder of its own.
    #[test]
    fn gzip_members_one_after_another_each_stand_alone() {
        let profiles = [
            proto::Profile {
                string_table: (0..20_000).map(|i| format!("function_{i}")).collect(),
                ..Default::default()
            },
            proto::Profile::default(),
            proto::Profile {
                string_table: vec![String::new(), "cpu".into()],
                period: 1,
                ..Default::default()
            },
        ];
        for _ in 0..2 {
            for profile in &profiles {
                let bytes = encode_gzip(profile);
                let mut raw = Vec::new();
                flate2::read::MultiGzDecoder::new(&bytes[..])
                    .read_to_end(&mut raw)
                    .expect("a whole gzip member, CRC and length checked");
                assert_eq!(raw, profile.encode_to_vec());
            }
        }
    }

    /// A gzip stream of `copies` MiB of zeros in about a kilobyte per MiB:
    /// one MiB deflated and sync-flushed (no final block) is a run of
    /// back-references into zeros, valid again after any run of zeros, so
    /// copies of it stand end to end. The trailer is never reached.
    fn gzip_bomb(copies: usize) -> Vec<u8> {
        let mut encoder = GzEncoder::new(Vec::new(), Compression::best());
        encoder.write_all(&[]).expect("header");
        encoder.flush().expect("header out");
        let header = encoder.get_ref().len();
        encoder.write_all(&vec![0; 1 << 20]).expect("deflate");
        encoder.flush().expect("sync flush");
        let stream = encoder.get_ref().clone();
        let (head, mebibyte) = stream.split_at(header);
        let mut bomb = head.to_vec();
        for _ in 0..copies {
            bomb.extend_from_slice(mebibyte);
        }
        bomb
    }

    #[test]
    fn a_gzip_bomb_is_refused_at_the_bound() {
        // 4 GiB of zeros in a few megabytes, refused after 1 MiB inflated.
        let bomb = gzip_bomb(4096);
        assert!(bomb.len() < 8 << 20, "{} bytes", bomb.len());
        let started = std::time::Instant::now();
        let error = decode_within(&bomb, 1 << 20).expect_err("refused");
        assert!(
            matches!(error, PprofError::TooLarge { limit } if limit == 1 << 20),
            "{error:?}"
        );
        assert!(error.to_string().contains("1048576"), "{error}");
        // Inflating all 4 GiB would take seconds and as many bytes.
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
        // The same stream under a bound it fits is not refused for its
        // size (zeros are no profile): the bound stopped the bomb.
        let small = gzip_bomb(2);
        let error = decode_within(&small, 4 << 20).expect_err("no profile");
        assert!(!matches!(error, PprofError::TooLarge { .. }), "{error:?}");
        assert!(matches!(
            decode_within(&small, (2 << 20) - 1),
            Err(PprofError::TooLarge { .. })
        ));
        assert_eq!(MAX_INFLATED_BYTES, 1 << 30);
    }
}
