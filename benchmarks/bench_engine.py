"""The embedded engine on the ``small`` synthetic model (16 layers, 64 experts, top-8, ~1 GB).

Three measurements, each against a baseline taken in the same run:

- speed: decode tok/s streaming with a cache that holds every expert vs plain llama-cpp-python
  decoding of the same file (no callback), alternated ``--repeats`` times; the steady-state rate
  (tokens that read nothing) and the time spent inside the eval callback per token;
- memory: peak RSS of a streamed run with ``--cache-mb 64`` vs a plain mmap run (which maps and
  faults the whole file), each in its own process; the whole-process peak (``VmHWM``, which
  includes llama.cpp populating the whole mapping at load), the peak after setup (``VmHWM``
  reset once the experts are rebound) and the per-token anon and file RSS: the anon memory is
  the engine's own (the dense copy, the cache, the buffers), the file RSS llama.cpp's mapping,
  which stays mapped as in the native engine;
- budgets: tok/s, MiB read per token and hit rate at cache 0, a small and a large budget;
- families: for every family ``bmoe model synth --arch`` writes (a mid-sized model each),
  streaming with a cache that holds everything vs plain llama-cpp-python decoding of the same
  file, paired and alternated; the target (>= 0.9) is judged on the CPU-time ratio (process
  CPU per steady-state token, plain / streamed), which a machine loaded by other work disturbs
  far less than the wall-clock ratio printed beside it;
- features: the per-token cost of each newer feature against streaming with the same cache in
  the same run (a split model, --drop-cold-experts, --predict-log, --predict-prefetch, a route
  trace), in process CPU time per steady-state token (us and ratio, the figure to read on a
  loaded machine) and in wall time.

- pair: the embedded engine against the native ``bmoe-cli`` (found as the tests find it:
  ``--native PATH``, else ``$BMOE_NATIVE_CLI``, else the binary ``../shared/native/build.sh``
  reports; skipped, saying why, without one) and plain llama-cpp-python, the same command line
  for each engine (``--moe-stream --no-odirect --force-cache``), paired and interleaved (the
  order alternates each round), each run a fresh process: a budget that holds every expert,
  one that evicts (about 30 % of them), the evicting one with ``--prefetch 1``, with
  ``--drop-cold-experts 1.0`` and as a session of three turns, on a quiet machine and with a
  fixed background load (``--spinners`` busy processes); decode tok/s (each run's tokens over
  their decode walls), the user and system CPU seconds and the peak RSS of each process, the
  embedded / native ratio of each pair and its spread, and a closing markdown table of them.
  Holding or evicting, plain runs wait as streamed ones do (a short spin,
  ``GOMP_SPINCOUNT=3000``); both also run with libgomp's own spin-wait, the engine also with a
  passive wait (``BMOE_OMP_WAIT=passive``), and holding everything also on huge pages
  (``BMOE_HUGE_PAGES=1``).

Usage: python benchmarks/bench_engine.py
       [--section speed|memory|budgets|families|features|pair|all] [--tokens 64]
       [--repeats 3] [--threads 1] [--model PATH] [--native PATH] [--spinners 2]
       [--loads both|quiet|processes] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bmoe.engine.embedded.config import EngineConfig  # noqa: E402
from bmoe.engine.embedded.layout import read_layout  # noqa: E402
from bmoe.engine.embedded.run import RunResult, run_engine  # noqa: E402
from bmoe.engine.synth import synth_model  # noqa: E402

MIB = 1 << 20
PROMPT = "Explain how a mixture-of-experts model decides which experts handle each token."


def _run(model: Path, args: argparse.Namespace, profile: bool = False, **kw) -> RunResult:
    cfg = EngineConfig(
        model=str(model), prompt=PROMPT, n_predict=args.tokens, threads=args.threads, **kw
    )
    return run_engine(cfg, profile_hook=profile)


def _tok_s(run: RunResult, steady: bool) -> float:
    rows = [r for r in run.rows if not steady or r["read_bytes"] == 0]
    wall = sum(r["wall_ms"] for r in rows) / 1e3
    return len(rows) / wall if wall else float("nan")


def _cpu_ms(run: RunResult, steady: bool) -> float:
    """Median process CPU time per token (less sensitive than wall time to other load)."""
    return statistics.median(r["cpu_ms"] for r in run.rows if not steady or r["read_bytes"] == 0)


def speed(model: Path, args: argparse.Namespace) -> None:
    layout = read_layout(model)
    everything = layout.total_expert_bytes / MIB + 1
    plain, streamed, steady, ratios, delta_us, cpu_ratios = [], [], [], [], [], []
    for _ in range(args.repeats):
        p = _run(model, args)
        s = _run(model, args, moe_stream=True, cache_mb=everything)
        plain.append(_tok_s(p, False))
        streamed.append(_tok_s(s, False))
        steady.append(_tok_s(s, True))
        ratios.append(steady[-1] / plain[-1])
        delta_us.append((1 / steady[-1] - 1 / plain[-1]) * 1e6)
        cpu_ratios.append(_cpu_ms(p, False) / _cpu_ms(s, True))
    prof = _run(model, args, profile=True, moe_stream=True, cache_mb=everything)
    quiet = [i for i, r in enumerate(prof.rows) if r["read_bytes"] == 0]
    hook_us = statistics.median(prof.hook_ns[i] for i in quiet) / 1e3
    calls = statistics.median(prof.hook_calls[i] for i in quiet)
    mp, ms, mst = statistics.median(plain), statistics.median(streamed), statistics.median(steady)
    print(f"speed ({args.tokens} tokens, {args.threads} thread(s), median of {args.repeats}):")
    print(f"  plain llama-cpp-python          {mp:8.2f} tok/s")
    print(
        f"  streamed, cache holds all       {ms:8.2f} tok/s   ratio {ms / mp:.3f} (whole run,"
        " first reads included)"
    )
    print(
        f"  streamed, steady state          {mst:8.2f} tok/s   ratio {mst / mp:.3f};"
        f" median of the paired ratios {statistics.median(ratios):.3f} (target >= 0.85)"
    )
    print(
        f"  CPU time per token, plain / streamed steady state: median of the paired ratios"
        f" {statistics.median(cpu_ratios):.3f} (load average {os.getloadavg()[0]:.1f} on"
        f" {os.cpu_count()} CPUs)"
    )
    print(
        f"  hook cost: {statistics.median(delta_us):.0f} us/token slower than plain (paired"
        f" median: callback + a graph split at each routing node); {hook_us:.0f} us/token"
        f" inside the callback over {calls:.0f} calls (median token without reads, in a"
        " separate timed run)"
    )


_CHILD = r"""
import json, sys
sys.path.insert(0, {root!r})
from bmoe.engine.embedded.config import EngineConfig
from bmoe.engine.embedded.run import run_engine
from bmoe.engine.embedded import probes

