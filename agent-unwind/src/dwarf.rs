//! The DWARF unwinder proper: from the sampled registers, frame by frame
//! over the copy of the stack, applying the CFI row the caller finds for
//! each address. Code without CFI (JIT output) is crossed by following rbp
//! where that looks like a frame. Pure: no I/O, and nothing allocated but
//! the frames it pushes.

use agent_common::UserRegs;

use crate::cfi::{Cfa, Rule, UnwindRow};

/// What the caller knows about the code at an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    /// CFI covers the address. `system`: the code is in a system library,
    /// which the frame-pointer check leaves out (see `mode`).
    Row { row: UnwindRow, system: bool },
    /// Mapped, but without CFI: JIT code, an object without unwind tables
    /// or one that could not be read.
    NoCfi,
    /// Outside every known mapping.
    Unmapped,
}

/// Finds the unwind rules for code addresses.
pub trait CodeLookup {
    fn code(&mut self, address: u64) -> Code;

    /// Code without CFI (a JIT compiler's) whose frames a runtime knows
    /// how to unwind: the caller's registers, or `None` when the code is
    /// not the runtime's (then rbp is followed, as for any JIT code).
    fn foreign(&mut self, _frame: ForeignFrame, _stack: StackCopy<'_>) -> Option<ForeignStep> {
        None
    }
}

/// A frame in code without CFI, as the unwinder reached it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ForeignFrame {
    /// The interrupted instruction (the leaf) or a return address.
    pub ip: u64,
    pub sp: u64,
    /// `None` once a frame saved it where the unwind cannot read.
    pub bp: Option<u64>,
    /// The frame's index in the frames pushed (0: the leaf).
    pub depth: usize,
    /// `ip` is where the frame was interrupted (the leaf, or the frame a
    /// signal interrupted), not a return address: the code at `ip` itself
    /// runs, and its frame may be half built.
    pub exact: bool,
}

/// What a runtime made of a frame in its code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForeignStep {
    /// The caller's registers: `ip` its return address.
    Caller { ip: u64, sp: u64, bp: Option<u64> },
    /// The runtime's code, but its frame could not be unwound: the
    /// unwind stops here.
    Stop,
}

/// Why the unwinder stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The outermost frame: its return address is undefined (`_start`, a
    /// thread's entry) or zero.
    Complete,
    /// A value it needed lay beyond the stack copy.
    Truncated,
    /// No CFI, and rbp did not point at a plausible frame.
    NoCfi,
    /// An address outside every mapping, and rbp did not point at a
    /// plausible frame.
    Unmapped,
    /// A CFI rule firn does not evaluate.
    UnsupportedRule,
    /// The CFA did not move up the stack: corrupt CFI or stack.
    NotProgressing,
    /// More frames than a stack may hold.
    TooDeep,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub stop: Stop,
    /// Frames found by following rbp where there was no CFI.
    pub rbp_frames: u32,
    /// Frames a runtime unwound in its own code (`CodeLookup::foreign`).
    pub foreign_frames: u32,
    /// Signal frames crossed.
    pub signal_frames: u32,
    /// Callers (not the leaf) outside system libraries whose frame is
    /// rsp-based: a frame-pointer walk cannot cross them.
    pub frameless_callers: u32,
    /// The first address looked up that lay outside every mapping, whether
    /// the unwind stopped there or crossed it by rbp: the caller's maps may
    /// predate a library being mapped, and are worth reading again.
    pub unmapped: Option<u64>,
    /// Bytes from the sampled rsp to the stack pointer of the outermost
    /// frame reached: for a complete unwind, about as much of the stack as
    /// it needed copied.
    pub stack_used: u64,
}

/// The copy of the stack: `bytes` as they were from address `sp` up.
#[derive(Clone, Copy, Debug)]
pub struct StackCopy<'a> {
    pub sp: u64,
    pub bytes: &'a [u8],
}

