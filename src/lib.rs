//! Tolk: fast, embeddable neural machine translation inference.
//!
//! The crate is organized by layer of the architecture:
//! - [`format`]: readers for model files (CTranslate2 directories);
//! - [`model`]: immutable layers built from weights (Transformer encoder and decoder);
//! - [`backend`]: compute kernels (CPU float32);
//! - [`decode`]: greedy and beam search;
//! - [`translator`]: batching, options and results;
//! - [`text`]: tokenization (SentencePiece);
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
pub mod text;
pub mod translator;

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use error::{Error, ErrorKind, Result};
pub use translator::{BatchType, TranslateOptions, TranslationResult};

/// A loaded model: immutable and cheap to clone (shared by reference counting).
#[derive(Clone)]
pub struct Model {
    inner: Arc<model::TransformerModel>,
    path: PathBuf,
}

impl Model {
    /// Loads a CTranslate2 model directory (`model.bin`, `config.json`, vocabularies) with
    /// the weights as saved ([`ComputeType::Default`]).
    pub fn load(path: impl AsRef<Path>) -> Result<Model> {
        Model::load_with(path, ComputeType::Default)
    }

    /// Loads a model with its weights converted for `compute_type` (quantized or
    /// dequantized at load, as CTranslate2 does).
    pub fn load_with(path: impl AsRef<Path>, compute_type: ComputeType) -> Result<Model> {
        let path = path.as_ref();
        Ok(Model { inner: Arc::new(model::TransformerModel::load(path, compute_type)?), path: path.to_path_buf() })
    }

    /// The compute type the weights were loaded for (never `Default` or `Auto`).
    pub fn compute_type(&self) -> ComputeType {
        self.inner.compute_type
    }

    pub fn transformer(&self) -> &model::TransformerModel {
        &self.inner
    }
}

/// Numeric precision of the computation, named as in CTranslate2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ComputeType {
    /// The type the weights are saved in (int8 -> int8, int16 -> int16, else float32).
    Default,
    /// The fastest type for this CPU: int8 where SIMD integer kernels exist.
    Auto,
    Float32,
    /// int8 weights and activations with float32 everything else (CTranslate2's
    /// `int8_float32`).
    Int8,
    /// int16 weights and activations.
    Int16,
}

impl ComputeType {
    /// Parses CTranslate2's names. Half-precision types are refused on CPU, as in CTranslate2.
    pub fn parse(name: &str) -> Result<ComputeType> {
        match name {
            "default" => Ok(ComputeType::Default),
            "auto" => Ok(ComputeType::Auto),
            "float32" | "float" => Ok(ComputeType::Float32),
            "int8" | "int8_float32" => Ok(ComputeType::Int8),
            "int16" => Ok(ComputeType::Int16),
            "int8_float16" | "int8_bfloat16" | "float16" | "bfloat16" => Err(Error::unsupported(format!(
                "compute type {name:?} is not supported on CPU (use float32, int8 or int16)"
            ))),
            other => Err(Error::invalid_argument(format!(
                "unknown compute type {other:?} (expected default, auto, float32, int8, int8_float32 or int16)"
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ComputeType::Default => "default",
            ComputeType::Auto => "auto",
            ComputeType::Float32 => "float32",
            ComputeType::Int8 => "int8_float32",
            ComputeType::Int16 => "int16",
        }
    }

    /// The concrete type for a model whose weights are saved as `saved`.
    pub fn resolve(self, saved: format::ct2::DType) -> ComputeType {
        use format::ct2::DType;
        match self {
            ComputeType::Default => match saved {
                DType::I8 => ComputeType::Int8,
                DType::I16 => ComputeType::Int16,
                _ => ComputeType::Float32,
            },
            ComputeType::Auto if backend::cpu::isa::current() == backend::cpu::isa::Isa::Scalar => ComputeType::Float32,
            ComputeType::Auto => ComputeType::Int8,
            concrete => concrete,
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
        TranslatorConfig { device: "cpu".into(), compute_type: ComputeType::Default, intra_threads: 1 }
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
        // A compute type other than the model's loads the weights again, converted.
        let resolved = config.compute_type.resolve(model.inner.saved_weight_type);
        let weights = if config.compute_type == ComputeType::Default || resolved == model.compute_type() {
            Arc::clone(&model.inner)
        } else {
            Arc::new(model::TransformerModel::load(&model.path, resolved)?)
        };
        Ok(Translator { inner: translator::Translator::new(weights, config.intra_threads)? })
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
