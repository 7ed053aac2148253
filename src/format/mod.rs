//! Readers for the model formats Tolk loads. Each reader turns files into plain data
//! (named tensors, configuration, vocabularies); building layers is `model`'s job.
pub mod ct2;
pub mod json;
