//! Attention and feed-forward blocks: the projections run as batched matrix products over
//! all rows; the attention itself is the backend's.
use crate::backend::{Activation, Backend, Ctx};
use crate::error::Result;
use crate::model::layers::{Linear, Norm, WeightReader};

/// Self-attention block: `linear_0` is the fused QKV projection [3d, d], `linear_1` the output.
pub struct SelfAttention<B: Backend> {
    pub norm: Norm<B>,
    pub qkv: Linear<B>,
    pub out: Linear<B>,
}

impl<B: Backend> SelfAttention<B> {
    pub fn load(w: &WeightReader<B>, scope: &str, d: usize, eps: Option<f32>) -> Result<Self> {
        Ok(SelfAttention {
            norm: Norm::load(w, &format!("{scope}/layer_norm"), d, eps)?,
            qkv: Linear::load(w, &format!("{scope}/linear_0"), 3 * d, d)?,
            out: Linear::load(w, &format!("{scope}/linear_1"), d, d)?,
        })
    }
}

/// A simpler simple recurrent unit replacing decoder self-attention (Marian's SSRU):
/// `input` is `W` (no bias), `forget` is `Wf` with `bf`.
pub struct Ssru<B: Backend> {
    pub norm: Norm<B>,
    pub input: Linear<B>,
    pub forget: Linear<B>,
}

impl<B: Backend> Ssru<B> {
    pub fn load(w: &WeightReader<B>, scope: &str, d: usize, eps: Option<f32>) -> Result<Self> {
        Ok(Ssru {
            norm: Norm::load(w, &format!("{scope}/layer_norm"), d, eps)?,
            input: Linear::load(w, &format!("{scope}/linear_0"), d, d)?,
            forget: Linear::load(w, &format!("{scope}/linear_1"), d, d)?,
        })
    }
}

/// Marian's average attention (AAN, "Accelerating NMT with an average attention network"):
/// the running average of the layer's inputs through a small FFN (`hidden` layers with
/// `activation`, then `projection` back to d when needed), gated with the input.
pub struct AverageAttention<B: Backend> {
    pub norm: Norm<B>,
    pub hidden: Vec<Linear<B>>,
    pub projection: Option<Linear<B>>,
    pub activation: Activation,
    /// `sigmoid(Wi x + bi)` and `sigmoid(Wf y + bf)`: `y = gi * x + gf * y` (absent with
    /// `transformer-aan-nogate`).
    pub gate: Option<(Linear<B>, Linear<B>)>,
}

impl<B: Backend> AverageAttention<B> {
    pub fn load(w: &WeightReader<B>, scope: &str, d: usize, eps: Option<f32>) -> Result<Self> {
        let mut hidden = Vec::new();
        let mut input = d;
        while w.contains(&format!("{scope}/linear_{}/weight", hidden.len())) {
            let name = format!("{scope}/linear_{}", hidden.len());
            let out = w.dims(&format!("{name}/weight"))?.first().copied().unwrap_or(0);
            hidden.push(Linear::load(w, &name, out, input)?);
            input = out;
        }
        let projection = if w.contains(&format!("{scope}/projection/weight")) {
            Some(Linear::load(w, &format!("{scope}/projection"), d, input)?)
        } else if input != d {
            return Err(crate::error::Error::invalid_model(format!(
                "{scope}: the last layer's width {input} is not the model's {d}, and no projection maps it back"
            )));
        } else {
            None
        };
        let activation = super::transformer::read_activation_or(w, scope, 2.0)?;
        let gate = if w.contains(&format!("{scope}/gate_input/weight")) {
            Some((Linear::load(w, &format!("{scope}/gate_input"), d, d)?, Linear::load(w, &format!("{scope}/gate_forget"), d, d)?))
        } else {
            None
        };
        Ok(AverageAttention { norm: Norm::load(w, &format!("{scope}/layer_norm"), d, eps)?, hidden, projection, activation, gate })
    }
}

/// Encoder-decoder attention: `linear_0` queries [d, d], `linear_1` fused KV [2d, d], `linear_2` output.
pub struct CrossAttention<B: Backend> {
    pub norm: Norm<B>,
    pub query: Linear<B>,
    pub kv: Linear<B>,
    pub out: Linear<B>,
}

