//! Models built from weights: immutable after loading and shared (through `Arc`) by every
//! translator that uses them.
//!
//! Every family sits behind [`TranslationModel`]: vocabularies, special tokens, position
//! limits, and a [`DecoderSession`] per batch (encode once, then one step at a time).
//! Decoding, the translator, the text API and the C API use only this interface.
pub mod attention;
pub mod layers;
pub mod marian;
pub mod transformer;

use std::path::Path;

use crate::backend::{Backend, ComputeType, Ctx, KvCacheType, SavedPrecision, TopLogits};
use crate::error::{Error, Result};
use crate::format::ct2::{Ct2Config, Ct2Dir, Vocabulary, VocabularyMap};
use crate::format::files::PackageFiles;
use crate::format::WeightSource;
use layers::WeightReader;
pub use transformer::{Decoder, DecoderState, Encoder, EncoderOutput};

/// The tokens a model's inputs and outputs are framed with, and how sources are framed.
#[derive(Debug, Clone, PartialEq)]
pub struct SpecialTokens {
    pub bos: String,
    pub eos: String,
    pub unk: String,
    /// `None`: the first target prefix token starts decoding.
    pub decoder_start: Option<String>,
    pub add_source_bos: bool,
    pub add_source_eos: bool,
}

impl From<&Ct2Config> for SpecialTokens {
    fn from(c: &Ct2Config) -> SpecialTokens {
        SpecialTokens {
            bos: c.bos_token.clone(),
            eos: c.eos_token.clone(),
            unk: c.unk_token.clone(),
            decoder_start: c.decoder_start_token.clone(),
            add_source_bos: c.add_source_bos,
            add_source_eos: c.add_source_eos,
        }
    }
}

/// Decoding settings a model package prescribes (Marian's YAML); options the caller
/// leaves at their defaults take these.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PackageDecoding {
    pub beam_size: Option<usize>,
    /// Length normalization exponent (Marian's `normalize`).
    pub length_penalty: Option<f32>,
    /// Maximum target length as a factor of the source length.
    pub max_length_factor: Option<f32>,
    pub max_batch_size: Option<usize>,
    /// Fewest tokens before the end token may be generated (Marian has no such bound: 0).
    pub min_length: Option<usize>,
    /// Whether `<unk>` may be generated (Marian suppresses it unless `allow-unk`).
    pub allow_unk: bool,
}

/// A translation model of any family.
pub trait TranslationModel: Send + Sync {
    /// What the model is, for logs and `--verbose` ("CTranslate2 Transformer", ...).
    fn description(&self) -> String;
    fn source_vocabulary(&self) -> &Vocabulary;
    fn target_vocabulary(&self) -> &Vocabulary;
    fn special_tokens(&self) -> &SpecialTokens;
    /// The longest source the encoder's positions support (`None` = unbounded).
    fn max_source_positions(&self) -> Option<usize>;
    /// The longest target the decoder's positions support (`None` = unbounded).
    fn max_target_positions(&self) -> Option<usize>;
    /// What the weights were built for (concrete: float32, int8 or int16).
    fn compute_type(&self) -> ComputeType;
    /// What the file stores (decides `ComputeType::Default` when loading again).
    fn saved_precision(&self) -> SavedPrecision;
    /// Decoding settings of the model's package, if it prescribes any.
    fn package_decoding(&self) -> PackageDecoding {
        PackageDecoding { allow_unk: true, ..PackageDecoding::default() }
    }
    /// The output vocabulary for a batch when the model restricts it (a lexical shortlist):
    /// sorted target ids. `None` = the whole vocabulary.
    fn output_candidates(&self, _sources: &[Vec<u32>]) -> Option<Vec<u32>> {
        None
    }
    /// The model's vocabulary map (CTranslate2's `vmap.txt`), used when a translation
    /// asks for it (`use_vmap`).
    fn vocabulary_map(&self) -> Option<&VocabularyMap> {
        None
    }
    /// Whether a decoding of this model can take in rows of other batches while it runs
    /// (continuous batching), output restrictions aside.
    fn takes_rows_in(&self) -> bool;
    /// Bytes one position of one row takes in a decoding's state with keys/values kept as
    /// `kv`: its keys and values in every layer (cross-attention per source position,
    /// self-attention per step).
    fn position_bytes(&self, kv: KvCacheType) -> usize;
    /// Bytes the model's weight matrices take in memory (the automatic decoding memory
    /// budget is half of it).
    fn weight_bytes(&self) -> usize;
    /// Encodes `sources` and returns their decoder, one row per source. With `output_ids`
    /// (sorted, unique), the logits of each step cover only those target ids, in that order.
    /// The decoder keeps its attention keys/values as `kv`.
    fn start<'a>(&'a self, ctx: &Ctx, sources: Sources<'_>, output_ids: Option<Vec<u32>>, kv: KvCacheType) -> Result<Box<dyn DecoderSession + 'a>>;
}

