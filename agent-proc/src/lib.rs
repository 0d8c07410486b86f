//! The `/proc` files firn reads of other processes, parsed: `maps` (what a
//! process has mapped), `cgroup` (where it runs: container, pod, unit),
//! `mountinfo` (its FUSE mounts), `status` and `cmdline`. Every byte of them is chosen by the
//! process (file names, cgroup and mount point names), so these are pure
//! functions over text that no input makes panic; the daemon reads the
//! files (bounded, through its safe path) and hands the text here.

pub mod cgroup;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod maps;
pub mod mountinfo;
pub mod status;

/// `makedev(major, minor)` as the kernel encodes a device number.
pub fn makedev(major: u64, minor: u64) -> u64 {
    ((major & 0xffff_f000) << 32)
        | ((major & 0xfff) << 8)
        | ((minor & 0xffff_ff00) << 12)
        | (minor & 0xff)
}
