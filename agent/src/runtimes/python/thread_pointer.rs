//! Where a task's thread pointer is in the kernel's `task_struct`, which
//! the walker needs to find a thread's interpreter state.

use std::{
    path::Path,
    sync::{Arc, OnceLock},
};

use tracing::{debug, warn};

use crate::bpf::btf;

/// `task_struct`'s thread pointer offset, read from the kernel's BTF on a
/// thread of its own from the start, beside the BPF programs'
/// verification. Not when the first interpreter is found: the processes
/// started meanwhile would go without Python frames for as long as the
/// lookup takes (measured: a fifth of a short-lived process's samples on a
/// loaded machine), against a few milliseconds of CPU saved on a host
/// without Python.
#[derive(Clone)]
pub struct ThreadPointerLookup(Arc<OnceLock<Option<u32>>>);

impl ThreadPointerLookup {
    /// Starts the lookup (here if no thread can be started).
    pub fn start() -> Self {
        let cell = Arc::new(OnceLock::new());
        let filler = cell.clone();
        let look_up = move || {
            let offset = match btf::task_thread_pointer_offset(Path::new(btf::VMLINUX_BTF)) {
                Ok(offset) => Some(offset),
                Err(error) => {
                    warn!(
                        error = %crate::logging::error_chain(&error),
                        "Python frames are off: where a task's thread pointer is in the kernel's task_struct is unknown"
                    );
                    None
                }
            };
            let _ = filler.set(offset);
        };
        if let Err(error) = std::thread::Builder::new().name("firn-btf".into()).spawn({
            let look_up = look_up.clone();
            move || {
                crate::stats::cpu::account_thread(crate::stats::cpu::CpuStage::Sample);
                look_up();
            }
        }) {
            debug!(%error, "no thread for the BTF lookup; done here");
            look_up();
        }
        Self(cell)
    }

    /// The offset once looked up: `Some(None)` if the BTF did not tell.
    pub fn get(&self) -> Option<Option<u32>> {
        self.0.get().copied()
    }
}
