//! The AVX2 int8 product (no VNNI), exact, planned per pair of rows.
//!
//! `vpmaddubsw` multiplies u8 by s8 and saturates each pair sum to int16. The sign trick
//! (`|x|` times `vpsignb(w, x)`) is exact for any operands but costs a sign instruction per
//! multiply and a `vpmaddwd` per 32 products, three instructions on the multiply pipes.
//! Read as u8 `w + 128` instead (as the panels store them) against signed `x`, each product is at most `255 |x|`: a run of products summed in int16 is exact
//! whenever its `|x|` add up to at most 128. Activations are quantized per row to a maximum
//! of 127 and most of them are small: on the zh-en model 80% of (pair of rows, 8 k) blocks
//! and 97% of (pair of rows, 4 k) blocks are within that bound.
//!
//! So each product first plans, per unit of rows (a pair, or a group's odd last row), which
//! kernel takes each k step: `octets` (8 k: two `vpmaddubsw` summed in int16, one
//! `vpmaddwd`, 1.5 multiply instructions per 32 products), `quads` (4 k: one of each) or
//! `exact` (4 k through the sign trick). Integer sums are exact in any order, so the result
//! is the reference's bit for bit; the shift adds `128 Σ x` over the shifted steps, which
//! the unit subtracts before the epilogue.
use super::{TileOut, MR, NR};
use std::arch::x86_64::*;

/// The largest `Σ |x|` of products that one int16 lane may sum with `w + 128 <= 255`.
const LANE_BUDGET: i16 = 128;
/// Units of rows per interleaved group of `MR` rows.
const UNITS: usize = MR / 2;

/// The plans of one product's rows: per unit, bit masks over the k steps (`octets`, then
/// `quads` and `exact` over 4-k groups), and per row the compensation `128 Σ x` of its
/// shifted steps.
#[derive(Default)]
pub(super) struct Plans {
    masks: Vec<u64>,
    compensation: Vec<i32>,
    /// u64 words of the octet mask and of each 4-k group mask.
    octet_words: usize,
    group_words: usize,
}

/// The plan of one group of `MR` rows, as the kernel reads it.
pub(super) struct GroupPlan<'a> {
    masks: &'a [u64],
    compensation: &'a [i32],
    octet_words: usize,
    group_words: usize,
}

impl Plans {
    fn unit_words(&self) -> usize {
        self.octet_words + 2 * self.group_words
    }

    /// Plans the `m` rows of `x` (interleaved groups of `MR` rows, `[kp/4][MR][4]` bytes
    /// each) given their magnitudes `magnitude` in the same layout.
    pub(super) fn fill(&mut self, x: &[u8], magnitude: &[u8], m: usize, kp: usize) {
        let groups = m.div_ceil(MR);
        self.octet_words = (kp / 8).div_ceil(64);
        self.group_words = (kp / 4).div_ceil(64);
        let words = self.unit_words();
        self.masks.clear();
        self.masks.resize(groups * UNITS * words, 0);
        if self.compensation.len() < groups * MR {
            self.compensation.resize(groups * MR, 0);
        }
        let size = kp * MR;
        for g in 0..groups {
            let live = MR.min(m - g * MR);
            let masks = &mut self.masks[g * UNITS * words..(g + 1) * UNITS * words];
            let compensation = &mut self.compensation[g * MR..(g + 1) * MR];
            // SAFETY: `Plans` is filled only for the AVX2 kernel, i.e. on a CPU with AVX2
            // (see Companion::of); both slices hold `kp / 4` steps of `MR` rows.
            unsafe {
                plan_group(&x[g * size..(g + 1) * size], &magnitude[g * size..(g + 1) * size], kp, live, masks, (self.octet_words, self.group_words), compensation)
            };
        }
    }

