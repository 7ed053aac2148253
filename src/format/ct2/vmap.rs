//! Vocabulary maps (`vmap.txt` in a CTranslate2 model directory): source n-grams mapped to
//! the target tokens a translation may use. With the translate option `use_vmap`, the
//! output layer of a batch is restricted to the candidates of its sources.
//!
//! Semantics, as CTranslate2 4.x has them (`VocabularyMap` in `src/vocabulary_map.cc`,
//! loaded by `SequenceToSequenceModel::load_vocabularies`, applied in
//! `EncoderDecoderReplica::run_translation` through `Decoder::update_output_layer`):
//!
//! - The file is `vmap.txt`, read whenever it exists (`use_vmap` only decides whether it
//!   is used). `use_vmap` with a model that has none translates over the whole vocabulary,
//!   without an error.
//! - Lines end at `\n`; one trailing `\r` is dropped; a last line without `\n` counts, the
//!   empty piece after a final `\n` does not. Lines are bytes: nothing needs to be UTF-8.
//! - A line is `n-gram TAB target tokens`: the n-gram's tokens are separated by single
//!   spaces, its size n is 1 + the number of spaces before the tab; the targets are
//!   separated by spaces. Rules are kept per n, so an n-gram only matches n consecutive
//!   source tokens joined with spaces. A later line with the same n-gram replaces the
//!   earlier one (its targets are not merged).
//! - Target tokens are looked up in the target vocabulary; an unknown one (an empty one
//!   between two spaces too) becomes `<unk>`, which is a candidate anyway: unknown target
//!   tokens change nothing.
//! - The 1-gram rule of the empty n-gram (a line starting with a tab) lists tokens that are
//!   always candidates. So does an empty line (with no targets: it clears that list) and a
//!   line without a tab: its whole text is one target token of the empty 1-gram (spaces
//!   included, which make it an unknown token; n grows by its spaces, which matters to no
//!   source). With more than one tab, each further tab ends the rule's n-gram again: the
//!   n-gram becomes the target piece read since the last space or tab, and the previous
//!   n-gram text is glued to the front of the next piece. (CTranslate2 reads such lines
//!   this way; nobody writes them, but they load the same in Tolk.)
//! - Always candidates: the unknown, begin and end tokens of the model's config (each
//!   `<unk>` when not in the vocabulary) and the empty n-gram's tokens.
//! - Per batch, the candidates are those, the targets of every n-gram (n from 1 to the
//!   largest n in the file) at every position of every source of the batch, and the
//!   decoder start token and target prefix of every example. Sources are the tokens as
//!   given, before `max_input_length` and without the special tokens the model adds. A
//!   custom `end_token` is not added: outside the candidates it can never be produced.
//!   The result is sorted and unique.
//! - CTranslate2 on a GPU pads the candidate count to a multiple of 8 (float16/bfloat16)
//!   or 16 (int8) with id 0 and a bias of -1e10, so the padding never wins and adds
//!   nothing to the softmax; on the CPU the multiple is 1. Tolk never pads: same tokens.
//! - An empty `vmap.txt` crashes CTranslate2's loader (it indexes an empty table); Tolk
//!   reads it as a map with no rules (only the special tokens are candidates).
//! - The batches (which sources share candidates) are cut after sorting by length with
//!   the unstable `std::sort`; Tolk orders ties as libstdc++ does (`translator/stdsort.rs`).
//! - CTranslate2 (4.8) keeps the id -> column map of a translator's earlier restricted
//!   batches (`update_output_layer` adds to it and clears it only when going back to the
//!   whole vocabulary): in a later batch the start, end, prefix and disabled ids can
//!   resolve to stale columns, giving other tokens or an exception. Tolk maps each batch
//!   afresh, which is what CTranslate2 does on a new translator, and always when those ids
//!   keep their columns (special tokens the lowest ids, no target prefix or custom end
//!   token: converted OPUS-MT and OpenNMT models).
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use crate::error::Result;
use crate::format::ct2::Vocabulary;
use crate::format::files::PackageFiles;

