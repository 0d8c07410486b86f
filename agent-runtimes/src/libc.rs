//! The C library's side of finding an interpreter's thread state: which
//! libc a process runs on, and where glibc keeps a thread's pthread keys.
//!
//! CPython keeps the running thread's state under a pthread key. The BPF
//! walker cannot call `pthread_getspecific`, so it reads the value where
//! glibc keeps it: `struct pthread` starts at the thread pointer (the fs
//! base on x86-64), and its `specific_1stblock` array of `{ seq, data }`
//! pairs holds keys below 32. That array's offset changes with glibc's
//! version and build, and glibc exports no symbol for it, so it is read off
//! the code of `pthread_getspecific` itself, which computes exactly that
//! address.

use iced_x86::{Decoder, DecoderOptions, Instruction, Mnemonic, OpKind, Register};
use object::{Object, ObjectSection, ObjectSymbol};

/// Which C library an object is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LibcKind {
    Glibc,
    Musl,
}

/// The C library `path` (a mapped file's path) is, by its file name.
pub fn libc_kind(path: &str) -> Option<LibcKind> {
    let name = path.rsplit('/').next().unwrap_or(path);
    let glibc_versioned = name
        .strip_prefix("libc-2.")
        .and_then(|rest| rest.strip_suffix(".so"))
        .is_some_and(|minor| !minor.is_empty() && minor.bytes().all(|b| b.is_ascii_digit()));
    if name == "libc.so.6" || glibc_versioned {
        return Some(LibcKind::Glibc);
    }
    let musl =
        (name.starts_with("ld-musl-") || name.starts_with("libc.musl-")) && name.ends_with(".so.1");
    musl.then_some(LibcKind::Musl)
}

#[derive(Debug, thiserror::Error)]
pub enum LibcError {
    #[error("could not parse the C library as ELF")]
    Parse {
        #[source]
        source: object::Error,
    },
    #[error("the C library exports neither __pthread_getspecific nor pthread_getspecific")]
    MissingSymbol,
    #[error("the code of {symbol} at {address:#x} is not in the file")]
    MissingCode { symbol: String, address: u64 },
    #[error(
        "{symbol} does not read a key's value from the thread's first block of keys \
         (16 * key + offset from the thread pointer) in its first {instructions} instructions"
    )]
    PatternNotFound { symbol: String, instructions: usize },
}

/// Symbols of `pthread_getspecific`, the internal alias first (the public
/// name is a versioned alias of the same code).
const GETSPECIFIC: &[&str] = &["__pthread_getspecific", "pthread_getspecific"];

/// Bytes of `pthread_getspecific` decoded at most: its key < 32 path is a
/// handful of instructions at the start.
const CODE_BYTES: u64 = 192;

/// Instructions evaluated at most (jumps are followed, so this bounds the
/// walk, not the bytes).
const MAX_INSTRUCTIONS: usize = 48;

/// Size of one `struct pthread_key_data` (`{ uintptr_t seq; void *data; }`).
const KEY_DATA_SIZE: i64 = 16;

/// Offset of `data` in `struct pthread_key_data`.
const KEY_DATA_DATA: i64 = 8;

/// Offset from the thread pointer of glibc's `specific_1stblock` in the
/// C library `elf`: key `k`'s value (for `k < 32`) is at
/// `thread pointer + offset + 16 * k + 8`.
///
/// Reads the code of `pthread_getspecific` and follows its first
/// instructions symbolically (each register as `a * key + b`, possibly plus
/// the thread pointer) up to the load whose address is
/// `16 * key + C + thread pointer`: that is `specific_1stblock[key].data`,
/// so the offset is `C - 8`. glibc reads `data` before `seq`, so the first
/// such load is the one.
///
/// Before glibc 2.34, `pthread_getspecific` is in `libpthread.so.0`, not in
/// `libc.so.6`: give that object then.
pub fn glibc_thread_specific_offset(elf: &[u8]) -> Result<u32, LibcError> {
    let file = object::File::parse(elf).map_err(|source| LibcError::Parse { source })?;
    let symbol = GETSPECIFIC
        .iter()
        .find_map(|name| {
            file.dynamic_symbols()
                .chain(file.symbols())
                .find(|symbol| symbol.is_definition() && symbol.name() == Ok(*name))
        })
        .ok_or(LibcError::MissingSymbol)?;
    let name = symbol.name().unwrap_or_default().to_owned();
    let address = symbol.address();
    let missing = || LibcError::MissingCode {
        symbol: name.clone(),
        address,
    };
    // Section fields come from the file: an end past the address space
    // must not wrap.
    let end = |section: &object::Section<'_, '_>| section.address().saturating_add(section.size());
    let section = file
        .sections()
        .find(|section| (section.address()..end(section)).contains(&address))
        .ok_or_else(missing)?;
    let available = end(&section) - address;
    let length = match symbol.size() {
        0 => available.min(CODE_BYTES),
        size => size.min(available).min(CODE_BYTES),
    };
    let code = section
        .data_range(address, length)
        .ok()
        .flatten()
        .ok_or_else(missing)?;
    thread_specific_offset_in_code(code, address).ok_or(LibcError::PatternNotFound {
        symbol: name,
        instructions: MAX_INSTRUCTIONS,
    })
}

