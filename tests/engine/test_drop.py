"""Live cache-aware dropping (``--drop-cold-experts F``) on a tiny synthetic model.

A routing is dropped when its expert is not resident, its weight is under ``F / k`` and it
is not the token's top slot: the expert is never read, its weight is zeroed before the expert
matmul (the kept ones rescaled unless ``--drop-no-renorm``), and the files say so.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python (the engine extra) is not installed")

from bmoe.engine.embedded.config import EngineConfig, parse_args
from bmoe.engine.embedded.run import RunResult, run_engine
from bmoe.formats.metrics import read_metrics
from bmoe.formats.op_traces import read_io_trace
from bmoe.formats.route import read_route_trace
from bmoe.formats.validate import validate_file

pytestmark = pytest.mark.engine

N = 32
PROMPT = "Explain how a mixture-of-experts model decides which experts handle each token."


def _run(model: Path, tmp_path: Path | None = None, **kw) -> RunResult:
    files = {}
    if tmp_path is not None:
        files = {
            "csv": str(tmp_path / "run.csv"),
            "route_trace": str(tmp_path / "route.csv"),
            "io_trace": str(tmp_path / "io.csv"),
        }
    cfg = EngineConfig(model=str(model), prompt=PROMPT, n_predict=N, threads=1, **files, **kw)
    return run_engine(cfg, keep_logits=True)


@pytest.fixture(scope="module")
def baseline(tiny_model: Path) -> RunResult:
    return _run(tiny_model)


def _identical(a: RunResult, b: RunResult) -> bool:
    return a.tokens == b.tokens and all(
        np.array_equal(x, y) for x, y in zip(a.logits, b.logits, strict=True)
    )


def test_a_threshold_nothing_falls_under_leaves_decoding_exact(tiny_model, baseline) -> None:
    """The routing moved to the weights node, with nothing dropped, changes nothing."""
    run = _run(tiny_model, moe_stream=True, cache_mb=1, drop_cold_frac=1e-9, drop_prefill=True)
    assert run.summary["experts_dropped"] == 0
    assert run.summary["experts_routed"] == N * 4 * 2
    assert _identical(run, baseline)


def test_dropped_routings_follow_the_contract(tiny_model, baseline, tmp_path) -> None:
    run = _run(tiny_model, tmp_path, moe_stream=True, cache_mb=3, drop_cold_frac=1.0)
    trace = read_route_trace(tmp_path / "route.csv").rows
    decode = trace[trace["phase"] == 1]
    dropped = decode[decode["dropped"] == 1]
    assert len(dropped) > 0
    assert (trace[trace["phase"] == 0]["dropped"] == 0).all()  # not in prefill by default
    # a miss, under the threshold, not its cell's top slot, never read
    assert (dropped["residency"] == 0).all() and (dropped["expert_bytes"] == 0).all()
    assert (dropped["weight"] < 1.0 / 2).all()
    top = decode.loc[decode.groupby(["step", "layer"])["weight"].idxmax()]
    assert not top["dropped"].any()
    reads = read_io_trace(tmp_path / "io.csv").rows
    read_keys = set(zip(reads["step"], reads["layer"], reads["expert"], strict=True))
    for row in dropped.itertuples():
        assert (row.step, row.layer, row.expert) not in read_keys
    # the ledger: summary, end-of-run figures, preamble
    summary = read_metrics(tmp_path / "run.csv")
    assert summary.summary["experts_dropped"] == len(dropped) == run.figures["experts_dropped"]
    assert summary.summary["experts_routed"] == len(decode) == N * 4 * 2
    assert summary.params["drop_cold_frac"] == 1.0 and summary.params["drop_renorm"] in (1, True)
    assert run.figures["drop_pct"] == pytest.approx(100.0 * len(dropped) / len(decode))
    for path in ("run.csv", "route.csv", "io.csv"):
        assert not [f for f in validate_file(tmp_path / path) if f.severity == "error"]
    # dropping changes what is computed
    assert not _identical(run, baseline)


def test_renorm_prefill_and_the_no_renorm_switch(tiny_model, tmp_path) -> None:
    kw = {"moe_stream": True, "cache_mb": 3, "drop_cold_frac": 1.0}
    renorm = _run(tiny_model, **kw)
    plain = _run(tiny_model, **kw, drop_renorm=False)
    assert renorm.summary["experts_dropped"] > 0 and plain.summary["experts_dropped"] > 0
    assert np.array_equal(renorm.logits[0], plain.logits[0])  # the prefill drops nothing
    pairs = zip(renorm.logits, plain.logits, strict=True)
    assert any(not np.array_equal(a, b) for a, b in pairs)  # the kept weights differ
    pre = _run(tiny_model, tmp_path, **kw, drop_prefill=True)
    rows = read_route_trace(tmp_path / "route.csv").rows
    # the first decode that asks for the weights (here the prompt) is where each layer's weight
    # chain is learned, as in the native engine: even --drop-in-prefill drops nothing there
    assert rows[rows["phase"] == 0]["dropped"].sum() == 0 and rows["dropped"].sum() > 0
    assert pre.params["drop_prefill"] is True


def test_drop_flags_parse_and_refuse_what_cannot_run() -> None:
    cfg, _ = parse_args(
        ["-m", "x.gguf", "--moe-stream", "--drop-cold-experts", "0.75", "--drop-no-renorm",
         "--drop-in-prefill"]
    )  # fmt: skip
    assert (cfg.drop_cold_frac, cfg.drop_renorm, cfg.drop_prefill) == (0.75, False, True)
    from bmoe.errors import BmoeError

    with pytest.raises(BmoeError, match="--drop-cold-experts needs --moe-stream"):
        parse_args(["-m", "x.gguf", "--drop-cold-experts", "0.5"])
    with pytest.raises(BmoeError, match="not with --load-all"):
        parse_args(["-m", "x.gguf", "--moe-stream", "--load-all", "--drop-cold-experts", "1"])


def test_every_routing_of_an_undropped_trace_has_its_weight(tiny_model, tmp_path) -> None:
    """What ``bmoe analyze drop`` needs to predict dropping: the applied weight of every
    routing, decode steps included (they go through the remembered-graph fast path)."""
    _run(tiny_model, tmp_path, moe_stream=True, cache_mb=2)
    rows = read_route_trace(tmp_path / "route.csv").rows
    assert rows["weight"].notna().all()
    sums = rows.groupby(["phase", "step", "layer"])["weight"].sum()
    assert np.allclose(sums, 1.0, atol=1e-5)  # qwen3moe normalises its top-k weights


def test_one_tokens_drops_in_python_match_the_array_form() -> None:
    from bmoe.cache import ExpertCache
    from bmoe.engine.embedded.streamer import ExpertStreamer

    rng = np.random.default_rng(7)
    streamer = object.__new__(ExpertStreamer)  # only the cache and the threshold are used
    streamer.cache = ExpertCache(1 << 30, "lru", n_layer=4)
    streamer.cache.prefetch(2, list(range(0, 16, 3)), 1)  # some experts resident
    seen = set()
    for _ in range(500):
        k = int(rng.integers(1, 9))
        streamer.drop_frac = float(rng.choice([0.25, 0.5, 1.0, 2.0]))
        flat = rng.integers(0, 16, k).tolist()
        w = rng.dirichlet(np.ones(k)).astype(np.float32)
        if rng.random() < 0.3:  # ties, and values right at the threshold
            w[:] = np.float32(streamer.drop_frac) / np.float32(k)
            w[int(rng.integers(0, k))] = np.float32(0.5)
        fast, fast_top = streamer._drops(2, flat, k, w)
        slow, slow_top = streamer._drops_batch(2, flat, k, w.copy())
        assert fast.shape == slow.shape == (1, k)
        assert np.array_equal(fast, slow), (flat, w, streamer.drop_frac)
        assert fast_top == slow_top == [flat[int(np.argmax(w))]]
        seen.add(int(fast.sum()))
    assert len(seen) > 2  # cases with none, one and several dropped were tried


def test_drops_decided_in_the_c_filter_match_python(tiny_model, monkeypatch) -> None:
    """With the eval filter compiled, a drop whose kept experts must be read is decided and
    applied in C; the same run with every routing decided in Python computes the same tokens
    and logits and counts the same drops, hits, misses and reads."""
    from bmoe.engine.embedded import evalfilter

    if evalfilter.load() is None:
        pytest.skip("the eval filter did not compile")
    kw = {"moe_stream": True, "cache_mb": 3, "drop_cold_frac": 1.0}
    in_c = _run(tiny_model, **kw)
    monkeypatch.setattr(evalfilter, "load", lambda: None)
    in_python = _run(tiny_model, **kw)
    assert in_c.summary["experts_dropped"] > 0 and in_c.cache_stats is not None
    assert in_c.cache_stats["misses"] > 0  # routings that read, past the warm-up
    assert _identical(in_c, in_python)
    assert in_c.cache_stats == in_python.cache_stats
    for key in ("experts_dropped", "experts_routed"):
        assert in_c.summary[key] == in_python.summary[key]
