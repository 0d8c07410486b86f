//! The CRuby releases the Ruby tests run beside Debian 12's `ruby3.1`:
//! newer Debian packages need a newer glibc than bookworm's, and an older
//! one is not in bookworm, so each one lives in a minimal chroot of the
//! Debian suite that has it, made with
//! `mmdebstrap` under `~/.cache/firn/ruby-chroots/<suite>/`, once: a stamp
//! there names what was made, and a changed recipe makes it again.
//!
//! The tests run `chroot DIR /usr/bin/ruby3.X SCRIPT` (`chroot` execs, so
//! the pid is the interpreter's) and firn reads the interpreter through
//! the process's own view of its files (`/proc/PID/map_files`).

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context, Result, bail};

use crate::util::{describe, run};

/// Bumped when what is made changes in a way the recipe text does not show.
const RECIPE_VERSION: u32 = 1;
const MIRROR: &str = "http://deb.debian.org/debian";
/// sid's and experimental's Release files are valid for a week: a mirror
/// or snapshot of the archive older than that (as the one these tests were
/// written against) must still do.
const APT_OPTIONS: &[&str] = &["Acquire::Check-Valid-Until \"false\""];
/// Left out of the chroots: documentation, manual pages, translations.
const EXCLUDED_PATHS: &[&str] = &[
    "/usr/share/doc/*",
    "/usr/share/man/*",
    "/usr/share/info/*",
    "/usr/share/locale/*",
];

/// One Ruby the tests run from a chroot.
#[derive(Clone, Copy, Debug)]
pub struct RubyChroot {
    /// `RUBY_VERSION`'s major and minor: `ruby3.3`, `libruby3.3`.
    pub version: &'static str,
    /// The suite the chroot is made of, and its directory's name.
    pub suite: &'static str,
    /// Suites whose packages are added to the base suite's: experimental
    /// is not a whole distribution, only packages on top of sid.
    pub extra_suites: &'static [&'static str],
}

impl RubyChroot {
    /// The interpreter inside the chroot.
    pub fn interpreter(&self) -> String {
        format!("/usr/bin/ruby{}", self.version)
    }
}

/// The chroots, pinned by suite (checked against the archive's indexes
/// with `apt-cache policy` when they were chosen). Ruby 2.7 is bullseye's
/// (2.7.4), 3.3 trixie's (3.3.8); 3.4 has no suite of its own yet: it is
/// in experimental only (3.4.11 when chosen), built against sid. No suite
/// has 4.0.
pub const RUBY_CHROOTS: &[RubyChroot] = &[
    RubyChroot {
        version: "2.7",
        suite: "bullseye",
        extra_suites: &[],
    },
    RubyChroot {
        version: "3.3",
        suite: "trixie",
        extra_suites: &[],
    },
    RubyChroot {
        version: "3.4",
        suite: "sid",
        extra_suites: &["experimental"],
    },
];

/// Where the chroots are kept between runs; the tests look there too (or
/// at `FIRN_RUBY_CHROOTS`, which `cargo xtask setup` honours as well).
pub fn ruby_chroots_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("FIRN_RUBY_CHROOTS") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    home.join(".cache/firn/ruby-chroots")
}

/// Makes every chroot of [`RUBY_CHROOTS`] whose stamp does not hold its
/// current recipe: the first time about 70-90 s and 120-160 MB each (sid's
/// holds sid's default ruby3.3 too: rake depends on `ruby`).
pub fn ruby_chroots() -> Result<()> {
    let dir = ruby_chroots_dir();
    for chroot in RUBY_CHROOTS {
        ruby_chroot(&dir, chroot)?;
    }
    Ok(())
}

/// The sources (`deb` lines) of a chroot: its suite, then the extra ones.
fn sources(chroot: &RubyChroot) -> Vec<String> {
    std::iter::once(chroot.suite)
        .chain(chroot.extra_suites.iter().copied())
        .map(|suite| format!("deb {MIRROR} {suite} main"))
        .collect()
}

fn recipe(chroot: &RubyChroot) -> String {
    format!(
        "recipe {RECIPE_VERSION}\nmmdebstrap --variant=apt --include=ruby{version} {suite}\n\
         {sources}\napt {apt}\nexcluded {excluded}\n",
        version = chroot.version,
        suite = chroot.suite,
        sources = sources(chroot).join("\n"),
        apt = APT_OPTIONS.join("; "),
        excluded = EXCLUDED_PATHS.join(" "),
    )
}

