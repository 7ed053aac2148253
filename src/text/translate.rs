//! Text in, text out: texts are cut into sentences, sentences into pieces (long ones
//! wrapped into several units, as Bergamot does), every unit of every text is translated in
//! one sorted batch, and each translation is put back between the source's own gaps
//! (spaces, line breaks, blank lines).
use std::ops::Range;
use std::sync::{Arc, Mutex};

use std::borrow::Cow;

use super::sentencepiece::EncodedPiece;
use super::split::{is_blank_char, split, trimmed, SplitMode};
use super::tokenizer::Tokenizer;
use crate::error::{Error, Result};
use crate::translator::{BatchType, TokenCallback, TokenEvent, TranslateOptions, TranslationResult, Translator};

/// Bergamot's default `max-length-break`.
pub const DEFAULT_MAX_SENTENCE_TOKENS: usize = 128;
/// `max_batch_size` used for text when the options leave it at 0 ("one batch"): a whole
/// document in one batch would hold every sentence's caches at once.
pub const DEFAULT_TEXT_BATCH_SIZE: usize = 32;

/// How texts are cut before translation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TextOptions {
    pub split_mode: SplitMode,
    /// A unit has at most this many source tokens, the end token included; longer sentences
    /// are cut, preferably before a word, else after a punctuation piece (0 = the default).
    pub max_sentence_tokens: usize,
}

impl Default for TextOptions {
    fn default() -> Self {
        TextOptions { split_mode: SplitMode::Sentences, max_sentence_tokens: DEFAULT_MAX_SENTENCE_TOKENS }
    }
}

/// One translated unit (a sentence, or a part of a long one): byte ranges in the source
/// text and in the translation.
#[derive(Debug, Clone, PartialEq)]
pub struct SentenceTranslation {
    pub source: Range<usize>,
    pub target: Range<usize>,
    /// The hypothesis score when `return_scores` was set.
    pub score: Option<f32>,
    /// Index of the source sentence in its text: the parts of a wrapped sentence share it.
    pub sentence: usize,
}

/// The translation of one text.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TextTranslation {
    pub text: String,
    pub sentences: Vec<SentenceTranslation>,
}

/// A unit to translate: where it is in which text, and its pieces.
struct Unit {
    text: usize,
    sentence: usize,
    source: Range<usize>,
    pieces: Vec<String>,
}

/// Texts cut into units and tokenized: the batch to translate, and what puts the
/// translations back between the sources' gaps.
pub(crate) struct PreparedTexts {
    /// The units' pieces, one sentence of the batch each.
    pub sources: Vec<Vec<String>>,
    /// The caller's options, with a batch size for text when they leave it at 0.
    pub options: TranslateOptions,
    texts: Vec<String>,
    units: Vec<Unit>,
}

/// Splits and tokenizes `texts` (each one independent) for translation by `translator`.
pub(crate) fn prepare_texts<S: AsRef<str>>(
    translator: &Translator,
    tokenizer: &Tokenizer,
    texts: &[S],
    options: &TranslateOptions,
    text_options: &TextOptions,
) -> Result<PreparedTexts> {
    if options.num_hypotheses != 1 {
        return Err(Error::invalid_argument("text translation returns one translation per text: num_hypotheses must be 1"));
    }
    let max_pieces = max_pieces_per_unit(translator, options, text_options)?;
    let mut units = Vec::new();
    for (t, text) in texts.iter().enumerate() {
        collect_units(tokenizer, t, text.as_ref(), text_options.split_mode, max_pieces, &mut units);
    }
    let mut options = options.clone();
    // Text results carry neither tokens nor attention (unknown words are still replaced).
    (options.return_end_token, options.return_attention) = (false, false);
    if options.max_batch_size == 0 {
        options.max_batch_size = DEFAULT_TEXT_BATCH_SIZE;
        options.batch_type = BatchType::Examples;
    }
    let sources: Vec<Vec<String>> = units.iter_mut().map(|u| std::mem::take(&mut u.pieces)).collect();
    let texts = texts.iter().map(|t| t.as_ref().to_string()).collect();
    Ok(PreparedTexts { sources, options, texts, units })
}