/// A register's value in terms of the key (the function's first argument)
/// and the thread pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Value {
    key: i64,
    constant: i64,
    thread_pointer: bool,
}

impl Value {
    const KEY: Self = Self {
        key: 1,
        constant: 0,
        thread_pointer: false,
    };

    fn constant(constant: i64) -> Self {
        Self {
            key: 0,
            constant,
            thread_pointer: false,
        }
    }

    fn add(self, other: Self) -> Option<Self> {
        if self.thread_pointer && other.thread_pointer {
            return None;
        }
        Some(Self {
            key: self.key.checked_add(other.key)?,
            constant: self.constant.checked_add(other.constant)?,
            thread_pointer: self.thread_pointer || other.thread_pointer,
        })
    }

    fn scale(self, factor: i64) -> Option<Self> {
        if self.thread_pointer && factor != 1 {
            return None;
        }
        Some(Self {
            key: self.key.checked_mul(factor)?,
            constant: self.constant.checked_mul(factor)?,
            thread_pointer: self.thread_pointer,
        })
    }
}

/// The registers: the 16 general purpose ones, unknown until written with
/// something known.
struct Registers([Option<Value>; 16]);

impl Registers {
    fn index(register: Register) -> Option<usize> {
        // 32- and 64-bit general purpose registers are two runs of 16 in
        // the same order (eax..r15d, rax..r15).
        let number = register as usize;
        [Register::EAX, Register::RAX]
            .into_iter()
            .map(|first| first as usize)
            .find(|first| (*first..*first + 16).contains(&number))
            .map(|first| number - first)
    }

    fn get(&self, register: Register) -> Option<Value> {
        Self::index(register).and_then(|index| self.0[index])
    }

    fn set(&mut self, register: Register, value: Option<Value>) {
        if let Some(index) = Self::index(register) {
            self.0[index] = value;
        }
    }
}

/// Follows `code` (at `address`) from its first instruction; see
/// [`glibc_thread_specific_offset`].
fn thread_specific_offset_in_code(code: &[u8], address: u64) -> Option<u32> {
    let mut registers = Registers([None; 16]);
    registers.set(Register::RDI, Some(Value::KEY));
    let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
    let end = address.saturating_add(code.len() as u64);
    for _ in 0..MAX_INSTRUCTIONS {
        if !decoder.can_decode() {
            return None;
        }
        let instruction = decoder.decode();
        if instruction.is_invalid() {
            return None;
        }
        match step(&mut registers, &instruction) {
            Step::Next => {}
            Step::Found(offset) => return Some(offset),
            Step::Stop => return None,
            Step::Jump(target) if (address..end).contains(&target) => {
                decoder.set_position((target - address) as usize).ok()?;
                decoder.set_ip(target);
            }
            Step::Jump(_) => return None,
        }
    }
    None
}

enum Step {
    Next,
    Jump(u64),
    Found(u32),
    Stop,
}

