//! Marian/Bergamot models through the family-neutral API: the real en-pt package (when
//! `TOLK_MODELS` has it), family detection and its errors, package decoding defaults,
//! shortlists as output subsets, compute types, and the same translations whichever
//! way the package is named (directory, YAML, model file).
mod common;

use std::path::PathBuf;

use tolk::{ComputeType, ErrorKind, Model, TextOptions, TranslateOptions, Translator, TranslatorConfig};

fn en_pt() -> Option<PathBuf> {
    let root = std::env::var_os("TOLK_MODELS").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("models"));
    let candidates = [root.join("en-pt-bergamot"), PathBuf::from("../shared/models/en-pt-bergamot")];
    let found = candidates.into_iter().find(|p| p.join("model.enpt.intgemm.alphas.bin").is_file());
    if found.is_none() {
        eprintln!("skipped: no en-pt-bergamot model under TOLK_MODELS");
    }
    found
}

const ENGLISH: [&str; 4] = [
    "Love your enemies.",
    "The light shines in the darkness, and the darkness hasn't overcome it.",
    "Blessed are the poor in spirit, for theirs is the Kingdom of Heaven.",
    "I am the way, the truth, and the life.",
];

fn translate(model: &Model, options: Option<TranslateOptions>) -> Vec<String> {
    let translator = Translator::with_config(model, &TranslatorConfig::default()).unwrap();
    let options = options.unwrap_or_else(|| translator.default_options());
    let text = TextOptions { split_mode: tolk::SplitMode::Lines, ..TextOptions::default() };
    translator.translate_text(&ENGLISH, &options, &text).unwrap().into_iter().map(|t| t.text).collect()
}

#[test]
fn the_bergamot_package_translates_with_its_own_settings() {
    let Some(dir) = en_pt() else { return };
    let model = Model::load(&dir).unwrap();
    let description = model.translation_model().description();
    assert!(description.contains("SSRU") && description.contains("shortlist"), "{description}");
    assert_eq!(model.compute_type(), ComputeType::Int8, "gemm-precision int8shiftAlphaAll");
    let translator = Translator::with_config(&model, &TranslatorConfig::default()).unwrap();
    let options = translator.default_options();
    // config.intgemm8bitalpha.yml: beam 1, normalize 1, max-length-factor 2.5, mini-batch 64;
    // Marian never generates <unk> unless allow-unk.
    assert_eq!((options.beam_size, options.length_penalty, options.max_length_factor), (1, 1.0, 2.5));
    assert_eq!(options.max_batch_size, 64);
    assert!(options.disable_unk && options.use_shortlist);
    let out = translate(&model, None);
    assert_eq!(out[0], "Ame seus inimigos.");
    assert!(out.iter().all(|t| !t.is_empty() && !t.contains('▁')), "{out:?}");
    assert!(out[3].contains("caminho") && out[3].contains("verdade") && out[3].contains("vida"), "{}", out[3]);
}

