//! The bodies of Tolk's fuzz targets, as plain functions over the public `tolk` API.
//!
//! The cargo-fuzz targets (`fuzz/fuzz_targets/*.rs`) are one-line wrappers around these
//! functions, and `tests/fuzz_parsers.rs` includes this file as a module
//! (`#[path = "../fuzz/src/lib.rs"]`) to run the same bodies over mutated seeds in
//! `cargo test`. A body returns normally for every input: parse errors are fine, a panic
//! (a bug or a broken invariant) is a crash.
//!
//! Besides the bodies this file builds small but complete SentencePiece models
//! ([`generated_model`]): unigram or BPE, every normalizer flag, byte fallback, and a
//! precompiled charsmap with rules that change lengths, delete characters and produce
//! spaces, written as a Darts-clone double array like the reference's trainer does.
use std::sync::OnceLock;

use tolk::format::ct2::{Ct2Config, ModelBin, Vocabulary};
use tolk::format::json;
use tolk::text::sentencepiece::{EncodedPiece, PieceType};
use tolk::text::SentencePiece;

// ------------------------------------------------------------------ protobuf writing

pub fn varint(mut v: u64, out: &mut Vec<u8>) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

pub fn bytes_field(field: u32, data: &[u8], out: &mut Vec<u8>) {
    varint(u64::from(field) << 3 | 2, out);
    varint(data.len() as u64, out);
    out.extend_from_slice(data);
}

pub fn varint_field(field: u32, v: u64, out: &mut Vec<u8>) {
    varint(u64::from(field) << 3, out);
    varint(v, out);
}

/// A serialized `SentencePiece` message: piece, score, type (1 normal, 2 unknown,
/// 3 control, 4 user-defined, 5 unused, 6 byte).
pub fn piece_proto(piece: &str, score: f32, kind: u64) -> Vec<u8> {
    let mut m = Vec::new();
    bytes_field(1, piece.as_bytes(), &mut m);
    varint(2 << 3 | 5, &mut m);
    m.extend_from_slice(&score.to_le_bytes());
    varint_field(3, kind, &mut m);
    m
}

// ------------------------------------------------------------------ generated models

/// The charsmap rules of the generated models: fullwidth letters, ligatures and
/// compatibility characters that expand, characters that become spaces, a deleted
/// zero-width space, a two-character key, and a rule whose output has spaces around it.
pub const CHARSMAP_RULES: &[(&str, &str)] = &[
    ("Ａ", "A"),
    ("Ｂ", "B"),
    ("ｅ", "e"),
    ("ｅ\u{301}", "é"),
    ("e\u{301}", "é"),
    ("ﬁ", "fi"),
    ("①", "1"),
    ("Ⅻ", "XII"),
    ("㍻", "平成"),
    ("ß", "ss"),
    ("\u{3000}", " "),
    ("\u{a0}", " "),
    ("\t", " "),
    ("\n", " "),
    ("\u{200b}", ""),
    ("¦", " | "),
];

/// How a generated model is set up (every combination is a valid model).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelOptions {
    pub bpe: bool,
    pub byte_fallback: bool,
    pub add_dummy_prefix: bool,
    pub remove_extra_whitespaces: bool,
    pub escape_whitespaces: bool,
    pub treat_whitespace_as_suffix: bool,
    pub charsmap: bool,
}

/// The number of [`ModelOptions`] combinations ([`ModelOptions::from_index`]).
pub const MODEL_VARIANTS: usize = 128;

impl ModelOptions {
    /// The combination of flags numbered `index` (bit 0 = BPE, ..., bit 6 = charsmap).
    pub fn from_index(index: usize) -> ModelOptions {
        let bit = |i: u32| index >> i & 1 == 1;
        ModelOptions {
            bpe: bit(0),
            byte_fallback: bit(1),
            add_dummy_prefix: !bit(2),
            remove_extra_whitespaces: !bit(3),
            escape_whitespaces: !bit(4),
            treat_whitespace_as_suffix: bit(5),
            charsmap: !bit(6),
        }
    }

    /// A file-name-friendly description, e.g. `unigram-bf-nodummy`.
    pub fn name(&self) -> String {
        let mut s = String::from(if self.bpe { "bpe" } else { "unigram" });
        for (on, tag) in [
            (self.byte_fallback, "-bytes"),
            (!self.add_dummy_prefix, "-nodummy"),
            (!self.remove_extra_whitespaces, "-keepspaces"),
            (!self.escape_whitespaces, "-noescape"),
            (self.treat_whitespace_as_suffix, "-suffix"),
            (!self.charsmap, "-nocharsmap"),
        ] {
            if on {
                s.push_str(tag);
            }
        }
        s
    }
}

