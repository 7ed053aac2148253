//! Lexical shortlists (Marian/Bergamot `lex.*.s2t.bin` and text `lex.s2t`): per batch,
//! the target words worth scoring.
//!
//! What Bergamot does, from browsermt/marian-dev `src/data/shortlist.{h,cpp}` and
//! browsermt/bergamot-translator `src/translator/translation_model.cpp` (both at
//! 2781d735 / 9271618e):
//!
//! - Bergamot always uses `BinaryShortlistGenerator`, also for text files (its
//!   `import`), never `LexicalShortlistGenerator`.
//! - Binary layout: six u64 `{magic 0xF11A48D5013417F5, checksum, firstNum, bestNum,
//!   wordToOffsetSize, shortListsSize}`, then `u64 wordToOffset[wordToOffsetSize]`
//!   (source vocabulary size + 1), then `u32 shortLists[shortListsSize]`; word `s`'s
//!   list is `shortLists[wordToOffset[s]..wordToOffset[s+1]]`, sorted. The file size
//!   must be exactly that.
//! - Checksum: `util::hashMem<uint64_t>` (`src/common/hash.h`) over the
//!   `(size - 16) / 8` u64 words from `firstNum` on (a trailing half word is left out):
//!   `seed ^= w + 0x9e3779b9 + (seed << 6) + (seed >> 2)`, wrapping, from 0
//!   (`std::hash<uint64_t>` is the identity).
//! - `check`: Bergamot loads the file into memory and passes `check-bytearray`
//!   (default false), so it verifies neither the checksum nor the bounds. The second
//!   value of `shortlist: [file, false]` in the shipped configs is Marian's `check` for
//!   a file it opens itself (`std::stoi(vals[1])`, which would even throw on "false");
//!   Bergamot ignores it. Here bounds are always checked (a bad offset is an error, not
//!   undefined behaviour) and the checksum on request.
//! - `shared`: Bergamot passes `shared = (source vocab == target vocab)`, comparing the
//!   loaded vocabulary pointers, which are one object when the `vocabs:` paths are
//!   equal: true for en-pt (`vocab.enpt.spm` twice).
//! - `generate`: target ids `0..min(firstNum, V)`; for every source id of the batch
//!   (padding and `</s>` included) the id itself when `shared`, and its list; then,
//!   while the count is not a multiple of 8, the smallest unselected ids from `firstNum`
//!   up (stopping at `V`; intgemm needed multiples of 8); the result sorted.
//! - Text import: whitespace-separated `trg src prob` triples read until one fails to
//!   parse; `NULL` on either side skipped; per (src, trg) the largest prob, where a new
//!   pair starts at 0 (so probabilities <= 0 or NaN count as 0); per source word the
//!   `bestNum` pairs of highest (prob, trg id) kept, then sorted by id. (Marian's
//!   threshold compares the target *id*, not the probability, with `>=`: with the
//!   default 0 it keeps everything, so it is not modelled.) `first`/`best` default to
//!   100, from `shortlist: [lex.s2t, first, best]`.
use std::collections::HashMap;
use std::path::Path;

use crate::error::{Error, Result};
use crate::format::files::PackageFiles;

/// `BINARY_SHORTLIST_MAGIC` in Marian.
pub const MAGIC: u64 = 0xF11A_48D5_0134_17F5;
const HEADER_BYTES: usize = 48;
/// Source ids of a text shortlist above this are refused (a vocabulary never has 16M).
const MAX_TEXT_SOURCE_ID: u32 = 1 << 24;

#[derive(Debug, Clone, PartialEq)]
pub struct Shortlist {
    first: usize,
    best: usize,
    /// Source vocabulary size + 1 entries, non-decreasing, the last = `lists.len()`.
    word_to_offset: Vec<u64>,
    lists: Vec<u32>,
}

/// Marian's `util::hashMem<uint64_t, uint64_t>`.
pub fn checksum(words: impl IntoIterator<Item = u64>) -> u64 {
    words
        .into_iter()
        .fold(0u64, |seed, w| seed ^ w.wrapping_add(0x9e37_79b9).wrapping_add(seed << 6).wrapping_add(seed >> 2))
}

fn bad(what: impl std::fmt::Display) -> Error {
    Error::invalid_model(format!("shortlist: {what}"))
}

