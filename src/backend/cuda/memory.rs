//! Device memory: activation buffers that keep their allocation between steps, uploaded
//! weights and parameters, the decoder's key/value caches, and the (host-only) sizing
//! rules they follow.
use cudarc::driver::CudaSlice;

/// Makes the context `slice` was allocated in current on this thread, so that dropping it
/// frees it there: cudarc's `CudaSlice::drop` calls `cuMemFreeAsync` without binding a
/// context, and on a thread where none (or another) is current the free fails, leaking the
/// memory and leaving an error that poisons the context's later calls. Errors are ignored
/// (a destructor cannot report them; the free itself records its own).
fn make_current<T>(slice: &CudaSlice<T>) {
    let ctx = slice.context().cu_ctx();
    // SAFETY: `ctx` is the slice's own context, alive while the slice holds it (the slice
    // keeps an `Arc` of its stream, which keeps the context).
    unsafe {
        if !matches!(cudarc::driver::result::ctx::get_current(), Ok(Some(current)) if current == ctx) {
            let _ = cudarc::driver::result::ctx::set_current(ctx);
        }
    }
}

/// Drops the slices with their context current (see [`make_current`]).
fn drop_slices<'a>(slices: impl IntoIterator<Item = &'a mut Option<CudaSlice<f32>>>) {
    for slot in slices {
        if let Some(slice) = slot.take() {
            make_current(&slice);
            drop(slice);
        }
    }
}

/// Activations `[rows, cols]` in device memory: the first `len` floats of `data`. Empty
/// (no allocation, no device) by default. The allocation only grows (see
/// [`grown_capacity`]), so a decoder step reuses the previous step's memory.
#[derive(Default)]
pub struct DeviceBuffer {
    pub(crate) data: Option<CudaSlice<f32>>,
    pub(crate) len: usize,
}

impl DeviceBuffer {
    /// Floats in use.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Floats allocated.
    pub fn capacity(&self) -> usize {
        self.data.as_ref().map_or(0, |d| d.len())
    }

    /// The allocation; panics on an empty buffer that an operation reads.
    pub(crate) fn slice(&self) -> &CudaSlice<f32> {
        self.data.as_ref().expect("CUDA backend: an operation read a buffer that was never written")
    }

    pub(crate) fn slice_mut(&mut self) -> &mut CudaSlice<f32> {
        self.data.as_mut().expect("CUDA backend: an operation wrote a buffer that was never sized")
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        drop_slices([&mut self.data]);
    }
}

/// The allocation (in floats) a buffer of capacity `current` gets to hold `needed`:
/// unchanged when it fits, else at least 1.5 times the old one, rounded up to 1024
/// floats (4 KiB), so that a batch whose rows grow step by step reallocates rarely.
pub fn grown_capacity(current: usize, needed: usize) -> usize {
    if needed <= current {
        return current;
    }
    let target = needed.max(current + current / 2);
    target.div_ceil(1024) * 1024
}

/// Steps a key/value cache holding `current` steps per row allocates when it needs room
/// for `needed`: doubled, at least 16.
pub fn grown_steps(current: usize, needed: usize) -> usize {
    if needed <= current {
        return current;
    }
    needed.max(current * 2).max(16)
}

/// A weight `[n, k]` as rows in device memory, in float32 or (compute type float16) IEEE
/// half precision; dequantized at upload when stored quantized.
pub struct DeviceMatrix {
    pub(crate) data: WeightData,
    pub(crate) n: usize,
    pub(crate) k: usize,
}

/// The elements of a [`DeviceMatrix`].
pub enum WeightData {
    F32(CudaSlice<f32>),
    /// float16 bits: multiplied by cuBLAS with float32 accumulation.
    F16(CudaSlice<u16>),
}

impl DeviceMatrix {
    /// Output features.
    pub fn rows(&self) -> usize {
        self.n
    }

    /// Input features.
    pub fn cols(&self) -> usize {
        self.k
    }
}

