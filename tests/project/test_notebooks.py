"""The post-mortem notebooks run top to bottom in a fresh kernel of this interpreter."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
KERNEL = "bmoe-test-python3"


@pytest.fixture(scope="module")
def kernel_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A kernelspec that starts this very interpreter (whatever ``python3`` kernels the
    machine has installed), with this checkout first on its path."""
    pytest.importorskip("ipykernel", reason="the test extra (ipykernel) is not installed")
    folder = tmp_path_factory.mktemp("kernels") / KERNEL
    folder.mkdir()
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "bmoe tests",
        "language": "python",
        "env": {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])},
    }
    (folder / "kernel.json").write_text(json.dumps(spec))
    return folder.parent


def test_the_notebooks_kernel_exists():
    """The notebooks name the ``python3`` kernel, which ipykernel provides in any venv."""
    pytest.importorskip("ipykernel", reason="the test extra (ipykernel) is not installed")
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec("python3")
    assert spec.language == "python"


def _kinds(cell) -> set[str]:
    """What a code cell showed: text (printed or a value) and/or a figure."""
    kinds = set()
    for out in cell.get("outputs", []):
        data = out.get("data", {})
        if "image/png" in data:
            kinds.add("figure")
        elif out.get("output_type") == "stream" and out.get("name") == "stderr":
            continue  # warnings: their wording is not the notebook's
        elif out.get("text") or data:
            kinds.add("text")
    return kinds


def test_every_notebook_is_committed_with_its_outputs():
    """Each notebook is committed as it ran on bench-data/, top to bottom in one kernel, so
    it reads (on GitHub, or opened without running) with its tables and figures: every code
    cell ran, in order, none failed, and no output names the machine it ran on."""
    assert [p.name for p in NOTEBOOKS] == [
        "decode-postmortem.ipynb",
        "predict.ipynb",
        "route-postmortem.ipynb",
        "sweep-postmortem.ipynb",
    ]
    for path in NOTEBOOKS:
        nb = json.loads(path.read_text(encoding="utf-8"))
        assert nb["metadata"]["kernelspec"]["name"] == "python3", path.name
        code = [c for c in nb["cells"] if c["cell_type"] == "code"]
        assert [c["execution_count"] for c in code] == list(range(1, len(code) + 1)), path.name
        outputs = [o for c in code for o in c["outputs"]]
        assert not [o for o in outputs if o["output_type"] == "error"], path.name
        assert any("image/png" in o.get("data", {}) for o in outputs), path.name
        text = json.dumps([o for o in outputs if "image/png" not in o.get("data", {})])
        for machine in ("/home/", "/work/", "/tmp/", "/Users/", "/root/"):
            assert machine not in text, (path.name, machine)


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_top_to_bottom(path: Path, kernel_dir: Path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    nb = nbformat.read(path, as_version=4)
    manager = KernelManager(
        kernel_name=KERNEL, kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernel_dir)])
    )
    client = nbclient.NotebookClient(
        nb, km=manager, timeout=180, resources={"metadata": {"path": str(path.parent)}}
    )
    client.execute()  # raises CellExecutionError naming the cell on any error
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert images, f"{path.name} drew no figure"
    # the committed outputs are this run's: each cell shows the same kinds of output (re-run
    # with: jupyter execute --inplace notebooks/*.ipynb)
    committed = json.loads(path.read_text(encoding="utf-8"))
    fresh = [_kinds(c) for c in nb.cells if c.cell_type == "code"]
    assert [_kinds(c) for c in committed["cells"] if c["cell_type"] == "code"] == fresh
