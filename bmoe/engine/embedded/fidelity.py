"""Fidelity of a modified run: how far its next-token distributions moved from an unmodified
run of the same prompt, measured teacher-forced.

``bmoe run --fidelity-save REF`` (an unmodified run) keeps what the reference generated: the
prompt, the tokens, and the logits of every next-token distribution it chose from.
``bmoe run --fidelity-ref REF`` (the run with a lossy lever: ``--drop-cold-experts``,
``--n-expert-used``, another quantisation of the model) feeds the reference's tokens instead of
its own choices, so both models see the same context at every step, and compares the
distributions step by step:

* top-1 agreement: the share of steps whose most likely token is the reference's;
* the mean Kullback-Leibler divergence KL(reference || run) in nats, the sum over the
  vocabulary of ``p_ref * (log p_ref - log p_run)``.

The figures go into the metrics CSV's ``# summary`` (``fidelity``, ``fidelity_kl``,
``fidelity_steps``, ``fidelity_first_miss``: the first step whose top-1 differs, 0 when none),
which the run analysis and a sweep's results read as columns, and each step's divergence into
its row (the ``fidelity_kl`` column, written under ``--fidelity-ref`` only). The decode
itself is unchanged: a teacher-forced run decodes the same number of tokens, so its speed
figures stay comparable.
"""

from __future__ import annotations

import json
import math
import os
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from bmoe.errors import BmoeError

REF_FORMAT = "bmoe_fidelity_ref"
REF_VERSION = 1

Sampler = Callable[[np.ndarray], int]


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """The log-probabilities of `logits` (float64, numerically stable)."""
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max()
    return z - np.log(np.exp(z).sum())


def kl_divergence(ref_logprobs: np.ndarray, run_logprobs: np.ndarray) -> float:
    """KL(reference || run) in nats from two log-probability vectors."""
    p = np.exp(ref_logprobs)
    return float(np.sum(p * (ref_logprobs - run_logprobs)))


@dataclass
class Reference:
    """What an unmodified run generated, to compare a modified run against."""

    prompt: str
    model: str
    tokens: np.ndarray  # int32, the generated tokens
    logits: np.ndarray  # float32 (steps, vocab): the logits each token was chosen from


def write_reference(path: str, ref: Reference) -> None:
    """Write `ref` as a compressed ``.npz`` (the header as JSON inside it)."""
    header = {
        "format": REF_FORMAT,
        "version": REF_VERSION,
        "prompt": ref.prompt,
        "model": os.path.basename(ref.model),
    }
    try:
        with open(path, "wb") as fh:
            np.savez_compressed(
                fh,
                header=np.frombuffer(json.dumps(header).encode("utf-8"), dtype=np.uint8),
                tokens=ref.tokens.astype(np.int32),
                logits=ref.logits.astype(np.float32),
            )
    except OSError as exc:
        raise BmoeError(f"{path}: cannot write ({exc.strerror or exc})") from None


#: The most array data a reference may declare (bytes, every member together): the
#: distributions of 1 GiB are 2,000 steps of a 131,072-token vocabulary.
MAX_REFERENCE_BYTES = 1 << 30
#: The members of a reference, and the dimensions of each.
_MEMBERS = {"header.npy": 1, "tokens.npy": 1, "logits.npy": 2}


def _not_a_reference(path: str, reason: str) -> BmoeError:
    return BmoeError(f"{path}: not a fidelity reference ({reason})")


def check_reference(path: str) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """The shape and type each member of the reference at `path` declares, read from the
    members' headers only (nothing inflated): a one-line error for anything that is not a
    reference or declares more than :data:`MAX_REFERENCE_BYTES`, so that a tune refuses it
    before its first run and a run before it allocates."""
    from bmoe.formats.inputs import regular_file

    regular_file(path)  # a FIFO or a device refused before it is opened
    declared: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
    try:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
            if len(names) > 2 * len(_MEMBERS):
                raise _not_a_reference(path, f"{len(names)} members")
            for name, ndim in _MEMBERS.items():
                if name not in names:
                    raise _not_a_reference(path, f"no {name[:-4]} array")
                with zf.open(name) as fh:
                    version = np.lib.format.read_magic(fh)
                    read = (
                        np.lib.format.read_array_header_1_0
                        if version == (1, 0)
                        else np.lib.format.read_array_header_2_0
                    )
                    shape, _fortran, dtype = read(fh)
                if len(shape) != ndim or dtype.hasobject:
                    raise _not_a_reference(path, f"{name[:-4]} of shape {shape}, {dtype}")
                declared[name[:-4]] = (tuple(shape), dtype)
    except FileNotFoundError:
        raise BmoeError(f"{path}: no such file") from None
    except (OSError, ValueError, EOFError, RecursionError, zipfile.BadZipFile) as exc:
        reason = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        raise _not_a_reference(path, reason) from None
    total = 0
    for member, (shape, dtype) in declared.items():
        size = math.prod(shape) * dtype.itemsize  # Python integers: no overflow
        total += size
        if total > MAX_REFERENCE_BYTES:
            raise BmoeError(
                f"{path}: {member} declares {'x'.join(map(str, shape))} {dtype} "
                f"({size / 2**30:,.1f} GiB), more than 1 GiB of reference data; a reference is "
                "the logits of each step of one run"
            )
    return declared