def reset_peak():
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")

cfg = EngineConfig(**json.loads(sys.argv[1]))
run = run_engine(cfg, on_ready=reset_peak)
mem = probes.memory()
print(json.dumps({{
    "after_setup_peak_mib": mem["peak_rss_mib"],
    "max_row_rss_mib": max(r["rss_mib"] for r in run.rows),
    "max_row_anon_mib": max(r["rss_anon_mib"] for r in run.rows),
    "max_row_file_mib": max(r["rss_file_mib"] for r in run.rows),
    "tok_s": run.summary["tok/s"],
}}))
"""


def _child(model: Path, args: argparse.Namespace, **kw) -> dict:
    cfg = {
        "model": str(model),
        "prompt": PROMPT,
        "n_predict": args.tokens,
        "threads": args.threads,
        **kw,
    }
    code = _CHILD.format(root=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-c", code, json.dumps(cfg)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    peak = 0.0
    status = f"/proc/{proc.pid}/status"
    while proc.poll() is None:  # the whole-process peak, read as a device sampler would
        try:
            with open(status) as fh:
                for line in fh:
                    if line.startswith("VmHWM:"):
                        peak = max(peak, int(line.split()[1]) / 1024)
        except OSError:
            pass
        time.sleep(0.05)
    out, err = proc.communicate()
    if proc.returncode:
        raise SystemExit(err.decode())
    result = json.loads(out.decode().strip().splitlines()[-1])
    result["process_peak_mib"] = peak
    return result


def memory(model: Path, args: argparse.Namespace) -> None:
    layout = read_layout(model)
    dense = layout.dense_bytes / MIB
    base = _child(model, args)
    streamed = _child(model, args, moe_stream=True, cache_mb=64)
    print(
        f"memory ({args.tokens} tokens; dense weights {dense:.1f} MiB, experts "
        f"{layout.total_expert_bytes / MIB:.0f} MiB):"
    )
    for name, r in (("plain mmap", base), ("streamed, --cache-mb 64", streamed)):
        print(
            f"  {name:24s} process peak {r['process_peak_mib']:7.1f} MiB | peak after setup "
            f"{r['after_setup_peak_mib']:7.1f} MiB | per-token max RSS {r['max_row_rss_mib']:7.1f}"
            f" (anon {r['max_row_anon_mib']:.1f}, file {r['max_row_file_mib']:.1f})"
        )
    overhead = streamed["max_row_anon_mib"] - dense - 64
    print(
        f"  streamed RssAnon = dense copy + 64 MiB + {overhead:.1f} MiB fixed overhead "
        "(interpreter, numpy/pandas, llama.cpp context and compute buffers); RssFile is "
        "llama.cpp's mapping of the file, left mapped as the native engine leaves it"
    )
    print(
        f"  ratio streamed / plain, RssAnon: "
        f"{streamed['max_row_anon_mib'] / base['max_row_anon_mib']:.3f}"
    )


def budgets(model: Path, args: argparse.Namespace) -> None:
    layout = read_layout(model)
    everything = layout.total_expert_bytes / MIB + 1
    print(f"budgets ({args.tokens} tokens, {args.threads} thread(s)):")
    plain = _run(model, args)
    print(f"  {'plain (no streaming)':22s} {_tok_s(plain, False):7.2f} tok/s")
    for label, mb in (
        ("cache 0", 0),
        ("cache 64 MiB", 64),
        ("cache 128 MiB", 128),
        ("cache 256 MiB", 256),
        ("cache 512 MiB", 512),
        ("cache holds all", everything),
    ):
        r = _run(model, args, moe_stream=True, cache_mb=mb)
        read = r.summary["read_MiB"] / max(1, r.summary["tokens"])
        print(
            f"  {label:22s} {_tok_s(r, False):7.2f} tok/s  {read:7.2f} MiB/token  "
            f"hit {r.summary['cache_hit_pct']:5.1f} %  io {r.summary['io_s/tok'] * 1e3:6.1f} "
            f"ms/token  o_direct={int(r.o_direct)}"
        )


#: The families section's model: mid-sized, so compute dominates the per-token callback cost.
FAMILY_SHAPE = {
    "layers": 8,
    "experts": 32,
    "top_k": 4,
    "n_embd": 512,
    "n_ff_exp": 256,
    "n_head": 8,
    "n_head_kv": 4,
    "head_dim": 64,
    "vocab": 4096,
    "type": "q8_0",
}


def _paired(
    a_model: Path, b_model: Path, args: argparse.Namespace, a_kw: dict, b_kw: dict
) -> tuple[float, float, float, float, float, float]:
    """Median steady-state tok/s of runs `a` and `b` alternated, the median of their paired
    ratios (b / a), of their per-token differences (us), of their CPU-time ratios (a / b:
    process CPU per token, less sensitive than wall time to a loaded machine) and of their
    per-token CPU-time differences (us)."""
    a, b, ratios, deltas, cpu, cpu_deltas = [], [], [], [], [], []
    for _ in range(args.repeats):
        ra, rb = _run(a_model, args, **a_kw), _run(b_model, args, **b_kw)
        a.append(_tok_s(ra, True))
        b.append(_tok_s(rb, True))
        ratios.append(b[-1] / a[-1])
        deltas.append((1 / b[-1] - 1 / a[-1]) * 1e6)
        cpu.append(_cpu_ms(ra, True) / _cpu_ms(rb, True))
        cpu_deltas.append((_cpu_ms(rb, True) - _cpu_ms(ra, True)) * 1e3)
    med = statistics.median
    return med(a), med(b), med(ratios), med(deltas), med(cpu), med(cpu_deltas)


def families(tmp: Path, args: argparse.Namespace) -> None:
    from bmoe.engine.synth import ARCHS

    print(
        f"families ({args.tokens} tokens, {args.threads} thread(s), median of {args.repeats},"
        f" {FAMILY_SHAPE['layers']} layers x {FAMILY_SHAPE['experts']} experts top-"
        f"{FAMILY_SHAPE['top_k']}, {FAMILY_SHAPE['type']}):"
    )
    for arch in ARCHS:
        shape = dict(FAMILY_SHAPE)
        if arch == "deepseek2":  # its attention has no grouped kv heads
            shape.pop("n_head_kv")
        model = synth_model(tmp / f"{arch}.gguf", "small", arch=arch, **shape)
        everything = read_layout(model).total_expert_bytes / MIB + 1
        plain, streamed, ratio, delta, cpu, _cpu_delta = _paired(
            model, model, args, {}, {"moe_stream": True, "cache_mb": everything}
        )
        flag = "ok" if cpu >= 0.9 else "BELOW TARGET"
        print(
            f"  {arch:10s} plain {plain:8.2f} tok/s  streamed {streamed:8.2f} tok/s  "
            f"wall ratio {ratio:.3f} ({delta:+.0f} us/token)  CPU-time ratio {cpu:.3f} "
            f"(target >= 0.9: {flag})"
        )
        model.unlink()
    print(f"  (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")


def features(tmp: Path, args: argparse.Namespace) -> None:
    model = synth_model(tmp / "features.gguf", "small", **FAMILY_SHAPE)
    split = synth_model(tmp / "split.gguf", "small", split_max_tensors=16, **FAMILY_SHAPE)
    layout = read_layout(model)
    everything = layout.total_expert_bytes / MIB + 1
    base = {"moe_stream": True, "cache_mb": everything}
    print(
        f"features ({args.tokens} tokens, the families section's qwen3moe shape, cache holds "
        f"everything, steady state, median of {args.repeats}; cost against streaming without "
        "the feature in the same run):"
    )
    cases = [
        ("split model (shards)", split, {}),
        ("--drop-cold-experts 1.0", model, {"drop_cold_frac": 1.0}),
        ("--predict-log", model, {"predict_log": True}),
        ("--predict-prefetch", model, {"predict_prefetch": True}),
        ("--route-trace", model, {"route_trace": str(tmp / "bench.route.csv")}),
    ]
    for label, target, extra in cases:
        a, b, ratio, delta, cpu, cpu_delta = _paired(model, target, args, base, {**base, **extra})
        print(
            f"  {label:26s} CPU {cpu_delta:+6.0f} us/token (ratio {cpu:.3f})  |  wall "
            f"{a:7.2f} -> {b:7.2f} tok/s, ratio {ratio:.3f}, {delta:+6.0f} us/token"
        )
    print(f"  (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
    for p in [model, *tmp.glob("split-*.gguf")]:
        p.unlink()


#: Environment keys a pair run sets itself (cleared from the caller's first).
_OMP_KEYS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "BMOE_OMP_WAIT", "BMOE_HUGE_PAGES")
NATIVE = "native bmoe-cli"
EMBEDDED = "embedded"
#: The engine runs of a condition that holds every expert or evicts: (name, program, env);
#: program "plain" is bmoe run without --moe-stream (llama-cpp-python on mmap, no streaming).
_VARIANTS = (
    ("plain llama-cpp-python", "plain", {"GOMP_SPINCOUNT": "3000"}),
    (EMBEDDED, "embedded", {}),
    ("plain, libgomp's spin-wait", "plain", {}),
    ("embedded, libgomp's spin-wait", "embedded", {"BMOE_OMP_WAIT": "default"}),
    ("embedded, passive wait", "embedded", {"BMOE_OMP_WAIT": "passive"}),
)
#: GNU time, to measure an engine process from a launcher of its own (see _pair_run).
TIME = os.path.exists("/usr/bin/time")
#: The session's turns: the prompt, then two that continue it.
SESSION_TURNS = (PROMPT, " And what does the cache do?", " Summarise it in a sentence.")


def _tok_s_of(csv: Path) -> float:
    """Decode tok/s of a run's metrics CSV: its tokens over their decode walls (every turn)."""
    from bmoe.formats.metrics import read_metrics

    rows = read_metrics(csv).rows
    return len(rows) / (rows["wall_ms"].sum() / 1e3)


