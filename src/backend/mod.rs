//! Compute backends. Only the CPU backend exists so far; it is chosen for every translator.
//! What a backend computes in (the compute type) is its choice, named here so that models
//! and formats can say what they hold without knowing any kernel.
pub mod cpu;

use crate::error::{Error, Result};

/// The order float operations run in, which decides the last bits of their results
/// (and, through int8 quantization, sometimes a word): each engine's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FloatOrder {
    /// CTranslate2's: its AVX2 layer norm and softmax, MKL's orders in attention.
    #[default]
    Ctranslate2,
    /// Marian's as the Bergamot engine runs it: sequential sums without fused
    /// multiply-adds in layer norm and attention, Eigen's GEMM order for `Q·Kᵀ`.
    Marian,
}

/// How a model file stores its matrices, which decides [`ComputeType::Default`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SavedPrecision {
    Float,
    Int8,
    Int16,
}

/// Numeric precision of the computation, named as in CTranslate2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ComputeType {
    /// The type the weights are saved in (int8 -> int8, int16 -> int16, else float32).
    #[default]
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
    pub fn resolve(self, saved: SavedPrecision) -> ComputeType {
        match self {
            ComputeType::Default => match saved {
                SavedPrecision::Int8 => ComputeType::Int8,
                SavedPrecision::Int16 => ComputeType::Int16,
                SavedPrecision::Float => ComputeType::Float32,
            },
            ComputeType::Auto if cpu::isa::current() == cpu::isa::Isa::Scalar => ComputeType::Float32,
            ComputeType::Auto => ComputeType::Int8,
            concrete => concrete,
        }
    }
}

