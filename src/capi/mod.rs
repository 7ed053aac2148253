//! The C ABI. Every entry point checks its pointers, catches panics, and reports failures
//! through a status code plus a thread-local message (`tolk_last_error`).
//! `include/tolk.h` is generated from this file by cbindgen (see build.rs).
use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;

use crate::error::{Error, ErrorKind};
use crate::{
    BatchHooks, BatchType, ComputeType, Device, DeviceRequest, KvCacheType, LoadOptions, Model, TranslateOptions, TranslationResult, Translator,
    TranslatorConfig,
};
use stream::{TokenSink, TolkTokenCallback};

/// Version of the C ABI described by this header; bumped on incompatible changes.
pub const TOLK_ABI_VERSION: u32 = 1;

/// `TolkTranslateOptions.max_decoding_memory_mb`: the automatic budget (half the model's
/// weights, at least 32 MB), the default.
pub const TOLK_DECODING_MEMORY_AUTO: u32 = u32::MAX;

/// Result of every fallible call.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(clippy::enum_variant_names)] // C names carry the type name.
pub enum TolkStatus {
    TolkOk = 0,
    /// A required pointer argument was NULL.
    TolkErrorNullPointer = 1,
    /// An argument or option has an invalid value.
    TolkErrorInvalidArgument = 2,
    /// A file could not be found, opened or read.
    TolkErrorIo = 3,
    /// A model file is malformed, truncated or inconsistent.
    TolkErrorInvalidModel = 4,
    /// The model or a requested feature is valid but not supported.
    TolkErrorUnsupported = 5,
    /// An index is out of range.
    TolkErrorOutOfRange = 6,
    /// An internal error (a bug): the library caught it and stays usable.
    TolkErrorInternal = 7,
    /// The progress callback returned false: the call stopped, nothing was returned.
    TolkErrorCancelled = 8,
}

/// How `max_batch_size` is counted.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(dead_code)] // Values arrive from C as integers.
pub enum TolkBatchType {
    /// Number of sentences.
    TolkBatchExamples = 0,
    /// Number of tokens (batch size x longest source, padding included).
    TolkBatchTokens = 1,
}

/// A loaded model (opaque). Immutable; may be shared by translators on any thread.
pub struct TolkModel {
    model: Model,
    /// What the model is, for tolk_model_description.
    description: CString,
    /// Where it runs, for tolk_model_device_name.
    device_name: CString,
}

/// A translator (opaque). May be used from several threads at once.
pub struct TolkTranslator {
    translator: Translator,
}

struct HypothesisC {
    _strings: Vec<CString>,
    pointers: Vec<*const c_char>,
    score: f32,
    /// Row-major `[tokens][source tokens]`, empty unless attention was returned.
    attention: Vec<f32>,
    source_length: usize,
}

/// Settings of model loading. Always start from `tolk_model_options_default()`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TolkModelOptions {
    /// sizeof(TolkModelOptions), set by the _default() function (ABI versioning).
    pub struct_size: u32,
    /// What the weights are converted to at load: "default" (as saved, NULL; float32 on a
    /// GPU), "auto" (int8 where the CPU has integer SIMD), "float32", "int8" (=
    /// "int8_float32"), "int16" (CPU), "float16" (GPU only: half-precision weights and
    /// products).
    pub compute_type: *const c_char,
    /// Path of the source SentencePiece model for text translation; NULL = the package's: in
    /// the model directory (or its parent for Argos packages) source.spm + target.spm,
    /// srcvocab.*.spm + trgvocab.*.spm, sentencepiece.model, spm.model,
    /// sentencepiece.bpe.model or vocab.*.spm. A package file that does not load leaves the
    /// model without a tokenizer (text calls then say why); a named file that does not load
    /// fails the load.
    pub source_tokenizer: *const c_char,
    /// Path of the target SentencePiece model; NULL = the package's, else the source one when
    /// it knows the target vocabulary, else target pieces are joined by SentencePiece's
    /// generic rules.
    pub target_tokenizer: *const c_char,
    /// Where the model runs: "auto" (NULL: a usable CUDA GPU, else the CPU), "cpu" or
    /// "cuda" (an error when no GPU is usable, saying why). tolk_model_device() tells
    /// which was chosen.
    pub device: *const c_char,
    /// Which GPU (0 = the first).
    pub device_index: u32,
}

/// The result of a batch translation (opaque, immutable).
pub struct TolkResult {
    examples: Vec<Vec<HypothesisC>>,
}

/// Settings of a translator. Always start from `tolk_translator_options_default()`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TolkTranslatorOptions {
    /// sizeof(TolkTranslatorOptions), set by the _default() function (ABI versioning).
    pub struct_size: u32,
    /// "auto", "cpu" or "cuda"; NULL = the model's device. Another device than the
    /// model's loads a copy of the weights there.
    pub device: *const c_char,
    /// "default" (the model's, NULL), "auto", "float32", "int8" (= "int8_float32"),
    /// "int16" or (GPU) "float16". A type other than the model's loads a converted copy of the weights: to
    /// save memory, load the model with that type (tolk_model_load_with_options).
    pub compute_type: *const c_char,
    /// Threads used inside one translation (0 = 1).
    pub intra_threads: u32,
    /// Which GPU with `device` "cuda" or "auto" (0 = the first).
    pub device_index: u32,
    /// Batches translated at once, each by a worker with its own decoding state sharing
    /// the model's weights (CTranslate2's inter_threads; 0 = 1). Calls from any thread
    /// queue their batches for these workers.
    pub inter_threads: u32,
    /// How this translator's calls keep attention keys/values unless their
    /// TolkTranslateOptions.kv_cache_type says otherwise: "float32" (NULL), "bfloat16" or
    /// "int8" (see TolkTranslateOptions.kv_cache_type).
    pub kv_cache_type: *const c_char,
}

