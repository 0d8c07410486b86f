//! Profiles written to a local directory, oldest deleted beyond a size.

use std::{
    fs,
    path::PathBuf,
    sync::Arc,
    time::{Instant, SystemTime, UNIX_EPOCH},
};

use tracing::warn;

use super::{ExportReceipt, Exporter, Grouping, OutputError, ProfileBatch, ProfileKind};
use crate::stats::Stats;

const PREFIX: &str = "profile-";
const SUFFIX: &str = ".pb.gz";
/// A profile being written: `.profile-<ms>.tmp`.
const TEMPORARY_PREFIX: &str = ".profile-";
const TEMPORARY_SUFFIX: &str = ".tmp";

/// Where profiles go without a remote store.
#[derive(Clone, Debug)]
pub struct LocalStoreConfig {
    pub directory: PathBuf,
    /// Oldest profiles are deleted (and counted) beyond this many bytes.
    pub max_bytes: u64,
}

pub struct LocalStore {
    directory: PathBuf,
    max_bytes: u64,
    stats: Arc<Stats>,
}

impl LocalStore {
    pub fn new(config: &LocalStoreConfig, stats: Arc<Stats>) -> Result<Self, OutputError> {
        let directory = &config.directory;
        fs::create_dir_all(directory).map_err(|source| OutputError::CreateDir {
            path: directory.display().to_string(),
            source,
        })?;
        let store = Self {
            directory: directory.clone(),
            max_bytes: config.max_bytes,
            stats,
        };
        store.remove_leftovers();
        Ok(store)
    }

    /// Temporary files a firn killed mid-write left behind: nothing else
    /// would ever delete them, and they are not counted in the size limit.
    fn remove_leftovers(&self) {
        let Ok(entries) = fs::read_dir(&self.directory) else {
            return;
        };
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with(TEMPORARY_PREFIX) && name.ends_with(TEMPORARY_SUFFIX) {
                let _ = fs::remove_file(entry.path());
            }
        }
    }

    /// Writes one gzipped profile (atomically: temp file, then rename) named
    /// after its start time, then enforces the size limit.
    pub fn write(&self, gzipped: &[u8], start: SystemTime) -> Result<PathBuf, OutputError> {
        self.write_kind(gzipped, start, ProfileKind::Cpu)
    }

    /// [`Self::write`]; an off-CPU profile is `profile-<ms>.offcpu.pb.gz`,
    /// under the same size limit.
    fn write_kind(
        &self,
        gzipped: &[u8],
        start: SystemTime,
        kind: ProfileKind,
    ) -> Result<PathBuf, OutputError> {
        let millis = start
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        let infix = match kind {
            ProfileKind::Cpu => "",
            ProfileKind::OffCpu => ".offcpu",
        };
        let path = self
            .directory
            .join(format!("{PREFIX}{millis:016}{infix}{SUFFIX}"));
        let temporary = self.directory.join(format!(
            "{TEMPORARY_PREFIX}{millis:016}{infix}{TEMPORARY_SUFFIX}"
        ));
        let written = fs::write(&temporary, gzipped).and_then(|()| fs::rename(&temporary, &path));
        if let Err(source) = written {
            // A full or read-only store fails after creating the file: an
            // empty temporary per interval would pile up otherwise.
            let _ = fs::remove_file(&temporary);
            return Err(OutputError::Write {
                path: path.display().to_string(),
                source,
            });
        }
        self.enforce_limit();
        Ok(path)
    }

    fn enforce_limit(&self) {
        let Ok(entries) = fs::read_dir(&self.directory) else {
            return;
        };
        let mut profiles: Vec<(String, u64)> = entries
            .filter_map(Result::ok)
            .filter_map(|entry| {
                let name = entry.file_name().into_string().ok()?;
                (name.starts_with(PREFIX) && name.ends_with(SUFFIX)).then_some(())?;
                Some((name, entry.metadata().ok()?.len()))
            })
            .collect();
        profiles.sort();
        let mut total: u64 = profiles.iter().map(|(_, size)| size).sum();
        // Never delete the profile just written.
        for (name, size) in profiles.iter().take(profiles.len().saturating_sub(1)) {
            if total <= self.max_bytes {
                break;
            }
            match fs::remove_file(self.directory.join(name)) {
                Ok(()) => {
                    total -= size;
                    Stats::inc(&self.stats.local_profiles_deleted);
                }
                Err(error) => warn!(file = name, %error, "could not delete an old profile"),
            }
        }
    }
}

