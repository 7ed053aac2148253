//! Marian model files, their YAML and lexical shortlists: the shared Bergamot en-pt
//! model and shortlist when present (TOLK_MODELS, `models/`, `../shared/models`),
//! synthetic `.bin`/`.npz`/shortlists written by the seed writers of fuzz/src/lib.rs,
//! `.npz` files and deflate streams written by numpy 2 / zlib (hex below), and corrupt
//! inputs, each of which must give a readable error, never a panic.
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;

use tolk::format::marian::npz::{crc32, inflate};
use tolk::format::marian::{yaml, MarianFile, MarianType, Yaml};
use tolk::format::shortlist::{checksum, Shortlist};
use tolk::{Error, ErrorKind};

/// The seed writers (shared with tests/fuzz_parsers.rs).
#[allow(dead_code)]
#[path = "../fuzz/src/lib.rs"]
mod fuzz_bodies;

use fuzz_bodies::{
    binary_shortlist, f32_bytes, intgemm_bytes, marian_bin, npy, npz, small_marian_arrays, small_marian_bin,
};

fn en_pt() -> Option<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let candidates = [
        std::env::var("TOLK_MODELS").ok().map(PathBuf::from),
        Some(root.join("models")),
        Some(root.join("../shared/models")),
    ];
    let dir = candidates.into_iter().flatten().map(|p| p.join("en-pt-bergamot")).find(|p| p.is_dir());
    if dir.is_none() {
        println!("skipped: no en-pt-bergamot model directory (set TOLK_MODELS)");
    }
    dir
}

/// Parsing `bytes` gives an error (never a panic) whose message contains `needle`.
fn expect_error(bytes: Vec<u8>, needle: &str) -> Error {
    let shown = format!("{needle:?} on {} bytes", bytes.len());
    let r =
        catch_unwind(AssertUnwindSafe(|| MarianFile::from_bytes(bytes))).unwrap_or_else(|_| panic!("panic: {shown}"));
    let e = r.err().unwrap_or_else(|| panic!("no error: {shown}"));
    assert!(e.message.contains(needle), "{shown}: {}", e.message);
    e
}

fn no_panic<T>(what: &str, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| panic!("panic on {what}"))
}

// ------------------------------------------------------------------ the real en-pt model

#[test]
fn real_model_items_types_and_config() {
    let Some(dir) = en_pt() else { return };
    let m = MarianFile::open(&dir.join("model.enpt.intgemm.alphas.bin")).unwrap();
    assert_eq!(m.items().len(), 195);
    let count = |t| m.items().iter().filter(|i| i.item_type == t).count();
    assert_eq!((count(MarianType::Float32), count(MarianType::Intgemm8), count(MarianType::Int8)), (140, 54, 1));

    let wemb = m.get("Wemb").unwrap();
    assert_eq!((wemb.shape.as_slice(), wemb.item_type), (&[32000, 256][..], MarianType::Intgemm8));
    let b = m.get("decoder_ff_logit_out_b").unwrap();
    assert_eq!((b.shape.as_slice(), b.item_type), (&[1, 32000][..], MarianType::Float32));
    let bias = m.float_values("decoder_ff_logit_out_b").unwrap();
    assert_eq!((bias.len(), bias[0]), (32000, -1.950_053_7));
    assert_eq!(m.get("special:model.yml").unwrap().shape, [1124]);
    for name in [
        "decoder_l1_rnn_W",
        "decoder_l1_rnn_Wf",
        "decoder_l1_rnn_bf",
        "encoder_l6_ffn_W2",
        "encoder_l1_self_Wo_ln_scale",
    ] {
        assert!(m.contains(name), "{name}");
    }

    // Every intgemm8 weight: 256-wide, a sane quantMult and (but Wemb) its activation scale.
    for item in m.items().iter().filter(|i| i.item_type == MarianType::Intgemm8) {
        let (values, q) = m.intgemm8(&item.name).unwrap();
        assert_eq!(values.len(), item.elements());
        assert!(q.is_finite() && q > 0.0, "{}: {q}", item.name);
        if item.name.ends_with("_QuantMultA") {
            continue;
        }
        let (max, min) = (values.iter().max().unwrap(), values.iter().min().unwrap());
        assert!(*max == 127 || *min == -127, "{}: the largest magnitude maps to 127", item.name);
        if item.name != "Wemb" {
            let a = m.quant_mult_a(&format!("{}_QuantMultA", item.name)).unwrap();
            assert!(a.is_some_and(|a| a.is_finite() && a > 0.0), "{}: {a:?}", item.name);
        }
    }
    let (values, q) = m.intgemm8("Wemb").unwrap();
    assert_eq!((&values[..4], q), (&[18i8, 3, 4, 6][..], 153.830_02));
    let wq = m.quant_mult_a("encoder_l1_self_Wq_QuantMultA").unwrap();
    assert_eq!(wq, Some(11.843_823));
    // The output layer's scale: `none_QuantMultA`, and `Wemb_QuantMultA` (one int8 127
    // and a quantMult 14.467291) read as Marian dequantizes it are the same float.
    let none = m.quant_mult_a("none_QuantMultA").unwrap().unwrap();
    let wemb_a = m.quant_mult_a("Wemb_QuantMultA").unwrap().unwrap();
    assert_eq!(m.intgemm8("Wemb_QuantMultA").unwrap(), (&[127i8][..], 14.467_291));
    assert_eq!((none, wemb_a.to_bits()), (8.778_423, none.to_bits()));
    assert_eq!(m.quant_mult_a("no_such_QuantMultA").unwrap(), None);
    let e = m.quant_mult_a("Wemb").unwrap_err();
    assert!(e.message.contains("not an activation scale"), "{}", e.message);
    let e = m.float_values("Wemb").unwrap_err();
    assert!(e.message.contains("Wemb is stored as intgemm8"), "{}", e.message);
    let dequantized = m.intgemm_dequantized("Wemb").unwrap();
    assert_eq!(dequantized[0], 18.0 * (1.0 / 153.830_02f32));

    let config = m.model_config().unwrap().unwrap();
    let get = |k: &str| config.get(k).unwrap_or_else(|| panic!("{k}"));
    assert_eq!(get("type").as_str(), Some("transformer"));
    assert_eq!(get("dec-cell").as_str(), Some("ssru"));
    assert_eq!(get("dim-emb").as_i64(), Some(256));
    assert_eq!((get("enc-depth").as_i64(), get("dec-depth").as_i64()), (Some(6), Some(2)));
    assert_eq!((get("transformer-heads").as_i64(), get("transformer-dim-ffn").as_i64()), (Some(8), Some(1536)));
    assert_eq!(get("tied-embeddings-all").as_bool(), Some(true));
    assert_eq!(get("transformer-postprocess").as_str(), Some("dan"));
    assert_eq!(get("transformer-preprocess").as_str(), Some(""));
    assert_eq!(get("input-types").as_list().map(<[Yaml]>::len), Some(0));
    let vocabs: Vec<i64> = get("dim-vocabs").as_list().unwrap().iter().filter_map(Yaml::as_i64).collect();
    assert_eq!(vocabs, [32000, 32000]);
    assert!(get("version").as_str().unwrap().starts_with("v1.9.56 94aeaa46 2021-04-28 00:28:35"));

    // The same file from memory reads the same.
    let from_bytes = MarianFile::from_bytes(std::fs::read(dir.join("model.enpt.intgemm.alphas.bin")).unwrap()).unwrap();
    assert_eq!(from_bytes.items(), m.items());
    assert_eq!(from_bytes.intgemm8("encoder_l3_ffn_W1").unwrap(), m.intgemm8("encoder_l3_ffn_W1").unwrap());
    assert_eq!(m.float_values("decoder_ff_logit_out_b").unwrap(), bias);
}

