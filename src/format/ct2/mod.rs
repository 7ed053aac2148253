//! CTranslate2 model directories: `model.bin`, `config.json`, the vocabularies and the
//! optional vocabulary map.
pub mod binary;
pub mod config;
pub mod vmap;
pub mod vocab;

use std::path::Path;

use crate::error::{Error, Result};
pub use binary::{DType, ModelBin};
pub use crate::format::Quantized;
pub use config::Ct2Config;
pub use vmap::VocabularyMap;
pub use vocab::Vocabulary;

/// Everything read from a CTranslate2 model directory, before layers are built.
pub struct Ct2Dir {
    pub bin: ModelBin,
    pub config: Ct2Config,
    pub source_vocabulary: Vocabulary,
    pub target_vocabulary: Vocabulary,
    /// `vmap.txt`, when the directory has one.
    pub vocabulary_map: Option<VocabularyMap>,
}

impl Ct2Dir {
    pub fn open(dir: &Path) -> Result<Ct2Dir> {
        if !dir.is_dir() {
            return Err(Error::io(format!("model directory {} does not exist or is not a directory", dir.display())));
        }
        let bin_path = dir.join("model.bin");
        if !bin_path.is_file() {
            return Err(Error::io(format!("{} has no model.bin", dir.display())));
        }
        let config_path = dir.join("config.json");
        let config = if config_path.is_file() {
            let text = std::fs::read(&config_path)
                .map_err(|e| Error::io(format!("cannot read {}: {e}", config_path.display())))?;
            let text = String::from_utf8(text)
                .map_err(|_| Error::invalid_model(format!("{} is not valid UTF-8", config_path.display())))?;
            Ct2Config::parse(&text)?
        } else {
            Ct2Config::default()
        };
        let unk = config.unk_token.clone();
        let (source_vocabulary, target_vocabulary) = match Vocabulary::load(dir, "shared_vocabulary", &unk)? {
            Some(shared) => (shared.clone(), shared),
            None => {
                if dir.join("source_1_vocabulary.json").is_file() || dir.join("source_1_vocabulary.txt").is_file() {
                    return Err(Error::unsupported("models with several source features (source factors) are not supported"));
                }
                let source = Vocabulary::load(dir, "source_vocabulary", &unk)?;
                let target = Vocabulary::load(dir, "target_vocabulary", &unk)?;
                match (source, target) {
                    (Some(s), Some(t)) => (s, t),
                    _ => {
                        return Err(Error::io(format!(
                            "{} has no vocabulary: expected shared_vocabulary.json/.txt or \
                             source_vocabulary and target_vocabulary (.json or .txt)",
                            dir.display()
                        )))
                    }
                }
            }
        };
        let special = [config.unk_token.as_str(), config.bos_token.as_str(), config.eos_token.as_str()];
        let vocabulary_map = VocabularyMap::load(dir, &target_vocabulary, special)?;
        let bin = ModelBin::open(&bin_path)?;
        Ok(Ct2Dir { bin, config, source_vocabulary, target_vocabulary, vocabulary_map })
    }
}