def read_reference(path: str) -> Reference:
    """A reference written by ``--fidelity-save`` (a one-line error for anything else); its
    declared sizes are checked first (:func:`check_reference`)."""
    check_reference(path)
    try:
        with np.load(path, allow_pickle=False) as data:
            header = json.loads(bytes(data["header"]).decode("utf-8"))
            tokens = np.asarray(data["tokens"], dtype=np.int32)
            logits = np.asarray(data["logits"], dtype=np.float32)
    except FileNotFoundError:
        raise BmoeError(f"{path}: no such file") from None
    except (OSError, ValueError, KeyError, EOFError, RecursionError, zipfile.BadZipFile) as exc:
        reason = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        raise BmoeError(f"{path}: not a fidelity reference ({reason})") from None
    if not isinstance(header, dict) or header.get("format") != REF_FORMAT:
        raise BmoeError(f"{path}: not a fidelity reference (written by --fidelity-save)")
    if logits.ndim != 2 or len(tokens) != len(logits):
        raise BmoeError(f"{path}: tokens and distributions disagree in length")
    return Reference(str(header.get("prompt", "")), str(header.get("model", "")), tokens, logits)


class Recorder:
    """``--fidelity-save``: samples as the run would and keeps each distribution."""

    def __init__(self, cfg: Any, inner: Sampler):
        self.cfg, self.inner = cfg, inner
        self.tokens: list[int] = []
        self.logits: list[np.ndarray] = []

    def __call__(self, logits: np.ndarray) -> int:
        token = self.inner(logits)
        self.tokens.append(token)
        self.logits.append(np.array(logits, dtype=np.float32))
        return token

    def finish(self) -> dict[str, Any]:
        vocab = len(self.logits[0]) if self.logits else 0
        logits = np.stack(self.logits) if self.logits else np.zeros((0, vocab), np.float32)
        ref = Reference(self.cfg.prompt, self.cfg.model, np.asarray(self.tokens, np.int32), logits)
        write_reference(self.cfg.fidelity_save, ref)
        return {}


class Forcer:
    """``--fidelity-ref``: returns the reference's token at each step (teacher forcing) and
    scores the run's distribution against the reference's."""

    def __init__(self, cfg: Any, ref: Reference):
        if ref.prompt != cfg.prompt:
            raise BmoeError(f"{cfg.fidelity_ref}: the reference ran another prompt")
        if cfg.n_predict > len(ref.tokens):
            raise BmoeError(
                f"{cfg.fidelity_ref}: the reference has {len(ref.tokens)} tokens, "
                f"-n {cfg.n_predict} asks for more"
            )
        self.ref = ref
        self.step = 0
        self.agree = 0
        self.first_miss = 0
        self.kl: list[float] = []

    def __call__(self, logits: np.ndarray) -> int:
        ref_lp = log_softmax(self.ref.logits[self.step])
        if len(logits) != len(ref_lp):
            raise BmoeError(
                f"{self.ref.model or 'the reference'}: its vocabulary ({len(ref_lp)}) is not "
                f"this model's ({len(logits)})"
            )
        run_lp = log_softmax(np.asarray(logits, dtype=np.float32))
        self.kl.append(kl_divergence(ref_lp, run_lp))
        same = int(np.argmax(logits)) == int(np.argmax(ref_lp))
        self.agree += same
        if not same and not self.first_miss:
            self.first_miss = self.step + 1
        token = int(self.ref.tokens[self.step])
        self.step += 1
        return token

    def finish(self) -> dict[str, Any]:
        if not self.step:
            return {}
        return {
            "fidelity": self.agree / self.step,
            "fidelity_kl": float(np.mean(self.kl)),
            "fidelity_steps": self.step,
            "fidelity_first_miss": self.first_miss,
        }


def step_kl(sample: Sampler | None, step: int) -> float:
    """KL(reference || run) of the distribution step `step` (1-based) of a ``--fidelity-ref``
    run was chosen from (the metrics row's ``fidelity_kl``); 0.0 for any other sampler."""
    return sample.kl[step - 1] if isinstance(sample, Forcer) else 0.0


def sampler(cfg: Any, inner: Sampler) -> Sampler:
    """The run's sampler, wrapped when ``--fidelity-save`` or ``--fidelity-ref`` asks."""
    save, ref = getattr(cfg, "fidelity_save", None), getattr(cfg, "fidelity_ref", None)
    if not save and not ref:
        return inner
    if cfg.session:
        raise BmoeError("--fidelity-save and --fidelity-ref compare one-shot runs, not sessions")
    if save and ref:
        raise BmoeError("--fidelity-save and --fidelity-ref are exclusive")
    if ref:
        return Forcer(cfg, read_reference(ref))
    return Recorder(cfg, inner)


def finish(sample: Sampler | None) -> dict[str, Any]:
    """The summary keys of a wrapped sampler (writing the reference file first); none for a
    plain one."""
    done = getattr(sample, "finish", None)
    return done() if done is not None else {}
