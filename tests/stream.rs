//! Streaming translation (`Translator::translate_stream` and `translate_file`): the output
//! is exactly what `translate_text` / `translate_batch` give for the same lines however
//! the input is cut into chunks and batches and whatever the number of workers, the
//! progress callback counts lines and can cancel, and bad input is an error naming its
//! line. The zh-en model (TOLK_MODELS, else models/ or ../shared/models) and its verses
//! (TOLK_DATA, else data/ or ../shared/data) check real translations; the committed tiny
//! fixture checks the rest without them.
mod common;

use std::io::{BufRead, Cursor, Read};
use std::path::{Path, PathBuf};

use tolk::{ErrorKind, Model, StreamOptions, TextOptions, TranslateOptions, TranslationResult, Translator, TranslatorConfig};

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn fixture() -> PathBuf {
    manifest_dir().join("ffi-tests/fixtures/tiny")
}

/// The first of `$env`, `local` and `../shared/local` (beside the repository) holding `file`.
fn find(env: &str, local: &str, file: &str) -> Option<PathBuf> {
    std::env::var_os(env)
        .map(PathBuf::from)
        .into_iter()
        .chain([manifest_dir().join(local), manifest_dir().join("../shared").join(local)])
        .map(|dir| dir.join(file))
        .find(|path| path.exists())
}

/// The zh-en model and `n` Chinese verses, with empty and blank lines and a line of two
/// verses among them; `None` (the test is skipped) without them.
fn zh_en_lines(n: usize) -> Option<(PathBuf, Vec<String>)> {
    let model = find("TOLK_MODELS", "models", "zh-en-ct2/model.bin")?.parent()?.to_path_buf();
    let verses = std::fs::read_to_string(find("TOLK_DATA", "data", "dev-matthew.zh")?).ok()?;
    let verses: Vec<&str> = verses.lines().collect();
    let mut lines: Vec<String> = Vec::new();
    for (i, verse) in verses.iter().take(n).enumerate() {
        match i % 25 {
            7 => lines.push(String::new()),
            13 => lines.push("  ".into()),
            19 => lines.push(format!("{verse}{}", verses[i + 1])),
            _ => {}
        }
        lines.push(verse.to_string());
    }
    Some((model, lines))
}

fn temp_dir(name: &str) -> PathBuf {
    common::temp_dir(&format!("stream-{name}"))
}

/// Checks the progress calls of a stream of `lines` lines: lines done never go back, the
/// total is `total_from_start` (counted beforehand) or 0 until it is known, and the last
/// call says everything is done.
fn check_progress(calls: &[(usize, usize)], lines: usize, total_from_start: bool) {
    assert!(!calls.is_empty());
    assert!(calls.windows(2).all(|w| w[0].0 <= w[1].0 && w[0] != w[1]), "{calls:?}");
    assert!(
        calls.iter().all(|&(done, total)| done <= lines && (total == lines || (!total_from_start && total == 0))),
        "{calls:?}"
    );
    assert_eq!(calls.last(), Some(&(lines, lines)), "{calls:?}");
}

/// Text mode, several chunks (read_batch_size 24 of ~210 lines) of several batches, two
/// workers: the stream is translate_text's translations of each chunk, one line each, in
/// order.
#[test]
fn streamed_text_equals_translate_text() {
    let Some((model, lines)) = zh_en_lines(200) else {
        eprintln!("zh-en model or verses not found: skipped");
        return;
    };
    let model = Model::load(&model).unwrap();
    let translator = Translator::with_config(&model, &TranslatorConfig { inter_threads: 2, ..Default::default() }).unwrap();
    let options = TranslateOptions { beam_size: 1, max_batch_size: 8, return_scores: true, ..translator.default_options() };
    let text_options = TextOptions::default();
    // Batches of other sentences change the numerics a little (scores, and with int8
    // sometimes words), so the reference sorts and batches the same sentences: each chunk's.
    let reference: Vec<_> =
        lines.chunks(24).flat_map(|chunk| translator.translate_text(chunk, &options, &text_options).unwrap()).collect();
    let expected: String = reference
        .iter()
        .map(|t| {
            let scores: Vec<String> = t.sentences.iter().map(|s| format!("{:.6}", s.score.unwrap())).collect();
            format!("{} ||| {}\n", scores.join(","), t.text)
        })
        .collect();

    let input = lines.join("\n") + "\n";
    let stream = StreamOptions { read_batch_size: 24, ..Default::default() };
    let mut output = Vec::new();
    let mut calls = Vec::new();
    let translated = translator
        .translate_stream(Cursor::new(&input), &mut output, &options, &text_options, &stream, &mut |done, total| {
            calls.push((done, total));
            true
        })
        .unwrap();
    assert_eq!(translated, lines.len());
    assert_eq!(String::from_utf8(output).unwrap(), expected);
    check_progress(&calls, lines.len(), false);
    assert!(calls.iter().any(|&(_, total)| total == 0), "the total is unknown before the end is read: {calls:?}");
    assert!(calls.len() > lines.len() / 24, "at least one call per chunk: {calls:?}");
}

