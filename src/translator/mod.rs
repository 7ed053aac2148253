//! Translation of token batches: options with CTranslate2's defaults and meaning,
//! sorting by length and re-batching, encoding, searching, and restoring input order.
mod job;
mod stdsort;
mod workers;

use std::sync::Arc;

pub use job::{CompletionCallback, Job};
use job::Request;
use workers::Workers;

use crate::backend::cpu::ops;
use crate::backend::KvCacheType;
use crate::decode::{Hypotheses, RepetitionRules, Sampling, SearchParams, StartTokens};
use crate::error::{Error, Result};
use crate::model::{Sources, TranslationModel};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchType {
    /// `max_batch_size` counts examples.
    Examples,
    /// `max_batch_size` counts tokens (batch size x longest source, padding included).
    Tokens,
}

/// Options of `Translator::translate_batch`; defaults are CTranslate2's.
#[derive(Debug, Clone)]
pub struct TranslateOptions {
    pub beam_size: usize,
    pub patience: f32,
    pub length_penalty: f32,
    pub num_hypotheses: usize,
    pub return_scores: bool,
    /// Source truncation (special tokens included); 0 = none.
    pub max_input_length: usize,
    pub max_decoding_length: usize,
    pub min_decoding_length: usize,
    /// Tokens that end a hypothesis, any of them (CTranslate2's `end_token`, one token or
    /// a list); empty = the model's end-of-sentence token.
    pub end_tokens: Vec<String>,
    pub disable_unk: bool,
    /// Penalty on the tokens a hypothesis already holds (CTranslate2's
    /// `repetition_penalty`): their logits are divided by it where non-negative and
    /// multiplied where negative, so values above 1 discourage repeats; 1 = off.
    pub repetition_penalty: f32,
    /// Hypotheses never repeat an n-gram of this size (CTranslate2's
    /// `no_repeat_ngram_size`); 0 = off.
    pub no_repeat_ngram_size: usize,
    /// Return each hypothesis's alignment attention ([`TranslationResult::attention`],
    /// CTranslate2's `return_attention`).
    pub return_attention: bool,
    /// Replace each generated unknown token by the source token it attends to most
    /// (CTranslate2's `replace_unknowns`).
    pub replace_unknowns: bool,
    /// Token sequences no hypothesis may contain (CTranslate2's `suppress_sequences`): a
    /// single token is never generated, a longer sequence's last token not after the others.
    pub suppress_sequences: Vec<Vec<String>>,
    /// Keep the end token at the end of the hypotheses that produced it (CTranslate2's
    /// `return_end_token`; text results never show it).
    pub return_end_token: bool,
    /// CTranslate2's random sampling, greedy search only (`beam_size` 1, one hypothesis):
    /// the next token is drawn among the `sampling_topk` best (0 = all, 1 = the arg-max:
    /// no sampling), from their softmax at `sampling_temperature` (0 = the arg-max),
    /// cut to the most probable ones whose probabilities sum to `sampling_topp`.
    pub sampling_topk: usize,
    pub sampling_topp: f32,
    pub sampling_temperature: f32,
    /// Seed of the sampling's random numbers: with one, a call's samples are the same
    /// every time, however it is threaded (each sentence has a stream of its own, the same
    /// however the call is batched, but another batching can change the logits in their
    /// last bits, and with them a draw); `None` = a new seed each call.
    pub sampling_seed: Option<u64>,
    /// 0 = translate everything as one batch.
    pub max_batch_size: usize,
    pub batch_type: BatchType,
    /// Bounds the decoding length of a batch to this factor times its longest source
    /// (Marian's `max-length-factor`); 0 = no such bound.
    pub max_length_factor: f32,
    /// Restrict the output layer to the model's lexical shortlist when it has one.
    pub use_shortlist: bool,
    /// Restrict the output layer to the candidates of the model's vocabulary map
    /// (CTranslate2's `vmap.txt`) when it has one.
    pub use_vmap: bool,
    /// Continuous batching: whether a search takes the call's next batch in once few of its
    /// rows are left. `None`: greedy search does, beam search does not (on the CPU it
    /// gained nothing measurable there for 14% more memory). Results are the same either way.
    pub join_batches: Option<bool>,
    /// How decoding keeps attention keys and values (not a CTranslate2 option): float32
    /// (exactly CTranslate2's results), or bfloat16 / int8 in about a half / a quarter of
    /// the memory, with results that differ in the last bits (see [`KvCacheType`]).
    pub kv_cache_type: KvCacheType,
    /// Where a decoding takes in further batches (continuous batching, see
    /// `join_batches`): the decoding state (attention keys and values) it plans for, in
    /// MB. Sentences then wait to start until theirs fits, and a batch may start in parts:
    /// a lower peak memory for fewer rows a step, the same results. `None` (the default):
    /// half the model's weights, at least 32 MB (39 MB for zh-en in int8, more than a
    /// batch of 32 needs in float32 or int16); `Some(0)`: no bound (a further batch joins
    /// whole once a quarter of the rows is left). Not a CTranslate2 option.
    pub max_decoding_memory_mb: Option<usize>,
}