impl Drop for DeviceMatrix {
    fn drop(&mut self) {
        // The slice itself is dropped after this, with its context current.
        match &self.data {
            WeightData::F32(slice) => make_current(slice),
            WeightData::F16(slice) => make_current(slice),
        }
    }
}

/// A float32 parameter in device memory: `len` floats, rows of `row_len` (a table) or one
/// row (a bias or gain). Empty vectors (`len == 0`) hold a one-float allocation.
pub struct DeviceVector {
    pub(crate) data: CudaSlice<f32>,
    pub(crate) len: usize,
    pub(crate) row_len: usize,
}

impl DeviceVector {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn row_len(&self) -> usize {
        self.row_len
    }
}

impl Drop for DeviceVector {
    fn drop(&mut self) {
        make_current(&self.data);
    }
}

/// One decoder layer's self-attention keys and values: row `r`'s step `t` at
/// `(r * capacity + t) * dim` in `keys` and `values`. Allocated at the first step (when
/// the width is known) and regrown by [`grown_steps`].
#[derive(Default)]
pub struct DeviceKvCache {
    pub(crate) keys: Option<CudaSlice<f32>>,
    pub(crate) values: Option<CudaSlice<f32>>,
    pub(crate) rows: usize,
    pub(crate) steps: usize,
    pub(crate) capacity: usize,
    pub(crate) dim: usize,
}

impl DeviceKvCache {
    pub fn new(rows: usize) -> DeviceKvCache {
        DeviceKvCache { keys: None, values: None, rows, steps: 0, capacity: 0, dim: 0 }
    }

    /// Rows (hypotheses) cached.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Steps cached per row.
    pub fn steps(&self) -> usize {
        self.steps
    }

    /// Steps per row the allocation holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

impl Drop for DeviceKvCache {
    fn drop(&mut self) {
        drop_slices([&mut self.keys, &mut self.values]);
    }
}

/// Per query row, where its keys start (in rows of the key buffer) and how many there
/// are, for a batch of concatenated sequences: every row of sequence `i` attends over
/// rows `offsets[i] .. offsets[i] + lengths[i]`.
pub fn sequence_rows(offsets: &[usize], lengths: &[usize]) -> (Vec<u32>, Vec<u32>) {
    let total: usize = lengths.iter().sum();
    let (mut base, mut len) = (Vec::with_capacity(total), Vec::with_capacity(total));
    for (&off, &l) in offsets.iter().zip(lengths) {
        base.extend(std::iter::repeat_n(to_u32(off), l));
        len.extend(std::iter::repeat_n(to_u32(l), l));
    }
    (base, len)
}

/// Per decoder row, where its example's memory rows start and how many there are.
pub fn memory_rows(offsets: &[usize], lengths: &[usize], row_example: &[usize]) -> (Vec<u32>, Vec<u32>) {
    row_example.iter().map(|&e| (to_u32(offsets[e]), to_u32(lengths[e]))).unzip()
}

/// An index or size as the kernels take it.
pub fn to_u32(v: usize) -> u32 {
    u32::try_from(v).unwrap_or_else(|_| panic!("CUDA backend: {v} does not fit the kernels' 32-bit indices"))
}

/// A size as the kernels take it.
pub fn to_i32(v: usize) -> i32 {
    i32::try_from(v).unwrap_or_else(|_| panic!("CUDA backend: {v} does not fit the kernels' 32-bit sizes"))
}

/// Weights dequantized to float32 as the CPU backend reads them back (`q * (1 / scale)`).
pub fn dequantize_i8(values: &[i8], scales: &[f32], n: usize, k: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; n * k];
    if k == 0 {
        return out;
    }
    for ((row, q), &scale) in out.chunks_exact_mut(k).zip(values.chunks_exact(k)).zip(scales) {
        let inv = 1.0 / scale;
        row.iter_mut().zip(q).for_each(|(o, &q)| *o = q as f32 * inv);
    }
    out
}

pub fn dequantize_i16(values: &[i16], scale: f32) -> Vec<f32> {
    let inv = 1.0 / scale;
    values.iter().map(|&q| q as f32 * inv).collect()
}
