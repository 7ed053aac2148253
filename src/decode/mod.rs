//! Search strategies over a step-wise decoder: greedy search and beam search, with the
//! semantics of CTranslate2's `translate_batch`.
pub mod beam;
pub mod greedy;

pub use crate::model::DecoderSession;

use crate::backend::cpu::{ops, split_rows};
use crate::backend::Ctx;
use std::sync::Mutex;

/// The logits columns of `ids` when the output is the subset `output` (sorted target ids);
/// ids outside the subset have no column.
pub(crate) fn columns(ids: &[u32], output: Option<&[u32]>) -> Vec<u32> {
    match output {
        None => ids.to_vec(),
        Some(out) => ids.iter().filter_map(|id| out.binary_search(id).ok().map(|c| c as u32)).collect(),
    }
}

/// What a search needs of a session's output: its target ids (when a subset), and the
/// logits columns of the disabled ids and of the end ids.
pub(crate) struct OutputColumns {
    pub ids: Option<Vec<u32>>,
    pub disabled: Vec<u32>,
    pub end: Vec<u32>,
}

impl OutputColumns {
    pub fn new(decoder: &dyn DecoderSession, params: &SearchParams) -> OutputColumns {
        let ids = decoder.output_ids().map(<[u32]>::to_vec);
        let disabled = columns(&params.disabled_ids, ids.as_deref());
        let end = columns(&params.end_ids, ids.as_deref());
        OutputColumns { ids, disabled, end }
    }
}

/// The target id of logits column `column`.
#[inline]
pub(crate) fn target_id(column: usize, output: Option<&[u32]>) -> u32 {
    output.map_or(column as u32, |out| out[column])
}

/// What a search reports to, and asks of, whoever runs it, once per step.
pub trait SearchObserver {
    /// True when the search must stop now (its request was cancelled); the hypotheses
    /// returned are then incomplete and meant to be thrown away.
    fn cancelled(&self) -> bool {
        false
    }
    /// Greedy search chose `id` for `example` at `step` (0-based, forced prefix tokens
    /// excluded); `is_last` when the hypothesis ends with it. Returning false ends that
    /// example's hypothesis here.
    fn token(&mut self, _example: usize, _step: usize, _id: u32, _is_last: bool) -> bool {
        true
    }
}

/// What feeds a continuous search (greedy or beam) and takes its results. Examples are
/// numbered in the order they joined: the first group's from 0, each later group's after
/// those of the groups before it (the numbers `token` reports).
pub trait ContinuousSearch: SearchObserver {
    /// Asked before each step with the number of rows still decoding: may append the next
    /// group's sources to `decoder` (`DecoderSession::append_sources`) and return their
    /// start tokens and parameters. The groups must share the end and disabled ids, and
    /// the beam size.
    fn next_group(&mut self, _ctx: &Ctx, _decoder: &mut dyn DecoderSession, _alive: usize) -> Option<(Vec<StartTokens>, SearchParams)> {
        None
    }
    /// Every example of group `group` has ended (or the search stopped: cancelled): its
    /// hypotheses in the group's order, unfinished ones empty.
    fn group_done(&mut self, group: usize, hypotheses: Vec<Hypotheses>);
}

/// Runs a continuous search (`run`) on one batch that nothing joins: its results in
/// batch order.
pub(crate) fn one_batch(observer: &mut dyn SearchObserver, run: impl FnOnce(&mut dyn ContinuousSearch)) -> Vec<Hypotheses> {
    struct OneBatch<'a> {
        observer: &'a mut dyn SearchObserver,
        results: Vec<Hypotheses>,
    }
    impl SearchObserver for OneBatch<'_> {
        fn cancelled(&self) -> bool {
            self.observer.cancelled()
        }
        fn token(&mut self, example: usize, step: usize, id: u32, is_last: bool) -> bool {
            self.observer.token(example, step, id, is_last)
        }
    }
    impl ContinuousSearch for OneBatch<'_> {
        fn group_done(&mut self, _group: usize, hypotheses: Vec<Hypotheses>) {
            self.results = hypotheses;
        }
    }
    let mut one = OneBatch { observer, results: Vec::new() };
    run(&mut one);
    one.results
}

