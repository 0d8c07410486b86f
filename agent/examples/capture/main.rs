//! Fixtures for the unwinder's tests from live processes, behind `cargo
//! xtask capture` (as root):
//!
//! - `--pid PID --output NAME [--samples N]`: samples that process with
//!   firn's BPF program in DWARF mode, unwinds N of the samples over the
//!   process's objects, names their frames, and writes
//!   `captures/NAME/` (the samples, stack copies, maps, JIT perf map,
//!   expected frames) and a CFI extract of each object holding a frame in
//!   `objects/`. Then it replays the written files the way the tests do
//!   and fails unless they unwind to the same frames.
//! - `--object PATH`: the CFI extract of one object, with all its
//!   function symbols.
//!
//! The format is described in `agent_fixtures::capture`.

mod extract;
mod image;
mod live;
mod record;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    fmt::Write as _,
    io::Write as _,
    path::{Path, PathBuf},
};

use agent_elf::BuildId;
use agent_fixtures::capture::{self, SampleLine};
use anyhow::{Context, Result, bail};
use clap::Parser;
use image::{Image, Object, Place};
use live::Files;

/// Objects with more function symbols than this keep only those the
/// captures need (node has over 100,000).
const KEEP_ALL_SYMBOLS_MAX: usize = 20_000;

#[derive(Parser)]
struct Cli {
    /// The fixtures directory: `objects/` and `captures/` are written there.
    #[arg(long)]
    fixtures: PathBuf,
    /// The process to sample.
    #[arg(long, requires = "output")]
    pid: Option<u32>,
    /// The capture's name (`captures/NAME/`).
    #[arg(long, requires = "pid")]
    output: Option<String>,
    /// Samples kept, evenly spread over the recording.
    #[arg(long, default_value_t = 4)]
    samples: usize,
    /// Seconds of sampling the samples are picked from.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Samples per second.
    #[arg(long, default_value_t = 99)]
    frequency: u64,
    /// Objects to extract with all their function symbols.
    #[arg(long)]
    object: Vec<PathBuf>,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    std::fs::create_dir_all(cli.fixtures.join("objects"))?;
    for path in &cli.object {
        let files = live::files(image::read(path)?)?;
        let name = write_extract(&cli.fixtures, &path.to_string_lossy(), &files, None)?;
        println!("objects/{name}");
    }
    if let (Some(pid), Some(name)) = (cli.pid, &cli.output) {
        capture_process(&cli, pid, name)?;
    }
    Ok(())
}

fn gzip(bytes: &[u8]) -> Result<Vec<u8>> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    encoder.write_all(bytes)?;
    Ok(encoder.finish()?)
}

/// `libc.so.6-93ac61ec.gz`: the file name and the build id's start.
fn extract_name(path: &str, build_id: Option<&BuildId>) -> String {
    let name = image::file_name(path).trim_matches(['[', ']']);
    match build_id {
        Some(id) => format!("{name}-{}.gz", &id.to_hex()[..8]),
        None => format!("{name}.gz"),
    }
}

/// Writes the extract of `files` (mapped from `path`) to `objects/` and
/// returns its file name. `needed`: for a capture, its name and the
/// link-time addresses its stacks hold in this object; an object with too
/// many symbols to keep them all keeps those that name these addresses and
/// those of the other captures using the extract. `None` keeps all.
fn write_extract(
    fixtures: &Path,
    path: &str,
    files: &Files,
    needed: Option<(&str, &BTreeSet<u64>)>,
) -> Result<String> {
    let object = Object::new(files.data.clone(), files.debug.clone())?;
    let mut inputs = vec![&files.data[..]];
    inputs.extend(files.debug.as_deref());
    let symbols = extract::function_symbols(&inputs)?;
    let name = extract_name(path, object.layout.build_id.as_ref());
    let needed = match needed {
        Some((this_capture, needed)) if symbols.len() > KEEP_ALL_SYMBOLS_MAX => {
            let mut needed = needed.clone();
            let others = needed_by_other_captures(fixtures, this_capture, &name, &object)?;
            needed.extend(others);
            Some(needed)
        }
        _ => None,
    };
    let chosen = extract::chosen_symbols(&symbols, &object.symbols, needed.as_ref());
    let bytes = extract::extract(&files.data, &chosen)
        .with_context(|| format!("could not extract {path}"))?;
    std::fs::write(fixtures.join("objects").join(&name), gzip(&bytes)?)?;
    Ok(name)
}

