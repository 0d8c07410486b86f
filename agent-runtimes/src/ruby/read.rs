//! CRuby objects read out of another process: words, Strings, Arrays.
//! Everything read is checked and capped: the process may be hostile, or
//! the object freed and its slot reused since the sample. Addresses from
//! it wrap rather than overflow (a read there fails).

use std::sync::Arc;

use super::{
    layout::{ArrayLayout, Layout, StringLayout, T_ARRAY, T_STRING, TYPE_MASK},
    namer::NameError,
};
use crate::Memory;

/// Bytes kept of a name or a file name; longer ones are cut.
pub(crate) const MAX_STRING_BYTES: u64 = 1024;

/// Lowest address a pointer read from the process is believed at: the
/// first pages are never mapped.
const MIN_POINTER: u64 = 0x1000;
/// Above the user half of x86-64's address space.
const MAX_POINTER: u64 = 0x0000_8000_0000_0000;

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

/// The 8 bytes at `offset` of `bytes` (a header already read); 0 past its
/// end.
pub(crate) fn field_u64(bytes: &[u8], offset: u64) -> u64 {
    usize::try_from(offset)
        .ok()
        .and_then(|start| bytes.get(start..start.checked_add(8)?))
        .and_then(|field| <[u8; 8]>::try_from(field).ok())
        .map_or(0, u64::from_le_bytes)
}

/// The 4 bytes at `offset` of `bytes`.
pub(crate) fn field_u32(bytes: &[u8], offset: u64) -> u32 {
    usize::try_from(offset)
        .ok()
        .and_then(|start| bytes.get(start..start.checked_add(4)?))
        .and_then(|field| <[u8; 4]>::try_from(field).ok())
        .map_or(0, u32::from_le_bytes)
}

/// Whether `address` can be a pointer to an object or a struct of the
/// process: aligned to 8, in the user half, past the first page.
pub(crate) fn plausible(address: u64) -> bool {
    address.is_multiple_of(8) && (MIN_POINTER..MAX_POINTER).contains(&address)
}

/// `address` if [`plausible`], else [`NameError::BadPointer`].
pub(crate) fn pointer(address: u64, what: &'static str) -> Result<u64, NameError> {
    if plausible(address) {
        Ok(address)
    } else {
        Err(NameError::BadPointer { what, address })
    }
}

/// The bytes of the String at `address`, with `header` its first
/// [`HEADER_BYTES`] if already read (else they are).
pub(crate) fn read_string(
    memory: &mut dyn Memory,
    layout: &StringLayout,
    address: u64,
    header: Option<&[u8]>,
) -> Result<Arc<str>, NameError> {
    let address = pointer(address, "string")?;
    let mut own = [0; HEADER_BYTES];
    let header = match header {
        Some(header) => header,
        None => {
            read(memory, address, &mut own)?;
            &own
        }
    };
    let flags = field_u64(header, 0);
    if flags & TYPE_MASK != T_STRING {
        return Err(NameError::NotString { address, flags });
    }
    let bytes = if flags & layout.heap_flag != 0 {
        let length = field_u64(header, layout.heap_length);
        if length > i64::MAX as u64 {
            return Err(NameError::NotString { address, flags });
        }
        let mut bytes = vec![0; length.min(MAX_STRING_BYTES) as usize];
        // Bytes need no alignment: a literal's are in the object's
        // `.rodata` (3.3's `"<main>"`), a shared string's at any offset
        // into those of the string it shares.
        let data = field_u64(header, layout.heap_pointer);
        if !(MIN_POINTER..MAX_POINTER).contains(&data) {
            return Err(NameError::BadPointer {
                what: "string bytes",
                address: data,
            });
        }
        read(memory, data, &mut bytes)?;
        bytes
    } else {
        let length = embedded_length(layout, header);
        // An embedded string's bytes end in its slot.
        let end = layout.embedded.saturating_add(length);
        if end > layout.size {
            return Err(NameError::NotString { address, flags });
        }
        let start = layout.embedded as usize;
        match header.get(start..end as usize) {
            Some(bytes) => bytes.to_vec(),
            // Longer than the header (3.2+ embeds up to a slot of 640
            // bytes): read where it is.
            None => {
                let mut bytes = vec![0; length.min(MAX_STRING_BYTES) as usize];
                read(memory, address + layout.embedded, &mut bytes)?;
                bytes
            }
        }
    };
    Ok(Arc::from(String::from_utf8_lossy(&bytes)))
}

