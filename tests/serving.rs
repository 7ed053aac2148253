//! Serving: workers on one model, jobs from many threads, results in input order,
//! cancellation, shutdown with work in flight, token streaming. The stress tests run on a
//! tiny random model (fast); the text tests on the real zh-en model when TOLK_MODELS has it.
mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use tolk::{BatchHooks, ErrorKind, Model, TextHooks, TextOptions, TranslateOptions, TranslationResult, Translator, TranslatorConfig};

const VOCAB: usize = 40;

fn tiny_model(name: &str) -> Model {
    let dir = write_model_dir(&temp_dir(name), &tiny_model_bin(7, VOCAB), &tiny_vocabulary(VOCAB));
    Model::load(&dir).unwrap()
}

fn translator(model: &Model, inter_threads: usize) -> Translator {
    Translator::with_config(model, &TranslatorConfig { inter_threads, ..Default::default() }).unwrap()
}

/// `n` sentences of lengths 0..=30 in a scrambled order (mixed lengths, some empty).
fn mixed_sentences(n: usize, seed: usize) -> Vec<Vec<String>> {
    (0..n)
        .map(|i| {
            let len = (i * 7919 + seed * 31) % 31;
            (0..len).map(|j| format!("w{}", 3 + (i * 13 + j * 5 + seed) % (VOCAB - 3))).collect()
        })
        .collect()
}

fn options(beam_size: usize, max_batch_size: usize) -> TranslateOptions {
    TranslateOptions { beam_size, max_batch_size, max_decoding_length: 24, return_scores: true, ..Default::default() }
}

fn sequential(model: &Model, source: &[Vec<String>], options: &TranslateOptions) -> Vec<TranslationResult> {
    // One sentence per call: no batching at all, the reference for every other arrangement.
    let t = translator(model, 1);
    source.iter().map(|s| t.translate_batch(std::slice::from_ref(s), None, options).unwrap().remove(0)).collect()
}

#[test]
fn thousands_of_mixed_sentences_from_many_threads_equal_the_sequential_run() {
    let model = tiny_model("stress");
    let source = mixed_sentences(2000, 1);
    for beam in [1, 3] {
        let opts = options(beam, 16);
        let expected = sequential(&model, &source, &opts);
        let t = translator(&model, 2);
        // Eight threads, each submitting its quarter-slices as jobs and as blocking calls.
        let chunks: Vec<(usize, &[Vec<String>])> = source.chunks(125).enumerate().collect();
        let got: Mutex<Vec<Option<Vec<TranslationResult>>>> = Mutex::new(vec![None; chunks.len()]);
        std::thread::scope(|scope| {
            for thread in 0..8 {
                let (t, chunks, got, opts) = (&t, &chunks, &got, &opts);
                scope.spawn(move || {
                    let mine: Vec<&(usize, &[Vec<String>])> = chunks.iter().filter(|(i, _)| i % 8 == thread).collect();
                    let jobs: Vec<_> = mine
                        .iter()
                        .filter(|(i, _)| i % 2 == 0)
                        .map(|(i, c)| (*i, t.submit_batch(c.to_vec(), None, opts, BatchHooks::default()).unwrap()))
                        .collect();
                    for (i, c) in mine.iter().filter(|(i, _)| i % 2 == 1) {
                        let r = t.translate_batch(c, None, opts).unwrap();
                        got.lock().unwrap()[*i] = Some(r);
                    }
                    for (i, job) in jobs {
                        got.lock().unwrap()[i] = Some(job.wait().unwrap());
                    }
                });
            }
        });
        let got: Vec<TranslationResult> = got.into_inner().unwrap().into_iter().flat_map(Option::unwrap).collect();
        assert_eq!(got.len(), expected.len());
        for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
            assert_eq!(g.hypotheses, e.hypotheses, "beam {beam}, sentence {i}");
            for (a, b) in g.scores.iter().zip(&e.scores) {
                assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "beam {beam}, sentence {i}: score {a} vs {b}");
            }
        }
    }
}

#[test]
fn results_keep_input_order_whatever_order_batches_end_in() {
    let model = tiny_model("order");
    let source = mixed_sentences(300, 2);
    let opts = options(2, 7);
    let expected = sequential(&model, &source, &opts);
    for workers in [1, 2, 4] {
        let got = translator(&model, workers).translate_batch(&source, None, &opts).unwrap();
        assert!(got.iter().zip(&expected).all(|(g, e)| g.hypotheses == e.hypotheses), "{workers} workers");
    }
}

