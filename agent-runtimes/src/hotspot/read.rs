//! Reads of the JVM's memory: integers, pointers, C strings, all bounded.

use super::HotSpotError;
use crate::Memory;

pub(crate) fn read(
    memory: &mut dyn Memory,
    address: u64,
    buf: &mut [u8],
) -> Result<(), HotSpotError> {
    Ok(memory.read(address, buf)?)
}

pub(crate) fn u64_at(memory: &mut dyn Memory, address: u64) -> Result<u64, HotSpotError> {
    let mut bytes = [0; 8];
    read(memory, address, &mut bytes)?;
    Ok(u64::from_le_bytes(bytes))
}

pub(crate) fn i32_at(memory: &mut dyn Memory, address: u64) -> Result<i32, HotSpotError> {
    let mut bytes = [0; 4];
    read(memory, address, &mut bytes)?;
    Ok(i32::from_le_bytes(bytes))
}

/// A field of a header already read: `width` bytes at `offset`, little
/// endian, zero-extended; 0 when the header is too short.
pub(crate) fn field(bytes: &[u8], offset: u64, width: usize) -> u64 {
    let start = offset as usize;
    let Some(slice) = start
        .checked_add(width)
        .and_then(|end| bytes.get(start..end))
    else {
        return 0;
    };
    let mut value = [0u8; 8];
    value[..width.min(8)].copy_from_slice(&slice[..width.min(8)]);
    u64::from_le_bytes(value)
}

pub(crate) fn field_u64(bytes: &[u8], offset: u64) -> u64 {
    field(bytes, offset, 8)
}

pub(crate) fn field_i32(bytes: &[u8], offset: u64) -> i32 {
    field(bytes, offset, 4) as u32 as i32
}

pub(crate) fn field_u16(bytes: &[u8], offset: u64) -> u16 {
    field(bytes, offset, 2) as u16
}

/// A NUL-terminated string of at most `limit` bytes, read in small pieces
/// (a string may end just before an unmapped page).
pub(crate) fn c_string(
    memory: &mut dyn Memory,
    address: u64,
    limit: usize,
) -> Result<String, HotSpotError> {
    const PIECE: u64 = 64;
    let mut out = Vec::new();
    let mut at = address;
    while out.len() < limit {
        // Up to the next 64-byte boundary: never across a page the string
        // does not reach.
        let length = (PIECE - at % PIECE) as usize;
        let mut piece = vec![0; length];
        read(memory, at, &mut piece)?;
        if let Some(end) = piece.iter().position(|&byte| byte == 0) {
            out.extend_from_slice(&piece[..end]);
            return Ok(String::from_utf8_lossy(&out).into_owned());
        }
        out.extend_from_slice(&piece);
        at = at.wrapping_add(length as u64);
    }
    Err(super::invalid("a string", address, "longer than its limit"))
}
