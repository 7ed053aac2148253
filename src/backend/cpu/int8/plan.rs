//! The planned int8 product without VNNI (the AVX2 and AVX-512BW kernels), exact.
//!
//! `vpmaddubsw` multiplies u8 by s8 and saturates each pair sum to int16. The sign trick
//! (`|x|` times `vpsignb(w, x)`) is exact for any operands but costs a sign instruction per
//! multiply and a `vpmaddwd` per 32 products, three instructions on the multiply pipes.
//! Read as u8 `w + 128` instead (as the panels store them) against signed `x`, a run of
//! products summed in int16 is `Σ w x + 128 Σ x`, at most `127 Σ|x| + 128 |Σ x|` in
//! magnitude: exact whenever `Σ|x| + |Σ x| <= 256`, for each pair `vpmaddubsw` sums and for
//! each int16 lane's whole run (`vpaddw` wraps, so only the final sum has to fit).
//! Activations are quantized per row to a maximum of 127 and most of them are small, with
//! mixed signs.
//!
//! So each product first plans, per unit of rows (a pair, or a group's odd last row), which
//! kernel takes each k step: `hexadecets` (16 k: four `vpmaddubsw` summed in int16, one
//! `vpmaddwd`; pairs of rows only),
//! `octets` (8 k: two and one), `quads` (4 k: one of each) or `exact` (4 k through the sign
//! trick; `hexadecets_pay_off` says why the 256-bit kernel takes octets at most by default).
//! On the zh-en model about 70% of the products fit hexadecets and 1% take the sign
//! trick. Integer sums are exact in any order, so the result is the reference's bit for
//! bit; the shift adds `128 Σ x` over the shifted steps, which the unit subtracts before
//! the epilogue. (Octets cost 1.5 multiply instructions per 32 products, against 3 for the
//! sign trick; hexadecets 1.25. A single row stays on octets: hexadecets there read the
//! panel in two passes and lost 30% at m = 1, where the weights' bandwidth bounds it.)

use super::MR;
use crate::backend::cpu::isa::Isa;
use crate::backend::cpu::tuning::Switch;
use std::arch::x86_64::*;

/// Calls `$body` with `$i` bound to each set bit of the mask words `$words`, ascending.
macro_rules! for_each_bit {
    ($words:expr, |$i:ident| $body:block) => {
        for (wi, &word) in $words.iter().enumerate() {
            let mut bits = word;
            while bits != 0 {
                let $i = wi * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                $body
            }
        }
    };
}

/// The largest `Σ|x| + |Σ x|` of a run of products one int16 lane may sum (see the module
/// doc): `127 a + 128 s <= 32767` holds for `a + s <= 256`, as `s <= a`.
const LANE_BUDGET: i16 = 256;
/// Units of rows per interleaved group of `MR` rows.
const UNITS: usize = MR / 2;

