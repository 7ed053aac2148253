//! Continuous batching: a greedy or beam translation of many batches takes the next batch
//! into the running search once few rows are left. Every example must come out exactly as
//! when its batch is translated on its own (tokens and scores, bit for bit), on the real
//! zh-en model (int8 and float32, one and two workers) and on tiny random models (with
//! target prefixes, and a vocabulary smaller than the beam's candidates); token events keep
//! each example's own step count. Under a budget of decoding state (`max_decoding_memory_mb`)
//! examples start a few at a time, batches in parts: the results must not change either.
mod common;

use std::sync::{Arc, Mutex};

use common::*;
use tolk::{ComputeType, Model, TranslateOptions, TranslationResult, Translator, TranslatorConfig};

fn translator(model: &Model, inter_threads: usize) -> Translator {
    Translator::with_config(model, &TranslatorConfig { inter_threads, ..Default::default() }).unwrap()
}

fn greedy(max_batch_size: usize) -> TranslateOptions {
    TranslateOptions { beam_size: 1, max_batch_size, return_scores: true, ..Default::default() }
}

/// Each batch of the request translated by a call of its own (a request of one batch has
/// nothing to take in): the reference.
fn batch_by_batch(t: &Translator, source: &[Vec<String>], prefix: Option<&[Vec<String>]>, options: &TranslateOptions) -> Vec<TranslationResult> {
    let mut results = vec![TranslationResult::default(); source.len()];
    for batch in tolk::translator::rebatch(source, options.max_batch_size, options.batch_type) {
        let sources: Vec<Vec<String>> = batch.iter().map(|&i| source[i].clone()).collect();
        let prefixes: Option<Vec<Vec<String>>> = prefix.map(|p| batch.iter().map(|&i| p[i].clone()).collect());
        for (i, r) in batch.into_iter().zip(t.translate_batch(&sources, prefixes.as_deref(), options).unwrap()) {
            results[i] = r;
        }
    }
    results
}

fn assert_same(got: &[TranslationResult], expected: &[TranslationResult], what: &str) {
    assert_eq!(got.len(), expected.len());
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        assert_eq!(g.hypotheses, e.hypotheses, "{what}: example {i}");
        let bits = |r: &TranslationResult| r.scores.iter().map(|s| s.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(g), bits(e), "{what}: scores of example {i}");
    }
}

#[test]
fn real_model_examples_equal_their_batch_translated_alone() {
    let Some((dir, source)) = zh_en_pieces(160) else { return };
    for compute_type in [ComputeType::Int8, ComputeType::Float32] {
        let model = Model::load_with(&dir, compute_type).unwrap();
        let options = greedy(16);
        let expected = batch_by_batch(&translator(&model, 1), &source, None, &options);
        // The default budget (half the weights: 39 MB in int8, more than these batches need
        // in float32).
        for workers in [1, 2] {
            let got = translator(&model, workers).translate_batch(&source, None, &options).unwrap();
            assert_same(&got, &expected, &format!("{compute_type:?}, {workers} workers"));
        }
        // No bound; 1 MB holds about 40 positions of zh-en (24 KB each): one example at a
        // time at first; 6 MB: parts of a few.
        for mb in [0, 1, 6] {
            let options = TranslateOptions { max_decoding_memory_mb: Some(mb), ..options.clone() };
            let got = translator(&model, 1).translate_batch(&source, None, &options).unwrap();
            assert_same(&got, &expected, &format!("{compute_type:?}, state budget {mb} MB"));
        }
    }
}

#[test]
fn real_model_beam_examples_equal_their_batch_translated_alone() {
    let Some((dir, source)) = zh_en_pieces(64) else { return };
    for compute_type in [ComputeType::Int8, ComputeType::Float32] {
        let model = Model::load_with(&dir, compute_type).unwrap();
        for beam_size in [2, 4] {
            let options = TranslateOptions { beam_size, join_batches: Some(true), ..greedy(12) };
            let expected = batch_by_batch(&translator(&model, 1), &source, None, &options);
            for workers in [1, 2] {
                let got = translator(&model, workers).translate_batch(&source, None, &options).unwrap();
                assert_same(&got, &expected, &format!("{compute_type:?}, beam {beam_size}, {workers} workers"));
            }
            let budgeted = TranslateOptions { max_decoding_memory_mb: Some(4), ..options.clone() };
            let got = translator(&model, 2).translate_batch(&source, None, &budgeted).unwrap();
            assert_same(&got, &expected, &format!("{compute_type:?}, beam {beam_size}, state budget 4 MB"));
        }
    }
}

/// `n` sources of lengths 0..=25 scrambled: empty sources (answered without decoding)
/// among them.
fn tiny_sources(n: usize, vocab: usize) -> Vec<Vec<String>> {
    (0..n).map(|i| (0..(i * 7 + 3) % 26).map(|j| format!("w{}", 3 + (i * 11 + j * 3) % (vocab - 3))).collect()).collect()
}

