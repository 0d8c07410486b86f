//! `/proc/PID/maps`. The paths in it are chosen by the process (any file
//! it maps, under any name), so nothing in a line may make the parser
//! panic.

use crate::makedev;

/// A line of the maps text is not as the kernel writes it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("could not parse line {line} of /proc/{pid}/maps")]
pub struct ParseError {
    pub pid: u32,
    /// 1-based.
    pub line: usize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MappingKind {
    /// Backed by a file; `path` is as the process sees it.
    File,
    /// The kernel's vDSO.
    Vdso,
    /// Executable memory with no file (JIT code).
    Anonymous,
}

/// One executable mapping.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MappingSpec {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    /// `makedev(major, minor)` as the kernel reports it for the file.
    pub dev: u64,
    pub inode: u64,
    pub path: String,
    pub kind: MappingKind,
    /// The file was deleted or replaced after it was mapped.
    pub deleted: bool,
}

/// The fields of one maps line, as the kernel prints them:
/// `start-end perms offset major:minor inode   path`.
struct Line<'a> {
    start: u64,
    end: u64,
    executable: bool,
    offset: u64,
    dev: u64,
    inode: u64,
    /// Empty for anonymous memory; may hold spaces.
    path: &'a str,
}

/// The next space-separated field of `rest`, and what follows it.
fn field(rest: &str) -> Option<(&str, &str)> {
    let rest = rest.trim_start_matches(' ');
    let end = rest.find(' ').unwrap_or(rest.len());
    (end > 0).then(|| rest.split_at(end))
}

fn hex(text: &str) -> Option<u64> {
    u64::from_str_radix(text, 16).ok()
}

fn parse_line(line: &str) -> Option<Line<'_>> {
    let (range, rest) = field(line)?;
    let (perms, rest) = field(rest)?;
    let (offset, rest) = field(rest)?;
    let (dev, rest) = field(rest)?;
    let (inode, rest) = field(rest)?;
    let (start, end) = range.split_once('-')?;
    let (major, minor) = dev.split_once(':')?;
    if perms.len() != 4 {
        return None;
    }
    Some(Line {
        start: hex(start)?,
        end: hex(end)?,
        executable: perms.as_bytes()[2] == b'x',
        offset: hex(offset)?,
        dev: makedev(hex(major)?, hex(minor)?),
        inode: inode.parse().ok()?,
        path: rest.trim(),
    })
}

/// What a mapping's path says it is; `None` for what there is nothing to
/// symbolize in (`[vsyscall]`, `[vvar]`, SysV shared memory).
fn classify(path: &str) -> Option<(MappingKind, String, bool)> {
    if path.is_empty() {
        return Some((MappingKind::Anonymous, String::new(), false));
    }
    if path == "[vdso]" {
        return Some((MappingKind::Vdso, path.to_owned(), false));
    }
    if path.starts_with('[') || path.starts_with("/SYSV") {
        return None;
    }
    let (path, deleted) = match path.strip_suffix(" (deleted)") {
        Some(stripped) => (stripped, true),
        None => (path, false),
    };
    // memfd code is JIT output, not a file to symbolize.
    let kind = if path.starts_with("/memfd:") {
        MappingKind::Anonymous
    } else {
        MappingKind::File
    };
    Some((kind, path.to_owned(), deleted))
}

/// The executable mappings in the text of `/proc/PID/maps`, sorted by start;
/// `pid` only names the file in errors.
pub fn parse_maps(pid: u32, text: &[u8]) -> Result<Vec<MappingSpec>, ParseError> {
    let text = String::from_utf8_lossy(text);
    let mut mappings = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.is_empty() {
            continue;
        }
        let line = parse_line(line).ok_or(ParseError {
            pid,
            line: index + 1,
        })?;
        if !line.executable {
            continue;
        }
        let Some((kind, path, deleted)) = classify(line.path) else {
            continue;
        };
        mappings.push(MappingSpec {
            start: line.start,
            end: line.end,
            offset: line.offset,
            dev: line.dev,
            inode: line.inode,
            path,
            kind,
            deleted,
        });
    }
    mappings.sort_by_key(|m| m.start);
    Ok(mappings)
}