impl Default for TranslateOptions {
    fn default() -> Self {
        TranslateOptions {
            beam_size: 2,
            patience: 1.0,
            length_penalty: 1.0,
            num_hypotheses: 1,
            return_scores: false,
            max_input_length: 1024,
            max_decoding_length: 256,
            min_decoding_length: 1,
            end_tokens: Vec::new(),
            disable_unk: false,
            repetition_penalty: 1.0,
            no_repeat_ngram_size: 0,
            return_attention: false,
            replace_unknowns: false,
            suppress_sequences: Vec::new(),
            return_end_token: false,
            sampling_topk: 1,
            sampling_topp: 1.0,
            sampling_temperature: 1.0,
            sampling_seed: None,
            max_batch_size: 0,
            batch_type: BatchType::Examples,
            max_length_factor: 0.0,
            use_shortlist: true,
            use_vmap: false,
            join_batches: None,
            kv_cache_type: KvCacheType::Float32,
            max_decoding_memory_mb: None,
        }
    }
}

impl TranslateOptions {
    /// The checks CTranslate2 makes, with the same wording where it has one.
    // `!(x > 0.0)` on purpose: a NaN fails it.
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    pub fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(Error::invalid_argument(m));
        if self.beam_size == 0 {
            return bad("The beam size must be > 0");
        }
        if !(self.patience > 0.0) || !self.patience.is_finite() {
            return bad("The patience factor must be > 0");
        }
        if !self.length_penalty.is_finite() {
            return bad("The length penalty must be a finite number");
        }
        if self.num_hypotheses == 0 {
            return bad("The number of hypotheses must be > 0");
        }
        if self.num_hypotheses > (self.beam_size as f32 * self.patience).round() as usize {
            return bad("The number of hypotheses cannot be greater than beam_size * patience");
        }
        if self.max_decoding_length == 0 {
            return bad("The maximum decoding length must be > 0");
        }
        if self.min_decoding_length > self.max_decoding_length {
            return bad("The minimum decoding length is greater than the maximum decoding length");
        }
        if self.beam_size > 1024 || self.num_hypotheses > 1024 {
            return bad("beam_size and num_hypotheses must be at most 1024");
        }
        if !(self.repetition_penalty > 0.0) || !self.repetition_penalty.is_finite() {
            return bad("The repetition penalty must be a finite number > 0");
        }
        if !(self.max_length_factor >= 0.0) || !self.max_length_factor.is_finite() {
            return bad("The maximum length factor must be a finite number >= 0");
        }
        if !(self.sampling_topp > 0.0 && self.sampling_topp <= 1.0) {
            return bad("The sampling_topp parameter must be between 0 and 1");
        }
        if !(self.sampling_temperature >= 0.0) || !self.sampling_temperature.is_finite() {
            return bad("The sampling temperature must be a finite number >= 0");
        }
        if self.sampling().is_some() && (self.beam_size > 1 || self.num_hypotheses > 1) {
            return Err(Error::unsupported("random sampling (sampling_topk other than 1) is supported with beam_size 1 and num_hypotheses 1"));
        }
        Ok(())
    }

    /// The random sampling these options ask for, if any (CTranslate2 samples unless
    /// `sampling_topk` is 1 or the temperature 0).
    pub fn sampling(&self) -> Option<Sampling> {
        (self.sampling_topk != 1 && self.sampling_temperature != 0.0).then_some(Sampling {
            topk: self.sampling_topk,
            topp: self.sampling_topp,
            temperature: self.sampling_temperature,
        })
    }
}