#[test]
fn real_bergamot_config() {
    let Some(dir) = en_pt() else { return };
    let text = std::fs::read_to_string(dir.join("config.intgemm8bitalpha.yml")).unwrap();
    let c = yaml::parse(&text).unwrap();
    let list = |k: &str| c.get(k).and_then(Yaml::as_list).unwrap_or_else(|| panic!("{k}")).to_vec();
    assert_eq!(list("models"), [Yaml::Scalar("model.enpt.intgemm.alphas.bin".into())]);
    assert_eq!(list("vocabs").len(), 2);
    let shortlist = list("shortlist");
    assert_eq!((shortlist[0].as_str(), shortlist[1].as_bool()), (Some("lex.50.50.enpt.s2t.bin"), Some(false)));
    assert_eq!(c.get("relative-paths").and_then(Yaml::as_bool), Some(true));
    assert_eq!(c.get("beam-size").and_then(Yaml::as_i64), Some(1));
    assert_eq!(c.get("normalize").and_then(Yaml::as_f64), Some(1.0));
    assert_eq!(c.get("max-length-factor").and_then(Yaml::as_f64), Some(2.5));
    assert_eq!(c.get("gemm-precision").and_then(Yaml::as_str), Some("int8shiftAlphaAll"));
}

/// Marian's generate, written as its text says with a set (the reference for the
/// table-based [`Shortlist::generate`]).
fn reference_generate(s: &Shortlist, source: &[u32], vocabulary: usize, shared: bool) -> Vec<u32> {
    let mut set = std::collections::BTreeSet::new();
    set.extend((0..s.first().min(vocabulary)).map(|i| i as u32));
    for &w in source {
        if shared && (w as usize) < vocabulary {
            set.insert(w);
        }
        set.extend(s.candidates(w).iter().copied().filter(|&t| (t as usize) < vocabulary));
    }
    let mut next = s.first() as u32;
    while set.len() % 8 != 0 && (next as usize) < vocabulary {
        set.insert(next);
        next += 1;
    }
    set.into_iter().collect()
}

#[test]
fn real_shortlist() {
    let Some(dir) = en_pt() else { return };
    let path = dir.join("lex.50.50.enpt.s2t.bin");
    let none = |_: &str| None;
    let s = Shortlist::open(&path, None, None, &none, &none).unwrap();
    assert_eq!((s.first(), s.best(), s.source_words()), (50, 50, 32000));
    s.check_target_vocabulary(32000).unwrap();
    assert!(s.check_target_vocabulary(31999).is_err());
    let expected_100 = [
        4, 100, 613, 694, 831, 1001, 1390, 2044, 2910, 3402, 4673, 5024, 5086, 5099, 5125, 5895, 6339, 6392, 7584,
        7855, 8336, 8840, 9649, 10640, 10851, 11104, 12370, 12670, 13168, 14107, 14609, 15322, 15980, 16361, 16526,
        16680, 17129, 17416, 18131, 18932, 21215, 21650, 22001, 22422, 23835, 23983, 27161, 27484, 28293, 28586,
    ];
    assert_eq!(s.candidates(100), expected_100);

    let batches: [&[u32]; 4] = [&[100, 0], &[5, 17, 300, 4000, 31999, 0, 0, 0], &[], &[7, 7, 7, 29999, 12, 0]];
    for source in batches {
        for shared in [false, true] {
            let out = s.generate(source, 32000, shared);
            assert!(out.windows(2).all(|w| w[0] < w[1]), "sorted and unique");
            assert_eq!(out.len() % 8, 0);
            assert!(out[..50].iter().enumerate().all(|(i, &t)| t as usize == i));
            assert_eq!(out, reference_generate(&s, source, 32000, shared), "{source:?} shared {shared}");
            if shared {
                assert!(source.iter().all(|w| out.binary_search(w).is_ok()));
            }
        }
    }
    // first 50 + the 49 candidates of word 100 from 50 up (word 0 has none): 99, padded to 104.
    let out = s.generate(&[100, 0], 32000, false);
    assert_eq!(out.len(), 104);
    assert_eq!(&out[50..56], [50, 51, 52, 53, 54, 100], "the padding takes the smallest free ids from first");

    // One flipped list id: the checksum catches it, and only it.
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 8;
    bytes[last] ^= 1;
    let e = Shortlist::from_binary_bytes(&bytes, true).unwrap_err();
    assert!(e.message.contains("checksum"), "{}", e.message);
    assert!(Shortlist::from_binary_bytes(&bytes, false).is_ok());
}

// ------------------------------------------------------------------ synthetic .bin

