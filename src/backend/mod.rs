//! Compute backends: where and how a model's arithmetic runs.
//!
//! Layers (in `model/`) hold their weights in a backend's types and run every operation
//! through [`Backend`]: matrix products, norms, embeddings, attention with its cache, the
//! recurrent cells, row reordering for beams and the logits' way back to the host. The
//! activations are [`Backend::Buffer`]s, which a device backend keeps in device memory;
//! only token ids go in and logits come out. The CPU backend (`cpu`) implements it with
//! kernels chosen per ISA at run time. What a backend computes in (the compute type) is
//! its choice, named here so that models and formats can say what they hold without
//! knowing any kernel.
pub mod cpu;
pub mod cuda;
pub mod positions;

use std::borrow::Cow;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::tensor::Tensor;
pub use positions::SinusoidTable;

/// The order float operations run in, which decides the last bits of their results
/// (and, through int8 quantization, sometimes a word): each engine's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FloatOrder {
    /// CTranslate2's: its AVX2 layer norm and softmax, MKL's orders in attention.
    #[default]
    Ctranslate2,
    /// Marian's as the Bergamot engine runs it: sequential sums without fused
    /// multiply-adds in layer norm and attention, Eigen's GEMM order for `Q·Kᵀ`.
    Marian,
}

/// How a model file stores its matrices, which decides [`ComputeType::Default`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SavedPrecision {
    Float,
    Int8,
    Int16,
}

/// Numeric precision of the computation, named as in CTranslate2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ComputeType {
    /// The type the weights are saved in (int8 -> int8, int16 -> int16, else float32).
    #[default]
    Default,
    /// The fastest type for this CPU: int8 where SIMD integer kernels exist.
    Auto,
    Float32,
    /// int8 weights and activations with float32 everything else (CTranslate2's
    /// `int8_float32`).
    Int8,
    /// int16 weights and activations.
    Int16,
    /// float16 weights and products (float32 accumulation), float32 everything else. CUDA
    /// only, as in CTranslate2.
    Float16,
}

