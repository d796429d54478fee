"""Every command the README and the pages of ``docs/`` show is checked, so that none can drift
from the tool.

Each ``bmoe`` command of a code block, and each one written inline, is parsed against the
command line itself: the command exists, its options are its own (``bmoe run`` against the
engine's flag table). Then every one of a code block runs, as written, from the root of a copy
of the repository's tracked files (a fresh clone), page by page in the page's order, with the
default output folders, and its exit status is checked: the analyses on the archives of
``bench-data/`` (and, for the names the pages give a run's files, ``run.csv``, ``trace.csv``,
..., the files of FILES beside them), the engine's commands (the quick start, ``bmoe run``,
``bmoe sweep``, ``bmoe tune``) on the generated tiny model. The few that cannot run here (a
phone, ssh, Ray, a 1 GB model) say in LIMITS why they are only parsed. Paths into the
repository must exist, the install lines' extras and markers must be the project's, the
Python examples run (and assert what they claim), and the ``bmoe.x.y`` names the prose points
at must import.
"""

from __future__ import annotations

import glob
import importlib
import importlib.util
import json
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
#: The pages in the order they are read: the front page, the subjects, the reference.
PAGES = [
    README,
    *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "cli.md"),
    ROOT / "docs" / "cli.md",
]
BENCH = ROOT / "bench-data"
SMALL_RUN = BENCH / "2026-11-29-small-traces" / "cells" / "cache_mb-64_io_threads-1-281579ec"
TINY = BENCH / "2026-11-29-tiny-cache-lanes"
#: The corpus stands for the pages' phone files and a layer-granular compute trace.
CORPUS = Path(os.environ.get("BMOE_CORPUS", ROOT.parent / "shared" / "corpus"))
PHONE = CORPUS / "route-trace"

#: Commands only parsed, by what they start with, and why.
LIMITS = {
    "bmoe sweep sweeps/phone-farm.toml": "a farm of phones on a Ray cluster",
    "bmoe sweep sweeps/tiny-embedded-traced.toml": "the quick start's 12 runs again, traced "
    "(half a minute more; tests/sweep/test_embedded.py runs traced sweeps)",
    "bmoe sweep sweeps/tiny-tune.toml": "the tune's whole grid, 48 runs (the tune runs here)",
    "bmoe sweep bench-data/20": "resumes the folder of an earlier sweep, named by its date "
    "(the --resume form runs)",
    "bmoe tune bench-data/20": "resumes the folder of an earlier tune, named by its date "
    "(tests/sweep/test_tune.py kills and resumes a tune)",
    "bmoe model synth small.gguf": "writes a 1 GB model (the tiny one stands for it)",
    "bmoe model synth big.gguf": "writes a 10 GB model",
    "bmoe profile runs/ --probe": "probes a device's flash with dd",
    "bmoe profile a.csv b.csv --model model.gguf": "needs the model file of the runs (1 GB)",
}
#: Programs other than bmoe: how each is checked, for it is not run.
NOT_RUN = {
    "python3.11 -m venv": "makes the environment the tests run in",
    "pip": "installs packages (the extras named are checked)",
    "pytest": "the test suite itself (the markers named are checked)",
    "ray": "starts a Ray cluster (tests/sweep/test_farm_ray.py starts one)",
}
#: Names the pages give their example files, and what stands for each (copied in when a
#: command names one the page has not made itself).
FILES = {
    "run.csv": SMALL_RUN / "r1" / "run.csv",
    "run.route.csv": SMALL_RUN / "r1" / "run.route.csv",
    "run.io.csv": SMALL_RUN / "r1" / "run.io.csv",
    "run.compute.csv": SMALL_RUN / "r1" / "run.compute.csv",
    "run.out": SMALL_RUN / "r1" / "run.out",
    "run.metrics": SMALL_RUN / "r1" / "run.metrics",
    "trace.csv": SMALL_RUN / "r1" / "run.route.csv",
    "trace.route.csv": SMALL_RUN / "r1" / "run.route.csv",
    "drop.route.csv": SMALL_RUN / "r1" / "run.route.csv",
    "huge.route.csv": SMALL_RUN / "r1" / "run.route.csv",
    "pf.route.csv": SMALL_RUN / "r1" / "run.route.csv",
    "pf.csv": SMALL_RUN / "r1" / "run.csv",
    "ct.compute.csv": SMALL_RUN / "r1" / "run.compute.csv",
    "ct.csv": SMALL_RUN / "r1" / "run.csv",
    "base.csv": TINY / "cells" / "cache_mb-4_io_threads-2-29ab4f81" / "r1" / "run.csv",
    "baseline.csv": TINY / "cells" / "cache_mb-4_io_threads-2-29ab4f81" / "r1" / "run.csv",
    "candidate.csv": TINY / "cells" / "cache_mb-8_io_threads-2-b9e5283f" / "r1" / "run.csv",
    "ctl.compute-layers.csv": CORPUS / "native-tiny" / "ctl.compute-layers.csv",
    "gemma.route.csv": PHONE / "gemma.route.csv",
}
#: Folders the pages name: how each is made.
FOLDERS = ("bench", "runs", "old-sweep", "new-sweep", "phone")
#: Stand-ins made rather than copied: a profile of the small sweep (its runs are compute
#: traced, so --allow-traced), one of the phone run, and the Parquet form of a route trace.
MADE = ("device.json", "phone.json", "big.route.parquet", "huge.route.parquet")
#: Options whose value a command writes (never stood in for).
OUTPUTS = ("-o", "--output", "--csv", "--plot", "--plots", "--route-trace", "--io-trace",
           "--compute-trace", "--compute-trace-layers", "--fidelity-save")  # fmt: skip


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


