//! Loading a model from files in memory: the C side of [`Model::load_from_memory`], for
//! applications that ship models inside their own archives.
use std::ffi::{c_char, c_void, CStr};
use std::ptr;

use super::{guard, load_options, new_model, non_null, reserve_for, TolkModel, TolkModelOptions, TolkStatus};
use crate::error::Error;
use crate::Model;

/// One file of a model package, in memory (see tolk_model_load_from_memory).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TolkModelFile {
    /// The file's name as in the package's directory, NUL-terminated UTF-8: "model.bin",
    /// "config.json", "shared_vocabulary.json", "sentencepiece.model"; for a Marian package
    /// its YAML and the names the YAML gives (e.g. "model.enpt.intgemm.alphas.bin",
    /// "vocab.enpt.spm", "lex.50.50.enpt.s2t.bin").
    pub name: *const c_char,
    /// The file's bytes; read during the load call only.
    pub data: *const c_void,
    /// The number of bytes at `data`.
    pub size: usize,
}

/// Loads a model from `count` files in memory, found and loaded as the same files in a
/// directory would be by tolk_model_load_with_options (a CTranslate2 model.bin +
/// config.json + vocabularies, or a Marian package). `options` may be NULL (defaults); its
/// `source_tokenizer` / `target_tokenizer`, when set, are names of files among `files`
/// rather than paths. On success `*out_model` receives a model to release with
/// tolk_model_free.
///
/// The buffers are only read during the call: they may be freed as soon as it returns.
/// The model keeps its own copy of the files (their total size, besides the loaded
/// weights) for as long as it or a translator made from it lives, so that
/// tolk_translator_new with another compute type or device can load the weights again
/// from it.
///
/// Errors (TOLK_ERROR_INVALID_ARGUMENT): count 0, a NULL or non-UTF-8 name, a name given
/// twice, empty, absolute or with "..", NULL data with a size, an empty file; no model
/// among the names is TOLK_ERROR_IO (the message lists the names), a broken one
/// TOLK_ERROR_INVALID_MODEL, as from a directory.
///
/// # Safety
/// `files` must be NULL or point to `count` readable TolkModelFile, each `name` NULL or a
/// NUL-terminated string and each `data` NULL or `size` readable bytes; `options` NULL or
/// initialized by tolk_model_options_default; `out_model` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn tolk_model_load_from_memory(
    files: *const TolkModelFile,
    count: usize,
    options: *const TolkModelOptions,
    out_model: *mut *mut TolkModel,
) -> TolkStatus {
    guard("tolk_model_load_from_memory", || {
        let out = non_null(out_model as *const *mut TolkModel, "out_model")? as *mut *mut TolkModel;
        *out = ptr::null_mut();
        non_null(files, "files")?;
        if count == 0 {
            return Err(Error::invalid_argument("count is 0: no files given").into());
        }
        // from_raw_parts needs the array to fit in isize::MAX bytes.
        if count > isize::MAX as usize / std::mem::size_of::<TolkModelFile>() {
            return Err(Error::invalid_argument(format!("count {count} is too large")).into());
        }
        let mut named = Vec::with_capacity(reserve_for(count));
        for (i, file) in std::slice::from_raw_parts(files, count).iter().enumerate() {
            if file.name.is_null() {
                return Err(Error::invalid_argument(format!("files[{i}].name is NULL")).into());
            }
            let name = CStr::from_ptr(file.name)
                .to_str()
                .map_err(|_| Error::invalid_argument(format!("files[{i}].name is not valid UTF-8")))?;
            let data: &[u8] = match file.size {
                0 => &[], // refused by name as an empty file
                n if file.data.is_null() => {
                    return Err(Error::invalid_argument(format!("files[{i}] ({name:?}) has NULL data but size {n}")).into())
                }
                n if n > isize::MAX as usize => {
                    return Err(Error::invalid_argument(format!("files[{i}] ({name:?}) has an impossible size {n}")).into())
                }
                n => std::slice::from_raw_parts(file.data.cast::<u8>(), n),
            };
            named.push((name, data));
        }
        *out = new_model(Model::load_from_memory(&named, &load_options(options)?)?);
        Ok(())
    })
}
