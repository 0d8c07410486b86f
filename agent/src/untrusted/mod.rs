//! Opening files that another process controls (its executables, debug
//! files, perf maps) and files named by flags: never follow a symlink out
//! of the process's root, never block on a FIFO or a device, never read a
//! file whose size is absurd.
//!
//! Every open goes in two steps: an `O_PATH` descriptor (which opens
//! nothing: a FIFO does not wait for a writer, a device driver is not
//! called), checked with `fstat`/`fstatfs`, then reopened for reading
//! through `/proc/self/fd` only if it is a regular file of sane size on a
//! filesystem the kernel serves itself.

use std::{
    fs::File,
    io::{self, Read},
    num::NonZeroUsize,
    os::fd::{AsFd, AsRawFd, OwnedFd},
    path::Path,
    sync::{Arc, Mutex},
};

use lru::LruCache;
use rustix::fs::{FileType, Mode, OFlags, ResolveFlags};
use tracing::warn;

use crate::stats::Stats;

mod mapped;

pub use agent_proc::mountinfo::FuseMounts;
pub use mapped::{MappedFile, guard_mapped_files, truncated_pages, unguarded_mappings};

/// The largest object or debug file firn reads (the biggest real debug
/// files, of browsers and LLVM, are a few GiB).
pub const MAX_OBJECT_BYTES: u64 = 8 << 30;
/// The largest file named by a flag or the config file that firn reads
/// whole (tokens, CA bundles, config files).
pub const MAX_SMALL_FILE_BYTES: u64 = 16 << 20;

/// `statfs.f_type` of FUSE filesystems: every access is answered by a
/// process, which may never answer.
const FUSE_SUPER_MAGIC: u64 = 0x6573_5546;

/// Why a file was not read, one label value each on
/// `firn_untrusted_files_refused_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// A FIFO, socket, device or directory.
    NotRegular,
    /// Larger than the limit for its use.
    TooLarge,
    /// On a FUSE filesystem, whose server is a process that may never
    /// answer (and whose pages fault through it).
    Fuse,
    /// Opening it took longer than its deadline.
    TimedOut,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::NotRegular => "not a regular file",
            Self::TooLarge => "larger than firn reads",
            Self::Fuse => "on a FUSE filesystem",
            Self::TimedOut => "opening it did not finish in time",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("could not open {path}")]
    Io {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("refused {path}: {reason} ({detail})")]
    Refused {
        path: String,
        reason: Refusal,
        detail: String,
    },
}

impl OpenError {
    /// The reason, when the file exists but was refused.
    pub fn refusal(&self) -> Option<Refusal> {
        match self {
            Self::Refused { reason, .. } => Some(*reason),
            Self::Io { .. } => None,
        }
    }

    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }
}

/// The most of a mountinfo file read (a few thousand mounts).
const MAX_MOUNTINFO_BYTES: u64 = 4 << 20;

/// The FUSE mounts of the process at `process_dir` (`/proc/PID`); all of
/// its root when its mountinfo cannot be read.
pub fn fuse_mounts(process_dir: &Path) -> FuseMounts {
    let mut text = Vec::new();
    let read = File::open(process_dir.join("mountinfo"))
        .and_then(|file| file.take(MAX_MOUNTINFO_BYTES).read_to_end(&mut text));
    match read {
        Ok(_) => FuseMounts::parse(&String::from_utf8_lossy(&text)),
        Err(_) => FuseMounts::unknown(),
    }
}

/// The root directory of a process (`/proc/PID/root`), held open: paths
/// are resolved inside it, as the process resolves them, whatever
/// symlinks it plants.
#[derive(Debug)]
pub struct ProcessRoot {
    dir: OwnedFd,
    fuse: FuseMounts,
}

impl ProcessRoot {
    /// `root` is a directory standing for a root, with no FUSE mounts
    /// beneath it.
    pub fn open(root: &Path) -> Result<Self, OpenError> {
        Self::with_mounts(root, FuseMounts::default())
    }

    /// The root of the process at `process_dir` (`/proc/PID`), with the
    /// FUSE mounts of its mount namespace.
    pub fn of_process(process_dir: &Path, fuse: FuseMounts) -> Result<Self, OpenError> {
        Self::with_mounts(&process_dir.join("root"), fuse)
    }