impl PreparedTexts {
    /// Detokenizes the translations of the units (in order) and assembles each text.
    pub fn finish(self, tokenizer: &Tokenizer, results: Vec<TranslationResult>) -> Vec<TextTranslation> {
        let translations = results.into_iter().map(|r| {
            let text = tokenizer.decode(r.hypotheses.first().map(Vec::as_slice).unwrap_or(&[]));
            (text.trim().to_string(), r.scores.first().copied())
        });
        assemble(&self.texts, &self.units, translations)
    }

    /// Where each unit's translation goes: (text, index in that text's `sentences`).
    pub fn slots(&self) -> Vec<(usize, usize)> {
        let mut seen = vec![0usize; self.texts.len()];
        self.units
            .iter()
            .map(|u| {
                seen[u.text] += 1;
                (u.text, seen[u.text] - 1)
            })
            .collect()
    }
}

/// A token of a text's translation, as given to a text token callback.
#[derive(Debug, Clone, Copy)]
pub struct TextTokenEvent<'a> {
    /// Index of the text in the request.
    pub text: usize,
    /// Index of the sentence in that text's `TextTranslation::sentences`.
    pub sentence: usize,
    /// Position of the token among the sentence's generated ones.
    pub step: usize,
    pub id: u32,
    pub token: &'a str,
    /// The sentence's translation so far, detokenized.
    pub translation: &'a str,
    /// The sentence's translation ends with this token.
    pub is_last: bool,
}

/// Called for each generated token of text translations (greedy search only), on the
/// translator's worker threads; returning false ends that sentence's translation there.
pub type TextTokenCallback = Arc<dyn Fn(&TextTokenEvent) -> bool + Send + Sync>;

/// A token callback that follows each unit's pieces and reports the detokenized
/// translation so far to `callback` (the end tokens are not part of the text).
pub(crate) fn text_token_callback(
    slots: Vec<(usize, usize)>,
    end_tokens: Vec<String>,
    detokenize: impl Fn(&[String]) -> String + Send + Sync + 'static,
    callback: TextTokenCallback,
) -> TokenCallback {
    let pieces: Mutex<Vec<Vec<String>>> = Mutex::new(vec![Vec::new(); slots.len()]);
    Arc::new(move |event: &TokenEvent| {
        let translation = {
            let mut pieces = pieces.lock().unwrap_or_else(|e| e.into_inner());
            let unit = &mut pieces[event.example];
            if !end_tokens.iter().any(|t| *t == event.token) {
                unit.push(event.token.to_string());
            }
            detokenize(unit).trim().to_string()
        };
        let (text, sentence) = slots[event.example];
        callback(&TextTokenEvent {
            text,
            sentence,
            step: event.step,
            id: event.id,
            token: event.token,
            translation: &translation,
            is_last: event.is_last,
        })
    })
}

/// The most source pieces a unit may have: `max_sentence_tokens`, `max_input_length` and
/// the encoder's positions all bound the source with its special tokens.
fn max_pieces_per_unit(translator: &Translator, options: &TranslateOptions, text_options: &TextOptions) -> Result<usize> {
    let model = translator.model();
    let mut max_tokens =
        if text_options.max_sentence_tokens == 0 { DEFAULT_MAX_SENTENCE_TOKENS } else { text_options.max_sentence_tokens };
    if options.max_input_length > 0 {
        max_tokens = max_tokens.min(options.max_input_length);
    }
    if let Some(positions) = model.max_source_positions() {
        max_tokens = max_tokens.min(positions);
    }
    let specials = model.special_tokens().add_source_bos as usize + model.special_tokens().add_source_eos as usize;
    if max_tokens <= specials {
        return Err(Error::invalid_argument(format!(
            "max_sentence_tokens / max_input_length of {max_tokens} leave no room for a piece beside the {specials} special token(s)"
        )));
    }
    Ok(max_tokens - specials)
}

