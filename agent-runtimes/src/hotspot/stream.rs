//! HotSpot's compressed streams (`compressedStream.hpp`): UNSIGNED5 ints
//! (1 to 5 bytes: a byte below 192 ends the number, each byte adds its
//! value shifted by 6 more bits) and the signed ints zigzag-encoded in
//! them. Line number tables and debug information are written with them.

/// Bytes below this end a number.
const L: u32 = 192;
const LG_H: u32 = 6;
const MAX_BYTES: usize = 5;

/// A reader over bytes; reading past the end fails.
pub(crate) struct Stream<'a> {
    bytes: &'a [u8],
    position: usize,
}

impl<'a> Stream<'a> {
    pub(crate) fn new(bytes: &'a [u8], position: usize) -> Self {
        Self { bytes, position }
    }

    pub(crate) fn byte(&mut self) -> Option<u8> {
        let byte = *self.bytes.get(self.position)?;
        self.position += 1;
        Some(byte)
    }

    pub(crate) fn unsigned(&mut self) -> Option<u32> {
        let mut sum = 0u32;
        let mut shift = 0;
        for index in 0..MAX_BYTES {
            let byte = u32::from(self.byte()?);
            sum = sum.wrapping_add(byte << shift);
            if byte < L || index == MAX_BYTES - 1 {
                return Some(sum);
            }
            shift += LG_H;
        }
        None
    }

    pub(crate) fn signed(&mut self) -> Option<i32> {
        let value = self.unsigned()?;
        Some(((value >> 1) as i32) ^ -((value & 1) as i32))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The writer of `compressedStream.cpp`, to check the reader against.
    fn write_unsigned(out: &mut Vec<u8>, mut value: u32) {
        for index in 0..MAX_BYTES {
            if value < L || index == MAX_BYTES - 1 {
                out.push(value as u8);
                return;
            }
            value -= L;
            out.push((L + value % 64) as u8);
            value >>= LG_H;
        }
    }

    #[test]
    fn reads_what_hotspot_writes() {
        let values = [0, 1, 191, 192, 255, 4095, 12287, 12288, 1 << 20, u32::MAX];
        let mut bytes = Vec::new();
        for value in values {
            write_unsigned(&mut bytes, value);
        }
        let mut stream = Stream::new(&bytes, 0);
        for value in values {
            assert_eq!(stream.unsigned(), Some(value));
        }
        assert_eq!(stream.unsigned(), None, "past the end");

        let signed = [0, -1, 1, -200, 200, i32::MIN, i32::MAX];
        let mut bytes = Vec::new();
        for value in signed {
            write_unsigned(&mut bytes, ((value << 1) ^ (value >> 31)) as u32);
        }
        let mut stream = Stream::new(&bytes, 0);
        for value in signed {
            assert_eq!(stream.signed(), Some(value));
        }
    }
}
