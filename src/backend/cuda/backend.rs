//! [`Backend`] for [`CudaBackend`]: activations stay in device memory from the embeddings
//! to the logits; token ids, positions and row indices go up as small `u32` arrays.
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};

use super::device::{check, Device};
use super::kernels::{self, activation_code, MAX_SHARED_SCORES};
use super::libs;
use super::memory::{
    dequantize_i16, dequantize_i8, grown_capacity, grown_steps, memory_rows, sequence_rows, to_i32, to_u32, DeviceBuffer, DeviceKvCache,
    DeviceMatrix, DeviceVector, WeightData,
};
use super::CudaBackend;
use crate::backend::cpu::memory_kv::CpuMemoryKv;

/// Launches kernel `$name` of `$dev` with `$cfg` and the arguments (references that live
/// until the launch returns), panicking with the kernel's name on failure.
macro_rules! launch {
    ($dev:expr, $name:expr, $cfg:expr, $($arg:expr),+ $(,)?) => {{
        let dev: &Device = $dev;
        let mut builder = dev.stream.launch_builder(dev.function($name));
        $( builder.arg($arg); )+
        // SAFETY: the arguments match the kernel's parameters in `kernels.rs`, and every
        // buffer holds what the launch shape reads and writes (checked by the caller).
        check(unsafe { builder.launch($cfg) }, concat!("the ", $name, " kernel"));
    }};
}
use crate::backend::{
    Activation, AttentionShape, Backend, ComputeType, Ctx, EmbeddingRows, FloatOrder, KvCacheType, MatrixData, PositionTable, Quantized,
    SequenceLayout, TopLogits,
};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Where the keys of one attention call are and how they are laid out (see the
/// `attention` kernel).
struct KeySource<'a> {
    keys: CudaView<'a, f32>,
    values: CudaView<'a, f32>,
    stride: usize,
    /// Per query row (start row, count), or `None` for row `r` at `r * base_stride` with
    /// `const_len` keys.
    rows: Option<(Vec<u32>, Vec<u32>)>,
    base_stride: usize,
    const_len: usize,
}

impl CudaBackend {
    fn dev(&self) -> &Device {
        &self.device
    }

    /// Makes the device's context current on this thread (copies and clears need it; the
    /// allocations and launches of cudarc do it themselves).
    fn bind(&self) {
        check(self.dev().ctx.bind_to_thread(), "binding the CUDA context to this thread");
    }

    /// Makes `buf` hold `len` floats (contents undefined), growing its allocation when needed.
    fn ensure(&self, buf: &mut DeviceBuffer, len: usize) {
        let capacity = grown_capacity(buf.capacity(), len.max(1));
        if capacity > buf.capacity() {
            // Freed (stream-ordered) before the new allocation, with the context current:
            // cudarc's free does not bind it (see `memory::make_current`).
            self.bind();
            buf.data = None;
            // SAFETY: the contents are undefined until written; every operation writes the
            // `len` floats it sizes before anything reads them.
            buf.data = Some(check(unsafe { self.dev().stream.alloc::<f32>(capacity) }, "allocating device memory"));
        }
        buf.len = len;
    }

    /// A buffer holding `host` (tests, the smoke test, callers that bring their own data).
    pub fn buffer_from_host(&self, host: &[f32]) -> DeviceBuffer {
        let mut buf = DeviceBuffer::default();
        self.ensure(&mut buf, host.len());
        if !host.is_empty() {
            self.bind();
            check(self.dev().stream.memcpy_htod(host, &mut buf.slice_mut().slice_mut(..host.len())), "copying data to the device");
        }
        buf
    }

    fn alloc(&self, len: usize) -> CudaSlice<f32> {
        // SAFETY: as in `ensure`: written before read.
        check(unsafe { self.dev().stream.alloc::<f32>(len.max(1)) }, "allocating device memory")
    }

    /// `values` in device memory. A decoding step sends the same arrays to every layer
    /// (the memory rows of cross-attention, the beam's row order): the last few uploads
    /// are kept and reused when the same values come again, so each goes up once per step.
    fn upload_u32(&self, values: &[u32]) -> Arc<CudaSlice<u32>> {
        const KEPT: usize = 8;
        let values = if values.is_empty() { &[0][..] } else { values };
        let mut kept = self.dev().uploads.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = kept.iter().position(|(host, _)| host[..] == *values) {
            let entry = kept.remove(i).expect("found above");
            let slice = entry.1.clone();
            kept.push_front(entry);
            return slice;
        }
        // Binds the context: an evicted slice may be freed here.
        self.bind();
        let slice = Arc::new(check(self.dev().stream.memcpy_stod(values), "copying indices to the device"));
        kept.push_front((values.to_vec(), slice.clone()));
        kept.truncate(KEPT);
        slice
    }

    fn upload_indices(&self, values: &[usize], bound: usize, what: &str) -> Arc<CudaSlice<u32>> {
        if let Some(&bad) = values.iter().find(|&&v| v >= bound) {
            panic!("CUDA backend: {what} {bad} out of range (0..{bound})");
        }
        self.upload_u32(&values.iter().map(|&v| to_u32(v)).collect::<Vec<_>>())
    }

    fn upload_f32(&self, values: &[f32]) -> Result<CudaSlice<f32>> {
        let values = if values.is_empty() { &[0.0][..] } else { values };
        self.dev().stream.memcpy_stod(values).map_err(|e| Error::unsupported(format!("could not upload a weight to the GPU: {e}")))
    }

