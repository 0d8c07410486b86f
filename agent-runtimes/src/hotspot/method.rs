//! Java methods by `Method*`: class, name, signature and source file from
//! the constant pool, lines from the compressed line number table.
//!
//! `Method` → `_constMethod` (`ConstMethod`: name and signature indexes
//! into the constant pool, the bytecodes, then the line number table) →
//! `_constants` (`ConstantPool`: `_pool_holder`, the class, whose `_name`
//! is a `Symbol`; its slots follow the header, `Symbol*`s for names).
//! Each step is checked: the class's own constant pool must be the one the
//! method points at, symbols must have a sane length.

use std::{num::NonZeroUsize, sync::Arc};

use lru::LruCache;

use super::{
    HotSpotError, invalid,
    layout::Layout,
    read::{field, field_i32, field_u16, field_u64, read, u64_at},
    stream::{Coding, Stream},
};
use crate::Memory;

/// Longest symbol read (class names, method names, signatures).
const MAX_SYMBOL: usize = 1024;

/// Largest line number table read.
const MAX_LINE_TABLE: u64 = 256 << 10;

/// Methods whose names are kept.
const CACHED_METHODS: usize = 8192;

/// `JVM_ACC_NATIVE`, fixed by the class file format.
const ACC_NATIVE: u64 = 0x0100;

/// A Java method, named.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JavaMethod {
    /// `java.util.HashMap`.
    pub class: Arc<str>,
    /// `get`.
    pub name: Arc<str>,
    /// `(Ljava/lang/Object;)Ljava/lang/Object;`.
    pub signature: Arc<str>,
    /// `java/util/HashMap.java`: the source file in its package's
    /// directory; empty when the class has none.
    pub file: Arc<str>,
    pub native: bool,
    /// Bytes of bytecode.
    pub code_size: u32,
    /// `(bci, line)` pairs in table order.
    lines: Vec<(u32, u32)>,
}

impl JavaMethod {
    /// `java.util.HashMap.get`.
    pub fn function(&self) -> String {
        format!("{}.{}", self.class, self.name)
    }

    /// The line of bytecode index `bci`: the entry at the greatest bci not
    /// above it (as `Method::line_from_bci`); 0 when unknown.
    pub fn line(&self, bci: i32) -> u32 {
        let Ok(bci) = u32::try_from(bci) else {
            return self.lines.first().map_or(0, |&(_, line)| line);
        };
        let mut best: Option<(u32, u32)> = None;
        for &(at, line) in &self.lines {
            if at == bci {
                return line;
            }
            if at < bci && best.is_none_or(|(best_bci, _)| at >= best_bci) {
                best = Some((at, line));
            }
        }
        best.map_or(0, |(_, line)| line)
    }

    /// The bytecode index of the bytecode pointer `bcp` of a method whose
    /// bytecodes start at `code`, if it points into them.
    pub fn bci(&self, code: u64, bcp: u64) -> Option<i32> {
        let bci = bcp.checked_sub(code)?;
        (bci < u64::from(self.code_size)).then_some(bci as i32)
    }

    /// About what the method takes in memory, for bounded caches.
    pub fn heap_bytes(&self) -> usize {
        self.class.len()
            + self.name.len()
            + self.signature.len()
            + self.file.len()
            + self.lines.len() * 8
            + 128
    }
}

/// How the namer's cache fared.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NamerCounts {
    pub hits: u64,
    pub misses: u64,
}

struct Cached {
    /// The `ConstMethod*` when named: a `Method*` reused for another method
    /// after its class was unloaded points at another one.
    const_method: u64,
    /// Where its bytecodes start.
    code: u64,
    method: Arc<JavaMethod>,
    /// When (the caller's monotonic clock) it was last read and still
    /// named this method; 0 for never.
    checked_at: u64,
}

/// Names `Method*`s of one JVM, with a bounded cache.
pub struct MethodNamer {
    cache: LruCache<u64, Cached>,
    counts: NamerCounts,
}

impl Default for MethodNamer {
    fn default() -> Self {
        Self::new()
    }
}

impl MethodNamer {
    pub fn new() -> Self {
        Self {
            cache: LruCache::new(NonZeroUsize::new(CACHED_METHODS).unwrap_or(NonZeroUsize::MIN)),
            counts: NamerCounts::default(),
        }
    }

    pub fn take_counts(&mut self) -> NamerCounts {
        std::mem::take(&mut self.counts)
    }

    /// The method at `method`, and where its bytecodes start.
    pub fn method(
        &mut self,
        memory: &mut dyn Memory,
        layout: &Layout,
        method: u64,
    ) -> Result<(Arc<JavaMethod>, u64), HotSpotError> {
        self.method_at(memory, layout, method, (u64::MAX, 0))
    }

