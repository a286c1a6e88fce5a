"""llama.cpp's trainer (llama.h "training": `llama_opt_init`, `llama_opt_epoch`, and ggml-opt's
datasets), each C resource with one owner: `Dataset` (a `ggml_opt_dataset` of token windows and
their next tokens) and `Trainer` (a model loaded into writable memory, its training context and
optimizer state).

llama-cpp-python binds `llama_opt_init` with a struct that lacks the optimizer type this build's
header ends with, and binds no `ggml_opt_*` function; both are declared here, against the bundled
libraries, as the header has them. Weights must be loaded without mmap (the optimizer writes
them), and only F32 tensors train: llama.cpp skips any other tensor its filter names, and never
trains `token_embd` (examples/training/finetune.cpp loads an F32 model for the same reason).

Labels are token ids: llama.cpp's `opt_epoch_iter` turns each into a one-hot row and counts every
position of the window (no loss mask, no ignored label; `idata_split` only splits whole
datapoints into trained and evaluated ones, and each datapoint starts from an empty cache), so a
position that should carry no label is given the draft's own argmax (bench/adapt/data.py).

One call of `Trainer.step` is one optimizer step over one window (one `llama_opt_epoch` over a
dataset of one datapoint), so the caller's loop sees every step: its progress, its ETA and its
Ctrl-C, which llama.cpp's own epoch callback could not stop.
"""
from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any, Callable, Sequence

import llama_cpp

from engine.errors import ModelFileError
from engine.llama.backend import default_threads
from engine.llama.resources import Owned, _init_backend

_LIB = Path(llama_cpp.__file__).parent / "lib"
GGML_TYPE_I32 = 26
# ggml_opt_optimizer_type
ADAMW = 0
SGD = 1


class _AdamW(ctypes.Structure):
    _fields_ = [("alpha", ctypes.c_float), ("beta1", ctypes.c_float), ("beta2", ctypes.c_float),
                ("eps", ctypes.c_float), ("wd", ctypes.c_float)]


class _Sgd(ctypes.Structure):
    _fields_ = [("alpha", ctypes.c_float), ("wd", ctypes.c_float)]


class _OptimizerParams(ctypes.Structure):
    """ggml_opt_optimizer_params."""
    _fields_ = [("adamw", _AdamW), ("sgd", _Sgd)]


class _LlamaOptParams(ctypes.Structure):
    """llama_opt_params as this build's llama.h has it (with `optimizer_type`)."""
    _fields_ = [("n_ctx_train", ctypes.c_uint32),
                ("param_filter", llama_cpp.llama_opt_param_filter),
                ("param_filter_ud", ctypes.c_void_p),
                ("get_opt_pars", ctypes.c_void_p),
                ("get_opt_pars_ud", ctypes.c_void_p),
                ("optimizer_type", ctypes.c_int)]


def _bind() -> tuple[Any, Any]:
    ggml = ctypes.CDLL(str(_LIB / "libggml-base.so"))
    vp, i64 = ctypes.c_void_p, ctypes.c_int64
    sigs: dict[str, tuple[list, Any]] = {
        "ggml_opt_dataset_init": ([ctypes.c_int, ctypes.c_int, i64, i64, i64, i64], vp),
        "ggml_opt_dataset_free": ([vp], None),
        "ggml_opt_dataset_data": ([vp], vp),
        "ggml_opt_dataset_labels": ([vp], vp),
        "ggml_get_data": ([vp], vp),
        "ggml_get_name": ([vp], ctypes.c_char_p),
        "ggml_opt_result_init": ([], vp),
        "ggml_opt_result_free": ([vp], None),
        "ggml_opt_result_reset": ([vp], None),
        "ggml_opt_result_loss": ([vp, ctypes.POINTER(ctypes.c_double),
                                  ctypes.POINTER(ctypes.c_double)], None),
        "ggml_opt_result_accuracy": ([vp, ctypes.POINTER(ctypes.c_double),
                                      ctypes.POINTER(ctypes.c_double)], None),
    }
    for name, (args, res) in sigs.items():
        fn = getattr(ggml, name)
        fn.argtypes, fn.restype = args, res
    llama = ctypes.CDLL(str(_LIB / "libllama.so"))
    llama.llama_opt_init.argtypes = [vp, vp, _LlamaOptParams]
    llama.llama_opt_init.restype = None
    llama.llama_opt_epoch.argtypes = [vp, vp, vp, vp, i64, vp, vp]
    llama.llama_opt_epoch.restype = None
    return ggml, llama


_ggml, _llama = _bind()


class Dataset(Owned):
    """A ggml-opt dataset of token windows of `n_ctx` tokens, each with the token every position
    is trained to predict (its label: the text's next token, or what a teacher chose there)."""

    def __init__(self, windows: Sequence[tuple[Sequence[int], Sequence[int]]], n_ctx: int) -> None:
        if not windows or any(len(w) != n_ctx or len(y) != n_ctx for w, y in windows):
            raise ValueError(f"each window and its labels must hold {n_ctx} tokens")
        self.n = len(windows)
        self.ptr: Any = _ggml.ggml_opt_dataset_init(GGML_TYPE_I32, GGML_TYPE_I32, n_ctx, n_ctx,
                                                    self.n, 1)
        if not self.ptr:
            raise MemoryError("ggml could not allocate a training dataset")
        i32p = ctypes.POINTER(ctypes.c_int32)
        data = ctypes.cast(_ggml.ggml_get_data(_ggml.ggml_opt_dataset_data(self.ptr)), i32p)
        labels = ctypes.cast(_ggml.ggml_get_data(_ggml.ggml_opt_dataset_labels(self.ptr)), i32p)
        for i, (w, y) in enumerate(windows):
            ctypes.memmove(ctypes.byref(data.contents, 4 * i * n_ctx),
                           (ctypes.c_int32 * n_ctx)(*w), 4 * n_ctx)
            ctypes.memmove(ctypes.byref(labels.contents, 4 * i * n_ctx),
                           (ctypes.c_int32 * n_ctx)(*y), 4 * n_ctx)

    def close(self) -> None:
        if self.ptr:
            _ggml.ggml_opt_dataset_free(self.ptr)
            self.ptr = None


