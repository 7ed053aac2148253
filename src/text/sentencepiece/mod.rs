//! SentencePiece in pure Rust, token for token like the reference library
//! (`google/sentencepiece`, the `sentencepiece` Python package): model files (`.model`,
//! `.spm`), normalization with the precompiled charsmap, unigram (Viterbi) and BPE
//! encoding, unknown-piece merging, byte fallback, and decoding back to text.
//!
//! ```no_run
//! use tolk::text::SentencePiece;
//! let sp = SentencePiece::load("models/zh-en-ct2/sentencepiece.model").unwrap();
//! let pieces = sp.encode("我爱你");
//! let ids = sp.encode_ids("我爱你");
//! assert_eq!(sp.decode(&pieces), "我爱你");
//! // Each piece with the byte range of the text it came from (`begin`/`end` of the
//! // reference's `SentencePieceText`).
//! for p in sp.encode_with_offsets("我爱你") {
//!     println!("{} {} {:?}", p.piece, p.id, p.range);
//! }
//! ```
//!
//! A loaded `SentencePiece` is immutable: share it between threads freely.
mod normalizer;
mod proto;
mod trie;

use std::collections::{BinaryHeap, HashMap};
use std::path::Path;

use crate::error::{Error, Result};
use crate::strings::PackedStrings;
use normalizer::{decode_utf8, one_char_len, Normalizer, SPACE_SYMBOL};
pub use proto::{ModelType, PieceType};
use trie::PieceTrie;

/// The penalty below the lowest piece score given to an unknown character (unigram).
const UNK_PENALTY: f32 = 10.0;
/// What `<unk>` decodes to unless the model says otherwise (" ⁇ ").
const DEFAULT_UNK_SURFACE: &str = " \u{2047} ";


/// A loaded SentencePiece model (unigram or BPE).
pub struct SentencePiece {
    /// Every piece's text, by id.
    pieces: PackedStrings,
    /// (score, type) per id, compact for the Viterbi loop.
    meta: Vec<(f32, PieceType)>,
    /// The byte of each `<0xXX>` piece (0 for the others).
    byte_of: Vec<u8>,
    model_type: ModelType,
    /// NORMAL, USER_DEFINED and UNUSED pieces (the reference's `pieces_`).
    trie: PieceTrie,
    /// CONTROL, UNKNOWN and BYTE pieces (the reference's `reserved_id_map_`).
    reserved: HashMap<String, u32>,
    /// User-defined symbols, matched before normalization and never split.
    user_matcher: Option<PieceTrie>,
    unk_id: u32,
    byte_fallback: bool,
    byte_ids: Vec<u32>,
    max_score: f32,
    unk_score: f32,
    normalizer: Normalizer,
    denormalizer: Option<Normalizer>,
    add_dummy_prefix: bool,
    remove_extra_whitespaces: bool,
    unk_surface: String,
    bos_piece: String,
    eos_piece: String,
    pad_piece: String,
    unk_piece: String,
}

/// One piece of an encoding with the byte range of the original text it came from.
///
/// `range` is the reference's `begin`/`end` (`SentencePieceText.SentencePiece`): the
/// original bytes whose normalization the piece covers. Normalization makes a few cases
/// worth knowing:
///
/// - the dummy-prefix `▁` comes from no input byte: a piece that is only `▁` has an empty
///   range where the text after it starts, and `▁hello` covers just `hello`;
/// - whitespace the normalizer removes belongs to the piece after it (`"a  b"` gives
///   `▁a` = `0..1`, `▁b` = `1..4`); removed leading and trailing whitespace belongs to no
///   piece (a charsmap rule whose replacement ends in a space, cut at the end of the
///   text, cuts the last range where its character starts);
/// - a character the charsmap rewrites into several (`ﬁ` to `fi`, `㍻` to `平成`) is
///   covered by the piece holding the end of its replacement: a piece ending inside the
///   replacement ends where the character starts (`㍻` gives `▁` = `0..0`, `平` = `0..0`,
///   `成` = `0..3`);
/// - with byte fallback, an unknown character becomes one piece per UTF-8 byte: the last
///   covers the character, the others have an empty range at its start;
/// - a run of unknown characters merged into one piece covers the whole run.
///
/// Consecutive ranges touch (`ranges[i].end == ranges[i + 1].start`) and lie on `char`
/// boundaries of the text (a model whose charsmap rewrites part of a character has its
/// offsets moved back to the character's start), so `&text[range]` is the piece's surface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedPiece {
    pub piece: String,
    pub id: u32,
    pub range: std::ops::Range<usize>,
}