/// Options of one translation call; defaults are CTranslate2's translate_batch defaults.
/// Always start from `tolk_translate_options_default()`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TolkTranslateOptions {
    /// sizeof(TolkTranslateOptions), set by the _default() function (ABI versioning).
    pub struct_size: u32,
    /// Beam size; 1 = greedy search (default 2).
    pub beam_size: u32,
    /// Beam search stops after beam_size * patience finished hypotheses (default 1).
    pub patience: f32,
    /// Scores are divided by length^length_penalty (default 1).
    pub length_penalty: f32,
    /// Number of hypotheses returned per sentence (default 1).
    pub num_hypotheses: u32,
    /// Return the score (normalized log-probability) of each hypothesis (default false).
    pub return_scores: bool,
    /// Sources are truncated to this many tokens, special tokens included; 0 = no limit (default 1024).
    pub max_input_length: u32,
    /// Maximum number of generated tokens, target prefix included (default 256).
    pub max_decoding_length: u32,
    /// Minimum number of generated tokens before the end token is allowed (default 1).
    pub min_decoding_length: u32,
    /// Token that ends a hypothesis; NULL = the model's end-of-sentence token (unless
    /// end_tokens names some).
    pub end_token: *const c_char,
    /// Never generate the unknown token (default false).
    pub disable_unk: bool,
    /// Sentences are sorted by length and translated in batches of at most this size; 0 = one batch.
    pub max_batch_size: u32,
    /// Unit of max_batch_size: a TolkBatchType value (default TOLK_BATCH_EXAMPLES).
    pub batch_type: u32,
    /// Called on the calling thread after each batch with the number of sentences done and
    /// their total (text calls count sentences, and parts of wrapped ones); returning false
    /// stops the call with TOLK_ERROR_CANCELLED. NULL = none.
    pub progress: TolkProgressCallback,
    /// Passed as is to `progress`.
    pub progress_user_data: *mut c_void,
    /// Decoding stops at this factor times the batch's longest source (Marian's
    /// max-length-factor); 0 = no such bound (default 0; a Marian package's own value in
    /// tolk_translator_translate_options).
    pub max_length_factor: f32,
    /// Restrict the output layer to the model's lexical shortlist when it has one
    /// (default true).
    pub use_shortlist: bool,
    /// Called for each generated token (greedy search only: beam_size 1), from the
    /// translator's worker threads (concurrently when inter_threads > 1); returning false
    /// ends that sentence's translation at this token. NULL = none.
    pub on_token: TolkTokenCallback,
    /// Passed as is to `on_token`.
    pub on_token_user_data: *mut c_void,
    /// Restrict the output layer to the candidates of the model's vocabulary map
    /// (CTranslate2's vmap.txt in the model directory) when it has one: the targets of the
    /// batch's source n-grams, the map's always-candidates, the special tokens, the decoder
    /// start token and target prefixes (default false, as in CTranslate2).
    pub use_vmap: bool,
    /// How decoding keeps the attention keys and values, most of its memory: "float32"
    /// (NULL: exactly CTranslate2's results), "bfloat16" (half the memory) or "int8" (about
    /// a quarter); the compact types round them, which changes the last bits of results
    /// and sometimes a word. Not a CTranslate2 option.
    pub kv_cache_type: *const c_char,
    /// Where a call's batches are decoded together (greedy search, several batches): the
    /// decoding state (attention keys and values) planned for, in MB. Sentences wait to
    /// start until theirs fits and a batch may start in parts: a lower peak memory for
    /// fewer rows a step, the same results. TOLK_DECODING_MEMORY_AUTO (the default): half
    /// the model's weights, at least 32 MB; 0 = no bound. Not a CTranslate2 option.
    pub max_decoding_memory_mb: u32,
    /// Penalty on the tokens a hypothesis already holds, its target prefix included
    /// (CTranslate2's repetition_penalty): their logits are divided by it where
    /// non-negative and multiplied where negative, so values above 1 discourage repeats;
    /// must be > 0 (default 1: off).
    pub repetition_penalty: f32,
    /// Hypotheses never repeat an n-gram of this size (CTranslate2's
    /// no_repeat_ngram_size; default 0: off).
    pub no_repeat_ngram_size: u32,
    /// Keep each hypothesis's alignment attention over the source tokens, read with
    /// tolk_result_attention (CTranslate2's return_attention; default false). CPU only.
    pub return_attention: bool,
    /// Replace each generated unknown token by the source token it attends to most
    /// (CTranslate2's replace_unknowns; default false). CPU only.
    pub replace_unknowns: bool,
    /// Token sequences no hypothesis may contain (CTranslate2's suppress_sequences):
    /// `num_suppress_sequences` arrays, `suppress_sequences[i]` of
    /// `suppress_sequence_lengths[i]` target tokens (NULL and 0: none). A single token is
    /// never generated, a longer sequence's last token not after the others; a token
    /// outside the target vocabulary is an error (but the unknown token itself).
    pub suppress_sequences: *const *const *const c_char,
    pub suppress_sequence_lengths: *const usize,
    pub num_suppress_sequences: usize,
    /// Keep the end token at the end of the hypotheses that produced it (CTranslate2's
    /// return_end_token; default false; text results never show it).
    pub return_end_token: bool,
    /// CTranslate2's random sampling (beam_size 1 and num_hypotheses 1 only): the next
    /// token is drawn among the sampling_topk best (0 = all; default 1 = the arg-max, no
    /// sampling) from their softmax at sampling_temperature (default 1; 0 = the arg-max),
    /// cut to the most probable whose probabilities sum to sampling_topp (default 1).
    pub sampling_topk: u32,
    pub sampling_topp: f32,
    pub sampling_temperature: f32,
    /// Seed of the sampling: the same seed gives the same samples however many threads
    /// the call runs on (another batching can change the logits in their last bits, and
    /// with them a draw); 0 (default) = a new seed each call.
    pub sampling_seed: u64,
    /// More tokens that end a hypothesis, any of them, beside end_token (CTranslate2's
    /// end_token list): num_end_tokens NUL-terminated strings (NULL and 0: none). With
    /// neither, the model's end-of-sentence token ends hypotheses.
    pub end_tokens: *const *const c_char,
    pub num_end_tokens: usize,
}

