"""Hostile inputs for every CLI command, generated from the real corpus into a folder.

The regression corpus of damaged and crafted files is made here, never stored: each case is
a real engine file with one thing done to it (cut, bytes flipped, garbage lines, CRLF, a BOM,
binary noise, markup-looking text), or with one value set outside the telemetry contract
(ids beyond ``n_expert``, sizes beyond int64, preamble values empty / ``x`` / ``nan`` / huge /
negative, ``wall_ms`` of nan, inf or 0), plus damaged sweep folders. ``commands`` pairs
every case with the commands that take such a file. Used by tests/test_fuzz_cli.py and
benchmarks/robustness.py.
"""

from __future__ import annotations

import contextlib
import io
import json
import random
import re
import shutil
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

#: Corpus files the cases start from (path under the corpus -> kind).
SOURCES = {
    "native-tiny/run.route.csv": "route",
    "native-tiny/drop.route.csv": "route",
    "native-tiny/run.csv": "metrics",
    "native-tiny/sess.csv": "metrics",
    "native-tiny/run.io.csv": "io",
    "native-tiny/ctl.compute-layers.csv": "compute",
    "native-tiny/sess.out": "log",
    "native-tiny/run.out": "log",
    "native-tiny/ov.err": "log",
    "route-trace/gemma.metrics": "pressure",
    "route-trace/gemma.state": "state",
}
#: Text that rich would read as markup: a closing tag with nothing open, a style, a link.
MARKUP = ("[/]", "[bold]x", "[link=http://x]y[/link]", "[red]", "\x1b[31mred")
#: What every preamble value is set to, one at a time.
PREAMBLE_VALUES = ("", "x", "nan", "inf", "-5", "9" * 30, "1e400", "[/]")
HUGE = str(2**70)


@dataclass(frozen=True)
class Case:
    """One hostile file (or folder): where it came from and what was done to it."""

    name: str
    kind: str  # the kind of the source: route, metrics, io, compute, log, ...
    what: str
    data: bytes | None = None  # None: a folder, made by `build`
    build: object = None  # callable(dest: Path) for folders


def _lines(data: bytes) -> list[bytes]:
    return data.splitlines(keepends=True)