/// The link-time addresses in `object` that the captures other than
/// `this_capture` whose objects include the extract `file` may look up.
fn needed_by_other_captures(
    fixtures: &Path,
    this_capture: &str,
    file: &str,
    object: &Object,
) -> Result<BTreeSet<u64>> {
    let mut needed = BTreeSet::new();
    for entry in std::fs::read_dir(fixtures.join("captures"))? {
        let dir = entry?.path();
        if dir.file_name().is_some_and(|name| name == this_capture) {
            continue;
        }
        let text = |name: &str| std::fs::read_to_string(dir.join(name));
        let Ok(manifest) = text("objects") else {
            continue;
        };
        let paths: Vec<&str> = capture::parse_objects(&manifest)?
            .into_iter()
            .filter_map(|(extract, path)| (extract == file).then_some(path))
            .collect();
        if paths.is_empty() {
            continue;
        }
        let samples = capture::parse_samples(&text("samples")?)?;
        let stacks = capture::inflate(&image::read(&dir.join("stacks.gz"))?)?;
        let stacks = capture::split_stacks(&samples, &stacks)?;
        let mappings = capture::parse_maps(&text("maps")?)?;
        for address in lookup_addresses(samples.iter().zip(stacks.iter().map(Vec::as_slice))) {
            let vaddr = mappings
                .iter()
                .find(|m| m.contains(address) && paths.contains(&m.path.as_str()))
                .and_then(|m| object.layout.vaddr_for_file_offset(m.file_offset(address)));
            needed.extend(vaddr);
        }
    }
    Ok(needed)
}

/// What a replay may look up: each sample's interrupted instruction, the
/// words of its stack copy and its walk, as they are and one byte back
/// (return addresses are named by their call).
fn lookup_addresses<'a>(
    samples: impl Iterator<Item = (&'a SampleLine, &'a [u8])>,
) -> BTreeSet<u64> {
    let mut addresses = BTreeSet::new();
    for (sample, stack) in samples {
        let words = stack
            .chunks_exact(8)
            .map(|word| u64::from_le_bytes(word.try_into().unwrap_or_default()));
        for address in words.chain(sample.walk.iter().copied()).chain([sample.ip]) {
            addresses.extend([address, address.wrapping_sub(1)]);
        }
    }
    addresses
}

/// The samples unwound over the live process: each one's frames by name,
/// the `expected` text, and the objects holding frames.
struct UnwoundSamples {
    names: Vec<Vec<String>>,
    expected: String,
    framed: BTreeSet<String>,
}

fn unwind_samples(live: &mut Image, samples: &[record::Recorded]) -> Result<UnwoundSamples> {
    let mut names = Vec::new();
    let mut expected = String::from(
        "# Each sample's frames, innermost first, as `cargo xtask capture` named them\n\
         # (a function symbol per frame, demangled without parameters).\n",
    );
    let mut framed = BTreeSet::new();
    for (index, sample) in samples.iter().enumerate() {
        let unwound = live.unwind(&sample.line, &sample.stack);
        for (depth, &address) in unwound.frames.iter().enumerate() {
            let lookup = if depth == 0 {
                address
            } else {
                address.wrapping_sub(1)
            };
            if let Place::Object { path, .. } = live.place(lookup) {
                framed.insert(path.to_owned());
            }
        }
        let sample_names = live.frame_names(&unwound.frames);
        let joined = if unwound.stitched {
            ", joined with the kernel's walk"
        } else {
            ""
        };
        writeln!(
            expected,
            "\n# sample {index}: tid {}, {:?}{joined}",
            sample.line.tid, unwound.outcome.stop,
        )?;
        for frame in &sample_names {
            writeln!(expected, "{frame}")?;
        }
        names.push(sample_names);
    }
    Ok(UnwoundSamples {
        names,
        expected,
        framed,
    })
}

/// What the fixture files of a capture hold besides the samples.
struct CaptureFiles {
    maps: String,
    objects: String,
    perf_map: String,
    expected: String,
}

