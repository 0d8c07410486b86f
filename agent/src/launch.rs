//! Starting the command `firn record` profiles. The child is forked and
//! held just before its `exec` until the sampler is attached with the
//! child's pid in the kernel's filter, so the profile starts at the new
//! image's first instruction. Run through sudo, the command runs as the
//! invoking user, as it would have without firn.

use std::{
    ffi::{CString, OsStr, OsString},
    fs::File,
    io::{self, Read, Write},
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::{
            ffi::OsStrExt,
            process::{CommandExt, ExitStatusExt},
        },
    },
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus},
    thread::JoinHandle,
};

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("`{program}`: command not found")]
    NotFound { program: String },
    #[error("could not start `{program}`")]
    Spawn {
        program: String,
        #[source]
        source: io::Error,
    },
    #[error("SUDO_{name} is `{value}`, not a number")]
    SudoVariable { name: &'static str, value: String },
    #[error("could not look up the groups of user `{user}`")]
    Groups { user: String },
}

/// Who the command runs as, when not as firn itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

impl TargetUser {
    /// The user who ran `sudo firn ...`: `SUDO_UID`, `SUDO_GID` and
    /// `SUDO_USER`, when firn runs as root and they name someone else.
    pub fn from_sudo(lookup: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, LaunchError> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Ok(None);
        }
        let (Some(uid), Some(gid), Some(name)) =
            (lookup("SUDO_UID"), lookup("SUDO_GID"), lookup("SUDO_USER"))
        else {
            return Ok(None);
        };
        let number = |name: &'static str, value: String| {
            value
                .trim()
                .parse::<u32>()
                .map_err(|_| LaunchError::SudoVariable { name, value })
        };
        let uid = number("UID", uid)?;
        let gid = number("GID", gid)?;
        if uid == 0 {
            return Ok(None);
        }
        let groups =
            groups_of(&name, gid).ok_or_else(|| LaunchError::Groups { user: name.clone() })?;
        Ok(Some(Self {
            name,
            uid,
            gid,
            groups,
        }))
    }
}

/// The user's supplementary groups, as login would set them.
fn groups_of(user: &str, gid: u32) -> Option<Vec<u32>> {
    let name = CString::new(user).ok()?;
    let mut groups: Vec<libc::gid_t> = vec![0; 64];
    for _ in 0..4 {
        let mut count = libc::c_int::try_from(groups.len()).ok()?;
        // SAFETY: the buffer holds `count` gids; getgrouplist writes at
        // most that many and sets `count` to how many there are.
        let found =
            unsafe { libc::getgrouplist(name.as_ptr(), gid, groups.as_mut_ptr(), &mut count) };
        let count = usize::try_from(count).ok()?;
        if found >= 0 {
            groups.truncate(count);
            return Some(groups);
        }
        groups.resize(count.max(groups.len() * 2), 0);
    }
    None
}

/// What to run.
#[derive(Clone, Debug)]
pub struct LaunchConfig {
    pub program: OsString,
    pub args: Vec<OsString>,
    pub user: Option<TargetUser>,
}

/// A command forked and waiting before its exec.
pub struct Held {
    pid: u32,
    program: String,
    /// Closing it without a byte makes the child give up.
    go: File,
    spawner: JoinHandle<io::Result<Child>>,
}

/// A command running its own image.
pub struct Running {
    pub pid: u32,
    child: Child,
}

/// The program as exec would find it: a path as is, a bare name on PATH.
fn resolve(program: &OsStr, path: Option<&OsStr>) -> Option<PathBuf> {
    if program.as_bytes().contains(&b'/') {
        return Some(PathBuf::from(program));
    }
    std::env::split_paths(path?)
        .map(|dir| dir.join(program))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

fn pipe() -> io::Result<(File, File)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array we own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just opened and are owned by nobody else.
    Ok(unsafe {
        (
            File::from(OwnedFd::from_raw_fd(fds[0])),
            File::from(OwnedFd::from_raw_fd(fds[1])),
        )
    })
}

