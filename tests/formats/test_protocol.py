"""BMOE_* events, session requests and end-of-run lines against the native engine's output."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from bmoe.errors import BmoeError
from bmoe.formats import protocol as P
from bmoe.formats.errors import FormatError, FormatWarning

STREAMS = ["native-tiny/run.out", "native-tiny/sess.out"]
RUN_LOGS = [
    "native-tiny/run.out",
    "native-tiny/pf.out",
    "native-tiny/drop.out",
    "native-tiny/mmap.out",
    "native-tiny/sess.out",
    "metrics/2026-07-12/qwen_c4000_l4.log",
    "metrics/2026-07-12/qwen_mmap.log",
    "metrics/2026-07-13/qwen_auto_ov.log",
    "metrics/2026-07-12-pr23/qwen_pf2.log",
    "route-trace/gemma.log",
]


def _events(path: Path) -> list[P.Event]:
    return list(P.iter_events(path.read_bytes().splitlines(keepends=True), path=str(path)))


@pytest.mark.parametrize("name", STREAMS)
def test_every_event_line_formats_back_to_its_bytes(corpus: Path, name: str) -> None:
    lines = [ln for ln in (corpus / name).read_bytes().split(b"\n") if ln.startswith(b"BMOE_")]
    assert lines
    for raw in lines:
        event = P.parse_line(raw)
        assert event is not None
        assert P.to_bytes(P.format_event(event)) == raw
        assert P.to_bytes(P.format_event(event.tag, event.data)) == raw


def test_progress_stream_with_invalid_utf8_decodes(corpus: Path) -> None:
    raw = (corpus / "native-tiny/run.out").read_bytes()
    with pytest.raises(UnicodeDecodeError):
        raw.decode("utf-8")
    events = _events(corpus / "native-tiny/run.out")
    progress = [e for e in events if isinstance(e, P.Progress)]
    loads = [e for e in events if isinstance(e, P.Load)]
    assert len(progress) == 24 and len(loads) == 24
    first = progress[0]
    assert (first.step, first.steps, first.wall_ms, first.read_mb) == (1, 24, 3.7, 1.2)
    assert first.dense_resident_frac == -1.0 and first.majflt == 0
    assert loads[0].mb == 1.2 and loads[0].ms == 2.8
    assert [p.step for p in progress] == list(range(1, 25))
    # the deltas, joined as bytes, are exactly the answer the engine printed under its banner
    answer = raw.split(b"=== answer ===\n", 1)[1].split(b"\n=== perf ===", 1)[0]
    assert b"".join(p.delta_text_bytes for p in progress) == answer
    assert "\ufffd" in P.printable(progress[3].delta_text)


def test_session_stream(corpus: Path) -> None:
    events = _events(corpus / "native-tiny/sess.out")
    tags = [e.tag for e in events]
    assert tags[0] == "READY" and tags.count("BEGIN") == 3 and tags.count("DONE") == 2
    ready = events[0]
    assert isinstance(ready, P.Ready)
    assert (ready.arch, ready.n_ctx, ready.think_ctl, ready.n_expert_used) == (
        "qwen3moe",
        2048,
        "template",
        2,
    )
    done = [e for e in events if isinstance(e, P.Done)]
    assert [d.id for d in done] == [1, 2] and [d.tokens for d in done] == [8, 6]
    assert done[0].cancelled is False and done[0].tok_s == pytest.approx(485.682)
    assert done[0].n_prompt == 17 and done[0].n_past == 25 and done[1].n_past == 20
    assert done[0].cache_resident_mib == 2.0 and done[0].mtp_decodes == 8
    # each DONE's final text is its generation's deltas joined
    turn: list[bytes] = []
    for event in events:
        if isinstance(event, P.Begin):
            turn = []
        elif isinstance(event, P.Progress):
            turn.append(event.delta_text_bytes)
        elif isinstance(event, P.Done):
            assert event.text_bytes == b"".join(turn)
    error = events[-1]
    assert isinstance(error, P.Error)
    assert error.id == 3 and error.fatal is False and "n_ctx" in (error.msg or "")


def test_unknown_tags_and_keys_are_kept() -> None:
    event = P.parse_line('BMOE_HEARTBEAT {"t":1.25,"who":"x"}')
    assert isinstance(event, P.Unknown) and event.tag == "HEARTBEAT"
    assert event.data == {"t": 1.25, "who": "x"}
    assert P.format_event(event) == 'BMOE_HEARTBEAT {"t":1.25,"who":"x"}'
    line = 'BMOE_PROGRESS {"step":3,"wall_ms":2.5,"new_key":[1,2],"delta_text":"a"}'
    progress = P.parse_line(line)
    assert isinstance(progress, P.Progress) and progress.data["new_key"] == [1, 2]
    assert progress.steps is None and P.format_event(progress) == line


def test_native_number_formatting_by_hand() -> None:
    line = P.format_event(
        "PROGRESS",
        {"step": 7, "wall_ms": 3.04, "read_mb": 1.2, "cache_hit_pct": -1, "reset": 1,
         "dense_resident_frac": 0.5, "delta_text": 'a"\n\x03'},
    )  # fmt: skip
    assert line == (
        'BMOE_PROGRESS {"step":7,"wall_ms":3.0,"read_mb":1.20,"cache_hit_pct":-1.0,"reset":1,'
        '"dense_resident_frac":0.500,"delta_text":"a\\"\\n\\u0003"}'
    )
    assert P.format_event("LOAD", {"mb": 0.5, "ms": 12}) == 'BMOE_LOAD {"mb":0.50,"ms":12.0}'
    assert P.format_event("ERROR", {"id": 3, "fatal": True, "msg": "x"}) == (
        'BMOE_ERROR {"id":3,"fatal":true,"msg":"x"}'
    )
    nan = P.parse_line('BMOE_PROGRESS {"step":1,"cache_hit_pct":nan}')
    assert nan is not None and nan.cache_hit_pct != nan.cache_hit_pct
    assert P.format_event(nan) == 'BMOE_PROGRESS {"step":1,"cache_hit_pct":nan}'


def test_reset_and_decide() -> None:
    reset = P.parse_line('BMOE_PROGRESS {"step":2,"reset":1,"delta_reasoning":"r","delta_text":""}')
    assert isinstance(reset, P.Progress) and reset.is_reset
    decide = P.parse_line(
        'BMOE_DECIDE {"id":4,"cancelled":false,"best":1,"choice_logp":[-2.5,-0.25,null]}'
    )
    assert isinstance(decide, P.Decide)
    assert decide.best == 1 and decide.choice_logp == [-2.5, -0.25, None]


def test_non_protocol_and_bad_lines() -> None:
    assert P.parse_line("generation: 24 tokens") is None
    assert P.parse_line(b"") is None
    with pytest.raises(FormatError, match=r"x.out:9: BMOE_PROGRESS payload is not valid JSON"):
        P.parse_line('BMOE_PROGRESS {"step":', path="x.out", lineno=9)
    with pytest.raises(FormatError, match="not a JSON object"):
        P.parse_line("BMOE_LOAD [1,2]")
    with pytest.raises(FormatError, match="no JSON payload"):
        P.parse_line("BMOE_BEGIN")


def test_a_cut_last_line_is_dropped_with_a_warning() -> None:
    lines = ['BMOE_BEGIN {"id":1}\n', 'BMOE_LOAD {"mb":1.20,"ms":2.8}\n', 'BMOE_PROGRESS {"st']
    with pytest.warns(FormatWarning, match="s.out:3: last line is cut short"):
        events = list(P.iter_events(lines, path="s.out"))
    assert [e.tag for e in events] == ["BEGIN", "LOAD"]
    with pytest.raises(FormatError, match=r"s\.out:1:"):
        list(P.iter_events(['BMOE_BEGIN {"id"\n', 'BMOE_BEGIN {"id":1}\n'], path="s.out"))


def test_requests() -> None:
    line = P.encode_request("generate", id=1, prompt='say "hi"\n', n_predict=8, clear_kv=True)
    assert (
        line == '{"cmd":"generate","id":1,"prompt":"say \\"hi\\"\\n","n_predict":8,"clear_kv":true}'
    )
    assert P.parse_request(line)["prompt"] == 'say "hi"\n'
    assert P.encode_request("cancel") == '{"cmd":"cancel"}'
    assert P.encode_request("close") == '{"cmd":"close"}'
    decide = P.encode_request("decide", id=2, prefix="p", suffix="s", choices=["a", "b"])
    assert P.parse_request(decide)["choices"] == ["a", "b"]
    with pytest.raises(BmoeError, match="unknown session request 'stop'"):
        P.encode_request("stop")
    with pytest.raises(BmoeError, match="needs prompt"):
        P.encode_request("generate", id=1)
    with pytest.raises(FormatError, match="unknown request 'stop'"):
        P.parse_request('{"cmd":"stop"}')
    with pytest.raises(FormatError, match="not valid JSON"):
        P.parse_request("{")


@pytest.mark.parametrize("name", RUN_LOGS)
def test_run_lines_format_back_exactly(corpus: Path, name: str) -> None:
    text = (corpus / name).read_bytes()
    figures = P.parse_run_lines(text)
    assert P.format_run_lines(figures) == P.run_line_text(text)


def test_run_line_figures(corpus: Path) -> None:
    run = P.parse_run_lines((corpus / "native-tiny/run.out").read_bytes())
    assert run["tokens"] == 24 and run["tok/s"] == 362.141 and run["s/tok"] == 0.003
    assert (run["cpu_pct"], run["cpu_s/tok"], run["threads"]) == (84.3, 0.0047, 2)
    assert (run["n_prompt"], run["prefill_tps"], run["ttft_s"]) == (17, 794.9, 0.051)
    assert (run["read_MiB"], run["read_MiB/tok"], run["read_MiB/s"]) == (34.1, 1.42, 732)
    assert (run["cache_hit_pct"], run["cache_resident_MiB"]) == (9.7, 1.9)
    assert (run["evictions"], run["rereads"], run["rereads/tok"]) == (186, 166, 6.9)
    drop = P.parse_run_lines((corpus / "native-tiny/drop.out").read_bytes())
    assert (drop["experts_dropped"], drop["experts_routed"]) == (123, 384)
    assert (drop["drop_pct"], drop["drop_cold_frac"]) == (32.0, 1.0)
    pf2 = P.parse_run_lines((corpus / "metrics/2026-07-12-pr23/qwen_pf2.log").read_bytes())
    assert (pf2["spec_read_MiB"], pf2["spec_useful"], pf2["spec_experts"]) == (464.2, 163, 167)
    assert pf2["stall_s/tok"] == 0.063 and pf2["mgmt_s/tok"] == 0.026
    c4000 = P.parse_run_lines((corpus / "metrics/2026-07-12/qwen_c4000_l4.log").read_bytes())
    assert "mgmt_s/tok" not in c4000 and c4000["io_s/tok"] == 0.127
    auto = P.parse_run_lines((corpus / "metrics/2026-07-13/qwen_auto_ov.log").read_bytes())
    assert (auto["cache_budget_MiB"], auto["cache_sizing"], auto["cache_resizes"]) == (
        4675,
        "auto",
        0,
    )
    mmap = P.parse_run_lines((corpus / "native-tiny/mmap.out").read_bytes())
    assert "read_MiB" not in mmap and mmap["tokens"] == 32
    gemma = P.parse_run_lines((corpus / "route-trace/gemma.log").read_bytes())
    assert gemma["majflt/tok"] == 49.2 and gemma["stall_s/tok"] == 0.053


def test_run_lines_not_in_the_corpus_by_hand() -> None:
    lines = [
        "generation: 64 tokens, 0.250 s/token (4.000 tok/s)",
        "ngram: 30/90 drafts accepted (33.3%), 1.40 tokens per verify decode "
        "(46 decodes for 64 tokens)",
        "ngram: drafting costs 0.0012 s/token on top of decode → 3.981 tok/s effective "
        "(vs 4.000 reported)",
        "ngram: drafted on 20 of 46 steps (43.5%); the rest decoded plainly",
        "mode: expert streaming, cache 4000 MiB, dense anon, overlap",
        "moe-rows: 120.5 MiB of row-gathered table(s) off the resident set, 2.0 MiB resident, "
        "300 rows gathered, 12 reads (1.5 MiB)",
        "moe-rows: 2 FAILED reads - this run's output is not trustworthy",
        "moe-route-ahead: 2 layers early — 3000 routings committed, 48 passed through; "
        "committed selection agreed with the router on 91.5% of slots",
        "moe-predict: stale-gate 80.1% of routed slots (40.0% whole routings)",
    ]
    figures = P.parse_run_lines("\n".join(lines))
    assert figures["mode"] == "expert streaming" and figures["overlap"] is True
    assert figures["mode_cache"] == "4000 MiB" and figures["dense_weights"] == "anon"
    assert figures["row_io_errors"] == 2 and figures["row_rows"] == 300
    assert (figures["route_ahead"], figures["ra_agree_pct"]) == (2, 91.5)
    assert (figures["spec"], figures["mtp_accepted"], figures["drafted_steps"]) == ("ngram", 30, 20)
    assert figures["other_lines"] == [lines[-1]]
    assert P.format_run_lines(figures) == lines
    plain = P.parse_run_lines("mode: expert streaming, cache off, dense mmap\n")
    assert plain["overlap"] is False
    assert P.format_run_lines(plain) == ["mode: expert streaming, cache off, dense mmap"]
    mtp = (
        "mtp:   9/10 drafts accepted (90.0%), 1.90 tokens per verify decode"
        " (10 decodes for 19 tokens)"
    )
    assert P.format_run_lines(P.parse_run_lines(mtp)) == [mtp]


def test_answer_text_before_the_banner_is_not_a_figure() -> None:
    text = "=== answer ===\ngeneration: 1 tokens, 9.000 s/token (0.111 tok/s)\n=== perf ===\n"
    text += "generation: 5 tokens, 0.200 s/token (5.000 tok/s)\n"
    assert P.parse_run_lines(text)["tokens"] == 5


def test_warning_free_parse_of_every_corpus_stream(corpus: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", FormatWarning)
        for name in RUN_LOGS:
            _events(corpus / name)


def test_events_arrive_as_their_lines_do() -> None:
    def live():
        yield 'BMOE_BEGIN {"id":1}\n'
        raise AssertionError("read a line ahead of the consumer")

    assert next(P.iter_events(live())).tag == "BEGIN"
