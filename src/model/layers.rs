//! Building blocks shared by the encoder and decoder: linear layers, normalization,
//! embeddings and position encodings, plus the weight reader that builds them by name.
use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use crate::backend::cpu::int16::PackedI16Matrix;
use crate::backend::cpu::int8::PackedI8Matrix;
use crate::backend::cpu::packed::PackedMatrix;
use crate::backend::cpu::weight::PackedWeight;
use crate::backend::cpu::{ops, Ctx};
use crate::error::{Error, Result};
use crate::backend::{ComputeType, FloatOrder};
use crate::format::{Quantized, WeightSource};
use crate::tensor::Tensor;

/// Reads weights by their spec name (CTranslate2's) and remembers which names were used,
/// so that any variable the model builder did not understand is reported instead of ignored.
pub struct WeightReader<'a> {
    source: &'a dyn WeightSource,
    /// What weights are converted to (concrete: float32, int8 or int16).
    compute_type: ComputeType,
    used: RefCell<BTreeSet<String>>,
    /// Converted tensors by stored name: aliases (tied embeddings) share one copy.
    converted: RefCell<HashMap<String, Weight>>,
    /// Packed matrices by stored name, for weights shared by several layers.
    packed: RefCell<HashMap<String, Arc<PackedWeight>>>,
}

/// A weight shared by the layers that use it (tied embeddings and projections).
pub type Weight = Arc<Tensor>;

impl<'a> WeightReader<'a> {
    pub fn new(source: &'a dyn WeightSource, compute_type: ComputeType) -> Self {
        WeightReader {
            source,
            compute_type,
            used: RefCell::new(BTreeSet::new()),
            converted: RefCell::new(HashMap::new()),
            packed: RefCell::new(HashMap::new()),
        }
    }

    fn mark(&self, name: &str) {
        let mut used = self.used.borrow_mut();
        used.insert(name.to_string());
        used.insert(format!("{name}_scale"));
    }

    pub fn contains(&self, name: &str) -> bool {
        self.source.contains(name)
    }

    fn missing(&self, name: &str) -> Error {
        Error::invalid_model(format!("{}: missing variable {name:?}", self.source.file_name()))
    }

    /// The stored shape of a variable, without converting its data.
    pub fn dims(&self, name: &str) -> Result<Vec<usize>> {
        self.source.shape(name).ok_or_else(|| self.missing(name))
    }

    pub fn tensor(&self, name: &str) -> Result<Weight> {
        self.mark(name);
        let stored = self.stored_name(name).ok_or_else(|| self.missing(name))?;
        if let Some(t) = self.converted.borrow().get(&stored) {
            return Ok(Arc::clone(t));
        }
        let t = Arc::new(self.source.tensor(&stored)?);
        // Only tensors that aliases point to are kept for sharing; the others are released
        // as soon as their layer has packed them, which keeps the loading peak low.
        if self.source.is_shared(&stored) {
            self.converted.borrow_mut().insert(stored, Arc::clone(&t));
        }
        Ok(t)
    }

    /// The stored variable a name refers to (after aliases).
    pub fn stored_name(&self, name: &str) -> Option<String> {
        self.source.stored_name(name)
    }

    /// A weight `[n, k]` converted to the compute type and packed; shared weights are
    /// packed once.
    pub fn packed(&self, name: &str, n: usize, k: usize) -> Result<Arc<PackedWeight>> {
        let stored = self.stored_name(name).unwrap_or_default();
        if let Some(p) = self.packed.borrow().get(&stored) {
            if (p.rows(), p.cols()) != (n, k) {
                let file = self.source.file_name();
                return Err(Error::invalid_model(format!("{file}: {name} is [{}, {}], expected [{n}, {k}]", p.rows(), p.cols())));
            }
            self.mark(name);
            return Ok(Arc::clone(p));
        }
        let dims = self.dims(name)?;
        if dims != [n, k] {
            let file = self.source.file_name();
            return Err(Error::invalid_model(format!("{file}: {name} has shape {dims:?}, expected [{n}, {k}]")));
        }
        let saved = match self.compute_type {
            ComputeType::Int8 | ComputeType::Int16 => self.source.quantized(name)?,
            _ => None,
        };
        let p = Arc::new(match (self.compute_type, saved) {
            // Saved in the compute type: used as is, exactly as CTranslate2 does.
            (ComputeType::Int8, Some(Quantized::Int8 { values, scales, activation_scale, intgemm })) => {
                self.mark(name);
                let packed = PackedI8Matrix::from_quantized(&values, scales, n, k);
                PackedWeight::Int8(packed.with_activation_scale(activation_scale).with_intgemm_emulation(intgemm))
            }
            // Otherwise through float32 (int8 <-> int16 dequantize and requantize).
            (ComputeType::Int8, _) => PackedWeight::Int8(PackedI8Matrix::quantize(&self.tensor(name)?, n, k)),
            (ComputeType::Int16, Some(Quantized::Int16 { values, scale })) => {
                self.mark(name);
                PackedWeight::Int16(PackedI16Matrix::from_quantized(&values, scale, n, k))
            }
            (ComputeType::Int16, _) => PackedWeight::Int16(PackedI16Matrix::quantize(&self.tensor(name)?, n, k)),
            _ => PackedWeight::Float32(PackedMatrix::pack(&self.tensor(name)?, n, k)),
        });
        self.source.release(&stored);
        if self.source.is_shared(&stored) {
            self.packed.borrow_mut().insert(stored, Arc::clone(&p));
        }
        Ok(p)
    }

