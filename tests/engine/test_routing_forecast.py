"""``--predict-log`` and ``--predict-prefetch`` on synthetic models.

The fresh-gate control recomputes each router from its own input with the file's weights: it
must agree with llama.cpp's routing on every slot wherever the model selects by raw logits,
which is what makes the stale-gate figure (the next router on this layer's input)
trustworthy. The routings scored are the native engine's (worked out by hand on a built
routing, and on the 16-layer shape the native figures were quoted for). Neither option may
change what is computed.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python (the engine extra) is not installed")

from bmoe.engine.embedded.config import EngineConfig, parse_args
from bmoe.engine.embedded.run import RunResult, run_engine
from bmoe.engine.synth import synth_model
from bmoe.errors import BmoeError
from bmoe.formats import protocol
from bmoe.formats.metrics import read_metrics
from bmoe.formats.route import read_route_trace

pytestmark = pytest.mark.engine

N = 24
PROMPT = "Explain how a mixture-of-experts model decides which experts handle each token."


def _run(model: Path, out: io.BytesIO | None = None, **kw) -> RunResult:
    cfg = EngineConfig(model=str(model), prompt=PROMPT, n_predict=N, threads=1, **kw)
    return run_engine(cfg, keep_logits=True, out=out)


def _identical(a: RunResult, b: RunResult) -> bool:
    return a.tokens == b.tokens and all(
        np.array_equal(x, y) for x, y in zip(a.logits, b.logits, strict=True)
    )


def _expected_counts(moe: list[int], n: int) -> dict[str, int]:
    """The native engine's counts over `n` decodes of a model whose MoE layers are `moe`: a
    layer's stale gate is the router of the layer before it (none after a dense layer or
    before the first), known only once a decode has reached it (not in the first)."""
    ahead = [il for il in moe if il - 1 in moe]
    return {
        "stale": (n - 1) * len(ahead),
        "unranked": n * (len(moe) - len(ahead)) + len(ahead),
        "stale2": (n - 1) * sum(il - 2 in moe for il in moe),
    }


@pytest.mark.parametrize(
    "arch", ["qwen3moe", "qwen2moe", "llama", "deepseek2", "gpt-oss", "gemma4"]
)
def test_predict_log_scores_the_predictors_and_changes_nothing(arch, tmp_path) -> None:
    model = synth_model(tmp_path / "m.gguf", "tiny", arch=arch)
    plain = _run(model)
    out = io.BytesIO()
    csv = tmp_path / "run.csv"
    run = _run(model, out, moe_stream=True, cache_mb=1, predict_log=True, csv=str(csv))
    assert _identical(run, plain)
    lines = [ln for ln in protocol.to_text(out.getvalue()).splitlines()]
    first = next(ln for ln in lines if ln.startswith("moe-predict: stale-gate"))
    warned = any("the control is below 100%" in ln for ln in lines)
    if arch == "gpt-oss":  # its router adds a bias the raw-logit ranking does not see
        assert "fresh-gate control 100.0%" not in first and warned
    else:  # the arithmetic is the router's
        assert "fresh-gate control 100.0% (100.0%)" in first and not warned
    moe = read_route_trace_layers(model)
    want = _expected_counts(moe, N)
    scored = next(ln for ln in lines if ln.startswith("moe-predict: scored"))
    k = run.params["n_expert_used"]
    assert scored == (
        f"moe-predict: scored — stale-gate {want['stale']} routings/{want['stale'] * k} slots, "
        f"prev-token {N * len(moe)}/{N * len(moe) * k}, control {N * len(moe)}/"
        f"{N * len(moe) * k}; {want['unranked']} routings the stale-gate could not rank"
    )
    assert any(ln.startswith("moe-predict: stale-2 (two layers early)") for ln in lines) == (
        want["stale2"] > 0
    )
    table = lines[lines.index("  layer   stale    prev   ctrl   routings") + 1 :]
    rows = [ln.split() for ln in table if ln.strip()]
    assert [int(r[0]) for r in rows] == moe  # one row per MoE layer, dense ones left out
    for r in rows:
        layer, stale, routings = int(r[0]), r[1], int(r[4])
        assert routings == (N - 1 if layer - 1 in moe else 0)
        assert (stale == "-") == (routings == 0)
    assert read_metrics(csv).params["predict_log"] in (1, True)


def read_route_trace_layers(model: Path) -> list[int]:
    from bmoe.engine.embedded.layout import read_layout

    return list(read_layout(model).moe_layers)


def test_the_counts_are_the_native_engines_on_its_16_layer_shape(tmp_path) -> None:
    """The shape the native figures were quoted for (16 MoE layers, top-8, 16 decodes):
    stale-gate 225 routings / 1800 slots, prev-token 256 / 2048, 31 not ranked."""
    model = synth_model(tmp_path / "m.gguf", "tiny", layers=16, experts=16, top_k=8)
    out = io.BytesIO()
    cfg = EngineConfig(
        model=str(model), n_predict=16, threads=1, moe_stream=True, cache_mb=64,
        predict_log=True,
    )  # fmt: skip
    run_engine(cfg, out=out)
    text = protocol.to_text(out.getvalue())
    assert (
        "moe-predict: scored — stale-gate 225 routings/1800 slots, prev-token 256/2048, "
        "control 256/2048; 31 routings the stale-gate could not rank"
    ) in text.splitlines()


def test_predict_prefetch_reads_the_stale_pick_ahead_and_stays_exact(tiny_model, tmp_path):
    plain = _run(tiny_model)
    route = tmp_path / "route.csv"
    base = _run(tiny_model, moe_stream=True, cache_mb=3)
    run = _run(
        tiny_model, moe_stream=True, cache_mb=3, predict_prefetch=True, route_trace=str(route)
    )
    assert _identical(run, plain)
    stats = run.cache_stats
    assert stats["prefetched"] > 0 and stats["prefetch_hits"] > 0
    assert run.summary["spec_useful"] > 0
    assert run.figures["prefetch_source"] == "stale-gate"
    rows = read_route_trace(route).rows
    assert (rows["residency"] == 2).sum() == stats["prefetch_hits"]
    # the bet is good on this model: fewer demand misses than without it
    assert stats["misses"] < base.cache_stats["misses"]


def test_predict_flags_parse_and_the_others_say_why_they_are_refused() -> None:
    cfg, _ = parse_args(
        ["-m", "x.gguf", "--moe-stream", "--predict-log", "--predict-prefetch",
         "--predict-spec-max", "3"]
    )  # fmt: skip
    assert (cfg.predict_log, cfg.predict_prefetch, cfg.predict_spec_max) == (True, True, 3)
    with pytest.raises(BmoeError, match="needs --moe-stream"):
        parse_args(["-m", "x.gguf", "--predict-log"])
    with pytest.raises(BmoeError, match="eval callback"):
        parse_args(["-m", "x.gguf", "--moe-stream", "--overlap"])
    cfg, _ = parse_args(["-m", "x.gguf", "--moe-stream", "--route-ahead", "2"])
    assert cfg.route_ahead == 2
    with pytest.raises(BmoeError, match="--route-ahead needs --moe-stream"):
        parse_args(["-m", "x.gguf", "--route-ahead", "1"])


def test_route_ahead_commits_early_and_the_matmul_uses_the_commitment(tiny_model, tmp_path):
    plain = _run(tiny_model)
    out = io.BytesIO()
    route, csv = tmp_path / "ra.route.csv", tmp_path / "ra.csv"
    ra = _run(
        tiny_model, out, moe_stream=True, cache_mb=0, route_ahead=1, predict_log=True,
        route_trace=str(route), csv=str(csv),
    )  # fmt: skip
    n_moe = 4
    summary = read_metrics(csv).summary
    assert summary["ra_committed"] == N * (n_moe - 1) and summary["ra_passthrough"] == N
    assert 0 < summary["ra_agree_pct"] <= 100
    text = protocol.to_text(out.getvalue())
    assert f"moe-route-ahead: 1 layers early — {N * (n_moe - 1)} routings committed" in text
    # with N = 1 the commitment is the stale gate's pick, so the routing the layers used is it
    stale = next(ln for ln in text.splitlines() if ln.startswith("moe-predict: stale-gate"))
    assert stale.startswith("moe-predict: stale-gate 100.0% of routed slots (100.0% whole")
    assert not _identical(ra, plain)  # a different model, by design
    # only the committed experts were read (no cache): if llama.cpp had used other ids than
    # the ones written over the router's, a run reading every expert of every layer
    # (--load-all) would decode otherwise
    everything = _run(tiny_model, moe_stream=True, load_all=True, route_ahead=1)
    assert _identical(ra, everything)
    rows = read_route_trace(route).rows
    decode = rows[rows["phase"] == 1]
    assert decode.groupby(["step", "layer"])["expert"].nunique().eq(2).all()


def _predict_lines(text: str) -> list[str]:
    lines = text.splitlines()
    head = [i for i, ln in enumerate(lines) if ln.startswith("moe-predict: stale-gate")]
    assert len(head) == 1, text
    i = head[0]
    block = [ln for ln in lines[i:] if ln.startswith("moe-predict:")]
    block += [ln for ln in lines[i:] if ln.startswith("  ") and ln.split()[0].isdigit()]
    return block


def test_a_session_turn_ends_with_the_predict_lines_of_the_session_so_far(tiny_model) -> None:
    from bmoe.engine.embedded.serve import serve_session

    one_shot = io.BytesIO()
    settings = {"moe_stream": True, "cache_mb": 1, "predict_log": True}
    _run(tiny_model, one_shot, **settings)
    requests = [
        protocol.encode_request("generate", id=1, prompt=PROMPT, n_predict=N),
        protocol.encode_request("generate", id=2, prompt=" And?", n_predict=5, clear_kv=False),
    ]
    stdin = io.BytesIO(("\n".join(requests) + "\n").encode())
    out = io.BytesIO()
    cfg = EngineConfig(model=str(tiny_model), n_predict=N, threads=1, **settings)
    serve_session(cfg, stdin=stdin, out=out)
    text = protocol.to_text(out.getvalue())
    turns = [t.split("BMOE_DONE")[0] for t in text.split("BMOE_BEGIN")[1:]]
    assert len(turns) == 2
    # the first turn is the one-shot run: the same tokens scored the same way
    assert _predict_lines(turns[0]) == _predict_lines(protocol.to_text(one_shot.getvalue()))
    # the second adds its 5 decodes to the first turn's 24 (session totals, as native): the
    # routers are known by then, so only the first MoE layer goes unranked in them
    second = _predict_lines(turns[1])
    moe, decodes = 4, N + 5
    assert second[2] == (
        f"moe-predict: scored — stale-gate {(decodes - 1) * (moe - 1)} routings/"
        f"{(decodes - 1) * (moe - 1) * 2} slots, prev-token {decodes * moe}/{decodes * moe * 2}, "
        f"control {decodes * moe}/{decodes * moe * 2}; {decodes + moe - 1} routings the "
        "stale-gate could not rank"
    )
    assert [int(row.split()[4]) for row in second[3:]] == [0, *[decodes - 1] * (moe - 1)]


def test_a_session_without_predict_log_prints_no_predict_lines(tiny_model) -> None:
    from bmoe.engine.embedded.serve import serve_session

    stdin = io.BytesIO((protocol.encode_request("generate", id=1, prompt=PROMPT) + "\n").encode())
    out = io.BytesIO()
    cfg = EngineConfig(model=str(tiny_model), n_predict=4, threads=1, moe_stream=True, cache_mb=1)
    serve_session(cfg, stdin=stdin, out=out)
    text = protocol.to_text(out.getvalue())
    assert "BMOE_DONE" in text and "moe-predict:" not in text


def test_scoring_counts_shared_ids_as_intersect1d_does() -> None:
    from bmoe.engine.embedded.routing_forecast import _common

    rng = np.random.default_rng(3)
    for _ in range(300):
        a = rng.integers(0, 12, int(rng.integers(0, 9))).astype(np.int32)
        b = rng.integers(0, 12, int(rng.integers(0, 9)))
        assert _common(a, b) == len(np.intersect1d(a, b))
