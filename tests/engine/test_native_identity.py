"""The embedded engine against the real native ``bmoe-cli``, on every generated family the native
engine streams, with the same model, prompt and flags: the route trace row for row, live drops,
the ``--predict-log`` lines, session turns, ``--ngram`` speculation, the end-of-run lines both
print, and the memory columns of the metrics CSV by cache budget.

Each check first makes sure its run exercised what it compares (evictions, drops, drafts, a
kept and a cleared context), so two engines that both did nothing cannot pass for equal. The
native build is found as every test finds it (``tests/native_build.py``); without one these
tests skip, saying where they looked.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python (the engine extra) is not installed")

from bmoe.engine.native import native_refusal
from bmoe.engine.session import SessionClient
from bmoe.engine.synth import ARCHS, synth_model
from bmoe.formats import protocol
from bmoe.formats.metrics import read_metrics
from bmoe.formats.route import read_route_trace

pytestmark = [pytest.mark.engine, pytest.mark.slow]

#: The generated families the native engine streams (the others it refuses; see below).
FAMILIES = [arch for arch in ARCHS if native_refusal(arch) is None]
#: Small enough to make and run in a second or two, wide enough that the cache and the
#: expert memory dominate what each engine holds (a few hundred MiB of experts).
SHAPE = {"layers": 4, "experts": 32, "top_k": 4, "n_ff_exp": 512, "type": "f32"}
PROMPT = "The capital of Japan is"
#: A prompt whose continuation the n-gram source can draft from.
REPEATING = " ".join(["one two three four five six"] * 4)
N = 8
#: Budgets of the memory check: a smaller one and one that holds every expert.
EVICTING_MIB, HOLDING_MIB = 48, 1024
#: Figures of the end-of-run lines that time something (they differ run to run).
TIMED = ("s/tok", "tok/s", "_s", "_tps", "cpu_pct", "MiB/s", "majflt/tok")


@dataclass
class Ran:
    """One engine process: what it printed and the files it wrote."""

    out: bytes
    err: str
    folder: Path

    @property
    def figures(self) -> dict:
        return protocol.parse_run_lines(self.out)

    def lines(self, prefix: str) -> list[str]:
        text = protocol.to_text(self.out)
        return [ln for ln in text.splitlines() if ln.startswith(prefix)]


@pytest.fixture(scope="module", params=FAMILIES)
def family_model(request, tmp_path_factory) -> Path:
    """One model per family the native engine streams, made once."""
    arch = request.param
    return synth_model(
        tmp_path_factory.mktemp(f"identity-{arch}") / f"{arch}.gguf", "tiny", arch=arch, **SHAPE
    )


def _programs(native_cli: Path) -> dict[str, list[str]]:
    return {"native": [str(native_cli)], "embedded": [sys.executable, "-m", "bmoe", "run"]}


def _flags(model: Path, cache_mb: int, *extra: str, prompt: str = PROMPT, n: int = N) -> list[str]:
    return [
        "-m",
        str(model),
        "-p",
        prompt,
        "-n",
        str(n),
        "-t",
        "1",
        "-c",
        "512",
        "--moe-stream",
        "--no-odirect",
        "--cache-mb",
        str(cache_mb),
        "--force-cache",
        *extra,
    ]


def run_both(native_cli: Path, folder: Path, flags: list[str], files: tuple[str, ...] = ()):
    """Each engine once on `flags` in a folder of its own; `files` are output flags (``csv``,
    ``route_trace``) that each run writes into its folder."""
    ran = {}
    for name, program in _programs(native_cli).items():
        where = folder / name
        where.mkdir(parents=True, exist_ok=True)
        outputs = [a for f in files for a in (f"--{f.replace('_', '-')}", str(where / f"{f}.csv"))]
        proc = subprocess.run(
            [*program, *flags, *outputs], capture_output=True, cwd=where, timeout=300
        )
        assert proc.returncode == 0, f"{name}: {proc.stderr.decode(errors='replace')[-2000:]}"
        ran[name] = Ran(proc.stdout, proc.stderr.decode(errors="replace"), where)
    return ran["native"], ran["embedded"]


def _untimed(figures: dict) -> dict:
    return {k: v for k, v in figures.items() if not any(t in k for t in TIMED)}


def assert_same_run_lines(native: Ran, embedded: Ran) -> None:
    """The end-of-run lines both engines print: the same lines in the same order, and the same
    figures in each except the ones that time something."""
    ours = protocol.parse_run_lines(embedded.out)
    theirs = protocol.parse_run_lines(native.out)
    # every native line is read, but for the --predict-log lines (compared as text)
    other = theirs.get("other_lines", [])
    assert all(ln.startswith("moe-predict:") for ln in other), other
    assert ours.get("other_lines", []) == other
    common = [k for k in theirs if k in ours and k != "other_lines"]
    assert len(common) >= 8  # generation, compute, prefill, moe-stream, moe-cache at least
    assert _untimed({k: ours[k] for k in common}) == _untimed({k: theirs[k] for k in common})
    assert set(theirs) - set(ours) <= {"other_lines"}  # a native line the embedded one lacks
    heads = [
        ln.split(":")[0]
        for ln in protocol.to_text(native.out).splitlines()
        if ln.startswith(protocol.RUN_PREFIXES)
    ]
    ours_heads = [
        ln.split(":")[0]
        for ln in protocol.to_text(embedded.out).splitlines()
        if ln.startswith(protocol.RUN_PREFIXES) and not ln.startswith("mode:")
    ]
    assert ours_heads == heads  # the lines both print, in the native engine's order


def test_route_trace_predict_lines_and_run_lines(native_cli, family_model, tmp_path) -> None:
    flags = _flags(family_model, EVICTING_MIB // 4, "--predict-log")
    native, embedded = run_both(native_cli, tmp_path, flags, ("csv", "route_trace"))
    theirs = read_route_trace(native.folder / "route_trace.csv")
    ours = read_route_trace(embedded.folder / "route_trace.csv")
    assert ours.meta == theirs.meta
    assert ours.layers.to_dict("records") == theirs.layers.to_dict("records")
    assert len(ours.rows) == len(theirs.rows) > 0
    exact = [c for c in theirs.rows.columns if c != "weight"]
    assert ours.rows[exact].equals(theirs.rows[exact])
    assert np.allclose(ours.rows["weight"], theirs.rows["weight"], rtol=1e-5, atol=1e-6)
    assert (theirs.rows["residency"] == 0).sum() > (theirs.rows["phase"] == 0).sum() // 4
    assert native.figures["evictions"] > 0  # the run evicted, re-read: the cache was exercised
    assert_same_run_lines(native, embedded)
    predict = native.lines("moe-predict")
    assert len(predict) >= 2 and embedded.lines("moe-predict") == predict
    assert _table(embedded) == _table(native) != []


def _table(ran: Ran) -> list[str]:
    """The --predict-log per-layer table (the rows under its header)."""
    lines = protocol.to_text(ran.out).splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith("layer")), None)
    return [] if start is None else [ln for ln in lines[start:] if ln.strip()]


def test_live_drops(native_cli, family_model, tmp_path) -> None:
    flags = _flags(family_model, EVICTING_MIB // 4, "--drop-cold-experts", "1.0")
    untraced = run_both(native_cli, tmp_path / "plain", flags)
    traced = run_both(native_cli, tmp_path / "traced", flags, ("route_trace",))
    for native, embedded in (untraced, traced):
        theirs, ours = native.figures, embedded.figures
        assert theirs["experts_dropped"] > 0  # the policy bit
        assert (ours["experts_dropped"], ours["experts_routed"]) == (
            theirs["experts_dropped"],
            theirs["experts_routed"],
        )
        assert_same_run_lines(native, embedded)
    native, embedded = traced
    theirs = read_route_trace(native.folder / "route_trace.csv").rows
    ours = read_route_trace(embedded.folder / "route_trace.csv").rows
    assert theirs["dropped"].sum() > 0 and ours["dropped"].tolist() == theirs["dropped"].tolist()
    assert ours["residency"].tolist() == theirs["residency"].tolist()


def test_ngram_acceptance_and_drafts(native_cli, family_model, tmp_path) -> None:
    flags = _flags(family_model, HOLDING_MIB, "--ngram", "--draft", "3", prompt=REPEATING, n=24)
    native, embedded = run_both(native_cli, tmp_path, flags, ("csv",))
    theirs, ours = native.figures, embedded.figures
    keys = ("mtp_drafted", "mtp_accepted", "mtp_decodes", "drafted_steps", "tokens")
    assert theirs["mtp_drafted"] > 0  # the source drafted
    assert {k: ours[k] for k in keys} == {k: theirs[k] for k in keys}
    assert_same_run_lines(native, embedded)
    a = read_metrics(native.folder / "csv.csv").rows
    b = read_metrics(embedded.folder / "csv.csv").rows
    assert b["mtp_batch"].tolist() == a["mtp_batch"].tolist()


#: (prompt, tokens, clear_kv) of each session turn: a first turn, one that continues it, one
#: more that continues, one that starts over.
TURNS = (
    (PROMPT, 4, True),
    (" And then?", 3, False),
    (" Tell me more.", 3, False),
    ("Start over:", 5, True),
)


def test_session_turns(native_cli, family_model, tmp_path) -> None:
    flags = [*_flags(family_model, EVICTING_MIB // 4, n=4), "--session"]
    seen = {}
    for name, program in _programs(native_cli).items():
        proc = subprocess.Popen(
            [*program, *flags],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=tmp_path,
        )
        try:
            client = SessionClient(proc.stdin, proc.stdout)
            client.wait_ready(timeout=120)
            turns = [client.generate(p, n_predict=n, clear_kv=c, timeout=120) for p, n, c in TURNS]
            client.close()
            assert proc.wait(timeout=60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
        seen[name] = [(t.done["n_prompt"], t.done["n_past"], t.tokens, t.text) for t in turns]
    native = seen["native"]
    # n_past counts a turn's own tokens; what the kept context changes is what the continued
    # turns generate, so those must have generated something for the texts to tell
    assert native[1][2] + native[2][2] > 0 and native[3][2] > 0
    assert all(past == prompt + tokens for prompt, past, tokens, _text in native)
    assert seen["embedded"] == native


#: Stands in for the embedded engine's model load: the process as it is right before it, with
#: the libraries the load brings in (llama.cpp, gguf), reports its memory and ends.
_BEFORE_LOAD = """
import runpy, sys
from bmoe.engine.embedded import engine, model, probes

