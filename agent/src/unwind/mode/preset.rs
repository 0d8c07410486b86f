//! A new process whose maps are read only at its first sample
//! (`ProcessTable::on_exec`) gets at its exec the unwinding its
//! executable's earlier process was given there: until its first sample
//! is decided, the BPF program would otherwise copy its whole stack for
//! every sample.

use std::sync::{Arc, Weak};

use super::{Decision, ProcessUnwinding, Sizing, UnwindMode, UnwindPolicy, WalkJudge, entry};
use crate::{process::ProcessImage, unwind::learned::ExecutableKey};

/// What a process was decided at its exec, for the next ones of its
/// executable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Preset {
    unwinding: ProcessUnwinding,
    executable: Option<ExecutableKey>,
}

impl Preset {
    /// Frame pointers, for tests of what keeps presets.
    #[cfg(test)]
    pub fn frame_pointers() -> Self {
        Self {
            unwinding: ProcessUnwinding::FramePointers,
            executable: None,
        }
    }
}

impl UnwindPolicy {
    /// What `image` (just decided) was given, to preset the next
    /// processes of its executable with.
    pub fn preset_of(&self, image: &Arc<ProcessImage>) -> Option<Preset> {
        let decision = self.decisions.peek(&image.tgid)?;
        std::ptr::eq(decision.image.as_ptr(), Arc::as_ptr(image)).then(|| Preset {
            unwinding: decision.unwinding,
            executable: ExecutableKey::of(image),
        })
    }

    /// `tgid` executed a program whose earlier process got `preset`: its
    /// copy is set as that one's was (with what the executable's
    /// processes taught since), undecided until its first sample.
    pub fn apply_preset(&mut self, tgid: u32, preset: Preset) {
        if self.mode != UnwindMode::Auto {
            return;
        }
        let learned = preset
            .executable
            .and_then(|key| self.learned.size(key, self.copy_bytes))
            .filter(|_| preset.unwinding == ProcessUnwinding::Dwarf);
        let wanted = match preset.unwinding {
            ProcessUnwinding::Dwarf => learned.unwrap_or(self.copy_bytes),
            ProcessUnwinding::FramePointers => self.leaf_copy_bytes,
        };
        // The BPF program gave it the full copy at its exec.
        let copy = if wanted == self.copy_bytes
            || self.set_copy(tgid, entry(wanted, preset.unwinding, true))
        {
            wanted
        } else {
            self.copy_bytes
        };
        let in_map = self.map.is_some();
        self.remember(
            tgid,
            Decision {
                image: Weak::new(),
                unwinding: preset.unwinding,
                in_map,
                copy,
                sizing: Sizing {
                    fitted: learned.is_some(),
                    ..Sizing::default()
                },
                walk: WalkJudge::default(),
            },
        );
    }
}
