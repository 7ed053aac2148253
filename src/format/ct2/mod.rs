//! CTranslate2 model directories: `model.bin`, `config.json`, the vocabularies and the
//! optional vocabulary map.
pub mod binary;
pub mod config;
pub mod vmap;
pub mod vocab;

use std::path::Path;

use crate::error::{Error, Result};
pub use binary::{DType, ModelBin};
use crate::format::files::PackageFiles;
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
        Ct2Dir::open_in(&PackageFiles::Disk, dir)
    }

    /// Reads the directory `dir` of `files` (on disk or in memory).
    pub fn open_in(files: &PackageFiles, dir: &Path) -> Result<Ct2Dir> {
        if !files.is_dir(dir) {
            return Err(Error::io(format!("model directory {} does not exist or is not a directory", dir.display())));
        }
        let bin_path = dir.join("model.bin");
        if !files.is_file(&bin_path) {
            return Err(Error::io(format!("no model.bin in {}", files.describe(dir))));
        }
        let bin = ModelBin::parse(files.map(&bin_path)?)?;
        let config_path = dir.join("config.json");
        let config = if files.is_file(&config_path) {
            Ct2Config::parse(&files.read_text(&config_path)?)?
        } else if bin.binary_version < 6 {
            Ct2Config::default()
        } else {
            // Its special tokens and `add_source_bos/eos` change every translation: guessed,
            // they came out as garbage (and CTranslate2 4.8 does not load such a directory).
            return Err(Error::io(format!(
                "no config.json in {}: a model.bin of binary version {} is written with one (it names the \
                 special tokens and what the source gets added); copy it from where the model was converted",
                files.describe(dir),
                bin.binary_version
            )));
        };
        let unk = config.unk_token.clone();
        let (source_vocabulary, target_vocabulary) = match Vocabulary::load(files, dir, "shared_vocabulary", &unk)? {
            Some(shared) => (shared.clone(), shared),
            None => {
                let has = |name: &str| files.is_file(&dir.join(name));
                if has("source_1_vocabulary.json") || has("source_1_vocabulary.txt") {
                    return Err(Error::unsupported("models with several source features (source factors) are not supported"));
                }
                let source = Vocabulary::load(files, dir, "source_vocabulary", &unk)?;
                let target = Vocabulary::load(files, dir, "target_vocabulary", &unk)?;
                match (source, target) {
                    (Some(s), Some(t)) => (s, t),
                    _ => {
                        return Err(Error::io(format!(
                            "no vocabulary in {}: expected shared_vocabulary.json/.txt or \
                             source_vocabulary and target_vocabulary (.json or .txt)",
                            files.describe(dir)
                        )))
                    }
                }
            }
        };
        let special = [config.unk_token.as_str(), config.bos_token.as_str(), config.eos_token.as_str()];
        let vocabulary_map = VocabularyMap::load(files, dir, &target_vocabulary, special)?;
        Ok(Ct2Dir { bin, config, source_vocabulary, target_vocabulary, vocabulary_map })
    }
}
