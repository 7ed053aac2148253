//! Sentence splitting for the text API: cuts a text into the units that are translated one by
//! one, as byte ranges, so that the caller can copy everything between them (spaces, line
//! breaks, blank lines) verbatim around the translations.
//!
//! The sentence rules follow the heuristics of Moses' `split-sentences.perl` (which
//! ssplit-cpp, used by Bergamot, implements too), extended for CJK punctuation and scripts
//! without case:
//!
//! - A line break always ends a sentence.
//! - A run of terminal punctuation (`.` `!` `?` `…` `‼` `⁇` `⁈` `⁉` `؟` `।` `॥` `۔` `։` `።`
//!   `။`), with the closing quotes/brackets right after it, ends a sentence when whitespace
//!   follows and the next sentence starts well: optional opening quotes/brackets/dashes,
//!   then an uppercase or titlecase letter, a digit or a letter of a script without case. A
//!   lowercase letter next means no split ("e.g. foo", "Wait... and then").
//! - CJK terminals (`。` `！` `？` `｡`) end a sentence with or without whitespace after them,
//!   their closers (`」` `”` `）` ...) staying in the sentence. `．` and ASCII terminals do the
//!   same between two CJK characters (informal Chinese), ellipses excepted.
//! - A single `.` does not end a sentence after a non-breaking prefix (see `NON_BREAKING`):
//!   listed abbreviations, single letters (initials), dotted acronyms ending in capitals
//!   ("U.S.", "Ph.D."), `NUMERIC_ONLY` ones before a digit ("No. 5"), and list labels
//!   ("1.", "IV.") opening a sentence.
//! - A sentence made only of punctuation so far is never ended ("... Then" stays whole).
//!
//! Everything runs in one forward pass per line (look-aheads and look-behinds cover disjoint
//! stretches), so time is linear in the text length.

use std::ops::Range;

/// How a text is cut into the units that are translated one by one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SplitMode {
    /// Sentences inside each line (default): line breaks always end a sentence.
    #[default]
    Sentences,
    /// Each non-blank line is one unit.
    Lines,
    /// The whole text is one unit.
    Whole,
}

/// Byte ranges of the units of `text`, in order, non-empty, non-overlapping, each trimmed of
/// blanks (Unicode White_Space incl. U+3000, U+00A0, and the zero-width format characters of
/// `is_blank_char`) at both ends and always on char boundaries. Everything between ranges (spaces, line breaks, blank lines) is a gap the
/// caller copies verbatim.
pub fn split(text: &str, mode: SplitMode) -> Vec<Range<usize>> {
    let mut units = Vec::new();
    match mode {
        SplitMode::Whole => push_trimmed(text, 0..text.len(), &mut units),
        SplitMode::Lines => lines(text).for_each(|line| push_trimmed(text, line, &mut units)),
        SplitMode::Sentences => lines(text).for_each(|line| split_line(text, line, &mut units)),
    }
    units
}

/// Words that a `.` follows without ending the sentence, matched case-sensitively as Moses
/// does (the word before the period, internal periods included: "e.g"). Kept short: a
/// missing entry costs a wrong split, a wrong entry (a word that often ends sentences, like
/// "etc" or "Inc") costs a merged pair of sentences.
#[rustfmt::skip]
const NON_BREAKING: &[&str] = &[
    // English titles.
    "Mr", "Mrs", "Ms", "Mx", "Messrs", "Dr", "Drs", "Prof", "Rev", "Hon", "Pres", "Gov", "Sen",
    "Rep", "Gen", "Col", "Capt", "Lt", "Sgt", "Maj", "Adm", "Insp", "Supt", "Jr", "Sr", "St",
    "Mt", "Ft", "Bros",
    // Spanish / Portuguese.
    "Sra", "Sras", "Srta", "Sres", "Dra", "Dras", "Profa", "Lic", "Ing", "Arq", "Ud", "Uds",
    "Vd", "Vds", "Dña", "Exmo", "Exma", "Sto", "Sta", "Av", "Avda",
    // French.
    "Mme", "Mmes", "Mlle", "Mlles", "MM", "Mgr", "Me", "Pr", "Ste",
    // German.
    "Hr", "Hrn", "Fr", "Frl", "Dipl", "Str", "bzw", "vgl", "ggf", "evtl", "inkl", "d.h", "u.a",
    // Italian.
    "Sig", "Sigg", "Sig.ra", "Sig.na", "Dott", "Dott.ssa", "Avv", "Geom", "Egr", "Gent", "Spett",
    // Latin and scholarly abbreviations.
    "e.g", "i.e", "cf", "vs", "viz", "al", "ca", "approx", "resp", "incl",
    // Months.
    "Jan", "Feb", "Mar", "Apr", "Jun", "Jul", "Aug", "Sep", "Sept", "Oct", "Nov", "Dec",
];

/// Words that a `.` follows without ending the sentence only when a digit comes next (Moses'
/// `#NUMERIC_ONLY#`): "No. 5" but "I said no. Then".
#[rustfmt::skip]
const NUMERIC_ONLY: &[&str] = &[
    "No", "no", "Nos", "nos", "Nr", "nr", "Art", "art", "Fig", "fig", "Vol", "vol", "Ch", "ch",
    "pp", "Abs", "Bd", "Pág", "pág", "Núm", "núm",
];

