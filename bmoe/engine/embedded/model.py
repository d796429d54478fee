"""A thin, explicit wrapper over llama-cpp-python's low-level API (model, context, batches).

The model is loaded with mmap on and weight repacking off (``use_extra_bufts=False``) so every
tensor keeps its GGUF layout and the expert tensors point into the file mapping until the
engine rebinds them. llama.cpp's log goes to a ring buffer instead of the terminal; the last
lines are attached to load errors.
"""

from __future__ import annotations

import collections
import ctypes
import functools
import os
import sys
from collections.abc import MutableMapping
from typing import Any

import numpy as np

from bmoe.errors import BmoeError

_LOG: collections.deque[str] = collections.deque(maxlen=200)


#: How the OpenMP threads of llama.cpp's CPU backend wait, for a streamed run (``BMOE_OMP_WAIT``:
#: ``passive``, ``default``, or a spin count). See :func:`prepare_openmp`.
OMP_WAIT_DEFAULT = "3000"


def prepare_openmp(streaming: bool, env: MutableMapping[str, str] | None = None) -> str | None:
    """Set how llama.cpp's OpenMP threads wait, before llama.cpp is loaded; returns what was
    set (None: left alone).

    The CPU backend runs each graph as OpenMP parallel regions, and libgomp's threads spin
    for a long while (hundreds of thousands of pause loops, tens of milliseconds) before they
    sleep, at every barrier and between regions. A streamed decode is many regions per token
    (the graph splits at each routing node) with the eval callback and the expert reads
    between them, so the idle threads spin through every read; on cores shared with other
    work the spinning thread takes the core the reads, the callback or its own partner needs,
    and a token can take ten times as long. A short spin (``GOMP_SPINCOUNT=3000``, a few
    microseconds) keeps the barriers between graph nodes fast and sleeps through the reads.
    A passive wait (``OMP_WAIT_POLICY=PASSIVE``, ``BMOE_OMP_WAIT=passive``) sleeps at every
    barrier, a futex wake per node: 3x slower on the ``small`` model with every expert
    resident, 14x on ``tiny``. It applies only where the user set neither
    ``OMP_WAIT_POLICY`` nor ``GOMP_SPINCOUNT``, and only before libgomp is loaded (the first
    model of the process); ``BMOE_OMP_WAIT=default`` leaves libgomp as it is, a number sets
    ``GOMP_SPINCOUNT``."""
    env = os.environ if env is None else env
    if not streaming or "llama_cpp" in sys.modules:
        return None
    if "OMP_WAIT_POLICY" in env or "GOMP_SPINCOUNT" in env:
        return None
    choice = env.get("BMOE_OMP_WAIT", OMP_WAIT_DEFAULT).strip().lower()
    if choice in ("", "default"):
        return None
    if choice == "passive":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
        return "OMP_WAIT_POLICY=PASSIVE"
    if choice.isdigit():
        env["GOMP_SPINCOUNT"] = choice
        return f"GOMP_SPINCOUNT={choice}"
    raise BmoeError(f"BMOE_OMP_WAIT={choice!r}: passive, default or a spin count")


