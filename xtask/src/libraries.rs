//! The library crates (`agent-*`) keep to their promise: none depends on
//! aya, tokio, procfs or the agent, and their tests pass as an
//! unprivileged user, so they cannot be reaching the live host.

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::util::{self, cargo};

/// Crates a library crate must not depend on, directly or not.
const FORBIDDEN: &[&str] = &["aya", "aya-obj", "tokio", "procfs", "firn"];

/// `nobody` on Debian.
const UNPRIVILEGED_ID: &str = "65534";

pub fn check(root: &Path) -> Result<()> {
    let crates = library_crates(root)?;
    for name in &crates {
        check_dependencies(root, name)?;
    }
    run_unprivileged(root, &crates)
}

/// The workspace members named `agent-*`.
fn library_crates(root: &Path) -> Result<Vec<String>> {
    let output = cargo(root)
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .output()
        .context("could not run cargo metadata")?;
    if !output.status.success() {
        bail!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let metadata: Value = serde_json::from_slice(&output.stdout).context("cargo metadata")?;
    let crates: Vec<String> = metadata["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|package| package["name"].as_str())
        .filter(|name| name.starts_with("agent-"))
        .map(str::to_owned)
        .collect();
    if crates.is_empty() {
        bail!("no agent-* library crates in the workspace");
    }
    Ok(crates)
}

fn check_dependencies(root: &Path, name: &str) -> Result<()> {
    let output = cargo(root)
        .args([
            "tree", "--edges", "normal", "--prefix", "none", "--format", "{p}",
        ])
        .args(["--package", name])
        .output()
        .context("could not run cargo tree")?;
    if !output.status.success() {
        bail!(
            "cargo tree -p {name} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let tree = String::from_utf8_lossy(&output.stdout);
    let found: Vec<&str> = tree
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|dependency| FORBIDDEN.contains(dependency))
        .collect();
    if !found.is_empty() {
        bail!("the library crate {name} depends on {found:?}: it must not");
    }
    Ok(())
}

/// Builds the crates' test executables, copies them where any user may
/// run them, and runs each as `nobody`.
fn run_unprivileged(root: &Path, crates: &[String]) -> Result<()> {
    let mut build = cargo(root);
    build.args([
        "test",
        "--no-run",
        "--message-format",
        "json-render-diagnostics",
    ]);
    for name in crates {
        build.args(["--package", name]);
    }
    let output = build
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("could not build the library crates' tests")?;
    if !output.status.success() {
        bail!("building the library crates' tests failed");
    }
    let executables = test_executables(&output.stdout)?;
    let directory = std::env::temp_dir().join(format!("firn-unprivileged-{}", std::process::id()));
    fs::create_dir_all(&directory)?;
    let result = run_copies(&directory, &executables);
    let _ = fs::remove_dir_all(&directory);
    result
}

fn run_copies(directory: &Path, executables: &[PathBuf]) -> Result<()> {
    fs::set_permissions(directory, fs::Permissions::from_mode(0o755))?;
    for executable in executables {
        let name = executable.file_name().context("a test executable's name")?;
        let copy = directory.join(name);
        fs::copy(executable, &copy)
            .with_context(|| format!("could not copy {}", executable.display()))?;
        fs::set_permissions(&copy, fs::Permissions::from_mode(0o755))?;
        println!("--- {} as an unprivileged user", name.to_string_lossy());
        util::run(
            Command::new("setpriv")
                .args(["--reuid", UNPRIVILEGED_ID, "--regid", UNPRIVILEGED_ID])
                .args(["--clear-groups", "--no-new-privs", "--"])
                .arg(&copy)
                .current_dir(directory)
                .env("HOME", directory),
        )?;
    }
    Ok(())
}

/// The executables of the `compiler-artifact` messages that are tests.
fn test_executables(messages: &[u8]) -> Result<Vec<PathBuf>> {
    let mut executables = Vec::new();
    for line in messages.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        let message: Value = serde_json::from_slice(line).context("a cargo message")?;
        if message["reason"] != "compiler-artifact" || message["profile"]["test"] != true {
            continue;
        }
        if let Some(path) = message["executable"].as_str() {
            executables.push(PathBuf::from(path));
        }
    }
    if executables.is_empty() {
        bail!("cargo built no test executables for the library crates");
    }
    Ok(executables)
}