/// Appends `range` of `text` without its leading and trailing whitespace, unless nothing is
/// left.
fn push_trimmed(text: &str, range: Range<usize>, units: &mut Vec<Range<usize>>) {
    let trimmed = trimmed(text, range);
    if !trimmed.is_empty() {
        units.push(trimmed);
    }
}

/// White space and the invisible characters that only format text (zero-width space and
/// joiners, word joiner, byte order mark): nothing to translate.
pub(crate) fn is_blank_char(c: char) -> bool {
    c.is_whitespace() || matches!(c, '\u{200B}' | '\u{200C}' | '\u{200D}' | '\u{2060}' | '\u{FEFF}')
}

/// `range` of `text` without the blanks at its ends (empty at its start if all blank).
pub(crate) fn trimmed(text: &str, range: Range<usize>) -> Range<usize> {
    let s = &text[range.clone()];
    let start = range.start + (s.len() - s.trim_start_matches(is_blank_char).len());
    let end = range.start + s.trim_end_matches(is_blank_char).len();
    if start < end {
        start..end
    } else {
        range.start..range.start
    }
}

fn is_line_break(c: char) -> bool {
    matches!(c, '\n' | '\r' | '\u{85}' | '\u{2028}' | '\u{2029}')
}

/// The lines of `text` without their breaks. "\r\n" gives an empty line between `\r` and
/// `\n`, which is harmless: blank lines produce no units.
fn lines(text: &str) -> impl Iterator<Item = Range<usize>> + '_ {
    let mut next_start = Some(0);
    let mut breaks = text.char_indices().filter(|&(_, c)| is_line_break(c));
    std::iter::from_fn(move || {
        let start = next_start?;
        match breaks.next() {
            Some((at, c)) => {
                next_start = Some(at + c.len_utf8());
                Some(start..at)
            }
            None => {
                next_start = None;
                Some(start..text.len())
            }
        }
    })
}

/// Appends the sentences of one line (`line` is a range of `text` without line breaks).
fn split_line(text: &str, line: Range<usize>, units: &mut Vec<Range<usize>>) {
    let mut start = line.start;
    for end in SentenceEnds::new(&text[line.clone()]) {
        push_trimmed(text, start..line.start + end, units);
        start = line.start + end;
    }
    push_trimmed(text, start..line.end, units);
}

fn char_at(s: &str, pos: usize) -> Option<char> {
    s[pos..].chars().next()
}

/// The position of the first char at or after `from` that fails `pred`.
fn skip(s: &str, from: usize, pred: impl Fn(char) -> bool) -> usize {
    s[from..].find(|c| !pred(c)).map_or(s.len(), |i| from + i)
}

/// Iterates over the byte offsets (in one line) where sentences end, ascending.
struct SentenceEnds<'a> {
    line: &'a str,
    pos: usize,
    /// Where the first letter or digit of the current sentence is, once seen.
    first_alnum: Option<usize>,
    /// Whether an ASCII `"` is open (odd count so far): tells whether a `"` right after CJK
    /// punctuation closes the sentence's quotation or opens the next one.
    quote_open: bool,
}

impl Iterator for SentenceEnds<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        while let Some(c) = char_at(self.line, self.pos) {
            if is_terminal(c) {
                if let Some(end) = self.after_terminals() {
                    self.first_alnum = None;
                    return Some(end);
                }
            } else {
                if self.first_alnum.is_none() && c.is_alphanumeric() {
                    self.first_alnum = Some(self.pos);
                }
                if c == '"' {
                    self.quote_open = !self.quote_open;
                }
                self.pos += c.len_utf8();
            }
        }
        None
    }
}

impl<'a> SentenceEnds<'a> {
    fn new(line: &'a str) -> Self {
        SentenceEnds {
            line,
            pos: 0,
            first_alnum: None,
            quote_open: false,
        }
    }

    /// At the first char of a run of terminal punctuation: consumes the run with its closers
    /// and returns where the sentence ends, if it ends there.
    fn after_terminals(&mut self) -> Option<usize> {
        let line = self.line;
        let run_start = self.pos;
        let run_end = skip(line, run_start, is_terminal);
        let run = &line[run_start..run_end];
        let cjk = run.chars().any(is_cjk_terminal);
        let after_cjk = line[..run_start].chars().next_back().is_some_and(is_cjk);
        let end = self.closers(run_end, cjk || after_cjk);
        self.pos = end;
        // At the line end the line break ends the sentence anyway.
        let next = char_at(line, end)?;
        self.first_alnum?; // only punctuation so far: nothing to end
        if cjk || (after_cjk && is_cjk(next) && !is_ellipsis(run)) {
            // Japanese 「…。」と言った: the quotation goes on in the same sentence.
            let quoted = end > run_end;
            return (!(quoted && matches!(next, 'と' | 'っ'))).then_some(end);
        }
        if !next.is_whitespace() {
            return None; // "3.14", "example.com", "end.Next"
        }
        let end = self.spaced_closers(end);
        self.pos = end;
        let start = skip(line, end, char::is_whitespace);
        if start == line.len() || !starts_sentence(line, start) {
            return None;
        }
        if run == "." && end == run_end && self.is_abbreviation(run_start, start) {
            return None;
        }
        Some(end)
    }

