"""The native engine's text protocol: ``BMOE_*`` event lines, session requests, end-of-run lines.

With ``--progress`` (and in ``--session`` mode) the engine prints one ``BMOE_<TAG> {json}`` line
per event on stdout. :func:`parse_line` turns one into a typed :class:`Event` (unknown tags and
unknown keys are kept, never dropped) and :func:`format_event` writes one back with the native
number formatting, so a parsed line formats to the same bytes.

The answer deltas (``delta_text``) are cut at token boundaries, which need not be character
boundaries: a line can carry bytes that are not valid UTF-8. Such bytes are kept losslessly as
``surrogateescape`` code points (``Progress.delta_text_bytes`` gives the raw bytes back).

One-shot runs end with plain text lines (``generation:``, ``moe-stream:``, ...);
:func:`parse_run_lines` reads them into a dict of figures named like the metrics CSV's
``# summary`` keys where the figure is the same, and :func:`format_run_lines` prints them again
exactly as the engine does.
"""

from __future__ import annotations

import functools
import json
import math
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar, overload

from bmoe.errors import BmoeError
from bmoe.formats.errors import FormatError, warn

PREFIX = "BMOE_"
T = TypeVar("T")


def to_text(line: str | bytes) -> str:
    """A line as text; bytes that are not UTF-8 survive as ``surrogateescape`` code points."""
    if isinstance(line, bytes | bytearray | memoryview):
        return bytes(line).decode("utf-8", "surrogateescape")
    return line


def to_bytes(text: str) -> bytes:
    """The inverse of :func:`to_text`: the original bytes of a decoded line or value."""
    return text.encode("utf-8", "surrogateescape")


def printable(text: str) -> str:
    """`text` with undecodable bytes shown as U+FFFD (safe to print or store as UTF-8)."""
    return to_bytes(text).decode("utf-8", "replace")


# ----------------------------------------------------------------------------- typed events


class Key(Generic[T]):
    """A documented key of an event: its Python type and the decimals the engine prints."""

    def __init__(self, kind: Callable[[Any], T], digits: int | None = None):
        self.kind = kind
        self.digits = digits
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type) -> Key[T]: ...

    @overload
    def __get__(self, obj: Event, owner: type) -> T | None: ...

    def __get__(self, obj, owner):
        if obj is None:
            return self
        value = obj.data.get(self.name)
        if value is None:
            return None
        try:
            return self.kind(value)
        except (TypeError, ValueError):
            return None


def _logps(value: Any) -> list[float | None]:
    return [None if v is None else float(v) for v in value]


@dataclass(frozen=True)
class Event:
    """One ``BMOE_<TAG> {json}`` line: the tag and every key it carried (in line order)."""

    tag: ClassVar[str] = ""
    data: dict[str, Any]
    line: int | None = field(default=None, compare=False)  # 1-based line in its stream

    @classmethod
    def keys(cls) -> dict[str, Key[Any]]:
        """The documented keys of this event type, by name."""
        out: dict[str, Key[Any]] = {}
        for klass in reversed(cls.__mro__):
            out.update({k: v for k, v in vars(klass).items() if isinstance(v, Key)})
        return out

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)


@dataclass(frozen=True)
class Unknown(Event):
    """A ``BMOE_*`` tag this version does not know: kept with its tag and data."""

    name: str = ""

    @property
    def tag(self) -> str:  # type: ignore[override]
        return self.name


@dataclass(frozen=True)
class Load(Event):
    """Experts were read from flash this token."""

    tag: ClassVar[str] = "LOAD"
    mb = Key(float, 2)
    ms = Key(float, 1)


@dataclass(frozen=True)
class Progress(Event):
    """One generated token: timings, reads, cache state and the answer delta."""

    tag: ClassVar[str] = "PROGRESS"
    step = Key(int)
    steps = Key(int)
    wall_ms = Key(float, 1)
    io_ms = Key(float, 1)
    compute_ms = Key(float, 1)
    mgmt_ms = Key(float, 1)
    stall_ms = Key(float, 1)
    read_mb = Key(float, 2)
    cache_hit_pct = Key(float, 1)
    majflt = Key(int)
    cpu_ms = Key(float, 1)
    dense_resident_frac = Key(float, 3)
    reset = Key(int)
    delta_reasoning = Key(str)
    delta_text = Key(str)

    @property
    def is_reset(self) -> bool:
        """The deltas on this line replace the accumulated text instead of extending it."""
        return bool(self.data.get("reset"))

    @property
    def delta_text_bytes(self) -> bytes:
        return to_bytes(self.data.get("delta_text", ""))

    @property
    def delta_reasoning_bytes(self) -> bytes:
        return to_bytes(self.data.get("delta_reasoning", ""))


