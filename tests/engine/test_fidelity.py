"""Teacher-forced fidelity (``--fidelity-save`` / ``--fidelity-ref``) on tiny generated models.

The expected figures are derived independently of the engine's fidelity code: from the logits
an unmodified run chose its tokens from (``keep_logits``), with the perturbation applied by
hand. Scaling the output head by c (a power of two or -1, both exact in f32) turns every logit
z into c * z without changing the hidden states, so the KL divergence of each step is
KL(softmax(z) || softmax(c z)), computed here with numpy.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python (the engine extra) is not installed")

from bmoe.analyze.metrics import run_summary
from bmoe.engine.embedded.config import EngineConfig, parse_args
from bmoe.engine.embedded.fidelity import read_reference
from bmoe.engine.embedded.run import RunResult, run_engine
from bmoe.errors import BmoeError
from bmoe.formats.metrics import COLUMNS_V2, read_metrics

pytestmark = pytest.mark.engine

N = 24
PROMPT = "Explain how a mixture-of-experts model decides which experts handle each token."


def _run(model: Path, **kw) -> RunResult:
    cfg = EngineConfig(model=str(model), prompt=PROMPT, n_predict=N, threads=1, **kw)
    return run_engine(cfg, keep_logits=True)


def _scaled_head(model: Path, dest: Path, factor: float) -> Path:
    """A copy of `model` whose output head (f32) is multiplied by `factor` in place."""
    import gguf

    shutil.copyfile(model, dest)
    reader = gguf.GGUFReader(dest, "r+")
    (head,) = [t for t in reader.tensors if t.name == "output.weight"]
    assert head.data.dtype == np.float32
    head.data[...] = head.data * np.float32(factor)
    reader.data.flush()
    return dest


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    z = z - z.max()
    return z - np.log(np.exp(z).sum())


@pytest.fixture(scope="module")
def reference(tiny_model: Path, tmp_path_factory) -> tuple[Path, RunResult]:
    path = tmp_path_factory.mktemp("fidelity") / "ref.npz"
    return path, _run(tiny_model, moe_stream=True, cache_mb=2, fidelity_save=str(path))


def test_the_reference_keeps_the_tokens_and_their_logits(reference) -> None:
    path, run = reference
    ref = read_reference(str(path))
    assert ref.prompt == PROMPT
    assert ref.tokens.tolist() == run.tokens
    assert np.array_equal(ref.logits, np.stack(run.logits).astype(np.float32))


def test_the_same_model_agrees_fully_with_zero_divergence(tiny_model, reference, tmp_path) -> None:
    path, ref_run = reference
    csv = tmp_path / "run.csv"
    # another thread count and a cache that holds everything: the same model all the same
    run = _run(tiny_model, moe_stream=True, cache_mb=64, fidelity_ref=str(path), csv=str(csv))
    assert run.summary["fidelity"] == 1.0
    assert run.summary["fidelity_kl"] == 0.0
    assert run.summary["fidelity_first_miss"] == 0
    assert run.summary["fidelity_steps"] == N
    assert run.tokens == ref_run.tokens
    figures = run_summary(read_metrics(csv))  # the results column a sweep ranks by
    assert figures["fidelity"] == 1.0 and figures["fidelity_kl"] == 0.0
    rows = read_metrics(csv).rows  # each step's own divergence, after the native columns
    assert list(rows.columns) == [*COLUMNS_V2, "fidelity_kl"]
    assert rows["fidelity_kl"].tolist() == [0.0] * N


def test_only_a_run_against_a_reference_writes_the_divergence_column(reference) -> None:
    _, ref_run = reference
    assert "fidelity_kl" not in ref_run.metrics and list(ref_run.metrics) == COLUMNS_V2


@pytest.mark.parametrize("factor", [2.0, -1.0])
def test_a_scaled_output_head_gives_the_hand_computed_divergence(
    tiny_model, reference, tmp_path, factor
) -> None:
    path, ref_run = reference
    model = _scaled_head(tiny_model, tmp_path / "scaled.gguf", factor)
    csv = tmp_path / "run.csv"
    run = _run(model, moe_stream=True, cache_mb=2, fidelity_ref=str(path), csv=str(csv))
    # teacher-forced: the modified model is fed the reference's tokens, whatever it prefers
    assert run.tokens == ref_run.tokens
    z = np.stack(ref_run.logits).astype(np.float64)
    kl = []
    for row in z:
        p, q = _log_softmax(row), _log_softmax(factor * row)
        kl.append(float(np.sum(np.exp(p) * (p - q))))
    top1 = np.mean(np.argmax(factor * z, axis=1) == np.argmax(z, axis=1))
    assert run.summary["fidelity"] == pytest.approx(top1)
    assert run.summary["fidelity_kl"] == pytest.approx(np.mean(kl), rel=1e-5)
    assert run.summary["fidelity_kl"] > 0.01
    # each row carries its own step's divergence (printed with six significant digits)
    assert run.metrics["fidelity_kl"].tolist() == pytest.approx(kl, rel=1e-5)
    assert read_metrics(csv).rows["fidelity_kl"].tolist() == pytest.approx(kl, rel=1e-5)
    assert len(set(np.round(kl, 6))) > 1  # the steps differ: a mean alone would hide which
    if factor > 0:
        assert run.summary["fidelity"] == 1.0  # a sharper head keeps every argmax
    else:
        assert run.summary["fidelity"] == 0.0 and run.summary["fidelity_first_miss"] == 1


def test_dropping_experts_moves_the_output(tiny_model, reference) -> None:
    path, _ = reference
    run = _run(tiny_model, moe_stream=True, cache_mb=2, drop_cold_frac=1.0, fidelity_ref=str(path))
    assert run.summary["experts_dropped"] > 0
    assert run.summary["fidelity_kl"] > 0
    assert run.summary["fidelity"] < 1.0


def test_a_reference_of_another_prompt_or_too_short_is_refused(tiny_model, reference) -> None:
    path, _ = reference
    with pytest.raises(BmoeError, match="another prompt"):
        run_engine(
            EngineConfig(model=str(tiny_model), prompt="other", n_predict=4, fidelity_ref=str(path))
        )
    with pytest.raises(BmoeError, match="asks for more"):
        run_engine(
            EngineConfig(
                model=str(tiny_model), prompt=PROMPT, n_predict=N + 1, fidelity_ref=str(path)
            )
        )


def test_a_file_that_is_not_a_reference_is_one_error(tmp_path) -> None:
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip")
    with pytest.raises(BmoeError, match="not a fidelity reference"):
        read_reference(str(bad))
    with pytest.raises(BmoeError, match="no such file"):
        read_reference(str(tmp_path / "missing.npz"))


def test_the_flags_parse() -> None:
    cfg, _ = parse_args(["-m", "x.gguf", "--fidelity-ref", "r.npz"])
    assert cfg.fidelity_ref == "r.npz"
    cfg, _ = parse_args(["-m", "x.gguf", "--fidelity-save", "r.npz"])
    assert cfg.fidelity_save == "r.npz"


def test_speculation_is_refused_with_a_fidelity_measure() -> None:
    """--ngram confirms drafted tokens without sampling them, so a token-by-token measure
    would skip them: the two are refused together, naming both."""
    for flag in ("--fidelity-ref", "--fidelity-save"):
        with pytest.raises(BmoeError, match=r"--ngram.*--fidelity"):
            parse_args(["-m", "x.gguf", "--ngram", flag, "r.npz"])
    cfg, _ = parse_args(["-m", "x.gguf", "--ngram"])
    assert cfg.spec == "ngram"
