//! JIT symbols from a process's `/tmp/perf-PID.map` (Node with
//! `--perf-basic-prof`, JVM perf map agents): one `START SIZE name` line per
//! compiled function, hex numbers, appended as code is compiled. The table
//! is read incrementally (only what was appended since the last read) and
//! holds at most a given number of bytes of the file. Parsing is pure; the
//! file is read through [`PerfMapSource`], which the caller opens.

use std::{io, sync::Arc};

/// Overlapping entries checked before giving up on an address: recompiled
/// code can be mapped over older code at a nearby start.
const OVERLAP_SCAN: usize = 8;
/// Read chunk size.
const CHUNK: usize = 64 << 10;

#[derive(Clone, Copy, Debug)]
struct Entry {
    start: u64,
    end: u64,
    /// Line order: later lines describe newer code and win.
    seq: u32,
    name_start: u32,
    name_len: u32,
}

/// A perf map file as the caller opened it.
pub trait PerfMapSource {
    /// Who the file is and how long it is now.
    fn stat(&self) -> io::Result<PerfMapStat>;
    /// Reads at `offset`, as `pread` does (0 at the end).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
}

/// A perf map file's identity and length.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PerfMapStat {
    /// Device and inode: another file under the same name is another map.
    pub identity: (u64, u64),
    pub len: u64,
}

/// Perf maps the caller shares are read through the share.
impl<T: PerfMapSource + ?Sized> PerfMapSource for Arc<T> {
    fn stat(&self) -> io::Result<PerfMapStat> {
        (**self).stat()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        (**self).read_at(buf, offset)
    }
}

/// What one read of a perf map did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadReport {
    pub entries: usize,
    /// Lines that did not parse.
    pub errors: usize,
    /// The file holds more than the table may read.
    pub truncated: bool,
}

/// The functions of one perf map file, sorted by start address.
#[derive(Debug, Default)]
pub struct PerfMapTable {
    entries: Vec<Entry>,
    names: String,
    /// Bytes of the file parsed so far (whole lines only).
    consumed: u64,
    /// Identity of the file parsed, to notice a rewrite.
    identity: (u64, u64),
    truncated: bool,
    /// The order number of the next entry pushed.
    next_seq: u32,
}

/// One perf map line: start, size, name.
pub fn parse_line(line: &str) -> Option<(u64, u64, &str)> {
    let mut fields = line.splitn(3, ' ');
    let hex = |text: &str| {
        let text = text.strip_prefix("0x").unwrap_or(text);
        u64::from_str_radix(text, 16).ok()
    };
    let start = hex(fields.next()?)?;
    let size = hex(fields.next()?)?;
    let name = fields.next()?.trim_end_matches('\r');
    (!name.is_empty() && size > 0).then_some((start, size, name))
}

