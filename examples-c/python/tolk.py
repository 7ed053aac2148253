"""ctypes binding for the Tolk C API (include/tolk.h).

A small, dependency-free wrapper that mirrors ``ctranslate2.Translator`` and adds
text in / text out translation with the SentencePiece model of the package::

    import tolk

    with tolk.Translator("models/zh-en-ct2", compute_type="int8") as translator:
        print(translator.translate_text("你好，世界。今天天气很好。", beam_size=4))
        # Several texts in one call (their sentences are batched together):
        print(translator.translate_text(["第一段。", "第二段。\\n第三行。"]))
        # The translated sentences with their places in the source and the result:
        doc = translator.translate_text("你好。世界。", return_sentences=True)
        for s in doc.sentences:
            print(s.source_span, s.source, "->", s.target_span, s.target)

Long translations report progress and can be stopped: ``progress(done, total)`` is
called after each batch (on the calling thread); returning ``False`` cancels the call,
which raises :class:`TolkCancelled`::

    def progress(done, total):
        print("translating... %d/%d sentences" % (done, total))
        return not stop_requested  # False: stop

    translator.translate_text(document, max_batch_size=8, progress=progress)

A model packed in an application's own archive loads from memory, each file under its
name in the package's directory (as ``ctranslate2.Translator(path, files=...)``)::

    files = {name: archive.read(name) for name in
             ("model.bin", "config.json", "shared_vocabulary.json", "sentencepiece.model")}
    with tolk.Model.from_files(files, compute_type="int8") as model:
        ...

Tokens in / tokens out works as in CTranslate2::

    with tolk.Model("models/zh-en-ct2") as model, \\
            tolk.Translator(model, compute_type="int8") as translator:
        results = translator.translate_batch([["▁你好", "世界"]], beam_size=4)
        print(results[0].hypotheses[0])

The shared library is found, in order, at ``$TOLK_LIB``, at
``../../target/release/libtolk.so`` relative to this file (the cargo build
output of this repository), then by ``ctypes.util.find_library("tolk")``.

Every C object is released deterministically: use the context managers or
``close()``; ``__del__`` is a fallback.  A translator keeps its model alive on the
C side, so closing the ``Model`` while translators still use it is safe.

Errors raise :class:`TolkError` with the status code and ``tolk_last_error()``
(:class:`TolkCancelled`, a subclass, for a cancelled translation).
"""

import atexit
import collections
import ctypes
import ctypes.util
import math
import os
import signal
import sys
import threading
import weakref
from typing import List, Optional, Sequence, Tuple, Union

__all__ = [
    "TolkError",
    "TolkCancelled",
    "Model",
    "Translator",
    "TranslationResult",
    "TextTranslation",
    "Sentence",
    "SPLIT_MODES",
    "version",
    "abi_version",
    "status_string",
    "library_path",
    "Status",
    "ABI_VERSION",
    "DECODING_MEMORY_AUTO",
]

ABI_VERSION = 1
# TolkTranslateOptions.max_decoding_memory_mb: the automatic budget (half the model's weights, at least 32 MB).
DECODING_MEMORY_AUTO = 0xFFFFFFFF


class Status:
    OK = 0
    ERROR_NULL_POINTER = 1
    ERROR_INVALID_ARGUMENT = 2
    ERROR_IO = 3
    ERROR_INVALID_MODEL = 4
    ERROR_UNSUPPORTED = 5
    ERROR_OUT_OF_RANGE = 6
    ERROR_INTERNAL = 7
    ERROR_CANCELLED = 8

    NAMES = {
        0: "TOLK_OK",
        1: "TOLK_ERROR_NULL_POINTER",
        2: "TOLK_ERROR_INVALID_ARGUMENT",
        3: "TOLK_ERROR_IO",
        4: "TOLK_ERROR_INVALID_MODEL",
        5: "TOLK_ERROR_UNSUPPORTED",
        6: "TOLK_ERROR_OUT_OF_RANGE",
        7: "TOLK_ERROR_INTERNAL",
        8: "TOLK_ERROR_CANCELLED",
    }


BATCH_TYPES = {"examples": 0, "tokens": 1}
# TolkSplitMode: how translate_text cuts texts into the sentences it translates.
SPLIT_MODES = {"sentences": 0, "lines": 1, "whole": 2}


class TolkError(RuntimeError):
    """A Tolk call failed: ``status`` is the TolkStatus code, ``message`` the
    text of ``tolk_last_error()``."""

    def __init__(self, status: int, message: str):
        self.status = int(status)
        self.message = message
        name = Status.NAMES.get(self.status, "status %d" % self.status)
        super().__init__("%s: %s" % (name, message) if message else name)


class TolkCancelled(TolkError):
    """The ``progress`` callable of a translation returned ``False``: the call stopped
    (``TOLK_ERROR_CANCELLED``) and returned nothing."""


# --------------------------------------------------------------------------- C types


class TolkModelOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("compute_type", ctypes.c_char_p),
        ("source_tokenizer", ctypes.c_char_p),
        ("target_tokenizer", ctypes.c_char_p),
        ("device", ctypes.c_char_p),
        ("device_index", ctypes.c_uint32),
    ]


_ModelOptions = TolkModelOptions


class TolkModelFile(ctypes.Structure):
    """One file of a package in memory (``tolk_model_load_from_memory``)."""

    _fields_ = [
        ("name", ctypes.c_char_p),
        ("data", ctypes.c_void_p),
        ("size", ctypes.c_size_t),
    ]


class TolkTranslatorOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("device", ctypes.c_char_p),
        ("compute_type", ctypes.c_char_p),
        ("intra_threads", ctypes.c_uint32),
        ("device_index", ctypes.c_uint32),
        ("inter_threads", ctypes.c_uint32),
        # The calls' kv_cache_type unless they say otherwise; NULL = "float32".
        ("kv_cache_type", ctypes.c_char_p),
    ]


# TolkProgressCallback: bool (*)(void *user_data, size_t done, size_t total).
TolkProgressCallback = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t)


class TolkTokenEvent(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("token_id", ctypes.c_uint32),
        ("index", ctypes.c_size_t),
        ("sentence", ctypes.c_size_t),
        ("step", ctypes.c_size_t),
        ("token", ctypes.c_char_p),
        ("text", ctypes.c_void_p),  # UTF-8, text_length bytes (NULL in token calls)
        ("text_length", ctypes.c_size_t),
        ("is_last", ctypes.c_bool),
    ]


# TolkTokenCallback: bool (*)(void *user_data, const TolkTokenEvent *event).
TolkTokenCallback = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.POINTER(TolkTokenEvent))
# TolkJobCallback: void (*)(void *user_data, TolkStatus status).
TolkJobCallback = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int)


class TolkTranslateOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("beam_size", ctypes.c_uint32),
        ("patience", ctypes.c_float),
        ("length_penalty", ctypes.c_float),
        ("num_hypotheses", ctypes.c_uint32),
        ("return_scores", ctypes.c_bool),
        ("max_input_length", ctypes.c_uint32),
        ("max_decoding_length", ctypes.c_uint32),
        ("min_decoding_length", ctypes.c_uint32),
        ("end_token", ctypes.c_char_p),
        ("disable_unk", ctypes.c_bool),
        ("max_batch_size", ctypes.c_uint32),
        ("batch_type", ctypes.c_int),  # enum TolkBatchType
        # Called on the calling thread after each batch; NULL = none.
        ("progress", TolkProgressCallback),
        ("progress_user_data", ctypes.c_void_p),
        # Decoding stops at this factor times the longest source; 0 = none.
        ("max_length_factor", ctypes.c_float),
        # Restrict the output layer to the model's shortlist when it has one.
        ("use_shortlist", ctypes.c_bool),
        # Called for each generated token (greedy search), on the translator's threads.
        ("on_token", TolkTokenCallback),
        ("on_token_user_data", ctypes.c_void_p),
        # Restrict the output layer to the candidates of the model's vmap.txt (CTranslate2).
        ("use_vmap", ctypes.c_bool),
        # How decoding keeps attention keys/values: "float32" (NULL), "bfloat16", "int8".
        ("kv_cache_type", ctypes.c_char_p),
        # Decoding state planned for where batches are decoded together, in MB; 0 = no bound,
        # DECODING_MEMORY_AUTO (the default) = half the model's weights, at least 32 MB.
        ("max_decoding_memory_mb", ctypes.c_uint32),
        # Penalty on the tokens a hypothesis already holds (CTranslate2's); 1 = off.
        ("repetition_penalty", ctypes.c_float),
        # Hypotheses never repeat an n-gram of this size (CTranslate2's); 0 = off.
        ("no_repeat_ngram_size", ctypes.c_uint32),
        # Keep each hypothesis's alignment attention (tolk_result_attention); CPU only.
        ("return_attention", ctypes.c_bool),
        # Replace generated unknown tokens by the source token attended to most; CPU only.
        ("replace_unknowns", ctypes.c_bool),
        # Token sequences no hypothesis may contain: arrays of tokens, their lengths, count.
        ("suppress_sequences", ctypes.POINTER(ctypes.POINTER(ctypes.c_char_p))),
        ("suppress_sequence_lengths", ctypes.POINTER(ctypes.c_size_t)),
        ("num_suppress_sequences", ctypes.c_size_t),
        # Keep the end token at the end of the hypotheses that produced it.
        ("return_end_token", ctypes.c_bool),
        # Random sampling (greedy search): among the topk best (0 = all, 1 = none), at a
        # temperature, cut to a cumulative probability topp; seed 0 = new each call.
        ("sampling_topk", ctypes.c_uint32),
        ("sampling_topp", ctypes.c_float),
        ("sampling_temperature", ctypes.c_float),
        ("sampling_seed", ctypes.c_uint64),
        ("end_tokens", ctypes.POINTER(ctypes.c_char_p)),
        ("num_end_tokens", ctypes.c_size_t),
    ]


class TolkTextOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("split_mode", ctypes.c_uint32),  # TolkSplitMode
        ("max_sentence_tokens", ctypes.c_uint32),
    ]


class TolkStreamOptions(ctypes.Structure):
    """Settings of ``tolk_translate_file`` (start from ``tolk_stream_options_default()``)."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("read_batch_size", ctypes.c_uint32),  # lines per chunk; 0 = 8 batches
        ("tokens", ctypes.c_bool),  # token lines instead of text lines
    ]


class TolkSentenceInfo(ctypes.Structure):
    """One translated part of a text (``tolk_text_result_sentence``'s out struct; start
    from ``tolk_sentence_info_default()``, which sets ``struct_size``)."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("score", ctypes.c_float),  # NaN unless return_scores
        ("source_begin", ctypes.c_size_t),
        ("source_end", ctypes.c_size_t),
        ("target_begin", ctypes.c_size_t),
        ("target_end", ctypes.c_size_t),
        ("sentence", ctypes.c_size_t),  # index of the source sentence; wrapped parts share it
    ]


class _TolkModel(ctypes.Structure):
    pass


class _TolkTranslator(ctypes.Structure):
    pass


class _TolkResult(ctypes.Structure):
    pass


class _TolkJob(ctypes.Structure):
    pass


class _TolkTextResult(ctypes.Structure):
    pass


_ModelP = ctypes.POINTER(_TolkModel)
_TranslatorP = ctypes.POINTER(_TolkTranslator)
_ResultP = ctypes.POINTER(_TolkResult)
_TextResultP = ctypes.POINTER(_TolkTextResult)
_JobP = ctypes.POINTER(_TolkJob)
_Status = ctypes.c_int  # enum TolkStatus
_CharPP = ctypes.POINTER(ctypes.c_char_p)  # const char *const *
_CharPPP = ctypes.POINTER(_CharPP)  # const char *const *const *


# --------------------------------------------------------------------------- loading


def _candidate_paths():
    env = os.environ.get("TOLK_LIB")
    if env:
        yield env
        return
    here = os.path.dirname(os.path.abspath(__file__))
    names = ["libtolk.so"]
    if sys.platform == "darwin":
        names = ["libtolk.dylib"]
    elif sys.platform == "win32":
        names = ["tolk.dll"]
    for name in names:
        yield os.path.join(here, "..", "..", "target", "release", name)
    found = ctypes.util.find_library("tolk")
    if found:
        yield found


def _load_library():
    tried = []
    for path in _candidate_paths():
        if os.path.sep in path and not os.path.exists(path):
            tried.append(path + " (missing)")
            continue
        try:
            return ctypes.CDLL(path), os.path.abspath(path) if os.path.exists(path) else path
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
    raise OSError(
        "cannot find the Tolk library; set TOLK_LIB or run `cargo build --release`. Tried: "
        + "; ".join(tried or ["ctypes.util.find_library('tolk')"])
    )


def _declare(lib):
    def fn(name, restype, *argtypes):
        f = getattr(lib, name)
        f.restype = restype
        f.argtypes = list(argtypes)
        return f

    fn("tolk_version", ctypes.c_char_p)
    fn("tolk_abi_version", ctypes.c_uint32)
    fn("tolk_cpu_isa", ctypes.c_char_p)
    fn("tolk_last_error", ctypes.c_char_p)
    fn("tolk_status_string", ctypes.c_char_p, ctypes.c_int)

    fn("tolk_model_load", _Status, ctypes.c_char_p, ctypes.POINTER(_ModelP))
    fn("tolk_model_options_default", _ModelOptions)
    fn("tolk_model_load_with_options", _Status, ctypes.c_char_p, ctypes.POINTER(_ModelOptions), ctypes.POINTER(_ModelP))
    fn(
        "tolk_model_load_from_memory",
        _Status,
        ctypes.POINTER(TolkModelFile),
        ctypes.c_size_t,
        ctypes.POINTER(_ModelOptions),
        ctypes.POINTER(_ModelP),
    )
    fn("tolk_model_compute_type", ctypes.c_char_p, _ModelP)
    fn("tolk_model_description", ctypes.c_char_p, _ModelP)
    fn("tolk_model_device", ctypes.c_char_p, _ModelP)
    fn("tolk_model_device_name", ctypes.c_char_p, _ModelP)
    fn("tolk_model_free", None, _ModelP)

    fn("tolk_translator_options_default", TolkTranslatorOptions)
    fn(
        "tolk_translator_new",
        _Status,
        _ModelP,
        ctypes.POINTER(TolkTranslatorOptions),
        ctypes.POINTER(_TranslatorP),
    )
    fn("tolk_translator_free", None, _TranslatorP)

    fn("tolk_translate_options_default", TolkTranslateOptions)
    fn("tolk_translator_translate_options", _Status, _TranslatorP, ctypes.POINTER(TolkTranslateOptions))
    fn(
        "tolk_translate_batch",
        _Status,
        _TranslatorP,
        _CharPPP,
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.c_size_t,
        _CharPPP,
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.POINTER(TolkTranslateOptions),
        ctypes.POINTER(_ResultP),
    )
    fn("tolk_result_batch_size", ctypes.c_size_t, _ResultP)
    fn("tolk_result_num_hypotheses", ctypes.c_size_t, _ResultP, ctypes.c_size_t)
    fn(
        "tolk_result_hypothesis",
        _Status,
        _ResultP,
        ctypes.c_size_t,
        ctypes.c_size_t,
        ctypes.POINTER(_CharPP),
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.POINTER(ctypes.c_float),
    )
    fn(
        "tolk_result_attention",
        _Status,
        _ResultP,
        ctypes.c_size_t,
        ctypes.c_size_t,
        ctypes.POINTER(ctypes.POINTER(ctypes.c_float)),
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.POINTER(ctypes.c_size_t),
    )
    fn("tolk_result_free", None, _ResultP)

    fn("tolk_text_options_default", TolkTextOptions)
    fn(
        "tolk_translate_text",
        _Status,
        _TranslatorP,
        ctypes.c_char_p,
        ctypes.POINTER(TolkTranslateOptions),
        ctypes.POINTER(TolkTextOptions),
        ctypes.POINTER(_TextResultP),
    )
    fn(
        "tolk_translate_text_batch",
        _Status,
        _TranslatorP,
        _CharPP,  # const char *const *texts
        ctypes.POINTER(ctypes.c_size_t),  # text_lengths (NULL = NUL-terminated)
        ctypes.c_size_t,
        ctypes.POINTER(TolkTranslateOptions),
        ctypes.POINTER(TolkTextOptions),
        ctypes.POINTER(_TextResultP),
    )
    fn("tolk_text_result_count", ctypes.c_size_t, _TextResultP)
    # Returns `const char *` that may hold NUL bytes: read it with its length.
    fn("tolk_text_result_text", ctypes.c_void_p, _TextResultP, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t))
    fn("tolk_text_result_num_sentences", ctypes.c_size_t, _TextResultP, ctypes.c_size_t)
    fn("tolk_sentence_info_default", TolkSentenceInfo)
    fn(
        "tolk_text_result_sentence",
        _Status,
        _TextResultP,
        ctypes.c_size_t,  # text index
        ctypes.c_size_t,  # part
        ctypes.POINTER(TolkSentenceInfo),
    )
    fn("tolk_text_result_free", None, _TextResultP)

    fn(
        "tolk_translate_batch_async",
        _Status,
        _TranslatorP,
        _CharPPP,
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.c_size_t,
        _CharPPP,
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.POINTER(TolkTranslateOptions),
        TolkJobCallback,
        ctypes.c_void_p,
        ctypes.POINTER(_JobP),
    )
    fn(
        "tolk_translate_text_async",
        _Status,
        _TranslatorP,
        _CharPP,
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.c_size_t,
        ctypes.POINTER(TolkTranslateOptions),
        ctypes.POINTER(TolkTextOptions),
        TolkJobCallback,
        ctypes.c_void_p,
        ctypes.POINTER(_JobP),
    )
    fn("tolk_job_is_done", ctypes.c_bool, _JobP)
    fn("tolk_job_wait_for", ctypes.c_bool, _JobP, ctypes.c_int64)
    fn("tolk_job_wait", _Status, _JobP)
    fn("tolk_job_progress", _Status, _JobP, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t))
    fn("tolk_job_cancel", None, _JobP)
    fn("tolk_job_result", _Status, _JobP, ctypes.POINTER(_ResultP))
    fn("tolk_job_text_result", _Status, _JobP, ctypes.POINTER(_TextResultP))
    fn("tolk_job_free", None, _JobP)

    fn("tolk_stream_options_default", TolkStreamOptions)
    fn(
        "tolk_translate_file",
        _Status,
        _TranslatorP,
        ctypes.c_char_p,  # input path (NULL or "-": standard input)
        ctypes.c_char_p,  # output path (NULL or "-": standard output)
        ctypes.POINTER(TolkTranslateOptions),
        ctypes.POINTER(TolkTextOptions),
        ctypes.POINTER(TolkStreamOptions),
    )
    return lib


