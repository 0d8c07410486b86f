//! HotSpot's compressed streams (`compressedStream.hpp`): UNSIGNED5 ints
//! (1 to 5 bytes: a low byte ends the number, each byte adds its value
//! shifted by 6 more bits) and the signed ints zigzag-encoded in them.
//! Line number tables and debug information are written with them.

const LG_H: u32 = 6;
const MAX_BYTES: usize = 5;

/// Which UNSIGNED5 a JVM writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coding {
    /// Up to JDK 19: bytes below 192 end a number, 0 among them.
    Pack200,
    /// JDK 20 on (`utilities/unsigned5.hpp`): the zero byte is never
    /// written (every byte is one more than its digit), so bytes 1 to 191
    /// end a number.
    NoZeroBytes,
}

impl Coding {
    /// The JVM's: its tables do not say, its major version does.
    pub fn of_version(major: i64) -> Self {
        if major >= 20 {
            Self::NoZeroBytes
        } else {
            Self::Pack200
        }
    }

    /// The excluded bytes (X) and the low bytes (L).
    fn constants(self) -> (u32, u32) {
        match self {
            Self::Pack200 => (0, 192),
            Self::NoZeroBytes => (1, 191),
        }
    }
}

/// A reader over bytes; reading past the end fails.
pub(crate) struct Stream<'a> {
    bytes: &'a [u8],
    position: usize,
    coding: Coding,
}

impl<'a> Stream<'a> {
    pub(crate) fn new(bytes: &'a [u8], position: usize, coding: Coding) -> Self {
        Self {
            bytes,
            position,
            coding,
        }
    }

    pub(crate) fn byte(&mut self) -> Option<u8> {
        let byte = *self.bytes.get(self.position)?;
        self.position += 1;
        Some(byte)
    }

    pub(crate) fn unsigned(&mut self) -> Option<u32> {
        let (excluded, low) = self.coding.constants();
        let mut sum = 0u32;
        let mut shift = 0;
        for index in 0..MAX_BYTES {
            // An excluded byte is no number (the end of a table).
            let byte = u32::from(self.byte()?).checked_sub(excluded)?;
            sum = sum.wrapping_add(byte << shift);
            if byte < low || index == MAX_BYTES - 1 {
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

    /// The writers of `compressedStream.cpp` (JDK 17) and `unsigned5.hpp`
    /// (JDK 20 on), to check the reader against.
    pub(crate) fn write_unsigned(out: &mut Vec<u8>, mut value: u32, coding: Coding) {
        let (excluded, low) = coding.constants();
        for index in 0..MAX_BYTES {
            if value < low || index == MAX_BYTES - 1 {
                out.push((excluded + value) as u8);
                return;
            }
            value -= low;
            out.push((excluded + low + value % 64) as u8);
            value >>= LG_H;
        }
    }

    #[test]
    fn reads_what_hotspot_writes() {
        for coding in [Coding::Pack200, Coding::NoZeroBytes] {
            let values = [
                0,
                1,
                190,
                191,
                192,
                255,
                4095,
                12287,
                12288,
                1 << 20,
                u32::MAX,
            ];
            let mut bytes = Vec::new();
            for value in values {
                write_unsigned(&mut bytes, value, coding);
            }
            if coding == Coding::NoZeroBytes {
                assert!(!bytes.contains(&0), "{bytes:?}");
            }
            let mut stream = Stream::new(&bytes, 0, coding);
            for value in values {
                assert_eq!(stream.unsigned(), Some(value), "{coding:?}");
            }
            assert_eq!(stream.unsigned(), None, "past the end");

            let signed = [0, -1, 1, -200, 200, i32::MIN, i32::MAX];
            let mut bytes = Vec::new();
            for value in signed {
                write_unsigned(&mut bytes, ((value << 1) ^ (value >> 31)) as u32, coding);
            }
            let mut stream = Stream::new(&bytes, 0, coding);
            for value in signed {
                assert_eq!(stream.signed(), Some(value), "{coding:?}");
            }
        }
        // A zero byte is no number in JDK 20's coding.
        assert_eq!(Stream::new(&[0], 0, Coding::NoZeroBytes).unsigned(), None);
    }
}
