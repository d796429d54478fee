"""Every MoE family ``bmoe model synth --arch`` writes, in several weight types, streamed:
qwen3moe, qwen2moe (shared expert), a Mixtral-style llama, deepseek2 (leading dense layer,
shared experts, fused gate_up), gpt-oss (MXFP4 experts, expert biases) and gemma4 (fused
gate_up, dense layers mixed in).

For each: greedy tokens and logits streamed == plain llama.cpp (a cache that evicts, no cache,
prefetch), an LRU replay of the run's own route trace == its recorded hit rate, and every file
passes ``bmoe validate``. The quantized types with odd block sizes (q4_0: 18 bytes, q5_0: 22,
mxfp4: 17 per 32 weights) put expert slices at offsets no page boundary lines up with, which
the O_DIRECT windows must still serve.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python (the engine extra) is not installed")

from bmoe.analyze import replay
from bmoe.engine.embedded.config import EngineConfig
from bmoe.engine.embedded.layout import read_layout
from bmoe.engine.embedded.run import RunResult, run_engine
from bmoe.engine.synth import synth_model
from bmoe.formats.metrics import read_metrics
from bmoe.formats.route import read_route_trace
from bmoe.formats.validate import validate_file

pytestmark = pytest.mark.engine

N = 12
PROMPT = "Explain how a mixture-of-experts model decides which experts handle each token."
CASES = [
    ("qwen3moe", "q4_0", False),
    ("qwen3moe", "q5_0", False),
    ("qwen3moe", "mxfp4", False),
    ("qwen2moe", "f16", False),
    ("qwen2moe", "q5_0", False),
    ("qwen2moe", "mxfp4", False),
    ("llama", "f32", False),
    ("llama", "q8_0", False),
    ("llama", "q4_0", False),
    ("deepseek2", "f32", False),
    ("deepseek2", "q5_0", False),
    ("deepseek2", "mxfp4", True),
    ("gpt-oss", "mxfp4", False),
    ("gpt-oss", "q5_0", False),
    ("gemma4", "f16", True),
    ("gemma4", "q4_0", True),
    ("qwen3moe", "q8_0,q4_0,q5_0", False),  # a type per layer, as a K-quant mixes them
]


@pytest.fixture(
    scope="module",
    params=CASES,
    ids=[f"{a}-{t}" + ("-fused" if f else "") for a, t, f in CASES],
)
def family(request, tmp_path_factory) -> tuple[Path, RunResult, str, bool]:
    arch, kind, fused = request.param
    folder = tmp_path_factory.mktemp(f"{arch}-{kind}")
    extra: dict = {"fused_gate_up": True} if fused and arch != "gemma4" else {}
    if "," in kind:
        extra["layer_types"] = tuple(kind.split(","))
    model = synth_model(folder / "m.gguf", "tiny", arch=arch, type=kind.split(",")[0], **extra)
    return model, _run(model), arch, fused


def _run(model: Path, **kw) -> RunResult:
    cfg = EngineConfig(model=str(model), prompt=PROMPT, n_predict=N, threads=1, **kw)
    return run_engine(cfg, keep_logits=True)


def test_the_file_is_the_family_asked_for(family) -> None:
    model, _plain, arch, fused = family
    layout = read_layout(model)
    assert layout.arch == arch and layout.n_expert == 8
    if arch == "deepseek2":  # its leading dense layer routes nothing
        assert layout.moe_layers == list(range(1, layout.n_layer))
    elif arch == "gemma4":  # dense layers mixed in
        assert layout.moe_layers == list(range(0, layout.n_layer, 2))
    else:
        assert layout.moe_layers == list(range(layout.n_layer))
    names = {n.rsplit(".", 2)[-2] for n in layout.tensors}
    if fused:
        assert names == {"ffn_gate_up_exps", "ffn_down_exps"}
    else:
        assert names == {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"}


@pytest.mark.parametrize(
    "settings",
    [{"cache_mb": 1}, {"cache_mb": 0}, {"cache_mb": 1, "prefetch": 1}, {"cache_mb": 100}],
    ids=["evicting", "no-cache", "prefetch", "holds-all"],
)
def test_streamed_equals_resident(family, settings) -> None:
    model, plain, _arch, _fused = family
    streamed = _run(model, moe_stream=True, **settings)
    assert streamed.tokens == plain.tokens
    assert all(np.array_equal(a, b) for a, b in zip(streamed.logits, plain.logits, strict=True))
    assert streamed.cache_stats is not None and streamed.cache_stats["misses"] > 0


def test_replay_of_its_own_trace_and_valid_files(family, tmp_path) -> None:
    model, _plain, _arch, _fused = family
    paths = {k: tmp_path / f"r.{k}.csv" for k in ("csv", "route_trace", "io_trace")}
    out = io.BytesIO()
    cfg = EngineConfig(
        model=str(model),
        prompt=PROMPT,
        n_predict=N,
        threads=1,
        moe_stream=True,
        cache_mb=1.5,
        progress=True,
        **{k: str(p) for k, p in paths.items()},
    )
    run = run_engine(cfg, out=out)
    batches = replay.prepare_batches(read_route_trace(paths["route_trace"]))
    table = replay.validate(batches, 1.5, read_metrics(paths["csv"]).summary)
    table = table.set_index("source")
    exact = 100 * run.cache_stats["hits"] / run.cache_stats["lookups"]
    assert table.loc["lru replay @ 1.5 MiB", "hit_pct_cum"] == pytest.approx(exact, abs=1e-9)
    stream = tmp_path / "r.out"
    stream.write_bytes(out.getvalue())
    for path in [*paths.values(), stream]:
        findings = [f for f in validate_file(path) if f.severity == "error"]
        assert not findings, (path.name, findings)
