//! The BPF maps the daemon's stages own once the programs are loaded: the
//! per-process stack copy sizes, the excluded processes and the Python
//! walker's layouts, each taken out of the loaded object.

use agent_common::names;
use aya::maps::{HashMap as BpfHashMap, MapData};

use super::{BpfError, BpfSampler};
use crate::{
    labels::ExclusionMap,
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

    /// Takes the map of interpreter processes out, for the Python runtime
    /// to own.
    pub fn take_python_map(&mut self) -> Result<BpfPythonMap, BpfError> {
        let name = names::PYTHON_PROCESSES;
        let map = self
            .ebpf
            .take_map(name)
            .ok_or(BpfError::Missing { kind: "map", name })?;
        let map = BpfHashMap::try_from(map).map_err(|source| BpfError::Map { name, source })?;
        let name = names::PYTHON_EXECUTABLES;
        let executables = self
            .ebpf
            .take_map(name)
            .ok_or(BpfError::Missing { kind: "map", name })?;
        let executables =
            BpfHashMap::try_from(executables).map_err(|source| BpfError::Map { name, source })?;
        Ok(BpfPythonMap { map, executables })
    }
}

/// `PYTHON_PROCESSES`: the walker's layout of each CPython process; and
/// `PYTHON_EXECUTABLES`, those of executables whose processes are
/// registered at their exec.
pub struct BpfPythonMap {
    map: BpfHashMap<MapData, u32, agent_common::PythonProcess>,
    executables: BpfHashMap<MapData, agent_common::ExecutableKey, agent_common::PythonProcess>,
}

impl crate::runtimes::PythonProcessMap for BpfPythonMap {
    fn set(
        &mut self,
        tgid: u32,
        layout: agent_common::PythonProcess,
    ) -> Result<(), crate::runtimes::PythonMapError> {
        self.map
            .insert(tgid, layout, 0)
            .map_err(|source| crate::runtimes::PythonMapError {
                tgid,
                source: Box::new(source),
            })
    }

    fn remove(&mut self, tgid: u32) {
        let _ = self.map.remove(&tgid);
    }

    fn set_executable(
        &mut self,
        executable: agent_common::ExecutableKey,
        layout: agent_common::PythonProcess,
    ) {
        // An LRU map: a full one makes room by itself.
        if let Err(error) = self.executables.insert(executable, layout, 0) {
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
