"""Op classes from node names and ops, and layers resolved for views and unnamed nodes."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from bmoe.analyze import op_traces as dec
from bmoe.analyze.opclass import (
    OP_CLASS_RULES,
    OP_CLASSES,
    Rule,
    classify,
    node_classes,
    node_layers,
)
from bmoe.formats.op_traces import read_compute_trace

# (op, name, class): llama.cpp graph names as qwen3moe, gpt-oss, gemma and llama-style dense
# models spell them.
CASES = [
    # qwen3moe (the corpus trace)
    ("GET_ROWS", "embd", "other"),
    ("RMS_NORM", "norm-0", "norm"),
    ("MUL", "attn_norm-0", "norm"),
    ("MUL_MAT", "Qcur-0", "attention"),
    ("MUL", "Qcur_normed-0", "attention"),
    ("ROPE", "Kcur-0", "attention"),
    ("SET_ROWS", "cache_k_l0 (view)", "attention"),
    ("PERMUTE", "cache_v_l3 (view) (permuted)", "attention"),
    ("FLASH_ATTN_EXT", "node_25", "attention"),
    ("RESHAPE", "kqv_out-0", "attention"),
    ("ADD", "ffn_inp-0", "other"),
    ("MUL", "ffn_norm-0", "norm"),
    ("RESHAPE", "ffn_norm-0 (reshaped)", "norm"),
    ("MUL_MAT", "ffn_moe_logits-0", "router"),
    ("SOFT_MAX", "ffn_moe_probs-0", "router"),
    ("ARGSORT", "ffn_moe_argsort-0", "router"),
    ("VIEW", "ffn_moe_topk-0", "router"),
    ("GET_ROWS", "ffn_moe_weights-0", "router"),
    ("DIV", "ffn_moe_weights_norm-0", "router"),
    ("MUL_MAT_ID", "ffn_moe_gate-0", "expert matmul"),
    ("MUL_MAT_ID", "ffn_moe_up-0", "expert matmul"),
    ("GLU", "ffn_moe_swiglu-0", "expert matmul"),
    ("MUL_MAT_ID", "ffn_moe_down-0", "expert matmul"),
    ("MUL", "ffn_moe_weighted-0", "expert matmul"),
    ("ADD", "ffn_moe_out-0", "expert matmul"),
    ("ADD", "l_out-0", "other"),
    ("MUL", "result_norm", "norm"),
    ("MUL_MAT", "result_output", "other"),
    # gpt-oss: biased router, fused gate_up, attention sinks
    ("ADD", "ffn_moe_logits_biased-5", "router"),
    ("SOFT_MAX", "ffn_moe_weights_softmax-5", "router"),
    ("MUL_MAT_ID", "ffn_moe_gate_up-5", "expert matmul"),
    ("ADD", "ffn_moe_down_biased-5", "expert matmul"),
    ("MUL_MAT_ID", "some_unlabelled_matmul", "expert matmul"),
    # gemma: post-norms, dense MLP beside the experts, GELU
    ("MUL", "attn_post_norm-7", "norm"),
    ("MUL", "ffn_post_norm-7", "norm"),
    ("MUL_MAT", "ffn_gate-7", "dense FFN"),
    ("GLU", "ffn_geglu-7", "dense FFN"),
    # shared experts (qwen2moe) are dense FFN
    ("MUL_MAT", "ffn_up_shexp-2", "dense FFN"),
    # llama-style dense layer
    ("MUL_MAT", "ffn_down-1", "dense FFN"),
    ("MUL_MAT", "ffn_out-1", "dense FFN"),
    ("SOFT_MAX", "kq_soft_max-1", "attention"),
    ("CPY", "something_unknown-1", "other"),
]


@pytest.mark.parametrize(("op", "name", "want"), CASES)
def test_classify_known_names(op: str, name: str, want: str) -> None:
    assert want in OP_CLASSES
    assert classify(op, name) == want


def test_unnamed_node_without_telling_op_is_undecided() -> None:
    assert classify("MUL_MAT", "node_27") is None
    assert classify("FLASH_ATTN_EXT", "node_25") == "attention"


def test_a_prepended_rule_overrides_the_table() -> None:
    rules = (Rule("dense FFN", name=r"ffn_moe_up", arch="myarch"), *OP_CLASS_RULES)
    assert classify("MUL_MAT_ID", "ffn_moe_up-3", "myarch", rules) == "dense FFN"
    assert classify("MUL_MAT_ID", "ffn_moe_up-3", "qwen3moe", rules) == "expert matmul"


def frame(nodes: list[tuple[int, int, str, str]]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "turn": 0,
            "phase": 1,
            "step": [s for s, _, _, _ in nodes],
            "layer": [lay for _, lay, _, _ in nodes],
            "op": pd.Categorical([o for _, _, o, _ in nodes]),
            "name": pd.Categorical([n for _, _, _, n in nodes]),
        }
    )


def test_unnamed_nodes_inherit_predecessor_class_and_layer_within_a_step() -> None:
    rows = frame(
        [
            (1, 0, "RESHAPE", "kqv_out-0"),
            (1, -1, "MUL_MAT", "node_27"),  # attention output projection, layer 0
            (1, -1, "VIEW", "Kcur-2 (view)"),  # layer from the name
            (1, 1, "MUL_MAT_ID", "ffn_moe_down-1"),
            (2, -1, "MUL_MAT", "node_3"),  # first of its step: nothing to inherit
            (2, -1, "GET_ROWS", "embd"),
        ]
    )
    assert list(node_classes(rows, "qwen3moe")) == [
        "attention", "attention", "attention", "expert matmul", "other", "other",
    ]  # fmt: skip
    assert list(node_layers(rows)) == [0, 0, 2, 1, -1, -1]


def test_corpus_classes_cover_the_measured_total(corpus: Path) -> None:
    trace = read_compute_trace(corpus / "native-tiny" / "ct.compute.csv")
    by_class = dec.compute_by_class(trace)
    assert list(by_class["op_class"]) == list(OP_CLASSES)
    assert by_class["ms_per_token"].sum() == pytest.approx(
        dec.compute_summary(trace)["ms_per_token"]
    )
    assert by_class["share_pct"].sum() == pytest.approx(100.0)
    rows = dec.decode_rows(trace.rows)
    classes = node_classes(rows, "qwen3moe")
    experts = rows["op"].astype(str) == "MUL_MAT_ID"
    assert (classes[experts] == "expert matmul").all()
    assert (classes[rows["op"].astype(str) == "FLASH_ATTN_EXT"] == "attention").all()
    # qwen3moe has no dense FFN; every layer's nodes land in layers 0..3 or -1
    assert by_class.set_index("op_class").loc["dense FFN", "ms_per_token"] == 0
    table = dec.compute_class_by_layer(trace)
    assert list(table["layer"]) == [-1, 0, 1, 2, 3]
    assert table["total"].sum() == pytest.approx(by_class["ms_per_token"].sum())