    pub(super) fn group(&self, g: usize) -> GroupPlan<'_> {
        let words = self.unit_words();
        GroupPlan {
            masks: &self.masks[g * UNITS * words..(g + 1) * UNITS * words],
            compensation: &self.compensation[g * MR..(g + 1) * MR],
            octet_words: self.octet_words,
            group_words: self.group_words,
        }
    }

    /// How many (unit, step) pairs take each kernel, in multiply-adds of one row:
    /// `(octets, quads, exact)` (for tests and benchmarks).
    #[cfg(test)]
    pub(super) fn kernel_shares(&self, kp: usize) -> (usize, usize, usize) {
        let words = self.unit_words();
        let ones = |w: &[u64]| w.iter().map(|v| v.count_ones() as usize).sum::<usize>();
        let mut shares = (0, 0, 0);
        for unit in self.masks.chunks_exact(words.max(1)).filter(|_| kp > 0) {
            let (octets, groups) = unit.split_at(self.octet_words);
            shares.0 += 8 * ones(octets);
            shares.1 += 4 * ones(&groups[..self.group_words]);
            shares.2 += 4 * ones(&groups[self.group_words..]);
        }
        shares
    }
}

/// Sets bit `i` of a mask.
#[inline(always)]
fn set(mask: &mut [u64], i: usize) {
    mask[i / 64] |= 1 << (i % 64);
}

/// Step `g` (4 k of the `MR` rows, 32 bytes) of an interleaved group.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn load_step(v: &[u8], g: usize) -> __m256i {
    debug_assert!((g + 1) * 4 * MR <= v.len());
    _mm256_loadu_si256(v.as_ptr().add(g * 4 * MR) as *const _)
}

/// One movemask bit per byte of the int16 lanes over the budget: bytes `4r..4r + 4` are
/// row `r`'s two lanes.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn over_budget(sums: __m256i) -> u32 {
    _mm256_movemask_epi8(_mm256_cmpgt_epi16(sums, _mm256_set1_epi16(LANE_BUDGET))) as u32
}

/// Plans the units of one row group: see the module doc. `live` rows of the `MR` hold data.
#[target_feature(enable = "avx2")]
unsafe fn plan_group(x: &[u8], magnitude: &[u8], kp: usize, live: usize, masks: &mut [u64], (octet_words, group_words): (usize, usize), compensation: &mut [i32]) {
    let steps = kp / 4;
    let words = octet_words + 2 * group_words;
    let (ones8, ones16) = (_mm256_set1_epi8(1), _mm256_set1_epi16(1));
    let unit_bits: [u32; UNITS] = std::array::from_fn(|u| {
        let first = if 2 * u < live { 0xf << (8 * u) } else { 0 };
        let second = if 2 * u + 1 < live { 0xf0 << (8 * u) } else { 0 };
        first | second
    });
    let mut exact_sum = [0i32; MR];
    // Group `g` alone for the units in `units`: shifted within the budget, else exact.
    let mut group_alone = |g: usize, over: u32, units: u32, masks: &mut [u64]| {
        for (u, &bits) in unit_bits.iter().enumerate() {
            if bits & units == 0 {
                continue;
            }
            let unit = &mut masks[u * words + octet_words..(u + 1) * words];
            if over & bits == 0 {
                set(&mut unit[..group_words], g);
            } else {
                set(&mut unit[group_words..], g);
                for r in (2 * u..2 * u + 2).filter(|&r| r < live) {
                    exact_sum[r] += x[(g * MR + r) * 4..(g * MR + r) * 4 + 4].iter().map(|&v| v as i8 as i32).sum::<i32>();
                }
            }
        }
    };
    let all = unit_bits.iter().fold(0, |a, b| a | b);
    let mut total = _mm256_setzero_si256();
    let mut g = 0;
    while g < steps {
        // Per row: its two pair sums of |x| (int16), and Σ x of the step (int32).
        let pair_a = _mm256_maddubs_epi16(load_step(magnitude, g), ones8);
        total = _mm256_add_epi32(total, _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, load_step(x, g)), ones16));
        if g + 1 == steps {
            group_alone(g, over_budget(pair_a), all, masks);
            break;
        }
        let pair_b = _mm256_maddubs_epi16(load_step(magnitude, g + 1), ones8);
        total = _mm256_add_epi32(total, _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, load_step(x, g + 1)), ones16));
        let over8 = over_budget(_mm256_add_epi16(pair_a, pair_b));
        let mut split = 0u32;
        for (u, &bits) in unit_bits.iter().enumerate() {
            if bits == 0 {
                continue;
            }
            if over8 & bits == 0 {
                set(&mut masks[u * words..u * words + octet_words], g / 2);
            } else {
                split |= bits;
            }
        }
        if split != 0 {
            group_alone(g, over_budget(pair_a), split, masks);
            group_alone(g + 1, over_budget(pair_b), split, masks);
        }
        g += 2;
    }
    let mut totals = [0i32; MR];
    _mm256_storeu_si256(totals.as_mut_ptr() as *mut _, total);
    for r in 0..MR {
        compensation[r] = 128 * (totals[r] - exact_sum[r]);
    }
}

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

