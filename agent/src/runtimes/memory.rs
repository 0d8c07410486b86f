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

    fn read_many(&mut self, reads: &mut [(u64, &mut [u8])]) -> usize {
        // The kernel takes at most IOV_MAX (1024) of each.
        const MOST: usize = 1024;
        let most = reads.len().min(MOST);
        let reads = &mut reads[..most];
        let (local, remote): (Vec<libc::iovec>, Vec<libc::iovec>) = reads
            .iter_mut()
            .map(|(address, buf)| {
                (
                    libc::iovec {
                        iov_base: buf.as_mut_ptr().cast(),
                        iov_len: buf.len(),
                    },
                    libc::iovec {
                        iov_base: *address as *mut libc::c_void,
                        iov_len: buf.len(),
                    },
                )
            })
            .unzip();
        // SAFETY: each local iovec covers exactly one of the buffers, all
        // borrowed mutably for the call; the kernel checks the remote
        // ranges and stops at the first it cannot read, never splitting
        // an element.
        let read = unsafe {
            libc::process_vm_readv(
                self.pid,
                local.as_ptr(),
                local.len() as libc::c_ulong,
                remote.as_ptr(),
                remote.len() as libc::c_ulong,
                0,
            )
        };
        let Ok(mut left) = usize::try_from(read) else {
            return 0;
        };
        reads
            .iter()
            .take_while(|(_, buf)| {
                let whole = buf.len() <= left;
                left = left.saturating_sub(buf.len());
                whole
            })
            .count()
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
        let other = 0x0fed_cba9_8765_4321u64;
        let (mut first, mut second, mut third) = ([0u8; 8], [0u8; 8], [0u8; 8]);
        let mut reads = [
            (&value as *const u64 as u64, &mut first[..]),
            (&other as *const u64 as u64, &mut second[..]),
            (8, &mut third[..]),
        ];
        assert_eq!(memory.read_many(&mut reads), 2, "up to the unmapped one");
        assert_eq!(u64::from_ne_bytes(first), value);
        assert_eq!(u64::from_ne_bytes(second), other);
    }
}