    /// `dst[i * dst_stride ..][..len] = src[idx[i] * src_stride ..][..len] * scale` for
    /// `i < n` (`idx[i] = i` without `idx`).
    #[allow(clippy::too_many_arguments)]
    fn gather_kernel(
        &self,
        dst: &mut CudaViewMut<'_, f32>,
        dst_stride: usize,
        src: &CudaView<'_, f32>,
        src_stride: usize,
        idx: Option<&CudaSlice<u32>>,
        n: usize,
        len: usize,
        scale: f32,
    ) {
        if n == 0 || len == 0 {
            return;
        }
        let dev = self.dev();
        let cfg = Self::gather_shape(n, len);
        let (dst_stride, src_stride, use_idx, n, len) =
            (to_i32(dst_stride), to_i32(src_stride), idx.is_some() as i32, to_i32(n), to_i32(len));
        let idx = idx.unwrap_or(&dev.dummy_u32);
        launch!(dev, "gather_rows", cfg, dst, &dst_stride, src, &src_stride, idx, &use_idx, &n, &len, &scale);
    }

    /// Launch shape of the row gathers: one block row per gathered row, up to 64 blocks
    /// along it.
    fn gather_shape(n: usize, len: usize) -> LaunchConfig {
        let chunks = len.div_ceil(kernels::ELEMENT_THREADS as usize).clamp(1, 64) as u32;
        LaunchConfig { grid_dim: (to_u32(n), chunks, 1), block_dim: (kernels::ELEMENT_THREADS, 1, 1), shared_mem_bytes: 0 }
    }

    fn upload_f16(&self, values: &[f32]) -> Result<CudaSlice<u16>> {
        let bits: Vec<u16> = if values.is_empty() { vec![0] } else { values.iter().map(|&v| half::f16::from_f32(v).to_bits()).collect() };
        self.dev().stream.memcpy_stod(&bits).map_err(|e| Error::unsupported(format!("could not upload a weight to the GPU: {e}")))
    }

    /// Row-major `out[rows, n] = x[rows, k] · W[n, k]ᵀ` through cuBLAS, which is column-major
    /// `outᵀ = W · xᵀ`: W read transposed (its rows are columns of length k), x as is.
    /// float32 weights: `sgemm`. float16 weights: x is rounded to float16 first and
    /// `GemmEx` multiplies on the tensor cores, accumulating in float32.
    fn product(&self, x: &DeviceBuffer, rows: usize, w: &DeviceMatrix, out: &mut DeviceBuffer) {
        let (n, k) = (w.n, w.k);
        assert!(x.len() >= rows * k, "CUDA backend: linear input holds {} floats, {rows} rows of {k} need more", x.len());
        let dev = self.dev();
        let cublas = check(libs::cublas(), "loading cuBLAS");
        let blas = dev.blas.lock().unwrap_or_else(|e| e.into_inner());
        self.bind();
        let (m_i, n_i, k_i) = (to_i32(n), to_i32(rows), to_i32(k));
        let (alpha, beta) = (1.0f32, 0.0f32);
        let stream = &dev.stream;
        match &w.data {
            WeightData::F32(weights) => {
                let (a, _a) = weights.device_ptr(stream);
                let (b, _b) = x.slice().device_ptr(stream);
                let (c, _c) = out.slice_mut().device_ptr_mut(stream);
                // SAFETY: W holds n·k floats, x at least rows·k (checked), out rows·n (the
                // caller ensured it); the handle's stream is `stream`.
                let status = unsafe {
                    (cublas.sgemm)(
                        blas.handle,
                        libs::CUBLAS_OP_T,
                        libs::CUBLAS_OP_N,
                        m_i,
                        n_i,
                        k_i,
                        &alpha,
                        a as *const f32,
                        k_i,
                        b as *const f32,
                        k_i,
                        &beta,
                        c as *mut f32,
                        m_i,
                    )
                };
                check(cublas.check(status), "cuBLAS sgemm");
            }
            WeightData::F16(weights) => {
                let mut scratch = dev.half_scratch.lock().unwrap_or_else(|e| e.into_inner());
                let needed = grown_capacity(scratch.as_ref().map_or(0, |s| s.len()), rows * k);
                if scratch.as_ref().is_none_or(|s| s.len() < needed) {
                    *scratch = None;
                    // SAFETY: written by `to_half` before the product reads it.
                    *scratch = Some(check(unsafe { stream.alloc::<u16>(needed) }, "allocating device memory"));
                }
                let half_x = scratch.as_mut().expect("allocated above");
                let count = to_i32(rows * k);
                launch!(dev, "to_half", Device::elementwise(rows * k), &mut *half_x, x.slice(), &count);
                let (a, _a) = weights.device_ptr(stream);
                let (b, _b) = half_x.device_ptr(stream);
                let (c, _c) = out.slice_mut().device_ptr_mut(stream);
                // SAFETY: as for sgemm, with W and x in float16 and out in float32.
                let status = unsafe {
                    (cublas.gemm_ex)(
                        blas.handle,
                        libs::CUBLAS_OP_T,
                        libs::CUBLAS_OP_N,
                        m_i,
                        n_i,
                        k_i,
                        (&alpha as *const f32).cast(),
                        a as *const std::ffi::c_void,
                        libs::CUDA_R_16F,
                        k_i,
                        b as *const std::ffi::c_void,
                        libs::CUDA_R_16F,
                        k_i,
                        (&beta as *const f32).cast(),
                        c as *mut std::ffi::c_void,
                        libs::CUDA_R_32F,
                        m_i,
                        libs::CUBLAS_COMPUTE_32F,
                        libs::CUBLAS_GEMM_DEFAULT,
                    )
                };
                check(cublas.check(status), "cuBLAS GemmEx (float16)");
            }
        }
    }

