//! The Java name of a JVM's threads: the whole `java.lang.Thread` name,
//! where the OS thread's name (comm) HotSpot sets from it is cut at 15
//! bytes.
//!
//! The thread list (`ThreadsSMRSupport::_java_thread_list`) gives each
//! `JavaThread` its OS thread id (`_osthread->_thread_id`) and its
//! `java.lang.Thread` (`_threadObj`, an `OopHandle`). The tables do not
//! locate the fields of Java objects: the offsets of `Thread.name`,
//! `String.value` and `String.coder` come from the classes' own field
//! metadata (JDK 17: `InstanceKlass::_fields`, six `u2` a field; JDK 21
//! on: the UNSIGNED5 stream `_fieldinfo_stream`). Objects are read with
//! compressed oops and class pointers (the default below a 32 GiB heap);
//! every object read is checked to be of the class it should be (the
//! `String` class from `vmClasses`), so any other layout fails rather than
//! naming a thread wrongly.

use super::{
    HotSpotError, LayoutError, VmTables, invalid,
    read::{field_u16, read, u64_at},
};
use crate::Memory;

/// Most threads read from one JVM's list.
pub const MAX_THREADS: usize = 1 << 16;

/// Longest name read, in UTF-16 units or bytes.
pub const MAX_NAME: usize = 256;

/// A static field: its offset is in the class's mirror, not its objects.
const ACC_STATIC: u16 = 0x0008;

/// Most fields of a class looked through.
const MAX_FIELDS: usize = 1024;

/// Where a class's field metadata is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldMetadata {
    /// JDK 17: `_fields` (`Array<u2>`), `_java_fields_count` tuples of
    /// `FieldInfo::field_slots`; the offset packed with a tag.
    Tuples {
        fields: u64,
        count: u64,
        slots: u64,
        name_index: u64,
        low_packed: u64,
        high_packed: u64,
        tag_size: u64,
    },
    /// JDK 21 on: `_fieldinfo_stream` (`Array<u1>`).
    Stream { stream: u64 },
}

/// The offsets the thread names are read through. A JVM whose tables
/// lack one has no thread names, its frames are unaffected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadLayout {
    pub java_thread_list: u64,
    pub threads_list_length: u64,
    pub threads_list_threads: u64,
    pub osthread: u64,
    pub osthread_thread_id: u64,
    pub thread_obj: u64,
    pub oop_handle_obj: u64,
    pub narrow_oop_base: u64,
    pub narrow_oop_shift: u64,
    pub narrow_klass_base: u64,
    pub narrow_klass_shift: u64,
    pub narrow_klass_offset: u64,
    /// `vmClasses`' slots of `java.lang.Thread` and `java.lang.String`.
    pub thread_klass: u64,
    pub string_klass: u64,
    pub array_u2_data: u64,
    pub array_u1_data: u64,
    pub metadata: FieldMetadata,
    pub instance_klass_constants: u64,
    pub constant_pool_size: u64,
    pub symbol_length: u64,
    pub symbol_body: u64,
}

fn vm_class(tables: &VmTables, name: &str) -> Option<u64> {
    tables.static_address(
        "vmClasses",
        &format!("_klasses[static_cast<int>(vmClassID::{name}_klass_knum)]"),
    )
}

