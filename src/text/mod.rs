//! Text around the models: SentencePiece tokenization, the tokenizers a model package ships
//! (`tokenizer`), sentence splitting (`split`) and text-in/text-out translation
//! (`translate`), and streaming translation of lines, files and standard streams with
//! bounded memory (`stream`).
pub mod sentencepiece;
pub mod split;
pub mod stream;
pub mod tokenizer;
pub mod translate;

pub use sentencepiece::{EncodedPiece, SentencePiece};
pub use split::SplitMode;
pub use stream::StreamOptions;
pub use tokenizer::{Tokenizer, TokenizerFiles};
pub use translate::{SentenceTranslation, TextOptions, TextTokenCallback, TextTokenEvent, TextTranslation};
