use std::time::{Duration, SystemTime};

use agent_elf::BuildId;

use super::*;
use crate::{
    aggregate::{ImageRef, MetadataRef},
    process::MappingSpec,
    symbolize::{ObjectSource, PerfMapSource},
};

/// Names kernel addresses `k<hex>` but one, user addresses `u<hex>`.
struct FakeSymbolizer {
    build_id: BuildId,
    profiles_ended: usize,
}

impl FrameSymbolizer for FakeSymbolizer {
    fn kernel(&mut self, address: u64) -> Option<Line> {
        (address != 0xffff_ffff_dead_0000).then(|| Line::named(&format!("k{address:x}")))
    }

    fn user(&mut self, _object: &dyn ObjectSource, vaddr: u64) -> Vec<Line> {
        vec![Line::named(&format!("u{vaddr:x}"))]
    }

    fn jit(&mut self, _perf_map: &dyn PerfMapSource, address: u64) -> Option<Line> {
        Some(Line::named(&format!("jit{address:x}")))
    }

    fn kernel_build_id(&self) -> Option<&BuildId> {
        Some(&self.build_id)
    }

    fn end_of_profile(&mut self) {
        self.profiles_ended += 1;
    }
}

fn spec(start: u64, end: u64, path: &str, kind: MappingKind) -> MappingSpec {
    MappingSpec {
        start,
        end,
        offset: 0,
        dev: 0,
        inode: 0,
        path: path.into(),
        kind,
        deleted: false,
    }
}

/// A file mapping whose object could not be opened, and JIT code without
/// a perf map.
fn image() -> Arc<ProcessImage> {
    Arc::new(ProcessImage::new(
        42,
        "worker".into(),
        vec![
            spec(0x400000, 0x500000, "/bin/worker", MappingKind::File),
            spec(0x600000, 0x700000, "", MappingKind::Anonymous),
        ],
    ))
}

fn interval(stacks: Vec<(StackKey, u64)>) -> AggregatedProfile {
    AggregatedProfile {
        start: SystemTime::now(),
        duration: Duration::from_secs(10),
        samples: stacks.iter().map(|(_, c)| c).sum(),
        dropped: 0,
        stacks,
    }
}

#[test]
fn every_distinct_frame_is_named_once_and_shared() {
    let image = image();
    let metadata = MetadataRef(Arc::new(ProcessMetadata::unknown(42)));
    let key = |tid, kernel: &[u64], user: &[u64]| StackKey {
        image: ImageRef(image.clone()),
        metadata: metadata.clone(),
        tid,
        thread_name: None,
        kernel: kernel.into(),
        user: user
            .iter()
            .copied()
            .map(crate::runtimes::UserFrame::Native)
            .collect(),
        reason: None,
    };
    let aggregated = interval(vec![
        (key(42, &[0xffff_ffff_8100_0010], &[0x401000, 0x601000]), 3),
        (key(43, &[0xffff_ffff_dead_0000], &[0x401000, 0x900000]), 2),
    ]);
    let mut symbolizer = FakeSymbolizer {
        build_id: BuildId::new(&[0xab, 0xcd]),
        profiles_ended: 0,
    };
    let mut cache = FrameCache::new(1 << 20, Arc::new(crate::stats::Stats::default()));
    let symbolized = symbolize_interval(aggregated, &mut symbolizer, &mut cache);
    assert_eq!(symbolizer.profiles_ended, 1, "caches trimmed once");

    let table = &symbolized.table;
    let frames = &table.frames;
    assert_eq!(
        frames.frames.len(),
        5,
        "0x401000 is one frame in both stacks"
    );
    assert_eq!(
        symbolized.stacks[0].frames[1],
        symbolized.stacks[1].frames[1]
    );
    assert_eq!(
        (symbolized.stacks[0].count, symbolized.stacks[1].tid),
        (3, 43)
    );

    let kernel = &frames.frames[symbolized.stacks[0].frames[0]];
    assert_eq!(kernel.origin, Origin::Kernel);
    assert_eq!(kernel.lines[0].function, "kffffffff81000010");
    let kernel_mapping = &frames.mappings[kernel.mapping.expect("kernel mapping")];
    assert!(kernel_mapping.kernel);
    assert_eq!(kernel_mapping.build_id, "abcd");

    // No object behind /bin/worker: its frames cannot be named, and are
    // not an object's to offer a server.
    let file_frame = symbolized.stacks[0].frames[1];
    let worker = &frames.frames[file_frame];
    assert_eq!((worker.origin, worker.lines.len()), (Origin::NoObject, 0));
    assert!(table.object(file_frame).is_none());
    assert!(!table.unnamed_in_object(file_frame));
    let mapping = &frames.mappings[worker.mapping.expect("mapped")];
    assert_eq!(
        (mapping.path.as_str(), mapping.start, mapping.limit),
        ("/bin/worker", 0x400000, 0x500000)
    );

    let jit = &frames.frames[symbolized.stacks[0].frames[2]];
    assert_eq!((jit.origin, jit.lines.len()), (Origin::NoObject, 0));
    assert_eq!(frames.mappings[jit.mapping.expect("mapped")].path, "[anon]");

    let outside = &frames.frames[symbolized.stacks[1].frames[2]];
    assert_eq!((outside.mapping, outside.address), (None, 0x900000));
    let unnamed_kernel = &frames.frames[symbolized.stacks[1].frames[0]];
    assert!(unnamed_kernel.lines.is_empty());
    assert_eq!(frames.mappings.len(), 3, "kernel, file, anonymous");
    assert!(table.objects.iter().all(Option::is_none));
}

#[test]
fn return_addresses_are_looked_up_before_the_call() {
    assert_eq!(lookup_address(0x1000, false), 0x1000);
    assert_eq!(lookup_address(0x1000, true), 0xfff);
    assert_eq!(lookup_address(0, true), 0);
}
