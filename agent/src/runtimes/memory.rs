//! Reading another process's memory, for the namers.

use agent_runtimes::{Memory, MemoryError};

/// One process's memory, read with `process_vm_readv` (no ptrace stop,
/// nothing written; a page that is not mapped fails the read).
pub struct ProcessMemory {
    pid: libc::pid_t,
}

impl ProcessMemory {
    pub fn new(pid: u32) -> Self {
        Self {
            pid: pid as libc::pid_t,
        }
    }
}

impl Memory for ProcessMemory {
    fn read(&mut self, address: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        if buf.is_empty() {
            return Ok(());
        }
        let local = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let remote = libc::iovec {
            iov_base: address as *mut libc::c_void,
            iov_len: buf.len(),
        };
        // SAFETY: `local` covers exactly `buf`, which we own mutably; the
        // kernel checks the remote range and fails instead of faulting.
        let read = unsafe { libc::process_vm_readv(self.pid, &local, 1, &remote, 1, 0) };
        if read == buf.len() as isize {
            Ok(())
        } else {
            Err(MemoryError {
                address,
                length: buf.len(),
                source: (read < 0).then(std::io::Error::last_os_error),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_memory_and_refuses_unmapped() {
        let value = 0x1234_5678_9abc_def0u64;
        let mut memory = ProcessMemory::new(std::process::id());
        let mut buf = [0u8; 8];
        memory
            .read(&value as *const u64 as u64, &mut buf)
            .expect("own stack is readable");
        assert_eq!(u64::from_ne_bytes(buf), value);
        assert!(memory.read(8, &mut buf).is_err());
    }
}