#[test]
fn synthetic_bin_round_trip() {
    let bytes = small_marian_bin();
    let m = MarianFile::from_bytes(bytes.clone()).unwrap();
    let names: Vec<&str> = m.items().iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names.len(), 9);
    assert_eq!(m.float_values("decoder_b").unwrap(), [0.5, -1.0, 2.0]);
    assert_eq!(m.float_values("decoder_h").unwrap(), [0.5, -2.0]);
    assert_eq!(m.intgemm8("Wemb").unwrap(), (&[127i8, -127, 5, 0, -5, 64][..], 12.5));
    assert_eq!(m.intgemm_dequantized("Wemb").unwrap()[1], -127.0 * (1.0 / 12.5f32));
    // Master's intgemm8 code (0x10001) reads like browsermt's (0x4101).
    assert_eq!(m.get("encoder_W").unwrap().item_type, MarianType::Intgemm8);
    assert_eq!(m.intgemm8("encoder_W").unwrap(), (&[1i8, 2, 3, -4][..], 8.0));
    assert_eq!(m.intgemm16("encoder_W16").unwrap(), (&[1024i16, -1][..], 1024.0));
    assert_eq!(m.quant_mult_a("encoder_W_QuantMultA").unwrap(), Some(3.25));
    assert_eq!(m.quant_mult_a("Wemb_QuantMultA").unwrap(), Some(127.0 * (1.0 / 14.0f32)));
    assert_eq!(m.bytes(m.get("steps").unwrap()), 7i32.to_le_bytes());
    assert_eq!(m.get("steps").unwrap().shape, [1]);
    let yml = m.model_yaml().unwrap().unwrap();
    assert!(yml.ends_with("vocabs: [a, b]\n"), "{yml:?}");
    assert_eq!(m.model_config().unwrap().unwrap().get("dec-cell").and_then(Yaml::as_str), Some("ssru"));
    for (call, needle) in [
        (m.intgemm8("decoder_b").map(|_| ()), "decoder_b is stored as float32, not as intgemm8"),
        (m.intgemm16("Wemb").map(|_| ()), "not as intgemm16"),
        (m.float_values("steps").map(|_| ()), "steps is stored as int32"),
        (m.float_values("missing").map(|_| ()), "no item missing"),
    ] {
        assert!(call.unwrap_err().message.contains(needle), "{needle}");
    }

    // Through a file (mapped) as well, and every blob 256-aligned as Marian writes it. Each
    // test maps a file of its own name: tests run in parallel, and rewriting a file another
    // one has mapped killed the run with SIGBUS.
    let path = std::env::temp_dir().join(format!("tolk-marian-bin-{}.bin", std::process::id()));
    std::fs::write(&path, &bytes).unwrap();
    let mapped = MarianFile::open(&path).unwrap();
    std::fs::remove_file(&path).ok();
    assert_eq!(mapped.items(), m.items());
    for item in mapped.items() {
        assert_eq!(mapped.bytes(item).as_ptr() as usize % 256, 0, "{}", item.name);
    }
    assert_eq!(mapped.float_values("decoder_b").unwrap(), [0.5, -1.0, 2.0]);
}

/// A quantMult or an activation scale that is not a positive finite number (a corrupt file)
/// is an error naming the item, never a model that translates garbage.
#[test]
fn corrupt_quantization_scales_are_errors() {
    use fuzz_bodies::small_marian_items;
    for bad in [f32::NAN, 0.0, f32::INFINITY, -1.0] {
        let mut items = small_marian_items();
        items[4].3 = intgemm_bytes(&[1, 2, 3, 0xfc], bad); // encoder_W's quantMult
        items[5].3 = f32_bytes(&[bad]); // encoder_W_QuantMultA
        let m = MarianFile::from_bytes(marian_bin(&items)).unwrap();
        for (call, name) in [
            (m.intgemm8("encoder_W").map(drop), "encoder_W: the quantMult"),
            (m.intgemm_dequantized("encoder_W").map(drop), "encoder_W: the quantMult"),
            (m.quant_mult_a("encoder_W_QuantMultA").map(drop), "encoder_W_QuantMultA: the activation scale"),
        ] {
            let e = call.unwrap_err();
            assert!(e.kind == tolk::ErrorKind::InvalidModel && e.message.contains(name), "{bad}: {e}");
        }
    }
    // An activation scale stored as intgemm8 whose value is not positive.
    for value in [0u8, 0x81] {
        let mut items = small_marian_items();
        items[1].3 = intgemm_bytes(&[value], 14.0); // Wemb_QuantMultA: 0, then -127 / 14
        let e = MarianFile::from_bytes(marian_bin(&items)).unwrap().quant_mult_a("Wemb_QuantMultA").unwrap_err();
        assert!(e.kind == tolk::ErrorKind::InvalidModel && e.message.contains("Wemb_QuantMultA: the activation scale"), "{value}: {e}");
    }
}

/// Vector items are `[n]` or `[1, n]`: a `[2, 2]` one is an error naming it.
#[test]
fn vector_items_must_be_vectors() {
    let items = [
        ("a_ln_scale", 0x404, vec![1, 4], f32_bytes(&[1.0; 4])),
        ("b_ln_scale", 0x404, vec![4], f32_bytes(&[1.0; 4])),
        ("c_ln_scale", 0x404, vec![2, 2], f32_bytes(&[1.0; 4])),
    ];
    let m = MarianFile::from_bytes(marian_bin(&items)).unwrap();
    assert!(m.check_vector("a_ln_scale").is_ok() && m.check_vector("b_ln_scale").is_ok());
    let e = m.check_vector("c_ln_scale").unwrap_err();
    assert!(e.message.contains("c_ln_scale has shape [2, 2], expected a vector"), "{e}");
}

