"""Where cells run: this host, a device over ``adb``, a host over ``ssh``.

A :class:`Target` knows how to run a fixed shell script with arguments on its machine, start
the engine under the pressure sampler, move files, and stop what it started. Values from the
configuration never reach a shell unquoted: locally every command is an argv list (values are
positional parameters of a fixed script); over adb and ssh, each value is quoted with
:func:`shlex.quote`, and the engine's command line travels as a pushed script file.

The interface is small on purpose: a distributed executor places the same cell code next to
a target on another host and only needs :func:`open_target` there.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from abc import ABC, abstractmethod
from pathlib import Path, PurePosixPath

from bmoe.errors import BmoeError
from bmoe.sweep.config import TargetSpec
from bmoe.sweep.gate import STATE_SCRIPT, WRAPPER_SCRIPT

#: Kills the process whose pid a pidfile holds, if it is still the engine ($2 in its cmdline).
KILL_PIDFILE_SCRIPT = r"""
f=$1; name=$2
[ -f "$f" ] || exit 0
pid=
read pid < "$f"
rm -f "$f"
case $pid in ''|*[!0-9]*) exit 0;; esac
[ -r "/proc/$pid/cmdline" ] || exit 0
if tr '\000' ' ' < "/proc/$pid/cmdline" | grep -q -F -e "$name"; then
  kill -9 "$pid" 2>/dev/null && echo "killed $pid"
fi
exit 0
"""

#: Kills every process whose name ($1, as /proc/<pid>/comm spells it) is the engine's.
KILL_NAME_SCRIPT = r"""
name=$1
for p in /proc/[0-9]*; do
  c=
  read c < "$p/comm" 2>/dev/null || continue
  if [ "$c" = "$name" ]; then
    pid=${p#/proc/}
    [ "$pid" = "$$" ] && continue
    kill -9 "$pid" 2>/dev/null && echo "killed $pid"
  fi
done
exit 0
"""

#: Stops the engine whose pid a pidfile holds: TERM, then KILL after $2 seconds.
STOP_SCRIPT = r"""
f=$1; grace=$2
[ -f "$f" ] || exit 0
pid=
read pid < "$f"
case $pid in ''|*[!0-9]*) exit 0;; esac
kill -TERM "$pid" 2>/dev/null || exit 0
i=0
while kill -0 "$pid" 2>/dev/null && [ "$i" -lt "$grace" ]; do sleep 1; i=$((i+1)); done
kill -KILL "$pid" 2>/dev/null
exit 0
"""

MKDIR_SCRIPT = 'mkdir -p "$1"'
#: Size and SHA-256 (when the target has sha256sum) of the files $2... in folder $1.
LISTING_SCRIPT = r"""
d=$1; shift
for f in "$@"; do
  [ -f "$d/$f" ] || continue
  n=$(wc -c < "$d/$f" | tr -d ' ')
  h=$(sha256sum "$d/$f" 2>/dev/null | cut -d ' ' -f 1)
  echo "$n ${h:--} $f"