/// Every file of a loaded package (model, shortlist, vocabulary, YAML) rewritten in place
/// (truncated, then other bytes, as `cp` does) changes nothing: the model holds copies.
/// (Marian weights were always copied at load; this keeps it so.)
#[test]
fn package_files_rewritten_in_place_under_a_loaded_model_are_not_read() {
    let Some(shared) = en_pt() else { return };
    let dir = common::temp_dir("marian-rewrite");
    common::copy_files_writable(&shared, &dir);
    let model = Model::load(&dir).unwrap();
    let before = translate(&model, None);
    for entry in std::fs::read_dir(&dir).unwrap() {
        common::rewrite_in_place(&entry.unwrap().path());
    }
    assert_eq!(translate(&model, None), before);
    drop(model);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_package_is_found_from_its_directory_yaml_or_model_file() {
    let Some(dir) = en_pt() else { return };
    let by_dir = translate(&Model::load(&dir).unwrap(), None);
    let by_yaml = translate(&Model::load(dir.join("config.intgemm8bitalpha.yml")).unwrap(), None);
    assert_eq!(by_dir, by_yaml);
    // The bare model file: vocabularies found beside it, Marian's own decoding defaults
    // (beam 12, normalize 0, max-length-factor 3), no shortlist.
    let bare = Model::load(dir.join("model.enpt.intgemm.alphas.bin")).unwrap();
    assert!(!bare.translation_model().description().contains("shortlist"));
    let translator = Translator::with_config(&bare, &TranslatorConfig::default()).unwrap();
    let options = translator.default_options();
    assert_eq!((options.beam_size, options.length_penalty, options.max_length_factor), (12, 0.0, 3.0));
}

#[test]
fn the_shortlist_restricts_the_output_and_can_be_turned_off() {
    let Some(dir) = en_pt() else { return };
    let model = Model::load(&dir).unwrap();
    let m = model.translation_model();
    let vocabulary = m.target_vocabulary().len();
    let source: Vec<u32> = ["▁Love", "▁your", "▁enemies", "."].iter().map(|t| m.source_vocabulary().id_or_unk(t)).collect();
    let candidates = m.output_candidates(&[source]).expect("the package has a shortlist");
    assert!(candidates.len() < vocabulary / 10 && candidates.len().is_multiple_of(8), "{}", candidates.len());
    assert!(candidates.windows(2).all(|w| w[0] < w[1]));
    let translator = Translator::with_config(&model, &TranslatorConfig::default()).unwrap();
    let full = TranslateOptions { use_shortlist: false, ..translator.default_options() };
    let out = translate(&model, Some(full));
    assert!(out.iter().all(|t| !t.is_empty()), "{out:?}");
}

#[test]
fn compute_types_override_the_package_precision() {
    let Some(dir) = en_pt() else { return };
    for compute_type in [ComputeType::Float32, ComputeType::Int16, ComputeType::Int8] {
        let model = Model::load_with(&dir, compute_type).unwrap();
        assert_eq!(model.compute_type(), compute_type);
        // The description says what the products run in (the activation scales with int8).
        let description = model.translation_model().description();
        let precision = if compute_type == ComputeType::Int8 { "int8 with precomputed activation scales" } else { compute_type.name() };
        assert!(description.contains(precision), "{description}");
        let out = translate(&model, None);
        assert!(out[0].starts_with("Ame"), "{compute_type:?}: {out:?}");
    }
}

#[test]
fn every_isa_translates_the_package_identically() {
    let Some(dir) = en_pt() else { return };
    let model = Model::load(&dir).unwrap();
    let reference = tolk::backend::cpu::isa::with_isa(tolk::backend::cpu::isa::Isa::Scalar, || translate(&model, None));
    for level in tolk::backend::cpu::isa::available() {
        let out = tolk::backend::cpu::isa::with_isa(level, || translate(&model, None));
        assert_eq!(out, reference, "{level:?}");
    }
}

/// intgemm's quantization and products split across intra threads (rows of a batch of
/// dev verses, enough to split): the same translations.
#[test]
fn intra_threads_translate_the_package_identically() {
    let Some(dir) = en_pt() else { return };
    let Some(data) = common::find("TOLK_DATA", "data", "dev-matthew.en") else { return };
    let text = std::fs::read_to_string(data).unwrap();
    let lines: Vec<&str> = text.lines().take(48).collect();
    let model = Model::load(&dir).unwrap();
    let run = |threads| {
        let t = Translator::with_config(&model, &TranslatorConfig { intra_threads: threads, ..Default::default() }).unwrap();
        let text = TextOptions { split_mode: tolk::SplitMode::Lines, ..TextOptions::default() };
        t.translate_text(&lines, &t.default_options(), &text).unwrap().into_iter().map(|t| t.text).collect::<Vec<_>>()
    };
    let one = run(1);
    assert_eq!(run(2), one);
    assert_eq!(run(3), one);
}

#[test]
fn a_folder_of_neither_family_says_what_was_looked_for() {
    let dir = common::temp_dir("marian-neither");
    std::fs::write(dir.join("notes.txt"), "nothing").unwrap();
    let e = Model::load(&dir).err().unwrap();
    assert_eq!(e.kind, ErrorKind::Io);
    assert!(e.message.contains("model.bin + config.json") && e.message.contains("Marian"), "{}", e.message);
    // A Marian package whose YAML names a missing model, or has no vocabulary.
    std::fs::write(dir.join("config.yml"), "models:\n  - missing.bin\nvocabs:\n  - vocab.spm\n").unwrap();
    let e = Model::load(&dir).err().unwrap();
    assert!(e.message.contains("missing.bin"), "{}", e.message);
    // A Bergamot model renamed model.bin is not mistaken for a CTranslate2 model.
    std::fs::write(dir.join("config.yml"), "models:\n  - model.bin\nvocabs:\n  - vocab.yml\n").unwrap();
    let mut bin = 1u64.to_le_bytes().to_vec();
    bin.extend_from_slice(&0u64.to_le_bytes());
    std::fs::write(dir.join("model.bin"), &bin).unwrap();
    std::fs::write(dir.join("vocab.yml"), "\"</s>\": 0\n\"<unk>\": 1\n").unwrap();
    let e = Model::load(&dir).err().unwrap();
    assert!(!e.message.contains("binary version"), "{}", e.message);
}

/// Package settings of the wrong kind are load errors naming the setting (taken as absent
/// or truncated, `beam-size: 2.5` ran with 2 and `gemm-precision: [int8]` with float32),
/// as are an empty and a foreign shortlist file.
#[test]
fn package_settings_of_the_wrong_kind_are_errors() {
    let Some(dir) = en_pt() else { return };
    let dir = std::fs::canonicalize(dir).unwrap();
    let yaml = std::fs::read_to_string(dir.join("config.intgemm8bitalpha.yml")).unwrap();
    let copy = common::temp_dir("marian-settings");
    for name in ["model.enpt.intgemm.alphas.bin", "vocab.enpt.spm", "lex.50.50.enpt.s2t.bin"] {
        std::os::unix::fs::symlink(dir.join(name), copy.join(name)).unwrap();
    }
    let config = copy.join("config.intgemm8bitalpha.yml");
    for (edit, needle) in [
        (yaml.replace("beam-size: 1", "beam-size: 2.5"), "beam-size is \"2.5\", expected a whole number"),
        (yaml.replace("beam-size: 1", "beam-size: 0"), "beam-size must be a whole number in 1..=1024"),
        (yaml.replace("mini-batch: 64", "mini-batch: [64]"), "mini-batch is a list, expected a whole number"),
        (yaml.replace("gemm-precision: int8shiftAlphaAll", "gemm-precision: [int8]"), "gemm-precision is a list, expected a string"),
        (yaml.replace("lex.50.50.enpt.s2t.bin", "empty.bin"), "empty.bin"),
    ] {
        std::fs::write(&config, &edit).unwrap();
        std::fs::write(copy.join("empty.bin"), b"").unwrap();
        let e = Model::load(&copy).err().unwrap_or_else(|| panic!("{needle}: loaded"));
        assert!(e.kind == ErrorKind::InvalidModel && e.message.contains(needle), "{needle}: {e}");
    }
    std::fs::write(&config, &yaml).unwrap();
    assert!(Model::load(&copy).is_ok());
    let _ = std::fs::remove_dir_all(copy);
}

/// A config whose enc-depth / dec-depth is below the file's layers says so (it listed the
/// extra layers' items as features Tolk does not support).
#[test]
fn a_depth_below_the_files_layers_says_so() {
    let Some(dir) = en_pt() else { return };
    let names = ["config.intgemm8bitalpha.yml", "model.enpt.intgemm.alphas.bin", "vocab.enpt.spm", "lex.50.50.enpt.s2t.bin"];
    let files: Vec<(String, Vec<u8>)> = names.iter().map(|n| (n.to_string(), std::fs::read(dir.join(n)).unwrap())).collect();
    for (from, to, needle) in [
        (&b"enc-depth: 6"[..], &b"enc-depth: 5"[..], "items of encoder_l6 but enc-depth in its config is 5"),
        (b"dec-depth: 2", b"dec-depth: 1", "items of decoder_l2 but dec-depth in its config is 1"),
    ] {
        let mut edited = files.clone();
        let model = &mut edited[1].1;
        let at = model.windows(from.len()).position(|w| w == from).expect("the setting is in special:model.yml");
        model[at..at + to.len()].copy_from_slice(to);
        let e = Model::load_from_memory(&edited, &tolk::LoadOptions::default()).err().unwrap();
        assert!(e.kind == ErrorKind::InvalidModel && e.message.contains(needle), "{e}");
    }
}