/// Splits `text` into sentences, tokenizes them and wraps long ones into units.
fn collect_units(tokenizer: &Tokenizer, t: usize, text: &str, mode: SplitMode, max_pieces: usize, units: &mut Vec<Unit>) {
    let mut covered = 0; // Units never overlap.
    for (sentence, range) in split(text, mode).into_iter().enumerate() {
        let pieces = tokenizer.encode(&text[range.clone()]);
        let cuts: Vec<Cut> = (0..pieces.len()).map(|i| Cut::before(&pieces, i)).collect();
        for chunk in wrap(&cuts, max_pieces) {
            let start = (range.start + pieces[chunk.start].range.start).max(covered);
            let end = (range.start + pieces[chunk.end - 1].range.end).max(start);
            let source = trimmed(text, start..end);
            if source.is_empty() {
                continue; // Only blank pieces (e.g. unknown spaces): nothing to translate.
            }
            covered = source.end;
            let pieces = pieces[chunk].iter().map(|p| p.piece.clone()).collect();
            units.push(Unit { text: t, sentence, source, pieces });
        }
    }
}

/// Puts each unit's translation between the source's own gaps, text by text.
fn assemble<S: AsRef<str>>(
    texts: &[S],
    units: &[Unit],
    translations: impl Iterator<Item = (String, Option<f32>)>,
) -> Vec<TextTranslation> {
    let mut out: Vec<TextTranslation> = vec![TextTranslation::default(); texts.len()];
    let mut copied = vec![0usize; texts.len()]; // Source bytes consumed so far, per text.
    for (unit, (translation, score)) in units.iter().zip(translations) {
        let source = texts[unit.text].as_ref();
        let done = &mut out[unit.text];
        let gap = &source[copied[unit.text]..unit.source.start];
        done.text.push_str(&adapt_gap(gap, &done.text, &translation));
        let start = done.text.len();
        done.text.push_str(&translation);
        done.sentences.push(SentenceTranslation {
            source: unit.source.clone(),
            target: start..done.text.len(),
            score,
            sentence: unit.sentence,
        });
        copied[unit.text] = unit.source.end;
    }
    for (t, done) in out.iter_mut().enumerate() {
        done.text.push_str(&texts[t].as_ref()[copied[t]..]);
    }
    out
}

/// How good a place the boundary before a piece is to cut a long sentence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Cut {
    /// Between the byte pieces of one character.
    Never,
    /// Inside a word.
    Poor,
    /// After a punctuation piece.
    Good,
    /// Before a word (a `▁` piece).
    Best,
}

impl Cut {
    fn before(pieces: &[EncodedPiece], i: usize) -> Cut {
        if i > 0 && pieces[i - 1].range.is_empty() {
            // The previous piece has no source of its own: it is part of this piece's
            // character (byte pieces, a character normalized into several pieces) or a lone `▁`.
            Cut::Never
        } else if pieces[i].piece.starts_with('\u{2581}') {
            Cut::Best
        } else if i > 0 && is_punctuation(&pieces[i - 1].piece) {
            Cut::Good
        } else {
            Cut::Poor
        }
    }
}

/// Cuts `cuts.len()` pieces into ranges of at most `max`, balanced: as many parts as
/// needed, each near an equal share, cut at the best place within a quarter of the share
/// around it (Bergamot cuts every `max` pieces, which can leave a lone "。" whose
/// translation is made up).
fn wrap(cuts: &[Cut], max: usize) -> Vec<Range<usize>> {
    let n = cuts.len();
    let mut chunks = Vec::new();
    let mut start = 0;
    while n - start > max {
        let parts = (n - start).div_ceil(max);
        let share = (n - start).div_ceil(parts);
        let slack = (share / 4).max(1);
        let ideal = start + share;
        // Candidates for the next chunk's start: never past `max` pieces, never so early
        // that the rest needs more than `parts - 1` parts.
        let earliest = n - (parts - 1) * max;
        let lo = (ideal - slack).max(earliest).max(start + 1);
        let hi = (ideal + slack).min(start + max);
        let allowed = |i: &usize| cuts[*i] != Cut::Never;
        let best = (lo..=hi).filter(allowed).max_by_key(|&i| (cuts[i], std::cmp::Reverse(i.abs_diff(ideal))));
        // Else the latest allowed cut (one more part, when characters are in the way).
        let end = best.or_else(|| (start + 1..=start + max).rev().find(allowed)).unwrap_or(start + max);
        chunks.push(start..end);
        start = end;
    }
    if start < n {
        chunks.push(start..n);
    }
    chunks
}