/// The file name CTranslate2 reads in a model directory.
pub const FILE_NAME: &str = "vmap.txt";

#[derive(Debug, Clone, Default)]
pub struct VocabularyMap {
    /// Target ids that are always candidates, sorted and unique.
    fixed: Vec<u32>,
    /// The rules by n: n-gram (tokens joined by spaces, as bytes) to target ids. (A map of
    /// the sizes present: a line with a million spaces makes one level, not a million.)
    rules: BTreeMap<usize, HashMap<Vec<u8>, Vec<u32>>>,
}

impl VocabularyMap {
    /// Reads `dir/vmap.txt`; `Ok(None)` when the directory has none.
    pub fn load(files: &PackageFiles, dir: &Path, vocabulary: &Vocabulary, special: [&str; 3]) -> Result<Option<VocabularyMap>> {
        let path = dir.join(FILE_NAME);
        if !files.is_file(&path) {
            return Ok(None);
        }
        Ok(Some(VocabularyMap::parse(&files.read(&path)?, vocabulary, special)))
    }

    /// Parses the contents of a `vmap.txt`. Every input gives a map (see the module
    /// documentation for malformed lines). `special`: the unknown, begin and end tokens.
    pub fn parse(text: &[u8], vocabulary: &Vocabulary, special: [&str; 3]) -> VocabularyMap {
        let id = |token: &[u8]| std::str::from_utf8(token).ok().map_or(vocabulary.unk_id(), |t| vocabulary.id_or_unk(t));
        let mut rules: BTreeMap<usize, HashMap<Vec<u8>, Vec<u32>>> = BTreeMap::new();
        let mut lines: Vec<&[u8]> = text.split(|&b| b == b'\n').collect();
        if lines.last().is_some_and(|l| l.is_empty()) {
            lines.pop();
        }
        for line in lines {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let (n, key, targets) = parse_line(line, id);
            rules.entry(n).or_default().insert(key, targets);
        }
        let mut fixed: Vec<u32> = special.iter().map(|t| vocabulary.id_or_unk(t)).collect();
        if let Some(always) = rules.get_mut(&1).and_then(|r| r.remove(b"".as_slice())) {
            fixed.extend(always);
        }
        fixed.sort_unstable();
        fixed.dedup();
        VocabularyMap { fixed, rules }
    }

    /// The largest n-gram size of the rules (0 without rules).
    pub fn max_ngram(&self) -> usize {
        self.rules.keys().next_back().copied().unwrap_or(0)
    }

