"""``--ngram`` self-speculation on the embedded engine.

The draft source is checked on hand-worked token histories (which match wins, where the
draft stops, when it abstains). On generated models of every family: the greedy output with
speculation is the output without it, token for token (the verify path did run: drafts were
made and accepted); a verify decode's cost sits on its group's first row and the groups add up
to the tokens; the route trace holds the verify batches' widened routing; the files pass
``bmoe validate``, carry the preamble keys, the ``ngram:`` lines and the session protocol's
``mtp_*`` keys; and the comparison refuses to set a speculated run against a plain one.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from bmoe.engine.embedded.config import EngineConfig, parse_args
from bmoe.engine.embedded.speculate import NgramDrafter, ngram_draft
from bmoe.errors import BmoeError

PROMPT = "Explain how a mixture-of-experts model decides which experts handle each token."
MIB = 1 << 20


# ----------------------------------------------------------------------------- the drafter


def test_the_longest_earlier_match_proposes_what_followed_it() -> None:
    # corpus 5 1 2 3 9 | 7 2 3 8 | 1 2 3 + last=... the pattern ends "1 2 3" (last=3)
    history = [5, 1, 2, 3, 9, 7, 2, 3, 8, 1, 2]
    # candidates ending in 3: index 3 (suffix 1 2 3 matches 3 back: 1,2,3) and index 7
    # (suffix 2 3, then 7 != 1: length 2); the longer one wins and 9 7 2 follow it
    assert ngram_draft(history, 3, n_max=3, min_match=2, max_match=12) == [9, 7, 2]
    assert ngram_draft(history, 3, n_max=1, min_match=2, max_match=12) == [9]  # n_max clips
    # min_match 4: the best match is 3 long (index 3 starts the corpus' own 1 2 3 after 5)
    assert ngram_draft(history, 3, n_max=3, min_match=4, max_match=12) == []
    assert ngram_draft(history, 3, n_max=3, min_match=3, max_match=12) == [9, 7, 2]


def test_among_equal_matches_the_most_recent_wins() -> None:
    history = [1, 2, 10, 11, 1, 2, 20, 21, 1]
    # pattern "1 2": earlier at indices 0-1 (then 10) and 4-5 (then 20): both length 2
    assert ngram_draft(history, 2, n_max=2, min_match=2, max_match=12) == [20, 21]


def test_the_draft_stops_at_the_end_of_the_corpus_and_may_overlap_the_pattern() -> None:
    # a run of one repeated token predicts itself: the best match ends one before the end,
    # so only the pattern's own last token follows it
    assert ngram_draft([4, 4, 4], 4, n_max=5, min_match=3, max_match=12) == [4]
    # 6 7 8 6 7 | last 8: the match "6 7 8" ends at index 2 and "6 7" then last 8 follow
    assert ngram_draft([6, 7, 8, 6, 7], 8, n_max=5, min_match=3, max_match=12) == [6, 7, 8]


def test_the_pattern_never_matches_itself_and_short_histories_abstain() -> None:
    assert ngram_draft([1, 2], 3, n_max=3, min_match=1, max_match=12) == []  # 3 never seen
    assert ngram_draft([3], 3, n_max=3, min_match=1, max_match=12) == [3]
    assert ngram_draft([3], 3, n_max=3, min_match=2, max_match=12) == []  # history too short
    assert ngram_draft([1, 2, 1], 2, n_max=0, min_match=1, max_match=12) == []


def test_max_match_caps_the_comparison_not_the_choice() -> None:
    # the older occurrence matches 4 back, the recent one 2; with max_match 2 both count as
    # 2 and the most recent wins
    history = [9, 1, 2, 3, 50, 8, 2, 3, 60, 9, 1, 2]
    assert ngram_draft(history, 3, n_max=1, min_match=2, max_match=12) == [50]
    assert ngram_draft(history, 3, n_max=1, min_match=2, max_match=2) == [60]


def _coverage(tokens: list[int], n_prompt: int) -> tuple[int, int]:
    """(steps that drafted, steps) replaying `tokens` as prompt + generation, one step per
    token after the prompt, every draft accepted as far as it equals what followed."""
    drafter = NgramDrafter(tokens[:n_prompt], 3, 3, 12)
    drafted = steps = 0
    i = n_prompt
    while i < len(tokens):
        drafts = drafter.draft(tokens[i], len(tokens) - i - 1)
        good = 0
        while good < len(drafts) and drafts[good] == tokens[i + 1 + good]:
            good += 1
        drafter.confirm(tokens[i : i + 1 + good])
        drafted += bool(drafts)
        steps += 1
        i += 1 + good
    return drafted, steps


def test_copied_text_drafts_and_random_text_declines() -> None:
    rng = np.random.default_rng(7)
    phrase = rng.integers(3, 500, 30).tolist()
    copied = phrase * 4  # a prompt of two copies, then the model copies it twice more
    drafted, steps = _coverage(copied, 60)
    assert drafted >= steps - 1 and steps <= 60 / 4 + 2  # nearly every step drafts 3 tokens
    noise = rng.integers(3, 500, 160).tolist()
    drafted, steps = _coverage(noise, 60)
    assert steps == 100 and drafted <= 2


# ----------------------------------------------------------------------------- flags


def test_the_flags_parse_and_bad_values_are_refused() -> None:
    cfg, _ = parse_args(["-m", "x.gguf", "--ngram", "--draft", "5", "--ngram-min-match", "2"])
    assert (cfg.spec, cfg.draft, cfg.ngram_min_match) == ("ngram", 5, 2)
    assert parse_args(["-m", "x.gguf"])[0].spec == "off"
    for argv, message in (
        (["--ngram", "--draft", "9"], "--draft must be between 1 and 8"),
        (["--ngram", "--ngram-min-match", "0"], "--ngram-min-match must be between"),
        (["--ngram", "--temp", "0.7"], "greedy"),
        (["--mtp"], "nextn"),
        (["--mtp-p-min", "0.5"], "nextn"),
    ):
        with pytest.raises(BmoeError, match=message):
            parse_args(["-m", "x.gguf", *argv])


# ----------------------------------------------------------------------------- the engine

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")

from bmoe.engine.embedded.run import RunResult, run_engine  # noqa: E402
from bmoe.engine.synth import ARCHS, synth_model  # noqa: E402
from bmoe.formats import protocol  # noqa: E402
from bmoe.formats.metrics import read_metrics  # noqa: E402
from bmoe.formats.route import read_route_trace  # noqa: E402
from bmoe.formats.validate import validate_file  # noqa: E402


def _run(model: Path, prompt: str, n: int, **kw) -> RunResult:
    cfg = EngineConfig(model=str(model), prompt=prompt, n_predict=n, threads=1, **kw)
    return run_engine(cfg, keep_logits=True)


def _copy_heavy(model: Path, errors: str = "surrogateescape") -> str:
    """The prompt, the model's own continuation of it, the two again, then the prompt: text
    the n-gram source finds matches in."""
    first = _run(model, PROMPT, 32).text.decode("utf-8", errors)
    return (PROMPT + first) * 2 + PROMPT


@pytest.fixture(scope="module", params=ARCHS)
def family(request, tmp_path_factory) -> tuple[Path, str, RunResult]:
    folder = tmp_path_factory.mktemp(request.param)
    model = synth_model(folder / "m.gguf", "tiny", arch=request.param, type="q8_0")
    prompt = _copy_heavy(model)
    return model, prompt, _run(model, prompt, 40)


@pytest.mark.engine
@pytest.mark.slow
def test_greedy_output_with_ngram_is_the_output_without_it(family) -> None:
    model, prompt, plain = family
    for kw in ({}, {"moe_stream": True, "cache_mb": 1}):
        spec = _run(model, prompt, 40, spec="ngram", ngram_min_match=1, **kw)
        assert spec.tokens == plain.tokens
        assert all(np.array_equal(a, b) for a, b in zip(spec.logits, plain.logits, strict=True))
        s = spec.summary
        assert s["mtp_accepted"] > 0 and s["drafted_steps"] > 0  # the verify path ran
        assert s["mtp_decodes"] < len(plain.tokens)
    # widths and gates only change how the same tokens are reached
    for draft, gate in ((1, 1), (8, 2)):
        spec = _run(model, prompt, 40, spec="ngram", draft=draft, ngram_min_match=gate)
        assert spec.tokens == plain.tokens


@pytest.mark.engine
@pytest.mark.slow
def test_groups_charge_their_first_row_and_add_up_to_the_tokens(tiny_model, tmp_path) -> None:
    prompt = _copy_heavy(tiny_model)
    files = {
        "csv": tmp_path / "s.csv",
        "route_trace": tmp_path / "s.route.csv",
        "io_trace": tmp_path / "s.io.csv",
        "compute_trace_layers": tmp_path / "s.ct.csv",
    }
    out = io.BytesIO()
    cfg = EngineConfig(
        model=str(tiny_model), prompt=prompt, n_predict=40, threads=1, moe_stream=True,
        cache_mb=1, spec="ngram", draft=3, ngram_min_match=1,
        **{k: str(v) for k, v in files.items()},
    )  # fmt: skip
    result = run_engine(cfg, out=out)
    rows = result.metrics
    s = result.summary
    first = rows["wall_ms"].to_numpy() > 0
    batch = rows["mtp_batch"].to_numpy()
    assert int(batch[first].sum()) == len(rows) == s["tokens"]
    assert int(first.sum()) == s["mtp_decodes"] and (batch > 1).any()
    # every later row of a group: zero cost, the group's size
    decode = np.cumsum(first) - 1
    assert (batch == batch[np.flatnonzero(first)][decode]).all()
    for col in ("wall_ms", "io_ms", "cpu_ms", "read_bytes", "loop_overhead_ms", "mtp_draft_ms"):
        assert (rows.loc[~first, col] == 0).all(), col
    # a group of b tokens accepted b - 1 drafts (no end of generation in these tokens)
    assert s["mtp_accepted"] == int((batch[first] - 1).sum())
    assert s["drafted_steps"] <= s["mtp_decodes"] and s["mtp_drafted"] >= s["mtp_accepted"]
    assert s["mtp_draft_s/tok"] > 0
    assert s["read_MiB"] * MIB == pytest.approx(rows["read_bytes"].sum())

    for path in files.values():
        assert not [f for f in validate_file(path) if f.severity == "error"], path
    run = read_metrics(files["csv"])
    assert (run.params["spec"], run.params["spec_draft_max"]) == ("ngram", 3)
    assert run.params["ngram_min_match"] == 1
    trace = read_route_trace(files["route_trace"])
    assert trace.meta["spec"] == "ngram"
    decode_rows = trace.rows[trace.rows["phase"] == 1]
    n_layers = trace.rows["layer"].nunique()
    # every decode routed its token and every draft it verified, rejected ones included
    assert len(decode_rows) == (s["mtp_decodes"] + s["mtp_drafted"]) * 2 * n_layers
    assert decode_rows.duplicated(["step", "layer", "slot"]).any()  # rejected, routed again

    figures = protocol.parse_run_lines(out.getvalue())
    assert figures["spec"] == "ngram"
    assert (figures["mtp_accepted"], figures["mtp_drafted"]) == (
        s["mtp_accepted"],
        s["mtp_drafted"],
    )
    assert figures["mtp_decodes"] == s["mtp_decodes"] and figures["mtp_tokens"] == s["tokens"]
    assert figures["drafted_steps"] == s["drafted_steps"]
    assert figures["ngram_steps"] == s["mtp_decodes"]


@pytest.mark.engine
@pytest.mark.slow
def test_a_copy_heavy_prompt_drafts_and_a_random_one_mostly_declines(tiny_model) -> None:
    copied = _run(tiny_model, _copy_heavy(tiny_model), 48, spec="ngram")
    rng = np.random.default_rng(3)
    noise = "".join(chr(c) for c in rng.integers(0x21, 0x7E, 200))
    random = _run(tiny_model, noise, 48, spec="ngram")
    cs, rs = copied.summary, random.summary
    assert cs["drafted_steps"] >= 3 and cs["mtp_accepted"] >= 2
    assert rs["drafted_steps"] <= 0.1 * rs["mtp_decodes"]
    assert cs["drafted_steps"] / cs["mtp_decodes"] > rs["drafted_steps"] / rs["mtp_decodes"]


@pytest.mark.engine
@pytest.mark.slow
def test_the_comparison_refuses_a_speculated_run_against_a_plain_one(tiny_model, tmp_path):
    from bmoe.analyze.compare import NotComparable, compare_runs

    plain, spec = tmp_path / "plain.csv", tmp_path / "spec.csv"
    for path, kw in ((plain, {}), (spec, {"spec": "ngram", "ngram_min_match": 1})):
        cfg = EngineConfig(
            model=str(tiny_model), prompt=_copy_heavy(tiny_model), n_predict=32, threads=1,
            moe_stream=True, cache_mb=2, csv=str(path), **kw,
        )  # fmt: skip
        run_engine(cfg)
    with pytest.raises(NotComparable, match="speculation on one side only"):
        compare_runs(read_metrics(plain), read_metrics(spec))


@pytest.mark.engine
@pytest.mark.slow
def test_session_turns_report_their_own_speculation(tiny_model, tmp_path) -> None:
    from bmoe.engine.embedded.serve import serve_session

    csv = tmp_path / "s.csv"
    cfg = EngineConfig(
        model=str(tiny_model), n_predict=24, threads=1, moe_stream=True, cache_mb=2,
        spec="ngram", ngram_min_match=1, csv=str(csv), progress=True,
    )  # fmt: skip
    prompt = _copy_heavy(tiny_model, "replace")  # JSON carries text
    requests = [
        protocol.encode_request("generate", id=1, prompt=prompt),
        protocol.encode_request("generate", id=2, prompt=prompt, n_predict=12),
    ]
    out = io.BytesIO()
    serve_session(cfg, stdin=io.BytesIO(("\n".join(requests) + "\n").encode()), out=out)
    done = [e for e in protocol.iter_events(out.getvalue().splitlines()) if e.tag == "DONE"]
    run = read_metrics(csv)
    assert len(done) == len(run.summaries) == 2
    for event, summary in zip(done, run.summaries, strict=True):
        for key in ("mtp_drafted", "mtp_accepted", "mtp_decodes", "drafted_steps"):
            assert event.data[key] == summary[key], key
        assert event.data["tokens"] == summary["tokens"]
    assert done[0].data["mtp_accepted"] > 0
    assert done[0].data["mtp_decodes"] < done[0].data["tokens"]