#[test]
fn completion_callbacks_run_once_and_jobs_report_progress() {
    let model = tiny_model("callbacks");
    let t = translator(&model, 2);
    let calls = Arc::new(AtomicUsize::new(0));
    let mut jobs = Vec::new();
    for i in 0..20 {
        let calls = Arc::clone(&calls);
        let hooks = BatchHooks {
            on_complete: Some(Box::new(move |error| {
                assert!(error.is_none());
                calls.fetch_add(1, Ordering::SeqCst);
            })),
            ..Default::default()
        };
        jobs.push(t.submit_batch(mixed_sentences(10 + i, i), None, &options(1, 4), hooks).unwrap());
    }
    for (i, job) in jobs.iter().enumerate() {
        assert_eq!(job.wait().unwrap().len(), 10 + i);
        assert!(job.is_done());
        assert_eq!(job.progress(), (10 + i, 10 + i));
        assert_eq!(job.wait().unwrap_err().kind, ErrorKind::InvalidArgument, "the output is taken once");
    }
    drop(t); // Joins the workers: every callback has returned.
    assert_eq!(calls.load(Ordering::SeqCst), 20);
    // A job with nothing to translate ends at once, its callback on the submitting thread.
    let t = translator(&model, 1);
    let called = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&called);
    let hooks = BatchHooks { on_complete: Some(Box::new(move |_| {
        c.fetch_add(1, Ordering::SeqCst);
    })), ..Default::default() };
    let job = t.submit_batch(Vec::new(), None, &options(1, 4), hooks).unwrap();
    assert!(job.is_done() && job.wait().unwrap().is_empty());
    assert_eq!(called.load(Ordering::SeqCst), 1);
}

#[test]
fn cancelling_a_job_stops_it_and_leaves_the_others_alone() {
    let model = tiny_model("cancel");
    let t = translator(&model, 1);
    let long: Vec<Vec<String>> = mixed_sentences(3000, 3);
    let opts = TranslateOptions { max_decoding_length: 200, min_decoding_length: 150, ..options(4, 8) };
    let doomed = t.submit_batch(long.clone(), None, &opts, BatchHooks::default()).unwrap();
    let kept = t.submit_batch(mixed_sentences(20, 4), None, &options(1, 8), BatchHooks::default()).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    doomed.cancel();
    assert!(doomed.wait_for(Duration::from_secs(10)), "a cancelled job ends within a decoding step");
    let error = doomed.wait().unwrap_err();
    assert_eq!(error.kind, ErrorKind::Cancelled, "{}", error.message);
    let (done, total) = doomed.progress();
    assert!(done < total, "cancelled after {done} of {total}");
    assert_eq!(kept.wait().unwrap().len(), 20, "the next job still runs");
}

#[test]
fn a_progress_callback_refusing_cancels_the_call() {
    let model = tiny_model("progress");
    let t = translator(&model, 2);
    let mut calls = Vec::new();
    let result = t.translate_batch_with_progress(&mixed_sentences(64, 5), None, &options(1, 8), &mut |done, total| {
        calls.push((done, total));
        calls.len() < 3
    });
    assert_eq!(result.unwrap_err().kind, ErrorKind::Cancelled);
    assert_eq!(calls.len(), 3, "one call per batch until the refusal");
    assert!(calls.windows(2).all(|w| w[0].0 < w[1].0) && calls.iter().all(|c| c.1 == 64));
}

