//! The tokenizers of a model package: finding the SentencePiece files that ship beside a
//! model, encoding source text, and turning the target pieces a model emits back into text.
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::sentencepiece::{EncodedPiece, SentencePiece};
use crate::error::{Error, Result};
use crate::format::files::PackageFiles;

const SPACE_SYMBOL: char = '\u{2581}';
/// What SentencePiece prints for `<unk>` (its `unk_surface`).
const UNK_SURFACE: &str = " \u{2047} ";
/// A single SentencePiece model counts as the target side's when it knows this share of the
/// target vocabulary (joint models know ~100%; a source-only one, like the zh-en package's,
/// about half).
const TARGET_COVERAGE: f64 = 0.9;

/// Where a package's tokenizer files are; found by [`TokenizerFiles::find`] or given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenizerFiles {
    pub source: Option<PathBuf>,
    /// `None` with a source file: one model for both sides (checked against the target
    /// vocabulary before it is used to decode).
    pub target: Option<PathBuf>,
}

impl TokenizerFiles {
    /// Looks in `dir`, then in its parent for Argos packages (the model in a `model/`
    /// directory beside `sentencepiece.model` and `metadata.json`), for, in this order:
    /// `source.spm` + `target.spm` (OPUS-MT), `srcvocab.*.spm` + `trgvocab.*.spm` (Bergamot),
    /// `sentencepiece.model` (Argos), `spm.model`, `sentencepiece.bpe.model`, `vocab.*.spm`
    /// (Marian joint vocabulary). Other parents are left alone: a folder of models may hold
    /// unrelated files.
    pub fn find(dir: &Path) -> TokenizerFiles {
        let files = PackageFiles::Disk;
        let mut places = vec![dir.to_path_buf()];
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            if dir.file_name().is_some_and(|n| n == "model") || parent.join("metadata.json").is_file() {
                places.push(parent.to_path_buf());
            }
        }
        places.iter().find_map(|d| Self::find_in(&files, d)).unwrap_or_default()
    }

    /// [`TokenizerFiles::find`] over `files`: files in memory have no parent folder to
    /// look in, only the names given.
    pub fn find_among(files: &PackageFiles, dir: &Path) -> TokenizerFiles {
        match files {
            PackageFiles::Disk => Self::find(dir),
            PackageFiles::Memory(_) => Self::find_in(files, dir).unwrap_or_default(),
        }
    }

    /// A short list of the names [`TokenizerFiles::find`] looks for, for error messages.
    pub const SEARCHED: &'static str = "source.spm + target.spm, srcvocab.*.spm + trgvocab.*.spm, sentencepiece.model, \
        spm.model, sentencepiece.bpe.model or vocab.*.spm in the model directory (or its parent for Argos packages)";

    fn find_in(files: &PackageFiles, dir: &Path) -> Option<TokenizerFiles> {
        let file = |name: &str| Some(dir.join(name)).filter(|p| files.is_file(p));
        let matching = |prefix: &str| -> Option<PathBuf> {
            // Sorted: the first match.
            files.list(dir).ok()?.into_iter().find(|p| {
                files.is_file(p)
                    && p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(prefix) && n.ends_with(".spm"))
            })
        };
        let pair = |source: Option<PathBuf>, target: Option<PathBuf>| match (source, target) {
            (Some(s), Some(t)) => Some(TokenizerFiles { source: Some(s), target: Some(t) }),
            _ => None,
        };
        let shared = |p: PathBuf| TokenizerFiles { source: Some(p), target: None };
        pair(file("source.spm"), file("target.spm"))
            .or_else(|| pair(matching("srcvocab."), matching("trgvocab.")))
            .or_else(|| file("sentencepiece.model").map(shared))
            .or_else(|| file("spm.model").map(shared))
            .or_else(|| file("sentencepiece.bpe.model").map(shared))
            .or_else(|| matching("vocab.").map(shared))
    }
}