/// A token over the normalized text: the byte range it covers and its id.
#[derive(Clone, Copy)]
struct Token {
    start: usize,
    end: usize,
    id: u32,
}

fn byte_piece_value(piece: &str) -> Option<u8> {
    // Exactly "<0xXX>" with upper-case hex digits (`ByteToPiece` prints "%02X").
    let b = piece.as_bytes();
    if b.len() != 6 || &b[..3] != b"<0x" || b[5] != b'>' {
        return None;
    }
    let hex = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    Some(hex(b[3])? * 16 + hex(b[4])?)
}

impl SentencePiece {
    /// Loads a `.model` / `.spm` file.
    pub fn load(path: impl AsRef<Path>) -> Result<SentencePiece> {
        let path = path.as_ref();
        let bytes = std::fs::read(path)
            .map_err(|e| Error::io(format!("cannot read {}: {e}", path.display())))?;
        SentencePiece::from_bytes(&bytes)
    }

    /// Loads a serialized `ModelProto`.
    pub fn from_bytes(bytes: &[u8]) -> Result<SentencePiece> {
        let m = proto::parse_model(bytes)?;
        let bad = |m: String| Error::invalid_model(format!("invalid SentencePiece model: {m}"));
        if m.pieces.is_empty() {
            return Err(bad("no pieces".into()));
        }
        if m.pieces.len() >= u32::MAX as usize {
            return Err(bad("too many pieces".into()));
        }
        match m.trainer_spec.model_type {
            ModelType::Unigram | ModelType::Bpe => {}
            t => {
                return Err(Error::unsupported(format!(
                    "SentencePiece model type {t:?} is not supported"
                )))
            }
        }
        let byte_fallback = m.trainer_spec.byte_fallback;
        let mut normal: HashMap<&str, u32> = HashMap::with_capacity(m.pieces.len());
        let mut reserved: HashMap<String, u32> = HashMap::new();
        let mut unk_id = None;
        let mut byte_ids = vec![u32::MAX; 256];
        let bytes: usize = m.pieces.iter().map(|p| p.piece.len()).sum();
        if bytes > u32::MAX as usize {
            return Err(bad("the pieces are too long".into()));
        }
        let mut pieces = PackedStrings::with_capacity(m.pieces.len(), bytes);
        let mut meta = Vec::with_capacity(m.pieces.len());
        let mut byte_of = Vec::with_capacity(m.pieces.len());
        let mut user_defined = Vec::new();
        let (mut min_score, mut max_score) = (f32::MAX, f32::MIN_POSITIVE);
        for (i, p) in m.pieces.iter().enumerate() {
            let id = i as u32;
            if p.piece.is_empty() {
                return Err(bad("piece must not be empty".into()));
            }
            let is_normal = matches!(
                p.kind,
                PieceType::Normal | PieceType::UserDefined | PieceType::Unused
            );
            let fresh = if is_normal {
                normal.insert(&p.piece, id).is_none()
            } else {
                reserved.insert(p.piece.clone(), id).is_none()
            };
            if !fresh {
                return Err(bad(format!("{} is already defined", p.piece)));
            }
            let mut byte = 0;
            match p.kind {
                PieceType::UserDefined => user_defined.push((p.piece.as_bytes(), id)),
                PieceType::Unknown if unk_id.replace(id).is_some() => {
                    return Err(bad("unk is already defined".into()));
                }
                PieceType::Byte => {
                    if !byte_fallback {
                        return Err(bad(format!(
                            "byte piece {} is found although `byte_fallback` is false",
                            p.piece
                        )));
                    }
                    byte = byte_piece_value(&p.piece)
                        .ok_or_else(|| bad(format!("byte piece {} is invalid", p.piece)))?;
                    byte_ids[byte as usize] = id;
                }
                PieceType::Normal => {
                    min_score = min_score.min(p.score);
                    max_score = max_score.max(p.score);
                }
                _ => {}
            }
            pieces.push(&p.piece);
            meta.push((p.score, p.kind));
            byte_of.push(byte);
        }
        let unk_id = unk_id.ok_or_else(|| bad("unk is not defined".into()))?;
        if byte_fallback && byte_ids.contains(&u32::MAX) {
            return Err(bad(
                "there are not 256 byte pieces although `byte_fallback` is true".into(),
            ));
        }
        let mut trie = PieceTrie::new(normal.iter().map(|(k, &v)| (k.as_bytes(), v)).collect());
        trie.set_scores(|id| {
            let (score, kind) = meta[id as usize];
            (score, kind as u8)
        });
        let user_matcher = if user_defined.is_empty() {
            None
        } else {
            Some(PieceTrie::new(user_defined))
        };
        let ts = &m.trainer_spec;
        let normalizer = Normalizer::new(&m.normalizer_spec, ts.treat_whitespace_as_suffix)?;
        let denormalizer = match &m.denormalizer_spec {
            Some(spec) if !spec.precompiled_charsmap.is_empty() => {
                Some(Normalizer::new(spec, false)?)
            }
            _ => None,
        };
        Ok(SentencePiece {
            meta,
            byte_of,
            model_type: ts.model_type,
            trie,
            reserved,
            user_matcher,
            unk_id,
            byte_fallback,
            byte_ids,
            max_score,
            unk_score: min_score - UNK_PENALTY,
            normalizer,
            denormalizer,
            add_dummy_prefix: m.normalizer_spec.add_dummy_prefix,
            remove_extra_whitespaces: m.normalizer_spec.remove_extra_whitespaces,
            unk_surface: ts
                .unk_surface
                .clone()
                .unwrap_or_else(|| DEFAULT_UNK_SURFACE.to_string()),
            bos_piece: ts.bos_piece.clone(),
            eos_piece: ts.eos_piece.clone(),
            pad_piece: ts.pad_piece.clone(),
            unk_piece: ts.unk_piece.clone(),
            pieces,
        })
    }

