//! Tests of the CUDA backend. Without a GPU they check that probing fails cleanly, that
//! the kernels compile (when NVRTC can be loaded: see `kernels_compile_with_nvrtc`) and
//! the host-side logic; with one, every operation against the CPU backend.
use std::sync::Arc;

use super::kernels::{self, KERNEL_NAMES, SOURCE};
use super::memory::{dequantize_i16, dequantize_i8, grown_capacity, grown_steps, memory_rows, sequence_rows};
use super::{probe, CudaBackend};
use crate::backend::cpu::CpuBackend;
use crate::backend::{
    Activation, AttentionShape, Backend, ComputeType, Ctx, EmbeddingRows, FloatOrder, KvCacheType, MatrixData, PositionTable, Quantized, SequenceLayout,
};
use crate::tensor::Tensor;

fn driver_present() -> bool {
    // SAFETY: only tries to load the library.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

fn nvrtc_present() -> bool {
    super::libs::nvrtc().is_ok()
}

#[test]
fn probe_without_a_driver_is_a_clear_error() {
    let result = probe(0);
    if driver_present() {
        // A machine with a driver: whatever the answer, it came back without panicking.
        if let Err(e) = &result {
            eprintln!("probe(0) on this machine: {e}");
        }
        return;
    }
    let e = result.expect_err("no driver: the probe must fail");
    assert_eq!(e.kind, crate::error::ErrorKind::Unsupported);
    assert!(e.message.contains("no CUDA driver found") && e.message.contains("libcuda.so"), "{}", e.message);
    // Asking again gives the same answer (nothing half-initialized is cached).
    assert_eq!(probe(3).unwrap_err().message, e.message);
}

#[test]
fn backend_without_a_driver_is_a_clear_error() {
    match CudaBackend::new(0) {
        Err(e) if !driver_present() => assert!(e.message.contains("libcuda.so"), "{}", e.message),
        Err(e) => eprintln!("CudaBackend::new(0) on this machine: {e}"),
        Ok(b) => eprintln!("CUDA backend available: {}", b.name()),
    }
}

/// Compiles the kernels with NVRTC for every architecture the backend picks. Runs where
/// libnvrtc.so.12 can be loaded, e.g. with the pip package:
/// `pip install nvidia-cuda-nvrtc-cu12` then
/// `LD_LIBRARY_PATH=$(python3 -c 'import nvidia.cuda_nvrtc as m; print(m.__path__[0])')/lib cargo test --release --lib cuda`.
#[test]
fn kernels_compile_with_nvrtc() {
    if !nvrtc_present() {
        println!("no NVRTC: kernel compilation not checked");
        return;
    }
    // NVRTC 13 dropped the architectures before Turing (compute_75).
    let (nvrtc_major, _) = super::libs::nvrtc().unwrap().version();
    let oldest = if nvrtc_major >= 13 { "compute_75" } else { "compute_50" };
    for arch in ["compute_50", "compute_52", "compute_70", "compute_75", "compute_80"].into_iter().filter(|&a| a >= oldest) {
        let ptx = kernels::compile(arch).unwrap_or_else(|e| panic!("{e}"));
        let text = ptx.to_src();
        for name in KERNEL_NAMES {
            assert!(text.contains(&format!(".entry {name}(")), "kernel {name} missing from the PTX for {arch}");
        }
    }
}

#[test]
fn every_kernel_named_is_in_the_source() {
    for name in KERNEL_NAMES {
        assert!(SOURCE.contains(&format!("__global__ void {name}(")), "kernel {name} not in the source");
    }
    assert_eq!(SOURCE.matches("__global__").count(), KERNEL_NAMES.len(), "a kernel in the source is not loaded");
}

#[test]
fn activation_codes_follow_ctranslate2_ids() {
    for id in 0..6 {
        let activation = Activation::from_ct2_id(id).unwrap();
        assert_eq!(kernels::activation_code(activation) as i64, id);
    }
}

#[test]
fn architecture_per_compute_capability() {
    assert_eq!(kernels::arch_for((9, 0)), "compute_80");
    assert_eq!(kernels::arch_for((8, 6)), "compute_80");
    assert_eq!(kernels::arch_for((7, 5)), "compute_75");
    assert_eq!(kernels::arch_for((7, 0)), "compute_70");
    assert_eq!(kernels::arch_for((6, 1)), "compute_52");
    assert_eq!(kernels::arch_for((5, 2)), "compute_52");
    assert_eq!(kernels::arch_for((5, 0)), "compute_50");
}

#[test]
fn buffers_grow_geometrically_and_never_shrink() {
    assert_eq!(grown_capacity(0, 1), 1024);
    assert_eq!(grown_capacity(4096, 100), 4096);
    assert_eq!(grown_capacity(4096, 4096), 4096);
    assert_eq!(grown_capacity(4096, 4097), 6144);
    assert_eq!(grown_capacity(4096, 10_000), 10_240);
    // A buffer growing one row at a time reallocates O(log n) times.
    let (mut cap, mut reallocations) = (0, 0);
    for len in (512..=512 * 1000).step_by(512) {
        let next = grown_capacity(cap, len);
        reallocations += (next != cap) as usize;
        cap = next;
        assert!(cap >= len && cap % 1024 == 0);
    }
    assert!(reallocations < 20, "{reallocations}");
}

#[test]
fn key_value_caches_double() {
    assert_eq!(grown_steps(0, 1), 16);
    assert_eq!(grown_steps(16, 16), 16);
    assert_eq!(grown_steps(16, 17), 32);
    assert_eq!(grown_steps(32, 100), 100);
}

#[test]
fn attention_row_tables() {
    let layout = SequenceLayout::new(vec![2, 0, 3]);
    let (base, len) = sequence_rows(&layout.offsets, &layout.lengths);
    assert_eq!(base, [0, 0, 2, 2, 2]);
    assert_eq!(len, [2, 2, 3, 3, 3]);
    let (base, len) = memory_rows(&layout.offsets, &layout.lengths, &[2, 0, 0, 1]);
    assert_eq!(base, [2, 0, 0, 2]);
    assert_eq!(len, [3, 2, 2, 0]);
}

#[test]
fn dequantization_matches_the_cpu_read_back() {
    let (n, k) = (3, 5);
    let values: Vec<i8> = (0..n * k).map(|i| (i as i32 * 37 % 255 - 127) as i8).collect();
    let scales = vec![10.0f32, 3.0, 127.0];
    let w = dequantize_i8(&values, &scales, n, k);
    let cpu = CpuBackend;
    let quantized = MatrixData::Quantized(Quantized::Int8 { values: values.into(), scales, activation_scale: None, intgemm: false });
    let packed = cpu.matrix(quantized, n, k, ComputeType::Int8).unwrap();
    let mut row = vec![0.0f32; k];
    for r in 0..n {
        packed.copy_row(r, &mut row);
        assert_eq!(&w[r * k..(r + 1) * k], &row[..], "int8 row {r}");
    }
    let values16: Vec<i16> = (0..n * k).map(|i| (i as i32 * 1234 % 30000 - 15000) as i16).collect();
    let w16 = dequantize_i16(&values16, 1000.0);
    let packed = cpu.matrix(MatrixData::Quantized(Quantized::Int16 { values: values16, scale: 1000.0 }), n, k, ComputeType::Int16).unwrap();
    for r in 0..n {
        packed.copy_row(r, &mut row);
        assert_eq!(&w16[r * k..(r + 1) * k], &row[..], "int16 row {r}");
    }
}

// ---- With a GPU: every operation against the CPU backend. ----

fn gpu() -> Option<CudaBackend> {
    match CudaBackend::new(0) {
        Ok(b) => Some(b),
        Err(e) => {
            println!("no usable GPU, CUDA operations not checked: {e}");
            None
        }
    }
}

/// Deterministic values in [-1, 1).
fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(12345);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s % 20_000) as f32 / 10_000.0 - 1.0
        })
        .collect()
}