/// A piece made only of punctuation (`,` `，` `、` `;` ...), optionally after `▁`.
fn is_punctuation(piece: &str) -> bool {
    let p = piece.trim_start_matches('\u{2581}');
    !p.is_empty() && p.chars().all(|c| c.is_ascii_punctuation() || matches!(c, '，' | '、' | '；' | '：' | '。' | '！' | '？' | '…' | '—'))
}

/// The source gap to put before `next` in a translation that so far is `done`. A gap with a
/// line break is kept as it is. Between two translations written without spaces (CJK) a
/// blank gap vanishes; between others, an empty gap becomes a space (zh "。" -> en ". "),
/// ASCII spaces and tabs are kept, and other blanks (U+3000, NBSP, zero-width characters)
/// become one space.
fn adapt_gap<'a>(gap: &'a str, done: &str, next: &str) -> Cow<'a, str> {
    let (Some(before), Some(after)) = (done.chars().next_back(), next.chars().next()) else {
        return gap.into();
    };
    if !gap.chars().all(is_blank) || before.is_whitespace() {
        return gap.into();
    }
    if is_unspaced(before) && is_unspaced(after) {
        "".into()
    } else if !gap.is_empty() && gap.chars().all(|c| c == ' ' || c == '\t') {
        gap.into()
    } else {
        " ".into()
    }
}

/// A blank that is not a line break.
fn is_blank(c: char) -> bool {
    is_blank_char(c) && !matches!(c, '\n' | '\r' | '\u{0B}' | '\u{0C}' | '\u{85}' | '\u{2028}' | '\u{2029}')
}