def page_commands(page: Path) -> list[str]:
    """Every shell command of a page's code blocks, in order."""
    text = page.read_text(encoding="utf-8")
    return [c for lang, body in _blocks(text) if lang in ("bash", "sh") for c in _shell_lines(body)]


def readme_commands() -> list[str]:
    """Every shell command of the README's code blocks, in order."""
    return page_commands(README)


def inline_commands(page: Path) -> list[str]:
    """``bmoe ...`` commands written inline in a page's prose (code spans), in order."""
    text = page.read_text(encoding="utf-8")
    prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    spans = re.findall(r"`(bmoe [a-z][^`]*)`", prose.replace("\n", " "))
    return [" ".join(s.split()) for s in spans]


def _bmoe_argv(command: str) -> list[str] | None:
    """The arguments after ``bmoe`` (``.venv/bin/bmoe`` too), or None for other programs."""
    words = shlex.split(command)
    if words and Path(words[0]).name == "bmoe":
        return words[1:]
    return None


def _not_run(words: list[str]) -> str | None:
    """Why a command of another program is not run (None: it is run, or is unknown)."""
    text = " ".join(words)
    for start, why in NOT_RUN.items():
        first = start.split()[0]
        if text.startswith(start) or Path(words[0]).name == first or first in words[:3]:
            return why
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


def _engine_bound(argv: list[str]) -> bool:
    """Whether a command needs the engine extra, or what an engine command made: it runs in
    the engine's test (a model made, a run, a sweep or its dry run, a tune; the analysis of a
    sweep named by its configuration, which reads the folder that sweep wrote)."""
    if argv[:1] in (["run"], ["tune"], ["model"], ["sweep"]):
        return True
    return argv[:2] == ["analyze", "sweep"] and any(a.endswith(".toml") for a in argv[2:])


# ----------------------------------------------------------------------------- the copy


def tracked_copy(dest: Path) -> Path:
    """The repository as a fresh clone has it: its tracked files, copied to `dest`."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: no list of tracked files to copy")
    for name in listed.decode("utf-8").split("\0"):
        if name and (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    return dest


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stand-ins that are made, once: MADE."""
    from bmoe.analyze.device import build_profile, profile_runs
    from bmoe.formats.profile import write_profile
    from bmoe.formats.runfiles import read_recorded_runs

    folder = tmp_path_factory.mktemp("made")
    runs = profile_runs(
        read_recorded_runs(sorted((BENCH / "2026-11-29-small-traces").glob("cells/*/r1/run.csv")))
    )
    write_profile(build_profile(runs, allow_traced=True), folder / "device.json")
    assert main(["convert", str(SMALL_RUN / "r1" / "run.route.csv"), "--to", "parquet",
                 "-o", str(folder)]) == 0  # fmt: skip
    for name in ("big.route.parquet", "huge.route.parquet"):
        shutil.copyfile(folder / "run.route.parquet", folder / name)
    if PHONE.is_dir():  # (a copy of the corpus file: its name must end in .csv)
        shutil.copyfile(PHONE / "gemma.metrics", folder / "gemma.csv")
        assert main(["profile", str(folder / "gemma.csv"), "--trace",
                     str(PHONE / "gemma.route.csv"), "-o", str(folder / "phone.json"),
                     "-f", "json"]) == 0  # fmt: skip
    return folder


