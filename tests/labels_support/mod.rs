//! Support for the label tests: real cgroups made and removed by the
//! test, random container ids and pod UIDs, the labels of a process in a
//! profile, and a Kubernetes API server of the test's own.

// Each test file uses its own part of the support code.
#![allow(dead_code)]

pub mod kube_server;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::Duration,
};

use agent_pprof::{Reader, proto::Profile};

/// Where the cgroup hierarchies are mounted.
pub struct Hierarchies {
    pub unified: PathBuf,
    pub cpu: PathBuf,
    pub systemd: PathBuf,
}

pub fn hierarchies() -> Hierarchies {
    let mounts = std::fs::read_to_string("/proc/self/mounts").expect("/proc/self/mounts");
    let find = |wanted: &dyn Fn(&str, &str) -> bool| {
        mounts.lines().find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (fields.len() > 3 && wanted(fields[2], fields[3])).then(|| PathBuf::from(fields[1]))
        })
    };
    let v1 = |option: &'static str| {
        move |kind: &str, options: &str| kind == "cgroup" && options.split(',').any(|o| o == option)
    };
    let unified = find(&|kind, _| kind == "cgroup2");
    let cpu = find(&v1("cpu"));
    let systemd = find(&v1("name=systemd"));
    match (unified, cpu, systemd) {
        (Some(unified), Some(cpu), Some(systemd)) => Hierarchies {
            unified,
            cpu,
            systemd,
        },
        found => panic!(
            "these tests need the hybrid cgroup layout (the v2 hierarchy and the v1 `cpu` and \
             `name=systemd` hierarchies mounted); found (v2, cpu, systemd) = {found:?}"
        ),
    }
}

/// Where the unified (v2) hierarchy is mounted: `/sys/fs/cgroup` on a v2
/// host, `/sys/fs/cgroup/unified` on a hybrid one.
pub fn unified_hierarchy() -> PathBuf {
    let mounts = std::fs::read_to_string("/proc/self/mounts").expect("/proc/self/mounts");
    mounts
        .lines()
        .find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (fields.len() > 2 && fields[2] == "cgroup2").then(|| PathBuf::from(fields[1]))
        })
        .expect("this test needs the unified (v2) cgroup hierarchy mounted")
}

/// A cgroup the test made, with the parents it had to make. When dropped,
/// processes still inside go back to the root and the directories it made
/// are removed.
pub struct TestCgroup {
    root: PathBuf,
    leaf: PathBuf,
    /// Outermost first.
    created: Vec<PathBuf>,
}

impl TestCgroup {
    pub fn create(root: &Path, relative: &str) -> Self {
        let mut created = Vec::new();
        let mut path = root.to_path_buf();
        for part in relative.split('/') {
            path.push(part);
            if !path.exists() {
                std::fs::create_dir(&path)
                    .unwrap_or_else(|error| panic!("cannot make {}: {error}", path.display()));
                created.push(path.clone());
            }
        }
        Self {
            root: root.to_path_buf(),
            leaf: path,
            created,
        }
    }

    /// Its `cgroup.procs`: a process writing its pid there joins it.
    pub fn procs(&self) -> PathBuf {
        self.leaf.join("cgroup.procs")
    }

    pub fn add(&self, pid: u32) {
        std::fs::write(self.leaf.join("cgroup.procs"), pid.to_string()).unwrap_or_else(|error| {
            panic!("cannot move {pid} into {}: {error}", self.leaf.display())
        });
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let procs = std::fs::read_to_string(self.leaf.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.split_whitespace() {
            let _ = std::fs::write(self.root.join("cgroup.procs"), pid);
        }
        for dir in self.created.iter().rev() {
            // A process just killed may take a moment to leave.
            for _ in 0..50 {
                if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// Cgroups removed newest first: later ones may sit inside parents an
/// earlier one made.
pub struct TestCgroups(pub Vec<TestCgroup>);

impl Drop for TestCgroups {
    fn drop(&mut self) {
        while let Some(cgroup) = self.0.pop() {
            drop(cgroup);
        }
    }
}

pub fn random_hex(digits: usize) -> String {
    (0..digits)
        .map(|_| char::from_digit(fastrand::u32(0..16), 16).unwrap_or('0'))
        .collect()
}

pub fn pod_uid() -> String {
    [8, 4, 4, 4, 12]
        .iter()
        .map(|&n| random_hex(n))
        .collect::<Vec<_>>()
        .join("-")
}

/// Every string label on the samples of `pid`, and how many samples.
pub fn labels_of(profile: &Profile, pid: u32) -> (BTreeMap<String, String>, i64) {
    let pid = pid.to_string();
    let mut labels = BTreeMap::new();
    let mut samples = 0;
    for sample in Reader::new(profile).samples() {
        if sample.label("pid") == Some(pid.as_str()) {
            samples += sample.count();
            labels.extend(
                sample
                    .labels()
                    .map(|(name, value)| (name.to_owned(), value.to_owned())),
            );
        }
    }
    (labels, samples)
}

pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .expect("kernel release")
        .trim()
        .to_owned()
}
