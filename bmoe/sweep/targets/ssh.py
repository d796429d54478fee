"""A host over ssh as a target (``kind = "ssh"``)."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from bmoe.sweep.checking import Checker
from bmoe.sweep.targets.base import RemoteTarget, TargetError, TargetKind, TargetSpec
from bmoe.sweep.tomltext import KeyPath


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


def _check(
    check: Checker, table: Mapping[str, Any], key: KeyPath, fields: dict[str, Any], engine: str
) -> None:
    if "host" not in table:
        raise check.fail(key, "an ssh target needs 'host'")
    fields["host"] = check.string(table["host"], (*key, "host"))
    if "port" in table:
        fields["port"] = check.integer(table["port"], (*key, "port"), minimum=1)
    if "ssh" in table:
        fields["ssh"] = check.string(table["ssh"], (*key, "ssh"))
    if "ssh_options" in table:
        options = check.strings(table["ssh_options"], (*key, "ssh_options"))
        fields["ssh_options"] = tuple(options)
    fields.setdefault("workdir", "/tmp/bmoe-sweep")
    if "binary" not in fields and engine == "native":
        raise check.fail(key, "an ssh target needs 'binary' (bmoe-cli on that host)")


def _resolved(spec: TargetSpec) -> dict[str, Any]:
    item: dict[str, Any] = {"host": spec.host, "port": spec.port, "ssh": spec.ssh}
    if spec.ssh_options:
        item["ssh_options"] = list(spec.ssh_options)
    return item


KIND = TargetKind(
    name="ssh",
    keys=("host", "user", "port", "identity", "ssh", "ssh_options"),
    check=_check,
    default_name=lambda fields: f"ssh-{fields.get('host')}",
    resolved=_resolved,
    transport=SshTarget,
)