/// Evaluates one instruction. Conditional branches fall through: the
/// fast path for keys below 32 is the fall-through of glibc's bound check.
fn step(registers: &mut Registers, instruction: &Instruction) -> Step {
    let destination = instruction.op0_register();
    let written = match instruction.mnemonic() {
        Mnemonic::Ret | Mnemonic::Call | Mnemonic::Ud2 | Mnemonic::Int3 => return Step::Stop,
        Mnemonic::Jmp if instruction.op0_kind() == OpKind::NearBranch64 => {
            return Step::Jump(instruction.near_branch_target());
        }
        Mnemonic::Jmp => return Step::Stop,
        _ if instruction.op0_kind() == OpKind::NearBranch64 => return Step::Next,
        Mnemonic::Cmp | Mnemonic::Test | Mnemonic::Nop | Mnemonic::Push | Mnemonic::Endbr64 => {
            return Step::Next;
        }
        Mnemonic::Mov | Mnemonic::Movsxd | Mnemonic::Movzx => match instruction.op1_kind() {
            OpKind::Memory => match load(registers, instruction) {
                Load::Block(offset) => return Step::Found(offset),
                Load::Value(value) => value,
            },
            _ => source(registers, instruction, 1),
        },
        Mnemonic::Lea => address_of(registers, instruction).map(|(value, _)| value),
        Mnemonic::Add => {
            let right = match instruction.op1_kind() {
                OpKind::Memory => match load(registers, instruction) {
                    Load::Block(offset) => return Step::Found(offset),
                    Load::Value(value) => value,
                },
                _ => source(registers, instruction, 1),
            };
            registers
                .get(destination)
                .zip(right)
                .and_then(|(left, right)| left.add(right))
        }
        Mnemonic::Sub => registers
            .get(destination)
            .zip(source(registers, instruction, 1))
            .and_then(|(left, right)| left.add(right.scale(-1)?)),
        Mnemonic::Shl => registers.get(destination).and_then(|value| {
            let shift = u32::try_from(instruction.immediate(1)).ok()?;
            value.scale(1i64.checked_shl(shift)?)
        }),
        Mnemonic::Imul => multiply(registers, instruction),
        _ => None,
    };
    registers.set(destination, written);
    Step::Next
}

/// The value of operand `operand` if it is a register or an immediate.
fn source(registers: &Registers, instruction: &Instruction, operand: u32) -> Option<Value> {
    match instruction.op_kind(operand) {
        OpKind::Register => registers.get(instruction.op_register(operand)),
        OpKind::Immediate8
        | OpKind::Immediate16
        | OpKind::Immediate32
        | OpKind::Immediate64
        | OpKind::Immediate8to16
        | OpKind::Immediate8to32
        | OpKind::Immediate8to64
        | OpKind::Immediate32to64 => Some(Value::constant(
            instruction.immediate(operand).cast_signed(),
        )),
        _ => None,
    }
}

/// `imul r, r/m, imm` and the two-operand form by a known constant.
fn multiply(registers: &Registers, instruction: &Instruction) -> Option<Value> {
    if instruction.op_count() == 3 {
        let factor = source(registers, instruction, 2)?;
        return source(registers, instruction, 1)?.scale(factor.constant);
    }
    let left = registers.get(instruction.op0_register())?;
    let right = source(registers, instruction, 1)?;
    match (
        left.key,
        left.thread_pointer,
        right.key,
        right.thread_pointer,
    ) {
        (0, false, _, _) => right.scale(left.constant),
        (_, _, 0, false) => left.scale(right.constant),
        _ => None,
    }
}

/// The address of the memory operand, and whether it is relative to the
/// fs segment (whose base is the thread pointer).
fn address_of(registers: &Registers, instruction: &Instruction) -> Option<(Value, bool)> {
    let mut address = Value::constant(instruction.memory_displacement64().cast_signed());
    if instruction.memory_base() != Register::None {
        address = address.add(registers.get(instruction.memory_base())?)?;
    }
    if instruction.memory_index() != Register::None {
        let index = registers.get(instruction.memory_index())?;
        address = address.add(index.scale(i64::from(instruction.memory_index_scale()))?)?;
    }
    Some((address, instruction.memory_segment() == Register::FS))
}

const THREAD_POINTER: Value = Value {
    key: 0,
    constant: 0,
    thread_pointer: true,
};

/// Where `tcbhead_t::self` is.
const THREAD_SELF: Value = Value {
    key: 0,
    constant: 0x10,
    thread_pointer: true,
};

enum Load {
    /// A load from the thread's first block of keys: its offset.
    Block(u32),
    /// Any other load: what the destination holds now.
    Value(Option<Value>),
}

fn load(registers: &Registers, instruction: &Instruction) -> Load {
    let Some((mut address, fs_relative)) = address_of(registers, instruction) else {
        return Load::Value(None);
    };
    if fs_relative {
        let Some(absolute) = address.add(THREAD_POINTER) else {
            return Load::Value(None);
        };
        // `struct pthread` starts with glibc's `tcbhead_t`, whose `self`
        // field (at 0x10) points at the thread itself: `fs:[0x10]` is the
        // thread pointer.
        if absolute == THREAD_SELF {
            return Load::Value(Some(THREAD_POINTER));
        }
        address = absolute;
    }
    if address.thread_pointer && address.key == KEY_DATA_SIZE {
        let block = address.constant - KEY_DATA_DATA;
        if let Ok(offset) = u32::try_from(block) {
            return Load::Block(offset);
        }
    }
    Load::Value(None)
}

#[cfg(test)]
mod tests;
