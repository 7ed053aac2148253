"""ctypes binding for the Tolk C API (include/tolk.h).

A small, dependency-free wrapper that mirrors ``ctranslate2.Translator``::

    import tolk

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

Errors raise :class:`TolkError` with the status code and ``tolk_last_error()``.
"""

import ctypes
import ctypes.util
import math
import os
import sys
from typing import List, Optional, Sequence

__all__ = [
    "TolkError",
    "Model",
    "Translator",
    "TranslationResult",
    "version",
    "abi_version",
    "status_string",
    "library_path",
    "Status",
    "ABI_VERSION",
]

ABI_VERSION = 1


class Status:
    OK = 0
    ERROR_NULL_POINTER = 1
    ERROR_INVALID_ARGUMENT = 2
    ERROR_IO = 3
    ERROR_INVALID_MODEL = 4
    ERROR_UNSUPPORTED = 5
    ERROR_OUT_OF_RANGE = 6
    ERROR_INTERNAL = 7

    NAMES = {
        0: "TOLK_OK",
        1: "TOLK_ERROR_NULL_POINTER",
        2: "TOLK_ERROR_INVALID_ARGUMENT",
        3: "TOLK_ERROR_IO",
        4: "TOLK_ERROR_INVALID_MODEL",
        5: "TOLK_ERROR_UNSUPPORTED",
        6: "TOLK_ERROR_OUT_OF_RANGE",
        7: "TOLK_ERROR_INTERNAL",
    }


BATCH_TYPES = {"examples": 0, "tokens": 1}


class TolkError(RuntimeError):
    """A Tolk call failed: ``status`` is the TolkStatus code, ``message`` the
    text of ``tolk_last_error()``."""

    def __init__(self, status: int, message: str):
        self.status = int(status)
        self.message = message
        name = Status.NAMES.get(self.status, "status %d" % self.status)
        super().__init__("%s: %s" % (name, message) if message else name)


# --------------------------------------------------------------------------- C types


class TolkModelOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("compute_type", ctypes.c_char_p),
    ]


_ModelOptions = TolkModelOptions


class TolkTranslatorOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("device", ctypes.c_char_p),
        ("compute_type", ctypes.c_char_p),
        ("intra_threads", ctypes.c_uint32),
    ]


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
    ]


class _TolkModel(ctypes.Structure):
    pass


class _TolkTranslator(ctypes.Structure):
    pass


class _TolkResult(ctypes.Structure):
    pass


_ModelP = ctypes.POINTER(_TolkModel)
_TranslatorP = ctypes.POINTER(_TolkTranslator)
_ResultP = ctypes.POINTER(_TolkResult)
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
    fn("tolk_model_compute_type", ctypes.c_char_p, _ModelP)
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
    fn("tolk_result_free", None, _ResultP)
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


def _last_error(lib) -> str:
    msg = lib.tolk_last_error()
    return msg.decode("utf-8", "replace") if msg else ""


def _check(lib, status: int):
    if status != Status.OK:
        raise TolkError(status, _last_error(lib))


def version() -> str:
    return _get_lib().tolk_version().decode("utf-8")


def abi_version() -> int:
    return int(_get_lib().tolk_abi_version())


def cpu_isa() -> str:
    """The CPU kernel path in use ("scalar", "avx2", "avxvnni", "avx512bw", "avx512vnni")."""
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


# --------------------------------------------------------------------------- objects


class Model:
    """An immutable loaded model (``TolkModel``); shareable across threads and
    translators."""

    def __init__(self, path: str, compute_type: str = "default"):
        """Loads ``path`` with the weights converted for ``compute_type`` ("default":
        as saved; "auto", "float32", "int8", "int16")."""
        self._lib = _get_lib()
        self._ptr = None
        self.path = os.fspath(path)
        out = _ModelP()
        opts = self._lib.tolk_model_options_default()
        compute_b = compute_type.encode("utf-8") if compute_type is not None else None
        opts.compute_type = compute_b
        status = self._lib.tolk_model_load_with_options(self.path.encode("utf-8"), ctypes.byref(opts), ctypes.byref(out))
        _check(self._lib, status)
        if not out:
            raise TolkError(Status.ERROR_INTERNAL, "tolk_model_load returned TOLK_OK but no model")
        self._ptr = out

    @property
    def closed(self) -> bool:
        return not self._ptr

    @property
    def compute_type(self) -> str:
        """What the weights were loaded for: "float32", "int8_float32" or "int16"."""
        return self._lib.tolk_model_compute_type(self._ptr).decode("ascii")

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

    __slots__ = ("hypotheses", "scores")

    def __init__(self, hypotheses: List[List[str]], scores: List[float]):
        self.hypotheses = hypotheses
        self.scores = scores

    def __eq__(self, other):
        return (
            isinstance(other, TranslationResult)
            and self.hypotheses == other.hypotheses
            and self.scores == other.scores
        )

    def __repr__(self):
        return "TranslationResult(hypotheses=%r, scores=%r)" % (self.hypotheses, self.scores)