impl PerfMapTable {
    pub fn heap_bytes(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<Entry>()
            + self.names.capacity()
            + std::mem::size_of::<Self>()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Parses the complete lines of `text` (the file's bytes following what
    /// was parsed before); returns how many bytes were consumed, so a line
    /// still being written is read again next time.
    pub fn extend(&mut self, text: &[u8]) -> (usize, ReadReport) {
        let complete = text
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |newline| newline + 1);
        let mut report = ReadReport::default();
        for line in text[..complete].split(|&b| b == b'\n') {
            if line.is_empty() {
                continue;
            }
            let parsed = std::str::from_utf8(line).ok().and_then(parse_line);
            let Some((start, size, name)) = parsed else {
                report.errors += 1;
                continue;
            };
            if !self.push(start, size, name) {
                report.truncated = true;
                break;
            }
            report.entries += 1;
        }
        self.settle();
        self.consumed += complete as u64;
        (complete, report)
    }

    /// Adds one function; `false` when the table cannot index more.
    /// [`Self::settle`] must run before the next lookup.
    pub(crate) fn push(&mut self, start: u64, size: u64, name: &str) -> bool {
        let (Ok(name_start), Ok(name_len)) =
            (u32::try_from(self.names.len()), u32::try_from(name.len()))
        else {
            return false;
        };
        // Counted apart from the entries: deduplication drops some, and
        // newer code must still win over all older.
        let seq = self.next_seq;
        let Some(next) = seq.checked_add(1) else {
            return false;
        };
        self.next_seq = next;
        self.names.push_str(name);
        self.entries.push(Entry {
            start,
            end: start.saturating_add(size),
            seq,
            name_start,
            name_len,
        });
        true
    }

    /// Sorts what was pushed: newest first among equal starts, then one
    /// entry per start.
    pub(crate) fn settle(&mut self) {
        self.entries
            .sort_unstable_by(|a, b| a.start.cmp(&b.start).then(b.seq.cmp(&a.seq)));
        self.entries.dedup_by_key(|e| e.start);
    }

    /// The function whose code covers `address`.
    pub fn lookup(&self, address: u64) -> Option<&str> {
        let index = self.entries.partition_point(|e| e.start <= address);
        self.entries[..index]
            .iter()
            .rev()
            .take(OVERLAP_SCAN)
            .filter(|e| address < e.end)
            .max_by_key(|e| e.seq)
            .map(|e| &self.names[e.name_start as usize..(e.name_start + e.name_len) as usize])
    }

    /// Reads what was appended to `file` since the last read, keeping the
    /// table within `max_file_bytes` of the file. A file that shrank or was
    /// replaced is read again from the start.
    pub fn refresh(
        &mut self,
        file: &dyn PerfMapSource,
        max_file_bytes: u64,
    ) -> io::Result<ReadReport> {
        let PerfMapStat { identity, len } = file.stat()?;
        if identity != self.identity || len < self.consumed {
            *self = Self {
                identity,
                ..Self::default()
            };
        }
        let mut report = ReadReport::default();
        let end = len.min(max_file_bytes);
        let mut pending: Vec<u8> = Vec::new();
        let mut offset = self.consumed;
        while offset < end {
            let want = usize::try_from(end - offset).unwrap_or(CHUNK).min(CHUNK);
            let start = pending.len();
            pending.resize(start + want, 0);
            let read = file.read_at(&mut pending[start..], offset)?;
            pending.truncate(start + read);
            if read == 0 {
                break;
            }
            offset += read as u64;
            let (consumed, chunk) = self.extend(&pending);
            report.entries += chunk.entries;
            report.errors += chunk.errors;
            pending.drain(..consumed);
            if chunk.truncated {
                self.truncated = true;
                break;
            }
        }
        if len > max_file_bytes && !self.truncated {
            self.truncated = true;
            report.truncated = true;
        }
        Ok(report)
    }

    /// Bytes of the file parsed so far.
    pub fn consumed(&self) -> u64 {
        self.consumed
    }
}

/// A perf map in memory, for tests: written to as a JIT appends.
#[cfg(test)]
#[derive(Debug, Default)]
pub(crate) struct MemoryPerfMap {
    pub identity: (u64, u64),
    pub text: std::sync::Mutex<Vec<u8>>,
}

#[cfg(test)]
impl MemoryPerfMap {
    pub fn append(&self, bytes: &[u8]) {
        self.text
            .lock()
            .expect("not poisoned")
            .extend_from_slice(bytes);
    }