/// Token mode with n-best and scores, between files: each hypothesis a line
/// ("SCORE ||| tokens"), as translate_batch gives them; the total is counted beforehand.
#[test]
fn streamed_tokens_equal_translate_batch() {
    let Some((model, lines)) = zh_en_lines(100) else {
        eprintln!("zh-en model or verses not found: skipped");
        return;
    };
    let model = Model::load(&model).unwrap();
    let tokenizer = model.tokenizer().unwrap();
    let source: Vec<Vec<String>> = lines.iter().map(|l| tokenizer.encode(l).into_iter().map(|p| p.piece).collect()).collect();
    let translator = Translator::with_config(&model, &TranslatorConfig { inter_threads: 2, ..Default::default() }).unwrap();
    let options = TranslateOptions { num_hypotheses: 2, return_scores: true, max_batch_size: 8, ..translator.default_options() };
    let reference: Vec<_> =
        source.chunks(16).flat_map(|chunk| translator.translate_batch(chunk, None, &options).unwrap()).collect();
    let expected: String = reference
        .iter()
        .flat_map(|r: &TranslationResult| {
            r.hypotheses.iter().zip(&r.scores).map(|(h, s)| format!("{s:.6} ||| {}\n", h.join(" ")))
        })
        .collect();

    let dir = temp_dir("tokens");
    let (input, output) = (dir.join("in.tok"), dir.join("out.tok"));
    let text: String = source.iter().map(|s| s.join(" ") + "\n").collect();
    std::fs::write(&input, text).unwrap();
    let stream = StreamOptions { read_batch_size: 16, tokens: true, ..Default::default() };
    let mut calls = Vec::new();
    translator
        .translate_file(&input, &output, &options, &TextOptions::default(), &stream, &mut |done, total| {
            calls.push((done, total));
            true
        })
        .unwrap();
    assert_eq!(std::fs::read_to_string(&output).unwrap(), expected);
    check_progress(&calls, lines.len(), true);
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2, "no temporary file is left");
}

fn fixture_translator(inter_threads: usize) -> Translator {
    let model = Model::load(fixture()).unwrap();
    Translator::with_config(&model, &TranslatorConfig { inter_threads, ..Default::default() }).unwrap()
}

fn quick() -> TranslateOptions {
    TranslateOptions { beam_size: 1, max_decoding_length: 8, max_batch_size: 4, ..Default::default() }
}

/// 200 lines of the fixture's sentences, numbered, every fifth one empty.
fn fixture_lines() -> String {
    let base = ["Hello world. How are you?", "The cat sat on the mat.", "Zebra quilt vex jinx.", "We love to read."];
    (0..200).map(|i| if i % 5 == 4 { "\n".to_string() } else { format!("{} {i}\n", base[i % 4]) }).collect()
}