/// See TolkTranslateOptions.progress: `done` of `total` sentences are translated; return
/// false to stop.
pub type TolkProgressCallback = Option<unsafe extern "C" fn(user_data: *mut c_void, done: usize, total: usize) -> bool>;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(message: &str) {
    let c = CString::new(message.replace('\0', " ")).unwrap_or_default();
    // Gone while the thread exits (a C destructor calling in): the message is dropped.
    let _ = LAST_ERROR.try_with(|e| *e.borrow_mut() = c);
}

fn status_of(kind: ErrorKind) -> TolkStatus {
    match kind {
        ErrorKind::Io => TolkStatus::TolkErrorIo,
        ErrorKind::InvalidModel => TolkStatus::TolkErrorInvalidModel,
        ErrorKind::Unsupported => TolkStatus::TolkErrorUnsupported,
        ErrorKind::InvalidArgument => TolkStatus::TolkErrorInvalidArgument,
        ErrorKind::OutOfRange => TolkStatus::TolkErrorOutOfRange,
        ErrorKind::Internal => TolkStatus::TolkErrorInternal,
        ErrorKind::Cancelled => TolkStatus::TolkErrorCancelled,
    }
}

/// An error that maps to `TolkErrorNullPointer`.
struct NullPointer(&'static str);

enum Failure {
    Null(NullPointer),
    Tolk(Error),
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure::Tolk(e)
    }
}

impl From<NullPointer> for Failure {
    fn from(e: NullPointer) -> Self {
        Failure::Null(e)
    }
}

/// Runs `body`, converting errors and panics into a status and a last-error message.
fn guard(function: &str, body: impl FnOnce() -> Result<(), Failure>) -> TolkStatus {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => TolkStatus::TolkOk,
        Ok(Err(Failure::Null(NullPointer(arg)))) => {
            set_last_error(&format!("{function}: argument `{arg}` is NULL"));
            TolkStatus::TolkErrorNullPointer
        }
        Ok(Err(Failure::Tolk(e))) => {
            set_last_error(&format!("{function}: {}", e.message));
            status_of(e.kind)
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            set_last_error(&format!("{function}: internal error: {what}"));
            TolkStatus::TolkErrorInternal
        }
    }
}

fn non_null<T>(p: *const T, name: &'static str) -> Result<*const T, NullPointer> {
    if p.is_null() {
        Err(NullPointer(name))
    } else {
        Ok(p)
    }
}

/// Reads a NUL-terminated UTF-8 string; NULL gives `None`.
unsafe fn opt_str<'a>(p: *const c_char, what: &str) -> Result<Option<&'a str>, Error> {
    if p.is_null() {
        return Ok(None);
    }
    CStr::from_ptr(p)
        .to_str()
        .map(Some)
        .map_err(|_| Error::invalid_argument(format!("{what} is not valid UTF-8")))
}

/// A C path: on Unix any bytes but NUL, as the file system takes them (a name need not be
/// UTF-8).
///
/// # Safety
/// `p` must be a NUL-terminated string.
unsafe fn c_path(p: *const c_char) -> std::path::PathBuf {
    let bytes = CStr::from_ptr(p).to_bytes();
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        std::path::PathBuf::from(std::ffi::OsStr::from_bytes(bytes))
    }
    #[cfg(not(unix))]
    {
        std::path::PathBuf::from(String::from_utf8_lossy(bytes).into_owned())
    }
}

/// An options struct versioned by its leading `struct_size`: its fields, which a caller's
/// smaller, older struct may end between. A field added later must start at or past the
/// older struct's size: its tail padding holds whatever the caller's memory held.
trait Versioned: Copy {
    fn fields() -> Vec<Field>;
}

/// One field of a [`Versioned`] struct.
struct Field {
    offset: usize,
    size: usize,
    /// A `bool`: read as C reads one (a byte other than 0 is true).
    is_bool: bool,
}

macro_rules! versioned {
    ($t:ty { $($field:ident),* }) => {
        impl $crate::capi::Versioned for $t {
            fn fields() -> Vec<$crate::capi::Field> {
                fn field<T, F: 'static>(offset: usize, _: fn(&T) -> &F) -> $crate::capi::Field {
                    let is_bool = std::any::TypeId::of::<F>() == std::any::TypeId::of::<bool>();
                    $crate::capi::Field { offset, size: std::mem::size_of::<F>(), is_bool }
                }
                vec![$(field(std::mem::offset_of!($t, $field), |s: &$t| &s.$field)),*]
            }
        }
    };
}

pub(crate) use versioned;

versioned!(TolkModelOptions { struct_size, compute_type, source_tokenizer, target_tokenizer, device, device_index });
versioned!(TolkTranslatorOptions { struct_size, device, compute_type, intra_threads, device_index, inter_threads, kv_cache_type });
versioned!(TolkTranslateOptions {
    struct_size, beam_size, patience, length_penalty, num_hypotheses, return_scores, max_input_length,
    max_decoding_length, min_decoding_length, end_token, disable_unk, max_batch_size, batch_type, progress,
    progress_user_data, max_length_factor, use_shortlist, on_token, on_token_user_data, use_vmap, kv_cache_type,
    max_decoding_memory_mb, repetition_penalty, no_repeat_ngram_size, return_attention, replace_unknowns, suppress_sequences,
    suppress_sequence_lengths, num_suppress_sequences, return_end_token, sampling_topk, sampling_topp, sampling_temperature, sampling_seed,
    end_tokens, num_end_tokens
});

/// Checks a versioned struct's `struct_size`: at least the size field, at most the full
/// struct, and not ending inside a field (no version of the struct has such a size).
/// A larger size (a newer caller) is accepted only for structs the library writes.
fn check_struct_size<T: Versioned>(struct_size: u32, written_by_library: bool) -> Result<usize, Error> {
    let size = struct_size as usize;
    let full = std::mem::size_of::<T>();
    let splits_a_field = T::fields().iter().any(|f| f.offset < size && size < f.offset + f.size);
    if size < std::mem::size_of::<u32>() || (size > full && !written_by_library) || splits_a_field {
        return Err(Error::invalid_argument(format!(
            "struct_size is {size}, expected {full}: initialize the struct with its *_default() function"
        )));
    }
    Ok(size.min(full))
}

