"""Remote targets: adb against a stand-in ``adb`` that executes on a local folder, ssh against
a real ``sshd`` on 127.0.0.1 started by the test. Prompts with quotes, newlines and shell
metacharacters must reach the engine intact; files come home; nothing is left behind."""

from __future__ import annotations

import getpass
import json
import os
import secrets
import shutil
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sweep_helpers import STAND_INS, install_fake_cli, manifest, write_config

from bmoe.formats.metrics import read_metrics
from bmoe.sweep.archive import ArchiveWriter
from bmoe.sweep.config import load_config, resolved_toml
from bmoe.sweep.plan import make_plan
from bmoe.sweep.runner import run_sweep

PROMPT = 'it\'s "quoted" $(echo no) `id` $HOME; a|b & c\nsecond line\\'


def _run(path: Path, **options) -> Path:
    config = load_config(path)
    archive = ArchiveWriter.create(
        Path(config.settings.output), config.settings.name, resolved_toml(config)
    )
    run_sweep(config, make_plan(config), archive, **options)
    return archive.root


def _fake_argv(folder: Path) -> list[str]:
    for line in (folder / "run.err").read_text().splitlines():
        if line.startswith("FAKE_ARGV "):
            return json.loads(line[len("FAKE_ARGV ") :])
    raise AssertionError("the engine did not report its argv")


def _check_runs(root: Path, n: int, model_on_target: str) -> list[dict]:
    lines = manifest(root)
    assert [r["status"] for r in lines] == ["ok"] * n, [r.get("error") for r in lines]
    for record in lines:
        folder = root / record["dir"]
        run = read_metrics(folder / "run.csv")
        assert not run.partial and run.tokens == 4
        assert (folder / "run.io.csv").is_file()
        argv = _fake_argv(folder)
        assert argv[argv.index("-p") + 1] == PROMPT
        assert argv[argv.index("-m") + 1] == model_on_target
        assert "mem_avail_floor_kb" in (folder / "run.metrics").read_text()
        assert (folder / "cell.sh").is_file()
    return lines


def test_adb_target_through_a_stand_in_adb(tmp_path, monkeypatch):
    device = tmp_path / "device"
    (device / "models").mkdir(parents=True)
    (device / "models" / "tiny.gguf").write_bytes(b"model on the device")
    # A name no other process on this machine has: killing strays by name kills every
    # process of that name.
    fake = install_fake_cli(device / "bin", name=f"eng-{secrets.token_hex(5)}")
    adb = tmp_path / "adb"
    adb.write_text(f"#!{sys.executable}\n" + (STAND_INS / "adb.py").read_text())
    adb.chmod(adb.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "adb.log"
    monkeypatch.setenv("FAKE_ADB_LOG", str(log))
    monkeypatch.setenv("FAKE_ADB_SERIAL", "FAKE123")
    # A stray engine left over from an earlier run: the target must kill it first.
    stray_argv = [str(fake), "-m", str(device / "models" / "tiny.gguf"), "--session"]
    stray = subprocess.Popen(stray_argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    cfg = write_config(
        tmp_path,
        f"""\
        [sweep]
        name = "adb"
        output = "{tmp_path / "out"}"
        timeout_s = 60

        [base]
        model = "tiny.gguf"
        prompt = {json.dumps(PROMPT)}
        n_predict = 4
        io_trace = true

        [grid]
        cache_mb = [0, 8]

        [[targets]]
        name = "phone"
        kind = "adb"
        adb = "{adb}"
        serial = "FAKE123"
        workdir = "{device / "work"}"
        binary = "{fake}"
        model_dir = "{device / "models"}"
        kill_strays = "name"
        """,
    )
    try:
        root = _run(cfg)
        assert stray.wait(timeout=10) == -9
    finally:
        if stray.poll() is None:
            stray.kill()
    lines = _check_runs(root, 2, str(device / "models" / "tiny.gguf"))
    assert lines[0]["strays_killed"] == [stray.pid]
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert all(c[:2] == ["-s", "FAKE123"] for c in calls)
    assert {c[2] for c in calls} == {"shell", "push", "pull"}
    # Every run folder on the device was removed once its files were home.
    assert [p.name for p in (device / "work").iterdir()] == []
    # A pull cut short: the run does not count, and says why.
    monkeypatch.setenv("FAKE_ADB_CUT", "run.csv")
    cfg.write_text(cfg.read_text().replace('"adb"\noutput', '"adb-cut"\noutput'))
    root = _run(cfg, keep_going=True)
    assert len(manifest(root)) == 4  # two attempts of each run
    for record in manifest(root):
        assert record["status"] == "invalid"
        assert record["error"].startswith("transfer check: run.csv: ")
        assert "bytes arrived" in record["error"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def sshd(tmp_path):
    """A real sshd on 127.0.0.1 (keys and config in tmp_path), or a skip saying why not."""
    binary = shutil.which("sshd") or "/usr/sbin/sshd"
    if not os.path.exists(binary):
        pytest.skip("sshd is not installed (apt-get install openssh-server)")
    if not shutil.which("ssh") or not shutil.which("ssh-keygen"):
        pytest.skip("the ssh client is not installed")
    keys = tmp_path / "keys"
    keys.mkdir()
    for name in ("host", "client"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / name)],
                       check=True, stdin=subprocess.DEVNULL)  # fmt: skip
    (keys / "authorized_keys").write_text((keys / "client.pub").read_text())
    port = _free_port()
    config = keys / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {keys / 'host'}\n"
        f"AuthorizedKeysFile {keys / 'authorized_keys'}\nPidFile {keys / 'sshd.pid'}\n"
        "StrictModes no\nUsePAM no\nPasswordAuthentication no\nPermitRootLogin yes\n"
        "KbdInteractiveAuthentication no\n"
    )
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", exist_ok=True)
    proc = subprocess.Popen([binary, "-D", "-e", "-f", str(config)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.skip(f"sshd did not start: {proc.stderr.read().decode().strip()[:300]}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.1)
    else:
        proc.kill()
        pytest.skip("sshd did not listen within 15 s")
    yield {"port": port, "identity": keys / "client", "user": getpass.getuser()}
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_ssh_target_against_a_real_sshd(tmp_path, sshd):
    remote = tmp_path / "remote"
    (remote / "models").mkdir(parents=True)
    model = remote / "models" / "tiny-on-host.gguf"
    model.write_bytes(b"model on the host")
    fake = install_fake_cli(remote / "bin")
    cfg = write_config(
        tmp_path,
        f"""\
        [sweep]
        name = "ssh"
        output = "{tmp_path / "out"}"
        timeout_s = 60
        repeats = 2

        [base]
        model = "tiny.gguf"
        prompt = {json.dumps(PROMPT)}
        n_predict = 4
        io_trace = true

        [[targets]]
        name = "box"
        kind = "ssh"
        host = "127.0.0.1"
        port = {sshd["port"]}
        user = "{sshd["user"]}"
        identity = "{sshd["identity"]}"
        ssh_options = ["StrictHostKeyChecking=no", "UserKnownHostsFile=/dev/null",
                       "LogLevel=ERROR"]
        workdir = "{remote / "work"}"
        binary = "{fake}"
        models = {{ "tiny.gguf" = "{model}" }}
        """,
    )
    root = _run(cfg)
    _check_runs(root, 2, str(model))
    assert not any((remote / "work").rglob("run.csv"))
