//! `Model::load_from_memory`: a package given as named buffers loads and translates exactly
//! as the same files in a directory (the tiny model written here; the zh-en CTranslate2
//! model and the en-pt Bergamot package when TOLK_MODELS has them), owns what it keeps of
//! them, loads again from them for a translator with another compute type, and turns
//! broken or mutated file sets into the errors a directory gives, never a panic.
mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use common::*;
use tolk::{
    ComputeType, DeviceRequest, ErrorKind, LoadOptions, Model, TextOptions, TranslateOptions, TranslationResult,
    Translator, TranslatorConfig,
};

const VOCAB: usize = 12;

/// The files of `dir`, named as there.
fn files_of(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .map(|p| (p.file_name().unwrap().to_str().unwrap().to_string(), std::fs::read(&p).unwrap()))
        .collect();
    files.sort();
    files
}

fn without(files: &[(String, Vec<u8>)], name: &str) -> Vec<(String, Vec<u8>)> {
    files.iter().filter(|(n, _)| n != name).cloned().collect()
}

fn replaced(files: &[(String, Vec<u8>)], name: &str, bytes: &[u8]) -> Vec<(String, Vec<u8>)> {
    files.iter().map(|(n, b)| (n.clone(), if n == name { bytes.to_vec() } else { b.clone() })).collect()
}

fn cpu(compute_type: ComputeType) -> LoadOptions {
    LoadOptions { compute_type, device: DeviceRequest::Cpu, ..LoadOptions::default() }
}

fn translator(model: &Model, compute_type: ComputeType) -> Translator {
    Translator::with_config(model, &TranslatorConfig { compute_type, ..TranslatorConfig::default() }).unwrap()
}

fn tokens(model: &Model, compute_type: ComputeType, source: &[Vec<String>]) -> Vec<TranslationResult> {
    let options = TranslateOptions { beam_size: 2, return_scores: true, max_decoding_length: 40, ..Default::default() };
    translator(model, compute_type).translate_batch(source, None, &options).unwrap()
}

fn texts<S: AsRef<str>>(model: &Model, texts: &[S]) -> Vec<String> {
    let t = translator(model, ComputeType::Default);
    let options = t.default_options();
    t.translate_text(texts, &options, &TextOptions::default()).unwrap().into_iter().map(|t| t.text).collect()
}

/// A folder of TOLK_MODELS (else ../shared/models) holding `file`.
fn shared_model(name: &str, file: &str) -> Option<PathBuf> {
    let roots = [std::env::var_os("TOLK_MODELS").map(PathBuf::from), Some(PathBuf::from("../shared/models"))];
    let found = roots.into_iter().flatten().map(|r| r.join(name)).find(|d| d.join(file).is_file());
    if found.is_none() {
        eprintln!("skipped: no {name} under TOLK_MODELS");
    }
    found
}

fn tiny_source() -> Vec<Vec<String>> {
    (0..4).map(|i| (0..2 + i).map(|j| format!("w{}", 3 + (i + j * 5) % 9)).collect()).collect()
}

#[test]
fn the_tiny_model_from_memory_translates_as_from_its_directory_for_every_compute_type() {
    // Saved as int8: float32 and int16 translators load the weights again, from memory.
    let dir = write_model_dir(&temp_dir("memory-tiny"), &tiny_int8_model_bin(1, VOCAB), &tiny_vocabulary(VOCAB));
    let mut files = files_of(&dir);
    let from_memory = Model::load_from_memory(&files, &cpu(ComputeType::Default)).unwrap();
    let from_dir = Model::load_with_options(&dir, &cpu(ComputeType::Default)).unwrap();
    assert_eq!(from_memory.compute_type(), ComputeType::Int8);
    // Nothing points into the caller's buffers: scribbled over and freed, they change nothing.
    for (_, bytes) in &mut files {
        bytes.fill(0xA5);
    }
    drop(files);
    let source = tiny_source();
    for compute_type in [ComputeType::Default, ComputeType::Float32, ComputeType::Int16, ComputeType::Int8] {
        assert_eq!(tokens(&from_memory, compute_type, &source), tokens(&from_dir, compute_type, &source), "{compute_type:?}");
    }
    // The float32-saved model: its float32 weights are used in place from the copy.
    let float_dir = write_model_dir(&temp_dir("memory-tiny-f32"), &tiny_model_bin(2, VOCAB), &tiny_vocabulary(VOCAB));
    let float_memory = Model::load_from_memory(&files_of(&float_dir), &cpu(ComputeType::Default)).unwrap();
    let float_from_dir = Model::load(&float_dir).unwrap();
    for compute_type in [ComputeType::Default, ComputeType::Int8] {
        assert_eq!(tokens(&float_memory, compute_type, &source), tokens(&float_from_dir, compute_type, &source));
    }
    // Without a tokenizer, text translation says where it looked.
    let e = translator(&float_memory, ComputeType::Default)
        .translate_text(&["w3"], &TranslateOptions::default(), &TextOptions::default())
        .unwrap_err();
    assert!(e.message.contains("in memory (config.json, model.bin, shared_vocabulary.json)"), "{}", e.message);
    let _ = std::fs::remove_dir_all(dir);
    let _ = std::fs::remove_dir_all(float_dir);
}