    /// [`Self::method`] for a sample taken at `sampled_at`, any read made
    /// at or after `now` (both on the caller's monotonic clock). A method
    /// whose `Method*` was read after the sample, and still named it, is
    /// believed without reading it again: that read is as late as one made
    /// now, both after the sample. So a batch of samples handled together
    /// reads each method once (an interpreted frame is in most samples of
    /// a thread).
    pub fn method_at(
        &mut self,
        memory: &mut dyn Memory,
        layout: &Layout,
        method: u64,
        (sampled_at, now): (u64, u64),
    ) -> Result<(Arc<JavaMethod>, u64), HotSpotError> {
        if method == 0 || !method.is_multiple_of(8) {
            return Err(invalid("a Method*", method, "null or misaligned"));
        }
        if let Some(cached) = self.cache.get(&method)
            && cached.checked_at >= sampled_at
        {
            self.counts.hits += 1;
            return Ok((cached.method.clone(), cached.code));
        }
        let const_method = u64_at(memory, method.wrapping_add(layout.method_const_method))?;
        if let Some(cached) = self.cache.get_mut(&method)
            && cached.const_method == const_method
        {
            cached.checked_at = cached.checked_at.max(now);
            self.counts.hits += 1;
            return Ok((cached.method.clone(), cached.code));
        }
        self.counts.misses += 1;
        let (named, code) = read_method(memory, layout, method, const_method)?;
        let named = Arc::new(named);
        self.cache.put(
            method,
            Cached {
                const_method,
                code,
                method: named.clone(),
                checked_at: now,
            },
        );
        Ok((named, code))
    }
}

fn read_method(
    memory: &mut dyn Memory,
    layout: &Layout,
    method: u64,
    const_method: u64,
) -> Result<(JavaMethod, u64), HotSpotError> {
    if const_method == 0 || !const_method.is_multiple_of(8) {
        return Err(invalid(
            "a ConstMethod*",
            const_method,
            "null or misaligned",
        ));
    }
    let mut header = vec![0; layout.method_size as usize];
    read(memory, method, &mut header)?;
    let (access_at, access_width) = layout.method_access_flags;
    let access = field(&header, access_at, access_width);

    let mut cm = vec![0; layout.const_method_size as usize];
    read(memory, const_method, &mut cm)?;
    let constants = field_u64(&cm, layout.const_method_constants);
    let (flags_at, flags_width) = layout.const_method_flags;
    let flags = field(&cm, flags_at, flags_width);
    let code_size = u64::from(field_u16(&cm, layout.const_method_code_size));
    let name_index = field_u16(&cm, layout.const_method_name_index);
    let signature_index = field_u16(&cm, layout.const_method_signature_index);
    let total_words = field_i32(&cm, layout.const_method_total_size);
    let code = const_method.wrapping_add(layout.const_method_size);
    if constants == 0 || !constants.is_multiple_of(8) {
        return Err(invalid("a ConstantPool*", constants, "null or misaligned"));
    }
    let total = u64::try_from(total_words).unwrap_or(0) * 8;
    if total < layout.const_method_size + code_size {
        return Err(invalid(
            "a ConstMethod",
            const_method,
            "shorter than its code",
        ));
    }

    let mut pool = vec![0; layout.constant_pool_size as usize];
    read(memory, constants, &mut pool)?;
    let holder = field_u64(&pool, layout.constant_pool_holder);
    let length = field_i32(&pool, layout.constant_pool_length);
    let source_index = field_u16(&pool, layout.constant_pool_source_file);
    if holder == 0 || !holder.is_multiple_of(8) {
        return Err(invalid("a class", holder, "null or misaligned"));
    }
    if u64_at(memory, holder.wrapping_add(layout.instance_klass_constants))? != constants {
        return Err(invalid("a ConstantPool", constants, "not its class's"));
    }
    let slot = |index: u16| -> Result<u64, HotSpotError> {
        if index == 0 || i32::from(index) >= length {
            return Err(invalid("a constant pool index", constants, "out of range"));
        }
        Ok(constants
            .wrapping_add(layout.constant_pool_size)
            .wrapping_add(u64::from(index) * 8))
    };
    let symbol_at = |memory: &mut dyn Memory, pointer: u64| {
        let address = u64_at(memory, pointer)?;
        symbol(memory, layout, address)
    };
    let name = symbol_at(memory, slot(name_index)?)?;
    let signature = symbol_at(memory, slot(signature_index)?)?;
    let class = symbol_at(memory, holder.wrapping_add(layout.klass_name))?;
    let source = match source_index {
        0 => String::new(),
        index => symbol_at(memory, slot(index)?)?,
    };
    let lines = if flags & layout.has_line_number_table != 0 {
        let start = code.wrapping_add(code_size);
        read_line_table(memory, layout, start, const_method.wrapping_add(total))?
    } else {
        Vec::new()
    };
    Ok((
        JavaMethod {
            class: class.replace('/', ".").into(),
            name: name.into(),
            signature: signature.into(),
            file: source_path(&class, source).into(),
            native: access & ACC_NATIVE != 0,
            code_size: code_size as u32,
            lines,
        },
        code,
    ))
}

