//! Multi-head attention. Projections run as batched matrix products over all rows; the
//! attention itself runs per query row over that row's own keys, so no padding or mask
//! is ever materialized (each sequence only sees its real length).
use crate::backend::cpu::isa::dispatch_isa;
use crate::backend::cpu::{ops, Ctx};
use crate::error::Result;
use crate::model::layers::{Linear, Norm, WeightReader};

/// Dot product with 8 independent accumulators so the compiler can vectorize it.
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; 8];
    let chunks = n / 8;
    for c in 0..chunks {
        for l in 0..8 {
            acc[l] += a[c * 8 + l] * b[c * 8 + l];
        }
    }
    let mut s = 0.0;
    for i in chunks * 8..n {
        s += a[i] * b[i];
    }
    acc.iter().sum::<f32>() + s
}

/// Keys or values of one sequence: row `j`, head `h` is `data[j * stride + offset + h * head_dim ..]`.
#[derive(Clone, Copy)]
pub struct KvView<'a> {
    pub data: &'a [f32],
    pub stride: usize,
    pub offset: usize,
}

impl KvView<'_> {
    #[inline]
    fn head(&self, j: usize, h: usize, head_dim: usize) -> &[f32] {
        let start = j * self.stride + self.offset + h * head_dim;
        &self.data[start..start + head_dim]
    }
}

/// One query row attending over `len` keys/values, all heads; writes [num_heads * head_dim].
/// The same loops are compiled for AVX-512 and AVX2 and picked by `isa::current()`.
#[allow(clippy::too_many_arguments)]
pub fn attend_row(
    query: &[f32],
    keys: KvView,
    values: KvView,
    len: usize,
    num_heads: usize,
    head_dim: usize,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    dispatch_isa!(attend_row_generic(
        query: &[f32],
        keys: KvView,
        values: KvView,
        len: usize,
        num_heads: usize,
        head_dim: usize,
        scale: f32,
        scores: &mut Vec<f32>,
        out: &mut [f32]
    ) -> ())
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attend_row_generic(
    query: &[f32],
    keys: KvView,
    values: KvView,
    len: usize,
    num_heads: usize,
    head_dim: usize,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    scores.resize(len, 0.0);
    for h in 0..num_heads {
        let q = &query[h * head_dim..(h + 1) * head_dim];
        for (j, s) in scores.iter_mut().enumerate() {
            *s = dot(q, keys.head(j, h, head_dim)) * scale;
        }
        ops::softmax(scores);
        let o = &mut out[h * head_dim..(h + 1) * head_dim];
        o.fill(0.0);
        for (j, &p) in scores.iter().enumerate() {
            let v = values.head(j, h, head_dim);
            o.iter_mut().zip(v).for_each(|(o, v)| *o += p * v);
        }
    }
}

/// Self-attention block: `linear_0` is the fused QKV projection [3d, d], `linear_1` the output.
pub struct SelfAttention {
    pub norm: Norm,
    pub qkv: Linear,
    pub out: Linear,
}

impl SelfAttention {
    pub fn load(w: &WeightReader, scope: &str, d: usize, eps: Option<f32>) -> Result<Self> {
        Ok(SelfAttention {
            norm: Norm::load(w, &format!("{scope}/layer_norm"), d, eps)?,
            qkv: Linear::load(w, &format!("{scope}/linear_0"), 3 * d, d)?,
            out: Linear::load(w, &format!("{scope}/linear_1"), d, d)?,
        })
    }
}

/// Encoder-decoder attention: `linear_0` queries [d, d], `linear_1` fused KV [2d, d], `linear_2` output.
pub struct CrossAttention {
    pub norm: Norm,
    pub query: Linear,
    pub kv: Linear,
    pub out: Linear,
}

impl CrossAttention {
    pub fn load(w: &WeightReader, scope: &str, d: usize, eps: Option<f32>) -> Result<Self> {
        Ok(CrossAttention {
            norm: Norm::load(w, &format!("{scope}/layer_norm"), d, eps)?,
            query: Linear::load(w, &format!("{scope}/linear_0"), d, d)?,
            kv: Linear::load(w, &format!("{scope}/linear_1"), 2 * d, d)?,
            out: Linear::load(w, &format!("{scope}/linear_2"), d, d)?,
        })
    }
}

/// Position-wise feed-forward block.
pub struct FeedForward {
    pub norm: Norm,
    pub inner: Linear,
    pub outer: Linear,
    pub activation: ops::Activation,
}

impl FeedForward {
    pub fn load(w: &WeightReader, scope: &str, d: usize, eps: Option<f32>, activation: ops::Activation) -> Result<Self> {
        let ffn_dim = w.dims(&format!("{scope}/linear_0/weight"))?.first().copied().unwrap_or(0);
        Ok(FeedForward {
            norm: Norm::load(w, &format!("{scope}/layer_norm"), d, eps)?,
            inner: Linear::load(w, &format!("{scope}/linear_0"), ffn_dim, d)?,
            outer: Linear::load(w, &format!("{scope}/linear_1"), d, ffn_dim)?,
            activation,
        })
    }

    /// `x` (rows × d) is replaced by the block's output, residual and norm included.
    pub fn forward(&self, ctx: &Ctx, x: &mut [f32], rows: usize, pre_norm: bool, scratch: &mut Scratch) {
        let input: &[f32] = if pre_norm {
            scratch.normed.clear();
            scratch.normed.extend_from_slice(x);
            self.norm.forward(&mut scratch.normed);
            &scratch.normed
        } else {
            x
        };
        self.inner.forward(ctx, input, rows, &mut scratch.hidden);
        self.activation.apply(&mut scratch.hidden);
        self.outer.forward(ctx, &scratch.hidden, rows, &mut scratch.proj);
        ops::add_assign(x, &scratch.proj);
        if !pre_norm {
            self.norm.forward(x);
        }
    }
}

/// Reusable buffers, so a decoding step allocates nothing once warmed up.
#[derive(Default)]
pub struct Scratch {
    pub normed: Vec<f32>,
    pub hidden: Vec<f32>,
    pub proj: Vec<f32>,
    pub context: Vec<f32>,
    pub scores: Vec<f32>,
    pub query: Vec<f32>,
}
