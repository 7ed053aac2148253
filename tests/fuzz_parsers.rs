//! The fuzz targets' bodies (fuzz/src/lib.rs, included here as a module) run in
//! `cargo test` over seed inputs and thousands of deterministic mutations of them (bit
//! flips, byte sets, truncations, insertions, deletions, duplicated chunks, splices,
//! overwritten length fields; a xorshift generator with fixed seeds). Every input must
//! give a value or a clean error: a panic fails the test with the input in hex.
//!
//! Each target runs for a time budget (TOLK_FUZZ_SECONDS, default 15 s over all targets,
//! shared by weight) or an iteration cap, whichever comes first; the inputs are the same
//! sequence on every run, only how far it goes depends on the machine. Inputs that once
//! crashed a target (found by libFuzzer) are replayed first as regressions.
//!
//! `write_seed_corpus` (ignored) writes the seeds as libFuzzer corpora into
//! TOLK_FUZZ_CORPUS (e.g. `fuzz/corpus`), one folder per target: see fuzz/README.md.
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[path = "../fuzz/src/lib.rs"]
mod bodies;
mod common;

/// xorshift64: deterministic and dependency-free.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const INTERESTING_U8: [u8; 8] = [0, 1, 0x7f, 0x80, 0xff, b' ', b'\n', 0x20];
const INTERESTING_U32: [u32; 9] = [
    0,
    1,
    2,
    0x7f,
    0xff,
    0xffff,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
];

/// One to four random edits of `input`; `seeds` provide material for splices.
fn mutate(rng: &mut Rng, input: &[u8], seeds: &[Vec<u8>]) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        let n = out.len();
        match rng.below(10) {
            0 if n > 0 => {
                let at = rng.below(n);
                out[at] ^= 1 << rng.below(8);
            }
            1 if n > 0 => {
                let at = rng.below(n);
                out[at] = rng.next() as u8;
            }
            2 if n > 0 => {
                let at = rng.below(n);
                out[at] = INTERESTING_U8[rng.below(INTERESTING_U8.len())];
            }
            3 if n > 0 => out.truncate(rng.below(n)),
            4 => {
                let at = rng.below(n + 1);
                let len = 1 + rng.below(8);
                let bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
                out.splice(at..at, bytes);
            }
            5 if n > 0 => {
                let at = rng.below(n);
                let len = 1 + rng.below((n - at).min(64));
                out.drain(at..at + len);
            }
            6 if n > 0 => {
                let from = rng.below(n);
                let len = 1 + rng.below((n - from).min(64));
                let chunk = out[from..from + len].to_vec();
                let at = rng.below(n + 1);
                out.splice(at..at, chunk);
            }
            7 => {
                let other = &seeds[rng.below(seeds.len())];
                let cut = rng.below(n + 1);
                let from = rng.below(other.len() + 1);
                out.truncate(cut);
                out.extend_from_slice(&other[from..]);
            }
            8 if n >= 4 => {
                let at = rng.below(n - 3);
                let v = match rng.below(3) {
                    0 => INTERESTING_U32[rng.below(INTERESTING_U32.len())],
                    1 => n as u32 + rng.below(3) as u32,
                    _ => u32::from_le_bytes(out[at..at + 4].try_into().unwrap())
                        .wrapping_add(rng.below(5) as u32)
                        .wrapping_sub(2),
                };
                out[at..at + 4].copy_from_slice(&v.to_le_bytes());
            }
            9 if n >= 2 => {
                // A varint or u16 length nudged.
                let at = rng.below(n - 1);
                let v = u16::from_le_bytes([out[at], out[at + 1]])
                    .wrapping_add(rng.below(5) as u16)
                    .wrapping_sub(2);
                out[at..at + 2].copy_from_slice(&v.to_le_bytes());
            }
            _ => {}
        }
    }
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

fn panic_message(e: &(dyn std::any::Any + Send)) -> String {
    e.downcast_ref::<String>()
        .cloned()
        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "(non-string panic)".into())
}

