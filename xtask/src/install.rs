//! `cargo xtask install`: firn and its systemd unit, config and environment
//! file, laid out as `make install` would: under `--prefix` (the binary in
//! PREFIX/bin, the unit in PREFIX/lib/systemd/system, where systemd looks
//! for both /usr and /usr/local), the config in `--sysconfdir`, all below
//! `DESTDIR` when set (packaging, tests).

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};

use crate::util::{self, cargo};

/// The paths the unit in deploy/systemd names, rewritten on install.
const UNIT_BINARY: &str = "/usr/local/bin/firn";
const UNIT_SYSCONFDIR: &str = "/etc/firn";

#[derive(clap::Args)]
pub struct InstallArgs {
    /// Staging directory every path is installed under.
    #[arg(long, env = "DESTDIR", default_value = "")]
    destdir: PathBuf,
    /// Installation prefix.
    #[arg(long, env = "PREFIX", default_value = "/usr/local")]
    prefix: PathBuf,
    /// Where firn.yaml and firn.env go (kept if already there).
    #[arg(long, default_value = UNIT_SYSCONFDIR)]
    sysconfdir: PathBuf,
    /// Install this firn binary instead of building one.
    #[arg(long)]
    binary: Option<PathBuf>,
}

/// Where each file goes, as the running system sees it (without DESTDIR).
#[derive(Debug)]
pub struct Layout {
    pub destdir: PathBuf,
    pub binary: PathBuf,
    pub unit: PathBuf,
    pub config: PathBuf,
    pub env: PathBuf,
}

impl Layout {
    pub fn new(destdir: &Path, prefix: &Path, sysconfdir: &Path) -> Result<Self> {
        if !prefix.is_absolute() || !sysconfdir.is_absolute() {
            bail!("--prefix and --sysconfdir must be absolute paths");
        }
        Ok(Self {
            destdir: destdir.to_path_buf(),
            binary: prefix.join("bin/firn"),
            unit: prefix.join("lib/systemd/system/firn.service"),
            config: sysconfdir.join("firn.yaml"),
            env: sysconfdir.join("firn.env"),
        })
    }

    /// `path` below DESTDIR.
    pub fn staged(&self, path: &Path) -> PathBuf {
        match path.strip_prefix("/") {
            Ok(relative) if !self.destdir.as_os_str().is_empty() => self.destdir.join(relative),
            _ => path.to_path_buf(),
        }
    }
}

pub fn run(root: &Path, args: &InstallArgs) -> Result<()> {
    let binary = match &args.binary {
        Some(binary) => binary.clone(),
        None => {
            util::run(cargo(root).args(["build", "--release", "--package", "firn"]))?;
            root.join("target/release/firn")
        }
    };
    let layout = Layout::new(&args.destdir, &args.prefix, &args.sysconfdir)?;
    for line in install(&root.join("deploy/systemd"), &binary, &layout)? {
        println!("{line}");
    }
    if args.destdir.as_os_str().is_empty() {
        println!(
            "next: edit {} (and the token in {}), then\n  systemctl daemon-reload && systemctl enable --now firn",
            layout.config.display(),
            layout.env.display()
        );
    }
    Ok(())
}

/// Copies the files; returns what it did, a line each. The config and the
/// environment file are an operator's once installed: never overwritten.
pub fn install(deploy: &Path, binary: &Path, layout: &Layout) -> Result<Vec<String>> {
    let mut done = Vec::new();
    let firn = fs::read(binary)
        .with_context(|| format!("could not read the firn binary {}", binary.display()))?;
    write(&layout.staged(&layout.binary), &firn, 0o755)?;
    done.push(format!("installed {}", layout.binary.display()));

    let unit_path = deploy.join("firn.service");
    let unit = fs::read_to_string(&unit_path)
        .with_context(|| format!("could not read {}", unit_path.display()))?;
    let sysconfdir = layout.config.parent().unwrap_or(Path::new(UNIT_SYSCONFDIR));
    let unit = unit
        .replace(UNIT_BINARY, &layout.binary.display().to_string())
        .replace(
            &format!("{UNIT_SYSCONFDIR}/"),
            &format!("{}/", sysconfdir.display()),
        );
    write(&layout.staged(&layout.unit), unit.as_bytes(), 0o644)?;
    done.push(format!("installed {}", layout.unit.display()));

    for (source, target, mode) in [
        ("firn.yaml", &layout.config, 0o644),
        ("firn.env", &layout.env, 0o600),
    ] {
        let staged = layout.staged(target);
        if staged.exists() {
            done.push(format!("kept {} (already there)", target.display()));
            continue;
        }
        let path = deploy.join(source);
        let text = fs::read(&path).with_context(|| format!("could not read {}", path.display()))?;
        write(&staged, &text, mode)?;
        done.push(format!("installed {}", target.display()));
    }
    Ok(done)
}

