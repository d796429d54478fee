"""This host as a target (``kind = "local"``): the engine runs in the run's staging folder."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bmoe.formats.archive import SAMPLES
from bmoe.sweep.checking import Checker
from bmoe.sweep.gate import WRAPPER_SCRIPT
from bmoe.sweep.targets.base import Target, TargetError, TargetKind, sh_argv
from bmoe.sweep.tomltext import KeyPath


class LocalTarget(Target):
    """This host. The engine writes straight into the run's staging folder."""

    def shell(self, script, args, timeout=60.0, stdin=None):
        try:
            return subprocess.run(
                sh_argv(script, args), input=stdin, capture_output=True, timeout=timeout,
                stdin=None if stdin is not None else subprocess.DEVNULL,
            )  # fmt: skip
        except OSError as exc:
            raise TargetError(f"target {self.name}: cannot run sh: {exc}") from None

    def run_dir(self, staging, run_key):
        return str(staging.resolve())

    def pidfile(self):
        self.state_dir.mkdir(parents=True, exist_ok=True)
        return str((self.state_dir / f"{self.name}.pid").resolve())

    def start(self, argv, run_dir, staging, *, stdin=False):
        env = {**os.environ, **self.spec.env}
        if argv[1:4] == ["-m", "bmoe", "run"]:
            # The embedded engine imports the same bmoe as this process, whatever the cwd.
            root = str(Path(__file__).resolve().parents[3])
            env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        samples = str((staging / SAMPLES).resolve())
        try:
            return subprocess.Popen(
                sh_argv(WRAPPER_SCRIPT, [self.pidfile(), samples, *argv]),
                cwd=run_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        except OSError as exc:
            raise TargetError(f"target {self.name}: cannot start: {exc}") from None

    def stop(self, proc, grace_s=3.0):
        super().stop(proc, grace_s=grace_s)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)

    def fetch(self, run_dir, names, staging):
        return [n for n in names if (staging / n).is_file()]

    def check(self):
        if shutil.which("sh") is None:
            raise TargetError(f"target {self.name}: no 'sh' on this host")


def _check(
    check: Checker, table: Mapping[str, Any], key: KeyPath, fields: dict[str, Any], engine: str
) -> None:
    if "workdir" in fields:
        raise check.fail((*key, "workdir"), "a local target writes into the sweep folder")


KIND = TargetKind(
    name="local",
    keys=(),
    check=_check,
    default_name=lambda fields: "local",
    resolved=lambda spec: {},
    transport=LocalTarget,
)
