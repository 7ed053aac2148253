//! The CUDA C source of the backend's kernels, compiled at run time by NVRTC (once per
//! device and process, see `device.rs`), and the options it is compiled with.
//!
//! Every kernel computes what the CPU backend's operation of the same name computes
//! (`backend/cpu/backend.rs`, `ops.rs`): the same formulas, in float32, without fast-math.
//! Sums run in the GPU's order (tree reductions), so the last bits may differ from the CPU.
//! Sizes are `int` (a buffer holds fewer than 2^31 floats); offsets are computed in
//! `size_t`.
use cudarc::nvrtc::Ptx;

use crate::error::{Error, Result};

/// Threads per block of the row-wise kernels (layer norm, attention).
pub const ROW_THREADS: u32 = 256;
/// Threads per block of the element-wise kernels.
pub const ELEMENT_THREADS: u32 = 256;
/// Scores an attention block keeps in dynamic shared memory (40 KiB: with the reductions'
/// static shared memory it stays under the 48 KiB a block gets without opting in); rows
/// with more keys keep their scores in a global scratch buffer.
pub const MAX_SHARED_SCORES: usize = 40 * 1024 / 4;

/// The names of the kernels in [`SOURCE`], loaded from the compiled module.
pub const KERNEL_NAMES: &[&str] =
    &["bias_activation", "layer_norm", "activation", "add", "gather_rows", "add_positions", "attention", "ssru", "running_average", "gate",
      "to_half", "gather_rows_half", "gather_half_rows", "disable_columns", "row_top_1", "row_top_4", "row_top_8", "row_top_16",
      "row_top_32"];

/// The candidate counts `row_top_K` kernels exist for (a request for `k` uses the smallest
/// `K >= k` and reads the first `k`).
pub const TOP_K_SIZES: [usize; 5] = [1, 4, 8, 16, 32];

/// Codes of [`crate::backend::Activation`] in the kernels (`ACT_*` below); ReLU is 0.
pub fn activation_code(activation: crate::backend::Activation) -> i32 {
    use crate::backend::Activation::*;
    match activation {
        Relu => 0,
        GeluTanh => 1,
        Swish => 2,
        Gelu => 3,
        GeluSigmoid => 4,
        Tanh => 5,
    }
}

/// The oldest compute capability the kernels are compiled for (`compute_50`, Maxwell, with
/// NVRTC 12; NVRTC 13 compiles for Turing, `compute_75`, and later only, and says so).
pub const MIN_COMPUTE_CAPABILITY: (i32, i32) = (5, 0);

/// The virtual architecture the kernels are compiled for on a device of compute
/// capability `cc`: PTX runs on any later GPU (the driver JIT-compiles it), and the kernels
/// use nothing newer than Volta offers.
pub fn arch_for(cc: (i32, i32)) -> &'static str {
    match cc {
        (major, _) if major >= 8 => "compute_80",
        (7, minor) if minor >= 5 => "compute_75",
        (7, _) => "compute_70",
        (5, 0) => "compute_50",
        _ => "compute_52",
    }
}

/// Compiles [`SOURCE`] for `arch` (e.g. "compute_80"). Never fast-math: precise division,
/// square roots and denormals, as the CPU computes.
pub fn compile(arch: &'static str) -> Result<Ptx> {
    let nvrtc = super::libs::nvrtc().map_err(Error::unsupported)?;
    let gpu_architecture = format!("--gpu-architecture={arch}");
    let options = [gpu_architecture.as_str(), "--ftz=false", "--prec-div=true", "--prec-sqrt=true", "--fmad=true"];
    let ptx = nvrtc.compile(SOURCE, "tolk_kernels.cu", &options).map_err(|e| {
        let (major, minor) = nvrtc.version();
        Error::unsupported(format!("NVRTC {major}.{minor} ({}) could not compile Tolk's CUDA kernels for {arch}: {e}", nvrtc.path()))
    })?;
    Ok(Ptx::from_src(ptx))
}

