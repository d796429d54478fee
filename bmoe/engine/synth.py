"""Synthetic mixture-of-experts GGUF files that llama.cpp loads and runs, in the families
users run (:data:`ARCHS`: ``qwen3moe`` by default, ``qwen2moe``, a Mixtral-style ``llama``,
``deepseek2``, ``gpt-oss``, ``gemma4``) and the weight types f32, f16, q8_0, q4_0, q5_0 or
mxfp4 (the experts; the rest f16), optionally split into shards as ``llama-gguf-split`` does.

The weights are random but shaped on purpose:

- **A routing bias channel.** Embedding dimension 0 holds the same constant for every token
  and no layer writes to it (row 0 of every output projection is zero), so after each RMS
  norm it is a near-constant input. The router's column 0 therefore acts as a per-expert
  bias: experts with a large bias are *hot*. ``skew`` scales it (0 = no bias; the default
  makes the eight hottest of the ``small`` preset's 64 experts take about half of a layer's
  decode routings, the concentration the real traces in the corpus show).
- **Experts matter.** Each expert's output is as large as the residual stream it is added
  to and the output head is sharp, so serving one wrong expert changes the next token: a
  streaming engine that reads the wrong bytes cannot pass an identity check by luck.
- **A byte-level vocabulary.** A SentencePiece-style vocabulary (``tokenizer.ggml.model =
  llama``) with the 256 byte tokens, so any prompt tokenizes, plus multi-character pieces up
  to the requested size.

Larger models: every size is an override, e.g. ``bmoe model synth big.gguf --preset small
--layers 48 --experts 128 --n-embd 1024 --n-ff-exp 768 --type q8_0`` (about 10 GB; the file
size is roughly ``layers * experts * 3 * n_embd * n_ff_exp * bytes_per_weight``, see
:func:`estimate_bytes`).
"""

from __future__ import annotations

import itertools
import math
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from bmoe.errors import BmoeError

ARCH = "qwen3moe"
#: The mixture-of-experts families `synth` writes (llama.cpp architecture names):
#: ``qwen2moe`` adds a gated shared expert beside the routed ones, ``llama`` is the
#: Mixtral shape (a llama with routed experts, no q/k norms).
#: ``deepseek2`` has leading dense layers, shared experts and low-rank (MLA-shaped)
#: attention, and may store gate and up fused (``ffn_gate_up_exps``).
#: ``gpt-oss`` has biases on the router and on every expert, attention sinks and sliding-
#: window layers; its experts ship in MXFP4.
#: ``gemma4`` stores gate and up fused (``ffn_gate_up_exps``), runs a dense MLP beside the
#: experts, and mixes dense layers in (every other layer here).
ARCHS = ("qwen3moe", "qwen2moe", "llama", "deepseek2", "gpt-oss", "gemma4")
TYPES = ("f32", "f16", "q8_0", "q4_0", "q5_0", "mxfp4")
#: Block size of the quantized types (a row must be a whole number of blocks).
_BLOCK = 32
#: ``general.file_type`` of each weight type (llama.cpp's ``LLAMA_FTYPE_*``).
_FILE_TYPE = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 7, "q5_0": 8, "mxfp4": 38}

#: Chat templates `synth` can write (``tokenizer.chat_template``): ChatML, and ChatML whose
#: generation prompt reads ``enable_thinking`` as Qwen3's does (a closed, empty reasoning span
#: when thinking is off).
CHAT_TEMPLATES = {
    "chatml": (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    ),
    "think": (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
        "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
        "{% endif %}{% endif %}"
    ),
}

#: The constant carried by the routing bias channel (embedding dimension 0).
_BIAS_CHANNEL = 4.0