fn write(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent)
            .with_context(|| format!("could not create {}", parent.display()))?;
    }
    // Written aside and renamed: a running firn keeps its old binary.
    let temporary = path.with_extension("xtask-new");
    fs::write(&temporary, bytes)
        .with_context(|| format!("could not write {}", temporary.display()))?;
    fs::set_permissions(&temporary, fs::Permissions::from_mode(mode))
        .with_context(|| format!("could not set the mode of {}", temporary.display()))?;
    fs::rename(&temporary, path).with_context(|| format!("could not write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;

    fn deploy_dir() -> PathBuf {
        crate::workspace_root().join("deploy/systemd")
    }

    #[test]
    fn installs_under_destdir_and_prefix_and_keeps_the_operators_files() {
        let dir = std::env::temp_dir().join(format!("firn-xtask-install-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let destdir = dir.join("root");
        let binary = dir.join("firn-binary");
        fs::create_dir_all(&dir).expect("temp dir");
        fs::write(&binary, b"#!/bin/sh\nexit 0\n").expect("a stand-in binary");
        let layout =
            Layout::new(&destdir, Path::new("/usr"), Path::new("/etc/firn-test")).expect("layout");
        let done = install(&deploy_dir(), &binary, &layout).expect("installs");
        assert_eq!(done.len(), 4, "{done:?}");

        let mode = |path: &str| {
            fs::metadata(destdir.join(path))
                .unwrap_or_else(|e| panic!("{path}: {e}"))
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!(mode("usr/bin/firn"), 0o755);
        assert_eq!(mode("usr/lib/systemd/system/firn.service"), 0o644);
        assert_eq!(mode("etc/firn-test/firn.yaml"), 0o644);
        assert_eq!(mode("etc/firn-test/firn.env"), 0o600, "the token file");
        let unit =
            fs::read_to_string(destdir.join("usr/lib/systemd/system/firn.service")).expect("unit");
        assert!(
            unit.contains("ExecStart=/usr/bin/firn --config-path=/etc/firn-test/firn.yaml"),
            "{unit}"
        );
        assert!(
            unit.contains("EnvironmentFile=-/etc/firn-test/firn.env"),
            "{unit}"
        );
        assert!(!unit.contains("/usr/local/bin/firn") && !unit.contains("/etc/firn/"));

        // The unit as installed passes systemd's own check (its binary and
        // files seen at their staged paths).
        let check = dir.join("firn.service");
        fs::write(
            &check,
            unit.replace(
                "/usr/bin/firn",
                &destdir.join("usr/bin/firn").display().to_string(),
            ),
        )
        .expect("unit copy");
        let output = Command::new("systemd-analyze")
            .arg("verify")
            .arg(&check)
            .output()
            .expect("systemd-analyze (Debian package systemd; cargo xtask setup installs it)");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success() && stderr.trim().is_empty(),
            "systemd-analyze verify: {stderr}"
        );

        // A second install updates the binary and the unit, never the
        // operator's config and token.
        fs::write(destdir.join("etc/firn-test/firn.yaml"), "frequency: 49\n").expect("edit");
        let done = install(&deploy_dir(), &binary, &layout).expect("installs again");
        assert!(
            done.iter()
                .any(|line| line.starts_with("kept /etc/firn-test/firn.yaml"))
        );
        assert_eq!(
            fs::read_to_string(destdir.join("etc/firn-test/firn.yaml")).expect("config"),
            "frequency: 49\n"
        );
        assert!(Layout::new(&destdir, Path::new("usr"), Path::new("/etc")).is_err());
        let _ = fs::remove_dir_all(&dir);
    }
}