_lib = None
_lib_path = None


def _get_lib():
    global _lib, _lib_path
    if _lib is None:
        lib, path = _load_library()
        _lib = _declare(lib)
        _lib_path = path
    return _lib


def library_path() -> str:
    """Path of the loaded shared library."""
    _get_lib()
    return _lib_path


def _u32(name: str, value) -> int:
    """``value`` as a count for a 32-bit unsigned C field: ctypes would silently wrap one
    out of range (2**32 + 1 became 1, -1 the largest)."""
    v = int(value)
    if not 0 <= v < 2 ** 32:
        raise ValueError("%s must be in [0, 2**32), got %r" % (name, value))
    return v


def _last_error(lib) -> str:
    msg = lib.tolk_last_error()
    return msg.decode("utf-8", "replace") if msg else ""


def _check(lib, status: int):
    if status == Status.ERROR_CANCELLED:
        raise TolkCancelled(status, _last_error(lib))
    if status != Status.OK:
        raise TolkError(status, _last_error(lib))


class _PythonCallback:
    """A Python callable behind one C callback of one call or job.

    The callable's result: ``None`` or a true value goes on, a false value stops. An
    exception raised by the callable (KeyboardInterrupt included) never crosses into the
    library: it is kept, the library is told to stop, and :meth:`reraise` raises it once
    the call has returned."""

    def __init__(self, fn, what, c_type):
        if not callable(fn):
            raise TypeError("%s, got %r" % (what, type(fn).__name__))
        self.fn = fn
        self.error = None
        # The ctypes thunk: alive as long as this object, which the caller keeps through
        # the library call.
        self.c_callback = c_type(self._call)

    def _guard(self, arguments):
        """Calls the callable with ``arguments()`` (made inside the guard too)."""
        if self.error is not None:
            return False
        try:
            go_on = self.fn(*arguments())
            return go_on is None or bool(go_on)
        except BaseException as e:  # noqa: B902 -- nothing may unwind into C
            self.error = e
            return False

    def reraise(self):
        """Raises the exception the callable raised, if any."""
        error, self.error = self.error, None
        if error is not None:
            try:
                raise error
            finally:
                error = None  # no reference cycle through this frame


class _Progress(_PythonCallback):
    """A Python ``progress(done, total)`` callable as the TolkProgressCallback of one call
    (a false result cancels)."""

    def __init__(self, fn):
        super().__init__(fn, "progress must be a callable (done, total) -> bool", TolkProgressCallback)

    def _call(self, user_data, done, total):
        return self._guard(lambda: (done, total))


