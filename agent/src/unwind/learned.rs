//! The stack copy each executable's processes need, learned over all of
//! them: the deepest stack any complete DWARF unwind of any of its
//! processes used, from their first samples on (short processes that
//! never fit a copy of their own included). The next process of the
//! executable starts with a copy fitted to that, once enough unwinds were
//! seen; one that ran past its copy makes the executable keep the full
//! copy. A copy fitted to one process alone would cut the first samples
//! of the next whose stacks run deeper (the same compiler on a bigger
//! file, the same interpreter on another script).

use std::num::NonZeroUsize;

use agent_common::{MAX_STACK_COPY, STACK_COPY_CHUNK};
use lru::LruCache;

use crate::process::{MappingKind, ProcessImage};

/// Executables whose copy size is remembered.
const LEARNED_EXECUTABLES: NonZeroUsize = NonZeroUsize::new(1024).unwrap();

/// Complete unwinds, over every process of an executable, before its next
/// processes start with a fitted copy.
pub const LEARN_AFTER: u32 = 200;

/// The executable's file, as its mapping names it: its processes are
/// those of one object, whatever path ran it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ExecutableKey {
    dev: u64,
    inode: u64,
}

impl ExecutableKey {
    pub fn of(image: &ProcessImage) -> Option<Self> {
        let spec = image
            .mappings
            .iter()
            .map(|mapping| &mapping.spec)
            .find(|spec| spec.kind == MappingKind::File)?;
        Some(Self {
            dev: spec.dev,
            inode: spec.inode,
        })
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Need {
    deepest: u64,
    complete: u32,
    /// A process of it ran past the copy it had.
    grown: bool,
}

pub struct LearnedCopies {
    needs: LruCache<ExecutableKey, Need>,
}

impl Default for LearnedCopies {
    fn default() -> Self {
        Self {
            needs: LruCache::new(LEARNED_EXECUTABLES),
        }
    }
}

impl LearnedCopies {
    /// The copy a new process of `key` starts with, if one was learned:
    /// never more than `default` unless a process of it needed more.
    pub fn size(&mut self, key: ExecutableKey, default: u32) -> Option<u32> {
        let need = self.needs.get(&key)?;
        if need.grown {
            return Some(MAX_STACK_COPY as u32);
        }
        (need.complete >= LEARN_AFTER).then(|| fitted(need.deepest).min(default))
    }

    /// A complete unwind of a process of `key` used `bytes` of its stack.
    pub fn used(&mut self, key: ExecutableKey, bytes: u64) {
        let need = self.needs.get_or_insert_mut(key, Need::default);
        need.deepest = need.deepest.max(bytes);
        need.complete = need.complete.saturating_add(1);
    }

    /// A process of `key` needed more than its copy.
    pub fn grown(&mut self, key: ExecutableKey) {
        self.needs.get_or_insert_mut(key, Need::default).grown = true;
    }
}

/// A copy for stacks of at most `deepest` bytes: a quarter and a KiB to
/// spare, in copy chunks, at least [`MIN_COPY`].
pub fn fitted(deepest: u64) -> u32 {
    let chunk = STACK_COPY_CHUNK as u64;
    let want = (deepest + deepest / 4 + 1024).div_ceil(chunk) * chunk;
    u32::try_from(want).unwrap_or(u32::MAX).max(MIN_COPY)
}

/// Smallest copy a process is given.
pub const MIN_COPY: u32 = 2048;
