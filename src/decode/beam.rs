//! Beam search with CTranslate2's exact bookkeeping: 2 x beam candidates per example and
//! step, finished hypotheses replaced by the next unfinished candidates, `patience`
//! deciding how many finished hypotheses end the search, forced target prefixes.
use super::{disable, finalize, target_id, DecoderSession, Hypotheses, OutputColumns, SearchObserver, SearchParams, StartTokens};
use crate::backend::cpu::ops;
use crate::backend::Ctx;

/// The `k` best (index, value) pairs of `values`, best first; the lower index wins ties.
pub fn top_k(values: &[f32], k: usize, out: &mut Vec<(usize, f32)>) {
    out.clear();
    if k == 0 {
        return;
    }
    // Once k values are held, whole chunks that cannot enter are skipped with one
    // vectorized comparison: decoding takes the top 8 of 65k logits for every row.
    for (c, chunk) in values.chunks(64).enumerate() {
        if out.len() == k {
            let threshold = out[k - 1].1;
            if !chunk.iter().fold(false, |enters, &v| enters | !(v <= threshold)) {
                continue;
            }
        }
        for (i, &v) in chunk.iter().enumerate() {
            if out.len() == k {
                if v <= out[k - 1].1 {
                    continue;
                }
                out.pop();
            }
            let pos = out.partition_point(|&(_, x)| x >= v);
            out.insert(pos, (c * 64 + i, v));
        }
    }
}

/// Live decoding state of one example.
struct Beams {
    example: usize,
    top_beam_finished: bool,
    finished: Vec<(Vec<u32>, f32)>,
}