/// The normal pieces of the generated models with their scores (higher merges first in
/// BPE; the unigram lattice prefers few, well-scored pieces).
fn normal_pieces() -> Vec<(String, f32)> {
    let mut v: Vec<(String, f32)> = vec![("▁".into(), -2.0)];
    let singles = "abcdefghijklmnopqrstuvwxyzABCIX0123456789.,!?|-'é平";
    for (i, c) in singles.chars().enumerate() {
        v.push((c.to_string(), -5.0 - i as f32 * 0.01));
    }
    let multi = [
        ("▁a", -3.0),
        ("ab", -3.1),
        ("▁ab", -2.5),
        ("th", -3.2),
        ("he", -3.3),
        ("the", -2.9),
        ("▁the", -2.0),
        ("▁t", -3.4),
        ("fi", -3.5),
        ("▁fi", -2.8),
        ("▁1", -3.6),
        ("12", -3.7),
        ("XI", -3.8),
        ("XII", -3.0),
        ("▁XII", -2.7),
        ("ss", -3.9),
        ("▁é", -3.95),
        ("▁▁", -4.0),
        ("..", -4.1),
    ];
    v.extend(multi.iter().map(|&(p, s)| (p.to_string(), s)));
    v
}

/// A serialized `ModelProto` for `o`: `<unk>`, `<s>`, `</s>`, the normal pieces, a
/// user-defined `<sep>`, an unused `abb`, and the 256 byte pieces with byte fallback.
pub fn generated_model(o: ModelOptions) -> Vec<u8> {
    let mut m = Vec::new();
    let mut add = |p: &str, score: f32, kind: u64| bytes_field(1, &piece_proto(p, score, kind), &mut m);
    add("<unk>", 0.0, 2);
    add("<s>", 0.0, 3);
    add("</s>", 0.0, 3);
    for (p, s) in normal_pieces() {
        add(&p, s, 1);
    }
    add("<sep>", 0.0, 4);
    add("abb", -1.0, 5);
    if o.byte_fallback {
        for b in 0..=255u8 {
            add(&format!("<0x{b:02X}>"), 0.0, 6);
        }
    }
    let mut ts = Vec::new();
    varint_field(3, if o.bpe { 2 } else { 1 }, &mut ts);
    varint_field(24, o.treat_whitespace_as_suffix as u64, &mut ts);
    varint_field(35, o.byte_fallback as u64, &mut ts);
    varint_field(43, u64::MAX, &mut ts); // pad_id = -1
    bytes_field(2, &ts, &mut m);
    let mut ns = Vec::new();
    bytes_field(1, if o.charsmap { b"generated" } else { b"identity" }, &mut ns);
    if o.charsmap {
        bytes_field(2, &precompiled_charsmap(CHARSMAP_RULES), &mut ns);
    }
    varint_field(3, o.add_dummy_prefix as u64, &mut ns);
    varint_field(4, o.remove_extra_whitespaces as u64, &mut ns);
    varint_field(5, o.escape_whitespaces as u64, &mut ns);
    bytes_field(3, &ns, &mut m);
    m
}

/// A precompiled charsmap: `u32 trie_size`, a Darts-clone double array over the keys'
/// UTF-8 bytes whose values are offsets of NUL-terminated replacements, then those.
pub fn precompiled_charsmap(rules: &[(&str, &str)]) -> Vec<u8> {
    let mut normalized = Vec::new();
    let mut keys: Vec<(&[u8], u32)> = Vec::new();
    for (key, value) in rules {
        keys.push((key.as_bytes(), normalized.len() as u32));
        normalized.extend_from_slice(value.as_bytes());
        normalized.push(0);
    }
    let units = double_array(keys);
    let mut blob = Vec::new();
    blob.extend_from_slice(&((units.len() * 4) as u32).to_le_bytes());
    for u in &units {
        blob.extend_from_slice(&u.to_le_bytes());
    }
    blob.extend_from_slice(&normalized);
    blob
}

/// Darts-clone units (`DoubleArrayUnit`): bits 0-7 label, bit 8 has-leaf, bits 10-31
/// offset (the XOR distance from a node to its children's block); a leaf unit holds
/// `value | 1 << 31`. The child of the node at `p` by byte `c` is at `p ^ offset ^ c`,
/// its value (if a key ends there) at `p ^ offset`.
fn double_array(mut keys: Vec<(&[u8], u32)>) -> Vec<u32> {
    keys.sort();
    keys.dedup_by(|a, b| a.0 == b.0);
    // (slot, key range, depth): children of one node are consecutive keys.
    let mut units: Vec<u32> = vec![0; 256];
    let mut used: Vec<bool> = vec![false; 256];
    used[0] = true;
    let mut work = vec![(0usize, 0usize, keys.len(), 0usize)];
    while let Some((slot, mut lo, hi, depth)) = work.pop() {
        let value = if lo < hi && keys[lo].0.len() == depth {
            lo += 1;
            Some(keys[lo - 1].1)
        } else {
            None
        };
        let mut labels: Vec<(u8, usize, usize)> = Vec::new();
        let mut i = lo;
        while i < hi {
            let c = keys[i].0[depth];
            let mut j = i + 1;
            while j < hi && keys[j].0[depth] == c {
                j += 1;
            }
            labels.push((c, i, j));
            i = j;
        }
        if labels.is_empty() && value.is_none() {
            continue;
        }
        // First fit: a base whose leaf slot (if any) and child slots are free.
        let mut base = 1usize;
        let base = loop {
            let need = (base | 255) + 1;
            if units.len() < need {
                units.resize(need, 0);
                used.resize(need, false);
            }
            let free = (value.is_none() || !used[base]) && labels.iter().all(|&(c, _, _)| !used[base ^ c as usize]);
            if free {
                break base;
            }
            base += 1;
        };
        let offset = (slot ^ base) as u32;
        assert!(offset < 1 << 21, "double array too large for a plain offset");
        units[slot] |= offset << 10 | u32::from(value.is_some()) << 8;
        if let Some(v) = value {
            used[base] = true;
            units[base] = v | 1 << 31;
        }
        for &(c, i, j) in &labels {
            let child = base ^ c as usize;
            used[child] = true;
            units[child] = u32::from(c);
            work.push((child, i, j, depth + 1));
        }
    }
    units
}

