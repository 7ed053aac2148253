//! What a model path holds: a CTranslate2 directory (`model.bin` + `config.json`) or a
//! Marian package (a model `.bin`/`.npz` with its YAML: Bergamot's `config.*.yml`, a
//! `decoder.yml`, or the model's own `special:model.yml` beside `vocab*.spm`/`.yml`), on
//! disk or among files in memory ([`PackageFiles`]).
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::format::files::PackageFiles;
use crate::format::marian::Yaml;

/// The model families Tolk loads, with the files found for them.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelPackage {
    Ct2 { files: PackageFiles, dir: PathBuf },
    Marian(MarianPackage),
}

/// A Marian model and what its package configuration says about it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MarianPackage {
    /// Where the paths below are.
    pub files: PackageFiles,
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
        ModelPackage::detect_in(&PackageFiles::Disk, path)
    }

    /// [`ModelPackage::detect`] over `files`: in memory, `path` is the root (the empty
    /// path) or the name of a YAML or model file among them.
    pub fn detect_in(files: &PackageFiles, path: &Path) -> Result<ModelPackage> {
        if files.is_file(path) {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name.ends_with(".yml") || name.ends_with(".yaml") {
                return MarianPackage::from_yaml_file(files, path).map(ModelPackage::Marian);
            }
            if MODEL_SUFFIXES.iter().any(|s| name.ends_with(s)) && name != "model.bin" {
                let dir = path.parent().unwrap_or(Path::new("."));
                return MarianPackage::from_directory(files, dir, Some(path.to_path_buf())).map(ModelPackage::Marian);
            }
            return Err(Error::io(format!(
                "{} is neither a model directory nor a Marian model (.bin/.npz) or its YAML configuration",
                path.display()
            )));
        }
        if !files.is_dir(path) {
            return Err(Error::io(format!("model path {} does not exist", path.display())));
        }
        let model_bin = path.join("model.bin");
        if files.is_file(&model_bin) && (files.is_file(&path.join("config.json")) || looks_like_ct2(files, &model_bin)) {
            return Ok(ModelPackage::Ct2 { files: files.clone(), dir: path.to_path_buf() });
        }
        if let Some(yaml) = package_yaml(files, path)? {
            return MarianPackage::from_yaml_file(files, &yaml).map(ModelPackage::Marian);
        }
        if marian_model_files(files, path)?.len() == 1 {
            return MarianPackage::from_directory(files, path, None).map(ModelPackage::Marian);
        }
        if files.is_file(&model_bin) {
            // A model.bin with no config.json that is not CTranslate2's either.
            return Err(Error::invalid_model(format!(
                "{} is not a CTranslate2 model (no config.json, unknown header) and no Marian \
                 configuration (*.yml naming `models:`) is beside it",
                model_bin.display()
            )));
        }
        Err(Error::io(format!(
            "no model Tolk knows in {}: looked for a CTranslate2 directory (model.bin + config.json) and a \
             Marian package (a *.yml with `models:`, or one model *.bin/*.npz with vocab*.spm or *.yml vocabularies)",
            files.describe(path)
        )))
    }
}

/// Whether `model.bin` starts like a CTranslate2 binary: a version 1..=6 (a Marian `.bin`
/// starts with a u64 version 1 whose high half is 0, then a u64 item count).
fn looks_like_ct2(files: &PackageFiles, path: &Path) -> bool {
    // Mapped, not read: only the first page is touched.
    let Ok(bytes) = files.map(path) else { return false };
    let Some(head) = bytes.get(..8) else { return false };
    let version = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
    let marian_like = version == 1 && head[4..8] == [0, 0, 0, 0];
    (1..=6).contains(&version) && !marian_like
}