/// Copies a caller's options struct over the defaults, honouring its `struct_size` so that
/// programs built against an older (smaller) header keep working.
unsafe fn read_versioned<T: Versioned>(p: *const T, defaults: T, struct_size: u32) -> Result<T, Error> {
    let size = check_struct_size::<T>(struct_size, false)?;
    let mut out = std::mem::MaybeUninit::new(defaults);
    let bytes = out.as_mut_ptr() as *mut u8;
    ptr::copy_nonoverlapping(p as *const u8, bytes, size);
    // A C bool holding another byte than 0 or 1 (memset, a cast) is no Rust bool: made one
    // before the struct is read as a T.
    for field in T::fields().iter().filter(|f| f.is_bool && f.offset < size) {
        let b = bytes.add(field.offset);
        *b = (*b != 0) as u8;
    }
    Ok(out.assume_init())
}

/// Writes `value` into a caller's struct as far as its `struct_size` (read from the
/// caller's struct) reaches: an older caller gets the fields it knows, a newer one those the
/// library knows (the rest of its struct is left as it was).
unsafe fn write_versioned<T: Versioned>(p: *mut T, value: T, struct_size: u32) -> Result<(), Error> {
    let size = check_struct_size::<T>(struct_size, true)?;
    // The caller's struct_size stays as the caller set it.
    let skip = std::mem::size_of::<u32>();
    ptr::copy_nonoverlapping((&value as *const T as *const u8).add(skip), (p as *mut u8).add(skip), size - skip);
    Ok(())
}

/// The library version, e.g. "0.1.0" (static string).
#[no_mangle]
pub extern "C" fn tolk_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr() as *const c_char
}

/// The ABI version of the library; compare with TOLK_ABI_VERSION.
#[no_mangle]
pub extern "C" fn tolk_abi_version() -> u32 {
    TOLK_ABI_VERSION
}

/// The CPU kernel path in use: "scalar", "avx2", "avxvnni", "avx512bw", "avx512vnni" or
/// "amx" (chosen by CPUID, or forced lower with the environment variable TOLK_CPU_ISA).
/// Static string.
#[no_mangle]
pub extern "C" fn tolk_cpu_isa() -> *const c_char {
    use crate::backend::cpu::isa::{current, Isa};
    match current() {
        Isa::Scalar => c"scalar".as_ptr(),
        Isa::Avx2 => c"avx2".as_ptr(),
        Isa::AvxVnni => c"avxvnni".as_ptr(),
        Isa::Avx512Bw => c"avx512bw".as_ptr(),
        Isa::Avx512Vnni => c"avx512vnni".as_ptr(),
        Isa::Amx => c"amx".as_ptr(),
    }
}

/// Message of the most recent failed call on this thread ("" if none). The pointer stays
/// valid until the next failing tolk_ call on the same thread.
#[no_mangle]
pub extern "C" fn tolk_last_error() -> *const c_char {
    LAST_ERROR
        .try_with(|e| e.borrow().as_ptr())
        .unwrap_or(c"the thread's last error is gone: the thread is exiting".as_ptr())
}

/// A static description of a status code (a TolkStatus value; any other integer gets
/// "unknown status", so a value read from elsewhere is safe to pass).
#[no_mangle]
pub extern "C" fn tolk_status_string(status: c_int) -> *const c_char {
    const NAMES: [(TolkStatus, &CStr); 9] = [
        (TolkStatus::TolkOk, c"ok"),
        (TolkStatus::TolkErrorNullPointer, c"null pointer"),
        (TolkStatus::TolkErrorInvalidArgument, c"invalid argument"),
        (TolkStatus::TolkErrorIo, c"I/O error"),
        (TolkStatus::TolkErrorInvalidModel, c"invalid model"),
        (TolkStatus::TolkErrorUnsupported, c"unsupported"),
        (TolkStatus::TolkErrorOutOfRange, c"out of range"),
        (TolkStatus::TolkErrorInternal, c"internal error"),
        (TolkStatus::TolkErrorCancelled, c"cancelled"),
    ];
    NAMES.iter().find(|(s, _)| *s as c_int == status).map_or(c"unknown status", |(_, name)| name).as_ptr()
}

/// Loads a CTranslate2 model directory with its weights as saved (compute type
/// "default"). On success `*out_model` receives a model to release with tolk_model_free.
/// Paths are bytes as the file system takes them (on Unix a name need not be UTF-8).
///
/// # Safety
/// `path` must be NULL or a NUL-terminated string; `out_model` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn tolk_model_load(path: *const c_char, out_model: *mut *mut TolkModel) -> TolkStatus {
    load_model("tolk_model_load", path, ptr::null(), out_model)
}

/// Default model loading settings (compute type "default").
#[no_mangle]
pub extern "C" fn tolk_model_options_default() -> TolkModelOptions {
    TolkModelOptions {
        struct_size: std::mem::size_of::<TolkModelOptions>() as u32,
        compute_type: ptr::null(),
        source_tokenizer: ptr::null(),
        target_tokenizer: ptr::null(),
        device: ptr::null(),
        device_index: 0,
    }
}

/// Loads a model (a CTranslate2 directory, or a Marian/Bergamot package as tolk_model_load
/// finds it) with its weights converted for `options->compute_type` (quantized or
/// dequantized as CTranslate2 does). `options` may be NULL (defaults). On success
/// `*out_model` receives a model to release with tolk_model_free.
///
/// # Safety
/// `path` must be NULL or a NUL-terminated string; `options` NULL or initialized by
/// tolk_model_options_default; `out_model` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn tolk_model_load_with_options(
    path: *const c_char,
    options: *const TolkModelOptions,
    out_model: *mut *mut TolkModel,
) -> TolkStatus {
    load_model("tolk_model_load_with_options", path, options, out_model)
}