impl ThreadLayout {
    #[expect(
        clippy::too_many_lines,
        reason = "one lookup per field, in the order of the struct"
    )]
    pub fn new(tables: &VmTables) -> Result<Self, LayoutError> {
        let mut missing = Vec::new();
        let mut need = |value: Option<u64>, what: &str| {
            value.unwrap_or_else(|| {
                missing.push(what.to_owned());
                0
            })
        };
        let either = |a: (&str, &str), b: (&str, &str)| {
            tables
                .static_address(a.0, a.1)
                .or_else(|| tables.static_address(b.0, b.1))
        };
        let metadata = match tables.offset("InstanceKlass", "_fieldinfo_stream") {
            Some(stream) => FieldMetadata::Stream { stream },
            None => FieldMetadata::Tuples {
                fields: need(
                    tables.offset("InstanceKlass", "_fields"),
                    "InstanceKlass::_fields",
                ),
                count: need(
                    tables.offset("InstanceKlass", "_java_fields_count"),
                    "InstanceKlass::_java_fields_count",
                ),
                slots: need(
                    tables.constant("FieldInfo::field_slots").map(|v| v as u64),
                    "FieldInfo::field_slots",
                ),
                name_index: need(
                    tables
                        .constant("FieldInfo::name_index_offset")
                        .map(|v| v as u64),
                    "FieldInfo::name_index_offset",
                ),
                low_packed: need(
                    tables
                        .constant("FieldInfo::low_packed_offset")
                        .map(|v| v as u64),
                    "FieldInfo::low_packed_offset",
                ),
                high_packed: need(
                    tables
                        .constant("FieldInfo::high_packed_offset")
                        .map(|v| v as u64),
                    "FieldInfo::high_packed_offset",
                ),
                tag_size: need(
                    tables.constant("FIELDINFO_TAG_SIZE").map(|v| v as u64),
                    "FIELDINFO_TAG_SIZE",
                ),
            },
        };
        let layout = ThreadLayout {
            java_thread_list: need(
                tables.static_address("ThreadsSMRSupport", "_java_thread_list"),
                "static ThreadsSMRSupport::_java_thread_list",
            ),
            threads_list_length: need(
                tables.offset("ThreadsList", "_length"),
                "ThreadsList::_length",
            ),
            threads_list_threads: need(
                tables.offset("ThreadsList", "_threads"),
                "ThreadsList::_threads",
            ),
            osthread: need(
                tables
                    .offset("JavaThread", "_osthread")
                    .or_else(|| tables.offset("Thread", "_osthread")),
                "Thread::_osthread",
            ),
            osthread_thread_id: need(
                tables.offset("OSThread", "_thread_id"),
                "OSThread::_thread_id",
            ),
            thread_obj: need(
                tables.offset("JavaThread", "_threadObj"),
                "JavaThread::_threadObj",
            ),
            oop_handle_obj: need(tables.offset("OopHandle", "_obj"), "OopHandle::_obj"),
            narrow_oop_base: need(
                either(
                    ("CompressedOops", "_narrow_oop._base"),
                    ("CompressedOops", "_base"),
                ),
                "static CompressedOops::_base",
            ),
            narrow_oop_shift: need(
                either(
                    ("CompressedOops", "_narrow_oop._shift"),
                    ("CompressedOops", "_shift"),
                ),
                "static CompressedOops::_shift",
            ),
            narrow_klass_base: need(
                either(
                    ("CompressedKlassPointers", "_narrow_klass._base"),
                    ("CompressedKlassPointers", "_base"),
                ),
                "static CompressedKlassPointers::_base",
            ),
            narrow_klass_shift: need(
                either(
                    ("CompressedKlassPointers", "_narrow_klass._shift"),
                    ("CompressedKlassPointers", "_shift"),
                ),
                "static CompressedKlassPointers::_shift",
            ),
            narrow_klass_offset: need(
                tables.offset("oopDesc", "_metadata._compressed_klass"),
                "oopDesc::_metadata._compressed_klass",
            ),
            thread_klass: need(vm_class(tables, "Thread"), "vmClasses Thread_klass"),
            string_klass: need(vm_class(tables, "String"), "vmClasses String_klass"),
            array_u2_data: need(tables.offset("Array<u2>", "_data"), "Array<u2>::_data"),
            array_u1_data: need(tables.offset("Array<u1>", "_data"), "Array<u1>::_data"),
            metadata,
            instance_klass_constants: need(
                tables.offset("InstanceKlass", "_constants"),
                "InstanceKlass::_constants",
            ),
            constant_pool_size: need(tables.size("ConstantPool"), "the size of ConstantPool"),
            symbol_length: need(tables.offset("Symbol", "_length"), "Symbol::_length"),
            symbol_body: need(tables.offset("Symbol", "_body"), "Symbol::_body"),
        };
        match missing.is_empty() {
            true => Ok(layout),
            false => Err(LayoutError::Missing {
                what: missing.join(", "),
            }),
        }
    }
}

/// One JVM's decoding of objects, read once: the compressed pointers'
/// bases and shifts, the classes, the field offsets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectLayout {
    oop_base: u64,
    oop_shift: u32,
    klass_base: u64,
    klass_shift: u32,
    string_klass: u64,
    /// `Thread.name`, `String.value`, `String.coder`.
    thread_name: u64,
    string_value: u64,
    string_coder: u64,
}

