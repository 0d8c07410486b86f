//! A new process whose maps are read only at its first sample
//! (`ProcessTable::on_exec`) gets at its exec the unwinding its
//! executable's earlier process was given there: until its first sample
//! is decided, the BPF program would otherwise copy its whole stack for
//! every sample.

use std::{
    num::NonZeroUsize,
    sync::{Arc, Weak},
};

use agent_common::MAX_EXEC_PRESETS;
use lru::LruCache;
use tracing::debug;

use super::{Decision, ProcessUnwinding, Sizing, UnwindMode, UnwindPolicy, WalkJudge, entry};
use crate::{process::ProcessImage, stats::Stats, unwind::learned::ExecutableKey};

/// The `EXEC_PRESETS` values written, so that an unchanged one is not
/// written again at each exec; as many as the map holds.
pub(super) struct Published(LruCache<agent_common::ExecutableKey, u32>);

impl Default for Published {
    fn default() -> Self {
        Self(LruCache::new(
            NonZeroUsize::new(MAX_EXEC_PRESETS as usize).unwrap_or(NonZeroUsize::MIN),
        ))
    }
}

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

    /// DWARF with the full copy, for tests of what keeps presets.
    #[cfg(test)]
    pub fn dwarf() -> Self {
        Self {
            unwinding: ProcessUnwinding::Dwarf,
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
        let (wanted, learned) = self.preset_copy(preset);
        // The BPF program gave it the full copy at its exec, or the
        // executable's published entry.
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
                    fitted: learned,
                    ..Sizing::default()
                },
                walk: WalkJudge::default(),
            },
        );
    }

    /// The copy `preset` gives a new process, and whether it was learned
    /// from the executable's processes.
    fn preset_copy(&mut self, preset: Preset) -> (u32, bool) {
        let learned = preset
            .executable
            .and_then(|key| self.learned.size(key, self.copy_bytes))
            .filter(|_| preset.unwinding == ProcessUnwinding::Dwarf);
        let wanted = match preset.unwinding {
            ProcessUnwinding::Dwarf => learned.unwrap_or(self.copy_bytes),
            ProcessUnwinding::FramePointers => self.leaf_copy_bytes,
        };
        (wanted, learned.is_some())
    }

    /// New processes of `executable` get what `preset` gives from their
    /// exec on, in the BPF program, which then need not wake the daemon
    /// for them: written when it changed (the executable's processes
    /// taught a new copy size).
    pub fn publish_preset(&mut self, executable: agent_common::ExecutableKey, preset: Preset) {
        if self.mode != UnwindMode::Auto {
            return;
        }
        if self.map.is_none() {
            return;
        }
        let (wanted, _) = self.preset_copy(preset);
        let value = entry(wanted, preset.unwinding, true);
        if self.published.0.get(&executable) == Some(&value) {
            return;
        }
        let Some(map) = &mut self.map else {
            return;
        };
        match map.set_exec_preset(executable, value) {
            Ok(()) => {
                self.published.0.put(executable, value);
                Stats::inc(&self.stats.unwind_exec_presets_set);
            }
            Err(error) => {
                Stats::inc(&self.stats.unwind_copy_map_failures);
                debug!(%error, "new processes of the executable wake the daemon at exec");
            }
        }
    }
}