@functools.cache
def llama() -> Any:
    """The ``llama_cpp`` module with logging captured and the backend initialised."""
    try:
        import llama_cpp
    except ImportError as exc:
        raise BmoeError(
            "the embedded engine needs llama-cpp-python (pip install 'bmoe[engine]')"
        ) from exc

    @llama_cpp.llama_log_callback
    def keep(level: int, text: bytes, _user: Any) -> None:
        _LOG.append(text.decode("utf-8", "replace"))

    llama._log_callback = keep  # type: ignore[attr-defined]  # keep the thunk alive
    llama_cpp.llama_log_set(keep, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    return llama_cpp


def last_log(n: int = 3) -> str:
    """The last non-empty lines llama.cpp logged (for error messages)."""
    lines = [ln.strip() for ln in "".join(_LOG).splitlines() if ln.strip()]
    return " | ".join(lines[-n:])


def version() -> str:
    return str(getattr(llama(), "__version__", "unknown"))


class LlamaModel:
    """A loaded model and one context over it."""

    def __init__(
        self,
        path: str,
        *,
        n_ctx: int,
        n_ubatch: int,
        threads: int,
        n_expert_used: int = 0,
        arch: str = "",
        callback: Any = None,
        callback_user: int | None = None,
    ):
        lc = llama()
        self.lc = lc
        mp = lc.llama_model_default_params()
        mp.n_gpu_layers = 0
        mp.load_mode = 1  # LLAMA_LOAD_MODE_MMAP
        mp.use_extra_bufts = False  # no repacking: tensors keep their file layout
        self._overrides = None
        if n_expert_used:
            ov = (lc.llama_model_kv_override * 2)()
            ov[0].tag = lc.LLAMA_KV_OVERRIDE_TYPE_INT
            ov[0].key = f"{arch}.expert_used_count".encode()
            ov[0].value.val_i64 = int(n_expert_used)
            self._overrides = ov
            mp.kv_overrides = ctypes.cast(ov, ctypes.POINTER(lc.llama_model_kv_override))
        _LOG.clear()
        self.model = lc.llama_model_load_from_file(path.encode(), mp)
        if not self.model:
            raise BmoeError(f"{path}: llama.cpp could not load the model ({last_log()})")
        cp = lc.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = n_ctx
        cp.n_ubatch = n_ubatch if n_ubatch > 0 else n_ctx
        cp.n_threads = threads
        cp.n_threads_batch = threads
        cp.no_perf = True
        if callback is not None:
            cp.cb_eval = callback
            if callback_user is not None:
                cp.cb_eval_user_data = ctypes.c_void_p(callback_user)
        self._callback = callback
        self.ctx = lc.llama_init_from_model(self.model, cp)
        if not self.ctx:
            lc.llama_model_free(self.model)
            raise BmoeError(f"{path}: llama.cpp could not create a context ({last_log()})")
        self.vocab = lc.llama_model_get_vocab(self.model)
        self.n_vocab = int(lc.llama_vocab_n_tokens(self.vocab))
        self.n_ctx = int(lc.llama_n_ctx(self.ctx))
        self.n_ubatch = int(cp.n_ubatch)
        self._batch: Any = None  # a llama_batch (ctypes) once a decode sizes it
        self._batch_cap = 0
        self._piece = ctypes.create_string_buffer(256)
        self._longest: int | None = None  # bytes of the vocabulary's longest token, once asked

    # -- text -------------------------------------------------------------------------------
    def tokenize(
        self, text: bytes, add_special: bool = True, parse_special: bool = False
    ) -> list[int]:
        """`text` as tokens (`add_special`: with the model's BOS; `parse_special`: special
        tokens written in the text are read as such, as a rendered chat prompt needs)."""
        lc = self.lc
        cap = len(text) + 16
        buf = (lc.llama_token * cap)()
        n = lc.llama_tokenize(self.vocab, text, len(text), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (lc.llama_token * cap)()
            n = lc.llama_tokenize(self.vocab, text, len(text), buf, cap, add_special, parse_special)
        return list(buf[:n])

    def check_fits(self, text: bytes, positions: int, what: str = "prompt") -> None:
        """BmoeError when `text` cannot fit `positions` tokens whatever it tokenizes to (more
        bytes than that many of the vocabulary's longest tokens), said without tokenizing
        it: the tokenizer takes minutes on some long inputs (quadratic in repeated pairs)."""
        if len(text) <= 4 * positions:
            return
        if self._longest is None:
            lc = self.lc
            self._longest = max(
                1,
                *(max(len(self.piece(t)), len(lc.llama_vocab_get_text(self.vocab, t) or b""))
                  for t in range(self.n_vocab)),
            )  # fmt: skip
        if len(text) > positions * self._longest:
            raise BmoeError(
                f"{what} of {len(text):,} bytes cannot fit the {positions} positions of the "
                f"context (a token of this model is at most {self._longest} bytes); raise -c "
                "or shorten it"
            )

    def chat_template(self) -> str | None:
        """The model's own chat template (``tokenizer.chat_template``), None without one."""
        raw = self.lc.llama_model_chat_template(self.model, None)
        return raw.decode("utf-8", "replace") if raw else None

    def token_text(self, token: int) -> str:
        """A special token's text (BOS, EOS) as a template spells it; empty for none."""
        if token < 0:
            return ""
        raw = self.lc.llama_vocab_get_text(self.vocab, token)
        return raw.decode("utf-8", "replace") if raw else ""

    @property
    def eos(self) -> int:
        return int(self.lc.llama_vocab_eos(self.vocab))

    def piece(self, token: int) -> bytes:
        n = self.lc.llama_token_to_piece(self.vocab, token, self._piece, len(self._piece), 0, False)
        if n < 0:
            self._piece = ctypes.create_string_buffer(-n)
            n = self.lc.llama_token_to_piece(self.vocab, token, self._piece, -n, 0, False)
        return self._piece.raw[: max(n, 0)]

    def is_eog(self, token: int) -> bool:
        return bool(self.lc.llama_vocab_is_eog(self.vocab, token))

    @property
    def bos(self) -> int:
        return int(self.lc.llama_vocab_bos(self.vocab))

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(256)
        n = self.lc.llama_model_meta_val_str(self.model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace") if n >= 0 else None

    # -- decoding ---------------------------------------------------------------------------
    def decode(
        self, tokens: list[int], start_pos: int, logits_last: bool = True, logits_all: bool = False
    ) -> None:
        """Decode `tokens` at positions start_pos.. (sequence 0); logits for the last one (for
        every one with `logits_all`, as a verify decode needs)."""
        lc = self.lc
        n = len(tokens)
        if n > self._batch_cap:
            if self._batch is not None:
                lc.llama_batch_free(self._batch)
            self._batch = lc.llama_batch_init(max(n, 1), 0, 1)
            self._batch_cap = n
        b = self._batch
        b.n_tokens = n
        for i, tok in enumerate(tokens):
            b.token[i] = tok
            b.pos[i] = start_pos + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = int(logits_all)
        if logits_last and n:
            b.logits[n - 1] = 1
        rc = lc.llama_decode(self.ctx, b)
        if rc != 0:
            raise BmoeError(f"llama_decode failed ({rc}): {last_log()}")

    def logits(self, row: int = -1) -> np.ndarray:
        """The logits of batch position `row` (the last output by default; a view: copy it
        to keep it)."""
        ptr = self.lc.llama_get_logits_ith(self.ctx, row)
        if not ptr:
            raise BmoeError(f"no logits at batch position {row} after decode")
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    def forget_from(self, pos: int) -> bool:
        """Drop the KV cache from position `pos` on (to decode it again); False when the
        memory cannot drop a tail (a sliding window may refuse)."""
        return bool(self.lc.llama_memory_seq_rm(self.lc.llama_get_memory(self.ctx), 0, pos, -1))

    def clear_memory(self) -> None:
        self.lc.llama_memory_clear(self.lc.llama_get_memory(self.ctx), True)

    def close(self) -> None:
        lc = self.lc
        if self._batch is not None:
            lc.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "ctx", None):
            lc.llama_free(self.ctx)
            self.ctx = None
        if getattr(self, "model", None):
            lc.llama_model_free(self.model)
            self.model = None
