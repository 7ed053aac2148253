//! The decoder's self-attention cache, paged: each row's history (one beam hypothesis) is a
//! list of fixed-size blocks of positions, and the rows that continue one hypothesis share
//! the blocks of their common prefix. Reordering beams copies block lists, not keys and
//! values; a row appending into a block another row also holds copies that one block first
//! (copy on write); blocks no row holds any more go to a free list, so a decoding that has
//! reached its largest size allocates nothing. Positions are kept as the decoding's
//! [`KvCacheType`] asks (`kv_storage`): float32 as the projection writes them, or compact.
use std::sync::Arc;

use super::attention::KvView;
use super::kv_storage::KvCodec;
use crate::backend::KvCacheType;

/// Positions per block, as a power of two (`j >> SHIFT` finds position `j`'s block). Small
/// blocks share more: beams that part within a block hold a copy of it each, and every
/// row's last block is its own, partly filled. On the zh-en model, beam 4 over the 32
/// longest verses at once peaks at 61 MB of blocks of 4, against 76 MB with blocks of 8,
/// 112 MB of 16, and 51 MB if every position were shared on its own; 4 positions of
/// a 512-wide model are 16 KB. The attention kernels need at least 4 (`KvView::paged`).
const SHIFT: u32 = 2;
const BLOCK: usize = 1 << SHIFT;

/// `BLOCK` positions of one layer, each `[key | value]` (`2 * d` floats, as the fused
/// projection writes them, or stored compactly in fewer). Shared by the rows whose
/// histories contain it.
type Block = Arc<[f32]>;

/// One row's history: its blocks in order, the last one filled up to `len % BLOCK`.
#[derive(Default)]
struct History {
    blocks: Vec<Block>,
    len: usize,
}

/// Self-attention keys and values of one decoder layer, per row.
#[derive(Default)]
pub struct CpuKvCache {
    rows: Vec<History>,
    /// Blocks no row holds (each the only reference to its memory), reused before any new
    /// one is allocated.
    free: Vec<Block>,
    /// How positions are stored.
    kv: KvCacheType,
    /// Floats a stored position takes (`2 * d` in float32), known from the first step.
    width: usize,
    /// Values per position (`2 * d`) and how they are stored, known from the first step.
    values: usize,
    codec: Option<KvCodec>,
}

impl CpuKvCache {
    pub fn new(rows: usize, kv: KvCacheType) -> CpuKvCache {
        CpuKvCache { rows: (0..rows).map(|_| History::default()).collect(), kv, ..CpuKvCache::default() }
    }

    /// Whether positions are kept as float32 (the attention kernels read the blocks then).
    pub fn is_float32(&self) -> bool {
        self.kv == KvCacheType::Float32
    }

    pub fn num_rows(&self) -> usize {
        self.rows.len()
    }

    /// Appends one position (`[key | value]`, int8 scaled per `head_dim` values) to row `r`.
    pub fn append(&mut self, r: usize, kv: &[f32], head_dim: usize) {
        if self.codec.is_none() {
            let codec = KvCodec::new(self.kv, head_dim);
            (self.codec, self.values, self.width) = (Some(codec), kv.len(), codec.slots(kv.len()));
        }
        debug_assert_eq!(kv.len(), self.values, "one cache holds one layer's width");
        let codec = self.codec.expect("set above");
        let width = self.width;
        let CpuKvCache { rows, free, .. } = self;
        let row = &mut rows[r];
        let at = row.len % BLOCK;
        if at == 0 {
            row.blocks.push(take_block(free, width));
        }
        let last = row.blocks.last_mut().expect("a block holds position len");
        if Arc::get_mut(last).is_none() {
            // Shared with a row that continues the same hypothesis: this row's own copy of
            // the positions so far, the other rows keep the original.
            let mut copy = take_block(free, width);
            unique(&mut copy)[..at * width].copy_from_slice(&last[..at * width]);
            *last = copy;
        }
        codec.encode(kv, &mut unique(last)[at * width..(at + 1) * width]);
        row.len += 1;
    }

    /// Appends the rows of `other` after this cache's rows (with their own histories), and
    /// takes over its free blocks.
    pub fn append_rows(&mut self, other: CpuKvCache) {
        debug_assert_eq!(self.kv, other.kv, "one decoding stores its keys/values one way");
        if self.codec.is_none() {
            (self.codec, self.values, self.width) = (other.codec, other.values, other.width);
        }
        debug_assert!(other.width == 0 || other.width == self.width, "one cache holds one layer's width");
        self.rows.extend(other.rows);
        if other.width == self.width {
            self.free.extend(other.free);
        }
    }