@dataclass(frozen=True)
class Ready(Event):
    """The session's model is loaded."""

    tag: ClassVar[str] = "READY"
    load_s = Key(float, 3)
    arch = Key(str)
    n_ctx = Key(int)
    think_ctl = Key(str)
    n_expert_used = Key(int)


@dataclass(frozen=True)
class Begin(Event):
    """A session request started."""

    tag: ClassVar[str] = "BEGIN"
    id = Key(int)


@dataclass(frozen=True)
class Done(Event):
    """A generation ended: its summary figures and the final text."""

    tag: ClassVar[str] = "DONE"
    id = Key(int)
    cancelled = Key(bool)
    tokens = Key(int)
    tok_s = Key(float, 3)
    prefill_s = Key(float, 3)
    prefill_tps = Key(float, 2)
    load_s = Key(float, 3)
    cache_hit_pct = Key(float, 1)
    n_prompt = Key(int)
    n_past = Key(int)
    compute_s_tok = Key(float, 4)
    io_s_tok = Key(float, 4)
    cache_resident_mib = Key(float, 0)
    cache_budget_mib = Key(float, 0)
    read_mib = Key(float, 1)
    stall_s_tok = Key(float, 4)
    mgmt_s_tok = Key(float, 4)
    majflt_tok = Key(float, 2)
    cpu_s_tok = Key(float, 4)
    prefill_cpu_s = Key(float, 3)
    prefill_read_mib = Key(float, 1)
    prefill_io_s = Key(float, 3)
    prefill_stall_s = Key(float, 3)
    prefill_mgmt_s = Key(float, 3)
    prefill_dev_tokens = Key(int)
    prefill_dev_nodes = Key(int)
    prefill_dev_read_mib = Key(float, 1)
    prefill_dev_stall_s = Key(float, 3)
    token_demand_mib = Key(float, 1)
    mtp_drafted = Key(int)
    mtp_accepted = Key(int)
    mtp_decodes = Key(int)
    mtp_draft_s_tok = Key(float, 4)
    drafted_steps = Key(int)
    loop_overhead_s_tok = Key(float, 4)
    reasoning = Key(str)
    text = Key(str)

    @property
    def text_bytes(self) -> bytes:
        return to_bytes(self.data.get("text", ""))


@dataclass(frozen=True)
class Decide(Event):
    """The answer to a ``decide`` request: first-token log-probabilities of the choices."""

    tag: ClassVar[str] = "DECIDE"
    id = Key(int)
    cancelled = Key(bool)
    best = Key(int)
    choice_logp = Key(_logps)
    n_tokens = Key(int)
    n_reused = Key(int)
    n_prefilled = Key(int)
    restore_s = Key(float, 3)
    store_s = Key(float, 3)
    prefill_s = Key(float, 3)
    prefill_cpu_s = Key(float, 3)
    prefill_read_mib = Key(float, 1)
    prefill_io_s = Key(float, 3)
    prefill_stall_s = Key(float, 3)
    prefill_mgmt_s = Key(float, 3)
    prefill_dev_tokens = Key(int)
    prefill_dev_read_mib = Key(float, 1)
    prefill_dev_stall_s = Key(float, 3)
    prefill_dev_routed = Key(int)
    prefill_dev_demand = Key(int)
    prefix_state_mib = Key(float, 1)


@dataclass(frozen=True)
class Error(Event):
    """A rejected request (``fatal`` false, the session stays usable) or the end (true)."""

    tag: ClassVar[str] = "ERROR"
    id = Key(int)
    fatal = Key(bool)
    msg = Key(str)