/// The source file in its package's directory (`java/util/HashMap.java`).
fn source_path(class: &str, source: String) -> String {
    match (class.rfind('/'), source.is_empty()) {
        (_, true) => String::new(),
        (Some(slash), false) => format!("{}/{source}", &class[..slash]),
        (None, false) => source,
    }
}

/// The line number table from `start` to at most `end` (the end of its
/// `ConstMethod`).
fn read_line_table(
    memory: &mut dyn Memory,
    layout: &Layout,
    start: u64,
    end: u64,
) -> Result<Vec<(u32, u32)>, HotSpotError> {
    let length = end.saturating_sub(start).min(MAX_LINE_TABLE);
    let mut table = vec![0; length as usize];
    read(memory, start, &mut table)?;
    line_table(&table, layout.coding)
        .ok_or_else(|| invalid("a line number table", start, "not terminated"))
}

/// A `Symbol`: its length, then its bytes (modified UTF-8).
fn symbol(memory: &mut dyn Memory, layout: &Layout, address: u64) -> Result<String, HotSpotError> {
    if address == 0 || !address.is_multiple_of(8) {
        return Err(invalid("a Symbol*", address, "null or misaligned"));
    }
    let mut length = [0u8; 2];
    read(
        memory,
        address.wrapping_add(layout.symbol_length),
        &mut length,
    )?;
    let length = u16::from_le_bytes(length) as usize;
    if length == 0 || length > MAX_SYMBOL {
        return Err(invalid("a Symbol", address, "an implausible length"));
    }
    let mut body = vec![0; length];
    read(memory, address.wrapping_add(layout.symbol_body), &mut body)?;
    if body
        .iter()
        .any(|&byte| byte == 0 || byte < 0x20 && byte != b'\t')
    {
        return Err(invalid("a Symbol", address, "not text"));
    }
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// The compressed line number table (`CompressedLineNumberReadStream`):
/// each entry a byte `bci_delta << 3 | line_delta` when both fit, else
/// 0xFF then both as signed ints; 0 ends the table.
pub(crate) fn line_table(bytes: &[u8], coding: Coding) -> Option<Vec<(u32, u32)>> {
    let mut stream = Stream::new(bytes, 0, coding);
    let mut lines = Vec::new();
    let (mut bci, mut line) = (0i64, 0i64);
    loop {
        let byte = stream.byte()?;
        match byte {
            0 => return Some(lines),
            0xff => {
                bci += i64::from(stream.signed()?);
                line += i64::from(stream.signed()?);
            }
            _ => {
                bci += i64::from(byte >> 3);
                line += i64::from(byte & 7);
            }
        }
        lines.push((u32::try_from(bci).ok()?, u32::try_from(line).ok()?));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_tables_decode_both_entry_forms() {
        // (0, 10): 0xff, zigzag 0, zigzag 20; (5, 12): 5 << 3 | 2;
        // (5 + 40, 12 - 3): 0xff, zigzag 80, zigzag 5.
        let table = [0xff, 0, 20, 5 << 3 | 2, 0xff, 80, 5, 0];
        let lines = line_table(&table, Coding::Pack200).expect("terminated");
        assert_eq!(lines, [(0, 10), (5, 12), (45, 9)]);
        assert_eq!(
            line_table(&table[..7], Coding::Pack200),
            None,
            "no terminator"
        );
        // JDK 20 on: each coded byte one more.
        let table = [0xff, 1, 21, 5 << 3 | 2, 0xff, 81, 6, 0];
        assert_eq!(line_table(&table, Coding::NoZeroBytes), Some(lines.clone()));
        let method = JavaMethod {
            class: "C".into(),
            name: "m".into(),
            signature: "()V".into(),
            file: "C.java".into(),
            native: false,
            code_size: 50,
            lines,
        };
        assert_eq!(method.line(0), 10);
        assert_eq!(method.line(4), 10);
        assert_eq!(method.line(5), 12);
        assert_eq!(method.line(44), 12);
        assert_eq!(method.line(100), 9);
        assert_eq!(method.line(-1), 10, "method entry");
    }
}