    pub fn replace(&self, bytes: &[u8]) {
        *self.text.lock().expect("not poisoned") = bytes.to_vec();
    }
}

#[cfg(test)]
impl PerfMapSource for MemoryPerfMap {
    fn stat(&self) -> io::Result<PerfMapStat> {
        Ok(PerfMapStat {
            identity: self.identity,
            len: self.text.lock().expect("not poisoned").len() as u64,
        })
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let text = self.text.lock().expect("not poisoned");
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(text.len());
        let read = buf.len().min(text.len() - start);
        buf[..read].copy_from_slice(&text[start..start + read]);
        Ok(read)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_parse_with_spaces_in_names() {
        assert_eq!(
            parse_line("7f9e28006040 2c4 JS:*hotLoop /tmp/hot.js:1:17"),
            Some((0x7f9e28006040, 0x2c4, "JS:*hotLoop /tmp/hot.js:1:17"))
        );
        assert_eq!(
            parse_line("0x1000 0x10 Lcom/Foo;bar"),
            Some((0x1000, 0x10, "Lcom/Foo;bar"))
        );
        for bad in [
            "",
            "1000",
            "1000 10",
            "zz 10 f",
            "1000 yy f",
            "1000 0 empty",
        ] {
            assert_eq!(parse_line(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn newer_entries_win_and_partial_lines_wait() {
        let mut table = PerfMapTable::default();
        let (consumed, report) = table.extend(b"1000 100 old\n2000 10 b\nnot a line\n3000 10 par");
        assert_eq!(consumed, "1000 100 old\n2000 10 b\nnot a line\n".len());
        assert_eq!(
            report,
            ReadReport {
                entries: 2,
                errors: 1,
                truncated: false
            }
        );
        assert_eq!(table.lookup(0x1050), Some("old"));
        assert_eq!(table.lookup(0x2005), Some("b"));
        assert_eq!(table.lookup(0x3005), None);
        assert_eq!(table.lookup(0xfff), None);
        // Recompiled code over an old range: at the same start it replaces
        // the old entry, at a nearby start it shadows what it covers.
        table.extend(b"1000 20 new\n2000 40 wide\n2008 10 inner\n");
        assert_eq!(table.lookup(0x1010), Some("new"));
        assert_eq!(table.lookup(0x1080), None);
        assert_eq!(table.lookup(0x200a), Some("inner"));
        assert_eq!(table.lookup(0x2030), Some("wide"));
    }

    #[test]
    fn files_are_read_incrementally_and_bounded() {
        let file = MemoryPerfMap::default();
        file.append(b"1000 10 first\n2000 10 sec");
        let mut table = PerfMapTable::default();
        let report = table.refresh(&file, 1 << 20).expect("reads");
        assert_eq!(report.entries, 1);
        assert_eq!(table.lookup(0x2000), None, "the line is not finished");
        file.append(b"ond\n3000 10 third\n");
        let report = table.refresh(&file, 1 << 20).expect("reads");
        assert_eq!(report.entries, 2, "only what was appended is parsed");
        assert_eq!(table.lookup(0x2001), Some("second"));
        assert_eq!(table.lookup(0x3001), Some("third"));
        assert_eq!(table.len(), 3);

        let mut capped = PerfMapTable::default();
        let report = capped.refresh(&file, 20).expect("reads");
        assert!(report.truncated);
        assert_eq!(capped.len(), 1);
        assert!(capped.consumed() <= 20);

        // A rewritten (shorter) file is parsed from the start.
        file.replace(b"5000 10 fresh\n");
        table.refresh(&file, 1 << 20).expect("reads");
        assert_eq!(table.lookup(0x5001), Some("fresh"));
        assert_eq!(table.lookup(0x1001), None);

        // Another file (a new process reusing the pid) is read afresh,
        // even when it is longer than what was read of the old one.
        let other = MemoryPerfMap {
            identity: (1, 2),
            ..MemoryPerfMap::default()
        };
        other.append(b"5000 10 fresh\n6000 10 other\n");
        table.refresh(&other, 1 << 20).expect("reads");
        assert_eq!(table.lookup(0x6001), Some("other"));
        assert_eq!(table.len(), 2);
    }

    #[test]
    fn garbage_is_counted_not_fatal() {
        let mut table = PerfMapTable::default();
        let (_, report) = table.extend(b"\xff\xfe\n\n 1 2\n\x001000 10 x\n");
        assert_eq!(report.errors, 3);
        assert!(table.is_empty());
    }
}