/// The seed of the sampling of the call's example `index` (its place in the call): a
/// stream of its own, the same however the call is batched.
fn sampling_seed(seed: Option<u64>, index: usize) -> u64 {
    seed.unwrap_or(0) ^ (index as u64).wrapping_mul(0xd1b5_4a32_d192_ed03)
}

/// The n-best translations of one source sentence, best first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TranslationResult {
    pub hypotheses: Vec<Vec<String>>,
    /// Empty unless `return_scores` was set.
    pub scores: Vec<f32>,
    /// Empty unless `return_attention` was set: per hypothesis, per target token, the
    /// decoder's alignment attention over the source tokens as given (CTranslate2's: the
    /// cross-attention probabilities of the model's alignment layer averaged over its
    /// alignment heads, by default the last layer's first head; positions of added special
    /// tokens removed, those cut by `max_input_length` zero).
    pub attention: Vec<Vec<Vec<f32>>>,
}

/// A token greedy decoding just chose, as given to a token callback.
#[derive(Debug, Clone, Copy)]
pub struct TokenEvent<'a> {
    /// Index of the sentence in the request.
    pub example: usize,
    /// Position of the token among the generated ones (0 = the first after the prefix).
    pub step: usize,
    pub id: u32,
    pub token: &'a str,
    /// The hypothesis ends with this token (the end token, the length limit, or the
    /// callback having returned false for it).
    pub is_last: bool,
}

/// Called for each generated token (greedy search only), on the translator's worker
/// threads (concurrently when `inter_threads` > 1); returning false ends that sentence's
/// translation at this token.
pub type TokenCallback = Arc<dyn Fn(&TokenEvent) -> bool + Send + Sync>;

/// Runs translations on one model: `inter_threads` workers translate batches side by side,
/// sharing the model's weights, each with its own decoding state and `intra_threads`.
/// Every call, from any thread, queues its batches for the workers.
pub struct Translator {
    /// Declared (so dropped) before `model`: dropping the workers ends the abandoned jobs,
    /// whose completion callbacks may still submit to this translator (refused, the queue
    /// being closed), which reads the model.
    workers: Workers,
    model: Arc<dyn TranslationModel>,
    /// The `kv_cache_type` of `default_options`.
    kv_cache_type: KvCacheType,
}

impl Translator {
    pub fn new(model: Arc<dyn TranslationModel>, inter_threads: usize, intra_threads: usize) -> Result<Translator> {
        let workers = Workers::new(inter_threads.max(1), intra_threads.max(1))?;
        Ok(Translator { model, workers, kv_cache_type: KvCacheType::Float32 })
    }

    /// This translator's calls keep keys/values as `kv` unless their options say otherwise.
    pub fn with_kv_cache_type(mut self, kv: KvCacheType) -> Translator {
        self.kv_cache_type = kv;
        self
    }

    /// Number of batches translated at once.
    pub fn inter_threads(&self) -> usize {
        self.workers.count()
    }

    pub fn model(&self) -> &Arc<dyn TranslationModel> {
        &self.model
    }

    /// CTranslate2's defaults with what the model's package prescribes (Marian's YAML:
    /// beam size, normalization, length factor, mini-batch, `<unk>` suppression) and this
    /// translator's `kv_cache_type`.
    pub fn default_options(&self) -> TranslateOptions {
        let package = self.model.package_decoding();
        let defaults = TranslateOptions::default();
        TranslateOptions {
            beam_size: package.beam_size.unwrap_or(defaults.beam_size).max(1),
            length_penalty: package.length_penalty.unwrap_or(defaults.length_penalty),
            max_length_factor: package.max_length_factor.unwrap_or(defaults.max_length_factor),
            max_batch_size: package.max_batch_size.unwrap_or(defaults.max_batch_size),
            min_decoding_length: package.min_length.unwrap_or(defaults.min_decoding_length),
            disable_unk: !package.allow_unk,
            kv_cache_type: self.kv_cache_type,
            ..defaults
        }
    }

    /// Translates tokenized sentences; `target_prefix`, when given, has one (possibly
    /// empty) prefix per sentence that every hypothesis starts with.
    pub fn translate_batch(
        &self,
        source: &[Vec<String>],
        target_prefix: Option<&[Vec<String>]>,
        options: &TranslateOptions,
    ) -> Result<Vec<TranslationResult>> {
        self.translate_batch_with_progress(source, target_prefix, options, &mut |_, _| true)
    }

