//! SentencePiece tests that need no Python: the shared models parse and encode fixed
//! strings as the reference library does (expectations taken from the `sentencepiece`
//! package 0.2), decoding inverts encoding, and truncated or garbage model files give
//! errors without panicking.
//!
//! Three ignored tests are driven by tests/python/test_sentencepiece.py:
//! `write_generated_models` (TOLK_SPM_GENERATED_DIR: writes the generated models of
//! fuzz/src/lib.rs for the reference to encode), `compare_with_reference`
//! (TOLK_SPM_REFERENCE: the reference's outputs, byte offsets included) and
//! `bench_encode` (TOLK_SPM_BENCH_MODEL, TOLK_SPM_BENCH_DATA, TOLK_SPM_BENCH_REPEATS).
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;

use tolk::text::sentencepiece::EncodedPiece;
use tolk::text::SentencePiece;
use tolk::ErrorKind;

/// The fuzz targets' bodies and generated models (shared with tests/fuzz_parsers.rs).
#[allow(dead_code)]
#[path = "../fuzz/src/lib.rs"]
mod fuzz_bodies;

use fuzz_bodies::{bytes_field, piece_proto, varint_field};

const ZH_EN: &str = "zh-en-ct2/sentencepiece.model";
const EN_PT: &str = "en-pt-bergamot/vocab.enpt.spm";

