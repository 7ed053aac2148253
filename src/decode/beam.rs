//! Beam search with CTranslate2's exact bookkeeping: 2 x beam candidates per example and
//! step, finished hypotheses replaced by the next unfinished candidates, `patience`
//! deciding how many finished hypotheses end the search, forced target prefixes. Like
//! greedy search it can take in more examples while it runs (continuous batching).
use super::{
    apply_repetition_rules, disable, finalize, map_rows, one_batch, target_id, Attention, ContinuousSearch, DecoderSession, Finished, Groups,
    Hypotheses, OutputColumns, RepetitionRules, SearchObserver, SearchParams, StartTokens,
};
use std::sync::Arc;
use crate::backend::cpu::ops;
use crate::backend::{Ctx, TopLogits};

/// The `k` best (index, value) pairs of `values`, best first; the lower index wins ties.
// `!(v <= threshold)` on purpose: a NaN enters the comparison's slow path.
#[allow(clippy::neg_cmp_op_on_partial_ord)]
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

/// What [`DecoderSession::step_top`] finds, from the logits on the host: each row's `k`
/// best logits (`top_k`, after its `disabled` columns are set to `f32::MIN`) and its
/// log-sum-exp. The rows are independent, so they are split across the worker's team
/// (the exponentials of 65k logits a row were 4% of int8 beam 4 at 2 threads, all on
/// the worker's thread).
fn host_top(ctx: &Ctx, logits: &mut [f32], vocab: usize, disabled: &[&[u32]], k: usize, top: &mut TopLogits) {
    // A row's log-sum-exp costs about as much as 4 multiply-adds a logit.
    let rows = map_rows(ctx, logits, vocab, logits.len() * 4, |r, row| {
        disable(row, disabled[r]);
        let mut best = Vec::with_capacity(k);
        top_k(row, k, &mut best);
        // The best candidate is the row's largest logit: no pass for the maximum (a NaN in
        // the row makes the sum NaN either way). Meanwhile the next row is fetched (the
        // logits of a step outgrow the caches).
        let next = row.as_ptr().wrapping_add(vocab);
        let log_sum_exp = match best.first() {
            Some(&(_, max)) if !max.is_nan() => ops::log_sum_exp_then(row, max, next),
            _ => ops::log_sum_exp(row),
        };
        (best, log_sum_exp)
    });
    top.k = k;
    top.candidates.clear();
    top.log_sum_exp.clear();
    for (candidates, log_sum_exp) in rows {
        top.candidates.extend(candidates);
        top.log_sum_exp.push(log_sum_exp);
    }
}

/// One example being decoded, and its finished hypotheses.
struct Example {
    group: usize,
    prefix: Vec<u32>,
    /// Whether an example of its group has a target prefix: CTranslate2 then treats the
    /// first free step of every example of the batch specially.
    group_has_prefix: bool,
    /// Steps decoded so far.
    step: usize,
    top_beam_finished: bool,
    finished: Vec<Finished>,
}

/// The examples of a search and its live rows: the examples decoding in row order, each
/// with its rows adjacent (one row on an example's first step unless the vocabulary is
/// smaller than the candidates, else `beam`), and per row its input token, score and tokens.
#[derive(Default)]
struct Live {
    examples: Vec<Example>,
    groups: Groups,
    alive: Vec<usize>,
    inputs: Vec<u32>,
    scores: Vec<f32>,
    sequences: Vec<Vec<u32>>,
    /// Each row's attention so far, where its group asks for it.
    attention: Vec<Attention>,
}

impl Live {
    /// Takes in a group whose sources the decoder has as its last rows, one row each.
    fn join(
        &mut self,
        decoder: &mut dyn DecoderSession,
        starts: Vec<StartTokens>,
        params: SearchParams,
        beam_rows: usize,
        search: &mut dyn ContinuousSearch,
    ) {
        let group_has_prefix = starts.iter().any(|s| !s.prefix.is_empty());
        let group = self.groups.add(params, starts.len(), self.examples.len(), search);
        let old = self.inputs.len();
        for s in starts {
            self.alive.push(self.examples.len());
            self.inputs.push(s.start);
            self.examples.push(Example { group, prefix: s.prefix, group_has_prefix, step: 0, top_beam_finished: false, finished: Vec::new() });
        }
        if beam_rows > 1 {
            // The vocabulary is smaller than the candidates: the new examples start with
            // all their beams, the first one scoring 0.
            let rows: Vec<usize> = (0..old).chain((old..self.inputs.len()).flat_map(|r| std::iter::repeat_n(r, beam_rows))).collect();
            decoder.select_rows(&rows);
            self.inputs = rows.iter().map(|&r| self.inputs[r]).collect();
        }
        let new_rows = self.inputs.len() - old;
        self.scores.extend((0..new_rows).map(|k| if k % beam_rows == 0 { 0.0 } else { f32::MIN }));
        self.sequences.resize(self.inputs.len(), Vec::new());
        self.attention.resize(self.inputs.len(), Vec::new());
    }
}

