//! Greedy search: the arg-max token at each step. The log-probability of the chosen token
//! is only computed when scores are requested (the arg-max of the logits is the same).
//!
//! A search can take in more examples while it runs (continuous batching, see
//! [`ContinuousSearch`]): rows finish at different steps, and a batch decoded alone ends
//! with a few long hypotheses stepping through the whole model for one or two rows each.
//! Every example keeps its own step count, parameters and results, so each is decoded
//! exactly as it would be on its own.
use super::{
    apply_repetition_rules, disable, finalize, map_rows, one_batch, target_id, Attention, ContinuousSearch, DecoderSession, Groups, Hypotheses,
    OutputColumns, RepetitionRules, Rng, Sampling, SearchObserver, SearchParams, StartTokens,
};
use std::sync::Arc;
use crate::backend::cpu::ops;
use crate::backend::Ctx;

/// Greedy search over one batch; results in batch order.
pub fn greedy_search(
    ctx: &Ctx,
    decoder: &mut dyn DecoderSession,
    observer: &mut dyn SearchObserver,
    starts: &[StartTokens],
    params: &SearchParams,
) -> Vec<Hypotheses> {
    one_batch(observer, |search| greedy_continuous(ctx, decoder, search, starts.to_vec(), params.clone()))
}

/// Each row's arg-max (after its `disabled` columns are set to `f32::MIN`) into `best`,
/// as a score its log-probability where `scored[row]` (the arg-max minus the row's
/// log-sum-exp, as a full log-softmax would give it), else its logit. The rows are
/// independent: they are split across the worker's team (each log-sum-exp takes the
/// exponentials of the whole vocabulary).
fn best_of_rows(ctx: &Ctx, logits: &mut [f32], vocab: usize, disabled: &[&[u32]], scored: &[bool], best: &mut Vec<(usize, f32)>) {
    let work = logits.len() * if scored.contains(&true) { 4 } else { 1 };
    *best = map_rows(ctx, logits, vocab, work, |r, row| {
        disable(row, disabled[r]);
        let (column, logit) = ops::argmax(row);
        (column, if scored[r] { logit - ops::log_sum_exp(row) } else { logit })
    });
}

/// Each row's token drawn by its `sampling` (`Some`: CTranslate2's random sampling, after
/// its `disabled` columns are set to `f32::MIN`) or its arg-max, into `best` as
/// `best_of_rows` gives them. Row by row: each draw moves its example's generator.
#[allow(clippy::too_many_arguments)]
fn sample_rows(logits: &mut [f32], vocab: usize, disabled: &[&[u32]], scored: &[bool], sampling: &[Option<Sampling>], rngs: &mut [Rng], best: &mut Vec<(usize, f32)>) {
    best.clear();
    for (r, row) in logits.chunks_exact_mut(vocab).enumerate() {
        disable(row, disabled[r]);
        let column = match sampling[r] {
            Some(s) => s.draw(row, &mut rngs[r]),
            None => ops::argmax(row).0,
        };
        best.push((column, if scored[r] { row[column] - ops::log_sum_exp(row) } else { row[column] }));
    }
}

/// One example being decoded.
struct Example {
    group: usize,
    start: StartTokens,
    tokens: Vec<u32>,
    score: f32,
    /// The attention of each token, when asked for.
    attention: Attention,
    /// Steps decoded so far.
    step: usize,
}

/// The examples of a search and its live rows.
#[derive(Default)]
struct Live {
    examples: Vec<Example>,
    groups: Groups,
    /// Which example each row decodes, its last token and its sampling's generator.
    alive: Vec<usize>,
    inputs: Vec<u32>,
    rngs: Vec<Rng>,
}

impl Live {
    fn join(&mut self, starts: Vec<StartTokens>, params: SearchParams, search: &mut dyn ContinuousSearch) {
        let group = self.groups.add(params, starts.len(), self.examples.len(), search);
        for start in starts {
            self.alive.push(self.examples.len());
            self.inputs.push(start.start);
            self.rngs.push(Rng::new(start.seed));
            self.examples.push(Example { group, start, tokens: Vec::new(), score: 0.0, attention: Vec::new(), step: 0 });
        }
    }
}