impl StackCopy<'_> {
    fn read(&self, address: u64) -> Result<u64, Stop> {
        self.word(address).ok_or(Stop::Truncated)
    }

    /// The 8 bytes at `address`, if the copy holds them.
    pub fn word(&self, address: u64) -> Option<u64> {
        crate::leaf::read_stack_u64(self.bytes, self.sp, address)
    }

    /// The address just past the copy.
    pub fn end(&self) -> u64 {
        self.sp.saturating_add(self.bytes.len() as u64)
    }
}

/// Offsets in the `ucontext_t` the kernel pushes for a signal handler
/// (x86_64 `uc_mcontext.gregs`, the offsets glibc's `__restore_rt` CFI uses).
const UCONTEXT_RBP: u64 = 120;
const UCONTEXT_RSP: u64 = 160;
const UCONTEXT_RIP: u64 = 168;

/// Farthest above the copy an rbp chain may point and still be taken for a
/// frame that did not fit in the copy (the usual stack size limit).
const MAX_STACK_SPAN: u64 = 8 << 20;

#[derive(Clone, Copy, Debug)]
struct Registers {
    ip: u64,
    sp: u64,
    /// Unknown once a frame saved it where firn cannot read, with the
    /// reason to report if it is needed.
    bp: Result<u64, Stop>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StepKind {
    Cfi,
    Rbp,
    Signal,
    Foreign,
}

/// Unwinds from `regs` and pushes the frames, innermost first, onto
/// `frames`: the interrupted instruction, then return addresses (or, after
/// a signal frame, the interrupted instruction of the frame below it).
pub fn unwind(
    regs: UserRegs,
    stack: StackCopy<'_>,
    code: &mut impl CodeLookup,
    max_frames: usize,
    frames: &mut Vec<u64>,
) -> Outcome {
    let mut outcome = Outcome {
        stop: Stop::Complete,
        rbp_frames: 0,
        foreign_frames: 0,
        signal_frames: 0,
        frameless_callers: 0,
        unmapped: None,
        stack_used: 0,
    };
    let mut state = Registers {
        ip: regs.ip,
        sp: regs.sp,
        bp: Ok(regs.bp),
    };
    // The interrupted instruction is looked up as is; a return address
    // minus one, so a call at a function's very end still finds its row.
    let mut exact = true;
    frames.push(state.ip);
    loop {
        outcome.stack_used = state.sp.saturating_sub(regs.sp);
        if frames.len() >= max_frames {
            outcome.stop = Stop::TooDeep;
            return outcome;
        }
        let lookup = if exact {
            state.ip
        } else {
            state.ip.wrapping_sub(1)
        };
        let step = match code.code(lookup) {
            Code::Row { row, system } => {
                if !exact && !system && matches!(row.cfa, Cfa::RspOffset(offset) if offset > 8) {
                    outcome.frameless_callers += 1;
                }
                step_cfi(&row, &state, stack)
            }
            Code::NoCfi => match step_foreign(code, &state, stack, frames.len() - 1, exact) {
                Some(step) => step,
                None => step_rbp(&state, stack, Stop::NoCfi),
            },
            Code::Unmapped => {
                outcome.unmapped.get_or_insert(lookup);
                step_rbp(&state, stack, Stop::Unmapped)
            }
        };
        let (next, kind) = match step {
            Ok(step) => step,
            Err(stop) => {
                outcome.stop = stop;
                return outcome;
            }
        };
        match kind {
            StepKind::Rbp => outcome.rbp_frames += 1,
            StepKind::Signal => outcome.signal_frames += 1,
            StepKind::Foreign => outcome.foreign_frames += 1,
            StepKind::Cfi => {}
        }
        if next.ip == 0 {
            return outcome;
        }
        // A signal handler may run on its own stack; everywhere else the
        // caller's frame lies above the callee's.
        if kind != StepKind::Signal && next.sp <= state.sp {
            outcome.stop = Stop::NotProgressing;
            return outcome;
        }
        frames.push(next.ip);
        exact = kind == StepKind::Signal;
        state = next;
    }
}

fn step_cfi(
    row: &UnwindRow,
    state: &Registers,
    stack: StackCopy<'_>,
) -> Result<(Registers, StepKind), Stop> {
    let cfa = match row.cfa {
        Cfa::RspOffset(offset) => state.sp.checked_add_signed(i64::from(offset)),
        Cfa::RbpOffset(offset) => state.bp?.checked_add_signed(i64::from(offset)),
        Cfa::Plt { threshold } => {
            let pushed = if state.ip & 15 >= u64::from(threshold) {
                16
            } else {
                8
            };
            state.sp.checked_add(pushed)
        }
        Cfa::Signal => return step_signal(state, stack),
        Cfa::Unsupported => return Err(Stop::UnsupportedRule),
    }
    .ok_or(Stop::NotProgressing)?;
    if cfa <= state.sp {
        return Err(Stop::NotProgressing);
    }
    let at = |offset: i32| {
        cfa.checked_add_signed(i64::from(offset))
            .ok_or(Stop::NotProgressing)
            .and_then(|address| stack.read(address))
    };
    let ip = match row.ra {
        Rule::CfaOffset(offset) => at(offset)?,
        Rule::Undefined => return Err(Stop::Complete),
        Rule::Same | Rule::Unsupported => return Err(Stop::UnsupportedRule),
    };
    let bp = match row.rbp {
        Rule::Same => state.bp,
        Rule::CfaOffset(offset) => at(offset),
        Rule::Undefined | Rule::Unsupported => Err(Stop::UnsupportedRule),
    };
    Ok((Registers { ip, sp: cfa, bp }, StepKind::Cfi))
}

/// The frame of a signal trampoline: the kernel's `ucontext_t` starts at
/// rsp and holds the interrupted registers.
fn step_signal(state: &Registers, stack: StackCopy<'_>) -> Result<(Registers, StepKind), Stop> {
    let slot = |offset: u64| {
        state
            .sp
            .checked_add(offset)
            .ok_or(Stop::NotProgressing)
            .and_then(|address| stack.read(address))
    };
    let next = Registers {
        ip: slot(UCONTEXT_RIP)?,
        sp: slot(UCONTEXT_RSP)?,
        bp: slot(UCONTEXT_RBP),
    };
    Ok((next, StepKind::Signal))
}

/// Code without CFI that a runtime may know: its step, if it does.
fn step_foreign(
    code: &mut impl CodeLookup,
    state: &Registers,
    stack: StackCopy<'_>,
    depth: usize,
    exact: bool,
) -> Option<Result<(Registers, StepKind), Stop>> {
    let frame = ForeignFrame {
        ip: state.ip,
        sp: state.sp,
        bp: state.bp.ok(),
        depth,
        exact,
    };
    Some(match code.foreign(frame, stack)? {
        ForeignStep::Caller { ip, sp, bp } => Ok((
            Registers {
                ip,
                sp,
                bp: bp.ok_or(Stop::UnsupportedRule),
            },
            StepKind::Foreign,
        )),
        ForeignStep::Stop => Err(Stop::NoCfi),
    })
}

/// Code without CFI: if rbp points at a saved-rbp/return-address pair
/// above rsp, take it for the frame (JIT compilers keep frame pointers).
fn step_rbp(
    state: &Registers,
    stack: StackCopy<'_>,
    implausible: Stop,
) -> Result<(Registers, StepKind), Stop> {
    let bp = state.bp.map_err(|_| implausible)?;
    if bp < state.sp || bp % 8 != 0 {
        return Err(implausible);
    }
    if bp.saturating_add(16) > stack.end() {
        // Mapped code beyond the copy but within a stack's reach: a real
        // frame that did not fit. Farther, or for code firn knows nothing
        // about, rbp is no evidence of a frame.
        let within_reach = bp.saturating_sub(stack.end()) < MAX_STACK_SPAN;
        return Err(if within_reach && implausible == Stop::NoCfi {
            Stop::Truncated
        } else {
            implausible
        });
    }
    let next = Registers {
        ip: stack.read(bp + 8)?,
        sp: bp + 16,
        bp: stack.read(bp),
    };
    Ok((next, StepKind::Rbp))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// Code by address range.
    struct FakeCode(Vec<(u64, u64, Code)>);

    type Ranges = Vec<(u64, u64, Code)>;

    impl CodeLookup for FakeCode {
        fn code(&mut self, address: u64) -> Code {
            self.0
                .iter()
                .find(|(start, end, _)| (*start..*end).contains(&address))
                .map_or(Code::Unmapped, |(_, _, code)| *code)
        }
    }

    const SP: u64 = 0x7ffd_0000;

    /// A stack copy built word by word from `SP` up.
    fn stack(words: &HashMap<u64, u64>, len: usize) -> Vec<u8> {
        (0..len as u64)
            .flat_map(|index| {
                words
                    .get(&(SP + index * 8))
                    .copied()
                    .unwrap_or(0xdead_beef)
                    .to_le_bytes()
            })
            .collect()
    }

    const fn covered(row: UnwindRow) -> Code {
        Code::Row { row, system: false }
    }

    const fn rsp_row(offset: i32) -> Code {
        covered(UnwindRow {
            cfa: Cfa::RspOffset(offset),
            ra: Rule::CfaOffset(-8),
            rbp: Rule::Same,
        })
    }

    const OUTERMOST: Code = covered(UnwindRow {
        cfa: Cfa::RspOffset(8),
        ra: Rule::Undefined,
        rbp: Rule::Same,
    });

    fn run(code: Ranges, regs: UserRegs, bytes: &[u8]) -> (Vec<u64>, Outcome) {
        let mut frames = Vec::new();
        let outcome = unwind(
            regs,
            StackCopy { sp: regs.sp, bytes },
            &mut FakeCode(code),
            128,
            &mut frames,
        );
        (frames, outcome)
    }

    /// leaf (no frame) -> mid (32-byte frame) -> root (outermost).
    fn three_frames() -> (Ranges, HashMap<u64, u64>) {
        let code = vec![
            (0x1000, 0x1100, rsp_row(8)),
            (0x2000, 0x2100, rsp_row(40)),
            (0x3000, 0x3100, OUTERMOST),
        ];
        // leaf's return address at SP; mid's at SP + 8 + 32.
        let words = HashMap::from([(SP, 0x2010), (SP + 40, 0x3020)]);
        (code, words)
    }

    #[test]
    fn frameless_code_unwinds_to_the_outermost_frame() {
        let (code, words) = three_frames();
        let regs = UserRegs {
            ip: 0x1004,
            sp: SP,
            bp: 0x1234,
        };
        let (frames, outcome) = run(code, regs, &stack(&words, 16));
        assert_eq!(frames, [0x1004, 0x2010, 0x3020]);
        assert_eq!(outcome.stop, Stop::Complete);
        // mid has a frame without rbp: a frame-pointer walk loses its caller.
        assert_eq!(outcome.frameless_callers, 1);
    }

    #[test]
    fn return_addresses_are_looked_up_one_byte_back() {
        // mid's call is its last instruction: the return address is the
        // first byte past mid, where another function's CFI begins.
        let code = vec![
            (0x1000, 0x1100, rsp_row(8)),
            (0x2000, 0x2010, rsp_row(40)),
            (
                0x2010,
                0x2100,
                covered(UnwindRow {
                    cfa: Cfa::Unsupported,
                    ra: Rule::Unsupported,
                    rbp: Rule::Same,
                }),
            ),
            (0x3000, 0x3100, OUTERMOST),
        ];
        let words = HashMap::from([(SP, 0x2010), (SP + 40, 0x3020)]);
        let regs = UserRegs {
            ip: 0x1004,
            sp: SP,
            bp: 0,
        };
        let (frames, outcome) = run(code, regs, &stack(&words, 16));
        assert_eq!(frames, [0x1004, 0x2010, 0x3020]);
        assert_eq!(outcome.stop, Stop::Complete);
    }

    #[test]
    fn a_frame_beyond_the_copy_is_truncated_and_kept() {
        let (code, words) = three_frames();
        let regs = UserRegs {
            ip: 0x1004,
            sp: SP,
            bp: 0,
        };
        // 4 words: leaf's return address fits, mid's (at SP + 40) does not.
        let (frames, outcome) = run(code, regs, &stack(&words, 4));
        assert_eq!(frames, [0x1004, 0x2010]);
        assert_eq!(outcome.stop, Stop::Truncated);
    }

    #[test]
    fn rbp_based_frames_restore_the_saved_rbp() {
        let framed = covered(UnwindRow {
            cfa: Cfa::RbpOffset(16),
            ra: Rule::CfaOffset(-8),
            rbp: Rule::CfaOffset(-16),
        });
        let code = vec![(0x1000, 0x1100, framed), (0x2000, 0x2100, framed)];
        // Frame 1 at SP + 0x20: saved rbp -> SP + 0x60, ra 0x2044.
        // Frame 2 at SP + 0x60: saved rbp 0, ra 0 (end of the chain).
        let words = HashMap::from([
            (SP + 0x20, SP + 0x60),
            (SP + 0x28, 0x2044),
            (SP + 0x60, 0),
            (SP + 0x68, 0),
        ]);
        let regs = UserRegs {
            ip: 0x1010,
            sp: SP,
            bp: SP + 0x20,
        };
        let (frames, outcome) = run(code, regs, &stack(&words, 32));
        assert_eq!(frames, [0x1010, 0x2044]);
        assert_eq!(outcome.stop, Stop::Complete);
    }

    #[test]
    fn code_without_cfi_is_crossed_by_the_rbp_chain() {
        // JIT code at 0x9000 (no CFI) called from an outermost function.
        let code = vec![(0x9000, 0x9100, Code::NoCfi), (0x3000, 0x3100, OUTERMOST)];
        let words = HashMap::from([(SP + 0x10, SP + 0x40), (SP + 0x18, 0x3008)]);
        let regs = UserRegs {
            ip: 0x9050,
            sp: SP,
            bp: SP + 0x10,
        };
        let (frames, outcome) = run(code, regs, &stack(&words, 16));
        assert_eq!(frames, [0x9050, 0x3008]);
        assert_eq!(outcome.stop, Stop::Complete);
        assert_eq!(outcome.rbp_frames, 1);

        // rbp beyond the copy: for mapped code a frame that did not fit,
        // for unknown code no evidence of anything.
        let far = UserRegs {
            bp: SP + 0x1000,
            ..regs
        };
        let (_, outcome) = run(vec![(0x9000, 0x9100, Code::NoCfi)], far, &stack(&words, 16));
        assert_eq!(outcome.stop, Stop::Truncated);
        let (_, outcome) = run(Vec::new(), far, &stack(&words, 16));
        assert_eq!(outcome.stop, Stop::Unmapped);
        assert_eq!(outcome.unmapped, Some(0x9050));

        // rbp holding a small integer is no frame.
        let code = vec![(0x9000, 0x9100, Code::NoCfi)];
        let regs = UserRegs { bp: 42, ..regs };
        let (frames, outcome) = run(code, regs, &stack(&words, 16));
        assert_eq!(frames, [0x9050]);
        assert_eq!(outcome.stop, Stop::NoCfi);
    }

    /// JIT code at 0x9000..0x9100 whose frames a runtime unwinds: a frame
    /// of 0x40 bytes with no rbp chain, return address at its top.
    struct Runtime {
        code: FakeCode,
        asked: Vec<ForeignFrame>,
        stop: bool,
    }

    impl CodeLookup for Runtime {
        fn code(&mut self, address: u64) -> Code {
            self.code.code(address)
        }

        fn foreign(&mut self, frame: ForeignFrame, stack: StackCopy<'_>) -> Option<ForeignStep> {
            if !(0x9000..0x9100).contains(&frame.ip) {
                return None;
            }
            self.asked.push(frame);
            if self.stop {
                return Some(ForeignStep::Stop);
            }
            let sp = frame.sp + 0x40;
            Some(ForeignStep::Caller {
                ip: stack.word(sp - 8)?,
                sp,
                bp: frame.bp,
            })
        }
    }

    #[test]
    fn a_runtime_unwinds_its_own_frames() {
        // leaf in JIT code, called by JIT code, called by native code.
        let code = vec![(0x9000, 0x9100, Code::NoCfi), (0x3000, 0x3100, OUTERMOST)];
        let words = HashMap::from([(SP + 0x38, 0x9080), (SP + 0x78, 0x3010)]);
        let regs = UserRegs {
            ip: 0x9004,
            sp: SP,
            // Not a frame: JIT code uses rbp as it likes.
            bp: 7,
        };
        let mut runtime = Runtime {
            code: FakeCode(code),
            asked: Vec::new(),
            stop: false,
        };
        let bytes = stack(&words, 32);
        let mut frames = Vec::new();
        let copy = StackCopy {
            sp: SP,
            bytes: &bytes,
        };
        let outcome = unwind(regs, copy, &mut runtime, 128, &mut frames);
        assert_eq!(frames, [0x9004, 0x9080, 0x3010]);
        assert_eq!(outcome.stop, Stop::Complete);
        assert_eq!((outcome.foreign_frames, outcome.rbp_frames), (2, 0));
        let depths: Vec<(usize, bool)> = runtime
            .asked
            .iter()
            .map(|frame| (frame.depth, frame.exact))
            .collect();
        assert_eq!(depths, [(0, true), (1, false)]);
        assert_eq!(runtime.asked[1].sp, SP + 0x40);

        // The runtime's code whose frame it cannot unwind: a stop, not a
        // guess by rbp.
        runtime.stop = true;
        frames.clear();
        let outcome = unwind(regs, copy, &mut runtime, 128, &mut frames);
        assert_eq!(frames, [0x9004]);
        assert_eq!(outcome.stop, Stop::NoCfi);
    }

    #[test]
    fn the_first_unmapped_address_is_reported_even_when_crossed() {
        // Code the caller's maps do not know of yet (a library mapped
        // after they were read), with a frame the rbp chain crosses.
        let code = vec![(0x3000, 0x3100, OUTERMOST)];
        let words = HashMap::from([(SP + 0x10, SP + 0x40), (SP + 0x18, 0x3008)]);
        let regs = UserRegs {
            ip: 0x9050,
            sp: SP,
            bp: SP + 0x10,
        };
        let (frames, outcome) = run(code.clone(), regs, &stack(&words, 16));
        assert_eq!(frames, [0x9050, 0x3008]);
        assert_eq!(outcome.stop, Stop::Complete);
        assert_eq!(outcome.unmapped, Some(0x9050));

        // Return addresses are looked up one byte back.
        let words = HashMap::from([(SP, 0x9051)]);
        let regs = UserRegs {
            ip: 0x3004,
            sp: SP,
            bp: 0,
        };
        let (frames, outcome) = run(vec![(0x3000, 0x3100, rsp_row(8))], regs, &stack(&words, 4));
        assert_eq!(frames, [0x3004, 0x9051]);
        assert_eq!(outcome.stop, Stop::Unmapped);
        assert_eq!(outcome.unmapped, Some(0x9050));
        let (_, outcome) = run(code, regs, &stack(&words, 4));
        assert_eq!(outcome.unmapped, None);
    }

    #[test]
    fn signal_frames_resume_at_the_interrupted_instruction() {
        let trampoline = covered(UnwindRow {
            cfa: Cfa::Signal,
            ra: Rule::Unsupported,
            rbp: Rule::Unsupported,
        });
        let code = vec![
            // The handler: no frame.
            (0x5000, 0x5100, rsp_row(8)),
            // __restore_rt; its FDE starts one byte early, as glibc's does.
            (0x6fff, 0x7010, trampoline),
            // The interrupted function, whose first instruction was hit.
            (0x1000, 0x1100, rsp_row(8)),
            (0x3000, 0x3100, OUTERMOST),
        ];
        let uc = SP + 8;
        let interrupted_sp = SP + 0x400;
        let words = HashMap::from([
            (SP, 0x7000),
            (uc + UCONTEXT_RIP, 0x1000),
            (uc + UCONTEXT_RSP, interrupted_sp),
            (uc + UCONTEXT_RBP, 7),
            (interrupted_sp, 0x3010),
        ]);
        let regs = UserRegs {
            ip: 0x5004,
            sp: SP,
            bp: 0,
        };
        let (frames, outcome) = run(code, regs, &stack(&words, 0x100));
        // 0x1000 is found exactly, not as 0x0fff (which has no code).
        assert_eq!(frames, [0x5004, 0x7000, 0x1000, 0x3010]);
        assert_eq!(outcome.stop, Stop::Complete);
        assert_eq!(outcome.signal_frames, 1);
    }

    #[test]
    fn plt_entries_pop_what_they_pushed() {
        let plt = covered(UnwindRow {
            cfa: Cfa::Plt { threshold: 11 },
            ra: Rule::CfaOffset(-8),
            rbp: Rule::Same,
        });
        let code = vec![(0x4000, 0x4100, plt), (0x3000, 0x3100, OUTERMOST)];
        let words = HashMap::from([(SP, 0x3004), (SP + 8, 0x3008)]);
        let regs = UserRegs {
            ip: 0x4004,
            sp: SP,
            bp: 0,
        };
        let (frames, _) = run(code.clone(), regs, &stack(&words, 4));
        assert_eq!(frames, [0x4004, 0x3004]);
        let regs = UserRegs { ip: 0x400c, ..regs };
        let (frames, _) = run(code, regs, &stack(&words, 4));
        assert_eq!(frames, [0x400c, 0x3008]);
    }

    #[test]
    fn corrupt_stacks_stop_with_a_reason() {
        // A frame whose CFA does not move up: a loop that must end.
        let code = vec![(0x1000, 0x1100, rsp_row(8))];
        let words = HashMap::from([(SP, 0x1010)]);
        let regs = UserRegs {
            ip: 0x1004,
            sp: SP,
            bp: 0,
        };
        let (frames, outcome) = run(code.clone(), regs, &stack(&words, 8));
        // 0x1010 is in the same function: its CFA is SP + 16, then
        // its return address is garbage outside every mapping.
        assert!(frames.len() <= 3, "{frames:x?}");
        assert_ne!(outcome.stop, Stop::Complete);

        // A negative CFA offset: not progressing.
        let backwards = vec![(0x1000, 0x1100, rsp_row(-64))];
        let (frames, outcome) = run(backwards, regs, &stack(&words, 8));
        assert_eq!(frames, [0x1004]);
        assert_eq!(outcome.stop, Stop::NotProgressing);

        // A recursion deeper than the bound.
        let recursive = vec![(0x1000, 0x1100, rsp_row(8))];
        let words: HashMap<u64, u64> = (0..300).map(|i| (SP + i * 8, 0x1010)).collect();
        let (frames, outcome) = run(recursive, regs, &stack(&words, 300));
        assert_eq!(frames.len(), 128);
        assert_eq!(outcome.stop, Stop::TooDeep);

        // No copy at all.
        let (frames, outcome) = run(code, regs, &[]);
        assert_eq!(frames, [0x1004]);
        assert_eq!(outcome.stop, Stop::Truncated);
    }
}