#[test]
fn zh_en_from_memory_translates_as_from_its_directory() {
    let Some(dir) = shared_model("zh-en-ct2", "model.bin") else { return };
    let files = files_of(&dir);
    let from_memory = Model::load_from_memory(&files, &cpu(ComputeType::Default)).unwrap();
    drop(files);
    let from_dir = Model::load_with_options(&dir, &cpu(ComputeType::Default)).unwrap();
    assert_eq!(from_memory.compute_type(), from_dir.compute_type());
    let chinese = ["耶稣基督是大卫的子孙，亚伯拉罕的后裔。", "你们要彼此相爱。我是世界的光。"];
    let tokenizer = from_memory.tokenizer().expect("sentencepiece.model is found among the files");
    assert_eq!(tokenizer.files().source.as_deref(), Some(Path::new("sentencepiece.model")));
    let source: Vec<Vec<String>> = chinese.iter().map(|t| tokenizer.source().encode(t)).collect();
    let by_memory = tokens(&from_memory, ComputeType::Default, &source);
    assert_eq!(by_memory, tokens(&from_dir, ComputeType::Default, &source));
    let text = texts(&from_memory, &chinese);
    assert_eq!(text, texts(&from_dir, &chinese));
    assert!(text[1].contains("love"), "{text:?}");
    // Another compute type: the weights are loaded again from the model's copy.
    let float32 = tokens(&from_memory, ComputeType::Float32, &source[..1]);
    assert_eq!(float32, tokens(&from_dir, ComputeType::Float32, &source[..1]));
}

#[test]
fn the_en_pt_bergamot_package_from_memory_translates_as_from_its_directory() {
    let Some(dir) = shared_model("en-pt-bergamot", "model.enpt.intgemm.alphas.bin") else { return };
    let files = files_of(&dir);
    let from_memory = Model::load_from_memory(&files, &LoadOptions::default()).unwrap();
    let from_dir = Model::load(&dir).unwrap();
    assert_eq!(from_memory.translation_model().description(), from_dir.translation_model().description());
    let english = ["Love your enemies.", "I am the way, the truth, and the life. The light shines in the darkness."];
    let text = texts(&from_memory, &english);
    assert_eq!(text, texts(&from_dir, &english));
    assert!(text[0].starts_with("Ame seus inimigos."), "{text:?}");
    // The tokenizer named among the files, as a directory's would be by its path.
    let named = LoadOptions { source_tokenizer: Some("vocab.enpt.spm".into()), ..LoadOptions::default() };
    assert_eq!(texts(&Model::load_from_memory(&files, &named).unwrap(), &english), text);
    let missing = LoadOptions { source_tokenizer: Some("missing.spm".into()), ..LoadOptions::default() };
    let e = Model::load_from_memory(&files, &missing).err().unwrap();
    assert!(e.kind == ErrorKind::Io && e.message.contains("missing.spm"), "{e}");
    // Another compute type loads the model file, vocabularies and shortlist again.
    let source = vec![from_memory.tokenizer().unwrap().source().encode("Love your enemies.")];
    assert_eq!(tokens(&from_memory, ComputeType::Float32, &source), tokens(&from_dir, ComputeType::Float32, &source));
}