/// The groups of a continuous search (the batches that joined it), each with its own
/// parameters and results so far.
#[derive(Default)]
pub(crate) struct Groups(Vec<Group>);

struct Group {
    params: SearchParams,
    /// The search's number of the group's first example.
    first: usize,
    results: Vec<Option<Hypotheses>>,
    pending: usize,
}

impl Groups {
    /// Adds a group of `examples` examples numbered from `first`; returns its number.
    pub fn add(&mut self, params: SearchParams, examples: usize, first: usize, search: &mut dyn ContinuousSearch) -> usize {
        let group = self.0.len();
        if examples == 0 {
            search.group_done(group, Vec::new());
        }
        self.0.push(Group { params, first, results: vec![None; examples], pending: examples });
        group
    }

    pub fn params(&self, group: usize) -> &SearchParams {
        &self.0[group].params
    }

    /// Example `example` of group `group` has ended: hands the group over once complete.
    pub fn finish(&mut self, group: usize, example: usize, hypotheses: Hypotheses, search: &mut dyn ContinuousSearch) {
        let g = &mut self.0[group];
        g.results[example - g.first] = Some(hypotheses);
        g.pending -= 1;
        if g.pending == 0 {
            search.group_done(group, std::mem::take(&mut g.results).into_iter().map(Option::unwrap_or_default).collect());
        }
    }

    /// The search stopped (cancelled): the groups not done yet, with what they have.
    pub fn stop(&mut self, search: &mut dyn ContinuousSearch) {
        for (group, g) in self.0.iter_mut().enumerate() {
            if g.pending > 0 {
                g.pending = 0;
                search.group_done(group, std::mem::take(&mut g.results).into_iter().map(Option::unwrap_or_default).collect());
            }
        }
    }
}

/// A search that nobody watches.
pub struct Unobserved;

impl SearchObserver for Unobserved {}

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
    pub repetition: RepetitionRules,
    /// Keep each hypothesis's alignment attention (see [`Hypotheses::attention`]).
    pub return_attention: bool,
    /// Random sampling instead of the arg-max (greedy search only).
    pub sampling: Option<Sampling>,
}

/// CTranslate2's random sampling (`sampling_topk`, `sampling_topp`,
/// `sampling_temperature`): a row's next token is drawn from the softmax of its `topk`
/// best logits (0: all of them) divided by `temperature`, keeping only the most probable
/// of them whose probabilities, before each, sum to less than `topp`. Its score is still
/// its log-probability under the whole row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    pub topk: usize,
    pub topp: f32,
    pub temperature: f32,
}

impl Sampling {
    /// Draws a column of `row` (its logits, masks applied).
    pub(crate) fn draw(&self, row: &[f32], rng: &mut Rng) -> usize {
        let mut candidates: Vec<(usize, f32)> = Vec::new();
        if self.topk == 0 || self.topk >= row.len() {
            candidates.extend(row.iter().copied().enumerate());
        } else {
            beam::top_k(row, self.topk, &mut candidates);
        }
        if self.temperature != 1.0 {
            let scale = 1.0 / self.temperature;
            candidates.iter_mut().for_each(|c| c.1 *= scale);
        }
        let probabilities = |candidates: &[(usize, f32)]| {
            let mut p: Vec<f32> = candidates.iter().map(|c| c.1).collect();
            ops::softmax(&mut p);
            p
        };
        if self.topp < 1.0 {
            let p = probabilities(&candidates);
            let mut order: Vec<usize> = (0..candidates.len()).collect();
            order.sort_by(|&a, &b| p[b].partial_cmp(&p[a]).unwrap_or(std::cmp::Ordering::Equal));
            let (mut before, mut kept) = (0.0, Vec::with_capacity(order.len()));
            for i in order {
                if before >= self.topp {
                    break;
                }
                before += p[i];
                kept.push(candidates[i]);
            }
            candidates = kept;
        }
        let p = probabilities(&candidates);
        let mut u = rng.uniform() * p.iter().map(|&w| w as f64).sum::<f64>();
        for (c, &w) in candidates.iter().zip(&p) {
            if u < w as f64 {
                return c.0;
            }
            u -= w as f64;
        }
        candidates.last().map_or(0, |c| c.0)
    }
}