fn write_capture(dir: &Path, samples: &[record::Recorded], files: &CaptureFiles) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let lines: String = samples
        .iter()
        .map(|sample| sample.line.to_line() + "\n")
        .collect();
    let stacks: Vec<u8> = samples
        .iter()
        .flat_map(|s| s.stack.iter().copied())
        .collect();
    std::fs::write(dir.join("samples"), lines)?;
    std::fs::write(dir.join("stacks.gz"), gzip(&stacks)?)?;
    std::fs::write(dir.join("maps"), &files.maps)?;
    std::fs::write(dir.join("objects"), &files.objects)?;
    std::fs::write(dir.join("expected"), &files.expected)?;
    let perf_map = dir.join("perf.map");
    if files.perf_map.is_empty() {
        let _ = std::fs::remove_file(perf_map);
    } else {
        std::fs::write(perf_map, &files.perf_map)?;
    }
    Ok(())
}

fn capture_process(cli: &Cli, pid: u32, name: &str) -> Result<()> {
    let recorded = record::record(pid, cli.seconds, cli.frequency)?;
    if recorded.is_empty() {
        bail!("no sample of process {pid} had its stack copied");
    }
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    let perf_map =
        std::fs::read_to_string(format!("/proc/{pid}/root/tmp/perf-{pid}.map")).unwrap_or_default();
    let recorded_count = recorded.len();
    let samples = record::spread(recorded, cli.samples);
    eprintln!(
        "{recorded_count} samples of process {pid} had their stack copied; kept {}",
        samples.len()
    );
    let (mut live, files) = live::image(pid, &maps, &perf_map)?;
    let unwound = unwind_samples(&mut live, &samples)?;

    // Objects keep the symbols, and the perf map the entries, that name
    // what a replay may look up.
    let mut needed: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
    let mut jit = Vec::new();
    let recorded = samples.iter().map(|s| (&s.line, s.stack.as_slice()));
    for &address in &lookup_addresses(recorded) {
        match live.place(address) {
            Place::Object { path, vaddr, .. } => {
                needed.entry(path.to_owned()).or_default().insert(vaddr);
            }
            Place::Anonymous => jit.push(address),
            _ => {}
        }
    }
    let mut objects = String::new();
    for path in &unwound.framed {
        let needed = needed.get(path).map(|needed| (name, needed));
        let file = write_extract(&cli.fixtures, path, &files[path], needed)?;
        writeln!(objects, "{file} {path}")?;
    }
    let perf_map = live
        .perf_map
        .iter()
        .filter(|entry| jit.iter().any(|&address| entry.contains(address)))
        .map(|entry| format!("{:x} {:x} {}\n", entry.start, entry.size, entry.name))
        .collect();
    let files = CaptureFiles {
        maps,
        objects,
        perf_map,
        expected: unwound.expected,
    };
    write_capture(&cli.fixtures.join("captures").join(name), &samples, &files)?;

    let replayed = replay(&cli.fixtures, name)?;
    image::check_same(name, &unwound.names, &replayed)?;
    print!("captures/{name}:\n{}{}", files.objects, files.expected);
    Ok(())
}

/// The capture `name` as the tests see it: its files and the extracts.
fn replay(fixtures: &Path, name: &str) -> Result<Vec<Vec<String>>> {
    let dir = fixtures.join("captures").join(name);
    let text = |file: &str| -> Result<String> {
        std::fs::read_to_string(dir.join(file))
            .with_context(|| format!("could not read {}", dir.join(file).display()))
    };
    let samples: Vec<SampleLine> = capture::parse_samples(&text("samples")?)?;
    let stacks = capture::inflate(&image::read(&dir.join("stacks.gz"))?)?;
    let stacks = capture::split_stacks(&samples, &stacks)?;
    let manifest = text("objects")?;
    let mut objects = HashMap::new();
    for (file, path) in capture::parse_objects(&manifest)? {
        let bytes = capture::inflate(&image::read(&fixtures.join("objects").join(file))?)?;
        objects.insert(path.to_owned(), Object::new(bytes, None)?);
    }
    let perf_map = image::jit_symbols(&text("perf.map").unwrap_or_default())?;
    let mut image = Image {
        mappings: capture::parse_maps(&text("maps")?)?,
        objects,
        perf_map,
    };
    Ok(samples
        .iter()
        .zip(&stacks)
        .map(|(sample, stack)| {
            let unwound = image.unwind(sample, stack);
            image.frame_names(&unwound.frames)
        })
        .collect())
}
