//! Text translation as a property: thousands of generated texts (every kind of blank, line
//! break, script, punctuation run, invalid-looking sequence) through `translate_text` on
//! the tiny fixture with its SentencePiece model, in every split mode and with tiny
//! wrapping limits. Whatever the text, the result keeps its invariants: sentences in
//! order, ranges on character boundaries, nothing of the source lost between them, line
//! structure kept, and no panic.
use std::ops::Range;
use std::path::PathBuf;

use tolk::{Model, SplitMode, TextOptions, TextTranslation, TranslateOptions, Translator, TranslatorConfig};

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("ffi-tests/fixtures/tiny")
}

struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Pieces texts are built from: words the fixture's tokenizer knows, unknown scripts,
/// sentence ends, closers, every blank and line break the splitter treats specially.
const POOL: &[&str] = &[
    "abc", "def", "ghij", "é", "x", "Mr.", "e.g.", "U.S.", "3.14", "No. 5", "Hello", "World", "我们", "你好",
    "。", "！", "？", ".", "!", "?", "...", "…", "\"", "”", "」", "）", "(", "「", " ", "  ", "\t", "\u{3000}",
    "\u{a0}", "\u{200b}", "\u{feff}", "\u{2060}", "\n", "\r\n", "\r", "\n\n", "\u{2028}", "\u{85}", "\u{0}",
    "\u{1}", "\u{301}", "😀", "👨\u{200d}👩", "\u{202e}", "ﬁ", "①", "ＡＢＣ", "١٢٣", "שלום", "Ωμέγα",
];

fn random_text(rng: &mut XorShift) -> String {
    let n = rng.below(24);
    (0..n).map(|_| POOL[rng.below(POOL.len())]).collect()
}

fn is_line_break(c: char) -> bool {
    matches!(c, '\n' | '\r' | '\u{85}' | '\u{2028}' | '\u{2029}')
}

fn check(source: &str, out: &TextTranslation, mode: SplitMode) {
    let mut previous_source = 0;
    let mut previous_target = 0;
    let mut previous_sentence = None;
    let mut source_gaps = String::new();
    let mut target_gaps = String::new();
    for s in &out.sentences {
        let (src, tgt): (&Range<usize>, &Range<usize>) = (&s.source, &s.target);
        assert!(previous_source <= src.start && src.start < src.end && src.end <= source.len(), "{s:?} in {source:?}");
        assert!(previous_target <= tgt.start && tgt.start <= tgt.end && tgt.end <= out.text.len(), "{s:?} in {out:?}");
        assert!(source.is_char_boundary(src.start) && source.is_char_boundary(src.end));
        assert!(out.text.is_char_boundary(tgt.start) && out.text.is_char_boundary(tgt.end));
        assert!(previous_sentence.is_none_or(|p| p <= s.sentence), "sentence indices go back: {out:?}");
        if mode != SplitMode::Whole {
            assert!(!source[src.clone()].contains(is_line_break), "line break inside {s:?} of {source:?}");
        }
        source_gaps.push_str(&source[previous_source..src.start]);
        target_gaps.push_str(&out.text[previous_target..tgt.start]);
        previous_source = src.end;
        previous_target = tgt.end;
        previous_sentence = Some(s.sentence);
    }
    source_gaps.push_str(&source[previous_source..]);
    target_gaps.push_str(&out.text[previous_target..]);
    // Gaps keep every line break of the source, in order (blanks between sentences may
    // become one space or vanish, by the target's script).
    let breaks = |s: &str| s.chars().filter(|&c| is_line_break(c)).collect::<String>();
    assert_eq!(breaks(&target_gaps), breaks(&source_gaps), "line breaks of {source:?} -> {:?}", out.text);
    if out.sentences.is_empty() {
        assert_eq!(out.text, source, "a text with nothing to translate comes back as it is");
    }
}

#[test]
fn generated_texts_keep_their_structure_in_every_mode() {
    let model = Model::load(fixture()).unwrap();
    assert!(model.tokenizer().is_some(), "the fixture ships a sentencepiece.model");
    let translator = Translator::with_config(&model, &TranslatorConfig::default()).unwrap();
    let options = TranslateOptions { beam_size: 1, max_decoding_length: 6, return_scores: true, ..Default::default() };
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
    let texts: Vec<String> = (0..600).map(|_| random_text(&mut rng)).collect();
    for mode in [SplitMode::Sentences, SplitMode::Lines, SplitMode::Whole] {
        for max_sentence_tokens in [0, 2, 3, 7] {
            let text_options = TextOptions { split_mode: mode, max_sentence_tokens };
            let out = translator.translate_text(&texts, &options, &text_options).unwrap();
            assert_eq!(out.len(), texts.len());
            let sentences: usize = out.iter().map(|t| t.sentences.len()).sum();
            if mode != SplitMode::Whole || max_sentence_tokens != 0 {
                assert!(sentences > texts.len(), "{mode:?}/{max_sentence_tokens}: only {sentences} sentences");
            }
            for (source, translated) in texts.iter().zip(&out) {
                check(source, translated, mode);
                assert!(translated.sentences.iter().all(|s| s.score.is_some_and(f32::is_finite)));
            }
            // One text at a time gives the same as the batch (batches of 32 sorted by
            // length; the tiny model is float32, so batching changes nothing).
            for (source, batched) in texts.iter().zip(&out).step_by(37) {
                let alone = translator.translate_text(&[source], &options, &text_options).unwrap();
                assert_eq!(&alone[0], batched, "{source:?}");
            }
        }
    }
}

#[test]
fn long_unbroken_text_is_wrapped_within_the_limit() {
    let model = Model::load(fixture()).unwrap();
    let translator = Translator::with_config(&model, &TranslatorConfig::default()).unwrap();
    let options = TranslateOptions { beam_size: 1, max_decoding_length: 4, ..Default::default() };
    let text = "abcdefghij".repeat(300) + " " + &"xyz ".repeat(500);
    let tokenizer = model.tokenizer().unwrap();
    for max in [2, 5, 16, 128] {
        let text_options = TextOptions { split_mode: SplitMode::Whole, max_sentence_tokens: max };
        let out = translator.translate_text(&[&text], &options, &text_options).unwrap();
        check(&text, &out[0], SplitMode::Whole);
        let config = model.translation_model().special_tokens();
        let limit = max - config.add_source_bos as usize - config.add_source_eos as usize;
        let parts = &out[0].sentences;
        assert!(parts.len() > 1 && parts.iter().all(|s| s.sentence == 0), "one sentence, several parts");
        // Each part's pieces (of the whole text's encoding) fit the limit.
        let pieces = tokenizer.encode(&text);
        for part in parts {
            let n = pieces.iter().filter(|p| !p.range.is_empty() && part.source.start <= p.range.start && p.range.end <= part.source.end).count();
            assert!(n <= limit, "max {max}: a part of {n} pieces");
        }
    }
}