#[test]
fn broken_file_sets_are_errors_like_broken_directories() {
    let dir = write_model_dir(&temp_dir("memory-broken"), &tiny_model_bin(3, VOCAB), &tiny_vocabulary(VOCAB));
    let files = files_of(&dir);
    let options = cpu(ComputeType::Default);
    let kind = |files: &[(String, Vec<u8>)]| Model::load_from_memory(files, &options).err().map(|e| e.kind);
    let none: &[(&str, &[u8])] = &[];
    assert_eq!(Model::load_from_memory(none, &options).err().unwrap().kind, ErrorKind::InvalidArgument);
    // Without model.bin: nothing Tolk knows, and the message lists what was given.
    let e = Model::load_from_memory(&without(&files, "model.bin"), &options).err().unwrap();
    assert_eq!(e.kind, ErrorKind::Io);
    assert!(e.message.contains("config.json, shared_vocabulary.json"), "{}", e.message);
    // Without config.json, as without it in a directory: an error beside a version 6 model.bin.
    std::fs::remove_file(dir.join("config.json")).unwrap();
    let no_config = without(&files, "config.json");
    assert_eq!(kind(&no_config), Model::load(&dir).err().map(|e| e.kind));
    assert_eq!(kind(&without(&files, "shared_vocabulary.json")), Some(ErrorKind::Io));
    let model_bin = &files.iter().find(|(n, _)| n == "model.bin").unwrap().1;
    for len in [1, 7, 100, model_bin.len() / 2, model_bin.len() - 1] {
        assert_eq!(kind(&replaced(&files, "model.bin", &model_bin[..len])), Some(ErrorKind::InvalidModel), "{len}");
    }
    let mut rng = Rng::new(7);
    let garbage: Vec<u8> = (0..4096).map(|_| rng.next_u64() as u8).collect();
    assert!(kind(&replaced(&files, "model.bin", &garbage)).is_some());
    assert_eq!(kind(&replaced(&files, "config.json", b"{not json")), Some(ErrorKind::InvalidModel));
    assert_eq!(kind(&replaced(&files, "shared_vocabulary.json", &[0xff, 0xfe])), Some(ErrorKind::InvalidModel));
    // Names: twice (also as ./name), empty, absolute, with `..`; an empty file.
    let mut twice = files.clone();
    twice.push(("./config.json".into(), b"{}".to_vec()));
    let e = Model::load_from_memory(&twice, &options).err().unwrap();
    assert!(e.kind == ErrorKind::InvalidArgument && e.message.contains("twice"), "{e}");
    for name in ["", "/model.bin", "../model.bin"] {
        let mut bad = files.clone();
        bad.push((name.into(), b"x".to_vec()));
        assert_eq!(kind(&bad), Some(ErrorKind::InvalidArgument), "{name:?}");
    }
    let e = Model::load_from_memory(&replaced(&files, "config.json", b""), &options).err().unwrap();
    assert!(e.kind == ErrorKind::InvalidArgument && e.message.contains("\"config.json\" is empty"), "{e}");
    // A Marian YAML naming a model that is not among the files.
    let yaml: &[(&str, &[u8])] = &[("config.yml", b"models:\n  - model.npz\nvocabs:\n  - vocab.spm\n"), ("vocab.spm", b"x")];
    let e = Model::load_from_memory(yaml, &options).err().unwrap();
    assert!(e.kind == ErrorKind::Io && e.message.contains("model.npz"), "{e}");
    let _ = std::fs::remove_dir_all(dir);
}

/// The loader fuzzing of tests/loader.rs through memory: every mutated model.bin loads from
/// memory exactly when it loads from a directory (the same error kind otherwise), and
/// translates the same, also with a float32 translator (loaded again from memory).
#[test]
fn mutated_model_bins_load_from_memory_as_from_a_directory() {
    let sources = [tiny_model_bin(8, VOCAB), tiny_int8_model_bin(8, VOCAB)];
    let dir = write_model_dir(&temp_dir("memory-mutate"), &sources[0], &tiny_vocabulary(VOCAB));
    let files = files_of(&dir);
    let options = cpu(ComputeType::Default);
    let source = vec![vec!["w3".to_string(), "w7".into()]];
    let run = |model: tolk::Result<Model>| -> Result<Vec<Vec<TranslationResult>>, ErrorKind> {
        let model = model.map_err(|e| e.kind)?;
        let opts = TranslateOptions { max_decoding_length: 8, ..Default::default() };
        [ComputeType::Default, ComputeType::Float32]
            .iter()
            .map(|&compute_type| {
                let config = TranslatorConfig { compute_type, ..TranslatorConfig::default() };
                let t = Translator::with_config(&model, &config).map_err(|e| e.kind)?;
                t.translate_batch(&source, None, &opts).map_err(|e| e.kind)
            })
            .collect()
    };
    let mut rng = Rng::new(99);
    let (mut loaded, mut refused) = (0, 0);
    for i in 0..600 {
        let mut m = sources[i % 2].clone();
        for _ in 0..1 + rng.below(3) {
            match rng.below(3) {
                0 => {
                    let p = rng.below(m.len());
                    m[p] ^= 1 << rng.below(8);
                }
                1 => {
                    let p = rng.below(m.len() - 4);
                    let v: u32 = [u32::MAX, 0x7FFF_FFFF, 0x1000_0000, rng.next_u64() as u32][rng.below(4)];
                    m[p..p + 4].copy_from_slice(&v.to_le_bytes());
                }
                _ => m.truncate(rng.below(m.len()).max(1)),
            }
        }
        std::fs::write(dir.join("model.bin"), &m).unwrap();
        let both = catch_unwind(AssertUnwindSafe(|| {
            let memory = run(Model::load_from_memory(&replaced(&files, "model.bin", &m), &options));
            (memory, run(Model::load_with_options(&dir, &options)))
        }));
        let (memory, directory) = both.unwrap_or_else(|_| panic!("mutation #{i} panicked"));
        assert_eq!(memory, directory, "mutation #{i}");
        if memory.is_ok() {
            loaded += 1;
        } else {
            refused += 1;
        }
    }
    assert!(refused > 200, "most mutations should be refused ({refused} refused, {loaded} loaded)");
    let _ = std::fs::remove_dir_all(dir);
}
