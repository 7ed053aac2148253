//! Every CPU kernel level (`isa::with_isa`, which the translator's workers follow)
//! translates the real zh-en model identically: the same tokens, and scores bit for bit
//! between the vector levels (the scalar reference's within 1e-5), int8 and float32,
//! greedy and beam 4. The integer products are exact on every path (the AVX2 int8
//! plan included, whose shortcuts real activations exercise far more than random ones) and
//! the float operations follow one order. Skipped without the model.
mod common;

use tolk::backend::cpu::isa::{self, Isa};
use tolk::{ComputeType, Model, TranslateOptions, Translator, TranslatorConfig};

#[test]
fn every_isa_translates_the_real_model_identically() {
    let Some((dir, source)) = common::zh_en_pieces(32) else { return };
    let all = isa::available();
    let vector: Vec<Isa> = all.iter().copied().filter(|&l| l != Isa::Scalar).collect();
    for compute_type in [ComputeType::Int8, ComputeType::Float32] {
        let model = Model::load_with(&dir, compute_type).unwrap();
        let t = Translator::with_config(&model, &TranslatorConfig::default()).unwrap();
        for beam_size in [1, 4] {
            let options = TranslateOptions { beam_size, max_batch_size: 16, return_scores: true, ..Default::default() };
            // The scalar reference is slow: it takes the first verses only.
            for (levels, n) in [(&all, 4), (&vector, source.len())] {
                let run = |level: Isa| isa::with_isa(level, || t.translate_batch(&source[..n], None, &options).unwrap());
                let Some((&first, rest)) = levels.split_first() else { continue };
                let reference = run(first);
                for &level in rest {
                    let got = run(level);
                    for (i, (g, e)) in got.iter().zip(&reference).enumerate() {
                        let what = format!("{compute_type:?} beam {beam_size}, {level:?} vs {first:?}, verse {i}");
                        assert_eq!(g.hypotheses, e.hypotheses, "{what}");
                        if first == Isa::Scalar {
                            // The scalar path's float operations (its exp in the log-softmax)
                            // are the C library's, not the vector order: the last bits of a
                            // score may differ, the tokens may not.
                            for (a, b) in g.scores.iter().zip(&e.scores) {
                                assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{what}: score {a} vs {b}");
                            }
                        } else {
                            let bits = |r: &tolk::TranslationResult| r.scores.iter().map(|s| s.to_bits()).collect::<Vec<_>>();
                            assert_eq!(bits(g), bits(e), "{what}: scores");
                        }
                    }
                }
            }
        }
    }
}
