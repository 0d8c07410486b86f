//! FUSE mounts of a mount namespace, from `/proc/PID/mountinfo` (which the
//! kernel writes; reading it never calls into a filesystem). A FUSE
//! filesystem is served by a process: a lookup, `stat` or page fault there
//! waits for that process's answer, in a state no signal ends, so firn
//! decides from this list before touching anything beneath it. Mount
//! points are names a process chooses.

use std::path::{Path, PathBuf};

use crate::makedev;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FuseMounts {
    /// Mount points, as the process sees them (relative to its root).
    points: Vec<PathBuf>,
    /// Their devices, `makedev(major, minor)`.
    devices: Vec<u64>,
    /// The mountinfo could not be read: assume the worst.
    unknown: bool,
}

impl FuseMounts {
    /// The mounts of a process whose mountinfo could not be read: every
    /// path inside its root is treated as on FUSE.
    pub fn unknown() -> Self {
        Self {
            unknown: true,
            ..Self::default()
        }
    }

    /// Parses mountinfo text: `ID PARENT MAJOR:MINOR ROOT POINT OPTIONS
    /// [OPTIONAL...] - FSTYPE SOURCE SUPER_OPTIONS` per line.
    pub fn parse(text: &str) -> Self {
        let mut mounts = Self::default();
        for line in text.lines() {
            let Some((head, tail)) = line.split_once(" - ") else {
                continue;
            };
            let fstype = tail.split(' ').next().unwrap_or_default();
            if !(fstype == "fuse" || fstype == "fuseblk" || fstype.starts_with("fuse.")) {
                continue;
            }
            let fields: Vec<&str> = head.split(' ').collect();
            let (Some(device), Some(point)) = (fields.get(2), fields.get(4)) else {
                continue;
            };
            if let Some((major, minor)) = device.split_once(':')
                && let (Ok(major), Ok(minor)) = (major.parse::<u32>(), minor.parse::<u32>())
            {
                mounts.devices.push(makedev(major.into(), minor.into()));
            }
            mounts.points.push(PathBuf::from(unescape(point)));
        }
        mounts
    }

    /// The mountinfo could not be read ([`FuseMounts::unknown`]).
    pub fn is_unknown(&self) -> bool {
        self.unknown
    }

    pub fn is_empty(&self) -> bool {
        self.points.is_empty() && !self.unknown
    }

    /// Whether `path` (absolute, as the process sees it) lies on a FUSE
    /// mount, judged by its components alone.
    pub fn covers(&self, path: &Path) -> bool {
        let absolute = Path::new("/").join(path);
        self.unknown || self.points.iter().any(|point| absolute.starts_with(point))
    }

    /// Whether a file on device `dev` (`makedev`) is on a FUSE mount.
    /// Unknown mounts (the process exited) do not say so: its files are
    /// then only reachable by their host path.
    pub fn has_device(&self, dev: u64) -> bool {
        self.devices.contains(&dev)
    }
}

/// Mount points escape space, tab, newline and backslash as `\ooo`.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let octal = bytes.get(index + 1..index + 4).and_then(|digits| {
            let text = std::str::from_utf8(digits).ok()?;
            u8::from_str_radix(text, 8).ok()
        });
        match (bytes[index], octal) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                index += 4;
            }
            (byte, _) => {
                out.push(byte);
                index += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
25 22 0:22 / /proc rw,nosuid shared:12 - proc proc rw
96 22 0:61 / /usr/lib/debug rw,relatime - fuse firn-hang rw,user_id=0,group_id=0
97 22 0:62 / /home/a\\040b rw,relatime shared:40 - fuse.sshfs host:/x rw
98 22 0:63 / /media/usb rw - fuseblk /dev/sdb1 rw
99 22 0:64 / /tmp rw - tmpfs tmpfs rw
garbage line without separator
";

    #[test]
    fn fuse_mounts_are_found_by_type() {
        let mounts = FuseMounts::parse(MOUNTINFO);
        assert!(!mounts.is_empty());
        assert!(mounts.covers(Path::new("/usr/lib/debug/.build-id/ab/cd.debug")));
        assert!(mounts.covers(Path::new("usr/lib/debug")));
        assert!(mounts.covers(Path::new("/home/a b/file")));
        assert!(mounts.covers(Path::new("/media/usb/x")));
        assert!(!mounts.covers(Path::new("/usr/lib/debugger")));
        assert!(!mounts.covers(Path::new("/tmp/perf-1.map")));
        assert!(mounts.has_device(makedev(0, 61)));
        assert!(!mounts.has_device(makedev(254, 1)));
    }

    #[test]
    fn a_fuse_root_covers_everything() {
        let mounts = FuseMounts::parse("1 0 0:50 / / rw - fuse.fuse-overlayfs fuse rw\n");
        assert!(mounts.covers(Path::new("/usr/bin/app")));
    }

    #[test]
    fn without_fuse_nothing_is_covered() {
        let mounts = FuseMounts::parse("22 1 254:1 / / rw - ext4 /dev/vda1 rw\n");
        assert!(mounts.is_empty());
        assert!(!mounts.covers(Path::new("/anything")));
        let unreadable = FuseMounts::unknown();
        assert!(unreadable.is_unknown());
        assert!(unreadable.covers(Path::new("/anything")));
        assert!(!unreadable.is_empty());
    }
}
