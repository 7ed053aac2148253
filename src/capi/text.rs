//! The text part of the C ABI: UTF-8 text in, UTF-8 text out, with the byte ranges and
//! scores of every translated sentence.
use std::ffi::{c_char, CStr};
use std::ptr;

use super::{
    guard, non_null, read_translate_options, read_versioned, reserve_for, write_versioned, Failure, TolkStatus, TolkTranslateOptions,
    TolkTranslator,
};
use crate::error::Error;
use crate::{SplitMode, TextHooks, TextOptions, TextTranslation};

/// How texts are cut into the sentences that are translated one by one.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(dead_code)] // Values arrive from C as integers.
#[allow(clippy::enum_variant_names)] // C names carry the type name.
pub enum TolkSplitMode {
    /// Sentences inside each line; line breaks always end a sentence (default).
    TolkSplitSentences = 0,
    /// Each non-blank line is one sentence.
    TolkSplitLines = 1,
    /// The whole text is one sentence.
    TolkSplitWhole = 2,
}

/// Settings of text translation. Always start from `tolk_text_options_default()`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TolkTextOptions {
    /// sizeof(TolkTextOptions), set by the _default() function (ABI versioning).
    pub struct_size: u32,
    /// A TolkSplitMode value (default TOLK_SPLIT_SENTENCES).
    pub split_mode: u32,
    /// Longer sentences are cut into parts of at most this many source tokens, end token
    /// included, preferably between words (default 128, Bergamot's max-length-break; 0 =
    /// default).
    pub max_sentence_tokens: u32,
}

super::versioned!(TolkTextOptions { struct_size, split_mode, max_sentence_tokens });

/// Where a translated sentence (or part of a long one) is. Always start from
/// `tolk_sentence_info_default()`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TolkSentenceInfo {
    /// sizeof(TolkSentenceInfo), set by the _default() function (ABI versioning).
    pub struct_size: u32,
    /// The translation's score; NaN unless return_scores was set.
    pub score: f32,
    /// Byte range [source_begin, source_end) of the sentence in the source text.
    pub source_begin: usize,
    pub source_end: usize,
    /// Byte range [target_begin, target_end) of its translation in the translated text.
    pub target_begin: usize,
    pub target_end: usize,
    /// Index of the source sentence within its text: the parts of a sentence wrapped at
    /// max_sentence_tokens share it.
    pub sentence: usize,
}

super::versioned!(TolkSentenceInfo { struct_size, score, source_begin, source_end, target_begin, target_end, sentence });

/// An empty TolkSentenceInfo with its struct_size set.
#[no_mangle]
pub extern "C" fn tolk_sentence_info_default() -> TolkSentenceInfo {
    TolkSentenceInfo {
        struct_size: std::mem::size_of::<TolkSentenceInfo>() as u32,
        score: f32::NAN,
        source_begin: 0,
        source_end: 0,
        target_begin: 0,
        target_end: 0,
        sentence: 0,
    }
}

/// Translations of a batch of texts (opaque, immutable).
pub struct TolkTextResult {
    /// Each text ends with a NUL (past its sentences' ranges) so C reads it in place.
    texts: Vec<TextTranslation>,
}

/// Default text settings (sentence splitting, 128 tokens at most per sentence).
#[no_mangle]
pub extern "C" fn tolk_text_options_default() -> TolkTextOptions {
    TolkTextOptions {
        struct_size: std::mem::size_of::<TolkTextOptions>() as u32,
        split_mode: TolkSplitMode::TolkSplitSentences as u32,
        max_sentence_tokens: crate::text::translate::DEFAULT_MAX_SENTENCE_TOKENS as u32,
    }
}

pub(super) unsafe fn read_text_options(options: *const TolkTextOptions) -> Result<TextOptions, Error> {
    let defaults = tolk_text_options_default();
    let o = if options.is_null() { defaults } else { read_versioned(options, defaults, (*options).struct_size)? };
    let split_mode = match o.split_mode {
        0 => SplitMode::Sentences,
        1 => SplitMode::Lines,
        2 => SplitMode::Whole,
        other => return Err(Error::invalid_argument(format!("unknown split_mode {other}"))),
    };
    Ok(TextOptions { split_mode, max_sentence_tokens: o.max_sentence_tokens as usize })
}