fn run_one(name: &str, body: fn(&[u8]), input: &[u8], what: &str) {
    if let Err(e) = catch_unwind(AssertUnwindSafe(|| body(input))) {
        let shown = if input.len() > 4096 {
            &input[..4096]
        } else {
            input
        };
        panic!(
            "fuzz target {name} panicked on {what} ({} bytes): {}\ninput (hex{}): {}",
            input.len(),
            panic_message(&*e),
            if shown.len() < input.len() {
                ", first 4096 bytes"
            } else {
                ""
            },
            hex(shown)
        );
    }
}

/// The sum of the targets' shares of the time budget.
const ALL_SHARES: f64 = 15.75;

/// The share of the time budget for a target (out of [`ALL_SHARES`]).
fn budget(share: f64) -> Duration {
    let total: f64 = std::env::var("TOLK_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(15.0);
    Duration::from_secs_f64(total * share / ALL_SHARES)
}

/// Runs `body` on the regressions, the seeds, then mutations of the seeds (big seeds are
/// picked rarely) until the budget or `max_iters` is spent; prints what it did.
fn fuzz(
    name: &str,
    body: fn(&[u8]),
    regressions: &[&str],
    seeds: Vec<Vec<u8>>,
    share: f64,
    max_iters: usize,
) {
    assert!(!seeds.is_empty());
    for (i, r) in regressions.iter().enumerate() {
        run_one(name, body, &unhex(r), &format!("regression #{i}"));
    }
    for (i, s) in seeds.iter().enumerate() {
        run_one(name, body, s, &format!("seed #{i}"));
    }
    let small: Vec<usize> = (0..seeds.len())
        .filter(|&i| seeds[i].len() <= 64 * 1024)
        .collect();
    let mut rng = Rng::new(
        name.bytes()
            .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64)),
    );
    let deadline = Instant::now() + budget(share);
    let mut iters = 0usize;
    let mut pool: Vec<Vec<u8>> = Vec::new();
    while iters < max_iters && Instant::now() < deadline {
        let base: &[u8] = if !pool.is_empty() && rng.below(3) == 0 {
            // Mutations of mutations reach further from the seeds.
            &pool[rng.below(pool.len())]
        } else if small.is_empty() || rng.below(50) == 0 {
            &seeds[rng.below(seeds.len())]
        } else {
            &seeds[small[rng.below(small.len())]]
        };
        let input = mutate(&mut rng, base, &seeds);
        run_one(name, body, &input, &format!("mutation #{iters}"));
        if input.len() <= 64 * 1024 && rng.below(8) == 0 {
            if pool.len() < 256 {
                pool.push(input);
            } else {
                let at = rng.below(pool.len());
                pool[at] = input;
            }
        }
        iters += 1;
    }
    println!("fuzz {name}: {} seeds, {iters} mutations", seeds.len());
}

// ------------------------------------------------------------------ seeds

fn models_root() -> Option<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let candidates = [
        std::env::var("TOLK_MODELS").ok().map(PathBuf::from),
        Some(root.join("models")),
        Some(root.join("../shared/models")),
    ];
    candidates.into_iter().flatten().find(|p| p.is_dir())
}

fn spm_model_seeds() -> Vec<Vec<u8>> {
    use bodies::{generated_model, ModelOptions};
    // Unigram and BPE, with and without byte fallback and charsmap, odd whitespace flags.
    let mut seeds: Vec<Vec<u8>> = [0usize, 1, 2, 3, 0b0100100, 0b0011101, 0b1000000, 0b1111111]
        .iter()
        .map(|&i| generated_model(ModelOptions::from_index(i)))
        .collect();
    if let Some(root) = models_root() {
        for rel in [
            "zh-en-ct2/sentencepiece.model",
            "en-pt-bergamot/vocab.enpt.spm",
        ] {
            if let Ok(b) = std::fs::read(root.join(rel)) {
                seeds.push(b);
            }
        }
    }
    seeds
}

const TEXTS: &[&str] = &[
    "Hello world!",
    "  ＡＢＣ  ｅ\u{301} ﬁ ① Ⅻ ㍻ ß  ",
    "a\u{3000}b\u{200b}c¦d\te\nf\u{a0} ¦ ",
    "我爱你 😀 e\u{301} the abb <sep>",
    "xyz<unk>▁▁ a ▁",
    "\u{0}\u{1}\u{7f}\u{80}\u{ffff}\u{10ffff}",
    "Olá, coração! Ação, pão, avó.",
];

