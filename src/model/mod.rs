//! Models built from weights: immutable after loading and shared (through `Arc`) by every
//! translator that uses them.
pub mod attention;
pub mod layers;
pub mod transformer;

use std::path::Path;

use crate::error::{Error, Result};
use crate::format::ct2::{Ct2Config, Ct2Dir, DType, Vocabulary};
use crate::ComputeType;
use layers::WeightReader;
pub use transformer::{Decoder, DecoderState, Encoder, EncoderOutput};

/// Spec names of CTranslate2 encoder-decoder Transformers (older converters used the last two).
const TRANSFORMER_SPECS: [&str; 3] = ["TransformerSpec", "TransformerBase", "TransformerBig"];

/// A CTranslate2 Transformer translation model with its vocabularies.
pub struct TransformerModel {
    pub encoder: Encoder,
    pub decoder: Decoder,
    pub config: Ct2Config,
    pub source_vocabulary: Vocabulary,
    pub target_vocabulary: Vocabulary,
    pub binary_version: u32,
    pub spec_revision: u32,
    /// What the weights were built for (concrete: float32, int8 or int16).
    pub compute_type: ComputeType,
    /// The dtype the model file stores its weights in.
    pub saved_weight_type: DType,
}

impl TransformerModel {
    /// Loads and builds the model with weights converted for `compute_type`.
    pub fn load(dir: &Path, compute_type: ComputeType) -> Result<TransformerModel> {
        let Ct2Dir { bin, config, source_vocabulary, target_vocabulary } = Ct2Dir::open(dir)?;
        if !TRANSFORMER_SPECS.contains(&bin.spec_name.as_str()) {
            return Err(Error::unsupported(format!(
                "model spec {:?} is not supported: Tolk runs encoder-decoder TransformerSpec models",
                bin.spec_name
            )));
        }
        let saved_weight_type = bin.saved_weight_type();
        let compute_type = compute_type.resolve(saved_weight_type);
        let w = WeightReader::new(&bin, compute_type);
        let encoder = Encoder::load(&w, config.layer_norm_epsilon)?;
        let decoder = Decoder::load(&w, config.layer_norm_epsilon)?;
        w.ensure_all_used()?;
        drop(w);
        bin.release_pages();
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
            binary_version: bin.binary_version,
            spec_revision: bin.spec_revision,
            compute_type,
            saved_weight_type,
            encoder,
            decoder,
            config,
            source_vocabulary,
            target_vocabulary,
        })
    }
}