#[test]
fn tiny_model_beam_examples_equal_their_batch_translated_alone() {
    // Vocabulary 40: the first step runs one row per example; 6: fewer tokens than the 8
    // candidates of beam 4, every example starts with its 4 beams. The random models rarely
    // end a hypothesis: a token they often produce as the end token varies the lengths.
    for (vocab, beams, end) in [(40, &[2, 4][..], "w37"), (6, &[4][..], "w3")] {
        for (name, bin) in [("continuous-beam-f32", tiny_model_bin(21, vocab)), ("continuous-beam-i8", tiny_int8_model_bin(21, vocab))] {
            let dir = write_model_dir(&temp_dir(&format!("{name}-{vocab}")), &bin, &tiny_vocabulary(vocab));
            let model = Model::load(&dir).unwrap();
            let source = tiny_sources(200, vocab);
            // Target prefixes on some examples: their batch's other examples then end no
            // secondary beam on their first step (CTranslate2's batch-wide prefix rule).
            let prefix: Vec<Vec<String>> = (0..source.len()).map(|i| (0..[0, 0, 0, 1, 2][i % 5]).map(|j| format!("w{}", 3 + j)).collect()).collect();
            for &beam_size in beams {
                let cases = [(1, 1, 1.0, None), (5, 2, 0.0, Some(end)), (16, 1, 0.0, Some(end)), (32, 2, 1.0, Some(end))];
                for (max_batch_size, num_hypotheses, length_penalty, end_token) in cases {
                    let options = TranslateOptions {
                        beam_size,
                        num_hypotheses,
                        length_penalty,
                        end_tokens: end_token.into_iter().map(String::from).collect(),
                        max_decoding_length: 30,
                        join_batches: Some(true),
                        ..greedy(max_batch_size)
                    };
                    for prefix in [None, Some(&prefix[..])] {
                        let expected = batch_by_batch(&translator(&model, 1), &source, prefix, &options);
                        let got = translator(&model, 2).translate_batch(&source, prefix, &options).unwrap();
                        let what = format!("{name}, vocabulary {vocab}, beam {beam_size}, batches of {max_batch_size}, prefix {}", prefix.is_some());
                        assert_same(&got, &expected, &what);
                    }
                }
            }
        }
    }
}

#[test]
fn tiny_model_examples_equal_their_batch_translated_alone() {
    let vocab = 40;
    for (name, bin) in [("continuous-f32", tiny_model_bin(11, vocab)), ("continuous-i8", tiny_int8_model_bin(12, vocab))] {
        let dir = write_model_dir(&temp_dir(name), &bin, &tiny_vocabulary(vocab));
        let model = Model::load(&dir).unwrap();
        let source = tiny_sources(300, vocab);
        for max_batch_size in [1, 5, 16] {
            let options = TranslateOptions { max_decoding_length: 40, ..greedy(max_batch_size) };
            let expected = batch_by_batch(&translator(&model, 1), &source, None, &options);
            let got = translator(&model, 2).translate_batch(&source, None, &options).unwrap();
            assert_same(&got, &expected, &format!("{name}, batches of {max_batch_size}"));
        }
    }
}

#[test]
fn token_events_count_each_examples_own_steps() {
    let vocab = 40;
    let dir = write_model_dir(&temp_dir("continuous-events"), &tiny_model_bin(13, vocab), &tiny_vocabulary(vocab));
    let model = Model::load(&dir).unwrap();
    let source: Vec<Vec<String>> = (0..120).map(|i| (0..1 + i % 17).map(|j| format!("w{}", 3 + (i + j * 7) % (vocab - 3))).collect()).collect();
    type Events = Vec<Vec<(usize, String, bool)>>;
    let events: Arc<Mutex<Events>> = Arc::new(Mutex::new(vec![Vec::new(); source.len()]));
    let sink = Arc::clone(&events);
    let on_token: tolk::TokenCallback = Arc::new(move |e: &tolk::TokenEvent| {
        sink.lock().unwrap()[e.example].push((e.step, e.token.to_string(), e.is_last));
        true
    });
    let options = TranslateOptions { max_decoding_length: 30, ..greedy(8) };
    let results = translator(&model, 1).translate_batch_streaming(&source, None, &options, on_token).unwrap();
    let events = events.lock().unwrap();
    for (i, (r, ev)) in results.iter().zip(events.iter()).enumerate() {
        assert!(!ev.is_empty(), "example {i} has no events");
        assert!(ev.iter().enumerate().all(|(k, e)| e.0 == k), "example {i}: steps {:?}", ev.iter().map(|e| e.0).collect::<Vec<_>>());
        assert!(ev.last().unwrap().2 && ev.iter().filter(|e| e.2).count() == 1, "example {i}: one last event, at the end");
        let streamed: Vec<&String> = ev.iter().map(|e| &e.1).filter(|t| t.as_str() != "</s>").collect();
        assert_eq!(streamed, r.hypotheses[0].iter().collect::<Vec<_>>(), "example {i}");
    }
}