impl ComputeType {
    /// Parses CTranslate2's names. Half-precision types are refused on CPU, as in CTranslate2.
    pub fn parse(name: &str) -> Result<ComputeType> {
        match name {
            "default" => Ok(ComputeType::Default),
            "auto" => Ok(ComputeType::Auto),
            "float32" | "float" => Ok(ComputeType::Float32),
            "int8" | "int8_float32" => Ok(ComputeType::Int8),
            "int16" => Ok(ComputeType::Int16),
            "float16" => Ok(ComputeType::Float16),
            "int8_float16" | "int8_bfloat16" | "bfloat16" => Err(Error::unsupported(format!(
                "compute type {name:?} is not supported (use float32, int8 or int16 on the CPU, float32 or float16 on a GPU)"
            ))),
            other => Err(Error::invalid_argument(format!(
                "unknown compute type {other:?} (expected default, auto, float32, float16, int8, int8_float32 or int16)"
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ComputeType::Default => "default",
            ComputeType::Auto => "auto",
            ComputeType::Float32 => "float32",
            ComputeType::Int8 => "int8_float32",
            ComputeType::Int16 => "int16",
            ComputeType::Float16 => "float16",
        }
    }

    /// The concrete type on `device` for a model whose weights are saved as `saved`. The
    /// CUDA backend computes in float32 whatever the weights are saved as (stored int8 and
    /// int16 are dequantized when uploaded); the integer types are the CPU's kernels.
    pub fn resolve_on(self, device: &Device, saved: SavedPrecision) -> Result<ComputeType> {
        match (device, self) {
            (Device::Cpu, ComputeType::Float16) => {
                Err(Error::unsupported("compute type float16 needs a CUDA GPU (on the CPU: float32, int8 or int16)"))
            }
            (Device::Cpu, requested) => Ok(requested.resolve(saved)),
            (Device::Cuda(_), ComputeType::Default | ComputeType::Auto | ComputeType::Float32) => Ok(ComputeType::Float32),
            (Device::Cuda(_), ComputeType::Float16) => Ok(ComputeType::Float16),
            (Device::Cuda(_), other) => Err(Error::unsupported(format!(
                "compute type {} runs on the CPU only: the CUDA backend computes in float32 or float16",
                other.name()
            ))),
        }
    }

    /// The concrete type for a model whose weights are saved as `saved`, on the CPU.
    pub fn resolve(self, saved: SavedPrecision) -> ComputeType {
        match self {
            ComputeType::Default => match saved {
                SavedPrecision::Int8 => ComputeType::Int8,
                SavedPrecision::Int16 => ComputeType::Int16,
                SavedPrecision::Float => ComputeType::Float32,
            },
            ComputeType::Auto if cpu::isa::current() == cpu::isa::Isa::Scalar => ComputeType::Float32,
            ComputeType::Auto => ComputeType::Int8,
            concrete => concrete,
        }
    }
}


/// What [`Backend::top_logits`] finds: `k` (column, logit) pairs per row, best first
/// (row `r`'s at `candidates[r * k..]`), and each row's log-sum-exp.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TopLogits {
    pub k: usize,
    pub candidates: Vec<(usize, f32)>,
    pub log_sum_exp: Vec<f32>,
}

/// How a decoding keeps the attention keys and values it reuses at every step: the
/// self-attention cache and the encoder output's keys/values of cross-attention. They are
/// most of a decoding's memory (at 32 rows of the zh-en model, 68 of int8 greedy's 192 MB).
/// `Float32` computes exactly what CTranslate2 does. The compact types are rounded once when
/// stored and widened back to float32 before each attention: the results differ in the
/// last bits, and through int8 activations sometimes in a word (on zh-en: BLEU within
/// 0.05 with float32 compute; with int8 compute about half the sentences change and BLEU
/// moves by a few tenths either way).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum KvCacheType {
    #[default]
    Float32,
    /// bfloat16: half the memory, float32's range, 8 significant bits.
    BFloat16,
    /// int8 with one float32 scale per head and position (the largest magnitude / 127):
    /// 27% of the memory at 64-wide heads.
    Int8,
}

impl KvCacheType {
    pub fn parse(name: &str) -> Result<KvCacheType> {
        match name {
            "default" | "float32" | "float" => Ok(KvCacheType::Float32),
            "bfloat16" | "bf16" => Ok(KvCacheType::BFloat16),
            "int8" => Ok(KvCacheType::Int8),
            other => Err(Error::invalid_argument(format!("unknown kv_cache_type {other:?} (expected float32, bfloat16 or int8)"))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvCacheType::Float32 => "float32",
            KvCacheType::BFloat16 => "bfloat16",
            KvCacheType::Int8 => "int8",
        }
    }

    /// The float32 slots one stored row of `len` values takes, scaled in `chunk`-wide
    /// pieces (a head): the width of the buffers that hold such rows.
    pub fn row_slots(self, len: usize, chunk: usize) -> usize {
        match self {
            KvCacheType::Float32 => len,
            KvCacheType::BFloat16 => len.div_ceil(2),
            KvCacheType::Int8 => len.div_ceil(4) + len.div_ceil(chunk.max(1)),
        }
    }
}

/// Feed-forward activations, numbered as CTranslate2 stores them (`*/activation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    Relu,
    GeluTanh,
    Swish,
    Gelu,
    GeluSigmoid,
    Tanh,
}

impl Activation {
    pub fn from_ct2_id(id: i64) -> Option<Activation> {
        Some(match id {
            0 => Activation::Relu,
            1 => Activation::GeluTanh,
            2 => Activation::Swish,
            3 => Activation::Gelu,
            4 => Activation::GeluSigmoid,
            5 => Activation::Tanh,
            _ => return None,
        })
    }
}

/// A weight as stored quantized (`w = q / scale`). int8 values are borrowed from the
/// mapped model file where they lie there as stored: a copy of them (78 MB on zh-en) had
/// been a fifth of an int8 model's load.
pub enum Quantized<'a> {
    /// One scale per row; `activation_scale` is a precomputed, fixed scale for the inputs
    /// of the product (Marian's `*_QuantMultA` "alphas"), `None` = per row at run time;
    /// `intgemm` asks for the products to reproduce intgemm's shifted int8 multiply.
    Int8 { values: Cow<'a, [i8]>, scales: Vec<f32>, activation_scale: Option<f32>, intgemm: bool },
    /// One scale for the whole tensor.
    Int16 { values: Vec<i16>, scale: f32 },
}

/// A weight matrix `[n, k]` as a model file hands it over, before the backend prepares it.
pub enum MatrixData<'a> {
    Float(Arc<Tensor>),
    Quantized(Quantized<'a>),
}

/// Per-call execution settings shared by every operation of one translation.
#[derive(Debug, Clone, Copy)]
pub struct Ctx {
    /// Threads a single matrix product may use (the translator's intra_threads).
    pub threads: usize,
}

impl Default for Ctx {
    fn default() -> Self {
        Ctx { threads: 1 }
    }
}

/// Where the rows of a batch of sequences lie in one buffer (concatenated, no padding):
/// sequence `i` occupies rows `offsets[i] .. offsets[i] + lengths[i]`.
#[derive(Debug, Clone, Default)]
pub struct SequenceLayout {
    pub offsets: Vec<usize>,
    pub lengths: Vec<usize>,
    /// Per sequence, the longest length of the batch it was encoded in: CTranslate2 pads a
    /// batch's sources to it, which decides the summation order Tolk reproduces. Sequences
    /// appended from another batch (continuous batching) keep their own batch's value.
    pub padded: Vec<usize>,
}

impl SequenceLayout {
    pub fn new(lengths: Vec<usize>) -> SequenceLayout {
        let offsets = lengths.iter().scan(0, |total, &len| Some(std::mem::replace(total, *total + len))).collect();
        let longest = lengths.iter().copied().max().unwrap_or(0);
        SequenceLayout { offsets, padded: vec![longest; lengths.len()], lengths }
    }