/// The random numbers of one example's sampling (SplitMix64): each example draws from
/// its own stream, seeded from the call's seed and its place in the call, so that its
/// samples do not depend on how the call is batched.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// CTranslate2's logits processors that read the tokens a row has produced so far (its
/// target prefix included), applied to the row's logits before its disabled columns are
/// set, as CTranslate2 applies them: `penalty` (`repetition_penalty`, 1 = off) divides a
/// non-negative logit of each such token and multiplies a negative one,
/// `no_repeat_ngram_size` n (0 = off) disables every token that would end an n-gram the
/// row already holds (n = 1: every token it produced), and each of `suppressed` (target
/// ids, 2 tokens or more: `suppress_sequences`, whose single tokens are disabled ids)
/// disables its last token where the row ends with the others.
#[derive(Debug, Clone, PartialEq)]
pub struct RepetitionRules {
    pub penalty: f32,
    pub no_repeat_ngram_size: usize,
    pub suppressed: Vec<Vec<u32>>,
}

impl Default for RepetitionRules {
    fn default() -> Self {
        RepetitionRules { penalty: 1.0, no_repeat_ngram_size: 0, suppressed: Vec::new() }
    }
}

impl RepetitionRules {
    pub fn is_active(&self) -> bool {
        self.penalty != 1.0 || self.no_repeat_ngram_size > 0 || !self.suppressed.is_empty()
    }

    /// Applies the penalty to the columns of `tokens` (target ids) in `row`, and appends to
    /// `disabled` the columns the n-gram rule and the suppressed sequences ban. Tokens outside the output subset
    /// `output` have no column and are skipped.
    fn apply(&self, tokens: &[u32], output: Option<&[u32]>, row: &mut [f32], disabled: &mut Vec<u32>) {
        if self.penalty != 1.0 {
            // CTranslate2 gathers every token's logit before writing any: a token produced
            // twice is penalized once.
            let mut seen = columns(tokens, output);
            seen.sort_unstable();
            seen.dedup();
            for c in seen {
                if let Some(v) = row.get_mut(c as usize) {
                    *v = if *v < 0.0 { *v * self.penalty } else { *v / self.penalty };
                }
            }
        }
        let n = self.no_repeat_ngram_size;
        if n > 0 && tokens.len() >= n {
            // Every earlier occurrence of the row's last n - 1 tokens bans the token that
            // followed it.
            let suffix = &tokens[tokens.len() - (n - 1)..];
            let banned: Vec<u32> = (0..=tokens.len() - n).filter(|&i| tokens[i..i + n - 1] == *suffix).map(|i| tokens[i + n - 1]).collect();
            disabled.extend(columns(&banned, output));
        }
        let ends: Vec<u32> = self.suppressed.iter().filter_map(|s| s.split_last()).filter(|(_, head)| tokens.ends_with(head)).map(|(&last, _)| last).collect();
        disabled.extend(columns(&ends, output));
    }
}

/// Applies each row's repetition rules (`rows[r]`: the row's tokens so far and its rules)
/// to its logits (`rows.len()` rows of `vocab`), and returns each row's disabled columns:
/// `masks[r]` and those its rules ban.
pub(crate) fn apply_repetition_rules(logits: &mut [f32], vocab: usize, output: Option<&[u32]>, rows: &[(&[u32], &RepetitionRules)], masks: &[&[u32]]) -> Vec<Vec<u32>> {
    rows.iter()
        .zip(masks)
        .zip(logits.chunks_exact_mut(vocab))
        .map(|(((tokens, rules), mask), row)| {
            let mut disabled = mask.to_vec();
            rules.apply(tokens, output, row, &mut disabled);
            disabled
        })
        .collect()
}

