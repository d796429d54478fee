"""What every kind of target shares: its specification (:class:`TargetSpec`), the transport
interface (:class:`Target`, and :class:`RemoteTarget` for a machine reached by a command), the
fixed shell scripts they run, and what a kind brings to the registry (:class:`TargetKind`).

Values from the configuration never reach a shell unquoted: locally every command is an argv
list (values are positional parameters of a fixed script); over adb and ssh, each value is
quoted with :func:`shlex.quote`, and the engine's command line travels as a pushed script file.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import subprocess
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from bmoe.errors import BmoeError
from bmoe.formats.archive import SAMPLES
from bmoe.sweep.checking import Checker
from bmoe.sweep.gate import STATE_SCRIPT, WRAPPER_SCRIPT
from bmoe.sweep.shelltext import shell_join, shell_quote
from bmoe.sweep.tomltext import KeyPath

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


#: The custom resource a farm host advertises for each target it can reach, by default.
RESOURCE_PREFIX = "bmoe_target_"


@dataclass(frozen=True)
class TargetSpec:
    """Where cells run. ``local`` is this host; ``adb`` a device over adb; ``ssh`` a host."""

    name: str
    kind: str = "local"
    tags: frozenset[str] = frozenset()
    workdir: str | None = None
    binary: str | None = None
    python: str | None = None
    model_dir: str | None = None
    models: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    kill_strays: str = "pidfile"
    keep_remote: bool = False
    # adb
    serial: str | None = None
    adb: str = "adb"
    # ssh
    host: str | None = None
    user: str | None = None
    port: int = 22
    identity: str | None = None
    ssh: str = "ssh"
    ssh_options: tuple[str, ...] = ()
    # a farm (executor "ray"): the custom resource its host advertises
    resource: str | None = None

    def can_run(self, tags: frozenset[str]) -> bool:
        return tags <= self.tags

    @property
    def ray_resource(self) -> str:
        """The Ray resource the host that reaches this target advertises (one unit)."""
        return self.resource or f"{RESOURCE_PREFIX}{self.name}"


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
        return f"(cd {shell_quote(run_dir)} && {shell_join(argv)})"

    def engine_program(self, engine: str) -> list[str]:
        """The program part of the engine's command line on this target: the native engine is
        the target's ``binary``, else (on this machine) ``$BMOE_NATIVE_CLI``, else ``bmoe-cli``
        on PATH."""
        if engine == "embedded":
            default = sys.executable if self.spec.kind == "local" else "python3"
            python = self.spec.python or default
            return [python, "-m", "bmoe", "run"]
        here = os.environ.get("BMOE_NATIVE_CLI") if self.spec.kind == "local" else None
        return [self.spec.binary or here or "bmoe-cli"]

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
            argv, self.pidfile(), str(PurePosixPath(run_dir) / SAMPLES), run_dir,
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
        # the far side's sh reads the inner line (plain quoting); the local shell the outer
        return shell_join(self.command(f"cd {shlex.quote(run_dir)} && {shlex.join(argv)}"))

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


def wait_output(proc: subprocess.Popen, deadline: float) -> int | None:
    """Wait for `proc` until `deadline` (monotonic); its exit status, or None on timeout."""
    try:
        return proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return None


#: Checks a kind's own keys of one ``[[targets]]`` table: (checker, table, its key, the
#: TargetSpec fields found so far (filled in place, with the kind's defaults), the engine).
KindCheck = Callable[[Checker, Mapping[str, Any], KeyPath, dict[str, Any], str], None]


@dataclass(frozen=True)
class TargetKind:
    """What one kind of target brings to the registry (:data:`bmoe.sweep.targets.KINDS`): its
    own configuration keys and their checks, its default name, its own fields in the resolved
    configuration, and its transport."""

    name: str
    #: Its own keys of a ``[[targets]]`` table, besides those every kind has.
    keys: tuple[str, ...]
    check: KindCheck
    #: The target's name when the table gives none (from the fields checked).
    default_name: Callable[[Mapping[str, Any]], str]
    #: Its own fields of the resolved configuration (``sweep.toml`` in the sweep folder).
    resolved: Callable[[TargetSpec], dict[str, Any]]
    transport: type[Target]
    #: Why the embedded engine cannot run on it (None: it can).
    no_embedded: str | None = None
