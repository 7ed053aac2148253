//! What a model path holds: a CTranslate2 directory (`model.bin` + `config.json`) or a
//! Marian package (a model `.bin`/`.npz` with its YAML: Bergamot's `config.*.yml`, a
//! `decoder.yml`, or the model's own `special:model.yml` beside `vocab*.spm`/`.yml`).
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::format::marian::Yaml;

/// The model families Tolk loads, with the files found for them.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelPackage {
    Ct2 { dir: PathBuf },
    Marian(MarianPackage),
}

/// A Marian model and what its package configuration says about it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MarianPackage {
    pub model: PathBuf,
    /// Source then target vocabulary (`.spm` SentencePiece models or `.yml` token maps).
    pub vocabularies: Vec<PathBuf>,
    pub shortlist: Option<ShortlistConfig>,
    pub beam_size: Option<usize>,
    pub normalize: Option<f32>,
    pub max_length_factor: Option<f32>,
    pub mini_batch: Option<usize>,
    /// `gemm-precision`: float32, int8, int8shift, int8shiftAlpha, int8shiftAlphaAll, int16.
    pub gemm_precision: Option<String>,
    pub allow_unk: bool,
}

/// A shortlist file and its `first`/`best` (text shortlists). A binary shortlist's
/// checksum is always verified, whatever the YAML's second value (Marian's `check`) says:
/// a corrupted file is refused rather than used.
#[derive(Debug, Clone, PartialEq)]
pub struct ShortlistConfig {
    pub path: PathBuf,
    pub first: Option<usize>,
    pub best: Option<usize>,
}

const MODEL_SUFFIXES: [&str; 2] = [".bin", ".npz"];

impl ModelPackage {
    /// Tells the family by what `path` holds: a directory with `model.bin` and
    /// `config.json` is CTranslate2's; a directory with a Marian YAML (or a model file and
    /// vocabularies), or a path to such a YAML or model file, is Marian's.
    pub fn detect(path: &Path) -> Result<ModelPackage> {
        if path.is_file() {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name.ends_with(".yml") || name.ends_with(".yaml") {
                return MarianPackage::from_yaml_file(path).map(ModelPackage::Marian);
            }
            if MODEL_SUFFIXES.iter().any(|s| name.ends_with(s)) && name != "model.bin" {
                let dir = path.parent().unwrap_or(Path::new("."));
                return MarianPackage::from_directory(dir, Some(path.to_path_buf())).map(ModelPackage::Marian);
            }
            return Err(Error::io(format!(
                "{} is neither a model directory nor a Marian model (.bin/.npz) or its YAML configuration",
                path.display()
            )));
        }
        if !path.is_dir() {
            return Err(Error::io(format!("model path {} does not exist", path.display())));
        }
        if path.join("model.bin").is_file() && (path.join("config.json").is_file() || looks_like_ct2(&path.join("model.bin"))) {
            return Ok(ModelPackage::Ct2 { dir: path.to_path_buf() });
        }
        if let Some(yaml) = package_yaml(path)? {
            return MarianPackage::from_yaml_file(&yaml).map(ModelPackage::Marian);
        }
        if marian_model_files(path)?.len() == 1 {
            return MarianPackage::from_directory(path, None).map(ModelPackage::Marian);
        }
        if path.join("model.bin").is_file() {
            // A model.bin with no config.json that is not CTranslate2's either.
            return Err(Error::invalid_model(format!(
                "{}/model.bin is not a CTranslate2 model (no config.json, unknown header) and no Marian \
                 configuration (*.yml naming `models:`) is beside it",
                path.display()
            )));
        }
        Err(Error::io(format!(
            "{} holds no model Tolk knows: looked for a CTranslate2 directory (model.bin + config.json) and a \
             Marian package (a *.yml with `models:`, or one model *.bin/*.npz with vocab*.spm or *.yml vocabularies)",
            path.display()
        )))
    }
}

/// Whether `model.bin` starts like a CTranslate2 binary: a version 1..=6 (a Marian `.bin`
/// starts with a u64 version 1 whose high half is 0, then a u64 item count).
fn looks_like_ct2(path: &Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; 8];
    let read = std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut head));
    let version = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
    let marian_like = version == 1 && head[4..8] == [0, 0, 0, 0];
    read.is_ok() && (1..=6).contains(&version) && !marian_like
}

/// A YAML in `dir` that names the model (`models:`), preferring Bergamot's int8 config.
fn package_yaml(dir: &Path) -> Result<Option<PathBuf>> {
    let mut candidates: Vec<PathBuf> = read_dir(dir)?
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "yml" || e == "yaml"))
        .filter(|p| std::fs::read_to_string(p).is_ok_and(|t| t.lines().any(|l| l.starts_with("models:"))))
        .collect();
    // Bergamot packages ship config.intgemm8bitalpha.yml (int8) and sometimes float configs.
    candidates.sort_by_key(|p| {
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("").to_string();
        (!name.contains("intgemm8bitalpha"), !name.contains("intgemm"), name)
    });
    Ok(candidates.into_iter().next())
}

fn read_dir(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io(format!("cannot list {}: {e}", dir.display())))?;
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    Ok(paths)
}

fn marian_model_files(dir: &Path) -> Result<Vec<PathBuf>> {
    Ok(read_dir(dir)?
        .into_iter()
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.starts_with("model") && MODEL_SUFFIXES.iter().any(|s| name.ends_with(s)) && name != "model.bin"
        })
        .collect())
}

