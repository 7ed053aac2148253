//! SentencePiece normalization: the precompiled character map (a Darts-clone double-array
//! trie over UTF-8 bytes whose values point into a blob of NUL-terminated replacement
//! strings), longest-prefix rewriting, whitespace handling and `▁` escaping, with the
//! reference library's semantics (`normalizer.cc`).
use super::proto::NormalizerSpec;
use super::trie::PieceTrie;
use crate::error::{Error, Result};

/// U+2581 LOWER ONE EIGHTH BLOCK, the escaped space.
pub const SPACE_SYMBOL: &str = "\u{2581}";
const SPACE_BYTES: &[u8] = SPACE_SYMBOL.as_bytes();

/// The double array of a precompiled charsmap, read with bounds checks (a unit out of
/// the array ends the search as a mismatch).
struct DoubleArray {
    units: Vec<u32>,
}

impl DoubleArray {
    #[inline]
    fn unit(&self, i: usize) -> Option<u32> {
        self.units.get(i).copied()
    }
    #[inline]
    fn has_leaf(u: u32) -> bool {
        (u >> 8) & 1 == 1
    }
    #[inline]
    fn value(u: u32) -> u32 {
        u & ((1 << 31) - 1)
    }
    #[inline]
    fn label(u: u32) -> u32 {
        u & ((1 << 31) | 0xff)
    }
    #[inline]
    fn offset(u: u32) -> usize {
        ((u >> 10) << ((u & (1 << 9)) >> 6)) as usize
    }

    /// The longest key that is a prefix of `key`: (length, value).
    fn longest_prefix(&self, key: &[u8]) -> Option<(usize, u32)> {
        let mut best = None;
        let mut pos = Self::offset(self.unit(0)?);
        for (i, &b) in key.iter().enumerate() {
            pos ^= b as usize;
            let Some(u) = self.unit(pos) else { break };
            if Self::label(u) != b as u32 {
                break;
            }
            pos ^= Self::offset(u);
            if Self::has_leaf(u) {
                let Some(leaf) = self.unit(pos) else { break };
                best = Some((i + 1, Self::value(leaf)));
            }
        }
        best
    }
}

pub struct Normalizer {
    trie: Option<DoubleArray>,
    normalized: Vec<u8>,
    add_dummy_prefix: bool,
    remove_extra_whitespaces: bool,
    escape_whitespaces: bool,
    treat_whitespace_as_suffix: bool,
}

/// The U+FFFD replacement character, which the reference emits for a malformed byte.
const REPLACEMENT: &[u8] = "\u{FFFD}".as_bytes();

impl Normalizer {
    pub fn new(spec: &NormalizerSpec, treat_whitespace_as_suffix: bool) -> Result<Normalizer> {
        let mut n = Normalizer {
            trie: None,
            normalized: Vec::new(),
            add_dummy_prefix: spec.add_dummy_prefix,
            remove_extra_whitespaces: spec.remove_extra_whitespaces,
            escape_whitespaces: spec.escape_whitespaces,
            treat_whitespace_as_suffix,
        };
        let blob = &spec.precompiled_charsmap;
        if !blob.is_empty() {
            let bad = |m: &str| {
                Error::invalid_model(format!(
                    "invalid SentencePiece model: precompiled charsmap {m}"
                ))
            };
            if blob.len() <= 4 {
                return Err(bad("is broken"));
            }
            let trie_size = u32::from_le_bytes([blob[0], blob[1], blob[2], blob[3]]) as usize;
            if trie_size >= blob.len() {
                return Err(bad("trie size exceeds the blob"));
            }
            let rest = &blob[4..];
            if trie_size > rest.len() || !trie_size.is_multiple_of(4) || trie_size == 0 {
                return Err(bad("trie size is invalid"));
            }
            let units = rest[..trie_size]
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            n.trie = Some(DoubleArray { units });
            n.normalized = rest[trie_size..].to_vec();
        }
        Ok(n)
    }