#[test]
fn prepacked_and_unknown_types_are_refused_by_name() {
    for (code, name) in [
        (0x2801u64, "packed8avx512"),
        (0x1801, "packed8avx2"),
        (0x802, "packed16"),
        (0x11001, "intgemm8avx2"),
        (0x13001, "intgemm8avx512vnni"),
        (0x14002, "intgemm16sse2"),
    ] {
        let bytes =
            marian_bin(&[("encoder_W", 0x404, vec![1], f32_bytes(&[1.0])), ("Wemb", code, vec![2, 2], vec![0; 8])]);
        let e = expect_error(bytes, &format!("Wemb is stored as {name} (a CPU-specific prepacked layout)"));
        assert_eq!(e.kind, ErrorKind::Unsupported);
        assert!(e.message.contains("convert the model to intgemm8 or float32"));
    }
    let e = expect_error(marian_bin(&[("x", 0x4404, vec![1], vec![0; 4])]), "x has an unknown Marian type code 0x4404");
    assert_eq!(e.kind, ErrorKind::InvalidModel);
    let mut encrypted = small_marian_bin();
    encrypted[0] = 2;
    assert_eq!(expect_error(encrypted, "encrypted").kind, ErrorKind::Unsupported);
    let mut future = small_marian_bin();
    future[0] = 3;
    expect_error(future, "unknown binary version 3");
}

/// Offsets of a `.bin`'s fields, for corrupting them.
fn header_field(item: usize, field: usize) -> usize {
    16 + 32 * item + 8 * field
}

#[test]
fn corrupt_bin_files_are_errors() {
    let good = small_marian_bin();
    let items = fuzz_bodies::small_marian_items();
    // Every truncation: the header, names, shapes, padding and each blob.
    let data_start = good.len() - items.iter().map(|i| i.3.len().next_multiple_of(256)).sum::<usize>();
    for len in 0..data_start + 300 {
        let e = no_panic(&format!("truncation at {len}"), || MarianFile::from_bytes(good[..len].to_vec())).err();
        let e = e.unwrap_or_else(|| panic!("a {len}-byte prefix parsed"));
        assert!(e.message.contains("past the end") || e.message.contains("do not fit"), "{len}: {}", e.message);
    }
    let set = |at: usize, v: u64| {
        let mut b = good.clone();
        b[at..at + 8].copy_from_slice(&v.to_le_bytes());
        b
    };
    expect_error(set(8, u64::MAX), "the headers of 18446744073709551615 items");
    expect_error(set(8, 1 << 40), "runs past the end");
    expect_error(set(header_field(0, 0), u64::MAX), "the name of item 0");
    expect_error(set(header_field(2, 0), 1 << 50), "the name of item 2");
    expect_error(set(header_field(1, 2), u64::MAX / 2), "the shape of Wemb_QuantMultA");
    expect_error(set(header_field(3, 3), u64::MAX), "the data of decoder_h");
    expect_error(set(header_field(8, 3), 1 << 62), "the data of special:model.yml");
    // A blob shorter than its shape (the next items shift, so the shape check fires).
    expect_error(
        set(header_field(2, 3), 8),
        "decoder_b: float32 values of shape [1, 3] do not fit in its 8 stored bytes",
    );
    // intgemm8 needs room for the quantMult after the values.
    let tight = marian_bin(&[("W", 0x4101, vec![2, 2], vec![1, 2, 3, 4])]);
    let mut b = tight.clone();
    let at = header_field(0, 3);
    b[at..at + 8].copy_from_slice(&6u64.to_le_bytes());
    b.truncate(b.len() - 256 + 6);
    expect_error(b, "W: intgemm8 values of shape [2, 2] do not fit in its 6 stored bytes");

    // Shapes: a product that overflows, a negative dimension.
    let big = i32::MAX;
    expect_error(marian_bin(&[("huge", 0x404, vec![big, big, big], vec![0; 4])]), "huge: the shape");
    expect_error(marian_bin(&[("huge", 0x404, vec![big, big], vec![0; 4])]), "do not fit");
    expect_error(marian_bin(&[("neg", 0x404, vec![-1, 4], vec![0; 4])]), "neg has a negative dimension -1");
    // Names: not UTF-8, not NUL-terminated, twice.
    let mut b = marian_bin(&[("n\u{e9}", 0x404, vec![1], vec![0; 4])]);
    let name_at = 16 + 32;
    b[name_at + 1] = 0xff;
    expect_error(b, "the name of item 0 is not valid UTF-8");
    let mut b = marian_bin(&[("ab", 0x404, vec![1], vec![0; 4])]);
    b[name_at + 2] = b'c';
    expect_error(b, "is not NUL-terminated");
    expect_error(
        marian_bin(&[("a", 0x404, vec![1], vec![0; 4]), ("a", 0x404, vec![1], vec![0; 4])]),
        "the item a appears twice",
    );
    // The padding length.
    let pad_at = 16 + 32 + 2 + 4;
    let mut b = marian_bin(&[("a", 0x404, vec![1], vec![0; 4])]);
    b[pad_at..pad_at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    expect_error(b, "the padding before the data");
    // special:model.yml must be bytes and text.
    let m = MarianFile::from_bytes(marian_bin(&[("special:model.yml", 0x404, vec![1], vec![0; 4])])).unwrap();
    assert!(m.model_yaml().unwrap_err().message.contains("stored as float32, not as bytes"));
    let m =
        MarianFile::from_bytes(marian_bin(&[("special:model.yml", 0x101, vec![3], vec![b'a', 0xff, b':'])])).unwrap();
    assert!(m.model_yaml().unwrap_err().message.contains("not valid UTF-8"));
    let m = MarianFile::from_bytes(marian_bin(&[("special:model.yml", 0x101, vec![6], b"a: [1\0".to_vec())])).unwrap();
    assert!(m.model_config().unwrap_err().message.contains("YAML line 1"));

    // Empty and missing files.
    expect_error(Vec::new(), "the version");
    let e = MarianFile::open(std::path::Path::new("/nonexistent/model.bin")).err().unwrap();
    assert_eq!(e.kind, ErrorKind::Io);
}

// ------------------------------------------------------------------ .npz

/// numpy 2 `np.savez` / `np.savez_compressed` of: `special:model.yml` (int8,
/// "type: transformer\ndim-emb: 4\n\0"), `Wemb` float32 2x3 `arange(6) * 0.5 - 1`,
/// `decoder_b` float16 `[1.5, -2, 0.25, 65504]`, `encoder_l1_ffn_W1` float32 3x2 1..6.
/// The local headers carry zip64 extra fields (numpy's `force_zip64`).
const NUMPY_SAVEZ: &str = concat!(
    "504b03042d00000000000000210075a86098ffffffffffffffff150014007370656369616c3a6d6f64656c2e796d6c2e",
    "6e7079010010009e000000000000009e00000000000000934e554d5059010076007b276465736372273a20277c693127",
    "2c2027666f727472616e5f6f72646572273a2046616c73652c20277368617065273a202833302c292c207d2020202020",
    "202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020",
    "2020202020200a747970653a207472616e73666f726d65720a64696d2d656d623a20340a00504b03042d000000000000",
    "0021004b4a6801ffffffffffffffff0800140057656d622e6e7079010010009800000000000000980000000000000093",
    "4e554d5059010076007b276465736372273a20273c6634272c2027666f727472616e5f6f72646572273a2046616c7365",
    "2c20277368617065273a2028322c2033292c207d20202020202020202020202020202020202020202020202020202020",
    "2020202020202020202020202020202020202020202020202020202020200a000080bf000000bf000000000000003f00",
    "00803f0000c03f504b03042d000000000000002100faf729adffffffffffffffff0d0014006465636f6465725f622e6e",
    "70790100100088000000000000008800000000000000934e554d5059010076007b276465736372273a20273c6632272c",
    "2027666f727472616e5f6f72646572273a2046616c73652c20277368617065273a2028342c292c207d20202020202020",
    "202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020",
    "20202020200a003e00c00034ff7b504b03042d000000000000002100ffbf4235ffffffffffffffff15001400656e636f",
    "6465725f6c315f66666e5f57312e6e70790100100098000000000000009800000000000000934e554d5059010076007b",
    "276465736372273a20273c6634272c2027666f727472616e5f6f72646572273a2046616c73652c20277368617065273a",
    "2028332c2032292c207d2020202020202020202020202020202020202020202020202020202020202020202020202020",
    "20202020202020202020202020202020202020200a0000803f0000004000004040000080400000a0400000c040504b01",
    "022d032d00000000000000210075a860989e0000009e0000001500000000000000000000008001000000007370656369",
    "616c3a6d6f64656c2e796d6c2e6e7079504b01022d032d0000000000000021004b4a6801980000009800000008000000",
    "00000000000000008001e500000057656d622e6e7079504b01022d032d000000000000002100faf729ad880000008800",
    "00000d00000000000000000000008001b70100006465636f6465725f622e6e7079504b01022d032d0000000000000021",
    "00ffbf4235980000009800000015000000000000000000000080017e020000656e636f6465725f6c315f66666e5f5731",
    "2e6e7079504b05060000000004000400f70000005d0300000000",
);

const NUMPY_SAVEZ_COMPRESSED: &str = concat!(
    "504b03042d00000008000000210075a86098ffffffffffffffff150014007370656369616c3a6d6f64656c2e796d6c2e",
    "6e7079010010009e0000000000000060000000000000009bec17ea1b10c9c850c650ad9e925a9c5ca46ea5a05e9369a8",
    "aea3a09e965f54529498179f5f94920a12774bcc294e058a17672416a402f91ac6063a9a3a0ab50ae403ae92ca82542b",
    "059035c540eb72538bb852327375537393ac144cb81800504b03042d0000000800000021004b4a6801ffffffffffffff",
    "ff0800140057656d622e6e707901001000980000000000000057000000000000009bec17ea1b10c9c850c650ad9e925a",
    "9c5ca46ea5a06e9366a2aea3a09e965f54529498179f5f94920a12774bcc294e058a17672416a402f91a463a0ac69a3a",
    "0ab50a64032e068686fd0c0c0c200c02f6403e101fb00700504b03042d000000080000002100faf729adffffffffffff",
    "ffff0d0014006465636f6465725f622e6e70790100100088000000000000004c000000000000009bec17ea1b10c9c850",
    "c650ad9e925a9c5ca46ea5a06e9366a4aea3a09e965f54529498179f5f94920a12774bcc294e058a17672416a402f91a",
    "263a9a3a0ab50a14002e063b86030c26ffab01504b03042d000000080000002100ffbf4235ffffffffffffffff150014",
    "00656e636f6465725f6c315f66666e5f57312e6e707901001000980000000000000058000000000000009bec17ea1b10",
    "c9c850c650ad9e925a9c5ca46ea5a06e9366a2aea3a09e965f54529498179f5f94920a12774bcc294e058a17672416a4",
    "02f91ac63a0a469a3a0ab50a64032e0686067b060606072002e206205e00c4071c00504b01022d032d00000008000000",
    "210075a86098600000009e0000001500000000000000000000008001000000007370656369616c3a6d6f64656c2e796d",
    "6c2e6e7079504b01022d032d0000000800000021004b4a680157000000980000000800000000000000000000008001a7",
    "00000057656d622e6e7079504b01022d032d000000080000002100faf729ad4c000000880000000d0000000000000000",
    "0000008001380100006465636f6465725f622e6e7079504b01022d032d000000080000002100ffbf4235580000009800",
    "00001500000000000000000000008001c3010000656e636f6465725f6c315f66666e5f57312e6e7079504b0506000000",
    "0004000400f7000000620200000000",
);

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2).map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap()).collect()
}

