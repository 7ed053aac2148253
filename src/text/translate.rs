//! Text in, text out: texts are cut into sentences, sentences into pieces (long ones
//! wrapped into several units, as Bergamot does), every unit of every text is translated in
//! one sorted batch, and each translation is put back between the source's own gaps
//! (spaces, line breaks, blank lines).
use std::ops::Range;

use super::split::{split, SplitMode};
use super::tokenizer::Tokenizer;
use crate::error::{Error, Result};
use crate::translator::{TranslateOptions, Translator};

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

/// One translated unit (a sentence, or part of a long one): byte ranges in the source text
/// and in the translation.
#[derive(Debug, Clone, PartialEq)]
pub struct SentenceTranslation {
    pub source: Range<usize>,
    pub target: Range<usize>,
    /// The hypothesis score when `return_scores` was set.
    pub score: Option<f32>,
}

/// The translation of one text.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TextTranslation {
    pub text: String,
    pub sentences: Vec<SentenceTranslation>,
}

/// A unit to translate: its source range (in its text) and pieces.
struct Unit {
    text: usize,
    source: Range<usize>,
    pieces: Vec<String>,
}

/// Translates `texts` (each one independent) with `translator` and `tokenizer`.
pub fn translate_texts<S: AsRef<str>>(
    translator: &Translator,
    tokenizer: &Tokenizer,
    texts: &[S],
    options: &TranslateOptions,
    text_options: &TextOptions,
) -> Result<Vec<TextTranslation>> {
    if options.num_hypotheses != 1 {
        return Err(Error::invalid_argument("text translation returns one translation per text: num_hypotheses must be 1"));
    }
    let max_tokens =
        if text_options.max_sentence_tokens == 0 { DEFAULT_MAX_SENTENCE_TOKENS } else { text_options.max_sentence_tokens };
    if max_tokens < 2 {
        return Err(Error::invalid_argument("max_sentence_tokens must be at least 2 (a piece and the end token)"));
    }
    let mut units = Vec::new();
    for (t, text) in texts.iter().enumerate() {
        let text = text.as_ref();
        let mut covered = 0; // Units never overlap, even when a cut splits a character's byte pieces.
        for sentence in split(text, text_options.split_mode) {
            let pieces = tokenizer.encode(&text[sentence.clone()]);
            for chunk in wrap(&pieces, max_tokens - 1) {
                let start = (sentence.start + pieces[chunk.start].range.start).max(covered);
                let end = (sentence.start + pieces[chunk.end - 1].range.end).max(start);
                let source = trim(text, start..end);
                if source.is_empty() {
                    continue; // Only blank pieces (a wrapped run of unknown spaces): nothing to translate.
                }
                covered = source.end;
                units.push(Unit { text: t, source, pieces: pieces[chunk].iter().map(|p| p.piece.clone()).collect() });
            }
        }
    }
    let mut options = options.clone();
    if options.max_batch_size == 0 {
        options.max_batch_size = DEFAULT_TEXT_BATCH_SIZE;
        options.batch_type = crate::translator::BatchType::Examples;
    }
    let sources: Vec<Vec<String>> = units.iter_mut().map(|u| std::mem::take(&mut u.pieces)).collect();
    let results = translator.translate_batch(&sources, None, &options)?;

    let mut out: Vec<TextTranslation> = vec![TextTranslation::default(); texts.len()];
    let mut ends = vec![0usize; texts.len()]; // Source bytes copied so far, per text.
    for (unit, result) in units.into_iter().zip(results) {
        let source = texts[unit.text].as_ref();
        let translation = tokenizer.decode(result.hypotheses.first().map(Vec::as_slice).unwrap_or(&[]));
        let translation = translation.trim();
        let done = &mut out[unit.text];
        let gap = &source[ends[unit.text]..unit.source.start];
        done.text.push_str(&adapt_gap(gap, &done.text, translation));
        let start = done.text.len();
        done.text.push_str(translation);
        done.sentences.push(SentenceTranslation {
            source: unit.source.clone(),
            target: start..done.text.len(),
            score: result.scores.first().copied(),
        });
        ends[unit.text] = unit.source.end;
    }
    for (t, done) in out.iter_mut().enumerate() {
        done.text.push_str(&texts[t].as_ref()[ends[t]..]);
    }
    Ok(out)
}

/// Cuts `pieces` into ranges of at most `max` pieces. A cut goes before the last word start
/// (`▁...` piece) in the second half of the allowed length, else after the last punctuation
/// piece there, else at `max` (inside a word, where Bergamot always cuts).
fn wrap<T: AsPiece>(pieces: &[T], max: usize) -> Vec<Range<usize>> {
    let mut chunks = Vec::new();
    let mut start = 0;
    while pieces.len() - start > max {
        let window = start + max / 2 + 1..=start + max; // Where the next chunk may start.
        let before_word = window.clone().rev().find(|&i| pieces[i].piece().starts_with('\u{2581}'));
        let after_punct = || window.clone().rev().find(|&i| is_punctuation(pieces[i - 1].piece()));
        let end = before_word.or_else(after_punct).unwrap_or(start + max);
        chunks.push(start..end);
        start = end;
    }
    if start < pieces.len() {
        chunks.push(start..pieces.len());
    }
    chunks
}

