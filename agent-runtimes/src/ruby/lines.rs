//! An instruction sequence's line table: which `insns_info` entry (and so
//! which line) an instruction position belongs to, looked up as CRuby's
//! `get_insn_info` does (`iseq.c`): the last entry starting at or before
//! the position, found through the entries' positions (a sorted u32
//! array) or, once CRuby compacted them, through its succinct bit vector.

/// `IMMEDIATE_TABLE_SIZE`: positions below it have their rank stored in
/// `imm_part` words, nine 7-bit ranks each.
const IMMEDIATE_POSITIONS: u64 = 54;
/// Ranks in one `imm_part` word.
const RANKS_PER_WORD: u64 = 9;
/// Bytes of `imm_part` when the table has a `succ_part`.
const IMMEDIATE_BYTES: u64 = IMMEDIATE_POSITIONS / RANKS_PER_WORD * 8;
/// Positions one `struct succ_dict_block` covers, and its size: `rank`
/// (u32, padded), `small_block_ranks` (7 ranks of 9 bits), `bits[8]`.
const BLOCK_POSITIONS: u64 = 512;
const BLOCK_BYTES: u64 = 80;

/// Bytes of the `struct succ_index_table` CRuby builds for an instruction
/// sequence of `iseq_size` VALUEs (`succ_index_table_create` with
/// `max_pos = iseq_size`: only the `imm_part` words needed when short).
pub(crate) fn succinct_table_bytes(iseq_size: u64) -> u64 {
    if iseq_size < IMMEDIATE_POSITIONS {
        iseq_size.div_ceil(RANKS_PER_WORD) * 8
    } else {
        let blocks = (iseq_size - IMMEDIATE_POSITIONS).div_ceil(BLOCK_POSITIONS);
        IMMEDIATE_BYTES + blocks * BLOCK_BYTES
    }
}

fn word(table: &[u8], at: u64) -> Option<u64> {
    let at = usize::try_from(at).ok()?;
    let bytes = table.get(at..at.checked_add(8)?)?;
    Some(u64::from_le_bytes(bytes.try_into().ok()?))
}

/// `succ_index_lookup(table, position)`: how many entries start at or
/// before `position`. `None` if `table` is too short for it.
pub(crate) fn succinct_rank(table: &[u8], position: u64) -> Option<u64> {
    if position < IMMEDIATE_POSITIONS {
        let word = word(table, position / RANKS_PER_WORD * 8)?;
        return Some((word >> ((position % RANKS_PER_WORD) * 7)) & 0x7f);
    }
    let position = position - IMMEDIATE_POSITIONS;
    let block = IMMEDIATE_BYTES + position / BLOCK_POSITIONS * BLOCK_BYTES;
    let index = position % BLOCK_POSITIONS;
    let small = index / 64;
    let rank = word(table, block)? & 0xffff_ffff;
    let small_rank = match small {
        0 => 0,
        _ => (word(table, block + 8)? >> ((small - 1) * 9)) & 0x1ff,
    };
    let bits = word(table, block + 16 + small * 8)? << (63 - index % 64);
    Some(rank + small_rank + u64::from(bits.count_ones()))
}

/// How the entry of a position is found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum EntryIndex {
    /// One entry (or none): it covers every position.
    Single,
    /// The entries' start positions, sorted.
    Positions(Vec<u32>),
    /// The bytes of the succinct bit vector.
    Succinct(Vec<u8>),
}

/// The lines of an instruction sequence's entries, and how to find the
/// entry of a position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LineTable {
    pub lines: Vec<u32>,
    pub index: EntryIndex,
}

