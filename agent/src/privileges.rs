//! What the process may do: capability checks before touching BPF, so a
//! missing privilege is reported by name instead of as a raw errno.

use std::{fs, io};

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// The effective capability set of this process, from /proc/self/status.
pub fn effective_capabilities() -> Option<u64> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    parse_cap_eff(&status)
}

fn parse_cap_eff(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
}

fn has(capabilities: u64, capability: u32) -> bool {
    capabilities & (1 << capability) != 0
}

/// Loading the programs needs CAP_BPF and CAP_PERFMON, or CAP_SYS_ADMIN on
/// kernels before 5.8 that lack them.
pub fn can_use_bpf() -> bool {
    match effective_capabilities() {
        Some(caps) => (has(caps, CAP_BPF) && has(caps, CAP_PERFMON)) || has(caps, CAP_SYS_ADMIN),
        // Cannot tell; let the kernel decide and report what it says.
        None => true,
    }
}

pub fn is_permission_error(error: &io::Error) -> bool {
    matches!(error.raw_os_error(), Some(libc::EPERM | libc::EACCES))
}

/// Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK; later ones use
/// the memory cgroup, where failing to raise the limit does not matter.
pub fn raise_memlock_limit() {
    let limit = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit reads the struct we pass and nothing else.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit) } != 0 {
        tracing::debug!(
            error = %io::Error::last_os_error(),
            "could not raise RLIMIT_MEMLOCK (fine on kernels >= 5.11)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_eff_is_read_from_status() {
        let status = "Name:\tfirn\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n";
        let caps = parse_cap_eff(status).expect("CapEff present");
        assert!(has(caps, CAP_BPF));
        assert!(has(caps, CAP_PERFMON));
        let none = parse_cap_eff("CapEff:\t0000000000000000\n").expect("CapEff present");
        assert!(!has(none, CAP_BPF));
        assert_eq!(parse_cap_eff("Name:\tfirn\n"), None);
    }
}