/// The kernels. Launch shapes are in the comments; `device.rs` launches them.
pub const SOURCE: &str = r#"
#define ACT_RELU 0
#define ACT_GELU_TANH 1
#define ACT_SWISH 2
#define ACT_GELU 3
#define ACT_GELU_SIGMOID 4
#define ACT_TANH 5
#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
__device__ float block_sum(float v) {
    __shared__ float partial[32];
    __shared__ float total;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float s = lane < (int)(blockDim.x >> 5) ? partial[lane] : 0.0f;
        s = warp_sum(s);
        if (lane == 0) total = s;
    }
    __syncthreads();
    float r = total;
    __syncthreads();
    return r;
}

__device__ float block_max(float v) {
    __shared__ float partial[32];
    __shared__ float total;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_max(v);
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float s = lane < (int)(blockDim.x >> 5) ? partial[lane] : NEG_INF;
        s = warp_max(s);
        if (lane == 0) total = s;
    }
    __syncthreads();
    float r = total;
    __syncthreads();
    return r;
}

__device__ __forceinline__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

__device__ __forceinline__ float activate(int kind, float u) {
    switch (kind) {
    case ACT_RELU: return fmaxf(u, 0.0f);
    case ACT_GELU_TANH: return 0.5f * u * (1.0f + tanhf(0.7978846f * (u + 0.044715f * u * u * u)));
    case ACT_SWISH: return u / (1.0f + expf(-u));
    case ACT_GELU: return 0.5f * u * (1.0f + erff(u * 0.70710678118654752f));
    case ACT_GELU_SIGMOID: return u / (1.0f + expf(-1.702f * u));
    case ACT_TANH: return tanhf(u);
    default: return u;
    }
}

// y[r, c] = y[r, c] + bias[c] (when has_bias), then ReLU (when relu). Grid-stride.
extern "C" __global__ void bias_activation(float* y, const float* bias, int rows, int n, int has_bias, int relu) {
    size_t total = (size_t)rows * n;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        float v = y[i];
        if (has_bias) v += bias[i % n];
        if (relu) v = fmaxf(v, 0.0f);
        y[i] = v;
    }
}

// One block per row of width d, in place. mode 0: layer norm
// ((x - mean) / sqrt(var + eps) * gamma + beta, variance over d, two passes);
// mode 1: RMS norm (x / sqrt(mean(x^2) + eps) * gamma).
extern "C" __global__ void layer_norm(float* x, const float* gamma, const float* beta, int d, float epsilon, int mode) {
    float* row = x + (size_t)blockIdx.x * d;
    if (mode == 1) {
        float sq = 0.0f;
        for (int j = threadIdx.x; j < d; j += blockDim.x) sq += row[j] * row[j];
        float ms = block_sum(sq) / (float)d;
        float r = 1.0f / sqrtf(ms + epsilon);
        for (int j = threadIdx.x; j < d; j += blockDim.x) row[j] = row[j] * r * gamma[j];
        return;
    }
    float s = 0.0f;
    for (int j = threadIdx.x; j < d; j += blockDim.x) s += row[j];
    float mean = block_sum(s) / (float)d;
    float sq = 0.0f;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        float c = row[j] - mean;
        sq += c * c;
    }
    float var = block_sum(sq) / (float)d;
    float rstd = 1.0f / sqrtf(var + epsilon);
    for (int j = threadIdx.x; j < d; j += blockDim.x) row[j] = (row[j] - mean) * rstd * gamma[j] + beta[j];
}

extern "C" __global__ void activation(float* x, int kind, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) x[i] = activate(kind, x[i]);
}

extern "C" __global__ void add(float* x, const float* y, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) x[i] += y[i];
}

// dst[i * dst_stride + j] = src[idx[i] * src_stride + j] * scale for j < len; idx[i] = i when
// !use_idx. Grid (n, chunks), block-stride over j.
extern "C" __global__ void gather_rows(float* dst, int dst_stride, const float* src, int src_stride, const unsigned* idx, int use_idx,
                                       int n, int len, float scale) {
    int i = blockIdx.x;
    if (i >= n) return;
    size_t s = use_idx ? (size_t)idx[i] : (size_t)i;
    const float* from = src + s * (size_t)src_stride;
    float* to = dst + (size_t)i * (size_t)dst_stride;
    for (int j = blockIdx.y * blockDim.x + threadIdx.x; j < len; j += gridDim.y * blockDim.x) to[j] = from[j] * scale;
}