/// Whether the kernel of `isa` takes hexadecets. The 512-bit kernel always does (32
/// registers hold a pair of rows' hexadecets over a whole panel). The 256-bit one needs 17
/// registers of 16 for them and spills, and with today's kernel (step lists, prefetcher,
/// weights in huge pages) octets alone are faster on every core it was measured on: an
/// AVX2-only AMD EPYC (Zen 3, 2026-11-27: gemm_bench int8 GOP/s 32x65000x512 119 vs 102,
/// 128x512x2048 149 vs 140; zh-en int8 beam 4 5-10% faster end to end), a Skylake-SP
/// forced to AVX2 (2026-11-28: int8 beam 4 132-134 vs 128 tokens/s), a Zen 4 forced to
/// AVX2 (2026-11-29: 32x65000x512 191-200 vs 169-173; greedy 858-886 vs 802-819 tokens/s)
/// and a Zen 5 (AMD family 1Ah) forced to AVX2 (2026-12-01, alternating pairs: gemm_bench
/// 32x65000x512 241-252 vs 214-224, 128x65000x512 263-281 vs 222-245, 128x512x2048
/// 235-280 vs 222-236; zh-en int8 greedy 1167-1196 vs 1039-1059 tokens/s, beam 4 375-434
/// vs 363-379). Only Sapphire Rapids and an earlier Zen 5 favoured hexadecets, measured
/// with the older kernel (2026-11-21/25). So the 256-bit kernel takes octets by default;
/// `TOLK_INT8_HEXADECETS=1` turns hexadecets on (`=0` off), to measure a new core
/// (`tuning::Switch::Int8Hexadecets`).
/// (The spill is not what holds them back on Zen 3: written in assembly within the 16
/// registers, a pair's hexadecets ran at 181 GOP/s against octets' 150 in a loop over L1
/// with every step planned alike, yet a whole tile with a real plan, 83% hexadecets, ran
/// no faster than octets alone, and larger products ran slower; 2026-11-27. On the Zen 5,
/// hexadecets rewritten to need 14 registers and no spill were slower still than octets on
/// every shape: bench/RESULTS.md, 2026-12-01. On the Xeon with AMX held to AVX2, a
/// one-pass rewrite over all 32 columns with the broadcasts reloaded where used, 15
/// registers and no spill, was no faster either in whole products or in translation
/// (hexadecets are 14% faster than octets in registers there); bench/RESULTS.md, 2026-12-07.)
pub(super) fn hexadecets_pay_off(isa: Isa) -> bool {
    match isa {
        Isa::Avx2 => Switch::Int8Hexadecets.is_on(),
        _ => true,
    }
}

/// The kernels of a plan, by the k steps one takes: mask `Kind as usize` of a unit.
#[derive(Clone, Copy)]
pub(super) enum Kind {
    Hexadecets,
    Octets,
    Quads,
    Exact,
}

/// Where each kind's mask starts in a unit's words, and the unit's size.
#[derive(Clone, Copy, Default)]
struct MaskLayout {
    start: [usize; 4],
    words: usize,
}

impl MaskLayout {
    fn new(kp: usize) -> MaskLayout {
        let sizes = [(kp / 16).div_ceil(64), (kp / 8).div_ceil(64), (kp / 4).div_ceil(64), (kp / 4).div_ceil(64)];
        let mut start = [0; 4];
        for i in 1..4 {
            start[i] = start[i - 1] + sizes[i - 1];
        }
        MaskLayout { start, words: start[3] + sizes[3] }
    }

    /// The words of `kind`'s mask in a unit's words.
    fn range(&self, kind: Kind) -> std::ops::Range<usize> {
        let i = kind as usize;
        self.start[i]..if i == 3 { self.words } else { self.start[i + 1] }
    }
}

/// The plans of one product's rows: per unit, the k steps each kind takes (planned as bit
/// masks, read by the kernels as lists of indices), and per row the compensation `128 Σ x`
/// of its shifted steps.
#[derive(Default)]
pub(super) struct Plans {
    masks: Vec<u64>,
    /// Per unit `kp / 4` slots: its hexadecets' indices, then its octets', quads' and exact
    /// steps' (together at most `kp / 4`), the unit's share of each in `counts`.
    lists: Vec<u16>,
    counts: Vec<[u16; 4]>,
    /// Slots per unit in `lists` (`kp / 4`).
    slots: usize,
    compensation: Vec<i32>,
    layout: MaskLayout,
}

/// Whether a product of depth `kp` (a multiple of 4) can be planned: its step indices and
/// a kind's count of steps (all of them quads, at most) fit a `u16`.
pub(super) fn fits(kp: usize) -> bool {
    kp / 4 <= u16::MAX as usize
}

/// The plan of one group of `MR` rows, as the kernel reads it.
pub(super) struct GroupPlan<'a> {
    lists: &'a [u16],
    counts: &'a [[u16; 4]],
    /// `128 Σ x` of each row's shifted steps, subtracted before the epilogue.
    pub(super) compensation: &'a [i32],
    /// Slots per unit in `lists` (`kp / 4`).
    slots: usize,
}