@dataclass(frozen=True)
class SynthConfig:
    """Shape and character of a synthetic model."""

    layers: int = 4
    experts: int = 8
    top_k: int = 2
    n_embd: int = 128
    n_ff_exp: int = 128
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 32
    vocab: int = 512
    type: str = "f32"
    arch: str = ARCH
    n_ff_shexp: int = 128  # shared expert width (qwen2moe)
    dense_layers: int = 1  # leading layers with a dense FFN instead of experts (deepseek2)
    shared_experts: int = 1  # shared experts beside the routed ones (deepseek2)
    fused_gate_up: bool = False  # one ffn_gate_up_exps tensor (deepseek2)
    q_lora: int = 64  # deepseek2 attention ranks
    kv_lora: int = 32
    n_rot: int = 16  # deepseek2: the rotary part of each head
    seed: int = 0
    skew: float = 0.5
    router_scale: float = 1.0
    expert_scale: float = 2.0
    ctx: int = 4096
    chat_template: str = ""  # "" (none), a name in CHAT_TEMPLATES, or a Jinja template
    #: the experts' weight type layer by layer (cycled over the layers; empty: ``type``
    #: throughout), as a K-quant mixes types across layers: expert sizes that differ by layer
    layer_types: tuple[str, ...] = ()

    def check(self) -> None:
        """Raise :class:`BmoeError` for a shape llama.cpp would refuse."""
        positive = (
            "layers",
            "experts",
            "top_k",
            "n_embd",
            "n_ff_exp",
            "n_head",
            "n_head_kv",
            "head_dim",
            "ctx",
            "n_ff_shexp",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise BmoeError(f"synth: {name} must be at least 1 (got {getattr(self, name)})")
        if self.top_k > self.experts:
            raise BmoeError(f"synth: top_k {self.top_k} exceeds the {self.experts} experts")
        if self.n_head % self.n_head_kv:
            raise BmoeError("synth: n_head must be a multiple of n_head_kv")
        if self.head_dim % 2:
            raise BmoeError("synth: head_dim must be even (rotary embedding)")
        if self.vocab < _N_BASE_TOKENS:
            raise BmoeError(
                f"synth: vocab must be at least {_N_BASE_TOKENS} (3 special + 256 bytes)"
            )
        for kind in (self.type, *self.layer_types):
            if kind not in TYPES:
                raise BmoeError(f"synth: unknown type {kind!r} (one of {', '.join(TYPES)})")
        if self.arch not in ARCHS:
            raise BmoeError(f"synth: unknown arch {self.arch!r} (one of {', '.join(ARCHS)})")
        widths = (self.n_embd, self.n_ff_exp, self.n_head * self.head_dim, self.n_ff_shexp)
        quantized = [k for k in (self.type, *self.layer_types) if k not in ("f32", "f16")]
        if quantized and any(w % _BLOCK for w in widths):
            raise BmoeError(
                f"synth: {quantized[0]} needs n_embd, n_ff_exp, n_head x head_dim and "
                f"n_ff_shexp to be multiples of {_BLOCK}"
            )
        if (
            self.arch in ("qwen2moe", "llama", "gpt-oss")
            and self.n_head * self.head_dim != self.n_embd
        ):
            raise BmoeError(f"synth: {self.arch} needs n_head x head_dim == n_embd")
        if self.arch == "deepseek2":
            if not 0 <= self.dense_layers < self.layers:
                raise BmoeError("synth: deepseek2 needs 0 <= dense_layers < layers")
            if self.n_head * self.head_dim != self.n_embd or self.n_head_kv != self.n_head:
                raise BmoeError("synth: deepseek2 needs n_head x head_dim == n_embd, n_head_kv")
            if not 0 < self.n_rot < self.head_dim or self.n_rot % 2:
                raise BmoeError("synth: deepseek2 needs an even n_rot below head_dim")
        elif self.fused_gate_up and self.arch != "gemma4":
            raise BmoeError("synth: fused_gate_up is written for deepseek2 (gemma4 always is)")
        if self.skew < 0:
            raise BmoeError("synth: skew must be >= 0")


PRESETS: dict[str, SynthConfig] = {
    # the shape of the native engine's tiny test model: ~7.6 MB
    "tiny": SynthConfig(),
    # ~1 GB: 16 layers, 64 experts, top-8
    "small": SynthConfig(
        layers=16,
        experts=64,
        top_k=8,
        n_embd=512,
        n_ff_exp=320,
        n_head=8,
        n_head_kv=4,
        head_dim=64,
        vocab=4096,
        type="f16",
    ),
}


def preset_config(preset: str = "tiny", **overrides: Any) -> SynthConfig:
    """The configuration of `preset` with `overrides` applied (unknown names are errors)."""
    if preset not in PRESETS:
        raise BmoeError(f"synth: unknown preset {preset!r} (one of {', '.join(PRESETS)})")
    fields = set(asdict(PRESETS[preset]))
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise BmoeError(f"synth: unknown setting {unknown[0]!r}")
    cfg = replace(PRESETS[preset], **{k: v for k, v in overrides.items() if v is not None})
    if cfg.arch == "deepseek2" and overrides.get("n_head_kv") is None:
        cfg = replace(cfg, n_head_kv=cfg.n_head)  # its attention has no grouped kv heads
    cfg.check()
    return cfg


# ----------------------------------------------------------------------------- tensor plan


def _plan(cfg: SynthConfig) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, numpy shape, storage type) of every tensor, in file order; a layer's expert
    tensors in its ``layer_types`` entry where they are given."""
    plan = _family_plan(cfg)
    if not cfg.layer_types:
        return plan
    out = []
    for name, shape, kind in plan:
        parts = name.split(".")
        if name.startswith("blk.") and parts[2].endswith("_exps") and parts[3] == "weight":
            kind = cfg.layer_types[int(parts[1]) % len(cfg.layer_types)]
        out.append((name, shape, kind))
    return out


def _family_plan(cfg: SynthConfig) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, numpy shape, storage type) of every tensor of the family, in file order."""
    e, v, f, x = cfg.n_embd, cfg.vocab, cfg.n_ff_exp, cfg.experts
    t = "f16" if cfg.type == "mxfp4" else cfg.type  # MXFP4 is for the experts only
    te = cfg.type
    out: list[tuple[str, tuple[int, ...], str]] = [("token_embd.weight", (v, e), t)]
    tail = [("output_norm.weight", (e,), "f32"), ("output.weight", (v, e), t)]
    if cfg.arch == "gpt-oss":
        return out + _plan_gpt_oss(cfg, t) + tail
    if cfg.arch == "gemma4":
        return out + _plan_gemma4(cfg, t) + tail
    if cfg.arch == "deepseek2":
        return out + _plan_deepseek2(cfg, t) + tail
    for il in range(cfg.layers):
        b = f"blk.{il}."
        out += [
            *_attention(b, cfg, t),
        ]
        if cfg.arch == "qwen3moe":
            out += [
                (b + "attn_q_norm.weight", (cfg.head_dim,), "f32"),
                (b + "attn_k_norm.weight", (cfg.head_dim,), "f32"),
            ]
        out += [
            (b + "ffn_norm.weight", (e,), "f32"),
            (b + "ffn_gate_inp.weight", (x, e), "f32"),
            (b + "ffn_gate_exps.weight", (x, f, e), te),
            (b + "ffn_up_exps.weight", (x, f, e), te),
            (b + "ffn_down_exps.weight", (x, e, f), te),
        ]
        if cfg.arch == "qwen2moe":
            fs = cfg.n_ff_shexp
            out += [
                (b + "ffn_gate_inp_shexp.weight", (e,), "f32"),
                (b + "ffn_gate_shexp.weight", (fs, e), t),
                (b + "ffn_up_shexp.weight", (fs, e), t),
                (b + "ffn_down_shexp.weight", (e, fs), t),
            ]
    return out + tail