/// The product of one row group (`x`, its magnitudes `magnitude`, its plan) with one
/// panel: rows two at a time (a unit), then the odd one.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn tile(x: &[u8], magnitude: &[u8], plan: &GroupPlan, panel: &[u8], kp: usize, t: &TileOut) {
    let mut r = 0;
    while r + 2 <= t.rows {
        unit::<2>(x, magnitude, plan, r, panel, kp, t);
        r += 2;
    }
    if r < t.rows {
        unit::<1>(x, magnitude, plan, r, panel, kp, t);
    }
}

/// The 4 activation bytes of row `r` in step `g`, broadcast.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn broadcast(a: *const u8, g: usize, r: usize) -> __m256i {
    _mm256_set1_epi32((a.add((g * MR + r) * 4) as *const i32).read_unaligned())
}

/// Columns `8j..8j + 8` of step `g` of a panel, as stored: `w + 128`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn load_weights(w: *const u8, g: usize, j: usize) -> __m256i {
    _mm256_loadu_si256(w.add(g * NR * 4 + 32 * j) as *const _)
}

#[inline]
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma")]
unsafe fn unit<const R: usize>(x: &[u8], magnitude: &[u8], plan: &GroupPlan, r0: usize, panel: &[u8], kp: usize, t: &TileOut) {
    let (a, xa, w) = (x.as_ptr(), magnitude.as_ptr(), panel.as_ptr());
    let words = plan.octet_words + 2 * plan.group_words;
    let masks = &plan.masks[r0 / 2 * words..(r0 / 2 + 1) * words];
    let (octets, groups) = masks.split_at(plan.octet_words);
    let (quads, exact) = groups.split_at(plan.group_words);
    let ones = _mm256_set1_epi16(1);
    let mut s = [[_mm256_setzero_si256(); 4]; R];
    let mut pf = super::x86::Prefetcher::new(if r0 == 0 { t.prefetch } else { &[] }, kp / 8);
    for_each_bit!(octets, |o| {
        pf.step();
        let g = 2 * o;
        let (mut xa_, mut xb_) = ([_mm256_setzero_si256(); R], [_mm256_setzero_si256(); R]);
        for r in 0..R {
            (xa_[r], xb_[r]) = (broadcast(a, g, r0 + r), broadcast(a, g + 1, r0 + r));
        }
        for j in 0..4 {
            let (wa, wb) = (load_weights(w, g, j), load_weights(w, g + 1, j));
            for r in 0..R {
                let p = _mm256_add_epi16(_mm256_maddubs_epi16(wa, xa_[r]), _mm256_maddubs_epi16(wb, xb_[r]));
                s[r][j] = _mm256_add_epi32(s[r][j], _mm256_madd_epi16(p, ones));
            }
        }
    });
    for_each_bit!(quads, |g| {
        let mut xv = [_mm256_setzero_si256(); R];
        for r in 0..R {
            xv[r] = broadcast(a, g, r0 + r);
        }
        for j in 0..4 {
            let wj = load_weights(w, g, j);
            for r in 0..R {
                s[r][j] = _mm256_add_epi32(s[r][j], _mm256_madd_epi16(_mm256_maddubs_epi16(wj, xv[r]), ones));
            }
        }
    });
    for_each_bit!(exact, |g| {
        for r in 0..R {
            let (xv, xav) = (broadcast(a, g, r0 + r), broadcast(xa, g, r0 + r));
            for j in 0..4 {
                let p = _mm256_maddubs_epi16(xav, _mm256_sign_epi8(super::x86::signed256(w.add(g * NR * 4 + 32 * j)), xv));
                s[r][j] = _mm256_add_epi32(s[r][j], _mm256_madd_epi16(p, ones));
            }
        }
    });
    for r in 0..R {
        let shift = _mm256_set1_epi32(plan.compensation[r0 + r]);
        let mut acc = [0i32; NR];
        for j in 0..4 {
            _mm256_storeu_si256(acc.as_mut_ptr().add(8 * j) as *mut _, _mm256_sub_epi32(s[r][j], shift));
        }
        t.store(r0 + r, &acc);
    }
}
