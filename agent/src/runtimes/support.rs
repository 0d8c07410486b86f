//! The one shape every runtime has, as the pipeline drives it: look at a
//! process image, forget a process, optionally unwind frames of its JIT
//! code for the native unwinder, and name and splice what a sample
//! recorded into the native stack. Each runtime's own module keeps its
//! internals; the adapters here fit them to this shape.

use std::{sync::Arc, time::Instant};

use agent_unwind::{ForeignFrame, ForeignStep, StackCopy};

use super::{
    JavaFrames, JavaKind, JavaRuntime, JvmUnwinder, PythonRuntime, Runtime, UserFrame, splice,
};
use crate::{
    process::{ProcessImage, ProcessTable},
    sampler::RawSample,
};

/// Frames of a runtime's JIT code, unwound for the native unwinder
/// (`agent_unwind::CodeLookup::foreign`).
pub trait ForeignUnwind {
    /// The caller of a frame in code without CFI, if the code is the
    /// runtime's; `None` leaves the frame to the native unwinder.
    fn foreign(&mut self, frame: ForeignFrame, stack: StackCopy<'_>) -> Option<ForeignStep>;
}

/// What a runtime made of a sample's native stack.
pub enum Spliced {
    /// The stack with the runtime's frames named in it.
    Named(Vec<UserFrame>),
    /// Not a process of this runtime: the native stack, handed on.
    NotMine(Vec<u64>),
}

/// One runtime's support for the pipeline.
pub trait RuntimeSupport {
    /// The runtime whose frames this names.
    fn runtime(&self) -> Runtime;

    /// Looks at a process image (a first sample, after an exec, maps read
    /// again): is it a process of this runtime, and what does it need.
    /// Cheap for an image already looked at.
    fn observe(&mut self, image: &Arc<ProcessImage>, processes: &mut ProcessTable);

    /// The process executed a new image or exited.
    fn forget(&mut self, tgid: u32);

    /// Whether the runtime looked at `tgid`'s image and found it is not
    /// its own. Looked at right after an exec, that is the executable's
    /// verdict: the next processes of that executable need no look before
    /// their first sample.
    fn passed_over(&self, tgid: u32) -> bool;

    /// Whether `tgid`'s frames are found over its stack copy, so it must be
    /// unwound with DWARF over a copy even if its code keeps frame
    /// pointers.
    fn unwinds_over_stack(&self, _tgid: u32) -> bool {
        false
    }

    /// The unwinder of `tgid`'s JIT frames, for the sample about to be
    /// unwound; what it finds is kept for [`Self::splice`].
    fn unwinder(&mut self, _tgid: u32) -> Option<Box<dyn ForeignUnwind + '_>> {
        None
    }

    /// The native stack of `sample` (innermost first), with the frames this
    /// runtime recorded or found named in place; named now, while the
    /// process is alive.
    fn splice(&mut self, sample: &RawSample, native: Vec<u64>) -> Spliced;

    /// The runtime's own name of thread `tid` of `tgid`, where longer than
    /// the OS thread's (asked only with thread labels on).
    /// `now`: the sample's time, read once for a batch of them.
    fn thread_name(&mut self, _tgid: u32, _tid: u32, _now: Instant) -> Option<Arc<str>> {
        None
    }

    /// Processes whose maps the runtime wants read again at `now` (their
    /// loader had not mapped what it looks for), each asked for once; the
    /// images read are observed.
    fn loading_due(&mut self, _now: Instant) -> Vec<u32> {
        Vec::new()
    }

    /// When [`Self::loading_due`] next has any.
    fn next_loading(&self) -> Option<Instant> {
        None
    }
}

impl ForeignUnwind for JvmUnwinder<'_> {
    fn foreign(&mut self, frame: ForeignFrame, stack: StackCopy<'_>) -> Option<ForeignStep> {
        JvmUnwinder::foreign(self, frame, stack)
    }
}

/// HotSpot: Java frames unwound over the stack copy and named.
pub struct JavaSupport {
    runtime: JavaRuntime,
    /// What the last unwind of a JVM's sample found.
    found: JavaFrames,
}

impl JavaSupport {
    pub fn new(runtime: JavaRuntime) -> Self {
        Self {
            runtime,
            found: JavaFrames::default(),
        }
    }
}

impl RuntimeSupport for JavaSupport {
    fn runtime(&self) -> Runtime {
        // Its frames carry their kind as well; the JVM's generated code
        // is the kind that stands for the runtime itself.
        Runtime::Java(JavaKind::Generated)
    }

    fn observe(&mut self, image: &Arc<ProcessImage>, processes: &mut ProcessTable) {
        self.runtime.observe(image, processes);
    }

    fn forget(&mut self, tgid: u32) {
        self.runtime.forget(tgid);
    }

    fn passed_over(&self, tgid: u32) -> bool {
        self.runtime.passed_over(tgid)
    }

    fn unwinder(&mut self, tgid: u32) -> Option<Box<dyn ForeignUnwind + '_>> {
        let unwinder = self.runtime.unwinder(tgid, &mut self.found)?;
        Some(Box::new(unwinder))
    }

    fn splice(&mut self, sample: &RawSample, native: Vec<u64>) -> Spliced {
        if !self.runtime.is_java(sample.tgid) {
            return Spliced::NotMine(native);
        }
        let spliced = self
            .runtime
            .splice(sample.tgid, sample.timestamp_ns, native, &self.found);
        self.found = JavaFrames::default();
        Spliced::Named(spliced)
    }

    fn thread_name(&mut self, tgid: u32, tid: u32, now: Instant) -> Option<Arc<str>> {
        self.runtime.thread_name(tgid, tid, now)
    }
}

/// CPython: frames recorded by the BPF walker, named and spliced where the
/// native interpreter loop ran them.
pub struct PythonSupport {
    runtime: PythonRuntime,
}

impl PythonSupport {
    pub fn new(runtime: PythonRuntime) -> Self {
        Self { runtime }
    }
}

impl RuntimeSupport for PythonSupport {
    fn runtime(&self) -> Runtime {
        Runtime::Python
    }

    fn observe(&mut self, image: &Arc<ProcessImage>, processes: &mut ProcessTable) {
        self.runtime.observe(image, processes);
    }

    fn forget(&mut self, tgid: u32) {
        self.runtime.forget(tgid);
    }

    fn passed_over(&self, tgid: u32) -> bool {
        self.runtime.passed_over(tgid)
    }

    fn splice(&mut self, sample: &RawSample, native: Vec<u64>) -> Spliced {
        if sample.interpreter.is_empty() {
            return Spliced::NotMine(native);
        }
        let Some(eval_loop) = self.runtime.eval_loop(sample.tgid) else {
            return Spliced::NotMine(native);
        };
        let named = self.runtime.name(sample.tgid, &sample.interpreter);
        Spliced::Named(splice(&native, &named, std::slice::from_ref(&eval_loop)))
    }

    fn loading_due(&mut self, now: Instant) -> Vec<u32> {
        self.runtime.loading_due(now)
    }

    fn next_loading(&self) -> Option<Instant> {
        self.runtime.next_loading()
    }
}