/// Beam search over one batch; results in batch order.
pub fn beam_search(
    ctx: &Ctx,
    decoder: &mut dyn DecoderSession,
    observer: &mut dyn SearchObserver,
    starts: &[StartTokens],
    params: &SearchParams,
) -> Vec<Hypotheses> {
    one_batch(observer, |search| beam_continuous(ctx, decoder, search, starts.to_vec(), params.clone()))
}

/// Beam search starting with the batch `starts` (group 0), taking in further groups from
/// `search` as it goes (continuous batching, as `greedy_continuous`); each group's results
/// go to `search.group_done`. Every example keeps its own steps, parameters and finished
/// hypotheses, so it is decoded exactly as in its own batch. Token streaming is
/// greedy-only: the search is asked only whether to stop.
pub fn beam_continuous(
    ctx: &Ctx,
    decoder: &mut dyn DecoderSession,
    search: &mut dyn ContinuousSearch,
    starts: Vec<StartTokens>,
    params: SearchParams,
) {
    let beam = params.beam_size;
    let vocab = decoder.vocabulary_size();
    let OutputColumns { ids: output, disabled, end: end_columns } = OutputColumns::new(decoder, &params);
    let output = output.as_deref();
    let num_candidates = 2 * beam;
    // The first step only expands the first beam, so it runs on one row per example
    // unless the vocabulary is smaller than the candidate list.
    let expand_after_first_step = num_candidates <= vocab;
    let first_step_rows = if expand_after_first_step { 1 } else { beam };
    let is_end = |id: u32| params.end_ids.contains(&id);
    // A token that is not an end token, to fill the candidates that must not be taken (id 0
    // is the end token in Marian vocabularies).
    let filler = (0..).find(|&id| !is_end(id)).unwrap_or(0);

    let mut live = Live::default();
    live.join(decoder, starts, params.clone(), first_step_rows, search);
    // The columns a row may not take before its minimum length: the disabled ones and ends.
    let early: Vec<u32> = disabled.iter().chain(&end_columns).copied().collect();
    let mut logits = Vec::new();
    let mut top = TopLogits::default();
    let mut candidates = Vec::with_capacity(num_candidates);
    let mut row_candidates: Vec<(usize, f32)> = Vec::new();
    let per_row = num_candidates.min(vocab);
    loop {
        if search.cancelled() {
            break;
        }
        if let Some((starts, params)) = search.next_group(ctx, decoder, live.inputs.len()) {
            debug_assert_eq!(params.beam_size, beam, "the groups of a search share the beam size");
            live.join(decoder, starts, params, first_step_rows, search);
        }
        let Live { examples, groups, alive, inputs, scores, sequences, attention } = &mut live;
        if alive.is_empty() {
            break;
        }
        let rows_of = |e: &Example| if e.step == 0 { first_step_rows } else { beam };
        // Candidates of each row: its best 2 x beam tokens by logit. Log-probabilities are
        // only formed for them (log_softmax is monotonic within a row), with the same
        // arithmetic as a full log-softmax: (logit - logsumexp) + beam score. A backend
        // that finds them where the logits are (a GPU) hands over only those.
        let masks: Vec<&[u32]> = alive
            .iter()
            .flat_map(|&ex| {
                let example = &examples[ex];
                let mask = if example.step < groups.params(example.group).min_length { &early[..] } else { &disabled[..] };
                std::iter::repeat_n(mask, rows_of(example))
            })
            .collect();
        // Repetition rules change the logits, so they need them written out.
        let repetition: Vec<(&[u32], &RepetitionRules)> = alive
            .iter()
            .flat_map(|&ex| std::iter::repeat_n(&groups.params(examples[ex].group).repetition, rows_of(&examples[ex])))
            .zip(sequences.iter())
            .map(|(rules, tokens)| (&tokens[..], rules))
            .collect();
        if repetition.iter().any(|(_, rules)| rules.is_active()) {
            decoder.step(ctx, inputs, &mut logits);
            let rows = &mut logits[..masks.len() * vocab];
            let disabled = apply_repetition_rules(rows, vocab, output, &repetition, &masks);
            let masks: Vec<&[u32]> = disabled.iter().map(Vec::as_slice).collect();
            host_top(ctx, rows, vocab, &masks, per_row, &mut top);
        } else if !decoder.step_top(ctx, inputs, &masks, per_row, &mut logits, &mut top) {
            host_top(ctx, &mut logits[..masks.len() * vocab], vocab, &masks, per_row, &mut top);
        }
        row_candidates.clear();
        let mut r = 0;
        for &ex in alive.iter() {
            let example = &examples[ex];
            // On one row, an example's first step has no beam score to add.
            let expanded = !expand_after_first_step || example.step > 0;
            for _ in 0..rows_of(example) {
                let shift = top.log_sum_exp[r];
                row_candidates.extend(top.candidates[r * per_row..(r + 1) * per_row].iter().map(|&(id, logit)| {
                    let log_prob = logit - shift;
                    (r * vocab + id, if expanded { log_prob + scores[r] } else { log_prob })
                }));
                r += 1;
            }
        }

        let mut next_alive = Vec::with_capacity(alive.len());
        let mut next_rows = Vec::with_capacity(alive.len() * beam);
        let mut next_inputs = Vec::with_capacity(alive.len() * beam);
        let mut next_scores = Vec::with_capacity(alive.len() * beam);
        let mut next_sequences = Vec::with_capacity(alive.len() * beam);
        let mut next_attention = Vec::with_capacity(alive.len() * beam);
        // This step's attention of each row, shared by the candidates it gives.
        let step_attention: Vec<Arc<Vec<f32>>> = decoder.step_attention().iter().map(|a| Arc::new(a.clone())).collect();
        let mut first_row = 0;
        for &ex in alive.iter() {
            let example = &mut examples[ex];
            let (params, step, rows_per_example) = (groups.params(example.group), example.step, rows_of(example));
            example.step += 1;
            // Best candidates over this example's rows (flat index = row * vocab + token).
            let block = &row_candidates[first_row * per_row..(first_row + rows_per_example) * per_row];
            candidates.clear();
            candidates.extend_from_slice(block);
            candidates.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap_or(std::cmp::Ordering::Equal).then(a.0.cmp(&b.0)));
            candidates.truncate(num_candidates);
            // (word, score, source row) of each candidate.
            let mut cands: Vec<(u32, f32, usize)> =
                candidates.iter().map(|&(flat, score)| (target_id(flat % vocab, output), score, flat / vocab)).collect();
            let prefix = &example.prefix;
            if example.group_has_prefix && step <= prefix.len() {
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
            first_row += rows_per_example;
            let sequence_of = |c: &(u32, f32, usize)| {
                let mut s = sequences[c.2].clone();
                s.push(c.0);
                s
            };
            let attention_of = |c: &(u32, f32, usize)| match step_attention.get(c.2) {
                Some(step) if params.return_attention => {
                    let mut a = attention[c.2].clone();
                    a.push(step.clone());
                    a
                }
                _ => Vec::new(),
            };
            let last_step = step + 1 == params.max_length;
            let mut active = Vec::with_capacity(beam);
            let mut secondary = beam;
            for k in 0..beam.min(cands.len()) {
                let (word, score, _) = cands[k];
                let mut next = k;
                if (is_end(word) && step >= prefix.len()) || last_step {
                    if k == 0 {
                        example.top_beam_finished = true;
                    }
                    example.finished.push((sequence_of(&cands[k]), score, attention_of(&cands[k])));
                    if let Some(j) = (secondary..cands.len()).find(|&j| !is_end(cands[j].0)) {
                        next = j;
                        secondary = j + 1;
                    }
                }
                active.push(next);
            }
            let done = last_step
                || if params.length_penalty == 0.0 {
                    // Early exit: no later hypothesis can beat the finished top beam.
                    example.top_beam_finished && example.finished.len() >= params.num_hypotheses
                } else {
                    example.finished.len() >= (beam as f32 * params.patience).round() as usize
                };
            if done {
                let h = finalize(std::mem::take(&mut example.finished), params.num_hypotheses, params.length_penalty, params.return_scores);
                groups.finish(example.group, ex, h, search);
                continue;
            }
            for &a in &active {
                let c = &cands[a];
                next_rows.push(c.2);
                next_inputs.push(c.0);
                next_scores.push(c.1);
                next_sequences.push(sequence_of(c));
                next_attention.push(attention_of(c));
            }
            next_alive.push(ex);
        }
        // Even when no row is left: the next group joins an empty decoding.
        decoder.select_rows(&next_rows);
        *alive = next_alive;
        *inputs = next_inputs;
        *scores = next_scores;
        *sequences = next_sequences;
        *attention = next_attention;
    }
    live.groups.stop(search);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The search takes the row maximum from its best candidate: the same shift as a full
    /// log-sum-exp, bit for bit (disabled tokens at -inf included, every ISA).
    #[test]
    fn the_best_candidate_gives_the_log_sum_exp_shift() {
        use crate::backend::cpu::isa;
        for n in [1, 7, 33, 1000, 65_001] {
            let mut row: Vec<f32> = (0..n).map(|i| ((i * 7919) % 997) as f32 * 0.013 - 6.0).collect();
            row.iter_mut().step_by(5).for_each(|v| *v = f32::NEG_INFINITY);
            for level in isa::available() {
                isa::with_isa(level, || {
                    let mut out = Vec::new();
                    top_k(&row, 8, &mut out);
                    let fused = ops::log_sum_exp_with_max(&row, out[0].1);
                    assert_eq!(fused.to_bits(), ops::log_sum_exp(&row).to_bits(), "{level:?} n {n}");
                });
            }
        }
    }

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
