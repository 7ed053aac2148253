//! Tolk: fast, embeddable neural machine translation inference.
//!
//! The crate is organized by layer of the architecture:
//! - [`format`](mod@format): readers for model files (CTranslate2 directories, Marian
//!   packages), on disk or in memory;
//! - [`model`]: immutable layers built from weights (Transformer encoder and decoder);
//! - [`backend`]: the compute-backend interface and its implementations (CPU kernels per
//!   ISA; CUDA, found at run time);
//! - [`decode`]: greedy and beam search;
//! - [`translator`]: batching, options and results;
//! - [`text`]: SentencePiece, a package's tokenizers, sentence splitting, text translation;
//! - `capi`: the C ABI (`include/tolk.h`).
//!
//! ```no_run
//! use tolk::{Model, TextOptions, TranslateOptions, Translator, TranslatorConfig};
//! let model = Model::load("models/zh-en-ct2").unwrap(); // finds sentencepiece.model too
//! let translator = Translator::with_config(&model, &TranslatorConfig::default()).unwrap();
//! let texts = ["你好。\n我爱你。"];
//! let out = translator.translate_text(&texts, &TranslateOptions::default(), &TextOptions::default()).unwrap();
//! println!("{}", out[0].text);
//! // Or tokens in, tokens out, as CTranslate2's translate_batch:
//! let source = vec![vec!["▁你好".to_string()]];
//! let results = translator.translate_batch(&source, None, &TranslateOptions::default()).unwrap();
//! println!("{:?}", results[0].hypotheses[0]);
//! // Or a file of any size, line by line, with bounded memory ("-": standard streams):
//! let stream = tolk::StreamOptions::default();
//! translator.translate_file("in.zh".as_ref(), "out.en".as_ref(), &TranslateOptions::default(),
//!     &TextOptions::default(), &stream, &mut |done, total| { eprintln!("{done}/{total}"); true }).unwrap();
//! ```
pub mod backend;
mod capi;
pub mod decode;
pub mod error;
mod scoped;
mod strings;
pub mod format;
pub mod model;
pub mod tensor;
pub mod text;
pub mod translator;

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use backend::{ComputeType, Device, DeviceRequest, KvCacheType};
use backend::SavedPrecision;
use format::files::{MemoryFiles, PackageFiles};
use format::package::ModelPackage;
pub use error::{Error, ErrorKind, Result};
pub use text::{SplitMode, StreamOptions, TextOptions, TextTokenCallback, TextTokenEvent, TextTranslation, Tokenizer, TokenizerFiles};
pub use translator::{BatchType, CompletionCallback, Job, TokenCallback, TokenEvent, TranslateOptions, TranslationResult};

/// A loaded model: immutable and cheap to clone (shared by reference counting).
#[derive(Clone)]
pub struct Model {
    inner: Arc<dyn model::TranslationModel>,
    package: Arc<Package>,
    device: Device,
}

/// The model package around the weights: its files and its tokenizer (or why there is
/// none). Shared by a model and its translators, which may outlive the model's weights.
struct Package {
    /// What was detected, for translators that load the weights again (another compute
    /// type or device); a package in memory holds its files here.
    source: ModelPackage,
    /// Where the package is, for messages.
    location: String,
    tokenizer: Option<Tokenizer>,
    /// Why the package's tokenizer did not load, if it did not.
    tokenizer_problem: Option<String>,
}

impl Package {
    /// The tokenizer text translation needs, or an error saying why there is none.
    fn text_tokenizer(&self) -> Result<&Tokenizer> {
        self.tokenizer.as_ref().ok_or_else(|| {
            Error::unsupported(match &self.tokenizer_problem {
                Some(problem) => format!("text translation needs the package's SentencePiece model, which did not load: {problem}"),
                None => format!(
                    "text translation needs a SentencePiece model and none was found for {} (looked for {}): name one \
                     in the load options, or translate tokens",
                    self.location,
                    TokenizerFiles::SEARCHED
                ),
            })
        })
    }
}

