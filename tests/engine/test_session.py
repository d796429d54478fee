"""The ``--session`` client against a stand-in engine that follows the protocol."""

from __future__ import annotations

import subprocess

import pytest
from sweep_helpers import install_fake_cli

from bmoe.engine.session import SessionClient, SessionError, SessionRequestError
from bmoe.formats.metrics import read_metrics


@pytest.fixture
def session(tmp_path):
    fake = install_fake_cli(tmp_path / "bin")
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x")
    lines: list[bytes] = []
    proc = subprocess.Popen(
        [str(fake), "-m", str(model), "-n", "5", "--csv", str(tmp_path / "s.csv"),
         "--fake-delay", "0.05", "--progress", "--session"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    client = SessionClient(proc.stdin, proc.stdout, on_line=lines.append)
    yield client, proc, lines, tmp_path
    client.close()
    proc.wait(timeout=10)
    if proc.poll() is None:
        proc.kill()


def test_turns_errors_and_cancel_over_one_process(session):
    client, proc, lines, tmp_path = session
    ready = client.wait_ready(timeout=30)
    assert ready["n_expert_used"] == 2
    prompt = 'a "quoted"\nprompt with \\ and \u00e9'
    first = client.generate(prompt, timeout=30)
    assert (first.id, first.tokens, first.cancelled) == (1, 5, False)
    assert first.done["n_prompt"] == len(prompt)  # the prompt arrived intact
    assert len(first.progress) == 5 and first.text == "xxxxx"
    seen = []
    second = client.generate("again", n_predict=3, on_progress=seen.append, timeout=30)
    assert second.tokens == 3 and [p["step"] for p in seen] == [1, 2, 3]
    with pytest.raises(SessionRequestError, match="prompt rejected") as info:
        client.generate("FAIL", timeout=30)
    assert info.value.request_id == 3
    cancelled = client.generate("long", n_predict=200, cancel_after=2, timeout=30)
    assert cancelled.cancelled and 2 <= cancelled.tokens < 200
    after = client.generate("still loaded", n_predict=2, timeout=30)
    assert after.tokens == 2 and not after.cancelled
    client.close()
    assert proc.wait(timeout=10) == 0
    run = read_metrics(tmp_path / "s.csv")
    assert len(run.summaries) == 4  # one per completed or cancelled turn
    assert sorted(set(run.rows["turn"].tolist())) == [0, 1, 2, 3]
    assert sum(line.startswith(b"BMOE_DONE ") for line in lines) == 4


def test_a_timeout_cancels_the_turn(session):
    client, _proc, _lines, _ = session
    turn = client.generate("slow", n_predict=1000, timeout=0.5)
    assert turn.timed_out and turn.cancelled and turn.tokens < 1000


def test_an_engine_that_exits_ends_the_session(session):
    client, proc, _lines, _ = session
    client.wait_ready(timeout=30)
    proc.kill()
    proc.wait()
    with pytest.raises(SessionError):
        client.generate("anyone?", timeout=10)
