//! Whether an object's code keeps frame pointers, judged from its CFI: code
//! built with frame pointers moves the CFA to rbp (`push %rbp; mov
//! %rsp,%rbp`) in nearly every function that has a frame, code built
//! without them almost never does. Functions without a frame (leaves that
//! never move rsp) say nothing either way and are not counted. Bounded: a
//! fixed number of probes spread over `.text`, each a table lookup and one
//! FDE's rows.

use std::ops::Deref;

use gimli::{BaseAddresses, CfaRule, FrameDescriptionEntry, UnwindSection, X86_64};
use object::Object;

use crate::cfi::{CfiContext, CfiSource, FdeVisitor, Reader};

/// Addresses probed per object.
const PROBES: usize = 64;
/// Rows read per FDE at most; real functions have a few dozen.
const MAX_ROWS: usize = 512;

/// What firn concluded about one object's code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ObjectFrames {
    /// Frame-pointer walks are reliable through this object.
    FramePointers,
    /// Frame pointers are absent: walking it needs DWARF.
    NoFramePointers,
    /// No CFI, or no function with a frame to judge by.
    Unknown,
}

/// Counts over the distinct functions the probes hit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrameSurvey {
    /// Functions whose CFA moves away from `rsp + 8` somewhere.
    pub framed: u32,
    /// Of those, functions whose CFA is rbp-based somewhere.
    pub rbp_based: u32,
}

impl FrameSurvey {
    pub fn verdict(&self) -> ObjectFrames {
        if self.framed == 0 {
            ObjectFrames::Unknown
        } else if self.rbp_based * 2 >= self.framed {
            ObjectFrames::FramePointers
        } else {
            ObjectFrames::NoFramePointers
        }
    }
}

/// Go binaries keep frame pointers on amd64, but their CFI describes frames
/// relative to rsp only, so the survey would call them frame-pointer-less:
/// callers ask this first.
pub fn is_go(data: &[u8]) -> bool {
    object::File::parse(data).is_ok_and(|file| {
        [".go.buildinfo", ".note.go.buildid", ".gopclntab"]
            .iter()
            .any(|name| file.section_by_name(name).is_some())
    })
}

pub fn survey<D: Deref<Target = [u8]>>(
    source: &CfiSource<D>,
    context: &mut CfiContext,
) -> FrameSurvey {
    let mut totals = FrameSurvey::default();
    let Some(text) = source.text() else {
        return totals;
    };
    let len = text.end.saturating_sub(text.start);
    if len == 0 {
        return totals;
    }
    let mut shape = Shape {
        seen: Vec::with_capacity(PROBES),
    };
    for probe in 0..PROBES as u64 {
        // Midpoints of PROBES equal slices of .text.
        let offset = (u128::from(len) * u128::from(2 * probe + 1) / (2 * PROBES as u128)) as u64;
        let Some((framed, rbp_based)) = source.visit_fde(text.start + offset, context, &mut shape)
        else {
            continue;
        };
        totals.framed += u32::from(framed);
        totals.rbp_based += u32::from(rbp_based);
    }
    totals
}

/// Whether one FDE has a frame and whether it is rbp-based; each function
/// is counted once however many probes land in it.
struct Shape {
    seen: Vec<u64>,
}

impl FdeVisitor for Shape {
    type Output = (bool, bool);

    fn visit<'a, S: UnwindSection<Reader<'a>>>(
        &mut self,
        section: &S,
        bases: &BaseAddresses,
        fde: &FrameDescriptionEntry<Reader<'a>>,
        context: &mut CfiContext,
    ) -> Option<(bool, bool)> {
        let start = fde.initial_address();
        if self.seen.contains(&start) {
            return None;
        }
        self.seen.push(start);
        let mut rows = fde.rows(section, bases, context).ok()?;
        let (mut framed, mut rbp_based) = (false, false);
        for _ in 0..MAX_ROWS {
            let Ok(Some(row)) = rows.next_row() else {
                break;
            };
            match *row.cfa() {
                CfaRule::RegisterAndOffset { register, .. } if register == X86_64::RBP => {
                    framed = true;
                    rbp_based = true;
                }
                CfaRule::RegisterAndOffset { register, offset }
                    if register == X86_64::RSP && offset == 8 => {}
                _ => framed = true,
            }
        }
        Some((framed, rbp_based))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_fixtures::CHAIN;

    #[test]
    fn frame_pointer_fixture_is_recognized() {
        let source = CfiSource::new(CHAIN).expect("CFI parses");
        let survey = survey(&source, &mut CfiContext::new());
        assert!(survey.framed >= 4, "{survey:?}");
        assert_eq!(survey.verdict(), ObjectFrames::FramePointers, "{survey:?}");
        assert!(!is_go(CHAIN));
    }

    #[test]
    fn verdict_needs_framed_functions() {
        let verdict = |framed, rbp_based| FrameSurvey { framed, rbp_based }.verdict();
        assert_eq!(verdict(0, 0), ObjectFrames::Unknown);
        assert_eq!(verdict(10, 1), ObjectFrames::NoFramePointers);
        assert_eq!(verdict(10, 9), ObjectFrames::FramePointers);
    }

    #[test]
    fn garbage_has_no_verdict() {
        assert!(!is_go(b"not an object"));
        let mut truncated = CHAIN[..CHAIN.len() / 2].to_vec();
        truncated.extend_from_slice(&[0xff; 64]);
        if let Ok(source) = CfiSource::new(&truncated[..]) {
            let _ = survey(&source, &mut CfiContext::new()).verdict();
        }
    }
}