def _stand_in(name: str, root: Path, made: Path) -> str | None:
    """Put what stands for `name` (a file or folder a page names) into `root`; None when done
    (or nothing is needed), else why it cannot be."""
    target = root / name.rstrip("/")
    top = name.split("/")[0]
    if target.exists() or (top in FOLDERS and (root / top).exists()):
        return None
    if name in FILES:
        if not FILES[name].exists():
            return f"{FILES[name]} (the stand-in of {name}) is absent"
        shutil.copyfile(FILES[name], target)
    elif name in MADE:
        if not (made / name).exists():
            return f"the stand-in of {name} is made from the corpus, absent at {CORPUS}"
        shutil.copyfile(made / name, target)
    elif top == "bench":  # bench/<cell>.csv with its sidecar
        (root / "bench").mkdir()
        for run in sorted(TINY.glob("cells/*/r1")):
            shutil.copyfile(run / "run.csv", root / "bench" / f"{run.parent.name}.csv")
            shutil.copyfile(run / "run.metrics", root / "bench" / f"{run.parent.name}.metrics")
    elif top == "runs":  # runs/run.csv beside its traces
        (root / "runs").mkdir()
        for f in (SMALL_RUN / "r1").glob("run.*"):
            shutil.copyfile(f, root / "runs" / f.name)
    elif top in ("old-sweep", "new-sweep"):
        shutil.copytree(TINY, root / top, symlinks=True)
    elif top == "phone":
        if not PHONE.is_dir():
            return f"the phone files' stand-in is the corpus, absent at {PHONE}"
        (root / "phone").mkdir()
        shutil.copyfile(PHONE / "gemma.metrics", root / "phone" / "gemma.csv")
    return None


def _inputs(argv: list[str]) -> list[str]:
    """The arguments that name an example file or folder the pages use (not a value an
    option writes)."""
    names = []
    for before, arg in zip(["", *argv], argv, strict=False):
        if before in OUTPUTS or arg.startswith("-"):
            continue
        top = arg.split("/")[0]
        if arg in FILES or arg in MADE or (top in FOLDERS and ("/" in arg or arg == top)):
            names.append(arg)
    return names


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


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


# ----------------------------------------------------------------------------- parsing tests


def test_every_command_of_the_code_blocks_parses_and_names_what_exists() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    extras = set(pyproject["project"]["optional-dependencies"])
    markers = {m.split(":")[0] for m in pyproject["tool"]["pytest"]["ini_options"]["markers"]}
    total = 0
    for page in PAGES:
        for command in page_commands(page):
            total += 1
            words = shlex.split(command)
            argv = _bmoe_argv(command)
            where = f"{page.name}: {command}"
            if argv is not None:
                parse_check(argv)
                into = r"(sweeps|bench-data/20\d\d-\d\d-\d\d-[a-z]|docs|notebooks)/"
                for arg in argv:  # paths into the repository exist
                    if re.match(into, arg) and _limit(command) is None:
                        assert glob.glob(str(ROOT / arg)), f"{where}: {arg} is not here"
            elif "pip" in Path(words[0]).name or words[1:3] == ["-m", "pip"]:
                for spec in (w for w in words if "[" in w):  # '.[engine,test]', 'bmoe[engine]'
                    named = set(spec.split("[")[1].rstrip("]").split(","))
                    assert named <= extras, (where, named - extras)
            elif "pytest" in words:
                after = words[words.index("pytest") + 1 :]  # pytest's -m, not python's
                if "-m" in after:
                    expression = after[after.index("-m") + 1]
                    used = set(re.findall(r"[a-z_]+", expression)) - {"not", "and", "or"}
                    assert used <= markers, (where, used - markers)
            elif words[0] != "mkdir":
                assert _not_run(words), f"{where}: say in NOT_RUN how this is checked"
    assert total > 120


def test_every_inline_bmoe_command_parses() -> None:
    commands = [c for page in PAGES for c in inline_commands(page)]
    assert len(commands) > 10
    for command in commands:
        argv = shlex.split(command)[1:]
        # inline mentions may stop at an option's name (`bmoe model synth --arch`)
        parse_check([a for a in argv if not a.endswith("...")], group=True)


def test_the_readme_is_a_front_page_and_each_page_opens_on_an_example() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 210, len(lines)
    for page in PAGES[1:-1]:
        if page.name.startswith("adding-"):
            continue  # a how-to: its steps are the example
        text = page.read_text(encoding="utf-8")
        head = text.split("\n## ", 1)[0]  # before the first section: the example and its output
        kinds = [lang for lang, _body in _blocks(head)]
        assert kinds[:1] in (["bash"], ["python"]) and "text" in kinds, (page.name, kinds)


