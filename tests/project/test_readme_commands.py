"""Every command the README shows is checked, so that it cannot drift from the tool.

Each ``bmoe`` command of a code block, and each one written inline, is parsed against the
command line itself: the command exists, its options are its own (``bmoe run`` against the
engine's flag table). The ones that need nothing but the shipped ``bench-data/`` and files
made from it then really run, in README order, in a folder laid out with the README's file
names (``run.csv``, ``trace.csv``, ``bench/*.csv``, ...); the others (a phone, ssh, Ray, a
1 GB model) say in LIMITS why they are only parsed. Paths into the repository
(``sweeps/...``, ``bench-data/...``) must exist, the install lines' extras and markers must
be the project's, the Python examples run, and the ``bmoe.x.y`` names the prose points at
must import.
"""

from __future__ import annotations

import glob
import importlib
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from bmoe.cli import cli_command, main, register

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
BENCH = ROOT / "bench-data"
SMALL_RUN = BENCH / "2026-11-29-small-traces" / "cells" / "cache_mb-64_io_threads-1-281579ec"
TINY = BENCH / "2026-11-29-tiny-cache-lanes"
#: The phone run of the corpus stands for the README's phone/*.csv and gemma.route.csv.
PHONE = Path(os.environ.get("BMOE_CORPUS", ROOT.parent / "shared" / "corpus")) / "route-trace"

#: Commands only parsed, by what they start with, and why.
LIMITS = {
    "bmoe sweep sweeps/phone-farm.toml": "a farm of phones on a Ray cluster",
    "bmoe sweep sweeps/tiny-embedded.toml --resume": "resumes an interrupted sweep",
    "bmoe sweep": "runs the engine for minutes (its --dry-run runs here)",
    "bmoe tune": "runs the engine round after round (tests/sweep/test_tune.py runs whole tunes)",
    "bmoe run": "the engine on a model file (tests/engine/ runs it)",
    "bmoe model synth small.gguf": "writes a 1 GB model",
    "bmoe model synth big.gguf": "writes a 10 GB model",
    "bmoe model synth models/tiny.gguf": "the quick start's own folder (tiny.gguf runs here)",
    "bmoe profile runs/ --probe": "probes a device's flash with dd",
    "bmoe profile runs/": "needs runs without compute tracing (bench-data's traced runs "
    "are refused); the predict lines below run on a profile built with --allow-traced",
    "bmoe analyze decode compute ctl.compute-layers.csv": "bench-data has no layer-granular "
    "compute trace",
    "bmoe analyze sweep sweeps/tiny-embedded.toml": "reads the folder of the quick start's "
    "sweep (test_the_quick_start_runs runs all three)",
}
#: Names the README gives its example files, and what stands for each (run first, so that
#: the commands find them).
FILES = {
    "run.csv": SMALL_RUN / "r1" / "run.csv",
    "run.route.csv": SMALL_RUN / "r1" / "run.route.csv",
    "run.io.csv": SMALL_RUN / "r1" / "run.io.csv",
    "run.compute.csv": SMALL_RUN / "r1" / "run.compute.csv",
    "run.out": SMALL_RUN / "r1" / "run.out",
    "run.metrics": SMALL_RUN / "r1" / "run.metrics",
    "trace.csv": SMALL_RUN / "r1" / "run.route.csv",
    "pf.route.csv": SMALL_RUN / "r1" / "run.route.csv",
    "pf.csv": SMALL_RUN / "r1" / "run.csv",
    "ct.compute.csv": SMALL_RUN / "r1" / "run.compute.csv",
    "ct.csv": SMALL_RUN / "r1" / "run.csv",
    "base.csv": TINY / "cells" / "cache_mb-4_io_threads-2-29ab4f81" / "r1" / "run.csv",
    "candidate.csv": TINY / "cells" / "cache_mb-8_io_threads-2-b9e5283f" / "r1" / "run.csv",
}


# ----------------------------------------------------------------------------- reading


def _blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced code block."""
    return re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.M | re.S)


def _shell_lines(body: str) -> list[str]:
    """The commands of a shell block: continuation lines joined, comments dropped, ``&&``
    chains split."""
    joined = re.sub(r"\\\n\s*", " ", body)
    out = []
    for line in joined.splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            words = shlex.split(line.split(" #")[0])
        command: list[str] = []
        for word in [*words, "&&"]:
            if word == "&&":
                if command:
                    out.append(shlex.join(command))
                command = []
            else:
                command.append(word)
    return out


def readme_commands() -> list[str]:
    """Every shell command of the README's code blocks, in order."""
    text = README.read_text(encoding="utf-8")
    return [c for lang, body in _blocks(text) if lang in ("bash", "sh") for c in _shell_lines(body)]


