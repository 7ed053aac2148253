//! The attention's explicit AVX2 and AVX-512 loops, each summing in the order of its
//! portable twin in `attention` (the tests hold them bit for bit equal).
use super::KvView;
use std::arch::x86_64::*;

/// Levels 2-4 of `fold16` on its first level `h8` (lanes `l + (l + 8)`): 4 + 4, then
/// (0 + 2) + (1 + 3).
#[inline(always)]
unsafe fn fold8(h8: __m256) -> f32 {
    let h4 = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps::<1>(h8));
    let h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
    _mm_cvtss_f32(_mm_add_ss(h2, _mm_shuffle_ps::<1>(h2, h2)))
}

/// The first level of `fold16`: lanes `l + (l + 8)`.
#[inline(always)]
unsafe fn halves512(r: __m512) -> __m256 {
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(r)));
    _mm256_add_ps(_mm512_castps512_ps256(r), hi)
}

/// `fold16` of a vector: halves added as 8 + 8, 4 + 4, then (0 + 2) + (1 + 3).
#[inline(always)]
unsafe fn fold16(r: __m512) -> f32 {
    fold8(halves512(r))
}

/// The 16 lanes of `single_query_dot` over elements 0..49 (lane 0 `q[0] * k[0]`, then
/// 16 elements a step from element 1).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn head_lanes512(q: [__m512; 4], k: *const f32) -> __m512 {
    let mut acc = _mm512_maskz_mul_ps(1, q[0], _mm512_loadu_ps(k));
    for t in 0..3 {
        acc = _mm512_fmadd_ps(q[1 + t], _mm512_loadu_ps(k.add(1 + 16 * t)), acc);
    }
    acc
}

/// The 16 lanes over elements 49..64, lane 0 starting from `carry` (`[s, 0, ..]`).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn tail_lanes512(q49: __m512, k: *const f32, carry: __m512) -> __m512 {
    _mm512_fmadd_ps(q49, _mm512_maskz_loadu_ps(0x7FFF, k.add(49)), carry)
}

/// The query vectors `head_lanes512` and `tail_lanes512` take.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn query_lanes512(q: *const f32) -> ([__m512; 4], __m512) {
    let head = [_mm512_loadu_ps(q), _mm512_loadu_ps(q.add(1)), _mm512_loadu_ps(q.add(17)), _mm512_loadu_ps(q.add(33))];
    (head, _mm512_maskz_loadu_ps(0x7FFF, q.add(49)))
}

/// `single_query_dot` with explicit 16-lane vectors (the compiler splits the portable
/// version into 2-wide pieces); the same operations in the same order.
#[target_feature(enable = "avx512f")]
pub unsafe fn single_query_dot_avx512(q: &[f32], k: &[f32]) -> f32 {
    assert!(q.len() >= 64 && k.len() >= 64);
    let (q, k) = (query_lanes512(q.as_ptr()), k.as_ptr());
    let carry = _mm512_maskz_mov_ps(1, _mm512_set1_ps(fold16(head_lanes512(q.0, k))));
    fold16(tail_lanes512(q.1, k, carry))
}

/// The first level of `fold16` over elements 0..49 with the 16 lanes as two 8-lane
/// vectors `lo` (lanes 0..8) and `hi` (8..16).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn head_halves256(q: *const f32, k: *const f32) -> __m256 {
    let zero = _mm256_setzero_ps();
    let mut lo = _mm256_blend_ps::<1>(zero, _mm256_mul_ps(_mm256_loadu_ps(q), _mm256_loadu_ps(k)));
    let mut hi = zero;
    for t in 0..3 {
        lo = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(1 + 16 * t)), _mm256_loadu_ps(k.add(1 + 16 * t)), lo);
        hi = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(9 + 16 * t)), _mm256_loadu_ps(k.add(9 + 16 * t)), hi);
    }
    _mm256_add_ps(lo, hi)
}