EVENT_TYPES: dict[str, type[Event]] = {
    cls.tag: cls for cls in (Load, Progress, Ready, Begin, Done, Decide, Error)
}
TAGS = tuple(EVENT_TYPES)

_LINE = re.compile(r"^BMOE_([A-Z0-9_]+)(?:[ \t]+(.*?))?[ \t]*$", re.S)
_BARE_NUMBER = re.compile(r"(?<=[:\[,])(-?)(nan|inf)(?=[,\]}])")


def _loads(payload: str) -> Any:
    try:
        return json.loads(payload)
    except json.JSONDecodeError:
        # printf spells non-finite numbers nan/inf, which JSON does not have
        fixed = _BARE_NUMBER.sub(
            lambda m: m.group(1) + ("NaN" if m.group(2) == "nan" else "Infinity"), payload
        )
        return json.loads(fixed)


def make_event(tag: str, data: Mapping[str, Any], line: int | None = None) -> Event:
    """The typed event for `tag` (``"PROGRESS"``; a ``BMOE_`` prefix is accepted)."""
    tag = tag.removeprefix(PREFIX)
    cls = EVENT_TYPES.get(tag)
    if cls is None:
        return Unknown(dict(data), line, tag)
    values = dict(data)
    for key, spec in cls.keys().items():  # "2" on a float key (printed with 0 decimals) is 2.0
        value = values.get(key)
        if spec.kind is float and isinstance(value, int) and not isinstance(value, bool):
            values[key] = float(value)
    return cls(values, line)


def parse_line(
    line: str | bytes, *, path: str | None = None, lineno: int | None = None
) -> Event | None:
    """The event on one stdout line, or None when the line is not a ``BMOE_*`` line.

    A ``BMOE_*`` line whose payload is not a JSON object raises :class:`FormatError`.
    """
    text = to_text(line).lstrip("\ufeff").rstrip("\r\n")
    if not text.startswith(PREFIX):
        return None
    m = _LINE.match(text)
    if m is None:
        return None
    tag, payload = m.group(1), m.group(2) or ""
    if not payload:
        raise FormatError(path, lineno, f"BMOE_{tag} line has no JSON payload")
    try:
        data = _loads(payload)
    except (json.JSONDecodeError, RecursionError) as exc:
        problem = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
        raise FormatError(
            path, lineno, f"BMOE_{tag} payload is not valid JSON ({problem})"
        ) from None
    if not isinstance(data, dict):
        raise FormatError(path, lineno, f"BMOE_{tag} payload is not a JSON object")
    return make_event(tag, data, lineno)


def iter_events(
    lines: Iterable[str | bytes], *, path: str | None = None, notes: list[str] | None = None
) -> Iterator[Event]:
    """The events of a stdout stream, in order, as each line arrives; other lines are skipped.

    Give the lines with their newlines (a file, a pipe's ``readline``): a malformed ``BMOE_*``
    line that ends in a newline is a :class:`FormatError`; one without (the last line of a run
    killed mid-write) is dropped with a :class:`FormatWarning`, its text also appended to
    `notes` when given.
    """
    for lineno, line in enumerate(lines, start=1):
        try:
            event = parse_line(line, path=path, lineno=lineno)
        except FormatError:
            if to_text(line).endswith("\n"):
                raise
            text = warn(path, lineno, "last line is cut short (stream truncated?); dropped it")
            if notes is not None:
                notes.append(text)
            continue
        if event is not None:
            yield event


def _number(value: Any, digits: int | None) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if digits is None:
        if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
            return str(int(value))
        return _json(value)
    value = float(value)
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:.{digits}f}"


#: Characters JSON lets through raw that a terminal acts on (DEL, the C1 controls) or that
#: reorder or break a line on display: written ``\uXXXX`` (the value reads back the same).
_UNSHOWN = re.compile(r"[\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _json(value: Any) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return (
        _UNSHOWN.sub(lambda m: f"\\u{ord(m.group()):04x}", text) if _UNSHOWN.search(text) else text
    )


def _format_value(spec: Key[Any] | None, value: Any) -> str:
    if value is None or spec is None or isinstance(value, str | list | dict):
        return _json(value)
    if isinstance(value, bool) or spec.kind is bool:
        return "true" if value else "false"
    if spec.kind is int:
        return (
            str(int(value)) if not isinstance(value, float) or value.is_integer() else _json(value)
        )
    if spec.kind is float:
        return _number(value, spec.digits)
    return _json(value)