def _pair_run(argv: list[str], env: dict, csv: Path, turns: int) -> dict:
    """One engine process on `argv` (plus its CSV); with `turns`, a ``--session`` served
    that many requests. Decode tok/s from the CSV; user and system CPU seconds and the peak
    RSS (MiB) of the whole process, from wait4."""
    from bmoe.engine.session import SessionClient

    argv = [*argv, "--csv", str(csv)] + (["--session"] if turns else [])
    clean = {k: v for k, v in os.environ.items() if k not in _OMP_KEYS}
    # Started by GNU time, whose own small process forks the engine: a child of this Python
    # process would inherit its peak RSS (the kernel keeps the pre-exec high-water mark).
    times = csv.with_suffix(".time")
    launcher = ["/usr/bin/time", "-f", "%M %U %S", "-o", str(times)] if TIME else []
    log = csv.with_suffix(".err")
    with open(log, "wb") as err:  # a file: the native engine's log would fill a pipe
        proc = subprocess.Popen(
            [*launcher, *argv],
            stdin=subprocess.PIPE if turns else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
            env={**clean, **env},
        )
        assert proc.stdout is not None
        if turns:
            assert proc.stdin is not None
            client = SessionClient(proc.stdin, proc.stdout)
            for prompt in SESSION_TURNS[:turns]:
                client.generate(prompt, clear_kv=False, timeout=600)
            client.close()
        proc.stdout.read()
        _pid, status, usage = os.wait4(proc.pid, 0)
    text = log.read_text(errors="replace")
    log.unlink()
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"{argv[0]} failed: {text[-600:]}")
    if TIME:
        rss_kib, user, system = times.read_text().split()[-3:]
        times.unlink()
        figures = {"user": float(user), "sys": float(system), "rss": int(rss_kib) / 1024}
    else:  # the peak includes this process's, inherited across the fork
        figures = {"user": usage.ru_utime, "sys": usage.ru_stime, "rss": usage.ru_maxrss / 1024}
    return {"tok_s": _tok_s_of(csv), **figures}