#[test]
fn freeing_a_translator_with_work_in_flight_cancels_it_without_hanging() {
    let model = tiny_model("shutdown");
    for workers in [1, 3] {
        let t = translator(&model, workers);
        let opts = TranslateOptions { max_decoding_length: 200, min_decoding_length: 150, ..options(4, 8) };
        let ended = Arc::new(AtomicUsize::new(0));
        let jobs: Vec<_> = (0..6)
            .map(|i| {
                let ended = Arc::clone(&ended);
                let hooks = BatchHooks {
                    on_complete: Some(Box::new(move |_| {
                        ended.fetch_add(1, Ordering::SeqCst);
                    })),
                    ..Default::default()
                };
                t.submit_batch(mixed_sentences(500, i), None, &opts, hooks).unwrap()
            })
            .collect();
        std::thread::sleep(Duration::from_millis(30));
        let start = std::time::Instant::now();
        drop(t);
        assert!(start.elapsed() < Duration::from_secs(10), "shutdown took {:?}", start.elapsed());
        assert_eq!(ended.load(Ordering::SeqCst), 6, "every job ended and called back");
        for job in jobs {
            assert!(job.is_done());
            assert_eq!(job.wait().unwrap_err().kind, ErrorKind::Cancelled);
        }
    }
}

#[test]
fn streamed_tokens_are_the_greedy_hypotheses_and_can_stop_a_sentence() {
    let model = tiny_model("tokens");
    let t = translator(&model, 2);
    let source = mixed_sentences(40, 6);
    let opts = TranslateOptions { return_scores: false, ..options(1, 8) };
    let expected = t.translate_batch(&source, None, &opts).unwrap();
    type Streamed = Vec<Vec<(usize, String, bool)>>; // Per sentence: (step, token, is_last).
    let streamed: Arc<Mutex<Streamed>> = Arc::new(Mutex::new(vec![Vec::new(); source.len()]));
    let sink = Arc::clone(&streamed);
    let got = t
        .translate_batch_streaming(
            &source,
            None,
            &opts,
            Arc::new(move |e| {
                sink.lock().unwrap()[e.example].push((e.step, e.token.to_string(), e.is_last));
                true
            }),
        )
        .unwrap();
    assert_eq!(got, expected);
    for (i, tokens) in streamed.lock().unwrap().iter().enumerate() {
        if source[i].is_empty() {
            continue; // No content: CTranslate2's shortcut, nothing decoded.
        }
        let words: Vec<String> = tokens.iter().map(|t| t.1.clone()).filter(|t| t != "</s>").collect();
        assert_eq!(words, expected[i].hypotheses[0], "sentence {i}");
        assert!(tokens.iter().enumerate().all(|(k, t)| t.0 == k), "steps count from 0");
        assert!(tokens.last().unwrap().2 && tokens.iter().filter(|t| t.2).count() == 1, "one last token");
    }
    // Returning false at step 2 ends every sentence with 3 tokens.
    let stopped = t.translate_batch_streaming(&source, None, &opts, Arc::new(|e| e.step < 2)).unwrap();
    for (i, r) in stopped.iter().enumerate() {
        if !source[i].is_empty() {
            let full = &expected[i].hypotheses[0];
            assert_eq!(r.hypotheses[0][..], full[..full.len().min(3)], "sentence {i}");
        }
    }
    let beam = TranslateOptions { beam_size: 2, ..opts };
    let error = t.translate_batch_streaming(&source, None, &beam, Arc::new(|_| true)).unwrap_err();
    assert_eq!(error.kind, ErrorKind::InvalidArgument, "{}", error.message);
}

/// The real model, if TOLK_MODELS has it.
fn zh_en() -> Option<Model> {
    let dir = std::path::PathBuf::from(std::env::var("TOLK_MODELS").unwrap_or_else(|_| "models".into())).join("zh-en-ct2");
    if !dir.join("model.bin").exists() {
        eprintln!("{} not found: skipped", dir.display());
        return None;
    }
    Some(Model::load(dir).unwrap())
}

#[test]
fn text_jobs_and_text_streaming_match_the_blocking_call() {
    let Some(model) = zh_en() else { return };
    let t = Translator::with_config(&model, &TranslatorConfig { inter_threads: 2, ..Default::default() }).unwrap();
    let texts = ["你好。我爱你。", "", "今天天气很好。\n我们去公园吧！", "耶稣基督是大卫的子孙。"];
    let opts = TranslateOptions { beam_size: 1, ..Default::default() };
    let expected = t.translate_text(&texts, &opts, &TextOptions::default()).unwrap();
    let job = t.submit_text(&texts, &opts, &TextOptions::default(), TextHooks::default()).unwrap();
    assert_eq!(job.wait().unwrap(), expected);
    // The last event of each sentence carries its whole translation.
    let last: Arc<Mutex<Vec<(usize, usize, String)>>> = Arc::default();
    let sink = Arc::clone(&last);
    let streamed = t
        .translate_text_streaming(
            &texts,
            &opts,
            &TextOptions::default(),
            Arc::new(move |e| {
                if e.is_last {
                    sink.lock().unwrap().push((e.text, e.sentence, e.translation.to_string()));
                }
                true
            }),
        )
        .unwrap();
    assert_eq!(streamed, expected);
    let mut last = last.lock().unwrap().clone();
    last.sort();
    let mut want = Vec::new();
    for (i, tr) in expected.iter().enumerate() {
        for (k, s) in tr.sentences.iter().enumerate() {
            want.push((i, k, tr.text[s.target.clone()].to_string()));
        }
    }
    assert_eq!(last, want);
}

