"""Synthetic models: what llama.cpp's qwen3moe loader requires, checked in the written file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bmoe.engine.synth import PRESETS, estimate_bytes, preset_config, synth_model
from bmoe.errors import BmoeError

gguf = pytest.importorskip("gguf", reason="the engine extra (gguf) is not installed")

# the keys llama.cpp 0.3.36 reads for qwen3moe (llama_model_base::load_hparams and
# llama_model_qwen3moe::load_arch_hparams); all required ones must be present
REQUIRED_KEYS = [
    "general.architecture",
    "qwen3moe.context_length",
    "qwen3moe.embedding_length",
    "qwen3moe.block_count",
    "qwen3moe.attention.head_count",
    "qwen3moe.attention.head_count_kv",
    "qwen3moe.attention.layer_norm_rms_epsilon",
    "qwen3moe.expert_count",
    "qwen3moe.expert_used_count",
    "qwen3moe.expert_feed_forward_length",
    "tokenizer.ggml.model",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.scores",
    "tokenizer.ggml.token_type",
]


def _reader(path: Path):
    return gguf.GGUFReader(path)


def _value(reader, key):
    return reader.fields[key].contents()


def test_tiny_has_the_keys_and_tensors_qwen3moe_needs(tiny_model: Path) -> None:
    r = _reader(tiny_model)
    for key in REQUIRED_KEYS:
        assert key in r.fields, key
    assert _value(r, "general.architecture") == "qwen3moe"
    cfg = PRESETS["tiny"]
    e, f, x, v = cfg.n_embd, cfg.n_ff_exp, cfg.experts, cfg.vocab
    q, kv = cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim
    # ggml order (ne0 first), as llama_model_qwen3moe::load_arch_tensors creates them
    want = {"token_embd.weight": [e, v], "output_norm.weight": [e], "output.weight": [e, v]}
    for il in range(cfg.layers):
        b = f"blk.{il}."
        want.update(
            {
                b + "attn_norm.weight": [e],
                b + "attn_q.weight": [e, q],
                b + "attn_k.weight": [e, kv],
                b + "attn_v.weight": [e, kv],
                b + "attn_output.weight": [q, e],
                b + "attn_q_norm.weight": [cfg.head_dim],
                b + "attn_k_norm.weight": [cfg.head_dim],
                b + "ffn_norm.weight": [e],
                b + "ffn_gate_inp.weight": [e, x],
                b + "ffn_gate_exps.weight": [e, f, x],
                b + "ffn_up_exps.weight": [e, f, x],
                b + "ffn_down_exps.weight": [f, e, x],
            }
        )
    got = {t.name: [int(n) for n in t.shape] for t in r.tensors}
    assert got == want
    assert abs(tiny_model.stat().st_size - estimate_bytes(cfg)) < 64 * 1024


def test_vocabulary_is_byte_level(tiny_model: Path) -> None:
    r = _reader(tiny_model)
    tokens = _value(r, "tokenizer.ggml.tokens")
    types = _value(r, "tokenizer.ggml.token_type")
    assert _value(r, "tokenizer.ggml.model") == "llama"
    assert len(tokens) == PRESETS["tiny"].vocab == len(set(tokens))
    for b in range(256):
        i = tokens.index(f"<0x{b:02X}>")
        assert types[i] == 6  # BYTE: every byte sequence tokenizes


def test_small_preset_is_about_a_gigabyte_with_the_asked_shape() -> None:
    cfg = preset_config("small")
    assert (cfg.layers, cfg.experts, cfg.top_k) == (16, 64, 8)
    assert 0.9e9 < estimate_bytes(cfg) < 1.2e9


def test_overrides_and_their_errors(tmp_path: Path) -> None:
    path = synth_model(tmp_path / "m.gguf", "tiny", layers=2, experts=4, top_k=1, vocab=300)
    r = _reader(path)
    assert _value(r, "qwen3moe.block_count") == 2
    assert _value(r, "qwen3moe.expert_count") == 4
    assert _value(r, "qwen3moe.expert_used_count") == 1
    with pytest.raises(BmoeError, match="top_k"):
        preset_config("tiny", top_k=9)
    with pytest.raises(BmoeError, match="unknown preset"):
        preset_config("huge")
    with pytest.raises(BmoeError, match="unknown setting 'depth'"):
        preset_config("tiny", depth=3)
    with pytest.raises(BmoeError, match="q8_0"):
        preset_config("tiny", type="q8_0", n_embd=100)
    assert not list(tmp_path.glob("*.part"))


def test_seed_makes_files_reproducible(tmp_path: Path) -> None:
    a = synth_model(tmp_path / "a.gguf", "tiny", layers=1, seed=7).read_bytes()
    b = synth_model(tmp_path / "b.gguf", "tiny", layers=1, seed=7).read_bytes()
    c = synth_model(tmp_path / "c.gguf", "tiny", layers=1, seed=8).read_bytes()
    assert a == b
    assert a != c


def _router_bias(path: Path, layer: int) -> np.ndarray:
    r = _reader(path)
    t = next(t for t in r.tensors if t.name == f"blk.{layer}.ffn_gate_inp.weight")
    return np.asarray(t.data)[:, 0]  # (n_expert,): the weights on the bias channel


def test_skew_is_a_router_bias_on_a_channel_no_layer_writes(tmp_path: Path) -> None:
    flat = synth_model(tmp_path / "flat.gguf", "tiny", skew=0.0)
    hot = synth_model(tmp_path / "hot.gguf", "tiny", skew=2.0)
    assert not np.any(_router_bias(flat, 0))
    assert np.std(_router_bias(hot, 0)) > 0.1
    r = _reader(hot)
    by_name = {t.name: np.asarray(t.data) for t in r.tensors}
    assert np.all(by_name["token_embd.weight"][:, 0] == by_name["token_embd.weight"][0, 0])
    assert not np.any(by_name["blk.0.attn_output.weight"][0, :])  # numpy (out, in)
    assert not np.any(by_name["blk.0.ffn_down_exps.weight"][:, 0, :])


@pytest.mark.parametrize("kind", ["f16", "q8_0"])
def test_other_weight_types(tmp_path: Path, kind: str) -> None:
    path = synth_model(tmp_path / f"{kind}.gguf", "tiny", layers=1, type=kind)
    r = _reader(path)
    t = next(t for t in r.tensors if t.name == "blk.0.ffn_up_exps.weight")
    assert t.tensor_type.name == kind.upper()
    assert (
        path.stat().st_size < (synth_model(tmp_path / "f32.gguf", "tiny", layers=1)).stat().st_size
    )


def test_a_weight_type_per_layer_gives_expert_sizes_that_differ_by_layer(tmp_path: Path) -> None:
    """--layer-types: each layer's experts in its type (cycled), the rest in --type: a
    K-quant's mix, whose widest layer is wider than the mean."""
    from bmoe.engine.embedded.layout import read_layout

    path = synth_model(tmp_path / "mixed.gguf", "tiny", type="q8_0", layer_types=("q8_0", "q4_0"))
    types = {t.name: t.tensor_type.name for t in _reader(path).tensors}
    for il, kind in enumerate(["Q8_0", "Q4_0", "Q8_0", "Q4_0"]):
        assert {types[f"blk.{il}.ffn_{p}_exps.weight"] for p in ("gate", "up", "down")} == {kind}
        assert types[f"blk.{il}.attn_q.weight"] == "Q8_0"
    layout = read_layout(path)
    sizes = [layout.expert_bytes(il) for il in layout.moe_layers]
    assert sizes[0] == sizes[2] > sizes[1] == sizes[3]
    assert _value(_reader(path), "bmoe.synth.layer_types") == "q8_0,q4_0"
    with pytest.raises(BmoeError, match="unknown type 'q6_k'"):
        preset_config("tiny", layer_types=("q8_0", "q6_k"))
    with pytest.raises(BmoeError, match="q4_0 needs"):
        preset_config("tiny", layer_types=("q4_0",), n_embd=100)