    /// Frees the blocks kept for reuse.
    pub fn shrink(&mut self) {
        self.free = Vec::new();
    }

    /// Row `r`'s positions so far.
    pub fn len(&self, r: usize) -> usize {
        self.rows[r].len
    }

    /// Row `r`'s blocks, as the slices [`CpuKvCache::keys`] and [`CpuKvCache::values`] read.
    pub fn blocks<'a>(&'a self, r: usize, out: &mut Vec<&'a [f32]>) {
        out.clear();
        out.extend(self.rows[r].blocks.iter().map(|b| &b[..]));
    }

    /// The keys in `blocks` (from [`CpuKvCache::blocks`]).
    pub fn keys<'a>(&self, blocks: &'a [&'a [f32]]) -> KvView<'a> {
        KvView::paged(blocks, SHIFT, self.width, 0)
    }

    /// The values in `blocks` (from [`CpuKvCache::blocks`]).
    pub fn values<'a>(&self, blocks: &'a [&'a [f32]]) -> KvView<'a> {
        KvView::paged(blocks, SHIFT, self.width, self.width / 2)
    }

    /// Row `r`'s positions widened to float32 into `out` (`[len, 2 * d]`, `[key | value]`
    /// rows), for caches that store them compactly.
    pub fn widen(&self, r: usize, out: &mut Vec<f32>) {
        let (row, values) = (&self.rows[r], self.values);
        let Some(codec) = self.codec else {
            out.clear();
            return;
        };
        // Every float is written: no zeroing of what the buffer already holds.
        out.resize(out.len().max(row.len * values), 0.0);
        out.truncate(row.len * values);
        for (block, wide) in row.blocks.iter().zip(out.chunks_mut(BLOCK * values)) {
            codec.decode_into(block, wide.len() / values.max(1), values, wide);
        }
    }

    /// Keeps rows `sources[i]` as row `i`: block lists are copied (the blocks are then
    /// shared); a source row used once is moved. The lists of rows nobody continues are
    /// reused for the copies, and their blocks no other row holds are recycled.
    pub fn reorder(&mut self, sources: &[usize]) {
        let mut uses = vec![0usize; self.rows.len()];
        sources.iter().for_each(|&s| uses[s] += 1);
        let mut old = std::mem::take(&mut self.rows);
        let mut spare = Vec::new();
        for (row, _) in old.iter_mut().zip(&uses).filter(|(_, &u)| u == 0) {
            for block in row.blocks.drain(..) {
                // A block only this row held is recycled; one other rows hold stays theirs.
                if Arc::strong_count(&block) == 1 {
                    self.free.push(block);
                }
            }
            spare.push(std::mem::take(row));
        }
        self.rows = sources
            .iter()
            .map(|&s| {
                uses[s] -= 1;
                if uses[s] == 0 {
                    return std::mem::take(&mut old[s]);
                }
                let mut copy = spare.pop().unwrap_or_default();
                copy.blocks.clear();
                copy.blocks.extend(old[s].blocks.iter().cloned());
                copy.len = old[s].len;
                copy
            })
            .collect();
    }

    /// Distinct blocks the rows hold, for tests.
    #[cfg(test)]
    fn held(&self) -> usize {
        let mut seen: Vec<*const f32> = self.rows.iter().flat_map(|r| r.blocks.iter().map(|b| b.as_ptr())).collect();
        seen.sort();
        seen.dedup();
        seen.len()
    }

    /// Blocks allocated (held by rows, or free), for tests.
    #[cfg(test)]
    fn allocated(&self) -> usize {
        self.held() + self.free.len()
    }
}

/// A free block, or a new one of `BLOCK` positions of `width` floats.
fn take_block(free: &mut Vec<Block>, width: usize) -> Block {
    free.pop().unwrap_or_else(|| std::iter::repeat_n(0.0, BLOCK * width).collect())
}

/// The contents of a block no other row holds.
fn unique(block: &mut Block) -> &mut [f32] {
    Arc::get_mut(block).expect("free and copied blocks have one holder")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Position `p` of a hypothesis `id`: distinct values per hypothesis and position.
    fn position(id: usize, p: usize, width: usize) -> Vec<f32> {
        (0..width).map(|c| (id * 1000 + p * 10 + c) as f32).collect()
    }

    /// Every row's keys and values against plain per-row histories.
    fn check(cache: &CpuKvCache, expected: &[Vec<Vec<f32>>]) {
        let width = cache.width;
        let mut wide = Vec::new();
        let mut blocks = Vec::new();
        for (r, history) in expected.iter().enumerate() {
            assert_eq!(cache.len(r), history.len());
            cache.blocks(r, &mut blocks);
            let (keys, values) = (cache.keys(&blocks), cache.values(&blocks));
            for (p, kv) in history.iter().enumerate() {
                assert_eq!(keys.head(p, 0, width / 2), &kv[..width / 2], "row {r} key {p}");
                assert_eq!(values.head(p, 1, width / 4), &kv[3 * width / 4..], "row {r} value {p}");
            }
            cache.widen(r, &mut wide);
            assert_eq!(wide, history.concat(), "row {r} widened");
        }
    }

    #[test]
    fn beams_share_prefixes_and_copy_only_on_write() {
        let width = 8;
        let mut cache = CpuKvCache::new(2, KvCacheType::Float32);
        let mut expected: Vec<Vec<Vec<f32>>> = vec![Vec::new(); 2];
        let mut fresh = 0;
        for step in 0..3 * BLOCK + 3 {
            for (r, history) in expected.iter_mut().enumerate() {
                let kv = position(fresh + r, step, width);
                cache.append(r, &kv, 2);
                history.push(kv);
            }
            fresh += 2;
            check(&cache, &expected);
            // Beam-like reorders: duplicate a row, drop a row, swap, keep, shrink and grow.
            let sources: &[usize] = match step % 4 {
                0 => &[0, 0],
                1 => &[1, 0],
                2 => &[1, 1],
                _ => &[0, 1],
            };
            cache.reorder(sources);
            expected = sources.iter().map(|&s| expected[s].clone()).collect();
            check(&cache, &expected);
        }
        cache.reorder(&[1]);
        cache.reorder(&[0, 0, 0, 0]);
        expected = vec![expected[1].clone(); 4];
        check(&cache, &expected);
        let before = cache.held();
        for (r, history) in expected.iter_mut().enumerate() {
            let kv = position(fresh + r, 0, width);
            cache.append(r, &kv, 2);
            history.push(kv);
        }
        check(&cache, &expected);
        // Three copies of the shared, partly written last block; the fourth row writes into it.
        assert_eq!(cache.held(), before + 3);
    }

    #[test]
    fn compact_positions_widen_to_what_was_stored() {
        let (width, head_dim) = (16, 4);
        for kv in [KvCacheType::BFloat16, KvCacheType::Int8] {
            let codec = KvCodec::new(kv, head_dim);
            let mut cache = CpuKvCache::new(2, kv);
            let mut expected: Vec<Vec<f32>> = vec![Vec::new(); 2];
            let mut wide = Vec::new();
            for step in 0..2 * BLOCK + 1 {
                for (r, history) in expected.iter_mut().enumerate() {
                    let x: Vec<f32> = position(r, step, width).iter().map(|v| v.sin() * 3.0).collect();
                    cache.append(r, &x, head_dim);
                    let mut stored = vec![0.0; codec.slots(width)];
                    codec.encode(&x, &mut stored);
                    let mut back = Vec::new();
                    codec.decode_rows(&stored, 1, width, &mut back);
                    assert_ne!(back, x, "{kv:?} rounds");
                    history.extend(back);
                }
                let sources: &[usize] = if step % 2 == 0 { &[1, 1] } else { &[0, 1] };
                cache.reorder(sources);
                expected = sources.iter().map(|&s| expected[s].clone()).collect();
                for (r, history) in expected.iter().enumerate() {
                    cache.widen(r, &mut wide);
                    assert_eq!(&wide, history, "{kv:?} row {r} at step {step}");
                }
            }
            // A quarter (int8: plus a scale per head) or half of float32's blocks.
            assert_eq!(cache.width, codec.slots(width));
        }
    }

    #[test]
    fn recycled_blocks_keep_the_allocation_steady() {
        let width = 4;
        let mut cache = CpuKvCache::new(4, KvCacheType::Float32);
        for step in 0..30 * BLOCK {
            for r in 0..4 {
                cache.append(r, &position(r, step, width), 2);
            }
            // Each step the first row's hypothesis takes over every row.
            cache.reorder(&[0, 0, 0, 0]);
        }
        // One shared history of 30 blocks, plus the few recycled ones each step's copies
        // and fresh blocks take.
        assert_eq!(cache.held(), 30);
        assert!(cache.allocated() <= 30 + 4, "{} blocks", cache.allocated());
        cache.reorder(&[]);
        assert_eq!(cache.num_rows(), 0);
        assert_eq!(cache.rows.len(), 0);
        assert_eq!(cache.free.len(), cache.allocated());
    }
}