    /// The replacement for the longest rule matching a prefix of `input` and the number of
    /// input bytes it consumes; user-defined symbols (`matcher`) are kept as they are.
    #[inline]
    fn normalize_prefix<'a>(
        &'a self,
        input: &'a [u8],
        matcher: Option<&PieceTrie>,
    ) -> (&'a [u8], usize) {
        if let Some(m) = matcher {
            if let Some((len, _)) = m.longest_prefix(input) {
                return (&input[..len], len);
            }
        }
        if let Some(trie) = &self.trie {
            if let Some((len, value)) = trie.longest_prefix(input) {
                let start = (value as usize).min(self.normalized.len());
                let tail = &self.normalized[start..];
                let end = tail.iter().position(|&b| b == 0).unwrap_or(tail.len());
                return (&tail[..end], len);
            }
        }
        match decode_utf8(input) {
            (_, len, true) => (&input[..len], len),
            (_, _, false) => (REPLACEMENT, 1),
        }
    }

    /// Normalizes `input` as `Normalizer::Normalize` does. The result is UTF-8 as long as
    /// the charsmap's replacements are (a broken map cannot make it panic: see `lossy`).
    pub fn normalize(&self, input: &str, matcher: Option<&PieceTrie>) -> String {
        lossy(self.normalize_into(input, matcher, &mut NoAlignment))
    }

    /// Normalizes `input` and aligns the result with it (the reference's `norm_to_orig`):
    /// `alignment[i]` is the byte of `input` the normalized byte `i` comes from, and one
    /// last entry holds the offset where the input the normalized text stems from ends.
    pub fn normalize_with_alignment(
        &self,
        input: &str,
        matcher: Option<&PieceTrie>,
    ) -> (String, Vec<usize>) {
        let mut alignment = Vec::with_capacity(input.len() * 3 / 2 + 4);
        let out = self.normalize_into(input, matcher, &mut alignment);
        if alignment.is_empty() {
            // Nothing but whitespace: the reference's `norm_to_orig` is empty too.
            alignment = vec![0];
        }
        lossy_aligned(out, alignment)
    }

    /// The one normalization routine: `align` records `norm_to_orig` (or nothing).
    #[inline]
    fn normalize_into<A: Alignment>(
        &self,
        text: &str,
        matcher: Option<&PieceTrie>,
        align: &mut A,
    ) -> Vec<u8> {
        let mut input = text.as_bytes();
        let mut out: Vec<u8> = Vec::with_capacity(input.len() * 3 / 2 + 4);
        if input.is_empty() {
            return out;
        }
        if self.remove_extra_whitespaces {
            while !input.is_empty() {
                let (sp, len) = self.normalize_prefix(input, matcher);
                if sp != b" " {
                    break;
                }
                input = &input[len..];
            }
        }
        if input.is_empty() {
            return out;
        }
        // The offset in `text` of what is left of `input` (the reference's `consumed`).
        let mut consumed = text.len() - input.len();
        let space: &[u8] = if self.escape_whitespaces {
            SPACE_BYTES
        } else {
            b" "
        };
        if !self.treat_whitespace_as_suffix && self.add_dummy_prefix {
            out.extend_from_slice(space);
            align.push(consumed, space.len());
        }
        let mut is_prev_space = self.remove_extra_whitespaces;
        while !input.is_empty() {
            let (mut sp, len) = self.normalize_prefix(input, matcher);
            while is_prev_space && sp.first() == Some(&b' ') {
                sp = &sp[1..];
            }
            if !sp.is_empty() {
                if self.escape_whitespaces {
                    for &b in sp {
                        if b == b' ' {
                            out.extend_from_slice(SPACE_BYTES);
                            align.push(consumed, SPACE_BYTES.len());
                        } else {
                            out.push(b);
                            align.push(consumed, 1);
                        }
                    }
                } else {
                    out.extend_from_slice(sp);
                    align.push(consumed, sp.len());
                }
                is_prev_space = sp.last() == Some(&b' ');
            }
            input = &input[len..];
            consumed += len;
            if !self.remove_extra_whitespaces {
                is_prev_space = false;
            }
        }
        if self.remove_extra_whitespaces {
            while out.ends_with(space) {
                let len = out.len() - space.len();
                // The text consumed ends where the removed space came from.
                if let Some(orig) = align.truncate(len) {
                    consumed = orig;
                }
                out.truncate(len);
            }
        }
        if self.treat_whitespace_as_suffix && self.add_dummy_prefix {
            out.extend_from_slice(space);
            align.push(consumed, space.len());
        }
        align.push(consumed, 1);
        out
    }
}