    /// The number of pieces in the vocabulary.
    pub fn len(&self) -> usize {
        self.meta.len()
    }

    pub fn is_empty(&self) -> bool {
        self.meta.is_empty()
    }

    pub fn model_type(&self) -> ModelType {
        self.model_type
    }

    /// The id of `piece`, or the unknown id when the vocabulary does not hold it.
    pub fn piece_to_id(&self, piece: &str) -> u32 {
        self.find_piece(piece).unwrap_or(self.unk_id)
    }

    /// The id of `piece` if the vocabulary holds it.
    pub fn find_piece(&self, piece: &str) -> Option<u32> {
        if let Some(&id) = self.reserved.get(piece) {
            return Some(id);
        }
        self.trie.get(piece.as_bytes())
    }

    /// The piece of `id`, if in range.
    pub fn id_to_piece(&self, id: u32) -> Option<&str> {
        self.pieces.get(id as usize)
    }

    pub fn score(&self, id: u32) -> Option<f32> {
        self.meta.get(id as usize).map(|m| m.0)
    }

    pub fn piece_type(&self, id: u32) -> Option<PieceType> {
        self.meta.get(id as usize).map(|m| m.1)
    }

    fn kind(&self, id: u32) -> PieceType {
        self.meta[id as usize].1
    }

    fn special_id(&self, piece: &str, kind: PieceType) -> Option<u32> {
        let id = self.piece_to_id(piece);
        (self.kind(id) == kind).then_some(id)
    }

    /// The unknown piece's id (as `SentencePieceProcessor::unk_id`).
    pub fn unk_id(&self) -> u32 {
        self.special_id(&self.unk_piece, PieceType::Unknown)
            .unwrap_or(self.unk_id)
    }
    /// `<s>`'s id if it is a control piece.
    pub fn bos_id(&self) -> Option<u32> {
        self.special_id(&self.bos_piece, PieceType::Control)
    }
    /// `</s>`'s id if it is a control piece.
    pub fn eos_id(&self) -> Option<u32> {
        self.special_id(&self.eos_piece, PieceType::Control)
    }
    /// `<pad>`'s id if it is a control piece.
    pub fn pad_id(&self) -> Option<u32> {
        self.special_id(&self.pad_piece, PieceType::Control)
    }

    /// The normalized text the model segments (spaces escaped as `▁`).
    pub fn normalize(&self, text: &str) -> String {
        self.normalizer.normalize(text, self.user_matcher.as_ref())
    }

    /// Encodes `text` into pieces.
    pub fn encode(&self, text: &str) -> Vec<String> {
        let normalized = self.normalize(text);
        let tokens = self.tokens(&normalized);
        tokens
            .iter()
            .map(|t| self.token_piece(&normalized, t).to_string())
            .collect()
    }

