//! Whether the kernel's frame-pointer walk of a DWARF process's user stack
//! is still taken (see [`WalkJudge`]).

use super::WalkUse;

/// Whether the kernel's frame-pointer walk of a DWARF process's user stack
/// earns its cost. The unwind runs over the stack copy; the walk only
/// continues an unwind that stopped short where the two meet (`stitch`),
/// and costs the sampled thread a walk of up to 127 frames per sample. It
/// is judged over windows of [`WALK_WINDOW`] unwinds: with the walk on, it
/// is skipped from then on when at most 1% of the unwinds needed it; with
/// it off, it comes back when more unwinds stop short than did while it
/// was on, by more than 1% (something it may have continued).
#[derive(Clone, Copy, Debug)]
pub struct WalkJudge {
    /// The map asks for the walk (the default: for frame-pointer
    /// processes, and DWARF ones not yet judged).
    pub on: bool,
    unwinds: u32,
    /// With the walk on: unwinds it continued.
    stitched: u32,
    /// Unwinds that stopped short (with the walk on: that it did not
    /// continue either).
    short: u32,
    /// Unwinds that stopped short, not continued, in the window that
    /// turned the walk off: what stops short whether it is on or not.
    short_before: u32,
}

impl Default for WalkJudge {
    fn default() -> Self {
        Self {
            on: true,
            unwinds: 0,
            stitched: 0,
            short: 0,
            short_before: 0,
        }
    }
}

/// Unwinds over which the walk is judged.
const WALK_WINDOW: u32 = 200;

impl WalkJudge {
    /// Counts one unwind; true when the walk's judgement changed.
    pub fn observe(&mut self, walk: WalkUse) -> bool {
        self.unwinds += 1;
        match walk {
            WalkUse::Unneeded => {}
            WalkUse::Stitched => self.stitched += 1,
            WalkUse::Short => self.short += 1,
        }
        if self.unwinds < WALK_WINDOW {
            return false;
        }
        let percent = self.unwinds / 100;
        let was = self.on;
        if self.on && self.stitched <= percent {
            self.on = false;
            self.short_before = self.short;
        } else if !self.on && self.short > self.short_before + percent {
            self.on = true;
        }
        (self.unwinds, self.stitched, self.short) = (0, 0, 0);
        self.on != was
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(judge: &mut WalkJudge, stitched: u32, short: u32) -> Vec<bool> {
        let mut changes = Vec::new();
        for index in 0..WALK_WINDOW {
            let walk = if index < stitched {
                WalkUse::Stitched
            } else if index < stitched + short {
                WalkUse::Short
            } else {
                WalkUse::Unneeded
            };
            if judge.observe(walk) {
                changes.push(judge.on);
            }
        }
        changes
    }

    #[test]
    fn the_walk_goes_when_hardly_any_unwind_needs_it() {
        let mut judge = WalkJudge::default();
        assert!(judge.on);
        // 2% continued by the walk: kept.
        assert!(window(&mut judge, 4, 0).is_empty());
        // 1%, with as many failing either way: skipped at the window's end.
        assert_eq!(window(&mut judge, 2, 10), [false]);
        // Without it, as many stop short as before, and 1% more: kept off.
        assert!(window(&mut judge, 0, 12).is_empty());
        // More: back on, and judged again.
        assert_eq!(window(&mut judge, 0, 13), [true]);
        assert_eq!(window(&mut judge, 0, 0), [false]);
    }
}
