//! The Java frames of a compiled pc: its `PcDesc` (the debug information
//! recorded at calls and safepoints), whose scope names the method and
//! bytecode index, and whose sender scopes name the methods it was inlined
//! into, outermost last.

use super::{
    HotSpotError,
    codecache::CodeBlob,
    invalid,
    layout::Layout,
    read::{field_i32, field_u64, read},
    stream::{Coding, Stream},
};
use crate::Memory;

/// Largest debug information read of one nmethod (pc descs, scopes,
/// metadata each).
const MAX_SECTION: u64 = 4 << 20;

/// Deepest inlining followed.
const MAX_SCOPES: usize = 64;

/// `PcDesc`: `_pc_offset`, `_scope_decode_offset` (ints), then two more
/// ints (`vmStructs` lists the same offsets from JDK 8 to 25).
const PC_DESC_SIZE: usize = 16;

/// A frame of a compiled method: the method (inlined or not) and where in
/// its bytecodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scope {
    pub method: u64,
    /// -1 at the method's entry (`InvocationEntryBci`).
    pub bci: i32,
}

/// An nmethod's debug information, read once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NmethodDebug {
    /// `(pc offset from the code's start, scope decode offset)`, ordered.
    pcs: Vec<(i32, i32)>,
    scopes: Vec<u8>,
    metadata: Vec<u64>,
    coding: Coding,
}

impl NmethodDebug {
    /// Reads the debug information of the nmethod `blob`.
    pub fn read(
        memory: &mut dyn Memory,
        layout: &Layout,
        blob: &CodeBlob,
    ) -> Result<Self, HotSpotError> {
        let section = |range: &std::ops::Range<u64>, what: &'static str| {
            if range.start > range.end || range.end - range.start > MAX_SECTION {
                Err(invalid(what, range.start, "implausible bounds"))
            } else {
                Ok((range.end - range.start) as usize)
            }
        };
        let pcs_length = section(&blob.pcs, "the pc descs")?;
        let scopes_length = section(&blob.scopes_data, "the scopes data")?;
        let metadata_length = section(&blob.metadata, "the metadata")?;
        let mut pcs = vec![0; pcs_length];
        read(memory, blob.pcs.start, &mut pcs)?;
        let mut scopes = vec![0; scopes_length];
        read(memory, blob.scopes_data.start, &mut scopes)?;
        let mut metadata = vec![0; metadata_length];
        read(memory, blob.metadata.start, &mut metadata)?;
        Ok(Self {
            coding: layout.coding,
            pcs: pcs
                .chunks_exact(PC_DESC_SIZE)
                .map(|desc| (field_i32(desc, 0), field_i32(desc, 4)))
                .collect(),
            scopes,
            metadata: metadata
                .chunks_exact(8)
                .map(|word| field_u64(word, 0))
                .collect(),
        })
    }

    /// The pc offsets (from the code's start) that have debug information.
    pub fn pc_offsets(&self) -> impl Iterator<Item = i32> + '_ {
        self.pcs.iter().map(|&(offset, _)| offset)
    }

    pub fn heap_bytes(&self) -> usize {
        self.pcs.len() * 8 + self.scopes.len() + self.metadata.len() * 8 + 64
    }

    /// The scopes at `pc_offset`, innermost first. A return address has a
    /// pc desc of its own (`exact`); an interrupted pc between two takes
    /// the next one's, as HotSpot does when it looks one up approximately.
    pub fn scopes_at(&self, pc_offset: i64, exact: bool) -> Result<Vec<Scope>, HotSpotError> {
        // An interrupted pc takes the next pc desc with scopes (the end of
        // a method has pc descs without, for its stubs), else the last one
        // before it.
        let found = self
            .pcs
            .iter()
            .find(|&&(offset, _)| i64::from(offset) == pc_offset)
            .or_else(|| {
                if exact {
                    return None;
                }
                let scoped = |&&(_, decode): &&(i32, i32)| decode != 0;
                self.pcs
                    .iter()
                    .filter(scoped)
                    .find(|&&(offset, _)| i64::from(offset) >= pc_offset)
                    .or_else(|| {
                        self.pcs
                            .iter()
                            .filter(scoped)
                            .rfind(|&&(offset, _)| i64::from(offset) < pc_offset)
                    })
            });
        let Some(&(_, mut decode)) = found else {
            return Err(invalid("a pc", pc_offset as u64, "no pc desc"));
        };
        let mut scopes = Vec::new();
        // 0 is `DebugInformationRecorder::serialized_null`: no scope.
        while decode != 0 {
            if scopes.len() >= MAX_SCOPES {
                return Err(invalid("a scope", decode as u64, "too deep"));
            }
            let bad = || invalid("a scope", decode as u64, "undecodable");
            let mut stream = Stream::new(
                &self.scopes,
                usize::try_from(decode).map_err(|_| bad())?,
                self.coding,
            );
            let sender = stream.unsigned().ok_or_else(bad)?;
            let index = stream.unsigned().ok_or_else(bad)? as usize;
            let bci = stream.unsigned().ok_or_else(bad)? as i32 - 1;
            let method = index
                .checked_sub(1)
                .and_then(|index| self.metadata.get(index))
                .copied()
                .filter(|&method| method != 0)
                .ok_or_else(bad)?;
            scopes.push(Scope { method, bci });
            // Sender scopes are written before the scopes they enclose.
            if i64::from(sender) >= i64::from(decode) {
                return Err(bad());
            }
            decode = sender as i32;
        }
        Ok(scopes)
    }
}