/// The 128 generated models, built once.
pub fn generated_models() -> &'static [(ModelOptions, SentencePiece)] {
    static MODELS: OnceLock<Vec<(ModelOptions, SentencePiece)>> = OnceLock::new();
    MODELS.get_or_init(|| {
        (0..MODEL_VARIANTS)
            .map(|i| {
                let o = ModelOptions::from_index(i);
                let sp = SentencePiece::from_bytes(&generated_model(o))
                    .unwrap_or_else(|e| panic!("generated model {}: {e}", o.name()));
                (o, sp)
            })
            .collect()
    })
}

/// The shared real models (`TOLK_MODELS`, else `models/` or `../shared/models` from the
/// current directory or its parent), loaded once; empty when there are none.
pub fn real_models() -> &'static [SentencePiece] {
    static MODELS: OnceLock<Vec<SentencePiece>> = OnceLock::new();
    MODELS.get_or_init(|| real_model_paths().iter().filter_map(|p| SentencePiece::load(p).ok()).collect())
}

/// The SentencePiece files of the shared models that exist here.
pub fn real_model_paths() -> Vec<std::path::PathBuf> {
    let mut roots: Vec<std::path::PathBuf> = Vec::new();
    if let Ok(p) = std::env::var("TOLK_MODELS") {
        roots.push(p.into());
    }
    for r in ["models", "../shared/models", "../models", "../../shared/models"] {
        roots.push(r.into());
    }
    for root in roots {
        let files: Vec<_> = ["zh-en-ct2/sentencepiece.model", "en-pt-bergamot/vocab.enpt.spm"]
            .iter()
            .map(|rel| root.join(rel))
            .filter(|p| p.is_file())
            .collect();
        if !files.is_empty() {
            return files;
        }
    }
    Vec::new()
}

// ------------------------------------------------------------------ invariants

/// Checks one encoding of `text` against the invariants that hold for every model:
/// - `encode_with_offsets` gives the pieces and ids of `encode_with_ids` / `encode_ids`;
/// - the ranges touch (`end[i] == start[i + 1]`), are ordered, lie inside `text` and on
///   `char` boundaries;
/// - the pieces spell the normalized text (byte pieces standing for their byte);
/// - the ids decode.
///
/// `decoder_strips` is for well-formed models (the generated and the real ones: a
/// charsmap over whole characters, no denormalizer, `▁` a piece): `Some(strip)` checks
/// that the text before the first range normalizes to nothing (or a dummy suffix), and,
/// for text without a literal `▁`, that decoding the pieces gives the normalized text
/// with `▁` turned back into spaces, less a leading one when the decoder strips it
/// (`strip`: the model escapes whitespace and has `add_dummy_prefix` or
/// `remove_extra_whitespaces`).
pub fn check_encoding(sp: &SentencePiece, text: &str, decoder_strips: Option<bool>) -> Vec<EncodedPiece> {
    let with_offsets = sp.encode_with_offsets(text);
    let with_ids = sp.encode_with_ids(text);
    let same = with_offsets.len() == with_ids.len()
        && with_offsets.iter().zip(&with_ids).all(|(a, (p, id))| &a.piece == p && a.id == *id);
    assert!(same, "encode_with_offsets {with_offsets:?} differs from encode_with_ids {with_ids:?} for {text:?}");
    let ids: Vec<u32> = with_ids.iter().map(|p| p.1).collect();
    assert_eq!(sp.encode_ids(text), ids, "encode_ids of {text:?}");
    let mut at = with_offsets.first().map_or(0, |p| p.range.start);
    for p in &with_offsets {
        let r = &p.range;
        assert!(
            r.start == at && r.start <= r.end && r.end <= text.len(),
            "bad range {r:?} (previous end {at}) in {with_offsets:?} for {text:?}"
        );
        assert!(
            text.is_char_boundary(r.start) && text.is_char_boundary(r.end),
            "range {r:?} splits a character of {text:?}"
        );
        at = r.end;
    }
    let normalized = sp.normalize(text);
    let mut spelled: Vec<u8> = Vec::with_capacity(normalized.len());
    for p in &with_offsets {
        match sp.piece_type(p.id) {
            Some(PieceType::Byte) => {
                let hex = p.piece.get(3..5).and_then(|h| u8::from_str_radix(h, 16).ok());
                spelled.push(hex.unwrap_or_else(|| panic!("byte piece {:?}", p.piece)));
            }
            _ => spelled.extend_from_slice(p.piece.as_bytes()),
        }
    }
    assert!(
        spelled == normalized.as_bytes(),
        "pieces {with_offsets:?} do not spell the normalized {normalized:?} of {text:?}"
    );
    assert!(sp.decode_ids(&ids).is_ok(), "the ids of an encoding do not decode: {ids:?}");
    let pieces: Vec<&str> = with_offsets.iter().map(|p| p.piece.as_str()).collect();
    let decoded = sp.decode(&pieces);
    let Some(strip) = decoder_strips else {
        return with_offsets;
    };
    if let Some(first) = with_offsets.first() {
        // Only removed whitespace and deleted characters (normalizing to nothing, or to the
        // dummy suffix of a model that adds one) come before the first piece.
        let head = &text[..first.range.start];
        let n = sp.normalize(head);
        assert!(
            n.is_empty() || n == "▁" || n == " ",
            "text {head:?} before the first piece of {text:?} normalizes to {n:?}"
        );
    }
    let unk = sp.id_to_piece(sp.unk_id()).unwrap_or_default();
    // An unknown run spelling the unknown piece itself decodes to its surface (" ⁇ ").
    if !text.contains('▁') && !pieces.contains(&unk) {
        let expected = match normalized.strip_prefix('▁') {
            Some(rest) if strip => rest.replace('▁', " "),
            _ => normalized.replace('▁', " "),
        };
        assert_eq!(decoded, expected, "decode(encode({text:?})) with pieces {pieces:?}");
    }
    with_offsets
}