fn models_root() -> PathBuf {
    if let Ok(p) = std::env::var("TOLK_MODELS") {
        return PathBuf::from(p);
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    for p in [root.join("models"), root.join("../shared/models")] {
        if p.is_dir() {
            return p;
        }
    }
    root.join("models")
}

fn model(rel: &str) -> Option<SentencePiece> {
    let path = models_root().join(rel);
    if !path.is_file() {
        eprintln!("skipping: {} not found (set TOLK_MODELS)", path.display());
        return None;
    }
    Some(SentencePiece::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
}

fn check(sp: &SentencePiece, text: &str, pieces: &[&str], ids: &[u32], decoded: &str) {
    assert_eq!(sp.encode(text), pieces, "pieces of {text:?}");
    assert_eq!(sp.encode_ids(text), ids, "ids of {text:?}");
    assert_eq!(sp.decode_ids(ids).unwrap(), decoded, "decode of {text:?}");
    // Decoding pieces equals decoding ids except for unknown pieces, kept as they are.
    if !ids.contains(&sp.unk_id()) {
        assert_eq!(
            sp.decode(&sp.encode(text)),
            decoded,
            "decode pieces of {text:?}"
        );
    }
}

#[test]
fn zh_en_model_matches_reference_on_fixed_strings() {
    let Some(sp) = model(ZH_EN) else { return };
    assert_eq!(sp.len(), 32000);
    assert_eq!(
        (sp.unk_id(), sp.bos_id(), sp.eos_id(), sp.pad_id()),
        (0, Some(1), Some(2), None)
    );
    check(&sp, "我爱你", &["▁我爱你"], &[12228], "我爱你");
    check(
        &sp,
        "Hello world!",
        &["▁H", "ello", "▁w", "or", "l", "d", "!"],
        &[2372, 26259, 8819, 2309, 1928, 244, 47],
        "Hello world!",
    );
    check(
        &sp,
        "  ＡＢＣ  １２３ ",
        &["▁", "AB", "C", "▁", "123"],
        &[4, 13581, 151, 4, 11295],
        "ABC 123",
    );
    check(
        &sp,
        "Olá, coração! 😀",
        &[
            "▁", "Ol", "á", ",", "▁", "co", "ra", "ç", "ã", "o", "!", "▁", "😀",
        ],
        &[
            4, 27985, 6413, 3, 4, 6085, 2765, 30764, 24998, 1032, 47, 4, 0,
        ],
        "Olá, coração!  ⁇ ",
    );
    check(
        &sp,
        "e\u{301} ﬁ ①",
        &["▁", "é", "▁", "fi", "▁1"],
        &[4, 5015, 4, 13556, 1627],
        "é fi 1",
    );
    check(&sp, "", &[], &[], "");
    check(&sp, "   ", &[], &[], "");
}

#[test]
fn en_pt_model_matches_reference_on_fixed_strings() {
    let Some(sp) = model(EN_PT) else { return };
    assert_eq!(sp.len(), 32000);
    assert_eq!(
        (sp.unk_id(), sp.bos_id(), sp.eos_id(), sp.pad_id()),
        (1, None, Some(0), None)
    );
    // Unknown characters in a row merge into one unknown piece.
    check(&sp, "我爱你", &["▁", "我爱你"], &[13, 1], " ⁇ ");
    check(
        &sp,
        "Hello world!",
        &["▁Hello", "▁world", "!"],
        &[9086, 391, 103],
        "Hello world!",
    );
    check(
        &sp,
        "  ＡＢＣ  １２３ ",
        &["▁ABC", "▁123"],
        &[19244, 18573],
        "ABC 123",
    );
    check(
        &sp,
        "Olá, coração! 😀",
        &["▁Olá", ",", "▁coração", "!", "▁", "😀"],
        &[13602, 2, 1756, 103, 13, 1],
        "Olá, coração!  ⁇ ",
    );
    check(
        &sp,
        "e\u{301} ﬁ ①",
        &["▁é", "▁fi", "▁1"],
        &[35, 3647, 92],
        "é fi 1",
    );
}

#[test]
fn piece_lookups_and_out_of_range_ids() {
    let Some(sp) = model(EN_PT) else { return };
    assert_eq!(sp.piece_to_id("▁Hello"), 9086);
    assert_eq!(sp.id_to_piece(9086), Some("▁Hello"));
    assert_eq!(sp.piece_to_id("no such piece at all"), sp.unk_id());
    assert_eq!(sp.find_piece("no such piece at all"), None);
    assert_eq!(sp.id_to_piece(32000), None);
    let err = sp.decode_ids(&[9086, 32000]).unwrap_err();
    assert_eq!(err.kind, ErrorKind::OutOfRange);
}

/// `encode_with_offsets` as (piece, id, begin, end), to compare with the reference's
/// `SentencePieceText` (`sp.encode(text, out_type="serialized_proto")` in Python).
fn offsets(sp: &SentencePiece, text: &str) -> Vec<(String, u32, usize, usize)> {
    sp.encode_with_offsets(text)
        .into_iter()
        .map(|p| (p.piece, p.id, p.range.start, p.range.end))
        .collect()
}

fn expect_offsets(sp: &SentencePiece, text: &str, expected: &[(&str, u32, usize, usize)]) {
    let expected: Vec<(String, u32, usize, usize)> = expected
        .iter()
        .map(|&(p, id, b, e)| (p.to_string(), id, b, e))
        .collect();
    assert_eq!(offsets(sp, text), expected, "offsets of {text:?}");
}

#[test]
fn zh_en_offsets_match_reference() {
    let Some(sp) = model(ZH_EN) else { return };
    // Expectations from sentencepiece 0.2.3 (`begin`/`end` of the pieces).
    expect_offsets(
        &sp,
        "  ＡＢＣ  １２３ ",
        &[
            ("▁", 4, 2, 2),
            ("AB", 13581, 2, 8),
            ("C", 151, 8, 11),
            ("▁", 4, 11, 13),
            ("123", 11295, 13, 22),
        ],
    );
    expect_offsets(
        &sp,
        "e\u{301} ﬁ ①",
        &[
            ("▁", 4, 0, 0),
            ("é", 5015, 0, 3),
            ("▁", 4, 3, 4),
            ("fi", 13556, 4, 7),
            ("▁1", 1627, 7, 11),
        ],
    );
    // Unknown characters in a row merge into one piece covering them all.
    expect_offsets(
        &sp,
        "我爱你 😀😀 x",
        &[
            ("▁我爱你", 12228, 0, 9),
            ("▁", 4, 9, 10),
            ("😀😀", 0, 10, 18),
            ("▁", 4, 18, 19),
            ("x", 3067, 19, 20),
        ],
    );
    // One character rewritten into two: the piece ending inside it covers nothing.
    expect_offsets(
        &sp,
        "㍻",
        &[("▁", 4, 0, 0), ("平", 2149, 0, 0), ("成", 758, 0, 3)],
    );
    // Removed whitespace belongs to the piece after it.
    expect_offsets(&sp, "a  b ", &[("▁a", 1780, 0, 1), ("▁b", 2961, 1, 4)]);
    expect_offsets(&sp, "", &[]);
    expect_offsets(&sp, "   ", &[]);
}

#[test]
fn en_pt_offsets_match_reference() {
    let Some(sp) = model(EN_PT) else { return };
    expect_offsets(
        &sp,
        "  ＡＢＣ  １２３ ",
        &[("▁ABC", 19244, 2, 11), ("▁123", 18573, 11, 22)],
    );
    expect_offsets(
        &sp,
        "我爱你 😀😀 x",
        &[
            ("▁", 13, 0, 0),
            ("我爱你", 1, 0, 9),
            ("▁", 13, 9, 10),
            ("😀😀", 1, 10, 18),
            ("▁x", 1104, 18, 20),
        ],
    );
    expect_offsets(&sp, "㍻", &[("▁", 13, 0, 0), ("平成", 1, 0, 3)]);
    let text = "Olá, coração! 😀";
    for p in sp.encode_with_offsets(text) {
        assert!(text.get(p.range.clone()).is_some(), "{p:?}");
    }
}

/// The generated models of fuzz/src/lib.rs (a charsmap whose rules expand, delete and
/// produce spaces; byte fallback; every whitespace flag), expectations from the reference.
#[test]
fn generated_models_offsets_match_reference() {
    use fuzz_bodies::{generated_model, ModelOptions};
    let load = |index: usize| {
        SentencePiece::from_bytes(&generated_model(ModelOptions::from_index(index))).unwrap()
    };
    // Unigram, charsmap, default whitespace handling. Deleted characters (U+200B) and
    // removed spaces belong to the piece before the next output; `¦` becomes " | ", whose
    // spaces are pieces of their own.
    let sp = load(0);
    expect_offsets(
        &sp,
        " ﬁ\u{200b}¦ab\u{3000}\u{3000}ｅ\u{301}x ",
        &[
            ("▁fi", 63, 1, 7),
            ("▁", 3, 7, 7),
            ("|", 49, 7, 7),
            ("▁ab", 56, 7, 11),
            ("▁é", 70, 11, 22),
            ("x", 27, 22, 23),
        ],
    );
    expect_offsets(
        &sp,
        " a  ¦ b ",
        &[
            ("▁a", 54, 1, 2),
            ("▁", 3, 2, 4),
            ("|", 49, 4, 4),
            ("▁", 3, 4, 7),
            ("b", 5, 7, 8),
        ],
    );
    expect_offsets(
        &sp,
        "㍻Ⅻ",
        &[
            ("▁", 3, 0, 0),
            ("平", 53, 0, 0),
            ("成", 0, 0, 3),
            ("XII", 67, 3, 6),
        ],
    );
    expect_offsets(&sp, "a成😀", &[("▁a", 54, 0, 1), ("成😀", 0, 1, 8)]);
    // A replacement ending in a space at the end of the text: the removed trailing space
    // comes from `¦`, so the text consumed ends where `¦` starts.
    expect_offsets(
        &sp,
        "a¦",
        &[("▁a", 54, 0, 1), ("▁", 3, 1, 1), ("|", 49, 1, 1)],
    );
    expect_offsets(
        &sp,
        "ab <sep>abb",
        &[
            ("▁ab", 56, 0, 2),
            ("▁", 3, 2, 3),
            ("<sep>", 73, 3, 8),
            ("ab", 55, 8, 10),
            ("b", 5, 10, 11),
        ],
    );
    // Byte fallback: the last byte piece covers the character, the others nothing.
    let sp = load(2);
    expect_offsets(
        &sp,
        "a成😀",
        &[
            ("▁a", 54, 0, 1),
            ("<0xE6>", 305, 1, 1),
            ("<0x88>", 211, 1, 1),
            ("<0x90>", 219, 1, 4),
            ("<0xF0>", 315, 4, 4),
            ("<0x9F>", 234, 4, 4),
            ("<0x98>", 227, 4, 4),
            ("<0x80>", 203, 4, 8),
        ],
    );
    expect_offsets(
        &sp,
        "㍻Ⅻ",
        &[
            ("▁", 3, 0, 0),
            ("平", 53, 0, 0),
            ("<0xE6>", 305, 0, 0),
            ("<0x88>", 211, 0, 0),
            ("<0x90>", 219, 0, 3),
            ("XII", 67, 3, 6),
        ],
    );
    // BPE: a merge into the UNUSED `abb` is split back into `ab` + `b` where it is (the
    // reference keys the split by text; the parts must not take another occurrence's
    // place).
    let sp = load(1);
    expect_offsets(
        &sp,
        "xabbxabb",
        &[
            ("▁", 3, 0, 0),
            ("x", 27, 0, 1),
            ("ab", 55, 1, 3),
            ("b", 5, 3, 4),
            ("x", 27, 4, 5),
            ("ab", 55, 5, 7),
            ("b", 5, 7, 8),
        ],
    );
    // BPE, no dummy prefix, spaces as suffixes.
    let sp = load(0b100101);
    expect_offsets(
        &sp,
        " a  ¦ b ",
        &[
            ("a", 4, 1, 2),
            ("▁", 3, 2, 4),
            ("|", 49, 4, 4),
            ("▁", 3, 4, 7),
            ("b", 5, 7, 8),
        ],
    );
    expect_offsets(&sp, "a成😀", &[("a", 4, 0, 1), ("成😀", 0, 1, 8)]);
}

/// Equal-scoring segmentations: the reference (0.2.3) sums path scores in single
/// precision and keeps the first best path found, so `s` + `ss` (found first) beats the
/// equal `ss` + `s`, and `▁▁` beats `▁` + `▁`. Summing in double precision (as 0.2.1
/// did) picks the other one in these cases.
#[test]
fn unigram_ties_break_as_the_reference() {
    use fuzz_bodies::{generated_model, ModelOptions};
    let load = |index: usize| {
        SentencePiece::from_bytes(&generated_model(ModelOptions::from_index(index))).unwrap()
    };
    let sp = load(0);
    assert_eq!(sp.encode("Asss"), ["▁", "A", "s", "ss"]);
    assert_eq!(sp.encode("ab  abb"), ["▁ab", "▁ab", "b"]);
    let sp = load(8); // remove_extra_whitespaces off
    expect_offsets(
        &sp,
        "b¦¦",
        &[
            ("▁", 3, 0, 0),
            ("b", 5, 0, 1),
            ("▁", 3, 1, 1),
            ("|", 49, 1, 1),
            ("▁▁", 71, 1, 3),
            ("|", 49, 3, 3),
            ("▁", 3, 3, 5),
        ],
    );
}

/// A hand-built ModelProto (the wire format written out by hand).
fn tiny_model(model_type: u64, byte_fallback: bool, pieces: &[(&str, f32, u64)]) -> Vec<u8> {
    let mut m = Vec::new();
    for &(p, s, k) in pieces {
        bytes_field(1, &piece_proto(p, s, k), &mut m);
    }
    let mut ts = Vec::new();
    varint_field(3, model_type, &mut ts);
    varint_field(35, byte_fallback as u64, &mut ts);
    varint_field(43, u64::MAX, &mut ts); // pad_id = -1
    bytes_field(2, &ts, &mut m);
    let mut ns = Vec::new();
    bytes_field(1, b"identity", &mut ns);
    bytes_field(3, &ns, &mut m);
    m
}

fn tiny_unigram() -> Vec<u8> {
    tiny_model(
        1,
        false,
        &[
            ("<unk>", 0.0, 2),
            ("<s>", 0.0, 3),
            ("</s>", 0.0, 3),
            ("▁", -2.0, 1),
            ("a", -3.0, 1),
            ("b", -3.0, 1),
            ("ab", -2.5, 1),
            ("▁ab", -1.0, 1),
            ("<sep>", 0.0, 4),
            ("abb", -0.5, 5),
        ],
    )
}

#[test]
fn hand_built_unigram_model_segments_by_score() {
    let sp = SentencePiece::from_bytes(&tiny_unigram()).unwrap();
    assert_eq!(sp.len(), 10);
    assert_eq!(sp.encode("ab ab"), ["▁ab", "▁ab"]);
    // "abb" is UNUSED: never produced; "x" and "y" are unknown and merge.
    assert_eq!(sp.encode("abb"), ["▁ab", "b"]);
    assert_eq!(sp.encode("xy a"), ["▁", "xy", "▁", "a"]);
    assert_eq!(sp.encode_ids("xy a"), [3, 0, 3, 4]);
    // A user-defined symbol is kept whole, even inside a word.
    assert_eq!(sp.encode("a<sep>b"), ["▁", "a", "<sep>", "b"]);
    // "▁a" is not a piece: an unknown piece decodes verbatim (as the reference does).
    assert_eq!(sp.decode(&["▁ab", "<s>", "▁a", "<unk>", "zz"]), "ab▁a ⁇ zz");
}

#[test]
fn hand_built_byte_fallback_and_bpe_models() {
    let mut pieces: Vec<(String, f32, u64)> = vec![
        ("<unk>".into(), 0.0, 2),
        ("▁".into(), -1.0, 1),
        ("a".into(), -1.0, 1),
        ("b".into(), -1.0, 1),
        ("ab".into(), -0.5, 1),
        ("▁ab".into(), -0.1, 1),
    ];
    for b in 0..=255u8 {
        pieces.push((format!("<0x{b:02X}>"), 0.0, 6));
    }
    let refs: Vec<(&str, f32, u64)> = pieces
        .iter()
        .map(|(p, s, k)| (p.as_str(), *s, *k))
        .collect();
    let sp = SentencePiece::from_bytes(&tiny_model(1, true, &refs)).unwrap();
    // "é" is unknown: its two UTF-8 bytes come out as byte pieces and decode back.
    assert_eq!(sp.encode("abé"), ["▁ab", "<0xC3>", "<0xA9>"]);
    assert_eq!(sp.decode(&sp.encode("abé")), "abé");
    assert_eq!(sp.decode(&["<0xC3>"]), "\u{FFFD}");
    // Without the byte pieces, byte_fallback is an error.
    assert!(SentencePiece::from_bytes(&tiny_model(1, true, &refs[..8])).is_err());
    // The same vocabulary as BPE merges pairs by score.
    let bpe = SentencePiece::from_bytes(&tiny_model(2, false, &refs[..6])).unwrap();
    assert_eq!(bpe.encode("ab ba"), ["▁ab", "▁", "b", "a"]);
    assert_eq!(bpe.encode("ab ba c"), ["▁ab", "▁", "b", "a", "▁", "c"]);
    assert_eq!(bpe.encode_ids("c"), [1, 0]);
}

#[test]
fn invalid_models_are_errors() {
    let bad = |p: &[(&str, f32, u64)]| {
        SentencePiece::from_bytes(&tiny_model(1, false, p))
            .err()
            .map(|e| e.kind)
    };
    assert_eq!(
        bad(&[("a", 0.0, 1)]),
        Some(ErrorKind::InvalidModel),
        "no unk"
    );
    assert_eq!(
        bad(&[("<unk>", 0.0, 2), ("a", 0.0, 1), ("a", 0.0, 1)]),
        Some(ErrorKind::InvalidModel),
        "duplicate"
    );
    assert_eq!(
        bad(&[("<unk>", 0.0, 2), ("", 0.0, 1)]),
        Some(ErrorKind::InvalidModel),
        "empty piece"
    );
    assert_eq!(
        bad(&[("<unk>", 0.0, 2), ("<0x41>", 0.0, 6)]),
        Some(ErrorKind::InvalidModel),
        "byte without fallback"
    );
    assert!(
        SentencePiece::from_bytes(&tiny_model(3, false, &[("<unk>", 0.0, 2)])).is_err(),
        "word model"
    );
    assert!(SentencePiece::from_bytes(b"").is_err());
    assert_eq!(
        SentencePiece::load("/nonexistent/x.model")
            .err()
            .map(|e| e.kind),
        Some(ErrorKind::Io)
    );
}

fn never_panics(bytes: &[u8]) -> bool {
    match catch_unwind(AssertUnwindSafe(|| {
        if let Ok(sp) = SentencePiece::from_bytes(bytes) {
            let pieces = sp.encode("Hello ＡＢＣ world 我爱你 😀 e\u{301}  ");
            let _ = sp.decode(&pieces);
            let _ = sp.decode_ids(&sp.encode_ids("abc a b"));
        }
    })) {
        Ok(()) => true,
        Err(_) => false,
    }
}

#[test]
fn truncated_and_corrupted_models_never_panic() {
    let mut blobs = vec![tiny_unigram()];
    for rel in [ZH_EN, EN_PT] {
        if let Ok(b) = std::fs::read(models_root().join(rel)) {
            blobs.push(b);
        }
    }
    for blob in &blobs {
        // Truncations: every offset of the small model; ~300 spread offsets of big ones,
        // plus the whole end region (the normalizer spec with its charsmap is at the end).
        let n = blob.len();
        let mut cuts: Vec<usize> = if n < 4096 {
            (0..n).collect()
        } else {
            (0..300).map(|i| i * n / 300).collect()
        };
        cuts.extend(n.saturating_sub(200)..n);
        for cut in cuts {
            let r = catch_unwind(AssertUnwindSafe(|| SentencePiece::from_bytes(&blob[..cut])));
            assert!(r.is_ok(), "panic on a model truncated at {cut}/{n}");
            assert!(
                never_panics(&blob[..cut]),
                "panic using a model truncated at {cut}/{n}"
            );
        }
        // Bit flips and byte overwrites at pseudo-random places (xorshift).
        let mut state = 0x9E3779B97F4A7C15u64 ^ n as u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let rounds = if n < 4096 { 2000 } else { 60 };
        for _ in 0..rounds {
            let mut b = blob.clone();
            for _ in 0..1 + next() % 4 {
                let at = (next() % n as u64) as usize;
                b[at] = next() as u8;
            }
            assert!(never_panics(&b), "panic on a corrupted model");
        }
    }
    // Pure garbage.
    let mut state = 12345u64;
    for len in [1usize, 2, 5, 10, 100, 1000] {
        for _ in 0..50 {
            let b: Vec<u8> = (0..len)
                .map(|_| {
                    state = state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    (state >> 33) as u8
                })
                .collect();
            assert!(never_panics(&b));
        }
    }
}

fn unhex(s: &str) -> String {
    if s == "-" {
        return String::new();
    }
    let bytes: Vec<u8> = (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    String::from_utf8(bytes).unwrap()
}

/// Writes the generated models of fuzz/src/lib.rs as `<index>-<name>.model` into
/// TOLK_SPM_GENERATED_DIR, for tests/python/test_sentencepiece.py to encode with the
/// reference.
#[test]
#[ignore]
fn write_generated_models() {
    use fuzz_bodies::{generated_model, ModelOptions, MODEL_VARIANTS};
    let dir = PathBuf::from(
        std::env::var("TOLK_SPM_GENERATED_DIR").expect("TOLK_SPM_GENERATED_DIR not set"),
    );
    std::fs::create_dir_all(&dir).unwrap();
    for i in 0..MODEL_VARIANTS {
        let o = ModelOptions::from_index(i);
        std::fs::write(
            dir.join(format!("{i:03}-{}.model", o.name())),
            generated_model(o),
        )
        .unwrap();
    }
    println!("spm-generated {MODEL_VARIANTS} models in {}", dir.display());
}

/// Compares with the reference's outputs written by tests/python/test_sentencepiece.py:
/// pieces, ids, decoding, and each piece's byte range (`encode_with_offsets`).
#[test]
#[ignore]
fn compare_with_reference() {
    let path = std::env::var("TOLK_SPM_REFERENCE").expect("TOLK_SPM_REFERENCE not set");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut sp: Option<SentencePiece> = None;
    let mut case = String::new();
    let (mut total, mut same, mut same_offsets) = (0usize, 0usize, 0usize);
    let mut failures = Vec::new();
    let mut summary = Vec::new();
    let mut finish = |case: &str, total: usize, same: usize, same_offsets: usize| {
        if !case.is_empty() {
            summary.push(format!(
                "spm-identity {case}: {same}/{total} identical (pieces, ids and decoding), \
                 {same_offsets}/{total} identical offsets"
            ));
        }
    };
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("#case ") {
            finish(&case, total, same, same_offsets);
            let parts: Vec<&str> = rest.split(' ').collect();
            case = format!("{} {}", parts[0], parts[1]);
            sp = Some(SentencePiece::load(unhex(parts[2])).unwrap());
            total = 0;
            same = 0;
            same_offsets = 0;
            continue;
        }
        let sp = sp.as_ref().expect("a #case line first");
        let f: Vec<&str> = line.split('\t').collect();
        let input = unhex(f[0]);
        let pieces: Vec<String> = if f[1] == "-" {
            vec![]
        } else {
            f[1].split(' ').map(unhex).collect()
        };
        let ids: Vec<u32> = if f[2] == "-" {
            vec![]
        } else {
            f[2].split(' ').map(|x| x.parse().unwrap()).collect()
        };
        let decoded = unhex(f[3]);
        // begin:end per piece (the pieces and ids of the reference's SentencePieceText
        // are those of columns 2 and 3: the Python side checks it).
        let ranges: Vec<std::ops::Range<usize>> = match f.get(4) {
            None | Some(&"-") => vec![],
            Some(r) => r
                .split(' ')
                .map(|x| {
                    let (b, e) = x.split_once(':').unwrap();
                    b.parse().unwrap()..e.parse().unwrap()
                })
                .collect(),
        };
        let expected_offsets: Vec<EncodedPiece> = pieces
            .iter()
            .zip(&ids)
            .zip(&ranges)
            .map(|((p, &id), r)| EncodedPiece {
                piece: p.clone(),
                id,
                range: r.clone(),
            })
            .collect();
        let got_pieces = sp.encode(&input);
        let got_ids = sp.encode_ids(&input);
        let got_decoded = sp.decode_ids(&ids).unwrap();
        let got_offsets = sp.encode_with_offsets(&input);
        total += 1;
        let tokens_ok = got_pieces == pieces && got_ids == ids && got_decoded == decoded;
        let offsets_ok = ranges.len() == pieces.len() && got_offsets == expected_offsets;
        same += tokens_ok as usize;
        same_offsets += offsets_ok as usize;
        if !(tokens_ok && offsets_ok) && failures.len() < 40 {
            failures.push(format!(
                "[{case}] {input:?}\n  expected {pieces:?} {ids:?} {decoded:?}\n  got      {got_pieces:?} {got_ids:?} {got_decoded:?}\n  \
                 expected offsets {:?}\n  got offsets      {:?}",
                ranges,
                got_offsets.iter().map(|p| p.range.clone()).collect::<Vec<_>>()
            ));
        }
    }
    finish(&case, total, same, same_offsets);
    for s in &summary {
        println!("{s}");
    }
    for f in &failures {
        println!("{f}");
    }
    assert!(
        failures.is_empty(),
        "{} mismatches (first ones above)",
        failures.len()
    );
}

/// Times encoding (TOLK_SPM_BENCH_DATA lines x TOLK_SPM_BENCH_REPEATS) with one thread.
#[test]
#[ignore]
fn bench_encode() {
    let model = std::env::var("TOLK_SPM_BENCH_MODEL").expect("TOLK_SPM_BENCH_MODEL not set");
    let data = std::fs::read_to_string(
        std::env::var("TOLK_SPM_BENCH_DATA").expect("TOLK_SPM_BENCH_DATA not set"),
    )
    .unwrap();
    let repeats: usize = std::env::var("TOLK_SPM_BENCH_REPEATS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let sp = SentencePiece::load(model).unwrap();
    let lines: Vec<&str> = data.split('\n').collect();
    let mut n = 0usize;
    for l in &lines {
        n += sp.encode_ids(l).len();
    }
    let t0 = std::time::Instant::now();
    let mut check = 0usize;
    for _ in 0..repeats {
        for l in &lines {
            check += sp.encode_ids(std::hint::black_box(l)).len();
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    assert_eq!(check, n * repeats);
    println!(
        "spm-bench seconds={secs} lines={} tokens={}",
        lines.len() * repeats,
        n * repeats
    );
}

/// Load time of the shared models (printed; a load builds the tries).
#[test]
fn load_time_is_small() {
    for rel in [ZH_EN, EN_PT] {
        let Ok(bytes) = std::fs::read(models_root().join(rel)) else {
            continue;
        };
        let t0 = std::time::Instant::now();
        let sp = SentencePiece::from_bytes(&bytes).unwrap();
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        println!("spm-load {rel}: {ms:.2} ms ({} pieces)", sp.len());
        assert!(ms < 2000.0, "loading {rel} took {ms} ms");
    }
}