/// Both loads, `function` naming the caller's entry point in messages.
unsafe fn load_model(function: &str, path: *const c_char, options: *const TolkModelOptions, out_model: *mut *mut TolkModel) -> TolkStatus {
    guard(function, || {
        let out = non_null(out_model as *const *mut TolkModel, "out_model")? as *mut *mut TolkModel;
        *out = ptr::null_mut();
        let path = c_path(non_null(path, "path")?);
        *out = new_model(Model::load_with_options(path, &load_options(options)?)?);
        Ok(())
    })
}

/// The load settings of a caller's options (NULL = the defaults).
///
/// # Safety
/// `options` must be NULL or initialized by tolk_model_options_default.
unsafe fn load_options(options: *const TolkModelOptions) -> Result<LoadOptions, Error> {
    let defaults = tolk_model_options_default();
    let opts = if options.is_null() { defaults } else { read_versioned(options, defaults, (*options).struct_size)? };
    let path_of = |p: *const c_char| (!p.is_null()).then(|| c_path(p));
    Ok(LoadOptions {
        compute_type: ComputeType::parse(opt_str(opts.compute_type, "compute_type")?.unwrap_or("default"))?,
        source_tokenizer: path_of(opts.source_tokenizer),
        target_tokenizer: path_of(opts.target_tokenizer),
        device: DeviceRequest::parse(opt_str(opts.device, "device")?.unwrap_or("auto"))?,
        device_index: opts.device_index as usize,
    })
}

/// A loaded model handed to C (released by tolk_model_free).
fn new_model(model: Model) -> *mut TolkModel {
    let c_string = |s: String| CString::new(s.replace('\0', " ")).unwrap_or_default();
    let description = c_string(model.translation_model().description());
    let device_name = c_string(model.device().description());
    Box::into_raw(Box::new(TolkModel { model, description, device_name }))
}

/// The compute type a model's weights were loaded for: "float32", "int8_float32", "int16"
/// or (on a GPU) "float16" (static string; NULL for a NULL model).
///
/// # Safety
/// `model` must be NULL or a live model.
#[no_mangle]
pub unsafe extern "C" fn tolk_model_compute_type(model: *const TolkModel) -> *const c_char {
    if model.is_null() {
        return ptr::null();
    }
    match (*model).model.compute_type() {
        ComputeType::Int8 => c"int8_float32".as_ptr(),
        ComputeType::Int16 => c"int16".as_ptr(),
        ComputeType::Float16 => c"float16".as_ptr(),
        _ => c"float32".as_ptr(),
    }
}

/// What the model is: its family and architecture, e.g. "CTranslate2 Transformer" or
/// "Marian transformer (SSRU decoder, int8 with precomputed activation scales, lexical
/// shortlist)". Owned by the model (valid until tolk_model_free); NULL for a NULL model.
///
/// # Safety
/// `model` must be NULL or a live model.
#[no_mangle]
pub unsafe extern "C" fn tolk_model_description(model: *const TolkModel) -> *const c_char {
    if model.is_null() {
        return ptr::null();
    }
    (*model).description.as_ptr()
}

/// The kind of device the model runs on: "cpu" or "cuda" (static string; NULL for a NULL
/// model). With device "auto" this says what was found.
///
/// # Safety
/// `model` must be NULL or a live model.
#[no_mangle]
pub unsafe extern "C" fn tolk_model_device(model: *const TolkModel) -> *const c_char {
    if model.is_null() {
        return ptr::null();
    }
    match (*model).model.device() {
        Device::Cpu => c"cpu".as_ptr(),
        Device::Cuda(_) => c"cuda".as_ptr(),
    }
}

/// The device the model runs on, for people: "cpu (avx2)" or "cuda:0 (NVIDIA H100 80GB
/// HBM3)". Owned by the model (valid until tolk_model_free); NULL for a NULL model.
///
/// # Safety
/// `model` must be NULL or a live model.
#[no_mangle]
pub unsafe extern "C" fn tolk_model_device_name(model: *const TolkModel) -> *const c_char {
    if model.is_null() {
        return ptr::null();
    }
    (*model).device_name.as_ptr()
}

/// Releases a model. Translators created from it stay valid (they share the model); its
/// memory is handed back to the system when the last of them is freed too.
///
/// # Safety
/// `model` must be NULL or a pointer from tolk_model_load not yet freed.
#[no_mangle]
pub unsafe extern "C" fn tolk_model_free(model: *mut TolkModel) {
    if !model.is_null() {
        let _ = catch_unwind(AssertUnwindSafe(|| {
            drop(Box::from_raw(model));
            crate::release_free_memory();
        }));
    }
}

/// Default translator settings (the model's device and compute type, 1 thread).
#[no_mangle]
pub extern "C" fn tolk_translator_options_default() -> TolkTranslatorOptions {
    TolkTranslatorOptions {
        struct_size: std::mem::size_of::<TolkTranslatorOptions>() as u32,
        device: ptr::null(),
        compute_type: ptr::null(),
        intra_threads: 0,
        device_index: 0,
        inter_threads: 0,
        kv_cache_type: ptr::null(),
    }
}

/// Creates a translator for `model`. `options` may be NULL for the defaults.
///
/// # Safety
/// `model` must be a live model; `options` NULL or initialized by the _default() function;
/// `out_translator` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn tolk_translator_new(
    model: *const TolkModel,
    options: *const TolkTranslatorOptions,
    out_translator: *mut *mut TolkTranslator,
) -> TolkStatus {
    guard("tolk_translator_new", || {
        let out = non_null(out_translator as *const *mut TolkTranslator, "out_translator")? as *mut *mut TolkTranslator;
        *out = ptr::null_mut();
        let model = &*non_null(model, "model")?;
        let defaults = tolk_translator_options_default();
        let opts = if options.is_null() { defaults } else { read_versioned(options, defaults, (*options).struct_size)? };
        let device = opt_str(opts.device, "device")?.map(DeviceRequest::parse).transpose()?;
        let compute_type = ComputeType::parse(opt_str(opts.compute_type, "compute_type")?.unwrap_or("default"))?;
        for (name, threads) in [("intra_threads", opts.intra_threads), ("inter_threads", opts.inter_threads)] {
            if threads > 1024 {
                return Err(Error::invalid_argument(format!("{name} {threads} is too large")).into());
            }
        }
        let device_index = device.map(|_| opts.device_index as usize);
        let config = TranslatorConfig {
            device,
            device_index,
            compute_type,
            inter_threads: opts.inter_threads as usize,
            intra_threads: opts.intra_threads as usize,
            kv_cache_type: KvCacheType::parse(opt_str(opts.kv_cache_type, "kv_cache_type")?.unwrap_or("float32"))?,
        };
        let translator = Translator::with_config(&model.model, &config)?;
        *out = Box::into_raw(Box::new(TolkTranslator { translator }));
        Ok(())
    })
}