/// The length of the embedded String whose header is `header`: in its
/// flags until 3.1, in `len` since.
pub(crate) fn embedded_length(layout: &StringLayout, header: &[u8]) -> u64 {
    match layout.embedded_length_flags {
        Some((mask, shift)) => (field_u64(header, 0) & mask) >> shift,
        None => field_u64(header, layout.heap_length),
    }
}

/// Bytes of an object header read ahead: a String's or an Array's.
pub(crate) const HEADER_BYTES: usize = 40;

/// The first [`HEADER_BYTES`] of the objects at `addresses`, in one system
/// call; `None` for those that did not read whole (read again, and their
/// failure reported, where they are used).
pub(crate) fn read_headers<const N: usize>(
    memory: &mut dyn Memory,
    addresses: [u64; N],
) -> [Option<[u8; HEADER_BYTES]>; N] {
    let mut headers = [[0u8; HEADER_BYTES]; N];
    let whole = if addresses.iter().all(|&address| plausible(address)) {
        let mut reads: Vec<(u64, &mut [u8])> = addresses
            .iter()
            .zip(headers.iter_mut())
            .map(|(&address, header)| (address, &mut header[..]))
            .collect();
        memory.read_many(&mut reads)
    } else {
        0
    };
    let mut out = [None; N];
    for (index, header) in headers.into_iter().enumerate().take(whole) {
        out[index] = Some(header);
    }
    out
}

/// An Array's length and where its elements are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ArrayView {
    pub length: u64,
    pub elements: u64,
}

/// The Array at `address`.
pub(crate) fn read_array(
    memory: &mut dyn Memory,
    layout: &ArrayLayout,
    address: u64,
) -> Result<ArrayView, NameError> {
    let address = pointer(address, "array")?;
    let mut header = [0; HEADER_BYTES];
    read(memory, address, &mut header)?;
    let flags = field_u64(&header, 0);
    if flags & TYPE_MASK != T_ARRAY {
        return Err(NameError::NotArray { address, flags });
    }
    Ok(if flags & layout.embedded_flag != 0 {
        let length = (flags & layout.embedded_length_mask) >> layout.embedded_length_shift;
        // An embedded array holds what fits in the object, no more.
        let room = (layout.size - layout.embedded) / 8;
        ArrayView {
            length: length.min(room),
            elements: address + layout.embedded,
        }
    } else {
        ArrayView {
            length: field_u64(&header, layout.heap_length),
            elements: field_u64(&header, layout.heap_pointer),
        }
    })
}

/// Element `index` of the Array at `address`; `None` past its end.
pub(crate) fn array_element(
    memory: &mut dyn Memory,
    layout: &ArrayLayout,
    address: u64,
    index: u64,
) -> Result<Option<u64>, NameError> {
    let array = read_array(memory, layout, address)?;
    if index >= array.length {
        return Ok(None);
    }
    let elements = pointer(array.elements, "array elements")?;
    read_u64(memory, elements.wrapping_add(index.wrapping_mul(8))).map(Some)
}

/// A file name: `pathobj` is the path String, or an Array whose first
/// element is (`[path, realpath]`); `header` as for [`read_string`].
pub(crate) fn read_path(
    memory: &mut dyn Memory,
    layout: &Layout,
    address: u64,
    header: Option<&[u8]>,
) -> Result<Arc<str>, NameError> {
    let address = pointer(address, "path")?;
    let flags = match header {
        Some(header) => field_u64(header, 0),
        None => read_u64(memory, address)?,
    };
    match flags & TYPE_MASK {
        T_STRING => read_string(memory, &layout.string, address, header),
        T_ARRAY => match array_element(memory, &layout.array, address, 0)? {
            Some(path) if path != layout.nil => read_string(memory, &layout.string, path, None),
            _ => Err(NameError::NotString {
                address,
                flags: layout.nil,
            }),
        },
        _ => Err(NameError::NotString { address, flags }),
    }
}