done
exit 0
"""
REMOVE_SCRIPT = 'case $1 in "$2"/*) rm -rf "$1";; esac'

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class TargetError(BmoeError):
    """A target that cannot be reached or refused a transport command."""


def sh_argv(script: str, args: list[str]) -> list[str]:
    """``sh -c SCRIPT sh ARGS...``: the script sees the values as $1, $2, ... (never parsed)."""
    return ["sh", "-c", script, "sh", *args]


def wrapper_script_text(argv: list[str], pidfile: str, samples: str, workdir: str,
                        env: dict[str, str] | None = None, comment: str = "") -> str:  # fmt: skip
    """A self-contained script that runs `argv` under the sampler, every value quoted."""
    lines = ["#!/bin/sh"]
    if comment:
        lines += [f"# {line}" for line in comment.splitlines()]
    for key, value in (env or {}).items():
        if not _ENV_NAME.fullmatch(key):
            raise BmoeError(f"environment variable name {key!r} is not valid")
        lines.append(f"export {key}={shlex.quote(value)}")
    lines.append(f"cd {shlex.quote(workdir)} || exit 97")
    lines.append("set -- " + " ".join(shlex.quote(a) for a in [pidfile, samples, *argv]))
    return "\n".join(lines) + "\n" + WRAPPER_SCRIPT


class Target(ABC):
    """One place cells run, one at a time."""

    def __init__(self, spec: TargetSpec, state_dir: Path):
        self.spec = spec
        self.state_dir = state_dir  # host-side folder for this sweep's transport state

    @property
    def name(self) -> str:
        return self.spec.name

    # -- what every transport implements
    @abstractmethod
    def shell(self, script: str, args: list[str], timeout: float = 60.0,
              stdin: bytes | None = None) -> subprocess.CompletedProcess:  # fmt: skip
        """Run fixed `script` with `args` as positional parameters; bytes out."""

    @abstractmethod
    def run_dir(self, staging: Path, run_key: str) -> str:
        """The folder on the target where a run's engine writes its files."""

    @abstractmethod
    def start(self, argv: list[str], run_dir: str, staging: Path, *,
              stdin: bool = False) -> subprocess.Popen:  # fmt: skip
        """Start `argv` under the sampler in `run_dir`; stdout/stderr are pipes (bytes)."""

    @abstractmethod
    def fetch(self, run_dir: str, names: list[str], staging: Path) -> list[str]:
        """Bring the named files of `run_dir` into `staging`; returns those that existed."""

    def fetch_checked(self, run_dir: str, names: list[str],
                      staging: Path) -> tuple[list[str], list[str]]:  # fmt: skip
        """:meth:`fetch`, then each file compared with the target's copy (size, checksum);
        returns the files that arrived whole and the problems found."""
        return self.fetch(run_dir, names, staging), []

    @abstractmethod
    def pidfile(self) -> str:
        """Where the running engine's pid is kept on the target (one engine at a time)."""

    def describe(self, argv: list[str], run_dir: str) -> str:
        """The exact command, as a shell would need it typed, for ``--dry-run``."""
        return f"(cd {shlex.quote(run_dir)} && {shlex.join(argv)})"

    def engine_program(self, engine: str) -> list[str]:
        """The program part of the engine's command line on this target."""
        if engine == "embedded":
            default = sys.executable if self.spec.kind == "local" else "python3"
            python = self.spec.python or default
            return [python, "-m", "bmoe", "run"]
        return [self.spec.binary or "bmoe-cli"]

    def model_path(self, model: str, base_dir: str) -> str:
        """Where `model` (a cell's value) lives on this target."""
        spec = self.spec
        if model in spec.models:
            return spec.models[model]
        base = PurePosixPath(model).name
        if base in spec.models:
            return spec.models[base]
        if spec.model_dir:
            return str(PurePosixPath(spec.model_dir) / base)
        if spec.kind == "local":
            path = Path(model).expanduser()
            return str(path if path.is_absolute() else Path(base_dir) / path)
        return model

    def engine_marker(self, engine: str) -> str:
        """Text in the engine's command line that tells it apart (stray detection)."""
        if engine == "embedded":
            return "bmoe"
        return PurePosixPath(self.engine_program(engine)[0]).name

    # -- shared behaviour
    def read_state_text(self) -> str:
        res = self.shell(STATE_SCRIPT, [], timeout=30)
        return res.stdout.decode("utf-8", "replace")

    def kill_strays(self, engine: str) -> list[int]:
        """Kill engine processes a stopped run left behind; returns their pids."""
        mode = self.spec.kill_strays
        if mode == "off":
            return []
        if mode == "name":
            name = PurePosixPath(self.engine_program(engine)[0]).name[:15]
            res = self.shell(KILL_NAME_SCRIPT, [name], timeout=30)
        else:
            res = self.shell(KILL_PIDFILE_SCRIPT, [self.pidfile(), self.engine_marker(engine)],
                             timeout=30)  # fmt: skip
        out = res.stdout.decode("utf-8", "replace").split()
        return [int(x) for x in out if x.isdigit()]

    def stop(self, proc: subprocess.Popen, grace_s: float = 3.0) -> None:
        """Stop the running engine (TERM, then KILL) and the local client process."""
        with contextlib.suppress(TargetError, subprocess.TimeoutExpired):
            args = [self.pidfile(), str(max(1, round(grace_s)))]
            self.shell(STOP_SCRIPT, args, timeout=grace_s + 30)
        self._end_client(proc, grace_s)

    def _end_client(self, proc: subprocess.Popen, grace_s: float) -> None:
        if proc.poll() is None:
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                proc.terminate()
                try:
                    proc.wait(timeout=grace_s)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

    def prepare(self, run_dir: str) -> None:  # noqa: B027 (optional hook)
        """Create the run's folder on the target."""

    def cleanup(self, run_dir: str) -> None:  # noqa: B027 (optional hook)
        """Remove the run's folder on the target once its files are home."""

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Release transport resources (connections)."""

    def check(self) -> None:
        """Fail early (TargetError) when the target cannot be reached."""
        res = self.shell("echo ok", [], timeout=60)
        if res.returncode != 0 or b"ok" not in res.stdout:
            raise TargetError(
                f"target {self.name}: not reachable: "
                + (res.stderr.decode("utf-8", "replace").strip() or f"exit {res.returncode}")
            )


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
            root = str(Path(__file__).resolve().parent.parent.parent)
            env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        samples = str((staging / "pressure.samples").resolve())
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


class RemoteTarget(Target):
    """Shared behaviour of adb and ssh: a work folder on the far side, scripts pushed there."""

    def command(self, remote: str) -> list[str]:
        """The local argv that runs the remote shell command line `remote`."""
        raise NotImplementedError

    def shell(self, script, args, timeout=60.0, stdin=None):
        remote = shlex.join(sh_argv(script, args))
        try:
            return subprocess.run(
                self.command(remote), input=stdin, capture_output=True, timeout=timeout,
                stdin=None if stdin is not None else subprocess.DEVNULL,
            )  # fmt: skip
        except FileNotFoundError as exc:
            raise TargetError(f"target {self.name}: {exc.filename} not found") from None

    def workdir(self) -> str:
        return self.spec.workdir or "/tmp/bmoe-sweep"

    def run_dir(self, staging, run_key):
        safe = re.sub(r"[^A-Za-z0-9._=+-]+", "_", run_key)
        return str(PurePosixPath(self.workdir()) / safe)

    def pidfile(self):
        return str(PurePosixPath(self.workdir()) / f".bmoe-engine-{self.name}.pid")

    def prepare(self, run_dir):
        res = self.shell(MKDIR_SCRIPT, [run_dir], timeout=60)
        if res.returncode != 0:
            raise TargetError(
                f"target {self.name}: cannot create {run_dir}: "
                + res.stderr.decode("utf-8", "replace").strip()
            )

    def cleanup(self, run_dir):
        if not self.spec.keep_remote:
            self.shell(REMOVE_SCRIPT, [run_dir, self.workdir()], timeout=60)

    def push(self, local: Path, remote: str) -> None:
        raise NotImplementedError

    def start(self, argv, run_dir, staging, *, stdin=False):
        script = wrapper_script_text(
            argv, self.pidfile(), str(PurePosixPath(run_dir) / "pressure.samples"), run_dir,
            dict(self.spec.env), comment=f"run by bmoe sweep on target {self.name}",
        )  # fmt: skip
        local = staging / "cell.sh"
        local.write_text(script, encoding="utf-8")
        remote_script = str(PurePosixPath(run_dir) / "cell.sh")
        self.push(local, remote_script)
        try:
            return subprocess.Popen(
                self.command("sh " + shlex.quote(remote_script)),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        except FileNotFoundError as exc:
            raise TargetError(f"target {self.name}: {exc.filename} not found") from None

    def describe(self, argv, run_dir):
        return shlex.join(self.command(f"cd {shlex.quote(run_dir)} && {shlex.join(argv)}"))

    def listing(self, run_dir: str, names: list[str]) -> dict[str, tuple[int, str | None]]:
        """Size and SHA-256 (None when the target cannot tell) of the named files there."""
        res = self.shell(LISTING_SCRIPT, [run_dir, *names], timeout=300)
        out: dict[str, tuple[int, str | None]] = {}
        for line in res.stdout.decode("utf-8", "replace").splitlines():
            size, digest, name = [*line.split(" ", 2), "", ""][:3]
            if size.isdigit() and name in names:
                out[name] = (int(size), None if digest == "-" else digest)
        return out

    def fetch_checked(self, run_dir, names, staging):
        from bmoe.sweep.archive import file_digest

        there = self.listing(run_dir, names)
        fetched = self.fetch(run_dir, names, staging)
        whole, problems = [], []
        for name in fetched:
            size = (staging / name).stat().st_size
            expected, digest = there.get(name, (None, None))
            if expected is None:
                problems.append(f"{name}: no size from the target")
            elif size != expected:
                problems.append(f"{name}: {size} bytes arrived, {expected} on the target")
            elif digest is not None and file_digest(staging / name) != digest:
                problems.append(f"{name}: checksum differs from the target's copy")
            else:
                whole.append(name)
        return whole, problems


class AdbTarget(RemoteTarget):
    """An Android device: ``adb [-s SERIAL] shell``, ``push`` and ``pull``."""

    def _adb(self) -> list[str]:
        base = [self.spec.adb]
        if self.spec.serial:
            base += ["-s", self.spec.serial]
        return base

    def command(self, remote):
        return [*self._adb(), "shell", remote]

    def push(self, local, remote):
        res = subprocess.run([*self._adb(), "push", str(local), remote], capture_output=True,
                             stdin=subprocess.DEVNULL, timeout=300)  # fmt: skip
        if res.returncode != 0:
            raise TargetError(f"target {self.name}: adb push failed: "
                              + res.stderr.decode("utf-8", "replace").strip())  # fmt: skip

    def fetch(self, run_dir, names, staging):
        got = []
        for name in names:
            remote = str(PurePosixPath(run_dir) / name)
            dest = staging / name
            res = subprocess.run([*self._adb(), "pull", remote, str(dest)], capture_output=True,
                                 stdin=subprocess.DEVNULL, timeout=600)  # fmt: skip
            if res.returncode == 0 and dest.is_file():
                got.append(name)
        return got


class SshTarget(RemoteTarget):
    """A host over ssh (batch mode, one multiplexed connection per sweep)."""

    def __init__(self, spec, state_dir):
        super().__init__(spec, state_dir)
        self._control = tempfile.mkdtemp(prefix="bmoe-ssh-")

    def _ssh(self) -> list[str]:
        spec = self.spec
        base = [spec.ssh, "-p", str(spec.port), "-o", "BatchMode=yes",
                "-o", "ControlMaster=auto", "-o", f"ControlPath={self._control}/cm",
                "-o", "ControlPersist=60"]  # fmt: skip
        if spec.identity:
            base += ["-i", str(Path(spec.identity).expanduser())]
        for option in spec.ssh_options:
            base += ["-o", option]
        if spec.user:
            base += ["-l", spec.user]
        return [*base, "--", spec.host or "localhost"]

    def command(self, remote):
        return [*self._ssh(), remote]

    def push(self, local, remote):
        with open(local, "rb") as fh:
            res = subprocess.run(self.command("cat > " + shlex.quote(remote)), stdin=fh,
                                 capture_output=True, timeout=300)  # fmt: skip
        if res.returncode != 0:
            raise TargetError(f"target {self.name}: copy to {remote} failed: "
                              + res.stderr.decode("utf-8", "replace").strip())  # fmt: skip

    def fetch(self, run_dir, names, staging):
        got = []
        for name in names:
            remote = str(PurePosixPath(run_dir) / name)
            dest = staging / name
            with open(dest, "wb") as fh:
                res = subprocess.run(
                    self.command(f"test -f {shlex.quote(remote)} && cat {shlex.quote(remote)}"),
                    stdout=fh, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, timeout=600,
                )  # fmt: skip
            if res.returncode == 0:
                got.append(name)
            else:
                dest.unlink(missing_ok=True)
        return got

    def close(self):
        subprocess.run([*self._ssh()[:-2], "-O", "exit", "--", self.spec.host or "localhost"],
                       capture_output=True, stdin=subprocess.DEVNULL, timeout=30)  # fmt: skip
        shutil.rmtree(self._control, ignore_errors=True)


def open_target(spec: TargetSpec, state_dir: Path) -> Target:
    """The transport for `spec`; `state_dir` is a host-side folder for its bookkeeping."""
    kinds: dict[str, type[LocalTarget | AdbTarget | SshTarget]] = {
        "local": LocalTarget,
        "adb": AdbTarget,
        "ssh": SshTarget,
    }
    return kinds[spec.kind](spec, state_dir)


def wait_output(proc: subprocess.Popen, deadline: float) -> int | None:
    """Wait for `proc` until `deadline` (monotonic); its exit status, or None on timeout."""
    try:
        return proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return None
