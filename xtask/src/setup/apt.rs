//! apt-get that waits for another package manager instead of failing at
//! once: at boot unattended-upgrades, or a second `cargo xtask setup`,
//! often holds the dpkg lock for a minute or two.

use std::{
    ffi::CString,
    os::unix::ffi::OsStrExt,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Result, bail};

/// How long apt-get, and the wait before it, give the lock holder.
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(300);

/// The locks apt and dpkg take (fcntl record locks on the whole file).
/// `apt-get update` takes the lists lock, which `DPkg::Lock::Timeout` does
/// not cover: hence the wait of our own.
const LOCKS: &[&str] = &[
    "/var/lib/dpkg/lock-frontend",
    "/var/lib/dpkg/lock",
    "/var/lib/apt/lists/lock",
    "/var/cache/apt/archives/lock",
];

/// `apt-get`, non-interactive, waiting up to [`LOCK_TIMEOUT`] for the dpkg
/// lock.
pub fn apt_get() -> Command {
    let mut command = Command::new("apt-get");
    command
        .env("DEBIAN_FRONTEND", "noninteractive")
        .arg(format!("-oDPkg::Lock::Timeout={}", LOCK_TIMEOUT.as_secs()));
    command
}

/// Waits until no other process holds apt's or dpkg's locks.
pub fn wait_for_locks() -> Result<()> {
    let paths: Vec<&Path> = LOCKS.iter().map(Path::new).collect();
    wait_for(&paths, LOCK_TIMEOUT, Duration::from_secs(1))
}

fn wait_for(paths: &[&Path], timeout: Duration, poll: Duration) -> Result<()> {
    let started = Instant::now();
    let mut told = false;
    loop {
        let Some((path, holder)) = paths.iter().find_map(|path| Some((path, holder(path)?))) else {
            return Ok(());
        };
        let who = if holder > 0 {
            format!("process {holder}")
        } else {
            "another process".to_owned()
        };
        if started.elapsed() >= timeout {
            bail!(
                "{} is still held by {who} after {}s; is another package manager running?",
                path.display(),
                timeout.as_secs()
            );
        }
        if !told {
            eprintln!(
                "xtask: waiting for {who} to release {} (at most {}s)",
                path.display(),
                timeout.as_secs()
            );
            told = true;
        }
        std::thread::sleep(poll);
    }
}

/// The pid holding a lock on `path` (-1 for an open file description lock,
/// which has no owner pid), or None when it is free or missing.
fn holder(path: &Path) -> Option<i32> {
    let name = CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: a NUL-terminated path; the descriptor is closed below.
    let fd = unsafe { libc::open(name.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    // SAFETY: zeroed flock is a valid "whole file" request.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = libc::F_WRLCK as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    // SAFETY: F_GETLK fills in the struct we own; then the fd is closed.
    // F_GETLK never takes the lock, so closing cannot drop one of apt's.
    let status = unsafe { libc::fcntl(fd, libc::F_GETLK, &mut lock) };
    // SAFETY: our own descriptor.
    unsafe { libc::close(fd) };
    (status == 0 && lock.l_type != libc::F_UNLCK as libc::c_short).then_some(lock.l_pid)
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;

    /// An open file description lock: it conflicts with the record lock
    /// F_GETLK asks about even within this process, as apt's would.
    fn lock(file: &std::fs::File) -> i32 {
        // SAFETY: zeroed flock is a valid "whole file" request.
        let mut lock: libc::flock = unsafe { std::mem::zeroed() };
        lock.l_type = libc::F_WRLCK as libc::c_short;
        lock.l_whence = libc::SEEK_SET as libc::c_short;
        // SAFETY: the fd is open for the call.
        unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &mut lock) }
    }

    #[test]
    fn waits_while_a_lock_is_held_and_gives_up_at_the_timeout() {
        let path = std::env::temp_dir().join(format!("firn-xtask-lock-{}", std::process::id()));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .expect("lock file");
        let missing = path.with_extension("missing");
        let paths = [path.as_path(), missing.as_path()];
        wait_for(&paths, Duration::ZERO, Duration::ZERO).expect("free: no wait");
        assert_eq!(lock(&file), 0);
        assert_eq!(holder(&path), Some(-1));
        let error = wait_for(
            &paths,
            Duration::from_millis(100),
            Duration::from_millis(10),
        )
        .expect_err("held");
        assert!(error.to_string().contains("still held"), "{error}");
        let released = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            drop(file);
        });
        wait_for(&paths, Duration::from_secs(30), Duration::from_millis(10))
            .expect("released in time");
        released.join().expect("joins");
        let _ = std::fs::remove_file(&path);
    }
}
