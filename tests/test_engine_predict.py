"""``--predict-log`` and ``--predict-prefetch`` on synthetic models.

The fresh-gate control recomputes each router from its own input with the file's weights: it
must agree with llama.cpp's routing on every slot, in every family, which is what makes the
stale-gate figure (the next router on this layer's input) trustworthy. Neither option may
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


@pytest.mark.parametrize(
    "arch", ["qwen3moe", "qwen2moe", "llama", "deepseek2", "gpt-oss", "gemma4"]
)
def test_predict_log_scores_three_predictors_and_changes_nothing(arch, tmp_path) -> None:
    model = synth_model(tmp_path / "m.gguf", "tiny", arch=arch)
    plain = _run(model)
    out = io.BytesIO()
    csv = tmp_path / "run.csv"
    run = _run(model, out, moe_stream=True, cache_mb=1, predict_log=True, csv=str(csv))
    assert _identical(run, plain)
    lines = [ln for ln in protocol.to_text(out.getvalue()).splitlines()]
    first = next(ln for ln in lines if ln.startswith("moe-predict: stale-gate"))
    assert "fresh-gate control 100.0% (100.0%)" in first  # the arithmetic is the router's
    table = lines[lines.index("  layer   stale    prev   ctrl   routings") + 1 :]
    rows = [ln.split() for ln in table if ln.strip()]
    n_layer = run.params["n_layer"]
    moe = {"deepseek2": n_layer - 1, "gemma4": (n_layer + 1) // 2}.get(arch, n_layer)
    assert len(rows) == moe
    assert rows[0][1] == "-"  # the first MoE layer has no layer before it to predict from
    assert all(r[3] == "100.0" and int(r[4]) == N for r in rows)
    stale = [float(r[1]) for r in rows[1:]]
    assert all(0 < s <= 100 for s in stale)
    scored = next(ln for ln in lines if ln.startswith("moe-predict: scored"))
    assert f"; {N} routings the stale-gate could not rank" in scored
    assert read_metrics(csv).params["predict_log"] in (1, True)


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
    block = lines[i : i + 3]
    block += [ln for ln in lines[i + 3 :] if ln.startswith("  ") and ln.split()[0].isdigit()]
    return block


def test_a_session_turn_ends_with_the_predict_lines_of_its_own_tokens(tiny_model) -> None:
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
    # the second is scored on its own 5 tokens, not added to the first turn's
    second = _predict_lines(turns[1])
    assert "; 5 routings the stale-gate could not rank" in second[1]
    assert all(int(row.split()[4]) == 5 for row in second[3:])


def test_a_session_without_predict_log_prints_no_predict_lines(tiny_model) -> None:
    from bmoe.engine.embedded.serve import serve_session

    stdin = io.BytesIO((protocol.encode_request("generate", id=1, prompt=PROMPT) + "\n").encode())
    out = io.BytesIO()
    cfg = EngineConfig(model=str(tiny_model), n_predict=4, threads=1, moe_stream=True, cache_mb=1)
    serve_session(cfg, stdin=stdin, out=out)
    text = protocol.to_text(out.getvalue())
    assert "BMOE_DONE" in text and "moe-predict:" not in text


def test_scoring_counts_shared_ids_as_intersect1d_does() -> None:
    from bmoe.engine.embedded.predict import _common

    rng = np.random.default_rng(3)
    for _ in range(300):
        a = rng.integers(0, 12, int(rng.integers(0, 9))).astype(np.int32)
        b = rng.integers(0, 12, int(rng.integers(0, 9)))
        assert _common(a, b) == len(np.intersect1d(a, b))
