//! Streaming translation of files and standard streams in the C ABI: tolk_translate_file.
use std::ffi::c_char;
use std::path::PathBuf;

use super::text::{read_text_options, TolkTextOptions};
use super::{guard, non_null, read_translate_options, read_versioned, TolkStatus, TolkTranslateOptions, TolkTranslator};
use crate::error::Error;
use crate::StreamOptions;

/// Settings of tolk_translate_file. Always start from `tolk_stream_options_default()`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TolkStreamOptions {
    /// sizeof(TolkStreamOptions), set by the _default() function (ABI versioning).
    pub struct_size: u32,
    /// Lines read and translated as one chunk (two chunks are in flight: one translated
    /// while the next is read and the previous written); memory grows with this, not with
    /// the input. 0 = 8 batches' worth: 8 x max_batch_size (8 x 32 when max_batch_size is
    /// 0 or counts tokens).
    pub read_batch_size: u32,
    /// Input lines are space-separated tokens and so are output lines, one per hypothesis
    /// (scores: "SCORE ||| tokens"); false = text lines (default).
    pub tokens: bool,
}

super::versioned!(TolkStreamOptions { struct_size, read_batch_size, tokens });

/// Default stream settings (text lines, chunks of 8 batches).
#[no_mangle]
pub extern "C" fn tolk_stream_options_default() -> TolkStreamOptions {
    TolkStreamOptions { struct_size: std::mem::size_of::<TolkStreamOptions>() as u32, read_batch_size: 0, tokens: false }
}

/// Translates a file line by line into another, with memory bounded by the chunk size
/// whatever the input's size. `input_path` and `output_path` NULL or "-" mean standard
/// input and output (read and written through the library's own buffers: do not mix with
/// stdio on them during the call).
///
/// Each input line is one text (cut into sentences per `text_options`; empty lines stay
/// empty) or, with `stream_options->tokens`, one sentence of space-separated tokens. A line
/// ends at "\n", and one "\r" before it goes with it. Each output line is the line's
/// translation; with `options->return_scores`, preceded by its sentence scores
/// (comma-separated) and " ||| ". In token mode every hypothesis is a line ("SCORE ||| "
/// first with scores). A line that is not valid UTF-8 stops the call with an error naming
/// it. Translations are written in input order, flushed after each chunk.
///
/// `options` (NULL = the translator's) and `text_options` (NULL = defaults) are those of
/// the text and batch calls; max_batch_size 0 means batches of 32 sentences here, and
/// `on_token` must be NULL. `options->progress` is called on this thread with the lines
/// done (estimated from the translated sentences inside a chunk in text mode) and the total:
/// counted beforehand when the input is a regular file, else 0 until the end of the input
/// is read. Returning false stops the call with TOLK_ERROR_CANCELLED.
///
/// A file output is written to a temporary file beside it (".NAME.tolk-PID-N.tmp") and
/// renamed over it at the end: on any failure no output file is created or changed.
/// Standard output, devices and FIFOs are written as chunks are translated. A path naming
/// an open descriptor ("/dev/stdout", "/dev/stdin", "/dev/fd/N", "/proc/self/fd/N") reads
/// or writes that descriptor at its offset, as NULL / "-" do for standard input and output.
///
/// # Safety
/// `translator` must be a live translator; the paths NULL or NUL-terminated; the option
/// structs NULL or initialized by their _default() functions.
#[no_mangle]
pub unsafe extern "C" fn tolk_translate_file(
    translator: *const TolkTranslator,
    input_path: *const c_char,
    output_path: *const c_char,
    options: *const TolkTranslateOptions,
    text_options: *const TolkTextOptions,
    stream_options: *const TolkStreamOptions,
) -> TolkStatus {
    guard("tolk_translate_file", || {
        let translator = &*non_null(translator, "translator")?;
        let (options, progress, tokens) = read_translate_options(translator, options)?;
        if tokens.callback.is_some() {
            return Err(Error::invalid_argument("on_token is not supported by tolk_translate_file: set it to NULL").into());
        }
        let text_options = read_text_options(text_options)?;
        let defaults = tolk_stream_options_default();
        let s = if stream_options.is_null() {
            defaults
        } else {
            read_versioned(stream_options, defaults, (*stream_options).struct_size)?
        };
        let stream = StreamOptions { read_batch_size: s.read_batch_size as usize, tokens: s.tokens, total_lines: None };
        let (input, output) = (path(input_path), path(output_path));
        translator
            .translator
            .translate_file(&input, &output, &options, &text_options, &stream, &mut |done, total| progress.report(done, total))?;
        Ok(())
    })
}

/// A C path, NULL = "-".
unsafe fn path(p: *const c_char) -> PathBuf {
    if p.is_null() {
        return PathBuf::from("-");
    }
    super::c_path(p)
}