    pub fn compute_type(&self) -> ComputeType {
        self.compute_type
    }

    pub fn float_order(&self) -> FloatOrder {
        self.source.float_order()
    }

    /// Drops the converted copy of a shared weight once its packed form is all that is used.
    pub fn forget_converted(&self, name: &str) {
        if let Some(stored) = self.stored_name(name) {
            self.converted.borrow_mut().remove(&stored);
        }
    }

    pub fn opt_tensor(&self, name: &str) -> Result<Option<Weight>> {
        if self.source.contains(name) {
            self.tensor(name).map(Some)
        } else {
            Ok(None)
        }
    }

    pub fn scalar(&self, name: &str) -> Result<Option<f64>> {
        self.mark(name);
        self.source.scalar(name)
    }

    pub fn flag(&self, name: &str, default: bool) -> Result<bool> {
        Ok(self.scalar(name)?.map(|v| v != 0.0).unwrap_or(default))
    }

    /// Fails when a stored variable (not an alias) was never read: it belongs to a model
    /// feature Tolk does not implement, and ignoring it would translate wrongly. Scalar
    /// attributes that are zero/false are disabled feature flags and are accepted.
    pub fn ensure_all_used(&self) -> Result<()> {
        let used = self.used.borrow();
        let mut unknown = Vec::new();
        let names = self.source.variable_names();
        for name in &names {
            if used.contains(name) {
                continue;
            }
            let is_disabled_flag = self
                .source
                .shape(name)
                .filter(|shape| shape.len() <= 1 && shape.iter().product::<usize>() == 1)
                .and_then(|_| self.source.scalar(name).ok().flatten())
                .is_some_and(|v| v == 0.0);
            if !is_disabled_flag {
                unknown.push(name.as_str());
            }
        }
        if unknown.is_empty() {
            return Ok(());
        }
        let features: Vec<String> = unknown.iter().map(|n| describe_feature(n)).collect::<BTreeSet<_>>().into_iter().collect();
        Err(Error::unsupported(format!(
            "the model uses features Tolk does not support: {} (variables {}{})",
            features.join("; "),
            unknown.iter().take(4).copied().collect::<Vec<_>>().join(", "),
            if unknown.len() > 4 { format!(" and {} more", unknown.len() - 4) } else { String::new() }
        )))
    }
}

/// Names the model feature an unrecognized CTranslate2 variable belongs to.
fn describe_feature(name: &str) -> String {
    const HINTS: &[(&str, &str)] = &[
        ("relative_position", "relative position representations"),
        ("relative_attention_bias", "T5 relative attention bias"),
        ("rotary", "rotary position embeddings"),
        ("alibi", "ALiBi attention biases"),
        ("num_heads_kv", "multi-query / grouped-query attention"),
        ("multi_query", "multi-query attention"),
        ("linear_0_noact", "gated linear units in the FFN"),
        ("sliding_window", "sliding-window attention"),
        ("parallel_residual", "parallel residual blocks"),
        ("project_in", "decoder input/output projections"),
        ("project_out", "decoder input/output projections"),
        ("scale_outputs", "scaled decoder outputs"),
        ("q_norm", "query/key normalization"),
        ("k_norm", "query/key normalization"),
        ("embeddings_1", "source factors"),
        ("lora", "LoRA adapters"),
        ("_zero", "zero-point (AWQ) quantization"),
    ];
    for (needle, feature) in HINTS {
        if name.contains(needle) {
            return (*feature).to_string();
        }
    }
    format!("unknown variable {name}")
}