class Trainer(Owned):
    """A GGUF loaded into writable memory with a training context of `n_ctx` tokens, whose F32
    tensors that `trains(name)` accepts are trained at learning rate `lr` by `optimizer` (ADAMW,
    with `eps` added to the root of its second moment, or SGD), with weight decay `wd`."""

    def __init__(self, path: Path, n_ctx: int, trains: Callable[[str], bool], lr: float,
                 threads: int | None = None, *, eps: float = 1e-8, wd: float = 0.0,
                 optimizer: int = ADAMW) -> None:
        if optimizer not in (ADAMW, SGD):
            raise ValueError(f"unknown optimizer type {optimizer}")
        _init_backend()
        self.model: Any = None
        self.ctx: Any = None
        self.result: Any = None
        params = llama_cpp.llama_model_default_params()
        params.load_mode = llama_cpp.LLAMA_LOAD_MODE_NONE  # not mapped: the optimizer writes them
        # No repacked copies: `save` reads every tensor back as stored (a repacked one crashes).
        params.use_extra_bufts = False
        self.model = llama_cpp.llama_model_load_from_file(str(path).encode("utf-8"), params)
        if self.model is None:
            raise ModelFileError(f"llama.cpp could not load {path.name} for training")
        try:
            self._context(n_ctx, threads or default_threads())
            self.trained: list[str] = []
            self._init_optimizer(n_ctx, trains, lr, eps, wd, optimizer)
        except BaseException:
            self.close()
            raise
        if not self.trained:
            self.close()
            raise ModelFileError(f"{path.name} has no F32 tensor to train among those chosen")

    def _context(self, n_ctx: int, threads: int) -> None:
        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx = cp.n_batch = cp.n_ubatch = n_ctx
        # OUT_PROD has no F16 path: the KV cache is F32 while training (as finetune.cpp sets).
        cp.type_k = cp.type_v = llama_cpp.GGML_TYPE_F32
        cp.n_threads = cp.n_threads_batch = threads
        cp.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        self.ctx = llama_cpp.llama_init_from_model(self.model, cp)
        if self.ctx is None:
            raise MemoryError(f"llama.cpp could not make a training context of {n_ctx} tokens")
        padded = llama_cpp.llama_n_ctx(self.ctx)
        if padded != n_ctx:
            # opt_epoch would read windows of the padded size from a dataset of n_ctx-token
            # ones and fail an assertion, ending the process.
            raise ValueError(f"llama.cpp pads a {n_ctx}-token context to {padded}: train on "
                             f"windows of {padded}")

    def _init_optimizer(self, n_ctx: int, trains: Callable[[str], bool], lr: float, eps: float,
                        wd: float, optimizer: int) -> None:
        def keep(tensor: int, _ud: int) -> bool:
            name = (_ggml.ggml_get_name(tensor) or b"").decode()
            ok = bool(trains(name))
            if ok:
                self.trained.append(name)
            return ok

        # Kept on self: llama.cpp calls the filter during init, the optimizer reads the
        # parameters at every step.
        self._filter = llama_cpp.llama_opt_param_filter(keep)
        self._pars = _OptimizerParams(_AdamW(lr, 0.9, 0.999, eps, wd), _Sgd(lr, wd))
        constant = ctypes.cast(_ggml.ggml_opt_get_constant_optimizer_params, ctypes.c_void_p)
        params = _LlamaOptParams(n_ctx, self._filter, None, constant.value,
                                 ctypes.addressof(self._pars), optimizer)
        _llama.llama_opt_init(self.ctx, self.model, params)
        self.result = _ggml.ggml_opt_result_init()

    def step(self, window: Sequence[int], labels: Sequence[int]) -> tuple[float, float]:
        """One optimizer step on one window of n_ctx tokens and their labels (token ids:
        llama.cpp makes each a one-hot row and counts every position; it has no loss mask);
        its mean cross-entropy loss and the trainer's accuracy over the window's positions
        (`ggml_opt_result_accuracy`: the share whose argmax is the label, before the step)."""
        with Dataset([(window, labels)], len(window)) as data:
            _ggml.ggml_opt_result_reset(self.result)
            _llama.llama_opt_epoch(self.ctx, data.ptr, self.result, None, 1, None, None)
        loss, acc, unc = ctypes.c_double(), ctypes.c_double(), ctypes.c_double()
        _ggml.ggml_opt_result_loss(self.result, ctypes.byref(loss), ctypes.byref(unc))
        _ggml.ggml_opt_result_accuracy(self.result, ctypes.byref(acc), ctypes.byref(unc))
        return float(loss.value), float(acc.value)

    def save(self, path: Path) -> None:
        """Write the model with its trained weights as a GGUF."""
        llama_cpp.llama_model_save_to_file(self.model, str(path).encode("utf-8"))
        if not Path(path).is_file():
            raise ModelFileError(f"llama.cpp could not write {Path(path).name}")

    def close(self) -> None:
        if self.result:
            _ggml.ggml_opt_result_free(self.result)
            self.result = None
        if self.ctx is not None:
            llama_cpp.llama_free(self.ctx)
            self.ctx = None
        if self.model is not None:
            llama_cpp.llama_model_free(self.model)
            self.model = None