/// The scopes of `pc` in the nmethod `blob`, read from the process (no
/// cache; see [`NmethodDebug`] to keep them).
pub fn scopes_at(
    memory: &mut dyn Memory,
    layout: &Layout,
    blob: &CodeBlob,
    pc: u64,
    exact: bool,
) -> Result<Vec<Scope>, HotSpotError> {
    let debug = NmethodDebug::read(memory, layout, blob)?;
    debug.scopes_at(pc.wrapping_sub(blob.code.start) as i64, exact)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two methods: `0x1000` inlined at bci 4 into `0x2000` at bci 7.
    fn debug() -> NmethodDebug {
        // Offset 1: the outer scope (no sender, metadata 2, bci 7 + 1);
        // offset 4: the inner (sender 1, metadata 1, bci 4 + 1).
        NmethodDebug {
            pcs: vec![(-1, 0), (0x20, 4), (0x50, 1), (0x131, 0)],
            scopes: vec![0, 0, 2, 8, 1, 1, 5],
            metadata: vec![0x1000, 0x2000],
            coding: Coding::Pack200,
        }
    }

    #[test]
    fn scopes_chain_from_the_inlined_method_out() {
        let debug = debug();
        let inlined = debug.scopes_at(0x20, true).expect("scopes");
        assert_eq!(
            inlined,
            [
                Scope {
                    method: 0x1000,
                    bci: 4
                },
                Scope {
                    method: 0x2000,
                    bci: 7
                }
            ]
        );
        assert!(debug.scopes_at(0x21, true).is_err(), "no exact pc desc");
        // Interrupted between pc descs: the next one with scopes.
        assert_eq!(debug.scopes_at(0x21, false).expect("scopes").len(), 1);
        // Past the last with scopes (only the stubs' remain): the last
        // before it.
        let tail = debug.scopes_at(0x100, false).expect("scopes");
        assert_eq!(tail[0].method, 0x2000);
    }

    #[test]
    fn corrupt_scopes_are_errors() {
        let mut debug = debug();
        // A sender after its scope: a loop, refused.
        debug.scopes[1] = 9;
        assert!(debug.scopes_at(0x50, true).is_err());
        let mut debug = self::tests::debug();
        // A metadata index past the array.
        debug.scopes[2] = 7;
        assert!(debug.scopes_at(0x50, true).is_err());
    }
}