/// Hands the memory the allocator keeps for reuse back to the operating system (glibc:
/// `malloc_trim`, every arena; elsewhere nothing). Freeing a model leaves its pages in the
/// allocator's arenas, those of the worker threads included, so a process that loads and
/// frees models one after another would keep the largest set it ever held; the C API calls
/// this in `tolk_model_free` and `tolk_translator_free`, and every model load at its end.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free pages of the allocator to the system.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Settings of [`Model::load_with_options`].
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    pub compute_type: ComputeType,
    /// Where the model runs: `Auto` (a usable CUDA GPU, else the CPU), `Cpu` or `Cuda`.
    pub device: DeviceRequest,
    /// Which GPU (0 = the first).
    pub device_index: usize,
    /// SentencePiece model of the source side; `None` = the package's
    /// ([`TokenizerFiles::find`]). With [`Model::load_from_memory`], the name of one of the
    /// files given.
    pub source_tokenizer: Option<PathBuf>,
    /// SentencePiece model of the target side; `None` = the package's, else the source one
    /// when it covers the target vocabulary, else the generic piece rules. With
    /// [`Model::load_from_memory`], the name of one of the files given.
    pub target_tokenizer: Option<PathBuf>,
}

impl Model {
    /// Loads a CTranslate2 model directory (`model.bin`, `config.json`, vocabularies) with
    /// the weights as saved ([`ComputeType::Default`]) and the package's tokenizer.
    pub fn load(path: impl AsRef<Path>) -> Result<Model> {
        Model::load_with(path, ComputeType::Default)
    }

    /// Loads a model with its weights converted for `compute_type` (quantized or
    /// dequantized at load, as CTranslate2 does).
    pub fn load_with(path: impl AsRef<Path>, compute_type: ComputeType) -> Result<Model> {
        Model::load_with_options(path, &LoadOptions { compute_type, ..LoadOptions::default() })
    }

    /// Loads a model with its weights converted for `options.compute_type` and the
    /// tokenizers named in `options` or found in the package.
    pub fn load_with_options(path: impl AsRef<Path>, options: &LoadOptions) -> Result<Model> {
        Model::load_package(&PackageFiles::Disk, path.as_ref(), options)
    }

    /// Loads a model from files in memory, each named as in the package's directory:
    /// `model.bin`, `config.json`, `shared_vocabulary.json`, `sentencepiece.model` for
    /// CTranslate2; the model `.bin`/`.npz`, vocabularies, shortlist and YAML under the
    /// names the YAML gives them for Marian. The package is found among the names as in a
    /// directory, and `options.source_tokenizer`/`target_tokenizer` name files among them.
    ///
    /// The bytes are copied during the call: the caller may free its buffers as soon as it
    /// returns. Memory: the model keeps that one copy (the files' total size, besides the
    /// built weights) for as long as it or a translator made from it lives, so that a
    /// translator asking for another compute type or device ([`Translator::with_config`])
    /// loads the weights again from it, as from a directory; float32 weights of a
    /// CTranslate2 model are used in place from it, as from a mapped file. (A directory's
    /// files are mapped instead: the system drops their pages after loading and reads them
    /// again when needed.)
    ///
    /// Errors besides the loaders': no files, a name that is empty, absolute or holds
    /// `..`, a name given twice, an empty file ([`ErrorKind::InvalidArgument`]).
    pub fn load_from_memory<N: AsRef<str>, B: AsRef<[u8]>>(files: &[(N, B)], options: &LoadOptions) -> Result<Model> {
        if files.is_empty() {
            return Err(Error::invalid_argument("no model files given"));
        }
        let files = PackageFiles::Memory(Arc::new(MemoryFiles::copy_of(files)?));
        Model::load_package(&files, Path::new(""), options)
    }