impl GroupPlan<'_> {
    /// Unit `u`'s steps of each kind as ascending indices (hexadecets, octets, quads, exact).
    /// Inlined into the kernels' units (left a call, it was 0.7% of int8 beam 4 at AVX2).
    #[inline(always)]
    pub(super) fn step_lists(&self, u: usize) -> [&[u16]; 4] {
        let (counts, mut rest) = (self.counts[u], &self.lists[u * self.slots..(u + 1) * self.slots]);
        counts.map(|c| {
            let (list, after) = rest.split_at(c as usize);
            rest = after;
            list
        })
    }
}

impl Plans {
    /// Plans the `m` rows of `x` (interleaved groups of `MR` rows, `[kp/4][MR][4]` bytes
    /// each) for the kernel of `isa`.
    pub(super) fn fill(&mut self, x: &[u8], m: usize, kp: usize, isa: Isa) {
        let hexadecets = hexadecets_pay_off(isa);
        let groups = m.div_ceil(MR);
        self.layout = MaskLayout::new(kp);
        let words = self.layout.words;
        self.masks.clear();
        self.masks.resize(groups * UNITS * words, 0);
        if self.compensation.len() < groups * MR {
            self.compensation.resize(groups * MR, 0);
        }
        let size = kp * MR;
        for g in 0..groups {
            let live = MR.min(m - g * MR);
            let planner = GroupPlanner::new(&x[g * size..(g + 1) * size], live, hexadecets, self.layout);
            let masks = &mut self.masks[g * UNITS * words..(g + 1) * UNITS * words];
            // SAFETY: `Plans` is filled only for the AVX2 kernel, i.e. on a CPU with AVX2
            // (see Companion::of); the group holds `kp / 4` steps of `MR` rows.
            unsafe { planner.plan(kp, masks, &mut self.compensation[g * MR..(g + 1) * MR]) };
        }
        self.fill_lists(groups * UNITS, kp / 4);
    }

    /// The masks as lists of indices, which the kernels walk. A product's plan serves all its
    /// panels (some 2000 for the 65k output layer), so the lists are made once and read many
    /// times. Walked in the masks by runs of set bits (formerly, at AVX2), each run's end was a
    /// branch that hangs on the data: on zh-en a unit's octets come in runs of about 13 steps
    /// between runs of 2-3 quads, and the mispredictions cost more than the walk; a list ends
    /// once per kind. Zen 4 forced to AVX2, int8 beam 4, 150 verses, 4 alternating rounds:
    /// 322-328 -> 328-334 tokens/s; greedy and the AVX-512BW kernel (bit by bit before, which
    /// on Skylake-SP beat runs by 3-6%) unchanged within the noise (2026-11-29).
    fn fill_lists(&mut self, units: usize, slots: usize) {
        assert!(fits(4 * slots), "an int8 product's depth {} exceeds the planned kernels' {}", 4 * slots, 4 * (u16::MAX as usize));
        self.slots = slots;
        self.lists.resize(units * slots, 0);
        self.counts.clear();
        self.counts.resize(units, [0; 4]);
        let words = self.layout.words;
        if slots == 0 {
            return;
        }
        for ((unit, list), counts) in self.masks.chunks_exact(words).zip(self.lists.chunks_exact_mut(slots)).zip(&mut self.counts) {
            let mut n = 0;
            for (kind, count) in [Kind::Hexadecets, Kind::Octets, Kind::Quads, Kind::Exact].into_iter().zip(counts.iter_mut()) {
                let first = n;
                for_each_bit!(unit[self.layout.range(kind)], |i| {
                    list[n] = i as u16;
                    n += 1;
                });
                *count = (n - first) as u16;
            }
        }
    }

    pub(super) fn group(&self, g: usize) -> GroupPlan<'_> {
        let slots = self.slots;
        GroupPlan {
            lists: &self.lists[g * UNITS * slots..(g + 1) * UNITS * slots],
            counts: &self.counts[g * UNITS..(g + 1) * UNITS],
            compensation: &self.compensation[g * MR..(g + 1) * MR],
            slots,
        }
    }

    /// Multiply-adds of one row taken by each kind as the kernels read them, summed over
    /// the units (for tests).
    #[cfg(test)]
    pub(super) fn kernel_shares(&self) -> [usize; 4] {
        let mut shares = [0; 4];
        for counts in &self.counts {
            for (i, &c) in counts.iter().enumerate() {
                shares[i] += [16, 8, 4, 4][i] * c as usize;
            }
        }
        shares
    }
}