    /// [`Translator::translate_batch`] that calls `progress(done, total)` on the calling
    /// thread after each batch (sentences translated so far, of all); `false` stops the
    /// translation with a [`crate::ErrorKind::Cancelled`] error.
    pub fn translate_batch_with_progress(
        &self,
        source: &[Vec<String>],
        target_prefix: Option<&[Vec<String>]>,
        options: &TranslateOptions,
        progress: &mut dyn FnMut(usize, usize) -> bool,
    ) -> Result<Vec<TranslationResult>> {
        let job = self.submit(source.to_vec(), target_prefix.map(<[_]>::to_vec), options.clone(), None, Box::new(Ok), None)?;
        job.wait_blocking(progress)
    }

    /// Queues a translation and returns at once. `finish` turns the results (input order)
    /// into the job's output on the worker that ends the job; `on_complete` is called then
    /// (on that worker, or here when the job ends at once).
    pub fn submit<T: Send + 'static>(
        &self,
        source: Vec<Vec<String>>,
        target_prefix: Option<Vec<Vec<String>>>,
        options: TranslateOptions,
        on_token: Option<TokenCallback>,
        finish: job::Finish<T>,
        on_complete: Option<CompletionCallback>,
    ) -> Result<Job<T>> {
        options.validate()?;
        if let Some(p) = &target_prefix {
            if p.len() != source.len() {
                return Err(Error::invalid_argument(format!(
                    "the batch has {} sources but {} target prefixes",
                    source.len(),
                    p.len()
                )));
            }
        }
        if on_token.is_some() && options.beam_size > 1 {
            return Err(Error::invalid_argument("token streaming needs greedy search: set beam_size to 1"));
        }
        let request = Request::new(Arc::clone(&self.model), self.workers.id(), source, target_prefix, options, on_token, finish, on_complete);
        self.workers.submit(request.tasks());
        Ok(Job::new(request))
    }
}

/// CTranslate2's shortcut for a source with no content: the translation is the target
/// prefix (or empty) with score 0, without running the model.
fn skip_translation(model: &dyn TranslationModel, source: &[String], prefix: &[String], options: &TranslateOptions) -> Option<TranslationResult> {
    let cfg = model.special_tokens();
    let mut length = source.len();
    if length == 1 && (source[0] == cfg.bos || source[0] == cfg.eos) {
        length = 0;
    } else if length >= 2 {
        if source[0] == cfg.bos {
            length -= 1;
        }
        if source[source.len() - 1] == cfg.eos {
            length -= 1;
        } else if source[source.len() - 2] == cfg.eos {
            length -= 2; // A language code follows the end token.
        }
    }
    if length > 0 {
        return None;
    }
    let vocab = model.target_vocabulary();
    let mut hypothesis: Vec<String> = prefix.to_vec();
    if cfg.decoder_start.is_none() && !hypothesis.is_empty() {
        hypothesis.remove(0);
    }
    hypothesis.truncate(options.max_decoding_length);
    for t in hypothesis.iter_mut() {
        *t = vocab.token(vocab.id_or_unk(t)).to_string();
    }
    let attention = match (options.return_attention, hypothesis.is_empty()) {
        (false, _) => Vec::new(),
        (true, true) => vec![Vec::new(); options.num_hypotheses],
        (true, false) => vec![vec![vec![0.0; source.len()]; hypothesis.len()]; options.num_hypotheses],
    };
    Some(TranslationResult {
        hypotheses: vec![hypothesis; options.num_hypotheses],
        scores: if options.return_scores { vec![0.0; options.num_hypotheses] } else { Vec::new() },
        attention,
    })
}

fn source_ids(m: &dyn TranslationModel, tokens: &[String], max_length: usize) -> Result<Vec<u32>> {
    let cfg = m.special_tokens();
    let vocab = m.source_vocabulary();
    let eos = vocab.id_or_unk(&cfg.eos);
    let mut ids = Vec::with_capacity(tokens.len() + 2);
    if cfg.add_source_bos {
        ids.push(vocab.id_or_unk(&cfg.bos));
    }
    ids.extend(tokens.iter().map(|t| vocab.id_or_unk(t)));
    if cfg.add_source_eos {
        ids.push(eos);
    }
    if max_length > 0 && ids.len() > max_length {
        // Keep the end token (and a language code after it) at the end, as CTranslate2 does.
        let n = ids.len();
        if ids[n - 1] == eos {
            ids[max_length - 1] = eos;
        } else if n >= 2 && ids[n - 2] == eos && max_length >= 2 {
            ids[max_length - 2] = eos;
            ids[max_length - 1] = ids[n - 1];
        }
        ids.truncate(max_length);
    }
    if let Some(max) = m.max_source_positions() {
        if ids.len() > max {
            return Err(Error::invalid_argument(format!(
                "a source of {} tokens is longer than the {max} positions the model supports; \
                 set max_input_length to at most {max}",
                ids.len()
            )));
        }
    }
    Ok(ids)
}