    /// Runs the `attention` kernel for `rows` query rows (query `r` at `query[r * q_stride]`).
    fn attention(
        &self,
        query: &CudaView<'_, f32>,
        q_stride: usize,
        keys: KeySource<'_>,
        rows: usize,
        shape: AttentionShape,
        out: &mut DeviceBuffer,
    ) {
        let AttentionShape { num_heads: heads, dim: d, order: _ } = shape;
        assert!(heads > 0 && d % heads == 0, "CUDA backend: model dimension {d} is not a multiple of {heads} heads");
        self.ensure(out, rows * d);
        if rows == 0 || d == 0 {
            return;
        }
        let dev = self.dev();
        let head_dim = d / heads;
        let scale = 1.0 / (head_dim as f32).sqrt();
        let (max_len, arrays) = match &keys.rows {
            Some((base, len)) => (len.iter().copied().max().unwrap_or(0) as usize, Some((self.upload_u32(base), self.upload_u32(len)))),
            None => (keys.const_len, None),
        };
        let use_scratch = max_len > MAX_SHARED_SCORES;
        let scratch = use_scratch.then(|| self.alloc(rows * heads * max_len));
        let cfg = LaunchConfig {
            grid_dim: (to_u32(rows), to_u32(heads), 1),
            block_dim: (kernels::ROW_THREADS, 1, 1),
            shared_mem_bytes: if use_scratch { 0 } else { to_u32(max_len.max(1) * 4) },
        };
        let (kv_base, kv_len) = arrays.as_ref().map_or((&dev.dummy_u32, &dev.dummy_u32), |(b, l)| (b, l));
        let (q_stride, kv_stride, use_arrays) = (to_i32(q_stride), to_i32(keys.stride), arrays.is_some() as i32);
        let (base_stride, const_len, d_i, hd) = (to_i32(keys.base_stride), to_i32(keys.const_len), to_i32(d), to_i32(head_dim));
        let (use_scratch, scratch_stride) = (use_scratch as i32, to_i32(max_len));
        let scratch = scratch.as_ref().unwrap_or(&dev.dummy_f32);
        launch!(
            dev,
            "attention",
            cfg,
            query,
            &q_stride,
            &keys.keys,
            &keys.values,
            &kv_stride,
            kv_base,
            kv_len,
            &use_arrays,
            &base_stride,
            &const_len,
            out.slice_mut(),
            &d_i,
            &hd,
            &scale,
            scratch,
            &use_scratch,
            &scratch_stride,
        );
    }
}

fn check_len(what: &str, len: usize, expected: usize) -> Result<()> {
    if len != expected {
        return Err(Error::invalid_model(format!("{what} holds {len} values where {expected} were expected")));
    }
    Ok(())
}

impl Backend for CudaBackend {
    type Buffer = DeviceBuffer;
    type Matrix = DeviceMatrix;
    type Vector = DeviceVector;
    type KvCache = DeviceKvCache;
    type MemoryKv = DeviceBuffer;

    fn name(&self) -> String {
        format!("cuda:{} ({})", self.info().index, self.info().name)
    }

    /// Every compute type multiplies in float32 on the GPU (see the module doc): quantized
    /// weights are dequantized here.
    fn matrix(&self, data: MatrixData<'_>, n: usize, k: usize, compute_type: ComputeType) -> Result<DeviceMatrix> {
        let (tensor, dequantized);
        let floats: &[f32] = match data {
            MatrixData::Float(w) => {
                check_len("a weight", w.len(), n * k)?;
                tensor = w;
                &tensor
            }
            MatrixData::Quantized(Quantized::Int8 { values, scales, .. }) => {
                check_len("an int8 weight", values.len(), n * k)?;
                check_len("an int8 weight's scales", scales.len(), n)?;
                dequantized = dequantize_i8(&values, &scales, n, k);
                &dequantized
            }
            MatrixData::Quantized(Quantized::Int16 { values, scale }) => {
                check_len("an int16 weight", values.len(), n * k)?;
                dequantized = dequantize_i16(&values, scale);
                &dequantized
            }
        };
        let data = match compute_type {
            ComputeType::Float16 => WeightData::F16(self.upload_f16(floats)?),
            _ => WeightData::F32(self.upload_f32(floats)?),
        };
        Ok(DeviceMatrix { data, n, k })
    }

    fn gather_rows(&self, matrix: &DeviceMatrix, ids: &[u32]) -> DeviceMatrix {
        let k = matrix.k;
        let ids: Vec<usize> = ids.iter().map(|&i| i as usize).collect();
        let idx = self.upload_indices(&ids, matrix.n, "weight row");
        let data = match &matrix.data {
            WeightData::F32(src) => {
                let mut data = self.alloc(ids.len() * k);
                self.gather_kernel(&mut data.slice_mut(..), k, &src.slice(..), k, Some(&*idx), ids.len(), k, 1.0);
                WeightData::F32(data)
            }
            WeightData::F16(src) => {
                // SAFETY: written by the gather before anything reads it.
                let mut data = check(unsafe { self.dev().stream.alloc::<u16>((ids.len() * k).max(1)) }, "allocating device memory");
                if !ids.is_empty() && k > 0 {
                    let dev = self.dev();
                    let (n_i, k_i, use_idx) = (to_i32(ids.len()), to_i32(k), 1i32);
                    launch!(dev, "gather_half_rows", Self::gather_shape(ids.len(), k), &mut data, &k_i, src, &k_i, &*idx, &use_idx, &n_i, &k_i);
                }
                WeightData::F16(data)
            }
        };
        DeviceMatrix { data, n: ids.len(), k }
    }

