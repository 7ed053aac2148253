//! Test support: writes small CTranslate2 model directories from Rust, so loader tests
//! need no Python and can mutate the bytes freely.
#![allow(dead_code)]
use std::path::{Path, PathBuf};

/// A tiny deterministic pseudo-random generator (xorshift), enough for test weights.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

pub enum Value {
    F32(Vec<usize>, Vec<f32>),
    I8(Vec<usize>, Vec<i8>),
    I16(Vec<usize>, Vec<i16>),
}

/// Serializes variables (sorted by name) and aliases in model.bin version 6 layout.
pub fn write_model_bin(vars: &mut [(String, Value)], aliases: &[(&str, &str)]) -> Vec<u8> {
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out = Vec::new();
    let put_str = |out: &mut Vec<u8>, s: &str| {
        out.extend_from_slice(&((s.len() + 1) as u16).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
        out.push(0);
    };
    out.extend_from_slice(&6u32.to_le_bytes());
    put_str(&mut out, "TransformerSpec");
    out.extend_from_slice(&7u32.to_le_bytes());
    out.extend_from_slice(&(vars.len() as u32).to_le_bytes());
    for (name, value) in vars.iter() {
        put_str(&mut out, name);
        let (shape, dtype, bytes): (&Vec<usize>, u8, Vec<u8>) = match value {
            Value::F32(s, d) => (s, 0, d.iter().flat_map(|v| v.to_le_bytes()).collect()),
            Value::I8(s, d) => (s, 1, d.iter().map(|&v| v as u8).collect()),
            Value::I16(s, d) => (s, 2, d.iter().flat_map(|v| v.to_le_bytes()).collect()),
        };
        out.push(shape.len() as u8);
        for &d in shape {
            out.extend_from_slice(&(d as u32).to_le_bytes());
        }
        out.push(dtype);
        out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        out.extend_from_slice(&bytes);
    }
    out.extend_from_slice(&(aliases.len() as u32).to_le_bytes());
    for (a, t) in aliases {
        put_str(&mut out, a);
        put_str(&mut out, t);
    }
    out
}

/// Builds a random post-norm Transformer (1+1 layers, d=8, 2 heads, shared vocabulary)
/// with tied embeddings, as a CTranslate2 converter would.
pub fn tiny_model_bin(seed: u64, vocab: usize) -> Vec<u8> {
    let (mut vars, aliases) = tiny_model_vars(seed, vocab);
    write_model_bin(&mut vars, &aliases)
}

/// The same model with its weights saved as int8 with per-row scales, as CTranslate2's
/// converter writes them with `--quantization int8`.
pub fn tiny_int8_model_bin(seed: u64, vocab: usize) -> Vec<u8> {
    tiny_int8_model_bin_edited(seed, vocab, &|_, _| {})
}

/// [`tiny_int8_model_bin`] with `edit(name, scales)` applied to each weight's scales.
pub fn tiny_int8_model_bin_edited(seed: u64, vocab: usize, edit: &dyn Fn(&str, &mut Vec<f32>)) -> Vec<u8> {
    let (vars, aliases) = tiny_model_vars(seed, vocab);
    let mut out = Vec::new();
    for (name, value) in vars {
        match value {
            Value::F32(shape, data) if name.ends_with("weight") && shape.len() == 2 => {
                let cols = shape[1];
                let (mut q, mut scales) = (Vec::new(), Vec::new());
                for row in data.chunks(cols) {
                    let amax = row.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                    let scale = if amax > 0.0 { 127.0 / amax } else { 1.0 };
                    q.extend(row.iter().map(|v| (v * scale).round_ties_even() as i8));
                    scales.push(scale);
                }
                edit(&name, &mut scales);
                out.push((format!("{name}_scale"), Value::F32(vec![shape[0]], scales)));
                out.push((name, Value::I8(shape, q)));
            }
            other => out.push((name, other)),
        }
    }
    write_model_bin(&mut out, &aliases)
}

type Aliases = Vec<(&'static str, &'static str)>;

fn tiny_model_vars(seed: u64, vocab: usize) -> (Vec<(String, Value)>, Aliases) {
    tiny_model_vars_of_widths(seed, vocab, [8, 8])
}

/// The variables of [`tiny_model_bin`] with the encoder and the decoder `widths` wide (the
/// encoder then has embeddings of its own where they differ).
pub fn tiny_model_vars_of_widths(seed: u64, vocab: usize, widths: [usize; 2]) -> (Vec<(String, Value)>, Aliases) {
    let mut rng = Rng::new(seed);
    let ffn = 16;
    let mut vars: Vec<(String, Value)> = Vec::new();
    let mat = |rng: &mut Rng, name: String, shape: Vec<usize>, scale: f32| {
        let n = shape.iter().product();
        (name, Value::F32(shape, (0..n).map(|_| rng.uniform() * scale).collect()))
    };
    let add_linear = |rng: &mut Rng, vars: &mut Vec<(String, Value)>, scope: &str, out: usize, inp: usize| {
        vars.push(mat(rng, format!("{scope}/weight"), vec![out, inp], 0.5));
        vars.push(mat(rng, format!("{scope}/bias"), vec![out], 0.1));
    };
    let norm = |vars: &mut Vec<(String, Value)>, scope: &str, d: usize| {
        vars.push((format!("{scope}/gamma"), Value::F32(vec![d], vec![1.0; d])));
        vars.push((format!("{scope}/beta"), Value::F32(vec![d], vec![0.0; d])));
    };
    for ((stack, cross), d) in [("encoder", false), ("decoder", true)].into_iter().zip(widths) {
        let l = format!("{stack}/layer_0");
        add_linear(&mut rng, &mut vars, &format!("{l}/self_attention/linear_0"), 3 * d, d);
        add_linear(&mut rng, &mut vars, &format!("{l}/self_attention/linear_1"), d, d);
        norm(&mut vars, &format!("{l}/self_attention/layer_norm"), d);
        if cross {
            add_linear(&mut rng, &mut vars, &format!("{l}/attention/linear_0"), d, d);
            add_linear(&mut rng, &mut vars, &format!("{l}/attention/linear_1"), 2 * d, d);
            add_linear(&mut rng, &mut vars, &format!("{l}/attention/linear_2"), d, d);
            norm(&mut vars, &format!("{l}/attention/layer_norm"), d);
        }
        add_linear(&mut rng, &mut vars, &format!("{l}/ffn/linear_0"), ffn, d);
        add_linear(&mut rng, &mut vars, &format!("{l}/ffn/linear_1"), d, ffn);
        norm(&mut vars, &format!("{l}/ffn/layer_norm"), d);
        vars.push((format!("{stack}/num_heads"), Value::I16(vec![], vec![2])));
        vars.push((format!("{stack}/pre_norm"), Value::I8(vec![], vec![0])));
        vars.push((format!("{stack}/activation"), Value::I8(vec![], vec![0])));
        vars.push((format!("{stack}/scale_embeddings"), Value::I8(vec![], vec![1])));
    }
    let [encoder_d, decoder_d] = widths;
    vars.push(mat(&mut rng, "decoder/embeddings/weight".into(), vec![vocab, decoder_d], 1.0));
    vars.push(mat(&mut rng, "decoder/projection/bias".into(), vec![vocab], 0.1));
    let mut aliases = vec![("decoder/projection/weight", "decoder/embeddings/weight")];
    if encoder_d == decoder_d {
        aliases.push(("encoder/embeddings_0/weight", "decoder/embeddings/weight"));
    } else {
        vars.push(mat(&mut rng, "encoder/embeddings_0/weight".into(), vec![vocab, encoder_d], 1.0));
    }
    (vars, aliases)
}

pub fn tiny_vocabulary(vocab: usize) -> Vec<String> {
    let mut tokens: Vec<String> = ["<unk>", "<s>", "</s>"].iter().map(|s| s.to_string()).collect();
    tokens.extend((tokens.len()..vocab).map(|i| format!("w{i}")));
    tokens
}

/// Writes a complete model directory and returns its path.
pub fn write_model_dir(dir: &Path, model_bin: &[u8], vocab: &[String]) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("model.bin"), model_bin).unwrap();
    std::fs::write(
        dir.join("config.json"),
        r#"{"add_source_bos": false, "add_source_eos": true, "bos_token": "<s>", "eos_token": "</s>",
            "unk_token": "<unk>", "decoder_start_token": "<s>", "layer_norm_epsilon": null}"#,
    )
    .unwrap();
    let json: Vec<String> = vocab.iter().map(|t| format!("\"{t}\"")).collect();
    std::fs::write(dir.join("shared_vocabulary.json"), format!("[{}]", json.join(","))).unwrap();
    dir.to_path_buf()
}