#[test]
fn numpy_written_npz_stored_and_compressed() {
    for hex in [NUMPY_SAVEZ, NUMPY_SAVEZ_COMPRESSED] {
        let m = MarianFile::from_bytes(unhex(hex)).unwrap();
        let names: Vec<&str> = m.items().iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, ["special:model.yml", "Wemb", "decoder_b", "encoder_l1_ffn_W1"]);
        assert_eq!(m.model_yaml().unwrap().unwrap(), "type: transformer\ndim-emb: 4\n");
        let wemb = m.get("Wemb").unwrap();
        assert_eq!((wemb.shape.as_slice(), wemb.item_type), (&[2, 3][..], MarianType::Float32));
        assert_eq!(m.float_values("Wemb").unwrap(), [-1.0, -0.5, 0.0, 0.5, 1.0, 1.5]);
        // 1-D arrays become 1 x n, as Marian's loadItemsFromNpz makes them.
        assert_eq!(m.get("decoder_b").unwrap().shape, [1, 4]);
        assert_eq!(m.get("special:model.yml").unwrap().shape, [1, 30]);
        assert_eq!(m.float_values("decoder_b").unwrap(), [1.5, -2.0, 0.25, 65504.0]);
        assert_eq!(m.float_values("encoder_l1_ffn_W1").unwrap(), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        for item in m.items() {
            assert_eq!(
                m.bytes(item).as_ptr() as usize % 64,
                m.bytes(m.items().first().unwrap()).as_ptr() as usize % 64
            );
        }
    }
}

