//! The exit walk (`process_exit_maps`, see `agent-ebpf/src/maps.rs`), run
//! as a process exits and as it executes another program: the
//! offsets it reads and the BTF ids of the kfuncs it calls come from the
//! running kernel's BTF; the kfunc calls are markers in the object, patched
//! here before it is loaded. A kernel without the VMA iterator (before
//! 6.7), or one whose `sched_process_exit` runs after the task let go of
//! its memory (before 6.16: the walk then finds nothing), keeps today's
//! behaviour: maps read from `/proc` when the samples are drained.

use std::{borrow::Cow, path::Path};

use agent_common::{MapsConfig, MapsCounter, names};
use aya::{
    Ebpf,
    maps::{MapData, PerCpuArray},
    programs::RawTracePoint,
};
use tracing::{debug, info};

use super::{BpfError, btf, load_logged, program_error, program_mut};

/// The immediates of the marked kfunc calls, in [`btf::WALK_KFUNCS`]'s
/// order (as in the BPF program).
const MARKERS: [u32; 6] = [
    0x0f1a_0001,
    0x0f1a_0002,
    0x0f1a_0003,
    0x0f1a_0004,
    0x0f1a_0005,
    0x0f1a_0006,
];
/// `BPF_JMP | BPF_CALL` with `src_reg` 2 (`BPF_PSEUDO_KFUNC_CALL`).
const KFUNC_CALL: [u8; 2] = [0x85, 0x20];

/// The walk's settings and kfunc ids, or `None` (said once) when this
/// kernel cannot walk.
pub(super) fn prepare() -> Option<(MapsConfig, [u32; 6])> {
    match btf::exit_walk(Path::new(btf::VMLINUX_BTF)) {
        Ok(found) => Some(found),
        Err(error) => {
            info!(
                reason = %crate::logging::error_chain(&error),
                "mappings of exited processes are not captured in the kernel: \
                 processes of a few milliseconds may keep unplaced frames"
            );
            None
        }
    }
}

/// `object` with each marked kfunc call pointing at the function's BTF id.
pub(super) fn patch(object: &[u8], ids: [u32; 6]) -> Cow<'_, [u8]> {
    let mut patched = object.to_vec();
    let mut found = 0;
    for insn in patched.chunks_exact_mut(8) {
        if insn[..2] != KFUNC_CALL || insn[2..4] != [0, 0] {
            continue;
        }
        let imm = u32::from_le_bytes([insn[4], insn[5], insn[6], insn[7]]);
        if let Some(index) = MARKERS.iter().position(|&marker| marker == imm) {
            insn[4..].copy_from_slice(&ids[index].to_le_bytes());
            found += 1;
        }
    }
    debug!(calls = found, "kfunc calls patched");
    Cow::Owned(patched)
}

/// Loads and attaches the fork and exit programs (when `wanted`): the exit
/// one before `process_exit`, since the kernel runs a tracepoint's
/// programs in the order they were attached and the mappings must come
/// before the exit in the ring buffer. Returns their counters, or `None`
/// (said once) when the kernel refuses them.
pub(super) fn attach(
    ebpf: &mut Ebpf,
    wanted: bool,
) -> Result<Option<PerCpuArray<MapData, u64>>, BpfError> {
    if !wanted || !attach_programs(ebpf) {
        return Ok(None);
    }
    let name = names::MAPS_COUNTERS;
    let map = ebpf
        .take_map(name)
        .ok_or(BpfError::Missing { kind: "map", name })?;
    PerCpuArray::try_from(map)
        .map(Some)
        .map_err(|source| BpfError::Map { name, source })
}

fn attach_programs(ebpf: &mut Ebpf) -> bool {
    let mut attach_one = |name: &'static str, tracepoint: &str| -> Result<(), BpfError> {
        let program: &mut RawTracePoint = program_mut(ebpf, name)?;
        load_logged(program, name, RawTracePoint::load, RawTracePoint::info)?;
        program
            .attach(tracepoint)
            .map_err(|source| program_error(name, source))?;
        Ok(())
    };
    let attached = attach_one(names::PROG_EXIT_MAPS, "sched_process_exit")
        .and_then(|()| attach_one(names::PROG_FORK_MAPS, "sched_process_fork"));
    match attached {
        Ok(()) => {
            debug!("mappings of exiting processes are captured in the kernel");
            attach_at_exec(ebpf);
            true
        }
        Err(error) => {
            info!(
                reason = %crate::logging::error_chain(&error),
                "mappings of exited processes are not captured in the kernel: \
                 processes of a few milliseconds may keep unplaced frames"
            );
            false
        }
    }
}

/// The same walk as a process executes another program, on
/// `sched_prepare_exec` (6.10 and later): it fires before the old image
/// is let go, and the exec that follows cannot fail back into it, so the
/// samples of a program that ends in an exec (shell wrappers, `exec "$@"`)
/// are placed with its own mappings, not left unplaced. Optional: without
/// it only exits are captured.
fn attach_at_exec(ebpf: &mut Ebpf) {
    let name = names::PROG_EXIT_MAPS;
    let attached = program_mut::<RawTracePoint>(ebpf, name).and_then(|program| {
        program
            .attach(PREPARE_EXEC)
            .map_err(|source| program_error(name, source))
    });
    match attached {
        Ok(_) => debug!("mappings of programs executing another are captured in the kernel"),
        Err(error) => info!(
            reason = %crate::logging::error_chain(&error),
            "mappings of a program that executes another are not captured in the kernel: \
             its samples may keep unplaced frames"
        ),
    }
}

/// The tracepoint before an exec lets go of the old image.
const PREPARE_EXEC: &str = "sched_prepare_exec";

/// Totals of `MAPS_COUNTERS`, by [`MapsCounter`].
pub fn read_counters(map: &PerCpuArray<MapData, u64>) -> [u64; MapsCounter::COUNT as usize] {
    let mut totals = [0; MapsCounter::COUNT as usize];
    for counter in MapsCounter::ALL {
        if let Ok(per_cpu) = map.get(&(counter as u32), 0) {
            totals[counter as usize] = per_cpu.iter().copied().sum();
        }
    }
    totals
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_marked_kfunc_calls_are_patched() {
        let insn = |code: [u8; 2], imm: u32| {
            let mut bytes = vec![code[0], code[1], 0, 0];
            bytes.extend_from_slice(&imm.to_le_bytes());
            bytes
        };
        let mut object = Vec::new();
        object.extend(insn(KFUNC_CALL, MARKERS[1]));
        // A helper call with the marker's immediate is left alone.
        object.extend(insn([0x85, 0x00], MARKERS[0]));
        object.extend(insn(KFUNC_CALL, MARKERS[2]));
        object.extend(insn(KFUNC_CALL, MARKERS[4]));
        let patched = patch(&object, [11, 22, 33, 44, 55, 66]);
        assert_eq!(&patched[..8], &insn(KFUNC_CALL, 22)[..]);
        assert_eq!(&patched[8..16], &insn([0x85, 0x00], MARKERS[0])[..]);
        assert_eq!(&patched[16..24], &insn(KFUNC_CALL, 33)[..]);
        assert_eq!(&patched[24..], &insn(KFUNC_CALL, 55)[..]);
    }

    #[test]
    fn the_running_kernel_can_walk() {
        let (config, ids) = btf::exit_walk(Path::new(btf::VMLINUX_BTF))
            .expect("this kernel (6.16 or later) has the iterator and the fields");
        assert_eq!(config.enabled, 1);
        assert!(ids.iter().all(|&id| id > 0), "{ids:?}");
        assert_ne!(config.vma_start, config.vma_end);
    }
}
