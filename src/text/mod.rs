//! Text processing around the models: tokenization (SentencePiece) and, later, sentence
//! splitting for the text API.
pub mod sentencepiece;

pub use sentencepiece::SentencePiece;