@overload
def format_event(event: Event, data: None = None) -> str: ...


@overload
def format_event(event: str, data: Mapping[str, Any]) -> str: ...


def format_event(event, data=None) -> str:
    """One ``BMOE_<TAG> {json}`` line (no newline) with the native number formatting.

    Call it with a tag and the data (``format_event("LOAD", {"mb": 1.2, "ms": 2.8})``) or with
    a parsed :class:`Event`. Keys are written in the mapping's order.
    """
    if isinstance(event, Event):
        tag, data = event.tag, event.data
    else:
        tag = str(event).removeprefix(PREFIX)
        if data is None:
            raise TypeError("format_event(tag, data): data is required with a tag")
    specs = EVENT_TYPES[tag].keys() if tag in EVENT_TYPES else {}
    body = ",".join(f"{_json(str(k))}:{_format_value(specs.get(k), v)}" for k, v in data.items())
    return f"{PREFIX}{tag} {{{body}}}"


# ----------------------------------------------------------------------------- session requests

#: The longest request line a session reads (bytes): a prompt past it could not fit any
#: context, and reading it whole would hold the session for minutes.
MAX_REQUEST_BYTES = 4 << 20
#: The deepest nesting of arrays and objects a request may have (a request needs 2).
MAX_REQUEST_DEPTH = 64
_ID_IN_LINE = re.compile(rb'"id"\s*:\s*(-?\d{1,10})(?![\d.eE])')

#: Request commands and their required fields.
REQUESTS: dict[str, tuple[str, ...]] = {
    "generate": ("id", "prompt"),
    "decide": ("id", "choices"),
    "cancel": (),
    "close": (),
}


def encode_request(cmd: str, **fields: Any) -> str:
    """One request line for a ``--session`` engine's stdin (no newline).

    ``encode_request("generate", id=1, prompt="Hi", n_predict=64, clear_kv=True)``
    """
    if cmd not in REQUESTS:
        raise BmoeError(f"unknown session request {cmd!r} (one of {', '.join(REQUESTS)})")
    missing = [k for k in REQUESTS[cmd] if k not in fields]
    if missing:
        raise BmoeError(f"session request {cmd!r} needs {', '.join(missing)}")
    return json.dumps({"cmd": cmd, **fields}, ensure_ascii=False, separators=(",", ":"))


def parse_request(
    line: str | bytes, *, path: str | None = None, lineno: int | None = None
) -> dict[str, Any]:
    """A request line as a dict (``cmd`` plus its fields), checked like :func:`encode_request`
    and bounded: at most :data:`MAX_REQUEST_BYTES` long, :data:`MAX_REQUEST_DEPTH` deep."""
    if len(line) > MAX_REQUEST_BYTES:
        raise FormatError(path, lineno, _too_long(len(line)))
    text = to_text(line).strip()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FormatError(path, lineno, f"request is not valid JSON ({exc.msg})") from None
    except RecursionError:
        raise FormatError(path, lineno, _too_deep()) from None
    except ValueError as exc:  # an integer of more digits than Python converts
        limit = sys.get_int_max_str_digits()
        raise FormatError(
            path, lineno, f"request holds a number longer than {limit} digits ({exc})"
        ) from None
    if _depth(data) > MAX_REQUEST_DEPTH:
        raise FormatError(path, lineno, _too_deep())
    if not isinstance(data, dict) or not isinstance(data.get("cmd"), str):
        raise FormatError(path, lineno, 'request is not a JSON object with a "cmd"')
    cmd = data["cmd"]
    if cmd not in REQUESTS:
        raise FormatError(path, lineno, f"unknown request {cmd!r} (one of {', '.join(REQUESTS)})")
    missing = [k for k in REQUESTS[cmd] if k not in data]
    if missing:
        raise FormatError(path, lineno, f"request {cmd!r} lacks {', '.join(missing)}")
    return data


