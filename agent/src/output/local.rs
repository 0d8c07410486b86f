//! Profiles written to a local directory, oldest deleted beyond a size.

use std::{
    fs,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Instant, SystemTime, UNIX_EPOCH},
};

use tracing::warn;

use super::{ExportReceipt, Exporter, Grouping, OutputError, ProfileBatch};
use crate::stats::Stats;

const PREFIX: &str = "profile-";
const SUFFIX: &str = ".pb.gz";

pub struct LocalStore {
    directory: PathBuf,
    max_bytes: u64,
    stats: Arc<Stats>,
}

impl LocalStore {
    pub fn new(directory: &Path, max_bytes: u64, stats: Arc<Stats>) -> Result<Self, OutputError> {
        fs::create_dir_all(directory).map_err(|source| OutputError::CreateDir {
            path: directory.display().to_string(),
            source,
        })?;
        Ok(Self {
            directory: directory.to_path_buf(),
            max_bytes,
            stats,
        })
    }

    /// Writes one gzipped profile (atomically: temp file, then rename) named
    /// after its start time, then enforces the size limit.
    pub fn write(&self, gzipped: &[u8], start: SystemTime) -> Result<PathBuf, OutputError> {
        let millis = start
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        let path = self.directory.join(format!("{PREFIX}{millis:016}{SUFFIX}"));
        let temporary = self.directory.join(format!(".{PREFIX}{millis:016}.tmp"));
        let error = |source| OutputError::Write {
            path: path.display().to_string(),
            source,
        };
        fs::write(&temporary, gzipped).map_err(error)?;
        fs::rename(&temporary, &path).map_err(error)?;
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
            let path = self.write(&profile.gzipped, batch.start)?;
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
    use std::time::Duration;

    use super::*;

    #[test]
    fn oldest_profiles_go_first_when_over_the_limit() {
        let dir = tempfile::tempdir().expect("tempdir");
        let stats = Arc::new(Stats::default());
        let store = LocalStore::new(&dir.path().join("nested"), 250, stats.clone()).expect("store");
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

    #[test]
    fn an_unwritable_directory_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("not-a-dir");
        fs::write(&file, b"x").expect("file");
        assert!(LocalStore::new(&file, 1, Arc::new(Stats::default())).is_err());
    }
}