    /// Skips the closing quotes and brackets right after a terminal run. In CJK text an ASCII
    /// `"` closes only when one is open, and the quotes that also open in some languages
    /// (“ ‘ « ' ...) are left to the next sentence.
    fn closers(&mut self, from: usize, cjk: bool) -> usize {
        let mut pos = from;
        while let Some(c) = char_at(self.line, pos) {
            let closes = match c {
                '"' => self.quote_open || !cjk,
                _ => is_closer(c) || (!cjk && is_ambiguous_quote(c)),
            };
            if !closes {
                break;
            }
            if c == '"' {
                self.quote_open = !self.quote_open;
            }
            pos += c.len_utf8();
        }
        pos
    }

    /// French typography puts a space before closing quotes ("… fin. » Puis"): closers after
    /// whitespace still belong to the sentence when whitespace or the line end follows them.
    /// Returns the new end of the sentence (`from` when there are none).
    fn spaced_closers(&mut self, from: usize) -> usize {
        let start = skip(self.line, from, char::is_whitespace);
        let mut pos = start;
        let mut quote_open = self.quote_open;
        while let Some(c) = char_at(self.line, pos) {
            if !(is_closer(c) || (c == '"' && quote_open)) {
                break;
            }
            if c == '"' {
                quote_open = false;
            }
            pos += c.len_utf8();
        }
        if pos > start && char_at(self.line, pos).is_none_or(char::is_whitespace) {
            self.quote_open = quote_open;
            pos
        } else {
            from
        }
    }

    /// Whether the `.` at `period` ends an abbreviation rather than the sentence, the next
    /// sentence would start at `next`.
    fn is_abbreviation(&self, period: usize, next: usize) -> bool {
        let word = word_before(self.line, period);
        if word.is_empty() {
            return false;
        }
        let word_start = period - word.len();
        let opens_sentence = self.first_alnum.is_some_and(|first| first >= word_start);
        let digit_next = char_at(self.line, next).is_some_and(|c| c.is_ascii_digit());
        (opens_sentence && is_list_label(word))
            || NON_BREAKING.contains(&word)
            || (digit_next && NUMERIC_ONLY.contains(&word))
            || is_initial(word)
            || is_dotted_acronym(word)
    }
}

/// The word that ends at `end` (Moses' `[\w.-]*`), without leading periods and hyphens.
fn word_before(line: &str, end: usize) -> &str {
    let start = line[..end]
        .char_indices()
        .rev()
        .take_while(|&(_, c)| is_word_char(c))
        .last()
        .map_or(end, |(i, _)| i);
    line[start..end].trim_start_matches(['.', '-', '_'])
}

fn is_word_char(c: char) -> bool {
    // Combining diacritics keep decomposed letters ("É" as E + U+0301) inside the word.
    c.is_alphanumeric() || matches!(c, '.' | '-' | '_' | '\u{300}'..='\u{36F}')
}

/// A single letter: an initial ("J. R. R. Tolkien") or a one-letter abbreviation ("p. 5").
fn is_initial(word: &str) -> bool {
    let mut chars = word.chars();
    matches!((chars.next(), chars.next()), (Some(c), None) if c.is_uppercase() || c.is_lowercase())
}

/// "U.S", "Ph.D", "z.B": internal periods and capitals after the last one (Moses' acronym
/// rule). "a.m" or "example.com" do not qualify: they often end sentences.
fn is_dotted_acronym(word: &str) -> bool {
    word.rfind('.').is_some_and(|i| {
        let tail = &word[i + 1..];
        tail.chars().any(char::is_uppercase) && tail.chars().all(|c| c.is_uppercase() || c == '-')
    })
}

/// An enumeration label that opens a sentence: "1. Introduction", "IV. Results".
fn is_list_label(word: &str) -> bool {
    let all = |set: &[u8]| word.bytes().all(|b| set.contains(&b));
    (word.len() <= 3 && all(b"0123456789")) || (word.len() <= 6 && (all(b"IVXLC") || all(b"ivxlc")))
}

/// Whether the text at `at` (after the whitespace that follows a terminal run) can start a
/// sentence: opening punctuation (with spaces, as Moses allows), then no lowercase letter.
fn starts_sentence(line: &str, at: usize) -> bool {
    let mut pos = at;
    let mut opened = false;
    while let Some(c) = char_at(line, pos) {
        if is_opener(c) {
            opened = true;
        } else if !(opened && c.is_whitespace()) {
            break;
        }
        pos += c.len_utf8();
    }
    char_at(line, pos).is_some_and(is_sentence_initial)
}

/// An uppercase or titlecase letter, a digit or a letter of a script without case.
fn is_sentence_initial(c: char) -> bool {
    c.is_numeric() || (c.is_alphabetic() && !is_lowercase_letter(c))
}

fn is_lowercase_letter(c: char) -> bool {
    // Georgian Mkhedruli is Lowercase since Unicode 11 (Mtavruli capitals were added), but
    // ordinary Georgian text has no case: its sentences start with these letters.
    c.is_lowercase() && !('\u{10D0}'..='\u{10FF}').contains(&c)
}

fn is_cjk_terminal(c: char) -> bool {
    matches!(c, '。' | '！' | '？' | '｡')
}

/// Called on every char: ASCII is answered without searching the set.
fn is_terminal(c: char) -> bool {
    if c.is_ascii() {
        matches!(c, '.' | '!' | '?')
    } else {
        "…‼⁇⁈⁉؟।॥۔։።။．。！？｡".contains(c)
    }
}

/// "..", "…", "．．": in CJK text an ellipsis is mostly a pause inside the sentence.
fn is_ellipsis(run: &str) -> bool {
    run.contains('…') || run.chars().filter(|&c| c == '.' || c == '．').count() >= 2
}

