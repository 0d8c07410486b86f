//! A process's executable mappings from the kernel's `PROCMAP_QUERY` ioctl
//! on its open maps file: one mapping per call, the kernel skipping those
//! that are not executable, with binary fields and the name unescaped.

use std::{fs::File, io, os::fd::AsFd};

use agent_proc::maps::{MappingSpec, from_query};
use linux_raw_sys::general::{
    procmap_query,
    procmap_query_flags::{PROCMAP_QUERY_COVERING_OR_NEXT_VMA, PROCMAP_QUERY_VMA_EXECUTABLE},
};
use rustix::ioctl::{Updater, ioctl, opcode};

/// `PROCMAP_QUERY`: `_IOWR('f', 17, struct procmap_query)`.
const PROCMAP_QUERY: rustix::ioctl::Opcode = opcode::read_write::<procmap_query>(b'f', 17);
/// The longest name asked for (`PATH_MAX`); a longer one is read as text.
const NAME_BYTES: usize = 4096;
/// Executable mappings at most: past this many the process is unreadable
/// (the text is bounded the same way, by its size).
const MAX_MAPPINGS: usize = 1 << 16;

#[derive(Debug)]
pub enum Error {
    /// The kernel has no `PROCMAP_QUERY` (before 6.11).
    Unsupported,
    /// A mapping's name does not fit [`NAME_BYTES`].
    NameTooLong,
    Io(io::Error),
}

/// The executable mappings of the process whose maps file `maps` is,
/// sorted by start.
pub fn executable_mappings(maps: &File) -> Result<Vec<MappingSpec>, Error> {
    let mut name = vec![0u8; NAME_BYTES];
    let mut mappings = Vec::new();
    let mut next = 0u64;
    loop {
        let mut query = procmap_query {
            size: size_of::<procmap_query>() as u64,
            query_flags: PROCMAP_QUERY_COVERING_OR_NEXT_VMA as u64
                | PROCMAP_QUERY_VMA_EXECUTABLE as u64,
            query_addr: next,
            vma_start: 0,
            vma_end: 0,
            vma_flags: 0,
            vma_page_size: 0,
            vma_offset: 0,
            inode: 0,
            dev_major: 0,
            dev_minor: 0,
            vma_name_size: NAME_BYTES as u32,
            build_id_size: 0,
            vma_name_addr: name.as_mut_ptr() as u64,
            build_id_addr: 0,
        };
        // SAFETY: PROCMAP_QUERY reads and writes a `procmap_query`, which
        // `Updater` lends it; the kernel writes at most `vma_name_size`
        // bytes at `vma_name_addr`, which is `name`, alive and unborrowed
        // until the call returns.
        let result = unsafe {
            ioctl(
                maps.as_fd(),
                Updater::<'_, PROCMAP_QUERY, procmap_query>::new(&mut query),
            )
        };
        match result {
            Ok(()) => {}
            // No executable mapping at or above `next`.
            Err(rustix::io::Errno::NOENT) => break,
            Err(rustix::io::Errno::NOTTY | rustix::io::Errno::INVAL) => {
                return Err(Error::Unsupported);
            }
            Err(rustix::io::Errno::NAMETOOLONG) => return Err(Error::NameTooLong),
            Err(errno) => return Err(Error::Io(errno.into())),
        }
        // The name's size counts its terminating zero; 0 when it has none.
        let name_len = (query.vma_name_size as usize)
            .saturating_sub(1)
            .min(NAME_BYTES);
        if let Some(mapping) = from_query(
            query.vma_start,
            query.vma_end,
            query.vma_offset,
            (query.dev_major, query.dev_minor),
            query.inode,
            &name[..name_len],
        ) {
            if mappings.len() >= MAX_MAPPINGS {
                return Err(Error::Io(io::Error::other(format!(
                    "more than {MAX_MAPPINGS} executable mappings"
                ))));
            }
            mappings.push(mapping);
        }
        // Mappings do not overlap: each answer starts past the last.
        if query.vma_end <= next {
            break;
        }
        next = query.vma_end;
    }
    Ok(mappings)
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    /// The query and the text agree on this process's mappings (on a
    /// kernel with the query; else the test says so and checks nothing).
    #[test]
    fn the_query_finds_what_the_text_lists() {
        let mut file = File::open("/proc/self/maps").expect("own maps");
        let queried = match executable_mappings(&file) {
            Ok(mappings) => mappings,
            Err(Error::Unsupported) => {
                eprintln!("skipped: this kernel has no PROCMAP_QUERY (Linux 6.11+)");
                return;
            }
            Err(error) => panic!("query failed: {error:?}"),
        };
        let mut text = Vec::new();
        file.read_to_end(&mut text).expect("own maps text");
        let listed = agent_proc::maps::parse_maps(0, &text).expect("parses");
        // The test binary maps nothing between the two reads.
        assert_eq!(queried, listed);
        let exe = std::env::current_exe().expect("own executable");
        assert_eq!(
            agent_proc::maps::executable(&queried),
            exe.to_str(),
            "{queried:?}"
        );
    }
}