    /// Encodes `text` into ids.
    pub fn encode_ids(&self, text: &str) -> Vec<u32> {
        let normalized = self.normalize(text);
        self.tokens(&normalized).iter().map(|t| t.id).collect()
    }

    /// Encodes `text` into (piece, id) pairs.
    pub fn encode_with_ids(&self, text: &str) -> Vec<(String, u32)> {
        let normalized = self.normalize(text);
        let tokens = self.tokens(&normalized);
        tokens
            .iter()
            .map(|t| (self.token_piece(&normalized, t).to_string(), t.id))
            .collect()
    }

    /// Encodes `text` like [`encode_with_ids`](Self::encode_with_ids), with each piece's
    /// byte range in `text` (the reference's `begin`/`end` of `SentencePieceText`; see
    /// [`EncodedPiece`] for the details).
    pub fn encode_with_offsets(&self, text: &str) -> Vec<EncodedPiece> {
        let (normalized, alignment) = self
            .normalizer
            .normalize_with_alignment(text, self.user_matcher.as_ref());
        let orig = |i: usize| {
            let mut at = alignment
                .get(i)
                .copied()
                .unwrap_or(text.len())
                .min(text.len());
            while !text.is_char_boundary(at) {
                at -= 1;
            }
            at
        };
        self.tokens(&normalized)
            .iter()
            .map(|t| EncodedPiece {
                piece: self.token_piece(&normalized, t).to_string(),
                id: t.id,
                range: orig(t.start)..orig(t.end),
            })
            .collect()
    }

    fn token_piece<'a>(&'a self, normalized: &'a str, t: &Token) -> &'a str {
        if t.id == self.unk_id {
            normalized.get(t.start..t.end).unwrap_or("")
        } else {
            self.pieces.get(t.id as usize).unwrap_or("")
        }
    }

    /// The model's segmentation followed by `PopulateSentencePieceText`'s rules: runs of
    /// unknown pieces merge into one, or become byte pieces with byte fallback.
    fn tokens(&self, normalized: &str) -> Vec<Token> {
        if normalized.is_empty() {
            return Vec::new();
        }
        let raw = match self.model_type {
            ModelType::Bpe => self.encode_bpe(normalized),
            _ => self.encode_unigram(normalized.as_bytes()),
        };
        let bytes = normalized.as_bytes();
        let mut out: Vec<Token> = Vec::with_capacity(raw.len());
        let mut prev_unk = false;
        for t in raw {
            let is_unk = self.kind(t.id) == PieceType::Unknown;
            if is_unk && self.byte_fallback {
                // As the reference: the last byte piece covers the character, the
                // others none of it (an empty range at its start).
                for (i, &b) in bytes[t.start..t.end].iter().enumerate() {
                    out.push(Token {
                        start: t.start,
                        end: if i + 1 == t.end - t.start {
                            t.end
                        } else {
                            t.start
                        },
                        id: self.byte_ids[b as usize],
                    });
                }
            } else if is_unk && prev_unk {
                if let Some(last) = out.last_mut() {
                    last.end = t.end;
                }
            } else {
                out.push(t);
            }
            prev_unk = is_unk;
        }
        out
    }

