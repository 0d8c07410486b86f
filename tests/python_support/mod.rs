//! Support for the Python tests: the interpreters they run under, the
//! workload scripts in `tests/workloads/python/`, and each sample of a
//! profile read as frames that say whether they are Python's.

// Each test uses its own part of the support code.
#![allow(dead_code)]

pub mod brief;
pub mod expect;
pub mod frames;
pub mod frozen;
pub mod scripts;

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, ChildStdout, Command, Stdio},
    sync::mpsc,
    time::Duration,
};

/// One CPython build the tests run the workloads under.
#[derive(Clone, Debug)]
pub struct Interpreter {
    /// For messages: `pyenv 3.12.1`, `Debian 3.11`.
    pub name: String,
    pub path: PathBuf,
    /// `N` of 3.N.
    pub minor: u32,
}

impl Interpreter {
    /// Whether frames are named by `co_qualname` (3.11+) rather than
    /// `co_name`.
    pub fn has_qualnames(&self) -> bool {
        self.minor >= 11
    }

    /// The version as firn's metrics label it (`3.12`).
    pub fn version(&self) -> String {
        format!("3.{}", self.minor)
    }
}

/// The minor versions of CPython 3 firn names frames of.
pub const MINORS: std::ops::RangeInclusive<u32> = 8..=13;

/// Debian's own build (bookworm): linked statically, stripped, its debug
/// symbols not installed.
pub const DEBIAN_PYTHON: &str = "/usr/bin/python3.11";

/// Every interpreter the tests need: pyenv's builds of 3.8 to 3.13 (the
/// machine image ships them) and Debian's python3.11 (`cargo xtask setup`
/// installs it). Fails, naming it, when one is missing.
pub fn interpreters() -> Vec<Interpreter> {
    let root = std::env::var_os("PYENV_ROOT").map_or_else(
        || {
            let home = std::env::var_os("HOME").map_or_else(|| "/root".into(), PathBuf::from);
            home.join(".pyenv")
        },
        PathBuf::from,
    );
    let mut found: Vec<Interpreter> = MINORS.map(|minor| pyenv_build(&root, minor)).collect();
    assert!(
        Path::new(DEBIAN_PYTHON).exists(),
        "Debian's {DEBIAN_PYTHON} is missing: `cargo xtask setup` installs it \
         (apt-get install python3.11)"
    );
    found.push(Interpreter {
        name: "Debian 3.11".into(),
        path: DEBIAN_PYTHON.into(),
        minor: 11,
    });
    found
}

/// The newest pyenv build of 3.`minor` under `root`.
fn pyenv_build(root: &Path, minor: u32) -> Interpreter {
    let versions = root.join("versions");
    let prefix = format!("3.{minor}.");
    let mut builds: Vec<(u32, PathBuf)> = std::fs::read_dir(&versions)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let patch = name.strip_prefix(&prefix)?.parse().ok()?;
            let binary = entry.path().join(format!("bin/python3.{minor}"));
            binary.exists().then_some((patch, binary))
        })
        .collect();
    builds.sort();
    let Some((patch, path)) = builds.pop() else {
        panic!(
            "pyenv's CPython 3.{minor} is missing: no {}/3.{minor}.*/bin/python3.{minor} \
             (the machine image ships pyenv builds of 3.8 to 3.13; `pyenv install 3.{minor}` \
             makes one)",
            versions.display()
        );
    };
    Interpreter {
        name: format!("pyenv 3.{minor}.{patch}"),
        path,
        minor,
    }
}

/// The path of workload `name` (`chain.py`) as the interpreter is given it,
/// and so as its code objects name it: canonical, so that the frames'
/// file names can be compared with it as they are.
pub fn script(name: &str) -> PathBuf {
    let path = crate::common::workloads_dir().join("python").join(name);
    std::fs::canonicalize(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

/// The 1-based lines of `script` that hold `marker` (`# call:crunch`).
pub fn lines_with(script: &Path, marker: &str) -> Vec<i64> {
    let text = std::fs::read_to_string(script).expect("the workload script");
    let lines: Vec<i64> = text
        .lines()
        .enumerate()
        .filter(|(_, line)| line.contains(marker))
        .map(|(index, _)| index as i64 + 1)
        .collect();
    assert!(!lines.is_empty(), "no `{marker}` in {}", script.display());
    lines
}

/// The one line of `script` that holds `marker`.
pub fn line_with(script: &Path, marker: &str) -> i64 {
    let lines = lines_with(script, marker);
    assert_eq!(lines.len(), 1, "`{marker}` in {}", script.display());
    lines[0]
}

/// The lines from the one marked `# begin:NAME` to `# end:NAME`.
pub fn body_of(script: &Path, name: &str) -> std::ops::RangeInclusive<i64> {
    line_with(script, &format!("# begin:{name}"))..=line_with(script, &format!("# end:{name}"))
}

/// A workload running under one interpreter, killed when dropped.
pub struct PythonProcess {
    child: Child,
    pub interpreter: Interpreter,
    /// What it printed, line by line; held until the end so that a
    /// workload printing at exit does not die of SIGPIPE first.
    output: mpsc::Receiver<String>,
}

/// How long an interpreter may take to start and print `ready`.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

impl PythonProcess {
    /// Starts `interpreter script ARGS` and waits until it prints `ready`.
    pub fn start(interpreter: &Interpreter, script: &Path, args: &[&str]) -> Self {
        let mut child = Command::new(&interpreter.path)
            .arg(script)
            .args(args)
            .env_remove("PYTHONPATH")
            .env_remove("PYTHONSTARTUP")
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| panic!("could not start {}: {error}", interpreter.name));
        let lines = forward_lines(child.stdout.take().expect("piped stdout"));
        let process = Self {
            child,
            interpreter: interpreter.clone(),
            output: lines,
        };
        match process.output.recv_timeout(READY_TIMEOUT) {
            Ok(line) if line == "ready" => process,
            other => panic!(
                "{} {} did not print `ready` within {READY_TIMEOUT:?}: {other:?}",
                interpreter.name,
                script.display()
            ),
        }
    }

    /// One process of `script ARGS` under each of `interpreters`, each
    /// running once this returns.
    pub fn start_each(interpreters: &[Interpreter], script: &Path, args: &[&str]) -> Vec<Self> {
        interpreters
            .iter()
            .map(|interpreter| Self::start(interpreter, script, args))
            .collect()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits (at most `timeout`) for a workload given a duration to end.
    pub fn wait(&mut self, timeout: Duration) {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("waits") {
                assert!(
                    status.success(),
                    "{} exited {status}",
                    self.interpreter.name
                );
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{} still ran after {timeout:?}",
                self.interpreter.name
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for PythonProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Each line the workload prints, read on a thread of its own.
fn forward_lines(stdout: ChildStdout) -> mpsc::Receiver<String> {
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if sender.send(line).is_err() {
                return;
            }
        }
    });
    receiver
}

/// `--pid` for each process.
pub fn pid_args(processes: &[PythonProcess]) -> Vec<String> {
    processes
        .iter()
        .flat_map(|process| ["--pid".to_owned(), process.pid().to_string()])
        .collect()
}

/// The profiles an agent wrote into `store`.
pub fn stored_profiles(store: &Path) -> Vec<agent_pprof::proto::Profile> {
    std::fs::read_dir(store)
        .expect("the local store")
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "gz"))
        .map(|path| agent_pprof::decode(&std::fs::read(&path).expect("readable")).expect("pprof"))
        .collect()
}