/// Where `Normalizer::normalize_into` records the origin of each normalized byte.
trait Alignment {
    /// `count` more normalized bytes come from the input byte `orig`.
    fn push(&mut self, orig: usize, count: usize);
    /// Keeps the first `len` entries; returns the first entry removed.
    fn truncate(&mut self, len: usize) -> Option<usize>;
}

/// Plain normalization: records nothing (compiles to nothing).
struct NoAlignment;

impl Alignment for NoAlignment {
    #[inline(always)]
    fn push(&mut self, _: usize, _: usize) {}
    #[inline(always)]
    fn truncate(&mut self, _: usize) -> Option<usize> {
        None
    }
}

impl Alignment for Vec<usize> {
    #[inline]
    fn push(&mut self, orig: usize, count: usize) {
        let n = self.len() + count;
        self.resize(n, orig);
    }
    fn truncate(&mut self, len: usize) -> Option<usize> {
        let first = self.get(len).copied();
        Vec::truncate(self, len);
        first
    }
}

/// `lossy` keeping an alignment in step: each U+FFFD standing for invalid bytes comes
/// from the first of them.
fn lossy_aligned(bytes: Vec<u8>, alignment: Vec<usize>) -> (String, Vec<usize>) {
    let bytes = match String::from_utf8(bytes) {
        Ok(s) => return (s, alignment),
        Err(e) => e.into_bytes(),
    };
    let mut text = String::with_capacity(bytes.len() + 8);
    let mut aligned = Vec::with_capacity(alignment.len() + 8);
    let mut at = 0;
    for chunk in bytes.utf8_chunks() {
        let valid = chunk.valid();
        text.push_str(valid);
        aligned.extend_from_slice(&alignment[at..at + valid.len()]);
        at += valid.len();
        let invalid = chunk.invalid();
        if !invalid.is_empty() {
            text.push('\u{FFFD}');
            aligned.extend(std::iter::repeat_n(alignment[at], REPLACEMENT.len()));
            at += invalid.len();
        }
    }
    aligned.extend_from_slice(&alignment[at..]);
    (text, aligned)
}

/// Bytes to a `String`, replacing invalid sequences (only a corrupt charsmap produces them).
pub fn lossy(bytes: Vec<u8>) -> String {
    match String::from_utf8(bytes) {
        Ok(s) => s,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    }
}

/// The reference's `DecodeUTF8`: (code point, length, valid). An invalid sequence
/// consumes one byte; U+FFFD itself counts as valid.
pub fn decode_utf8(s: &[u8]) -> (u32, usize, bool) {
    let valid_cp = |c: u32| c < 0xD800 || (0xE000..=0x10FFFF).contains(&c);
    let trail = |b: u8| b & 0xC0 == 0x80;
    let len = s.len();
    if len == 0 {
        return (0xFFFD, 1, false);
    }
    let b0 = s[0] as u32;
    if b0 < 0x80 {
        return (b0, 1, true);
    } else if len >= 2 && b0 & 0xE0 == 0xC0 {
        let cp = ((b0 & 0x1F) << 6) | (s[1] as u32 & 0x3F);
        if trail(s[1]) && cp >= 0x80 && valid_cp(cp) {
            return (cp, 2, true);
        }
    } else if len >= 3 && b0 & 0xF0 == 0xE0 {
        let cp = ((b0 & 0x0F) << 12) | ((s[1] as u32 & 0x3F) << 6) | (s[2] as u32 & 0x3F);
        if trail(s[1]) && trail(s[2]) && cp >= 0x800 && valid_cp(cp) {
            return (cp, 3, true);
        }
    } else if len >= 4 && b0 & 0xF8 == 0xF0 {
        let cp = ((b0 & 0x07) << 18)
            | ((s[1] as u32 & 0x3F) << 12)
            | ((s[2] as u32 & 0x3F) << 6)
            | (s[3] as u32 & 0x3F);
        if trail(s[1]) && trail(s[2]) && trail(s[3]) && cp >= 0x10000 && valid_cp(cp) {
            return (cp, 4, true);
        }
    }
    (0xFFFD, 1, false)
}

/// The reference's `OneCharLen`: the UTF-8 length announced by a lead byte.
#[inline]
pub fn one_char_len(b: u8) -> usize {
    const T: [u8; 16] = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4];
    T[(b >> 4) as usize] as usize
}