#[test]
fn synthetic_npz_round_trip_and_file() {
    let arrays = small_marian_arrays();
    let stored = npz(&arrays, false);
    let deflated = npz(&arrays, true);
    assert!(deflated.len() < stored.len(), "the fixed-Huffman writer compresses the padding");
    let a = MarianFile::from_bytes(stored.clone()).unwrap();
    let b = MarianFile::from_bytes(deflated).unwrap();
    assert_eq!(a.items(), b.items());
    for m in [&a, &b] {
        assert_eq!(m.float_values("Wemb").unwrap(), [1.0, -2.0, 0.5, 0.5, 0.5, 0.5]);
        assert_eq!(m.float_values("decoder_h").unwrap(), [0.5, -2.0]);
        assert_eq!(m.get("steps").unwrap().shape, Vec::<usize>::new());
        assert_eq!(m.bytes(m.get("steps").unwrap()), 7i32.to_le_bytes());
        assert_eq!(m.model_config().unwrap().unwrap().get("dim-emb").and_then(Yaml::as_i64), Some(2));
    }
    // `open` tells npz from bin by the magic, whatever the name.
    let path = std::env::temp_dir().join(format!("tolk-marian-npz-{}.bin", std::process::id()));
    std::fs::write(&path, &stored).unwrap();
    let opened = MarianFile::open(&path).unwrap();
    std::fs::remove_file(&path).ok();
    assert_eq!(opened.items(), a.items());
}