/// The first level of `fold16` over elements 49..64 (lanes 0..15, the 16th at zero),
/// lane 0 starting from `carry` (`[s, 0, ..]`); `q` holds the query's elements 49..57
/// and 57..64.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn tail_halves256(q: (__m256, __m256), k: *const f32, carry: __m256) -> __m256 {
    let lo = _mm256_fmadd_ps(q.0, _mm256_loadu_ps(k.add(49)), carry);
    let hi = _mm256_fmadd_ps(q.1, _mm256_maskload_ps(k.add(57), seven_lanes()), _mm256_setzero_ps());
    _mm256_add_ps(lo, hi)
}

/// The mask of lanes 0..7 of 8: elements 57..64 of a 64-element head, so that no load
/// reads past the head (the 8th lane would be element 64, the next head's first).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn seven_lanes() -> __m256i {
    _mm256_setr_epi32(-1, -1, -1, -1, -1, -1, -1, 0)
}

/// The query vectors `tail_halves256` takes.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn query_tail256(q: *const f32) -> (__m256, __m256) {
    (_mm256_loadu_ps(q.add(49)), _mm256_maskload_ps(q.add(57), seven_lanes()))
}

/// `single_query_dot` with the 16 lanes as two 8-lane vectors (the compiler builds the
/// portable version's unaligned lane groups from 2-wide pieces and scalar inserts); the
/// same operations in the same order.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn single_query_dot_avx2(q: &[f32], k: &[f32]) -> f32 {
    assert!(q.len() >= 64 && k.len() >= 64);
    let (q, k) = (q.as_ptr(), k.as_ptr());
    let carry = _mm256_blend_ps::<1>(_mm256_setzero_ps(), _mm256_set1_ps(fold8(head_halves256(q, k))));
    fold8(tail_halves256(query_tail256(q), k, carry))
}

