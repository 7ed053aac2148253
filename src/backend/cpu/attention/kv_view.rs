//! Where the attention finds a sequence's keys and values: [`KvView`] over contiguous or
//! paged storage, the rows and groups of 8 the kernels walk, and the prefetches that bring
//! a decoder step's keys and values from memory ahead of use.

/// Keys or values at a fixed stride: row `j`, head `h` is `data[j * stride + offset + h * head_dim ..]`.
#[derive(Clone, Copy)]
pub(super) struct Rows<'a> {
    data: &'a [f32],
    stride: usize,
    offset: usize,
}

impl<'a> Rows<'a> {
    #[inline(always)]
    pub(super) fn head(&self, j: usize, h: usize, head_dim: usize) -> &'a [f32] {
        let start = j * self.stride + self.offset + h * head_dim;
        &self.data[start..start + head_dim]
    }
}

/// Keys or values `b..b + 8` of a [`KvView`] (`b` a multiple of 8), as two halves of 4
/// rows, each within one block.
#[derive(Clone, Copy)]
pub(super) struct Eight<'a> {
    halves: [Rows<'a>; 2],
}

impl<'a> Eight<'a> {
    /// Row `b + i` (`i < 8`), head `h`.
    #[inline(always)]
    pub(super) fn head(&self, i: usize, h: usize, head_dim: usize) -> &'a [f32] {
        self.halves[i / 4].head(i % 4, h, head_dim)
    }
}

/// How far ahead a decoder step's single query asks for keys (measured: 1 to 8 alike).
pub(super) const KEYS_AHEAD: usize = 2;

/// How many rows of keys and values of `width` floats each [`prefetch_rows`] asks for, and
/// how far ahead of the key it scores a decoder step asks for the later ones: 256 KiB (64
/// rows of 8 heads of 64), within the L2 of any core this runs on.
pub(super) fn rows_ahead(width: usize) -> usize {
    ((256 << 10) / (8 * width.max(1))).max(4)
}

/// Asks for the first keys and values of a row's attention to be fetched into L2. The
/// decoder calls it for the next row (or example) before attending the current one: a
/// decoder step finds its keys and values in memory (the weights streamed since the last
/// step evicted them), and asked for a key at a time, their latency was not hidden. Zen 4,
/// zh-en int8, cycles a key of a decoder step's self- and cross-attention (one process
/// alternating the variants, 2026-11-29): greedy 1143 -> 575, beam 4 at AVX2 815 -> 519
/// (its cross-attention, several beams a product, 547 -> 485); tokens/s +3% and +1%. A Zen 5
/// at AVX2 (2026-12-03, alternating, a noisy VM): beam 4 alike (403 vs 404 tokens/s over 6
/// pairs), greedy ahead in each of 4 pairs (1030 vs 956 on average). On an
/// Intel Xeon with AMX (family 6 model 167) at AVX2 the burst costs instead (2026-12-03,
/// alternating, 150 verses, 3 rounds): greedy 695 vs 704 tokens/s without, beam 4 263 vs
/// 269 (bursts of 4 to 16 rows, or asking 4 to 16 keys ahead in the loop, no better than
/// none). So the burst is skipped on Intel's cores; `TOLK_ATTENTION_PREFETCH=1` / `=0`
/// turns it on or off anywhere, to measure a new core.
pub fn prefetch_rows(keys: &KvView, values: &KvView, len: usize, width: usize) {
    if !prefetch_pays_off() {
        return;
    }
    for j in 0..len.min(rows_ahead(width)) {
        keys.prefetch(j, len, width, Cache::L2);
        values.prefetch(j, len, width, Cache::L2);
    }
}

/// Whether [`prefetch_rows`] asks for anything on this CPU (see there).
fn prefetch_pays_off() -> bool {
    crate::backend::cpu::tuning::Switch::AttentionPrefetch.is_on()
}

/// Where [`KvView::prefetch`] brings a row.
#[derive(Clone, Copy)]
pub(super) enum Cache {
    L1,
    L2,
}