#[test]
fn corrupt_npz_files_are_errors() {
    let arrays = small_marian_arrays();
    let check = |bytes: Vec<u8>, needle: &str| expect_error(bytes, needle);
    for good in [npz(&arrays, false), npz(&arrays, true), unhex(NUMPY_SAVEZ), unhex(NUMPY_SAVEZ_COMPRESSED)] {
        for len in 0..good.len() {
            let r = no_panic(&format!("npz truncated at {len}"), || MarianFile::from_bytes(good[..len].to_vec()));
            assert!(r.is_err(), "a {len}-byte prefix parsed");
        }
        // Every single-byte change: an error or (in padding, names) a model, never a panic.
        for at in 0..good.len() {
            let mut b = good.clone();
            b[at] ^= 0x5a;
            let _ = no_panic(&format!("npz byte {at} flipped"), || MarianFile::from_bytes(b));
        }
    }
    // A changed value: the CRC catches it.
    let mut b = npz(&arrays, false);
    let steps = &arrays[3].1;
    let at = b.windows(steps.len()).position(|w| w == &steps[..]).unwrap() + steps.len() - 4;
    b[at] = 8; // `steps` = 7
    check(b, "steps.npy: CRC-32 mismatch");
    let one = |npy: Vec<u8>| npz(&[("x", npy)], false);
    check(one(npy("<f4", &[2, 2], &[0; 12])), "12 bytes of values for shape [2, 2] of <f4");
    check(one(npy(">f4", &[1], &[0; 4])), "not little-endian");
    check(one(npy("<c8", &[1], &[0; 8])), "dtype \"<c8\" is not supported");
    check(one(npy("<f4", &[1 << 40, 1 << 40, 1 << 40], &[])), "x.npy");
    let mut fortran = npy("<f4", &[1], &[0; 4]);
    let at = fortran.windows(5).position(|w| w == b"False").unwrap();
    fortran[at..at + 5].copy_from_slice(b"True ");
    assert_eq!(check(one(fortran), "npz: x.npy: Fortran-ordered").kind, ErrorKind::Unsupported);
    check(one(b"\x93NUMPY\x09\x00\x00\x00".to_vec()), ".npy version 9");
    check(one(b"\x93NUMPX\x01\x00\x00\x00".to_vec()), "bad magic");
    check(one(b"\x93NUMPY\x01\x00\x10\x00{'descr': '<f4'".to_vec()), "truncated .npy header");
    // The central directory's method counts (the local header's is not read).
    let mut bad_method = npz(&arrays, false);
    let at = cd_at_of(&bad_method) + 10;
    bad_method[at] = 12;
    assert_eq!(check(bad_method, "ZIP method 12").kind, ErrorKind::Unsupported);
    // Overlapping entries: two central entries for one local header.
    let single = npz(&[("a", npy("<f4", &[1], &[0; 4]))], false);
    let cd_at = u32::from_le_bytes(single[single.len() - 6..single.len() - 2].try_into().unwrap()) as usize;
    let entry = single[cd_at..single.len() - 22].to_vec();
    let mut twice = single[..cd_at].to_vec();
    twice.extend_from_slice(&entry);
    twice.extend_from_slice(&entry);
    let mut eocd = single[single.len() - 22..].to_vec();
    eocd[8..10].copy_from_slice(&2u16.to_le_bytes());
    eocd[10..12].copy_from_slice(&2u16.to_le_bytes());
    eocd[12..16].copy_from_slice(&(2 * entry.len() as u32).to_le_bytes());
    twice.extend_from_slice(&eocd);
    check(twice, "overlap");
    // A claimed count the central directory cannot hold, a size the data cannot give.
    let mut b = single.clone();
    let n = b.len();
    b[n - 12..n - 10].copy_from_slice(&0xfffeu16.to_le_bytes());
    check(b, "entries do not fit");
    let mut b = npz(&[("a", vec![0; 4096])], true);
    let size_at = cd_at_of(&b) + 24;
    b[size_at..size_at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    check(b, "cannot come from");
    check(b"PK\x03\x04 not really a zip".to_vec(), "no end of central directory");
}

fn cd_at_of(zip: &[u8]) -> usize {
    u32::from_le_bytes(zip[zip.len() - 6..zip.len() - 2].try_into().unwrap()) as usize
}

// ------------------------------------------------------------------ deflate

/// zlib (level 9, raw deflate, dynamic Huffman) of [`deflate_text`].
const ZLIB_DYNAMIC: &str = concat!(
    "2bc94855282ccd4cce56482aca2fcf5348cbaf50c82acd2d2856c82f4b2d5228014ae72456552aa4e4a75b8379c35a31",
    "032313330b2b1b3b072717370f2f1fbf80a090b088a898b884a494b48cac9cbc82a292b28aaa9aba86a696b68eae9ebe",
    "81a191b189a999b985a595b58dad9dbd83a393b38bab9bbb87a797b78faf9f7f4060507048685878446454744c6c5c7c",
    "426252724a6a5a7a466656764e6e5e7e4161517149695979456555754d6d5d7d436353734b6b5b7b476757774f6f5fff",
    "848993264f993a6dfa8c99b366cf993b6ffe82858b162f59ba6cf98a95ab56af59bb6efd868d9b366fd9ba6dfb8e9dbb",
    "76efd9bb6fff8183870e1f397aecf88993a74e9f397beefc858b972e5fb97aedfa8d9bb76edfb97beffe83878f1e3f79",
    "faecf98b97af5ebf79fbeefd878f9f3e7ff9faedfb8f9fbf7efff9fbef3fc328201a0000",
);

fn deflate_text() -> Vec<u8> {
    let mut t = b"the quick brown fox jumps over the lazy dog; ".repeat(6);
    t.extend(0..=255u8);
    t.extend([0u8; 300]);
    t
}

#[test]
fn inflate_zlib_streams() {
    let text = deflate_text();
    assert_eq!(crc32(&text), 4_164_897_089, "zlib.crc32");
    let dynamic = unhex(ZLIB_DYNAMIC);
    assert_eq!(inflate(&dynamic, text.len()).unwrap(), text);
    // Stored blocks (two, the second final), as zlib level 0 writes them.
    let mut stored = Vec::new();
    for (i, part) in text.chunks(500).enumerate() {
        stored.push(u8::from(i == 1));
        stored.extend_from_slice(&(part.len() as u16).to_le_bytes());
        stored.extend_from_slice(&(!(part.len() as u16)).to_le_bytes());
        stored.extend_from_slice(part);
    }
    assert_eq!(inflate(&stored, text.len()).unwrap(), text);
    let fixed = fuzz_bodies::deflate_fixed(&text);
    assert_eq!(inflate(&fixed, text.len()).unwrap(), text);
    assert_eq!(inflate(&[0x03, 0x00], 0).unwrap(), b"", "an empty fixed block");

    for stream in [&dynamic, &stored, &fixed] {
        for len in 0..stream.len() {
            let r = no_panic("a truncated stream", || inflate(&stream[..len], text.len()));
            assert!(r.is_err(), "{len}");
        }
        for at in 0..stream.len() {
            let mut s = stream.clone();
            s[at] ^= 0x10;
            let _ = no_panic("a corrupted stream", || inflate(&s, text.len()));
        }
        let e = inflate(stream, text.len() - 1).unwrap_err();
        assert!(e.message.contains("more data than the stated size"), "{}", e.message);
        assert!(inflate(stream, text.len() + 1).is_err());
    }
    for (bad, needle) in [
        (&[0x07u8][..], "invalid block type"),
        (&[0x01, 0x05, 0x00, 0x00, 0x00], "length check"),
        (&[0xfd, 0x00, 0x00], "too many length or distance codes"),
        // A fixed block whose first code is a match 1 byte back in an empty output.
        (&[0x03, 0x02], "a distance before the start"),
    ] {
        let e = inflate(bad, 10).unwrap_err();
        assert!(e.message.contains(needle), "{needle}: {}", e.message);
    }
}

// ------------------------------------------------------------------ YAML

#[test]
fn yaml_vocabulary_and_errors() {
    let vocab = "\"</s>\": 0\n\"<unk>\": 1\n▁the: 2\n\"\\u2581\\\"q\\\"\": 3\n',': 4\n\"#\": 5 # a comment\n\"\\U0001F600\": 6\n";
    let y = yaml::parse(vocab).unwrap();
    let entries: Vec<(&str, i64)> =
        y.as_map().unwrap().iter().map(|(k, v)| (k.as_str(), v.as_i64().unwrap())).collect();
    assert_eq!(entries, [("</s>", 0), ("<unk>", 1), ("▁the", 2), ("▁\"q\"", 3), (",", 4), ("#", 5), ("😀", 6)]);
    for (text, needle) in [
        ("a: 1\n b: 2\n", "YAML line 2: unexpected"),
        ("a: 'x\n", "YAML line 1: unterminated"),
        ("x: 1\ny: [1, 2\n", "YAML line 2: expected `,` or `]`"),
        ("a: >\n  folded\n", "YAML line 1: block scalars"),
        ("a: &anchor 1\n", "YAML line 1: anchors"),
        ("a: \"\\ud800\"\n", "YAML line 1: a lone UTF-16 surrogate"),
        ("a: \"\\xZZ\"\n", "YAML line 1: bad hexadecimal escape"),
        ("- a\n- b\nc: d\n", "YAML line 3"),
        ("a:\n  - x\n  y: 1\n", "YAML line 3"),
    ] {
        let e = yaml::parse(text).unwrap_err();
        assert!(e.message.contains(needle), "{text:?}: {}", e.message);
    }
    assert_eq!(yaml::parse("").unwrap(), Yaml::Null);
    assert_eq!(yaml::parse("# only\n---\n").unwrap(), Yaml::Null);
    let y = yaml::parse("k: yes\nf: .inf\nn: ~\nneg: -3\n").unwrap();
    assert_eq!(y.get("k").and_then(Yaml::as_bool), Some(true));
    assert_eq!(y.get("f").and_then(Yaml::as_f64), Some(f64::INFINITY));
    assert_eq!(y.get("n"), Some(&Yaml::Null));
    assert_eq!(y.get("neg").and_then(Yaml::as_i64), Some(-3));
}

// ------------------------------------------------------------------ shortlists

#[test]
fn synthetic_binary_shortlist() {
    let bytes = binary_shortlist(3, 2, &[&[0, 5], &[], &[7, 9], &[2]]);
    let s = Shortlist::from_binary_bytes(&bytes, true).unwrap();
    assert_eq!((s.first(), s.best(), s.source_words()), (3, 2, 4));
    assert_eq!(s.candidates(2), [7, 9]);
    assert_eq!(s.candidates(1), [] as [u32; 0]);
    assert_eq!(s.candidates(4), [] as [u32; 0]);
    assert_eq!(s.candidates(u32::MAX), [] as [u32; 0]);
    // {0,1,2} + {7,9} = 5, padded with 3, 4, 5.
    assert_eq!(s.generate(&[2, 1], 20, false), [0, 1, 2, 3, 4, 5, 7, 9]);
    // shared adds the source ids themselves: {0,1,2,3} + {0,5} + {7,9} + {2} = 7, + 4.
    assert_eq!(s.generate(&[3, 0, 2], 20, true), [0, 1, 2, 3, 4, 5, 7, 9]);
    assert_eq!(s.generate(&[3, 0, 2], 20, false), [0, 1, 2, 3, 4, 5, 7, 9]);
    // Ids past the vocabulary are skipped; the padding stops at its end.
    assert_eq!(s.generate(&[2, 99, u32::MAX], 8, true), [0, 1, 2, 3, 4, 5, 6, 7]);
    assert_eq!(s.generate(&[2], 6, false), [0, 1, 2, 3, 4, 5]);
    assert_eq!(s.generate(&[], 0, true), [] as [u32; 0]);
    assert!(s.check_target_vocabulary(9).is_err() && s.check_target_vocabulary(10).is_ok());
    // An odd number of ids: the checksum leaves the trailing half word out, as Marian.
    let odd = binary_shortlist(1, 1, &[&[1, 2, 3]]);
    assert_eq!(odd.len() % 8, 4);
    let words = odd[16..].chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap()));
    assert_eq!(checksum(words), u64::from_le_bytes(odd[8..16].try_into().unwrap()));
    Shortlist::from_binary_bytes(&odd, true).unwrap();
}

