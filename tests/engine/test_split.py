"""A model split into shards (``model-00001-of-0000N.gguf``), as large models ship.

The engine must find every expert in the right shard at the right offset: streamed decoding
of the split file must give exactly the tokens and logits of plain llama.cpp on it (and of
the same weights in one file), including when the first shard holds metadata only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python (the engine extra) is not installed")

from bmoe.engine.embedded.config import EngineConfig
from bmoe.engine.embedded.layout import read_layout
from bmoe.engine.embedded.run import RunResult, run_engine
from bmoe.engine.synth import synth_model
from bmoe.errors import BmoeError
from bmoe.formats.metrics import read_metrics
from bmoe.formats.route import read_route_trace
from bmoe.formats.validate import validate_file

pytestmark = pytest.mark.engine

N = 16
PROMPT = "Split models stream from every shard."


@pytest.fixture(scope="module", params=[True, False], ids=["metadata-first", "tensors-first"])
def split_model(request, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("split")
    return synth_model(
        folder / "tiny.gguf", "tiny", split_max_tensors=12, no_tensor_first_split=request.param
    )


def _run(model: Path, **kw) -> RunResult:
    cfg = EngineConfig(model=str(model), prompt=PROMPT, n_predict=N, threads=1, **kw)
    return run_engine(cfg, keep_logits=True)


def _identical(a: RunResult, b: RunResult) -> bool:
    return a.tokens == b.tokens and all(
        np.array_equal(x, y) for x, y in zip(a.logits, b.logits, strict=True)
    )


def test_synth_writes_shards_with_llama_cpp_names(split_model: Path) -> None:
    shards = sorted(split_model.parent.glob("tiny-*-of-*.gguf"))
    assert split_model == shards[0] and len(shards) > 2
    assert [p.name for p in shards] == [
        f"tiny-{i:05d}-of-{len(shards):05d}.gguf" for i in range(1, len(shards) + 1)
    ]
    assert not list(split_model.parent.glob(".*"))  # no staging left behind
    layout = read_layout(split_model)
    assert layout.shards == [str(p) for p in shards]
    assert {t.shard for t in layout.tensors.values()} >= set(range(1, len(shards)))
    assert layout.file_size == sum(p.stat().st_size for p in shards)


def test_every_expert_slice_is_read_from_its_shard(split_model: Path, tiny_model: Path) -> None:
    """The same weights in one file and in shards: each tensor's bytes agree."""
    split, whole = read_layout(split_model), read_layout(tiny_model)
    assert split.tensors.keys() == whole.tensors.keys()
    assert split.dense_bytes == whole.dense_bytes
    for name, t in split.tensors.items():
        w = whole.tensors[name]
        with open(split.shards[t.shard], "rb") as a, open(tiny_model, "rb") as b:
            a.seek(t.slice_offset(t.n_expert - 1))
            b.seek(w.slice_offset(w.n_expert - 1))
            assert a.read(t.slice_bytes) == b.read(w.slice_bytes), name


@pytest.mark.parametrize(
    "settings",
    [{"cache_mb": 1}, {"cache_mb": 0}, {"cache_mb": 1, "prefetch": 1}, {"cache_mb": 100}],
    ids=["evicting", "no-cache", "prefetch", "holds-all"],  # holds-all: a huge-page arena
)
def test_streaming_a_split_model_is_identical_to_plain_decoding(
    split_model: Path, tiny_model: Path, settings: dict
) -> None:
    plain = _run(split_model)
    assert _identical(plain, _run(tiny_model))  # the shards hold the same model
    streamed = _run(split_model, moe_stream=True, **settings)
    assert _identical(streamed, plain)
    assert streamed.cache_stats is not None and streamed.cache_stats["misses"] > 0


def test_files_name_the_model_by_its_first_shard(split_model: Path, tmp_path: Path) -> None:
    csv, route = tmp_path / "run.csv", tmp_path / "route.csv"
    _run(split_model, moe_stream=True, cache_mb=1, csv=str(csv), route_trace=str(route))
    assert read_metrics(csv).params["model"] == split_model.name
    assert read_route_trace(route).meta["model"] == str(split_model)
    for path in (csv, route):
        assert not [f for f in validate_file(path) if f.severity == "error"]


def test_a_later_or_missing_shard_is_a_one_line_error(split_model: Path, tmp_path: Path) -> None:
    shards = sorted(split_model.parent.glob("tiny-*-of-*.gguf"))
    with pytest.raises(BmoeError, match="open a split model by its first shard"):
        read_layout(shards[1])
    for shard in shards:
        (tmp_path / shard.name).symlink_to(shard)
    (tmp_path / shards[-1].name).unlink()
    with pytest.raises(BmoeError, match=rf"{shards[-1].name}: no such model file"):
        read_layout(tmp_path / shards[0].name)
    renamed = tmp_path / "first.gguf"
    renamed.symlink_to(shards[0])
    with pytest.raises(BmoeError, match="must be named"):
        read_layout(renamed)