/// Keys or values of one sequence, stored in blocks of `2^shift` rows: row `j` is row
/// `j & (2^shift - 1)` of `blocks[j >> shift]`, at `stride` and `offset`. A contiguous
/// sequence is one block ([`KvView::contiguous`]); the decoder's paged cache hands a row's
/// blocks ([`KvView::paged`]). The kernels walk the keys block by block, or in aligned
/// groups of 8 ([`Eight`]) where they take 8 at once, and read every key and value in the
/// same order wherever it is stored: the layout changes no result.
#[derive(Clone, Copy)]
pub struct KvView<'a> {
    blocks: &'a [&'a [f32]],
    shift: u32,
    stride: usize,
    offset: usize,
}

impl<'a> KvView<'a> {
    /// Row `j` at `data[j * stride + offset ..]`.
    pub fn contiguous(data: &'a &'a [f32], stride: usize, offset: usize) -> KvView<'a> {
        // One block no row index reaches the end of: `j >> shift` is always 0.
        KvView { blocks: std::slice::from_ref(data), shift: usize::BITS - 1, stride, offset }
    }

    /// Row `j` in `blocks[j >> shift]`, at `(j & (2^shift - 1)) * stride + offset`. Blocks
    /// hold at least 4 rows, so that each half of a group of 8 lies in one.
    pub fn paged(blocks: &'a [&'a [f32]], shift: u32, stride: usize, offset: usize) -> KvView<'a> {
        assert!((2..usize::BITS).contains(&shift), "blocks of at least 4 rows");
        KvView { blocks, shift, stride, offset }
    }

    /// The rows from row `j` to the end of its block (none past the stored rows).
    #[inline(always)]
    pub(super) fn rows_from(&self, j: usize) -> Rows<'a> {
        let within = j & ((1 << self.shift) - 1);
        let data = self.blocks.get(j >> self.shift).and_then(|b| b.get(within * self.stride..)).unwrap_or(&[]);
        Rows { data, stride: self.stride, offset: self.offset }
    }

    /// Asks for the `width` floats of row `j` (all heads; nothing when `j >= len`) to be
    /// fetched into `cache`.
    #[inline(always)]
    pub(super) fn prefetch(&self, j: usize, len: usize, width: usize, cache: Cache) {
        #[cfg(target_arch = "x86_64")]
        if j < len && width > 0 {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0, _MM_HINT_T1};
            let rows = self.rows_from(j);
            let Some(row) = rows.data.get(rows.offset..rows.offset + width) else { return };
            // Every cache line the row touches, walked by address (an iterator over its
            // floats, `step_by(16).chain(..)`, cost nine instructions a line).
            let (first, last) = (row.as_ptr() as usize & !63, (row.as_ptr() as usize + 4 * width - 1) & !63);
            let mut line = first;
            while line <= last {
                // SAFETY: a prefetch is a hint that never faults (each line holds part of `row`).
                unsafe {
                    match cache {
                        Cache::L1 => _mm_prefetch::<_MM_HINT_T0>(line as *const i8),
                        Cache::L2 => _mm_prefetch::<_MM_HINT_T1>(line as *const i8),
                    }
                }
                line += 64;
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (j, len, width, cache);
    }

    /// Rows `b..b + 8` (`b` a multiple of 8).
    #[inline(always)]
    pub(super) fn eight(&self, b: usize) -> Eight<'a> {
        Eight { halves: [self.rows_from(b), self.rows_from(b + 4)] }
    }

    /// Rows `0..len` block by block: (first row, rows in the block, the block's rows).
    #[inline(always)]
    pub(super) fn blocks(&self, len: usize) -> impl Iterator<Item = (usize, usize, Rows<'a>)> + '_ {
        let size = 1usize << self.shift;
        (0..len).step_by(size).map(move |first| (first, size.min(len - first), self.rows_from(first)))
    }

    /// Rows `0..len` in groups of 8: (first row, rows in the group, the group).
    #[inline(always)]
    pub(super) fn groups(&self, len: usize) -> impl Iterator<Item = (usize, usize, Eight<'a>)> + '_ {
        (0..len).step_by(8).map(move |b| (b, 8.min(len - b), self.eight(b)))
    }

    /// Row `j`, head `h`: for tests; the kernels go by groups.
    #[cfg(test)]
    pub(crate) fn head(&self, j: usize, h: usize, head_dim: usize) -> &'a [f32] {
        self.rows_from(j).head(0, h, head_dim)
    }
}