impl LineTable {
    /// The line of the instruction at `position` (in VALUEs from the
    /// start), `None` if the table does not say (no entries, a table too
    /// short or inconsistent: read from a process that changed it).
    pub(crate) fn line(&self, position: u64) -> Option<u32> {
        let entries = self.lines.len();
        let entry = match &self.index {
            EntryIndex::Single => 0,
            // `get_insn_info_binary_search`: the last entry starting at
            // or before the position (the first one always does).
            EntryIndex::Positions(starts) => {
                let after = starts[..entries.min(starts.len())]
                    .partition_point(|&start| u64::from(start) <= position);
                after.saturating_sub(1)
            }
            EntryIndex::Succinct(table) => {
                let rank = succinct_rank(table, position)?;
                usize::try_from(rank.checked_sub(1)?).ok()?
            }
        };
        self.lines.get(entry).copied()
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.lines.len() * 4
            + match &self.index {
                EntryIndex::Single => 0,
                EntryIndex::Positions(starts) => starts.len() * 4,
                EntryIndex::Succinct(table) => table.len(),
            }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// `succ_index_table_create(max_pos, positions, size)` of `iseq.c`,
    /// as the bytes of the struct.
    pub(crate) fn build_succinct(max_pos: u64, positions: &[u32]) -> Vec<u8> {
        let mut bytes = vec![0u8; succinct_table_bytes(max_pos) as usize];
        let imm_words = if max_pos < IMMEDIATE_POSITIONS {
            max_pos.div_ceil(9)
        } else {
            IMMEDIATE_POSITIONS / 9
        };
        let blocks = if max_pos < IMMEDIATE_POSITIONS {
            0
        } else {
            (max_pos - IMMEDIATE_POSITIONS).div_ceil(512)
        };
        let mut put = |at: u64, value: u64| {
            let at = at as usize;
            bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
        };
        let mut rank = 0usize;
        for j in 0..imm_words {
            let mut word = 0u64;
            for i in 0..9 {
                if rank < positions.len() && u64::from(positions[rank]) == j * 9 + i {
                    rank += 1;
                }
                word |= (rank as u64) << (7 * i);
            }
            put(j * 8, word);
        }
        for k in 0..blocks {
            let block = IMMEDIATE_BYTES + k * BLOCK_BYTES;
            let (mut small_ranks, mut small_rank) = (0u64, 0u64);
            put(block, rank as u64);
            for j in 0..8 {
                if j > 0 {
                    small_ranks |= small_rank << (9 * (j - 1));
                }
                let mut bits = 0u64;
                for i in 0..64 {
                    let at = k * 512 + j * 64 + i + IMMEDIATE_POSITIONS;
                    if rank < positions.len() && u64::from(positions[rank]) == at {
                        bits |= 1 << i;
                        rank += 1;
                    }
                }
                put(block + 16 + j * 8, bits);
                small_rank += u64::from(bits.count_ones());
            }
            put(block + 8, small_ranks);
        }
        bytes
    }

    /// Positions spread over `size` VALUEs, from a seed: a few close
    /// together, then gaps, like instructions of one to six VALUEs.
    fn positions(size: u64, seed: u64) -> Vec<u32> {
        let mut state = seed | 1;
        let mut at = 0u64;
        let mut out = Vec::new();
        while at < size {
            out.push(at as u32);
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            at += 1 + state % 7;
        }
        out
    }

    #[test]
    fn the_succinct_rank_is_the_count_of_positions_up_to_it() {
        for size in [1, 8, 9, 10, 53, 54, 55, 120, 565, 566, 567, 1500, 5000] {
            for seed in [1, 7, 99] {
                let starts = positions(size, seed);
                let table = build_succinct(size, &starts);
                assert_eq!(table.len() as u64, succinct_table_bytes(size));
                for position in 0..size {
                    let brute = starts
                        .iter()
                        .filter(|&&start| u64::from(start) <= position)
                        .count() as u64;
                    assert_eq!(
                        succinct_rank(&table, position),
                        Some(brute),
                        "size {size} seed {seed} position {position}"
                    );
                }
            }
        }
    }

    #[test]
    fn every_position_is_set_once_in_a_full_table() {
        // Every position an entry start: the rank is the position plus one
        // (block ranks up to 566, small ranks up to 448).
        let size = 2000;
        let starts: Vec<u32> = (0..size).collect();
        let table = build_succinct(u64::from(size), &starts);
        for position in 0..u64::from(size) {
            assert_eq!(succinct_rank(&table, position), Some(position + 1));
        }
    }

    #[test]
    fn short_tables_answer_nothing_past_their_end() {
        let table = build_succinct(600, &[0, 3, 70, 590]);
        assert_eq!(succinct_rank(&table, 599), Some(4));
        assert_eq!(succinct_rank(&table[..100], 599), None);
        assert_eq!(succinct_rank(&table[..20], 30), None);
        assert_eq!(succinct_rank(&[], 0), None);
        assert_eq!(succinct_rank(&table, u64::MAX), None);
    }

    #[test]
    fn lines_by_position() {
        let starts = vec![0, 2, 8, 60, 700];
        let lines = vec![10, 11, 12, 13, 14];
        let expected = |position: u64| match position {
            0..=1 => 10,
            2..=7 => 11,
            8..=59 => 12,
            60..=699 => 13,
            _ => 14,
        };
        let by_positions = LineTable {
            lines: lines.clone(),
            index: EntryIndex::Positions(starts.clone()),
        };
        let by_bits = LineTable {
            lines: lines.clone(),
            index: EntryIndex::Succinct(build_succinct(800, &starts)),
        };
        for position in 0..800 {
            assert_eq!(by_positions.line(position), Some(expected(position)));
            assert_eq!(by_bits.line(position), Some(expected(position)));
        }
        let single = LineTable {
            lines: vec![5],
            index: EntryIndex::Single,
        };
        assert_eq!(single.line(1000), Some(5));
        let empty = LineTable {
            lines: Vec::new(),
            index: EntryIndex::Single,
        };
        assert_eq!(empty.line(0), None);
        // A rank of 0 (a table claiming no entry up to there) is no line.
        let zero = LineTable {
            lines,
            index: EntryIndex::Succinct(vec![0; 48]),
        };
        assert_eq!(zero.line(3), None);
    }
}