def before_load(self, cfg, **kw):
    import gguf  # noqa: F401
    model.llama()
    memory = probes.memory()
    print("BASE", memory["rss_anon_mib"], memory["rss_file_mib"], flush=True)
    raise SystemExit(0)

engine.EmbeddedEngine.__init__ = before_load
sys.argv = ["bmoe", "run", *sys.argv[1:]]
runpy.run_module("bmoe", run_name="__main__")
"""


def _baseline_embedded(flags: list[str]) -> tuple[float, float]:
    """RssAnon and RssFile (MiB) of the embedded engine's program before any model: the
    command line run as the test runs it, stopped where the model would load."""
    out = subprocess.run(
        [sys.executable, "-c", _BEFORE_LOAD, *flags], capture_output=True, text=True, timeout=120
    )
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("BASE "))
    anon, file = line.split()[1:]
    return float(anon), float(file)


def _baseline_native(native_cli: Path, folder: Path) -> tuple[float, float]:
    """The same for the native binary: held while it opens its model, a FIFO nobody writes."""
    fifo = folder / "model.gguf"
    os.mkfifo(fifo)
    proc = subprocess.Popen(
        [str(native_cli), "-m", str(fifo), "-n", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        status = Path(f"/proc/{proc.pid}/status")
        deadline = time.monotonic() + 30
        while Path(f"/proc/{proc.pid}/wchan").read_text() != "wait_for_partner":
            assert time.monotonic() < deadline, "the native engine never opened its model"
            time.sleep(0.01)
        fields = dict(line.split(":", 1) for line in status.read_text().splitlines())
        anon, file = (int(fields[k].split()[0]) / 1024 for k in ("RssAnon", "RssFile"))
    finally:
        with open(fifo, "wb"):
            pass  # the writer arrives, the model is empty: the engine exits
        proc.wait(timeout=30)
    return anon, file


def test_memory_columns_by_cache_budget(native_cli, family_model, tmp_path) -> None:
    """What each engine holds beyond its own program (the columns less the program's memory
    before any model): within 5 % of each other, column by column, at a smaller budget and one
    that holds every expert."""
    flags = _flags(family_model, EVICTING_MIB)
    base = {"native": _baseline_native(native_cli, tmp_path), "embedded": _baseline_embedded(flags)}
    held = {}
    for budget in (EVICTING_MIB, HOLDING_MIB):
        native, embedded = run_both(
            native_cli, tmp_path / str(budget), _flags(family_model, budget), ("csv",)
        )
        for name, ran in (("native", native), ("embedded", embedded)):
            rows = read_metrics(ran.folder / "csv.csv").rows
            anon, file = base[name]
            held[budget, name] = (
                rows["rss_anon_mib"].max() - anon,
                rows["rss_file_mib"].max() - file,
            )
    for budget in (EVICTING_MIB, HOLDING_MIB):
        theirs, ours = held[budget, "native"], held[budget, "embedded"]
        for column, a, b in zip(("rss_anon_mib", "rss_file_mib"), theirs, ours, strict=True):
            assert abs(b - a) <= 0.05 * a, (budget, column, a, b)
    # the cache is most of what anon holds, and a larger budget holds no less
    assert held[HOLDING_MIB, "native"][0] >= held[EVICTING_MIB, "native"][0] > EVICTING_MIB * 0.8


def test_the_architectures_the_native_engine_streams(native_cli, tmp_path) -> None:
    """The one list bmoe keeps of them is the binary's own, and a family off it is refused by
    the native engine in the words the embedded engine's note and the sweep quote."""
    from bmoe.engine.native import NATIVE_STREAMED_ARCHS

    listed = subprocess.run([str(native_cli), "--list-archs"], capture_output=True, text=True)
    names = [ln.strip() for ln in listed.stdout.splitlines()[1:] if ln.strip()]
    assert names == list(NATIVE_STREAMED_ARCHS)
    refused = [arch for arch in ARCHS if native_refusal(arch) is not None]
    assert refused == ["llama", "deepseek2"]
    for arch in refused:
        model = synth_model(tmp_path / f"{arch}.gguf", "tiny", arch=arch)
        proc = subprocess.run([str(native_cli), *_flags(model, 4, n=1)], capture_output=True)
        assert proc.returncode != 0
        assert native_refusal(arch) in proc.stderr.decode(errors="replace")


