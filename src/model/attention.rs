//! Attention and feed-forward blocks: the projections run as batched matrix products over
//! all rows; the attention itself is the backend's (`backend::cpu::attention`).
use crate::backend::cpu::{ops, Ctx};
use crate::error::Result;
use crate::model::layers::{Linear, Norm, WeightReader};

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

/// A simpler simple recurrent unit replacing decoder self-attention (Marian's SSRU):
/// `input` is `W` (no bias), `forget` is `Wf` with `bf`.
pub struct Ssru {
    pub norm: Norm,
    pub input: Linear,
    pub forget: Linear,
}

impl Ssru {
    pub fn load(w: &WeightReader, scope: &str, d: usize, eps: Option<f32>) -> Result<Self> {
        Ok(Ssru {
            norm: Norm::load(w, &format!("{scope}/layer_norm"), d, eps)?,
            input: Linear::load(w, &format!("{scope}/linear_0"), d, d)?,
            forget: Linear::load(w, &format!("{scope}/linear_1"), d, d)?,
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
        if self.activation == ops::Activation::Relu {
            self.inner.forward_relu(ctx, input, rows, &mut scratch.hidden);
        } else {
            self.inner.forward(ctx, input, rows, &mut scratch.hidden);
            self.activation.apply(&mut scratch.hidden);
        }
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