    fn vector(&self, data: Arc<Tensor>) -> Result<DeviceVector> {
        let row_len = if data.shape().len() >= 2 { data.row_len() } else { data.len() };
        Ok(DeviceVector { data: self.upload_f32(&data)?, len: data.len(), row_len })
    }

    fn gather(&self, vector: &DeviceVector, ids: &[u32]) -> DeviceVector {
        let ids: Vec<usize> = ids.iter().map(|&i| i as usize).collect();
        let idx = self.upload_indices(&ids, vector.len, "vector element");
        let mut data = self.alloc(ids.len());
        self.gather_kernel(&mut data.slice_mut(..), 1, &vector.data.slice(..), 1, Some(&*idx), ids.len(), 1, 1.0);
        DeviceVector { data, len: ids.len(), row_len: ids.len() }
    }

    fn linear(
        &self,
        _ctx: &Ctx,
        x: &DeviceBuffer,
        rows: usize,
        w: &DeviceMatrix,
        bias: Option<&DeviceVector>,
        relu: bool,
        out: &mut DeviceBuffer,
    ) {
        let (n, k) = (w.n, w.k);
        self.ensure(out, rows * n);
        if rows == 0 || n == 0 {
            return;
        }
        let dev = self.dev();
        if k == 0 {
            self.bind();
            check(dev.stream.memset_zeros(&mut out.slice_mut().slice_mut(..rows * n)), "clearing a buffer");
        } else {
            assert!(x.len() >= rows * k, "CUDA backend: linear input holds {} floats, {rows} rows of {k} need more", x.len());
            self.product(x, rows, w, out);
        }
        if bias.is_some() || relu {
            if let Some(b) = bias {
                assert!(b.len >= n, "CUDA backend: bias of {} values for {n} outputs", b.len);
            }
            let bias_data = bias.map_or(&dev.dummy_f32, |b| &b.data);
            let (rows_i, n_i, has_bias, relu) = (to_i32(rows), to_i32(n), bias.is_some() as i32, relu as i32);
            launch!(dev, "bias_activation", Device::elementwise(rows * n), out.slice_mut(), bias_data, &rows_i, &n_i, &has_bias, &relu);
        }
    }

    /// `order` is ignored: one formula (two-pass mean and variance) for both engines.
    fn layer_norm(&self, x: &mut DeviceBuffer, gamma: &DeviceVector, beta: Option<&DeviceVector>, epsilon: f32, _order: FloatOrder) {
        let d = gamma.len;
        if d == 0 || x.is_empty() {
            return;
        }
        if let Some(beta) = beta {
            assert!(beta.len >= d, "CUDA backend: layer norm beta of {} values for width {d}", beta.len);
        }
        let rows = x.len() / d;
        if rows == 0 {
            return; // fewer floats than one row: no full row to normalize (and no empty grid)
        }
        let dev = self.dev();
        let (d_i, mode) = (to_i32(d), beta.is_none() as i32);
        let beta = beta.map_or(&gamma.data, |b| &b.data);
        launch!(dev, "layer_norm", Device::per_row(rows), x.slice_mut(), &gamma.data, beta, &d_i, &epsilon, &mode);
    }

    fn activation(&self, _ctx: &Ctx, x: &mut DeviceBuffer, activation: Activation) {
        let (kind, n) = (activation_code(activation), x.len());
        if n > 0 {
            let n_i = to_i32(n);
            launch!(self.dev(), "activation", Device::elementwise(n), x.slice_mut(), &kind, &n_i);
        }
    }

    fn add(&self, x: &mut DeviceBuffer, y: &DeviceBuffer) {
        let n = x.len().min(y.len());
        if n > 0 {
            let n_i = to_i32(n);
            launch!(self.dev(), "add", Device::elementwise(n), x.slice_mut(), y.slice(), &n_i);
        }
    }

    fn copy(&self, src: &DeviceBuffer, dst: &mut DeviceBuffer) {
        let len = src.len();
        self.ensure(dst, len);
        if len > 0 {
            self.bind();
            check(self.dev().stream.memcpy_dtod(&src.slice().slice(..len), &mut dst.slice_mut().slice_mut(..len)), "a device copy");
        }
    }

    fn zeros(&self, out: &mut DeviceBuffer, rows: usize, dim: usize) {
        let len = rows * dim;
        self.ensure(out, len);
        if len > 0 {
            self.bind();
            check(self.dev().stream.memset_zeros(&mut out.slice_mut().slice_mut(..len)), "clearing a buffer");
        }
    }

