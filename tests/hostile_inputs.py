"""Hostile inputs for every CLI command, generated from the real corpus into a folder.

The regression corpus of damaged and crafted files is made here, never stored: each case is
a real engine file with one thing done to it (cut, bytes flipped, garbage lines, CRLF, a BOM,
binary noise, markup-looking text), or with one value set outside the telemetry contract
(ids beyond ``n_expert``, sizes beyond int64, preamble values empty / ``x`` / ``nan`` / huge /
negative, ``wall_ms`` of nan, inf or 0), plus damaged sweep folders. ``commands`` pairs
every case with the commands that take such a file. Used by tests/cli/test_fuzz.py and
benchmarks/robustness.py.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
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


def _control_results(dest: Path) -> None:
    """Cell names, a flag value and an error holding terminal control sequences."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(dest / "results.parquet")
    for column, mark in (("cell", "\x1b[31m"), ("model", "\x9b2J"), ("error", "\x1b]8;;x\x07")):
        if column in table.column_names:
            i = table.column_names.index(column)
            values = [f"{mark}{'' if v is None else v}" for v in table.column(i).to_pylist()]
            table = table.set_column(i, column, pa.array(values, pa.string()))
    pq.write_table(table, dest / "results.parquet")


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
        "results-control": _control_results,
        "config-control": _write(
            "sweep.toml", b'[sweep]\nname = "x"\n[base]\nmodel = "\\u001b[31mm"\n'
        ),
    }
    return [_sweep_case(source, f"sweep-{k}", v) for k, v in damages.items()]


# ----------------------------------------------------------------------------- second round
# The commands added since the first audit, the Parquet side, the device profile, sweep
# configurations that ask for unbounded work, and paths that are not plain files.

#: Row sources of the Parquet cases (path under the corpus -> kind).
PARQUET_SOURCES = {
    "native-tiny/run.route.csv": "route",
    "native-tiny/run.csv": "metrics",
    "native-tiny/run.io.csv": "io",
    "native-tiny/ct.compute.csv": "compute",
    "native-tiny/ctl.compute-layers.csv": "compute",
}
#: Values the ``bmoe.*`` schema metadata keys are set to (raw bytes, one at a time).
PARQUET_META_VALUES = (
    b"1", b"null", b'"x"', b"[]", b"{}", b"[1, 2]", b'{"a": {"b": [1]}}', b"\xff\xfe",
    b"{not json", b"1e999", b"[" * 5000 + b"]" * 5000,
)  # fmt: skip
#: Control characters that must never reach a terminal or a rendered file unescaped.
CONTROL = ("\x1b[31m", "\x1b]8;;http://x\x1b\\", "\x9b2J", "\x07\x08\r")