/// Strings that every model encodes in the fuzz bodies.
pub const PROBES: &[&str] = &[
    "",
    " ",
    "Hello world!",
    "  ＡＢＣ  ｅ\u{301} ﬁ ① Ⅻ ㍻ ß  ",
    "a\u{3000}b\u{200b}c¦d\te\nf\u{a0}",
    "我爱你 😀 e\u{301}",
    "<sep>abb<unk>▁",
    "\u{0}\u{1}\u{7f}\u{80}\u{ffff}",
];

// ------------------------------------------------------------------ bodies

/// Arbitrary bytes as a SentencePiece model: loading gives a model or an error; a model
/// that loads encodes and decodes the probes, strings cut from the input and strings of
/// its own pieces without panicking and keeps the invariants of [`check_encoding`].
pub fn sentencepiece_model(data: &[u8]) {
    let Ok(sp) = SentencePiece::from_bytes(data) else {
        return;
    };
    let mut texts: Vec<String> = PROBES.iter().map(|s| s.to_string()).collect();
    texts.push(String::from_utf8_lossy(&data[data.len().saturating_sub(48)..]).into_owned());
    let n = sp.len().min(64) as u32;
    let own: String = (0..n).filter_map(|id| sp.id_to_piece(id)).collect::<Vec<_>>().join(" ");
    texts.push(own.chars().take(400).collect());
    for t in &texts {
        check_encoding(&sp, t, None);
    }
    let _ = sp.decode_ids(&[0, 1, 2, n.saturating_sub(1), u32::MAX]);
    let _ = sp.decode_ids(&(0..n).collect::<Vec<_>>());
    let _ = (sp.unk_id(), sp.bos_id(), sp.eos_id(), sp.pad_id());
}

/// The first byte picks a model (a generated one, or a shared real one when present),
/// the rest is text (lossy UTF-8): encoding keeps the invariants of [`check_encoding`],
/// decoding included.
pub fn sentencepiece_encode(data: &[u8]) {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    let generated = generated_models();
    let real = real_models();
    let pick = pick as usize % (generated.len() + real.len());
    match generated.get(pick) {
        Some((o, sp)) => {
            let strips = o.escape_whitespaces && (o.add_dummy_prefix || o.remove_extra_whitespaces);
            check_encoding(sp, &text, Some(strips))
        }
        // Both shared models escape whitespace and add a dummy prefix.
        None => check_encoding(&real[pick - generated.len()], &text, Some(true)),
    };
}

/// Arbitrary bytes as a CTranslate2 `model.bin`: parsing gives a model or an error; every
/// variable and alias of a parsed one reads without panicking.
pub fn ct2_model_bin(data: &[u8]) {
    let Ok(bin) = ModelBin::from_bytes(data) else {
        return;
    };
    let names: Vec<String> = bin.variable_names().chain(bin.alias_names()).map(str::to_string).collect();
    for name in &names {
        let v = bin.resolve(name).unwrap_or_else(|| panic!("{name:?} does not resolve"));
        if let Ok(t) = bin.tensor(name) {
            assert_eq!(t.len(), v.num_elements(), "tensor {name:?} has the wrong length");
        }
        let _ = bin.scalar(name);
        let _ = bin.quantized(name);
        let _ = bin.dtype(name);
        let _ = bin.is_alias_target(name);
        bin.release_variable(name);
    }
    let _ = bin.saved_weight_type();
}

/// Arbitrary bytes (lossy UTF-8) as `config.json` and as a JSON document.
pub fn ct2_config(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let _ = json::parse(&text);
    let _ = Ct2Config::parse(&text);
}