/// One executable mapping as the kernel's `PROCMAP_QUERY` ioctl reports
/// it (binary fields, the name as the maps text would print it but not
/// escaped); `None` where the text's line would be left out too.
pub fn from_query(
    start: u64,
    end: u64,
    offset: u64,
    (major, minor): (u32, u32),
    inode: u64,
    name: &[u8],
) -> Option<MappingSpec> {
    let name = String::from_utf8_lossy(name);
    let (kind, path, deleted) = classify(&name)?;
    Some(MappingSpec {
        start,
        end,
        offset,
        dev: makedev(u64::from(major), u64::from(minor)),
        inode,
        path,
        kind,
        deleted,
    })
}

impl MappingSpec {
    pub fn contains(&self, address: u64) -> bool {
        address >= self.start && address < self.end
    }
}

impl AsRef<MappingSpec> for MappingSpec {
    fn as_ref(&self) -> &MappingSpec {
        self
    }
}

/// Index of the mapping containing `address`, in mappings sorted by start
/// as [`parse_maps`] returns them.
pub fn mapping_index<M: AsRef<MappingSpec>>(mappings: &[M], address: u64) -> Option<usize> {
    let index = mappings.partition_point(|m| m.as_ref().start <= address);
    let candidate = index.checked_sub(1)?;
    mappings[candidate]
        .as_ref()
        .contains(address)
        .then_some(candidate)
}