    /// The reference's optimized Viterbi (`EncodeOptimized`), with its float types as in
    /// sentencepiece 0.2.3: path scores are single precision, a user-defined piece scores
    /// `length * max_score - 0.1` (computed in double, then rounded). Ties between
    /// segmentations (equal sums) go to the one found first, so the rounding matters:
    /// 0.2.0 and 0.2.1 compared in double precision and can break some ties differently.
    fn encode_unigram(&self, s: &[u8]) -> Vec<Token> {
        #[derive(Clone, Copy)]
        struct Best {
            score: f32,
            start: i64,
            id: u32,
        }
        let n = s.len();
        let mut best = vec![
            Best {
                score: 0.0,
                start: -1,
                id: 0
            };
            n + 1
        ];
        let mut start = 0usize;
        while start < n {
            let till_here = best[start].score;
            let mblen = one_char_len(s[start]).min(n - start);
            let mut has_single_node = false;
            let mut node = PieceTrie::ROOT;
            let mut k = start;
            while k < n {
                match self.trie.child(node, s[k]) {
                    Some(c) => node = c,
                    None => break,
                }
                k += 1;
                let Some((id, piece_score, kind)) = self.trie.entry(node) else {
                    continue;
                };
                if kind == PieceType::Unused as u8 {
                    continue;
                }
                let length = k - start;
                let score = if kind == PieceType::UserDefined as u8 {
                    ((length as f32 * self.max_score) as f64 - 0.1) as f32
                } else {
                    piece_score
                };
                let candidate = score + till_here;
                let target = &mut best[k];
                if target.start == -1 || candidate > target.score {
                    *target = Best {
                        score: candidate,
                        start: start as i64,
                        id,
                    };
                }
                if length == mblen {
                    has_single_node = true;
                }
            }
            if !has_single_node {
                let candidate = self.unk_score + till_here;
                let target = &mut best[start + mblen];
                if target.start == -1 || candidate > target.score {
                    *target = Best {
                        score: candidate,
                        start: start as i64,
                        id: self.unk_id,
                    };
                }
            }
            start += mblen;
        }
        let mut out = Vec::new();
        let mut end = n;
        while end > 0 {
            let b = best[end];
            // Every end reached from position 0 has a predecessor; guard anyway.
            if b.start < 0 || b.start as usize >= end {
                break;
            }
            out.push(Token {
                start: b.start as usize,
                end,
                id: b.id,
            });
            end = b.start as usize;
        }
        out.reverse();
        out
    }