/// One file per interval, every process in it.
impl Exporter for LocalStore {
    fn grouping(&self) -> Grouping {
        Grouping::Whole
    }

    fn export(&mut self, batch: ProfileBatch) -> Result<ExportReceipt, OutputError> {
        let mut receipt = ExportReceipt {
            action: "profile written",
            destination: String::new(),
            bytes: 0,
        };
        for profile in &batch.profiles {
            let path = self.write_kind(&profile.gzipped, batch.start, batch.kind)?;
            Stats::inc(&self.stats.profiles_written);
            receipt.destination = path.display().to_string();
            receipt.bytes += profile.gzipped.len();
        }
        Ok(receipt)
    }

    fn finish(self: Box<Self>, _deadline: Instant) {}
}

#[cfg(test)]
mod tests {
    use std::{path::Path, time::Duration};

    use super::*;

    fn store(
        directory: &Path,
        max_bytes: u64,
        stats: Arc<Stats>,
    ) -> Result<LocalStore, OutputError> {
        let config = LocalStoreConfig {
            directory: directory.to_path_buf(),
            max_bytes,
        };
        LocalStore::new(&config, stats)
    }

    #[test]
    fn oldest_profiles_go_first_when_over_the_limit() {
        let dir = tempfile::tempdir().expect("tempdir");
        let stats = Arc::new(Stats::default());
        let store = store(&dir.path().join("nested"), 250, stats.clone()).expect("store");
        let base = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let mut written = Vec::new();
        for i in 0..4 {
            written.push(
                store
                    .write(&[0u8; 100], base + Duration::from_secs(i))
                    .expect("writes"),
            );
        }
        let remaining: Vec<bool> = written.iter().map(|p| p.exists()).collect();
        assert_eq!(remaining, [false, false, true, true]);
        assert_eq!(stats.snapshot().local_profiles_deleted, 2);
    }

    /// A tmpfs of 64 KiB, unmounted (lazily) when dropped.
    struct SmallTmpfs(PathBuf);

    impl SmallTmpfs {
        fn mount(path: &Path) -> Self {
            use std::ffi::CString;
            let target = CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
            // SAFETY: valid NUL-terminated strings; a fresh mount on our
            // own temporary directory.
            let status = unsafe {
                libc::mount(
                    c"tmpfs".as_ptr(),
                    target.as_ptr(),
                    c"tmpfs".as_ptr(),
                    0,
                    c"size=64k".as_ptr().cast(),
                )
            };
            assert_eq!(
                status,
                0,
                "mounting a tmpfs needs root (the tests run as root): {}",
                std::io::Error::last_os_error()
            );
            Self(path.to_path_buf())
        }
    }

    impl Drop for SmallTmpfs {
        fn drop(&mut self) {
            use std::ffi::CString;
            let target = CString::new(self.0.as_os_str().as_encoded_bytes()).expect("path");
            // SAFETY: unmounts the tmpfs `mount` made.
            unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        }
    }

    fn leftovers(dir: &Path) -> Vec<String> {
        fs::read_dir(dir)
            .expect("readable")
            .filter_map(Result::ok)
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(TEMPORARY_SUFFIX))
            .collect()
    }

    #[test]
    fn a_full_store_fails_with_the_os_error_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let _tmpfs = SmallTmpfs::mount(dir.path());
        let store = store(dir.path(), 1 << 30, Arc::new(Stats::default())).expect("store");
        let base = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let mut failures = 0;
        for i in 0..4 {
            if let Err(error) = store.write(&[7u8; 48 << 10], base + Duration::from_secs(i)) {
                failures += 1;
                let chain = format!("{:#}", anyhow::Error::from(error));
                assert!(chain.contains("No space left on device"), "{chain}");
            }
        }
        assert!(failures >= 2, "a 64 KiB store takes one 48 KiB profile");
        assert_eq!(leftovers(dir.path()), Vec::<String>::new());
    }

    #[test]
    fn temporary_files_of_an_earlier_run_are_removed_at_start() {
        let dir = tempfile::tempdir().expect("tempdir");
        fs::write(dir.path().join(".profile-0000000000000001.tmp"), b"").expect("file");
        fs::write(dir.path().join("unrelated.tmp"), b"").expect("file");
        store(dir.path(), 1 << 30, Arc::new(Stats::default())).expect("store");
        assert_eq!(leftovers(dir.path()), ["unrelated.tmp"]);
    }

    #[test]
    fn an_unwritable_directory_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("not-a-dir");
        fs::write(&file, b"x").expect("file");
        assert!(store(&file, 1, Arc::new(Stats::default())).is_err());
    }
}