/// Hypotheses of one example, best first; token ids include the target prefix and end
/// with the end token when the hypothesis finished by producing it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Hypotheses {
    pub ids: Vec<Vec<u32>>,
    /// Empty unless scores were requested.
    pub scores: Vec<f32>,
    /// Empty unless attention was requested: per hypothesis, per token, the decoder's
    /// alignment attention over the source positions at the step that produced it
    /// (`DecoderSession::step_attention`).
    pub attention: Vec<Vec<Vec<f32>>>,
}

/// A hypothesis's attention vectors so far, one a token; shared between the beams that
/// grew from one hypothesis.
pub(crate) type Attention = Vec<std::sync::Arc<Vec<f32>>>;

/// A finished hypothesis: its tokens, score (sum of log-probabilities) and attention
/// (empty unless asked for).
pub(crate) type Finished = (Vec<u32>, f32, Attention);

/// Start token and forced prefix of one example, and the seed of its sampling.
#[derive(Debug, Clone)]
pub struct StartTokens {
    pub start: u32,
    pub prefix: Vec<u32>,
    pub seed: u64,
}

pub(crate) fn disable(logits_row: &mut [f32], ids: &[u32]) {
    for &id in ids {
        if let Some(v) = logits_row.get_mut(id as usize) {
            *v = f32::MIN;
        }
    }
}

/// `per_row(row index, row)` for every row of `logits` (`vocab` values each), the rows
/// split across the worker's team (`split_rows`) when `work` (multiply-adds) is worth it;
/// the results in row order. A search's work on each row's logits (masks, arg-max, top-k,
/// log-sum-exp) depends on that row only.
pub(crate) fn map_rows<T: Send>(ctx: &Ctx, logits: &mut [f32], vocab: usize, work: usize, per_row: impl Fn(usize, &mut [f32]) -> T + Sync) -> Vec<T> {
    let parts = Mutex::new(Vec::new());
    split_rows(logits, vocab, ctx.threads, work, |_| true, |first, rows| {
        let found: Vec<T> = rows.chunks_exact_mut(vocab).enumerate().map(|(i, row)| per_row(first + i, row)).collect();
        parts.lock().unwrap_or_else(|e| e.into_inner()).push((first, found));
    });
    let mut parts = parts.into_inner().unwrap_or_else(|e| e.into_inner());
    parts.sort_by_key(|(first, _)| *first);
    parts.into_iter().flat_map(|(_, found)| found).collect()
}

/// CTranslate2's final score: the sum of log-probabilities divided by length^penalty.
pub(crate) fn finalize_score(score: f32, length: usize, length_penalty: f32) -> f32 {
    score / (length as f32).powf(length_penalty)
}

