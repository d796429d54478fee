"""The embedded engine's configuration, and the native ``bmoe-cli`` flags that set it.

:func:`parse_args` reads the native engine's argv (``-m model.gguf -n 64 --moe-stream
--cache-mb 256 ...``) so the same command line drives either engine. A native flag this engine
does not implement is a one-line error naming it; a flag neither engine knows is an error too.
Environment overrides (``BMOE_CACHE_MB``...) apply as in the native engine; the flag wins.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from bmoe.errors import BmoeError

#: Bounds of the speculation flags (the native engine's).
DRAFT_MAX = 8
NGRAM_MATCH_MAX = 64

DEFAULT_PROMPT = "Explain how a mixture-of-experts model decides which experts handle each token."


@dataclass(frozen=True)
class EngineConfig:
    """Everything one run of the embedded engine needs (native flag names in comments)."""

    model: str = ""  # -m
    prompt: str = DEFAULT_PROMPT  # -p
    n_predict: int = 128  # -n
    threads: int = 4  # -t
    ctx_size: int = 2048  # -c
    ubatch: int = 0  # --ubatch (0 = follows the batch)
    n_expert_used: int = 0  # --n-expert-used (0 = the model's)
    temp: float = 0.0
    top_k: int = 40
    top_p: float = 0.95
    seed: int = 4294967295
    progress: bool = False
    csv: str | None = None
    route_trace: str | None = None
    compute_trace: str | None = None
    compute_trace_layers: str | None = None
    io_trace: str | None = None
    force: bool = False  # --force: write over output files that exist (never over the model)
    moe_stream: bool = False
    cache_mb: float | None = None  # None = auto
    cache_floor_mb: int = 1536
    cache_ceil_mb: int = 0
    force_cache: bool = False
    io_threads: int = 4
    o_direct: bool = True  # --no-odirect
    load_all: bool = False
    prefetch: int = 0
    cache_policy: str = "lru"  # --cache-policy (bmoe.cache's policies; the native engine: LRU)
    dense_weights: str = "mmap"
    session: bool = False  # --session: serve JSON requests on stdin
    drop_cold_frac: float = 0.0  # --drop-cold-experts F
    drop_renorm: bool = True  # --drop-no-renorm
    drop_prefill: bool = False  # --drop-in-prefill
    predict_log: bool = False  # --predict-log
    predict_prefetch: bool = False  # --predict-prefetch
    predict_spec_max: int = 2  # --predict-spec-max (0 = top-k)
    route_ahead: int = 0  # --route-ahead N
    fidelity_save: str | None = None  # --fidelity-save REF (engine/embedded/fidelity.py)
    fidelity_ref: str | None = None  # --fidelity-ref REF
    spec: str = "off"  # --ngram ("ngram"); --mtp is refused
    draft: int = 3  # --draft N: tokens drafted per verify decode
    ngram_min_match: int = 3  # --ngram-min-match N: shortest match allowed to draft
    ngram_max_match: int = 12  # the longest suffix the n-gram source considers (a scan bound)
    chatml: bool = False  # --chatml: render the prompt with the model's chat template
    think: bool = True  # --no-think: render it with reasoning disabled

    def check(self) -> None:
        """Raise :class:`BmoeError` naming the flag for a configuration that cannot run."""
        if not self.model:
            raise BmoeError("-m/--model is required")
        if self.n_predict < 0:
            raise BmoeError("-n must be >= 0")
        for name in ("threads", "ctx_size", "io_threads"):
            if getattr(self, name) < 1:
                raise BmoeError(f"--{name.replace('_', '-')} must be at least 1")
        if self.dense_weights not in ("mmap", "warm"):
            raise BmoeError(
                f"--dense-weights {self.dense_weights}: the embedded engine implements mmap and "
                "warm only"
            )
        if self.cache_mb is not None and self.cache_mb < 0:
            raise BmoeError("--cache-mb must be >= 0 (or auto)")
        if self.prefetch < 0:
            raise BmoeError("--prefetch must be >= 0")
        from bmoe.cache import POLICIES, policy_name

        policy = policy_name(self.cache_policy)
        if policy not in POLICIES:
            raise BmoeError(
                f"--cache-policy {self.cache_policy}: unknown (one of "
                f"{', '.join(p for p in POLICIES if not POLICIES[p].needs_future)})"
            )
        if POLICIES[policy].needs_future:
            raise BmoeError(f"--cache-policy {self.cache_policy} reads the future: replay only")
        if self.route_ahead < 0:
            raise BmoeError("--route-ahead must be >= 0")
        if self.predict_spec_max < 0:
            raise BmoeError("--predict-spec-max must be >= 0")
        if self.predict_prefetch and self.load_all:
            raise BmoeError("--predict-prefetch bets on a cache: not with --load-all")
        if self.compute_trace and self.compute_trace_layers:
            raise BmoeError("--compute-trace and --compute-trace-layers are exclusive")
        if self.drop_cold_frac < 0:
            raise BmoeError("--drop-cold-experts must be >= 0")
        if self.drop_cold_frac and self.load_all:
            raise BmoeError("--drop-cold-experts drops misses of a cache: not with --load-all")
        if self.spec not in ("off", "ngram"):
            raise BmoeError(f"unknown draft source {self.spec!r} (off or ngram)")
        if not 1 <= self.draft <= DRAFT_MAX:
            raise BmoeError(f"--draft must be between 1 and {DRAFT_MAX}")
        if not 1 <= self.ngram_min_match <= NGRAM_MATCH_MAX:
            raise BmoeError(f"--ngram-min-match must be between 1 and {NGRAM_MATCH_MAX}")
        if self.spec != "off" and (self.fidelity_save or self.fidelity_ref):
            raise BmoeError(
                "--ngram confirms drafts without sampling them: not with --fidelity-save or "
                "--fidelity-ref (their measure is token by token)"
            )
        if self.spec != "off" and self.temp > 0:
            raise BmoeError(
                "--ngram verifies drafts against the greedy choice: not with --temp > 0"
            )
        if not self.moe_stream:
            for flag, value in (
                ("--route-trace", self.route_trace),
                ("--io-trace", self.io_trace),
                ("--load-all", self.load_all),
                ("--prefetch", self.prefetch),
                ("--drop-cold-experts", self.drop_cold_frac),
                ("--predict-log", self.predict_log),
                ("--predict-prefetch", self.predict_prefetch),
                ("--route-ahead", self.route_ahead),
            ):
                if value:
                    raise BmoeError(f"{flag} needs --moe-stream")


# ----------------------------------------------------------------------------- native flags

_VALUE = {
    "-m": "model",
    "--model": "model",
    "-p": "prompt",
    "--prompt": "prompt",
    "-n": "n_predict",
    "--n-predict": "n_predict",
    "-t": "threads",
    "--threads": "threads",
    "-c": "ctx_size",
    "--ctx-size": "ctx_size",
    "--ubatch": "ubatch",
    "--n-expert-used": "n_expert_used",
    "--temp": "temp",
    "--top-k": "top_k",
    "--top-p": "top_p",
    "--seed": "seed",
    "--csv": "csv",
    "--route-trace": "route_trace",
    "--compute-trace": "compute_trace",
    "--compute-trace-layers": "compute_trace_layers",
    "--io-trace": "io_trace",
    "--cache-mb": "cache_mb",
    "--cache-floor-mb": "cache_floor_mb",
    "--cache-ceil-mb": "cache_ceil_mb",
    "--io-threads": "io_threads",
    "--prefetch": "prefetch",
    "--cache-policy": "cache_policy",
    "--dense-weights": "dense_weights",
    "--drop-cold-experts": "drop_cold_frac",
    "--predict-spec-max": "predict_spec_max",
    "--route-ahead": "route_ahead",
    "--fidelity-save": "fidelity_save",
    "--fidelity-ref": "fidelity_ref",
    "--draft": "draft",
    "--ngram-min-match": "ngram_min_match",
}
_SWITCH = {
    "--progress": ("progress", True),
    "--moe-stream": ("moe_stream", True),
    "--no-odirect": ("o_direct", False),
    "--load-all": ("load_all", True),
    "--force-cache": ("force_cache", True),
    "--force": ("force", True),
    "--session": ("session", True),
    "--drop-no-renorm": ("drop_renorm", False),
    "--drop-in-prefill": ("drop_prefill", True),
    "--predict-log": ("predict_log", True),
    "--predict-prefetch": ("predict_prefetch", True),
    "--ngram": ("spec", "ngram"),
    "--chatml": ("chatml", True),
    "--no-think": ("think", False),
}
#: Native flags the embedded engine does not implement (with whether they take a value).
NOT_IMPLEMENTED = {
    "--mtp": False,
    "--mtp-p-min": True,
    "--overlap": False,
    "--io-two-wave": False,
    "--list-archs": False,
    "--row-stream": False,
    "--expert-substitute": True,
    "--decide": False,
    "--prefill-device": True,
}
_NO_OVERLAP = (
    "reads can only overlap the expert matmul from inside it (the native build's per-expert "
    "ready hook); llama.cpp's eval callback runs between graph nodes, so a routed expert must "
    "be resident before MUL_MAT_ID starts (--predict-prefetch overlaps reads with the layer "
    "before instead)"
)
_NO_MTP = (
    "the bundled llama.cpp builds an MTP draft graph only for the qwen35, qwen35moe, qwen3next "
    "and step35 families, whose trained nextn block `bmoe model synth` does not write, and the "
    "loop that drives that second context (common_speculative) is in llama.cpp's common "
    "library, which llama-cpp-python does not ship; --ngram drafts from the text instead and "
    "runs on any model"
)
#: Why a native flag is refused, where it is a limit of the mechanism rather than unwritten.
WHY_NOT = {
    "--overlap": _NO_OVERLAP,
    "--io-two-wave": _NO_OVERLAP,
    "--mtp": _NO_MTP,
    "--mtp-p-min": _NO_MTP,
}
#: Environment overrides of the native engine: variable -> config field.
ENV = {
    "BMOE_CACHE_MB": "cache_mb",
    "BMOE_IO_THREADS": "io_threads",
    "BMOE_PROGRESS": "progress",
    "BMOE_PREFETCH": "prefetch",
    "BMOE_N_EXPERT_USED": "n_expert_used",
    "BMOE_PREDICT_LOG": "predict_log",
    "BMOE_PREDICT_PREFETCH": "predict_prefetch",
}
ENV_NOT_IMPLEMENTED = ("BMOE_OVERLAP",)

#: ``bmoe run --help``: (flags, value, what it does) of every flag the embedded engine takes.
FLAG_HELP: tuple[tuple[str, str, str], ...] = (
    ("-m, --model", "PATH", "GGUF model (required); a split model by its first shard"),
    ("-p, --prompt", "STR", "prompt text"),
    ("-n, --n-predict", "N", "tokens to generate (128)"),
    ("-t, --threads", "N", "compute threads (4)"),
    ("-c, --ctx-size", "N", "context size (2048)"),
    ("--ubatch", "N", "widest graph computed at once (0 = follows the batch)"),
    ("--n-expert-used", "N", "override top-k (0 = the model's); changes the output"),
    ("--temp, --top-k, --top-p, --seed", "F N F N", "sampling (default greedy)"),
    ("--progress", "", "BMOE_* lines on stdout (a progress display in a terminal)"),
    ("--session", "", "keep the model loaded, serve JSON requests on stdin"),
    ("--csv", "PATH", "per-token metrics CSV"),
    ("--route-trace", "PATH", "routing trace (needs --moe-stream)"),
    ("--io-trace", "PATH", "one row per flash read (needs --moe-stream)"),
    ("--compute-trace", "PATH", "one row per graph node"),
    ("--compute-trace-layers", "PATH", "one row per layer segment"),
    ("--force", "", "write over output files that exist (bmoe only; never over the model)"),
    ("--moe-stream", "", "stream the routed experts from the file"),
    ("--cache-mb", "N|auto", "expert cache budget in MiB (auto: half of MemAvailable)"),
    ("--cache-floor-mb, --cache-ceil-mb", "N", "bounds for auto (1536, 0 = none)"),
    ("--force-cache", "", "accept a budget under the floor"),
    ("--io-threads", "N", "parallel read lanes (4)"),
    ("--no-odirect", "", "buffered reads"),
    ("--load-all", "", "debug: read every expert every token"),
    ("--prefetch", "K", "read the previous token's experts of the next K layers ahead"),
    ("--cache-policy", "NAME", "the expert cache's eviction policy (lru; lfu, s3fifo, ...)"),
    ("--dense-weights", "mmap|warm", "where the non-expert weights live"),
    ("--drop-cold-experts", "F", "skip misses weighted under F/k (never the top slot)"),
    ("--drop-no-renorm", "", "with dropping: do not rescale the kept weights"),
    ("--drop-in-prefill", "", "with dropping: drop in the prompt too"),
    ("--predict-log", "", "score the stale-gate, previous-token and control predictors"),
    ("--predict-prefetch", "", "read the stale gate's pick for the next layer ahead"),
    ("--predict-spec-max", "N", "experts of that pick read per layer (2; 0 = top-k)"),
    ("--route-ahead", "N", "commit each layer's experts N layers early (changes the output)"),
    ("--fidelity-save", "PATH", "keep this run's tokens and distributions as a reference"),
    ("--fidelity-ref", "PATH", "feed a reference's tokens; record agreement and KL"),
    ("--ngram", "", "speculate: draft from the token history, verify in one decode"),
    ("--draft", "N", "tokens drafted per verify decode (3, at most 8)"),
    ("--ngram-min-match", "N", "shortest matching run allowed to draft (3)"),
    ("--chatml", "", "wrap the prompt in the model's chat template (ChatML without one)"),
    ("--no-think", "", "render the chat template with reasoning disabled"),
    ("--version", "", "print the engine version"),
    ("-h, --help", "", "this table"),
)

_TYPES = {f.name: f.type for f in fields(EngineConfig)}


def _convert(flag: str, name: str, text: str) -> object:
    kind = _TYPES[name]
    try:
        if name == "cache_mb":
            return None if text == "auto" else float(text)
        if kind in ("int", int):
            return int(text)
        if kind in ("float", float):
            return float(text)
        if kind in ("bool", bool):
            return text.strip().lower() not in ("", "0", "false", "no", "off")
    except ValueError:
        raise BmoeError(f"{flag}: {text!r} is not a valid value") from None
    return text


def wants_help(argv: Sequence[str]) -> bool:
    """Whether `argv` asks for the flag table (``-h``/``--help`` as a flag, not a value)."""
    args = list(argv)
    i = 0
    while i < len(args):
        if args[i] in ("-h", "--help"):
            return True
        i += 2 if args[i] in _VALUE else 1
    return False


def _suggestion(flag: str) -> str:
    """`` (did you mean '--cache-mb'?)`` for a flag written with ``_`` for ``-`` or a typo of
    a known one; empty when none is close."""
    import difflib

    known = [f for f in (*_VALUE, *_SWITCH, "--version") if f.startswith("--")]
    spelled = "--" + flag.lstrip("-").replace("_", "-")
    if spelled in known:
        return f" (did you mean {spelled!r}?)"
    close = difflib.get_close_matches(spelled, known, n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""


def parse_args(
    argv: Sequence[str], env: Mapping[str, str] | None = None
) -> tuple[EngineConfig, bool]:
    """The configuration `argv` (native ``bmoe-cli`` flags) asks for, and ``--version``."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    given: set[str] = set()
    version = False
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        flag, eq, inline = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if flag == "--version":
            version = True
        elif flag in _SWITCH:
            name, value = _SWITCH[flag]
            values[name] = value
            given.add(name)
        elif flag in _VALUE:
            if eq:
                text = inline
            elif i + 1 < len(args):
                i += 1
                text = args[i]
            else:
                raise BmoeError(f"{flag} needs a value")
            name = _VALUE[flag]
            values[name] = _convert(flag, name, text)
            given.add(name)
        elif flag in NOT_IMPLEMENTED:
            why = WHY_NOT.get(flag)
            raise BmoeError(
                f"{flag} is a native bmoe-cli flag the embedded engine does not implement"
                + (f": {why}" if why else "")
            )
        else:
            raise BmoeError(f"unknown flag {arg!r}{_suggestion(flag)} (bmoe run -h lists them)")
        i += 1
    for var in ENV_NOT_IMPLEMENTED:
        if env.get(var, "0") not in ("", "0"):
            raise BmoeError(
                f"{var}={env[var]}: the embedded engine does not implement it: {_NO_OVERLAP}"
            )
    for var, name in ENV.items():
        if name not in given and var in env:
            values[name] = _convert(var, name, env[var])
    cfg = replace(EngineConfig(), **values)
    if not version:
        cfg.check()
    return cfg, version