class _Spinners:
    """`n` processes that only spin, for as long as the block runs (a fixed background load)."""

    def __init__(self, n: int):
        self.n = n
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> _Spinners:
        code = "while True: pass"
        self.procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(self.n)]
        time.sleep(0.5)
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()


def _spread(values: list[float], digits: int = 3) -> str:
    if not values:
        return "-"
    med = statistics.median(values)
    return f"{med:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def _find_native(args: argparse.Namespace) -> tuple[Path | None, str]:
    """``--native PATH``, else the build the tests find (``$BMOE_NATIVE_CLI``, else what
    ``../shared/native/build.sh`` reports)."""
    if args.native is not None:
        return args.native, "--native"
    from tests.native_build import find_native

    return find_native()


_REPORTING_ORDER = Path("/sys/module/page_reporting/parameters/page_reporting_order")
_MAX_PAGE_ORDER = 10  # the buddy allocator's largest order on x86-64 and arm64 (4 KiB pages)


def _free_page_reporting() -> str | None:
    """Why first touches of memory may cost a host fault here, or None.

    A virtual machine whose balloon device reports free memory to its host (the virtio
    ``REPORTING`` feature, bit 5) has the host discard every free block of
    ``page_reporting_order`` or larger; the next process to be handed such a page pays a fault
    in the host at its first write (about 10 us a 4 KiB page on the machine these records were
    taken on, against about 0.2 for memory already backed). Which run of a pair gets those pages
    depends on what the previous one freed and when, so the ratios carry it."""
    try:
        order = int(_REPORTING_ORDER.read_text())
    except (OSError, ValueError):
        return None
    if order > _MAX_PAGE_ORDER:
        return None
    for dev in Path("/sys/bus/virtio/drivers/virtio_balloon").glob("virtio*"):
        features = (dev / "features").read_text().strip() if (dev / "features").exists() else ""
        if len(features) > 5 and features[5] == "1":
            return (
                f"free page reporting is on ({dev.name}, blocks of order {order} and up): "
                "memory the host took back costs a host fault at its next first touch; as root, "
                f"`echo 11 > {_REPORTING_ORDER}` turns it off until reboot"
            )
    return None