fn check_shape(name: &str, t: &Tensor, expected: &[usize]) -> Result<()> {
    if t.shape() != expected {
        return Err(Error::invalid_model(format!(
            "model.bin: {name} has shape {:?}, expected {expected:?}",
            t.shape()
        )));
    }
    Ok(())
}

/// `y = x · Wᵀ + b` with `W` stored [out, in].
pub struct Linear {
    weight: Arc<PackedWeight>,
    bias: Option<Weight>,
}

impl Linear {
    pub fn load(w: &WeightReader, scope: &str, out_dim: usize, in_dim: usize) -> Result<Linear> {
        let weight = w.packed(&format!("{scope}/weight"), out_dim, in_dim)?;
        let bias = w.opt_tensor(&format!("{scope}/bias"))?;
        if let Some(b) = &bias {
            check_shape(&format!("{scope}/bias"), b, &[out_dim])?;
        }
        Ok(Linear { weight, bias })
    }

    pub fn out_dim(&self) -> usize {
        self.weight.rows()
    }

    pub fn in_dim(&self) -> usize {
        self.weight.cols()
    }

    pub fn weight(&self) -> &Arc<PackedWeight> {
        &self.weight
    }

    /// This layer restricted to the output features `ids` (a vocabulary subset): the
    /// product then costs `ids.len()` rows instead of all of them.
    pub fn select_rows(&self, ids: &[u32]) -> Linear {
        Linear {
            weight: Arc::new(self.weight.gather_rows(ids)),
            bias: self.bias.as_ref().map(|b| Arc::new(Tensor::from_vec(ids.iter().map(|&i| b[i as usize]).collect(), vec![ids.len()]))),
        }
    }

    /// `forward` followed by ReLU, fused where the kernel can.
    pub fn forward_relu(&self, ctx: &Ctx, x: &[f32], rows: usize, out: &mut Vec<f32>) {
        self.resize_output(rows, out);
        self.weight.matmul_relu(x, self.bias.as_deref().map(|b| &b[..]), out, rows, ctx.threads);
    }

    fn resize_output(&self, rows: usize, out: &mut Vec<f32>) {
        // Every element is overwritten, so only newly grown space is initialized (zeroing
        // the 65k-wide logits of every step would cost as much as writing them).
        let needed = rows * self.out_dim();
        if out.len() < needed {
            out.resize(needed, 0.0);
        }
        out.truncate(needed);
    }

    /// Computes `rows` outputs into `out` (resized to rows × out_dim).
    pub fn forward(&self, ctx: &Ctx, x: &[f32], rows: usize, out: &mut Vec<f32>) {
        self.resize_output(rows, out);
        self.weight.matmul(x, self.bias.as_deref().map(|b| &b[..]), out, rows, ctx.threads);
    }
}

/// LayerNorm (with beta) or RMSNorm (gamma only), as CTranslate2 decides from the weights.
pub struct Norm {
    gamma: Weight,
    beta: Option<Weight>,
    epsilon: f32,
    order: FloatOrder,
}

impl Norm {
    pub fn load(w: &WeightReader, scope: &str, dim: usize, epsilon: Option<f32>) -> Result<Norm> {
        let gamma = w.tensor(&format!("{scope}/gamma"))?;
        check_shape(&format!("{scope}/gamma"), &gamma, &[dim])?;
        let beta = w.opt_tensor(&format!("{scope}/beta"))?;
        if let Some(b) = &beta {
            check_shape(&format!("{scope}/beta"), b, &[dim])?;
        }
        // CTranslate2's defaults: 1e-5 for LayerNorm, 1e-6 for RMSNorm.
        let epsilon = epsilon.unwrap_or(if beta.is_some() { 1e-5 } else { 1e-6 });
        Ok(Norm { gamma, beta, epsilon, order: w.float_order() })
    }

    pub fn forward(&self, x: &mut [f32]) {
        match &self.beta {
            Some(beta) if self.order == FloatOrder::Marian => ops::layer_norm_sequential(x, &self.gamma, beta, self.epsilon),
            Some(beta) => ops::layer_norm(x, &self.gamma, beta, self.epsilon),
            None => ops::rms_norm(x, &self.gamma, self.epsilon),
        }
    }
}

/// Position encodings added to the scaled embeddings.
pub enum Positions {
    /// A stored table [max_positions, d] (learned, or sinusoids saved by the converter).
    Table(Weight),
    /// Sinusoids with [sin | cos] halves; position p uses (p + start): CTranslate2 starts
    /// at 1, Marian at 0 (its models say so with a `position_start` attribute).
    Sinusoidal { dim: usize, start: usize },
}