# ----------------------------------------------------------------------------- running tests


def _run_page(page: Path, root: Path, made: Path, capsys, *, engine: bool, seen: set[str]):
    """Run the commands of `page` in `root`, in order: those of the engine's test (`engine`)
    or the others. Returns (ran, parsed with why)."""
    ran, parsed = [], []
    for command in page_commands(page):
        words = shlex.split(command)
        argv = _bmoe_argv(command)
        if argv is None:
            if words[:2] == ["mkdir", "-p"]:
                for folder in words[2:]:
                    (root / folder).mkdir(parents=True, exist_ok=True)
            continue
        why = _limit(command)
        if why is not None:
            parsed.append((command, why))
            continue
        if _engine_bound(argv) != engine:
            continue
        key = shlex.join(argv)
        if key in seen:  # the same command again (another page's, or a comment apart)
            continue
        seen.add(key)
        for name in _inputs(argv):
            missing = _stand_in(name, root, made)
            if missing:
                parsed.append((command, missing))
                break
        else:
            args = _expanded(argv, root)
            code = main(args)
            out = capsys.readouterr()
            err = out.err if isinstance(out.err, str) else out.err.decode("utf-8", "replace")
            # validate says 1 for findings; a regression gate says 1 for a regression
            expect = (0, 1) if argv[0] == "validate" or "--fail-on-regression" in argv else (0,)
            assert code in expect, f"{page.name}: {command}: exit {code}\n{err[-3000:]}"
            ran.append(command)
    for command, _why in parsed:  # each reason is the page's, not a typo: it parses
        parse_check(_bmoe_argv(command) or [])
    return ran, parsed


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_the_commands_of_each_page_run(page, made, tmp_path, capsys, monkeypatch) -> None:
    """The analyses of a page run as a user types them, from the root of a fresh copy of the
    repository (the engine's commands run in the test below)."""
    root = tracked_copy(tmp_path / "repo")
    monkeypatch.chdir(root)
    ran, parsed = _run_page(page, root, made, capsys, engine=False, seen=set())
    if any(_bmoe_argv(c) and not _engine_bound(_bmoe_argv(c) or []) for c in page_commands(page)):
        assert ran or parsed, page.name


def test_the_python_examples_run_and_assert_what_they_claim(monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    blocks = [(p, body) for p in PAGES for lang, body in _blocks(p.read_text()) if lang == "python"]
    assert blocks
    for page, body in blocks:
        assert "assert " in body, f"{page.name}: an example says what it shows by asserting it"
        exec(compile(body, page.name, "exec"), {})  # the page's own code


def test_the_python_names_the_prose_gives_exist() -> None:
    text = " ".join(p.read_text(encoding="utf-8") for p in PAGES)
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
def test_the_engine_commands_of_the_pages_run(made, tmp_path, capsysbinary, monkeypatch) -> None:
    """The quick start as written (a model, a sweep, its analysis), then every engine command
    of every page in order in the same fresh copy: the model families and split models, the
    runs (the tiny model standing for small.gguf), the dry run and --resume of the finished
    sweep, and the tune exactly as the pages write it, which must find its answer."""
    pytest.importorskip("llama_cpp", reason="the engine extra is not installed")
    pytest.importorskip("gguf", reason="the engine extra is not installed")
    root = tracked_copy(tmp_path / "repo")
    monkeypatch.chdir(root)
    (root / "small.gguf").symlink_to(root / "models" / "tiny.gguf")  # made by the quick start
    seen: set[str] = set()
    ran = []
    for page in PAGES:
        done, _parsed = _run_page(page, root, made, capsysbinary, engine=True, seen=seen)
        ran += [_bmoe_argv(c) for c in done]
    steps = [a[:2] for a in ran]
    assert steps[:3] == [["model", "synth"], ["sweep", "sweeps/tiny-embedded.toml"],
                         ["analyze", "sweep"]], steps  # fmt: skip
    assert ["tune", "sweeps/tiny-tune.toml"] in steps and ["run", "-m"] in steps
    # the tune with the default output, relative to the repository root: every run worked
    # and it recommends a cell that keeps the fidelity floor
    (folder,) = (root / "bench-data").glob("*-tiny-tune")
    lines = [json.loads(x) for x in (folder / "manifest.jsonl").read_text().splitlines()]
    assert lines and all(r["status"] == "ok" for r in lines), [r.get("error") for r in lines]
    best = json.loads((folder / "tune.json").read_text())["result"]["best"]
    assert best is not None and best["worst_fidelity"] >= 0.9
