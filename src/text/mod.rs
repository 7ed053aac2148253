//! Text around the models: SentencePiece tokenization, the tokenizers a model package ships
//! (`tokenizer`), sentence splitting (`split`) and text-in/text-out translation
//! (`translate`).
pub mod sentencepiece;
pub mod split;
pub mod tokenizer;
pub mod translate;

pub use sentencepiece::{EncodedPiece, SentencePiece};
pub use split::SplitMode;
pub use tokenizer::{Tokenizer, TokenizerFiles};
pub use translate::{SentenceTranslation, TextOptions, TextTokenCallback, TextTokenEvent, TextTranslation};