impl ObjectLayout {
    /// Reads what decoding objects needs; fails until the JVM has loaded
    /// its core classes.
    pub fn read(memory: &mut dyn Memory, threads: &ThreadLayout) -> Result<Self, HotSpotError> {
        let shift = |memory: &mut dyn Memory, address| -> Result<u32, HotSpotError> {
            let value = super::read::i32_at(memory, address)?;
            match value {
                0..=8 => Ok(value as u32),
                _ => Err(invalid("a compressed pointer shift", address, "above 8")),
            }
        };
        let thread_klass = u64_at(memory, threads.thread_klass)?;
        let string_klass = u64_at(memory, threads.string_klass)?;
        if thread_klass == 0 || string_klass == 0 {
            return Err(invalid("vmClasses", threads.thread_klass, "not loaded yet"));
        }
        Ok(Self {
            oop_base: u64_at(memory, threads.narrow_oop_base)?,
            oop_shift: shift(memory, threads.narrow_oop_shift)?,
            klass_base: u64_at(memory, threads.narrow_klass_base)?,
            klass_shift: shift(memory, threads.narrow_klass_shift)?,
            string_klass,
            thread_name: field_offset(memory, threads, thread_klass, "name")?,
            string_value: field_offset(memory, threads, string_klass, "value")?,
            string_coder: field_offset(memory, threads, string_klass, "coder")?,
        })
    }

    fn decode(&self, narrow: u32) -> u64 {
        self.oop_base
            .wrapping_add(u64::from(narrow) << self.oop_shift)
    }

    fn klass_of(
        &self,
        memory: &mut dyn Memory,
        threads: &ThreadLayout,
        oop: u64,
    ) -> Result<u64, HotSpotError> {
        let mut narrow = [0; 4];
        read(
            memory,
            oop.wrapping_add(threads.narrow_klass_offset),
            &mut narrow,
        )?;
        Ok(self
            .klass_base
            .wrapping_add(u64::from(u32::from_le_bytes(narrow)) << self.klass_shift))
    }

    fn narrow_at(&self, memory: &mut dyn Memory, address: u64) -> Result<u64, HotSpotError> {
        let mut narrow = [0; 4];
        read(memory, address, &mut narrow)?;
        match u32::from_le_bytes(narrow) {
            0 => Err(invalid("a reference", address, "null")),
            narrow => Ok(self.decode(narrow)),
        }
    }

    /// The name of the `java.lang.Thread` at `thread`.
    pub fn thread_name(
        &self,
        memory: &mut dyn Memory,
        threads: &ThreadLayout,
        thread: u64,
    ) -> Result<String, HotSpotError> {
        let string = self.narrow_at(memory, thread.wrapping_add(self.thread_name))?;
        if self.klass_of(memory, threads, string)? != self.string_klass {
            return Err(invalid("Thread.name", string, "not a String"));
        }
        let value = self.narrow_at(memory, string.wrapping_add(self.string_value))?;
        let mut coder = [0; 1];
        read(memory, string.wrapping_add(self.string_coder), &mut coder)?;
        // A byte[]: its length (an int) follows the narrow klass, its
        // bytes the length.
        let length_at = value.wrapping_add(threads.narrow_klass_offset + 4);
        let length = super::read::i32_at(memory, length_at)?;
        let Ok(length) = usize::try_from(length) else {
            return Err(invalid("String.value", value, "a negative length"));
        };
        let mut bytes = vec![0; length.min(MAX_NAME * 2)];
        read(memory, length_at + 4, &mut bytes)?;
        Ok(match coder[0] {
            0 => bytes.iter().map(|&byte| char::from(byte)).collect(),
            1 => {
                let units: Vec<u16> = bytes
                    .chunks_exact(2)
                    .map(|unit| u16::from_le_bytes([unit[0], unit[1]]))
                    .collect();
                String::from_utf16_lossy(&units)
            }
            _ => return Err(invalid("String.coder", string, "neither LATIN1 nor UTF16")),
        }
        .chars()
        .take(MAX_NAME)
        .collect())
    }
}