/// Token streaming is greedy-only: the observer is asked only whether to stop.
pub fn beam_search(
    ctx: &Ctx,
    decoder: &mut dyn DecoderSession,
    observer: &dyn SearchObserver,
    starts: &[StartTokens],
    params: &SearchParams,
) -> Vec<Hypotheses> {
    let beam = params.beam_size;
    let vocab = decoder.vocabulary_size();
    let OutputColumns { ids: output, disabled, end: end_columns } = OutputColumns::new(decoder, params);
    let output = output.as_deref();
    let num_candidates = 2 * beam;
    let max_candidates = (beam as f32 * params.patience).round() as usize;
    let allow_early_exit = params.length_penalty == 0.0;
    // The first step only expands the first beam, so it runs on one row per example
    // unless the vocabulary is smaller than the candidate list.
    let expand_after_first_step = num_candidates <= vocab;
    let has_prefix = starts.iter().any(|s| !s.prefix.is_empty());
    let is_end = |id: u32| params.end_ids.contains(&id);
    // A token that is not an end token, to fill the candidates that must not be taken (id 0
    // is the end token in Marian vocabularies).
    let filler = (0..).find(|&id| !is_end(id)).unwrap_or(0);

    let mut results: Vec<Option<Hypotheses>> = vec![None; starts.len()];
    let mut live: Vec<Beams> = (0..starts.len())
        .map(|example| Beams { example, top_beam_finished: false, finished: Vec::new() })
        .collect();
    let mut inputs: Vec<u32> = starts.iter().map(|s| s.start).collect();
    let mut beam_scores: Vec<f32> = Vec::new();
    let mut sequences: Vec<Vec<u32>> = Vec::new();
    if !expand_after_first_step {
        let rows: Vec<usize> = (0..starts.len()).flat_map(|i| std::iter::repeat(i).take(beam)).collect();
        decoder.select_rows(&rows);
        inputs = rows.iter().map(|&i| inputs[i]).collect();
        beam_scores = (0..rows.len()).map(|r| if r % beam == 0 { 0.0 } else { f32::MIN }).collect();
        sequences = vec![Vec::new(); rows.len()];
    }

    let mut logits = Vec::new();
    let mut candidates = Vec::with_capacity(num_candidates);
    let mut row_candidates: Vec<(usize, f32)> = Vec::new();
    for step in 0..params.max_length {
        if observer.cancelled() {
            break;
        }
        let is_expanded = !expand_after_first_step || step > 0;
        let rows_per_example = if is_expanded { beam } else { 1 };
        decoder.step(ctx, &inputs, &mut logits);
        // Candidates of each row: its best 2 x beam tokens by logit. Log-probabilities are
        // only formed for them (log_softmax is monotonic within a row), with the same
        // arithmetic as a full log-softmax: (logit - logsumexp) + beam score.
        row_candidates.clear();
        for (r, row) in logits.chunks_exact_mut(vocab).enumerate() {
            disable(row, &disabled);
            if step < params.min_length {
                disable(row, &end_columns);
            }
            let shift = ops::log_sum_exp(row);
            let beam_score = beam_scores.get(r).copied();
            top_k(row, num_candidates, &mut candidates);
            row_candidates.extend(candidates.iter().map(|&(id, logit)| {
                let log_prob = logit - shift;
                (r * vocab + id, beam_score.map_or(log_prob, |s| log_prob + s))
            }));
        }
        let per_row = num_candidates.min(vocab);

        let last_step = step + 1 == params.max_length;
        let mut next_live = Vec::with_capacity(live.len());
        let mut next_rows = Vec::with_capacity(live.len() * beam);
        let mut next_inputs = Vec::with_capacity(live.len() * beam);
        let mut next_scores = Vec::with_capacity(live.len() * beam);
        let mut next_sequences = Vec::with_capacity(live.len() * beam);
        for (i, mut beams) in live.into_iter().enumerate() {
            let first_row = i * rows_per_example;
            // Best candidates over this example's rows (flat index = row * vocab + token).
            let block = &row_candidates[first_row * per_row..(first_row + rows_per_example) * per_row];
            candidates.clear();
            candidates.extend_from_slice(block);
            candidates.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap_or(std::cmp::Ordering::Equal).then(a.0.cmp(&b.0)));
            candidates.truncate(num_candidates);
            // (word, score, source row) of each candidate.
            let mut cands: Vec<(u32, f32, usize)> =
                candidates.iter().map(|&(flat, score)| (target_id(flat % vocab, output), score, flat / vocab)).collect();
            let prefix = &starts[beams.example].prefix;
            if has_prefix && step <= prefix.len() {
                for (k, c) in cands.iter_mut().enumerate() {
                    if step < prefix.len() {
                        *c = (prefix[step], if k == 0 { 0.0 } else { -1e10 }, first_row);
                    } else if k > 0 && is_end(c.0) {
                        // First free step: only the first beam expands; secondary beams
                        // must not end right away (CTranslate2 issue #277).
                        *c = (filler, -1e10, first_row);
                    }
                }
            }
            let sequence_of = |c: &(u32, f32, usize)| {
                let mut s = sequences.get(c.2).cloned().unwrap_or_default();
                s.push(c.0);
                s
            };
            let mut active = Vec::with_capacity(beam);
            let mut secondary = beam;
            for k in 0..beam.min(cands.len()) {
                let (word, score, _) = cands[k];
                let mut next = k;
                if (is_end(word) && step >= prefix.len()) || last_step {
                    if k == 0 {
                        beams.top_beam_finished = true;
                    }
                    beams.finished.push((sequence_of(&cands[k]), score));
                    if let Some(j) = (secondary..cands.len()).find(|&j| !is_end(cands[j].0)) {
                        next = j;
                        secondary = j + 1;
                    }
                }
                active.push(next);
            }
            let done = last_step
                || if allow_early_exit {
                    beams.top_beam_finished && beams.finished.len() >= params.num_hypotheses
                } else {
                    beams.finished.len() >= max_candidates
                };
            if done {
                let finished = std::mem::take(&mut beams.finished);
                results[beams.example] =
                    Some(finalize(finished, params.num_hypotheses, params.length_penalty, params.return_scores));
                continue;
            }
            for &a in &active {
                let c = &cands[a];
                next_rows.push(c.2);
                next_inputs.push(c.0);
                next_scores.push(c.1);
                next_sequences.push(sequence_of(c));
            }
            next_live.push(beams);
        }
        if next_live.is_empty() {
            break;
        }
        decoder.select_rows(&next_rows);
        live = next_live;
        inputs = next_inputs;
        beam_scores = next_scores;
        sequences = next_sequences;
    }
    results.into_iter().map(Option::unwrap_or_default).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_orders_and_breaks_ties_by_index() {
        let mut out = Vec::new();
        top_k(&[1.0, 3.0, 3.0, -1.0, 2.0], 3, &mut out);
        assert_eq!(out, vec![(1, 3.0), (2, 3.0), (4, 2.0)]);
        top_k(&[1.0], 4, &mut out);
        assert_eq!(out, vec![(0, 1.0)]);
        // Across chunk boundaries, against a full sort.
        let values: Vec<f32> = (0..1000).map(|i| ((i * 7919) % 997) as f32 * 0.5).collect();
        top_k(&values, 8, &mut out);
        let mut sorted: Vec<(usize, f32)> = values.iter().copied().enumerate().collect();
        sorted.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap().then(a.0.cmp(&b.0)));
        assert_eq!(out, sorted[..8].to_vec());
    }
}