/// The first byte picks the format (JSON array or one token per line), the rest is the
/// vocabulary file: a vocabulary that loads maps its tokens to ids and back.
pub fn ct2_vocabulary(data: &[u8]) {
    let Some((&kind, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    let vocab =
        if kind & 1 == 0 { Vocabulary::from_json(&text, "<unk>") } else { Vocabulary::from_lines(&text, "<unk>") };
    let Ok(v) = vocab else { return };
    assert!(!v.is_empty());
    for id in 0..v.len().min(256) as u32 {
        let token = v.token(id).to_string();
        let back = v.id(&token).expect("a token of the vocabulary has an id");
        assert!(back <= id, "the first occurrence of {token:?} wins");
    }
    assert_eq!(v.token(v.unk_id()), "<unk>");
    let _ = v.id_or_unk("no such token");
    let _ = v.token(u32::MAX);
}

/// Arbitrary bytes as a `vmap.txt` over a small vocabulary; the candidates of a map for
/// sources cut from the input are sorted, unique, inside the vocabulary, and hold the
/// special tokens, the always-candidates and the given target ids.
pub fn ct2_vmap(data: &[u8]) {
    use tolk::format::ct2::VocabularyMap;
    static VOCAB: OnceLock<Vocabulary> = OnceLock::new();
    let vocab = VOCAB.get_or_init(|| {
        let tokens = ["<unk>", "<s>", "</s>", "a", "b", "\u{2581}c", "d e", "\u{e9}"];
        Vocabulary::new(tokens.iter().map(|t| t.to_string()).collect(), "<unk>").unwrap()
    });
    let map = VocabularyMap::parse(data, vocab, ["<unk>", "<s>", "</s>"]);
    let text = String::from_utf8_lossy(data);
    let sources: Vec<Vec<String>> =
        text.lines().take(16).map(|l| l.split([' ', '\t']).map(str::to_string).collect()).collect();
    let out = map.candidates(&sources, [4, 1]);
    assert!(out.windows(2).all(|w| w[0] < w[1]), "not sorted and unique: {out:?}");
    assert!(out.iter().all(|&t| (t as usize) < vocab.len()), "{out:?} past the vocabulary");
    let has = |id: u32| out.binary_search(&id).is_ok();
    assert!([0, 1, 2, 4].into_iter().all(has), "special or target ids missing from {out:?}");
    assert!(map.fixed().iter().all(|&id| has(id)), "always-candidates missing from {out:?}");
    assert!(map.max_ngram() <= data.len() + 1);
}

// ------------------------------------------------------------------ seeds

/// A small valid `model.bin` (version 6): float32, float16, bfloat16, int8 with per-row
/// scales, int16 with a tensor scale, int32, a scalar, and aliases (one of them to a
/// quantized weight, so its `_scale` follows).
pub fn small_model_bin() -> Vec<u8> {
    fn s(out: &mut Vec<u8>, v: &str) {
        out.extend_from_slice(&((v.len() + 1) as u16).to_le_bytes());
        out.extend_from_slice(v.as_bytes());
        out.push(0);
    }
    fn var(out: &mut Vec<u8>, name: &str, shape: &[u32], dtype: u8, data: &[u8]) {
        s(out, name);
        out.push(shape.len() as u8);
        shape.iter().for_each(|d| out.extend_from_slice(&d.to_le_bytes()));
        out.push(dtype);
        out.extend_from_slice(&(data.len() as u32).to_le_bytes());
        out.extend_from_slice(data);
    }
    let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let mut b = Vec::new();
    b.extend_from_slice(&6u32.to_le_bytes());
    s(&mut b, "TransformerSpec");
    b.extend_from_slice(&7u32.to_le_bytes());
    b.extend_from_slice(&8u32.to_le_bytes());
    var(&mut b, "a/weight", &[2, 2], 1, &[10, 246, 127, 0]);
    var(&mut b, "a/weight_scale", &[2], 0, &f32s(&[10.0, 127.0]));
    var(&mut b, "b/bias", &[3], 0, &f32s(&[0.5, -1.0, 2.0]));
    var(&mut b, "h", &[2], 4, &[0x00, 0x38, 0x00, 0xc0]);
    var(&mut b, "g", &[1, 2], 5, &[0x80, 0x3f, 0x00, 0xc0]);
    var(&mut b, "q/weight", &[2], 2, &[100, 0, 206, 255]);
    var(&mut b, "q/weight_scale", &[], 0, &f32s(&[100.0]));
    var(&mut b, "steps", &[], 3, &7i32.to_le_bytes());
    b.extend_from_slice(&2u32.to_le_bytes());
    s(&mut b, "tied/weight");
    s(&mut b, "a/weight");
    s(&mut b, "c/bias");
    s(&mut b, "b/bias");
    b
}

// ------------------------------------------------------------------ Marian models and shortlists

/// Arbitrary bytes as a Marian model (`.bin`, or `.npz` when they start like a ZIP) and
/// as YAML text: loading gives a model or an error; every item of a loaded one reads
/// without panicking, with as many values as its shape says.
pub fn marian_model(data: &[u8]) {
    use tolk::format::marian::{yaml, MarianFile};
    let _ = yaml::parse(&String::from_utf8_lossy(data));
    let Ok(m) = MarianFile::from_bytes(data.to_vec()) else {
        return;
    };
    for item in m.items() {
        assert_eq!(m.get(&item.name), Some(item), "{} is not found by name", item.name);
        let n = item.elements();
        assert_eq!(m.bytes(item).len(), n * item.item_type.element_size(), "{}", item.name);
        if let Ok(v) = m.float_values(&item.name) {
            assert_eq!(v.len(), n, "{}", item.name);
        }
        if let Ok((v, _)) = m.intgemm8(&item.name) {
            assert_eq!(v.len(), n, "{}", item.name);
        }
        if let Ok((v, _)) = m.intgemm16(&item.name) {
            assert_eq!(v.len(), n, "{}", item.name);
        }
        if let Ok(v) = m.intgemm_dequantized(&item.name) {
            assert_eq!(v.len(), n, "{}", item.name);
        }
        let _ = m.quant_mult_a(&item.name);
    }
    let _ = m.model_config();
}

/// Arbitrary bytes as a binary shortlist (checksum verified and not) and as a text one;
/// a shortlist that loads generates, for source ids taken from the input, a sorted set
/// of target ids with Marian's guarantees (the `first` ids, a multiple of 8 unless the
/// vocabulary ran out).
pub fn shortlist(data: &[u8]) {
    use tolk::format::shortlist::Shortlist;
    let vocabulary = 1 + data.first().map_or(0, |&b| usize::from(b) * 3);
    let mut ids: Vec<u32> = data.iter().rev().take(24).map(|&b| u32::from(b) % 80).collect();
    ids.push(u32::MAX);
    let check = |s: &Shortlist, shared: bool| {
        let out = s.generate(&ids, vocabulary, shared);
        assert!(out.windows(2).all(|w| w[0] < w[1]), "not sorted and unique: {out:?}");
        assert!(out.iter().all(|&t| (t as usize) < vocabulary), "{out:?} past {vocabulary}");
        let first = s.first().min(vocabulary);
        assert!(out.iter().take(first).copied().eq(0..first as u32), "the first {first} ids are not all in {out:?}");
        // The padding stops short of a multiple of 8 only when every id is taken.
        assert!(out.len().is_multiple_of(8) || out.len() == vocabulary, "{} ids: {out:?}", out.len());
        if shared {
            let mut inside = ids.iter().filter(|&&i| (i as usize) < vocabulary);
            assert!(inside.all(|i| out.binary_search(i).is_ok()), "a shared source id is missing");
        }
        let _ = s.check_target_vocabulary(vocabulary);
    };
    for verify in [false, true] {
        if let Ok(s) = Shortlist::from_binary_bytes(data, verify) {
            check(&s, verify);
            for i in 0..s.source_words().min(64) as u32 {
                let _ = s.candidates(i);
            }
        }
    }
    let text = String::from_utf8_lossy(data);
    let id =
        |w: &str| (!w.starts_with('x')).then(|| w.bytes().fold(7u32, |h, b| h.wrapping_mul(31) ^ u32::from(b)) % 97);
    if let Ok(s) = Shortlist::from_text(&text, Some(3), Some(2), id, id) {
        check(&s, true);
        check(&s, false);
    }
}

/// A Marian `.bin` as `saveItems` writes it: items `(name, type code, shape, data)`,
/// the data padded to 256 bytes each.
pub fn marian_bin(items: &[(&str, u64, Vec<i32>, Vec<u8>)]) -> Vec<u8> {
    let mut b = Vec::new();
    let u64s = |b: &mut Vec<u8>, v: u64| b.extend_from_slice(&v.to_le_bytes());
    u64s(&mut b, 1);
    u64s(&mut b, items.len() as u64);
    for (name, code, shape, data) in items {
        for v in [name.len() + 1, *code as usize, shape.len(), data.len().next_multiple_of(256)] {
            u64s(&mut b, v as u64);
        }
    }
    for (name, ..) in items {
        b.extend_from_slice(name.as_bytes());
        b.push(0);
    }
    for (_, _, shape, _) in items {
        shape.iter().for_each(|d| b.extend_from_slice(&d.to_le_bytes()));
    }
    let next = ((b.len() + 8) / 256 + 1) * 256;
    let padding = next - b.len() - 8;
    u64s(&mut b, padding as u64);
    b.resize(next, 0);
    for (.., data) in items {
        b.extend_from_slice(data);
        b.resize(b.len().next_multiple_of(256), 0);
    }
    b
}

pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// intgemm data: the values, then the float32 quantMult.
pub fn intgemm_bytes(values: &[u8], quant_mult: f32) -> Vec<u8> {
    let mut b = values.to_vec();
    b.extend_from_slice(&quant_mult.to_le_bytes());
    b
}

/// The items of [`small_marian_bin`]: every type Tolk reads and both kinds of
/// activation scale.
pub fn small_marian_items() -> Vec<(&'static str, u64, Vec<i32>, Vec<u8>)> {
    let yml = b"type: transformer\ndim-emb: 2\ndec-cell: ssru\nvocabs: [a, b]\n\0".to_vec();
    vec![
        ("Wemb", 0x4101, vec![3, 2], intgemm_bytes(&[127, 0x81, 5, 0, 0xfb, 64], 12.5)),
        ("Wemb_QuantMultA", 0x4101, vec![1, 1], intgemm_bytes(&[127], 14.0)),
        ("decoder_b", 0x404, vec![1, 3], f32_bytes(&[0.5, -1.0, 2.0])),
        ("decoder_h", 0x402, vec![1, 2], vec![0x00, 0x38, 0x00, 0xc0]),
        ("encoder_W", 0x10001, vec![2, 2], intgemm_bytes(&[1, 2, 3, 0xfc], 8.0)),
        ("encoder_W_QuantMultA", 0x404, vec![1, 1], f32_bytes(&[3.25])),
        ("encoder_W16", 0x4102, vec![1, 2], intgemm_bytes(&[0x00, 0x04, 0xff, 0xff], 1024.0)),
        ("steps", 0x104, vec![1], 7i32.to_le_bytes().to_vec()),
        ("special:model.yml", 0x101, vec![yml.len() as i32], yml),
    ]
}

/// A small valid Marian `.bin` ([`small_marian_items`]).
pub fn small_marian_bin() -> Vec<u8> {
    marian_bin(&small_marian_items())
}

/// A `.npy` (version 1) array as numpy writes it.
pub fn npy(descr: &str, shape: &[usize], data: &[u8]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut b = b"\x93NUMPY\x01\x00".to_vec();
    b.extend_from_slice(&(header.len() as u16).to_le_bytes());
    b.extend_from_slice(header.as_bytes());
    b.extend_from_slice(data);
    b
}

/// A ZIP archive of `NAME.npy` entries (stored, or deflated with [`deflate_fixed`]).
pub fn npz(arrays: &[(&str, Vec<u8>)], deflate: bool) -> Vec<u8> {
    let (mut out, mut central) = (Vec::new(), Vec::new());
    let u16s = |b: &mut Vec<u8>, v: usize| b.extend_from_slice(&(v as u16).to_le_bytes());
    let u32s = |b: &mut Vec<u8>, v: usize| b.extend_from_slice(&(v as u32).to_le_bytes());
    for (name, npy) in arrays {
        let file = format!("{name}.npy");
        let (method, body) = if deflate { (8, deflate_fixed(npy)) } else { (0, npy.clone()) };
        let crc = tolk::format::marian::npz::crc32(npy) as usize;
        let offset = out.len();
        u32s(&mut out, 0x0403_4b50);
        for v in [20, 0, method, 0, 0] {
            u16s(&mut out, v);
        }
        for v in [crc, body.len(), npy.len()] {
            u32s(&mut out, v);
        }
        u16s(&mut out, file.len());
        u16s(&mut out, 0);
        out.extend_from_slice(file.as_bytes());
        out.extend_from_slice(&body);
        u32s(&mut central, 0x0201_4b50);
        for v in [20, 20, 0, method, 0, 0] {
            u16s(&mut central, v);
        }
        for v in [crc, body.len(), npy.len()] {
            u32s(&mut central, v);
        }
        for v in [file.len(), 0, 0, 0, 0] {
            u16s(&mut central, v);
        }
        u32s(&mut central, 0);
        u32s(&mut central, offset);
        central.extend_from_slice(file.as_bytes());
    }
    let cd_offset = out.len();
    out.extend_from_slice(&central);
    u32s(&mut out, 0x0605_4b50);
    for v in [0, 0, arrays.len(), arrays.len()] {
        u16s(&mut out, v);
    }
    u32s(&mut out, central.len());
    u32s(&mut out, cd_offset);
    u16s(&mut out, 0);
    out
}

/// The arrays of a small Marian `.npz`: config, float32 matrix, float16 and int32 vectors.
pub fn small_marian_arrays() -> Vec<(&'static str, Vec<u8>)> {
    let yml = b"type: transformer\ndim-emb: 2\n\0";
    vec![
        ("special:model.yml", npy("|i1", &[yml.len()], yml)),
        ("Wemb", npy("<f4", &[3, 2], &f32_bytes(&[1.0, -2.0, 0.5, 0.5, 0.5, 0.5]))),
        ("decoder_h", npy("<f2", &[2], &[0x00, 0x38, 0x00, 0xc0])),
        ("steps", npy("<i4", &[], &7i32.to_le_bytes())),
    ]
}

/// Deflate (RFC 1951) with one fixed-Huffman block and greedy matches: small, valid
/// streams with back-references for seeds and tests.
pub fn deflate_fixed(data: &[u8]) -> Vec<u8> {
    const LEN_BASE: [usize; 29] = [
        3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227,
        258,
    ];
    const LEN_EXTRA: [u32; 29] =
        [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0];
    const DIST_BASE: [usize; 30] = [
        1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769, 1025, 1537, 2049, 3073, 4097,
        6145, 8193, 12289, 16385, 24577,
    ];
    const DIST_EXTRA: [u32; 30] =
        [0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13];
    struct W {
        out: Vec<u8>,
        acc: u64,
        n: u32,
    }
    impl W {
        fn bits(&mut self, v: u32, n: u32) {
            self.acc |= u64::from(v) << self.n;
            self.n += n;
            while self.n >= 8 {
                self.out.push(self.acc as u8);
                self.acc >>= 8;
                self.n -= 8;
            }
        }
        /// A Huffman code, most significant bit first.
        fn code(&mut self, code: u32, n: u32) {
            self.bits(code.reverse_bits() >> (32 - n), n);
        }
        fn symbol(&mut self, s: usize) {
            match s {
                0..=143 => self.code(0x30 + s as u32, 8),
                144..=255 => self.code(0x190 + (s - 144) as u32, 9),
                256..=279 => self.code((s - 256) as u32, 7),
                _ => self.code(0xc0 + (s - 280) as u32, 8),
            }
        }
    }
    let mut w = W { out: Vec::new(), acc: 0, n: 0 };
    w.bits(1, 1);
    w.bits(1, 2);
    let mut i = 0;
    while i < data.len() {
        let (mut best, mut at) = (0, 0);
        for j in i.saturating_sub(4096)..i {
            let l = (0..258.min(data.len() - i)).take_while(|&k| data[j + k] == data[i + k]).count();
            if l > best {
                (best, at) = (l, j);
            }
        }
        if best < 3 {
            w.symbol(usize::from(data[i]));
            i += 1;
            continue;
        }
        let k = LEN_BASE.iter().rposition(|&b| b <= best).unwrap();
        w.symbol(257 + k);
        w.bits((best - LEN_BASE[k]) as u32, LEN_EXTRA[k]);
        let d = i - at;
        let k = DIST_BASE.iter().rposition(|&b| b <= d).unwrap();
        w.code(k as u32, 5);
        w.bits((d - DIST_BASE[k]) as u32, DIST_EXTRA[k]);
        i += best;
    }
    w.symbol(256);
    if w.n > 0 {
        w.out.push(w.acc as u8);
    }
    w.out
}

/// A binary shortlist (`lex.*.s2t.bin`) with one sorted list per source word and a
/// correct checksum.
pub fn binary_shortlist(first: u64, best: u64, lists: &[&[u32]]) -> Vec<u8> {
    let mut offsets = vec![0u64];
    lists.iter().for_each(|l| offsets.push(offsets.last().unwrap() + l.len() as u64));
    let ids: Vec<u32> = lists.iter().flat_map(|l| l.iter().copied()).collect();
    let mut b = Vec::new();
    let words = [tolk::format::shortlist::MAGIC, 0, first, best, offsets.len() as u64, ids.len() as u64];
    words.iter().chain(&offsets).for_each(|v| b.extend_from_slice(&v.to_le_bytes()));
    ids.iter().for_each(|v| b.extend_from_slice(&v.to_le_bytes()));
    let sum =
        tolk::format::shortlist::checksum(b[16..].chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())));
    b[8..16].copy_from_slice(&sum.to_le_bytes());
    b
}

