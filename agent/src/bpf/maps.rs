//! The BPF maps the daemon's stages own once the programs are loaded: the
//! per-process stack copy sizes, the excluded processes and the
//! interpreter walkers' layouts, each taken out of the loaded object.

use std::sync::{Arc, Mutex};

use agent_common::{ExecutableKey, InterpreterKind, InterpreterProcess, names};
use aya::maps::{HashMap as BpfHashMap, MapData};

use super::{BpfError, BpfSampler};
use crate::{
    labels::ExclusionMap,
    runtimes::{InterpreterMap, InterpreterMapError},
    unwind::{CopyMapError, CopySizeMap, ExecPresetError, ThreadStackError},
};

impl BpfSampler {
    /// Takes the map of per-process stack copy sizes out, for the unwind
    /// policy to own.
    pub fn take_copy_size_map(&mut self) -> Result<BpfCopySizeMap, BpfError> {
        let name = names::UNWIND_COPY;
        let map = self
            .ebpf
            .take_map(name)
            .ok_or(BpfError::Missing { kind: "map", name })?;
        let map = BpfHashMap::try_from(map).map_err(|source| BpfError::Map { name, source })?;
        let name = names::THREAD_STACKS;
        let threads = self
            .ebpf
            .take_map(name)
            .ok_or(BpfError::Missing { kind: "map", name })?;
        let threads =
            BpfHashMap::try_from(threads).map_err(|source| BpfError::Map { name, source })?;
        let name = names::EXEC_PRESETS;
        let presets = self
            .ebpf
            .take_map(name)
            .ok_or(BpfError::Missing { kind: "map", name })?;
        let presets =
            BpfHashMap::try_from(presets).map_err(|source| BpfError::Map { name, source })?;
        Ok(BpfCopySizeMap {
            map,
            threads,
            presets,
        })
    }

    /// Takes the map of excluded processes out, for relabeling's filter
    /// to own.
    pub fn take_exclusion_map(&mut self) -> Result<BpfExclusionMap, BpfError> {
        let name = names::EXCLUDED;
        let map = self
            .ebpf
            .take_map(name)
            .ok_or(BpfError::Missing { kind: "map", name })?;
        let map = BpfHashMap::try_from(map).map_err(|source| BpfError::Map { name, source })?;
        Ok(BpfExclusionMap { map })
    }

    /// Takes the maps of interpreter processes out, for the runtimes whose
    /// frames the BPF program walks to share.
    pub fn take_interpreter_map(&mut self) -> Result<BpfInterpreterMap, BpfError> {
        let name = names::INTERPRETER_PROCESSES;
        let map = self
            .ebpf
            .take_map(name)
            .ok_or(BpfError::Missing { kind: "map", name })?;
        let map = BpfHashMap::try_from(map).map_err(|source| BpfError::Map { name, source })?;
        let name = names::INTERPRETER_EXECUTABLES;
        let executables = self
            .ebpf
            .take_map(name)
            .ok_or(BpfError::Missing { kind: "map", name })?;
        let executables =
            BpfHashMap::try_from(executables).map_err(|source| BpfError::Map { name, source })?;
        Ok(BpfInterpreterMap {
            maps: Arc::new(Mutex::new(InterpreterMaps { map, executables })),
            kind: InterpreterKind::Python,
        })
    }
}

/// `INTERPRETER_PROCESSES`: the walkers' layout of each interpreter
/// process; and `INTERPRETER_EXECUTABLES`, those of executables whose
/// processes are registered at their exec. Each runtime walked in BPF
/// holds a clone; the maps are one.
pub struct BpfInterpreterMap {
    maps: Arc<Mutex<InterpreterMaps>>,
    /// The interpreters whose entries this handle removes: each runtime
    /// removes only its own.
    kind: InterpreterKind,
}

struct InterpreterMaps {
    map: BpfHashMap<MapData, u32, InterpreterProcess>,
    executables: BpfHashMap<MapData, ExecutableKey, InterpreterProcess>,
}

impl BpfInterpreterMap {
    /// The handle of the runtime whose interpreters are of `kind`.
    pub fn for_kind(&self, kind: InterpreterKind) -> Self {
        Self {
            maps: self.maps.clone(),
            kind,
        }
    }

    fn maps(&self) -> std::sync::MutexGuard<'_, InterpreterMaps> {
        // A panic while holding the lock left plain map handles behind:
        // still usable.
        self.maps
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl InterpreterMap for BpfInterpreterMap {
    fn set(&mut self, tgid: u32, layout: InterpreterProcess) -> Result<(), InterpreterMapError> {
        self.maps()
            .map
            .insert(tgid, layout, 0)
            .map_err(|source| InterpreterMapError {
                tgid,
                source: Box::new(source),
            })
    }

    fn remove(&mut self, tgid: u32) {
        let mut maps = self.maps();
        if maps
            .map
            .get(&tgid, 0)
            .is_ok_and(|entry| entry.kind == self.kind as u32)
        {
            let _ = maps.map.remove(&tgid);
        }
    }

    fn set_executable(&mut self, executable: ExecutableKey, layout: InterpreterProcess) {
        // An LRU map: a full one makes room by itself.
        if let Err(error) = self.maps().executables.insert(executable, layout, 0) {
            tracing::debug!(%error, "executable not registered for its exec");
        }
    }
}

/// `UNWIND_COPY`: stack copy sizes of the processes unwound with DWARF;
/// `THREAD_STACKS`: where their threads' stacks end; `EXEC_PRESETS`: what
/// new processes of executables decided before get at their exec.
pub struct BpfCopySizeMap {
    map: BpfHashMap<MapData, u32, u32>,
    threads: BpfHashMap<MapData, u32, u64>,
    presets: BpfHashMap<MapData, agent_common::ExecutableKey, u32>,
}

impl CopySizeMap for BpfCopySizeMap {
    fn set(&mut self, tgid: u32, bytes: u32) -> Result<(), CopyMapError> {
        self.map
            .insert(tgid, bytes, 0)
            .map_err(|source| CopyMapError {
                tgid,
                source: Box::new(source),
            })
    }

    fn remove(&mut self, tgid: u32) {
        // Absent already (the process exited) is fine.
        let _ = self.map.remove(&tgid);
    }

    fn set_thread(&mut self, tid: u32, end: u64) -> Result<(), ThreadStackError> {
        // An LRU map: a full one makes room by itself.
        self.threads
            .insert(tid, end, 0)
            .map_err(|source| ThreadStackError {
                tid,
                source: Box::new(source),
            })
    }

    fn remove_thread(&mut self, tid: u32) {
        // Absent already (evicted) is fine.
        let _ = self.threads.remove(&tid);
    }

    fn set_exec_preset(
        &mut self,
        executable: agent_common::ExecutableKey,
        entry: u32,
    ) -> Result<(), ExecPresetError> {
        // An LRU map: a full one makes room by itself.
        self.presets
            .insert(executable, entry, 0)
            .map_err(|source| ExecPresetError {
                executable,
                source: Box::new(source),
            })
    }
}

/// `EXCLUDED`: processes whose samples the BPF program leaves out.
pub struct BpfExclusionMap {
    map: BpfHashMap<MapData, u32, u8>,
}

impl ExclusionMap for BpfExclusionMap {
    fn exclude(&mut self, tgid: u32) -> bool {
        self.map.insert(tgid, 1, 0).is_ok()
    }

    fn include(&mut self, tgid: u32) {
        // Absent already (the process exited or executed) is fine.
        let _ = self.map.remove(&tgid);
    }
}