class _CtrlCCancels:
    """Around a blocking call with a progress callback, on the main thread while SIGINT
    raises KeyboardInterrupt (Python's default): Ctrl-C cancels the call at its next
    progress report, and the call raises the KeyboardInterrupt. Python runs a signal's
    handler on entering the callback, before any guard, and ctypes swallows what it
    raises (printing "Exception ignored") and returns an undefined value to the library;
    so for the call this handler only takes note, and the callback returns False."""

    def __init__(self, streams):
        self.progress = next((w for w in streams if isinstance(w, _Progress)), None)
        self.previous = None

    def __enter__(self):
        if (self.progress is not None and threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
            self.previous = signal.signal(signal.SIGINT, self._note)
        return self

    def _note(self, signum, frame):
        if self.progress.error is None:
            self.progress.error = KeyboardInterrupt()

    def __exit__(self, *exc):
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


def _set_progress(opts, progress, keep) -> Optional[_Progress]:
    """Sets ``opts.progress`` for a Python callable (``None``: no callback)."""
    if progress is None:
        return None
    wrapper = _Progress(progress)
    keep.append(wrapper)
    opts.progress = wrapper.c_callback
    opts.progress_user_data = None
    return wrapper


TokenEvent = collections.namedtuple("TokenEvent", "index sentence step token_id token text is_last")
TokenEvent.__doc__ = """A token just generated, as given to ``on_token``: ``index`` of the sentence
(token calls) or text (text calls), ``sentence`` within that text (text calls; else 0),
``step`` among the generated tokens, ``token_id``, ``token``, ``text`` -- the sentence's
translation so far (text calls; else ``None``) -- and ``is_last``."""


class _TokenStream(_PythonCallback):
    """A Python ``on_token(event)`` callable as the TolkTokenCallback of one call or job.

    It is called on the translator's threads (ctypes takes the GIL). A false result ends
    that sentence's translation; an exception is kept (the sentence ends) and raised when
    the call returns or the job's result is read."""

    def __init__(self, fn):
        super().__init__(fn, "on_token must be a callable (event) -> bool", TolkTokenCallback)

    def _call(self, user_data, event_p):
        def event():
            e = event_p.contents
            text = None
            if e.text:
                text = ctypes.string_at(e.text, e.text_length).decode("utf-8", "replace")
            token = e.token.decode("utf-8", "replace") if e.token else ""
            return (TokenEvent(int(e.index), int(e.sentence), int(e.step), int(e.token_id), token, text, bool(e.is_last)),)
        return self._guard(event)


def _set_on_token(opts, on_token, keep) -> Optional[_TokenStream]:
    """Sets ``opts.on_token`` for a Python callable (``None``: no callback)."""
    if on_token is None:
        return None
    wrapper = _TokenStream(on_token)
    keep.append(wrapper)
    opts.on_token = wrapper.c_callback
    opts.on_token_user_data = None
    return wrapper


class Job:
    """A translation in flight (``TolkJob``), from :meth:`Translator.translate_batch_async`
    or :meth:`Translator.translate_text_async`: poll it, wait for it, cancel it, read its
    result (once). Closing it (or losing it, or the interpreter exiting) cancels the work
    if it is still running."""

    def __init__(self, lib, ptr, keep, read, streams):
        self._lib = lib
        self._ptr = ptr
        self._keep = keep  # the callbacks' thunks: alive until the job has settled
        self._read = read
        self._streams = streams
        _LIVE_JOBS.add(self)

    def done(self) -> bool:
        """Whether the job has ended (translated, failed or cancelled). Never blocks."""
        return bool(self._ptr) and self._lib.tolk_job_is_done(self._ptr)

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Blocks until the job ends or ``timeout`` seconds have passed; True if it ended."""
        self._check_open()
        ms = -1 if timeout is None else max(0, int(timeout * 1000))
        return self._lib.tolk_job_wait_for(self._ptr, ms)

    def progress(self) -> Tuple[int, int]:
        """Sentences translated so far and their total."""
        self._check_open()
        done, total = ctypes.c_size_t(), ctypes.c_size_t()
        _check(self._lib, self._lib.tolk_job_progress(self._ptr, ctypes.byref(done), ctypes.byref(total)))
        return done.value, total.value

    def cancel(self):
        """Asks the job to stop; :meth:`result` then raises :class:`TolkCancelled`."""
        if self._ptr:
            self._lib.tolk_job_cancel(self._ptr)

    def result(self):
        """Waits for the job and returns what the blocking call would have returned."""
        self._check_open()
        try:
            return self._read(self._ptr)
        finally:
            for s in self._streams:
                s.reraise()

    def close(self):
        ptr, self._ptr = self._ptr, None
        if ptr:
            self._lib.tolk_job_free(ptr)  # cancels a running job and waits until it settled
        self._keep = None

    def _check_open(self):
        if not self._ptr:
            raise ValueError("the job is closed")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


# Jobs not closed yet. At exit they are closed (cancelled, and waited for until their
# callbacks can no longer run) while the interpreter still runs: a worker calling an
# on_token thunk during finalization aborted the process ("FATAL: exception not rethrown").
_LIVE_JOBS = weakref.WeakSet()


@atexit.register
def _close_live_jobs():
    for job in list(_LIVE_JOBS):
        job.close()


def version() -> str:
    return _get_lib().tolk_version().decode("utf-8")


def abi_version() -> int:
    return int(_get_lib().tolk_abi_version())


def cpu_isa() -> str:
    """The CPU kernel path in use ("scalar", "avx2", "avxvnni", "avx512bw", "avx512vnni", "amx")."""
    return _get_lib().tolk_cpu_isa().decode("ascii")


def status_string(status: int) -> str:
    s = _get_lib().tolk_status_string(int(status))
    return s.decode("utf-8") if s else ""


def _encode_token(tok) -> bytes:
    if isinstance(tok, bytes):
        b = tok
    elif isinstance(tok, str):
        b = tok.encode("utf-8")
    else:
        raise TypeError("tokens must be str, got %r" % type(tok).__name__)
    if b"\0" in b:
        raise ValueError("tokens must not contain NUL characters: %r" % tok)
    return b


def _fspath_or_none(p) -> Optional[str]:
    return None if p is None else os.fspath(p)


def _path_bytes(p: Optional[str]) -> Optional[bytes]:
    if p is None:
        return None
    b = os.fsencode(p)
    if b"\0" in b:
        raise ValueError("paths must not contain NUL characters: %r" % (p,))
    return b


def _model_files(files):
    """``files`` (a mapping, or pairs, of name -> bytes-like) as a TolkModelFile array plus
    the objects that must stay alive while the library reads it.  ``bytes`` are passed
    without a copy; other buffers are passed in place when writable, else copied."""
    items = list(files.items() if hasattr(files, "items") else files)
    array = (TolkModelFile * len(items))()
    keep = []
    for entry, (name, data) in zip(array, items):
        if not isinstance(name, str):
            raise TypeError("file names must be str, got %r" % type(name).__name__)
        name_b = name.encode("utf-8")
        if b"\0" in name_b:
            raise ValueError("file names must not contain NUL characters: %r" % name)
        if not isinstance(data, bytes):
            view = memoryview(data).cast("B")
            if view.readonly:
                data = view.tobytes()
            else:
                data = (ctypes.c_char * view.nbytes).from_buffer(view)
        keep.append((name_b, data))
        entry.name = name_b
        entry.data = ctypes.cast(data, ctypes.c_void_p) if isinstance(data, bytes) else ctypes.addressof(data)
        entry.size = len(data)
    return array, keep


# --------------------------------------------------------------------------- objects


class Model:
    """An immutable loaded model (``TolkModel``); shareable across threads and
    translators."""

    def __init__(
        self,
        path: str,
        compute_type: str = "default",
        source_tokenizer: Optional[str] = None,
        target_tokenizer: Optional[str] = None,
        device: str = "auto",
        device_index: int = 0,
        files=None,
    ):
        """Loads ``path`` with the weights converted for ``compute_type`` ("default":
        as saved; "auto", "float32", "int8", "int16", or "float16" on a GPU) on ``device``: "auto" (a usable
        CUDA GPU, else the CPU; :attr:`device` says which), "cpu" or "cuda" (an error
        saying why when no GPU is usable); ``device_index`` picks the GPU.

        ``source_tokenizer`` / ``target_tokenizer`` are paths of SentencePiece models
        for :meth:`Translator.translate_text`; ``None`` looks in the model package
        (``source.spm`` + ``target.spm``, ``srcvocab.*.spm`` + ``trgvocab.*.spm``,
        ``sentencepiece.model``, ``spm.model``, ``sentencepiece.bpe.model``,
        ``vocab.*.spm``, in the model directory and then its parent).  A package
        without any only translates tokens.

        With ``files`` (as in ``ctranslate2.Translator``), the model is loaded from
        memory instead and ``path`` only names it: see :meth:`from_files`."""
        self._lib = _get_lib()
        self._ptr = None
        self.path = os.fspath(path)
        self.source_tokenizer = _fspath_or_none(source_tokenizer)
        self.target_tokenizer = _fspath_or_none(target_tokenizer)
        out = _ModelP()
        opts = self._lib.tolk_model_options_default()
        compute_b = compute_type.encode("utf-8") if compute_type is not None else None
        source_b = _path_bytes(self.source_tokenizer)
        target_b = _path_bytes(self.target_tokenizer)
        opts.compute_type = compute_b
        opts.source_tokenizer = source_b
        opts.target_tokenizer = target_b
        device_b = device.encode("utf-8") if device is not None else None
        opts.device = device_b
        opts.device_index = _u32("device_index", device_index)
        if files is not None:
            array, keep = _model_files(files)
            status = self._lib.tolk_model_load_from_memory(array, len(array), ctypes.byref(opts), ctypes.byref(out))
            del keep  # the library copied what it keeps
        else:
            status = self._lib.tolk_model_load_with_options(_path_bytes(self.path), ctypes.byref(opts), ctypes.byref(out))
        _check(self._lib, status)
        if not out:
            raise TolkError(Status.ERROR_INTERNAL, "tolk_model_load returned TOLK_OK but no model")
        self._ptr = out

    @classmethod
    def from_files(cls, files, compute_type: str = "default", source_tokenizer: Optional[str] = None,
                   target_tokenizer: Optional[str] = None, device: str = "auto", device_index: int = 0,
                   name: str = "<memory>") -> "Model":
        """Loads a model from files in memory: ``files`` maps each file's name in the
        package's directory to its bytes (``bytes``, ``bytearray``, ``memoryview``, ...),
        e.g. ``{"model.bin": ..., "config.json": ..., "shared_vocabulary.json": ...,
        "sentencepiece.model": ...}`` for CTranslate2, or a Marian package's YAML, model,
        vocabulary and shortlist under the names its YAML gives.  The package is found
        among the names as in a directory; ``source_tokenizer`` / ``target_tokenizer``
        name files among them.  The other arguments are :class:`Model`'s; ``name`` is
        only shown by ``repr``.

        The bytes are read during the call only.  The model keeps its own copy of the
        files (their total size) while it or a translator made from it lives, so that a
        :class:`Translator` with another ``compute_type`` or ``device`` can load the
        weights again."""
        return cls(name, compute_type=compute_type, source_tokenizer=source_tokenizer,
                   target_tokenizer=target_tokenizer, device=device, device_index=device_index,
                   files=files)

    @property
    def closed(self) -> bool:
        return not self._ptr

    @property
    def compute_type(self) -> str:
        """What the weights were loaded for: "float32", "int8_float32" or "int16"."""
        return self._lib.tolk_model_compute_type(self._ptr).decode("ascii")

    @property
    def description(self) -> str:
        """What the model is, e.g. "Marian transformer (SSRU decoder, ...)"."""
        return self._lib.tolk_model_description(self._ptr).decode("utf-8")

    @property
    def device(self) -> str:
        """Where the model runs: "cpu" or "cuda"."""
        return self._lib.tolk_model_device(self._ptr).decode("ascii")

    @property
    def device_name(self) -> str:
        """Where the model runs, for people: "cpu (avx2)", "cuda:0 (NVIDIA H100 ...)"."""
        return self._lib.tolk_model_device_name(self._ptr).decode("utf-8")

    def close(self):
        ptr, self._ptr = self._ptr, None
        if ptr:
            self._lib.tolk_model_free(ptr)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self):
        return "tolk.Model(%r%s)" % (self.path, ", closed" if self.closed else "")


class TranslationResult:
    """One example's result, like ``ctranslate2.TranslationResult``."""

    __slots__ = ("hypotheses", "scores", "attention")

    def __init__(self, hypotheses: List[List[str]], scores: List[float], attention=None):
        self.hypotheses = hypotheses
        self.scores = scores
        # Per hypothesis, per target token, the attention over the source tokens
        # (``return_attention=True``; else empty).
        self.attention = attention if attention is not None else []

    def __eq__(self, other):
        return (
            isinstance(other, TranslationResult)
            and self.hypotheses == other.hypotheses
            and self.scores == other.scores
            and self.attention == other.attention
        )

    def __repr__(self):
        return "TranslationResult(hypotheses=%r, scores=%r)" % (self.hypotheses, self.scores)


class Sentence:
    """One translated sentence of a text (or one part of a long sentence cut at
    ``max_sentence_tokens``): ``source`` and ``target`` are its text in the
    source and in the translation, ``source_span`` / ``target_span`` its
    ``(start, end)`` str indices there (``text[start:end] == source``), ``score`` the
    hypothesis score (``None`` unless ``return_scores``), ``sentence_index`` the index
    of the source sentence in its text (the parts of a wrapped sentence share it)."""

    __slots__ = ("source", "target", "source_span", "target_span", "score", "sentence_index")

    def __init__(self, source: str, target: str, source_span: Tuple[int, int],
                 target_span: Tuple[int, int], score: Optional[float] = None,
                 sentence_index: int = 0):
        self.source = source
        self.target = target
        self.source_span = source_span
        self.target_span = target_span
        self.score = score
        self.sentence_index = sentence_index

    def _key(self):
        return (self.source, self.target, self.source_span, self.target_span, self.score,
                self.sentence_index)

    def __eq__(self, other):
        return isinstance(other, Sentence) and self._key() == other._key()

    def __repr__(self):
        return ("Sentence(source=%r, target=%r, source_span=%r, target_span=%r, score=%r, "
                "sentence_index=%r)" % self._key())


class TextTranslation:
    """The translation of one text: ``text`` (the translated text) and
    ``sentences`` (a list of :class:`Sentence`, in source order)."""

    __slots__ = ("text", "sentences")

    def __init__(self, text: str, sentences: List[Sentence]):
        self.text = text
        self.sentences = sentences

    def __str__(self):
        return self.text

    def __eq__(self, other):
        return (
            isinstance(other, TextTranslation)
            and self.text == other.text
            and self.sentences == other.sentences
        )

    def __repr__(self):
        return "TextTranslation(text=%r, sentences=%r)" % (self.text, self.sentences)


class _CharIndex:
    """Converts byte offsets of a UTF-8 string into str (code point) indices. Offsets
    are asked for mostly in increasing order, so each call decodes only the bytes since
    the previous offset."""

    def __init__(self, data: bytes, what: str, index: int):
        self.data = data
        self.what = what
        self.index = index
        self.byte = 0
        self.char = 0

    def __call__(self, offset: int) -> int:
        if not 0 <= offset <= len(self.data):
            raise TolkError(
                Status.ERROR_INTERNAL,
                "byte offset %d is outside the %s of text %d (%d bytes)"
                % (offset, self.what, self.index, len(self.data)),
            )
        if offset < self.byte:
            self.byte = self.char = 0
        try:
            self.char += len(self.data[self.byte:offset].decode("utf-8"))
        except UnicodeDecodeError:
            raise TolkError(
                Status.ERROR_INTERNAL,
                "byte offset %d is not on a character boundary of the %s of text %d"
                % (offset, self.what, self.index),
            ) from None
        if offset < len(self.data) and (self.data[offset] & 0xC0) == 0x80:
            raise TolkError(
                Status.ERROR_INTERNAL,
                "byte offset %d is not on a character boundary of the %s of text %d"
                % (offset, self.what, self.index),
            )
        self.byte = offset
        return self.char


class Translator:
    """A translator (``TolkTranslator``) over a :class:`Model`.

    A translator runs ``inter_threads`` workers that share the model's weights, each
    with its own decoding state and ``intra_threads`` threads (CTranslate2's meaning).
    Any number of threads may call ``translate_batch`` / ``translate_text`` on one
    translator at the same time (ctypes releases the GIL during each library call):
    their batches queue for the workers, so up to ``inter_threads`` batches run in
    parallel.  ``translate_batch_async`` / ``translate_text_async`` return a
    :class:`Job` at once.  Several translators may share one model.  Closing a
    translator cancels its jobs in flight; closing it while another thread is inside
    a blocking call on it is the caller's error.
    """

    def __init__(
        self,
        model,
        compute_type: str = "default",
        intra_threads: int = 1,
        device: Optional[str] = None,
        source_tokenizer: Optional[str] = None,
        target_tokenizer: Optional[str] = None,
        device_index: int = 0,
        inter_threads: int = 1,
        files=None,
        kv_cache_type: Optional[str] = None,
    ):
        """``model`` is a :class:`Model` or, as in ``ctranslate2.Translator``, a model
        directory (then loaded with ``compute_type``, ``device`` (None = "auto"),
        ``device_index``, ``source_tokenizer`` and ``target_tokenizer`` -- see
        :class:`Model` -- and owned by this translator), or with ``files`` the name of
        a model loaded from those files in memory (:meth:`Model.from_files`).  With a :class:`Model`,
        ``device`` None runs where the model is; another device loads a copy of the
        weights there.  ``kv_cache_type`` is the default of every call's (see
        :meth:`translate_batch`).
        The tokenizers belong to the model: pass them to :class:`Model` when you load
        it yourself."""
        self._lib = _get_lib()
        self._ptr = None
        if isinstance(model, (str, bytes, os.PathLike)):
            model = Model(
                model,
                compute_type=compute_type,
                source_tokenizer=source_tokenizer,
                target_tokenizer=target_tokenizer,
                device=device if device is not None else "auto",
                device_index=device_index,
                files=files,
            )
            device = None  # the model is already there
        elif source_tokenizer is not None or target_tokenizer is not None or files is not None:
            raise ValueError(
                "source_tokenizer/target_tokenizer/files are read when a model is loaded: pass them "
                "to tolk.Model(), or give Translator a model directory or name"
            )
        if not isinstance(model, Model):
            raise TypeError("model must be a tolk.Model or a model directory")
        if model.closed:
            raise ValueError("the model is closed")
        self.model = model  # keeps the Python object alive too
        self.compute_type = compute_type
        opts = self._lib.tolk_translator_options_default()
        self._device_b = device.encode("utf-8") if device is not None else None
        self._compute_b = compute_type.encode("utf-8") if compute_type is not None else None
        opts.device = self._device_b
        opts.compute_type = self._compute_b
        opts.intra_threads = _u32("intra_threads", intra_threads)
        opts.device_index = _u32("device_index", device_index)
        opts.inter_threads = _u32("inter_threads", inter_threads)
        self._kv_b = kv_cache_type.encode("utf-8") if kv_cache_type is not None else None
        opts.kv_cache_type = self._kv_b
        out = _TranslatorP()
        status = self._lib.tolk_translator_new(model._ptr, ctypes.byref(opts), ctypes.byref(out))
        _check(self._lib, status)
        if not out:
            raise TolkError(Status.ERROR_INTERNAL, "tolk_translator_new returned TOLK_OK but no translator")
        self._ptr = out

    @property
    def closed(self) -> bool:
        return not self._ptr

    def close(self):
        ptr, self._ptr = self._ptr, None
        if ptr:
            self._lib.tolk_translator_free(ptr)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self):
        return "tolk.Translator(%r, compute_type=%r%s)" % (
            self.model.path,
            self.compute_type,
            ", closed" if self.closed else "",
        )

    def translate_batch(
        self,
        source: Sequence[Sequence[str]],
        target_prefix: Optional[Sequence[Optional[Sequence[str]]]] = None,
        beam_size: Optional[int] = None,
        patience: float = 1.0,
        length_penalty: Optional[float] = None,
        num_hypotheses: int = 1,
        return_scores: bool = False,
        max_input_length: int = 1024,
        max_decoding_length: int = 256,
        min_decoding_length: Optional[int] = None,
        end_token: Union[str, Sequence[str], None] = None,
        disable_unk: Optional[bool] = None,
        repetition_penalty: float = 1.0,
        no_repeat_ngram_size: int = 0,
        sampling_topk: int = 1,
        sampling_topp: float = 1.0,
        sampling_temperature: float = 1.0,
        sampling_seed: Optional[int] = None,
        return_attention: bool = False,
        replace_unknowns: bool = False,
        suppress_sequences: Optional[Sequence[Sequence[str]]] = None,
        return_end_token: bool = False,
        max_batch_size: Optional[int] = None,
        batch_type: str = "examples",
        max_length_factor: Optional[float] = None,
        use_shortlist: Optional[bool] = None,
        use_vmap: bool = False,
        kv_cache_type: Optional[str] = None,
        max_decoding_memory_mb: Optional[int] = None,
        progress=None,
        on_token=None,
    ) -> List[TranslationResult]:
        """Translate a batch of token lists; same arguments and defaults as
        ``ctranslate2.Translator.translate_batch``.

        ``progress``, if given, is called as ``progress(done, total)`` on this thread
        after each batch of ``max_batch_size`` (``done`` sentences of ``total``
        translated; ``done`` reaches ``total`` on a completed call, an empty batch makes
        no call). Returning ``False`` stops the translation and raises
        :class:`TolkCancelled`; ``None`` or ``True`` goes on. An exception raised by
        ``progress`` stops the translation too and is raised from this call.

        ``on_token``, if given (greedy search only: ``beam_size=1``), is called as
        ``on_token(event)`` with a :class:`TokenEvent` for each generated token, on the
        translator's threads; returning ``False`` ends that sentence there.

        ``repetition_penalty`` and ``no_repeat_ngram_size`` are CTranslate2's: the logits of
        tokens a hypothesis already holds (its target prefix included) are divided by the
        penalty (multiplied where negative; 1 = off), and no hypothesis holds an n-gram of
        that size twice (0 = off). So are ``suppress_sequences`` (token lists no hypothesis
        may contain), ``return_end_token``, ``return_attention`` (``result.attention``:
        per hypothesis and token, the attention over the source tokens) and
        ``replace_unknowns`` (an unknown target token becomes the source token it attends
        to most); the last two on the CPU only. ``sampling_topk`` (0 = all tokens, 1 = no
        sampling), ``sampling_topp`` and ``sampling_temperature`` are CTranslate2's random
        sampling (``beam_size=1``, one hypothesis); ``sampling_seed`` (not a CTranslate2
        argument) makes a call's samples repeatable whatever its threads (another
        batching can change the logits in their last bits, and with them a draw).

        ``kv_cache_type`` (not a CTranslate2 argument) is how decoding keeps attention keys
        and values, most of its memory: ``"float32"`` (``None``: CTranslate2's results),
        ``"bfloat16"`` (half the memory) or ``"int8"`` (about a quarter), which round them
        and so change the last bits of scores and sometimes a word.

        ``max_decoding_memory_mb`` (not a CTranslate2 argument): where the batches of a call
        are decoded together (greedy search), the decoding state (attention keys and
        values) planned for, in MB: sentences wait to start until theirs fits, for a lower
        peak memory and fewer rows a step. ``None``: automatic, half the model's weights, at
        least 32 MB (39 MB for zh-en in int8); ``0``: no bound. The results are the same either way."""
        keep, opts, args, streams = self._batch_arguments(
            source, target_prefix, progress, on_token, beam_size=beam_size, patience=patience,
            length_penalty=length_penalty, num_hypotheses=num_hypotheses, return_scores=return_scores,
            max_input_length=max_input_length, max_decoding_length=max_decoding_length,
            min_decoding_length=min_decoding_length, end_token=end_token, disable_unk=disable_unk,
            repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size,
            sampling_topk=sampling_topk, sampling_topp=sampling_topp, sampling_temperature=sampling_temperature,
            sampling_seed=sampling_seed,
            return_attention=return_attention, replace_unknowns=replace_unknowns,
            suppress_sequences=suppress_sequences, return_end_token=return_end_token,
            max_batch_size=max_batch_size, batch_type=batch_type, max_length_factor=max_length_factor,
            use_shortlist=use_shortlist, use_vmap=use_vmap, kv_cache_type=kv_cache_type,
            max_decoding_memory_mb=max_decoding_memory_mb)
        out = _ResultP()
        with _CtrlCCancels(streams):
            status = self._lib.tolk_translate_batch(self._ptr, *args, ctypes.byref(opts), ctypes.byref(out))
        for stream in streams:
            if stream.error is not None:
                self._lib.tolk_result_free(out)  # NULL after a cancel; no-op
                stream.reraise()
        _check(self._lib, status)
        try:
            return self._read_result(out, return_scores, return_attention)
        finally:
            self._lib.tolk_result_free(out)

    def translate_batch_async(self, source, target_prefix=None, *, on_token=None, **options) -> "Job":
        """Queues :meth:`translate_batch` (same arguments, without ``progress``) and returns
        a :class:`Job` at once; ``job.result()`` gives the list of :class:`TranslationResult`."""
        if "progress" in options:
            raise TypeError("translate_batch_async has no progress callback: use Job.progress()")
        keep, opts, args, streams = self._batch_arguments(source, target_prefix, None, on_token, **options)
        return_scores = bool(options.get("return_scores", False))
        return_attention = bool(options.get("return_attention", False))
        out = _JobP()
        status = self._lib.tolk_translate_batch_async(
            self._ptr, *args, ctypes.byref(opts), TolkJobCallback(), None, ctypes.byref(out))
        _check(self._lib, status)

        def read(job_ptr):
            res = _ResultP()
            _check(self._lib, self._lib.tolk_job_result(job_ptr, ctypes.byref(res)))
            try:
                return self._read_result(res, return_scores, return_attention)
            finally:
                self._lib.tolk_result_free(res)

        return Job(self._lib, out, keep, read, streams)

    def _batch_arguments(self, source, target_prefix, progress, on_token, **options):
        """Checks a token batch and builds its C arguments: (keep, options, (sources,
        source lengths, count, prefixes, prefix lengths), callback wrappers)."""
        if self.closed:
            raise ValueError("the translator is closed")
        if isinstance(source, (str, bytes)):
            raise TypeError("source must be a list of token lists")
        source = list(source)
        batch = len(source)
        if target_prefix is not None:
            target_prefix = list(target_prefix)
            if len(target_prefix) != batch:
                raise ValueError(
                    "target_prefix has %d entries but the batch has %d" % (len(target_prefix), batch)
                )
        keep = []  # keeps every ctypes buffer and thunk alive during the call
        opts = self._translate_options(keep, **options)
        streams = [w for w in (_set_progress(opts, progress, keep), _set_on_token(opts, on_token, keep)) if w]
        src_ptrs, src_lens = self._token_arrays(source, keep, allow_none=False)
        if target_prefix is None:
            tp_ptrs, tp_lens = None, None
        else:
            tp_ptrs, tp_lens = self._token_arrays(target_prefix, keep, allow_none=True)
        return keep, opts, (src_ptrs, src_lens, batch, tp_ptrs, tp_lens), streams

    def _translate_options(self, keep, *, beam_size=None, patience=1.0, length_penalty=None, num_hypotheses=1,
                           return_scores=False, max_input_length=1024, max_decoding_length=256,
                           min_decoding_length=None, end_token=None, disable_unk=None, max_batch_size=None,
                           batch_type="examples", max_length_factor=None, use_shortlist=None, use_vmap=False,
                           kv_cache_type=None, max_decoding_memory_mb=None, repetition_penalty=1.0,
                           no_repeat_ngram_size=0, return_attention=False, replace_unknowns=False,
                           suppress_sequences=None, return_end_token=False, sampling_topk=1, sampling_topp=1.0,
                           sampling_temperature=1.0, sampling_seed=None):
        """The C options of a call: the translator's defaults (a Marian package's beam size,
        length factor, ...), then the arguments given (the one list of the translation
        arguments' defaults; None keeps the translator's)."""
        if batch_type not in BATCH_TYPES:
            raise ValueError("batch_type must be 'examples' or 'tokens', got %r" % (batch_type,))
        # The model's defaults (a Marian package's beam size, length factor, ...); None
        # arguments keep them.
        opts = TolkTranslateOptions()
        opts.struct_size = ctypes.sizeof(TolkTranslateOptions)
        _check(self._lib, self._lib.tolk_translator_translate_options(self._ptr, ctypes.byref(opts)))
        if beam_size is not None:
            opts.beam_size = _u32("beam_size", beam_size)
        opts.patience = float(patience)
        if length_penalty is not None:
            opts.length_penalty = float(length_penalty)
        opts.num_hypotheses = _u32("num_hypotheses", num_hypotheses)
        opts.return_scores = bool(return_scores)
        opts.max_input_length = _u32("max_input_length", max_input_length)
        opts.max_decoding_length = _u32("max_decoding_length", max_decoding_length)
        if min_decoding_length is not None:
            opts.min_decoding_length = _u32("min_decoding_length", min_decoding_length)
        # One token or a list of them, as CTranslate2 takes it.
        if isinstance(end_token, (str, bytes)):
            end_token = [end_token]
        if end_token is not None:
            ends = [_encode_token(t) for t in end_token]
            array = (ctypes.c_char_p * max(len(ends), 1))(*ends)
            keep.append(array)
            opts.end_tokens, opts.num_end_tokens = ctypes.cast(array, _CharPP), len(ends)
        if disable_unk is not None:
            opts.disable_unk = bool(disable_unk)
        opts.repetition_penalty = float(repetition_penalty)
        opts.no_repeat_ngram_size = _u32("no_repeat_ngram_size", no_repeat_ngram_size)
        opts.return_attention = bool(return_attention)
        opts.replace_unknowns = bool(replace_unknowns)
        if suppress_sequences:
            if isinstance(suppress_sequences, (str, bytes)):
                raise TypeError("suppress_sequences must be a list of token lists")
            sequences = [list(seq) for seq in suppress_sequences]
            opts.suppress_sequences, opts.suppress_sequence_lengths = self._token_arrays(sequences, keep, allow_none=False)
            opts.num_suppress_sequences = len(sequences)
        opts.return_end_token = bool(return_end_token)
        opts.sampling_topk = _u32("sampling_topk", sampling_topk)
        opts.sampling_topp = float(sampling_topp)
        opts.sampling_temperature = float(sampling_temperature)
        if sampling_seed is not None and not 0 < int(sampling_seed) < 2 ** 64:
            raise ValueError("sampling_seed must be in [1, 2**64), got %r" % (sampling_seed,))
        opts.sampling_seed = 0 if sampling_seed is None else int(sampling_seed)
        if max_batch_size is not None:
            opts.max_batch_size = _u32("max_batch_size", max_batch_size)
        opts.batch_type = BATCH_TYPES[batch_type]
        if max_length_factor is not None:
            opts.max_length_factor = float(max_length_factor)
        if use_shortlist is not None:
            opts.use_shortlist = bool(use_shortlist)
        opts.use_vmap = bool(use_vmap)
        if kv_cache_type is not None:
            kv_b = str(kv_cache_type).encode("utf-8")
            keep.append(kv_b)
            opts.kv_cache_type = kv_b
        if max_decoding_memory_mb is not None:
            if not 0 <= int(max_decoding_memory_mb) < DECODING_MEMORY_AUTO:
                raise ValueError("max_decoding_memory_mb must be in [0, %d), got %r" % (DECODING_MEMORY_AUTO, max_decoding_memory_mb))
            opts.max_decoding_memory_mb = _u32("max_decoding_memory_mb", max_decoding_memory_mb)
        return opts

    def translate_text(
        self,
        text: Union[str, Sequence[str]],
        *,
        beam_size: Optional[int] = None,
        patience: float = 1.0,
        length_penalty: Optional[float] = None,
        return_scores: bool = False,
        max_input_length: int = 1024,
        max_decoding_length: int = 256,
        min_decoding_length: Optional[int] = None,
        end_token: Optional[str] = None,
        disable_unk: Optional[bool] = None,
        repetition_penalty: float = 1.0,
        no_repeat_ngram_size: int = 0,
        sampling_topk: int = 1,
        sampling_topp: float = 1.0,
        sampling_temperature: float = 1.0,
        sampling_seed: Optional[int] = None,
        replace_unknowns: bool = False,
        suppress_sequences: Optional[Sequence[Sequence[str]]] = None,
        max_batch_size: Optional[int] = None,
        batch_type: str = "examples",
        max_length_factor: Optional[float] = None,
        use_shortlist: Optional[bool] = None,
        use_vmap: bool = False,
        kv_cache_type: Optional[str] = None,
        max_decoding_memory_mb: Optional[int] = None,
        split: str = "sentences",
        max_sentence_tokens: int = 128,
        return_sentences: bool = False,
        progress=None,
        on_token=None,
    ):
        """Translate text (UTF-8 text in, text out) with the model's SentencePiece model.

        ``text`` is a ``str`` (gives a ``str``) or a list of ``str`` (gives a list,
        in order; all their sentences are translated together, sorted by length).
        Each text is cut into sentences (``split``: ``"sentences"`` -- sentence ends
        inside each line, line breaks always end one; ``"lines"`` -- each non-blank
        line is one sentence; ``"whole"`` -- the text is one sentence), sentences
        longer than ``max_sentence_tokens`` source tokens (end token included) are
        cut into parts, and every translation is put back between the source's own
        spaces, line breaks and blank lines.

        The decoding arguments are those of :meth:`translate_batch` (one hypothesis
        per sentence; ``max_batch_size`` 0 means batches of 32 sentences here).
        With ``return_sentences=True`` the result is a :class:`TextTranslation`
        (or a list of them) whose ``sentences`` give each source sentence, its
        translation and their spans (str indices); scores are set only with
        ``return_scores=True``.

        Texts may contain any character, NUL included (texts are passed with their
        byte lengths); a ``str`` that cannot be encoded as UTF-8 (lone surrogates)
        raises ``UnicodeEncodeError``.

        ``progress``, if given, is called as ``progress(done, total)`` on this thread
        after each batch, counting the sentences (and parts of wrapped sentences) of all
        texts; ``done`` reaches ``total`` on a completed call, and texts without any
        sentence make no call. Returning ``False`` stops the translation and raises
        :class:`TolkCancelled`; ``None`` or ``True`` goes on. An exception raised by
        ``progress`` (a ``KeyboardInterrupt`` too) stops the translation and is raised
        from this call.

        ``on_token``, if given (greedy search only: ``beam_size=1``), is called as
        ``on_token(event)`` for each generated token with a :class:`TokenEvent` whose
        ``text`` is the sentence's translation so far, on the translator's threads;
        returning ``False`` ends that sentence there.
        """
        single, texts, keep, opts, text_opts, args, streams, encoded = self._text_arguments(
            text, progress, on_token, beam_size=beam_size, patience=patience,
            length_penalty=length_penalty, return_scores=return_scores,
            max_input_length=max_input_length, max_decoding_length=max_decoding_length,
            min_decoding_length=min_decoding_length, end_token=end_token, disable_unk=disable_unk,
            repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size,
            sampling_topk=sampling_topk, sampling_topp=sampling_topp, sampling_temperature=sampling_temperature,
            sampling_seed=sampling_seed,
            replace_unknowns=replace_unknowns, suppress_sequences=suppress_sequences,
            max_batch_size=max_batch_size, batch_type=batch_type, max_length_factor=max_length_factor,
            use_shortlist=use_shortlist, use_vmap=use_vmap, kv_cache_type=kv_cache_type,
            max_decoding_memory_mb=max_decoding_memory_mb, split=split, max_sentence_tokens=max_sentence_tokens)
        out = _TextResultP()
        with _CtrlCCancels(streams):
            status = self._lib.tolk_translate_text_batch(
                self._ptr, *args, ctypes.byref(opts), ctypes.byref(text_opts), ctypes.byref(out))
        for stream in streams:
            if stream.error is not None:
                self._lib.tolk_text_result_free(out)  # NULL after a cancel; no-op
                stream.reraise()
        _check(self._lib, status)
        try:
            results = self._read_text_result(out, texts, encoded, return_sentences, return_scores)
        finally:
            self._lib.tolk_text_result_free(out)
        return results[0] if single else results

    def translate_text_async(self, text, *, on_token=None, return_sentences=False, **options) -> "Job":
        """Queues :meth:`translate_text` (same arguments, without ``progress``) and returns
        a :class:`Job` at once; ``job.result()`` gives what translate_text would return.
        Texts are split and tokenized before this returns."""
        if "progress" in options:
            raise TypeError("translate_text_async has no progress callback: use Job.progress()")
        single, texts, keep, opts, text_opts, args, streams, encoded = self._text_arguments(
            text, None, on_token, **options)
        return_scores = bool(options.get("return_scores", False))
        out = _JobP()
        status = self._lib.tolk_translate_text_async(
            self._ptr, *args, ctypes.byref(opts), ctypes.byref(text_opts), TolkJobCallback(), None,
            ctypes.byref(out))
        _check(self._lib, status)

        def read(job_ptr):
            res = _TextResultP()
            _check(self._lib, self._lib.tolk_job_text_result(job_ptr, ctypes.byref(res)))
            try:
                results = self._read_text_result(res, texts, encoded, return_sentences, return_scores)
            finally:
                self._lib.tolk_text_result_free(res)
            return results[0] if single else results

        return Job(self._lib, out, keep, read, streams)

    def _text_options(self, split, max_sentence_tokens):
        """Checks and converts the text arguments into a TolkTextOptions."""
        if split not in SPLIT_MODES:
            raise ValueError(
                "split must be one of %s, got %r" % (", ".join(repr(k) for k in SPLIT_MODES), split)
            )
        text_opts = self._lib.tolk_text_options_default()
        text_opts.split_mode = SPLIT_MODES[split]
        text_opts.max_sentence_tokens = _u32("max_sentence_tokens", max_sentence_tokens)
        return text_opts

    def _text_arguments(self, text, progress, on_token, split="sentences", max_sentence_tokens=128, **options):
        """Checks texts and builds their C arguments."""
        if self.closed:
            raise ValueError("the translator is closed")
        single = isinstance(text, str)
        if single:
            texts = [text]
        elif isinstance(text, (bytes, bytearray)):
            raise TypeError("text must be a str or a list of str, got bytes (decode it first)")
        else:
            texts = list(text)
            for i, t in enumerate(texts):
                if not isinstance(t, str):
                    raise TypeError("text[%d] must be a str, got %r" % (i, type(t).__name__))
        text_opts = self._text_options(split, max_sentence_tokens)

        keep = []
        opts = self._translate_options(keep, num_hypotheses=1, **options)
        streams = [w for w in (_set_progress(opts, progress, keep), _set_on_token(opts, on_token, keep)) if w]

        encoded = [t.encode("utf-8") for t in texts]
        n = len(encoded)
        # Explicit byte lengths: texts may hold NUL. One slot minimum, never NULL arrays.
        ptrs = (ctypes.c_char_p * max(n, 1))(*encoded)
        lens = (ctypes.c_size_t * max(n, 1))(*[len(b) for b in encoded])
        keep += [ptrs, lens]
        args = (ctypes.cast(ptrs, _CharPP), lens, n)
        return single, texts, keep, opts, text_opts, args, streams, encoded

    def _read_text_result(self, res, texts, encoded, return_sentences, return_scores):
        lib = self._lib
        count = lib.tolk_text_result_count(res)
        if count != len(texts):
            raise TolkError(
                Status.ERROR_INTERNAL, "%d texts translated but %d were given" % (count, len(texts))
            )
        results = []
        for i in range(count):
            length = ctypes.c_size_t(0)
            ptr = lib.tolk_text_result_text(res, i, ctypes.byref(length))
            if not ptr:
                raise TolkError(Status.ERROR_INTERNAL, "tolk_text_result_text(%d) returned NULL" % i)
            target_b = ctypes.string_at(ptr, length.value)
            target = target_b.decode("utf-8")
            if not return_sentences:
                results.append(target)
                continue
            parts = []
            for k in range(lib.tolk_text_result_num_sentences(res, i)):
                info = lib.tolk_sentence_info_default()
                _check(lib, lib.tolk_text_result_sentence(res, i, k, ctypes.byref(info)))
                parts.append((info.source_begin, info.source_end, info.target_begin,
                              info.target_end, float(info.score), int(info.sentence)))
            src_index = _CharIndex(encoded[i], "source", i)
            tgt_index = _CharIndex(target_b, "translation", i)
            sentences = []
            for sb, se, tb, te, score, sentence in parts:
                s0, s1 = src_index(sb), src_index(se)
                t0, t1 = tgt_index(tb), tgt_index(te)
                sentences.append(
                    Sentence(
                        source=texts[i][s0:s1],
                        target=target[t0:t1],
                        source_span=(s0, s1),
                        target_span=(t0, t1),
                        score=score if return_scores and not math.isnan(score) else None,
                        sentence_index=sentence,
                    )
                )
            results.append(TextTranslation(target, sentences))
        return results

    @staticmethod
    def _token_arrays(batch_tokens, keep, allow_none):
        n = len(batch_tokens)
        # Never hand the library NULL for a (possibly empty) batch: one slot minimum.
        outer = (_CharPP * max(n, 1))()
        lens = (ctypes.c_size_t * max(n, 1))()
        for i, toks in enumerate(batch_tokens):
            if toks is None:
                if not allow_none:
                    raise TypeError("source[%d] is None" % i)
                outer[i] = None
                lens[i] = 0
                continue
            if isinstance(toks, (str, bytes)):
                raise TypeError("each example must be a list of tokens, got a string")
            enc = [_encode_token(t) for t in toks]
            arr = (ctypes.c_char_p * max(len(enc), 1))(*enc)
            keep.append(arr)
            outer[i] = ctypes.cast(arr, _CharPP)
            lens[i] = len(enc)
        keep.append(outer)
        keep.append(lens)
        return ctypes.cast(outer, _CharPPP), ctypes.cast(lens, ctypes.POINTER(ctypes.c_size_t))

    def _read_result(self, res, return_scores, return_attention=False) -> List[TranslationResult]:
        lib = self._lib
        results = []
        n = lib.tolk_result_batch_size(res)
        for i in range(n):
            hyps, scores, attention = [], [], []
            for r in range(lib.tolk_result_num_hypotheses(res, i)):
                toks = _CharPP()
                length = ctypes.c_size_t()
                score = ctypes.c_float(math.nan)
                status = lib.tolk_result_hypothesis(
                    res, i, r, ctypes.byref(toks), ctypes.byref(length), ctypes.byref(score)
                )
                _check(lib, status)
                hyps.append([toks[k].decode("utf-8") for k in range(length.value)])
                if return_scores:
                    scores.append(float(score.value))
                if return_attention:
                    values = ctypes.POINTER(ctypes.c_float)()
                    rows, columns = ctypes.c_size_t(), ctypes.c_size_t()
                    _check(lib, lib.tolk_result_attention(
                        res, i, r, ctypes.byref(values), ctypes.byref(rows), ctypes.byref(columns)))
                    cols = columns.value
                    attention.append([values[t * cols:(t + 1) * cols] for t in range(rows.value)]
                                     if cols else [[] for _ in hyps[-1]])
            results.append(TranslationResult(hyps, scores, attention))
        return results

    def translate_file(
        self,
        input_path,
        output_path,
        *,
        tokens: bool = False,
        read_batch_size: int = 0,
        beam_size: Optional[int] = None,
        patience: float = 1.0,
        length_penalty: Optional[float] = None,
        num_hypotheses: int = 1,
        return_scores: bool = False,
        max_input_length: int = 1024,
        max_decoding_length: int = 256,
        min_decoding_length: Optional[int] = None,
        end_token: Optional[str] = None,
        disable_unk: Optional[bool] = None,
        repetition_penalty: float = 1.0,
        no_repeat_ngram_size: int = 0,
        sampling_topk: int = 1,
        sampling_topp: float = 1.0,
        sampling_temperature: float = 1.0,
        sampling_seed: Optional[int] = None,
        replace_unknowns: bool = False,
        suppress_sequences: Optional[Sequence[Sequence[str]]] = None,
        max_batch_size: Optional[int] = None,
        batch_type: str = "examples",
        max_length_factor: Optional[float] = None,
        use_shortlist: Optional[bool] = None,
        kv_cache_type: Optional[str] = None,
        max_decoding_memory_mb: Optional[int] = None,
        split: str = "sentences",
        max_sentence_tokens: int = 128,
        progress=None,
    ) -> None:
        """Translate a file line by line into another (``tolk_translate_file``), with
        memory bounded by ``read_batch_size`` lines (0 = 8 batches) whatever the
        file's size; ``"-"`` (or ``None``) is standard input or output.

        Each line is a text (``split`` and ``max_sentence_tokens`` as in
        :meth:`translate_text`; empty lines stay empty) or, with ``tokens=True``,
        space-separated tokens, each hypothesis one output line. With
        ``return_scores`` every line starts with its scores and ``" ||| "``, as the
        ``tolk-translate`` CLI prints them. The other arguments are those of
        :meth:`translate_batch` (``max_batch_size`` 0: batches of 32 sentences).

        ``progress(lines_done, lines_total)`` is called on this thread; the total is
        counted beforehand for a regular file, else 0 until the end of the input is
        read. Returning ``False`` raises :class:`TolkCancelled`. A failed call leaves
        no output file (it is written beside and renamed once complete).
        """
        if self.closed:
            raise ValueError("the translator is closed")
        text_opts = self._text_options(split, max_sentence_tokens)
        lib = self._lib
        keep = []
        opts = self._translate_options(
            keep,
            beam_size=beam_size,
            patience=patience,
            length_penalty=length_penalty,
            num_hypotheses=num_hypotheses,
            return_scores=return_scores,
            max_input_length=max_input_length,
            max_decoding_length=max_decoding_length,
            min_decoding_length=min_decoding_length,
            end_token=end_token,
            disable_unk=disable_unk,
            repetition_penalty=repetition_penalty,
            no_repeat_ngram_size=no_repeat_ngram_size,
            sampling_topk=sampling_topk, sampling_topp=sampling_topp, sampling_temperature=sampling_temperature,
            sampling_seed=sampling_seed,
            replace_unknowns=replace_unknowns,
            suppress_sequences=suppress_sequences,
            max_batch_size=max_batch_size,
            batch_type=batch_type,
            max_length_factor=max_length_factor,
            use_shortlist=use_shortlist,
            kv_cache_type=kv_cache_type,
            max_decoding_memory_mb=max_decoding_memory_mb,
        )
        reporter = _set_progress(opts, progress, keep)
        stream = lib.tolk_stream_options_default()
        stream.read_batch_size = _u32("read_batch_size", read_batch_size)
        stream.tokens = bool(tokens)
        with _CtrlCCancels([reporter] if reporter is not None else []):
            status = lib.tolk_translate_file(
                self._ptr,
                _path_bytes(_fspath_or_none(input_path)),
                _path_bytes(_fspath_or_none(output_path)),
                ctypes.byref(opts),
                ctypes.byref(text_opts),
                ctypes.byref(stream),
            )
        if reporter is not None:
            reporter.reraise()
        _check(lib, status)


def _main(argv=None):
    import argparse

    ap = argparse.ArgumentParser(description="Print the Tolk library version.")
    ap.parse_args(argv)
    print("tolk %s (ABI %d) at %s" % (version(), abi_version(), library_path()))


if __name__ == "__main__":
    _main()