/// Sorts hypotheses best first, keeps `n`, and drops the scores unless requested.
pub(crate) fn finalize(mut hyps: Vec<Finished>, n: usize, length_penalty: f32, return_scores: bool) -> Hypotheses {
    for (ids, score, _) in hyps.iter_mut() {
        *score = finalize_score(*score, ids.len(), length_penalty);
    }
    hyps.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap_or(std::cmp::Ordering::Equal));
    hyps.truncate(n);
    let scores = if return_scores { hyps.iter().map(|h| h.1).collect() } else { Vec::new() };
    let attention = match hyps.iter().any(|h| !h.2.is_empty()) {
        true => hyps.iter().map(|h| h.2.iter().map(|v| v.to_vec()).collect()).collect(),
        false => Vec::new(),
    };
    Hypotheses { ids: hyps.into_iter().map(|h| h.0).collect(), scores, attention }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Ctx, TopLogits};

    /// A decoder whose logits depend only on the step: `table[step][token]`, the same for
    /// every row. It records which rows survive, to check the row bookkeeping.
    struct Scripted {
        table: Vec<Vec<f32>>,
        step: usize,
        rows: Vec<usize>,
    }

    impl DecoderSession for Scripted {
        fn vocabulary_size(&self) -> usize {
            self.table[0].len()
        }
        fn step(&mut self, _ctx: &Ctx, ids: &[u32], logits: &mut Vec<f32>) {
            assert_eq!(ids.len(), self.rows.len(), "one input per live row");
            let row = &self.table[self.step.min(self.table.len() - 1)];
            logits.clear();
            for _ in ids {
                logits.extend_from_slice(row);
            }
            self.step += 1;
        }
        fn select_rows(&mut self, rows: &[usize]) {
            self.rows = rows.iter().map(|&r| self.rows[r]).collect();
        }
    }

    /// [`Scripted`] finding each row's candidates itself, as a GPU backend does
    /// ([`DecoderSession::step_top`]): beam search must decide exactly as from the logits.
    struct ScriptedTop(Scripted);

    impl DecoderSession for ScriptedTop {
        fn vocabulary_size(&self) -> usize {
            self.0.vocabulary_size()
        }
        fn step(&mut self, ctx: &Ctx, ids: &[u32], logits: &mut Vec<f32>) {
            self.0.step(ctx, ids, logits)
        }
        fn step_top(&mut self, ctx: &Ctx, ids: &[u32], disabled: &[&[u32]], k: usize, _: &mut Vec<f32>, top: &mut TopLogits) -> bool {
            let mut logits = Vec::new();
            self.0.step(ctx, ids, &mut logits);
            let vocab = self.vocabulary_size();
            *top = TopLogits { k, ..Default::default() };
            let mut best = Vec::new();
            for (row, mask) in logits.chunks_exact_mut(vocab).zip(disabled) {
                disable(row, mask);
                beam::top_k(row, k, &mut best);
                top.candidates.extend_from_slice(&best);
                top.log_sum_exp.push(crate::backend::cpu::ops::log_sum_exp(row));
            }
            true
        }
        fn select_rows(&mut self, rows: &[usize]) {
            self.0.select_rows(rows)
        }
    }

    #[test]
    fn beam_search_from_candidates_decides_as_from_logits() {
        for (beam, n_best, min_length, prefix, disabled) in
            [(2, 1, 0, vec![], vec![]), (3, 3, 0, vec![], vec![]), (2, 2, 3, vec![], vec![3]), (4, 2, 0, vec![4], vec![]), (5, 1, 2, vec![], vec![])]
        {
            let mut p = params(beam);
            (p.num_hypotheses, p.min_length, p.disabled_ids) = (n_best, min_length, disabled);
            let starts = start(2, prefix);
            let host = beam::beam_search(&Ctx::default(), &mut scripted(2), &mut Unobserved, &starts, &p);
            let found = beam::beam_search(&Ctx::default(), &mut ScriptedTop(scripted(2)), &mut Unobserved, &starts, &p);
            assert_eq!(host, found, "beam {beam}, n-best {n_best}, min length {min_length}");
        }
    }

    const EOS: u32 = 1;

    fn params(beam: usize) -> SearchParams {
        SearchParams {
            beam_size: beam,
            patience: 1.0,
            length_penalty: 1.0,
            num_hypotheses: 1,
            max_length: 10,
            min_length: 0,
            end_ids: vec![EOS],
            disabled_ids: vec![],
            return_scores: true,
            repetition: RepetitionRules::default(),
            return_attention: false,
            sampling: None,
        }
    }

    fn start(n: usize, prefix: Vec<u32>) -> Vec<StartTokens> {
        (0..n).map(|i| StartTokens { start: 0, prefix: prefix.clone(), seed: i as u64 }).collect()
    }

    // Vocabulary: 0 = <s>, 1 = </s>, 2..4 words. Step 0 prefers 2, step 1 prefers 3, then </s>.
    fn scripted(rows: usize) -> Scripted {
        Scripted {
            table: vec![vec![-9.0, -5.0, 3.0, 1.0, 0.0], vec![-9.0, -5.0, 0.0, 3.0, 1.0], vec![-9.0, 4.0, 0.0, 0.0, 0.0]],
            step: 0,
            rows: (0..rows).collect(),
        }
    }

    #[test]
    fn greedy_follows_the_argmax_and_scores_with_log_probabilities() {
        let mut d = scripted(2);
        let out = greedy::greedy_search(&Ctx::default(), &mut d, &mut Unobserved, &start(2, vec![]), &params(1));
        assert_eq!(out[0].ids, vec![vec![2, 3, EOS]]);
        let mut expected = 0.0;
        for (step, tok) in [(0, 2), (1, 3), (2, 1)] {
            let mut row = d.table[step].clone();
            crate::backend::cpu::ops::log_softmax(&mut row);
            expected += row[tok];
        }
        assert!((out[0].scores[0] - expected / 3.0).abs() < 1e-6);
    }

    #[test]
    fn greedy_forces_the_prefix_and_respects_min_and_max_length() {
        let mut p = params(1);
        p.max_length = 2;
        let out = greedy::greedy_search(&Ctx::default(), &mut scripted(1), &mut Unobserved, &start(1, vec![4]), &p);
        assert_eq!(out[0].ids, vec![vec![4, 3]], "prefix token forced, then cut at max_length");
        let mut p = params(1);
        p.min_length = 4;
        p.max_length = 5;
        let out = greedy::greedy_search(&Ctx::default(), &mut scripted(1), &mut Unobserved, &start(1, vec![]), &p);
        assert_eq!(out[0].ids[0].len(), 5, "</s> is disabled before min_length");
        assert_ne!(out[0].ids[0][2], EOS);
    }

    #[test]
    fn beam_search_returns_sorted_n_best() {
        let mut p = params(3);
        p.num_hypotheses = 3;
        let out = beam::beam_search(&Ctx::default(), &mut scripted(1), &mut Unobserved, &start(1, vec![]), &p);
        assert_eq!(out[0].ids.len(), 3);
        assert_eq!(out[0].ids[0], vec![2, 3, EOS]);
        assert!(out[0].scores.windows(2).all(|w| w[0] >= w[1]));
    }

    #[test]
    fn repetition_rules_penalize_once_and_ban_what_repeats_an_ngram() {
        let penalty = RepetitionRules { penalty: 2.0, ..Default::default() };
        let (mut row, mut disabled) = (vec![4.0, -4.0, 1.0, 0.0, 3.0], Vec::new());
        penalty.apply(&[0, 1, 0, 3], None, &mut row, &mut disabled);
        assert_eq!(row, vec![2.0, -8.0, 1.0, 0.0, 3.0], "each token once, zero stays zero");
        assert!(disabled.is_empty());
        let bans = |n: usize, tokens: &[u32], output: Option<&[u32]>| {
            let mut disabled = vec![99];
            RepetitionRules { no_repeat_ngram_size: n, ..Default::default() }.apply(tokens, output, &mut [0.0; 8], &mut disabled);
            disabled
        };
        // [2 3] occurred before, followed by 4; the last occurrence has no follower yet.
        assert_eq!(bans(3, &[2, 3, 4, 2, 3], None), vec![99, 4]);
        assert_eq!(bans(2, &[2, 3, 2, 5, 2], None), vec![99, 3, 5]);
        assert_eq!(bans(1, &[2, 3, 2], None), vec![99, 2, 3, 2], "n = 1: every token produced");
        assert_eq!(bans(4, &[2, 3, 2], None), vec![99], "shorter than n: nothing");
        // On an output subset the bans are columns; tokens outside it have none.
        assert_eq!(bans(1, &[7, 4, 5], Some(&[2, 4, 7])), vec![99, 2, 1]);
        // A suppressed sequence bans its last token after the others, whatever came before.
        let suppress = RepetitionRules { suppressed: vec![vec![3, 4, 5], vec![4, 6], vec![9, 9]], ..Default::default() };
        let mut disabled = Vec::new();
        suppress.apply(&[1, 3, 4], None, &mut [0.0; 10], &mut disabled);
        assert_eq!(disabled, vec![5, 6]);
        disabled.clear();
        suppress.apply(&[4], None, &mut [0.0; 10], &mut disabled);
        assert_eq!(disabled, vec![6], "a sequence longer than the row asks nothing of it");
    }

    #[test]
    fn sampling_draws_from_the_softmax_cut_as_ctranslate2_cuts_it() {
        // Probabilities 1/6, 2/6, 3/6 and a disabled column.
        let row = [1f32.ln(), 2f32.ln(), 3f32.ln(), f32::MIN];
        let frequencies = |s: Sampling| {
            let mut rng = Rng::new(7);
            let mut counts = [0usize; 4];
            (0..60_000).for_each(|_| counts[s.draw(&row, &mut rng)] += 1);
            counts.map(|c| c as f64 / 60_000.0)
        };
        let close = |got: [f64; 4], want: [f64; 4]| got.iter().zip(want).all(|(g, w)| (g - w).abs() < 0.01);
        let all = Sampling { topk: 0, topp: 1.0, temperature: 1.0 };
        assert!(close(frequencies(all), [1.0 / 6.0, 2.0 / 6.0, 0.5, 0.0]), "{:?}", frequencies(all));
        let cold = Sampling { temperature: 0.5, ..all };
        assert!(close(frequencies(cold), [1.0 / 14.0, 4.0 / 14.0, 9.0 / 14.0, 0.0]), "{:?}", frequencies(cold));
        let two = Sampling { topk: 2, ..all };
        assert!(close(frequencies(two), [0.0, 0.4, 0.6, 0.0]), "{:?}", frequencies(two));
        // topp: tokens join while the probability before them is below it.
        assert_eq!(frequencies(Sampling { topp: 0.5, ..all }), [0.0, 0.0, 1.0, 0.0]);
        assert!(close(frequencies(Sampling { topp: 0.6, ..all }), [0.0, 0.4, 0.6, 0.0]));
        // The same seed draws the same.
        let draws = |seed| {
            let mut rng = Rng::new(seed);
            (0..32).map(|_| all.draw(&row, &mut rng)).collect::<Vec<_>>()
        };
        assert_eq!(draws(3), draws(3));
        assert_ne!(draws(3), draws(4));
    }

    #[test]
    fn searches_follow_the_repetition_rules() {
        // Step 0 prefers 2; step 1 prefers 2 again, then 3; step 2 ends.
        let table = vec![vec![-9.0, -5.0, 3.0, 1.0, 0.0], vec![-9.0, -5.0, 3.0, 2.0, 1.0], vec![-9.0, 4.0, 0.0, 0.0, 0.0]];
        let decoder = || Scripted { table: table.clone(), step: 0, rows: vec![0] };
        let mut p = params(1);
        let out = greedy::greedy_search(&Ctx::default(), &mut decoder(), &mut Unobserved, &start(1, vec![]), &p);
        assert_eq!(out[0].ids[0], vec![2, 2, EOS]);
        p.repetition.no_repeat_ngram_size = 1;
        let out = greedy::greedy_search(&Ctx::default(), &mut decoder(), &mut Unobserved, &start(1, vec![]), &p);
        assert_eq!(out[0].ids[0], vec![2, 3, EOS]);
        // 3 / 2 = 1.5 < 2: the penalty makes 3 the best at step 1, in greedy and beam search.
        p.repetition = RepetitionRules { penalty: 2.0, ..Default::default() };
        let out = greedy::greedy_search(&Ctx::default(), &mut decoder(), &mut Unobserved, &start(1, vec![]), &p);
        assert_eq!(out[0].ids[0], vec![2, 3, EOS]);
        let mut b = params(2);
        b.repetition = p.repetition.clone();
        let out = beam::beam_search(&Ctx::default(), &mut decoder(), &mut Unobserved, &start(1, vec![]), &b);
        assert_eq!(out[0].ids[0], vec![2, 3, EOS]);
    }

    #[test]
    fn disabled_tokens_are_never_chosen() {
        let mut p = params(1);
        p.disabled_ids = vec![2];
        let out = greedy::greedy_search(&Ctx::default(), &mut scripted(1), &mut Unobserved, &start(1, vec![]), &p);
        assert!(!out[0].ids[0].contains(&2));
    }
}