fn ruby_chroot(dir: &Path, chroot: &RubyChroot) -> Result<()> {
    let root = dir.join(chroot.suite);
    let stamp = root.join("firn-recipe.txt");
    let recipe = recipe(chroot);
    let interpreter = root.join(chroot.interpreter().trim_start_matches('/'));
    if interpreter.is_file() && fs::read_to_string(&stamp).is_ok_and(|text| text == recipe) {
        return Ok(());
    }
    if !crate::util::is_root() {
        bail!(
            "the Ruby {} chroot ({}) is made with mmdebstrap, as root: run `cargo xtask setup` \
             as root",
            chroot.version,
            root.display()
        );
    }
    fs::create_dir_all(dir).with_context(|| format!("could not create {}", dir.display()))?;
    // Made beside, then moved in: a failed build leaves no half chroot.
    let building = dir.join(format!("{}.building", chroot.suite));
    remove_tree(&building)?;
    eprintln!(
        "xtask: making the Ruby {} chroot {} (mmdebstrap {} with ruby{}; about a minute and a half)",
        chroot.version,
        root.display(),
        chroot.suite,
        chroot.version
    );
    let started = Instant::now();
    let mut command = Command::new("mmdebstrap");
    command
        .arg("--variant=apt")
        .arg(format!("--include=ruby{}", chroot.version))
        .args(
            APT_OPTIONS
                .iter()
                .map(|option| format!("--aptopt={option}")),
        )
        .args(
            EXCLUDED_PATHS
                .iter()
                .map(|path| format!("--dpkgopt=path-exclude={path}")),
        )
        // Licences stay, as Debian asks.
        .arg("--dpkgopt=path-include=/usr/share/doc/*/copyright")
        .arg(chroot.suite)
        .arg(&building)
        .args(sources(chroot));
    if let Err(error) = run(&mut command) {
        let _ = remove_tree(&building);
        return Err(error).context(format!(
            "could not make the Ruby {} chroot: `{}` failed (mmdebstrap is installed by \
             `cargo xtask setup`; {MIRROR} must be reachable)",
            chroot.version,
            describe(&command)
        ));
    }
    let version = ruby_version(&building, chroot)?;
    remove_tree(&root)?;
    fs::rename(&building, &root).with_context(|| {
        format!(
            "could not move {} to {}",
            building.display(),
            root.display()
        )
    })?;
    fs::write(&stamp, recipe).with_context(|| format!("could not write {}", stamp.display()))?;
    eprintln!(
        "xtask: made the Ruby {version} chroot {} in {:.0} s ({} MB)",
        root.display(),
        started.elapsed().as_secs_f64(),
        tree_bytes(&root) >> 20
    );
    Ok(())
}

/// `RUBY_VERSION` of the chroot's interpreter, which must be the one asked
/// for.
fn ruby_version(root: &Path, chroot: &RubyChroot) -> Result<String> {
    let mut command = Command::new("chroot");
    command
        .arg(root)
        .arg(chroot.interpreter())
        .args(["-e", "print RUBY_VERSION"]);
    let output = command
        .output()
        .with_context(|| format!("could not start {}", describe(&command)))?;
    let version = String::from_utf8_lossy(&output.stdout).into_owned();
    if !output.status.success() || !version.starts_with(&format!("{}.", chroot.version)) {
        bail!(
            "{} printed {version:?} ({}): not Ruby {}",
            describe(&command),
            String::from_utf8_lossy(&output.stderr).trim(),
            chroot.version
        );
    }
    Ok(version)
}

/// Bytes of the regular files under `path` (not following links).
fn tree_bytes(path: &Path) -> u64 {
    let Ok(entries) = fs::read_dir(path) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .map(|entry| match entry.file_type() {
            Ok(kind) if kind.is_dir() => tree_bytes(&entry.path()),
            Ok(kind) if kind.is_file() => entry.metadata().map_or(0, |meta| meta.len()),
            _ => 0,
        })
        .sum()
}

/// Removes a chroot, refusing while anything is mounted inside it (a test
/// that bound a directory there and did not end): removing through a
/// mount would remove what is mounted.
fn remove_tree(path: &Path) -> Result<()> {
    if !path.exists() {
        return Ok(());
    }
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let prefix = format!("{}/", path.display());
    if let Some(mount) = mounts
        .lines()
        .filter_map(|line| line.split_whitespace().nth(1))
        .find(|mount| mount.starts_with(&prefix))
    {
        bail!(
            "{mount} is mounted inside {}; unmount it first",
            path.display()
        );
    }
    fs::remove_dir_all(path).with_context(|| format!("could not remove {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_chroot_has_its_sources_and_recipe() {
        let [_, trixie, sid] = RUBY_CHROOTS else {
            panic!("three chroots");
        };
        assert_eq!(
            sources(trixie),
            ["deb http://deb.debian.org/debian trixie main"]
        );
        assert_eq!(
            sources(sid),
            [
                "deb http://deb.debian.org/debian sid main",
                "deb http://deb.debian.org/debian experimental main"
            ]
        );
        assert_eq!(sid.interpreter(), "/usr/bin/ruby3.4");
        // What is made is in the stamp: another Ruby, another recipe.
        let other = RubyChroot {
            version: "3.5",
            ..*sid
        };
        assert!(recipe(sid).contains("--include=ruby3.4 sid"));
        assert_ne!(recipe(sid), recipe(&other));
    }
}
