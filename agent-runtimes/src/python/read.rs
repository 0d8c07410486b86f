//! CPython objects read out of another process: pointers, strings, bytes.
//! Everything read is capped: the process may be hostile, or the object
//! freed and its memory reused since the sample; addresses from it wrap
//! rather than overflow (a read there fails).

use std::sync::Arc;

use super::{
    layout::{BYTES_DATA, OBJECT_SIZE, UNICODE_LENGTH, UNICODE_STATE, UnicodeLayout},
    namer::NameError,
};
use crate::Memory;

/// Characters kept of a name or file name; longer ones are cut.
pub(crate) const MAX_STRING_CHARS: u64 = 1024;

/// Largest line table read (a function of 100,000 lines has one of a few
/// hundred KiB).
pub(crate) const MAX_LINE_TABLE: u64 = 1 << 20;

pub(crate) fn read(memory: &mut dyn Memory, address: u64, buf: &mut [u8]) -> Result<(), NameError> {
    memory
        .read(address, buf)
        .map_err(|source| NameError::Read { source })
}

pub(crate) fn read_u64(memory: &mut dyn Memory, address: u64) -> Result<u64, NameError> {
    let mut bytes = [0; 8];
    read(memory, address, &mut bytes)?;
    Ok(u64::from_le_bytes(bytes))
}

/// The 8 bytes at `offset` of `bytes` (a header already read).
pub(crate) fn field_u64(bytes: &[u8], offset: u64) -> u64 {
    let start = offset as usize;
    bytes
        .get(start..start + 8)
        .and_then(|field| <[u8; 8]>::try_from(field).ok())
        .map_or(0, u64::from_le_bytes)
}

/// The 4 bytes at `offset` of `bytes`, as a C `int`.
pub(crate) fn field_i32(bytes: &[u8], offset: u64) -> i32 {
    let start = offset as usize;
    bytes
        .get(start..start + 4)
        .and_then(|field| <[u8; 4]>::try_from(field).ok())
        .map_or(0, i32::from_le_bytes)
}

/// Bytes read at a string's address along with the code object's other
/// reads (one system call): the header and the data of nearly every
/// function and file name.
pub(crate) const STRING_READ_AHEAD: usize = 192;

/// Bytes read at a line table's address the same way: its header and the
/// whole table of most functions.
pub(crate) const BYTES_READ_AHEAD: usize = 256;

/// `buf` filled from `address`: from `ahead` (bytes already read at
/// `start`) when it holds them all, else read.
fn read_via(
    memory: &mut dyn Memory,
    ahead: (u64, &[u8]),
    address: u64,
    buf: &mut [u8],
) -> Result<(), NameError> {
    let (start, bytes) = ahead;
    let held = address
        .checked_sub(start)
        .and_then(|offset| usize::try_from(offset).ok())
        .and_then(|offset| bytes.get(offset..offset.checked_add(buf.len())?));
    match held {
        Some(held) => {
            buf.copy_from_slice(held);
            Ok(())
        }
        None => read(memory, address, buf),
    }
}

/// A `str` object (`PyASCIIObject` and after), with `ahead` the bytes
/// already read at `address` (any length; what it lacks is read). Only
/// compact strings are read: every string the compiler makes is one (the
/// legacy, non-compact form only comes from deprecated C APIs, removed in
/// 3.12).
pub(crate) fn read_string_ahead(
    memory: &mut dyn Memory,
    layout: &UnicodeLayout,
    address: u64,
    ahead: &[u8],
) -> Result<Arc<str>, NameError> {
    let ahead = (address, ahead);
    let mut header = [0; UNICODE_STATE as usize + 4];
    read_via(memory, ahead, address, &mut header)?;
    let length = field_u64(&header, UNICODE_LENGTH);
    let state = field_i32(&header, UNICODE_STATE).cast_unsigned();
    let kind = (state >> 2) & 7;
    let compact = (state >> 5) & 1 == 1;
    let ascii = (state >> 6) & 1 == 1;
    let valid = compact && matches!(kind, 1 | 2 | 4) && (!ascii || kind == 1);
    if !valid || length > i64::MAX as u64 {
        return Err(NameError::BadString { address, state });
    }
    let characters = length.min(MAX_STRING_CHARS) as usize;
    let data = if ascii {
        layout.ascii_data
    } else {
        layout.compact_data
    };
    let width = kind as usize;
    let mut bytes = vec![0; characters * width];
    read_via(memory, ahead, address.wrapping_add(data), &mut bytes)?;
    let text: String = match width {
        1 => bytes.iter().map(|&byte| char::from(byte)).collect(),
        2 => bytes
            .chunks_exact(2)
            .map(|unit| u32::from(u16::from_le_bytes([unit[0], unit[1]])))
            .map(|unit| char::from_u32(unit).unwrap_or(char::REPLACEMENT_CHARACTER))
            .collect(),
        _ => bytes
            .chunks_exact(4)
            .map(|unit| u32::from_le_bytes([unit[0], unit[1], unit[2], unit[3]]))
            .map(|unit| char::from_u32(unit).unwrap_or(char::REPLACEMENT_CHARACTER))
            .collect(),
    };
    Ok(Arc::from(text))
}

/// `ob_size` of a variable-size object.
pub(crate) fn object_size(memory: &mut dyn Memory, address: u64) -> Result<u64, NameError> {
    read_u64(memory, address.wrapping_add(OBJECT_SIZE))
}

/// The contents of a `bytes` object of at most `limit` bytes, with `ahead`
/// the bytes already read at `address`.
pub(crate) fn read_bytes_ahead(
    memory: &mut dyn Memory,
    address: u64,
    limit: u64,
    ahead: &[u8],
) -> Result<Vec<u8>, NameError> {
    let ahead = (address, ahead);
    let mut size = [0; 8];
    read_via(memory, ahead, address.wrapping_add(OBJECT_SIZE), &mut size)?;
    let size = u64::from_le_bytes(size);
    if size > limit {
        return Err(NameError::TooLarge {
            address,
            size,
            limit,
        });
    }
    let mut bytes = vec![0; size as usize];
    read_via(memory, ahead, address.wrapping_add(BYTES_DATA), &mut bytes)?;
    Ok(bytes)
}
