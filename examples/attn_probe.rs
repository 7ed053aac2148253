//! Times a decoder step's attention for one query row over `len` keys (8 heads of 64), as
//! the decoder calls it: `cargo run --release --example attn_probe [-- --isa avx2]`.
//! "warm": the same keys and values every call (in L1/L2); "cold": each call reads another
//! part of 64 MB of keys and values, as a decoder step finds them once the weights have
//! streamed through the caches, and asks for the next call's first ones beforehand
//! (`prefetch_rows`), as the decoder does for its next row.
use std::time::Instant;
use tolk::backend::cpu::attention::{attend_row_padded, prefetch_rows, KvView};
use tolk::backend::cpu::isa::{self, Isa};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let level = args.iter().position(|a| a == "--isa").and_then(|i| args.get(i + 1)).map(|n| Isa::parse(n).expect("--isa: unknown level")).unwrap_or_else(isa::detected);
    let (heads, dim) = (8, 64);
    let width = heads * dim;
    let q: Vec<f32> = (0..width).map(|i| ((i * 31 % 17) as f32 - 8.0) * 0.05).collect();
    for len in [8usize, 30, 60] {
        // Keys and values of `copies` rows of `len` keys each, 64 MB in all.
        let copies = (64 << 20) / (2 * 4 * len * width);
        let keys: Vec<f32> = (0..copies * len * width).map(|i| ((i * 7919 % 101) as f32 - 50.0) * 0.01).collect();
        let values: Vec<f32> = keys.iter().map(|v| v * 0.5).collect();
        let part = |c: usize| -> (&[f32], &[f32]) { (&keys[c * len * width..(c + 1) * len * width], &values[c * len * width..(c + 1) * len * width]) };
        let (mut scores, mut out) = (Vec::new(), vec![0.0f32; width]);
        for cold in [false, true] {
            let calls = 20 * copies;
            let mut run = || {
                for c in 0..calls {
                    let (k, v) = part(if cold { c % copies } else { 0 });
                    if cold {
                        let (next_k, next_v) = part((c + 1) % copies);
                        prefetch_rows(&KvView::contiguous(&next_k, width, 0), &KvView::contiguous(&next_v, width, 0), len, width);
                    }
                    attend_row_padded(std::hint::black_box(&q), KvView::contiguous(&k, width, 0), KvView::contiguous(&v, width, 0), len, len, heads, dim, 0.125, true, &mut scores, &mut out);
                }
            };
            isa::with_isa(level, &mut run);
            let t = Instant::now();
            isa::with_isa(level, &mut run);
            let ns = t.elapsed().as_secs_f64() * 1e9 / (calls * len) as f64;
            println!("{:>10} len {len:>2} {}: {ns:6.1} ns a key", level.name(), if cold { "cold" } else { "warm" });
        }
    }
}