/// Sources to encode: all or part of a batch. `padded` is the longest source of the whole
/// batch: CTranslate2 pads a batch to it, which decides the summation order of attention
/// that Tolk reproduces, so a part encodes exactly as within its batch.
#[derive(Clone, Copy)]
pub struct Sources<'a> {
    pub ids: &'a [Vec<u32>],
    pub padded: usize,
}

/// One batch being decoded: the rows (hypotheses) and what the decoder keeps for them.
pub trait DecoderSession {
    /// Width of a logits row: the vocabulary, or the output subset.
    fn vocabulary_size(&self) -> usize;
    /// The target id of each logits column when the output is a subset (sorted).
    fn output_ids(&self) -> Option<&[u32]> {
        None
    }
    /// Keeps, from the next step on, each step's alignment attention (`step_attention`);
    /// false where the decoder cannot (the CUDA backend).
    fn keep_attention(&mut self) -> bool {
        false
    }
    /// The last step's alignment attention (CTranslate2's `return_attention`): per row, its
    /// attention probabilities over its source's positions; empty unless kept.
    fn step_attention(&self) -> &[Vec<f32>] {
        &[]
    }
    /// Runs one step for every row with input `ids` (one per row, target ids) and writes
    /// the logits `[rows, vocabulary_size]`.
    fn step(&mut self, ctx: &Ctx, ids: &[u32], logits: &mut Vec<f32>);
    /// `step` when only each row's largest logit matters (greedy search without scores):
    /// its column and value into `best` (columns `disabled[row]` counted as `f32::MIN`)
    /// and `true` where the decoder finds them without writing the logits out, else the
    /// logits and `false`.
    fn step_best(&mut self, ctx: &Ctx, ids: &[u32], disabled: &[&[u32]], logits: &mut Vec<f32>, best: &mut Vec<(usize, f32)>) -> bool {
        let _ = (disabled, best);
        self.step(ctx, ids, logits);
        false
    }
    /// `step` when each row's `k` best logits and its log-sum-exp are enough (beam
    /// search; columns `disabled[row]` counted as `f32::MIN`): into `top` and `true` where
    /// the decoder finds them without writing the logits out, else the logits and `false`.
    fn step_top(&mut self, ctx: &Ctx, ids: &[u32], disabled: &[&[u32]], k: usize, logits: &mut Vec<f32>, top: &mut TopLogits) -> bool {
        let _ = (disabled, k, top);
        self.step(ctx, ids, logits);
        false
    }
    /// Keeps rows `rows[i]` as the new row `i` (beam reordering, finished rows removed).
    fn select_rows(&mut self, rows: &[usize]);
    /// Encodes `sources` (all or part of a batch) and appends one row per source after
    /// the current rows, each decoding from its own first step with the results it would
    /// have had alone (continuous batching). With `release_freed`, the memory the finished
    /// rows held goes back to the system first. `false`: this session cannot, and nothing
    /// changed.
    fn append_sources(&mut self, _ctx: &Ctx, _sources: Sources<'_>, _release_freed: bool) -> Result<bool> {
        Ok(false)
    }
    /// Each row's source length and the steps it has decoded: with
    /// [`TranslationModel::position_bytes`], the state the rows hold and will hold.
    fn row_lengths(&self) -> Vec<(usize, usize)> {
        Vec::new()
    }
}

/// Spec names of CTranslate2 encoder-decoder Transformers (older converters used the last two).
const TRANSFORMER_SPECS: [&str; 3] = ["TransformerSpec", "TransformerBase", "TransformerBig"];

/// An encoder-decoder Transformer with its vocabularies: CTranslate2's `TransformerSpec`,
/// its layers held and run by the compute backend `B`.
pub struct TransformerModel<B: Backend> {
    pub encoder: Encoder<B>,
    pub decoder: Decoder<B>,
    pub special_tokens: SpecialTokens,
    pub source_vocabulary: Vocabulary,
    pub target_vocabulary: Vocabulary,
    /// What the weights were built for (concrete: float32, int8 or int16).
    pub compute_type: ComputeType,
    /// What the model file stores its weights as.
    pub saved_precision: SavedPrecision,
    /// `vmap.txt` of a CTranslate2 model directory.
    pub vocabulary_map: Option<VocabularyMap>,
    /// Bytes of the weight matrices in memory.
    pub weight_bytes: usize,
}

