"""Driving ``bmoe-cli`` (and ``bmoe run``, which takes the same flags): argv from a cell's
flags, and following its ``--progress`` stream.

Flags are the engine's long names with ``_`` for ``-`` (``n_predict`` -> ``-n``,
``io_threads`` -> ``--io-threads``); ``true`` adds a bare flag, ``false`` leaves it out, and a
flag this module does not know is passed through unchanged, because newer builds add flags.
Output files (CSV, traces) are always given paths the caller chooses.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bmoe.errors import BmoeError
from bmoe.formats.archive import OUTPUT_FILES

#: Short spellings the native and embedded engines both accept.
SHORT_FLAGS = {"model": "-m", "prompt": "-p", "n_predict": "-n", "threads": "-t", "ctx_size": "-c"}

#: Flags carried per request in session mode rather than on the command line.
SESSION_REQUEST_KEYS = ("prompt", "n_predict")

#: The architectures the native engine streams (``--moe-stream``): the MoE recipes of its
#: registry at version 0.19.0 (``core/src/moe/arch_registry.cpp``; ``bmoe-cli --list-archs``
#: prints them). A streamed run of any other architecture it refuses by name; a run without
#: streaming loads whatever llama.cpp loads.
NATIVE_STREAMED_ARCHS = (
    "qwen3moe",
    "qwen2moe",
    "qwen35moe",
    "gemma4",
    "gpt-oss",
    "lfm2moe",
    "deepseek4",
    "bailingmoe3",
)


def native_refusal(arch: str | None) -> str | None:
    """Why the native engine refuses to stream a model of `arch`, in its words; None when it
    streams that architecture."""
    if arch in NATIVE_STREAMED_ARCHS:
        return None
    return f"no MoE recipe for architecture '{arch or ''}'"


def flag_name(key: str) -> str:
    """``io_threads`` -> ``--io-threads`` (``model`` -> ``-m``)."""
    return SHORT_FLAGS.get(key) or "--" + key.replace("_", "-")


def format_flag_value(value: Any) -> str:
    if isinstance(value, bool):
        raise TypeError("booleans are bare flags")
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise BmoeError(f"flag value {value} is not a finite number")
        return repr(value) if not value.is_integer() else str(int(value))
    return str(value)


def engine_args(
    params: Mapping[str, Any],
    outputs: Mapping[str, str],
    *,
    model: str | None = None,
    session: bool = False,
) -> list[str]:
    """The engine's arguments (without the program) for a cell's flags.

    `outputs` maps output flags (``csv``, ``route_trace``, ...) to the paths to write;
    output flags in `params` only say whether to record (the caller put them in `outputs`).
    `model` replaces the model path (the path on the target). With `session`, the per-request
    keys (prompt, n_predict) are left out and ``--session`` is added.
    """
    args: list[str] = []
    for key, value in params.items():
        if key in OUTPUT_FILES or (session and key in SESSION_REQUEST_KEYS):
            continue
        if key == "model" and model is not None:
            value = model
        flag = flag_name(key)
        if value is True:
            args.append(flag)
        elif value is False:
            continue
        else:
            args += [flag, format_flag_value(value)]
    for key, path in outputs.items():
        if key not in OUTPUT_FILES:
            raise BmoeError(f"{key!r} is not an output flag")
        args += [flag_name(key), path]
    args.append("--progress")
    if session:
        args.append("--session")
    return args


def output_files(params: Mapping[str, Any]) -> dict[str, str]:
    """Output flags a cell records -> file names in its folder (the CSV always)."""
    out = {"csv": OUTPUT_FILES["csv"]}
    for key, name in OUTPUT_FILES.items():
        if key != "csv" and params.get(key) is True:
            out[key] = name
    return out


@dataclass
class StreamState:
    """What the ``--progress`` stream has said so far about one generation."""

    step: int = 0
    steps: int | None = None
    wall_ms_total: float = 0.0
    tokens_seen: int = 0
    read_mb: float = 0.0
    cache_hit_pct: float | None = None
    done: dict[str, Any] | None = None
    ready: dict[str, Any] | None = None
    errors: list[dict[str, Any]] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    last_event: float = field(default_factory=time.monotonic)

    @property
    def tok_s(self) -> float | None:
        """Decode rate over the tokens seen so far (from their wall times)."""
        if self.tokens_seen == 0 or self.wall_ms_total <= 0:
            return None
        return 1000.0 * self.tokens_seen / self.wall_ms_total


class StreamFollower:
    """Feeds stdout lines (bytes, any encoding) through the protocol parser into a
    :class:`StreamState`; lines that are not protocol lines are kept for the end-of-run text."""

    def __init__(self) -> None:
        from bmoe.formats import protocol

        self._protocol = protocol
        self.state = StreamState()
        self.text_lines: list[str] = []

    def reset(self) -> None:
        self.state = StreamState()

    def feed(self, line: bytes | str) -> Any:
        """Consume one line; returns the parsed event (or None)."""
        event = self._protocol.parse_line(line)
        if event is None:
            text = line.decode("utf-8", "replace") if isinstance(line, bytes) else line
            self.text_lines.append(text.rstrip("\r\n"))
            return None
        state = self.state
        state.last_event = time.monotonic()
        data = event.data
        tag = event.tag
        if tag == "PROGRESS":
            if data.get("reset"):
                pass
            step = data.get("step")
            if isinstance(step, int):
                state.step = step
            steps = data.get("steps")
            if isinstance(steps, int):
                state.steps = steps
            wall = data.get("wall_ms")
            if isinstance(wall, int | float):
                state.wall_ms_total += float(wall)
                state.tokens_seen += 1
            read = data.get("read_mb")
            if isinstance(read, int | float):
                state.read_mb += float(read)
            hit = data.get("cache_hit_pct")
            if isinstance(hit, int | float) and hit >= 0:
                state.cache_hit_pct = float(hit)
        elif tag == "DONE":
            state.done = dict(data)
        elif tag == "READY":
            state.ready = dict(data)
        elif tag == "ERROR":
            state.errors.append(dict(data))
        return event

    def run_figures(self) -> dict[str, Any]:
        """Figures from the end-of-run lines seen so far (empty when there are none)."""
        try:
            return dict(self._protocol.parse_run_lines("\n".join(self.text_lines)))
        except (ValueError, BmoeError):
            return {}


def feed_all(lines: Iterable[bytes | str]) -> StreamFollower:
    follower = StreamFollower()
    for line in lines:
        follower.feed(line)
    return follower