def _parquet(table) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def parquet_mutations(table) -> Iterator[tuple[str, bytes]]:
    """A bmoe Parquet table with one thing wrong in its schema, a column or its metadata."""
    import numpy as np
    import pyarrow as pa

    meta = dict(table.schema.metadata or {})

    def kept(changed):  # the metadata as bmoe wrote it (some table operations drop it)
        return changed.replace_schema_metadata(meta)

    yield "parquet-clean", _parquet(table)
    yield "parquet-empty", _parquet(table.slice(0, 0))
    for i, name in enumerate(table.column_names):
        column = table.column(i)
        yield f"parquet-no-{name}", _parquet(kept(table.remove_column(i)))
        renamed = [f"{name}_x" if n == name else n for n in table.column_names]
        yield f"parquet-renamed-{name}", _parquet(kept(table.rename_columns(renamed)))
        spaced = [f"{name} " if n == name else n for n in table.column_names]
        yield f"parquet-spaced-{name}", _parquet(kept(table.rename_columns(spaced)))
        as_text = pa.array([str(v) for v in column.to_pylist()], pa.string())
        yield f"parquet-text-{name}", _parquet(kept(table.set_column(i, name, as_text)))
        values = column.to_pandas().to_numpy()
        if np.issubdtype(values.dtype, np.number):
            holes = values.astype(np.float64)
            holes[:: max(1, len(holes) // 3)] = np.nan
            yield f"parquet-nan-{name}", _parquet(kept(table.set_column(i, name, pa.array(holes))))
            nulls = pa.array(values, mask=np.arange(len(values)) % 3 == 0)
            yield f"parquet-null-{name}", _parquet(kept(table.set_column(i, name, nulls)))
            big = pa.array(np.full(len(values), 2**62, dtype=np.int64))
            yield f"parquet-huge-{name}", _parquet(kept(table.set_column(i, name, big)))
            flag = pa.array(np.arange(len(values)) % 2 == 0)
            yield f"parquet-bool-{name}", _parquet(kept(table.set_column(i, name, flag)))
        nested = pa.array([[1, 2]] * len(column))
        yield f"parquet-list-{name}", _parquet(kept(table.set_column(i, name, nested)))
    doubled = table.append_column(table.column_names[0], table.column(0))
    yield "parquet-duplicate", _parquet(kept(doubled))
    for key in (b"bmoe.meta", b"bmoe.summaries", b"bmoe.layers", b"bmoe.warnings",
                b"bmoe.version", b"bmoe.kind", b"bmoe.source"):  # fmt: skip
        gone = {k: v for k, v in meta.items() if k != key}
        yield f"parquet-meta-no-{key.decode()}", _parquet(table.replace_schema_metadata(gone))
        for value in PARQUET_META_VALUES:
            changed = {**meta, key: value}
            label = f"parquet-meta-{key.decode()}={value[:8]!r}"
            yield label, _parquet(table.replace_schema_metadata(changed))
    for text in CONTROL:
        marked = json.loads(meta[b"bmoe.meta"])
        marked.update(arch=text, model=text)
        changed = {**meta, b"bmoe.meta": json.dumps(marked).encode(),
                   b"bmoe.source": text.encode()}  # fmt: skip
        yield f"parquet-control-{text[:4]!r}", _parquet(table.replace_schema_metadata(changed))
    for key, value in (("n_expert", "[/]"), ("n_layer", -1), ("n_expert_used", 2**40),
                       ("n_expert", 1e300), ("model", None), ("n_layer", [1])):  # fmt: skip
        marked = json.loads(meta[b"bmoe.meta"])
        marked[key] = value
        changed = {**meta, b"bmoe.meta": json.dumps(marked).encode()}
        yield f"parquet-meta-{key}={value!r:.8}", _parquet(table.replace_schema_metadata(changed))
    if b"bmoe.layers" in meta:
        for layers in ('[{"name": "layer", "dtype": "int64", "values": [1, 2]}, '
                       '{"name": "expert_bytes", "dtype": "int64", "values": [1]}]',
                       '[{"name": "layer", "dtype": "nonsense", "values": [1]}]',
                       '[{"name": "layer", "dtype": "int64", "values": ["x"]}]',
                       '[{"name": "expert_bytes", "dtype": "int64", "values": [-5]}]',
                       '[{"name": "layer", "dtype": "object", "values": [{"a": 1}]}]'):  # fmt: skip
            changed = {**meta, b"bmoe.layers": layers.encode()}
            yield (
                f"parquet-layers-{layers[30:44]}",
                _parquet(table.replace_schema_metadata(changed)),
            )
    if b"bmoe.summaries" in meta:
        for summaries in ('[1]', '[{"n_prompt": "x"}]', '[{"a": [1]}]', '["s"]',
                          '[{"prefill_s": -1e400}]'):  # fmt: skip
            changed = {**meta, b"bmoe.summaries": summaries.encode()}
            yield (
                f"parquet-summaries-{summaries[:12]}",
                _parquet(table.replace_schema_metadata(changed)),
            )


def parquet_cases(corpus: Path) -> list[Case]:
    """Each row source as bmoe writes it to Parquet, then damaged one way at a time."""
    from bmoe.formats.load import load_file, row_kind
    from bmoe.formats.parquet import to_table

    cases: list[Case] = []
    for rel, kind in PARQUET_SOURCES.items():
        src = corpus / rel
        if not src.is_file():
            continue
        obj = load_file(src)
        table = to_table(obj, row_kind(obj))
        stem = rel.replace("/", "_") + ".parquet"
        for what, data in parquet_mutations(table):
            cases.append(Case(f"{stem}.{len(cases)}", kind, what, data))
    return cases


def header_mutations(data: bytes) -> Iterator[tuple[str, bytes]]:
    """Every column of a text file's header dropped, renamed, or spelled with blanks."""
    lines = _lines(data)
    header = next((i for i, ln in enumerate(lines) if not ln.startswith(b"#")), None)
    if header is None:
        return
    names = lines[header].rstrip(b"\r\n").split(b",")
    for c, name in enumerate(names):
        text = name.decode("utf-8", "replace")
        dropped = _drop_column(data, text)
        if dropped is not None:
            yield f"no-{text}", dropped
        for label, new in (("trailing-space", name + b" "), ("leading-space", b" " + name),
                           ("upper", name.upper()), ("renamed", name + b"_x")):  # fmt: skip
            changed = [*names[:c], new, *names[c + 1 :]]
            yield (
                f"header-{label}-{text}",
                b"".join([*lines[:header], b",".join(changed) + b"\n", *lines[header + 1 :]]),
            )


def control_mutations(data: bytes) -> Iterator[tuple[str, bytes]]:
    """Control characters in a preamble value, a cell and a line of their own."""
    lines = _lines(data)
    for i, text in enumerate(CONTROL):
        mark = text.encode("utf-8")
        yield f"control-{i}-preamble", re.sub(rb"=(\S+)", b"=" + mark + rb"\1", data, count=3)
        yield f"control-{i}-arch", data.replace(b"arch=", b"arch=" + mark, 1)
        body = [j for j, ln in enumerate(lines) if not ln.startswith(b"#")]
        if len(body) > 1:
            j = body[1]
            row = lines[j].split(b",")
            row[-1] = mark + b"\n"
            yield f"control-{i}-cell", b"".join([*lines[:j], b",".join(row), *lines[j + 1 :]])
            header = lines[body[0]].split(b",")
            header[0] = header[0] + mark
            yield (
                f"control-{i}-header",
                b"".join([*lines[: body[0]], b",".join(header), *lines[body[0] + 1 :]]),
            )


def text_cases(corpus: Path) -> list[Case]:
    """Header and control-character damage to every text source."""
    cases: list[Case] = []
    for rel, kind in SOURCES.items():
        src = corpus / rel
        if not src.is_file():
            continue
        data = src.read_bytes()
        stem = rel.replace("/", "_") + ".h"
        groups = [control_mutations(data)]
        if kind in ("route", "metrics", "io", "compute"):
            groups.append(header_mutations(data))
        for group in groups:
            for what, mutated in group:
                cases.append(Case(f"{stem}.{len(cases)}", kind, what, mutated))
    return cases


def good_profile(corpus: Path) -> dict:
    """The device profile of the corpus's serial run (as ``bmoe profile`` writes it)."""
    import warnings

    from bmoe.analyze.device import build_profile, profile_runs
    from bmoe.formats.runfiles import read_recorded_runs

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        profile = build_profile(
            profile_runs(read_recorded_runs([corpus / "native-tiny/run.csv"])), allow_traced=True
        )
    return json.loads(json.dumps(profile.to_dict()))


def _profile_paths(doc: dict) -> Iterator[tuple[tuple, object]]:
    """(path, value) of every leaf of a profile document."""
    if isinstance(doc, dict):
        for key, value in doc.items():
            for path, leaf in _profile_paths(value):
                yield (key, *path), leaf
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            for path, leaf in _profile_paths(value):
                yield (index, *path), leaf
    else:
        yield (), doc


def _set_path(doc, path: tuple, value):
    doc = json.loads(json.dumps(doc))
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return doc


#: JSON texts every profile leaf is set to (a value of the wrong kind or beyond reason).
PROFILE_VALUES = ("-Infinity", "Infinity", "NaN", "null", '"x"', "true", "1e20", "1e39",
                  "-1", "0", "1e308", "[]", "{}", '"[/]"', '"\\u001b[31m"')  # fmt: skip


def profile_mutations(doc: dict) -> Iterator[tuple[str, bytes]]:
    """A profile with one value wrong, one section the wrong shape, or the whole file odd."""

    def dump(d) -> bytes:
        return json.dumps(d, indent=1, allow_nan=True).encode()

    yield "profile-clean", dump(doc)
    for path, _leaf in _profile_paths(doc):
        label = ".".join(map(str, path))
        for value in PROFILE_VALUES:
            text = dump(_set_path(doc, path, "@@"))
            yield f"profile-{label}={value}", text.replace(b'"@@"', value.encode())
    for section in ("model", "flash", "compute", "mgmt", "prefill", "overlap", "caveats",
                    "sources", "model.expert_bytes"):  # fmt: skip
        path = tuple(section.split("."))
        for value in (5, "x", None, [], {}, [1], {"a": 1}):
            yield f"profile-{section}-as-{value!r}", dump(_set_path(doc, path, value))
        removed = json.loads(json.dumps(doc))
        node = removed
        for key in path[:-1]:
            node = node[key]
        node.pop(path[-1], None)
        yield f"profile-no-{section}", dump(removed)
    sizes = doc["model"]["expert_bytes"]
    for key in ("²", "-1", "1e3", " 1", "99999999999999999999", "x"):
        changed = _set_path(doc, ("model", "expert_bytes"), {**sizes, key: 196608})
        yield f"profile-expert-bytes-key-{key}", dump(changed)
    zero = json.loads(json.dumps(doc))
    for path, leaf in _profile_paths(doc):
        if isinstance(leaf, int | float) and not isinstance(leaf, bool) and path != ("version",):
            zero = _set_path(zero, path, 0)
    yield "profile-all-zero", dump(zero)
    yield "profile-overlap-5", dump({**doc, "overlap": 5})
    yield "profile-overlap-mode", dump({**doc, "mode": "overlap", "overlap": {}})
    yield "profile-lanes-1e20", dump(_set_path(doc, ("flash", 0, "lanes"), 10**20))
    yield "profile-compute-1e39", dump(_set_path(doc, ("compute", "token_ms"), 1e39))
    yield "profile-huge-caveat", dump({**doc, "caveats": ["c" * (10 << 20)]})
    yield "profile-many-caveats", dump({**doc, "caveats": ["c"] * 200_000})
    yield "profile-many-flash", dump({**doc, "flash": doc["flash"] * 100_000})
    yield (
        "profile-many-layers",
        dump(_set_path(doc, ("model", "expert_bytes"), {str(i): 196608 for i in range(200_000)})),
    )
    yield "profile-deep", b'{"format": "bmoe_profile", "x": ' + b"[" * 1000 + b"]" * 1000 + b"}"
    yield "profile-deeper", b"[" * 100_000 + b"]" * 100_000
    text = json.dumps(doc, indent=1)
    yield "profile-latin1", text.replace("tiny-moe", "tiny-mö").encode("latin-1")
    yield "profile-utf16", text.encode("utf-16")
    yield "profile-bom", b"\xef\xbb\xbf" + text.encode()
    yield "profile-nul", text.encode().replace(b"serial", b"ser\x00ial")
    yield "profile-not-json", b"{format: bmoe_profile}"
    yield "profile-list", b"[1, 2, 3]"
    yield "profile-empty", b""
    yield (
        "profile-dup-keys",
        text.replace('"mode": "serial"', '"mode": "serial", "mode": 5').encode(),
    )
    yield (
        "profile-big-int",
        text.replace('"slices_per_expert": 3', '"slices_per_expert": ' + "9" * 5000).encode(),
    )


def _profile_case(name: str, what: str, profile: bytes, trace: Path) -> Case:
    def build(dest: Path) -> None:
        dest.mkdir()
        (dest / "profile.json").write_bytes(profile)
        (dest / "trace.route.csv").write_bytes(trace.read_bytes())
        (dest / "sweep.toml").write_text(
            '[sweep]\nname = "p"\nengine = "embedded"\nprofile = "profile.json"\n'
            '[base]\nmodel = "m.gguf"\nn_predict = 4\n[grid]\ncache_mb = [1, 2]\n'
        )

    return Case(name, "profile", what, None, build)


def profile_cases(corpus: Path) -> list[Case]:
    """Damaged device profiles, each in a folder with a route trace and a sweep naming it."""
    trace = corpus / "native-tiny/run.route.csv"
    if not trace.is_file():
        return []
    doc = good_profile(corpus)
    return [
        _profile_case(f"profile.{i}", what, data, trace)
        for i, (what, data) in enumerate(profile_mutations(doc))
    ]


#: Sweep configurations asking for work without end, or for values nothing can run.
CONFIGS = {
    "grid-1e6": "[grid]\ncache_mb = {r1000}\nio_threads = {r1000}\n",
    "grid-1e5": "[grid]\ncache_mb = {r1000}\nio_threads = {r100}\n",
    "grid-1e4-repeats-100": "[grid]\ncache_mb = {r100}\nio_threads = {r100}\n",
    "grid-axes-20": "[grid]\n" + "".join(f"a{i} = [1, 2]\n" for i in range(20)),
    "repeats-1e9": "[grid]\ncache_mb = [1]\n",
    "warmup-1e9": "[grid]\ncache_mb = [1]\n",
    "max-repeats-1e9": "[grid]\ncache_mb = [1]\n",
    "retries-1e9": "[grid]\ncache_mb = [1]\n",
    "timeout-1e308": "[grid]\ncache_mb = [1]\n",
    "prompt-urandom": "[grid]\ncache_mb = [1]\n",
    "prompt-zero": "[grid]\ncache_mb = [1]\n",
    "prompt-fifo": "[grid]\ncache_mb = [1]\n",
    "prompt-lines-zero": '[grid]\nprompt_lines = "/dev/zero"\n',
    "prompt-lines-urandom": '[grid]\nprompt_lines = "/dev/urandom"\n',
    "prompt-loop": "[grid]\ncache_mb = [1]\n",
    "profile-zero": "[grid]\ncache_mb = [1]\n",
    "profile-fifo": "[grid]\ncache_mb = [1]\n",
    "profile-urandom": "[grid]\ncache_mb = [1]\n",
    "nested-1e5": "x = " + "[" * 100_000 + "]" * 100_000 + "\n",
    "nested-tables-1e4": "x = " + "{a = " * 10_000 + "1" + "}" * 10_000 + "\n",
    "nested-keys-1e4": "[" + ".".join(["a"] * 10_000) + "]\n",
    "cache-1e308": "[grid]\ncache_mb = [1e308]\n",
    "cache-inf": "[grid]\ncache_mb = [inf]\n",
    "cache-nan": "[grid]\ncache_mb = [nan]\n",
    "cache-negative": "[grid]\ncache_mb = [-1]\n",
    "n-predict-1e18": "[grid]\nn_predict = [1000000000000000000]\n",
    "threads-1e9": "[grid]\nthreads = [1000000000]\n",
    "gate-1e308": "[grid]\ncache_mb = [1]\n[gate]\nmin_mem_available_mb = 1e308\n"
    "max_wait_s = 1e308\n",
    "long-prompt": "[grid]\ncache_mb = [1]\n",
    "control-name": '[grid]\ncache_mb = ["\\u001b[31m", "\\u009b2J"]\n',
    "control-prompt": '[grid]\nprompt = ["a\\u001b[2Jb", "c\\u0007"]\n',
    "many-cells-1e5": "",
}
#: [sweep] and [base] lines per configuration (the rest as in :func:`_config_text`).
_CONFIG_SWEEP = {
    "repeats-1e9": "repeats = 1000000000\n",
    "grid-1e4-repeats-100": "repeats = 100\n",
    "warmup-1e9": "warmup = 1000000000\n",
    "max-repeats-1e9": 'repeats = "auto"\nmax_repeats = 1000000000\n',
    "retries-1e9": "retries = 1000000000\n",
    "timeout-1e308": "timeout_s = 1e308\n",
    "profile-zero": 'profile = "/dev/zero"\n',
    "profile-fifo": 'profile = "fifo"\n',
    "profile-urandom": 'profile = "/dev/urandom"\n',
}
_CONFIG_BASE = {
    "prompt-urandom": 'prompt_file = "/dev/urandom"\n',
    "prompt-zero": 'prompt_file = "/dev/zero"\n',
    "prompt-fifo": 'prompt_file = "fifo"\n',
    "prompt-loop": 'prompt_file = "loop"\n',
    "long-prompt": 'prompt_file = "long.txt"\n',
}


def _config_text(name: str) -> str:
    grid = CONFIGS[name].replace("{r1000}", str(list(range(1, 1001))))
    grid = grid.replace("{r100}", str(list(range(1, 101))))
    if name == "many-cells-1e5":
        grid = "".join(f"[[cells]]\ncache_mb = {i}\n" for i in range(100_000))
    sweep = _CONFIG_SWEEP.get(name, "")
    base = _CONFIG_BASE.get(name, "")
    if "nested" in name:
        return f'[sweep]\nname = "c"\n{grid}'
    return (f'[sweep]\nname = "c"\nengine = "embedded"\n{sweep}[base]\nmodel = "m.gguf"\n'
            f'{base}n_predict = 4\n{grid}')  # fmt: skip


def _config_case(name: str) -> Case:
    def build(dest: Path) -> None:
        dest.mkdir()
        (dest / "sweep.toml").write_text(_config_text(name), encoding="utf-8")
        os.mkfifo(dest / "fifo")
        (dest / "loop").symlink_to(dest / "loop")
        with open(dest / "long.txt", "wb") as fh:  # a sparse 20 GB prompt
            fh.truncate(20 << 30)

    return Case(f"config.{name}", "config", name, None, build)


def config_cases() -> list[Case]:
    return [_config_case(name) for name in CONFIGS]


def _special(name: str, make) -> Case:
    return Case(f"special.{name}", "special", name, None, make)


def _sparse_metrics(corpus: Path, size: int):
    def build(dest: Path) -> None:
        head = (corpus / "native-tiny/run.csv").read_bytes()
        with open(dest, "wb") as fh:
            fh.write(head[: head.index(b"\n", head.index(b"step,")) + 1])
            fh.truncate(size)  # NULs to the end: a file `info` calls binary

    return build


def special_cases(corpus: Path, sparse_gb: int = 20) -> list[Case]:
    """Paths that are not plain files: a symlink loop, a dangling link, a directory, a link to
    a device, and a sparse file of `sparse_gb` GB that starts like a metrics CSV."""
    cases = [
        _special("loop", lambda d: d.symlink_to(d)),
        _special("dangling", lambda d: d.symlink_to(d.parent / "nowhere")),
        _special("directory", lambda d: d.mkdir()),
        _special("to-zero", lambda d: d.symlink_to("/dev/zero")),
        _special("to-urandom", lambda d: d.symlink_to("/dev/urandom")),
    ]
    if (corpus / "native-tiny/run.csv").is_file():
        cases.append(_special("sparse-metrics", _sparse_metrics(corpus, sparse_gb << 30)))
    return cases


#: The commands each new kind of case goes through ({f}: the case; {trace}, {profile}: a good
#: route trace and device profile; {o}: a fresh folder).
PROFILE_COMMANDS = {
    "predict": [
        "predict",
        "{f}/trace.route.csv",
        "-p",
        "{f}/profile.json",
        "-g",
        "cache_mb=1,2",
        "-g",
        "io_threads=1,2",
    ],
    "predict-json": [
        "predict",
        "{f}/trace.route.csv",
        "-p",
        "{f}/profile.json",
        "-g",
        "cache_mb=1",
        "-f",
        "json",
    ],
    "predict-drop": [
        "predict",
        "{f}/trace.route.csv",
        "-p",
        "{f}/profile.json",
        "-g",
        "cache_mb=1",
        "-g",
        "prefetch=1",
        "--drop",
        "0.5",
    ],
    "sweep-profile": ["sweep", "{f}/sweep.toml", "--dry-run"],
    "predict-against": ["predict", "-p", "{f}/profile.json", "--against", "{metrics}"],
}
CONFIG_COMMANDS = {
    "sweep-dry-run": ["sweep", "{f}/sweep.toml", "--dry-run"],
    "analyze-sweep": ["analyze", "sweep", "{f}/sweep.toml"],
    "tune": ["tune", "{f}/sweep.toml", "-o", "{o}"],
}
#: Commands added since the first round, on files of the kind they take.
NEW_COMMANDS = {
    "profile": ["profile", "{f}", "-o", "{o}/p.json", "--allow-traced"],
    "predict-trace": ["predict", "{f}", "-p", "{profile}", "-g", "cache_mb=1,2"],
    "convert-csv": ["convert", "{f}", "--to", "csv", "-o", "{o}"],
    "info-csv": ["info", "{f}", "-f", "csv"],
    "info-markdown": ["info", "{f}", "-f", "markdown"],
    "metrics-csv": ["analyze", "metrics", "{f}", "-f", "csv"],
    "metrics-markdown": ["analyze", "metrics", "{f}", "-f", "markdown"],
    "compute-csv": ["analyze", "decode", "compute", "{f}", "-f", "csv"],
    "compute-markdown": ["analyze", "decode", "compute", "{f}", "-f", "markdown"],
    "io-metrics": ["analyze", "decode", "io", "{f}", "--metrics", "{metrics}"],
    "drop-json": ["analyze", "drop", "{f}", "-f", "json"],
    "history": ["history", "{f}", "{f}"],
    "history-json": ["history", "{f}", "{f}", "-f", "json"],
    "history-csv": ["history", "{f}", "{f}", "-f", "csv"],
    "history-markdown": ["history", "{f}", "{f}", "-f", "markdown"],
    "analyze-sweep-csv": ["analyze", "sweep", "{f}", "-f", "csv"],
    "analyze-sweep-markdown": ["analyze", "sweep", "{f}", "-f", "markdown"],
    "stall-plot": ["analyze", "stall", "{f}", "--plot", "{o}/s.png"],
    "profile-trace": ["profile", "{metrics}", "--trace", "{f}", "--allow-traced"],
    "predict-against": ["predict", "{trace}", "-p", "{profile}", "--against", "{f}"],
    "tune": ["tune", "{f}", "-o", "{o}"],
}
NEW_FOR_KIND = {
    "route": ("predict-trace", "drop-json", "profile-trace"),
    "metrics": ("profile", "metrics-csv", "metrics-markdown", "stall-plot", "predict-against"),
    "io": ("io-metrics",),
    "compute": ("compute-csv", "compute-markdown"),
    "log": ("metrics-csv",),
}
NEW_GENERIC = ("convert-csv", "info-csv", "info-markdown")
NEW_SWEEP = ("history", "predict-against", "history-json", "history-csv", "history-markdown",
             "analyze-sweep-csv", "analyze-sweep-markdown")  # fmt: skip


#: Every command line that writes a file the user names: (argv template, the input the
#: command reads). {dest} is the file to write; {route}, {metrics}, {io}, {compute}, {model},
#: {profile} and {sweep} are inputs (see :func:`writer_inputs`); a plot's {dest} ends in .png.
WRITERS: dict[str, tuple[list[str], str | None]] = {
    "predict --csv": (
        ["predict", "{route}", "-p", "{profile}", "-g", "cache_mb=1", "--csv", "{dest}"],
        "route",
    ),
    "profile -o": (["profile", "{metrics}", "-o", "{dest}", "--allow-traced"], "metrics"),
    "model synth": (["model", "synth", "{dest}"], None),
    "run --csv": (["run", "-m", "{model}", "-n", "1", "--csv", "{dest}"], "model"),
    "run --route-trace": (
        ["run", "-m", "{model}", "-n", "1", "--moe-stream", "--route-trace", "{dest}"],
        "model",
    ),
    "run --io-trace": (
        ["run", "-m", "{model}", "-n", "1", "--moe-stream", "--io-trace", "{dest}"],
        "model",
    ),
    "run --compute-trace": (
        ["run", "-m", "{model}", "-n", "1", "--compute-trace", "{dest}"],
        "model",
    ),
    "run --compute-trace-layers": (
        ["run", "-m", "{model}", "-n", "1", "--compute-trace-layers", "{dest}"],
        "model",
    ),
    "run --fidelity-save": (
        ["run", "-m", "{model}", "-n", "1", "--fidelity-save", "{dest}"],
        "model",
    ),
    "export trace -o": (["export", "trace", "{io}", "-o", "{dest}"], "io"),
    "report -o": (["report", "{metrics}", "-o", "{dest}"], "metrics"),
    "analyze replay --csv": (
        ["analyze", "replay", "{route}", "--budgets", "1", "--policies", "lru", "--csv", "{dest}"],
        "route",
    ),
    "analyze replay --plot": (
        ["analyze", "replay", "{route}", "--budgets", "1", "--policies", "lru", "--plot", "{dest}"],
        "route",
    ),
    "analyze route --plot": (["analyze", "route", "{route}", "--plot", "{dest}"], "route"),
    "analyze stall --plot": (["analyze", "stall", "{metrics}", "--plot", "{dest}"], "metrics"),
    "analyze decode compute --plot": (
        ["analyze", "decode", "compute", "{compute}", "--plot", "{dest}"],
        "compute",
    ),
    "analyze decode io --plot": (["analyze", "decode", "io", "{io}", "--plot", "{dest}"], "io"),
    "history --plot": (["history", "{sweep}", "{sweep}", "--plot", "{dest}"], "sweep"),
}
#: Writers whose file names are derived, not given (each has its own tests).
DERIVED_WRITERS = {
    "convert": "test_existing_outputs_need_force, test_no_command_writes_over_its_input",
    "analyze sweep --plots": "test_sweep_plots_never_overwrite_without_force",
}


def writer_inputs(corpus: Path, folder: Path, sweep: Path) -> dict[str, Path]:
    """Copies of the inputs :data:`WRITERS` read, under `folder` (each may be written over)."""
    tiny = corpus / "native-tiny"
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for key, name in (("route", "run.route.csv"), ("metrics", "run.csv"), ("io", "run.io.csv"),
                      ("compute", "ct.compute.csv")):  # fmt: skip
        out[key] = folder / name
        out[key].write_bytes((tiny / name).read_bytes())
    out["model"] = folder / "model.gguf"
    out["model"].write_bytes(b"GGUF" + b"\0" * 60)
    out["profile"] = folder / "profile.json"
    out["profile"].write_text(json.dumps(good_profile(corpus)), encoding="utf-8")
    out["sweep"] = sweep
    return out


def writer_scenarios(name: str, folder: Path, inputs: dict[str, Path]):
    """(scenario, argv, the file that must come out unchanged) for one writer: over an
    existing file without --force; and, for commands with an input, over that input and over
    a symbolic link to it, both with --force."""
    template, source = WRITERS[name]
    suffix = ".png" if "--plot" in template else ".html" if template[0] == "report" else ".out"
    keep = folder / f"keep-{len(list(folder.iterdir()))}{suffix}"
    keep.write_bytes(b"keep me")

    def args(dest: Path, force: bool) -> list[str]:
        filled = [a.format(dest=dest, **inputs) for a in template]
        return [*filled, "--force"] if force else filled

    yield "existing", args(keep, False), keep
    if source is None or source == "sweep":
        return
    target = inputs[source]
    yield "input", args(target, True), target
    link = (
        folder
        / f"link-{len(list(folder.iterdir()))}{suffix if suffix != '.out' else target.suffix}"
    )
    link.symlink_to(target)
    yield "link-to-input", args(link, True), target


def fixtures(corpus: Path, folder: Path) -> dict[str, object]:
    """The good files the templates name besides the case ({profile}, {trace}, {metrics}),
    written under `folder`."""
    profile = folder / "good-profile.json"
    profile.write_text(json.dumps(good_profile(corpus), indent=1), encoding="utf-8")
    tiny = corpus / "native-tiny"
    return {"profile": profile, "trace": tiny / "run.route.csv", "metrics": tiny / "run.csv"}


def all_cases(corpus: Path, sweep: Path, big_value: int = 1 << 20) -> list[Case]:
    """Every case of both rounds: damaged files, damaged sweep folders, Parquet schemas,
    headers and control characters, device profiles, configurations and special paths."""
    return [
        *file_cases(corpus, big_value=big_value),
        *sweep_cases(sweep),
        *parquet_cases(corpus),
        *text_cases(corpus),
        *profile_cases(corpus),
        *config_cases(),
        *special_cases(corpus),
    ]


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


def commands(
    case: Case, every: bool = False, second_round: bool = True
) -> list[tuple[str, list[str]]]:
    """(name, argv template) of the commands `case` goes through: the ones for its kind and
    the generic ones, or with `every` all of them (files of the wrong kind included); the
    commands of the second round too unless `second_round` is false."""
    if case.kind in THIRD_COMMANDS:
        return list(THIRD_COMMANDS[case.kind].items())
    if not second_round and case.kind in ("sweep", "file", *FOR_KIND, "none", "pressure",
                                          "state"):  # fmt: skip
        if case.kind == "sweep":
            return list(SWEEP_COMMANDS.items())
        names = FILE_COMMANDS if every else (*GENERIC, *FOR_KIND.get(case.kind, ()))
        return [(n, FILE_COMMANDS[n]) for n in names]
    if case.kind == "sweep":
        return [*SWEEP_COMMANDS.items(), *((n, NEW_COMMANDS[n]) for n in NEW_SWEEP)]
    if case.kind == "profile":
        return list(PROFILE_COMMANDS.items())
    if case.kind == "config":
        return list(CONFIG_COMMANDS.items())
    if case.kind == "special" or every:
        names = [*FILE_COMMANDS, *NEW_COMMANDS]
        if case.kind != "special":
            names = [n for n in names if n not in NEW_SWEEP]
        return [(n, FILE_COMMANDS.get(n) or NEW_COMMANDS[n]) for n in names]
    old = [(n, FILE_COMMANDS[n]) for n in (*GENERIC, *FOR_KIND.get(case.kind, ()))]
    new = [(n, NEW_COMMANDS[n]) for n in (*NEW_GENERIC, *NEW_FOR_KIND.get(case.kind, ()))]
    return old + new


def argv(template: list[str], path: Path, out: Path, extra: dict[str, object] | None = None):
    """`template` with {f} the case, {o} its output folder and `extra`'s names filled in."""
    return [a.format(f=path, o=out, **(extra or {})) for a in template]


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


# ----------------------------------------------------------------------------- third round
# Oversized and compressed inputs, CSV formula cells, session requests and tune faults.

#: A text cell a spreadsheet would run (the prompt axis of the audit's sweep).
FORMULA = "=cmd|' /C calc'!A0 explain"
FORMULA_CELLS = (FORMULA, "+1+cmd", "-2+3", "@SUM(A1:A9)", "\t=1+1", "\r=1+1")


def _route_parquet_rows(corpus: Path, rows: int):
    """A route trace's Parquet form declaring `rows` rows of zeros: some MB on disk."""

    def build(dest: Path) -> None:
        import numpy as np
        import pyarrow as pa
        import pyarrow.parquet as pq

        from bmoe.formats.load import load_file, row_kind
        from bmoe.formats.parquet import to_table

        obj = load_file(corpus / "native-tiny/run.route.csv")
        schema = to_table(obj, row_kind(obj)).schema
        block = min(rows, 10_000_000)
        chunk = pa.table({f.name: np.zeros(block, f.type.to_pandas_dtype()) for f in schema},
                         schema=schema)  # fmt: skip
        with pq.ParquetWriter(dest, schema, compression="zstd") as writer:
            for _ in range(rows // block):
                writer.write_table(chunk, row_group_size=block)

    return build


def _sparse_route(corpus: Path, size: int, rows_mib: int = 0):
    """`size` bytes of NULs, after a route trace's preamble and header when `rows_mib` >= 0
    (and that many MiB of its rows), none at all when it is negative."""

    def build(dest: Path) -> None:
        data = (corpus / "native-tiny/run.route.csv").read_bytes()
        start = data.index(b"\n", data.index(b"turn,")) + 1
        with open(dest, "wb") as fh:
            if rows_mib >= 0:
                fh.write(data[:start])
                body = data[start:]
                for _ in range((rows_mib << 20) // len(body) + (1 if rows_mib else 0)):
                    fh.write(body)
            fh.truncate(size)

    return build


def fidelity_reference(path: Path, logits_shape: tuple[int, ...], inflate: int = 0) -> Path:
    """A fidelity reference whose logits declare `logits_shape`; its data: a few bytes, or
    with `inflate`, that many bytes of zeros really deflated (a zip bomb) with the shape
    saying so."""
    import io
    import zipfile

    import numpy as np

    def member(shape: tuple[int, ...], descr: str) -> bytes:
        buf = io.BytesIO()
        header = {"descr": descr, "fortran_order": False, "shape": shape}
        np.lib.format.write_array_header_1_0(buf, header)
        return buf.getvalue()

    head = json.dumps({"format": "bmoe_fidelity_ref", "version": 1, "prompt": "hi",
                       "model": "m.gguf"}).encode()  # fmt: skip
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("header.npy", member((len(head),), "|u1") + head)
        tokens = bytes(4 * min(logits_shape[0], 1024))  # what it declares, or a few bytes of it
        zf.writestr("tokens.npy", member((logits_shape[0],), "<i4") + tokens)
        with zf.open("logits.npy", "w", force_zip64=True) as fh:
            fh.write(member(logits_shape, "<f4"))
            zeros = bytes(1 << 20)
            for _ in range(inflate >> 20):
                fh.write(zeros)
            fh.write(bytes(64 if not inflate else 0))
    return path


def _reference_case(name: str, shape: tuple[int, ...], inflate: int = 0) -> Case:
    def build(dest: Path) -> None:
        dest.mkdir()
        fidelity_reference(dest / "ref.npz", shape, inflate)
        (dest / "tune.toml").write_text(
            '[sweep]\nname = "r"\nengine = "embedded"\n[base]\nmodel = "m.gguf"\n'
            "n_predict = 4\nmoe_stream = true\n[grid]\ncache_mb = [1, 2]\n"
            '[tune]\nmin_fidelity = 0.9\nfidelity_ref = "ref.npz"\n'
        )

    return Case(f"oversized.{name}", "reference", name, None, build)


def oversized_cases(corpus: Path, sparse_gb: int = 20) -> list[Case]:
    """Inputs whose size, or whose declared size once inflated, is beyond reason: sparse
    route traces (no line at all, a header then NULs, rows then NULs), a few MB of Parquet
    declaring 200 M rows, fidelity references declaring vast arrays or inflating to GiBs."""
    size = sparse_gb << 30
    cases = [Case(f"oversized.{name}", "route", name, None, build) for name, build in (
        ("sparse-route-nul", _sparse_route(corpus, size, -1)),
        ("sparse-route-header", _sparse_route(corpus, size, 0)),
        ("sparse-route-tail", _sparse_route(corpus, size, 2)),
        ("parquet-200M-rows", _route_parquet_rows(corpus, 200_000_000)),
    )]  # fmt: skip
    cases += [
        _reference_case("npz-declares-4e12", (4, 10**12)),
        _reference_case("npz-declares-3GiB", (4, 3 << 28)),
        _reference_case("npz-declares-2^80", (2**40, 2**40)),
        _reference_case("npz-inflates-2GiB", (4, 1 << 27), inflate=2 << 30),
    ]
    return cases


def _formula_file(corpus: Path, rel: str):
    def build(dest: Path) -> None:
        data = (corpus / rel).read_bytes()
        out = re.sub(rb"model=\S+", b"model=" + FORMULA.replace(" ", "_").encode(), data, count=1)
        dest.write_bytes(out)

    return build


def _formula_sweep(source: Path):
    def build(dest: Path) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        shutil.copytree(source, dest)
        table = pq.read_table(dest / "results.parquet")
        for n, column in enumerate(("cell", "model", "prompt", "target")):
            if column in table.column_names:
                i = table.column_names.index(column)
                mark = FORMULA_CELLS[n % len(FORMULA_CELLS)]
                values = [f"{mark} {'' if v is None else v}" for v in table.column(i).to_pylist()]
                table = table.set_column(i, column, pa.array(values, pa.string()))
        pq.write_table(table, dest / "results.parquet")

    return build


def formula_cases(corpus: Path, sweep: Path) -> list[Case]:
    """Text that a spreadsheet reads as a formula, where CSV output carries it: a model name
    in a metrics and a route file's preamble, the cells, prompts and models of a sweep."""
    cases = [
        Case("formula.metrics", "formula-metrics", "model=" + FORMULA, None,
             _formula_file(corpus, "native-tiny/run.csv")),
        Case("formula.route", "formula-route", "model=" + FORMULA, None,
             _formula_file(corpus, "native-tiny/run.route.csv")),
    ]  # fmt: skip
    if (sweep / "results.parquet").is_file():
        cases.append(Case("formula.sweep", "formula-sweep", "cells", None, _formula_sweep(sweep)))
    return cases


#: The commands of the third round's kinds ({model}: a generated tiny model).
THIRD_COMMANDS: dict[str, dict[str, list[str]]] = {
    "reference": {
        "tune-fidelity-ref": ["tune", "{f}/tune.toml", "-o", "{o}"],
        "run-fidelity-ref": ["run", "-m", "{model}", "-n", "2", "-t", "1", "--fidelity-ref",
                             "{f}/ref.npz"],
    },
    "formula-metrics": {
        "info-csv": ["info", "{f}", "-f", "csv"],
        "metrics-csv": ["analyze", "metrics", "{f}", "-f", "csv"],
        "validate-csv": ["validate", "{f}", "-f", "csv"],
        "compare-csv": ["analyze", "compare", "{f}", "{f}", "-f", "csv", "--force"],
        "predict-against-csv": ["predict", "{trace}", "-p", "{profile}", "--against", "{f}",
                                "--csv", "{o}/p.csv"],
    },
    "formula-route": {
        "info-csv": ["info", "{f}", "-f", "csv"],
        "route-csv": ["analyze", "route", "{f}", "-f", "csv"],
        "predict-csv": ["predict", "{f}", "-p", "{profile}", "-g", "cache_mb=1,2", "--csv",
                        "{o}/p.csv"],
        "predict-format-csv": ["predict", "{f}", "-p", "{profile}", "-g", "cache_mb=1", "-f",
                               "csv"],
    },
    "formula-sweep": {
        "analyze-sweep-csv": ["analyze", "sweep", "{f}", "-f", "csv"],
        "contamination-csv": ["analyze", "contamination", "{f}", "-f", "csv"],
        "history-csv": ["history", "{f}", "{trace}/..", "-f", "csv"],
        "predict-against-sweep-csv": ["predict", "{trace}", "-p", "{profile}", "--against",
                                      "{f}", "--csv", "{o}/p.csv"],
    },
}  # fmt: skip


def formula_cells(text: str) -> list[str]:
    """The cells of CSV `text` (``#`` lines left out) that a spreadsheet would run: text
    starting with = + - @, a tab or a carriage return that is not a number (``-inf`` and
    ``-nan`` are numbers, as the engine and every float column print them: a spreadsheet
    shows them as an error, it runs nothing)."""
    import csv

    lines = [ln for ln in text.splitlines() if not ln.startswith("#")]
    number = re.compile(
        r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:inf|infinity|nan)", re.I
    )
    return [
        cell
        for row in csv.reader(io.StringIO("\n".join(lines)))
        for cell in row
        if cell[:1] in ("=", "+", "-", "@", "\t", "\r") and not number.fullmatch(cell)
    ]


#: Session request lines that must each be answered on their own, the session serving the
#: next: (label, the line, the id its answer names, the answer: ERROR or DONE).
SESSION_REQUESTS: list[tuple[str, bytes, int, str]] = [
    ("nested-200000", b'{"cmd":"generate","id":1,"prompt":' + b"[" * 200_000 + b"]" * 200_000
     + b"}", 1, "ERROR"),
    ("nested-65", b'{"cmd":"generate","id":2,"prompt":' + b"[" * 65 + b"]" * 65 + b"}", 2,
     "ERROR"),
    ("nested-object", b'{"cmd":"generate","id":3,"prompt":{"a":[[1]]}}', 3, "ERROR"),
    ("id-5000-digits", b'{"cmd":"generate","id":' + b"9" * 5000 + b',"prompt":"hi"}', -1,
     "ERROR"),
    ("n-predict-5000-digits", b'{"cmd":"generate","id":5,"prompt":"hi","n_predict":'
     + b"9" * 5000 + b"}", 5, "ERROR"),
    ("id-2^31", b'{"cmd":"generate","id":2147483648,"prompt":"hi"}', 2147483648, "ERROR"),
    ("id-float", b'{"cmd":"generate","id":7.5,"prompt":"hi"}', 7.5, "ERROR"),
    ("id-string", b'{"cmd":"generate","id":"8","prompt":"hi"}', "8", "ERROR"),
    ("id-null", b'{"cmd":"generate","id":null,"prompt":"hi"}', None, "ERROR"),
    ("n-predict-2^31", b'{"cmd":"generate","id":10,"prompt":"hi","n_predict":2147483648}',
     10, "ERROR"),
    ("n-predict-negative", b'{"cmd":"generate","id":11,"prompt":"hi","n_predict":-1}', 11,
     "ERROR"),
    ("n-predict-float", b'{"cmd":"generate","id":12,"prompt":"hi","n_predict":2.0}', 12,
     "ERROR"),
    ("n-predict-1e18", b'{"cmd":"generate","id":13,"prompt":"hi","n_predict":'
     b"1000000000000000000}", 13, "ERROR"),
    ("lone-surrogate", b'{"cmd":"generate","id":14,"prompt":"a\\ud800b"}', 14, "ERROR"),
    ("lone-low-surrogate", b'{"cmd":"generate","id":15,"prompt":"\\udfff"}', 15, "ERROR"),
    ("prompt-5MiB", b'{"cmd":"generate","id":16,"prompt":"' + b"x" * (5 << 20) + b'"}', 16,
     "ERROR"),
    ("prompt-64MiB", b'{"cmd":"generate","id":17,"prompt":"' + b"y " * (32 << 20) + b'"}',
     17, "ERROR"),
    ("prompt-3MiB-over-ctx", b'{"cmd":"generate","id":18,"prompt":"' + b"z " * (3 << 19)
     + b'"}', 18, "ERROR"),
    ("prompt-number", b'{"cmd":"generate","id":19,"prompt":5}', 19, "ERROR"),
    ("prompt-missing", b'{"cmd":"generate","id":20}', 20, "ERROR"),
    ("id-missing", b'{"cmd":"generate","prompt":"hi"}', -1, "ERROR"),
    ("clear-kv-text", b'{"cmd":"generate","id":22,"prompt":"hi","clear_kv":"yes"}', 22,
     "ERROR"),
    ("think-number", b'{"cmd":"generate","id":23,"prompt":"hi","think":1}', 23, "ERROR"),
    ("cmd-unknown", b'{"cmd":"explode","id":24}', 24, "ERROR"),
    ("cmd-number", b'{"cmd":5,"id":25}', 25, "ERROR"),
    ("not-an-object", b"[1, 2, 3]", -1, "ERROR"),
    ("json-string", b'"generate"', -1, "ERROR"),
    ("not-json", b"{not json", -1, "ERROR"),
    ("not-utf8", b"\xff\xfe\x00garbage", -1, "ERROR"),
    ("nul-bytes", b"\x00" * 64, -1, "ERROR"),
    ("decide", b'{"cmd":"decide","id":30,"prefix":"a","suffix":"b","choices":["x"]}', 30,
     "ERROR"),
    ("control-prompt", b'{"cmd":"generate","id":31,"prompt":"a\\u001b]0;PWNED\\u0007\\u009b'
     b'b","n_predict":2}', 31, "DONE"),
    ("not-utf8-prompt", b'{"cmd":"generate","id":32,"prompt":"a\xff\xfeb","n_predict":2}', 32,
     "DONE"),
    ("empty-prompt", b'{"cmd":"generate","id":33,"prompt":"","n_predict":2}', 33, "DONE"),
    ("n-predict-0", b'{"cmd":"generate","id":34,"prompt":"hi","n_predict":0}', 34, "DONE"),
    ("continue", b'{"cmd":"generate","id":35,"prompt":"more","n_predict":2,"clear_kv":false}',
     35, "DONE"),
    ("duplicate-keys", b'{"cmd":"generate","id":36,"id":37,"prompt":"hi","n_predict":2}', 37,
     "DONE"),
]  # fmt: skip
#: The valid request each hostile one is followed by (its id: 1000 + the request's index).
SESSION_GOOD = b'{"cmd":"generate","id":%d,"prompt":"hello","n_predict":2}'


def tune_text(model: Path, output: Path, budget: int) -> str:
    """A tune of the generated tiny model: 6 cells (a lossy axis: a fidelity reference run
    first), `budget` runs, two a round."""
    return (
        f'[sweep]\nname = "audit"\nengine = "embedded"\noutput = "{output}"\ntimeout_s = 120\n'
        f'[base]\nmodel = "{model}"\nn_predict = 8\nthreads = 1\nmoe_stream = true\n'
        "[grid]\ncache_mb = [1, 2, 8]\ndrop_cold_experts = [0.0, 1.0]\n"
        f"[tune]\nbudget = {budget}\nper_round = 2\nmin_fidelity = 0.5\n"
    )


def tear_manifest(root: Path, rng: random.Random) -> int:
    """Cut the manifest's last line somewhere inside it (a power loss mid-write); returns the
    bytes cut."""
    path = root / "manifest.jsonl"
    data = path.read_bytes()
    body = data.rstrip(b"\n")
    start = body.rfind(b"\n") + 1
    if len(body) - start < 2:
        return 0
    cut = rng.randrange(start + 1, len(body))
    path.write_bytes(data[:cut])
    return len(data) - cut


def duplicate_ok_lines(root: Path) -> int:
    """Append a copy of every ``ok`` line (a manifest copied onto itself); returns how many."""
    path = root / "manifest.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    ok = [ln for ln in lines if b'"status":"ok"' in ln]
    with open(path, "ab") as fh:
        fh.write(b"".join(ok))
    return len(ok)


def tune_problems(root: Path, budget: int, faults: int) -> dict[str, int]:
    """What a tune folder got wrong after its last resume: runs ``lost`` (a completed folder
    no ``ok`` line names, or an ``ok`` line whose folder is gone), runs ``counted twice`` (two
    ``ok`` attempts of one run), runs ``over budget`` (attempts beyond the budget and the
    attempts the `faults` cut short), ``unreadable`` manifest lines, and ``state`` (tune.json
    counting other than the manifest)."""
    from bmoe.sweep.tune import device_use

    lines = (root / "manifest.jsonl").read_bytes().splitlines()
    records = []
    unreadable = 0
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            unreadable += 1
    ok: dict[str, set] = {}
    for r in records:
        if isinstance(r, dict) and r.get("status") == "ok":
            ok.setdefault(str(r.get("run")), set()).add(r.get("attempt"))
    folders = {
        f"{p.parent.parent.name}/{p.parent.name}"
        for p in (root / "cells").glob("*/r*/record.json")
        if json.loads(p.read_text()).get("status") == "ok"
    }
    named = {r.get("dir") for r in records if isinstance(r, dict) and r.get("status") == "ok"}
    gone = sum(1 for d in named if isinstance(d, str) and not (root / d).is_dir())
    used, _ = device_use([r for r in records if isinstance(r, dict)])
    state = json.loads((root / "tune.json").read_text()) if (root / "tune.json").is_file() else {}
    said = (state.get("result") or {}).get("used_runs")
    return {
        "lost": len(folders - set(ok)) + gone,
        "counted twice": sum(1 for attempts in ok.values() if len(attempts) > 1),
        "over budget": max(0, used - budget - faults),
        "unreadable": unreadable,
        "state": int(said is not None and said != used),
    }


def inject_full_disk(k: int) -> None:
    """Make this process's sweep archive "full" (ENOSPC) at the `k`-th completed run's
    rename: what a full disk does to the runner, without filling one."""
    import errno

    from bmoe.sweep.archive import ArchiveWriter

    calls: list[int] = []
    finalize = ArchiveWriter.finalize

    def full(self, files, record):
        calls.append(1)
        if len(calls) >= k:
            raise OSError(errno.ENOSPC, "No space left on device", str(files.staging))
        return finalize(self, files, record)

    ArchiveWriter.finalize = full  # type: ignore[method-assign]


# ----------------------------------------------------------------------------- test helpers

#: Bytes of address space of a capped child: the interpreter with numpy, pandas, pyarrow, numba.
CAP = 3 << 30
_ROOT = Path(__file__).resolve().parent.parent


def capped(args: list[str], timeout: float = 120, cwd: Path | None = None):
    """``bmoe ARGS`` in a child process whose address space is capped at :data:`CAP`."""
    import subprocess
    import sys
    import time

    code = (
        "import resource, sys\n"
        f"resource.setrlimit(resource.RLIMIT_AS, ({CAP}, {CAP}))\n"
        "from bmoe.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", code, *map(str, args)],
        capture_output=True, text=True, timeout=timeout, cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(_ROOT), "COLUMNS": "100"},
    )  # fmt: skip
    done.seconds = time.monotonic() - started  # type: ignore[attr-defined]
    return done


def one_error(result, *needles: str) -> str:
    """The single error line of a refused command (exit 2), which names each needle."""
    err = result.err if hasattr(result, "err") else result.stderr
    assert result.code == 2 if hasattr(result, "code") else result.returncode == 2, err
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err and "internal error" not in err, err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]