def _attention(b: str, cfg: SynthConfig, t: str) -> list[tuple[str, tuple[int, ...], str]]:
    """Layer `b`'s attention norm and projections, as every family here lays them out."""
    e, nq, nkv = cfg.n_embd, cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim
    return [
        (b + "attn_norm.weight", (e,), "f32"),
        (b + "attn_q.weight", (nq, e), t),
        (b + "attn_k.weight", (nkv, e), t),
        (b + "attn_v.weight", (nkv, e), t),
        (b + "attn_output.weight", (e, nq), t),
    ]


def gemma4_moe_layer(il: int) -> bool:
    """Which layers of a synthetic gemma4 route experts (the others are dense)."""
    return il % 2 == 0


def _plan_gemma4(cfg: SynthConfig, t: str) -> list[tuple[str, tuple[int, ...], str]]:
    e, f, x, hd = cfg.n_embd, cfg.n_ff_exp, cfg.experts, cfg.head_dim
    dense = f * cfg.top_k
    out: list[tuple[str, tuple[int, ...], str]] = [("rope_freqs.weight", (hd // 2,), "f32")]
    for il in range(cfg.layers):
        b = f"blk.{il}."
        out += [
            *_attention(b, cfg, t),
            (b + "attn_q_norm.weight", (hd,), "f32"),
            (b + "attn_k_norm.weight", (hd,), "f32"),
            (b + "post_attention_norm.weight", (e,), "f32"),
            (b + "ffn_norm.weight", (e,), "f32"),
            (b + "ffn_gate.weight", (dense, e), t),
            (b + "ffn_up.weight", (dense, e), t),
            (b + "ffn_down.weight", (e, dense), t),
            (b + "post_ffw_norm.weight", (e,), "f32"),
        ]
        if gemma4_moe_layer(il):
            out += [
                (b + "ffn_gate_inp.weight", (x, e), "f32"),
                (b + "ffn_gate_inp.scale", (e,), "f32"),
                (b + "pre_ffw_norm_2.weight", (e,), "f32"),
                (b + "post_ffw_norm_1.weight", (e,), "f32"),
                (b + "post_ffw_norm_2.weight", (e,), "f32"),
                (b + "ffn_gate_up_exps.weight", (x, 2 * f, e), cfg.type),
                (b + "ffn_down_exps.weight", (x, e, f), cfg.type),
            ]
    return out


def _plan_gpt_oss(cfg: SynthConfig, t: str) -> list[tuple[str, tuple[int, ...], str]]:
    e, f, x = cfg.n_embd, cfg.n_ff_exp, cfg.experts
    out: list[tuple[str, tuple[int, ...], str]] = []
    for il in range(cfg.layers):
        b = f"blk.{il}."
        out += [
            *_attention(b, cfg, t),
            (b + "attn_output.bias", (e,), "f32"),
            (b + "attn_sinks.weight", (cfg.n_head,), "f32"),
            (b + "post_attention_norm.weight", (e,), "f32"),
            (b + "ffn_gate_inp.weight", (x, e), "f32"),
            (b + "ffn_gate_inp.bias", (x,), "f32"),
            (b + "ffn_gate_exps.weight", (x, f, e), cfg.type),
            (b + "ffn_gate_exps.bias", (x, f), "f32"),
            (b + "ffn_up_exps.weight", (x, f, e), cfg.type),
            (b + "ffn_up_exps.bias", (x, f), "f32"),
            (b + "ffn_down_exps.weight", (x, e, f), cfg.type),
            (b + "ffn_down_exps.bias", (x, e), "f32"),
        ]
    return out


def _plan_deepseek2(cfg: SynthConfig, t: str) -> list[tuple[str, tuple[int, ...], str]]:
    e, f, x, h, hd = cfg.n_embd, cfg.n_ff_exp, cfg.experts, cfg.n_head, cfg.head_dim
    fs = f * cfg.shared_experts
    nope = hd - cfg.n_rot
    out: list[tuple[str, tuple[int, ...], str]] = []
    for il in range(cfg.layers):
        b = f"blk.{il}."
        out += [
            (b + "attn_norm.weight", (e,), "f32"),
            (b + "attn_q_a_norm.weight", (cfg.q_lora,), "f32"),
            (b + "attn_kv_a_norm.weight", (cfg.kv_lora,), "f32"),
            (b + "attn_q_a.weight", (cfg.q_lora, e), t),
            (b + "attn_q_b.weight", (h * hd, cfg.q_lora), t),
            (b + "attn_kv_a_mqa.weight", (cfg.kv_lora + cfg.n_rot, e), t),
            (b + "attn_kv_b.weight", (h * (nope + hd), cfg.kv_lora), t),
            (b + "attn_output.weight", (e, h * hd), t),
            (b + "ffn_norm.weight", (e,), "f32"),
        ]
        if il < cfg.dense_layers:
            dense = f * cfg.top_k
            out += [
                (b + "ffn_gate.weight", (dense, e), t),
                (b + "ffn_up.weight", (dense, e), t),
                (b + "ffn_down.weight", (e, dense), t),
            ]
            continue
        out.append((b + "ffn_gate_inp.weight", (x, e), "f32"))
        te = cfg.type
        if cfg.fused_gate_up:
            out.append((b + "ffn_gate_up_exps.weight", (x, 2 * f, e), te))
        else:
            out += [
                (b + "ffn_gate_exps.weight", (x, f, e), te),
                (b + "ffn_up_exps.weight", (x, f, e), te),
            ]
        out += [
            (b + "ffn_down_exps.weight", (x, e, f), te),
            (b + "ffn_gate_shexp.weight", (fs, e), t),
            (b + "ffn_up_shexp.weight", (fs, e), t),
            (b + "ffn_down_shexp.weight", (e, fs), t),
        ]
    return out


def _nbytes(shape: tuple[int, ...], kind: str) -> int:
    n = math.prod(shape)
    if kind == "f32":
        return 4 * n
    if kind == "f16":
        return 2 * n
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[kind.upper()]]
    return n // block * size


def estimate_bytes(cfg: SynthConfig) -> int:
    """Approximate file size of `cfg` (tensor data, without the small header)."""
    return sum(_nbytes(shape, kind) for _name, shape, kind in _plan(cfg))


# ----------------------------------------------------------------------------- vocabulary

_N_BASE_TOKENS = 3 + 256
_ALPHABET = "▁etaoinshrdlucmfwypvbgk"


def _vocab(n: int) -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and types of a byte-fallback SentencePiece vocabulary of size `n`."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    scores = [0.0] * len(tokens)
    pieces = (
        "".join(p) for size in itertools.count(2) for p in itertools.product(_ALPHABET, repeat=size)
    )
    while len(tokens) < n:
        piece = next(pieces)
        tokens.append(piece)
        types.append(1)
        scores.append(-float(len(tokens)))  # earlier (shorter) pieces merge first
    return tokens, scores, types


# ----------------------------------------------------------------------------- weights


class _Weights:
    """Draws every tensor of the plan, in order, from one seeded generator."""

    def __init__(self, cfg: SynthConfig):
        self.cfg = cfg
        self.rng = np.random.default_rng(cfg.seed)
        hot = self.rng.standard_normal(cfg.experts).astype(np.float32)
        self.expert_bias = hot  # per-expert router bias (times skew), fixed across layers
        self.layer_shift = self.rng.permutation(cfg.experts)  # hot experts differ per layer

    def normal(self, shape: tuple[int, ...], std: float) -> np.ndarray:
        out = self.rng.standard_normal(shape, dtype=np.float32)
        out *= np.float32(std)
        return out

    def tensor(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        cfg = self.cfg
        e = cfg.n_embd
        kind = name.split(".")[-2] if name.startswith("blk.") else name.split(".")[0]
        if name.endswith(".scale") or kind == "rope_freqs":  # gemma4: neutral
            return np.ones(shape, dtype=np.float32)
        if name.endswith(".bias"):  # gpt-oss: small biases, none on the bias channel
            w = self.normal(shape, 0.1)
            if kind in ("ffn_down_exps", "attn_output"):
                w[..., 0] = 0.0
            return w
        if kind == "attn_sinks":
            return np.zeros(shape, dtype=np.float32)
        if kind in (
            "attn_norm",
            "attn_q_norm",
            "attn_k_norm",
            "ffn_norm",
            "output_norm",
            "post_attention_norm",
            "post_ffw_norm",
            "pre_ffw_norm_2",
            "post_ffw_norm_1",
            "post_ffw_norm_2",
        ):
            return np.ones(shape, dtype=np.float32)
        if kind == "token_embd":
            w = self.normal(shape, 1.0)
            w[:, 0] = _BIAS_CHANNEL
            return w
        if kind == "output":
            w = self.normal(shape, 4.0 / math.sqrt(e))
            w[:, 0] = 0.0  # the bias channel must not favour tokens
            return w
        if kind in ("attn_q", "attn_k", "attn_v"):
            return self.normal(shape, 1.0 / math.sqrt(e))
        if kind == "attn_output":
            w = self.normal(shape, 1.0 / math.sqrt(shape[1]))
            w[0, :] = 0.0
            return w
        if kind == "ffn_gate_inp":
            il = int(name.split(".")[1])
            w = self.normal(shape, cfg.router_scale / math.sqrt(e))
            # the residual stream grows with depth, so the normalised channel shrinks; keep
            # the bias comparable from the first layer to the last
            rms = math.sqrt(1.0 + 2.5 * il + _BIAS_CHANNEL**2 / e)
            bias = np.roll(self.expert_bias, int(self.layer_shift[il % cfg.experts]))
            w[:, 0] = cfg.skew * cfg.router_scale * bias * rms / _BIAS_CHANNEL
            return w
        if kind in (
            "ffn_gate_exps",
            "ffn_up_exps",
            "ffn_gate_up_exps",
            "ffn_gate_shexp",
            "ffn_up_shexp",
            "ffn_gate",
            "ffn_up",
        ):
            return self.normal(shape, 1.0 / math.sqrt(e))
        if kind in ("attn_q_a", "attn_q_b", "attn_kv_a_mqa", "attn_kv_b"):
            return self.normal(shape, 1.0 / math.sqrt(shape[-1]))
        if kind in ("attn_q_a_norm", "attn_kv_a_norm"):
            return np.ones(shape, dtype=np.float32)
        if kind in ("ffn_down_exps", "ffn_down_shexp", "ffn_down"):
            w = self.normal(shape, cfg.expert_scale / math.sqrt(shape[-1]))
            w[..., 0, :] = 0.0  # nothing writes the bias channel
            return w
        if kind == "ffn_gate_inp_shexp":
            return self.normal(shape, 1.0 / math.sqrt(e))
        raise AssertionError(name)


def _encode(data: np.ndarray, kind: str) -> np.ndarray:
    if kind == "f32":
        return data.astype(np.float32, copy=False)
    if kind == "f16":
        return data.astype(np.float16)
    from gguf import GGMLQuantizationType, quants

    return quants.quantize(data, GGMLQuantizationType[kind.upper()])


def synth_model(
    path: str | os.PathLike[str],
    preset: str = "tiny",
    *,
    progress: Callable[[int, int], None] | None = None,
    split_max_tensors: int = 0,
    no_tensor_first_split: bool = False,
    **overrides: Any,
) -> Path:
    """Write a synthetic mixture-of-experts GGUF to `path` and return the path.

    `overrides` are :class:`SynthConfig` fields (``arch``, ``layers``, ``experts``, ``top_k``,
    ``n_embd``, ``n_ff_exp``, ``vocab``, ``type``, ``seed``, ``skew``, ...). `progress` is
    called with (bytes written, total bytes) after each tensor.

    `split_max_tensors` N > 0 writes a split model the way ``llama-gguf-split`` does: shards
    of at most N tensors named ``<stem>-00001-of-0000M.gguf`` beside `path`, the first one
    holding the metadata (and, with `no_tensor_first_split`, nothing else); the path returned
    is the first shard's, the one llama.cpp opens.
    """
    cfg = preset_config(preset, **overrides)
    try:
        import gguf
    except ImportError as exc:  # pragma: no cover - the engine extra is missing
        raise BmoeError("synth needs the 'gguf' package (pip install 'bmoe[engine]')") from exc
    if split_max_tensors < 0:
        raise BmoeError("synth: split_max_tensors must be >= 0")

    out = Path(path)
    if out.parent and not out.parent.is_dir():
        raise BmoeError(f"{out.parent}: no such directory")
    plan = _plan(cfg)
    total = sum(_nbytes(shape, kind) for _n, shape, kind in plan)
    # written in a hidden folder beside the result, moved into place once complete
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent or "."))
    split = split_max_tensors > 0
    writer = gguf.GGUFWriter(
        staging / out.name,
        cfg.arch,
        split_max_tensors=split_max_tensors,
        small_first_shard=split and no_tensor_first_split,
    )
    _write_metadata(writer, cfg)
    for name, shape, kind in plan:
        if kind not in ("f32", "f16"):
            qtype = gguf.GGMLQuantizationType[kind.upper()]
            byte_shape = gguf.quant_shape_to_byte_shape(shape, qtype)
            writer.add_tensor_info(
                name, byte_shape, np.dtype(np.uint8), _nbytes(shape, kind), raw_dtype=qtype
            )
        else:
            dtype = np.dtype(np.float32 if kind == "f32" else np.float16)
            writer.add_tensor_info(name, shape, dtype, _nbytes(shape, kind))
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        weights = _Weights(cfg)
        done = 0
        for name, shape, kind in plan:
            data = _encode(weights.tensor(name, shape), kind)
            writer.write_tensor_data(data)
            done += data.nbytes
            if progress is not None:
                progress(done, total)
        writer.close()
        written = writer.format_shard_names(staging / out.name)
        for file in written:
            os.replace(file, out.with_name(file.name))
    except OSError as exc:
        raise BmoeError(f"{out}: cannot write ({exc.strerror or exc})") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out.with_name(written[0].name)


def _write_metadata(w: Any, cfg: SynthConfig) -> None:
    w.add_name(f"bmoe synthetic {cfg.arch} {cfg.layers}x{cfg.experts} top-{cfg.top_k}")
    w.add_context_length(cfg.ctx)
    w.add_embedding_length(cfg.n_embd)
    w.add_block_count(cfg.layers)
    if cfg.arch == "llama":  # Mixtral: the feed-forward length is the expert's
        w.add_feed_forward_length(cfg.n_ff_exp)
        w.add_rope_dimension_count(cfg.head_dim)
    else:
        w.add_feed_forward_length(cfg.n_ff_exp * cfg.top_k)
        w.add_expert_feed_forward_length(cfg.n_ff_exp)
    if cfg.arch == "qwen2moe":
        w.add_expert_shared_feed_forward_length(cfg.n_ff_shexp)
    if cfg.arch == "gemma4":
        w.add_sliding_window(128)
        w.add_sliding_window_pattern([il < cfg.layers - 1 for il in range(cfg.layers)])
        w.add_uint32(f"{cfg.arch}.attention.key_length_swa", cfg.head_dim)
        w.add_uint32(f"{cfg.arch}.attention.value_length_swa", cfg.head_dim)
        w.add_uint32(f"{cfg.arch}.embedding_length_per_layer_input", 0)
    if cfg.arch == "gpt-oss":
        w.add_sliding_window(128)
        w.add_rope_dimension_count(cfg.head_dim)
    if cfg.arch == "deepseek2":
        w.add_leading_dense_block_count(cfg.dense_layers)
        w.add_expert_shared_count(cfg.shared_experts)
        w.add_q_lora_rank(cfg.q_lora)
        w.add_kv_lora_rank(cfg.kv_lora)
        w.add_rope_dimension_count(cfg.n_rot)
        w.add_expert_weights_norm(True)
        w.add_expert_weights_scale(1.0)
    w.add_head_count(cfg.n_head)
    w.add_head_count_kv(cfg.n_head_kv)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_freq_base(1_000_000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(cfg.experts)
    w.add_expert_used_count(cfg.top_k)
    w.add_file_type(_FILE_TYPE[cfg.type])
    tokens, scores, types = _vocab(cfg.vocab)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_space_prefix(False)
    if cfg.chat_template:
        w.add_chat_template(CHAT_TEMPLATES.get(cfg.chat_template, cfg.chat_template))
    for key, value in asdict(cfg).items():
        if key == "chat_template":
            continue
        if isinstance(value, tuple | list):  # layer_types: written only when given
            if value:
                w.add_string(f"bmoe.synth.{key}", ",".join(map(str, value)))
        elif isinstance(value, str):
            w.add_string(f"bmoe.synth.{key}", value)
        elif isinstance(value, bool):
            w.add_bool(f"bmoe.synth.{key}", value)
        elif isinstance(value, float):
            w.add_float32(f"bmoe.synth.{key}", value)
        else:
            w.add_uint32(f"bmoe.synth.{key}", value)


__all__ = [
    "ARCHS",
    "CHAT_TEMPLATES",
    "PRESETS",
    "TYPES",
    "SynthConfig",
    "estimate_bytes",
    "preset_config",
    "synth_model",
]
