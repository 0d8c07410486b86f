//! The namer over the made-up process of `image.rs`: names as Ruby gives
//! them, lines from both kinds of table, and objects that are no longer
//! what was cached.

use agent_common::InterpreterFrame;

use super::image::{
    BLOCK, DUMMY, FILE, IFUNC, IMEMO_CREF, IMEMO_ISEQ, IMEMO_MENT, Image, METHOD, World,
    fuzz_input, world,
};
use crate::{
    fuzzing::ruby_frame,
    ruby::{NameError, NamerCounts, RubyFrame, RubyNamer},
};

fn name(world: &mut World, frame: &InterpreterFrame) -> Result<Option<RubyFrame>, NameError> {
    RubyNamer::new(1 << 20).name(&world.process, &mut world.image, frame)
}

fn named(world: &mut World, frame: &InterpreterFrame) -> (String, String, u32) {
    let named = name(world, frame)
        .unwrap_or_else(|error| panic!("{frame:x?}: {error}"))
        .unwrap_or_else(|| panic!("{frame:x?}: hidden"));
    (
        named.function.to_string(),
        named.file.to_string(),
        named.line,
    )
}

#[test]
fn methods_are_named_by_their_class() {
    let mut world = world();
    for (frame, function, line) in [
        (world.work, "Busy#work", 13),
        (world.block, "block (2 levels) in Busy#work", 15),
        (world.run, "Worker.run", 21),
        (world.helper, "helper", 32),
        // Named by its original name, as Ruby does.
        (world.aliased, "Busy#work", 11),
    ] {
        assert_eq!(
            named(&mut world, &frame),
            (function.into(), FILE.into(), line)
        );
    }
    let (times, main) = (world.times, world.main);
    let times = named(&mut world, &times);
    assert_eq!(times, ("Integer#times".into(), String::new(), 0));
    let main = named(&mut world, &main);
    assert_eq!(main, ("<main>".into(), FILE.into(), 40));
}

#[test]
fn lines_from_positions_and_from_the_succinct_index() {
    let mut world = world();
    let work = world.work;
    let block = world.block;
    // `pc` is past the instruction: position p is named by pc p + 1.
    let work_start = work.instruction - 11 * 8;
    let block_start = block.instruction - 66 * 8;
    for (position, line) in [
        (0, 11),
        (1, 11),
        (2, 12),
        (8, 12),
        (9, 13),
        (19, 13),
        (20, 15),
    ] {
        let frame = InterpreterFrame {
            instruction: work_start + (position + 1) * 8,
            ..work
        };
        assert_eq!(named(&mut world, &frame).2, line, "work {position}");
    }
    for (position, line) in [(0, 13), (59, 13), (60, 15), (599, 15), (600, 16), (699, 16)] {
        let frame = InterpreterFrame {
            instruction: block_start + (position + 1) * 8,
            ..block
        };
        assert_eq!(named(&mut world, &frame).2, line, "block {position}");
    }
    // At the sequence's start (not started): its first entry.
    let frame = InterpreterFrame {
        instruction: work_start,
        ..work
    };
    assert_eq!(named(&mut world, &frame).2, 11);
    // Before it, past its end or between VALUEs: the `def` line.
    for instruction in [work_start - 8, work_start + 31 * 8, work_start + 3] {
        let frame = InterpreterFrame {
            instruction,
            ..work
        };
        assert_eq!(named(&mut world, &frame).2, 10, "{instruction:#x}");
    }
}

#[test]
fn frames_users_do_not_see_are_not_named() {
    let mut world = world();
    let work = world.work;
    for frame in [
        InterpreterFrame {
            data: DUMMY,
            ..work
        },
        InterpreterFrame {
            data: IFUNC,
            ..work
        },
        InterpreterFrame {
            instruction: 0,
            ..work
        },
        InterpreterFrame {
            code: 0,
            data: METHOD,
            ..work
        },
    ] {
        assert_eq!(
            name(&mut world, &frame).expect("no error"),
            None,
            "{frame:x?}"
        );
    }
}

#[test]
fn a_method_entry_of_another_method_leaves_the_label() {
    let mut world = world();
    // `helper`'s entry on `work`'s frame (a block of another method, or a
    // stale stamp): the label is not qualified with the wrong class.
    let frame = InterpreterFrame {
        stamp: world.helper.stamp,
        ..world.work
    };
    assert_eq!(named(&mut world, &frame).0, "work");
    // A cref is no method entry; nor is nothing.
    let cref = world.main.stamp;
    for stamp in [cref, 0, 0x1234_5678_9abc_def1] {
        let frame = InterpreterFrame {
            stamp,
            data: BLOCK,
            ..world.block
        };
        assert_eq!(named(&mut world, &frame).0, "block (2 levels) in work");
    }
    // A C function's frame needs its method entry.
    let frame = InterpreterFrame {
        stamp: cref,
        ..world.times
    };
    assert!(matches!(
        name(&mut world, &frame),
        Err(NameError::NotMethodEntry {
            flags: IMEMO_CREF,
            ..
        })
    ));
}

