//! Captured samples to unwind in tests and fuzz targets: the registers and
//! stack copy the BPF program took of a fixture binary, the maps of the
//! process it ran as, and that binary's real CFI (the agent's
//! `unwind_bench` example writes such captures: `capture --pid PID`).

use agent_common::UserRegs;
use agent_elf::{self as elf, ElfLayout};
use agent_fixtures::capture::{ExecMapping, parse_maps};

use crate::{
    cfi::{CfiContext, CfiSource},
    dwarf::{Code, CodeLookup},
};

/// One captured sample.
#[derive(Clone, Copy, Debug)]
pub struct Capture {
    pub regs: UserRegs,
    /// The stack copy, from `regs.sp` up.
    pub stack: &'static [u8],
    /// The process's `/proc/PID/maps` when it was captured.
    pub maps: &'static str,
}

impl Capture {
    /// `regs`: `ip=0x.. sp=0x.. bp=0x..` on the first line, the maps after.
    pub fn parse(regs: &'static str, stack: &'static [u8]) -> Option<Self> {
        let (line, maps) = regs.split_once('\n')?;
        let value = |name: &str| {
            line.split_whitespace()
                .find_map(|field| field.strip_prefix(name))
                .and_then(|hex| u64::from_str_radix(hex.trim_start_matches("0x"), 16).ok())
        };
        Some(Self {
            regs: UserRegs {
                ip: value("ip=")?,
                sp: value("sp=")?,
                bp: value("bp=")?,
            },
            stack,
            maps,
        })
    }

    /// A sample of `agent_fixtures::CHAIN_INLINE` (built without frame
    /// pointers) spinning in its chain of calls.
    pub fn chain_inline() -> Self {
        Self::parse(
            agent_fixtures::CHAIN_INLINE_REGS,
            agent_fixtures::CHAIN_INLINE_STACK,
        )
        .expect("the chain_inline capture parses")
    }
}

/// A captured process's code: the fixture object has CFI, its other
/// mappings (libc, the loader) are code without.
pub struct FixtureCode {
    maps: Vec<ExecMapping>,
    /// The fixture's file name as the maps show it.
    name: String,
    layout: ElfLayout,
    source: CfiSource<&'static [u8]>,
    context: CfiContext,
}

impl FixtureCode {
    /// `object` mapped as a file named `name` in `maps`.
    pub fn new(object: &'static [u8], name: &str, maps: &str) -> Option<Self> {
        Some(Self {
            maps: parse_maps(maps).ok()?,
            name: format!("/{name}"),
            layout: elf::read_layout(object).ok()?,
            source: CfiSource::new(object).ok()?,
            context: CfiContext::new(),
        })
    }

    /// The process [`Capture::chain_inline`] was taken of.
    pub fn chain_inline() -> Option<Self> {
        let capture = Capture::chain_inline();
        Self::new(agent_fixtures::CHAIN_INLINE, "chain_inline", capture.maps)
    }

    /// Whether any executable mapping holds `address`.
    pub fn is_mapped(&self, address: u64) -> bool {
        self.maps.iter().any(|m| m.contains(address))
    }

    /// The link-time address in the fixture object of a runtime address.
    pub fn vaddr(&self, address: u64) -> Option<u64> {
        let map = self.maps.iter().find(|m| m.contains(address))?;
        if !map.path.ends_with(&self.name) {
            return None;
        }
        self.layout.vaddr_for_file_offset(map.file_offset(address))
    }
}

impl CodeLookup for FixtureCode {
    fn code(&mut self, address: u64) -> Code {
        if let Some(vaddr) = self.vaddr(address) {
            return self
                .source
                .row(vaddr, &mut self.context)
                .map_or(Code::NoCfi, |row| Code::Row { row, system: false });
        }
        if self.is_mapped(address) {
            Code::NoCfi
        } else {
            Code::Unmapped
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chain_inline_capture_loads() {
        let capture = Capture::chain_inline();
        let code = FixtureCode::chain_inline().expect("the fixture parses");
        assert!(code.vaddr(capture.regs.ip).is_some());
        assert!(!capture.stack.is_empty());
    }
}