/// Closing quotes and brackets that (almost) never open anything.
fn is_closer(c: char) -> bool {
    ")]}»›”’」』）】〉》〕］｝〗〙〛〞〟".contains(c)
}

/// Quotes that close in some conventions and open in others (German „…“ and »…«): closers
/// right after Latin-script terminal punctuation. ASCII `"` is handled apart (see
/// [`SentenceEnds::closers`]).
fn is_ambiguous_quote(c: char) -> bool {
    "'«‹“‘＂".contains(c)
}

/// What may precede the first letter of a sentence: opening quotes and brackets, Spanish
/// inverted marks, dialogue dashes.
fn is_opener(c: char) -> bool {
    "\"'([{“‘„‚«»‹›”¿¡「『（【〈《〔［｛〖〘〚〝＂—–―".contains(c)
}

/// Han, kana, Hangul, CJK punctuation and full-width forms (but not full-width digits, so
/// that "１．５" stays one number).
fn is_cjk(c: char) -> bool {
    matches!(
        c as u32,
        0x1100..=0x11FF
            | 0x3000..=0x30FF
            | 0x3130..=0x318F
            | 0x31F0..=0x31FF
            | 0x3400..=0x4DBF
            | 0x4E00..=0x9FFF
            | 0xAC00..=0xD7AF
            | 0xF900..=0xFAFF
            | 0xFF01..=0xFF0F
            | 0xFF1A..=0xFFEF
            | 0x20000..=0x3FFFF
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn units(text: &str, mode: SplitMode) -> Vec<&str> {
        split(text, mode).into_iter().map(|r| &text[r]).collect()
    }

    /// Ranges as `(start, end)` pairs, easier to compare than `Range`s.
    fn spans(text: &str, mode: SplitMode) -> Vec<(usize, usize)> {
        split(text, mode)
            .into_iter()
            .map(|r| (r.start, r.end))
            .collect()
    }

    fn sents(text: &str) -> Vec<&str> {
        units(text, SplitMode::Sentences)
    }

    // ---- basic rules ----

    #[test]
    fn default_mode_is_sentences() {
        assert_eq!(SplitMode::default(), SplitMode::Sentences);
    }

    #[test]
    fn splits_on_terminal_punctuation() {
        assert_eq!(
            sents("Hello world. How are you? I am fine! Thanks."),
            ["Hello world.", "How are you?", "I am fine!", "Thanks."]
        );
        assert_eq!(
            sents("Really?! Yes‼ Sure⁉ No⁇ Ok⁈ Done."),
            ["Really?!", "Yes‼", "Sure⁉", "No⁇", "Ok⁈", "Done."]
        );
    }

    #[test]
    fn lowercase_next_word_does_not_split() {
        assert_eq!(
            sents("Big cities, e.g. foo and bar."),
            ["Big cities, e.g. foo and bar."]
        );
        assert_eq!(sents("Yahoo! is a company."), ["Yahoo! is a company."]);
        assert_eq!(
            sents("Wait... and then he left."),
            ["Wait... and then he left."]
        );
        assert_eq!(sents("Is it? maybe."), ["Is it? maybe."]);
    }

    #[test]
    fn ellipsis_before_capital_splits() {
        assert_eq!(sents("Wait... Then he left."), ["Wait...", "Then he left."]);
        assert_eq!(sents("Wait… Then he left."), ["Wait…", "Then he left."]);
        assert_eq!(
            sents("Apples, pears, etc... Then more."),
            ["Apples, pears, etc...", "Then more."]
        );
    }

    #[test]
    fn needs_whitespace_after_latin_terminals() {
        assert_eq!(sents("Pi is 3.14 exactly."), ["Pi is 3.14 exactly."]);
        assert_eq!(
            sents("See example.com and v1.2.3 now."),
            ["See example.com and v1.2.3 now."]
        );
        assert_eq!(sents("end.Next one"), ["end.Next one"]);
        assert_eq!(sents("Why?Because."), ["Why?Because."]);
    }

    #[test]
    fn urls_and_numbers_at_sentence_end() {
        assert_eq!(
            sents("Pi is 3.14. See example.com for more. Version v1.2.3 is out."),
            [
                "Pi is 3.14.",
                "See example.com for more.",
                "Version v1.2.3 is out."
            ]
        );
        assert_eq!(sents("Mail a@b.org. Thanks."), ["Mail a@b.org.", "Thanks."]);
        assert_eq!(
            sents("It was 1999. 2000 was better."),
            ["It was 1999.", "2000 was better."]
        );
        assert_eq!(
            sents("We counted to 3. Then we stopped."),
            ["We counted to 3.", "Then we stopped."]
        );
    }

    #[test]
    fn closers_stay_with_the_sentence() {
        assert_eq!(
            sents(r#"He said "Stop." Then he left."#),
            [r#"He said "Stop.""#, "Then he left."]
        );
        assert_eq!(
            sents("(This is it.) Next one."),
            ["(This is it.)", "Next one."]
        );
        assert_eq!(
            sents("He said “Stop!” Then left."),
            ["He said “Stop!”", "Then left."]
        );
        assert_eq!(
            sents("Er rief „Halt!“ Dann ging er."),
            ["Er rief „Halt!“", "Dann ging er."]
        );
        assert_eq!(
            sents("Er rief »Halt!« Dann ging er."),
            ["Er rief »Halt!«", "Dann ging er."]
        );
        assert_eq!(
            sents("She said 'no.' Then left."),
            ["She said 'no.'", "Then left."]
        );
        // A closer with Mr. inside does not make the prefix rule apply (Moses).
        assert_eq!(sents("(See Mr.) Then go."), ["(See Mr.)", "Then go."]);
    }

    #[test]
    fn spaced_closers_french_typography() {
        assert_eq!(
            sents("Il a dit « bonjour . » Puis il est parti."),
            ["Il a dit « bonjour . »", "Puis il est parti."]
        );
        assert_eq!(
            sents("Bonjour ! Comment allez-vous ?"),
            ["Bonjour !", "Comment allez-vous ?"]
        );
        assert_eq!(sents("« Oui ! » dit-il."), ["« Oui ! » dit-il."]);
        // A French opening guillemet after a sentence is not taken for a closer.
        assert_eq!(
            sents("Il dit. « Bonjour » Fin."),
            ["Il dit.", "« Bonjour » Fin."]
        );
    }

    #[test]
    fn openers_start_sentences() {
        assert_eq!(
            sents(r#"He left. "Who?" she asked."#),
            ["He left.", r#""Who?" she asked."#]
        );
        assert_eq!(sents("¿Qué? ¡Nada! Bien."), ["¿Qué?", "¡Nada!", "Bien."]);
        assert_eq!(sents("He left. (See below.)"), ["He left.", "(See below.)"]);
        assert_eq!(
            sents("He left. ( See below.)"),
            ["He left.", "( See below.)"]
        );
        assert_eq!(
            sents("Se fue. —¿Qué? Nada."),
            ["Se fue.", "—¿Qué?", "Nada."]
        );
        assert_eq!(
            sents("Er ging. »Hallo«, sagte sie."),
            ["Er ging.", "»Hallo«, sagte sie."]
        );
        // An opener followed by lowercase does not start a sentence.
        assert_eq!(sents("He left. (see below)"), ["He left. (see below)"]);
        assert_eq!(sents(r#"He left. "...yes""#), [r#"He left. "...yes""#]);
    }

    #[test]
    fn other_starts_do_not_split() {
        assert_eq!(sents("Wow. 😀 Nice."), ["Wow. 😀 Nice."]);
        assert_eq!(sents("Done. - item"), ["Done. - item"]);
        assert_eq!(sents("Done. @user hi"), ["Done. @user hi"]);
    }

    #[test]
    fn titlecase_and_caseless_scripts_start_sentences() {
        assert_eq!(sents("One. ǅemal came."), ["One.", "ǅemal came."]);
        assert_eq!(
            sents("مرحبا. كيف حالك؟ أنا بخير."),
            ["مرحبا.", "كيف حالك؟", "أنا بخير."]
        );
        assert_eq!(sents("שלום. מה שלומך?"), ["שלום.", "מה שלומך?"]);
        assert_eq!(
            sents("नमस्ते। आप कैसे हैं? ठीक॥ हाँ।"),
            ["नमस्ते।", "आप कैसे हैं?", "ठीक॥", "हाँ।"]
        );
        assert_eq!(sents("گھر۔ اچھا"), ["گھر۔", "اچھا"]);
        assert_eq!(sents("გამარჯობა. როგორ ხარ?"), ["გამარჯობა.", "როგორ ხარ?"]);
        assert_eq!(sents("สวัสดี. ครับ"), ["สวัสดี.", "ครับ"]);
        assert_eq!(
            sents("Привет. Как дела? хорошо."),
            ["Привет.", "Как дела? хорошо."]
        );
        assert_eq!(sents("Γεια. Τι κάνεις;"), ["Γεια.", "Τι κάνεις;"]);
        assert_eq!(sents("Hello. 你好。"), ["Hello.", "你好。"]);
    }

    // ---- CJK ----

    #[test]
    fn chinese_without_spaces() {
        assert_eq!(
            sents("耶稣哭了。他说：“你们来看。”众人都走了。"),
            ["耶稣哭了。", "他说：“你们来看。”", "众人都走了。"]
        );
        assert_eq!(
            sents("“什么？！”他问道。好！"),
            ["“什么？！”", "他问道。", "好！"]
        );
        assert_eq!(sents("你好。 我很好。"), ["你好。", "我很好。"]);
        assert_eq!(sents("好。。。走吧"), ["好。。。", "走吧"]);
        assert_eq!(sents("他走了。（真的）"), ["他走了。", "（真的）"]);
    }

    #[test]
    fn japanese() {
        assert_eq!(
            sents("今日は晴れです。明日は雨です。"),
            ["今日は晴れです。", "明日は雨です。"]
        );
        assert_eq!(
            sents("「はい。」と言った。それで？"),
            ["「はい。」と言った。", "それで？"]
        );
        assert_eq!(sents("「本当？」って聞いた。"), ["「本当？」って聞いた。"]);
        assert_eq!(
            sents("「はい。」『いいえ。』"),
            ["「はい。」", "『いいえ。』"]
        );
        assert_eq!(sents("ﾊｲ｡ｲｲｴ｡"), ["ﾊｲ｡", "ｲｲｴ｡"]);
    }

    #[test]
    fn ascii_double_quotes_in_cjk_follow_parity() {
        assert_eq!(
            sents(r#"他说："你们来看。"众人都走了。"#),
            [r#"他说："你们来看。""#, "众人都走了。"]
        );
        assert_eq!(
            sents(r#"他走了。"你好"她说。"#),
            ["他走了。", r#""你好"她说。"#]
        );
    }

    #[test]
    fn fullwidth_and_ascii_periods_between_cjk() {
        assert_eq!(
            sents("这是第一句．这是第二句．"),
            ["这是第一句．", "这是第二句．"]
        );
        assert_eq!(sents("版本１．５很好"), ["版本１．５很好"]);
        assert_eq!(sents("你好!我很好."), ["你好!", "我很好."]);
        assert_eq!(sents("他想了想……然后说。"), ["他想了想……然后说。"]);
        assert_eq!(sents("他想了想...然后说。"), ["他想了想...然后说。"]);
        assert_eq!(sents("中文. English here."), ["中文.", "English here."]);
    }

    #[test]
    fn cjk_terminals_before_latin() {
        assert_eq!(
            sents("我爱北京。I love Beijing. Это Москва."),
            ["我爱北京。", "I love Beijing.", "Это Москва."]
        );
        assert_eq!(sents("什么？ ok"), ["什么？", "ok"]);
    }

    // ---- abbreviations ----

    #[test]
    fn titles_do_not_split() {
        assert_eq!(
            sents("Mr. Smith went to Washington. He met Dr. Jones and Mrs. Brown."),
            [
                "Mr. Smith went to Washington.",
                "He met Dr. Jones and Mrs. Brown."
            ]
        );
        assert_eq!(
            sents("Prof. Müller und Hr. Meier kamen."),
            ["Prof. Müller und Hr. Meier kamen."]
        );
        assert_eq!(
            sents("La Sra. García y el Sr. Pérez."),
            ["La Sra. García y el Sr. Pérez."]
        );
        assert_eq!(sents("Mme. Dupont est là."), ["Mme. Dupont est là."]);
        assert_eq!(
            sents("We climbed Mt. Everest near St. Moritz."),
            ["We climbed Mt. Everest near St. Moritz."]
        );
        assert_eq!(sents("(Mr. Smith) came."), ["(Mr. Smith) came."]);
    }

    #[test]
    fn prefixes_are_case_sensitive() {
        // "MR" and "mr" are not listed ("Mr" is).
        assert_eq!(sents("Ask mr. Smith."), ["Ask mr.", "Smith."]);
    }

    #[test]
    fn initials_do_not_split() {
        assert_eq!(
            sents("J. R. R. Tolkien wrote it."),
            ["J. R. R. Tolkien wrote it."]
        );
        assert_eq!(sents("See p. 5 here."), ["See p. 5 here."]);
    }

    #[test]
    fn dotted_acronyms() {
        assert_eq!(sents("The U.S. Army came."), ["The U.S. Army came."]);
        assert_eq!(
            sents("She has a Ph.D. She is smart."),
            ["She has a Ph.D. She is smart."]
        );
        assert_eq!(sents("Das ist z.B. Berlin."), ["Das ist z.B. Berlin."]);
        assert_eq!(sents("Das ist d.h. Berlin."), ["Das ist d.h. Berlin."]);
        // Lowercase dotted words often end sentences (Moses' p.m. remark).
        assert_eq!(
            sents("Come at 5 p.m. Then eat."),
            ["Come at 5 p.m.", "Then eat."]
        );
    }

    #[test]
    fn latin_abbreviations() {
        assert_eq!(
            sents("Cities, e.g. Paris, are busy."),
            ["Cities, e.g. Paris, are busy."]
        );
        assert_eq!(sents("That is, i.e. The end."), ["That is, i.e. The end."]);
        assert_eq!(
            sents("It was approx. 5 km. Then rest."),
            ["It was approx. 5 km.", "Then rest."]
        );
        assert_eq!(
            sents("Smith et al. (2020) say so."),
            ["Smith et al. (2020) say so."]
        );
        assert_eq!(
            sents("Ali vs. Frazier, cf. Table 2."),
            ["Ali vs. Frazier, cf. Table 2."]
        );
        assert_eq!(
            sents("Meet on Jan. 5 or Sept. 9."),
            ["Meet on Jan. 5 or Sept. 9."]
        );
    }

    #[test]
    fn etc_breaks_before_capitals_only() {
        assert_eq!(
            sents("We bought apples, pears, etc. Then we left."),
            ["We bought apples, pears, etc.", "Then we left."]
        );
        assert_eq!(
            sents("Apples, pears, etc. and more."),
            ["Apples, pears, etc. and more."]
        );
    }

    #[test]
    fn numeric_only_prefixes() {
        assert_eq!(
            sents("It is No. 1 in the charts."),
            ["It is No. 1 in the charts."]
        );
        assert_eq!(
            sents("I said No. Then I left."),
            ["I said No.", "Then I left."]
        );
        assert_eq!(
            sents("See Fig. 3 for details."),
            ["See Fig. 3 for details."]
        );
        assert_eq!(
            sents("I ate a fig. Then I slept."),
            ["I ate a fig.", "Then I slept."]
        );
        assert_eq!(
            sents("Read pp. 10-12 and Art. 5 now."),
            ["Read pp. 10-12 and Art. 5 now."]
        );
        // Moses wants the digit right away, not after an opener.
        assert_eq!(sents("He said no. (2) Yes."), ["He said no.", "(2) Yes."]);
    }

    #[test]
    fn list_labels_open_sentences() {
        assert_eq!(sents("1. Introduction"), ["1. Introduction"]);
        assert_eq!(sents("IV. Results are good."), ["IV. Results are good."]);
        assert_eq!(sents("Done. 2. Methods"), ["Done.", "2. Methods"]);
        assert_eq!(sents("(1. Intro)"), ["(1. Intro)"]);
    }

    #[test]
    fn punctuation_only_start_is_not_a_sentence() {
        assert_eq!(sents("... Then he left."), ["... Then he left."]);
        assert_eq!(sents("?! What. Now."), ["?! What.", "Now."]);
        assert_eq!(sents("。。你好。"), ["。。你好。"]);
    }

    // ---- whitespace, line breaks, modes ----

    #[test]
    fn ranges_are_trimmed() {
        let text = "  Hello.   World.  ";
        assert_eq!(spans(text, SplitMode::Sentences), [(2, 8), (11, 17)]);
        assert_eq!(spans(text, SplitMode::Lines), [(2, 17)]);
        assert_eq!(spans(text, SplitMode::Whole), [(2, 17)]);
        assert_eq!(sents("\u{3000}你好。\u{a0}"), ["你好。"]);
        assert_eq!(sents("Hello.\u{a0}World.\u{2003}"), ["Hello.", "World."]);
        assert_eq!(sents("\tTab.\x0bVertical."), ["Tab.", "Vertical."]);
    }

    #[test]
    fn line_breaks_always_end_sentences() {
        assert_eq!(sents("Hello\nworld"), ["Hello", "world"]);
        assert_eq!(sents("Mr.\nSmith"), ["Mr.", "Smith"]);
        for br in ["\n", "\r\n", "\r", "\u{2028}", "\u{2029}", "\u{85}"] {
            let text = format!("One two{br}three. Four{br}");
            assert_eq!(sents(&text), ["One two", "three.", "Four"], "{br:?}");
            assert_eq!(
                units(&text, SplitMode::Lines),
                ["One two", "three. Four"],
                "{br:?}"
            );
            assert_eq!(
                units(&text, SplitMode::Whole),
                [format!("One two{br}three. Four")],
                "{br:?}"
            );
        }
    }

    #[test]
    fn crlf_and_blank_lines_are_gaps() {
        let text = "One.\r\nTwo. Three.\r\n\r\n  \r\nFour";
        assert_eq!(
            spans(text, SplitMode::Sentences),
            [(0, 4), (6, 10), (11, 17), (25, 29)]
        );
        assert_eq!(&text[4..6], "\r\n");
        assert_eq!(&text[17..25], "\r\n\r\n  \r\n");
        assert_eq!(spans(text, SplitMode::Lines), [(0, 4), (6, 17), (25, 29)]);
        assert_eq!(spans(text, SplitMode::Whole), [(0, 29)]);
    }

    #[test]
    fn lines_mode() {
        assert_eq!(
            units("a. B. c\n\n  d  \r\ne", SplitMode::Lines),
            ["a. B. c", "d", "e"]
        );
        assert_eq!(
            units("你好。我很好。", SplitMode::Lines),
            ["你好。我很好。"]
        );
    }

    #[test]
    fn whole_mode() {
        assert_eq!(units("  a. B.\n\nc  ", SplitMode::Whole), ["a. B.\n\nc"]);
    }

    #[test]
    fn empty_and_blank_inputs_give_no_units() {
        for mode in [SplitMode::Sentences, SplitMode::Lines, SplitMode::Whole] {
            for text in [
                "",
                " ",
                "\n",
                "\r\n\r\n",
                " \t\u{3000}\u{a0}\u{2028}\u{85} ",
            ] {
                assert!(split(text, mode).is_empty(), "{mode:?} {text:?}");
            }
        }
    }

    #[test]
    fn odd_characters_stay_inside() {
        assert_eq!(sents("\u{0}\u{1}. Ab\u{7f}."), ["\u{0}\u{1}. Ab\u{7f}."]);
        assert_eq!(sents("\u{301}a. \u{301}B."), ["\u{301}a. \u{301}B."]);
        assert_eq!(sents("Cafe\u{301}. Bon."), ["Cafe\u{301}.", "Bon."]);
        assert_eq!(
            sents("\u{202e}abc. Def.\u{200b}"),
            ["\u{202e}abc.", "Def."] // Zero-width characters at the ends are blanks.
        );
        assert_eq!(sents("👍🏽 Great! 🎉 Yes."), ["👍🏽 Great! 🎉 Yes."]);
        assert_eq!(sents("Great! 👍 Yes."), ["Great! 👍 Yes."]);
    }

    // ---- invariants ----

    /// Checks the documented guarantees of `split(text, mode)`.
    fn check_invariants(text: &str, mode: SplitMode) {
        let ranges = split(text, mode);
        let mut rebuilt = String::with_capacity(text.len());
        let mut prev_end = 0;
        for r in &ranges {
            assert!(r.start < r.end, "empty range {r:?} in {text:?}");
            assert!(prev_end <= r.start, "overlap at {r:?} in {text:?}");
            assert!(
                text.is_char_boundary(r.start) && text.is_char_boundary(r.end),
                "{text:?}"
            );
            let unit = &text[r.clone()];
            let gap = &text[prev_end..r.start];
            assert!(
                gap.chars().all(is_blank_char),
                "text in gap {gap:?} of {text:?}"
            );
            assert!(!unit.starts_with(is_blank_char), "untrimmed {unit:?}");
            assert!(!unit.ends_with(is_blank_char), "untrimmed {unit:?}");
            if mode != SplitMode::Whole {
                assert!(!unit.contains(is_line_break), "line break in {unit:?}");
            }
            rebuilt.push_str(gap);
            rebuilt.push_str(unit);
            prev_end = r.end;
        }
        let tail = &text[prev_end..];
        assert!(
            tail.chars().all(is_blank_char),
            "text in tail {tail:?} of {text:?}"
        );
        rebuilt.push_str(tail);
        assert_eq!(rebuilt, text);
    }

    /// Sentences refine lines, lines are the trimmed non-blank lines, Whole is the trimmed text.
    fn check_modes_agree(text: &str) {
        let lines = split(text, SplitMode::Lines);
        for s in split(text, SplitMode::Sentences) {
            assert!(
                lines.iter().any(|l| l.start <= s.start && s.end <= l.end),
                "{s:?} in {text:?}"
            );
        }
        let expected: Vec<&str> = text
            .split(is_line_break)
            .map(|l| l.trim_matches(is_blank_char))
            .filter(|l| !l.is_empty())
            .collect();
        assert_eq!(units(text, SplitMode::Lines), expected);
        let trimmed = text.trim_matches(is_blank_char);
        let whole = units(text, SplitMode::Whole);
        assert_eq!(
            whole,
            if trimmed.is_empty() {
                vec![]
            } else {
                vec![trimmed]
            }
        );
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

    const POOL: &[&str] = &[
        "a",
        "Z",
        "x",
        "É",
        "ß",
        "İ",
        "ǅ",
        "ა",
        "ا",
        "ש",
        "中",
        "文",
        "と",
        "ア",
        "한",
        "ก",
        "म",
        "1",
        "０",
        "５",
        " ",
        " ",
        " ",
        "\t",
        "\u{3000}",
        "\u{a0}",
        "\u{2003}",
        "\n",
        "\r",
        "\r\n",
        "\u{2028}",
        "\u{2029}",
        "\u{85}",
        "\x0b",
        ".",
        ".",
        "!",
        "?",
        "…",
        "‼",
        "。",
        "！",
        "？",
        "｡",
        "．",
        "؟",
        "।",
        "॥",
        "\"",
        "'",
        "“",
        "”",
        "‘",
        "’",
        "«",
        "»",
        "„",
        "(",
        ")",
        "[",
        "」",
        "「",
        "』",
        "）",
        "（",
        "¿",
        "¡",
        "—",
        "-",
        "\u{0}",
        "\u{7f}",
        "\u{301}",
        "\u{200b}",
        "\u{202e}",
        "\u{feff}",
        "😀",
        "👍🏽",
        "\u{10ffff}",
        "Mr",
        "e.g",
        "U.S",
        "No",
        "fig",
        "etc",
        "3",
        "IV",
        "Hello",
        "world",
        "http://a.b",
    ];

    #[test]
    fn invariants_hold_on_random_strings() {
        let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
        let mut text = String::new();
        for _ in 0..4000 {
            text.clear();
            for _ in 0..rng.below(40) {
                text.push_str(POOL[rng.below(POOL.len())]);
            }
            for mode in [SplitMode::Sentences, SplitMode::Lines, SplitMode::Whole] {
                check_invariants(&text, mode);
            }
            check_modes_agree(&text);
        }
    }

    #[test]
    fn invariants_hold_on_examples() {
        for text in [
            "耶稣哭了。他说：“你们来看。”众人都走了。",
            "  Mr. Smith.\r\n\r\nHe said \"Hi.\" Then... Left! ",
            "。」」」。。！？",
            "\"\"\"。\"\"。\"",
            ". . . A. B.",
        ] {
            for mode in [SplitMode::Sentences, SplitMode::Lines, SplitMode::Whole] {
                check_invariants(text, mode);
            }
            check_modes_agree(text);
        }
    }

    // ---- size ----

    fn assert_fast(text: &str, limit: Duration) -> usize {
        let started = Instant::now();
        let n = split(text, SplitMode::Sentences).len();
        assert!(
            started.elapsed() < limit,
            "{:?} for {} bytes",
            started.elapsed(),
            text.len()
        );
        n
    }

    #[test]
    fn big_inputs_are_linear() {
        let limit = Duration::from_secs(5);
        let block =
            "Mr. Smith went to the U.S. in Jan. 2020. He said: \"Hi!\" Then... 你好。我很好！\n";
        let text = block.repeat(5_000_000 / block.len());
        let n = assert_fast(&text, limit);
        assert_eq!(n, text.len() / block.len() * 5);
        check_invariants(&text, SplitMode::Sentences);
        // One 5 MB line without a split, and long runs of punctuation or openers.
        assert_eq!(assert_fast(&"and. ".repeat(1_000_000), limit), 1);
        assert_eq!(assert_fast(&"a.".repeat(2_500_000), limit), 1);
        assert_eq!(
            assert_fast(&format!("A{}", ".".repeat(5_000_000)), limit),
            1
        );
        assert_eq!(
            assert_fast(&format!("A. {}a", "( ".repeat(2_500_000)), limit),
            1
        );
        assert_eq!(
            assert_fast(&format!("A.{} B", ")".repeat(5_000_000)), limit),
            2
        );
        assert_eq!(assert_fast(&"x. ".repeat(1_700_000), limit), 1);
        assert_eq!(assert_fast(&"好。".repeat(900_000), limit), 900_000);
        assert_eq!(split(&" ".repeat(5_000_000), SplitMode::Sentences).len(), 0);
    }
}