#[test]
fn changed_objects_are_read_again_or_refused() {
    let mut world = world();
    let mut namer = RubyNamer::new(1 << 20);
    let process = world.process;
    let work = world.work;
    let named = |namer: &mut RubyNamer, image: &mut Image, frame: &InterpreterFrame| {
        namer
            .name(&process, image, frame)
            .map(|named| named.map(|named| named.function.to_string()))
    };
    assert_eq!(
        named(&mut namer, &mut world.image, &work).expect("named"),
        Some("Busy#work".into())
    );
    assert_eq!(
        named(&mut namer, &mut world.image, &work).expect("named"),
        Some("Busy#work".into())
    );
    let counts = namer.take_counts();
    assert_eq!((counts.misses, counts.hits), (1, 1));
    // The method entry now says another owner (the slot was reused): read
    // again, named after what it is now.
    let worker_singleton = world.image.get(world.run.stamp + 32);
    world.image.word(work.stamp + 32, worker_singleton);
    assert_eq!(
        named(&mut namer, &mut world.image, &work).expect("named"),
        Some("Worker.work".into())
    );
    // The iseq is no longer one: an error, not the cached name.
    world.image.word(work.code, IMEMO_MENT);
    assert!(matches!(
        named(&mut namer, &mut world.image, &work),
        Err(NameError::NotIseq {
            flags: IMEMO_MENT,
            ..
        })
    ));
    // An iseq again, of another body: read again.
    world.image.word(work.code, IMEMO_ISEQ);
    let run_body = world.image.get(world.run.code + 16);
    world.image.word(work.code + 16, run_body);
    assert_eq!(
        named(&mut namer, &mut world.image, &work).expect("named"),
        Some("run".into()),
        "run's body under work's method entry: not qualified by it"
    );
    let counts = namer.take_counts();
    assert_eq!((counts.misses, counts.hits, counts.stale), (3, 0, 1));
}

#[test]
fn unreadable_memory_is_an_error_never_a_panic() {
    let world = world();
    let frames = [
        world.work,
        world.block,
        world.run,
        world.helper,
        world.times,
        world.main,
        world.aliased,
    ];
    // Every prefix of the memory: the reads past it fail.
    let full = world.image.bytes.len();
    for length in (0..full).step_by(97).chain([full - 1]) {
        let mut image = Image {
            bytes: world.image.bytes[..length].to_vec(),
        };
        let mut namer = RubyNamer::new(1 << 20);
        for frame in &frames {
            let _ = namer.name(&world.process, &mut image, frame);
        }
    }
    let mut nothing = Image::default();
    let mut namer = RubyNamer::new(1 << 20);
    assert!(matches!(
        namer.name(&world.process, &mut nothing, &world.work),
        Err(NameError::Read { .. })
    ));
    assert_eq!(namer.take_counts().read_failures, 1);
}

#[test]
fn counts_evictions_and_forgetting() {
    let mut world = world();
    // Room for about one entry: everything is read every time.
    let mut namer = RubyNamer::new(1);
    for _ in 0..2 {
        for frame in [world.work, world.run] {
            namer
                .name(&world.process, &mut world.image, &frame)
                .expect("named");
        }
    }
    let counts = namer.take_counts();
    assert_eq!(counts.hits, 0);
    assert!(counts.evictions > 4, "{counts:?}");
    // Processes are apart, and a forgotten one is looked at anew.
    let mut namer = RubyNamer::new(1 << 20);
    let other = crate::ruby::RubyProcess {
        key: 8,
        ..world.process
    };
    namer
        .name(&world.process, &mut world.image, &world.work)
        .expect("named");
    namer
        .name(&other, &mut world.image, &world.work)
        .expect("named");
    namer.forget(world.process.key);
    namer
        .name(&other, &mut world.image, &world.work)
        .expect("named");
    let counts = namer.take_counts();
    assert_eq!((counts.misses, counts.hits), (2, 1));
    assert_eq!(namer.take_counts(), NamerCounts::default());
}

/// The seeds of the `ruby_frame` fuzz target are inputs of this world
/// (`FIRN_WRITE_SEEDS=1` writes them).
#[test]
fn fuzz_seeds_are_the_made_up_process() {
    let world = world();
    let directory = agent_fixtures::dir().join("../fuzz/corpus/ruby_frame");
    for (file, frame) in [
        ("block_in_module_method", world.block),
        ("singleton_method", world.run),
        ("c_function", world.times),
    ] {
        let input = fuzz_input(&world, &frame);
        ruby_frame(&input);
        let path = directory.join(file);
        if std::env::var_os("FIRN_WRITE_SEEDS").is_some() {
            std::fs::write(&path, &input).expect("written");
        }
        let stored = std::fs::read(&path).unwrap_or_default();
        assert!(stored == input, "{} is not this world's", path.display());
    }
}