/// A batch ready to decode: the results of the sources without content (CTranslate2's
/// shortcut), and for the others (`to_run`, indices in the batch) their ids, start tokens,
/// search parameters and output restriction.
pub(crate) struct PreparedBatch {
    pub results: Vec<TranslationResult>,
    pub to_run: Vec<usize>,
    pub source_ids: Vec<Vec<u32>>,
    pub starts: Vec<StartTokens>,
    pub params: SearchParams,
    pub output_ids: Option<Vec<u32>>,
    /// What becomes of the searches' attention (see `complete`).
    attention: AttentionUse,
    /// Whether hypotheses keep their end token (`return_end_token`).
    keep_end_token: bool,
}

/// What a batch does with its hypotheses' attention: nothing (`None`), or return it and/or
/// replace unknown tokens by the source tokens it points to (`sources`: those of `to_run`,
/// as given).
#[derive(Default)]
struct AttentionUse {
    sources: Option<Vec<Vec<String>>>,
    return_attention: bool,
    replace_unknowns: bool,
}

impl PreparedBatch {
    /// The batch of the call's examples `indices` (their sources and prefixes).
    pub fn new(m: &dyn TranslationModel, indices: &[usize], sources: &[&[String]], prefixes: &[&[String]], options: &TranslateOptions) -> Result<PreparedBatch> {
        let mut results = vec![TranslationResult::default(); sources.len()];
        let mut to_run = Vec::with_capacity(sources.len());
        for (i, (source, prefix)) in sources.iter().zip(prefixes).enumerate() {
            match skip_translation(m, source, prefix, options) {
                Some(r) => results[i] = r,
                None => to_run.push(i),
            }
        }
        let sources: Vec<&[String]> = to_run.iter().map(|&i| sources[i]).collect();
        let cfg = m.special_tokens();
        let tv = m.target_vocabulary();
        let source_ids = sources
            .iter()
            .map(|s| source_ids(m, s, options.max_input_length))
            .collect::<Result<Vec<_>>>()?;
        let mut starts = Vec::with_capacity(to_run.len());
        for &i in &to_run {
            let p = prefixes[i];
            let mut ids: Vec<u32> = Vec::with_capacity(p.len() + 1);
            if let Some(start) = &cfg.decoder_start {
                ids.push(tv.id_or_unk(start));
            }
            ids.extend(p.iter().map(|t| tv.id_or_unk(t)));
            if ids.is_empty() {
                return Err(Error::invalid_argument(
                    "One input has no decoder start token: this model has no decoder_start_token, \
                     so every example needs a target prefix",
                ));
            }
            starts.push(StartTokens { start: ids[0], prefix: ids[1..].to_vec(), seed: sampling_seed(options.sampling_seed, indices[i]) });
        }
        // A stored position table bounds the decoding length (CTranslate2 raises an error
        // when decoding reaches its end; Tolk ends the hypotheses there instead).
        let mut max_length = match m.max_target_positions() {
            Some(max) => options.max_decoding_length.min(max),
            None => options.max_decoding_length,
        };
        if options.max_length_factor > 0.0 {
            let longest = source_ids.iter().map(Vec::len).max().unwrap_or(0);
            // A minimum length asked for explicitly wins over the factor's bound.
            let bound = ((longest as f32 * options.max_length_factor).ceil() as usize).max(options.min_decoding_length).max(1);
            max_length = max_length.min(bound);
        }
        let end_ids = if options.end_tokens.is_empty() {
            vec![tv.id_or_unk(&cfg.eos)]
        } else {
            let id = |t: &String| tv.id(t).ok_or_else(|| Error::invalid_argument(format!("end_token {t:?} is not in the target vocabulary")));
            options.end_tokens.iter().map(id).collect::<Result<Vec<u32>>>()?
        };
        if options.sampling().is_some() && options.sampling_topk > tv.len() {
            return Err(Error::invalid_argument(format!(
                "sampling_topk option ({}) is greater than the vocabulary size ({})",
                options.sampling_topk,
                tv.len()
            )));
        }
        // CTranslate2 takes no unknown token here, but `<unk>` itself.
        let target_id = |t: &String| tv.id(t).or_else(|| (t.as_str() == cfg.unk).then(|| tv.unk_id()));
        let mut suppressed = Vec::new();
        let mut disabled_ids = if options.disable_unk { vec![tv.unk_id()] } else { Vec::new() };
        for (i, sequence) in options.suppress_sequences.iter().enumerate() {
            let ids = sequence
                .iter()
                .enumerate()
                .map(|(j, t)| {
                    target_id(t).ok_or_else(|| {
                        Error::invalid_argument(format!("suppress_sequences[{i}][{j}]: token {t:?} is not in the target vocabulary"))
                    })
                })
                .collect::<Result<Vec<u32>>>()?;
            match ids.len() {
                0 => {}
                1 => disabled_ids.push(ids[0]),
                _ => suppressed.push(ids),
            }
        }
        let params = SearchParams {
            beam_size: options.beam_size,
            patience: options.patience,
            length_penalty: options.length_penalty,
            num_hypotheses: options.num_hypotheses,
            max_length,
            min_length: options.min_decoding_length,
            disabled_ids,
            end_ids,
            return_scores: options.return_scores,
            repetition: RepetitionRules { penalty: options.repetition_penalty, no_repeat_ngram_size: options.no_repeat_ngram_size, suppressed },
            return_attention: options.return_attention || options.replace_unknowns,
            sampling: options.sampling(),
        };
        let attention = AttentionUse {
            sources: params.return_attention.then(|| sources.iter().map(|s| s.to_vec()).collect()),
            return_attention: options.return_attention,
            replace_unknowns: options.replace_unknowns,
        };
        let keep_end_token = options.return_end_token;
        // A vocabulary map's candidates are CTranslate2's as they are (the start and prefix
        // tokens in, a custom end token not: it then cannot end a hypothesis either).
        let vmap_ids = m.vocabulary_map().filter(|_| options.use_vmap).map(|vmap| {
            let targets = starts.iter().flat_map(|s| std::iter::once(s.start).chain(s.prefix.iter().copied()));
            vmap.candidates(&sources, targets)
        });
        let output_ids = if options.use_shortlist && vmap_ids.is_none() { m.output_candidates(&source_ids) } else { None };
        let output_ids = output_ids.map(|mut ids| {
            // The tokens decoding must be able to produce or force are always candidates.
            ids.extend(params.end_ids.iter().copied());
            ids.extend(starts.iter().flat_map(|s| s.prefix.iter().copied()));
            ids.sort_unstable();
            ids.dedup();
            ids
        });
        Ok(PreparedBatch { results, to_run, source_ids, starts, params, output_ids: vmap_ids.or(output_ids), attention, keep_end_token })
    }