def request_id_in(line: bytes) -> int:
    """The ``"id"`` a request line that does not parse seems to give (-1 when none does),
    so that its refusal can name the request."""
    m = _ID_IN_LINE.search(line[: 1 << 16])
    value = int(m.group(1)) if m else -1
    return value if -(2**31) <= value < 2**31 else -1


def _too_long(size: int) -> str:
    return (
        f"request line longer than {MAX_REQUEST_BYTES >> 20} MiB "
        f"({size:,} bytes or more; the limit of a session request)"
    )


def _too_deep() -> str:
    return f"request nested deeper than {MAX_REQUEST_DEPTH} levels (the limit of a session request)"


def _depth(value: Any) -> int:
    """The nesting depth of parsed JSON (1 for a flat object), without recursion."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            deepest = max(deepest, depth)
            if depth <= MAX_REQUEST_DEPTH:
                children = node.values() if isinstance(node, dict) else node
                stack.extend((child, depth + 1) for child in children)
    return deepest


# ----------------------------------------------------------------------------- end-of-run lines

_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?nan|[-+]?inf"
_PLACEHOLDER = re.compile(r"\{([^{}:]+):(d|s|\.\d+f)\}")


@functools.cache
def _compile(template: str) -> re.Pattern[str]:
    """The regex matching a run-line template (literal text, numbers, text fields)."""
    out, pos = [], 0
    for n, m in enumerate(_PLACEHOLDER.finditer(template)):
        out.append(re.escape(template[pos : m.start()]).replace(r"\ ", r"\s+"))
        kind = m.group(2)
        pattern = r"[-+]?\d+" if kind == "d" else (r".+?" if kind == "s" else _NUM)
        out.append(f"(?P<f{n}>{pattern})")
        pos = m.end()
    out.append(re.escape(template[pos:]).replace(r"\ ", r"\s+"))
    return re.compile("^" + "".join(out) + r"\s*$")


@dataclass(frozen=True)
class RunLine:
    """One shape of an end-of-run line: a template such as ``"read {read_MiB:.1f} MiB"``.

    Placeholders are ``{key:d}`` (integer), ``{key:.Nf}`` (N decimals) or ``{key:s}`` (text);
    `const` are figures the shape itself implies (``overlap`` on the ``mode:`` line).
    """

    template: str
    const: Mapping[str, Any] = field(default_factory=dict)

    def fields(self) -> list[tuple[str, str]]:
        return _PLACEHOLDER.findall(self.template)

    def regex(self) -> re.Pattern[str]:
        return _compile(self.template)

    def parse(self, line: str) -> dict[str, Any] | None:
        m = self.regex().match(line)
        if m is None:
            return None
        out: dict[str, Any] = {}
        for n, (key, kind) in enumerate(self.fields()):
            text = m.group(f"f{n}")
            out[key] = int(text) if kind == "d" else (text if kind == "s" else float(text))
        out.update(self.const)
        return out

    def applies(self, figures: Mapping[str, Any]) -> bool:
        # a figure the shape sets to False may also be absent
        if any(figures.get(k, False if v is False else None) != v for k, v in self.const.items()):
            return False
        return all(figures.get(key) is not None for key, _kind in self.fields())

    def format(self, figures: Mapping[str, Any]) -> str:
        def one(m: re.Match[str]) -> str:
            value, kind = figures[m.group(1)], m.group(2)
            if kind == "d":
                return str(int(value))
            if kind == "s":
                return str(value)
            return _number(value, int(kind[1:-1]))

        return _PLACEHOLDER.sub(one, self.template)


def _acceptance_line(src: str) -> RunLine:
    return RunLine(
        f"{src + ':':<6} "
        "{mtp_accepted:d}/{mtp_drafted:d} drafts accepted ({mtp_accept_pct:.1f}%), "
        "{mtp_tokens_per_decode:.2f} tokens per verify decode "
        "({mtp_decodes:d} decodes for {mtp_tokens:d} tokens)",
        {"spec": src},
    )


def _cost_line(src: str) -> RunLine:
    return RunLine(
        src + ": drafting costs {mtp_draft_s/tok:.4f} s/token on top of decode → "
        "{mtp_effective_tok/s:.3f} tok/s effective (vs {mtp_reported_tok/s:.3f} reported)",
        {"spec": src},
    )


#: Every end-of-run line, in the order the engine prints them; alternatives of one line in the
#: order they are tried (most specific first).
RUN_LINES: tuple[tuple[str, tuple[RunLine, ...]], ...] = (
    (
        "generation",
        (RunLine("generation: {tokens:d} tokens, {s/tok:.3f} s/token ({tok/s:.3f} tok/s)"),),
    ),
    (
        "compute",
        (
            RunLine(
                "compute: {cpu_pct:.1f}% CPU occupancy ({cpu_s/tok:.4f} cpu-s/token over "
                "{threads:d} threads), {majflt/tok:.2f} major faults/token"
            ),
        ),
    ),
    ("speculation", (_acceptance_line("mtp"), _acceptance_line("ngram"))),
    ("speculation-cost", (_cost_line("mtp"), _cost_line("ngram"))),
    (
        "ngram-coverage",
        (
            RunLine(
                "ngram: drafted on {drafted_steps:d} of {ngram_steps:d} steps ({drafted_pct:.1f}%);"
                " the rest decoded plainly"
            ),
        ),
    ),
    (
        "mode",
        (
            RunLine(
                "mode: {mode:s}, cache {mode_cache:s}, dense {dense_weights:s}, overlap",
                {"overlap": True},
            ),
            RunLine(
                "mode: {mode:s}, cache {mode_cache:s}, dense {dense_weights:s}", {"overlap": False}
            ),
            RunLine("mode: {mode:s}"),
        ),
    ),
    (
        "prefill",
        (
            RunLine(
                "prefill: {n_prompt:d} tokens, {prefill_s:.3f} s ({prefill_tps:.1f} tok/s) | "
                "model load {load_s:.3f} s | TTFT {ttft_s:.3f} s"
            ),
        ),
    ),
    (
        "moe-stream",
        (
            RunLine(
                "moe-stream: read {read_MiB:.1f} MiB ({read_MiB/tok:.2f} MiB/token), decode "
                "{decode_s/tok:.3f} s/token (compute {compute_s/tok:.3f} + cache mgmt "
                "{mgmt_s/tok:.3f} + flash I/O {io_s/tok:.3f} s/token, {read_MiB/s:.0f} MiB/s)"
            ),
            RunLine(
                "moe-stream: read {read_MiB:.1f} MiB ({read_MiB/tok:.2f} MiB/token), decode "
                "{decode_s/tok:.3f} s/token (compute {compute_s/tok:.3f} + flash I/O "
                "{io_s/tok:.3f} s/token, {read_MiB/s:.0f} MiB/s)"
            ),
        ),
    ),
    (
        "moe-cache",
        (
            RunLine(
                "moe-cache: {cache_hit_pct:.1f}% hit, resident {cache_resident_MiB:.1f} MiB, "
                "budget {cache_budget_MiB:.0f} MiB ({cache_sizing:s}, resized {cache_resizes:d}×)"
            ),
            RunLine("moe-cache: {cache_hit_pct:.1f}% hit, resident {cache_resident_MiB:.1f} MiB"),
        ),
    ),
    (
        "moe-cache-churn",
        (
            RunLine(
                "moe-cache: {evictions:d} evictions, {rereads:d} re-reads ({rereads/tok:.1f}/token)"
                " — bytes the cache had already paid for once"
            ),
        ),
    ),
    (
        "moe-overlap",
        (
            RunLine(
                "moe-overlap: stall {stall_s/tok:.3f} s/token"
                " (flash reads overlapped with FFN compute)"
            ),
        ),
    ),
    (
        "moe-prefetch",
        (
            RunLine(
                "moe-prefetch: {spec_read_MiB:.1f} MiB speculative,"
                " {spec_useful:d}/{spec_experts:d} experts useful ({spec_useful_pct:.0f}%)"
                " [{prefetch_source:s}]"
            ),
            RunLine(
                "moe-prefetch: {spec_read_MiB:.1f} MiB speculative,"
                " {spec_useful:d}/{spec_experts:d} experts useful ({spec_useful_pct:.0f}%)"
            ),
        ),
    ),
    (
        "moe-drop",
        (
            RunLine(
                "moe-drop: {experts_dropped:d}/{experts_routed:d} routed experts dropped "
                "({drop_pct:.1f}%), threshold {drop_cold_frac:.2f} x uniform"
            ),
        ),
    ),
    (
        "moe-rows",
        (
            RunLine(
                "moe-rows: {row_table_MiB:.1f} MiB of row-gathered table(s) off the resident set, "
                "{row_resident_MiB:.1f} MiB resident, {row_rows:d} rows gathered, {row_reads:d} "
                "reads ({row_read_MiB:.1f} MiB)"
            ),
        ),
    ),
    (
        "moe-rows-failed",
        (
            RunLine(
                "moe-rows: {row_io_errors:d} FAILED reads - this run's output is not trustworthy"
            ),
        ),
    ),
    (
        "moe-route-ahead",
        (
            RunLine(
                "moe-route-ahead: {route_ahead:d} layers early — {ra_committed:d} routings "
                "committed, {ra_passthrough:d} passed through; committed selection agreed with "
                "the router on {ra_agree_pct:.1f}% of slots"
            ),
        ),
    ),
)

#: Prefixes of the lines this module reads (what ``detect`` uses to spot a run log).
RUN_PREFIXES = (
    "generation:", "compute:", "mode:", "prefill:", "moe-stream:", "moe-cache:", "moe-prefetch:",
    "moe-overlap:", "moe-drop:", "moe-rows:", "moe-route-ahead:", "moe-predict:", "mtp:", "ngram:",
)  # fmt: skip
PERF_BANNER = "=== perf ==="


def _run_line_shapes() -> list[RunLine]:
    return [shape for _name, shapes in RUN_LINES for shape in shapes]


def parse_run_lines(text: str | bytes) -> dict[str, Any]:
    """The figures of the end-of-run lines in `text` (a whole stdout/stderr log is fine).

    Only lines after the last ``=== perf ===`` banner are read when there is one (so answer
    text cannot pass for a figure); a line seen twice keeps its last value. Lines that start
    like a run line but have a shape this version does not know are kept, in order, under
    ``"other_lines"``.
    """
    text = to_text(text).lstrip("\ufeff")
    lines = text.splitlines()
    banner = max((i for i, ln in enumerate(lines) if ln.strip() == PERF_BANNER), default=-1)
    shapes = _run_line_shapes()
    figures: dict[str, Any] = {}
    other: list[str] = []
    for raw in lines[banner + 1 :]:
        line = raw.strip().lstrip("\ufeff")
        if not line.startswith(RUN_PREFIXES):
            continue
        for shape in shapes:
            found = shape.parse(line)
            if found is not None:
                figures.update(found)
                break
        else:
            other.append(printable(line))
    if other:
        figures["other_lines"] = other
    return figures


def format_run_lines(figures: Mapping[str, Any]) -> list[str]:
    """The end-of-run lines for `figures`, as the native engine prints them (no newlines).

    A line is printed when every figure it needs is present (the ``mode:``, ``moe-cache:``
    budget and ``moe-prefetch:`` source variants follow the figures they carry).
    """
    out = []
    for _name, shapes in RUN_LINES:
        for shape in shapes:
            if shape.applies(figures):
                out.append(shape.format(figures))
                break
    out.extend(figures.get("other_lines", ()))
    return out


def run_line_text(text: str | bytes) -> list[str]:
    """The end-of-run lines of `text` as they appear (what :func:`format_run_lines` rebuilds)."""
    text = to_text(text).lstrip("\ufeff")
    lines = text.splitlines()
    banner = max((i for i, ln in enumerate(lines) if ln.strip() == PERF_BANNER), default=-1)
    return [ln.strip() for ln in lines[banner + 1 :] if ln.strip().startswith(RUN_PREFIXES)]


__all__ = [
    "EVENT_TYPES",
    "RUN_LINES",
    "TAGS",
    "Begin",
    "Decide",
    "Done",
    "Error",
    "Event",
    "Load",
    "Progress",
    "Ready",
    "Unknown",
    "encode_request",
    "format_event",
    "format_run_lines",
    "iter_events",
    "make_event",
    "parse_line",
    "parse_request",
    "parse_run_lines",
    "printable",
    "run_line_text",
    "to_bytes",
    "to_text",
]
