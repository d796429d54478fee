"""The ``bmoe`` script's exit skips the interpreter's teardown (where pyarrow's thread pools
abort the process now and then), with the same output, exit code and exit handlers as a
normal exit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_RUN = """
import atexit, sys
marker = sys.argv[1]
atexit.register(lambda: open(marker, "w").write("ran"))
sys.argv = ["bmoe", *sys.argv[2:]]
from bmoe.cli import run
run()
"""

_PROBE = """
import sys
from bmoe.cli import main
code = main(sys.argv[1:])
print("pyarrow" in sys.modules, file=sys.stderr)
sys.exit(code)
"""


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100", **extra}


def test_a_run_that_loaded_pyarrow_ends_with_its_output_code_and_exit_handlers(
    corpus: Path, tmp_path: Path
) -> None:
    trace = str(corpus / "native-tiny" / "run.route.csv")
    env = _env(BMOE_KERNEL_BUILD="never", BMOE_KERNEL_DIR=str(tmp_path / "none"))
    # with no compiled CSV loop the route reader is pyarrow's: the path that aborted
    probe = subprocess.run([sys.executable, "-c", _PROBE, "info", trace], env=env,
                           capture_output=True, text=True, check=False)  # fmt: skip
    assert probe.returncode == 0 and probe.stderr.strip().endswith("True")
    marker = tmp_path / "atexit"
    done = subprocess.run([sys.executable, "-c", _RUN, str(marker), "info", trace], env=env,
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == probe.stdout and "rows" in done.stdout
    assert marker.read_text() == "ran"
    argv = [sys.executable, "-c", _RUN, str(marker), "info", trace, "--format", "nope"]
    bad = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and "nope" in bad.stderr
