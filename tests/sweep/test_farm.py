"""The farm's pieces that need no Ray cluster: its configuration keys, the single-host runner
never importing Ray, and a unit run "on another host" (in this process) shipped home as
messages and archived by the driver side exactly as a local run would be."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from sweep_helpers import install_fake_cli, manifest, write_config

from bmoe.errors import BmoeError
from bmoe.formats.metrics import read_metrics
from bmoe.sweep.archive import ArchiveWriter
from bmoe.sweep.attempt import NullSink
from bmoe.sweep.config import ConfigError, load_config, parse_config, resolved_toml
from bmoe.sweep.plan import make_plan
from bmoe.sweep.shipping import Delivery, Receiver, run_unit_away
from bmoe.sweep.units import run_unit

ROOT = Path(__file__).resolve().parents[2]

BASE = """\
[sweep]
name = "t"
executor = "ray"

[base]
model = "m.gguf"
"""


def line_with(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


@pytest.mark.parametrize(
    ("text", "needle", "key", "says"),
    [
        ('[sweep]\nname = "t"\nexecutor = "dask"\n', 'executor = "dask"', "sweep.executor",
         "must be one of local, ray"),
        ('[sweep]\nname = "t"\naddress = "auto"\n', 'address = "auto"', "sweep.address",
         'only applies to executor = "ray"'),
        ('[sweep]\nname = "t"\nexecutor = "ray"\naddress = 6379\n', "address = 6379",
         "sweep.address", "expected a string"),
        ('[sweep]\nname = "t"\n[base]\nmodel = "m"\n[[targets]]\nname = "a"\nresource = "r"\n',
         'resource = "r"', "targets[0].resource", 'only applies to executor = "ray"'),
        (BASE + '[[targets]]\nname = "a"\nresource = "CPU"\n', 'resource = "CPU"',
         "targets[0].resource", "Ray's own"),
        (BASE + '[[targets]]\nname = "a"\nresource = "has space"\n', 'resource = "has space"',
         "targets[0].resource", "use letters"),
        (BASE + '[[targets]]\nname = "a"\n[[targets]]\nname = "b"\nresource = "bmoe_target_a"\n',
         'resource = "bmoe_target_a"', "targets[1].resource", "both use the Ray resource"),
    ],
)  # fmt: skip
def test_farm_keys_are_checked_with_key_and_line(text, needle, key, says):
    with pytest.raises(ConfigError) as info:
        make_plan(parse_config(text, "farm.toml", base_dir="/"))
    err = info.value
    assert (err.key, err.line) == (key, line_with(text, needle))
    assert says in err.problem
    assert str(err).startswith(f"farm.toml:{err.line}: {key}: ")


def test_farm_settings_and_resources_round_trip():
    text = BASE + (
        '[[targets]]\nname = "phone-1"\nkind = "adb"\nserial = "S1"\nbinary = "/b"\n'
        '[[targets]]\nname = "box"\nresource = "lab_box_usb3"\n'
    )
    config = parse_config(text, "farm.toml", base_dir="/")
    assert (config.settings.executor, config.settings.address) == ("ray", "auto")
    assert [t.ray_resource for t in config.targets] == ["bmoe_target_phone-1", "lab_box_usb3"]
    again = parse_config(resolved_toml(config), "again.toml", base_dir="/")
    assert again.settings == config.settings and again.targets == config.targets
    local = parse_config('[sweep]\nname = "t"\n[base]\nmodel = "m"\n', "l.toml", base_dir="/")
    assert local.settings.executor == "local" and local.settings.address is None
    assert "executor" not in tomllib.loads(resolved_toml(local))["sweep"]
    addressed = parse_config(BASE.replace('"ray"\n', '"ray"\naddress = "10.0.0.2:6379"\n'))
    assert addressed.settings.address == "10.0.0.2:6379"


def test_the_ray_executor_without_ray_is_a_located_error(monkeypatch):
    from bmoe.sweep.runner import executor_for

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails as if not installed
    monkeypatch.delitem(sys.modules, "bmoe.sweep.farm", raising=False)
    with pytest.raises(ConfigError) as info:
        executor_for(parse_config(BASE, "farm.toml"))
    assert (info.value.key, info.value.line) == ("sweep.executor", 3)
    assert "pip install 'bmoe[farm]'" in str(info.value)


def test_a_local_sweep_never_imports_ray(tmp_path):
    fake = install_fake_cli(tmp_path / "bin")
    (tmp_path / "m.gguf").write_bytes(b"x")
    cfg = write_config(
        tmp_path,
        f"""\
        [sweep]
        name = "noray"
        output = "{tmp_path / "out"}"
        [base]
        model = "m.gguf"
        n_predict = 3
        [grid]
        cache_mb = [0, 8]
        [[targets]]
        name = "here"
        binary = "{fake}"
        """,
    )
    script = (
        "import sys\n"
        "from bmoe.cli import main\n"
        f"sys.argv = ['bmoe', 'sweep', {str(cfg)!r}, '--plain']\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as exc:\n"
        "    assert not exc.code, exc.code\n"
        "print('RAY_LOADED', 'ray' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "RAY_LOADED False" in proc.stdout
    root = next((tmp_path / "out").iterdir())
    assert [r["status"] for r in manifest(root)] == ["ok", "ok"]


def _native_sweep(tmp_path: Path, grid: str, extra: str = "") -> Path:
    fake = install_fake_cli(tmp_path / "bin")
    (tmp_path / "m.gguf").write_bytes(b"x")
    return write_config(
        tmp_path,
        f"""\
        [sweep]
        name = "away"
        executor = "ray"
        retries = 1
        timeout_s = 60
        output = "{tmp_path / "out"}"
        {extra}
        [base]
        model = "m.gguf"
        n_predict = 5
        route_trace = true
        fake_state = "{tmp_path}"
        [grid]
        {grid}
        [[targets]]
        name = "far"
        binary = "{fake}"
        """,
    )


def _ship(config, plan, archive: ArchiveWriter, unit, floors=None, **kw) -> list[dict]:
    """Run `unit` as a farm host would and archive its messages as the driver does."""
    spec = config.targets[0]
    delivery = Delivery(unit, spec)
    receiver = Receiver(archive, config, NullSink())
    records = []
    floors = floors or {run.id: archive.next_attempt(run.id) for run in unit.runs}
    messages = run_unit_away(unit, spec, config, archive.root.name, floors, lambda: False,
                             node="node-42", chunk_bytes=40, state_dir=archive.root.parent / "st",
                             run_unit=run_unit, **kw)  # fmt: skip
    kinds = []
    for message in messages:
        kinds.append(message["kind"])
        records += receiver.receive(delivery, message)
    assert kinds[0] == "hello"
    return records


def test_a_unit_run_away_is_archived_as_if_it_ran_here(tmp_path):
    cfg = _native_sweep(tmp_path, 'fake_mode = ["crash-once", "ok"]')
    config = load_config(cfg)
    plan = make_plan(config)
    archive = ArchiveWriter.create(tmp_path / "out", "away", resolved_toml(config))
    records = []
    for unit in plan.units:
        records += _ship(config, plan, archive, unit)
    statuses = [(r["params"]["fake_mode"], r["attempt"], r["status"]) for r in records]
    assert statuses == [("crash-once", 1, "crashed"), ("crash-once", 2, "ok"), ("ok", 1, "ok")]
    assert manifest(archive.root) == records
    for record in records:
        assert record["node"] == "node-42" and record["host"]
        assert (archive.root / record["dir"] / "record.json").is_file()
    for run in plan.runs:
        ok, why = archive.validate_run(run.id)
        assert ok, why
        folder = archive.run_final(run.id)
        run_csv = read_metrics(folder / "run.csv")
        assert run_csv.tokens == 5 and not run_csv.partial
        listed = json.loads((folder / "record.json").read_text())["files"]
        assert {"run.csv", "run.route.csv", "run.out", "run.err", "run.log"} <= set(listed)
    # Attempt numbers continue the driver's: a run sent again starts after its last attempt.
    again = _ship(config, plan, archive, plan.units[1], floors={plan.units[1].runs[0].id: 2})
    assert [r["attempt"] for r in again] == [2]


def test_a_lost_host_leaves_a_lost_attempt_and_its_run_to_do(tmp_path):
    cfg = _native_sweep(tmp_path, "cache_mb = [0, 8]")
    config = load_config(cfg)
    plan = make_plan(config)
    archive = ArchiveWriter.create(tmp_path / "out", "away", resolved_toml(config))
    unit = plan.units[0]
    run = unit.runs[0]
    delivery = Delivery(unit, config.targets[0])
    receiver = Receiver(archive, config, NullSink())
    receiver.receive(delivery, {"kind": "hello", "host": "lab-3", "node": "n3"})
    receiver.receive(delivery, {"kind": "started", "run": run.id, "attempt": 1})
    piece = {"kind": "file", "run": run.id, "attempt": 1, "name": "run.csv", "offset": 0,
             "data": b"# bmoe_metrics v2\n"}  # fmt: skip
    receiver.receive(delivery, piece)
    with pytest.raises(BmoeError, match="bad name"):
        receiver.receive(delivery, {**piece, "name": "../escape"})
    [record] = receiver.fail(delivery, "lost", "NodeDiedError: the node died")
    assert (record["status"], record["host"], record["node"]) == ("lost", "lab-3", "n3")
    folder = archive.root / record["dir"]
    assert folder.name == "r1.a1.lost"
    assert (folder / "run.csv").read_bytes() == b"# bmoe_metrics v2\n"
    assert "NodeDiedError" in (folder / "run.log").read_text()
    assert delivery.to_retry() == [run]
    assert not archive.validate_run(run.id)[0]
    assert archive.next_attempt(run.id) == 2
    assert not list((archive.root / "cells").glob("*/.*.staging"))


def test_a_session_run_away_brings_its_session_folder(tmp_path):
    fake = install_fake_cli(tmp_path / "bin")
    (tmp_path / "m.gguf").write_bytes(b"x")
    cfg = write_config(
        tmp_path,
        f"""\
        [sweep]
        name = "sess"
        executor = "ray"
        session = true
        timeout_s = 60
        output = "{tmp_path / "out"}"
        [base]
        model = "m.gguf"
        n_predict = 4
        [grid]
        prompt = ["first", "second"]
        [[targets]]
        name = "far"
        binary = "{fake}"
        """,
    )
    config = load_config(cfg)
    plan = make_plan(config)
    archive = ArchiveWriter.create(tmp_path / "out", "sess", resolved_toml(config))
    [unit] = plan.units
    records = _ship(config, plan, archive, unit)
    assert [r["status"] for r in records] == ["ok", "ok"]
    session = archive.root / records[0]["session"]
    assert session.is_dir() and (session / "session.out").stat().st_size > 0
    assert json.loads((session / "runs.json").read_text()) == [r.id for r in unit.runs]
    for run in unit.runs:
        assert archive.validate_run(run.id)[0]
    # A second session of the same runs takes the next number, never the first one's folder.
    sessions_taken = [p.name for p in (archive.root / "sessions").iterdir()]
    more = _ship(config, plan, archive, unit, sessions_taken=sessions_taken)
    assert more[0]["session"] != records[0]["session"] and session.is_dir()


def test_a_run_that_fails_the_same_way_on_a_host_stops_the_sweep_at_the_driver(tmp_path):
    cfg = _native_sweep(tmp_path, 'fake_mode = ["crash", "ok"]')
    config = load_config(cfg)
    plan = make_plan(config)
    archive = ArchiveWriter.create(tmp_path / "out", "away", resolved_toml(config))
    unit = plan.units[0]
    assert unit.runs[0].cell.params["fake_mode"] == "crash"
    delivery = Delivery(unit, config.targets[0])
    receiver = Receiver(archive, config, NullSink())
    floors = {run.id: 1 for run in unit.runs}
    records = []
    spec, name = config.targets[0], archive.root.name
    messages = run_unit_away(unit, spec, config, name, floors, lambda: False,
                             state_dir=tmp_path / "st", keep_going=False,
                             run_unit=run_unit)  # fmt: skip
    for message in messages:
        records += receiver.receive(delivery, message)
    assert [r["status"] for r in records] == ["crashed", "crashed"]  # both archived first
    assert "every attempt (2) failed the same way: crashed" in receiver.cell_failed
    # Keeping going (the default on a host), the same unit just ends with its failures.
    receiver = Receiver(archive, config, NullSink())
    floors = {run.id: 3 for run in unit.runs}
    for message in run_unit_away(unit, config.targets[0], config, archive.root.name, floors,
                                 lambda: False, state_dir=tmp_path / "st",
                                 run_unit=run_unit):  # fmt: skip
        receiver.receive(Delivery(unit, config.targets[0]), message)
    assert receiver.cell_failed is None
