//! The base images the image test builds `deploy/container/Containerfile`
//! on. No image registry is reachable where the tests run, so both are
//! made here from Debian packages, like the public ones the Containerfile
//! names by default:
//!
//! - the builder (for `rust:1.95.0-slim-bookworm`): a Debian bookworm root
//!   file system from `debootstrap` with gcc and the libc headers, and the
//!   machine's own Rust toolchain of `rust-toolchain.toml`'s channel;
//! - the runtime (for `distroless/cc-debian12`): only the files of glibc,
//!   libgcc, libstdc++, CA certificates, base-files and netbase from that
//!   root file system, a `nonroot` user, no shell; root by default, as
//!   distroless' `:latest` (see [`NONROOT`]).
//!
//! Each is a tarball for `docker import` with its `--change` lines beside
//! it. A stamp of the recipe (the packages, the suite, the toolchain's
//! `rustc -vV`) names the images' tag: a changed recipe makes them again,
//! and the test imports them again under the new tag.

use std::{
    collections::BTreeSet,
    fs,
    path::{Component, Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::util::run;

/// Bumped when what is made changes in a way the recipe text does not show.
const RECIPE_VERSION: u32 = 2;
const SUITE: &str = "bookworm";
const MIRROR: &str = "http://deb.debian.org/debian";
/// What `rust:*-slim-bookworm` holds beside Rust (ring builds C), and the
/// runtime's packages not in debootstrap's minimal base.
const BUILDER_PACKAGES: &[&str] = &["ca-certificates", "gcc", "libc6-dev", "netbase"];
/// The packages distroless `cc-debian12` is made of that firn can use.
const RUNTIME_PACKAGES: &[&str] = &[
    "base-files",
    "ca-certificates",
    "libc6",
    "libgcc-s1",
    "libstdc++6",
    "netbase",
];
/// distroless' unprivileged user. Not the runtime's default user, as it
/// is `:nonroot`'s: the test runs the image with containerd's `ctr`, which
/// sets no user, and the DaemonSet's `runAsUser: 0` is root either way.
const NONROOT: u32 = 65532;

/// Where the bases are kept between runs; the test looks there too (or at
/// `FIRN_IMAGE_BASES`).
pub fn bases_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("FIRN_IMAGE_BASES") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    home.join(".cache/firn/image-bases")
}

/// Makes the builder and runtime bases unless the stamp in [`bases_dir`]
/// holds the current recipe (about 3 minutes the first time).
pub fn container_bases(root: &Path) -> Result<()> {
    let dir = bases_dir();
    let channel = rust_channel(root)?;
    let sysroot = toolchain_sysroot(&channel)?;
    let recipe = recipe(&channel, &sysroot)?;
    let stamp = dir.join("recipe.txt");
    let made = ["builder.tar", "runtime.tar", "tag"]
        .iter()
        .all(|name| dir.join(name).is_file());
    if made && fs::read_to_string(&stamp).is_ok_and(|text| text == recipe) {
        return Ok(());
    }
    if !crate::util::is_root() {
        bail!("the container test's base images are made with debootstrap, as root");
    }
    eprintln!(
        "xtask: making the container test's base images (debootstrap {SUITE}, Rust {channel})"
    );
    fs::create_dir_all(&dir).with_context(|| format!("could not create {}", dir.display()))?;
    let _ = fs::remove_file(&stamp);
    let rootfs = dir.join("rootfs");
    remove_tree(&rootfs)?;
    run(Command::new("debootstrap")
        .arg("--variant=minbase")
        .arg(format!("--include={}", BUILDER_PACKAGES.join(",")))
        .arg(SUITE)
        .arg(&rootfs)
        .arg(MIRROR))
    .context("debootstrap (Debian's package, installed by `cargo xtask setup`) failed")?;
    fs::remove_dir_all(rootfs.join("var/cache/apt/archives"))
        .and_then(|()| fs::create_dir_all(rootfs.join("var/cache/apt/archives/partial")))
        .context("could not empty the rootfs' package cache")?;

    runtime_tarball(&rootfs, &dir.join("runtime.tar"))?;
    fs::write(
        dir.join("runtime.changes"),
        "ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt\n",
    )?;

    trust_host_certificates(&rootfs)?;
    let toolchain = format!("usr/local/rustup/toolchains/{channel}-x86_64-unknown-linux-gnu");
    copy_toolchain(&sysroot, &rootfs.join(&toolchain))?;
    fs::create_dir_all(rootfs.join("usr/local/cargo/bin"))?;
    run(Command::new("tar")
        .arg("--numeric-owner")
        .arg("-C")
        .arg(&rootfs)
        .arg("-cf")
        .arg(dir.join("builder.tar"))
        .arg("."))?;
    fs::write(
        dir.join("builder.changes"),
        format!(
            "ENV PATH=/{toolchain}/bin:/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n\
             ENV CARGO_HOME=/usr/local/cargo\n\
             ENV RUSTUP_HOME=/usr/local/rustup\n"
        ),
    )?;
    remove_tree(&rootfs)?;
    fs::write(
        dir.join("tag"),
        format!("{:016x}", fnv1a(recipe.as_bytes())),
    )?;
    fs::write(&stamp, recipe).with_context(|| format!("could not write {}", stamp.display()))
}

fn recipe(channel: &str, sysroot: &Path) -> Result<String> {
    let rustc = Command::new(sysroot.join("bin/rustc"))
        .arg("-vV")
        .output()
        .context("could not run the toolchain's rustc")?;
    let certificates: String = host_certificates()?
        .iter()
        .map(|(name, pem)| format!("certificate {name} {:016x}\n", fnv1a(pem)))
        .collect();
    Ok(format!(
        "recipe {RECIPE_VERSION}\nsuite {SUITE} {MIRROR}\nbuilder {}\nruntime {}\n{certificates}rust {channel}\n{}",
        BUILDER_PACKAGES.join(" "),
        RUNTIME_PACKAGES.join(" "),
        String::from_utf8_lossy(&rustc.stdout)
    ))
}

/// Where Debian keeps the machine's own certificate authorities.
const LOCAL_CERTIFICATES: &str = "usr/local/share/ca-certificates";

/// The machine's own certificate authorities (a TLS-inspecting proxy's,
/// say), by name: the builder fetches crates the way this machine does.
fn host_certificates() -> Result<Vec<(String, Vec<u8>)>> {
    let dir = Path::new("/").join(LOCAL_CERTIFICATES);
    let Ok(entries) = fs::read_dir(&dir) else {
        return Ok(Vec::new());
    };
    let mut found = Vec::new();
    for entry in entries {
        let path = entry?.path();
        let name = path
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name.ends_with(".crt") && path.is_file() {
            let pem =
                fs::read(&path).with_context(|| format!("could not read {}", path.display()))?;
            found.push((name, pem));
        }
    }
    found.sort();
    Ok(found)
}

/// Adds [`host_certificates`] to the rootfs' trust store, as Debian adds
/// local ones (after the runtime's files were taken: its certificates stay
/// Debian's).
fn trust_host_certificates(rootfs: &Path) -> Result<()> {
    let certificates = host_certificates()?;
    if certificates.is_empty() {
        return Ok(());
    }
    let dir = rootfs.join(LOCAL_CERTIFICATES);
    fs::create_dir_all(&dir)?;
    for (name, pem) in &certificates {
        fs::write(dir.join(name), pem)?;
    }
    run(Command::new("chroot")
        .arg(rootfs)
        .args(["update-ca-certificates", "--fresh"]))
}

/// The channel `rust-toolchain.toml` pins, the Rust the image is built with.
fn rust_channel(root: &Path) -> Result<String> {
    let path = root.join("rust-toolchain.toml");
    let text =
        fs::read_to_string(&path).with_context(|| format!("could not read {}", path.display()))?;
    text.lines()
        .filter_map(|line| line.trim().strip_prefix("channel"))
        .filter_map(|rest| rest.split('"').nth(1))
        .next()
        .map(str::to_owned)
        .with_context(|| format!("no channel = \"...\" in {}", path.display()))
}

fn toolchain_sysroot(channel: &str) -> Result<PathBuf> {
    let output = Command::new("rustup")
        .args(["run", channel, "rustc", "--print", "sysroot"])
        .env_remove("RUSTUP_TOOLCHAIN")
        .output()
        .context("rustup is needed to find the Rust toolchain for the builder image")?;
    if !output.status.success() {
        bail!(
            "Rust {channel} is not installed (rustup toolchain install {channel}): {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let sysroot = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    Ok(fs::canonicalize(&sysroot).unwrap_or(sysroot))
}

/// cargo, rustc and the host's standard library: what `cargo build` needs,
/// without rustup, docs or the developer tools.
fn copy_toolchain(sysroot: &Path, target: &Path) -> Result<()> {
    fs::create_dir_all(target)?;
    let mut parts = vec!["bin/cargo".to_owned(), "bin/rustc".to_owned()];
    for entry in fs::read_dir(sysroot.join("lib"))? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.contains(".so") {
            parts.push(format!("lib/{name}"));
        }
    }
    parts.push("lib/rustlib/x86_64-unknown-linux-gnu".to_owned());
    run(Command::new("cp")
        .current_dir(sysroot)
        .args(["-a", "--parents"])
        .args(&parts)
        .arg(target))
}

/// A tarball of [`RUNTIME_PACKAGES`]' files (as dpkg lists them, under the
/// merged /usr), the certificates their scripts made, and the files of a
/// distroless base: passwd and group with root and nonroot, its home.
fn runtime_tarball(rootfs: &Path, tarball: &Path) -> Result<()> {
    let listed = Command::new("chroot")
        .arg(rootfs)
        .args(["dpkg-query", "-L"])
        .args(RUNTIME_PACKAGES)
        .output()
        .context("could not run dpkg-query in the rootfs")?;
    if !listed.status.success() {
        bail!(
            "dpkg-query -L {} failed: {}",
            RUNTIME_PACKAGES.join(" "),
            String::from_utf8_lossy(&listed.stderr)
        );
    }
    let mut paths = BTreeSet::new();
    // The merged /usr's links (/lib -> usr/lib), so the loader's path holds.
    for link in ["bin", "lib", "lib64", "sbin"] {
        if rootfs.join(link).is_symlink() {
            paths.insert(PathBuf::from(link));
        }
    }
    let text = String::from_utf8_lossy(&listed.stdout);
    let certificates = fs::read_dir(rootfs.join("etc/ssl/certs"))
        .context("the rootfs has no /etc/ssl/certs")?
        .filter_map(Result::ok)
        .map(|entry| format!("/etc/ssl/certs/{}", entry.file_name().to_string_lossy()))
        .collect::<Vec<_>>();
    for line in text.lines().chain(certificates.iter().map(String::as_str)) {
        let Some(relative) = line.strip_prefix('/') else {
            continue;
        };
        if relative.is_empty() || rootfs.join(relative).symlink_metadata().is_err() {
            continue;
        }
        let path = resolve_parents(rootfs, Path::new(relative))?;
        let mut ancestor = path.parent();
        while let Some(dir) = ancestor.filter(|dir| !dir.as_os_str().is_empty()) {
            paths.insert(dir.to_path_buf());
            ancestor = dir.parent();
        }
        paths.insert(path);
    }
    // distroless' own files.
    let extra = rootfs.join("firn-runtime");
    remove_tree(&extra)?;
    fs::create_dir_all(extra.join("etc"))?;
    fs::create_dir_all(extra.join("home/nonroot"))?;
    fs::write(
        extra.join("etc/passwd"),
        format!(
            "root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n\
             nonroot:x:{NONROOT}:{NONROOT}:nonroot:/home/nonroot:/sbin/nologin\n"
        ),
    )?;
    fs::write(
        extra.join("etc/group"),
        format!("root:x:0:\nnogroup:x:65534:\nnonroot:x:{NONROOT}:\n"),
    )?;
    let list: Vec<u8> = paths
        .iter()
        .filter(|path| !matches!(path.to_str(), Some("etc/passwd" | "etc/group")))
        .flat_map(|path| {
            let mut bytes = path.as_os_str().as_encoded_bytes().to_vec();
            bytes.push(0);
            bytes
        })
        .collect();
    let list_path = rootfs.join("firn-runtime.list");
    fs::write(&list_path, list)?;
    run(Command::new("tar")
        .args(["--numeric-owner", "--no-recursion", "--null"])
        .arg("-C")
        .arg(rootfs)
        .arg("-T")
        .arg(&list_path)
        .arg("-cf")
        .arg(tarball)
        .arg("-C")
        .arg(&extra)
        .args(["etc/passwd", "etc/group", "home/nonroot"]))?;
    fs::remove_file(&list_path)?;
    remove_tree(&extra)
}

/// `path` (relative to `rootfs`) with its directories' symbolic links
/// followed inside `rootfs` (`lib/x86_64-linux-gnu/libc.so.6` becomes
/// `usr/lib/...`); the last component stays as it is.
fn resolve_parents(rootfs: &Path, path: &Path) -> Result<PathBuf> {
    let mut resolved = PathBuf::new();
    let components: Vec<Component> = path.components().collect();
    let Some((last, parents)) = components.split_last() else {
        return Ok(resolved);
    };
    for component in parents {
        resolved.push(component);
        let mut hops = 0;
        while let Ok(target) = fs::read_link(rootfs.join(&resolved)) {
            hops += 1;
            if hops > 16 {
                bail!("{}: too many links", path.display());
            }
            let joined = if target.is_absolute() {
                target
                    .strip_prefix("/")
                    .map(Path::to_path_buf)
                    .unwrap_or_default()
            } else {
                resolved
                    .parent()
                    .map_or_else(PathBuf::new, Path::to_path_buf)
                    .join(target)
            };
            resolved = normalize(&joined);
        }
    }
    resolved.push(last);
    Ok(resolved)
}

fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(part) => out.push(part),
            _ => {}
        }
    }
    out
}

/// Removes a tree that may hold a debootstrap left half done (its /proc
/// still mounted makes removal fail loudly rather than reach the host's).
fn remove_tree(path: &Path) -> Result<()> {
    if !path.exists() {
        return Ok(());
    }
    for mount in ["proc", "sys"] {
        let _ = Command::new("umount").arg(path.join(mount)).output();
    }
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let prefix = path.to_string_lossy().into_owned();
    if mounts
        .lines()
        .filter_map(|line| line.split_whitespace().nth(1))
        .any(|mount| mount.starts_with(&prefix))
    {
        bail!(
            "something is still mounted under {}; unmount it first",
            path.display()
        );
    }
    fs::remove_dir_all(path).with_context(|| format!("could not remove {}", path.display()))
}

/// FNV-1a: a short, stable name for the recipe.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