    /// The number of rules.
    pub fn len(&self) -> usize {
        self.rules.values().map(HashMap::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The target ids that are candidates whatever the source (sorted).
    pub fn fixed(&self) -> &[u32] {
        &self.fixed
    }

    /// The output vocabulary of a batch: sorted, unique target ids. `targets`: the decoder
    /// start tokens and target prefixes of the examples, as target ids.
    pub fn candidates<S: AsRef<[String]>>(&self, sources: &[S], targets: impl IntoIterator<Item = u32>) -> Vec<u32> {
        let mut ids = self.fixed.clone();
        let mut ngram = Vec::new();
        for source in sources {
            let source = source.as_ref();
            for start in 0..source.len() {
                ngram.clear();
                for (i, token) in source[start..].iter().take(self.max_ngram()).enumerate() {
                    if i > 0 {
                        ngram.push(b' ');
                    }
                    ngram.extend_from_slice(token.as_bytes());
                    if let Some(found) = self.rules.get(&(i + 1)).and_then(|level| level.get(ngram.as_slice())) {
                        ids.extend_from_slice(found);
                    }
                }
            }
        }
        ids.extend(targets);
        ids.sort_unstable();
        ids.dedup();
        ids
    }
}

/// One line (without its end): n-gram size, n-gram and target ids.
fn parse_line(line: &[u8], id: impl Fn(&[u8]) -> u32) -> (usize, Vec<u8>, Vec<u32>) {
    let mut segments = line.split(|&b| b == b'\t');
    let first = segments.next().unwrap_or_default();
    let n = 1 + first.iter().filter(|&&b| b == b' ').count();
    let mut segments = segments.peekable();
    if segments.peek().is_none() {
        // No tab: the empty n-gram, the whole line one target token.
        let targets = if first.is_empty() { Vec::new() } else { vec![id(first)] };
        return (n, Vec::new(), targets);
    }
    let mut key = first.to_vec();
    let mut targets = Vec::new();
    // What a further tab hands over to the next segment (the previous n-gram).
    let mut carry: Vec<u8> = Vec::new();
    while let Some(segment) = segments.next() {
        let mut text = std::mem::take(&mut carry);
        text.extend_from_slice(segment);
        let mut pieces: Vec<&[u8]> = text.split(|&b| b == b' ').collect();
        let last = pieces.pop().unwrap_or_default();
        targets.extend(pieces.into_iter().map(&id));
        if segments.peek().is_some() {
            carry = std::mem::replace(&mut key, last.to_vec());
        } else if !last.is_empty() {
            targets.push(id(last));
        }
    }
    (n, key, targets)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPECIAL: [&str; 3] = ["<unk>", "<s>", "</s>"];

    fn vocab() -> Vocabulary {
        let tokens = ["<unk>", "<s>", "</s>", "a", "b", "c", "d", "e", "x y", "kw"];
        Vocabulary::new(tokens.iter().map(|t| t.to_string()).collect(), "<unk>").unwrap()
    }

    fn toks(s: &str) -> Vec<String> {
        s.split(' ').map(str::to_string).collect()
    }

    fn cands(map: &VocabularyMap, sources: &[&str], targets: &[&[u32]]) -> Vec<u32> {
        let sources: Vec<Vec<String>> = sources.iter().map(|s| toks(s)).collect();
        map.candidates(&sources, targets.iter().flat_map(|t| t.iter().copied()))
    }

    #[test]
    fn ngrams_of_every_size_match_consecutive_source_tokens() {
        let v = vocab();
        let map = VocabularyMap::parse(b"\td\nsrc1\ta\nsrc1 src2\tb c\nsrc2 src3 src4\te\n", &v, SPECIAL);
        assert_eq!(map.max_ngram(), 3);
        assert_eq!(map.len(), 3);
        assert_eq!(map.fixed(), &[0, 1, 2, 6]);
        assert_eq!(cands(&map, &["zz"], &[]), vec![0, 1, 2, 6]);
        assert_eq!(cands(&map, &["src1"], &[]), vec![0, 1, 2, 3, 6]);
        assert_eq!(cands(&map, &["src1 src2"], &[]), vec![0, 1, 2, 3, 4, 5, 6]);
        assert_eq!(cands(&map, &["src2 src3"], &[]), vec![0, 1, 2, 6], "a 3-gram needs 3 tokens");
        // The union over the batch, plus the start token and prefix ids.
        assert_eq!(cands(&map, &["q src2 src3 src4", "src1"], &[&[9], &[1, 8]]), vec![0, 1, 2, 3, 6, 7, 8, 9]);
    }

    #[test]
    fn a_later_rule_replaces_an_earlier_one() {
        let v = vocab();
        let map = VocabularyMap::parse(b"s\ta b\ns\tc\n\ta\n\td", &v, SPECIAL);
        assert_eq!(cands(&map, &["s"], &[]), vec![0, 1, 2, 5, 6]);
    }

    #[test]
    fn unknown_targets_are_unk_and_special_tokens_may_be_missing() {
        let v = vocab();
        let map = VocabularyMap::parse("s\tnope a  b \u{fffd}\n".as_bytes(), &v, ["<unk>", "<bos>", "</eos>"]);
        assert_eq!(map.fixed(), &[0]);
        assert_eq!(cands(&map, &["s"], &[]), vec![0, 3, 4]);
    }

    #[test]
    fn line_ends_carriage_returns_and_empty_lines() {
        let v = vocab();
        // CRLF; the empty line clears the always-candidates of the first line.
        let map = VocabularyMap::parse(b"\ta\r\ns\tb\r\n\r\n", &v, SPECIAL);
        assert_eq!(map.fixed(), &[0, 1, 2]);
        assert_eq!(cands(&map, &["s"], &[]), vec![0, 1, 2, 4]);
        // Only one \r is dropped: "b\r" is unknown.
        let map = VocabularyMap::parse(b"s\tb\r\r\n", &v, SPECIAL);
        assert_eq!(cands(&map, &["s"], &[]), vec![0, 1, 2]);
        // A line without a tab is one always-candidate token (spaces included).
        let map = VocabularyMap::parse(b"\ta b\ne", &v, SPECIAL);
        assert_eq!(map.fixed(), &[0, 1, 2, 7]);
        let map = VocabularyMap::parse(b"\ta\nx y", &v, SPECIAL);
        assert_eq!(map.fixed(), &[0, 1, 2, 3], "\"x y\": a 2-gram rule of the empty n-gram, never matched");
        assert_eq!(map.max_ngram(), 2);
    }

    #[test]
    fn several_tabs_read_as_ctranslate2_reads_them() {
        let v = vocab();
        // "k\ta b\tw c": the n-gram becomes "b", the old n-gram "k" is glued to "w".
        let map = VocabularyMap::parse(b"k\ta b\tw c\n", &v, SPECIAL);
        assert_eq!(cands(&map, &["k"], &[]), vec![0, 1, 2]);
        assert_eq!(cands(&map, &["b"], &[]), vec![0, 1, 2, 3, 5, 9]);
        let map = VocabularyMap::parse(b"k\ta\t\n", &v, SPECIAL);
        assert_eq!(cands(&map, &["a"], &[]), vec![0, 1, 2], "the carried \"k\" alone: an unknown target");
        let map = VocabularyMap::parse(b"k\ta\tw", &v, SPECIAL);
        assert_eq!(cands(&map, &["a"], &[]), vec![0, 1, 2, 9], "\"k\" glued to \"w\"");
    }

    #[test]
    fn empty_files_bytes_and_huge_lines_never_fail() {
        let v = vocab();
        for text in [&b""[..], b"\n", b"\n\n\n", b"\t", b"\t\t\t", b"   ", b"\xff\xfe\tb\n\xc3\tc", b"\r"] {
            let map = VocabularyMap::parse(text, &v, SPECIAL);
            let _ = cands(&map, &["\u{fffd}\u{fffd}", ""], &[]);
        }
        // Invalid UTF-8 n-grams never match; invalid targets are unknown.
        let map = VocabularyMap::parse(b"\xff\ta\ns\t\xffb c\n", &v, SPECIAL);
        assert_eq!(cands(&map, &["\u{fffd}"], &[]), vec![0, 1, 2]);
        assert_eq!(cands(&map, &["s"], &[]), vec![0, 1, 2, 5]);
        let mut huge = b"s\t".to_vec();
        for _ in 0..200_000 {
            huge.extend_from_slice(b"a b c ");
        }
        let map = VocabularyMap::parse(&huge, &v, SPECIAL);
        assert_eq!(cands(&map, &["s"], &[]), vec![0, 1, 2, 3, 4, 5]);
        // A 10-million-gram: one level of rules, matched by no source this short.
        let mut wide = vec![b'w'; 1];
        wide.extend(std::iter::repeat_n(b" w", 10_000_000).flatten());
        wide.extend_from_slice(b"\ta\ns\tb\n");
        let map = VocabularyMap::parse(&wide, &v, SPECIAL);
        assert_eq!((map.max_ngram(), map.len()), (10_000_001, 2));
        assert_eq!(cands(&map, &["w w s"], &[]), vec![0, 1, 2, 4]);
    }

    #[test]
    fn source_tokens_with_spaces_only_match_their_own_size() {
        let v = vocab();
        let map = VocabularyMap::parse(b"x y\ta\n", &v, SPECIAL);
        assert_eq!(cands(&map, &["x y"], &[]), vec![0, 1, 2, 3], "two source tokens");
        let sources = vec![vec!["x y".to_string()]];
        assert_eq!(map.candidates(&sources, []), vec![0, 1, 2], "one token with a space is a 1-gram");
    }
}