/// Each Java thread's OS thread id and `java.lang.Thread` object (0 for
/// a thread whose object is not set yet), as of now.
pub fn java_threads(
    memory: &mut dyn Memory,
    threads: &ThreadLayout,
) -> Result<Vec<(u32, u64)>, HotSpotError> {
    let list = u64_at(memory, threads.java_thread_list)?;
    if list == 0 {
        return Err(invalid("the thread list", threads.java_thread_list, "null"));
    }
    let length = u64::from(super::read::i32_at(
        memory,
        list.wrapping_add(threads.threads_list_length),
    )? as u32);
    if length as usize > MAX_THREADS {
        return Err(invalid("the thread list", list, "implausibly long"));
    }
    let array = u64_at(memory, list.wrapping_add(threads.threads_list_threads))?;
    let mut pointers = vec![0u8; length as usize * 8];
    read(memory, array, &mut pointers)?;
    let mut out = Vec::with_capacity(length as usize);
    for pointer in pointers.chunks_exact(8) {
        let java_thread = u64::from_le_bytes(pointer.try_into().unwrap_or_default());
        let osthread = u64_at(memory, java_thread.wrapping_add(threads.osthread))?;
        if osthread == 0 {
            continue;
        }
        let tid =
            super::read::i32_at(memory, osthread.wrapping_add(threads.osthread_thread_id))? as u32;
        let handle = u64_at(memory, java_thread.wrapping_add(threads.thread_obj))?;
        let object = match handle {
            0 => 0,
            handle => u64_at(memory, handle.wrapping_add(threads.oop_handle_obj))?,
        };
        out.push((tid, object));
    }
    Ok(out)
}

/// The offset of the instance field `name` of the class at `klass`.
fn field_offset(
    memory: &mut dyn Memory,
    threads: &ThreadLayout,
    klass: u64,
    name: &str,
) -> Result<u64, HotSpotError> {
    let constants = u64_at(memory, klass.wrapping_add(threads.instance_klass_constants))?;
    // Only the symbol's first bytes: a name longer than the one wanted
    // is another.
    let pool_symbol = |memory: &mut dyn Memory, index: u64| -> Result<bool, HotSpotError> {
        let slot = constants
            .wrapping_add(threads.constant_pool_size)
            .wrapping_add(index * 8);
        let address = u64_at(memory, slot)?;
        if address == 0 || !address.is_multiple_of(8) {
            return Err(invalid("a Symbol*", address, "null or misaligned"));
        }
        let mut length = [0; 2];
        read(
            memory,
            address.wrapping_add(threads.symbol_length),
            &mut length,
        )?;
        if usize::from(u16::from_le_bytes(length)) != name.len() {
            return Ok(false);
        }
        let mut body = vec![0; name.len()];
        read(memory, address.wrapping_add(threads.symbol_body), &mut body)?;
        Ok(body == name.as_bytes())
    };
    match threads.metadata {
        FieldMetadata::Tuples {
            fields,
            count,
            slots,
            name_index,
            low_packed,
            high_packed,
            tag_size,
        } => {
            let array = u64_at(memory, klass.wrapping_add(fields))?;
            let mut count_bytes = [0; 2];
            read(memory, klass.wrapping_add(count), &mut count_bytes)?;
            let count = usize::from(u16::from_le_bytes(count_bytes)).min(MAX_FIELDS);
            let mut data = vec![0; count * slots as usize * 2];
            read(memory, array.wrapping_add(threads.array_u2_data), &mut data)?;
            for tuple in data.chunks_exact(slots as usize * 2) {
                let index = u64::from(field_u16(tuple, name_index * 2));
                // Access flags first (FieldInfo::access_flags_offset 0).
                if field_u16(tuple, 0) & ACC_STATIC != 0 {
                    continue;
                }
                if pool_symbol(memory, index)? {
                    let packed = u64::from(field_u16(tuple, high_packed * 2)) << 16
                        | u64::from(field_u16(tuple, low_packed * 2));
                    // The low tag bits say an offset was set (1).
                    if packed & ((1 << tag_size) - 1) != 1 {
                        return Err(invalid("a field's offset", klass, "not set"));
                    }
                    return Ok(packed >> tag_size);
                }
            }
        }
        FieldMetadata::Stream { stream } => {
            let array = u64_at(memory, klass.wrapping_add(stream))?;
            let length = super::read::i32_at(memory, array)?;
            let length = usize::try_from(length).unwrap_or(0).min(MAX_FIELDS * 32);
            let mut data = vec![0; length];
            read(memory, array.wrapping_add(threads.array_u1_data), &mut data)?;
            for (index, offset, access) in stream_fields(&data)
                .ok_or_else(|| invalid("a field info stream", array, "undecodable"))?
            {
                if access & u32::from(ACC_STATIC) != 0 {
                    continue;
                }
                if pool_symbol(memory, index)? {
                    return Ok(offset);
                }
            }
        }
    }
    Err(invalid("a class", klass, "without the field wanted"))
}