/// Characters of scripts written without spaces between words and sentences (Chinese,
/// Japanese; CJK punctuation and full-width forms). Unlike the splitter's `is_cjk`, Hangul
/// is not here: Korean puts spaces between sentences.
fn is_unspaced(c: char) -> bool {
    matches!(c as u32,
        0x3000..=0x303F   // CJK symbols and punctuation
        | 0x3040..=0x30FF // Hiragana, Katakana
        | 0x3400..=0x4DBF // CJK extension A
        | 0x4E00..=0x9FFF // CJK unified ideographs
        | 0xF900..=0xFAFF // CJK compatibility ideographs
        | 0xFF00..=0xFFEF // Half-width and full-width forms
        | 0x20000..=0x3FFFF)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(p: &str, range: Range<usize>) -> EncodedPiece {
        EncodedPiece { piece: p.to_string(), id: 0, range }
    }

    /// Cut classes of pieces given as text with spaces between them.
    fn cuts(pieces: &str) -> Vec<Cut> {
        let mut at = 0;
        let pieces: Vec<EncodedPiece> = pieces
            .split(' ')
            .map(|p| {
                let len = p.trim_start_matches('\u{2581}').len();
                at += len;
                piece(p, at - len..at)
            })
            .collect();
        (0..pieces.len()).map(|i| Cut::before(&pieces, i)).collect()
    }

    #[test]
    fn wrap_balances_parts_and_cuts_between_words() {
        let words = cuts("▁a b ▁c d e ▁f g ▁h i");
        assert_eq!(wrap(&words, 20), vec![0..9]);
        // 9 pieces, at most 5: two parts of ~5; "▁f" (5) is the word start nearest.
        assert_eq!(wrap(&words, 5), vec![0..5, 5..9]);
        // At most 4: three parts of 3; word starts at 2 and 5 are within reach.
        assert_eq!(wrap(&words, 4), vec![0..2, 2..5, 5..9]);
        // No word starts: after punctuation.
        let zh = cuts("▁我 们 ， 你 们 。 他 们");
        assert_eq!(wrap(&zh, 4), vec![0..4, 4..8]);
        assert_eq!(wrap(&zh, 3), vec![0..3, 3..6, 6..8]);
        assert!(wrap(&[], 5).is_empty());
    }

    #[test]
    fn wrap_never_leaves_a_tiny_tail() {
        // 128 pieces of CJK text ending in "。", at most 127: two halves, not 127 + 1.
        let mut text = vec!["▁我"];
        text.extend(std::iter::repeat_n("们", 126));
        text.push("。");
        let chunks = wrap(&cuts(&text.join(" ")), 127);
        assert_eq!(chunks.len(), 2);
        assert!(chunks.iter().all(|c| c.len() >= 60), "{chunks:?}");
    }

    #[test]
    fn wrap_never_splits_a_character() {
        // "▁x" then one unknown 3-byte character as byte pieces (the first two have empty
        // ranges at the character's start), repeated.
        let mut pieces = Vec::new();
        for k in 0..10 {
            let at = k * 4;
            pieces.push(piece("▁x", at..at + 1));
            pieces.push(piece("<0xE2>", at + 1..at + 1));
            pieces.push(piece("<0x82>", at + 1..at + 1));
            pieces.push(piece("<0xAC>", at + 1..at + 4));
        }
        let cuts: Vec<Cut> = (0..pieces.len()).map(|i| Cut::before(&pieces, i)).collect();
        for max in 3..12 {
            // (Below 3, a 3-byte character cannot fit one part: it is cut.)
            for chunk in wrap(&cuts, max) {
                assert!(chunk.len() <= max);
                assert_ne!(cuts[chunk.start], Cut::Never, "{max}: cut inside a character at {}", chunk.start);
            }
        }
    }

    #[test]
    fn wrap_covers_every_piece_within_the_limit() {
        let long: Vec<&str> = (0..200).map(|i| if i % 3 == 0 { "▁w" } else { "x" }).collect();
        let long = cuts(&long.join(" "));
        for max in 1..40 {
            let chunks = wrap(&long, max);
            assert_eq!(chunks.first().unwrap().start, 0);
            assert_eq!(chunks.last().unwrap().end, long.len());
            assert!(chunks.windows(2).all(|w| w[0].end == w[1].start));
            assert!(chunks.iter().all(|c| !c.is_empty() && c.len() <= max), "{max}: {chunks:?}");
            assert_eq!(chunks.len(), long.len().div_ceil(max), "{max}: as few parts as the limit allows");
        }
    }

    #[test]
    fn gaps_follow_the_target_script() {
        assert_eq!(adapt_gap("", "Jesus wept.", "He said"), " ");
        assert_eq!(adapt_gap("\n", "Jesus wept.", "He said"), "\n");
        assert_eq!(adapt_gap(" \r\n ", "你好。", "世界。"), " \r\n ");
        assert_eq!(adapt_gap(" ", "你好。", "世界。"), "");
        assert_eq!(adapt_gap("\u{3000}", "你好。", "世界。"), "");
        assert_eq!(adapt_gap("\n\n", "你好。", "世界。"), "\n\n");
        assert_eq!(adapt_gap("", "你好。", "世界。"), "");
        assert_eq!(adapt_gap("  ", "Hi.", "Yes."), "  ");
        assert_eq!(adapt_gap("\t", "Hi.", "Yes."), "\t");
        assert_eq!(adapt_gap("\u{200B}", "Hi.", "Yes."), " ");
        assert_eq!(adapt_gap("\u{3000}", "Hi.", "Yes."), " ");
        assert_eq!(adapt_gap("\u{FEFF} ", "Hi.", "Yes."), " ");
        assert_eq!(adapt_gap("", "", "First"), "");
        assert_eq!(adapt_gap("", "Hi. ", "Yes."), "");
    }
}