fn u64_words(bytes: &[u8]) -> impl Iterator<Item = u64> + '_ {
    bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
}

impl Shortlist {
    /// A binary shortlist (told apart by its magic, as Marian does) or a text one whose
    /// words are looked up in the vocabularies (return the unknown id for unknown words
    /// to match Marian, whose vocabularies do; `None` drops the pair). A binary file's
    /// checksum is verified; `first`/`best` only apply to text files (a binary file
    /// carries its own).
    pub fn open(
        path: &Path,
        first: Option<usize>,
        best: Option<usize>,
        source_vocabulary: &dyn Fn(&str) -> Option<u32>,
        target_vocabulary: &dyn Fn(&str) -> Option<u32>,
    ) -> Result<Shortlist> {
        Self::open_in(&PackageFiles::Disk, path, first, best, source_vocabulary, target_vocabulary)
    }

    /// [`Shortlist::open`] for a file of `files` (on disk or in memory).
    pub fn open_in(
        files: &PackageFiles,
        path: &Path,
        first: Option<usize>,
        best: Option<usize>,
        source_vocabulary: &dyn Fn(&str) -> Option<u32>,
        target_vocabulary: &dyn Fn(&str) -> Option<u32>,
    ) -> Result<Shortlist> {
        let bytes = files.read(path)?;
        let at = |e: Error| Error::new(e.kind, format!("{}: {}", path.display(), e.message));
        // A `.bin` is binary whatever it holds (as text, an empty or foreign one was an
        // empty shortlist): its header check says what is wrong.
        if bytes.get(..8) == Some(&MAGIC.to_le_bytes()[..]) || path.extension().is_some_and(|e| e == "bin") {
            return Self::from_binary_bytes(&bytes, true).map_err(at);
        }
        let text = std::str::from_utf8(&bytes).map_err(|_| at(bad("neither binary nor UTF-8 text")))?;
        Self::from_text(text, first, best, source_vocabulary, target_vocabulary).map_err(at)
    }

    /// A binary shortlist; `verify_checksum` as Marian's `check` (Bergamot: false).
    /// Offsets are always checked; target ids are checked against the vocabulary by
    /// [`Shortlist::generate`] and [`Shortlist::check_target_vocabulary`].
    pub fn from_binary_bytes(bytes: &[u8], verify_checksum: bool) -> Result<Shortlist> {
        if bytes.len() < HEADER_BYTES {
            return Err(bad(format!("{} bytes are too short for the header", bytes.len())));
        }
        let h: Vec<u64> = u64_words(&bytes[..HEADER_BYTES]).collect();
        if h[0] != MAGIC {
            return Err(bad("bad magic (not a binary shortlist)"));
        }
        let expected = h[4]
            .checked_mul(8)
            .zip(h[5].checked_mul(4))
            .and_then(|(a, b)| a.checked_add(b)?.checked_add(HEADER_BYTES as u64));
        if expected != Some(bytes.len() as u64) {
            return Err(bad(format!(
                "the header claims {} offsets and {} ids, which does not match the file size {}",
                h[4],
                h[5],
                bytes.len()
            )));
        }
        if verify_checksum {
            let actual = checksum(u64_words(&bytes[16..]));
            if actual != h[1] {
                return Err(bad(format!("checksum mismatch ({actual:#x}, header {:#x}): the file is corrupted", h[1])));
            }
        }
        let offsets_end = HEADER_BYTES + h[4] as usize * 8; // fits: checked with the size
        let word_to_offset: Vec<u64> = u64_words(&bytes[HEADER_BYTES..offsets_end]).collect();
        let lists =
            bytes[offsets_end..].chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes"))).collect();
        let to_usize = |v: u64, what| usize::try_from(v).map_err(|_| bad(format!("{what} {v} is too large")));
        Self::new(to_usize(h[2], "firstNum")?, to_usize(h[3], "bestNum")?, word_to_offset, lists)
    }

    fn new(first: usize, best: usize, word_to_offset: Vec<u64>, lists: Vec<u32>) -> Result<Shortlist> {
        let n = lists.len() as u64;
        if word_to_offset.last() != Some(&n) {
            return Err(bad(format!("the last offset is not the list size {n}")));
        }
        if let Some(i) = word_to_offset.windows(2).position(|w| w[0] > w[1]) {
            return Err(bad(format!("the offsets of source words {i} and {} decrease", i + 1)));
        }
        Ok(Shortlist { first, best, word_to_offset, lists })
    }

