//! A workload firn cannot name but a server given its debug file can: the
//! chain workload stripped, its debug file holding no symbol table and
//! more DWARF than a 1 MiB `--debuginfo-cache-size` may index.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use crate::common::workloads_dir;

pub struct StrippedWorkload {
    pub binary: PathBuf,
    /// Of the binary and its debug file, in hex.
    pub build_id: String,
    /// For `--debuginfo-directories`.
    pub debug_dir: PathBuf,
    /// `DEBUG_DIR/.build-id/xx/rest.debug`.
    pub debug_file: PathBuf,
}

impl StrippedWorkload {
    /// Builds it in `dir`.
    pub fn build(dir: &Path) -> Self {
        let padding = dir.join("padding.c");
        write_padding_source(&padding);
        let binary = dir.join("chain");
        run(Command::new("gcc")
            .args(["-O1", "-g", "-fno-omit-frame-pointer", "-o"])
            .arg(&binary)
            .arg(workloads_dir().join("chain.c"))
            .arg(&padding));
        let full_debug = dir.join("chain.debug");
        run(Command::new("objcopy")
            .arg("--only-keep-debug")
            .arg(&binary)
            .arg(&full_debug));
        run(Command::new("strip").arg("--strip-all").arg(&binary));
        let build_id = {
            use object::Object;
            let bytes = std::fs::read(&binary).expect("binary");
            let file = object::File::parse(bytes.as_slice()).expect("ELF");
            let id = file
                .build_id()
                .expect("notes")
                .expect("gcc adds a build id");
            id.iter().map(|b| format!("{b:02x}")).collect::<String>()
        };
        let debug_dir = dir.join("debug");
        let debug_file = debug_dir
            .join(".build-id")
            .join(&build_id[..2])
            .join(format!("{}.debug", &build_id[2..]));
        std::fs::create_dir_all(debug_file.parent().expect("parent")).expect("debug directory");
        // DWARF only, compressed (so all of it counts against firn's
        // cache): no symbol table firn could name the frames from.
        run(Command::new("objcopy")
            .args([
                "--strip-all",
                "--keep-section=.debug_*",
                "--compress-debug-sections=zlib",
            ])
            .arg(&full_debug)
            .arg(&debug_file));
        {
            use object::{Object, ObjectSection};
            let bytes = std::fs::read(&debug_file).expect("debug file");
            let file = object::File::parse(bytes.as_slice()).expect("ELF");
            assert!(
                file.section_by_name(".symtab").is_none(),
                "the debug file keeps no symbol table"
            );
            let info = file.section_by_name(".debug_info").expect(".debug_info");
            let size = info
                .compressed_file_range()
                .expect("range")
                .uncompressed_size;
            assert!(size > 1 << 20, "{size} bytes of .debug_info");
        }
        Self {
            binary,
            build_id,
            debug_dir,
            debug_file,
        }
    }
}

/// Types enough for some 1.4 MB of `.debug_info`.
fn write_padding_source(path: &Path) {
    let members: String = (0..100).map(|m| format!(" int m{m};")).collect();
    let source: String = (0..1000)
        .map(|s| format!("struct pad{s} {{{members} }};\nstruct pad{s} firn_pad{s};\n"))
        .collect();
    std::fs::write(path, source).expect("padding source");
}

fn run(command: &mut Command) {
    let status = command
        .status()
        .unwrap_or_else(|error| panic!("could not run {command:?}: {error}"));
    assert!(status.success(), "{command:?} failed: {status}");
}