/// A YAML in `dir` that names the model (`models:`), preferring Bergamot's int8 config.
fn package_yaml(files: &PackageFiles, dir: &Path) -> Result<Option<PathBuf>> {
    let names_models = |p: &Path| files.read_text(p).is_ok_and(|t| t.lines().any(|l| l.starts_with("models:")));
    let mut candidates: Vec<PathBuf> = files
        .list(dir)?
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "yml" || e == "yaml"))
        .filter(|p| names_models(p))
        .collect();
    // Bergamot packages ship config.intgemm8bitalpha.yml (int8) and sometimes float configs.
    candidates.sort_by_key(|p| {
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("").to_string();
        (!name.contains("intgemm8bitalpha"), !name.contains("intgemm"), name)
    });
    Ok(candidates.into_iter().next())
}

fn marian_model_files(files: &PackageFiles, dir: &Path) -> Result<Vec<PathBuf>> {
    Ok(files
        .list(dir)?
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
    pub fn from_yaml_file(files: &PackageFiles, path: &Path) -> Result<MarianPackage> {
        let text = files.read_text(path)?;
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
        let in_file = |e: Error| Error::new(e.kind, format!("{}: {}", path.display(), e.message));
        let count = |key: &str, low: usize, high: usize| -> Result<Option<usize>> {
            match yaml.count_at(key).map_err(in_file)? {
                Some(n) if !(low..=high).contains(&n) => {
                    Err(Error::invalid_model(format!("{}: {key} must be a whole number in {low}..={high}", path.display())))
                }
                n => Ok(n),
            }
        };
        if number("word-penalty", f64::MIN, f64::MAX)?.is_some_and(|w| w != 0.0) {
            return Err(Error::unsupported(format!("{}: a non-zero word-penalty is not supported", path.display())));
        }
        let mut package = MarianPackage {
            files: files.clone(),
            model,
            vocabularies,
            shortlist,
            beam_size: count("beam-size", 1, 1024)?,
            normalize: number("normalize", -100.0, 100.0)?.map(|v| v as f32),
            max_length_factor: number("max-length-factor", 0.0, 1000.0)?.map(|v| v as f32),
            mini_batch: count("mini-batch", 1, u32::MAX as usize)?,
            gemm_precision: yaml.string_at("gemm-precision").map_err(in_file)?.map(str::to_string),
            allow_unk: yaml.bool_at("allow-unk").map_err(in_file)?.unwrap_or(false),
        };
        if package.vocabularies.is_empty() {
            package.vocabularies = find_vocabularies(files, dir)?;
        }
        package.check_files()?;
        Ok(package)
    }

    /// A model file without a decoding configuration: the vocabularies found beside it.
    fn from_directory(files: &PackageFiles, dir: &Path, model: Option<PathBuf>) -> Result<MarianPackage> {
        let model = match model {
            Some(m) => m,
            None => marian_model_files(files, dir)?
                .into_iter()
                .next()
                .ok_or_else(|| Error::io(format!("{}: no Marian model file", files.describe(dir))))?,
        };
        let vocabularies = find_vocabularies(files, dir)?;
        let package = MarianPackage { files: files.clone(), model, vocabularies, ..MarianPackage::default() };
        package.check_files()?;
        Ok(package)
    }

    fn check_files(&self) -> Result<()> {
        if !self.files.is_file(&self.model) {
            return Err(self.files.not_a_file("the Marian model", &self.model));
        }
        if self.vocabularies.is_empty() {
            return Err(Error::io(format!(
                "no vocabulary for the Marian model {}: expected `vocabs:` in its YAML or vocab*.spm / vocab*.yml beside it",
                self.model.display()
            )));
        }
        for v in &self.vocabularies {
            if !self.files.is_file(v) {
                return Err(self.files.not_a_file("the vocabulary", v));
            }
        }
        if let Some(s) = &self.shortlist {
            if !self.files.is_file(&s.path) {
                return Err(self.files.not_a_file("the shortlist", &s.path));
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
fn find_vocabularies(files: &PackageFiles, dir: &Path) -> Result<Vec<PathBuf>> {
    let files = files.list(dir)?;
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