    fn embed(&self, table: EmbeddingRows<'_, Self>, dim: usize, ids: &[u32], scale: Option<f32>, out: &mut DeviceBuffer) {
        let (stride, rows) = match table {
            EmbeddingRows::Dense(t) => (t.row_len, t.len / t.row_len.max(1)),
            EmbeddingRows::Packed(m) => (m.k, m.n),
        };
        assert!(dim <= stride, "CUDA backend: embedding width {dim} wider than its table's rows ({stride})");
        let ids: Vec<usize> = ids.iter().map(|&i| i as usize).collect();
        let idx = self.upload_indices(&ids, rows, "token id");
        self.ensure(out, ids.len() * dim);
        let scale = scale.unwrap_or(1.0);
        match table {
            EmbeddingRows::Dense(DeviceVector { data, .. }) | EmbeddingRows::Packed(DeviceMatrix { data: WeightData::F32(data), .. }) => {
                self.gather_kernel(&mut out.slice_mut().slice_mut(..), dim, &data.slice(..), stride, Some(&*idx), ids.len(), dim, scale)
            }
            EmbeddingRows::Packed(DeviceMatrix { data: WeightData::F16(data), .. }) => {
                if !ids.is_empty() && dim > 0 {
                    let dev = self.dev();
                    let (dim_i, stride_i, n_i, use_idx) = (to_i32(dim), to_i32(stride), to_i32(ids.len()), 1i32);
                    let cfg = Self::gather_shape(ids.len(), dim);
                    launch!(dev, "gather_rows_half", cfg, out.slice_mut(), &dim_i, data, &stride_i, &*idx, &use_idx, &n_i, &dim_i, &scale);
                }
            }
        }
    }

    fn add_positions(&self, x: &mut DeviceBuffer, dim: usize, table: PositionTable<'_, Self>, positions: &[usize]) {
        if dim == 0 {
            return;
        }
        let rows = (x.len() / dim).min(positions.len());
        if rows == 0 {
            return;
        }
        let dev = self.dev();
        // Rows of a host-generated table, uploaded for this call (never chosen here, as
        // GENERATES_POSITION_TABLES is false for this backend: kept correct all the same).
        let (generated, in_order): (CudaSlice<f32>, Vec<usize>);
        let mut positions = &positions[..rows];
        let (table_data, sinusoid, start, increment, bound) = match table {
            PositionTable::Table(t) => {
                // The kernel reads row `p` at `p * dim`: the table's rows must be `dim` wide.
                assert!(t.row_len == dim, "CUDA backend: position table rows of {} for width {dim}", t.row_len);
                (&t.data, 0i32, 0u32, 0.0f32, t.len / t.row_len.max(1))
            }
            // The CPU's frequency step, computed here in the same float32 arithmetic.
            PositionTable::Sinusoidal { start } => (&dev.dummy_f32, 1, to_u32(start), 10000f32.ln() / (dim / 2 - 1) as f32, usize::MAX),
            PositionTable::Generated(t) => {
                assert!(t.dim() == dim, "CUDA backend: position table rows of {} for width {dim}", t.dim());
                let host: Vec<f32> = positions.iter().flat_map(|&p| t.row(p)).copied().collect();
                generated = self.upload_f32(&host).unwrap_or_else(|e| panic!("{e}"));
                in_order = (0..rows).collect();
                positions = &in_order;
                (&generated, 0, 0, 0.0, rows)
            }
        };
        let positions = self.upload_indices(positions, bound, "position");
        let (d_i, rows_i) = (to_i32(dim), to_i32(rows));
        launch!(
            dev,
            "add_positions",
            Device::per_row(rows),
            x.slice_mut(),
            &d_i,
            &rows_i,
            &*positions,
            table_data,
            &sinusoid,
            &start,
            &increment
        );
    }

    fn sequence_attention(&self, _ctx: &Ctx, qkv: &DeviceBuffer, layout: &SequenceLayout, shape: AttentionShape, out: &mut DeviceBuffer) {
        let d = shape.dim;
        let rows = layout.total_rows();
        if rows == 0 || d == 0 {
            self.ensure(out, 0);
            return;
        }
        assert!(qkv.len() >= rows * 3 * d, "CUDA backend: fused q|k|v of {} floats for {rows} rows of width {d}", qkv.len());
        let s = qkv.slice();
        let keys = KeySource {
            keys: s.slice(d..),
            values: s.slice(2 * d..),
            stride: 3 * d,
            rows: Some(sequence_rows(&layout.offsets, &layout.lengths)),
            base_stride: 0,
            const_len: 0,
        };
        self.attention(&s.slice(..), 3 * d, keys, rows, shape, out);
    }

    fn new_kv_cache(&self, rows: usize, kv: KvCacheType) -> DeviceKvCache {
        assert_eq!(kv, KvCacheType::Float32, "the CUDA backend keeps keys/values in float32");
        DeviceKvCache::new(rows)
    }