/// The progress callback returning false stops the stream: a Cancelled error, whole chunks
/// written before it (a prefix of the full translation), and for a file no output at all.
#[test]
fn the_progress_callback_cancels() {
    let translator = fixture_translator(2);
    let input = fixture_lines();
    let stream = StreamOptions { read_batch_size: 16, ..Default::default() };
    let text = TextOptions::default();
    let mut full = Vec::new();
    translator.translate_stream(Cursor::new(&input), &mut full, &quick(), &text, &stream, &mut |_, _| true).unwrap();
    let full = String::from_utf8(full).unwrap();
    assert_eq!(full.lines().count(), 200);

    let mut output = Vec::new();
    let error = translator
        .translate_stream(Cursor::new(&input), &mut output, &quick(), &text, &stream, &mut |done, _| done < 40)
        .unwrap_err();
    assert_eq!(error.kind, ErrorKind::Cancelled, "{error}");
    assert!(error.message.contains("progress callback") && error.message.contains("lines"), "{error}");
    let output = String::from_utf8(output).unwrap();
    let written = output.lines().count();
    assert!(written.is_multiple_of(16) && written <= 48 && full.starts_with(&output), "{written} lines written:\n{output}");

    // A file output: nothing is left of it, an existing one keeps its contents.
    let dir = temp_dir("cancel");
    let (in_path, out_path) = (dir.join("in.txt"), dir.join("out.txt"));
    std::fs::write(&in_path, &input).unwrap();
    std::fs::write(&out_path, "before\n").unwrap();
    let error = translator
        .translate_file(&in_path, &out_path, &quick(), &text, &stream, &mut |done, total| {
            assert_eq!(total, 200, "a file's lines are counted beforehand");
            done < 40
        })
        .unwrap_err();
    assert_eq!(error.kind, ErrorKind::Cancelled, "{error}");
    assert_eq!(std::fs::read_to_string(&out_path).unwrap(), "before\n");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2, "no temporary file is left");
    // Then a complete one replaces it.
    translator.translate_file(&in_path, &out_path, &quick(), &text, &stream, &mut |_, _| true).unwrap();
    assert_eq!(std::fs::read_to_string(&out_path).unwrap(), full);
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2);
}

/// A line that is not UTF-8 is an error naming it, in both modes; a file output is not
/// created. Lines end at "\n" (one "\r" before it goes too).
#[test]
fn invalid_utf8_names_its_line() {
    let translator = fixture_translator(1);
    let mut input = fixture_lines().into_bytes();
    input.extend_from_slice(b"fine\n\xff\xfe bad\nlast\n");
    for tokens in [false, true] {
        let stream = StreamOptions { read_batch_size: 16, tokens, ..Default::default() };
        let mut output = Vec::new();
        let error = translator
            .translate_stream(Cursor::new(&input), &mut output, &quick(), &TextOptions::default(), &stream, &mut |_, _| true)
            .unwrap_err();
        assert_eq!(error.kind, ErrorKind::InvalidArgument, "{error}");
        assert!(error.message.contains("line 202 ") && error.message.contains("UTF-8"), "{error}");
    }
    let dir = temp_dir("utf8");
    std::fs::write(dir.join("in.txt"), &input).unwrap();
    let stream = StreamOptions { read_batch_size: 16, ..Default::default() };
    let error = translator
        .translate_file(&dir.join("in.txt"), &dir.join("out.txt"), &quick(), &TextOptions::default(), &stream, &mut |_, _| true)
        .unwrap_err();
    assert!(error.message.contains("line 202 of") && error.message.contains("in.txt"), "{error}");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "no output, no temporary file");

    // CRLF and a last line without a line break are lines like the others.
    let mut crlf = Vec::new();
    let stream = StreamOptions::default();
    translator
        .translate_stream(Cursor::new("a b\r\nc"), &mut crlf, &quick(), &TextOptions::default(), &stream, &mut |_, _| true)
        .unwrap();
    let mut lf = Vec::new();
    translator
        .translate_stream(Cursor::new("a b\nc\n"), &mut lf, &quick(), &TextOptions::default(), &stream, &mut |_, _| true)
        .unwrap();
    assert_eq!(crlf, lf);
}

/// A reader that fails the test if read: the options are checked before any input is.
struct Untouched;

impl Read for Untouched {
    fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
        panic!("the input was read before the options were checked")
    }
}

impl BufRead for Untouched {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        panic!("the input was read before the options were checked")
    }
    fn consume(&mut self, _: usize) {}
}