/// Releases a translator. Jobs still in flight (tolk_translate_batch_async) are cancelled:
/// they end with TOLK_ERROR_CANCELLED and their handles stay valid until tolk_job_free.
/// Returns once the translator's threads have stopped (at most one decoding step).
///
/// # Safety
/// `translator` must be NULL or a pointer from tolk_translator_new not yet freed, and no
/// blocking call (tolk_translate_*) may be using it. Not from a job's callbacks.
#[no_mangle]
pub unsafe extern "C" fn tolk_translator_free(translator: *mut TolkTranslator) {
    if !translator.is_null() {
        let _ = catch_unwind(AssertUnwindSafe(|| {
            drop(Box::from_raw(translator));
            crate::release_free_memory();
        }));
    }
}

/// Default translation options (CTranslate2's translate_batch defaults). A model package
/// may prescribe others (a Marian package's beam size, length factor, ...): see
/// tolk_translator_translate_options, which translation calls use when options is NULL.
#[no_mangle]
pub extern "C" fn tolk_translate_options_default() -> TolkTranslateOptions {
    c_options(&TranslateOptions::default())
}

/// The translation options a translator uses when a call passes NULL: CTranslate2's
/// defaults with what the model's package prescribes (a Marian package's YAML: beam size,
/// normalization, max-length-factor, mini-batch, `<unk>` suppression).
///
/// # Safety
/// `translator` is NULL or a live translator; `out` is NULL or points to writable
/// options whose `struct_size` the caller set (0 = this version's size, which is then
/// stored in `struct_size`).
#[no_mangle]
pub unsafe extern "C" fn tolk_translator_translate_options(translator: *const TolkTranslator, out: *mut TolkTranslateOptions) -> TolkStatus {
    guard("tolk_translator_translate_options", || {
        let translator = &*non_null(translator, "translator")?;
        let out = non_null(out as *const TolkTranslateOptions, "out")? as *mut TolkTranslateOptions;
        let options = c_options(&translator.translator.default_options());
        // struct_size 0 (a zeroed struct) means this version's struct, and is set so that
        // the filled options can be passed to the translation calls as they are.
        if (*out).struct_size == 0 {
            (*out).struct_size = std::mem::size_of::<TolkTranslateOptions>() as u32;
        }
        write_versioned(out, options, (*out).struct_size)?;
        Ok(())
    })
}

fn c_options(d: &TranslateOptions) -> TolkTranslateOptions {
    TolkTranslateOptions {
        struct_size: std::mem::size_of::<TolkTranslateOptions>() as u32,
        beam_size: d.beam_size as u32,
        patience: d.patience,
        length_penalty: d.length_penalty,
        num_hypotheses: d.num_hypotheses as u32,
        return_scores: d.return_scores,
        max_input_length: d.max_input_length as u32,
        max_decoding_length: d.max_decoding_length as u32,
        min_decoding_length: d.min_decoding_length as u32,
        end_token: ptr::null(),
        disable_unk: d.disable_unk,
        max_batch_size: d.max_batch_size as u32,
        batch_type: match d.batch_type {
            BatchType::Examples => TolkBatchType::TolkBatchExamples as u32,
            BatchType::Tokens => TolkBatchType::TolkBatchTokens as u32,
        },
        progress: None,
        progress_user_data: ptr::null_mut(),
        max_length_factor: d.max_length_factor,
        use_shortlist: d.use_shortlist,
        on_token: None,
        on_token_user_data: ptr::null_mut(),
        use_vmap: d.use_vmap,
        kv_cache_type: ptr::null(),
        max_decoding_memory_mb: match d.max_decoding_memory_mb {
            None => TOLK_DECODING_MEMORY_AUTO,
            Some(mb) => mb.min(TOLK_DECODING_MEMORY_AUTO as usize - 1) as u32,
        },
        repetition_penalty: d.repetition_penalty,
        no_repeat_ngram_size: d.no_repeat_ngram_size.min(u32::MAX as usize) as u32,
        return_attention: d.return_attention,
        replace_unknowns: d.replace_unknowns,
        // The translator's defaults suppress nothing.
        suppress_sequences: ptr::null(),
        suppress_sequence_lengths: ptr::null(),
        num_suppress_sequences: 0,
        return_end_token: d.return_end_token,
        sampling_topk: d.sampling_topk.min(u32::MAX as usize) as u32,
        sampling_topp: d.sampling_topp,
        sampling_temperature: d.sampling_temperature,
        sampling_seed: d.sampling_seed.unwrap_or(0),
        // The translator's defaults name no end token (the model's ends hypotheses).
        end_tokens: ptr::null(),
        num_end_tokens: 0,
    }
}

/// A caller's progress callback.
struct Progress {
    callback: TolkProgressCallback,
    user_data: *mut c_void,
}

impl Progress {
    fn report(&self, done: usize, total: usize) -> bool {
        // SAFETY: the caller vouches for its callback and user data (TolkTranslateOptions).
        self.callback.is_none_or(|f| unsafe { f(self.user_data, done, total) })
    }
}