/// Levels 2-4 of `fold16` (lanes 4 apart, then (0 + 2) + (1 + 3)) for eight keys at
/// once: `h8[i]` holds key `i`'s first level (lanes `l + (l + 8)`). Each key's sums are
/// the same additions of the same operands as `fold8`'s, gathered across keys.
/// (Plain loops: closures and `array::map` here were left as calls.)
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn fold8_keys(h8: &[__m256; 8]) -> __m256 {
    // [h4 of key 2p | h4 of key 2p + 1]
    let mut h4 = [_mm256_setzero_ps(); 4];
    for p in 0..4 {
        let (a, b) = (h8[2 * p], h8[2 * p + 1]);
        h4[p] = _mm256_add_ps(_mm256_permute2f128_ps::<0x20>(a, b), _mm256_permute2f128_ps::<0x31>(a, b));
    }
    // [h2 of keys 4p, 4p + 2 | h2 of keys 4p + 1, 4p + 3]
    let mut h2 = [_mm256_setzero_ps(); 2];
    for p in 0..2 {
        let (a, b) = (h4[2 * p], h4[2 * p + 1]);
        h2[p] = _mm256_add_ps(_mm256_shuffle_ps::<0b01_00_01_00>(a, b), _mm256_shuffle_ps::<0b11_10_11_10>(a, b));
    }
    // Keys 0, 2, 4, 6 | 1, 3, 5, 7, then in key order.
    let sums = _mm256_add_ps(_mm256_shuffle_ps::<0b10_00_10_00>(h2[0], h2[1]), _mm256_shuffle_ps::<0b11_01_11_01>(h2[0], h2[1]));
    _mm256_permutevar8x32_ps(sums, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

/// `[s, 0, ..]` with `s` lane `i` of `v`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn lane_first(v: __m256, i: i32) -> __m256 {
    _mm256_blend_ps::<1>(_mm256_setzero_ps(), _mm256_permutevar8x32_ps(v, _mm256_set1_epi32(i)))
}

/// `single_query_dot_avx2` of eight keys against one query: the same operations per key,
/// the folds of the eight done together (`fold8_keys`).
#[target_feature(enable = "avx2,fma")]
pub unsafe fn single_query_dots8_avx2(q: &[f32], k: [&[f32]; 8]) -> [f32; 8] {
    assert!(q.len() >= 64 && k.iter().all(|k| k.len() >= 64));
    let q = q.as_ptr();
    let mut h8 = [_mm256_setzero_ps(); 8];
    for l in 0..8 {
        h8[l] = head_halves256(q, k[l].as_ptr());
    }
    let first = fold8_keys(&h8);
    let qt = query_tail256(q);
    for l in 0..8 {
        h8[l] = tail_halves256(qt, k[l].as_ptr(), lane_first(first, l as i32));
    }
    std::mem::transmute::<__m256, [f32; 8]>(fold8_keys(&h8))
}

/// `single_query_dot_avx512` of eight keys against one query (see
/// `single_query_dots8_avx2`).
#[target_feature(enable = "avx512f")]
pub unsafe fn single_query_dots8_avx512(q: &[f32], k: [&[f32]; 8]) -> [f32; 8] {
    assert!(q.len() >= 64 && k.iter().all(|k| k.len() >= 64));
    let q = query_lanes512(q.as_ptr());
    let mut h8 = [_mm256_setzero_ps(); 8];
    for l in 0..8 {
        h8[l] = halves512(head_lanes512(q.0, k[l].as_ptr()));
    }
    let first = fold8_keys(&h8);
    for l in 0..8 {
        let carry = _mm512_maskz_mov_ps(1, _mm512_castps256_ps512(lane_first(first, l as i32)));
        h8[l] = halves512(tail_lanes512(q.1, k[l].as_ptr(), carry));
    }
    std::mem::transmute::<__m256, [f32; 8]>(fold8_keys(&h8))
}

/// `row_dots`: four query rows (`q`, transposed: `[head_dim][4]`) against the `K` keys
/// `k` of one head, each key's four chains the lanes of one 128-bit FMA: the same
/// operations in the same order (the portable version compiles to scalar FMAs and
/// spills its 32 sums).
#[target_feature(enable = "avx2,fma")]
pub unsafe fn row_dots4<const K: usize>(q: &[f32], k: [&[f32]; K], head_dim: usize) -> [[f32; 4]; 8] {
    assert!(q.len() >= 4 * head_dim && k.iter().all(|k| k.len() >= head_dim));
    let q = q.as_ptr();
    let mut kp = [q; K];
    for (p, k) in kp.iter_mut().zip(k) {
        *p = k.as_ptr();
    }
    let mut acc = [_mm_setzero_ps(); K];
    for p in 0..head_dim {
        let qv = _mm_loadu_ps(q.add(4 * p));
        for i in 0..K {
            acc[i] = _mm_fmadd_ps(qv, _mm_broadcast_ss(&*kp[i].add(p)), acc[i]);
        }
    }
    let mut out = [[0.0f32; 4]; 8];
    for i in 0..K {
        _mm_storeu_ps(out[i].as_mut_ptr(), acc[i]);
    }
    out
}

/// `weighted_values` for head `h`, `8 R` columns at a time (`head_dim` a multiple of
/// `8 R`): the columns' sums stay in `R` registers across all the keys, each lane the
/// same chain in key order (the portable loop loads and stores the output at every
/// key, a dependency through memory).
#[target_feature(enable = "avx2,fma")]
pub unsafe fn head_values<const FUSED: bool, const R: usize>(probs: &[f32], values: &KvView, len: usize, h: usize, head_dim: usize, o: &mut [f32]) {
    assert!(probs.len() >= len && o.len() >= head_dim && head_dim.is_multiple_of(8 * R));
    for c in (0..head_dim).step_by(8 * R) {
        let mut acc = [_mm256_setzero_ps(); R];
        for (first, count, rows) in values.blocks(len) {
            for (i, &p) in probs[first..first + count].iter().enumerate() {
                let (p, v) = (_mm256_set1_ps(p), rows.head(i, h, head_dim).as_ptr().add(c));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let v = _mm256_loadu_ps(v.add(8 * r));
                    *acc = if FUSED { _mm256_fmadd_ps(p, v, *acc) } else { _mm256_add_ps(*acc, _mm256_mul_ps(p, v)) };
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            _mm256_storeu_ps(o.as_mut_ptr().add(c + 8 * r), *acc);
        }
    }
}