/// Greedy search starting with the batch `starts` (group 0), taking in further groups from
/// `search` as it goes; each group's results go to `search.group_done`.
pub fn greedy_continuous(ctx: &Ctx, decoder: &mut dyn DecoderSession, search: &mut dyn ContinuousSearch, starts: Vec<StartTokens>, params: SearchParams) {
    let vocab = decoder.vocabulary_size();
    let OutputColumns { ids: output, disabled, end: end_columns } = OutputColumns::new(decoder, &params);
    let output = output.as_deref();
    // The columns a row may not take before its minimum length: the disabled ones and ends.
    let early: Vec<u32> = disabled.iter().chain(&end_columns).copied().collect();
    let masked = |step: usize, params: &SearchParams| if step < params.min_length { &early[..] } else { &disabled[..] };
    let mut live = Live::default();
    live.join(starts, params, search);
    let (mut logits, mut best) = (Vec::new(), Vec::new());
    loop {
        if search.cancelled() {
            break;
        }
        if let Some((starts, params)) = search.next_group(ctx, decoder, live.alive.len()) {
            live.join(starts, params, search);
        }
        let Live { examples, groups, alive, inputs, rngs } = &mut live;
        if alive.is_empty() {
            break;
        }
        // Without scores only each row's best column matters, which the decoder may find
        // without writing the logits out (8 MB for 32 rows of a 65k vocabulary).
        let mut masks: Vec<&[u32]> = alive.iter().map(|&ex| masked(examples[ex].step, groups.params(examples[ex].group))).collect();
        let scored: Vec<bool> = alive.iter().map(|&ex| groups.params(examples[ex].group).return_scores).collect();
        // Repetition rules change the logits, so they need them written out.
        let repetition: Vec<(&[u32], &RepetitionRules)> =
            alive.iter().map(|&ex| (&examples[ex].tokens[..], &groups.params(examples[ex].group).repetition)).collect();
        let repeating = repetition.iter().any(|(_, rules)| rules.is_active());
        let sampling: Vec<Option<Sampling>> = alive.iter().map(|&ex| groups.params(examples[ex].group).sampling).collect();
        let sampled = sampling.iter().any(Option::is_some);
        let fused = if scored.contains(&true) || repeating || sampled {
            decoder.step(ctx, inputs, &mut logits);
            false
        } else {
            decoder.step_best(ctx, inputs, &masks, &mut logits, &mut best)
        };
        if !fused {
            let rows = &mut logits[..alive.len() * vocab];
            let disabled = if repeating { apply_repetition_rules(rows, vocab, output, &repetition, &masks) } else { Vec::new() };
            if repeating {
                masks = disabled.iter().map(Vec::as_slice).collect();
            }
            if sampled {
                sample_rows(rows, vocab, &masks, &scored, &sampling, rngs, &mut best);
            } else {
                best_of_rows(ctx, rows, vocab, &masks, &scored, &mut best);
            }
        }
        let mut keep = Vec::with_capacity(alive.len());
        let attention = decoder.step_attention();
        for (r, &ex) in alive.iter().enumerate() {
            let example = &mut examples[ex];
            let (params, step) = (groups.params(example.group), example.step);
            example.step += 1;
            if params.return_attention {
                example.attention.push(Arc::new(attention.get(r).cloned().unwrap_or_default()));
            }
            let (column, mut score) = best[r];
            let mut word = target_id(column, output);
            let prefix = &example.start.prefix;
            if step < prefix.len() {
                // Forced prefix tokens do not count in the score (as in CTranslate2).
                word = prefix[step];
                score = 0.0;
            }
            example.tokens.push(word);
            example.score += score;
            let mut is_end = params.end_ids.contains(&word) && step >= prefix.len();
            let is_last = is_end || step + 1 == params.max_length;
            if step >= prefix.len() && !search.token(ex, step - prefix.len(), word, is_last) {
                is_end = true; // The observer ends this hypothesis here.
            }
            if is_end || is_last {
                let ids = std::mem::take(&mut example.tokens);
                let hyps = vec![(ids, example.score, std::mem::take(&mut example.attention))];
                let mut h = finalize(hyps, 1, params.length_penalty, params.return_scores);
                // With patience > 1 CTranslate2 accepts num_hypotheses > 1 for greedy search
                // and returns copies of the single greedy hypothesis.
                h.ids = vec![h.ids[0].clone(); params.num_hypotheses];
                if params.return_scores {
                    h.scores = vec![h.scores[0]; params.num_hypotheses];
                }
                if let Some(first) = h.attention.first() {
                    h.attention = vec![first.clone(); params.num_hypotheses];
                }
                groups.finish(example.group, ex, h, search);
            } else {
                keep.push(r);
                inputs[r] = word;
            }
        }
        if keep.len() != alive.len() {
            decoder.select_rows(&keep);
            *alive = keep.iter().map(|&r| alive[r]).collect();
            *inputs = keep.iter().map(|&r| inputs[r]).collect();
            *rngs = keep.iter().map(|&r| rngs[r].clone()).collect();
            // The logits of a full batch (32 rows of 65k floats: 8 MB) would otherwise stay
            // allocated through the next batch's encoding, the peak of a decoding whose keys
            // and values are stored compactly.
            if logits.capacity() > 2 * alive.len() * vocab {
                logits.truncate(alive.len() * vocab);
                logits.shrink_to_fit();
            }
        }
    }
    live.groups.stop(search);
}