fn tensor(v: Vec<f32>, shape: Vec<usize>) -> Arc<Tensor> {
    Arc::new(Tensor::from_vec(v, shape))
}

fn host(gpu: &CudaBackend, buf: &mut super::DeviceBuffer) -> Vec<f32> {
    let mut out = Vec::new();
    gpu.logits_to_host(buf, &mut out);
    out
}

#[track_caller]
fn assert_close(got: &[f32], expected: &[f32], tolerance: f32, what: &str) {
    assert_eq!(got.len(), expected.len(), "{what}: lengths");
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        assert!((g - e).abs() <= tolerance * (1.0 + e.abs()), "{what}[{i}]: {g} vs {e}");
    }
}

#[test]
fn operations_match_the_cpu_backend() {
    let Some(gpu) = gpu() else { return };
    let cpu = CpuBackend;
    let ctx = Ctx::default();
    let (rows, n, k) = (5, 33, 70);
    let x = data(rows * k, 1);
    let w = data(n * k, 2);
    let bias = data(n, 3);

    // linear (+ bias, + relu), float and int8 storage, and a shortlist of its rows
    let gw = gpu.matrix(MatrixData::Float(tensor(w.clone(), vec![n, k])), n, k, ComputeType::Float32).unwrap();
    let cw = cpu.matrix(MatrixData::Float(tensor(w.clone(), vec![n, k])), n, k, ComputeType::Float32).unwrap();
    let (gb, cb) = (gpu.vector(tensor(bias.clone(), vec![n])).unwrap(), tensor(bias.clone(), vec![n]));
    let gx = gpu.buffer_from_host(&x);
    for relu in [false, true] {
        let (mut go, mut co) = (Default::default(), Vec::new());
        gpu.linear(&ctx, &gx, rows, &gw, Some(&gb), relu, &mut go);
        cpu.linear(&ctx, &x, rows, &cw, Some(&cb), relu, &mut co);
        assert_close(&host(&gpu, &mut go), &co, 1e-4, "linear");
    }
    let ids = [3u32, 0, 32, 7];
    let (gs, cs) = (gpu.gather_rows(&gw, &ids), cpu.gather_rows(&cw, &ids));
    let (gsb, csb) = (gpu.gather(&gb, &ids), cpu.gather(&cb, &ids));
    let (mut go, mut co) = (Default::default(), Vec::new());
    gpu.linear(&ctx, &gx, rows, &gs, Some(&gsb), false, &mut go);
    cpu.linear(&ctx, &x, rows, &cs, Some(&csb), false, &mut co);
    assert_close(&host(&gpu, &mut go), &co, 1e-4, "shortlisted linear");

    // float16 weights (compute type float16): products on float16-rounded operands with
    // float32 sums, the shortlist's rows and embeddings gathered from the float16 table.
    let rounded = |v: &[f32]| v.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect::<Vec<f32>>();
    let hw = gpu.matrix(MatrixData::Float(tensor(w.clone(), vec![n, k])), n, k, ComputeType::Float16).unwrap();
    let cw16 = cpu.matrix(MatrixData::Float(tensor(rounded(&w), vec![n, k])), n, k, ComputeType::Float32).unwrap();
    let x16 = rounded(&x);
    let (mut go, mut co) = (Default::default(), Vec::new());
    gpu.linear(&ctx, &gx, rows, &hw, Some(&gb), true, &mut go);
    cpu.linear(&ctx, &x16, rows, &cw16, Some(&cb), true, &mut co);
    assert_close(&host(&gpu, &mut go), &co, 1e-4, "float16 linear");
    let (hs, cs16) = (gpu.gather_rows(&hw, &ids), cpu.gather_rows(&cw16, &ids));
    let (mut go, mut co) = (Default::default(), Vec::new());
    gpu.linear(&ctx, &gx, rows, &hs, None, false, &mut go);
    cpu.linear(&ctx, &x16, rows, &cs16, None, false, &mut co);
    assert_close(&host(&gpu, &mut go), &co, 1e-4, "float16 shortlisted linear");
    let mut ge = Default::default();
    gpu.embed(EmbeddingRows::Packed(&hw), k, &[2, 0, 32], Some(2.0), &mut ge);
    let expected: Vec<f32> = [2usize, 0, 32].iter().flat_map(|&r| rounded(&w[r * k..(r + 1) * k])).map(|v| v * 2.0).collect();
    assert_close(&host(&gpu, &mut ge), &expected, 0.0, "float16 embedding");

    // layer norm, RMS norm
    let d = 64;
    let y = data(rows * d, 4);
    let gamma = tensor(data(d, 5), vec![d]);
    let beta = tensor(data(d, 6), vec![d]);
    let (gg, gbeta) = (gpu.vector(gamma.clone()).unwrap(), gpu.vector(beta.clone()).unwrap());
    for with_beta in [true, false] {
        let (mut gy, mut cy) = (gpu.buffer_from_host(&y), y.clone());
        gpu.layer_norm(&mut gy, &gg, with_beta.then_some(&gbeta), 1e-6, FloatOrder::Ctranslate2);
        cpu.layer_norm(&mut cy, &gamma, with_beta.then_some(&beta), 1e-6, FloatOrder::Ctranslate2);
        assert_close(&host(&gpu, &mut gy), &cy, 1e-5, "layer norm");
    }

    // activations, add, zeros, copy
    for id in 0..6 {
        let a = Activation::from_ct2_id(id).unwrap();
        let v: Vec<f32> = data(300, 7).iter().map(|v| v * 4.0).collect();
        let (mut gv, mut cv) = (gpu.buffer_from_host(&v), v.clone());
        gpu.activation(&ctx, &mut gv, a);
        cpu.activation(&ctx, &mut cv, a);
        assert_close(&host(&gpu, &mut gv), &cv, 1e-6, &format!("{a:?}"));
    }
    let (mut gy, gz) = (gpu.buffer_from_host(&y), gpu.buffer_from_host(&data(rows * d, 8)));
    gpu.add(&mut gy, &gz);
    let sum: Vec<f32> = y.iter().zip(data(rows * d, 8)).map(|(a, b)| a + b).collect();
    assert_eq!(host(&gpu, &mut gy), sum);
    let mut copy = Default::default();
    gpu.copy(&gz, &mut copy);
    assert_eq!(host(&gpu, &mut copy), data(rows * d, 8));
    gpu.zeros(&mut copy, 3, 5);
    assert_eq!(host(&gpu, &mut copy), vec![0.0; 15]);

    // embeddings (dense and from a matrix) and positions (table and sinusoids)
    let vocab = 20;
    let table = tensor(data(vocab * d, 9), vec![vocab, d]);
    let gt = gpu.vector(table.clone()).unwrap();
    let tokens = [4u32, 19, 0, 4];
    let (mut ge, mut ce) = (Default::default(), Vec::new());
    gpu.embed(EmbeddingRows::Dense(&gt), d, &tokens, Some(8.0), &mut ge);
    cpu.embed(EmbeddingRows::Dense(&table), d, &tokens, Some(8.0), &mut ce);
    assert_eq!(host(&gpu, &mut ge), ce);
    let (gm, cm) = (
        gpu.matrix(MatrixData::Float(table.clone()), vocab, d, ComputeType::Float32).unwrap(),
        cpu.matrix(MatrixData::Float(table.clone()), vocab, d, ComputeType::Float32).unwrap(),
    );
    let (mut gp, mut cp) = (Default::default(), Vec::new());
    gpu.embed(EmbeddingRows::Packed(&gm), d, &tokens, None, &mut gp);
    cpu.embed(EmbeddingRows::Packed(&cm), d, &tokens, None, &mut cp);
    assert_eq!(host(&gpu, &mut gp), cp);
    let positions = [0usize, 1, 7, 300];
    gpu.embed(EmbeddingRows::Dense(&gt), d, &tokens, None, &mut ge);
    cpu.embed(EmbeddingRows::Dense(&table), d, &tokens, None, &mut ce);
    gpu.add_positions(&mut ge, d, PositionTable::Sinusoidal { start: 2 }, &positions);
    cpu.add_positions(&mut ce, d, PositionTable::Sinusoidal { start: 2 }, &positions);
    // CUDA's expf may be 1 ulp off glibc's: a frequency 1 ulp off moves the angle at
    // position 302 by ~2e-5.
    assert_close(&host(&gpu, &mut ge), &ce, 1e-4, "sinusoids");
    gpu.add_positions(&mut ge, d, PositionTable::Table(&gt), &[1, 2, 3, 19]);
    cpu.add_positions(&mut ce, d, PositionTable::Table(&table), &[1, 2, 3, 19]);
    assert_close(&host(&gpu, &mut ge), &ce, 1e-5, "position table");

    // recurrent cells
    let m = rows * d;
    let (c0, inp, f) = (data(m, 10), data(m, 11), data(m, 12));
    let (mut gc, mut cc) = (gpu.buffer_from_host(&c0), c0.clone());
    let (mut go, mut co) = (Default::default(), Vec::new());
    gpu.ssru(&mut gc, &gpu.buffer_from_host(&inp), &gpu.buffer_from_host(&f), &mut go);
    cpu.ssru(&mut cc, &inp, &f, &mut co);
    assert_close(&host(&gpu, &mut go), &co, 1e-6, "ssru out");
    assert_close(&host(&gpu, &mut gc), &cc, 1e-6, "ssru cells");
    for step in [0, 3] {
        let (mut ga, mut ca) = (gpu.buffer_from_host(&c0), c0.clone());
        gpu.running_average(&mut ga, &gpu.buffer_from_host(&inp), step);
        cpu.running_average(&mut ca, &inp, step);
        assert_close(&host(&gpu, &mut ga), &ca, 1e-6, "running average");
    }
    let (mut gy2, mut cy2) = (gpu.buffer_from_host(&c0), c0.clone());
    gpu.gate(&mut gy2, &gpu.buffer_from_host(&inp), &gpu.buffer_from_host(&f), &gpu.buffer_from_host(&x[..m]));
    cpu.gate(&mut cy2, &inp, &f, &x[..m].to_vec());
    assert_close(&host(&gpu, &mut gy2), &cy2, 1e-6, "gate");
    let (mut gr, mut cr) = (gpu.buffer_from_host(&c0), c0.clone());
    gpu.reorder_rows(&mut gr, d, &[4, 4, 0, 2]);
    cpu.reorder_rows(&mut cr, d, &[4, 4, 0, 2]);
    assert_eq!(host(&gpu, &mut gr), cr);
}