/// Step `g` (4 k of the `MR` rows, 32 bytes) of an interleaved group.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn load_step(v: &[u8], g: usize) -> __m256i {
    debug_assert!((g + 1) * 4 * MR <= v.len());
    _mm256_loadu_si256(v.as_ptr().add(g * 4 * MR) as *const _)
}

/// A run's sums per int16 lane (two lanes per row: k = 0, 1 and k = 2, 3 of each step):
/// `Σ|x|` and `Σ x`.
#[derive(Clone, Copy)]
struct LaneSums {
    magnitude: __m256i,
    signed: __m256i,
}

impl LaneSums {
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn add(self, other: LaneSums) -> LaneSums {
        LaneSums { magnitude: _mm256_add_epi16(self.magnitude, other.magnitude), signed: _mm256_add_epi16(self.signed, other.signed) }
    }

    /// One movemask bit per byte of the lanes over the budget: bytes `4r..4r + 4` are row
    /// `r`'s two lanes.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn over_budget(self) -> u32 {
        let need = _mm256_add_epi16(self.magnitude, _mm256_abs_epi16(self.signed));
        _mm256_movemask_epi8(_mm256_cmpgt_epi16(need, _mm256_set1_epi16(LANE_BUDGET))) as u32
    }
}

/// Plans the units of one row group: see the module doc. `live` rows of the `MR` hold data.
struct GroupPlanner<'a> {
    x: &'a [u8],
    live: usize,
    /// Whether pairs of rows may take hexadecets (else octets at most).
    hexadecets: bool,
    layout: MaskLayout,
    /// The movemask bits of each unit's live rows (zero for a unit without rows).
    unit_bits: [u32; UNITS],
}