    fn cached_attention(&self, _ctx: &Ctx, qkv: &DeviceBuffer, cache: &mut DeviceKvCache, shape: AttentionShape, out: &mut DeviceBuffer) {
        let d = shape.dim;
        let rows = cache.rows;
        if rows == 0 || d == 0 {
            self.ensure(out, 0);
            return;
        }
        assert!(qkv.len() >= rows * 3 * d, "CUDA backend: fused q|k|v of {} floats for {rows} rows of width {d}", qkv.len());
        assert!(cache.dim == 0 || cache.dim == d, "CUDA backend: a key/value cache of width {} used with width {d}", cache.dim);
        cache.dim = d;
        if cache.steps + 1 > cache.capacity || cache.keys.is_none() {
            let capacity = grown_steps(cache.capacity, cache.steps + 1);
            let (mut keys, mut values) = (self.alloc(rows * capacity * d), self.alloc(rows * capacity * d));
            if let (Some(old_keys), Some(old_values)) = (&cache.keys, &cache.values) {
                let (old, new, len) = (cache.capacity * d, capacity * d, cache.steps * d);
                self.gather_kernel(&mut keys.slice_mut(..), new, &old_keys.slice(..), old, None, rows, len, 1.0);
                self.gather_kernel(&mut values.slice_mut(..), new, &old_values.slice(..), old, None, rows, len, 1.0);
            }
            (cache.keys, cache.values, cache.capacity) = (Some(keys), Some(values), capacity);
        }
        let (at, row_stride) = (cache.steps * d, cache.capacity * d);
        let s = qkv.slice();
        let (keys, values) = (cache.keys.as_mut().expect("allocated above"), cache.values.as_mut().expect("allocated above"));
        self.gather_kernel(&mut keys.slice_mut(at..), row_stride, &s.slice(d..), 3 * d, None, rows, d, 1.0);
        self.gather_kernel(&mut values.slice_mut(at..), row_stride, &s.slice(2 * d..), 3 * d, None, rows, d, 1.0);
        cache.steps += 1;
        let source = KeySource {
            keys: keys.slice(..),
            values: values.slice(..),
            stride: d,
            rows: None,
            base_stride: cache.capacity,
            const_len: cache.steps,
        };
        self.attention(&s.slice(..), 3 * d, source, rows, shape, out);
    }

    fn reorder_kv_cache(&self, cache: &mut DeviceKvCache, sources: &[usize]) {
        let rows = sources.len();
        if let (Some(keys), Some(values)) = (&cache.keys, &cache.values) {
            let idx = self.upload_indices(sources, cache.rows, "cache row");
            let (stride, len) = (cache.capacity * cache.dim, cache.steps * cache.dim);
            let (mut new_keys, mut new_values) = (self.alloc(rows * stride), self.alloc(rows * stride));
            self.gather_kernel(&mut new_keys.slice_mut(..), stride, &keys.slice(..), stride, Some(&*idx), rows, len, 1.0);
            self.gather_kernel(&mut new_values.slice_mut(..), stride, &values.slice(..), stride, Some(&*idx), rows, len, 1.0);
            (cache.keys, cache.values) = (Some(new_keys), Some(new_values));
        } else if let Some(&bad) = sources.iter().find(|&&s| s >= cache.rows) {
            panic!("CUDA backend: cache row {bad} out of range (0..{})", cache.rows);
        }
        cache.rows = rows;
    }

    fn append_memory_kv(&self, memory: &mut DeviceBuffer, rows: &mut DeviceBuffer, _lengths: &[usize], _width: usize, kv: KvCacheType, _chunk: usize) {
        assert_eq!(kv, KvCacheType::Float32, "the CUDA backend keeps keys/values in float32");
        // A decoding here takes no rows in (`can_append_rows`): its memory is one batch's.
        assert!(memory.is_empty(), "CUDA backend: memory keys/values appended to");
        std::mem::swap(memory, rows);
    }

    fn keep_memory_kv(&self, memory: &mut DeviceBuffer, layout: &SequenceLayout, kept: &[usize], slots: usize) {
        let (_, rows) = layout.select(kept);
        self.reorder_rows(memory, slots, &rows);
    }

    fn memory_attention(
        &self,
        _ctx: &Ctx,
        query: &DeviceBuffer,
        memory_kv: &DeviceBuffer,
        kv: KvCacheType,
        memory: &SequenceLayout,
        row_example: &[usize],
        shape: AttentionShape,
        out: &mut DeviceBuffer,
    ) {
        assert_eq!(kv, KvCacheType::Float32, "the CUDA backend keeps keys/values in float32");
        let d = shape.dim;
        let rows = row_example.len();
        if rows == 0 || d == 0 {
            self.ensure(out, 0);
            return;
        }
        assert!(query.len() >= rows * d, "CUDA backend: queries of {} floats for {rows} rows of width {d}", query.len());
        if let Some(&bad) = row_example.iter().find(|&&e| e >= memory.lengths.len()) {
            panic!("CUDA backend: example {bad} out of range (0..{})", memory.lengths.len());
        }
        assert!(memory_kv.len() >= memory.total_rows() * 2 * d, "CUDA backend: memory keys/values smaller than the memory layout");
        let m = memory_kv.slice();
        let keys = KeySource {
            keys: m.slice(..),
            values: m.slice(d..),
            stride: 2 * d,
            rows: Some(memory_rows(&memory.offsets, &memory.lengths, row_example)),
            base_stride: 0,
            const_len: 0,
        };
        self.attention(&query.slice().slice(..), d, keys, rows, shape, out);
    }

    fn ssru(&self, cells: &mut DeviceBuffer, input: &DeviceBuffer, forget: &DeviceBuffer, out: &mut DeviceBuffer) {
        let n = cells.len();
        assert!(input.len() >= n && forget.len() >= n, "CUDA backend: SSRU inputs smaller than its cells");
        self.ensure(out, n);
        if n > 0 {
            let n_i = to_i32(n);
            launch!(self.dev(), "ssru", Device::elementwise(n), cells.slice_mut(), input.slice(), forget.slice(), out.slice_mut(), &n_i);
        }
    }

    fn running_average(&self, average: &mut DeviceBuffer, x: &DeviceBuffer, step: usize) {
        let n = average.len();
        assert!(x.len() >= n, "CUDA backend: running average input smaller than the average");
        if n > 0 {
            let (step, n_i) = (to_i32(step), to_i32(n));
            launch!(self.dev(), "running_average", Device::elementwise(n), average.slice_mut(), x.slice(), &step, &n_i);
        }
    }

