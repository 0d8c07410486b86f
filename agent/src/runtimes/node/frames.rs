//! A recorded V8 frame as the frames of the profile: the function (with
//! the functions inlined into an optimized frame above it) and the line
//! being run, or the native frame for V8's own.

use std::sync::Arc;

use agent_runtimes::{
    Memory,
    v8::{ChainFrame, InlineError, JsFunction, NameError, OptimizedFrame, Position, Tier, V8Namer},
};
use tracing::debug;

use super::{NodeRuntime, Recorded};
use crate::{
    runtimes::{InterpretedFrame, Runtime, UserFrame},
    stats::Stats,
};

impl NodeRuntime {
    /// The named frames for one recorded V8 frame, pushed on `out`
    /// innermost first (the functions inlined into an optimized frame's
    /// code, then its own); `false` keeps the native frame (V8's own
    /// frames, and functions without a script: builtins, named by their
    /// symbols).
    pub(super) fn name(
        namer: &mut V8Namer,
        memory: &mut dyn Memory,
        recorded: &Recorded,
        stats: &Stats,
        out: &mut Vec<UserFrame>,
    ) -> bool {
        let tagging = namer.layout().tagging;
        // Entry, exit, stub and internal frames hold a frame type marker
        // (a Smi) where JavaScript frames hold their context.
        if !tagging.is_heap_object(recorded.context) {
            return false;
        }
        // The line being run where V8 says, else where the function
        // starts (as V8's profiler gives it).
        let frame = |named: &JsFunction, line: Option<Position>, runtime| {
            UserFrame::Interpreted(Arc::new(InterpretedFrame {
                runtime,
                function: named.name.clone(),
                file: named.file.clone(),
                line: line.or(named.position).map_or(0, |position| position.line),
            }))
        };
        match namer.name_method(memory, recorded.function, recorded.receiver) {
            Ok(named) => {
                Stats::inc(&stats.node_frames);
                let run = Self::run(namer, memory, recorded, stats);
                for (inlined, line) in &run.inlined {
                    Stats::inc(&stats.node_inlined_frames);
                    out.push(frame(inlined, *line, Runtime::JavaScriptInlined));
                }
                Stats::inc(if run.line.is_some() {
                    &stats.node_lines_run
                } else {
                    &stats.node_lines_start
                });
                out.push(frame(&named, run.line, Runtime::JavaScript));
                true
            }
            // A builtin with JavaScript linkage (`Array.prototype.map`): its
            // symbol names it.
            Err(NameError::WrongType {
                expected: "Script", ..
            }) => false,
            Err(error) => {
                debug!(%error, "JavaScript frame not named");
                Stats::inc(match error {
                    NameError::Read { .. } => &stats.node_read_failures,
                    NameError::NotHeapObject { .. }
                    | NameError::BadMap { .. }
                    | NameError::WrongType { .. } => &stats.node_name_stale,
                    _ => &stats.node_name_failures,
                });
                out.push(UserFrame::Interpreted(Arc::new(InterpretedFrame {
                    runtime: Runtime::JavaScript,
                    function: "<unknown>".into(),
                    file: "".into(),
                    line: 0,
                })));
                true
            }
        }
    }

    /// What a JavaScript frame runs: for an optimized frame, the
    /// functions inlined at its pc and the lines; for an interpreted
    /// frame, the line of its bytecode offset; nothing for a baseline one
    /// or when they cannot be read (counted).
    fn run(
        namer: &mut V8Namer,
        memory: &mut dyn Memory,
        recorded: &Recorded,
        stats: &Stats,
    ) -> OptimizedFrame {
        let chain = ChainFrame {
            pc: recorded.ip,
            fp: 0,
            function: Some(recorded.function),
            bytecode: recorded.bytecode,
        };
        // Without the builtins' range, code entered by on-stack
        // replacement is taken for interpreted.
        match namer.tier(memory, &chain, &[]) {
            Ok(Tier::Optimized) => {}
            Ok(Tier::Interpreted) => {
                return OptimizedFrame {
                    inlined: Vec::new(),
                    line: namer.interpreted_line(memory, recorded.function, recorded.bytecode),
                };
            }
            _ => return OptimizedFrame::default(),
        }
        match namer.optimized(memory, recorded.function, recorded.ip, recorded.depth == 0) {
            Ok(run) => run,
            Err(error) => {
                debug!(%error, "inlined functions not read");
                Stats::inc(match error {
                    InlineError::NoCode { .. } => &stats.node_inline_no_code,
                    InlineError::NoDeoptimizationData => &stats.node_inline_no_deoptimization_data,
                    InlineError::BadTable { .. } => &stats.node_inline_bad_table,
                    InlineError::Name(NameError::Read { .. }) => &stats.node_inline_read,
                    InlineError::Name(_) => &stats.node_inline_stale,
                });
                OptimizedFrame::default()
            }
        }
    }
}