impl GroupPlanner<'_> {
    fn new(x: &[u8], live: usize, hexadecets: bool, layout: MaskLayout) -> GroupPlanner<'_> {
        let unit_bits = std::array::from_fn(|u| {
            let first = if 2 * u < live { 0xf << (8 * u) } else { 0 };
            let second = if 2 * u + 1 < live { 0xf0 << (8 * u) } else { 0 };
            first | second
        });
        GroupPlanner { x, live, hexadecets, layout, unit_bits }
    }

    /// Marks step `i` of `kind` for the units among `units` whose lanes are within budget
    /// (`over`); returns the bits of the others.
    #[inline(always)]
    fn mark(&self, masks: &mut [u64], kind: Kind, i: usize, over: u32, units: u32) -> u32 {
        let mut rest = 0;
        // The word of bit `i` in unit 0's mask of `kind`; unit `u`'s is `words * u` later.
        let (word, bit) = (self.layout.start[kind as usize] + i / 64, 1u64 << (i % 64));
        // Without branches: which units fit depends on the data, and mispredicting it cost
        // more than the planning itself (`units` is made of whole units' bits).
        for (u, bits) in self.unit_bits.into_iter().enumerate() {
            let (mine, over) = (bits & units, over & bits != 0);
            masks[u * self.layout.words + word] |= bit & ((mine != 0 && !over) as u64).wrapping_neg();
            rest |= mine & (over as u32).wrapping_neg();
        }
        rest
    }

    #[target_feature(enable = "avx2")]
    unsafe fn plan(&self, kp: usize, masks: &mut [u64], compensation: &mut [i32]) {
        let steps = kp / 4;
        let (ones8, ones16) = (_mm256_set1_epi8(1), _mm256_set1_epi16(1));
        let all = self.unit_bits.iter().fold(0, |a, b| a | b);
        let mut total = _mm256_setzero_si256();
        let mut exact_sum = [0i32; MR];
        // Hexadecets only for pairs of rows (a single row is memory bound, see `unit`), and
        // only where the kernel takes them (`hexadecets_pay_off`).
        let pairs: u32 = match self.hexadecets {
            true => self.unit_bits.iter().filter(|&&b| b.count_ones() == 8).fold(0, |a, b| a | b),
            false => 0,
        };
        let mut sums = [LaneSums { magnitude: _mm256_setzero_si256(), signed: _mm256_setzero_si256() }; 4];
        let mut g = 0;
        while g < steps {
            let run = 4.min(steps - g);
            for (i, sum) in sums.iter_mut().enumerate().take(run) {
                let x = load_step(self.x, g + i);
                let signed = _mm256_maddubs_epi16(ones8, x);
                *sum = LaneSums { magnitude: _mm256_maddubs_epi16(_mm256_abs_epi8(x), ones8), signed };
                total = _mm256_add_epi32(total, _mm256_madd_epi16(signed, ones16));
            }
            // Units over budget for a whole hexadecet try its octets, then their quads.
            let mut split = all;
            if run == 4 && pairs != 0 {
                let four = sums.iter().fold(0, |o, s| o | s.over_budget());
                let over = four | sums[0].add(sums[1]).add(sums[2]).add(sums[3]).over_budget();
                split = self.mark(masks, Kind::Hexadecets, g / 4, over, pairs) | (all & !pairs);
            }
            for half in (0..run).step_by(2) {
                let mut rest = split;
                if half + 1 < run && split != 0 {
                    let (a, b) = (sums[half], sums[half + 1]);
                    let over = a.over_budget() | b.over_budget() | a.add(b).over_budget();
                    rest = self.mark(masks, Kind::Octets, (g + half) / 2, over, split);
                }
                for i in (half..(half + 2).min(run)).filter(|_| rest != 0) {
                    let exact = self.mark(masks, Kind::Quads, g + i, sums[i].over_budget(), rest);
                    self.mark(masks, Kind::Exact, g + i, 0, exact);
                    for r in (0..self.live).filter(|&r| exact & (0xf << (4 * r)) != 0) {
                        let bytes = &self.x[((g + i) * MR + r) * 4..((g + i) * MR + r) * 4 + 4];
                        exact_sum[r] += bytes.iter().map(|&v| v as i8 as i32).sum::<i32>();
                    }
                }
            }
            g += run;
        }
        let mut totals = [0i32; MR];
        _mm256_storeu_si256(totals.as_mut_ptr() as *mut _, total);
        for r in 0..MR {
            compensation[r] = 128 * (totals[r] - exact_sum[r]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lists hold each unit's steps of each kind, ascending, for any partition of the k
    /// steps into kinds (the planner's masks): depths that end inside a word, on a word's
    /// last bit and past the first word; several groups of units; one `Plans` reused by
    /// deeper and shallower products in turn.
    #[test]
    fn step_lists_follow_the_masks() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut plans = Plans::default();
        for kp in [2048, 0, 60, 512, 4, 1028, 8, 256] {
            let (steps, layout, units) = (kp / 4, MaskLayout::new(kp), 3 * UNITS);
            (plans.masks, plans.compensation, plans.layout) = (vec![0; units * layout.words], vec![0; 3 * MR], layout);
            let mut expected = vec![[const { Vec::new() }; 4]; units];
            for (u, lists) in expected.iter_mut().enumerate() {
                let mut g = 0;
                while g < steps {
                    let kind = match next() % 4 {
                        0 if g % 4 == 0 && g + 4 <= steps => Kind::Hexadecets,
                        0 | 1 if g % 2 == 0 && g + 2 <= steps => Kind::Octets,
                        2 => Kind::Exact,
                        _ => Kind::Quads,
                    };
                    let (index, width) = match kind {
                        Kind::Hexadecets => (g / 4, 4),
                        Kind::Octets => (g / 2, 2),
                        _ => (g, 1),
                    };
                    plans.masks[u * layout.words + layout.start[kind as usize] + index / 64] |= 1 << (index % 64);
                    lists[kind as usize].push(index as u16);
                    g += width;
                }
            }
            plans.fill_lists(units, steps);
            for (u, lists) in expected.iter().enumerate() {
                let group = plans.group(u / UNITS);
                assert_eq!(group.step_lists(u % UNITS).map(<[u16]>::to_vec), *lists, "kp {kp} unit {u}");
            }
        }
    }
}
