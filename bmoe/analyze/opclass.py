"""Which part of the model a compute-trace node belongs to: attention, router, expert matmul,
dense FFN, norm or other.

The engine writes each graph node's raw ``op`` and ``name``; naming is policy that varies by
architecture, so the classification lives here, in ONE table (:data:`OP_CLASS_RULES`). Rules
are tried in order and the first match wins; add a row (or put an architecture-specific row
first) to teach it a new naming scheme.

Nodes the graph left unnamed (``node_27``) carry no naming information; unless their op
settles it (``FLASH_ATTN_EXT`` is attention wherever it appears) they take the class of the
node executed just before them in the same step, which is where llama.cpp builds them (the
attention output projection right after ``kqv_out``, for instance).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pandas as pd

ATTENTION = "attention"
ROUTER = "router"
EXPERT = "expert matmul"
DENSE_FFN = "dense FFN"
NORM = "norm"
OTHER = "other"

#: Every class, in the order the views list them.
OP_CLASSES = (ATTENTION, ROUTER, EXPERT, DENSE_FFN, NORM, OTHER)


@dataclass(frozen=True)
class Rule:
    """A node is `op_class` when its op matches `op`, its base name matches `name` and the
    trace's architecture matches `arch` (each a regex searched in full; "" matches anything)."""

    op_class: str
    name: str = ""
    op: str = ""
    arch: str = ""


#: The classification table: first matching rule wins. Names are matched without their layer
#: suffix and view decorations (``ffn_moe_weights-0 (reshaped)`` -> ``ffn_moe_weights``).
OP_CLASS_RULES: tuple[Rule, ...] = (
    # Shared experts and dense MLPs that sit beside the routed experts (qwen2moe ``*_shexp``,
    # gemma4's always-on MLP) are dense FFN, not experts.
    Rule(DENSE_FFN, name=r"ffn_\w*shexp\w*|ffn_moe_shexp\w*|ffn_\w*_dense\w*"),
    # The router: gating logits, softmax/sigmoid probabilities, top-k selection, weights and
    # their normalisation (llama.cpp build_moe_ffn; gpt-oss adds ``_biased``/``_softmax``).
    Rule(
        ROUTER,
        name=r"ffn_moe_(logits|probs|argsort|topk|top_k|weights|group|selection|bias|"
        r"gate_inp|router|scores?)\w*",
    ),
    # Everything else build_moe_ffn names is the routed experts' FFN: the gate/up/down matmuls
    # (MUL_MAT_ID), the activation between them and the weighted combine.
    Rule(EXPERT, name=r"ffn_moe_\w*|ffn_exps\w*"),
    Rule(EXPERT, op=r"MUL_MAT_ID"),
    # Top-k selection ops belong to the router whatever the name.
    Rule(ROUTER, op=r"ARGSORT|TOP_K|ARGMAX"),
    # Dense (non-MoE) FFN, llama-style names: ffn_gate / ffn_up / ffn_down / activation / out.
    Rule(
        DENSE_FFN,
        name=r"ffn_(gate|up|down|gate_up|act|silu|gelu|relu|swiglu|geglu|par|out|mlp)\w*",
    ),
    # Attention: projections, q/k norms, RoPE'd q/k, the KV cache, scores and output.
    Rule(
        ATTENTION,
        name=r"(Qcur|Kcur|Vcur|QKV|wqkv|q|k|v|kq|kqv|kqv_out|kq_soft_max\w*|kq_mask\w*|"
        r"attn_out|attn_output|attn_sinks|cache_[kv]_l\d+|wo|q_pe|k_pe|kv_cmpr\w*)(_\w+)?",
    ),
    Rule(ATTENTION, op=r"FLASH_ATTN_EXT|ROPE|SET_ROWS"),
    # Norms: the normalisation op itself, and the scale that names it (attn_norm, ffn_norm,
    # result_norm, gemma's post-norms).
    Rule(NORM, op=r"RMS_NORM|NORM|L2_NORM|GROUP_NORM"),
    Rule(NORM, name=r"(\w+_)?norm(_\w+)?"),
    # Embeddings, the LM head, residual adds.
    Rule(OTHER, name=r"(inp_)?embd|inp_\w+|result_output|l_out|ffn_inp|per_layer\w*|attn_residual"),
)

#: Names the graph generated itself: no naming information (see the module notes).
GENERIC_NAME = re.compile(r"node_\d+|leaf_\d+|")

_DECORATION = re.compile(r"\s*\(.*$")
_LAYER_SUFFIX = re.compile(r"-(\d+)$")
_CACHE_LAYER = re.compile(r"_l(\d+)$")


def base_name(name: str) -> str:
    """``ffn_moe_weights-0 (reshaped)`` -> ``ffn_moe_weights``; ``cache_k_l0 (view)`` ->
    ``cache_k_l0``."""
    return _LAYER_SUFFIX.sub("", _DECORATION.sub("", name))


def name_layer(name: str) -> int:
    """The layer a node name spells (``-<il>`` suffix or ``cache_k_l<il>``), or -1."""
    stem = _DECORATION.sub("", name)
    m = _LAYER_SUFFIX.search(stem) or _CACHE_LAYER.search(stem)
    return int(m.group(1)) if m else -1


@lru_cache(maxsize=256)
def _compiled(rules: tuple[Rule, ...]) -> list[tuple[str, re.Pattern, re.Pattern, re.Pattern]]:
    return [(r.op_class, re.compile(r.name), re.compile(r.op), re.compile(r.arch)) for r in rules]