    /// The sources of the examples `part` (indices into `to_run`), to be encoded as within
    /// the whole batch: padded to its longest source, as CTranslate2 pads it.
    pub fn sources(&self, part: std::ops::Range<usize>) -> Sources<'_> {
        let padded = self.source_ids.iter().map(Vec::len).max().unwrap_or(0);
        Sources { ids: &self.source_ids[part], padded }
    }

    /// The batch's results, with the hypotheses of the examples that ran (in `to_run`
    /// order) as tokens, end tokens removed (and their attention), the attention over the
    /// source tokens as given, unknown tokens replaced where asked (as CTranslate2 does).
    pub fn complete(mut self, m: &dyn TranslationModel, hyps: Vec<Hypotheses>) -> Vec<TranslationResult> {
        let (tv, cfg) = (m.target_vocabulary(), m.special_tokens());
        let unk = tv.token(tv.unk_id());
        let end_ids = &self.params.end_ids;
        for (slot, (&i, h)) in self.to_run.iter().zip(hyps).enumerate() {
            let mut attention = h.attention;
            let mut hypotheses = Vec::with_capacity(h.ids.len());
            for (k, mut ids) in h.ids.into_iter().enumerate() {
                let mut vectors = attention.get_mut(k);
                while !self.keep_end_token && ids.last().is_some_and(|id| end_ids.contains(id)) {
                    ids.pop();
                    vectors.as_mut().map(|a| a.pop());
                }
                let mut tokens: Vec<String> = ids.into_iter().map(|id| tv.token(id).to_string()).collect();
                if let (Some(vectors), Some(sources)) = (vectors, &self.attention.sources) {
                    let source = &sources[slot];
                    for v in vectors.iter_mut() {
                        // Positions of the special tokens the model adds go; positions cut
                        // by max_input_length come back as zeros.
                        if cfg.add_source_bos && !v.is_empty() {
                            v.remove(0);
                        }
                        if cfg.add_source_eos {
                            v.pop();
                        }
                        v.resize(source.len(), 0.0);
                    }
                    if self.attention.replace_unknowns {
                        replace_unknowns(&mut tokens, vectors, source, unk);
                    }
                }
                hypotheses.push(tokens);
            }
            if !self.attention.return_attention {
                attention.clear();
            }
            self.results[i] = TranslationResult { hypotheses, scores: h.scores, attention };
        }
        self.results
    }
}