    /// Loads the package at `path` of `files` (in memory: the root, the empty path).
    fn load_package(files: &PackageFiles, path: &Path, options: &LoadOptions) -> Result<Model> {
        let package = ModelPackage::detect_in(files, path)?;
        let device = Device::select(options.device, options.device_index, options.compute_type)?;
        let inner = load_family(&package, options.compute_type, &device)?;
        // Named files override what the package has, side by side; a package file that
        // does not load leaves the model without a tokenizer (token translation still works)
        // and the reason for translate_text's error.
        let found = match &package {
            ModelPackage::Marian(m) => {
                let spm = |p: &Path| p.extension().is_some_and(|e| e == "spm").then(|| p.to_path_buf());
                let (source, target) = m.vocabulary_files();
                TokenizerFiles { source: spm(source), target: spm(target) }
            }
            ModelPackage::Ct2 { .. } => TokenizerFiles::find_among(files, path),
        };
        let named = options.source_tokenizer.is_some() || options.target_tokenizer.is_some();
        let tokenizer_files = TokenizerFiles {
            source: options.source_tokenizer.clone().or(found.source),
            target: options.target_tokenizer.clone().or(found.target),
        };
        let vocabulary = inner.target_vocabulary();
        let (tokenizer, tokenizer_problem) =
            match Tokenizer::load_from(files, &tokenizer_files, (0..vocabulary.len() as u32).map(|id| vocabulary.token(id))) {
                Ok(t) => (t, None),
                Err(e) if named => return Err(e),
                Err(e) => (None, Some(e.message)),
            };
        let location = files.describe(path);
        let package = Package { source: package, location, tokenizer, tokenizer_problem };
        // Loading frees a few times the SentencePiece model's size in small allocations
        // (its parsed protobuf, the trie's build) between the weights' pages: hand them back.
        release_free_memory();
        Ok(Model { inner, package: Arc::new(package), device })
    }

    /// The tokenizer found in (or given for) the package, if any: needed for text translation.
    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.package.tokenizer.as_ref()
    }

    /// The compute type the weights were loaded for (never `Default` or `Auto`).
    pub fn compute_type(&self) -> ComputeType {
        self.inner.compute_type()
    }

    /// The device the model's weights live on and its translations run on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The model behind the family-neutral interface (vocabularies, special tokens, ...).
    pub fn translation_model(&self) -> &dyn model::TranslationModel {
        self.inner.as_ref()
    }
}

/// Loads a model of the family its files say it is, on `device`.
fn load_family(package: &ModelPackage, compute_type: ComputeType, device: &Device) -> Result<Arc<dyn model::TranslationModel>> {
    match device {
        // float16 is refused here with the reason, before anything is read.
        Device::Cpu if compute_type == ComputeType::Float16 => Err(compute_type.resolve_on(device, SavedPrecision::Float).unwrap_err()),
        Device::Cpu => load_on(package, &backend::cpu::CpuBackend, compute_type),
        Device::Cuda(info) => {
            // Whatever the weights are saved as: the CUDA backend computes in float32 or float16.
            let compute_type = compute_type.resolve_on(device, SavedPrecision::Float)?;
            load_on(package, &backend::cuda::CudaBackend::new(info.index)?, compute_type)
        }
    }
}

/// Loads a model of the family its files say it is, its layers held by `backend`.
fn load_on<B: backend::Backend>(package: &ModelPackage, backend: &B, compute_type: ComputeType) -> Result<Arc<dyn model::TranslationModel>> {
    Ok(match package {
        ModelPackage::Ct2 { files, dir } => Arc::new(model::TransformerModel::load(files, dir, backend, compute_type)?),
        ModelPackage::Marian(m) => {
            let (source, target) = m.vocabulary_files();
            let source_vocabulary = marian_vocabulary(&m.files, source)?;
            let target_vocabulary =
                if source == target { source_vocabulary.clone() } else { marian_vocabulary(&m.files, target)? };
            Arc::new(model::marian::MarianModel::load(m, backend, compute_type, source_vocabulary, target_vocabulary)?)
        }
    })
}