/// The Java fields of an encoded `FieldInfoStream` (JDK 21 on), as their
/// name's constant pool index, offset and access flags: the counts of Java and injected
/// fields, then per field its name and signature indexes, offset, access
/// flags and field flags, followed by what those flags announce.
pub(crate) fn stream_fields(data: &[u8]) -> Option<Vec<(u64, u64, u32)>> {
    let mut at = 0;
    let java_fields = unsigned5(data, &mut at)?;
    let _injected = unsigned5(data, &mut at)?;
    let mut out = Vec::new();
    for _ in 0..java_fields.min(MAX_FIELDS as u32) {
        let name = unsigned5(data, &mut at)?;
        let _signature = unsigned5(data, &mut at)?;
        let offset = unsigned5(data, &mut at)?;
        let access = unsigned5(data, &mut at)?;
        let flags = unsigned5(data, &mut at)?;
        // initialized, generic, contended: one more number each.
        for bit in [0, 2, 4] {
            if flags & (1 << bit) != 0 {
                unsigned5(data, &mut at)?;
            }
        }
        out.push((u64::from(name), u64::from(offset), access));
    }
    Some(out)
}

/// One number of HotSpot's UNSIGNED5 encoding (`unsigned5.hpp`): bytes
/// from 1, each below 192 ending the number (L = 191 values), at most five, 6 bits more
/// a byte.
pub(crate) fn unsigned5(data: &[u8], at: &mut usize) -> Option<u32> {
    const X: u32 = 1;
    const L: u32 = 191;
    let mut sum: u32 = 0;
    let mut shift = 0;
    for i in 0..5 {
        let byte = u32::from(*data.get(*at)?);
        if byte < X {
            return None;
        }
        *at += 1;
        sum = sum.wrapping_add((byte - X) << shift);
        if byte < X + L || i == 4 {
            return Some(sum);
        }
        shift += 6;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The head of `java.lang.String`'s stream in Temurin 25: `value` at
    /// 20, `coder` at 16, `hash` at 12, `hashIsZero` at 17, then statics.
    #[test]
    fn string_fields_of_jdk25_decode() {
        let stream = [
            12, 2, 14, 15, 21, 19, 9, 18, 19, 17, 19, 1, 22, 23, 13, 3, 9, 26, 27, 18, 3, 1, 233,
            15, 234, 15, 129, 27, 2, 236, 15, 41, 27, 139, 25, 1, 218, 15, 219, 15, 121, 27, 1,
            238, 15, 239, 15, 137, 27, 2, 133, 232, 7, 233, 7, 125, 26, 5, 241, 15, 242, 15, 19,
            140, 25, 2, 243, 15, 244, 15, 19, 141, 25, 2, 245, 15, 216, 5, 242, 11,
        ];
        let fields = stream_fields(&stream).expect("the stream decodes");
        let offsets: Vec<(u64, u64)> = fields
            .iter()
            .filter(|(_, _, access)| access & u32::from(ACC_STATIC) == 0)
            .map(|&(name, offset, _)| (name, offset))
            .collect();
        assert_eq!(offsets, [(13, 20), (17, 16), (21, 12), (25, 17)]);
        assert_eq!(fields.len(), 11);
    }

    #[test]
    fn unsigned5_decodes_one_and_several_bytes() {
        let mut at = 0;
        assert_eq!(unsigned5(&[1], &mut at), Some(0));
        let mut at = 0;
        assert_eq!(unsigned5(&[191], &mut at), Some(190));
        // The first byte's 192 - 1 plus (2 - 1) << 6.
        let mut at = 0;
        assert_eq!(unsigned5(&[192, 2], &mut at), Some(191 + 64));
        assert_eq!(at, 2);
        let mut at = 0;
        assert_eq!(unsigned5(&[0], &mut at), None);
        let mut at = 0;
        assert_eq!(unsigned5(&[200], &mut at), None);
    }
}