/// Reads the `count` texts of a batch (`texts` may be NULL when `count` is 0).
pub(super) unsafe fn read_texts<'a>(texts: *const *const c_char, lengths: *const usize, count: usize) -> Result<Vec<&'a str>, Failure> {
    let mut batch = Vec::with_capacity(reserve_for(count));
    if count > 0 {
        non_null(texts, "texts")?;
        for i in 0..count {
            batch.push(read_text(texts, lengths, i)?);
        }
    }
    Ok(batch)
}

/// Reads text `i` of a batch: `lengths` NULL means NUL-terminated strings.
unsafe fn read_text<'a>(texts: *const *const c_char, lengths: *const usize, i: usize) -> Result<&'a str, Failure> {
    let p = *texts.add(i);
    let bytes = if lengths.is_null() {
        if p.is_null() {
            return Err(Error::invalid_argument(format!("texts[{i}] is NULL")).into());
        }
        CStr::from_ptr(p).to_bytes()
    } else {
        let n = *lengths.add(i);
        if n == 0 {
            return Ok("");
        }
        if p.is_null() {
            return Err(Error::invalid_argument(format!("texts[{i}] is NULL but its length is {n}")).into());
        }
        // from_raw_parts needs the text to fit in isize::MAX bytes (SIZE_MAX is no
        // "NUL-terminated" marker here: that is lengths = NULL).
        if n > isize::MAX as usize {
            return Err(Error::invalid_argument(format!("texts[{i}] has an impossible length {n}")).into());
        }
        std::slice::from_raw_parts(p as *const u8, n)
    };
    std::str::from_utf8(bytes).map_err(|e| {
        Error::invalid_argument(format!("texts[{i}] is not valid UTF-8 (at byte {})", e.valid_up_to())).into()
    })
}

/// Translates `count` texts. Each text is cut into sentences (see TolkTextOptions), the
/// sentences of all texts are translated together in batches sorted by length, and each
/// translation is written back between the source's own spaces and line breaks.
///
/// `texts[i]` is UTF-8; `text_lengths` gives each length in bytes, or is NULL when the
/// texts are NUL-terminated. `options` (NULL = defaults: beam 2, batches of 32 sentences
/// when max_batch_size is 0) must ask for one hypothesis; set return_scores for sentence
/// scores. `text_options` may be NULL. The model needs a SentencePiece model (found in its
/// package or named in TolkModelOptions). On success `*out_result` receives a result to
/// release with tolk_text_result_free.
///
/// # Safety
/// `texts` (and `text_lengths` unless NULL) must hold `count` entries; each text readable
/// for its length (or up to its NUL).
#[no_mangle]
pub unsafe extern "C" fn tolk_translate_text_batch(
    translator: *const TolkTranslator,
    texts: *const *const c_char,
    text_lengths: *const usize,
    count: usize,
    options: *const TolkTranslateOptions,
    text_options: *const TolkTextOptions,
    out_result: *mut *mut TolkTextResult,
) -> TolkStatus {
    guard("tolk_translate_text_batch", || {
        clear(out_result);
        let batch = read_texts(texts, text_lengths, count)?;
        translate(translator, &batch, options, text_options, out_result)
    })
}

/// Translates one NUL-terminated UTF-8 text: tolk_translate_text_batch with one text.
/// Read the translation with tolk_text_result_text(result, 0, NULL).
///
/// # Safety
/// `text` must be NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn tolk_translate_text(
    translator: *const TolkTranslator,
    text: *const c_char,
    options: *const TolkTranslateOptions,
    text_options: *const TolkTextOptions,
    out_result: *mut *mut TolkTextResult,
) -> TolkStatus {
    guard("tolk_translate_text", || {
        clear(out_result);
        let texts = [non_null(text, "text")?];
        let text = read_text(texts.as_ptr(), ptr::null(), 0)?;
        translate(translator, &[text], options, text_options, out_result)
    })
}

/// A failed call leaves NULL in the caller's result pointer, whatever fails first.
unsafe fn clear(out_result: *mut *mut TolkTextResult) {
    if !out_result.is_null() {
        *out_result = ptr::null_mut();
    }
}