/// A Marian vocabulary: a SentencePiece model's pieces by id, or a YAML map `token: id`.
fn marian_vocabulary(files: &PackageFiles, path: &Path) -> Result<format::ct2::Vocabulary> {
    let is_yaml = path.extension().is_some_and(|e| e == "yml" || e == "yaml");
    let tokens = if is_yaml {
        let text = files.read_text(path)?;
        let yaml = format::marian::yaml::parse(&text).map_err(|e| Error::invalid_model(format!("{}: {}", path.display(), e.message)))?;
        let entries = yaml.as_map().ok_or_else(|| Error::invalid_model(format!("{}: expected a map of tokens to ids", path.display())))?;
        let mut tokens = vec![None; entries.len()];
        for (token, id) in entries {
            let id = id.as_i64().filter(|&i| i >= 0 && (i as usize) < entries.len()).ok_or_else(|| {
                Error::invalid_model(format!("{}: token {token:?} has no id in 0..{}", path.display(), entries.len()))
            })?;
            tokens[id as usize] = Some(token.clone());
        }
        tokens
            .into_iter()
            .enumerate()
            .map(|(i, t)| t.ok_or_else(|| Error::invalid_model(format!("{}: no token has id {i}", path.display()))))
            .collect::<Result<Vec<_>>>()?
    } else {
        let spm = text::SentencePiece::from_bytes(&files.read(path)?)
            .map_err(|e| Error::new(e.kind, format!("the vocabulary {}: {}", path.display(), e.message)))?;
        (0..spm.len() as u32).map(|id| spm.id_to_piece(id).unwrap_or_default().to_string()).collect()
    };
    format::ct2::Vocabulary::new(tokens, "<unk>").map_err(|e| Error::invalid_model(format!("{}: {}", path.display(), e.message)))
}

/// Settings of a translator.
#[derive(Debug, Clone)]
pub struct TranslatorConfig {
    /// Where the translator runs; `None` = the model's device. Another device loads the
    /// weights again there.
    pub device: Option<DeviceRequest>,
    /// Which GPU with `device` (`None` = the model's, else 0).
    pub device_index: Option<usize>,
    pub compute_type: ComputeType,
    /// Batches translated at once, each by its own worker sharing the model's weights
    /// (CTranslate2's `inter_threads`); 0 or 1 = one.
    pub inter_threads: usize,
    /// Threads each worker uses inside one batch (matrix products); 0 or 1 = one.
    pub intra_threads: usize,
    /// How decoding keeps attention keys/values unless a call's options say otherwise
    /// (the `kv_cache_type` of [`Translator::default_options`]).
    pub kv_cache_type: KvCacheType,
}

impl Default for TranslatorConfig {
    fn default() -> Self {
        TranslatorConfig {
            device: None,
            device_index: None,
            compute_type: ComputeType::Default,
            inter_threads: 1,
            intra_threads: 1,
            kv_cache_type: KvCacheType::Float32,
        }
    }
}

/// What a submitted token translation reports while it runs.
#[derive(Default)]
pub struct BatchHooks {
    /// Each generated token (greedy search only), on a worker thread.
    pub on_token: Option<TokenCallback>,
    /// Called once when the job ends, on the worker that ends it.
    pub on_complete: Option<CompletionCallback>,
}

/// What a submitted text translation reports while it runs.
#[derive(Default)]
pub struct TextHooks {
    /// Each generated token with the sentence's translation so far (greedy search only),
    /// on a worker thread.
    pub on_token: Option<TextTokenCallback>,
    /// Called once when the job ends, on the worker that ends it.
    pub on_complete: Option<CompletionCallback>,
}

/// Translates batches with one model; see [`translator::Translator`].
pub struct Translator {
    inner: translator::Translator,
    package: Arc<Package>,
}