def classify(
    op: str, name: str, arch: str = "", rules: tuple[Rule, ...] = OP_CLASS_RULES
) -> str | None:
    """The class of one node, or None when nothing decides it (an unnamed node whose op says
    nothing: it inherits its predecessor's class)."""
    base = base_name(name)
    generic = GENERIC_NAME.fullmatch(base) is not None
    for op_class, name_re, op_re, arch_re in _compiled(rules):
        if arch_re.pattern and not arch_re.fullmatch(arch):
            continue
        if op_re.pattern and not op_re.fullmatch(op):
            continue
        if name_re.pattern and (generic or not name_re.fullmatch(base)):
            continue
        return op_class
    return None if generic else OTHER


def _pair_codes(rows: pd.DataFrame) -> tuple[np.ndarray, list[str], list[str]]:
    """One code per row for its (op, name) pair, and the op and name of each code. A direct
    table over the op x name space (no sort) while that space is small; np.unique otherwise."""
    op = (
        rows["op"]
        if isinstance(rows["op"].dtype, pd.CategoricalDtype)
        else rows["op"].astype("category")
    )
    name = (
        rows["name"]
        if isinstance(rows["name"].dtype, pd.CategoricalDtype)
        else rows["name"].astype("category")
    )
    op_labels = [str(c) for c in op.cat.categories]
    name_labels = [str(c) for c in name.cat.categories]
    n = len(name_labels) + 1
    pair = op.cat.codes.to_numpy(np.int64) * n + name.cat.codes.to_numpy(np.int64)
    space = (len(op_labels) + 1) * n
    if space <= 1 << 24:
        seen = np.zeros(space, dtype=bool)
        seen[pair] = True
        uniq = np.flatnonzero(seen)
        remap = np.zeros(space, dtype=np.int64)
        remap[uniq] = np.arange(len(uniq))
        inverse = remap[pair]
    else:
        uniq, inverse = np.unique(pair, return_inverse=True)
    ops = [op_labels[u // n] for u in uniq.tolist()]
    names = [name_labels[u % n] for u in uniq.tolist()]
    return inverse, ops, names


def _step_starts(rows: pd.DataFrame) -> np.ndarray:
    """True on each row that opens a new (turn, phase, step) block (rows are in file order)."""
    n = len(rows)
    starts = np.zeros(n, dtype=bool)
    if n:
        starts[0] = True
    for col in ("turn", "phase", "step"):
        if col in rows:
            v = rows[col].to_numpy()
            starts[1:] |= v[1:] != v[:-1]
    return starts


def _ffill_within_steps(values: np.ndarray, known: np.ndarray, starts: np.ndarray, fallback):
    """Fill each unknown value with the last known one of the same step block; an unknown
    value that opens its block (nothing before it to inherit) gets `fallback`."""
    values = values.copy()
    opener = starts & ~known
    values[opener] = fallback
    known = known | opener
    source = np.where(known, np.arange(len(values)), 0)
    np.maximum.accumulate(source, out=source)
    return values[source]


def node_classes(
    rows: pd.DataFrame,
    arch: str = "",
    rules: tuple[Rule, ...] = OP_CLASS_RULES,
    pairs: tuple[np.ndarray, list[str], list[str]] | None = None,
) -> pd.Series:
    """The op class of every row of a per-node compute trace (a categorical Series aligned with
    `rows`). Classifies each distinct (op, name) pair once, then maps back by code."""
    if not len(rows):
        return pd.Series(pd.Categorical([], categories=OP_CLASSES), index=rows.index)
    inverse, ops, names = pairs or _pair_codes(rows)
    lookup = {c: i for i, c in enumerate(OP_CLASSES)}
    found = [classify(o, n, arch, rules) for o, n in zip(ops, names, strict=True)]
    per_pair = np.array([lookup.get(c or "", -1) for c in found], dtype=np.int8)
    codes = per_pair[inverse]
    codes = _ffill_within_steps(codes, codes >= 0, _step_starts(rows), lookup[OTHER])
    return pd.Series(pd.Categorical.from_codes(codes, categories=OP_CLASSES), index=rows.index)


def node_layers(
    rows: pd.DataFrame, pairs: tuple[np.ndarray, list[str], list[str]] | None = None
) -> pd.Series:
    """Each row's layer, resolved: the ``layer`` column where the engine parsed one, else the
    layer the name spells (``Kcur-0 (view)``, ``cache_k_l0``), else — for unnamed nodes — the
    layer of the node executed before it in the same step; -1 when nothing says (embeddings,
    output head)."""
    if not len(rows):
        return pd.Series([], dtype=np.int16, index=rows.index)
    inverse, _ops, names = pairs or _pair_codes(rows)
    per_pair = np.array([name_layer(n) for n in names], dtype=np.int16)
    generic = np.array([GENERIC_NAME.fullmatch(base_name(n)) is not None for n in names])
    raw = rows["layer"].to_numpy(np.int16) if "layer" in rows else np.full(len(rows), -1)
    layer = np.where(raw >= 0, raw, per_pair[inverse]).astype(np.int16)
    known = (raw >= 0) | ~generic[inverse]
    layer = _ffill_within_steps(layer, known, _step_starts(rows), -1)
    return pd.Series(layer, index=rows.index, dtype=np.int16)


def classify_rows(
    rows: pd.DataFrame, arch: str = "", rules: tuple[Rule, ...] = OP_CLASS_RULES
) -> tuple[pd.Series, pd.Series]:
    """:func:`node_classes` and :func:`node_layers` of the same rows, sharing the work."""
    pairs = _pair_codes(rows) if len(rows) else None
    return node_classes(rows, arch, rules, pairs), node_layers(rows, pairs)