pub fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tolk-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Copies the files of directory `from` into `to` (created, or refreshed), writable: the
/// shared models are read-only, and so would be their copies.
pub fn copy_files_writable(from: &Path, to: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let copy = to.join(path.file_name().unwrap());
        let _ = std::fs::remove_file(&copy);
        std::fs::copy(&path, &copy).unwrap();
        std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
}

/// Rewrites the file `path` in place as `cp other path` does: truncated, then other bytes
/// (a third of its length).
pub fn rewrite_in_place(path: &Path) {
    use std::io::Write;
    let length = std::fs::metadata(path).unwrap().len();
    let mut file = std::fs::OpenOptions::new().write(true).truncate(true).open(path).unwrap();
    file.write_all(&vec![0x5a; (length / 3) as usize]).unwrap();
}

/// The first of `$var`, `default` and `../shared/default` that holds `file`: that file.
pub fn find(var: &str, default: &str, file: &str) -> Option<PathBuf> {
    let dirs = [std::env::var(var).ok().map(PathBuf::from), Some(PathBuf::from(default)), Some(PathBuf::from("../shared").join(default))];
    dirs.into_iter().flatten().map(|d| d.join(file)).find(|p| p.exists())
}

/// The zh-en model directory and its first `n` verses as SentencePiece pieces.
pub fn zh_en_pieces(n: usize) -> Option<(PathBuf, Vec<Vec<String>>)> {
    let (Some(model), Some(data)) = (find("TOLK_MODELS", "models", "zh-en-ct2/model.bin"), find("TOLK_DATA", "data", "dev-matthew.zh")) else {
        eprintln!("zh-en model or dev verses not found: skipped");
        return None;
    };
    let dir = model.parent()?.to_path_buf();
    let m = tolk::Model::load(&dir).unwrap();
    let tokenizer = m.tokenizer().expect("zh-en has a SentencePiece model");
    let text = std::fs::read_to_string(data).ok()?;
    let pieces = text.lines().take(n).map(|l| tokenizer.encode(l).into_iter().map(|p| p.piece).collect()).collect();
    Some((dir, pieces))
}