impl<B: Backend> TransformerModel<B> {
    /// Loads the CTranslate2 model directory `dir` of `files` with weights converted for
    /// `compute_type`.
    pub fn load(files: &PackageFiles, dir: &Path, backend: &B, compute_type: ComputeType) -> Result<Self> {
        let Ct2Dir { bin, config, source_vocabulary, target_vocabulary, vocabulary_map } = Ct2Dir::open_in(files, dir)?;
        if !TRANSFORMER_SPECS.contains(&bin.spec_name.as_str()) {
            return Err(Error::unsupported(format!(
                "model spec {:?} is not supported: Tolk runs encoder-decoder TransformerSpec models",
                bin.spec_name
            )));
        }
        let mut model = TransformerModel::build(
            &bin,
            backend,
            compute_type,
            config.layer_norm_epsilon,
            SpecialTokens::from(&config),
            source_vocabulary,
            target_vocabulary,
        )?;
        model.vocabulary_map = vocabulary_map;
        Ok(model)
    }

    /// Builds the layers from any weight source that presents the spec's names.
    pub fn build(
        source: &dyn WeightSource,
        backend: &B,
        compute_type: ComputeType,
        layer_norm_epsilon: Option<f32>,
        special_tokens: SpecialTokens,
        source_vocabulary: Vocabulary,
        target_vocabulary: Vocabulary,
    ) -> Result<Self> {
        let saved_precision = source.saved_precision();
        let compute_type = compute_type.resolve(saved_precision);
        let w = WeightReader::new(source, backend, compute_type);
        let encoder = Encoder::load(&w, layer_norm_epsilon)?;
        let decoder = Decoder::load(&w, layer_norm_epsilon)?;
        // Each decoder layer's attention projects the encoder's outputs with weights of the
        // decoder's width.
        if encoder.model_dim() != decoder.model_dim() {
            return Err(Error::invalid_model(format!(
                "the encoder's width {} differs from the decoder's {}, whose attention reads the encoder's outputs",
                encoder.model_dim(),
                decoder.model_dim()
            )));
        }
        w.ensure_all_used()?;
        let weight_bytes = w.matrix_bytes();
        drop(w);
        if source_vocabulary.len() != encoder.vocabulary_size() {
            return Err(Error::invalid_model(format!(
                "the source vocabulary has {} tokens but the encoder embeddings have {} rows",
                source_vocabulary.len(),
                encoder.vocabulary_size()
            )));
        }
        if target_vocabulary.len() != decoder.vocabulary_size() || target_vocabulary.len() != decoder.embeddings_size() {
            return Err(Error::invalid_model(format!(
                "the target vocabulary has {} tokens but the decoder has {} embeddings and {} outputs",
                target_vocabulary.len(),
                decoder.embeddings_size(),
                decoder.vocabulary_size()
            )));
        }
        Ok(TransformerModel {
            compute_type,
            saved_precision,
            encoder,
            decoder,
            special_tokens,
            source_vocabulary,
            target_vocabulary,
            vocabulary_map: None,
            weight_bytes,
        })
    }
}

impl<B: Backend> TranslationModel for TransformerModel<B> {
    fn description(&self) -> String {
        "CTranslate2 Transformer".into()
    }
    fn source_vocabulary(&self) -> &Vocabulary {
        &self.source_vocabulary
    }
    fn target_vocabulary(&self) -> &Vocabulary {
        &self.target_vocabulary
    }
    fn special_tokens(&self) -> &SpecialTokens {
        &self.special_tokens
    }
    fn max_source_positions(&self) -> Option<usize> {
        self.encoder.max_positions()
    }
    fn max_target_positions(&self) -> Option<usize> {
        self.decoder.max_positions()
    }
    fn compute_type(&self) -> ComputeType {
        self.compute_type
    }
    fn saved_precision(&self) -> SavedPrecision {
        self.saved_precision
    }
    fn vocabulary_map(&self) -> Option<&VocabularyMap> {
        self.vocabulary_map.as_ref()
    }
    fn takes_rows_in(&self) -> bool {
        self.decoder.takes_rows_in()
    }
    fn position_bytes(&self, kv: KvCacheType) -> usize {
        self.decoder.position_bytes(kv)
    }
    fn weight_bytes(&self) -> usize {
        self.weight_bytes
    }
    fn start<'a>(&'a self, ctx: &Ctx, sources: Sources<'_>, output_ids: Option<Vec<u32>>, kv: KvCacheType) -> Result<Box<dyn DecoderSession + 'a>> {
        // Refused before the batch is encoded for nothing.
        self.decoder.check_kv_type(kv)?;
        let memory = self.encoder.forward(ctx, sources);
        let state = self.decoder.initial_state(ctx, memory, output_ids, kv)?;
        Ok(Box::new(transformer::TransformerSession { encoder: &self.encoder, decoder: &self.decoder, state }))
    }
}