    /// The reference's BPE (`bpe::Model::SampleEncode` without dropout): merge the
    /// best-scored adjacent pair (leftmost on ties) until none is in the vocabulary, then
    /// split merges through UNUSED pieces back into their parts.
    fn encode_bpe<'s>(&self, s: &'s str) -> Vec<Token> {
        #[derive(Clone, Copy)]
        struct Symbol {
            prev: i64,
            next: i64,
            freeze: bool,
            start: usize,
            len: usize,
        }
        #[derive(PartialEq)]
        struct Pair {
            score: f32,
            left: usize,
            right: usize,
            size: usize,
        }
        impl Eq for Pair {}
        impl Ord for Pair {
            fn cmp(&self, o: &Self) -> std::cmp::Ordering {
                self.score
                    .total_cmp(&o.score)
                    .then_with(|| o.left.cmp(&self.left))
            }
        }
        impl PartialOrd for Pair {
            fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
                Some(self.cmp(o))
            }
        }
        let bytes = s.as_bytes();
        let mut symbols: Vec<Symbol> = Vec::with_capacity(bytes.len());
        let mut pos = 0;
        while pos < bytes.len() {
            let (len, freeze) = match self
                .user_matcher
                .as_ref()
                .and_then(|m| m.longest_prefix(&bytes[pos..]))
            {
                Some((len, _)) => (len, true),
                None => (one_char_len(bytes[pos]).min(bytes.len() - pos), false),
            };
            let index = symbols.len() as i64;
            let next = if pos + len >= bytes.len() {
                -1
            } else {
                index + 1
            };
            symbols.push(Symbol {
                prev: index - 1,
                next,
                freeze,
                start: pos,
                len,
            });
            pos += len;
        }
        let mut agenda = BinaryHeap::new();
        // Merged UNUSED piece -> the length of its left part, keyed by text as in the
        // reference (the last merge of a given text wins). The parts are split where the
        // piece is, which may be elsewhere than the merge recorded (same text).
        type RevMerge<'a> = HashMap<&'a str, usize>;
        let mut rev_merge: RevMerge<'s> = HashMap::new();
        let add_pair = |symbols: &Vec<Symbol>,
                        agenda: &mut BinaryHeap<Pair>,
                        rev_merge: &mut RevMerge<'s>,
                        left: i64,
                        right: i64| {
            if left < 0 || right < 0 {
                return;
            }
            let (l, r) = (symbols[left as usize], symbols[right as usize]);
            if l.freeze || r.freeze {
                return;
            }
            let merged = &bytes[l.start..l.start + l.len + r.len];
            let Some(id) = self.trie.get(merged) else {
                return;
            };
            let (score, kind) = self.meta[id as usize];
            agenda.push(Pair {
                score,
                left: left as usize,
                right: right as usize,
                size: merged.len(),
            });
            if kind == PieceType::Unused {
                rev_merge.insert(&s[l.start..l.start + merged.len()], l.len);
            }
        };
        for i in 1..symbols.len() {
            add_pair(
                &symbols,
                &mut agenda,
                &mut rev_merge,
                i as i64 - 1,
                i as i64,
            );
        }
        while let Some(top) = agenda.pop() {
            let (l, r) = (symbols[top.left], symbols[top.right]);
            if l.len == 0 || r.len == 0 || l.len + r.len != top.size {
                continue;
            }
            symbols[top.left].len += r.len;
            symbols[top.left].next = r.next;
            if r.next >= 0 {
                symbols[r.next as usize].prev = top.left as i64;
            }
            symbols[top.right].len = 0;
            let prev = symbols[top.left].prev;
            add_pair(&symbols, &mut agenda, &mut rev_merge, prev, top.left as i64);
            let next = symbols[top.left].next;
            add_pair(&symbols, &mut agenda, &mut rev_merge, top.left as i64, next);
        }
        let mut out = Vec::new();
        let mut stack = Vec::new();
        let mut index = if symbols.is_empty() { -1 } else { 0 };
        while index >= 0 {
            let sym = symbols[index as usize];
            stack.push((sym.start, sym.len));
            while let Some((start, len)) = stack.pop() {
                let w = &s[start..start + len];
                let id = self.piece_to_id(w);
                if self.kind(id) == PieceType::Unused {
                    if let Some(&left) = rev_merge.get(w) {
                        stack.push((start + left, len - left));
                        stack.push((start, left));
                        continue;
                    }
                }
                out.push(Token {
                    start,
                    end: start + len,
                    id,
                });
            }
            index = sym.next;
        }
        out
    }

    /// Decodes pieces back to text (`SentencePieceProcessor::DecodePieces`).
    pub fn decode<S: AsRef<str>>(&self, pieces: &[S]) -> String {
        let items: Vec<(&str, u32)> = pieces
            .iter()
            .map(|p| (p.as_ref(), self.piece_to_id(p.as_ref())))
            .collect();
        self.decode_items(&items)
    }

    /// Decodes ids back to text (`SentencePieceProcessor::DecodeIds`); an id out of range
    /// is an error.
    pub fn decode_ids(&self, ids: &[u32]) -> Result<String> {
        let mut items = Vec::with_capacity(ids.len());
        for &id in ids {
            let piece = self
                .id_to_piece(id)
                .ok_or_else(|| Error::out_of_range(format!("invalid piece id {id}")))?;
            items.push((piece, self.piece_to_id(piece)));
        }
        Ok(self.decode_items(&items))
    }

    fn decode_items(&self, items: &[(&str, u32)]) -> String {
        let mut text = String::new();
        let mut bytes: Vec<u8> = Vec::new();
        let flush = |text: &mut String, bytes: &mut Vec<u8>| {
            let mut rest = &bytes[..];
            while !rest.is_empty() {
                let (_, len, valid) = decode_utf8(rest);
                if valid {
                    // A valid sequence per the reference is valid UTF-8.
                    text.push_str(std::str::from_utf8(&rest[..len]).unwrap_or("\u{FFFD}"));
                } else {
                    text.push('\u{FFFD}');
                }
                rest = &rest[len..];
            }
            bytes.clear();
        };
        let mut is_bos_ws = true;
        let mut bos_ws_seen = false;
        for &(piece, id) in items {
            let kind = self.kind(id);
            if kind == PieceType::Byte {
                bytes.push(self.byte_of[id as usize]);
                continue;
            }
            flush(&mut text, &mut bytes);
            if bos_ws_seen || !text.is_empty() {
                is_bos_ws = false;
            }
            bos_ws_seen = false;
            match kind {
                PieceType::Control => {}
                PieceType::Unknown => {
                    if self.pieces.get(id as usize) == Some(piece) {
                        text.push_str(&self.unk_surface);
                    } else {
                        text.push_str(piece);
                    }
                }
                _ => {
                    let mut w = piece;
                    if is_bos_ws && (self.add_dummy_prefix || self.remove_extra_whitespaces) {
                        if let Some(rest) = w.strip_prefix(SPACE_SYMBOL) {
                            w = rest;
                            bos_ws_seen = !self.remove_extra_whitespaces;
                        }
                    }
                    text.push_str(&w.replace(SPACE_SYMBOL, " "));
                }
            }
        }
        flush(&mut text, &mut bytes);
        match &self.denormalizer {
            Some(d) => d.normalize(&text, None),
            None => text,
        }
    }
}