def inline_commands() -> list[str]:
    """``bmoe ...`` commands written inline in the prose (code spans), in order."""
    text = README.read_text(encoding="utf-8")
    prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    spans = re.findall(r"`(bmoe [a-z][^`]*)`", prose.replace("\n", " "))
    return [" ".join(s.split()) for s in spans]


def _bmoe_argv(command: str) -> list[str] | None:
    """The arguments after ``bmoe`` (``.venv/bin/bmoe`` too), or None for other programs."""
    words = shlex.split(command)
    if words and Path(words[0]).name == "bmoe":
        return words[1:]
    return None


# ----------------------------------------------------------------------------- parsing


def parse_check(argv: list[str], group: bool = False) -> None:
    """The command exists (a `group` of commands too, when allowed) and every option given is
    one of its own."""
    register()
    cmd = cli_command()
    path: list[str] = []
    args = list(argv)
    while hasattr(cmd, "commands") and args and not args[0].startswith("-"):
        name = args.pop(0)
        assert name in cmd.commands, f"bmoe {' '.join(path)}: no command {name!r}"
        cmd, path = cmd.commands[name], [*path, name]
    if hasattr(cmd, "commands"):
        assert group and not args, f"bmoe {' '.join(path)} names no command"
        return
    if path == ["run"]:
        from bmoe.engine.embedded import config

        if "-h" in args or "--help" in args:
            return
        model = [] if {"-m", "--model"} & set(args) else ["-m", "model.gguf"]  # a mention
        config.parse_args([*args, *model])  # the engine's own flag table: raises on a typo
        return
    known = {opt for p in cmd.params for opt in (*p.opts, *p.secondary_opts)} | {"-h", "--help"}
    for arg in args:
        if re.fullmatch(r"-\d.*", arg) or not arg.startswith("-") or arg == "-":
            continue
        flag = arg.split("=", 1)[0]
        assert flag in known, f"bmoe {' '.join(path)}: no option {flag} (has {sorted(known)})"


def _limit(command: str) -> str | None:
    text = " ".join(shlex.split(command))
    text = re.sub(r"^\S*/bmoe ", "bmoe ", text)
    return next((why for start, why in LIMITS.items() if text.startswith(start)), None)


