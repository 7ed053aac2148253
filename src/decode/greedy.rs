//! Greedy search: the arg-max token at each step. The log-probability of the chosen token
//! is only computed when scores are requested (the arg-max of the logits is the same).
use super::{disable, finalize, target_id, DecoderSession, Hypotheses, OutputColumns, SearchObserver, SearchParams, StartTokens};
use crate::backend::cpu::ops;
use crate::backend::Ctx;

pub fn greedy_search(
    ctx: &Ctx,
    decoder: &mut dyn DecoderSession,
    observer: &mut dyn SearchObserver,
    starts: &[StartTokens],
    params: &SearchParams,
) -> Vec<Hypotheses> {
    let batch = starts.len();
    let vocab = decoder.vocabulary_size();
    let OutputColumns { ids: output, disabled, end: end_columns } = OutputColumns::new(decoder, params);
    let output = output.as_deref();
    let mut results: Vec<Option<Hypotheses>> = vec![None; batch];
    let mut tokens: Vec<Vec<u32>> = vec![Vec::new(); batch];
    let mut scores = vec![0.0f32; batch];
    // Live rows: which example each row decodes, and its last token.
    let mut alive: Vec<usize> = (0..batch).collect();
    let mut inputs: Vec<u32> = starts.iter().map(|s| s.start).collect();
    let mut logits = Vec::new();

    for step in 0..params.max_length {
        if observer.cancelled() {
            break;
        }
        decoder.step(ctx, &inputs, &mut logits);
        let mut keep = Vec::with_capacity(alive.len());
        for (r, &ex) in alive.iter().enumerate() {
            let row = &mut logits[r * vocab..(r + 1) * vocab];
            disable(row, &disabled);
            if step < params.min_length {
                disable(row, &end_columns);
            }
            let (column, mut score) = ops::argmax(row);
            let mut word = target_id(column, output);
            if params.return_scores {
                // The log-probability of the arg-max, as a full log-softmax would give it.
                score -= ops::log_sum_exp(row);
            }
            let prefix = &starts[ex].prefix;
            if step < prefix.len() {
                // Forced prefix tokens do not count in the score (as in CTranslate2).
                word = prefix[step];
                score = 0.0;
            }
            tokens[ex].push(word);
            scores[ex] += score;
            let mut is_end = params.end_ids.contains(&word) && step >= prefix.len();
            let is_last = is_end || step + 1 == params.max_length;
            if step >= prefix.len() && !observer.token(ex, step - prefix.len(), word, is_last) {
                is_end = true; // The observer ends this hypothesis here.
            }
            if is_end || is_last {
                let ids = std::mem::take(&mut tokens[ex]);
                let hyps = vec![(ids, scores[ex]); 1];
                let mut h = finalize(hyps, 1, params.length_penalty, params.return_scores);
                // With patience > 1 CTranslate2 accepts num_hypotheses > 1 for greedy search
                // and returns copies of the single greedy hypothesis.
                h.ids = vec![h.ids[0].clone(); params.num_hypotheses];
                if params.return_scores {
                    h.scores = vec![h.scores[0]; params.num_hypotheses];
                }
                results[ex] = Some(h);
            } else {
                keep.push(r);
                inputs[r] = word;
            }
        }
        if keep.is_empty() {
            break;
        }
        if keep.len() != alive.len() {
            decoder.select_rows(&keep);
            alive = keep.iter().map(|&r| alive[r]).collect();
            inputs = keep.iter().map(|&r| inputs[r]).collect();
        }
    }
    results.into_iter().map(Option::unwrap_or_default).collect()
}