def _first_touch_us(mib: int = 256) -> float:
    """Microseconds a 4 KiB page at the first write into `mib` MiB of fresh anonymous memory."""
    t0 = time.perf_counter()
    block = np.empty(mib * MIB, dtype=np.uint8)
    block[::4096] = 1
    elapsed = time.perf_counter() - t0
    del block
    return elapsed * 1e6 / (mib * MIB // 4096)


def pair(model: Path, tmp: Path, args: argparse.Namespace) -> None:
    layout = read_layout(model)
    total = layout.total_expert_bytes / MIB
    holds, evicts = total + 1, round(total * 0.3)
    native, how = _find_native(args)
    conditions = (  # (name, budget MiB, extra flags, session turns, every variant)
        ("holds every expert", holds, [], 0, True),
        ("evicts", evicts, [], 0, True),
        ("evicts, --prefetch 1", evicts, ["--prefetch", "1"], 0, False),
        ("evicts, --drop-cold-experts 1.0", evicts, ["--drop-cold-experts", "1.0"], 0, False),
        ("evicts, a session of 3 turns", evicts, [], 3, False),
    )
    wanted = [w.strip() for w in args.only.split(",") if w.strip()]
    if wanted:
        conditions = tuple(c for c in conditions if any(w in c[0] for w in wanted))
        if not conditions:
            raise SystemExit(f"--only {args.only!r} names none of the pair conditions")
    print(
        f"pair ({args.tokens} tokens a run or turn, {args.threads} threads, --no-odirect, "
        f"{args.repeats} rounds, the order alternating each round, each run a fresh process; "
        f"experts {total:.0f} MiB; {os.cpu_count()} CPUs; a plain run waits as the engine's "
        "streamed runs do, a short spin, unless it says otherwise):"
    )
    reporting = _free_page_reporting()
    if reporting is not None:
        print(f"  note: {reporting}")
    print(f"  first write into fresh memory: {_first_touch_us():.2f} us a 4 KiB page")
    if native is None:
        print(f"  {NATIVE}: skipped ({how}); pairing with plain llama-cpp-python only")
    else:
        print(f"  {NATIVE}: {native} (found by {how})")
    python = [sys.executable, "-m", "bmoe", "run"]
    summary = []
    loads_to_run = [
        (load_name, spinners)
        for key, load_name, spinners in (
            ("quiet", "quiet", 0),
            ("processes", f"{args.spinners} busy processes", args.spinners),
        )
        if args.loads in ("both", key)
    ]
    for load_name, spinners in loads_to_run:
        for name, mb, extra, turns, every in conditions:
            variants = list(_VARIANTS) if every else [(EMBEDDED, "embedded", {})]
            if every and mb > total:  # the huge pages a budget that holds everything may ask for
                variants.append(("embedded, huge pages", "embedded", {"BMOE_HUGE_PAGES": "1"}))
            if native is not None:
                variants.append((NATIVE, "native", {}))
            common = ["-m", str(model), "-n", str(args.tokens), "-t", str(args.threads)]
            streamed = ["--moe-stream", "--no-odirect", "--cache-mb", str(int(mb)),
                        "--force-cache", *extra]  # fmt: skip
            prompt = [] if turns else ["-p", PROMPT]
            runs: dict[str, list[dict]] = {v: [] for v, _p, _e in variants}
            loads = []
            with _Spinners(spinners):
                for i in range(args.repeats):
                    order = variants if i % 2 == 0 else variants[::-1]
                    for variant, program, env in order:
                        if program == "plain":
                            argv = [*python, *common, *prompt]
                        elif program == "embedded":
                            argv = [*python, *common, *prompt, *streamed]
                        else:
                            assert native is not None
                            argv = [str(native), *common, *prompt, *streamed]
                        csv = tmp / f"pair-{len(loads)}.csv"
                        runs[variant].append(_pair_run(argv, env, csv, turns))
                        csv.unlink()
                    loads.append(os.getloadavg()[0])
            print(f"  {load_name}, {name} ({mb:.0f} MiB), load average "
                  f"{min(loads):.1f}-{max(loads):.1f}:")  # fmt: skip
            for variant, r in runs.items():
                print(
                    f"    {variant:30s} tok/s {_spread([x['tok_s'] for x in r], 2)}  user "
                    f"{_spread([x['user'] for x in r], 2)} s  system "
                    f"{_spread([x['sys'] for x in r], 2)} s  peak RSS "
                    f"{_spread([x['rss'] for x in r], 0)} MiB"
                )

            def ratio(a: str, b: str, key: str = "tok_s", runs=runs) -> list[float]:
                return [x[key] / y[key] for x, y in zip(runs[a], runs[b], strict=True)]

            if every:
                print(f"    embedded / plain, paired: "
                      f"{_spread(ratio(EMBEDDED, 'plain llama-cpp-python'))}")  # fmt: skip
                spun = ratio("embedded, libgomp's spin-wait", "plain, libgomp's spin-wait")
                print(f"    both with libgomp's spin-wait, paired: {_spread(spun)}")
            if native is not None:
                tok, rss = ratio(EMBEDDED, NATIVE), ratio(EMBEDDED, NATIVE, "rss")
                print(f"    embedded / native, paired: tok/s {_spread(tok)} (target >= 1.0"
                      f"{', >= 0.95 busy' if spinners else ''}); peak RSS {_spread(rss)} "
                      "(target within 10 %)")  # fmt: skip
                summary.append((load_name, name, mb, runs[EMBEDDED], runs[NATIVE], tok, rss,
                                (min(loads), max(loads))))  # fmt: skip
    if summary:
        _print_pair_table(summary)


def _print_pair_table(summary: list) -> None:
    """The embedded engine against the native one, one line a condition, as markdown."""
    med = statistics.median
    print(
        "\n  | condition | load | embedded tok/s | native tok/s | embedded / native "
        "(min-max) | user s emb / nat | system s emb / nat | peak RSS MiB emb / nat |"
    )
    print("  | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for load_name, name, mb, emb, nat, tok, _rss, (lo, hi) in summary:

        def m(runs: list[dict], key: str, digits: int) -> str:
            return f"{med(x[key] for x in runs):.{digits}f}"

        print(
            f"  | {name} ({mb:.0f} MiB), {load_name} | {lo:.1f}-{hi:.1f} | {m(emb, 'tok_s', 1)} | "
            f"{m(nat, 'tok_s', 1)} | {med(tok):.3f} ({min(tok):.2f}-{max(tok):.2f}) | "
            f"{m(emb, 'user', 2)} / {m(nat, 'user', 2)} | {m(emb, 'sys', 2)} / "
            f"{m(nat, 'sys', 2)} | {m(emb, 'rss', 0)} / {m(nat, 'rss', 0)} |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--section",
        default="all",
        choices=["speed", "memory", "budgets", "families", "features", "pair", "all"],
    )
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model", type=Path, help="an existing GGUF (default: make the small preset)")
    ap.add_argument("--keep", action="store_true", help="keep the generated model")
    ap.add_argument(
        "--native",
        type=Path,
        help="the native bmoe-cli to pair with (pair section; default: $BMOE_NATIVE_CLI, else "
        "the binary ../shared/native/build.sh reports)",
    )
    ap.add_argument("--spinners", type=int, default=2, help="background load of the pair section")
    ap.add_argument(
        "--only",
        default="",
        help="pair section: only the conditions whose names contain one of these "
        "comma-separated words (e.g. 'prefetch,holds')",
    )
    ap.add_argument(
        "--loads",
        choices=["both", "quiet", "processes"],
        default="both",
        help="pair section: the quiet machine, the one with --spinners busy processes, or both",
    )
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bmoe-bench-engine-"))
    model = args.model
    try:
        if args.section in ("families", "all"):
            families(tmp, args)
        if args.section in ("features", "all"):
            features(tmp, args)
        if args.section in ("families", "features"):
            return
        if model is None:
            t = time.perf_counter()
            model = synth_model(tmp / "small.gguf", "small")
            print(
                f"made {model} ({model.stat().st_size / MIB:.0f} MiB) in "
                f"{time.perf_counter() - t:.1f} s"
            )
        for name, fn in (("speed", speed), ("memory", memory), ("budgets", budgets)):
            if args.section in (name, "all"):
                fn(model, args)
        if args.section in ("pair", "all"):
            pair(model, tmp, args)
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            for p in tmp.glob("*"):
                p.unlink()
            os.rmdir(tmp)


if __name__ == "__main__":
    main()
