"""A farm on a real Ray cluster of two nodes on this machine (Ray's own test cluster utility),
each advertising two targets backed by the embedded engine with a generated tiny model: an
8-run sweep lands every run on the node holding its target, and killing one node mid-sweep
loses no completed run and finishes on resume once the node is back."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from sweep_helpers import manifest, sweep_folder, write_config

ROOT = Path(__file__).resolve().parents[2]


def _missing() -> str | None:
    for module, what in (
        ("ray", "ray is not installed (the farm extra)"),
        ("llama_cpp", "llama-cpp-python is not installed (the engine extra)"),
        ("gguf", "gguf is not installed (the engine extra)"),
    ):
        if importlib.util.find_spec(module) is None:
            return what
    return None


pytestmark = [
    pytest.mark.farm,
    pytest.mark.engine,
    pytest.mark.slow,
    pytest.mark.skipif(_missing() is not None, reason=str(_missing())),
]

MB = 1 << 20
NODE = {"num_cpus": 1, "object_store_memory": 100 * MB}
A_TARGETS = {"bmoe_target_a1": 1, "bmoe_target_a2": 1}
B_TARGETS = {"bmoe_target_b1": 1, "bmoe_target_b2": 1}


@pytest.fixture(scope="module")
def farm():
    """A head node (targets a1, a2) and a second node (b1, b2), small and quiet; the workers
    import this checkout of bmoe."""
    from ray.cluster_utils import Cluster

    scratch = Path(tempfile.mkdtemp(prefix="bmoe-ray-", dir="/tmp"))  # short socket paths
    env = {
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
        "RAY_AUTH_MODE": "disabled",  # a local test cluster; no token to share
        "TMPDIR": str(scratch / "tmp"),  # the hosts' scratch folders die with the test
    }
    (scratch / "tmp" / "ray").mkdir(parents=True)  # Ray writes the cluster's address there
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    cluster = None
    try:
        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                **NODE, "include_dashboard": False, "temp_dir": str(scratch / "ray"),
                "resources": A_TARGETS,
                "_system_config": {"health_check_period_ms": 500,
                                   "health_check_failure_threshold": 3},
            },
        )  # fmt: skip
        node_b = cluster.add_node(**NODE, resources=B_TARGETS)
        cluster.wait_for_nodes()
        yield cluster, node_b, env
    finally:
        if cluster is not None:
            cluster.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(scratch, ignore_errors=True)


def _config(tmp_path: Path, model: Path, address: str, cells: str) -> Path:
    return write_config(
        tmp_path,
        f"""\
        [sweep]
        name = "farm"
        engine = "embedded"
        executor = "ray"
        address = "{address}"
        output = "{tmp_path / "out"}"
        timeout_s = 120
        retries = 1

        [base]
        model = "{model}"
        prompt = "Route these tokens."
        n_predict = 3
        threads = 1
        moe_stream = true
        {cells}
        """,
    )


# Half of the runs need a target of node a, half one of node b.
TARGETS = """
[grid]
cache_mb = [0, 1, 2, 3]
io_threads = [1, 2]

[[limit]]
where = { io_threads = 1 }
tags = ["a"]

[[limit]]
where = { io_threads = 2 }
tags = ["b"]