fn spm_encode_seeds() -> Vec<Vec<u8>> {
    let models = bodies::MODEL_VARIANTS + bodies::real_models().len();
    let mut seeds = Vec::new();
    for (i, t) in TEXTS.iter().enumerate() {
        for pick in [
            i * 37 % models,
            (i * 37 + 11) % models,
            bodies::MODEL_VARIANTS + i % 2,
        ] {
            let mut s = vec![pick as u8];
            s.extend_from_slice(t.as_bytes());
            seeds.push(s);
        }
    }
    seeds
}

fn model_bin_seeds() -> Vec<Vec<u8>> {
    vec![
        bodies::small_model_bin(),
        common::tiny_model_bin(7, 12),
        common::tiny_int8_model_bin(3, 10),
    ]
}

fn config_seeds() -> Vec<Vec<u8>> {
    let mut seeds: Vec<Vec<u8>> = [
        r#"{"add_source_bos": false, "add_source_eos": true, "bos_token": "<s>", "decoder_start_token": "<s>", "eos_token": "</s>", "layer_norm_epsilon": null, "unk_token": "<unk>"}"#,
        r#"{"decoder_start_token": null, "layer_norm_epsilon": 1e-6, "x": [1, 2.5e3, -0, "\u00e9\ud83d\ude00\n", {"a": [[], {}]}], "y": true}"#,
        "[1, [2, [3, [4]]], \"a\\\"b\"]",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    if let Some(root) = models_root() {
        if let Ok(b) = std::fs::read(root.join("zh-en-ct2/config.json")) {
            seeds.push(b);
        }
    }
    seeds
}

fn vocabulary_seeds() -> Vec<Vec<u8>> {
    let with_kind = |kind: u8, text: &str| {
        let mut v = vec![kind];
        v.extend_from_slice(text.as_bytes());
        v
    };
    let tokens = common::tiny_vocabulary(20);
    let json = format!(
        "[{}]",
        tokens
            .iter()
            .map(|t| format!("{t:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    vec![
        with_kind(0, &json),
        with_kind(
            0,
            r#"["<unk>", "<s>", "</s>", "\u2581a", "a", "a", "\ud83d\ude00"]"#,
        ),
        with_kind(1, &tokens.join("\n")),
        with_kind(1, "<unk>\r\n<s>\r\n</s>\r\n▁hello\r\n\r\nhello\n"),
    ]
}

fn vmap_seeds() -> Vec<Vec<u8>> {
    [
        &b"\ta b </s>\na\t\xe2\x96\x81c\na b\td e\na b <s>\ta\n"[..],
        b"\ta\r\nb\tb\r\n\r\nno tab here\nk\ta b\tw c\t\n\xff\xfe\ta\n  \t  \nb\ta  b \xc3\xa9\n",
        b"a\tunknown a\na\tb\n\t\n\t\t\t",
    ]
    .iter()
    .map(|s| s.to_vec())
    .collect()
}

fn marian_model_seeds() -> Vec<Vec<u8>> {
    let arrays = bodies::small_marian_arrays();
    let mut seeds = vec![
        bodies::small_marian_bin(),
        bodies::npz(&arrays, false),
        bodies::npz(&arrays, true),
        b"relative-paths: true\nmodels:\n  - model.bin\nvocabs:\n- a.spm\n- 'b.spm'\nshortlist:\n    - lex.bin\n    - false\nbeam-size: 1 # c\ninput-types: []\ntop: \"\"\nnested:\n  a: {x: 1, y: [2, \"3\"]}\n  b:\n    - k: v\n      k2: v2\n    - - deep\n".to_vec(),
        "\"</s>\": 0\n\"<unk>\": 1\n▁the: 2\n\"\\u00e9\\ud83d\\ude00\": 3\n'it''s': 4\n".as_bytes().to_vec(),
    ];
    if let Some(root) = models_root() {
        let dir = root.join("en-pt-bergamot");
        if let Ok(b) = std::fs::read(dir.join("config.intgemm8bitalpha.yml")) {
            seeds.push(b);
        }
        // The real header (195 names and shapes); the data is cut off.
        if let Ok(b) = std::fs::read(dir.join("model.enpt.intgemm.alphas.bin")) {
            seeds.push(b[..b.len().min(16 * 1024)].to_vec());
        }
    }
    seeds
}

fn shortlist_seeds() -> Vec<Vec<u8>> {
    vec![
        bodies::binary_shortlist(3, 2, &[&[0, 5], &[], &[7, 9], &[2]]),
        bodies::binary_shortlist(0, 4, &[&[1, 2, 3, 4], &[60, 70]]),
        bodies::binary_shortlist(50, 50, &[]),
        b"w5 w1 0.5\nw9 w1 0.1\nw9 w1 0.7\nNULL w1 0.9\nw3 w2 -1\nxa w0 0.2\nw4 w6 nan\n".to_vec(),
    ]
}

/// Packages as named files ([`bodies::pack`]): the tiny CTranslate2 models (float32 and
/// int8) and the C tests' fixture with its SentencePiece model; Marian packages (a YAML
/// naming an `.npz`, a YAML vocabulary; a model file beside a SentencePiece vocabulary).
fn package_seeds() -> Vec<Vec<u8>> {
    let config = br#"{"add_source_bos": false, "add_source_eos": true, "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "decoder_start_token": "<s>", "layer_norm_epsilon": null}"#;
    let vocabulary = |n: usize| {
        let tokens: Vec<String> = common::tiny_vocabulary(n).iter().map(|t| format!("{t:?}")).collect();
        format!("[{}]", tokens.join(", ")).into_bytes()
    };
    let (float, int8, vocab) = (common::tiny_model_bin(7, 12), common::tiny_int8_model_bin(3, 10), vocabulary(12));
    let mut seeds = vec![
        bodies::pack(&[("model.bin", &float), ("config.json", config), ("shared_vocabulary.json", &vocab)]),
        bodies::pack(&[("config.json", config), ("model.bin", &int8), ("shared_vocabulary.json", &vocabulary(10))]),
    ];
    let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("ffi-tests/fixtures/tiny");
    let names = ["model.bin", "config.json", "shared_vocabulary.json", "sentencepiece.model"];
    if let Ok(files) = names.iter().map(|n| std::fs::read(fixture.join(n))).collect::<Result<Vec<_>, _>>() {
        let named: Vec<(&str, &[u8])> = names.iter().copied().zip(files.iter().map(Vec::as_slice)).collect();
        seeds.push(bodies::pack(&named));
    }
    let npz = bodies::npz(&bodies::small_marian_arrays(), false);
    let yaml = b"models:\n  - model.npz\nvocabs:\n  - vocab.yml\n  - vocab.yml\nbeam-size: 2\n";
    let yaml_vocabulary = "\"</s>\": 0\n\"<unk>\": 1\n\u{2581}the: 2\n".as_bytes();
    seeds.push(bodies::pack(&[("config.yml", yaml), ("model.npz", &npz), ("vocab.yml", yaml_vocabulary)]));
    let spm = bodies::generated_model(bodies::ModelOptions::from_index(0));
    seeds.push(bodies::pack(&[("model.enxx.bin", &bodies::small_marian_bin()), ("vocab.enxx.spm", &spm)]));
    seeds
}

// ------------------------------------------------------------------ tests

/// Inputs that crashed a target once (hex), replayed before the mutations.
const SPM_MODEL_REGRESSIONS: &[&str] = &[];
const SPM_ENCODE_REGRESSIONS: &[&str] = &[];
const MODEL_BIN_REGRESSIONS: &[&str] = &[];
const CONFIG_REGRESSIONS: &[&str] = &[];
const VOCABULARY_REGRESSIONS: &[&str] = &[];
const VMAP_REGRESSIONS: &[&str] = &[];
const MARIAN_MODEL_REGRESSIONS: &[&str] = &[];
const SHORTLIST_REGRESSIONS: &[&str] = &[];
const PACKAGE_REGRESSIONS: &[&str] = &[];

#[test]
fn fuzz_sentencepiece_model() {
    fuzz(
        "sentencepiece_model",
        bodies::sentencepiece_model,
        SPM_MODEL_REGRESSIONS,
        spm_model_seeds(),
        3.5,
        200_000,
    );
}

#[test]
fn fuzz_sentencepiece_encode() {
    fuzz(
        "sentencepiece_encode",
        bodies::sentencepiece_encode,
        SPM_ENCODE_REGRESSIONS,
        spm_encode_seeds(),
        2.5,
        500_000,
    );
}

#[test]
fn fuzz_ct2_model_bin() {
    fuzz(
        "ct2_model_bin",
        bodies::ct2_model_bin,
        MODEL_BIN_REGRESSIONS,
        model_bin_seeds(),
        2.5,
        500_000,
    );
}

#[test]
fn fuzz_ct2_config() {
    fuzz(
        "ct2_config",
        bodies::ct2_config,
        CONFIG_REGRESSIONS,
        config_seeds(),
        1.25,
        500_000,
    );
}

#[test]
fn fuzz_ct2_vocabulary() {
    fuzz(
        "ct2_vocabulary",
        bodies::ct2_vocabulary,
        VOCABULARY_REGRESSIONS,
        vocabulary_seeds(),
        1.25,
        500_000,
    );
}

#[test]
fn fuzz_ct2_vmap() {
    fuzz("ct2_vmap", bodies::ct2_vmap, VMAP_REGRESSIONS, vmap_seeds(), 0.75, 500_000);
}

#[test]
fn fuzz_marian_model() {
    fuzz(
        "marian_model",
        bodies::marian_model,
        MARIAN_MODEL_REGRESSIONS,
        marian_model_seeds(),
        2.0,
        500_000,
    );
}

#[test]
fn fuzz_shortlist() {
    fuzz(
        "shortlist",
        bodies::shortlist,
        SHORTLIST_REGRESSIONS,
        shortlist_seeds(),
        1.0,
        500_000,
    );
}

#[test]
fn fuzz_package_from_memory() {
    let seeds = package_seeds();
    // The CTranslate2 seeds are whole packages: the mutations start from models that load.
    let cpu = tolk::LoadOptions { device: tolk::DeviceRequest::Cpu, ..Default::default() };
    for seed in &seeds[..3] {
        let model = tolk::Model::load_from_memory(&bodies::unpack(seed), &cpu);
        assert!(model.is_ok(), "{:?}", model.err());
    }
    fuzz(
        "package_from_memory",
        bodies::package_from_memory,
        PACKAGE_REGRESSIONS,
        seeds,
        1.0,
        100_000,
    );
}

/// Every generated model checks out on every text of the table (a quick, exact check of
/// the invariants before the mutations).
#[test]
fn generated_models_keep_the_invariants() {
    for (o, sp) in bodies::generated_models() {
        let strips = o.escape_whitespaces && (o.add_dummy_prefix || o.remove_extra_whitespaces);
        for t in TEXTS.iter().chain(bodies::PROBES) {
            let r = catch_unwind(AssertUnwindSafe(|| {
                bodies::check_encoding(sp, t, Some(strips))
            }));
            assert!(r.is_ok(), "model {} on {t:?}", o.name());
        }
    }
}

/// Writes the seeds as libFuzzer corpora: TOLK_FUZZ_CORPUS/<target>/seed-<n>.
#[test]
#[ignore]
fn write_seed_corpus() {
    let root = PathBuf::from(std::env::var("TOLK_FUZZ_CORPUS").expect("TOLK_FUZZ_CORPUS not set"));
    let sets: [(&str, Vec<Vec<u8>>); 9] = [
        ("sentencepiece_model", spm_model_seeds()),
        ("sentencepiece_encode", spm_encode_seeds()),
        ("ct2_model_bin", model_bin_seeds()),
        ("ct2_config", config_seeds()),
        ("ct2_vocabulary", vocabulary_seeds()),
        ("ct2_vmap", vmap_seeds()),
        ("marian_model", marian_model_seeds()),
        ("shortlist", shortlist_seeds()),
        ("package_from_memory", package_seeds()),
    ];
    for (name, seeds) in sets {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        for (i, s) in seeds.iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{i}")), s).unwrap();
        }
        println!("{name}: {} seeds in {}", seeds.len(), dir.display());
    }
}