// float16 bits <-> float32 (PTX conversions: no header needed, any architecture).
__device__ __forceinline__ float half_to_float(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ unsigned short float_to_half(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

// dst[i] = float16(src[i]) (round to nearest even) for i < n, clamped to +-65504 (the
// largest half) so that an activation beyond it gives a large product, not inf * 0 = NaN
// inside the matrix product. Element-wise launch.
extern "C" __global__ void to_half(unsigned short* dst, const float* src, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float v = src[i];
        dst[i] = float_to_half(v != v ? v : fminf(fmaxf(v, -65504.0f), 65504.0f));
    }
}

// gather_rows from a float16 table into float32 rows (embeddings of a float16 model).
extern "C" __global__ void gather_rows_half(float* dst, int dst_stride, const unsigned short* src, int src_stride, const unsigned* idx,
                                            int use_idx, int n, int len, float scale) {
    int i = blockIdx.x;
    if (i >= n) return;
    size_t s = use_idx ? (size_t)idx[i] : (size_t)i;
    const unsigned short* from = src + s * (size_t)src_stride;
    float* to = dst + (size_t)i * (size_t)dst_stride;
    for (int j = blockIdx.y * blockDim.x + threadIdx.x; j < len; j += gridDim.y * blockDim.x) to[j] = half_to_float(from[j]) * scale;
}

// gather_rows of float16 rows as they are (a shortlist's rows of a float16 projection).
extern "C" __global__ void gather_half_rows(unsigned short* dst, int dst_stride, const unsigned short* src, int src_stride,
                                            const unsigned* idx, int use_idx, int n, int len) {
    int i = blockIdx.x;
    if (i >= n) return;
    size_t s = use_idx ? (size_t)idx[i] : (size_t)i;
    const unsigned short* from = src + s * (size_t)src_stride;
    unsigned short* to = dst + (size_t)i * (size_t)dst_stride;
    for (int j = blockIdx.y * blockDim.x + threadIdx.x; j < len; j += gridDim.y * blockDim.x) to[j] = from[j];
}

// Row r of logits (width vocab): columns ids[offsets[r] .. offsets[r + 1]] set to -FLT_MAX,
// as decode::disable does on the host (f32::MIN). One block per row.
extern "C" __global__ void disable_columns(float* logits, int vocab, const unsigned* offsets, const unsigned* ids, int rows) {
    int r = blockIdx.x;
    if (r >= rows) return;
    for (unsigned i = offsets[r] + threadIdx.x; i < offsets[r + 1]; i += blockDim.x) {
        unsigned c = ids[i];
        if (c < (unsigned)vocab) logits[(size_t)r * vocab + c] = __int_as_float(0xff7fffff);
    }
}

// The order of candidates: the larger value, then the lower column (the host's top_k).
__device__ __forceinline__ bool better(float v, unsigned i, float w, unsigned j) { return v > w || (v == w && i < j); }

// Inserts (v, c) into the sorted list (val, idx) of K if it enters. Unrolled, so the list
// stays in registers.
template <int K>
__device__ __forceinline__ void insert(float (&val)[K], unsigned (&idx)[K], float v, unsigned c) {
#pragma unroll
    for (int j = K - 1; j >= 0; j--) {
        bool above = j > 0 && better(v, c, val[j > 0 ? j - 1 : 0], idx[j > 0 ? j - 1 : 0]);
        if (above) {
            val[j] = val[j > 0 ? j - 1 : 0];
            idx[j] = idx[j > 0 ? j - 1 : 0];
        } else if (better(v, c, val[j], idx[j])) {
            val[j] = v;
            idx[j] = c;
        }
    }
}

// Drops the head of the list (it was taken).
template <int K>
__device__ __forceinline__ void pop(float (&val)[K], unsigned (&idx)[K]) {
#pragma unroll
    for (int j = 0; j + 1 < K; j++) {
        val[j] = val[j + 1];
        idx[j] = idx[j + 1];
    }
    val[K - 1] = NEG_INF;
    idx[K - 1] = 0xffffffffu;
}

// K rounds of a warp arg-max over the lanes' list heads: the warp's K best, in order, into
// (out_val, out_idx) by lane 0.
template <int K>
__device__ __forceinline__ void warp_merge(float (&val)[K], unsigned (&idx)[K], float* out_val, unsigned* out_idx) {
    for (int j = 0; j < K; j++) {
        float bv = val[0];
        unsigned bi = idx[0];
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            unsigned oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (better(ov, oi, bv, bi)) {
                bv = ov;
                bi = oi;
            }
        }
        if (val[0] == bv && idx[0] == bi) pop(val, idx);
        if ((threadIdx.x & 31) == 0) {
            out_val[j] = bv;
            out_idx[j] = bi;
        }
    }
}