#[test]
fn attention_matches_the_cpu_backend() {
    let Some(gpu) = gpu() else { return };
    let cpu = CpuBackend;
    let (heads, d) = (4, 32);
    let shape = AttentionShape { num_heads: heads, dim: d, order: FloatOrder::Ctranslate2 };

    // encoder self-attention over a batch of 3 sequences
    let layout = SequenceLayout::new(vec![3, 1, 6]);
    let total = layout.total_rows();
    let qkv = data(total * 3 * d, 20);
    let (mut go, mut co) = (Default::default(), Vec::new());
    gpu.sequence_attention(&Ctx::default(), &gpu.buffer_from_host(&qkv), &layout, shape, &mut go);
    cpu.sequence_attention(&Ctx::default(), &qkv, &layout, shape, &mut co);
    assert_close(&host(&gpu, &mut go), &co, 1e-5, "sequence attention");

    // cross-attention: rows of examples 2, 0, 0, 1
    let row_example = [2usize, 0, 0, 1];
    let query = data(row_example.len() * d, 21);
    let memory_kv = data(total * 2 * d, 22);
    gpu.memory_attention(&Ctx::default(), &gpu.buffer_from_host(&query), &gpu.buffer_from_host(&memory_kv), KvCacheType::Float32, &layout, &row_example, shape, &mut go);
    let cpu_memory = crate::backend::cpu::memory_kv::CpuMemoryKv::float32(&memory_kv, &layout.lengths, 2 * d);
    cpu.memory_attention(&Ctx::default(), &query, &cpu_memory, KvCacheType::Float32, &layout, &row_example, shape, &mut co);
    assert_close(&host(&gpu, &mut go), &co, 1e-5, "memory attention");

    // decoder self-attention over 40 steps (the cache regrows), reordered on the way
    let rows = 3;
    let (mut gcache, mut ccache) = (gpu.new_kv_cache(rows, KvCacheType::Float32), cpu.new_kv_cache(rows, KvCacheType::Float32));
    let mut rows_now = rows;
    for step in 0..40 {
        let qkv = data(rows_now * 3 * d, 100 + step);
        gpu.cached_attention(&Ctx::default(), &gpu.buffer_from_host(&qkv), &mut gcache, shape, &mut go);
        cpu.cached_attention(&Ctx::default(), &qkv, &mut ccache, shape, &mut co);
        assert_close(&host(&gpu, &mut go), &co, 1e-5, &format!("cached attention step {step}"));
        if step == 10 {
            let sources = [2usize, 2, 0, 1];
            gpu.reorder_kv_cache(&mut gcache, &sources);
            cpu.reorder_kv_cache(&mut ccache, &sources);
            rows_now = sources.len();
        }
    }
    assert_eq!((gcache.rows(), gcache.steps()), (4, 40));
    assert!(gcache.capacity() >= 40);
}