    fn gate(&self, y: &mut DeviceBuffer, x: &DeviceBuffer, input_gate: &DeviceBuffer, forget_gate: &DeviceBuffer) {
        let n = y.len();
        assert!(x.len() >= n && input_gate.len() >= n && forget_gate.len() >= n, "CUDA backend: gate inputs smaller than its output");
        if n > 0 {
            let n_i = to_i32(n);
            launch!(self.dev(), "gate", Device::elementwise(n), y.slice_mut(), x.slice(), input_gate.slice(), forget_gate.slice(), &n_i);
        }
    }

    fn reorder_rows(&self, x: &mut DeviceBuffer, dim: usize, sources: &[usize]) {
        if dim == 0 {
            x.len = 0;
            return;
        }
        let idx = self.upload_indices(sources, x.len() / dim, "row");
        let mut reordered = DeviceBuffer::default();
        self.ensure(&mut reordered, sources.len() * dim);
        if !x.is_empty() {
            self.gather_kernel(
                &mut reordered.slice_mut().slice_mut(..),
                dim,
                &x.slice().slice(..),
                dim,
                Some(&*idx),
                sources.len(),
                dim,
                1.0,
            );
        }
        *x = reordered;
    }

    fn top_logits(
        &self,
        ctx: &Ctx,
        x: &DeviceBuffer,
        rows: usize,
        w: &DeviceMatrix,
        bias: Option<&DeviceVector>,
        disabled: &[&[u32]],
        k: usize,
    ) -> Option<TopLogits> {
        let vocab = w.n;
        let kernel_k = kernels::TOP_K_SIZES.into_iter().find(|&size| size >= k)?;
        if rows == 0 || k == 0 || k > vocab || disabled.len() != rows {
            return None;
        }
        let dev = self.dev();
        let mut logits = dev.logits_scratch.lock().unwrap_or_else(|e| e.into_inner());
        self.linear(ctx, x, rows, w, bias, false, &mut logits);
        if disabled.iter().any(|d| !d.is_empty()) {
            let mut offsets = Vec::with_capacity(rows + 1);
            let mut ids = Vec::new();
            offsets.push(0);
            for row in disabled {
                ids.extend_from_slice(row);
                offsets.push(to_u32(ids.len()));
            }
            let (offsets, ids) = (self.upload_u32(&offsets), self.upload_u32(&ids));
            let (vocab_i, rows_i) = (to_i32(vocab), to_i32(rows));
            launch!(dev, "disable_columns", Device::per_row(rows), logits.slice_mut(), &vocab_i, &*offsets, &*ids, &rows_i);
        }
        let stride = 2 * kernel_k + 1;
        let mut found = self.alloc(rows * stride);
        let name = match kernel_k {
            1 => "row_top_1",
            4 => "row_top_4",
            8 => "row_top_8",
            16 => "row_top_16",
            _ => "row_top_32",
        };
        let vocab_i = to_i32(vocab);
        let mut builder = dev.stream.launch_builder(dev.function(name));
        builder.arg(logits.slice()).arg(&vocab_i).arg(&mut found);
        // SAFETY: `row_top_K(logits, vocab, out)`: logits holds rows x vocab floats (the
        // product above), out rows x (2K + 1).
        check(unsafe { builder.launch(Device::per_row(rows)) }, "the row_top kernel");
        drop(logits);
        let mut host = vec![0.0f32; rows * stride];
        self.bind();
        check(dev.stream.memcpy_dtoh(&found.slice(..rows * stride), &mut host[..]), "copying the best logits to the host");
        check(dev.stream.synchronize(), "a decoding step on the GPU");
        let mut top = TopLogits { k, candidates: Vec::with_capacity(rows * k), log_sum_exp: Vec::with_capacity(rows) };
        for row in host.chunks_exact(stride) {
            top.candidates.extend((0..k).map(|j| (row[j].to_bits() as usize, row[kernel_k + j])));
            top.log_sum_exp.push(row[2 * kernel_k]);
        }
        // A row with fewer than k values that are not NaN leaves the kernel's filler
        // column (u32::MAX) in place: such a step is searched on the host, which has its
        // own rules for NaN.
        if top.candidates.iter().any(|&(column, _)| column >= vocab) {
            return None;
        }
        Some(top)
    }

    fn best_logits(
        &self,
        ctx: &Ctx,
        x: &DeviceBuffer,
        rows: usize,
        w: &DeviceMatrix,
        bias: Option<&DeviceVector>,
        disabled: &[&[u32]],
    ) -> Option<Vec<(usize, f32)>> {
        self.top_logits(ctx, x, rows, w, bias, disabled, 1).map(|top| top.candidates)
    }

    fn logits_to_host(&self, logits: &mut DeviceBuffer, host: &mut Vec<f32>) {
        let len = logits.len();
        host.clear();
        host.resize(len, 0.0);
        if len > 0 {
            self.bind();
            let stream = &self.dev().stream;
            check(stream.memcpy_dtoh(&logits.slice().slice(..len), &mut host[..]), "copying the logits to the host");
            check(stream.synchronize(), "a decoding step on the GPU");
        }
    }
}