#[test]
fn corrupt_shortlists_are_errors() {
    let good = binary_shortlist(3, 2, &[&[0, 5], &[], &[7, 9], &[2]]);
    for len in 0..good.len() {
        for verify in [false, true] {
            let r = no_panic("a truncated shortlist", || Shortlist::from_binary_bytes(&good[..len], verify));
            assert!(r.is_err(), "{len}");
        }
    }
    let set = |bytes: &[u8], at: usize, v: u64| {
        let mut b = bytes.to_vec();
        b[at..at + 8].copy_from_slice(&v.to_le_bytes());
        b
    };
    let err = |b: Vec<u8>, verify: bool| Shortlist::from_binary_bytes(&b, verify).unwrap_err().message;
    assert!(err(set(&good, 0, 1), false).contains("bad magic"));
    assert!(err(set(&good, 8, 1), true).contains("checksum mismatch"));
    assert!(Shortlist::from_binary_bytes(&set(&good, 8, 1), false).is_ok());
    for (field, v) in [(4, u64::MAX / 4), (5, u64::MAX / 2), (4, 6), (5, 1 << 61)] {
        assert!(err(set(&good, 8 * field, v), false).contains("does not match the file size"), "{field} {v}");
    }
    // Offsets: decreasing, and a last one that is not the list size.
    assert!(err(set(&good, 48 + 8, 3), false).contains("decrease"));
    assert!(err(set(&good, 48 + 8 * 4, 4), false).contains("the last offset"));
    // Every byte changed: an error or a shortlist whose generate holds, never a panic.
    for at in 0..good.len() {
        for verify in [false, true] {
            let mut b = good.clone();
            b[at] ^= 0x81;
            no_panic("a changed shortlist", || {
                if let Ok(s) = Shortlist::from_binary_bytes(&b, verify) {
                    let out = s.generate(&[0, 1, 2, 3, 4, 200], 64, true);
                    assert!(out.windows(2).all(|w| w[0] < w[1]));
                }
            });
        }
    }
    // Text shortlists: whatever the text, a shortlist or an error.
    let id = |w: &str| w.strip_prefix('w').and_then(|n| n.parse().ok());
    let s = Shortlist::from_text("w1 w0 0.5 w2 w0 bad w3 w0 0.9", None, None, id, id).unwrap();
    assert_eq!((s.first(), s.best(), s.candidates(0)), (100, 100, &[1u32][..]));
    let e = Shortlist::from_text("w1 w99999999 0.5", None, None, id, id).unwrap_err();
    assert!(e.message.contains("out of range"), "{}", e.message);
    let none = |_: &str| None;
    let e = Shortlist::open(std::path::Path::new("/nonexistent/lex.bin"), None, None, &none, &none).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Io);
}

#[test]
fn binary_and_text_shortlists_agree() {
    // The same table as text and as binary (what Marian's import would write).
    let text = "w5 w1 0.5\nw9 w1 0.1\nw9 w1 0.7\nw7 w1 0.6\nw3 w2 0.2\nw4 w2 0.2\nw8 w2 0.1\n";
    let id = |w: &str| w.strip_prefix('w').and_then(|n| n.parse().ok());
    let t = Shortlist::from_text(text, Some(2), Some(2), id, id).unwrap();
    // Ties on probability keep the higher id (Marian's priority queue of (prob, id)).
    let b = Shortlist::from_binary_bytes(&binary_shortlist(2, 2, &[&[], &[7, 9], &[3, 4]]), true).unwrap();
    for w in 0..3 {
        assert_eq!(t.candidates(w), b.candidates(w), "word {w}");
    }
    let tie = Shortlist::from_text("w3 w0 0.2\nw4 w0 0.2\nw5 w0 0.2\n", Some(0), Some(2), id, id).unwrap();
    assert_eq!(tie.candidates(0), [4, 5]);
    for source in [&[1u32, 2][..], &[2], &[0, 0, 1]] {
        assert_eq!(t.generate(source, 16, true), b.generate(source, 16, true));
    }
}

/// The small intgemm helpers used above stay consistent with Marian's layout.
#[test]
fn intgemm_layout_helper() {
    assert_eq!(intgemm_bytes(&[1, 2], 2.0), [1, 2, 0, 0, 0, 64]);
}
