//! One stack, in order: the interpreter frames a sample recorded, spliced
//! into its native user stack where the native interpreter loop ran them.

use std::{ops::Range, sync::Arc};

use super::{InterpretedFrame, UserFrame};

/// One recorded interpreter frame, named.
#[derive(Clone, Debug)]
pub struct NamedFrame {
    pub frame: Arc<InterpretedFrame>,
    /// The outermost frame run by one call of the native interpreter loop.
    pub entry: bool,
}

/// Replaces each native interpreter-loop frame of `native` (innermost
/// first, the first being the interrupted instruction) with the
/// interpreter frames that call ran: the recorded frames, innermost first,
/// are cut into runs ending at each entry frame, and the n-th loop frame
/// from the leaf gets the n-th run.
///
/// Loop frames left over (threads running no interpreted code there) stay
/// as they are; runs left over (the native walk stopped early) go below
/// the last native frame, where they ran.
pub fn splice(
    native: &[u64],
    interpreted: &[NamedFrame],
    eval_loops: &[Range<u64>],
) -> Vec<UserFrame> {
    splice_after(native, interpreted, eval_loops, 0)
}

/// As [`splice`], for an interpreter whose loop frame outlives its
/// frames for a moment: one whose outermost frame just returned (CRuby's
/// `vm_exec_core` after popping its `FINISH` frame) still has its native
/// loop frame at the leaf. Loop frames beyond the runs are left native at
/// the leaf, not the root, so each run still meets its own loop frame.
pub fn splice_leaf_settling(
    native: &[u64],
    interpreted: &[NamedFrame],
    eval_loops: &[Range<u64>],
) -> Vec<UserFrame> {
    let loops = native
        .iter()
        .enumerate()
        .filter(|&(depth, &address)| in_loop(depth, address, eval_loops))
        .count();
    let runs = interpreted.split_inclusive(|frame| frame.entry).count();
    splice_after(native, interpreted, eval_loops, loops.saturating_sub(runs))
}

/// Whether the native frame at `depth` is in one of `eval_loops`.
fn in_loop(depth: usize, address: u64, eval_loops: &[Range<u64>]) -> bool {
    // A return address points after the call, possibly past the end of
    // the function.
    let lookup = if depth > 0 {
        address.saturating_sub(1)
    } else {
        address
    };
    eval_loops.iter().any(|range| range.contains(&lookup))
}

/// The splice, the first `stale` loop frames from the leaf left native.
fn splice_after(
    native: &[u64],
    interpreted: &[NamedFrame],
    eval_loops: &[Range<u64>],
    mut stale: usize,
) -> Vec<UserFrame> {
    let mut runs = interpreted.split_inclusive(|frame| frame.entry);
    let mut out = Vec::with_capacity(native.len() + interpreted.len());
    for (depth, &address) in native.iter().enumerate() {
        let mut in_loop = in_loop(depth, address, eval_loops);
        if in_loop && stale > 0 {
            stale -= 1;
            in_loop = false;
        }
        match runs.next_if(in_loop) {
            Some(run) => out.extend(
                run.iter()
                    .map(|named| UserFrame::Interpreted(named.frame.clone())),
            ),
            None => out.push(UserFrame::Native(address)),
        }
    }
    for run in runs {
        out.extend(
            run.iter()
                .map(|named| UserFrame::Interpreted(named.frame.clone())),
        );
    }
    out
}

trait NextIf: Iterator {
    fn next_if(&mut self, condition: bool) -> Option<Self::Item> {
        if condition { self.next() } else { None }
    }
}

impl<I: Iterator> NextIf for I {}

#[cfg(test)]
mod tests {
    use super::*;

    const LOOP: Range<u64> = 0x5000..0x6000;

    fn named(name: &str, entry: bool) -> NamedFrame {
        NamedFrame {
            frame: Arc::new(InterpretedFrame {
                runtime: super::super::Runtime::Python,
                function: name.into(),
                file: "app.py".into(),
                line: 1,
            }),
            entry,
        }
    }

    fn names(frames: &[UserFrame]) -> Vec<String> {
        frames
            .iter()
            .map(|frame| match frame {
                UserFrame::Native(address) => format!("{address:#x}"),
                UserFrame::Interpreted(frame) => frame.function.to_string(),
            })
            .collect()
    }

    #[test]
    fn each_loop_frame_gets_its_run() {
        // leaf in C, two loop calls (an extension called back into Python
        // between them), main at the bottom.
        let native = [0x9000, 0x5100, 0x9100, 0x5200, 0x1000];
        let interpreted = [
            named("callback", true),
            named("crunch", false),
            named("stage", false),
            named("<module>", true),
        ];
        let stack = splice(&native, &interpreted, &[LOOP]);
        assert_eq!(
            names(&stack),
            [
                "0x9000", "callback", "0x9100", "crunch", "stage", "<module>", "0x1000"
            ]
        );
    }

    #[test]
    fn return_address_just_past_the_loop_counts_as_in_it() {
        let stack = splice(&[0x9000, 0x6000], &[named("f", true)], &[LOOP]);
        assert_eq!(names(&stack), ["0x9000", "f"]);
    }

    #[test]
    fn leftovers_stay_on_either_side() {
        // More loop frames than runs: the outer ones stay native.
        let stack = splice(&[0x5100, 0x5200], &[named("f", true)], &[LOOP]);
        assert_eq!(names(&stack), ["f", "0x5200"]);
        // More runs than loop frames: below the last native frame.
        let stack = splice(&[0x9000], &[named("f", true), named("g", true)], &[LOOP]);
        assert_eq!(names(&stack), ["0x9000", "f", "g"]);
        // No interpreter frames: the native stack as it was.
        let stack = splice(&[0x5100, 0x1000], &[], &[LOOP]);
        assert_eq!(names(&stack), ["0x5100", "0x1000"]);
    }

    #[test]
    fn a_loop_frame_whose_frames_returned_stays_native_at_the_leaf() {
        // The innermost loop call's frames are gone, its native frame not
        // yet: the runs belong to the outer loop frames.
        let native = [0x5100, 0x9000, 0x5200, 0x9100, 0x5300, 0x1000];
        let interpreted = [
            named("each", false),
            named("handler", true),
            named("<main>", true),
        ];
        let stack = splice_leaf_settling(&native, &interpreted, &[LOOP]);
        assert_eq!(
            names(&stack),
            [
                "0x5100", "0x9000", "each", "handler", "0x9100", "<main>", "0x1000"
            ]
        );
        // As many loop frames as runs: the same as `splice`.
        let stack = splice_leaf_settling(&native[2..], &interpreted, &[LOOP]);
        assert_eq!(
            names(&stack),
            names(&splice(&native[2..], &interpreted, &[LOOP]))
        );
    }
}