// One block (ROW_THREADS) per row of logits (width vocab): the row's K best (column,
// value), best first, and its log-sum-exp (max + log(sum(exp(x - max)))), into
// out[r * (2K + 1) ..]: K columns (as float bits), K values, the log-sum-exp. Beam search
// takes these instead of the whole row.
template <int K>
__device__ void row_top(const float* logits, int vocab, float* out) {
    __shared__ float warp_val[32 * K];
    __shared__ unsigned warp_idx[32 * K];
    const float* row = logits + (size_t)blockIdx.x * vocab;
    float val[K];
    unsigned idx[K];
#pragma unroll
    for (int j = 0; j < K; j++) {
        val[j] = NEG_INF;
        idx[j] = 0xffffffffu;
    }
    float m = NEG_INF;
    for (int c = threadIdx.x; c < vocab; c += blockDim.x) {
        float v = row[c];
        m = fmaxf(m, v);
        if (better(v, (unsigned)c, val[K - 1], idx[K - 1])) insert(val, idx, v, (unsigned)c);
    }
    m = block_max(m);
    float sum = 0.0f;
    for (int c = threadIdx.x; c < vocab; c += blockDim.x) sum += expf(row[c] - m);
    sum = block_sum(sum);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    warp_merge(val, idx, warp_val + warp * K, warp_idx + warp * K);
    __syncthreads();
    if (warp == 0) {
#pragma unroll
        for (int j = 0; j < K; j++) {
            val[j] = lane < warps ? warp_val[lane * K + j] : NEG_INF;
            idx[j] = lane < warps ? warp_idx[lane * K + j] : 0xffffffffu;
        }
        float* o = out + (size_t)blockIdx.x * (2 * K + 1);
        warp_merge(val, idx, warp_val, warp_idx);
        if (lane == 0) {
            for (int j = 0; j < K; j++) {
                o[j] = __uint_as_float(warp_idx[j]);
                o[K + j] = warp_val[j];
            }
            o[2 * K] = m + logf(sum);
        }
    }
}

extern "C" __global__ void row_top_1(const float* logits, int vocab, float* out) { row_top<1>(logits, vocab, out); }
extern "C" __global__ void row_top_4(const float* logits, int vocab, float* out) { row_top<4>(logits, vocab, out); }
extern "C" __global__ void row_top_8(const float* logits, int vocab, float* out) { row_top<8>(logits, vocab, out); }
extern "C" __global__ void row_top_16(const float* logits, int vocab, float* out) { row_top<16>(logits, vocab, out); }
extern "C" __global__ void row_top_32(const float* logits, int vocab, float* out) { row_top<32>(logits, vocab, out); }

// Row r of x (width d) += the encoding of positions[r]: row positions[r] of table, or the
// sinusoid of positions[r] + start ([sin | cos] halves, timescale exp(-increment * j)).
extern "C" __global__ void add_positions(float* x, int d, int rows, const unsigned* positions, const float* table, int sinusoid,
                                         unsigned start, float increment) {
    int r = blockIdx.x;
    if (r >= rows) return;
    float* row = x + (size_t)r * d;
    if (!sinusoid) {
        const float* t = table + (size_t)positions[r] * d;
        for (int j = threadIdx.x; j < d; j += blockDim.x) row[j] += t[j];
        return;
    }
    int half = d / 2;
    float p = (float)(positions[r] + start);
    for (int j = threadIdx.x; j < half; j += blockDim.x) {
        float timescale = expf(-increment * (float)j);
        float t = p * timescale;
        row[j] += sinf(t);
        row[half + j] += cosf(t);
    }
}