// ------------------------------------------------------------------ packages in memory

/// Named files as one input: for each, a `u8` name length, the name, a `u32` size and the
/// bytes ([`unpack`] reads it back).
pub fn pack(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, bytes) in files {
        out.push(name.len() as u8);
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        out.extend_from_slice(bytes);
    }
    out
}

/// The files of a [`pack`]ed input, leniently: names are lossy UTF-8, a file cut short
/// keeps the bytes there are, an entry cut inside its header is dropped.
pub fn unpack(mut data: &[u8]) -> Vec<(String, &[u8])> {
    let mut files = Vec::new();
    while let Some((&len, rest)) = data.split_first() {
        let Some((name, rest)) = rest.split_at_checked(len as usize) else { break };
        let Some((size, rest)) = rest.split_at_checked(4) else { break };
        let size = (u32::from_le_bytes(size.try_into().expect("4 bytes")) as usize).min(rest.len());
        files.push((String::from_utf8_lossy(name).into_owned(), &rest[..size]));
        data = &rest[size..];
    }
    files
}

/// Arbitrary bytes as a [`pack`]ed package loaded with `Model::load_from_memory` on the
/// CPU: names and sizes are fuzzed with the contents (duplicated, missing, empty, odd
/// names), so detection, every loader and the tokenizer search run over memory. Loading
/// gives a model or an error; a model that loads translates tokens (and text, with a
/// tokenizer), also with a translator of another compute type, which loads the weights
/// again from the model's copy of the files.
pub fn package_from_memory(data: &[u8]) {
    use tolk::{ComputeType, DeviceRequest, LoadOptions, Model, TextOptions, TranslateOptions, Translator, TranslatorConfig};
    let files = unpack(data);
    let options = LoadOptions { device: DeviceRequest::Cpu, ..LoadOptions::default() };
    let Ok(model) = Model::load_from_memory(&files, &options) else {
        return;
    };
    let opts = TranslateOptions { beam_size: 2, max_decoding_length: 6, ..TranslateOptions::default() };
    for compute_type in [ComputeType::Default, ComputeType::Int16] {
        let config = TranslatorConfig { compute_type, ..TranslatorConfig::default() };
        let Ok(t) = Translator::with_config(&model, &config) else { continue };
        let _ = t.translate_batch(&[vec!["w3".to_string(), "w7".into()]], None, &opts);
        if model.tokenizer().is_some() {
            let _ = t.translate_text(&["Hello world. Ação!"], &opts, &TextOptions::default());
        }
    }
}
