"""Where the tests and benchmarks find a native ``bmoe-cli`` build (the one way they do).

``$BMOE_NATIVE_CLI`` when it is set (set and empty: there is none, look no further), else
the binary ``../shared/native/build.sh`` reports (beside the repository root: it builds the
engine from source the first time, about 10 minutes, then prints the cached binary's path at
once; ``.ci/run`` calls it before the tests). A user's ``bmoe sweep`` never looks here: it
finds its engine through the target's ``binary``, ``$BMOE_NATIVE_CLI`` or ``bmoe-cli`` on PATH.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = ROOT.parent / "shared" / "native" / "build.sh"
#: How long a test session waits for build.sh (a cached build answers at once; a first build
#: takes about 10 minutes and belongs to .ci/run or to a shell, not to a test).
BUILD_WAIT_S = float(os.environ.get("BMOE_NATIVE_BUILD_WAIT_S", "60"))


@functools.cache
def find_native() -> tuple[Path | None, str]:
    """(the native ``bmoe-cli``, how it was found) or (None, why there is none)."""
    env = os.environ.get("BMOE_NATIVE_CLI")
    if env is not None:
        if not env:
            return None, "BMOE_NATIVE_CLI is set and empty (no native build)"
        path = Path(env)
        if path.is_file() and os.access(path, os.X_OK):
            return path, f"BMOE_NATIVE_CLI={env}"
        return None, f"BMOE_NATIVE_CLI={env} is not an executable file"
    if not BUILD_SCRIPT.is_file():
        return None, f"BMOE_NATIVE_CLI is not set and {BUILD_SCRIPT} does not exist"
    proc = subprocess.Popen(
        ["bash", str(BUILD_SCRIPT)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=BUILD_WAIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.communicate()
        return None, (
            f"BMOE_NATIVE_CLI is not set and bash {BUILD_SCRIPT} did not report a build within "
            f"{BUILD_WAIT_S:.0f} s (the first build takes about 10 minutes: run it once)"
        )
    lines = out.decode(errors="replace").split()
    if proc.returncode or not lines:
        tail = err.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        return None, f"bash {BUILD_SCRIPT} failed (status {proc.returncode}): {tail[0]}"
    path = Path(lines[-1])
    if not (path.is_file() and os.access(path, os.X_OK)):
        return None, f"bash {BUILD_SCRIPT} reported {path}, which is not an executable file"
    return path, f"bash {BUILD_SCRIPT}"


def native_cli_or_skip() -> Path:
    """The native ``bmoe-cli``, or skip the test naming both places looked at."""
    path, how = find_native()
    if path is None:
        import pytest

        pytest.skip(f"no native bmoe-cli: {how} (set BMOE_NATIVE_CLI or build ../shared/native)")
    return path