// One block per (query row r, head h): softmax(q . K^T * scale) . V over the keys of row r.
// Query r, head h: q[r * q_stride + h * hd ..]. Key j of row r: k[(base_r + j) * kv_stride +
// h * hd ..] (values likewise in v), with base_r = kv_base[r] and the count kv_len[r] when
// use_arrays, else base_r = r * base_stride and the count const_len. The scores live in
// dynamic shared memory, or at scratch + (r * heads + h) * scratch_stride when use_scratch.
// Writes out[r * d + h * hd ..]. Rows without keys get zeros.
extern "C" __global__ void attention(const float* q, int q_stride, const float* k, const float* v, int kv_stride,
                                     const unsigned* kv_base, const unsigned* kv_len, int use_arrays, int base_stride, int const_len,
                                     float* out, int d, int hd, float scale, float* scratch, int use_scratch, int scratch_stride) {
    extern __shared__ float shared_scores[];
    int r = blockIdx.x, h = blockIdx.y, heads = gridDim.y;
    size_t base = use_arrays ? (size_t)kv_base[r] : (size_t)r * (size_t)base_stride;
    int len = use_arrays ? (int)kv_len[r] : const_len;
    float* o = out + (size_t)r * d + (size_t)h * hd;
    if (len <= 0) {
        for (int c = threadIdx.x; c < hd; c += blockDim.x) o[c] = 0.0f;
        return;
    }
    float* scores = use_scratch ? scratch + ((size_t)r * heads + h) * (size_t)scratch_stride : shared_scores;
    const float* qh = q + (size_t)r * q_stride + (size_t)h * hd;
    float local_max = NEG_INF;
    for (int j = threadIdx.x; j < len; j += blockDim.x) {
        const float* kj = k + (base + j) * (size_t)kv_stride + (size_t)h * hd;
        float dot = 0.0f;
        for (int c = 0; c < hd; ++c) dot += qh[c] * kj[c];
        float s = dot * scale;
        scores[j] = s;
        local_max = fmaxf(local_max, s);
    }
    float m = block_max(local_max);
    float local_sum = 0.0f;
    for (int j = threadIdx.x; j < len; j += blockDim.x) {
        float e = expf(scores[j] - m);
        scores[j] = e;
        local_sum += e;
    }
    float inv = 1.0f / block_sum(local_sum);  // block_sum's barrier also publishes scores
    for (int c = threadIdx.x; c < hd; c += blockDim.x) {
        const float* vc = v + base * (size_t)kv_stride + (size_t)h * hd + c;
        float acc = 0.0f;
        for (int j = 0; j < len; ++j) acc += scores[j] * vc[(size_t)j * kv_stride];
        o[c] = acc * inv;
    }
}

// c = f * c + (1 - f) * x with f = sigmoid(forget); out = relu(c).
extern "C" __global__ void ssru(float* cells, const float* input, const float* forget, float* out, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float f = 1.0f / (1.0f + expf(-forget[i]));
        float c = f * cells[i] + (1.0f - f) * input[i];
        cells[i] = c;
        out[i] = fmaxf(c, 0.0f);
    }
}

// g = x at step 0, else (g * t + x) / (t + 1).
extern "C" __global__ void running_average(float* g, const float* x, int step, int n) {
    float t = (float)step;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        g[i] = step == 0 ? x[i] : (g[i] * t + x[i]) / (t + 1.0f);
}

// y = sigmoid(gi) * x + sigmoid(gf) * y.
extern "C" __global__ void gate(float* y, const float* x, const float* gi, const float* gf, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float a = 1.0f / (1.0f + expf(-gi[i]));
        float b = 1.0f / (1.0f + expf(-gf[i]));
        y[i] = a * x[i] + b * y[i];
    }
}
"#;
