"""``bmoe run --session`` on a tiny synthetic model: the session protocol of telemetry.md,
served by the embedded engine, through the same client and readers the native engine's
session files go through, and a sweep with ``session = true`` on it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python (the engine extra) is not installed")

from sweep_helpers import manifest, sweep_folder, write_config

from bmoe.engine.embedded.config import EngineConfig
from bmoe.engine.embedded.run import run_engine
from bmoe.engine.session import SessionClient, SessionRequestError
from bmoe.formats import protocol
from bmoe.formats.metrics import read_metrics
from bmoe.formats.route import read_route_trace
from bmoe.formats.validate import validate_file
from bmoe.sweep.sessions import split_turns

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "Explain how a mixture-of-experts model decides which experts handle each token."


def _start(model: Path, tmp_path: Path, *extra: str) -> tuple[subprocess.Popen, SessionClient]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "bmoe", "run", "-m", str(model), "-n", "6", "-t", "1",
         "--moe-stream", "--cache-mb", "2", "--session", *extra],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path,
    )  # fmt: skip
    lines: list[bytes] = []
    client = SessionClient(proc.stdin, proc.stdout, on_line=lines.append)
    client.lines = lines  # type: ignore[attr-defined]
    return proc, client


@pytest.mark.slow
def test_turns_rejections_and_files_read_like_the_native_session(tiny_model, tmp_path) -> None:
    csv, route = tmp_path / "s.csv", tmp_path / "s.route.csv"
    proc, client = _start(tiny_model, tmp_path, "--csv", str(csv), "--route-trace", str(route))
    try:
        ready = client.wait_ready(timeout=120)
        assert (ready["arch"], ready["n_expert_used"], ready["n_ctx"]) == ("qwen3moe", 2, 2048)
        first = client.generate(PROMPT, timeout=120)
        assert (first.tokens, first.cancelled, first.done["n_past"]) == (
            6,
            False,
            first.done["n_prompt"] + 6,
        )
        more = client.generate(" And then?", n_predict=4, clear_kv=False, timeout=120)
        assert more.tokens == 4
        # no chat template: the prompt is tokenized on its own (its BOS, then 9 tokens) and
        # decoded after the context; n_past counts the turn's own tokens, as native reports
        assert (more.done["n_prompt"], more.done["n_past"]) == (10, 14)
        with pytest.raises(SessionRequestError, match="exceeds the session n_ctx"):
            client.generate("too long", n_predict=5000, timeout=120)
        again = client.generate(PROMPT, n_predict=3, timeout=120)
        assert again.tokens == 3 and again.text == first.text[: len(again.text)]
        client._send("this is not json")  # a malformed line: rejected, the session goes on
        client.close()
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    events = list(protocol.iter_events(client.lines))  # type: ignore[attr-defined]
    errors = [e for e in events if e.tag == "ERROR"]
    assert [bool(e.data["fatal"]) for e in errors] == [False, False]
    assert "stdin:" in errors[1].data["msg"] and "JSON" in errors[1].data["msg"]

    # the same readers as the corpus session file: one summary per turn, rows by turn
    run = read_metrics(csv)
    assert sorted(set(run.rows["turn"])) == [0, 1, 2] and len(run.summaries) == 3
    turns = split_turns(csv)
    assert [t.rows["step"].tolist() for t in turns] == [[1, 2, 3, 4, 5, 6], [1, 2, 3, 4], [1, 2, 3]]
    assert [t.summaries[0]["tokens"] for t in turns] == [6, 4, 3]
    trace = read_route_trace(route)
    assert sorted(set(trace.rows["turn"])) == [0, 1, 2]
    second = trace.rows[trace.rows["turn"] == 1]
    # the continued turn routes positions after the first turn's context (it is kept)
    assert second["step"].min() == first.done["n_past"]
    for path in (csv, route):
        assert not [f for f in validate_file(path) if f.severity == "error"]


#: Requests that each must be refused on their own (id, the line): the session serves on.
HOSTILE_REQUESTS = [
    (1, b'{"cmd": "generate", "id": 1, "prompt": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"),
    (-1, b'{"cmd": "generate", "id": ' + b"9" * 5000 + b', "prompt": "hi"}'),
    (3, b'{"cmd": "generate", "id": 3, "prompt": "hi", "n_predict": ' + b"9" * 5000 + b"}"),
    (4, b'{"cmd": "generate", "id": 4, "prompt": "a\\ud800b"}'),
    (5, b'{"cmd": "generate", "id": 5, "prompt": "' + b"x" * (5 << 20) + b'"}'),
    (6, b'{"cmd": "generate", "id": 6, "prompt": "hi", "n_predict": 99999999999}'),
    (99999999999, b'{"cmd": "generate", "id": 99999999999, "prompt": "hi"}'),
    (8, b'{"cmd": "generate", "id": 8, "prompt": {"a": [[1]]}}'),
    (-1, b"\xff\xfe not json"),
    (10, b'{"cmd": "generate", "id": 10, "prompt": "' + b"z " * 200_000 + b'"}'),  # minutes
]


def test_a_session_answers_each_hostile_request_and_serves_the_next(tiny_model, tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "bmoe", "run", "-m", str(tiny_model), "-n", "2", "-t", "1",
         "--session"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path,
    )  # fmt: skip
    good = b'{"cmd": "generate", "id": 100, "prompt": "hello", "n_predict": 2}\n'
    feed = b"".join(line + b"\n" + good for _, line in HOSTILE_REQUESTS)
    out, err = proc.communicate(feed + b'{"cmd": "close"}\n', timeout=300)
    assert proc.returncode == 0, err.decode(errors="replace")
    assert b"Traceback" not in err and b"internal error" not in err, err[-2000:]
    events = [e for e in protocol.iter_events(out.splitlines()) if e.tag in ("ERROR", "DONE")]
    got = [(e.tag, e.data["id"]) for e in events]
    want = [x for rid, _ in HOSTILE_REQUESTS for x in (("ERROR", rid), ("DONE", 100))]
    assert got == want
    errors = [e.data["msg"] for e in events if e.tag == "ERROR"]
    assert "nested deeper than 64" in errors[0] and "4300 digits" in errors[1]
    assert "lone surrogate" in errors[3] and "longer than 4 MiB" in errors[4]
    assert "from 0 to 2147483647" in errors[5] and "from -2147483648" in errors[6]
    assert '"prompt" must be a string' in errors[7]
    assert "prompt of 400,000 bytes cannot fit the 2040 positions" in errors[9]
    stderr_lines = [ln for ln in err.decode().splitlines() if ln.startswith("error: stdin:")]
    assert len(stderr_lines) == sum(1 for rid, _ in HOSTILE_REQUESTS if rid == -1)
    assert len(out.splitlines()) < 400  # no echo of the oversized line


def test_a_session_turn_generates_what_a_one_shot_run_does(tiny_model, tmp_path) -> None:
    cfg = EngineConfig(model=str(tiny_model), prompt=PROMPT, n_predict=6, threads=1)
    alone = run_engine(cfg)
    proc, client = _start(tiny_model, tmp_path)
    try:
        client.generate("warm the cache with something else", n_predict=4, timeout=120)
        turn = client.generate(PROMPT, n_predict=6, timeout=120)
        client.close()
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert protocol.to_bytes(turn.done["text"]) == alone.text


def test_cancel_ends_the_turn_and_the_session_goes_on(tiny_model, tmp_path) -> None:
    proc, client = _start(tiny_model, tmp_path, "-c", "4096")
    try:
        client.wait_ready(timeout=120)
        cut = client.generate(PROMPT, n_predict=2000, cancel_after=2, timeout=120)
        assert cut.cancelled and 2 <= cut.tokens < 2000
        after = client.generate(PROMPT, n_predict=2, timeout=120)
        assert after.tokens == 2 and not after.cancelled
        client.close()
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.slow
def test_a_session_sweep_runs_on_the_embedded_engine(tiny_model, tmp_path) -> None:
    cfg = write_config(
        tmp_path,
        f"""\
        [sweep]
        name = "emb-sess"
        engine = "embedded"
        session = true
        output = "{tmp_path / "out"}"
        timeout_s = 300

        [base]
        model = "{tiny_model}"
        n_predict = 4
        threads = 1
        moe_stream = true
        cache_mb = 2
        route_trace = true

        [grid]
        prompt = ["first prompt", "second prompt", "third prompt"]
        """,
    )
    proc = subprocess.run(
        [sys.executable, "-m", "bmoe", "sweep", str(cfg), "--plain"],
        cwd=ROOT, capture_output=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()
    root = sweep_folder(tmp_path / "out")
    lines = manifest(root)
    assert len(lines) == 3 and {r["status"] for r in lines} == {"ok"}
    assert len({r["session"] for r in lines}) == 1  # one engine process served the three
    for record in lines:
        run = read_metrics(root / record["dir"] / "run.csv")
        assert run.tokens == 4 and record["stream"]["done"]["tokens"] == 4


class _DoneProbe:
    """An output stream that counts the route-trace rows on disk whenever BMOE_DONE passes."""

    def __init__(self, route: Path):
        self.route = route
        self.rows_at_done: list[int] = []
        self.data = bytearray()

    def write(self, data: bytes) -> int:
        if b"BMOE_DONE" in data:
            self.rows_at_done.append(len(read_route_trace(self.route).rows))
        self.data += data
        return len(data)

    def flush(self) -> None:
        pass


def test_a_turns_route_rows_are_on_disk_when_it_is_done(tiny_model, tmp_path) -> None:
    import io

    from bmoe.engine.embedded.serve import serve_session

    route = tmp_path / "s.route.csv"
    requests = [
        protocol.encode_request("generate", id=1, prompt=PROMPT, n_predict=5),
        protocol.encode_request("generate", id=2, prompt=" More.", n_predict=3, clear_kv=False),
    ]
    out = _DoneProbe(route)
    cfg = EngineConfig(
        model=str(tiny_model), threads=1, moe_stream=True, cache_mb=2, route_trace=str(route)
    )
    serve_session(cfg, stdin=io.BytesIO(("\n".join(requests) + "\n").encode()), out=out)
    trace = read_route_trace(route).rows
    per_turn = trace.groupby("turn").size().tolist()
    assert len(per_turn) == 2
    assert out.rows_at_done == [per_turn[0], per_turn[0] + per_turn[1]]