impl Positions {
    pub fn load(w: &WeightReader, scope: &str, dim: usize) -> Result<Positions> {
        let name = format!("{scope}/position_encodings/encodings");
        match w.opt_tensor(&name)? {
            Some(t) => {
                if t.shape().len() != 2 || t.shape()[1] != dim || t.shape()[0] == 0 {
                    return Err(Error::invalid_model(format!("model.bin: {name} has shape {:?}, expected [N, {dim}]", t.shape())));
                }
                Ok(Positions::Table(t))
            }
            None => {
                if dim < 4 || dim % 2 != 0 {
                    return Err(Error::invalid_model(format!("sinusoidal positions need an even model dimension >= 4, got {dim}")));
                }
                let start = w.scalar(&format!("{scope}/position_start"))?.unwrap_or(1.0);
                Ok(Positions::Sinusoidal { dim, start: start.clamp(0.0, 1.0) as usize })
            }
        }
    }

    /// The largest number of positions supported (None = unbounded).
    pub fn max_positions(&self) -> Option<usize> {
        match self {
            Positions::Table(t) => Some(t.rows()),
            Positions::Sinusoidal { .. } => None,
        }
    }

    /// Adds the encoding of `position` to `x` (one row).
    pub fn add(&self, position: usize, x: &mut [f32]) {
        match self {
            Positions::Table(t) => ops::add_assign(x, t.row(position)),
            Positions::Sinusoidal { dim, start } => {
                let half = dim / 2;
                let increment = 10000f32.ln() / (half - 1) as f32;
                let p = (position + start) as f32;
                for j in 0..half {
                    let timescale = (-increment * j as f32).exp();
                    let t = p * timescale;
                    x[j] += t.sin();
                    x[half + j] += t.cos();
                }
            }
        }
    }
}

/// How embeddings are scaled: CTranslate2's `scale_embeddings` is a flag (sqrt(d)) or a value.
pub fn embeddings_scale(w: &WeightReader, scope: &str, dim: usize) -> Result<Option<f32>> {
    let name = format!("{scope}/scale_embeddings");
    let raw = w.source.is_flag(&name);
    Ok(match (w.scalar(&name)?, raw) {
        (None, _) => Some((dim as f32).sqrt()),
        (Some(v), true) => (v != 0.0).then(|| (dim as f32).sqrt()),
        (Some(v), false) => (v != 1.0).then_some(v as f32),
    })
}

/// An embedding table: dense float rows, or packed rows read back dequantized: the output
/// projection it is tied to (so a shared 65k x 512 matrix is stored once) or, with a
/// quantized compute type, its own quantized table (CTranslate2 quantizes embeddings too).
pub enum EmbeddingTable {
    Dense(Weight),
    Packed(Arc<PackedWeight>),
}

impl EmbeddingTable {
    /// Loads `name`, reusing the packed projection when the model ties them together.
    pub fn load(w: &WeightReader, name: &str, tied_projection: &str) -> Result<EmbeddingTable> {
        let dims = w.dims(name)?;
        if dims.len() != 2 || dims[0] == 0 || dims[1] == 0 {
            return Err(Error::invalid_model(format!("model.bin: {name} has shape {dims:?}, expected [vocabulary, d]")));
        }
        let tied = w.contains(tied_projection) && w.stored_name(name) == w.stored_name(tied_projection);
        if tied || w.compute_type() != ComputeType::Float32 {
            let packed = w.packed(name, dims[0], dims[1])?;
            w.forget_converted(name);
            return Ok(EmbeddingTable::Packed(packed));
        }
        Ok(EmbeddingTable::Dense(w.tensor(name)?))
    }

    pub fn rows(&self) -> usize {
        match self {
            EmbeddingTable::Dense(t) => t.rows(),
            EmbeddingTable::Packed(p) => p.rows(),
        }
    }

    pub fn dim(&self) -> usize {
        match self {
            EmbeddingTable::Dense(t) => t.row_len(),
            EmbeddingTable::Packed(p) => p.cols(),
        }
    }

    /// Writes row `id` scaled by `scale` into `out`.
    pub fn lookup(&self, id: usize, scale: Option<f32>, out: &mut [f32]) {
        match self {
            EmbeddingTable::Dense(t) => out.copy_from_slice(t.row(id)),
            EmbeddingTable::Packed(p) => p.copy_row(id, out),
        }
        if let Some(s) = scale {
            out.iter_mut().for_each(|v| *v *= s);
        }
    }
}