    fn with_mounts(root: &Path, fuse: FuseMounts) -> Result<Self, OpenError> {
        let dir = rustix::fs::open(
            root,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|errno| io_error(root, errno))?;
        Ok(Self { dir, fuse })
    }

    /// Opens `path` (absolute or relative, as the process sees it) for
    /// reading. Symlinks, absolute ones included, and `..` resolve inside
    /// the root; magic links (`/proc/*/root`, `/proc/*/fd/*`) are refused.
    /// In a mount namespace with FUSE mounts, a path beneath one is refused
    /// before any lookup, and symlinks are not followed (one could lead
    /// beneath one).
    pub fn open_file(&self, path: &Path, max_bytes: u64) -> Result<File, OpenError> {
        let mut resolve = ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS;
        if !self.fuse.is_empty() {
            if self.fuse.covers(path) {
                return Err(refused(path, Refusal::Fuse, "beneath a FUSE mount".into()));
            }
            resolve |= ResolveFlags::NO_SYMLINKS;
        }
        let relative = path.strip_prefix("/").unwrap_or(path);
        let handle = rustix::fs::openat2(
            &self.dir,
            relative,
            OFlags::PATH | OFlags::CLOEXEC,
            Mode::empty(),
            resolve,
        )
        .map_err(|errno| io_error(path, errno))?;
        reopen_checked(handle, path, max_bytes)
    }
}

/// Opens the file a magic link names (`/proc/PID/map_files/…`, which the
/// kernel resolves to the exact mapped file, deleted or in another mount
/// namespace), with the same checks.
pub fn open_magic_link(link: &Path, max_bytes: u64) -> Result<File, OpenError> {
    let handle = rustix::fs::open(link, OFlags::PATH | OFlags::CLOEXEC, Mode::empty())
        .map_err(|errno| io_error(link, errno))?;
    reopen_checked(handle, link, max_bytes)
}

/// Opens a file named on the host (a flag, the config file, a host debug
/// directory) with the same checks; symlinks are followed as usual, since
/// whoever wrote the path chose them.
pub fn open_host_file(path: &Path, max_bytes: u64) -> Result<File, OpenError> {
    let handle = rustix::fs::open(path, OFlags::PATH | OFlags::CLOEXEC, Mode::empty())
        .map_err(|errno| io_error(path, errno))?;
    reopen_checked(handle, path, max_bytes)
}

/// Reads a small file named on the host whole (a token, a CA bundle, a
/// config file).
pub fn read_host_file(path: &Path) -> Result<Vec<u8>, OpenError> {
    let file = open_host_file(path, MAX_SMALL_FILE_BYTES)?;
    let mut bytes = Vec::new();
    // The size was checked, but the file may grow while it is read.
    file.take(MAX_SMALL_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| OpenError::Io {
            path: path.display().to_string(),
            source,
        })?;
    if bytes.len() as u64 > MAX_SMALL_FILE_BYTES {
        return Err(refused(
            path,
            Refusal::TooLarge,
            format!("more than {MAX_SMALL_FILE_BYTES} bytes"),
        ));
    }
    Ok(bytes)
}

/// [`read_host_file`] as UTF-8 text.
pub fn read_host_text(path: &Path) -> Result<String, OpenError> {
    String::from_utf8(read_host_file(path)?).map_err(|error| OpenError::Io {
        path: path.display().to_string(),
        source: io::Error::new(io::ErrorKind::InvalidData, error.utf8_error()),
    })
}

/// Refused paths remembered so that each is logged once.
const LOGGED_REFUSALS: NonZeroUsize = NonZeroUsize::new(256).expect("non-zero");

/// Counts refused files by reason and logs each refused path once (a
/// bounded memory of them: a process planting FIFOs cannot flood the log).
#[derive(Clone)]
pub struct Refusals {
    stats: Arc<Stats>,
    logged: Arc<Mutex<LruCache<String, ()>>>,
}

impl Refusals {
    pub fn new(stats: Arc<Stats>) -> Self {
        Self {
            stats,
            logged: Arc::new(Mutex::new(LruCache::new(LOGGED_REFUSALS))),
        }
    }