[[targets]]
name = "a1"
tags = ["a"]
[[targets]]
name = "a2"
tags = ["a"]
[[targets]]
name = "b1"
tags = ["b"]
[[targets]]
name = "b2"
tags = ["b"]
"""


def _sweep(cfg_or_dir: Path, env: dict, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "bmoe", "sweep", str(cfg_or_dir), "--plain", *extra],
        cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip


def test_a_target_no_host_advertises_is_refused_before_the_sweep(farm, tmp_path, tiny_model):
    cluster, _node_b, env = farm
    cfg = _config(tmp_path, tiny_model, cluster.address,
                  TARGETS + '[[targets]]\nname = "c1"\ntags = ["a"]\n')  # fmt: skip
    proc = _sweep(cfg, env)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, out + err
    assert "target c1: no host in the Ray cluster" in err
    assert "'bmoe_target_c1'" in err and "ray start" in err
    assert not manifest(sweep_folder(tmp_path / "out"))


def test_runs_land_on_their_targets_node_and_a_killed_node_loses_nothing(
    farm, tmp_path, tiny_model
):
    cluster, node_b, env = farm
    head_id = cluster.head_node.node_id
    cfg = _config(tmp_path, tiny_model, cluster.address, TARGETS)
    proc = _sweep(cfg, env)
    out = tmp_path / "out"
    deadline = time.monotonic() + 240
    root = None
    while time.monotonic() < deadline:  # wait for b to finish a run and be busy with another
        if proc.poll() is not None:
            pytest.fail(f"the sweep ended before node b was killed: {proc.communicate()}")
        if out.is_dir() and any(p.is_dir() for p in out.iterdir()):
            root = sweep_folder(out)
            done = {r["run"]: r["target"] for r in manifest(root) if r["status"] == "ok"}
            running = {f"{p.parent.name}/{p.name.split('.')[1]}"
                       for p in (root / "cells").glob("*io_threads-2*/.*.staging")}  # fmt: skip
            if any(t[0] == "b" for t in done.values()) and running - set(done):
                break
        time.sleep(0.05)
    else:
        pytest.fail("node b never finished a run while busy with another")
    assert root is not None
    cluster.remove_node(node_b, allow_graceful=False)
    first_out, first_err = proc.communicate(timeout=300)
    assert proc.returncode == 1, first_out + first_err  # b's runs are left: not complete

    before = manifest(root)
    ok_before = {r["run"]: r for r in before if r["status"] == "ok"}
    lost = [r for r in before if r["status"] == "lost"]
    assert lost, first_out + first_err
    for record in lost:
        assert record["target"] in ("b1", "b2") and record["node"] == node_b.node_id, (
            record, first_out, first_err)  # fmt: skip
    assert len(ok_before) < 8 and any(r["target"][0] == "b" for r in ok_before.values())
    assert "host " in first_out  # progress per host

    node_b2 = cluster.add_node(**NODE, resources=B_TARGETS)  # the host is back (a new node)
    cluster.wait_for_nodes()
    proc = _sweep(root, env)
    second_out, second_err = proc.communicate(timeout=300)
    assert proc.returncode == 0, second_out + second_err
    assert "8/8 runs complete" in second_out

    lines = manifest(root)
    ok = [r for r in lines if r["status"] == "ok"]
    assert sorted(r["run"] for r in ok) == sorted({r["run"] for r in lines})
    assert len(ok) == 8 == len({r["run"] for r in ok})  # every run once, none twice
    nodes = {"a1": {head_id}, "a2": {head_id}, "b1": {node_b.node_id, node_b2.node_id},
             "b2": {node_b.node_id, node_b2.node_id}}  # fmt: skip
    for record in ok:
        assert record["node"] in nodes[record["target"]], record
        wanted = "a" if record["params"]["io_threads"] == 1 else "b"
        assert record["target"][0] == wanted
        assert (root / record["dir"] / "run.csv").stat().st_size > 0
    for run_id, record in ok_before.items():  # nothing completed was lost or run again
        kept = json.loads((root / "cells" / run_id / "record.json").read_text())
        assert (kept["started"], kept["attempt"]) == (record["started"], record["attempt"])
    for record in lost:  # the lost runs finished on the node that came back
        redone = next(r for r in ok if r["run"] == record["run"])
        assert redone["node"] == node_b2.node_id and redone["attempt"] > record["attempt"]


def _unit_task_workers() -> list[int]:
    """Pids of the Ray workers running a unit now (Ray titles them after the task's name)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                title = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if title.startswith(b"ray::bmoe a"):  # "ray::bmoe <target> <run>"
                pids.append(int(proc.name))
    return pids


def test_a_killed_task_is_a_lost_attempt_retried_in_the_same_sweep(farm, tmp_path, tiny_model):
    cluster, _node_b, env = farm
    a_only = """
    [grid]
    cache_mb = [0, 1, 2, 3]
    [[targets]]
    name = "a1"
    [[targets]]
    name = "a2"
    """
    cfg = _config(tmp_path, tiny_model, cluster.address, a_only)
    proc = _sweep(cfg, env)
    out = tmp_path / "out"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the sweep ended before a task was killed: {proc.communicate()}")
        if out.is_dir() and any(p.is_dir() for p in out.iterdir()):
            root = sweep_folder(out)
            workers = _unit_task_workers()
            if workers and list((root / "cells").glob("*/.*.staging")):
                break
        time.sleep(0.05)
    else:
        pytest.fail("no unit ever ran")
    os.kill(workers[0], signal.SIGKILL)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stdout + stderr
    assert "4/4 runs complete" in stdout
    lines = manifest(root)
    [lost] = [r for r in lines if r["status"] != "ok"]
    assert lost["status"] == "lost" and "worker" in lost["error"]
    ok = [r for r in lines if r["status"] == "ok"]
    assert len(ok) == 4 == len({r["run"] for r in ok})
    redone = next(r for r in ok if r["run"] == lost["run"])
    assert redone["attempt"] == lost["attempt"] + 1
    assert {r["node"] for r in lines} == {cluster.head_node.node_id}


def test_ctrl_c_stops_the_runs_on_the_hosts_and_resume_finishes(farm, tmp_path, tiny_model):
    cluster, _node_b, env = farm
    cells = """
    [grid]
    cache_mb = [0, 1, 2, 3]
    [[targets]]
    name = "a1"
    [[targets]]
    name = "a2"
    """
    gate = "[gate]\nmin_mem_available_mb = 1e12\npoll_s = 0.2\nmax_wait_s = 120\n"
    cfg = _config(tmp_path, tiny_model, cluster.address, cells + gate)  # waits at the gate
    proc = _sweep(cfg, env)
    out = tmp_path / "out"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the sweep ended before Ctrl-C: {proc.communicate()}")
        if out.is_dir() and any(p.is_dir() for p in out.iterdir()):
            root = sweep_folder(out)
            if len(list((root / "cells").glob("*/.*.staging"))) == 2:  # both hosts' runs began
                break
        time.sleep(0.05)
    else:
        pytest.fail("the runs never started")
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 130, stdout + stderr
    assert "interrupted; resume with" in stderr
    lines = manifest(root)
    assert [r["status"] for r in lines] == ["interrupted", "interrupted"], lines
    assert {r["target"] for r in lines} == {"a1", "a2"}
    assert all(r["node"] == cluster.head_node.node_id for r in lines)
    assert all("stopped before the engine started" in r["error"] for r in lines)
    assert not list((root / "cells").glob("*/.*.staging"))  # every attempt archived whole

    cfg.write_text(cfg.read_text().replace(gate, ""))  # no gate this time
    proc = _sweep(cfg, env, "--resume")
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stdout + stderr
    ok = [r for r in manifest(root) if r["status"] == "ok"]
    assert len(ok) == 4 == len({r["run"] for r in ok})
