//! What firn labels series with, parsed: the YAML config file
//! (`--config-path`) with its Prometheus `relabel_configs`, the relabel
//! rules themselves and the label sets they rewrite, the Kubernetes pods
//! the API server describes, and containers as Docker's API describes
//! them. The file is the user's, the label
//! values come from processes (names, cgroup paths) and the pods from the
//! API server: all of it is parsed strictly into plain data, with no I/O
//! (the daemon reads the file and talks to the API server).

pub mod container;
pub mod file;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod pod;
pub mod relabel;
