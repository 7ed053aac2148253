//! Search strategies over a step-wise decoder: greedy search and beam search, with the
//! semantics of CTranslate2's `translate_batch`.
pub mod beam;
pub mod greedy;

use crate::backend::cpu::Ctx;

/// One decoding step over all live rows: `ids[r]` is row r's last token; writes the
/// logits [rows, vocabulary_size]. `select_rows` reorders/removes rows between steps.
pub trait StepDecoder {
    type State;
    fn vocabulary_size(&self) -> usize;
    fn step(&self, ctx: &Ctx, ids: &[u32], state: &mut Self::State, logits: &mut Vec<f32>);
    fn select_rows(&self, state: &mut Self::State, rows: &[usize]);
}

impl StepDecoder for crate::model::Decoder {
    type State = crate::model::DecoderState;
    fn vocabulary_size(&self) -> usize {
        crate::model::Decoder::vocabulary_size(self)
    }
    fn step(&self, ctx: &Ctx, ids: &[u32], state: &mut Self::State, logits: &mut Vec<f32>) {
        crate::model::Decoder::step(self, ctx, ids, state, logits)
    }
    fn select_rows(&self, state: &mut Self::State, rows: &[usize]) {
        state.select_rows(rows)
    }
}

/// Decoding settings after validation (see `TranslateOptions` for their meaning).
#[derive(Debug, Clone)]
pub struct SearchParams {
    pub beam_size: usize,
    pub patience: f32,
    pub length_penalty: f32,
    pub num_hypotheses: usize,
    pub max_length: usize,
    pub min_length: usize,
    pub end_ids: Vec<u32>,
    /// Logits set to the lowest float before the search looks at them (e.g. `<unk>`).
    pub disabled_ids: Vec<u32>,
    pub return_scores: bool,
}

/// Hypotheses of one example, best first; token ids include the target prefix and end
/// with the end token when the hypothesis finished by producing it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Hypotheses {
    pub ids: Vec<Vec<u32>>,
    /// Empty unless scores were requested.
    pub scores: Vec<f32>,
}

/// Start token and forced prefix of one example.
#[derive(Debug, Clone)]
pub struct StartTokens {
    pub start: u32,
    pub prefix: Vec<u32>,
}

pub(crate) fn disable(logits_row: &mut [f32], ids: &[u32]) {
    for &id in ids {
        if let Some(v) = logits_row.get_mut(id as usize) {
            *v = f32::MIN;
        }
    }
}

/// CTranslate2's final score: the sum of log-probabilities divided by length^penalty.
pub(crate) fn finalize_score(score: f32, length: usize, length_penalty: f32) -> f32 {
    score / (length as f32).powf(length_penalty)
}

/// Sorts hypotheses best first, keeps `n`, and drops the scores unless requested.
pub(crate) fn finalize(mut hyps: Vec<(Vec<u32>, f32)>, n: usize, length_penalty: f32, return_scores: bool) -> Hypotheses {
    for (ids, score) in hyps.iter_mut() {
        *score = finalize_score(*score, ids.len(), length_penalty);
    }
    hyps.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap_or(std::cmp::Ordering::Equal));
    hyps.truncate(n);
    let scores = if return_scores { hyps.iter().map(|h| h.1).collect() } else { Vec::new() };
    Hypotheses { ids: hyps.into_iter().map(|h| h.0).collect(), scores }
}