    /// Counts and logs `error` if it is a refusal; other errors (a missing
    /// file) are the caller's business.
    pub fn record(&self, pid: u32, error: &OpenError) {
        if let OpenError::Refused { path, reason, .. } = error {
            self.count(*reason);
            self.log_once(pid, path, &error.to_string());
        }
    }

    /// Counts a file whose opening missed its deadline.
    pub fn record_timeout(&self, pid: u32, path: &str) {
        self.count(Refusal::TimedOut);
        self.log_once(pid, path, &format!("refused {path}: {}", Refusal::TimedOut));
    }

    fn count(&self, reason: Refusal) {
        let counter = match reason {
            Refusal::NotRegular => &self.stats.untrusted_refused_not_regular,
            Refusal::TooLarge => &self.stats.untrusted_refused_too_large,
            Refusal::Fuse => &self.stats.untrusted_refused_fuse,
            Refusal::TimedOut => &self.stats.untrusted_refused_timed_out,
        };
        Stats::inc(counter);
    }

    fn log_once(&self, pid: u32, path: &str, message: &str) {
        let first = self
            .logged
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(path.to_owned(), ())
            .is_none_or(|(evicted, ())| evicted != path);
        if first {
            warn!(pid, "{message}");
        }
    }
}

/// Checks what `handle` (an `O_PATH` descriptor) is, then opens it for
/// reading.
fn reopen_checked(handle: OwnedFd, path: &Path, max_bytes: u64) -> Result<File, OpenError> {
    let stat = rustix::fs::fstat(&handle).map_err(|errno| io_error(path, errno))?;
    let file_type = FileType::from_raw_mode(stat.st_mode);
    if file_type != FileType::RegularFile {
        return Err(refused(path, Refusal::NotRegular, format!("{file_type:?}")));
    }
    let size = u64::try_from(stat.st_size).unwrap_or(0);
    if size > max_bytes {
        return Err(refused(
            path,
            Refusal::TooLarge,
            format!("{size} bytes, at most {max_bytes} read"),
        ));
    }
    let filesystem = rustix::fs::fstatfs(&handle).map_err(|errno| io_error(path, errno))?;
    // The field's integer type differs between libcs and architectures.
    #[allow(clippy::useless_conversion, clippy::unnecessary_cast)]
    if filesystem.f_type as u64 == FUSE_SUPER_MAGIC {
        return Err(refused(path, Refusal::Fuse, "FUSE".into()));
    }
    // Reopening through the descriptor's /proc entry opens this very
    // inode, whatever happened to the path since. O_NONBLOCK: a regular
    // file ignores it, and it keeps a mandatory-lock or lease wait short.
    let fd_path = format!("/proc/self/fd/{}", handle.as_fd().as_raw_fd());
    let file = rustix::fs::open(
        fd_path.as_str(),
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK,
        Mode::empty(),
    )
    .map_err(|errno| io_error(path, errno))?;
    Ok(File::from(file))
}

fn io_error(path: &Path, errno: rustix::io::Errno) -> OpenError {
    OpenError::Io {
        path: path.display().to_string(),
        source: io::Error::from(errno),
    }
}