/// Source encoding and target decoding for one model.
pub struct Tokenizer {
    source: Arc<SentencePiece>,
    /// The model that knows the target pieces, if the package has one.
    target: Option<Arc<SentencePiece>>,
    files: TokenizerFiles,
}

impl Tokenizer {
    /// Loads `files` for a model whose target vocabulary is `target_vocabulary`. Returns
    /// `None` when no source file is given.
    pub fn load<'a>(files: &TokenizerFiles, target_vocabulary: impl ExactSizeIterator<Item = &'a str>) -> Result<Option<Tokenizer>> {
        Tokenizer::load_from(&PackageFiles::Disk, files, target_vocabulary)
    }

    /// [`Tokenizer::load`] with the paths of `files` read from `package` (on disk or in
    /// memory).
    pub fn load_from<'a>(
        package: &PackageFiles,
        files: &TokenizerFiles,
        target_vocabulary: impl ExactSizeIterator<Item = &'a str>,
    ) -> Result<Option<Tokenizer>> {
        let Some(source_path) = &files.source else {
            if files.target.is_some() {
                return Err(Error::invalid_argument("a target tokenizer was given without a source tokenizer"));
            }
            return Ok(None);
        };
        let load = |p: &Path| {
            package
                .read(p)
                .and_then(|bytes| SentencePiece::from_bytes(&bytes))
                .map(Arc::new)
                .map_err(|e| Error::new(e.kind, format!("tokenizer {}: {}", p.display(), e.message)))
        };
        let source = load(source_path)?;
        let target = match &files.target {
            Some(p) => Some(load(p)?),
            None if covers(&source, target_vocabulary) => Some(Arc::clone(&source)),
            None => None,
        };
        Ok(Some(Tokenizer { source, target, files: files.clone() }))
    }

    /// The files this tokenizer was loaded from.
    pub fn files(&self) -> &TokenizerFiles {
        &self.files
    }

    pub fn source(&self) -> &SentencePiece {
        &self.source
    }

    /// Whether target pieces are decoded by a SentencePiece model (otherwise by the generic
    /// piece rules of [`detokenize_pieces`]).
    pub fn has_target_model(&self) -> bool {
        self.target.is_some()
    }

    /// Source pieces of `text` with their byte ranges in it.
    pub fn encode(&self, text: &str) -> Vec<EncodedPiece> {
        self.source.encode_with_offsets(text)
    }

    /// The text of target pieces: the target SentencePiece model's decoding when it knows
    /// every piece, else the generic rules (a source-only model would leave unknown pieces
    /// undecoded, `▁` included, as the reference library does).
    pub fn decode<S: AsRef<str>>(&self, pieces: &[S]) -> String {
        match &self.target {
            Some(sp) if pieces.iter().all(|p| sp.find_piece(p.as_ref()).is_some()) => sp.decode(pieces),
            _ => detokenize_pieces(pieces),
        }
    }
}

/// Whether `sp` knows at least [`TARGET_COVERAGE`] of the target vocabulary.
fn covers<'a>(sp: &SentencePiece, vocabulary: impl ExactSizeIterator<Item = &'a str>) -> bool {
    let total = vocabulary.len();
    let known = vocabulary.filter(|t| sp.find_piece(t).is_some()).count();
    total > 0 && known as f64 >= TARGET_COVERAGE * total as f64
}

/// SentencePiece's decoding rules without a model: pieces are concatenated, `▁` becomes a
/// space (the first one dropped), `<0xNN>` byte pieces are joined into UTF-8, `<unk>` is
/// shown as ` ⁇ ` and the other `<...>` control pieces (`<s>`, `</s>`, `<pad>`) vanish.
pub fn detokenize_pieces<S: AsRef<str>>(pieces: &[S]) -> String {
    let mut text = String::new();
    let mut bytes: Vec<u8> = Vec::new();
    let flush = |text: &mut String, bytes: &mut Vec<u8>| {
        if !bytes.is_empty() {
            text.push_str(&String::from_utf8_lossy(bytes));
            bytes.clear();
        }
    };
    for piece in pieces {
        let piece = piece.as_ref();
        if let Some(b) = byte_piece(piece) {
            bytes.push(b);
            continue;
        }
        flush(&mut text, &mut bytes);
        match piece {
            "<unk>" => text.push_str(UNK_SURFACE),
            "<s>" | "</s>" | "<pad>" => {}
            _ => {
                let piece = if text.is_empty() { piece.strip_prefix(SPACE_SYMBOL).unwrap_or(piece) } else { piece };
                text.extend(piece.chars().map(|c| if c == SPACE_SYMBOL { ' ' } else { c }));
            }
        }
    }
    flush(&mut text, &mut bytes);
    text
}