#[test]
fn bad_options_fail_before_reading() {
    let translator = fixture_translator(1);
    let text = TextOptions::default();
    for (options, tokens) in [
        (TranslateOptions { num_hypotheses: 2, ..Default::default() }, false), // text: one translation per line
        (TranslateOptions { beam_size: 0, ..Default::default() }, true),
    ] {
        let stream = StreamOptions { tokens, ..Default::default() };
        let error = translator.translate_stream(Untouched, Vec::new(), &options, &text, &stream, &mut |_, _| true).unwrap_err();
        assert_eq!(error.kind, ErrorKind::InvalidArgument, "{error}");
    }
    // And before a missing input is opened or any output created.
    let dir = temp_dir("options");
    let options = TranslateOptions { beam_size: 0, ..Default::default() };
    let error = translator
        .translate_file(
            Path::new("/nonexistent/in"),
            &dir.join("out"),
            &options,
            &text,
            &StreamOptions::default(),
            &mut |_, _| true,
        )
        .unwrap_err();
    assert_eq!(error.kind, ErrorKind::InvalidArgument, "{error}");
    let error = translator
        .translate_file(
            Path::new("/nonexistent/in"),
            &dir.join("out"),
            &quick(),
            &text,
            &StreamOptions::default(),
            &mut |_, _| true,
        )
        .unwrap_err();
    assert!(error.kind == ErrorKind::Io && error.message.contains("/nonexistent/in"), "{error}");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
}

/// A waiter whose progress callback runs while the last batch ends gets the job's output
/// (it once saw the job ended before its output was set: "already taken"). Streaming waits
/// with a callback on every chunk, so it met this often.
#[test]
fn waiting_with_progress_always_gets_the_output() {
    let translator = fixture_translator(2);
    let texts: Vec<String> = fixture_lines().lines().map(str::to_string).collect();
    for round in 0..40 {
        let job = translator.submit_text(&texts, &quick(), &TextOptions::default(), Default::default()).unwrap();
        let out = job.wait_with_progress(&mut |_, _| true);
        assert_eq!(out.unwrap_or_else(|e| panic!("round {round}: {e}")).len(), texts.len());
    }
}

/// A path naming an open descriptor (`/dev/fd/N`, as `/dev/stdout` names fd 1) is read and
/// written where that descriptor is: what the program wrote before and after stays, and
/// input already consumed is not read again (opened by name, the output file was replaced
/// by the rename and the input read from its start).
#[cfg(unix)]
#[test]
fn descriptor_paths_read_and_write_where_the_descriptor_is() {
    use std::io::{Seek, Write};
    use std::os::fd::AsRawFd;
    let translator = fixture_translator(1);
    let dir = temp_dir("descriptors");
    let (in_path, out_path, reference_path) = (dir.join("in.txt"), dir.join("out.txt"), dir.join("reference.txt"));
    std::fs::write(&in_path, "skipped line\nHello world.\nThe cat sat on the mat.\n").unwrap();
    std::fs::write(dir.join("rest.txt"), "Hello world.\nThe cat sat on the mat.\n").unwrap();
    let text = TextOptions::default();
    let stream = StreamOptions::default();
    translator.translate_file(&dir.join("rest.txt"), &reference_path, &quick(), &text, &stream, &mut |_, _| true).unwrap();
    let expected = std::fs::read_to_string(&reference_path).unwrap();

    let mut input = std::fs::File::open(&in_path).unwrap();
    input.seek(std::io::SeekFrom::Start("skipped line\n".len() as u64)).unwrap();
    let mut output = std::fs::File::create(&out_path).unwrap();
    output.write_all(b"before\n").unwrap();
    let (input_fd, output_fd) = (PathBuf::from(format!("/dev/fd/{}", input.as_raw_fd())), PathBuf::from(format!("/dev/fd/{}", output.as_raw_fd())));
    let lines = translator.translate_file(&input_fd, &output_fd, &quick(), &text, &stream, &mut |_, _| true).unwrap();
    assert_eq!(lines, 2);
    output.write_all(b"after\n").unwrap();
    assert_eq!(std::fs::read_to_string(&out_path).unwrap(), format!("before\n{expected}after\n"));
    // A descriptor that is not open is an I/O error naming the path.
    let e = translator.translate_file(&in_path, Path::new("/dev/fd/987654"), &quick(), &text, &stream, &mut |_, _| true).err().unwrap();
    assert!(e.kind == ErrorKind::Io && e.message.contains("/dev/fd/987654"), "{e}");
    let _ = std::fs::remove_dir_all(dir);
}