trait AsPiece {
    fn piece(&self) -> &str;
}

impl AsPiece for super::sentencepiece::EncodedPiece {
    fn piece(&self) -> &str {
        &self.piece
    }
}

impl AsPiece for &str {
    fn piece(&self) -> &str {
        self
    }
}

/// A piece made only of punctuation (`,` `，` `、` `;` ...), optionally after `▁`.
fn is_punctuation(piece: &str) -> bool {
    let p = piece.trim_start_matches('\u{2581}');
    !p.is_empty() && p.chars().all(|c| c.is_ascii_punctuation() || matches!(c, '，' | '、' | '；' | '：' | '。' | '！' | '？' | '…' | '—'))
}

/// `range` without the whitespace at its ends (the `▁` of a piece covers the space before it).
fn trim(text: &str, range: Range<usize>) -> Range<usize> {
    let s = &text[range.clone()];
    let start = range.start + (s.len() - s.trim_start().len());
    let end = range.start + s.trim_end().len();
    if start >= end {
        range.start..range.start
    } else {
        start..end
    }
}

/// The source gap to put before `next` in a translation that so far is `done`. Kept as it
/// is, except: no gap between two sentences whose translations use spaces gets one
/// (zh "。" -> en ". "), and spaces between two sentences written without spaces
/// (CJK) are dropped.
fn adapt_gap<'a>(gap: &'a str, done: &str, next: &str) -> std::borrow::Cow<'a, str> {
    let (Some(before), Some(after)) = (done.chars().next_back(), next.chars().next()) else {
        return gap.into();
    };
    if gap.is_empty() && !before.is_whitespace() && !is_unspaced(before) && !is_unspaced(after) {
        return " ".into();
    }
    if !gap.is_empty() && gap.chars().all(|c| c == ' ' || c == '\t' || c == '\u{3000}') && is_unspaced(before) && is_unspaced(after) {
        return "".into();
    }
    gap.into()
}

/// Characters of scripts written without spaces between words and sentences (Chinese,
/// Japanese; CJK punctuation and full-width forms).
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

    #[test]
    fn wrap_prefers_word_starts_then_punctuation() {
        let words: Vec<&str> = "▁a b ▁c d e ▁f g ▁h i".split(' ').collect();
        assert_eq!(wrap(&words, 20), vec![0..9]);
        // max 4: no word starts at 3 or 4 -> hard cut at 4; then before "▁h" (7).
        assert_eq!(wrap(&words, 4), vec![0..4, 4..7, 7..9]);
        // max 5: "▁f" starts at 5.
        assert_eq!(wrap(&words, 5), vec![0..5, 5..9]);
        let zh: Vec<&str> = "▁我 们 ， 你 们 。 他 们".split(' ').collect();
        assert_eq!(wrap(&zh, 4), vec![0..3, 3..6, 6..8]);
        assert_eq!(wrap(&["▁x"; 7], 2), vec![0..2, 2..4, 4..6, 6..7]);
        assert!(wrap::<&str>(&[], 5).is_empty());
        // Every piece in exactly one chunk, each at most max, for many sizes.
        let long: Vec<&str> = (0..200).map(|i| if i % 3 == 0 { "▁w" } else { "x" }).collect();
        for max in 1..40 {
            let chunks = wrap(&long, max);
            assert_eq!(chunks.first().unwrap().start, 0);
            assert_eq!(chunks.last().unwrap().end, long.len());
            assert!(chunks.windows(2).all(|w| w[0].end == w[1].start));
            assert!(chunks.iter().all(|c| !c.is_empty() && c.len() <= max), "{max}: {chunks:?}");
        }
    }

    #[test]
    fn gaps_follow_the_target_script() {
        assert_eq!(adapt_gap("", "Jesus wept.", "He said"), " ");
        assert_eq!(adapt_gap("\n", "Jesus wept.", "He said"), "\n");
        assert_eq!(adapt_gap(" ", "你好。", "世界。"), "");
        assert_eq!(adapt_gap("\n\n", "你好。", "世界。"), "\n\n");
        assert_eq!(adapt_gap("", "你好。", "世界。"), "");
        assert_eq!(adapt_gap("  ", "Hi.", "Yes."), "  ");
        assert_eq!(adapt_gap("", "", "First"), "");
    }

    #[test]
    fn trim_keeps_ranges_on_content() {
        assert_eq!(trim(" ab ", 0..4), 1..3);
        assert_eq!(trim("   ", 0..3), 0..0);
        assert_eq!(trim("x\u{3000}", 0..4), 0..1);
    }
}
