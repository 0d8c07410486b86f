//! What the kernel shows of the host, in one place: `/proc` and `/sys`, or
//! a directory a test lays out in their stead. The process table and the
//! metadata reader read per-process files beneath [`Host::proc`]; the
//! host-wide facts (the processes running, kernel symbols, the kernel's
//! build id and release, whether BPF run time is accounted) are read here.
//! Files a process controls are not read here but through `untrusted`.

use std::{
    io,
    path::{Path, PathBuf},
};

/// The host's `/proc` and `/sys`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Host {
    proc: PathBuf,
    sys: PathBuf,
}

impl Default for Host {
    fn default() -> Self {
        Self::system()
    }
}

impl Host {
    /// The running system's.
    pub fn system() -> Self {
        Self::at(PathBuf::from("/proc"), PathBuf::from("/sys"))
    }

    /// A host whose `/proc` and `/sys` are elsewhere (tests).
    pub fn at(proc: PathBuf, sys: PathBuf) -> Self {
        Self { proc, sys }
    }

    /// The `/proc` the process table and the metadata reader read beneath.
    pub fn proc(&self) -> &Path {
        &self.proc
    }

    /// The tgids running now (unordered).
    pub fn pids(&self) -> impl Iterator<Item = u32> + use<> {
        std::fs::read_dir(&self.proc)
            .into_iter()
            .flatten()
            .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
    }

    /// Where the kernel's symbols are listed.
    pub fn kallsyms_path(&self) -> PathBuf {
        self.proc.join("kallsyms")
    }

    /// The kernel's notes (its build id among them).
    pub fn kernel_notes(&self) -> io::Result<Vec<u8>> {
        std::fs::read(self.sys.join("kernel/notes"))
    }

    /// `uname -r`.
    pub fn kernel_release(&self) -> Option<String> {
        std::fs::read_to_string(self.proc.join("sys/kernel/osrelease"))
            .ok()
            .map(|text| text.trim().to_owned())
            .filter(|release| !release.is_empty())
    }

    /// Whether the kernel accounts BPF programs' run time.
    pub fn bpf_stats_enabled(&self) -> bool {
        std::fs::read_to_string(self.proc.join("sys/kernel/bpf_stats_enabled"))
            .is_ok_and(|value| value.trim() == "1")
    }

    /// Where the unified (v2) cgroup hierarchy is mounted: `/sys/fs/cgroup`
    /// on a v2 host, `/sys/fs/cgroup/unified` on a hybrid one; `None` on a
    /// v1-only host. Only v2 has `cgroup.controllers`; the inode numbers of
    /// its directories are the cgroup ids the BPF program records.
    pub fn unified_cgroup_root(&self) -> Option<PathBuf> {
        let cgroup = self.sys.join("fs/cgroup");
        [cgroup.clone(), cgroup.join("unified")]
            .into_iter()
            .find(|root| root.join("cgroup.controllers").is_file())
    }

    /// `/proc/PID/status`.
    pub fn process_status(&self, pid: u32) -> io::Result<String> {
        std::fs::read_to_string(self.proc.join(pid.to_string()).join("status"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_laid_out_elsewhere_is_read_there() {
        let dir = tempfile::tempdir().expect("tempdir");
        let proc = dir.path().join("proc");
        std::fs::create_dir_all(proc.join("sys/kernel")).expect("proc");
        std::fs::create_dir_all(proc.join("42")).expect("pid dir");
        std::fs::create_dir_all(proc.join("self")).expect("self");
        std::fs::write(proc.join("sys/kernel/osrelease"), "6.1.0-test\n").expect("release");
        std::fs::write(proc.join("42/status"), "Tgid:\t42\n").expect("status");
        let host = Host::at(proc, dir.path().join("sys"));
        assert_eq!(host.pids().collect::<Vec<_>>(), [42]);
        assert_eq!(host.kernel_release().as_deref(), Some("6.1.0-test"));
        assert_eq!(host.process_status(42).expect("status"), "Tgid:\t42\n");
        assert!(host.kernel_notes().is_err());
        assert!(!host.bpf_stats_enabled());
        assert_eq!(host.unified_cgroup_root(), None);
        let unified = dir.path().join("sys/fs/cgroup/unified");
        std::fs::create_dir_all(&unified).expect("hybrid layout");
        std::fs::write(unified.join("cgroup.controllers"), "").expect("controllers");
        assert_eq!(host.unified_cgroup_root(), Some(unified));
    }
}