unsafe fn translate(
    translator: *const TolkTranslator,
    texts: &[&str],
    options: *const TolkTranslateOptions,
    text_options: *const TolkTextOptions,
    out_result: *mut *mut TolkTextResult,
) -> Result<(), Failure> {
    let out = non_null(out_result as *const *mut TolkTextResult, "out_result")? as *mut *mut TolkTextResult;
    let translator = &*non_null(translator, "translator")?;
    let (options, progress, tokens) = read_translate_options(translator, options)?;
    let text_options = read_text_options(text_options)?;
    let hooks = TextHooks { on_token: tokens.text_callback(), on_complete: None };
    let job = translator.translator.submit_text(texts, &options, &text_options, hooks)?;
    let translated = job.wait_blocking(&mut |done, total| progress.report(done, total))?;
    *out = Box::into_raw(Box::new(TolkTextResult::new(translated)));
    Ok(())
}

impl TolkTextResult {
    pub(super) fn new(mut texts: Vec<TextTranslation>) -> TolkTextResult {
        for t in &mut texts {
            t.text.push('\0');
        }
        TolkTextResult { texts }
    }
}

/// Number of texts in a result (0 for NULL).
///
/// # Safety
/// `result` must be NULL or a live result.
#[no_mangle]
pub unsafe extern "C" fn tolk_text_result_count(result: *const TolkTextResult) -> usize {
    if result.is_null() {
        return 0;
    }
    (*result).texts.len()
}

/// The translation of text `index`: NUL-terminated UTF-8 owned by the result (valid until
/// tolk_text_result_free); `*out_length` (if not NULL) receives its length in bytes (use it
/// when the source may hold NUL bytes: the spacing between sentences is copied from the
/// source). NULL when `result` is NULL or `index` out of range.
///
/// # Safety
/// `result` must be NULL or a live result; `out_length` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn tolk_text_result_text(result: *const TolkTextResult, index: usize, out_length: *mut usize) -> *const c_char {
    if result.is_null() {
        return ptr::null();
    }
    let result = &*result;
    let Some(translation) = result.texts.get(index) else { return ptr::null() };
    if !out_length.is_null() {
        *out_length = translation.text.len() - 1;
    }
    translation.text.as_ptr() as *const c_char
}

/// Number of translated sentences (parts, for wrapped long sentences) of text `index` (0 if
/// NULL or out of range).
///
/// # Safety
/// `result` must be NULL or a live result.
#[no_mangle]
pub unsafe extern "C" fn tolk_text_result_num_sentences(result: *const TolkTextResult, index: usize) -> usize {
    if result.is_null() {
        return 0;
    }
    let result = &*result;
    result.texts.get(index).map_or(0, |t| t.sentences.len())
}

/// Part `part` of text `index`: a sentence, or one part of a sentence longer than
/// max_sentence_tokens. Fields are written as far as `out->struct_size` reaches.
///
/// # Safety
/// `result` must be a live result; `out` NULL or a struct initialized by
/// tolk_sentence_info_default.
#[no_mangle]
pub unsafe extern "C" fn tolk_text_result_sentence(
    result: *const TolkTextResult,
    index: usize,
    part: usize,
    out: *mut TolkSentenceInfo,
) -> TolkStatus {
    guard("tolk_text_result_sentence", || {
        let result = &*non_null(result, "result")?;
        non_null(out as *const TolkSentenceInfo, "out")?;
        let text = result.texts.get(index).ok_or_else(|| {
            Error::out_of_range(format!("text {index} is out of range ({} texts)", result.texts.len()))
        })?;
        let s = text.sentences.get(part).ok_or_else(|| {
            Error::out_of_range(format!("sentence {part} is out of range ({} sentences)", text.sentences.len()))
        })?;
        let info = TolkSentenceInfo {
            struct_size: std::mem::size_of::<TolkSentenceInfo>() as u32,
            score: s.score.unwrap_or(f32::NAN),
            source_begin: s.source.start,
            source_end: s.source.end,
            target_begin: s.target.start,
            target_end: s.target.end,
            sentence: s.sentence,
        };
        write_versioned(out, info, (*out).struct_size)?;
        Ok(())
    })
}

/// Releases a text result and every string it handed out.
///
/// # Safety
/// `result` must be NULL or a pointer from tolk_translate_text(_batch) not yet freed.
#[no_mangle]
pub unsafe extern "C" fn tolk_text_result_free(result: *mut TolkTextResult) {
    if !result.is_null() {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(Box::from_raw(result))));
    }
}
