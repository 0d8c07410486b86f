//! The running process's objects, read as root while it runs: through
//! `/proc/PID/map_files` (deleted files and other mount namespaces too),
//! the vDSO from its memory, and each object's Debian debug file by build
//! id for the names stripped from it.

use std::{collections::HashMap, os::unix::fs::FileExt, path::PathBuf};

use crate::image::{self, Image, Object};
use agent_fixtures::capture::{self, ExecMapping};
use anyhow::{Context, Result};

/// Where Debian's `-dbg` and `-dbgsym` packages put debug files.
const DEBUG_ROOT: &str = "/usr/lib/debug/.build-id";

/// An object's bytes and its debug file's, if installed.
pub struct Files {
    pub data: Vec<u8>,
    pub debug: Option<Vec<u8>>,
}

fn read_mapping(pid: u32, mapping: &ExecMapping) -> Result<Vec<u8>> {
    if mapping.path == "[vdso]" {
        let memory = std::fs::File::open(format!("/proc/{pid}/mem"))?;
        let mut bytes = vec![0; (mapping.end - mapping.start) as usize];
        memory.read_exact_at(&mut bytes, mapping.start)?;
        return Ok(bytes);
    }
    let map_file = format!(
        "/proc/{pid}/map_files/{:x}-{:x}",
        mapping.start, mapping.end
    );
    std::fs::read(&map_file).with_context(|| format!("could not read {map_file}"))
}

/// The separate debug file of an object with `build_id`, if installed.
pub fn debug_file(build_id: Option<&agent_elf::BuildId>) -> Option<Vec<u8>> {
    let hex = build_id?.to_hex();
    let path: PathBuf = [DEBUG_ROOT, &hex[..2], &format!("{}.debug", &hex[2..])]
        .iter()
        .collect();
    std::fs::read(path).ok()
}

/// Reads an object file and its debug file.
pub fn files(data: Vec<u8>) -> Result<Files> {
    let layout = agent_elf::read_layout(&data)?;
    let debug = debug_file(layout.build_id.as_ref());
    Ok(Files { data, debug })
}

/// The process `pid` as its `maps` text and perf map describe it: every
/// executable object it maps, by path.
pub fn image(pid: u32, maps: &str, perf_map: &str) -> Result<(Image, HashMap<String, Files>)> {
    let mappings = capture::parse_maps(maps)?;
    let mut objects = HashMap::new();
    let mut files_by_path = HashMap::new();
    for mapping in &mappings {
        if mapping.path.is_empty() || objects.contains_key(&mapping.path) {
            continue;
        }
        let loaded = read_mapping(pid, mapping)
            .and_then(files)
            .and_then(|files| {
                let object = Object::new(files.data.clone(), files.debug.clone())?;
                Ok((object, files))
            });
        match loaded {
            Ok((object, files)) => {
                objects.insert(mapping.path.clone(), object);
                files_by_path.insert(mapping.path.clone(), files);
            }
            Err(error) => eprintln!("{}: no object: {error:#}", mapping.path),
        }
    }
    let perf_map = image::jit_symbols(perf_map)?;
    Ok((
        Image {
            mappings,
            objects,
            perf_map,
        },
        files_by_path,
    ))
}
