//! Loader tests on models written from Rust: a valid model translates; truncated,
//! bit-flipped and absurd files give clear errors and never panic or allocate wildly.
mod common;

use common::*;
use std::panic::{catch_unwind, AssertUnwindSafe};
use tolk::{ErrorKind, Model, TranslateOptions, Translator, TranslatorConfig};

const VOCAB: usize = 12;

fn load(dir: &std::path::Path) -> tolk::Result<Model> {
    Model::load(dir)
}

#[test]
fn a_valid_tiny_model_translates_with_greedy_and_beam() {
    let dir = write_model_dir(&temp_dir("valid"), &tiny_model_bin(1, VOCAB), &tiny_vocabulary(VOCAB));
    let model = load(&dir).expect("tiny model loads");
    let translator = Translator::with_config(&model, &TranslatorConfig::default()).unwrap();
    let source = vec![vec!["w3".to_string(), "w4".into(), "unknown-token".into()], vec![], vec!["w5".into()]];
    for beam in [1, 3] {
        let opts = TranslateOptions { beam_size: beam, num_hypotheses: beam.min(2), return_scores: true, max_decoding_length: 10, ..Default::default() };
        let results = translator.translate_batch(&source, None, &opts).unwrap();
        assert_eq!(results.len(), 3);
        // An empty source translates to an empty hypothesis with score 0, as in CTranslate2.
        assert_eq!(results[1].hypotheses, vec![Vec::<String>::new(); beam.min(2)]);
        assert_eq!(results[1].scores, vec![0.0; beam.min(2)]);
        for r in [&results[0], &results[2]] {
            assert_eq!(r.hypotheses.len(), beam.min(2));
            assert!(r.scores.iter().all(|s| s.is_finite() && *s <= 0.0));
            assert!(r.hypotheses[0].len() <= 10);
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn int8_saved_weights_are_used_as_saved() {
    use tolk::ComputeType;
    let dir = write_model_dir(&temp_dir("int8"), &tiny_int8_model_bin(1, VOCAB), &tiny_vocabulary(VOCAB));
    let int8 = load(&dir).unwrap();
    assert_eq!(int8.compute_type(), ComputeType::Int8, "\"default\" keeps int8");
    // Quantizing the float model at load gives the same int8 values and scales as saving
    // them quantized, hence the same translations.
    let float_dir = write_model_dir(&temp_dir("int8f"), &tiny_model_bin(1, VOCAB), &tiny_vocabulary(VOCAB));
    let quantized_at_load = Model::load_with(&float_dir, ComputeType::Int8).unwrap();
    let src: Vec<Vec<String>> = (0..4).map(|i| (0..2 + i).map(|j| format!("w{}", 3 + (i + j * 5) % 9)).collect()).collect();
    let opts = TranslateOptions { beam_size: 2, return_scores: true, max_decoding_length: 10, ..Default::default() };
    let a = Translator::with_config(&int8, &TranslatorConfig::default()).unwrap().translate_batch(&src, None, &opts).unwrap();
    let b = Translator::with_config(&quantized_at_load, &TranslatorConfig::default()).unwrap().translate_batch(&src, None, &opts).unwrap();
    assert_eq!(a, b);
    // And dequantized for float32.
    assert_eq!(Model::load_with(&dir, ComputeType::Float32).unwrap().compute_type(), ComputeType::Float32);
}

/// Translates `source` with the model in `dir`, then rewrites its model.bin in place (as
/// `cp other model.bin` does: truncated, then other bytes) and translates again: a loaded
/// model reads nothing of its files, so the result is the same, where a model that went on
/// reading its mapping would fault (SIGBUS) or read the new bytes.
fn survives_its_file_rewritten_in_place(dir: &std::path::Path, compute_type: tolk::ComputeType, source: &[Vec<String>]) {
    let model = Model::load_with(dir, compute_type).unwrap();
    let translator = Translator::with_config(&model, &TranslatorConfig::default()).unwrap();
    let opts = TranslateOptions { beam_size: 2, return_scores: true, max_decoding_length: 24, ..Default::default() };
    let before = translator.translate_batch(source, None, &opts).unwrap();
    rewrite_in_place(&dir.join("model.bin"));
    assert_eq!(translator.translate_batch(source, None, &opts).unwrap(), before, "{compute_type:?} after the rewrite");
    drop((translator, model));
    assert!(Model::load(dir).is_err(), "the rewritten file no longer loads");
}

#[test]
fn a_model_file_rewritten_in_place_under_a_loaded_model_is_not_read() {
    let source: Vec<Vec<String>> = (0..3).map(|i| (0..3 + i).map(|j| format!("w{}", 3 + (i + j * 5) % 9)).collect()).collect();
    for (name, bytes, compute_type) in [
        ("rewrite-f32", tiny_model_bin(4, VOCAB), tolk::ComputeType::Float32),
        ("rewrite-i8", tiny_int8_model_bin(4, VOCAB), tolk::ComputeType::Int8),
    ] {
        let dir = write_model_dir(&temp_dir(name), &bytes, &tiny_vocabulary(VOCAB));
        survives_its_file_rewritten_in_place(&dir, compute_type, &source);
        let _ = std::fs::remove_dir_all(dir);
    }
    // zh-en: float32 biases and norms 4-byte aligned in the file, and a 4 MB sinusoid table.
    let Some((zh_en, pieces)) = zh_en_pieces(4) else { return };
    let dir = temp_dir("rewrite-zh-en");
    for compute_type in [tolk::ComputeType::Int8, tolk::ComputeType::Float32] {
        copy_files_writable(&zh_en, &dir);
        survives_its_file_rewritten_in_place(&dir, compute_type, &pieces);
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn missing_files_and_directories_are_io_errors() {
    let err = load(std::path::Path::new("/nonexistent/tolk-model")).err().unwrap();
    assert_eq!(err.kind, ErrorKind::Io);
    let dir = temp_dir("missing-bin");
    let err = load(&dir).err().unwrap();
    assert_eq!(err.kind, ErrorKind::Io);
    assert!(err.message.contains("model.bin"), "{}", err.message);
    let dir = write_model_dir(&temp_dir("missing-vocab"), &tiny_model_bin(2, VOCAB), &tiny_vocabulary(VOCAB));
    std::fs::remove_file(dir.join("shared_vocabulary.json")).unwrap();
    assert_eq!(load(&dir).err().unwrap().kind, ErrorKind::Io);
}

#[test]
fn config_json_is_required_beside_a_version_6_model_bin() {
    let dir = write_model_dir(&temp_dir("no-config"), &tiny_model_bin(2, VOCAB), &tiny_vocabulary(VOCAB));
    std::fs::remove_file(dir.join("config.json")).unwrap();
    let err = load(&dir).err().unwrap();
    assert_eq!(err.kind, ErrorKind::Io);
    assert!(err.message.contains("no config.json") && err.message.contains("version 6"), "{}", err.message);
    // Version 5 models were written before config.json existed: CTranslate2's defaults.
    let mut bytes = tiny_model_bin(2, VOCAB);
    bytes[..4].copy_from_slice(&5u32.to_le_bytes());
    std::fs::write(dir.join("model.bin"), &bytes).unwrap();
    load(&dir).expect("a version 5 model.bin loads without config.json");
    let _ = std::fs::remove_dir_all(dir);
}

/// A stored int8 scale that is not a positive finite number (a corrupt file) is an error
/// naming the variable, for every compute type (float32 dequantizes with it).
#[test]
fn corrupt_int8_scales_are_errors() {
    use tolk::ComputeType;
    for bad in [f32::NAN, 0.0, f32::INFINITY, -1.0] {
        let edit = |name: &str, scales: &mut Vec<f32>| {
            if name == "decoder/layer_0/ffn/linear_0/weight" {
                scales[3] = bad;
            }
        };
        let dir = write_model_dir(&temp_dir("bad-scale"), &tiny_int8_model_bin_edited(5, VOCAB, &edit), &tiny_vocabulary(VOCAB));
        for compute_type in [ComputeType::Int8, ComputeType::Float32] {
            let e = Model::load_with(&dir, compute_type).err().unwrap();
            assert_eq!(e.kind, ErrorKind::InvalidModel, "{bad} {compute_type:?}: {e}");
            assert!(e.message.contains("decoder/layer_0/ffn/linear_0/weight_scale"), "{e}");
        }
    }
}

#[test]
fn old_binary_versions_are_refused_by_name() {
    let mut bytes = tiny_model_bin(3, VOCAB);
    bytes[..4].copy_from_slice(&4u32.to_le_bytes());
    let dir = write_model_dir(&temp_dir("old"), &bytes, &tiny_vocabulary(VOCAB));
    let err = load(&dir).err().unwrap();
    assert_eq!(err.kind, ErrorKind::Unsupported);
    assert!(err.message.contains("version 4"), "{}", err.message);
}

#[test]
fn vocabulary_size_mismatch_is_reported() {
    let dir = write_model_dir(&temp_dir("vocab-mismatch"), &tiny_model_bin(4, VOCAB), &tiny_vocabulary(VOCAB - 2));
    let err = load(&dir).err().unwrap();
    assert_eq!(err.kind, ErrorKind::InvalidModel);
    assert!(err.message.contains("vocabulary"), "{}", err.message);
}

/// Writes the tiny model of `widths` after `edit(vars)` and loads it at float32 and int8.
fn load_edited(name: &str, widths: [usize; 2], edit: impl Fn(&mut Vec<(String, Value)>)) -> Vec<tolk::Result<Model>> {
    let (mut vars, aliases) = tiny_model_vars_of_widths(6, VOCAB, widths);
    edit(&mut vars);
    let dir = write_model_dir(&temp_dir(name), &write_model_bin(&mut vars, &aliases), &tiny_vocabulary(VOCAB));
    [tolk::ComputeType::Float32, tolk::ComputeType::Int8].into_iter().map(|c| Model::load_with(&dir, c)).collect()
}

fn expect_invalid(results: Vec<tolk::Result<Model>>, kind: ErrorKind, needle: &str) {
    for result in results {
        let e = result.err().expect("the model loads");
        assert_eq!(e.kind, kind, "{e}");
        assert!(e.message.contains(needle), "{e}");
    }
}

fn replace(vars: &mut Vec<(String, Value)>, name: &str, value: Value) {
    vars.retain(|(n, _)| n != name);
    vars.push((name.to_string(), value));
}

/// Files whose every tensor is well formed but which disagree with each other (what byte
/// mutations rarely reach) are refused at load; each had loaded and then panicked or
/// translated garbage.
#[test]
fn inconsistent_shapes_are_refused_at_load() {
    // The sizes themselves load and translate.
    for result in load_edited("widths-ok", [8, 8], |_| {}) {
        let model = result.unwrap();
        let translator = Translator::with_config(&model, &TranslatorConfig::default()).unwrap();
        let opts = TranslateOptions { max_decoding_length: 5, ..Default::default() };
        assert_eq!(translator.translate_batch(&[vec!["w3".to_string()]], None, &opts).unwrap().len(), 1);
    }
    // An encoder narrower or wider than the decoder whose attention reads it.
    for widths in [[4, 8], [16, 8]] {
        expect_invalid(load_edited("widths", widths, |_| {}), ErrorKind::InvalidModel, "the encoder's width");
    }
    // A feed-forward block of width 0.
    expect_invalid(
        load_edited("ffn0", [8, 8], |vars| {
            replace(vars, "decoder/layer_0/ffn/linear_0/weight", Value::F32(vec![0, 8], vec![]));
            replace(vars, "decoder/layer_0/ffn/linear_0/bias", Value::F32(vec![0], vec![]));
            replace(vars, "decoder/layer_0/ffn/linear_1/weight", Value::F32(vec![8, 0], vec![]));
        }),
        ErrorKind::InvalidModel,
        "empty dimension",
    );
    // Average attention whose last layer is narrower than the model, with no projection.
    let average = |hidden: usize, activation: f32| {
        move |vars: &mut Vec<(String, Value)>| {
            vars.retain(|(n, _)| !n.starts_with("decoder/layer_0/self_attention/"));
            let s = "decoder/layer_0/average_attention";
            vars.push((format!("{s}/layer_norm/gamma"), Value::F32(vec![8], vec![1.0; 8])));
            vars.push((format!("{s}/layer_norm/beta"), Value::F32(vec![8], vec![0.0; 8])));
            vars.push((format!("{s}/linear_0/weight"), Value::F32(vec![hidden, 8], vec![0.1; hidden * 8])));
            vars.push((format!("{s}/activation"), Value::F32(vec![], vec![activation])));
        }
    };
    expect_invalid(load_edited("aan-width", [8, 8], average(4, 0.0)), ErrorKind::InvalidModel, "no projection maps it back");
    // ... and with a fractional activation id, which names none (1.5 had read as gelu).
    expect_invalid(load_edited("aan-activation", [8, 8], average(8, 1.5)), ErrorKind::Unsupported, "activation #1.5");
    // A fractional count of alignment heads.
    expect_invalid(
        load_edited("alignment-heads", [8, 8], |vars| vars.push(("decoder/alignment_heads".into(), Value::F32(vec![], vec![1.5])))),
        ErrorKind::InvalidModel,
        "alignment_heads",
    );
}

#[test]
fn truncation_at_every_offset_is_a_clean_error() {
    for bytes in [tiny_model_bin(5, VOCAB), tiny_int8_model_bin(5, VOCAB)] {
        truncations_fail_cleanly(&bytes);
    }
}

fn truncations_fail_cleanly(bytes: &[u8]) {
    let dir = write_model_dir(&temp_dir("truncate"), bytes, &tiny_vocabulary(VOCAB));
    let step = (bytes.len() / 600).max(1);
    for len in (0..bytes.len()).step_by(step) {
        std::fs::write(dir.join("model.bin"), &bytes[..len]).unwrap();
        let outcome = catch_unwind(AssertUnwindSafe(|| load(&dir)));
        match outcome {
            Ok(Err(e)) => assert!(matches!(e.kind, ErrorKind::InvalidModel | ErrorKind::Unsupported), "{len}: {e}"),
            Ok(Ok(_)) => panic!("a model truncated to {len} of {} bytes loaded", bytes.len()),
            Err(_) => panic!("loading a model truncated to {len} bytes panicked"),
        }
    }
}

#[test]
fn thousands_of_mutations_never_panic() {
    // Float and int8-saved models, loaded as float32, int8 and int16 in turn.
    let sources = [tiny_model_bin(6, VOCAB), tiny_int8_model_bin(6, VOCAB)];
    let compute_types = [tolk::ComputeType::Default, tolk::ComputeType::Int8, tolk::ComputeType::Int16];
    let vocab = tiny_vocabulary(VOCAB);
    let dir = write_model_dir(&temp_dir("mutate"), &sources[0], &vocab);
    let mut rng = Rng::new(42);
    let (mut loaded, mut refused) = (0, 0);
    for i in 0..3000 {
        let bytes = &sources[(i / 3) % 2];
        let compute_type = compute_types[(i / 6) % 3];
        let mut m = bytes.clone();
        match i % 3 {
            // Flip a few random bits.
            0 => {
                for _ in 0..1 + rng.below(4) {
                    let p = rng.below(m.len());
                    m[p] ^= 1 << rng.below(8);
                }
            }
            // Overwrite an aligned-or-not u32 with a huge or random value (dims, sizes, counts).
            1 => {
                let p = rng.below(m.len() - 4);
                let v: u32 = [u32::MAX, 0x7FFF_FFFF, 0x1000_0000, rng.next_u64() as u32][rng.below(4)];
                m[p..p + 4].copy_from_slice(&v.to_le_bytes());
            }
            // Insert or delete a byte.
            _ => {
                let p = rng.below(m.len());
                if rng.below(2) == 0 {
                    m.remove(p);
                } else {
                    m.insert(p, rng.next_u64() as u8);
                }
            }
        }
        std::fs::write(dir.join("model.bin"), &m).unwrap();
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            let model = Model::load_with(&dir, compute_type)?;
            // A model that still loads must also translate without crashing.
            let t = Translator::with_config(&model, &TranslatorConfig::default())?;
            let src = vec![vec!["w3".to_string(), "w7".into()]];
            t.translate_batch(&src, None, &TranslateOptions { max_decoding_length: 8, ..Default::default() })
        }));
        match outcome {
            Ok(Ok(_)) => loaded += 1,
            Ok(Err(_)) => refused += 1,
            Err(_) => panic!("mutation #{i} made the loader or translator panic"),
        }
    }
    assert!(refused > 1000, "most mutations should be refused ({refused} refused, {loaded} loaded)");
}

#[test]
fn garbage_config_and_vocabulary_are_invalid_model_errors() {
    let dir = write_model_dir(&temp_dir("garbage"), &tiny_model_bin(7, VOCAB), &tiny_vocabulary(VOCAB));
    std::fs::write(dir.join("config.json"), "{not json").unwrap();
    assert_eq!(load(&dir).err().unwrap().kind, ErrorKind::InvalidModel);
    write_model_dir(&dir, &tiny_model_bin(7, VOCAB), &tiny_vocabulary(VOCAB));
    std::fs::write(dir.join("shared_vocabulary.json"), "[1, 2, 3]").unwrap();
    assert_eq!(load(&dir).err().unwrap().kind, ErrorKind::InvalidModel);
    std::fs::write(dir.join("shared_vocabulary.json"), [0xff, 0xfe, 0x00]).unwrap();
    assert_eq!(load(&dir).err().unwrap().kind, ErrorKind::InvalidModel);
}

#[test]
fn very_long_inputs_are_truncated_and_unknown_tokens_map_to_unk() {
    let dir = write_model_dir(&temp_dir("long"), &tiny_model_bin(8, VOCAB), &tiny_vocabulary(VOCAB));
    let model = load(&dir).unwrap();
    let t = Translator::with_config(&model, &TranslatorConfig::default()).unwrap();
    let long: Vec<String> = (0..5000).map(|i| format!("w{}", 3 + i % 9)).collect();
    let opts = TranslateOptions { max_decoding_length: 5, beam_size: 1, ..Default::default() };
    let truncated = t.translate_batch(std::slice::from_ref(&long), None, &TranslateOptions { max_input_length: 100, ..opts.clone() }).unwrap();
    let same_prefix = t.translate_batch(&[long[..99].to_vec()], None, &opts).unwrap();
    assert_eq!(truncated, same_prefix, "truncation keeps the first tokens and the end token");
    let unk = t.translate_batch(&[vec!["never-seen".into()]], None, &opts).unwrap();
    let explicit = t.translate_batch(&[vec!["<unk>".into()]], None, &opts).unwrap();
    assert_eq!(unk, explicit);
}

#[test]
fn every_cpu_kernel_path_translates_the_same() {
    use tolk::backend::cpu::isa;
    use tolk::ComputeType;
    let dir = write_model_dir(&temp_dir("isa"), &tiny_model_bin(9, VOCAB), &tiny_vocabulary(VOCAB));
    let source: Vec<Vec<String>> = (0..6).map(|i| (0..3 + i).map(|j| format!("w{}", 3 + (i * 7 + j * 3) % 9)).collect()).collect();
    let opts = TranslateOptions { beam_size: 2, num_hypotheses: 2, return_scores: true, max_decoding_length: 12, ..Default::default() };
    // Integer products are exact and every float operation is written in one order, so
    // each compute type gives the same translations on every ISA level.
    for compute_type in [ComputeType::Float32, ComputeType::Int8, ComputeType::Int16] {
        let model = tolk::Model::load_with(&dir, compute_type).unwrap();
        assert_eq!(model.compute_type(), compute_type);
        let t = Translator::with_config(&model, &TranslatorConfig::default()).unwrap();
        let reference = isa::with_isa(isa::Isa::Scalar, || t.translate_batch(&source, None, &opts).unwrap());
        for path in isa::available() {
            let out = isa::with_isa(path, || t.translate_batch(&source, None, &opts).unwrap());
            for (a, b) in out.iter().zip(&reference) {
                assert_eq!(a.hypotheses, b.hypotheses, "{compute_type:?} {path:?} differs from the scalar reference");
                for (x, y) in a.scores.iter().zip(&b.scores) {
                    assert!((x - y).abs() < 1e-4, "{compute_type:?} {path:?}: score {x} vs {y}");
                }
            }
        }
    }
}

#[test]
fn compute_types_resolve_like_ctranslate2() {
    use tolk::ComputeType;
    let dir = write_model_dir(&temp_dir("ct"), &tiny_model_bin(4, VOCAB), &tiny_vocabulary(VOCAB));
    // The tiny model is saved in float32: "default" keeps it, "auto" quantizes to int8.
    assert_eq!(tolk::Model::load(&dir).unwrap().compute_type(), ComputeType::Float32);
    let auto = if tolk::backend::cpu::isa::current() == tolk::backend::cpu::isa::Isa::Scalar { ComputeType::Float32 } else { ComputeType::Int8 };
    assert_eq!(tolk::Model::load_with(&dir, ComputeType::Auto).unwrap().compute_type(), auto);
    assert_eq!(ComputeType::parse("int8_float32").unwrap(), ComputeType::Int8);
    assert_eq!(ComputeType::parse("float16").unwrap(), ComputeType::Float16);
    assert_eq!(ComputeType::parse("bfloat16").unwrap_err().kind, ErrorKind::Unsupported);
    // float16 runs on a GPU only: without one (or held to the CPU) loading says so.
    match tolk::Model::load_with(&dir, ComputeType::Float16) {
        Ok(m) => assert_eq!((m.device().kind(), m.compute_type()), ("cuda", ComputeType::Float16)),
        Err(e) => assert!(e.kind == ErrorKind::Unsupported && e.message.contains("float16 needs a CUDA GPU"), "{e}"),
    }
    assert_eq!(ComputeType::parse("int4").unwrap_err().kind, ErrorKind::InvalidArgument);
    // A translator asking for another type than the model's gets converted weights.
    let model = tolk::Model::load(&dir).unwrap();
    let config = TranslatorConfig { compute_type: ComputeType::Int16, ..Default::default() };
    let t16 = Translator::with_config(&model, &config).unwrap();
    let m16 = tolk::Model::load_with(&dir, ComputeType::Int16).unwrap();
    let t16b = Translator::with_config(&m16, &TranslatorConfig::default()).unwrap();
    let src = vec![vec!["w3".to_string(), "w5".to_string()]];
    let opts = TranslateOptions { max_decoding_length: 6, return_scores: true, ..Default::default() };
    assert_eq!(t16.translate_batch(&src, None, &opts).unwrap(), t16b.translate_batch(&src, None, &opts).unwrap());
}

#[test]
fn intra_threads_do_not_change_quantized_results() {
    use tolk::ComputeType;
    let dir = write_model_dir(&temp_dir("threads"), &tiny_int8_model_bin(3, VOCAB), &tiny_vocabulary(VOCAB));
    let src: Vec<Vec<String>> = (0..9).map(|i| (0..2 + i).map(|j| format!("w{}", 3 + (i * 5 + j) % 9)).collect()).collect();
    let opts = TranslateOptions { beam_size: 3, return_scores: true, max_decoding_length: 12, ..Default::default() };
    for compute_type in [ComputeType::Int8, ComputeType::Int16, ComputeType::Float32] {
        let model = Model::load_with(&dir, compute_type).unwrap();
        let run = |threads| {
            let config = TranslatorConfig { intra_threads: threads, ..Default::default() };
            Translator::with_config(&model, &config).unwrap().translate_batch(&src, None, &opts).unwrap()
        };
        assert_eq!(run(1), run(3), "{compute_type:?}");
    }
}

/// The real model splits what the tiny one does not (a beam step's 65k-logit rows, the
/// activations of its feed-forward layers): the same tokens and scores bit for bit at any
/// number of intra threads.
#[test]
fn intra_threads_do_not_change_real_model_results() {
    use tolk::ComputeType;
    let Some((dir, source)) = zh_en_pieces(24) else { return };
    for compute_type in [ComputeType::Int8, ComputeType::Float32] {
        let model = Model::load_with(&dir, compute_type).unwrap();
        for beam_size in [1, 4] {
            let opts = TranslateOptions { beam_size, max_batch_size: 12, return_scores: true, ..Default::default() };
            let run = |threads| {
                let config = TranslatorConfig { intra_threads: threads, ..Default::default() };
                Translator::with_config(&model, &config).unwrap().translate_batch(&source, None, &opts).unwrap()
            };
            let bits = |results: &[tolk::TranslationResult]| {
                results.iter().map(|r| (r.hypotheses.clone(), r.scores.iter().map(|s| s.to_bits()).collect::<Vec<_>>())).collect::<Vec<_>>()
            };
            let one = bits(&run(1));
            for threads in [2, 3] {
                assert_eq!(bits(&run(threads)), one, "{compute_type:?} beam {beam_size}, {threads} threads");
            }
        }
    }
}

#[test]
fn long_beam_searches_keep_memory_bounded() {
    // Beam reordering copies key/value caches from row to row; their buffers must be
    // sized from lengths (a capacity handed down the rows compounded to 64 GB once).
    let dir = write_model_dir(&temp_dir("longbeam"), &tiny_model_bin(2, VOCAB), &tiny_vocabulary(VOCAB));
    let model = load(&dir).unwrap();
    let t = Translator::with_config(&model, &TranslatorConfig::default()).unwrap();
    let src: Vec<Vec<String>> = (0..4).map(|i| vec![format!("w{}", 3 + i)]).collect();
    let opts = TranslateOptions { beam_size: 4, max_decoding_length: 250, min_decoding_length: 250, ..Default::default() };
    let out = t.translate_batch(&src, None, &opts).unwrap();
    assert!(out.iter().all(|r| r.hypotheses[0].len() == 250));
}

#[test]
fn progress_is_reported_per_batch_on_the_calling_thread_and_can_cancel() {
    let dir = write_model_dir(&temp_dir("progress"), &tiny_model_bin(2, VOCAB), &tiny_vocabulary(VOCAB));
    let model = load(&dir).unwrap();
    let config = TranslatorConfig { intra_threads: 2, ..Default::default() };
    let t = Translator::with_config(&model, &config).unwrap();
    let src: Vec<Vec<String>> = (0..10).map(|i| (0..1 + i % 4).map(|j| format!("w{}", 3 + j)).collect()).collect();
    let opts = TranslateOptions { max_batch_size: 4, max_decoding_length: 8, ..Default::default() };
    let caller = std::thread::current().id();
    let mut calls = Vec::new();
    let with = t
        .translate_batch_with_progress(&src, None, &opts, &mut |done, total| {
            assert_eq!(std::thread::current().id(), caller, "progress runs on the calling thread");
            calls.push((done, total));
            true
        })
        .unwrap();
    assert_eq!(calls, vec![(4, 10), (8, 10), (10, 10)]);
    assert_eq!(with, t.translate_batch(&src, None, &opts).unwrap(), "a callback changes nothing");
    let mut seen = 0;
    let err = t
        .translate_batch_with_progress(&src, None, &opts, &mut |_, _| {
            seen += 1;
            false
        })
        .unwrap_err();
    assert_eq!((err.kind, seen), (tolk::ErrorKind::Cancelled, 1), "{err}");
}