    /// A text shortlist (`trg src prob` triples), imported as Bergamot's
    /// `BinaryShortlistGenerator::import` does (see the module comment). Unknown words:
    /// as in [`Shortlist::open`].
    pub fn from_text(
        text: &str,
        first: Option<usize>,
        best: Option<usize>,
        source_id: impl Fn(&str) -> Option<u32>,
        target_id: impl Fn(&str) -> Option<u32>,
    ) -> Result<Shortlist> {
        let (first, best) = (first.unwrap_or(100), best.unwrap_or(100));
        let mut table: HashMap<u32, HashMap<u32, f32>> = HashMap::new();
        let mut words = text.split_ascii_whitespace();
        while let (Some(trg), Some(src), Some(prob)) = (words.next(), words.next(), words.next()) {
            // C++ `>> float` fails on inf/nan spellings; Rust's parse accepts them.
            let letters = prob.bytes().any(|b| matches!(b.to_ascii_lowercase(), b'i' | b'n'));
            let Some(prob) = prob.parse::<f32>().ok().filter(|_| !letters) else { break };
            if src == "NULL" || trg == "NULL" {
                continue;
            }
            let (Some(s), Some(t)) = (source_id(src), target_id(trg)) else { continue };
            if s >= MAX_TEXT_SOURCE_ID {
                return Err(bad(format!("source id {s} of {src:?} is out of range")));
            }
            let p = table.entry(s).or_default().entry(t).or_insert(0.0);
            if *p < prob {
                *p = prob;
            }
        }
        // Nothing read is no shortlist: the output layer would be the `first` words only.
        if table.is_empty() {
            return Err(bad("no `target source probability` line with known words (empty, or not a shortlist)"));
        }
        let sources = table.keys().max().map_or(0, |&m| m as usize + 1);
        let mut word_to_offset = Vec::with_capacity(sources + 1);
        let mut lists = Vec::new();
        for s in 0..sources as u32 {
            word_to_offset.push(lists.len() as u64);
            if let Some(pairs) = table.get(&s) {
                let mut pairs: Vec<(f32, u32)> = pairs.iter().map(|(&t, &p)| (p, t)).collect();
                // Marian's priority_queue<pair<float, WordIndex>>: highest prob, then id.
                pairs.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(b.1.cmp(&a.1)));
                let start = lists.len();
                lists.extend(pairs.iter().take(best).map(|&(_, t)| t));
                lists[start..].sort_unstable();
            }
        }
        word_to_offset.push(lists.len() as u64);
        Self::new(first, best, word_to_offset, lists)
    }

    /// The number of most frequent target words always included.
    pub fn first(&self) -> usize {
        self.first
    }

    /// The most candidates kept per source word.
    pub fn best(&self) -> usize {
        self.best
    }

    /// The number of source words with an entry.
    pub fn source_words(&self) -> usize {
        self.word_to_offset.len().saturating_sub(1)
    }

    /// The candidates of one source word (empty for ids past the table).
    pub fn candidates(&self, source_id: u32) -> &[u32] {
        let s = source_id as usize;
        match (self.word_to_offset.get(s), self.word_to_offset.get(s + 1)) {
            // In range: the offsets were checked to be non-decreasing up to lists.len().
            (Some(&a), Some(&b)) => &self.lists[a as usize..b as usize],
            _ => &[],
        }
    }

    /// Marian's `contentCheck` of target ids: every id below the target vocabulary size.
    pub fn check_target_vocabulary(&self, target_vocabulary_size: usize) -> Result<()> {
        match self.lists.iter().find(|&&t| t as usize >= target_vocabulary_size) {
            Some(t) => Err(bad(format!("target id {t} is outside the {target_vocabulary_size}-word vocabulary"))),
            None => Ok(()),
        }
    }

    /// The sorted, unique target ids to score for a batch whose source ids are
    /// `source_ids` (all sentences, padding included): exactly
    /// `BinaryShortlistGenerator::generate` (module comment). Ids outside the tables or
    /// the vocabulary are skipped where Marian would read out of bounds.
    pub fn generate(&self, source_ids: &[u32], target_vocabulary_size: usize, shared_vocabulary: bool) -> Vec<u32> {
        let size = target_vocabulary_size.min(u32::MAX as usize);
        let mut selected = vec![false; size];
        selected[..self.first.min(size)].fill(true);
        let mut seen = vec![false; self.source_words()];
        for &s in source_ids {
            if shared_vocabulary {
                if let Some(x) = selected.get_mut(s as usize) {
                    *x = true;
                }
            }
            if let Some(done) = seen.get_mut(s as usize).filter(|d| !**d) {
                *done = true;
                for &t in self.candidates(s) {
                    if let Some(x) = selected.get_mut(t as usize) {
                        *x = true;
                    }
                }
            }
        }
        let mut count = selected.iter().filter(|&&x| x).count();
        for x in selected.iter_mut().skip(self.first) {
            if count % 8 == 0 {
                break;
            }
            if !*x {
                *x = true;
                count += 1;
            }
        }
        (0..size as u32).filter(|&i| selected[i as usize]).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An empty file, text with no usable line and a `.bin` without the magic are errors
    /// (read as text, they made a shortlist of the `first` words only: garbage output).
    #[test]
    fn empty_and_foreign_files_are_not_shortlists() {
        use crate::error::ErrorKind;
        use crate::format::files::MemoryFiles;
        use std::sync::Arc;
        let vocab = |w: &str| w.strip_prefix('w').and_then(|n| n.parse().ok());
        for text in ["", "not a shortlist\n", "NULL w1 0.5\nw1 unknown 0.5\n"] {
            let e = Shortlist::from_text(text, None, None, vocab, vocab).err().unwrap();
            assert!(e.kind == ErrorKind::InvalidModel && e.message.contains("not a shortlist"), "{text:?}: {e}");
        }
        let text = "w5 w1 0.5\n".repeat(8);
        let files = PackageFiles::Memory(Arc::new(MemoryFiles::copy_of(&[("lex.s2t.bin", text.as_bytes()), ("lex.s2t", text.as_bytes())]).unwrap()));
        let e = Shortlist::open_in(&files, Path::new("lex.s2t.bin"), None, None, &vocab, &vocab).err().unwrap();
        assert!(e.message.contains("lex.s2t.bin") && e.message.contains("magic"), "{e}");
        assert_eq!(Shortlist::open_in(&files, Path::new("lex.s2t"), None, None, &vocab, &vocab).unwrap().candidates(1), &[5]);
    }

    #[test]
    fn text_import_keeps_the_best_and_pads_to_eight() {
        let vocab = |w: &str| w.strip_prefix('w').and_then(|n| n.parse().ok());
        // trg src prob; w9 twice for w1 (the larger prob wins), a NULL, a <=0 prob.
        let text =
            "w5 w1 0.5\nw9 w1 0.1\nw9 w1 0.7\nw7 w1 0.6\nNULL w1 0.9\nw3 w2 -1\nw20 w0 0.2\nw4 stop x w6 w1 0.99";
        let s = Shortlist::from_text(text, Some(2), Some(2), vocab, vocab).unwrap();
        assert_eq!(s.candidates(1), &[7, 9]);
        assert_eq!(s.candidates(2), &[3]);
        assert_eq!(s.candidates(0), &[20]);
        // first 0..2, lists of 1 and 2, shared adds 1 and 2: {0,1,2,3,7,9} then 4,5 pad.
        assert_eq!(s.generate(&[1, 2, 1], 30, true), [0, 1, 2, 3, 4, 5, 7, 9]);
        assert_eq!(s.generate(&[1, 2], 30, false), [0, 1, 2, 3, 4, 5, 7, 9]);
        // A small vocabulary stops the padding.
        assert_eq!(s.generate(&[1, 99], 8, false), [0, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(s.generate(&[1], 6, false), [0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn checksum_matches_marian() {
        // hash_combine from seed 0 over [1, 2]: 0x9e3779ba, then the second word.
        let s1 = 0x9e37_79bau64;
        let s2 = s1 ^ (2u64 + 0x9e37_79b9 + (s1 << 6) + (s1 >> 2));
        assert_eq!(checksum([1, 2]), s2);
    }
}