fn refused(path: &Path, reason: Refusal, detail: String) -> OpenError {
    OpenError::Refused {
        path: path.display().to_string(),
        reason,
        detail,
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    #[test]
    fn mountinfo_is_read_or_everything_is_on_fuse() {
        assert!(!fuse_mounts(Path::new("/proc/self")).is_unknown());
        assert!(fuse_mounts(Path::new("/nonexistent/4194305")).is_unknown());
    }

    fn mkfifo(path: &Path) {
        rustix::fs::mknodat(
            rustix::fs::CWD,
            path,
            FileType::Fifo,
            Mode::from_raw_mode(0o644),
            0,
        )
        .expect("mkfifo");
    }

    #[test]
    fn a_fifo_is_refused_without_waiting_for_a_writer() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("perf-1.map");
        mkfifo(&fifo);
        let root = ProcessRoot::open(dir.path()).expect("root");
        let error = root
            .open_file(Path::new("/perf-1.map"), MAX_OBJECT_BYTES)
            .expect_err("a FIFO");
        assert_eq!(error.refusal(), Some(Refusal::NotRegular), "{error}");
        let error = open_host_file(&fifo, MAX_SMALL_FILE_BYTES).expect_err("a FIFO");
        assert_eq!(error.refusal(), Some(Refusal::NotRegular), "{error}");
        assert!(read_host_file(&fifo).is_err());
    }

    #[test]
    fn devices_and_directories_are_refused() {
        for path in ["/dev/zero", "/dev/null", "/"] {
            let error = open_host_file(Path::new(path), MAX_OBJECT_BYTES).expect_err(path);
            assert_eq!(
                error.refusal(),
                Some(Refusal::NotRegular),
                "{path}: {error}"
            );
        }
    }

    #[test]
    fn absolute_symlinks_resolve_inside_the_root() {
        let host = tempfile::tempdir().expect("tempdir");
        let secret = host.path().join("secret");
        std::fs::write(&secret, b"host").expect("write");
        let container = tempfile::tempdir().expect("tempdir");
        // Inside the "container", the link's target is another file.
        let target_inside = container
            .path()
            .join(secret.strip_prefix("/").expect("absolute"));
        std::fs::create_dir_all(target_inside.parent().expect("parent")).expect("mkdir");
        std::fs::write(&target_inside, b"container").expect("write");
        symlink(&secret, container.path().join("link")).expect("symlink");
        symlink("../../../../../../..", container.path().join("up")).expect("symlink");

        let root = ProcessRoot::open(container.path()).expect("root");
        let mut text = String::new();
        root.open_file(Path::new("/link"), MAX_OBJECT_BYTES)
            .expect("opens")
            .read_to_string(&mut text)
            .expect("reads");
        assert_eq!(text, "container");
        // `..` stops at the root as well.
        let through_parent = Path::new("/up").join(secret.strip_prefix("/").expect("abs"));
        let mut text = String::new();
        root.open_file(&through_parent, MAX_OBJECT_BYTES)
            .expect("opens")
            .read_to_string(&mut text)
            .expect("reads");
        assert_eq!(text, "container");
    }

    #[test]
    fn a_symlink_with_nothing_behind_it_inside_the_root_is_not_found() {
        let host = tempfile::tempdir().expect("tempdir");
        let secret = host.path().join("secret");
        std::fs::write(&secret, b"host").expect("write");
        let container = tempfile::tempdir().expect("tempdir");
        symlink(&secret, container.path().join("link")).expect("symlink");
        let root = ProcessRoot::open(container.path()).expect("root");
        let error = root
            .open_file(Path::new("link"), MAX_OBJECT_BYTES)
            .expect_err("the host file is not inside");
        assert!(error.is_not_found(), "{error}");
    }

    #[test]
    fn magic_links_inside_the_root_are_refused() {
        // A link to /proc/self/root would leave any root.
        let container = tempfile::tempdir().expect("tempdir");
        symlink(
            "/proc/self/root/etc/hostname",
            container.path().join("link"),
        )
        .expect("symlink");
        let root = ProcessRoot::open(Path::new("/")).expect("root");
        let error = root
            .open_file(&container.path().join("link"), MAX_OBJECT_BYTES)
            .expect_err("magic link");
        assert!(matches!(error, OpenError::Io { .. }), "{error}");
    }

    #[test]
    fn sparse_giants_are_refused_by_size() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("holes");
        let file = File::create(&path).expect("create");
        file.set_len(64 << 30).expect("64 GiB of holes");
        let error = open_host_file(&path, MAX_OBJECT_BYTES).expect_err("too large");
        assert_eq!(error.refusal(), Some(Refusal::TooLarge), "{error}");
        let small = dir.path().join("small");
        File::create(&small)
            .expect("create")
            .set_len(MAX_SMALL_FILE_BYTES + 1)
            .expect("set_len");
        assert_eq!(
            read_host_file(&small).expect_err("too large").refusal(),
            Some(Refusal::TooLarge)
        );
    }

    #[test]
    fn regular_files_read_as_usual() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("token");
        std::fs::write(&path, "secret\n").expect("write");
        assert_eq!(read_host_text(&path).expect("reads"), "secret\n");
        let map_file = open_magic_link(Path::new("/proc/self/exe"), MAX_OBJECT_BYTES);
        assert!(map_file.is_ok(), "{map_file:?}");
    }
}