impl<B: Backend> CrossAttention<B> {
    pub fn load(w: &WeightReader<B>, scope: &str, d: usize, eps: Option<f32>) -> Result<Self> {
        Ok(CrossAttention {
            norm: Norm::load(w, &format!("{scope}/layer_norm"), d, eps)?,
            query: Linear::load(w, &format!("{scope}/linear_0"), d, d)?,
            kv: Linear::load(w, &format!("{scope}/linear_1"), 2 * d, d)?,
            out: Linear::load(w, &format!("{scope}/linear_2"), d, d)?,
        })
    }
}

/// Position-wise feed-forward block.
pub struct FeedForward<B: Backend> {
    pub norm: Norm<B>,
    pub inner: Linear<B>,
    pub outer: Linear<B>,
    pub activation: Activation,
}

impl<B: Backend> FeedForward<B> {
    pub fn load(w: &WeightReader<B>, scope: &str, d: usize, eps: Option<f32>, activation: Activation) -> Result<Self> {
        let ffn_dim = w.dims(&format!("{scope}/linear_0/weight"))?.first().copied().unwrap_or(0);
        Ok(FeedForward {
            norm: Norm::load(w, &format!("{scope}/layer_norm"), d, eps)?,
            inner: Linear::load(w, &format!("{scope}/linear_0"), ffn_dim, d)?,
            outer: Linear::load(w, &format!("{scope}/linear_1"), d, ffn_dim)?,
            activation,
        })
    }

    /// `forward` over at most `b.feed_forward_rows()` rows at a time (the encoder's whole
    /// batch): the same results, with hidden activations that size.
    pub fn forward_in_parts(&self, b: &B, ctx: &Ctx, x: &mut B::Buffer, rows: usize, pre_norm: bool, scratch: &mut Scratch<B>) {
        let part_rows = match b.feed_forward_rows() {
            Some(n) if n > 0 && rows > n => n,
            _ => return self.forward(b, ctx, x, rows, pre_norm, scratch),
        };
        let d = self.outer.out_dim();
        let mut part = std::mem::take(&mut scratch.context);
        for first in (0..rows).step_by(part_rows) {
            let count = part_rows.min(rows - first);
            b.copy_rows(x, d, first, count, &mut part);
            self.forward(b, ctx, &mut part, count, pre_norm, scratch);
            b.write_rows(x, d, first, &part);
        }
        scratch.context = part;
    }

    /// `x` (rows × d) is replaced by the block's output, residual and norm included.
    pub fn forward(&self, b: &B, ctx: &Ctx, x: &mut B::Buffer, rows: usize, pre_norm: bool, scratch: &mut Scratch<B>) {
        let input = if pre_norm {
            b.copy(x, &mut scratch.normed);
            self.norm.forward(b, &mut scratch.normed);
            &scratch.normed
        } else {
            &*x
        };
        if self.activation == Activation::Relu {
            self.inner.forward_relu(b, ctx, input, rows, &mut scratch.hidden);
        } else {
            self.inner.forward(b, ctx, input, rows, &mut scratch.hidden);
            b.activation(ctx, &mut scratch.hidden, self.activation);
        }
        self.outer.forward(b, ctx, &scratch.hidden, rows, &mut scratch.proj);
        b.add(x, &scratch.proj);
        if !pre_norm {
            self.norm.forward(b, x);
        }
    }
}

/// Reusable buffers, so a decoding step allocates nothing once warmed up.
pub struct Scratch<B: Backend> {
    pub normed: B::Buffer,
    pub hidden: B::Buffer,
    pub proj: B::Buffer,
    pub context: B::Buffer,
    pub query: B::Buffer,
}

impl<B: Backend> Default for Scratch<B> {
    fn default() -> Self {
        Scratch {
            normed: B::Buffer::default(),
            hidden: B::Buffer::default(),
            proj: B::Buffer::default(),
            context: B::Buffer::default(),
            query: B::Buffer::default(),
        }
    }
}