/// The byte of a byte-fallback piece `<0xNN>`.
fn byte_piece(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generic_detokenization_follows_sentencepiece_rules() {
        assert_eq!(detokenize_pieces(&["▁Jesus", "▁wept", ".", "▁He"]), "Jesus wept. He");
        assert_eq!(detokenize_pieces(&["▁a", "<0xE2>", "<0x82>", "<0xAC>", "▁b"]), "a€ b");
        assert_eq!(detokenize_pieces(&["<s>", "▁x", "<unk>", "</s>"]), "x ⁇ ");
        assert_eq!(detokenize_pieces(&["<0xFF>"]), "\u{FFFD}");
        assert_eq!(detokenize_pieces::<&str>(&[]), "");
        assert_eq!(detokenize_pieces(&["▁", "▁a"]), "a"); // As the reference with remove_extra_whitespaces.
        assert_eq!(detokenize_pieces(&["<0x4G>", "<0x4>"]), "<0x4G><0x4>");
    }

    #[test]
    fn package_layouts_are_found() {
        let root = std::env::temp_dir().join(format!("tolk-tokfind-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let touch = |p: &Path| {
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, b"").unwrap();
        };
        // Argos: package/model/ with package/sentencepiece.model.
        let argos = root.join("argos");
        touch(&argos.join("model/model.bin"));
        touch(&argos.join("sentencepiece.model"));
        let found = TokenizerFiles::find(&argos.join("model"));
        assert_eq!(found, TokenizerFiles { source: Some(argos.join("sentencepiece.model")), target: None });
        // OPUS-MT: source.spm + target.spm win over a joint file.
        let opus = root.join("opus");
        touch(&opus.join("source.spm"));
        touch(&opus.join("target.spm"));
        touch(&opus.join("spm.model"));
        assert_eq!(
            TokenizerFiles::find(&opus),
            TokenizerFiles { source: Some(opus.join("source.spm")), target: Some(opus.join("target.spm")) }
        );
        // Bergamot: separate and joint vocabularies.
        let split = root.join("split");
        touch(&split.join("srcvocab.jaen.spm"));
        touch(&split.join("trgvocab.jaen.spm"));
        assert_eq!(
            TokenizerFiles::find(&split),
            TokenizerFiles { source: Some(split.join("srcvocab.jaen.spm")), target: Some(split.join("trgvocab.jaen.spm")) }
        );
        let joint = root.join("joint");
        touch(&joint.join("vocab.enpt.spm"));
        assert_eq!(TokenizerFiles::find(&joint).source, Some(joint.join("vocab.enpt.spm")));
        // Nothing: no tokenizer (and no error).
        let none = root.join("none/model");
        std::fs::create_dir_all(&none).unwrap();
        assert_eq!(TokenizerFiles::find(&none), TokenizerFiles::default());
        // A folder of models is no package: its files are not a model's tokenizer.
        let shelf = root.join("shelf");
        touch(&shelf.join("zh-en/model.bin"));
        touch(&shelf.join("spm.model"));
        assert_eq!(TokenizerFiles::find(&shelf.join("zh-en")), TokenizerFiles::default());
        touch(&shelf.join("metadata.json"));
        assert_eq!(TokenizerFiles::find(&shelf.join("zh-en")).source, Some(shelf.join("spm.model")));
        let _ = std::fs::remove_dir_all(&root);
    }
}