/// CTranslate2's `replace_unknowns`: each unknown token of `tokens` becomes the source token
/// its attention vector points to most (the first of equal maxima, as `std::max_element`).
fn replace_unknowns(tokens: &mut [String], attention: &[Vec<f32>], source: &[String], unk: &str) {
    for (token, weights) in tokens.iter_mut().zip(attention) {
        if token == unk {
            if let Some(word) = source.get(ops::argmax(weights).0) {
                *token = word.clone();
            }
        }
    }
}

/// Splits example indices into batches like CTranslate2: longest sources first, then
/// cut so that each batch holds at most `max_batch_size` examples or tokens (padding
/// included). Returns the original indices of each batch.
pub fn rebatch(source: &[Vec<String>], max_batch_size: usize, batch_type: BatchType) -> Vec<Vec<usize>> {
    if source.is_empty() {
        return Vec::new();
    }
    let (max_batch_size, batch_type) =
        if max_batch_size == 0 { (source.len(), BatchType::Examples) } else { (max_batch_size, batch_type) };
    let mut order: Vec<usize> = (0..source.len()).collect();
    // Sources of the same length in CTranslate2's (unstable) order: which batch they fall
    // into shows with a vocabulary map.
    stdsort::sort(&mut order, |&a, &b| source[a].len() > source[b].len());
    let mut batches = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    let mut max_increment = 0;
    for i in order {
        let increment = match batch_type {
            BatchType::Examples => 1,
            BatchType::Tokens => source[i].len(),
        };
        let new_max = max_increment.max(increment);
        if !current.is_empty() && (current.len() + 1) * new_max > max_batch_size {
            batches.push(std::mem::take(&mut current));
            max_increment = increment;
        } else {
            max_increment = new_max;
        }
        current.push(i);
    }
    if !current.is_empty() {
        batches.push(current);
    }
    batches
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(n: usize) -> Vec<String> {
        vec!["a".to_string(); n]
    }

    #[test]
    fn rebatch_sorts_longest_first_and_cuts() {
        let src = vec![toks(1), toks(5), toks(3), toks(2)];
        assert_eq!(rebatch(&src, 0, BatchType::Tokens), vec![vec![1, 2, 3, 0]]);
        assert_eq!(rebatch(&src, 2, BatchType::Examples), vec![vec![1, 2], vec![3, 0]]);
        // Tokens: 5 alone (2 x 5 > 6), then 3 + 2 (2 x 3 = 6), then 1.
        assert_eq!(rebatch(&src, 6, BatchType::Tokens), vec![vec![1], vec![2, 3], vec![0]]);
        assert!(rebatch(&[], 4, BatchType::Examples).is_empty());
    }

    #[test]
    fn options_are_validated() {
        let ok = TranslateOptions::default();
        assert!(ok.validate().is_ok());
        for bad in [
            TranslateOptions { beam_size: 0, ..ok.clone() },
            TranslateOptions { num_hypotheses: 3, ..ok.clone() },
            TranslateOptions { patience: 0.0, ..ok.clone() },
            TranslateOptions { max_decoding_length: 0, ..ok.clone() },
            TranslateOptions { min_decoding_length: 300, ..ok.clone() },
            TranslateOptions { repetition_penalty: 0.0, ..ok.clone() },
            TranslateOptions { repetition_penalty: -1.5, ..ok.clone() },
            TranslateOptions { repetition_penalty: f32::NAN, ..ok.clone() },
            TranslateOptions { repetition_penalty: f32::INFINITY, ..ok.clone() },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }
}