impl MarianPackage {
    /// Reads a Marian decoding configuration: `models`, `vocabs`, `shortlist` and the
    /// decoding settings; relative paths are relative to the YAML's folder (as
    /// `relative-paths: true` says, and as Bergamot packages are laid out).
    pub fn from_yaml_file(path: &Path) -> Result<MarianPackage> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(format!("cannot read {}: {e}", path.display())))?;
        let yaml = crate::format::marian::yaml::parse(&text)
            .map_err(|e| Error::invalid_model(format!("{}: {}", path.display(), e.message)))?;
        let dir = path.parent().unwrap_or(Path::new("."));
        let strings = |key: &str| -> Vec<String> {
            match yaml.get(key) {
                Some(Yaml::List(items)) => items.iter().filter_map(|i| i.as_str().map(str::to_string)).collect(),
                Some(item) => item.as_str().map(|s| vec![s.to_string()]).unwrap_or_default(),
                None => Vec::new(),
            }
        };
        let models = strings("models");
        let model = match models.as_slice() {
            [one] => dir.join(one),
            [] => return Err(Error::invalid_model(format!("{}: no `models:` entry names the model file", path.display()))),
            _ => return Err(Error::unsupported(format!("{}: ensembles of several models are not supported", path.display()))),
        };
        let vocabularies: Vec<PathBuf> = strings("vocabs").iter().map(|v| dir.join(v)).collect();
        let shortlist = match strings("shortlist").as_slice() {
            [] => None,
            [file, rest @ ..] => {
                let number = |i: usize| rest.get(i).and_then(|v| v.parse::<usize>().ok());
                let binary = file.ends_with(".bin");
                Some(ShortlistConfig {
                    path: dir.join(file),
                    first: if binary { None } else { number(0) },
                    best: if binary { None } else { number(1) },
                })
            }
        };
        // Settings are checked here: a value no translation could use fails the load.
        let number = |key: &str, low: f64, high: f64| -> Result<Option<f64>> {
            match yaml.get(key) {
                None | Some(Yaml::Null) => Ok(None),
                Some(v) => match v.as_f64() {
                    Some(x) if x.is_finite() && (low..=high).contains(&x) => Ok(Some(x)),
                    _ => Err(Error::invalid_model(format!("{}: {key} must be a number in {low}..={high}", path.display()))),
                },
            }
        };
        if number("word-penalty", f64::MIN, f64::MAX)?.is_some_and(|w| w != 0.0) {
            return Err(Error::unsupported(format!("{}: a non-zero word-penalty is not supported", path.display())));
        }
        let mut package = MarianPackage {
            model,
            vocabularies,
            shortlist,
            beam_size: number("beam-size", 1.0, 1024.0)?.map(|v| v as usize),
            normalize: number("normalize", -100.0, 100.0)?.map(|v| v as f32),
            max_length_factor: number("max-length-factor", 0.0, 1000.0)?.map(|v| v as f32),
            mini_batch: number("mini-batch", 1.0, u32::MAX as f64)?.map(|v| v as usize),
            gemm_precision: yaml.get("gemm-precision").and_then(Yaml::as_str).map(str::to_string),
            allow_unk: yaml.get("allow-unk").and_then(Yaml::as_bool).unwrap_or(false),
        };
        if package.vocabularies.is_empty() {
            package.vocabularies = find_vocabularies(dir)?;
        }
        package.check_files()?;
        Ok(package)
    }

    /// A model file without a decoding configuration: the vocabularies found beside it.
    fn from_directory(dir: &Path, model: Option<PathBuf>) -> Result<MarianPackage> {
        let model = match model {
            Some(m) => m,
            None => marian_model_files(dir)?.into_iter().next().ok_or_else(|| Error::io(format!("{}: no Marian model file", dir.display())))?,
        };
        let package = MarianPackage { model, vocabularies: find_vocabularies(dir)?, ..MarianPackage::default() };
        package.check_files()?;
        Ok(package)
    }

    fn check_files(&self) -> Result<()> {
        if !self.model.is_file() {
            return Err(Error::io(format!("the Marian model {} does not exist", self.model.display())));
        }
        if self.vocabularies.is_empty() {
            return Err(Error::io(format!(
                "no vocabulary for the Marian model {}: expected `vocabs:` in its YAML or vocab*.spm / vocab*.yml beside it",
                self.model.display()
            )));
        }
        for v in &self.vocabularies {
            if !v.is_file() {
                return Err(Error::io(format!("the vocabulary {} does not exist", v.display())));
            }
        }
        if let Some(s) = &self.shortlist {
            if !s.path.is_file() {
                return Err(Error::io(format!("the shortlist {} does not exist", s.path.display())));
            }
        }
        Ok(())
    }

    /// Source and target vocabulary files (one file = shared).
    pub fn vocabulary_files(&self) -> (&Path, &Path) {
        let source = &self.vocabularies[0];
        (source, self.vocabularies.last().unwrap_or(source))
    }
}

/// `srcvocab*`/`trgvocab*` or a single `vocab*` (SentencePiece `.spm` or Marian `.yml`).
fn find_vocabularies(dir: &Path) -> Result<Vec<PathBuf>> {
    let files = read_dir(dir)?;
    let named = |prefix: &str| {
        files.iter().find(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.starts_with(prefix) && (name.ends_with(".spm") || name.ends_with(".yml") || name.ends_with(".yaml"))
        })
    };
    Ok(match (named("srcvocab"), named("trgvocab"), named("vocab")) {
        (Some(s), Some(t), _) => vec![s.clone(), t.clone()],
        (_, _, Some(v)) => vec![v.clone()],
        _ => Vec::new(),
    })
}