#: Each identity check against a native engine made to disagree in what that check compares: a
#: wrapper around the real binary that swaps one argument (or adds one), so that the checks
#: above are known to fail when the two engines differ.
DISAGREEING = {
    "route_trace": (test_route_trace_predict_lines_and_run_lines, ("12", "24"), ()),
    "drops": (test_live_drops, ("1.0", "0.5"), ()),
    "ngram": (test_ngram_acceptance_and_drafts, ("24", "16"), ()),  # fewer verify decodes
    "session": (test_session_turns, None, ("--chatml",)),
    "memory": (test_memory_columns_by_cache_budget, ("48", "24"), ()),
}


def _disagreeing(native_cli: Path, folder: Path, swap: tuple[str, str] | None, extra) -> Path:
    script = folder / "disagreeing-bmoe-cli"
    case = f'  "{swap[0]}") args+=("{swap[1]}") ;;\n' if swap else ""
    script.write_text(
        '#!/bin/bash\nargs=()\nfor a in "$@"; do\n case "$a" in\n'
        f'{case}  *) args+=("$a") ;;\n esac\ndone\n'
        f'case " $* " in *" -n 1 "*) exec "{native_cli}" "$@" ;; esac\n'  # the memory baseline
        f'exec "{native_cli}" "${{args[@]}}" {" ".join(extra)}\n'
    )
    script.chmod(0o755)
    return script


@pytest.fixture(scope="module")
def one_model(tmp_path_factory) -> Path:
    """The first family's model, for the checks made to fail."""
    return synth_model(tmp_path_factory.mktemp("disagree") / "m.gguf", "tiny", arch=FAMILIES[0],
                       **SHAPE)  # fmt: skip


@pytest.mark.parametrize("check", sorted(DISAGREEING))
def test_each_check_fails_when_the_engines_disagree(native_cli, one_model, check, tmp_path):
    test, swap, extra = DISAGREEING[check]
    other = _disagreeing(native_cli, tmp_path, swap, extra)
    (tmp_path / "run").mkdir()
    with pytest.raises(AssertionError):
        test(other, one_model, tmp_path / "run")