def mutations(data: bytes, rng: random.Random) -> Iterator[tuple[str, bytes]]:
    """The file-level damage the audit did: cuts, flips, garbage lines, CRLF, BOM, binary."""
    n = len(data)
    for frac in (0.0, 0.05, 0.5, 0.97):
        yield f"cut-{frac}", data[: int(n * frac)]
    yield "cut-mid-line", data[: data.rfind(b"\n", 0, n - 1) + 5]
    for i in range(3):
        flipped = bytearray(data)
        for _ in range(1 + i * 4):
            pos = rng.randrange(n)
            flipped[pos] = rng.choice(b',\n\r#=.-x0 \x00\xff"9e[]/')
        yield f"flip-{i}", bytes(flipped)
    lines = _lines(data)
    for garbage in (b"garbage,,,,\n", b"\xff\xfe\x00\x01\n", b"1,2\n", b"#\n", b",,,,,,,,,,,,,\n"):
        pos = rng.randrange(1, len(lines))
        yield f"garbage-{garbage[:4]!r}", b"".join([*lines[:pos], garbage, *lines[pos:]])
    yield "crlf", data.replace(b"\n", b"\r\n")
    yield "bom", b"\xef\xbb\xbf" + data
    yield "binary", bytes(rng.randrange(256) for _ in range(2048))
    yield "nul-inside", data[: n // 2] + b"\x00" * 64 + data[n // 2 :]
    for i, text in enumerate(MARKUP):
        mark = text.encode()
        # in the first '#' line's values, in a data row, and as a line of its own
        yield f"markup-{i}-preamble", re.sub(rb"=(\S+)", b"=" + mark + rb"\1", data, count=1)
        pos = rng.randrange(1, len(lines))
        yield f"markup-{i}-line", b"".join([*lines[:pos], mark + b"\n", *lines[pos:]])
        body = [i for i, ln in enumerate(lines) if not ln.startswith(b"#")]
        if len(body) > 1:
            j = body[1]
            row = lines[j].split(b",")
            row[min(2, len(row) - 1)] = mark
            yield f"markup-{i}-cell", b"".join([*lines[:j], b",".join(row), *lines[j + 1 :]])


def preamble_mutations(data: bytes) -> Iterator[tuple[str, bytes]]:
    """Every ``key=value`` of the first lines set to each of :data:`PREAMBLE_VALUES`."""
    lines = _lines(data)
    for i, line in enumerate(lines[:8]):
        if not line.startswith(b"#"):
            continue
        for m in re.finditer(rb"(\w+)=(\S*)", line):
            for value in PREAMBLE_VALUES:
                new = line[: m.start(2)] + value.encode() + line[m.end(2) :]
                key = m.group(1).decode()
                yield f"pre-{i}-{key}={value[:6]}", b"".join([*lines[:i], new, *lines[i + 1 :]])


def _set_column(data: bytes, column: str, value: str, every: int = 3) -> bytes | None:
    lines = _lines(data)
    header = next((i for i, ln in enumerate(lines) if not ln.startswith(b"#")), None)
    if header is None:
        return None
    cols = lines[header].rstrip(b"\r\n").split(b",")
    if column.encode() not in cols:
        return None
    c = cols.index(column.encode())
    out = lines[: header + 1]
    for k, ln in enumerate(lines[header + 1 :]):
        if not ln.startswith(b"#") and k % every == 0:
            cells = ln.rstrip(b"\r\n").split(b",")
            if len(cells) > c:
                cells[c] = value.encode()
                ln = b",".join(cells) + b"\n"
        out.append(ln)
    return b"".join(out)


def _drop_column(data: bytes, column: str) -> bytes | None:
    lines = _lines(data)
    header = next((i for i, ln in enumerate(lines) if not ln.startswith(b"#")), None)
    if header is None:
        return None
    cols = lines[header].rstrip(b"\r\n").split(b",")
    if column.encode() not in cols:
        return None
    c = cols.index(column.encode())
    out = []
    for k, ln in enumerate(lines):
        if k >= header and not ln.startswith(b"#"):
            cells = ln.rstrip(b"\r\n").split(b",")
            del cells[c : c + 1]
            ln = b",".join(cells) + b"\n"
        out.append(ln)
    return b"".join(out)


#: Crafted values per column: outside the contract, each alone.
CRAFTED = {
    "expert": ("8", "9999", str(2**31), str(2**40), "-1", "-7", HUGE, "nan", "1.5"),
    "layer": ("99", "-3", str(2**40)),
    "expert_bytes": (HUGE, "-1", str(2**63), "nan", "1e300"),
    "slot": ("9999", "-1", HUGE),
    "weight": ("nan", "inf", "-inf", "1e308", "-1"),
    "step": ("-1", HUGE, "x"),
    "wall_ms": ("nan", "inf", "0", "-1", HUGE),
    "read_bytes": (HUGE, "-1"),
    "latency_ns": (HUGE, "-1", "nan"),
    "wall_ns": (HUGE, "-1"),
    "cache_hit_pct": ("nan", "1000", "-5"),
}


def crafted(data: bytes) -> Iterator[tuple[str, bytes]]:
    for column, values in CRAFTED.items():
        for value in values:
            new = _set_column(data, column, value)
            if new is not None:
                yield f"set-{column}={value[:8]}", new
        dropped = _drop_column(data, column)
        if dropped is not None:
            yield f"no-{column}", dropped
    every = _set_column(data, "expert", "-1", every=1)
    if every is not None:
        yield "expert-all=-1", every


def file_cases(corpus: Path, seed: int = 0, big_value: int = 1 << 20) -> list[Case]:
    """Every file case from the corpus (sources missing from it are left out)."""
    rng = random.Random(seed)
    cases: list[Case] = []
    for rel, kind in SOURCES.items():
        src = corpus / rel
        if not src.is_file():
            continue
        data = src.read_bytes()
        stem = rel.replace("/", "_")
        groups = [mutations(data, rng), preamble_mutations(data), crafted(data)]
        for group in groups:
            for what, mutated in group:
                cases.append(Case(f"{stem}.{len(cases)}", kind, what, mutated))
        if data.startswith(b"#"):  # one runaway preamble value
            first = _lines(data)
            long = re.sub(rb"=(\S+)", b"=" + b"y" * big_value, first[1], count=1)
            cases.append(
                Case(
                    f"{stem}.{len(cases)}",
                    kind,
                    "long-value",
                    b"".join([first[0], long, *first[2:]]),
                )
            )
    cases.append(Case("empty", "none", "empty", b""))
    cases.append(Case("markup-only", "none", "markup", "\n".join(MARKUP).encode()))
    return cases


def _sweep_case(source: Path, name: str, damage) -> Case:
    def build(dest: Path) -> None:
        shutil.copytree(source, dest, ignore=shutil.ignore_patterns("cells"))
        (dest / "cells").mkdir()
        damage(dest)

    return Case(name, "sweep", name, None, build)


def _write(rel: str, data: bytes):
    return lambda d: (d / rel).write_bytes(data)


def _remove(rel: str):
    return lambda d: (d / rel).unlink(missing_ok=True)


def sweep_cases(source: Path) -> list[Case]:
    """Damaged copies of an archived sweep folder (its cells left out: the index files only)."""
    if not (source / "manifest.jsonl").is_file():
        return []
    manifest = (source / "manifest.jsonl").read_bytes()
    damages = {
        "garbage-results": _write("results.parquet", b"PAR1 garbage"),
        "text-results": _write("results.parquet", b"not,parquet\n1,2\n"),
        "no-results": _remove("results.parquet"),
        "manifest-not-objects": _write("manifest.jsonl", b'[1,2]\n"x"\n3\nnull\n' + manifest),
        "manifest-not-utf8": _write("manifest.jsonl", b"\xff\xfe\x00garbage\n" + manifest),
        "manifest-garbage": _write(
            "manifest.jsonl", b"{not json\n" + manifest[: len(manifest) // 2]
        ),
        "manifest-markup": _write(
            "manifest.jsonl", json.dumps({"run": "[/]", "status": "[bold]"}).encode() + b"\n"
        ),
        "config-garbage": _write("sweep.toml", b"[[[ not toml \xff"),
        "config-markup": _write("sweep.toml", b'[sweep]\nname = "[/]"\n'),
        "no-config": _remove("sweep.toml"),
        "no-manifest": _remove("manifest.jsonl"),
    }
    return [_sweep_case(source, f"sweep-{k}", v) for k, v in damages.items()]


def materialize(case: Case, folder: Path) -> Path:
    """Write `case` under `folder` and return its path."""
    dest = folder / case.name
    if case.data is not None:
        dest.write_bytes(case.data)
    else:
        case.build(dest)
    return dest


#: The commands that take one file, and what they do with it ({f} the file, {o} a fresh folder).
FILE_COMMANDS = {
    "info": ["info", "{f}"],
    "validate": ["validate", "{f}"],
    "convert": ["convert", "{f}", "-o", "{o}"],
    "report": ["report", "{f}", "-o", "{o}/r.html"],
    "route": ["analyze", "route", "{f}", "--view", "all"],
    "route-json": ["analyze", "route", "{f}", "--format", "json"],
    "replay": ["analyze", "replay", "{f}", "--budgets", "1,4", "--policies", "lru"],
    "replay-stream": ["analyze", "replay", "{f}", "--stream", "--policies", "lru,belady"],
    "route-stream": ["analyze", "route", "{f}", "--stream"],
    "drop": ["analyze", "drop", "{f}"],
    "metrics": ["analyze", "metrics", "{f}"],
    "stall": ["analyze", "stall", "{f}"],
    "compare": ["analyze", "compare", "{f}", "{f}"],
    "contamination": ["analyze", "contamination", "{f}"],
    "compute": ["analyze", "decode", "compute", "{f}"],
    "io": ["analyze", "decode", "io", "{f}"],
    "export": ["export", "trace", "{f}", "-o", "{o}/t.json"],
    "sweep": ["sweep", "{f}", "--dry-run"],
    "run": ["run", "-m", "{f}", "-n", "1", "-p", "hi"],
}
#: The commands a file of each kind is meant for (every file also goes through the generic
#: ones: info, validate, convert, report).
FOR_KIND = {
    "route": ("route", "route-json", "replay", "replay-stream", "route-stream", "drop"),
    "metrics": ("metrics", "stall", "compare", "contamination"),
    "io": ("io", "export"),
    "compute": ("compute", "export"),
    "log": ("metrics",),
}
GENERIC = ("info", "validate", "convert", "report")
SWEEP_COMMANDS = {
    "analyze-sweep": ["analyze", "sweep", "{f}"],
    "contamination": ["analyze", "contamination", "{f}"],
    "report": ["report", "{f}", "-o", "{o}/r.html"],
    "sweep-dry-run": ["sweep", "{f}", "--dry-run"],
}


def commands(case: Case, every: bool = False) -> list[tuple[str, list[str]]]:
    """(name, argv template) of the commands `case` goes through: the ones for its kind and
    the generic ones, or with `every` all of them (files of the wrong kind included)."""
    if case.kind == "sweep":
        return list(SWEEP_COMMANDS.items())
    names = FILE_COMMANDS if every else (*GENERIC, *FOR_KIND.get(case.kind, ()))
    return [(n, FILE_COMMANDS[n]) for n in names]


def argv(template: list[str], path: Path, out: Path) -> list[str]:
    return [a.format(f=path, o=out) for a in template]


@dataclass(frozen=True)
class Result:
    code: int | None  # None: an exception escaped main()
    out: str
    err: str
    traceback: str | None  # the escaped exception, or a traceback printed on stderr


def run_in_process(args: list[str]) -> Result:
    """``bmoe ARGS`` through the CLI's main(), stdout and stderr captured."""
    from bmoe.cli import main

    # text streams with a binary buffer beneath, as the real ones (`bmoe run` writes bytes)
    out, err = (io.TextIOWrapper(io.BytesIO(), "utf-8", "replace", write_through=True)
                for _ in range(2))  # fmt: skip
    tb = None
    code: int | None = None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(args)
        except BaseException:  # what the audit counts
            tb = traceback.format_exc()
    out_text, err_text = (s.buffer.getvalue().decode("utf-8", "replace") for s in (out, err))
    if tb is None and "Traceback (most recent call last)" in err_text:
        tb = err_text
    return Result(code, out_text, err_text, tb)
