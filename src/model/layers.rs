//! Building blocks shared by the encoder and decoder: linear layers, normalization,
//! embeddings and position encodings, plus the weight reader that builds them by name.
use std::cell::{Cell, RefCell};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use crate::backend::{Backend, ComputeType, Ctx, EmbeddingRows, FloatOrder, MatrixData, PositionTable, Quantized, SinusoidTable, TopLogits};
use crate::error::{Error, Result};
use crate::format::WeightSource;
use crate::tensor::Tensor;

/// Reads weights by their spec name (CTranslate2's) and remembers which names were used,
/// so that any variable the model builder did not understand is reported instead of ignored.
pub struct WeightReader<'a, B: Backend> {
    source: &'a dyn WeightSource,
    backend: &'a B,
    /// What weights are converted to (concrete: float32, int8 or int16).
    compute_type: ComputeType,
    used: RefCell<BTreeSet<String>>,
    /// Converted tensors by stored name: aliases (tied embeddings) share one copy.
    converted: RefCell<HashMap<String, Weight>>,
    /// Prepared matrices by stored name, for weights shared by several layers.
    packed: RefCell<HashMap<String, Prepared<B::Matrix>>>,
    /// Vectors the backend holds, by stored name, for tables several stacks alias.
    vectors: RefCell<HashMap<String, Arc<B::Vector>>>,
    /// Stored tables recognized as sinusoids, by stored name (`None`: checked, not them).
    sinusoids: RefCell<HashMap<String, Option<Arc<SinusoidTable>>>>,
    /// Bytes of the matrices prepared so far, at the compute type's width.
    matrix_bytes: Cell<usize>,
}

/// A matrix prepared by the backend, with the `[rows, cols]` it was prepared as.
struct Prepared<M> {
    matrix: Arc<M>,
    rows: usize,
    cols: usize,
}

/// A weight shared by the layers that use it (tied embeddings and projections).
pub type Weight = Arc<Tensor>;

impl<'a, B: Backend> WeightReader<'a, B> {
    pub fn new(source: &'a dyn WeightSource, backend: &'a B, compute_type: ComputeType) -> Self {
        WeightReader {
            source,
            backend,
            compute_type,
            used: RefCell::new(BTreeSet::new()),
            converted: RefCell::new(HashMap::new()),
            packed: RefCell::new(HashMap::new()),
            vectors: RefCell::new(HashMap::new()),
            sinusoids: RefCell::new(HashMap::new()),
            matrix_bytes: Cell::new(0),
        }
    }

    /// Bytes of the weight matrices prepared (each shared one once), the bulk of a model's
    /// memory: one, two or four a value as the compute type keeps them.
    pub fn matrix_bytes(&self) -> usize {
        self.matrix_bytes.get()
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

    /// `name`'s tensor `t` as the backend holds vectors, once for all the names that alias
    /// one stored table (an encoder's and a decoder's positions, shared embeddings).
    pub fn shared_vector(&self, name: &str, t: Weight) -> Result<Arc<B::Vector>> {
        let stored = self.stored_name(name).ok_or_else(|| self.missing(name))?;
        if let Some(v) = self.vectors.borrow().get(&stored) {
            return Ok(Arc::clone(v));
        }
        let v = Arc::new(self.backend.vector(t)?);
        if self.source.is_shared(&stored) {
            self.vectors.borrow_mut().insert(stored, Arc::clone(&v));
        }
        Ok(v)
    }

    /// The generator of position table `name` (tensor `t`, `[rows, d]`) if it holds the
    /// float64 sinusoids [`SinusoidTable`] makes, checked once per stored table.
    pub fn recognized_sinusoids(&self, name: &str, t: &Tensor) -> Option<Arc<SinusoidTable>> {
        let stored = self.stored_name(name)?;
        if let Some(known) = self.sinusoids.borrow().get(&stored) {
            return known.clone();
        }
        let table = SinusoidTable::recognize(t, t.rows(), t.row_len()).map(Arc::new);
        self.sinusoids.borrow_mut().insert(stored, table.clone());
        table
    }

    /// "FILE: NAME has shape [..], expected EXPECTED", FILE the source's (`model.bin`, a
    /// Marian model).
    pub fn shape_error(&self, name: &str, shape: &[usize], expected: String) -> Error {
        Error::invalid_model(format!("{}: {name} has shape {shape:?}, expected {expected}", self.file_name()))
    }

    /// What the weights are read from, for messages (`model.bin`, a Marian model).
    pub fn file_name(&self) -> &str {
        self.source.file_name()
    }

    /// The stored variable a name refers to (after aliases).
    pub fn stored_name(&self, name: &str) -> Option<String> {
        self.source.stored_name(name)
    }

    pub fn backend(&self) -> &'a B {
        self.backend
    }