/// The options a caller passed (NULL = the translator's defaults; fields past an older
/// caller's struct_size too), converted, and its progress and token callbacks.
unsafe fn read_translate_options(
    translator: &TolkTranslator,
    options: *const TolkTranslateOptions,
) -> Result<(TranslateOptions, Progress, TokenSink), Failure> {
    let default_options = translator.translator.default_options();
    let defaults = c_options(&default_options);
    let o = if options.is_null() { defaults } else { read_versioned(options, defaults, (*options).struct_size)? };
    let progress = Progress { callback: o.progress, user_data: o.progress_user_data };
    let tokens = TokenSink { callback: o.on_token, user_data: o.on_token_user_data };
    let batch_type = match o.batch_type {
        0 => BatchType::Examples,
        1 => BatchType::Tokens,
        other => return Err(Error::invalid_argument(format!("unknown batch_type {other}")).into()),
    };
    let options = TranslateOptions {
        beam_size: o.beam_size as usize,
        patience: o.patience,
        length_penalty: o.length_penalty,
        num_hypotheses: o.num_hypotheses as usize,
        return_scores: o.return_scores,
        max_input_length: o.max_input_length as usize,
        max_decoding_length: o.max_decoding_length as usize,
        min_decoding_length: o.min_decoding_length as usize,
        end_tokens: {
            let single = opt_str(o.end_token, "end_token")?.map(str::to_string);
            single.into_iter().chain(read_tokens(o.end_tokens, o.num_end_tokens, "end_tokens")?).collect()
        },
        disable_unk: o.disable_unk,
        repetition_penalty: o.repetition_penalty,
        no_repeat_ngram_size: o.no_repeat_ngram_size as usize,
        return_attention: o.return_attention,
        replace_unknowns: o.replace_unknowns,
        suppress_sequences: read_token_batch(
            o.suppress_sequences,
            o.suppress_sequence_lengths,
            o.num_suppress_sequences,
            "suppress_sequences",
            "suppress_sequence_lengths",
        )?,
        return_end_token: o.return_end_token,
        sampling_topk: o.sampling_topk as usize,
        sampling_topp: o.sampling_topp,
        sampling_temperature: o.sampling_temperature,
        sampling_seed: (o.sampling_seed != 0).then_some(o.sampling_seed),
        max_batch_size: o.max_batch_size as usize,
        batch_type,
        max_length_factor: o.max_length_factor,
        use_shortlist: o.use_shortlist,
        use_vmap: o.use_vmap,
        join_batches: None,
        kv_cache_type: match opt_str(o.kv_cache_type, "kv_cache_type")? {
            Some(name) => KvCacheType::parse(name)?,
            None => default_options.kv_cache_type,
        },
        max_decoding_memory_mb: match o.max_decoding_memory_mb {
            TOLK_DECODING_MEMORY_AUTO => None,
            mb => Some(mb as usize),
        },
    };
    Ok((options, progress, tokens))
}

/// Entries to reserve for a caller's `count` of them: a count the caller cannot back
/// (a wrong or huge value) then fails on reading its entries, not in the allocator.
fn reserve_for(count: usize) -> usize {
    count.min(1 << 16)
}

/// Reads `count` token arrays from C.
unsafe fn read_token_batch(
    tokens: *const *const *const c_char,
    lengths: *const usize,
    count: usize,
    what: &'static str,
    lengths_name: &'static str,
) -> Result<Vec<Vec<String>>, Failure> {
    if count == 0 {
        return Ok(Vec::new());
    }
    non_null(tokens, what)?;
    non_null(lengths, lengths_name)?;
    let mut batch = Vec::with_capacity(reserve_for(count));
    for i in 0..count {
        batch.push(read_tokens(*tokens.add(i), *lengths.add(i), &format!("{what}[{i}]"))?);
    }
    Ok(batch)
}

/// Reads the `n` NUL-terminated UTF-8 tokens of the C array `array` (NULL only when `n` is
/// 0), named `name` in errors.
unsafe fn read_tokens(array: *const *const c_char, n: usize, name: &str) -> Result<Vec<String>, Failure> {
    if n > 0 && array.is_null() {
        return Err(Error::invalid_argument(format!("{name} is NULL but its length is {n}")).into());
    }
    let mut out = Vec::with_capacity(reserve_for(n));
    for j in 0..n {
        let t = *array.add(j);
        if t.is_null() {
            return Err(Error::invalid_argument(format!("{name}[{j}] is NULL")).into());
        }
        let s = CStr::from_ptr(t).to_str().map_err(|_| Error::invalid_argument(format!("{name}[{j}] is not valid UTF-8")))?;
        out.push(s.to_string());
    }
    Ok(out)
}

/// Translates a batch of tokenized sentences.
///
/// `source[i]` points to `source_lengths[i]` NUL-terminated UTF-8 tokens (it may be NULL
/// when the length is 0). `target_prefix` may be NULL; otherwise `target_prefix[i]` holds
/// `target_prefix_lengths[i]` tokens every hypothesis of sentence i starts with.
/// `options` may be NULL for the defaults. On success `*out_result` receives a result to
/// release with tolk_result_free; results are in input order.
///
/// # Safety
/// The arrays must hold at least `batch_size` entries with the stated lengths.
#[no_mangle]
pub unsafe extern "C" fn tolk_translate_batch(
    translator: *const TolkTranslator,
    source: *const *const *const c_char,
    source_lengths: *const usize,
    batch_size: usize,
    target_prefix: *const *const *const c_char,
    target_prefix_lengths: *const usize,
    options: *const TolkTranslateOptions,
    out_result: *mut *mut TolkResult,
) -> TolkStatus {
    guard("tolk_translate_batch", || {
        let out = non_null(out_result as *const *mut TolkResult, "out_result")? as *mut *mut TolkResult;
        *out = ptr::null_mut();
        let translator = &*non_null(translator, "translator")?;
        let (opts, progress, tokens) = read_translate_options(translator, options)?;
        let (source, prefix) = read_sources(source, source_lengths, batch_size, target_prefix, target_prefix_lengths)?;
        let hooks = BatchHooks { on_token: tokens.batch_callback(), on_complete: None };
        let job = translator.translator.submit_batch(source, prefix, &opts, hooks)?;
        let results = job.wait_blocking(&mut |done, total| progress.report(done, total))?;
        *out = Box::into_raw(Box::new(TolkResult::new(results)));
        Ok(())
    })
}