/// The executable's path: the first file mapping, when the main binary is
/// mapped.
pub fn executable<M: AsRef<MappingSpec>>(mappings: &[M]) -> Option<&str> {
    mappings
        .iter()
        .map(AsRef::as_ref)
        .find(|m| m.kind == MappingKind::File)
        .map(|m| m.path.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d4e0a00000-55d4e0a01000 r--p 00000000 fe:01 1311834                    /usr/bin/chain
55d4e0a01000-55d4e0a02000 r-xp 00001000 fe:01 1311834                    /usr/bin/chain
55d4e0a02000-55d4e0a03000 r--p 00002000 fe:01 1311834                    /usr/bin/chain
55d4e1c5e000-55d4e1c7f000 rw-p 00000000 00:00 0                          [heap]
7f2a1c028000-7f2a1c17d000 r-xp 00028000 fe:01 1049013                    /usr/lib/x86_64-linux-gnu/libc.so.6
7f2a1c300000-7f2a1c301000 rwxp 00000000 00:00 0 
7f2a1c400000-7f2a1c401000 r-xp 00000000 00:05 2048                       /memfd:jit (deleted)
7f2a1c500000-7f2a1c501000 r-xp 00000000 fe:01 99                         /opt/app/old.so (deleted)
7ffd6b9e8000-7ffd6ba09000 rw-p 00000000 00:00 0                          [stack]
7ffd6bbc4000-7ffd6bbc6000 r-xp 00000000 00:00 0                          [vdso]
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
";

    #[test]
    fn keeps_executable_mappings_only() {
        let maps = parse_maps(1, MAPS.as_bytes()).expect("parses");
        let paths: Vec<&str> = maps.iter().map(|m| m.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "/usr/bin/chain",
                "/usr/lib/x86_64-linux-gnu/libc.so.6",
                "",
                "/memfd:jit",
                "/opt/app/old.so",
                "[vdso]",
            ]
        );
        let exe = &maps[0];
        assert_eq!(
            (exe.start, exe.end, exe.offset),
            (0x55d4e0a01000, 0x55d4e0a02000, 0x1000)
        );
        assert_eq!(exe.inode, 1311834);
        assert_eq!(exe.dev, makedev(0xfe, 1));
        assert_eq!(exe.kind, MappingKind::File);
        assert_eq!(maps[2].kind, MappingKind::Anonymous);
        assert_eq!(maps[3].kind, MappingKind::Anonymous);
        assert!(maps[4].deleted);
        assert_eq!(maps[5].kind, MappingKind::Vdso);
    }

    #[test]
    fn addresses_find_their_mapping_and_the_executable_is_the_first_file() {
        let maps = parse_maps(1, MAPS.as_bytes()).expect("parses");
        assert_eq!(mapping_index(&maps, 0x55d4e0a01000), Some(0));
        assert_eq!(mapping_index(&maps, 0x55d4e0a01fff), Some(0));
        assert_eq!(
            mapping_index(&maps, 0x55d4e0a02000),
            None,
            "end is exclusive"
        );
        assert_eq!(mapping_index(&maps, 0x7ffd6bbc5000), Some(5));
        assert_eq!(mapping_index(&maps, 0), None);
        assert_eq!(mapping_index(&maps, u64::MAX), None);
        assert_eq!(executable(&maps), Some("/usr/bin/chain"));
        assert_eq!(executable(&maps[2..4]), None, "only anonymous code");
    }

    #[test]
    fn garbage_is_a_parse_error() {
        assert!(matches!(
            parse_maps(7, b"this is not a maps file\n"),
            Err(ParseError { pid: 7, line: 1 })
        ));
        let truncated = &MAPS.as_bytes()[..MAPS.len() / 2];
        assert!(parse_maps(7, truncated).is_err());
    }

    #[test]
    fn paths_are_whatever_the_process_named_its_files() {
        // procfs panicked on a path starting with /SYSV shorter than the
        // SysV key it expected.
        let maps = "\
7f2a1c028000-7f2a1c17d000 r-xp 00028000 fe:01 1049013 /SYSV
7f2a1c300000-7f2a1c301000 r-xp 00000000 fe:01 7   /opt/my app/lib x.so
7f2a1c400000-7f2a1c401000 r-xp 00000000 fe:01 8   [stack:
7f2a1c500000-7f2a1c501000 r-xp 00000000 fe:01 9   (deleted)
";
        let paths: Vec<String> = parse_maps(1, maps.as_bytes())
            .expect("parses")
            .into_iter()
            .map(|m| m.path)
            .collect();
        assert_eq!(paths, ["/opt/my app/lib x.so", "(deleted)"]);
        assert!(parse_maps(1, b"1-2 r-xp 0 fe:01 x /a\n").is_err());
        assert!(parse_maps(1, b"1-2 rx 0 fe:01 1 /a\n").is_err());
    }

    #[test]
    fn a_queried_mapping_is_classified_as_its_maps_line_would_be() {
        let file = from_query(0x1000, 0x2000, 0x3000, (0xfe, 1), 42, b"/usr/lib/libc.so.6")
            .expect("a file");
        assert_eq!(
            (file.start, file.end, file.offset, file.inode),
            (0x1000, 0x2000, 0x3000, 42)
        );
        assert_eq!(file.dev, makedev(0xfe, 1));
        assert_eq!(file.kind, MappingKind::File);
        let gone = from_query(0, 1, 0, (0, 0), 1, b"/opt/old.so (deleted)").expect("a file");
        assert_eq!((gone.path.as_str(), gone.deleted), ("/opt/old.so", true));
        let jit = from_query(0, 1, 0, (0, 0), 0, b"").expect("anonymous");
        assert_eq!(jit.kind, MappingKind::Anonymous);
        let vdso = from_query(0, 1, 0, (0, 0), 0, b"[vdso]").expect("the vdso");
        assert_eq!(vdso.kind, MappingKind::Vdso);
        assert!(from_query(0, 1, 0, (0, 0), 0, b"[anon:x]").is_none());
        // Not escaped, unlike the text: the name is the file's own.
        let newline = from_query(0, 1, 0, (0, 0), 3, b"/tmp/a\nb").expect("a file");
        assert_eq!(newline.path, "/tmp/a\nb");
    }
}
