//! Tolk: fast, embeddable neural machine translation inference.
//!
//! The crate is organized by layer of the architecture:
//! - [`format`]: readers for model files (CTranslate2 directories);
//! - [`model`]: immutable layers built from weights (Transformer encoder and decoder);
//! - [`backend`]: compute kernels (CPU float32);
//! - [`decode`]: greedy and beam search;
//! - [`translator`]: batching, options and results;
//! - `capi`: the C ABI (`include/tolk.h`).
//!
//! ```no_run
//! use tolk::{Model, TranslateOptions, Translator, TranslatorConfig};
//! let model = Model::load("models/zh-en-ct2").unwrap();
//! let translator = Translator::with_config(&model, &TranslatorConfig::default()).unwrap();
//! let source = vec![vec!["▁你好".to_string()]];
//! let results = translator.translate_batch(&source, None, &TranslateOptions::default()).unwrap();
//! println!("{:?}", results[0].hypotheses[0]);
//! ```
pub mod backend;
mod capi;
pub mod decode;
pub mod error;
pub mod format;
pub mod model;
pub mod tensor;
pub mod translator;

use std::path::Path;
use std::sync::Arc;

pub use error::{Error, ErrorKind, Result};
pub use translator::{BatchType, TranslateOptions, TranslationResult};

/// A loaded model: immutable and cheap to clone (shared by reference counting).
#[derive(Clone)]
pub struct Model {
    inner: Arc<model::TransformerModel>,
}

impl Model {
    /// Loads a CTranslate2 model directory (`model.bin`, `config.json`, vocabularies).
    pub fn load(path: impl AsRef<Path>) -> Result<Model> {
        Ok(Model { inner: Arc::new(model::TransformerModel::load(path.as_ref())?) })
    }

    pub fn transformer(&self) -> &model::TransformerModel {
        &self.inner
    }
}

/// Numeric precision of the computation, named as in CTranslate2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ComputeType {
    Float32,
}

impl ComputeType {
    /// Parses CTranslate2's names. Quantized compute types are refused until the int8/int16
    /// kernels land; `default` and `auto` pick the best supported type (float32 for now).
    pub fn parse(name: &str) -> Result<ComputeType> {
        match name {
            "default" | "auto" | "float32" | "float" => Ok(ComputeType::Float32),
            "int8" | "int8_float32" | "int16" | "int8_float16" | "int8_bfloat16" | "float16" | "bfloat16" => {
                Err(Error::unsupported(format!("compute type {name:?} is not supported on CPU yet (use float32)")))
            }
            other => Err(Error::invalid_argument(format!(
                "unknown compute type {other:?} (expected default, auto, float32, int8, int8_float32 or int16)"
            ))),
        }
    }
}

/// Settings of a translator.
#[derive(Debug, Clone)]
pub struct TranslatorConfig {
    /// Only "cpu" for now.
    pub device: String,
    pub compute_type: ComputeType,
    /// Threads used inside one translation (matrix products); 0 or 1 = one thread.
    pub intra_threads: usize,
}

impl Default for TranslatorConfig {
    fn default() -> Self {
        TranslatorConfig { device: "cpu".into(), compute_type: ComputeType::Float32, intra_threads: 1 }
    }
}

/// Translates batches with one model; see [`translator::Translator`].
pub struct Translator {
    inner: translator::Translator,
}

impl Translator {
    pub fn with_config(model: &Model, config: &TranslatorConfig) -> Result<Translator> {
        match config.device.as_str() {
            "cpu" => {}
            "cuda" | "gpu" => return Err(Error::unsupported("the CUDA backend is not available yet; use device \"cpu\"")),
            other => return Err(Error::invalid_argument(format!("unknown device {other:?} (expected \"cpu\")"))),
        }
        Ok(Translator { inner: translator::Translator::new(Arc::clone(&model.inner), config.intra_threads)? })
    }

    pub fn translate_batch(
        &self,
        source: &[Vec<String>],
        target_prefix: Option<&[Vec<String>]>,
        options: &TranslateOptions,
    ) -> Result<Vec<TranslationResult>> {
        self.inner.translate_batch(source, target_prefix, options)
    }
}