/// Runs in the forked child before exec: only async-signal-safe calls (the
/// parent has other threads), no allocation.
fn child_hold(
    ready: i32,
    go_read: i32,
    go_write: i32,
    user: Option<&TargetUser>,
) -> io::Result<()> {
    // SAFETY: plain system calls on descriptors the child inherited and
    // buffers on its stack; `groups` outlives the call.
    unsafe {
        libc::close(go_write);
        let pid = libc::getpid().to_ne_bytes();
        if libc::write(ready, pid.as_ptr().cast(), pid.len()) != 4 {
            return Err(io::Error::last_os_error());
        }
        let mut byte = 0u8;
        loop {
            match libc::read(go_read, (&raw mut byte).cast(), 1) {
                1 => break,
                // firn let go without starting it (it failed or was stopped).
                0 => return Err(io::Error::from_raw_os_error(libc::ECANCELED)),
                _ if io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) => {}
                _ => return Err(io::Error::last_os_error()),
            }
        }
        if let Some(user) = user
            && (libc::setgroups(user.groups.len(), user.groups.as_ptr()) != 0
                || libc::setgid(user.gid) != 0
                || libc::setuid(user.uid) != 0)
        {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

impl Held {
    /// Forks the command; it waits for [`Held::release`].
    pub fn spawn(config: &LaunchConfig) -> Result<Self, LaunchError> {
        let program = config.program.to_string_lossy().into_owned();
        let path = resolve(&config.program, std::env::var_os("PATH").as_deref())
            .filter(|path| path.exists())
            .ok_or_else(|| LaunchError::NotFound {
                program: program.clone(),
            })?;
        let spawn_error = |source| LaunchError::Spawn {
            program: program.clone(),
            source,
        };
        let (mut ready_read, ready_write) = pipe().map_err(spawn_error)?;
        let (go_read, go) = pipe().map_err(spawn_error)?;
        let mut command = Command::new(&path);
        command.arg0(&config.program).args(&config.args);
        if let Some(user) = &config.user {
            command.env("USER", &user.name).env("LOGNAME", &user.name);
        }
        let user = config.user.clone();
        let fds = (ready_write.as_raw_fd(), go_read.as_raw_fd(), go.as_raw_fd());
        // SAFETY: the hook runs between fork and exec and only makes
        // async-signal-safe system calls (`child_hold`).
        unsafe {
            command.pre_exec(move || child_hold(fds.0, fds.1, fds.2, user.as_ref()));
        }
        // `spawn` returns only once the child has exec'd or failed, which
        // waits for the release: it runs on a thread of its own.
        let spawner = std::thread::Builder::new()
            .name("firn-launch".into())
            .spawn(move || {
                let child = command.spawn();
                // The parent's ends close here, so a fork that failed shows
                // as end of file on the ready pipe.
                drop((ready_write, go_read));
                child
            })
            .map_err(spawn_error)?;
        let mut pid = [0u8; 4];
        if let Err(read_error) = ready_read.read_exact(&mut pid) {
            let source = match spawner.join() {
                Ok(Err(error)) => error,
                _ => read_error,
            };
            return Err(spawn_error(source));
        }
        Ok(Self {
            pid: u32::from_ne_bytes(pid),
            program,
            go,
            spawner,
        })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Lets the command exec; errors when the exec failed.
    pub fn release(mut self) -> Result<Running, LaunchError> {
        let program = &self.program;
        let spawn_error = |source| LaunchError::Spawn {
            program: program.clone(),
            source,
        };
        self.go.write_all(&[1]).map_err(spawn_error)?;
        drop(self.go);
        let child = self
            .spawner
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the launching thread panicked")))
            .map_err(spawn_error)?;
        Ok(Running {
            pid: self.pid,
            child,
        })
    }
}

impl Running {
    /// Blocks until the command has exited, without reaping it: its pid
    /// stays its own (safe to signal) until [`Running::reap`].
    pub fn wait_exited(pid: u32) -> io::Result<()> {
        loop {
            // SAFETY: an all-zero siginfo_t is valid; waitid fills it in.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: waitid writes only into `info`.
            let result =
                unsafe { libc::waitid(libc::P_PID, pid, &mut info, libc::WEXITED | libc::WNOWAIT) };
            if result == 0 {
                return Ok(());
            }
            let error = io::Error::last_os_error();
            if error.raw_os_error() != Some(libc::EINTR) {
                return Err(error);
            }
        }
    }

    /// Sends `signal` to the command, which has not been reaped yet.
    pub fn signal(&self, signal: i32) {
        let Ok(pid) = libc::pid_t::try_from(self.pid) else {
            return;
        };
        // SAFETY: the child is not reaped before `reap`, so the pid is
        // still the command's.
        unsafe { libc::kill(pid, signal) };
    }

    /// Reaps the command; its exit status.
    pub fn reap(mut self) -> io::Result<ExitStatus> {
        self.child.wait()
    }
}

/// The exit status a shell would report: the code, or 128 + the signal.
pub fn shell_status(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(1),
        (None, Some(signal)) => u8::try_from(128 + (signal & 0x7f)).unwrap_or(1),
        (None, None) => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_resolve_on_path_or_as_given() {
        let path = OsString::from("/nonexistent:/bin:/usr/bin");
        assert!(resolve(OsStr::new("sh"), Some(&path)).is_some_and(|p| p.ends_with("sh")));
        assert_eq!(
            resolve(OsStr::new("no-such-program-here"), Some(&path)),
            None
        );
        assert_eq!(resolve(OsStr::new("./x"), None), Some(PathBuf::from("./x")));
    }

    #[test]
    fn a_held_command_runs_once_released_and_reports_its_status() {
        let config = LaunchConfig {
            program: "sh".into(),
            args: vec!["-c".into(), "exit 7".into()],
            user: None,
        };
        let held = Held::spawn(&config).expect("forks");
        assert!(held.pid() > 0);
        let running = held.release().expect("execs");
        Running::wait_exited(running.pid).expect("waits");
        assert_eq!(shell_status(running.reap().expect("reaps")), 7);
    }

    #[test]
    fn a_command_never_released_does_not_run() {
        let dir = tempfile::tempdir().expect("tempdir");
        let marker = dir.path().join("ran");
        let config = LaunchConfig {
            program: "touch".into(),
            args: vec![marker.clone().into()],
            user: None,
        };
        let held = Held::spawn(&config).expect("forks");
        drop(held);
        assert!(!marker.exists());
        let missing = LaunchConfig {
            program: "no-such-program-here".into(),
            args: Vec::new(),
            user: None,
        };
        assert!(matches!(
            Held::spawn(&missing),
            Err(LaunchError::NotFound { .. })
        ));
    }

    #[test]
    fn sudo_variables_name_the_user_only_when_they_are_someone_else() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(key, _)| *key == name)
                    .map(|(_, value)| (*value).to_owned())
            }
        };
        assert_eq!(TargetUser::from_sudo(env(&[])).expect("no sudo"), None);
        assert_eq!(
            TargetUser::from_sudo(env(&[
                ("SUDO_UID", "0"),
                ("SUDO_GID", "0"),
                ("SUDO_USER", "root")
            ]))
            .expect("root"),
            None
        );
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            assert!(matches!(
                TargetUser::from_sudo(env(&[
                    ("SUDO_UID", "x"),
                    ("SUDO_GID", "0"),
                    ("SUDO_USER", "a")
                ])),
                Err(LaunchError::SudoVariable { .. })
            ));
        }
    }
}