/// The largest difference between `got` and `expected`, relative to `max(1, |expected|)`;
/// infinite when the lengths differ or any value is NaN (a NaN anywhere fails the check).
fn worst_error(got: &[f32], expected: &[f32]) -> f32 {
    if got.len() != expected.len() {
        return f32::INFINITY;
    }
    got.iter().zip(expected).fold(0.0f32, |worst, (&g, &e)| {
        let err = (g - e).abs() / e.abs().max(1.0);
        if err.is_nan() {
            f32::INFINITY
        } else {
            worst.max(err)
        }
    })
}

/// Runs a few operations on the device and the same ones through [`CpuBackend`](crate::backend::cpu::CpuBackend),
/// and compares: whether the device really computes, in float32. The inputs are not
/// dyadic (thirds and sevenths), so a product in a reduced precision (TF32) would differ
/// by far more than the tolerance. Covers cuBLAS (a product with bias and ReLU), the
/// layer norm, embedding and row-gathering kernels and the attention kernel.
pub(super) fn smoke_test(backend: &CudaBackend) -> Result<()> {
    use crate::backend::cpu::CpuBackend;
    const TOLERANCE: f32 = 1e-4;
    let cpu = CpuBackend;
    let ctx = Ctx::default();
    let tensor = |v: &[f32], shape: Vec<usize>| Arc::new(Tensor::from_vec(v.to_vec(), shape));
    let values = |len: usize, seed: usize| -> Vec<f32> {
        (0..len).map(|i| ((i * 7 + seed * 5) % 11) as f32 / 3.0 - 1.6 + (i % 5) as f32 / 7.0).collect()
    };
    let mut failures = Vec::new();
    let mut compare = |what: &str, got: &mut DeviceBuffer, expected: &[f32]| {
        let mut host = Vec::new();
        backend.logits_to_host(got, &mut host);
        let worst = worst_error(&host, expected);
        // `worst_error` is infinite for a NaN, so any NaN fails here.
        if worst.is_nan() || worst > TOLERANCE {
            failures.push(format!("{what} differs from the CPU's by {worst}"));
        }
    };

    // product (+ bias, ReLU; a TF32 product would be off by ~1e-3 here), then layer norm
    let (rows, n, k) = (3usize, 5usize, 7usize);
    let (x, w, bias) = (values(rows * k, 1), values(n * k, 2), values(n, 3));
    let (gamma, beta) = (values(n, 4), values(n, 5));
    let gw = backend.matrix(MatrixData::Float(tensor(&w, vec![n, k])), n, k, ComputeType::Float32)?;
    let cw = cpu.matrix(MatrixData::Float(tensor(&w, vec![n, k])), n, k, ComputeType::Float32)?;
    let (cb, cg, cbeta) = (tensor(&bias, vec![n]), tensor(&gamma, vec![n]), tensor(&beta, vec![n]));
    let (gb, gg, gbeta) = (backend.vector(cb.clone())?, backend.vector(cg.clone())?, backend.vector(cbeta.clone())?);
    let mut got = DeviceBuffer::default();
    let mut expected = Vec::new();
    backend.linear(&ctx, &backend.buffer_from_host(&x), rows, &gw, Some(&gb), true, &mut got);
    cpu.linear(&ctx, &x, rows, &cw, Some(&cb), true, &mut expected);
    compare("a product", &mut got, &expected);
    backend.layer_norm(&mut got, &gg, Some(&gbeta), 1e-5, FloatOrder::default());
    cpu.layer_norm(&mut expected, &cg, Some(&cbeta), 1e-5, FloatOrder::default());
    compare("a layer norm", &mut got, &expected);

    // embedding: from a table (scaled), and from rows gathered out of a weight
    let (vocab, dim) = (6usize, 4usize);
    let table = tensor(&values(vocab * dim, 6), vec![vocab, dim]);
    let gt = backend.vector(table.clone())?;
    let ids = [5u32, 0, 2, 5];
    backend.embed(EmbeddingRows::Dense(&gt), dim, &ids, Some(1.5), &mut got);
    cpu.embed(EmbeddingRows::Dense(&table), dim, &ids, Some(1.5), &mut expected);
    compare("an embedding", &mut got, &expected);
    let (gs, cs) = (backend.gather_rows(&gw, &[4, 1, 3]), cpu.gather_rows(&cw, &[4, 1, 3]));
    backend.embed(EmbeddingRows::Packed(&gs), k, &[2, 0, 1, 0], None, &mut got);
    cpu.embed(EmbeddingRows::Packed(&cs), k, &[2, 0, 1, 0], None, &mut expected);
    compare("rows gathered from a weight", &mut got, &expected);

    // attention: 2 query rows over 3 keys, 2 heads
    let shape = AttentionShape { num_heads: 2, dim: 4, order: FloatOrder::default() };
    let layout = SequenceLayout::new(vec![3]);
    let (query, memory_kv) = (values(2 * 4, 7), values(3 * 2 * 4, 8));
    backend.memory_attention(&Ctx::default(), &backend.buffer_from_host(&query), &backend.buffer_from_host(&memory_kv), KvCacheType::Float32, &layout, &[0, 0], shape, &mut got);
    let cpu_memory = CpuMemoryKv::float32(&memory_kv, &layout.lengths, 2 * 4);
    cpu.memory_attention(&Ctx::default(), &query, &cpu_memory, KvCacheType::Float32, &layout, &[0, 0], shape, &mut expected);
    compare("an attention", &mut got, &expected);

    if !failures.is_empty() {
        return Err(Error::unsupported(format!(
            "CUDA device {} computes wrong results: {}",
            backend.info().index,
            failures.join("; ")
        )));
    }
    Ok(())
}