/// Sentences of tokens, as read from C.
type TokenBatch = Vec<Vec<String>>;

/// A batch's sources and optional target prefixes, read from C.
unsafe fn read_sources(
    source: *const *const *const c_char,
    source_lengths: *const usize,
    batch_size: usize,
    target_prefix: *const *const *const c_char,
    target_prefix_lengths: *const usize,
) -> Result<(TokenBatch, Option<TokenBatch>), Failure> {
    let source = read_token_batch(source, source_lengths, batch_size, "source", "source_lengths")?;
    let prefix = if target_prefix.is_null() {
        None
    } else {
        Some(read_token_batch(target_prefix, target_prefix_lengths, batch_size, "target_prefix", "target_prefix_lengths")?)
    };
    Ok((source, prefix))
}

impl TolkResult {
    fn new(results: Vec<TranslationResult>) -> TolkResult {
        let examples = results
            .into_iter()
            .map(|r| {
                r.hypotheses
                    .into_iter()
                    .enumerate()
                    .map(|(h, tokens)| {
                        let strings: Vec<CString> =
                            tokens.into_iter().map(|t| CString::new(t.replace('\0', "")).unwrap_or_default()).collect();
                        let pointers = strings.iter().map(|s| s.as_ptr()).collect();
                        let vectors = r.attention.get(h).map_or(&[][..], Vec::as_slice);
                        let source_length = vectors.first().map_or(0, Vec::len);
                        let attention = vectors.concat();
                        HypothesisC { _strings: strings, pointers, score: r.scores.get(h).copied().unwrap_or(f32::NAN), attention, source_length }
                    })
                    .collect()
            })
            .collect();
        TolkResult { examples }
    }
}

impl TolkResult {
    /// Hypothesis `rank` of sentence `example`, or the out-of-range error naming which.
    fn hypothesis(&self, example: usize, rank: usize) -> Result<&HypothesisC, Error> {
        let hyps = self.examples.get(example).ok_or_else(|| {
            Error::out_of_range(format!("example {example} is out of range (batch size {})", self.examples.len()))
        })?;
        hyps.get(rank).ok_or_else(|| Error::out_of_range(format!("hypothesis {rank} is out of range ({} hypotheses)", hyps.len())))
    }
}

/// Number of sentences in a result (0 for NULL).
///
/// # Safety
/// `result` must be NULL or a live result.
#[no_mangle]
pub unsafe extern "C" fn tolk_result_batch_size(result: *const TolkResult) -> usize {
    if result.is_null() {
        return 0;
    }
    let result = &*result;
    result.examples.len()
}

/// Number of hypotheses of sentence `example` (0 if NULL or out of range).
///
/// # Safety
/// `result` must be NULL or a live result.
#[no_mangle]
pub unsafe extern "C" fn tolk_result_num_hypotheses(result: *const TolkResult, example: usize) -> usize {
    if result.is_null() {
        return 0;
    }
    let result = &*result;
    result.examples.get(example).map_or(0, Vec::len)
}

/// Hypothesis `rank` (0 = best) of sentence `example`: `*out_tokens` receives an array of
/// `*out_length` tokens owned by the result (valid until tolk_result_free); `*out_score`
/// (if not NULL) its score, or NaN when scores were not requested.
///
/// # Safety
/// `result` must be a live result; `out_tokens` and `out_length` writable (NULL is
/// TOLK_ERROR_NULL_POINTER), `out_score` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn tolk_result_hypothesis(
    result: *const TolkResult,
    example: usize,
    rank: usize,
    out_tokens: *mut *const *const c_char,
    out_length: *mut usize,
    out_score: *mut f32,
) -> TolkStatus {
    guard("tolk_result_hypothesis", || {
        let result = &*non_null(result, "result")?;
        non_null(out_tokens as *const *const *const c_char, "out_tokens")?;
        non_null(out_length as *const usize, "out_length")?;
        let hyp = result.hypothesis(example, rank)?;
        *out_tokens = hyp.pointers.as_ptr();
        *out_length = hyp.pointers.len();
        if !out_score.is_null() {
            *out_score = hyp.score;
        }
        Ok(())
    })
}

/// The alignment attention of hypothesis `rank` of sentence `example` (the translation
/// asked for it: TolkTranslateOptions.return_attention): `*out_values` receives
/// `*out_rows` x `*out_columns` floats owned by the result, row-major, one row per token of
/// the hypothesis and one column per source token as given (valid until
/// tolk_result_free). Without attention the rows and columns are 0 and `*out_values` NULL.
///
/// # Safety
/// `result` must be a live result; the three out pointers writable (NULL is
/// TOLK_ERROR_NULL_POINTER).
#[no_mangle]
pub unsafe extern "C" fn tolk_result_attention(
    result: *const TolkResult,
    example: usize,
    rank: usize,
    out_values: *mut *const f32,
    out_rows: *mut usize,
    out_columns: *mut usize,
) -> TolkStatus {
    guard("tolk_result_attention", || {
        let result = &*non_null(result, "result")?;
        non_null(out_values as *const *const f32, "out_values")?;
        non_null(out_rows as *const usize, "out_rows")?;
        non_null(out_columns as *const usize, "out_columns")?;
        let hyp = result.hypothesis(example, rank)?;
        let columns = hyp.source_length;
        let rows = hyp.attention.len().checked_div(columns).unwrap_or(0);
        *out_values = if rows == 0 { ptr::null() } else { hyp.attention.as_ptr() };
        *out_rows = rows;
        *out_columns = if rows == 0 { 0 } else { columns };
        Ok(())
    })
}

/// Releases a result and every string it handed out.
///
/// # Safety
/// `result` must be NULL or a pointer from tolk_translate_batch not yet freed.
#[no_mangle]
pub unsafe extern "C" fn tolk_result_free(result: *mut TolkResult) {
    if !result.is_null() {
        let _ = catch_unwind(AssertUnwindSafe(|| drop(Box::from_raw(result))));
    }
}

mod jobs;
mod memory;
mod stream;
mod text;
mod file;