impl Translator {
    pub fn with_config(model: &Model, config: &TranslatorConfig) -> Result<Translator> {
        let model_index = match &model.device {
            Device::Cuda(info) => info.index,
            Device::Cpu => 0,
        };
        let device = match config.device {
            None => model.device.clone(),
            Some(request) => Device::select(request, config.device_index.unwrap_or(model_index), config.compute_type)?,
        };
        // A compute type or device other than the model's loads the weights again, converted
        // ("default" keeps the model's type on its device and lets another device choose).
        let same_device = device.same_as(&model.device);
        let resolved = config.compute_type.resolve_on(&device, model.inner.saved_precision())?;
        let weights = if same_device && (config.compute_type == ComputeType::Default || resolved == model.compute_type()) {
            Arc::clone(&model.inner)
        } else {
            load_family(&model.package.source, resolved, &device)?
        };
        Ok(Translator {
            inner: translator::Translator::new(weights, config.inter_threads, config.intra_threads)?.with_kv_cache_type(config.kv_cache_type),
            package: Arc::clone(&model.package),
        })
    }

    pub fn translate_batch(
        &self,
        source: &[Vec<String>],
        target_prefix: Option<&[Vec<String>]>,
        options: &TranslateOptions,
    ) -> Result<Vec<TranslationResult>> {
        self.inner.translate_batch(source, target_prefix, options)
    }

    /// CTranslate2's option defaults with what the model's package prescribes (a Marian
    /// package's beam size, normalization, length factor, mini-batch, `<unk>` suppression).
    pub fn default_options(&self) -> TranslateOptions {
        self.inner.default_options()
    }

    /// [`Translator::translate_batch`] with `progress(done, total)` called after each batch;
    /// returning `false` stops with an [`ErrorKind::Cancelled`] error.
    pub fn translate_batch_with_progress(
        &self,
        source: &[Vec<String>],
        target_prefix: Option<&[Vec<String>]>,
        options: &TranslateOptions,
        progress: &mut dyn FnMut(usize, usize) -> bool,
    ) -> Result<Vec<TranslationResult>> {
        self.inner.translate_batch_with_progress(source, target_prefix, options, progress)
    }

    /// Queues a translation of tokenized sentences and returns at once: wait on, poll or
    /// cancel the [`Job`]; its output is in input order. Many jobs, from many threads, may
    /// be in flight; batches run in submission order on the translator's workers.
    pub fn submit_batch(
        &self,
        source: Vec<Vec<String>>,
        target_prefix: Option<Vec<Vec<String>>>,
        options: &TranslateOptions,
        hooks: BatchHooks,
    ) -> Result<Job<Vec<TranslationResult>>> {
        self.inner.submit(source, target_prefix, options.clone(), hooks.on_token, Box::new(Ok), hooks.on_complete)
    }

    /// [`Translator::translate_batch`] with `on_token` called for each generated token
    /// (greedy search only), on the translator's workers.
    pub fn translate_batch_streaming(
        &self,
        source: &[Vec<String>],
        target_prefix: Option<&[Vec<String>]>,
        options: &TranslateOptions,
        on_token: TokenCallback,
    ) -> Result<Vec<TranslationResult>> {
        let hooks = BatchHooks { on_token: Some(on_token), on_complete: None };
        self.submit_batch(source.to_vec(), target_prefix.map(<[_]>::to_vec), options, hooks)?.wait_blocking(&mut |_, _| true)
    }

    /// Translates texts (each one independently): sentences are split, tokenized, translated
    /// in one sorted batch and detokenized; line breaks and spacing between sentences are
    /// kept. Needs the model's tokenizer ([`Model::tokenizer`]).
    pub fn translate_text<S: AsRef<str>>(
        &self,
        texts: &[S],
        options: &TranslateOptions,
        text_options: &TextOptions,
    ) -> Result<Vec<TextTranslation>> {
        self.translate_text_with_progress(texts, options, text_options, &mut |_, _| true)
    }

