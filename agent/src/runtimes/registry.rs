//! The one place every runtime is built: from one config, in the order
//! the pipeline asks them ([`super::Runtime::order`]). A runtime walked in
//! BPF gets its handle on the shared map of interpreter processes and the
//! kernel's thread pointer offset; without them (a pipeline fed records
//! directly, in tests) only the runtimes read from userspace are built.

use std::sync::Arc;

use agent_common::InterpreterKind;

use super::{
    InterpreterMap, JavaConfig, JavaRuntime, JavaSupport, NodeConfig, NodeRuntime, PythonConfig,
    PythonRuntime, PythonSupport, RubyConfig, RubyRuntime, RuntimeSupport, ThreadPointerLookup,
};
use crate::stats::Stats;

/// Every runtime's settings, as the flags and the config file set them.
#[derive(Clone, Debug, Default)]
pub struct RuntimesConfig {
    pub python: PythonConfig,
    pub ruby: RubyConfig,
    pub java: JavaConfig,
    pub node: NodeConfig,
}

impl RuntimesConfig {
    /// Whether a runtime whose frames the BPF program walks is on: the
    /// session then looks up the thread pointer's offset and hands the
    /// interpreter map over.
    pub fn walks_in_bpf(&self) -> bool {
        self.python.enabled || self.ruby.enabled
    }
}

/// What the runtimes walked in BPF are built with.
pub struct BpfWalkers<'a> {
    /// A handle on the map of interpreter processes for the runtime of
    /// each kind.
    pub map: Box<dyn Fn(InterpreterKind) -> Box<dyn InterpreterMap> + 'a>,
    pub thread_pointer: ThreadPointerLookup,
}

/// Every enabled runtime, in the pipeline's order.
pub fn build(
    config: &RuntimesConfig,
    walkers: Option<BpfWalkers<'_>>,
    max_processes: usize,
    stats: &Arc<Stats>,
) -> Vec<Box<dyn RuntimeSupport>> {
    let mut runtimes: Vec<Box<dyn RuntimeSupport>> = Vec::new();
    if config.java.enabled {
        runtimes.push(Box::new(JavaSupport::new(JavaRuntime::new(stats.clone()))));
    }
    if let Some(walkers) = walkers {
        if config.python.enabled {
            runtimes.push(Box::new(PythonSupport::new(PythonRuntime::new(
                &config.python,
                walkers.thread_pointer.clone(),
                (walkers.map)(InterpreterKind::Python),
                max_processes,
                stats.clone(),
            ))));
        }
        if config.ruby.enabled {
            runtimes.push(Box::new(RubyRuntime::new(
                &config.ruby,
                walkers.thread_pointer,
                (walkers.map)(InterpreterKind::Ruby),
                max_processes,
                stats.clone(),
            )));
        }
    }
    if config.node.enabled {
        runtimes.push(Box::new(NodeRuntime::new(stats.clone())));
    }
    runtimes.sort_by_key(|runtime| runtime.runtime().order());
    runtimes
}