    /// A weight `[n, k]` prepared by the backend for the compute type; shared weights are
    /// prepared once.
    pub fn packed(&self, name: &str, n: usize, k: usize) -> Result<Arc<B::Matrix>> {
        let stored = self.stored_name(name).unwrap_or_default();
        if let Some(Prepared { matrix: p, rows, cols }) = self.packed.borrow().get(&stored) {
            if (*rows, *cols) != (n, k) {
                let file = self.source.file_name();
                return Err(Error::invalid_model(format!("{file}: {name} is [{rows}, {cols}], expected [{n}, {k}]")));
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
        // Saved in the compute type: handed over as stored. Otherwise through float32
        // (int8 <-> int16 dequantize and requantize).
        let data = match (self.compute_type, saved) {
            (ComputeType::Int8, Some(q @ Quantized::Int8 { .. })) | (ComputeType::Int16, Some(q @ Quantized::Int16 { .. })) => {
                self.mark(name);
                MatrixData::Quantized(q)
            }
            _ => MatrixData::Float(self.tensor(name)?),
        };
        let p = Arc::new(self.backend.matrix(data, n, k, self.compute_type)?);
        let width = match self.compute_type {
            ComputeType::Int8 => 1,
            ComputeType::Int16 | ComputeType::Float16 => 2,
            _ => 4,
        };
        self.matrix_bytes.set(self.matrix_bytes.get() + n * k * width);
        self.source.release(&stored);
        if self.source.is_shared(&stored) {
            self.packed.borrow_mut().insert(stored, Prepared { matrix: Arc::clone(&p), rows: n, cols: k });
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

fn check_shape<B: Backend>(w: &WeightReader<B>, name: &str, t: &Tensor, expected: &[usize]) -> Result<()> {
    if t.shape() != expected {
        return Err(w.shape_error(name, t.shape(), format!("{expected:?}")));
    }
    Ok(())
}

/// `y = x · Wᵀ + b` with `W` stored [out, in].
pub struct Linear<B: Backend> {
    weight: Arc<B::Matrix>,
    bias: Option<B::Vector>,
    out_dim: usize,
    in_dim: usize,
}

impl<B: Backend> Linear<B> {
    pub fn load(w: &WeightReader<B>, scope: &str, out_dim: usize, in_dim: usize) -> Result<Self> {
        // No layer of a model maps to or from nothing (a zero width read from a weight's
        // shape would pass its shape check and fail in the products).
        if out_dim == 0 || in_dim == 0 {
            return Err(Error::invalid_model(format!("{}: {scope}/weight has an empty dimension ({out_dim} x {in_dim})", w.file_name())));
        }
        let weight = w.packed(&format!("{scope}/weight"), out_dim, in_dim)?;
        let bias = match w.opt_tensor(&format!("{scope}/bias"))? {
            Some(b) => {
                check_shape(w, &format!("{scope}/bias"), &b, &[out_dim])?;
                Some(w.backend().vector(b)?)
            }
            None => None,
        };
        Ok(Linear { weight, bias, out_dim, in_dim })
    }

    pub fn out_dim(&self) -> usize {
        self.out_dim
    }

    pub fn in_dim(&self) -> usize {
        self.in_dim
    }

    /// This layer restricted to the output features `ids` (a vocabulary subset): the
    /// product then costs `ids.len()` rows instead of all of them.
    pub fn select_rows(&self, backend: &B, ids: &[u32]) -> Self {
        Linear {
            weight: Arc::new(backend.gather_rows(&self.weight, ids)),
            bias: self.bias.as_ref().map(|b| backend.gather(b, ids)),
            out_dim: ids.len(),
            in_dim: self.in_dim,
        }
    }

    /// Computes `rows` outputs into `out` (rows × out_dim).
    pub fn forward(&self, backend: &B, ctx: &Ctx, x: &B::Buffer, rows: usize, out: &mut B::Buffer) {
        backend.linear(ctx, x, rows, &self.weight, self.bias.as_ref(), false, out);
    }

    /// `forward` for the output layer, its `rows` outputs (the logits) written on the host.
    pub fn forward_to_host(&self, backend: &B, ctx: &Ctx, x: &B::Buffer, rows: usize, scratch: &mut B::Buffer, host: &mut Vec<f32>) {
        backend.logits(ctx, x, rows, &self.weight, self.bias.as_ref(), scratch, host);
    }

    /// Each row's largest output and its first column (`disabled[row]` counted as
    /// `f32::MIN`), where the backend finds them without the whole output.
    pub fn best_outputs(&self, backend: &B, ctx: &Ctx, x: &B::Buffer, rows: usize, disabled: &[&[u32]]) -> Option<Vec<(usize, f32)>> {
        backend.best_logits(ctx, x, rows, &self.weight, self.bias.as_ref(), disabled)
    }

    /// Each row's `k` largest outputs and its log-sum-exp (`disabled[row]` counted as
    /// `f32::MIN`), where the backend finds them without the whole output.
    #[allow(clippy::too_many_arguments)]
    pub fn top_outputs(&self, backend: &B, ctx: &Ctx, x: &B::Buffer, rows: usize, disabled: &[&[u32]], k: usize) -> Option<TopLogits> {
        backend.top_logits(ctx, x, rows, &self.weight, self.bias.as_ref(), disabled, k)
    }

    /// `forward` followed by ReLU, fused where the kernel can.
    pub fn forward_relu(&self, backend: &B, ctx: &Ctx, x: &B::Buffer, rows: usize, out: &mut B::Buffer) {
        backend.linear(ctx, x, rows, &self.weight, self.bias.as_ref(), true, out);
    }
}

/// LayerNorm (with beta) or RMSNorm (gamma only), as CTranslate2 decides from the weights.
pub struct Norm<B: Backend> {
    gamma: B::Vector,
    beta: Option<B::Vector>,
    epsilon: f32,
    order: FloatOrder,
}

impl<B: Backend> Norm<B> {
    pub fn load(w: &WeightReader<B>, scope: &str, dim: usize, epsilon: Option<f32>) -> Result<Self> {
        let gamma = w.tensor(&format!("{scope}/gamma"))?;
        check_shape(w, &format!("{scope}/gamma"), &gamma, &[dim])?;
        let beta = w.opt_tensor(&format!("{scope}/beta"))?;
        if let Some(b) = &beta {
            check_shape(w, &format!("{scope}/beta"), b, &[dim])?;
        }
        // CTranslate2's defaults: 1e-5 for LayerNorm, 1e-6 for RMSNorm.
        let epsilon = epsilon.unwrap_or(if beta.is_some() { 1e-5 } else { 1e-6 });
        let backend = w.backend();
        Ok(Norm {
            gamma: backend.vector(gamma)?,
            beta: beta.map(|b| backend.vector(b)).transpose()?,
            epsilon,
            order: w.float_order(),
        })
    }

    pub fn forward(&self, backend: &B, x: &mut B::Buffer) {
        backend.layer_norm(x, &self.gamma, self.beta.as_ref(), self.epsilon, self.order);
    }
}

/// Position encodings added to the scaled embeddings.
pub enum Positions<B: Backend> {
    /// A stored table [max_positions, d] (learned, or sinusoids saved by the converter),
    /// shared by the stacks whose names alias it.
    Table { table: Arc<B::Vector>, rows: usize },
    /// A stored table of float64 sinusoids, generated on the host as positions are reached
    /// ([`Backend::GENERATES_POSITION_TABLES`]).
    Generated(Arc<SinusoidTable>),
    /// Sinusoids with [sin | cos] halves; position p uses (p + start): CTranslate2 starts
    /// at 1, Marian at 0 (its models say so with a `position_start` attribute).
    Sinusoidal { start: usize },
}

impl<B: Backend> Positions<B> {
    pub fn load(w: &WeightReader<B>, scope: &str, dim: usize) -> Result<Self> {
        let name = format!("{scope}/position_encodings/encodings");
        match w.opt_tensor(&name)? {
            Some(t) => {
                if t.shape().len() != 2 || t.shape()[1] != dim || t.shape()[0] == 0 {
                    return Err(w.shape_error(&name, t.shape(), format!("[N, {dim}]")));
                }
                if B::GENERATES_POSITION_TABLES {
                    if let Some(table) = w.recognized_sinusoids(&name, &t) {
                        return Ok(Positions::Generated(table));
                    }
                }
                Ok(Positions::Table { rows: t.rows(), table: w.shared_vector(&name, t)? })
            }
            None => {
                if dim < 4 || !dim.is_multiple_of(2) {
                    return Err(Error::invalid_model(format!("sinusoidal positions need an even model dimension >= 4, got {dim}")));
                }
                let start = w.scalar(&format!("{scope}/position_start"))?.unwrap_or(1.0);
                Ok(Positions::Sinusoidal { start: start.clamp(0.0, 1.0) as usize })
            }
        }
    }

    /// The largest number of positions supported (None = unbounded).
    pub fn max_positions(&self) -> Option<usize> {
        match self {
            Positions::Table { rows, .. } => Some(*rows),
            Positions::Generated(table) => Some(table.rows()),
            Positions::Sinusoidal { .. } => None,
        }
    }

    /// Adds the encoding of `positions[r]` to row `r` of `x` (width `dim`).
    pub fn add(&self, backend: &B, x: &mut B::Buffer, dim: usize, positions: &[usize]) {
        let table = match self {
            Positions::Table { table, .. } => PositionTable::Table(table.as_ref()),
            Positions::Generated(table) => PositionTable::Generated(table),
            Positions::Sinusoidal { start } => PositionTable::Sinusoidal { start: *start },
        };
        backend.add_positions(x, dim, table, positions);
    }
}

/// How embeddings are scaled: CTranslate2's `scale_embeddings` is a flag (sqrt(d)) or a value.
pub fn embeddings_scale<B: Backend>(w: &WeightReader<B>, scope: &str, dim: usize) -> Result<Option<f32>> {
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
pub struct EmbeddingTable<B: Backend> {
    rows: Rows<B>,
    vocabulary: usize,
    dim: usize,
}

enum Rows<B: Backend> {
    Dense(Arc<B::Vector>),
    Packed(Arc<B::Matrix>),
}

impl<B: Backend> EmbeddingTable<B> {
    /// Loads `name`, reusing the packed projection when the model ties them together.
    pub fn load(w: &WeightReader<B>, name: &str, tied_projection: &str) -> Result<Self> {
        let dims = w.dims(name)?;
        if dims.len() != 2 || dims[0] == 0 || dims[1] == 0 {
            return Err(w.shape_error(name, &dims, "[vocabulary, d]".into()));
        }
        let (vocabulary, dim) = (dims[0], dims[1]);
        let tied = w.contains(tied_projection) && w.stored_name(name) == w.stored_name(tied_projection);
        let rows = if tied || w.compute_type() != ComputeType::Float32 {
            let packed = w.packed(name, vocabulary, dim)?;
            w.forget_converted(name);
            Rows::Packed(packed)
        } else {
            Rows::Dense(w.shared_vector(name, w.tensor(name)?)?)
        };
        Ok(EmbeddingTable { rows, vocabulary, dim })
    }

    pub fn rows(&self) -> usize {
        self.vocabulary
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Row `ids[r]` scaled by `scale` as row `r` of `out`.
    pub fn lookup(&self, backend: &B, ids: &[u32], scale: Option<f32>, out: &mut B::Buffer) {
        let rows = match &self.rows {
            Rows::Dense(t) => EmbeddingRows::Dense(t.as_ref()),
            Rows::Packed(p) => EmbeddingRows::Packed(p.as_ref()),
        };
        backend.embed(rows, self.dim, ids, scale, out);
    }
}