    /// [`Translator::translate_text`] with `progress(done, total)` called on this thread as
    /// batches end (counting sentences, and parts of wrapped ones, of all texts); returning
    /// `false` stops with an [`ErrorKind::Cancelled`] error.
    pub fn translate_text_with_progress<S: AsRef<str>>(
        &self,
        texts: &[S],
        options: &TranslateOptions,
        text_options: &TextOptions,
        progress: &mut dyn FnMut(usize, usize) -> bool,
    ) -> Result<Vec<TextTranslation>> {
        self.submit_text(texts, options, text_options, TextHooks::default())?.wait_blocking(progress)
    }

    /// [`Translator::translate_text`] with `on_token` called for each generated token with
    /// the sentence's translation so far (greedy search only), on the translator's workers.
    pub fn translate_text_streaming<S: AsRef<str>>(
        &self,
        texts: &[S],
        options: &TranslateOptions,
        text_options: &TextOptions,
        on_token: TextTokenCallback,
    ) -> Result<Vec<TextTranslation>> {
        self.submit_text(texts, options, text_options, TextHooks { on_token: Some(on_token), on_complete: None })?.wait_blocking(&mut |_, _| true)
    }

    /// Queues a text translation (see [`Translator::translate_text`]) and returns at once.
    /// Splitting and tokenization happen here; translation and detokenization on the
    /// translator's workers.
    pub fn submit_text<S: AsRef<str>>(
        &self,
        texts: &[S],
        options: &TranslateOptions,
        text_options: &TextOptions,
        hooks: TextHooks,
    ) -> Result<Job<Vec<TextTranslation>>> {
        let tokenizer = self.package.text_tokenizer()?;
        let mut prepared = text::translate::prepare_texts(&self.inner, tokenizer, texts, options, text_options)?;
        let on_token = hooks.on_token.map(|callback| {
            let model = self.inner.model();
            let end_tokens = match &options.end_tokens[..] {
                [] => vec![model.special_tokens().eos.clone()],
                tokens => tokens.to_vec(),
            };
            let package = Arc::clone(&self.package);
            let detokenize = move |pieces: &[String]| package.tokenizer.as_ref().map(|t| t.decode(pieces)).unwrap_or_default();
            text::translate::text_token_callback(prepared.slots(), end_tokens, detokenize, callback)
        });
        let sources = std::mem::take(&mut prepared.sources);
        let options = prepared.options.clone();
        let package = Arc::clone(&self.package);
        let finish = Box::new(move |results| Ok(prepared.finish(package.text_tokenizer()?, results)));
        self.inner.submit(sources, None, options, on_token, finish, hooks.on_complete)
    }

    /// Translates `input` line by line into `output` with bounded memory: chunks of
    /// `stream.read_batch_size` lines, two in flight, written in order (see
    /// [`text::stream`] for the format). `progress(lines_done, lines_total)` (total 0 while
    /// unknown) is called on this thread; returning false cancels. Returns the line count.
    pub fn translate_stream<R: std::io::BufRead, W: std::io::Write>(
        &self,
        input: R,
        output: W,
        options: &TranslateOptions,
        text_options: &TextOptions,
        stream: &StreamOptions,
        progress: &mut dyn FnMut(usize, usize) -> bool,
    ) -> Result<usize> {
        text::stream::translate_stream(self, input, output, options, text_options, stream, progress)
    }

    /// [`Translator::translate_stream`] between files (`-`: standard input or output); the
    /// progress total is counted beforehand for a regular input file, and a file output
    /// appears only once complete (see [`text::stream::translate_file`]).
    pub fn translate_file(
        &self,
        input: &Path,
        output: &Path,
        options: &TranslateOptions,
        text_options: &TextOptions,
        stream: &StreamOptions,
        progress: &mut dyn FnMut(usize, usize) -> bool,
    ) -> Result<usize> {
        text::stream::translate_file(self, input, output, options, text_options, stream, progress)
    }

    /// Number of batches this translator translates at once (its `inter_threads`).
    pub fn inter_threads(&self) -> usize {
        self.inner.inter_threads()
    }
}
