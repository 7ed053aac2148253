//! Readers for the model formats Tolk loads. Each reader turns files into plain data
//! (named tensors, configuration, vocabularies); building layers is `model`'s job.
//!
//! The seam between the two is [`WeightSource`]: a model family's builder asks for
//! tensors by their name in Tolk's spec tree (CTranslate2's variable names, plus a few
//! of Tolk's own for what CTranslate2 cannot express, such as SSRU decoder layers), and
//! each format presents its file under those names: CTranslate2's `model.bin` as stored,
//! a Marian model through a name map.
pub mod ct2;
pub mod files;
pub mod json;
pub mod marian;
pub mod package;
pub mod shortlist;

pub use crate::backend::Quantized;
use crate::backend::{FloatOrder, SavedPrecision};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Named tensors and attributes of a model, under Tolk's spec names. Matrices are handed
/// out as `[out, in]` (CTranslate2's layout) whatever the file stores.
pub trait WeightSource {
    /// The file the names come from, for error messages ("model.bin").
    fn file_name(&self) -> &str;
    /// Names of the stored variables (not aliases), each of which a builder must use.
    fn variable_names(&self) -> Vec<String>;
    /// The stored variable `name` refers to: itself, or the target of an alias (a tied weight).
    fn stored_name(&self, name: &str) -> Option<String>;
    fn contains(&self, name: &str) -> bool {
        self.stored_name(name).is_some()
    }
    /// Shape of a variable, without reading its data.
    fn shape(&self, name: &str) -> Option<Vec<usize>>;
    /// Whether a stored variable is shared by several names (tied weights).
    fn is_shared(&self, stored: &str) -> bool;
    /// A variable as float32 (dequantized or widened as needed).
    fn tensor(&self, name: &str) -> Result<Tensor>;
    /// A weight's stored quantized values, `None` when it is stored as floats.
    fn quantized(&self, name: &str) -> Result<Option<Quantized<'_>>>;
    /// A scalar attribute as a float.
    fn scalar(&self, name: &str) -> Result<Option<f64>>;
    /// Whether a scalar attribute is stored as a boolean flag (rather than a value).
    fn is_flag(&self, name: &str) -> bool;
    /// What the matrices are saved as: decides the default compute type.
    fn saved_precision(&self) -> SavedPrecision;
    /// The float arithmetic the model was made with (its engine's order of operations).
    fn float_order(&self) -> FloatOrder {
        FloatOrder::Ctranslate2
    }
    /// The stored data of a variable is no longer needed (its pages may be dropped).
    fn release(&self, _stored: &str) {}
}

/// A stored quantization scale, which is a positive finite number in any file a converter
/// wrote: a corrupt one (NaN, 0, infinite, negative) loaded silently and translated garbage.
pub(crate) fn check_scale(value: f32, name: &str, what: &str) -> Result<f32> {
    if value.is_finite() && value > 0.0 {
        Ok(value)
    } else {
        Err(Error::invalid_model(format!("{name}: the {what} {value} is not a positive finite number (a corrupt file)")))
    }
}