/// Resident memory of this process in kB.
fn rss_kb() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[test]
fn workers_share_the_model_weights() {
    let Some(model) = zh_en() else { return };
    let Some(before) = rss_kb() else { return };
    let opts = TranslateOptions { beam_size: 1, max_batch_size: 4, ..Default::default() };
    let source: Vec<Vec<String>> = vec![vec!["▁你好".to_string(), "。".to_string()]; 16];
    let t = Translator::with_config(&model, &TranslatorConfig { inter_threads: 4, ..Default::default() }).unwrap();
    t.translate_batch(&source, None, &opts).unwrap();
    let after = rss_kb().unwrap();
    // The int8 weights are ~77 MB: a copy per worker would add hundreds of MB.
    assert!(after < before + 40_000, "4 workers added {} kB", after.saturating_sub(before));
}

/// A blocking call on a translator from inside one of its own callbacks (on_token,
/// on_complete) would wait for the worker it runs on: it is refused with an error instead
/// of hanging, the outer translation goes on, and async submissions from there still work.
/// Settling a job returns only after its completion callback has returned.
#[test]
fn waiting_inside_the_translators_own_callbacks_is_refused_not_a_deadlock() {
    let model = tiny_model("reentrant");
    let t = Arc::new(translator(&model, 1));
    let source = mixed_sentences(6, 4);
    let opts = options(1, 4);
    let refused = Arc::new(Mutex::new(Vec::new()));
    let (weak, seen, inner_source, inner_opts) = (Arc::downgrade(&t), Arc::clone(&refused), source.clone(), opts.clone());
    let on_token: tolk::TokenCallback = Arc::new(move |_| {
        if let Some(t) = weak.upgrade() {
            seen.lock().unwrap().push(t.translate_batch(&inner_source[..1], None, &inner_opts).err().map(|e| e.kind));
        }
        true
    });
    let outer = t.translate_batch_streaming(&source, None, &opts, on_token).unwrap();
    assert_eq!(outer, t.translate_batch(&source, None, &opts).unwrap());
    let refused = refused.lock().unwrap();
    assert!(!refused.is_empty() && refused.iter().all(|k| *k == Some(ErrorKind::InvalidArgument)), "{refused:?}");

    // From on_complete: the blocking call is refused, an async job is accepted; once the
    // outer job is settled the callback has returned, its results in place.
    let outcome = Arc::new(Mutex::new(None));
    let (weak, out, inner_source, inner_opts) = (Arc::downgrade(&t), Arc::clone(&outcome), source.clone(), opts.clone());
    let hooks = BatchHooks {
        on_complete: Some(Box::new(move |_| {
            let t = weak.upgrade().unwrap();
            let blocking = t.translate_batch(&inner_source, None, &inner_opts).err().map(|e| e.kind);
            std::thread::sleep(Duration::from_millis(50));
            let job = t.submit_batch(inner_source.clone(), None, &inner_opts, BatchHooks::default()).unwrap();
            *out.lock().unwrap() = Some((blocking, job));
        })),
        ..Default::default()
    };
    let job = t.submit_batch(source.clone(), None, &opts, hooks).unwrap();
    assert_eq!(job.wait().unwrap(), outer);
    job.cancel_and_settle();
    let (blocking, inner) = outcome.lock().unwrap().take().expect("the callback has returned once the job is settled");
    assert_eq!(blocking, Some(ErrorKind::InvalidArgument));
    assert_eq!(inner.wait().unwrap(), outer, "the job submitted from the callback ran");
}