class Translator:
    """A translator (``TolkTranslator``) over a :class:`Model`.

    Calls on one translator are serialized by the library; use several
    translators (sharing one model) for parallel work.
    """

    def __init__(
        self,
        model,
        compute_type: str = "default",
        intra_threads: int = 1,
        device: str = "cpu",
    ):
        """``model`` is a :class:`Model` or, as in ``ctranslate2.Translator``, a model
        directory (then loaded with ``compute_type`` and owned by this translator)."""
        self._lib = _get_lib()
        self._ptr = None
        if isinstance(model, (str, os.PathLike)):
            model = Model(model, compute_type=compute_type)
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
        opts.intra_threads = int(intra_threads)
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
        beam_size: int = 2,
        patience: float = 1.0,
        length_penalty: float = 1.0,
        num_hypotheses: int = 1,
        return_scores: bool = False,
        max_input_length: int = 1024,
        max_decoding_length: int = 256,
        min_decoding_length: int = 1,
        end_token: Optional[str] = None,
        disable_unk: bool = False,
        max_batch_size: int = 0,
        batch_type: str = "examples",
    ) -> List[TranslationResult]:
        """Translate a batch of token lists; same arguments and defaults as
        ``ctranslate2.Translator.translate_batch``."""
        if self.closed:
            raise ValueError("the translator is closed")
        if batch_type not in BATCH_TYPES:
            raise ValueError("batch_type must be 'examples' or 'tokens', got %r" % (batch_type,))
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

        opts = self._lib.tolk_translate_options_default()
        opts.beam_size = int(beam_size)
        opts.patience = float(patience)
        opts.length_penalty = float(length_penalty)
        opts.num_hypotheses = int(num_hypotheses)
        opts.return_scores = bool(return_scores)
        opts.max_input_length = int(max_input_length)
        opts.max_decoding_length = int(max_decoding_length)
        opts.min_decoding_length = int(min_decoding_length)
        end_b = _encode_token(end_token) if end_token is not None else None
        opts.end_token = end_b
        opts.disable_unk = bool(disable_unk)
        opts.max_batch_size = int(max_batch_size)
        opts.batch_type = BATCH_TYPES[batch_type]

        keep = []  # keeps every ctypes buffer alive during the call
        src_ptrs, src_lens = self._token_arrays(source, keep, allow_none=False)
        if target_prefix is None:
            tp_ptrs, tp_lens = None, None
        else:
            tp_ptrs, tp_lens = self._token_arrays(target_prefix, keep, allow_none=True)

        out = _ResultP()
        status = self._lib.tolk_translate_batch(
            self._ptr,
            src_ptrs,
            src_lens,
            batch,
            tp_ptrs,
            tp_lens,
            ctypes.byref(opts),
            ctypes.byref(out),
        )
        _check(self._lib, status)
        try:
            return self._read_result(out, return_scores)
        finally:
            self._lib.tolk_result_free(out)

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

    def _read_result(self, res, return_scores) -> List[TranslationResult]:
        lib = self._lib
        results = []
        n = lib.tolk_result_batch_size(res)
        for i in range(n):
            hyps, scores = [], []
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
            results.append(TranslationResult(hyps, scores))
        return results


def _main(argv=None):
    import argparse

    ap = argparse.ArgumentParser(description="Print the Tolk library version.")
    ap.parse_args(argv)
    print("tolk %s (ABI %d) at %s" % (version(), abi_version(), library_path()))


if __name__ == "__main__":
    _main()