/// Each row's best logits and log-sum-exp found on the device equal what beam search finds
/// from the logits on the host (ties to the lower column, disabled columns at f32::MIN).
#[test]
fn top_logits_match_the_host_search() {
    let Some(gpu) = gpu() else { return };
    let ctx = Ctx::default();
    let (rows, vocab, k) = (7, 5003, 16);
    // Values on a coarse grid, so that rows hold ties.
    let x: Vec<f32> = data(rows * k, 7).iter().map(|v| (v * 4.0).round() / 4.0).collect();
    let w: Vec<f32> = data(vocab * k, 8).iter().map(|v| (v * 4.0).round() / 4.0).collect();
    let gw = gpu.matrix(MatrixData::Float(tensor(w, vec![vocab, k])), vocab, k, ComputeType::Float32).unwrap();
    let gx = gpu.buffer_from_host(&x);
    let (mut go, mut logits) = (Default::default(), Vec::new());
    gpu.linear(&ctx, &gx, rows, &gw, None, false, &mut go);
    gpu.logits_to_host(&mut go, &mut logits);
    let masks: Vec<Vec<u32>> = (0..rows).map(|r| if r % 3 == 0 { vec![] } else { vec![1, 17, 5002, 9999] }).collect();
    let masks: Vec<&[u32]> = masks.iter().map(Vec::as_slice).collect();
    for want in [1, 2, 4, 8, 10, 32] {
        let top = gpu.top_logits(&ctx, &gx, rows, &gw, None, &masks, want).expect("found on the device");
        assert_eq!((top.k, top.candidates.len(), top.log_sum_exp.len()), (want, rows * want, rows));
        let mut best = Vec::new();
        for r in 0..rows {
            let mut row = logits[r * vocab..(r + 1) * vocab].to_vec();
            crate::decode::disable(&mut row, masks[r]);
            crate::decode::beam::top_k(&row, want, &mut best);
            assert_eq!(&top.candidates[r * want..(r + 1) * want], &best[..], "row {r}, k {want}");
            let lse = crate::backend::cpu::ops::log_sum_exp(&row);
            assert!((top.log_sum_exp[r] - lse).abs() <= 1e-5 * lse.abs().max(1.0), "row {r}: {} vs {lse}", top.log_sum_exp[r]);
        }
    }
    assert!(gpu.top_logits(&ctx, &gx, rows, &gw, None, &masks, 33).is_none(), "more candidates than the kernels keep");
}