    pub fn total_rows(&self) -> usize {
        self.lengths.iter().sum()
    }

    /// The layout of sequences `kept` (in that order) alone, and the rows they hold here.
    pub fn select(&self, kept: &[usize]) -> (SequenceLayout, Vec<usize>) {
        let rows = kept.iter().flat_map(|&e| self.offsets[e]..self.offsets[e] + self.lengths[e]).collect();
        let mut layout = SequenceLayout::new(kept.iter().map(|&e| self.lengths[e]).collect());
        layout.padded = kept.iter().map(|&e| self.padded[e]).collect();
        (layout, rows)
    }

    /// Appends the sequences of `other` (their rows follow this layout's rows).
    pub fn append(&mut self, other: SequenceLayout) {
        let base = self.total_rows();
        self.offsets.extend(other.offsets.iter().map(|o| o + base));
        self.lengths.extend(other.lengths);
        self.padded.extend(other.padded);
    }
}

/// An embedding table as the backend stores it: dense float rows, or the rows of a packed
/// matrix read back (the output projection it is tied to, or a quantized table).
pub enum EmbeddingRows<'a, B: Backend> {
    Dense(&'a B::Vector),
    Packed(&'a B::Matrix),
}

/// Position encodings added to embeddings.
pub enum PositionTable<'a, B: Backend> {
    /// A stored table `[max_positions, d]`.
    Table(&'a B::Vector),
    /// Sinusoids with `[sin | cos]` halves; position p is encoded as `p + start`.
    Sinusoidal { start: usize },
    /// A stored table recognized as float64 sinusoids, generated on the host
    /// ([`Backend::GENERATES_POSITION_TABLES`]).
    Generated(&'a SinusoidTable),
}

/// Multi-head attention settings of a stack.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    pub num_heads: usize,
    /// Model dimension (all heads).
    pub dim: usize,
    pub order: FloatOrder,
}

/// The operations a Transformer encoder-decoder runs, over the backend's own buffers.
/// A buffer holds a row-major float32 matrix; operations size their outputs.
pub trait Backend: Clone + Send + Sync + 'static {
    /// Activations `[rows, cols]`.
    type Buffer: Default + Send;
    /// A weight matrix `[n, k]` prepared for products (packed, quantized, on the device).
    type Matrix: Send + Sync;
    /// A float32 parameter: a bias, a norm's gain, an embedding or position table.
    type Vector: Send + Sync;
    /// The keys and values one decoder self-attention layer has seen, per row.
    type KvCache: Send;
    /// The cross-attention keys and values of one decoder layer, per example decoded.
    type MemoryKv: Default + Send;

    /// Whether a stored position table that [`SinusoidTable::recognize`]s is generated row
    /// by row on the host rather than held as a vector: where vectors live in host memory
    /// (no table read from the mapped file or owned for the few rows a translation uses).
    const GENERATES_POSITION_TABLES: bool = false;

    /// A short name for logs and `--verbose` ("cpu (avx512vnni)").
    fn name(&self) -> String;

    /// Prepares a weight for products in `compute_type` (concrete: float32, int8, int16).
    fn matrix(&self, data: MatrixData<'_>, n: usize, k: usize, compute_type: ComputeType) -> Result<Self::Matrix>;
    /// The rows `ids` of a weight (output features), prepared the same way.
    fn gather_rows(&self, matrix: &Self::Matrix, ids: &[u32]) -> Self::Matrix;
    fn vector(&self, data: Arc<Tensor>) -> Result<Self::Vector>;
    /// The elements `ids` of a vector.
    fn gather(&self, vector: &Self::Vector, ids: &[u32]) -> Self::Vector;

    /// `out = x · Wᵀ (+ bias)` (then ReLU when `relu`) for `rows` rows; W is `[n, k]`.
    #[allow(clippy::too_many_arguments)]
    fn linear(&self, ctx: &Ctx, x: &Self::Buffer, rows: usize, w: &Self::Matrix, bias: Option<&Self::Vector>, relu: bool, out: &mut Self::Buffer);
    /// Layer norm of each row (RMS norm without `beta`), in place.
    fn layer_norm(&self, x: &mut Self::Buffer, gamma: &Self::Vector, beta: Option<&Self::Vector>, epsilon: f32, order: FloatOrder);
    /// The activation of every element, in place.
    fn activation(&self, ctx: &Ctx, x: &mut Self::Buffer, activation: Activation);
    /// `x += y`.
    fn add(&self, x: &mut Self::Buffer, y: &Self::Buffer);
    fn copy(&self, src: &Self::Buffer, dst: &mut Self::Buffer);
    /// `out` = `rows` zero rows of width `dim`.
    fn zeros(&self, out: &mut Self::Buffer, rows: usize, dim: usize);

    /// `out[r]` = row `ids[r]` of the table (width `dim`), times `scale`.
    fn embed(&self, table: EmbeddingRows<'_, Self>, dim: usize, ids: &[u32], scale: Option<f32>, out: &mut Self::Buffer);
    /// Adds the encoding of position `positions[r]` to row `r` of `x` (width `dim`).
    fn add_positions(&self, x: &mut Self::Buffer, dim: usize, table: PositionTable<'_, Self>, positions: &[usize]);

    /// Self-attention within each sequence of a batch (the encoder): `qkv` holds each
    /// row's fused `[q | k | v]`; writes the attended rows `[rows, dim]`. This and the other
    /// attention operations may spread their query rows over `ctx.threads`.
    fn sequence_attention(&self, ctx: &Ctx, qkv: &Self::Buffer, layout: &SequenceLayout, shape: AttentionShape, out: &mut Self::Buffer);
    /// Whether decodings here can keep their keys/values as `kv` (a device backend: float32 only).
    fn stores_kv_as(&self, kv: KvCacheType) -> bool {
        kv == KvCacheType::Float32
    }
    /// A cache storing its keys/values as `kv` (one `stores_kv_as`).
    fn new_kv_cache(&self, rows: usize, kv: KvCacheType) -> Self::KvCache;
    /// One decoder step of self-attention: appends each row's keys and values (from the
    /// fused `qkv`) to the cache, then attends with its query over all of them.
    fn cached_attention(&self, ctx: &Ctx, qkv: &Self::Buffer, cache: &mut Self::KvCache, shape: AttentionShape, out: &mut Self::Buffer);
    /// Keeps cache rows `sources[i]` as row `i`.
    fn reorder_kv_cache(&self, cache: &mut Self::KvCache, sources: &[usize]);
    /// Frees what the cache keeps for reuse but no row holds.
    fn shrink_kv_cache(&self, _cache: &mut Self::KvCache) {}
    /// Appends the examples of `lengths` to `memory`: their projected `[k | v]` positions,
    /// `rows` (`[Σ lengths, width]` float32, whose contents this may take), stored as `kv`
    /// (one `stores_kv_as`) in pieces of `chunk` values.
    #[allow(clippy::too_many_arguments)]
    fn append_memory_kv(&self, memory: &mut Self::MemoryKv, rows: &mut Self::Buffer, lengths: &[usize], width: usize, kv: KvCacheType, chunk: usize);
    /// Keeps the examples `kept` (ascending) of `memory`, laid out as `layout`, and frees
    /// the others'; `slots` floats a stored position.
    fn keep_memory_kv(&self, memory: &mut Self::MemoryKv, layout: &SequenceLayout, kept: &[usize], slots: usize);
    /// Whether `keep_memory_kv` costs nothing per kept example: finished examples are then
    /// dropped as soon as they finish, else once they hold half the memory.
    fn drops_memory_kv_freely(&self) -> bool {
        false
    }
    /// One decoder step of encoder-decoder attention: row `r` attends with `query[r]`
    /// over the memory keys/values (fused `[k | v]` rows, stored as `kv`) of example
    /// `row_example[r]`.
    #[allow(clippy::too_many_arguments)]
    fn memory_attention(
        &self,
        ctx: &Ctx,
        query: &Self::Buffer,
        memory_kv: &Self::MemoryKv,
        kv: KvCacheType,
        memory: &SequenceLayout,
        row_example: &[usize],
        shape: AttentionShape,
        out: &mut Self::Buffer,
    );

    /// Whether `memory_attention_weights` gives the weights on this backend.
    fn gives_attention_weights(&self) -> bool {
        false
    }
    /// CTranslate2's alignment attention of a decoder step, what `return_attention` returns:
    /// for each row of `memory_attention`, its attention probabilities over its example's
    /// memory positions averaged over heads `0..heads`. `None` where the backend does not
    /// give them (the searches then refuse `return_attention`).
    #[allow(clippy::too_many_arguments)]
    fn memory_attention_weights(
        &self,
        _ctx: &Ctx,
        _query: &Self::Buffer,
        _memory_kv: &Self::MemoryKv,
        _kv: KvCacheType,
        _memory: &SequenceLayout,
        _row_example: &[usize],
        _shape: AttentionShape,
        _heads: usize,
    ) -> Option<Vec<Vec<f32>>> {
        None
    }

    /// The SSRU cell: `c = f * c + (1 - f) * input` with `f = sigmoid(forget)`, `out = relu(c)`.
    fn ssru(&self, cells: &mut Self::Buffer, input: &Self::Buffer, forget: &Self::Buffer, out: &mut Self::Buffer);
    /// Average attention's running mean after `step` earlier inputs: `g = (g * step + x) / (step + 1)`.
    fn running_average(&self, average: &mut Self::Buffer, x: &Self::Buffer, step: usize);
    /// Average attention's gate: `y = sigmoid(input_gate) * x + sigmoid(forget_gate) * y`.
    fn gate(&self, y: &mut Self::Buffer, x: &Self::Buffer, input_gate: &Self::Buffer, forget_gate: &Self::Buffer);
    /// Keeps rows `sources[i]` (width `dim`) as row `i`.
    fn reorder_rows(&self, x: &mut Self::Buffer, dim: usize, sources: &[usize]);

    /// Whether `append_rows` and `append_kv_cache` work here: a decoding can then take in
    /// new sentences while others are still being decoded (continuous batching).
    fn can_append_rows(&self) -> bool {
        false
    }
    /// Appends the rows of `src` after those of `dst` (only where `can_append_rows`).
    fn append_rows(&self, _dst: &mut Self::Buffer, _src: &Self::Buffer) {
        unreachable!("append_rows is only called where can_append_rows")
    }
    /// Sets rows `rows` of `x` (width `dim`) to zero (only where `can_append_rows`: rows
    /// that joined a decoding later start from a zero embedding on their own first step).
    fn zero_rows(&self, _x: &mut Self::Buffer, _dim: usize, _rows: &[usize]) {
        unreachable!("zero_rows is only called where can_append_rows")
    }
    /// Rows the encoder's feed-forward layers take at a time, for a backend whose memory
    /// matters more than the products' size: their hidden activations (rows x 4d floats)
    /// are the encoder's largest buffer. `None`: all rows at once. Each row's result must
    /// not depend on how many rows a product takes.
    fn feed_forward_rows(&self) -> Option<usize> {
        None
    }
    /// `dst` = rows `first..first + count` of `src` (width `dim`); only where `feed_forward_rows`.
    fn copy_rows(&self, _src: &Self::Buffer, _dim: usize, _first: usize, _count: usize, _dst: &mut Self::Buffer) {
        unreachable!("copy_rows is only called where feed_forward_rows")
    }
    /// Rows `first..` of `dst` (width `dim`) = the rows of `src`; only where `feed_forward_rows`.
    fn write_rows(&self, _dst: &mut Self::Buffer, _dim: usize, _first: usize, _src: &Self::Buffer) {
        unreachable!("write_rows is only called where feed_forward_rows")
    }
    /// Appends the rows of cache `src` after those of `dst` (only where `can_append_rows`).
    fn append_kv_cache(&self, _dst: &mut Self::KvCache, _src: Self::KvCache) {
        unreachable!("append_kv_cache is only called where can_append_rows")
    }

    /// For each row of the output layer `x · Wᵀ (+ bias)`, its largest logit and the first
    /// column holding it, columns `disabled[row]` counted as `f32::MIN` as `decode::disable`
    /// sets them (greedy search without scores), where the backend finds them without
    /// writing the logits out; else `None`.
    #[allow(clippy::too_many_arguments)]
    fn best_logits(
        &self,
        _ctx: &Ctx,
        _x: &Self::Buffer,
        _rows: usize,
        _w: &Self::Matrix,
        _bias: Option<&Self::Vector>,
        _disabled: &[&[u32]],
    ) -> Option<Vec<(usize, f32)>> {
        None
    }

    /// For each row of the output layer `x · Wᵀ (+ bias)`, with columns `disabled[row]`
    /// counted as `f32::MIN` (as `decode::disable` sets them): its `k` largest logits
    /// (column, value; best first, the lower column on ties) and the log-sum-exp of the
    /// row, where the backend finds them without handing the logits over (a GPU: beam
    /// search then moves `k` candidates per row instead of the whole vocabulary); else
    /// `None`.
    #[allow(clippy::too_many_arguments)]
    fn top_logits(
        &self,
        _ctx: &Ctx,
        _x: &Self::Buffer,
        _rows: usize,
        _w: &Self::Matrix,
        _bias: Option<&Self::Vector>,
        _disabled: &[&[u32]],
        _k: usize,
    ) -> Option<TopLogits> {
        None
    }

    /// Hands the logits over to the host (decoding runs there).
    fn logits_to_host(&self, logits: &mut Self::Buffer, host: &mut Vec<f32>);

    /// The output layer: `host = x · Wᵀ (+ bias)` for `rows` rows, on the host, through
    /// `scratch` where the backend computes elsewhere.
    #[allow(clippy::too_many_arguments)]
    fn logits(
        &self,
        ctx: &Ctx,
        x: &Self::Buffer,
        rows: usize,
        w: &Self::Matrix,
        bias: Option<&Self::Vector>,
        scratch: &mut Self::Buffer,
        host: &mut Vec<f32>,
    ) {
        self.linear(ctx, x, rows, w, bias, false, scratch);
        self.logits_to_host(scratch, host);
    }
}

/// The device a model is asked to run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceRequest {
    /// A usable CUDA GPU when there is one, else the CPU.
    #[default]
    Auto,
    Cpu,
    /// A CUDA GPU, or an error saying why none is usable.
    Cuda,
}

impl DeviceRequest {
    pub fn parse(name: &str) -> Result<DeviceRequest> {
        match name {
            "auto" => Ok(DeviceRequest::Auto),
            "cpu" => Ok(DeviceRequest::Cpu),
            "cuda" | "gpu" => Ok(DeviceRequest::Cuda),
            other => Err(Error::invalid_argument(format!("unknown device {other:?} (expected \"auto\", \"cpu\" or \"cuda\")"))),
        }
    }
}

/// The device a model runs on.
#[derive(Debug, Clone)]
pub enum Device {
    Cpu,
    Cuda(cuda::DeviceInfo),
}

impl Device {
    /// Resolves a request for a model computing in `compute_type`. `Auto` (or what
    /// `TOLK_DEVICE=cpu|cuda|auto` asks for in its place, as `TOLK_CPU_ISA` lowers the CPU
    /// level: a test run or an application pins the device without changing code) takes
    /// GPU `index` when the CUDA probe finds it usable (driver, cuBLAS, NVRTC, a device,
    /// compiled kernels), else the CPU; with an integer compute type (int8, int16) it means
    /// the CPU, whose kernels those are. `Cuda` fails with the probe's reason.
    pub fn select(request: DeviceRequest, index: usize, compute_type: ComputeType) -> Result<Device> {
        let request = match (request, std::env::var("TOLK_DEVICE")) {
            (DeviceRequest::Auto, Ok(name)) if !name.is_empty() => {
                DeviceRequest::parse(&name).map_err(|e| Error::invalid_argument(format!("TOLK_DEVICE: {}", e.message)))?
            }
            (request, _) => request,
        };
        match (request, compute_type) {
            (DeviceRequest::Cpu, _) | (DeviceRequest::Auto, ComputeType::Int8 | ComputeType::Int16) => Ok(Device::Cpu),
            // float16 has no CPU kernels: "auto" means the GPU, and its absence is an error.
            (DeviceRequest::Auto, ComputeType::Float16) => cuda::probe(index)
                .map(Device::Cuda)
                .map_err(|e| Error::new(e.kind, format!("compute type float16 needs a CUDA GPU: {}", e.message))),
            (DeviceRequest::Auto, _) => Ok(cuda::probe(index).map(Device::Cuda).unwrap_or(Device::Cpu)),
            (DeviceRequest::Cuda, _) => cuda::probe(index)
                .map(Device::Cuda)
                .map_err(|e| Error::new(e.kind, format!("device \"cuda\" is not usable: {}", e.message))),
        }
    }

    /// "cpu" or "cuda".
    pub fn kind(&self) -> &'static str {
        match self {
            Device::Cpu => "cpu",
            Device::Cuda(_) => "cuda",
        }
    }

    /// For logs and `--verbose`: "cpu (avx512vnni)", "cuda:0 (NVIDIA H100 80GB HBM3; cuBLAS
    /// libcublas.so.13, NVRTC 13.0 libnvrtc.so.13)".
    pub fn description(&self) -> String {
        match self {
            Device::Cpu => format!("cpu ({})", cpu::isa::current().name()),
            Device::Cuda(info) if info.libraries.is_empty() => format!("cuda:{} ({})", info.index, info.name),
            Device::Cuda(info) => format!("cuda:{} ({}; {})", info.index, info.name, info.libraries),
        }
    }

    /// Whether two devices are the same one.
    pub fn same_as(&self, other: &Device) -> bool {
        match (self, other) {
            (Device::Cpu, Device::Cpu) => true,
            (Device::Cuda(a), Device::Cuda(b)) => a.index == b.index,
            _ => false,
        }
    }
}
