"""`bmoe info`, `bmoe validate`, `bmoe convert` through the command line entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bmoe.cli import main


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_info_on_every_kind(corpus: Path, capsys) -> None:
    files = [
        "native-tiny/run.csv",
        "native-tiny/run.route.csv",
        "native-tiny/ct.compute.csv",
        "native-tiny/run.io.csv",
        "native-tiny/sess.out",
        "route-trace/gemma.log",
        "metrics/2026-07-12/qwen_mmap.metrics",
        "route-trace/gemma.state",
    ]
    code, out, err = run(capsys, "info", "--format", "json", *(str(corpus / f) for f in files))
    assert code == 0 and err == ""
    docs = [json.loads(chunk) for chunk in out.replace("}\n{", "}\n\x00{").split("\x00")]
    formats = [d["file"]["format"] for d in docs]
    assert formats == [
        "bmoe_metrics", "route_trace", "compute_trace", "io_trace", "bmoe protocol stream",
        "run log", "pressure sidecar", "device state",
    ]  # fmt: skip
    session = docs[4]
    assert session["file"]["generations"] == 2 and session["file"]["errors"] == 1
    assert [g["tokens"] for g in session["generations"]] == [8, 6]
    assert session["errors"][0]["fatal"] is False
    assert docs[5]["end_of_run"]["tok/s"] == 4.971
    assert docs[6]["pressure"]["peak_rss_kb"] == 6152604
    state = {row["figure"]: row for row in docs[7]["state"]}
    assert state["mem_available_kb"]["before"] == 6794156


def test_info_partial_run(corpus: Path, tmp_path: Path, capsys) -> None:
    path = corpus / "metrics/2026-07-21-pinned-dense-ab/bmoe-20260721-103724.csv"
    code, out, _ = run(capsys, "info", "-f", "json", str(path))
    head = json.loads(out)["file"]  # ended by the model at 1354 of 2048 steps: finished
    assert code == 0 and (head["rows"], head["steps"], head["partial"]) == (1354, 2048, False)
    text = path.read_text()
    killed = tmp_path / "killed.csv"
    killed.write_text(text[: text.index("# summary")])
    code, out, _ = run(capsys, "info", "-f", "json", str(killed))
    head = json.loads(out)["file"]
    assert code == 0 and (head["rows"], head["steps"], head["partial"]) == (1354, 2048, True)


def test_validate_exit_codes(corpus: Path, tmp_path: Path, capsys) -> None:
    code, out, _ = run(capsys, "validate", str(corpus / "native-tiny/run.csv"))
    assert code == 0 and out.strip().endswith("run.csv: ok")
    ended = corpus / "metrics/2026-07-21-pinned-dense-ab/bmoe-20260721-103724.csv"
    text = ended.read_text()
    partial = tmp_path / "killed.csv"
    partial.write_text(text[: text.index("# summary")])
    code, out, _ = run(capsys, "validate", str(partial))
    assert code == 1 and "warning: no '# summary' trailer" in out
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    code, out, err = run(capsys, "validate", str(partial), str(empty))
    assert code == 2 and "empty.csv: file is empty" in err and "Traceback" not in err
    code, out, _ = run(capsys, "validate", "-f", "csv", str(partial))
    assert code == 1 and out.splitlines()[1] == "file,line,severity,message"


def test_convert_and_back(corpus: Path, tmp_path: Path, capsys) -> None:
    src = corpus / "native-tiny/sess.csv"
    code, _, _ = run(capsys, "convert", str(src), "--to", "parquet", "-o", str(tmp_path))
    assert code == 0 and (tmp_path / "sess.parquet").is_file()
    code, _, _ = run(capsys, "convert", str(tmp_path / "sess.parquet"), "--to", "csv")
    assert code == 0 and (tmp_path / "sess.csv").read_bytes() == src.read_bytes()
    code, _, err = run(capsys, "convert", str(src), "--to", "xlsx")
    assert code == 2 and "cannot convert to 'xlsx'" in err


BAD_INPUTS = {
    "empty.csv": b"",
    "garbage.bin": bytes(range(256)) * 8,
    "headerless.csv": b"1,2,3\n4,5,6\n",
    "fields.route.csv": b"# route_trace v1\nturn,phase,step,layer,slot,expert\n0,1,2,3,4\n",
    "text.csv": b"step,steps,wall_ms\n1,2,fast\n2,2,1.0\n",
    "cut.csv": b"step,steps,wall_ms\n1,2,1.0\n2,2,1.",
    "cutsum.csv": b"step,steps,wall_ms\n1,2,1.0\n2,2,1.0\n# summary tokens=2 tok/s=3.",
    "crlf.csv": b"step,steps,wall_ms\r\n1,2,1.0\r\n2,2,2.0\r\n",
    "bom.csv": b"\xef\xbb\xbfstep,steps,wall_ms\n1,2,1.0\n",
    "cut.out": b'BMOE_BEGIN {"id":1}\nBMOE_LOAD {"mb":1.20,"ms":2.8}\nBMOE_PROGRESS {"st',
    "bad.parquet": b"PAR1\x00\x01\x02",
}  # fmt: skip


@pytest.mark.parametrize("command", ["info", "validate", "convert"])
def test_bad_input_never_shows_a_traceback(tmp_path: Path, capsys, command: str) -> None:
    paths = []
    for name, data in BAD_INPUTS.items():
        (tmp_path / name).write_bytes(data)
        paths.append(str(tmp_path / name))
    extra = ["-o", str(tmp_path / "out")] if command == "convert" else []
    for path in paths:
        code, out, err = run(capsys, command, path, *extra)
        assert "Traceback" not in out + err and "internal error" not in err, (path, err)
        assert code in (0, 1, 2)
        if code == 2:
            errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
            assert len(errors) == 1 and Path(path).name in errors[0]