# ----------------------------------------------------------------------------- the folder


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder where the README's commands find what they name: bench-data/ (its archives,
    and my-sweep), sweeps/, the example files, bench/ and runs/ of metrics CSVs, two sweep
    folders to line up, and a device profile for predict."""
    from bmoe.analyze.profile import build_profile
    from bmoe.formats.profile import write_profile

    root = tmp_path_factory.mktemp("readme")
    (root / "bench-data").mkdir()
    for archive in BENCH.iterdir():
        if archive.is_dir():
            (root / "bench-data" / archive.name).symlink_to(archive)
    (root / "bench-data" / "my-sweep").symlink_to(TINY)
    shutil.copytree(ROOT / "sweeps", root / "sweeps")
    for name, source in FILES.items():
        shutil.copyfile(source, root / name)
    for folder in ("bench", "runs"):
        (root / folder).mkdir()
    for run in sorted(TINY.glob("cells/*/r1")):  # bench/<cell>.csv with its sidecar
        shutil.copyfile(run / "run.csv", root / "bench" / f"{run.parent.name}.csv")
        shutil.copyfile(run / "run.metrics", root / "bench" / f"{run.parent.name}.metrics")
    for f in (SMALL_RUN / "r1").glob("run.*"):  # runs/run.csv beside its traces
        shutil.copyfile(f, root / "runs" / f.name)
    shutil.copytree(TINY, root / "old-sweep", symlinks=True)
    shutil.copytree(TINY, root / "new-sweep", symlinks=True)
    write_profile(_traced_profile(build_profile), root / "device.json")
    if PHONE.is_dir():  # read in place elsewhere; a copy in the test's own temporary folder
        (root / "phone").mkdir()
        shutil.copyfile(PHONE / "gemma.metrics", root / "phone" / "gemma.csv")
        shutil.copyfile(PHONE / "gemma.route.csv", root / "gemma.route.csv")
    return root


def _traced_profile(build_profile):
    from bmoe.analyze.profile import read_runs

    runs = read_runs(sorted((BENCH / "2026-11-29-small-traces").glob("cells/*/r1/run.csv")))
    return build_profile(runs, allow_traced=True)


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _paths_exist(argv: list[str], cwd: Path) -> list[str]:
    """The arguments that look like files or folders and match nothing under `cwd`."""
    missing = []
    for arg in argv:
        if arg.startswith("-") or "=" in arg or ("/" not in arg and "." not in arg):
            continue
        if re.fullmatch(r"[\d.,%]+", arg) or arg.isupper():
            continue
        found = glob.glob(str(cwd / arg))
        if not found and ("*" in arg or not (cwd / arg).parent.is_dir()):
            missing.append(arg)
    return missing


def _expanded(argv: list[str], cwd: Path) -> list[str]:
    out = []
    for arg in argv:
        if "*" in arg:
            found = sorted(glob.glob(arg, root_dir=cwd))
            assert found, f"{arg} matches nothing"
            out += found
        else:
            out.append(arg)
    return out


# ----------------------------------------------------------------------------- the tests


def test_every_command_of_the_code_blocks_parses_and_names_what_exists() -> None:
    commands = readme_commands()
    assert len(commands) > 40
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    extras = set(pyproject["project"]["optional-dependencies"])
    markers = {m.split(":")[0] for m in pyproject["tool"]["pytest"]["ini_options"]["markers"]}
    for command in commands:
        words = shlex.split(command)
        argv = _bmoe_argv(command)
        if argv is not None:
            parse_check(argv)
            for arg in argv:  # paths into the repository exist
                if re.match(r"(sweeps|bench-data/20|docs|notebooks)/", arg):
                    assert glob.glob(str(ROOT / arg)), f"{command}: {arg} is not in the repository"
        elif "pip" in Path(words[0]).name or words[1:3] == ["-m", "pip"]:
            for spec in (w for w in words if "[" in w):  # '.[engine,test]', 'bmoe[engine]'
                named = set(spec.split("[")[1].rstrip("]").split(","))
                assert named <= extras, (command, named - extras)
        elif "pytest" in words:
            after = words[words.index("pytest") + 1 :]  # pytest's -m, not python's
            if "-m" in after:
                expression = after[after.index("-m") + 1]
                used = set(re.findall(r"[a-z_]+", expression)) - {"not", "and", "or"}
                assert used <= markers, (command, used - markers)
        else:  # other programs (python -m venv, mkdir, ray, a benchmark script): the files
            for arg in words[1:]:  # of this repository they name exist
                if re.match(r"(benchmarks|sweeps|bench-data|notebooks|tests|docs)/", arg):
                    assert glob.glob(str(ROOT / arg)), f"{command}: {arg} is not in the repository"


def test_every_inline_bmoe_command_parses() -> None:
    commands = inline_commands()
    assert len(commands) > 10
    for command in commands:
        argv = shlex.split(command)[1:]
        # inline mentions may stop at an option's name (`bmoe model synth --arch`)
        parse_check([a for a in argv if not a.endswith("...")], group=True)


@pytest.mark.slow
def test_the_readme_commands_run(sandbox: Path, capsys, monkeypatch) -> None:
    """The commands that need only bench-data and files made from it run, in README order,
    as a user would type them (exit 0; the history gate passes on bench-data's archives)."""
    monkeypatch.chdir(sandbox)
    ran, parsed = [], []
    for command in readme_commands():
        argv = _bmoe_argv(command)
        if argv is None:
            continue
        why = None if argv[:1] == ["sweep"] and "--dry-run" in argv else _limit(command)
        if why is None and "phone/" in command and not PHONE.is_dir():
            why = f"the phone files stand-in is the corpus, absent at {PHONE}"
        if why is None and argv[:2] == ["model", "synth"] and not _has("gguf"):
            why = "writing a model needs the engine extra (gguf)"
        if why is not None:
            parsed.append((command, why))
            continue
        missing = _paths_exist(argv, sandbox)
        assert not missing, f"{command}: nothing here stands for {missing}"
        args = _expanded(argv, sandbox)
        if argv[0] == "history" and len(glob.glob("bench-data/*-tiny-cache-lanes")) < 2:
            code = main(args)
            out = capsys.readouterr()
            assert "history needs two or more sweep folders" in out.err
            parsed.append((command, "one tiny-cache-lanes archive ships"))
            continue
        code = main(args)
        out = capsys.readouterr()
        # validate says 1 for findings; a regression gate says 1 for a regression
        expect = (0, 1) if argv[0] == "validate" or "--fail-on-regression" in argv else (0,)
        assert code in expect, f"{command}: exit {code}\n{out.err}"
        ran.append(command)
    assert len(ran) >= 35, ran
    # each reason is the README's, not a missing file: every limited command was parsed
    for command, _why in parsed:
        parse_check(_bmoe_argv(command) or [])


def test_the_python_examples_run(monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    text = README.read_text(encoding="utf-8")
    blocks = [body for lang, body in _blocks(text) if lang == "python"]
    assert blocks
    for body in blocks:
        exec(compile(body, "README.md", "exec"), {})  # the README's own code


def test_the_python_names_the_prose_gives_exist() -> None:
    text = README.read_text(encoding="utf-8")
    names = sorted(set(re.findall(r"`(bmoe(?:\.[A-Za-z_]\w*)+)", text.replace("\n", " "))))
    assert len(names) > 15
    missing = []
    for name in names:
        parts = name.split(".")
        for cut in range(len(parts), 0, -1):  # the longest importable module, then attributes
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            try:
                for attr in parts[cut:]:
                    obj = getattr(obj, attr)
            except AttributeError:
                missing.append(name)
            break
        else:
            missing.append(name)
    assert not missing, missing


@pytest.mark.slow
def test_the_docs_command_the_readme_gives_writes_the_reference(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bmoe.cli.docs"], capture_output=True, text=True, check=True,
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert out.stdout == (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")


@pytest.mark.slow
@pytest.mark.engine
def test_the_quick_start_and_the_engine_commands_run(
    tmp_path: Path, capsysbinary, monkeypatch
) -> None:
    """The quick start as written (model, sweep, analysis; then --resume finds nothing to
    run), and the engine lines with the tiny model standing for small.gguf: a streamed run
    with its traces, the plain baseline, a split model, and the profile of the streamed run."""
    pytest.importorskip("llama_cpp", reason="the engine extra is not installed")
    pytest.importorskip("gguf", reason="the engine extra is not installed")
    monkeypatch.chdir(tmp_path)
    shutil.copytree(ROOT / "sweeps", tmp_path / "sweeps")
    (tmp_path / "models").mkdir()

    def run(argv: list[str]) -> str:
        code = main(argv)
        out, err = (b.decode("utf-8", "replace") for b in capsysbinary.readouterr())
        assert code == 0, f"bmoe {shlex.join(argv)}: exit {code}\n{err}"
        return out  # (a generated model's answer is any bytes)

    text = README.read_text(encoding="utf-8")
    quick = _shell_lines(_blocks(text)[0][1])
    steps = [a for c in quick if (a := _bmoe_argv(c)) is not None]
    assert [a[:2] for a in steps] == [["model", "synth"], ["sweep", "sweeps/tiny-embedded.toml"],
                                      ["analyze", "sweep"]]  # fmt: skip
    for argv in steps:
        out = run(argv)
    assert "Ranking by tok_s_mean" in out  # the analysis of the sweep just run
    resume = [a for c in readme_commands() if (a := _bmoe_argv(c)) and "--resume" in a]
    run(resume[0])  # a finished sweep: nothing left to run

    (tmp_path / "small.gguf").symlink_to(tmp_path / "models" / "tiny.gguf")
    engine = [a for c in readme_commands() if (a := _bmoe_argv(c)) and a[0] in ("run", "model")]
    for argv in engine:
        if argv[:3] == ["model", "synth", "g4.gguf"] or argv[0] == "run":
            run(argv)  # the split model first, then the runs
    for name in ("run.csv", "run.route.csv", "run.io.csv"):
        assert (tmp_path / name).stat().st_size > 0, name
    (tmp_path / "runs").mkdir()
    for name in ("run.csv", "run.route.csv", "run.io.csv"):
        shutil.copyfile(tmp_path / name, tmp_path / "runs" / name)
    profile = [
        a for c in readme_commands() if (a := _bmoe_argv(c)) and a[:2] == ["profile", "runs/"]
    ]
    run(profile[0])
    assert (tmp_path / "device.json").is_file()
