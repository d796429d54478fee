"""A sweep's folder from start to finish, the same for ``bmoe sweep``, ``bmoe tune`` and a
library caller: one runner per sweep name and per folder (the locks), a new folder or a
resumed one (a changed configuration kept as ``sweep.<n>.toml`` before the new one replaces
it), the predictions of a sweep with a profile (``predictions.csv``), the runs, and the
analysis of what the folder holds (``summary.md``), written however the runs ended::

    from bmoe.sweep.config import load_config
    from bmoe.sweep.lifecycle import run_sweep_folder

    outcome = run_sweep_folder(load_config("sweeps/tiny-embedded.toml"))
    outcome.root  # bench-data/<date>-tiny-embedded: manifest, results, summary.md
"""

from __future__ import annotations

import contextlib
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from bmoe.errors import BmoeError
from bmoe.formats import archive as layout
from bmoe.sweep.archive import ArchiveWriter, load_results
from bmoe.sweep.attempt import ProgressSink
from bmoe.sweep.config import SweepConfig, resolved_toml
from bmoe.sweep.lock import folder_lock, name_lock
from bmoe.sweep.plan import Plan, make_plan
from bmoe.sweep.runner import SweepOutcome, run_sweep

if TYPE_CHECKING:
    import pandas as pd

    from bmoe.sweep.tune import TuneOutcome
    from bmoe.sweep.tune_config import TuneConfig


@dataclass
class SweepFolder:
    """A sweep folder held by this runner: its archive, and what was found on the way in
    (locks taken over from a runner that died, a torn manifest mended) for the caller to say."""

    archive: ArchiveWriter
    resumed: bool
    notes: list[str] = field(default_factory=list)

    @property
    def root(self) -> Path:
        return self.archive.root


@contextlib.contextmanager
def hold_folder(name: str, text: str | None, *, output: Path, folder: Path | None = None
                ) -> Iterator[SweepFolder]:  # fmt: skip
    """The folder of sweep `name` held for one runner: the sweep's name lock under the output
    folder and the folder's own lock, taken before anything in a folder is touched (a second
    runner is refused); `folder` reopened (its configuration replaced by `text` when that
    differs, the old one kept as ``sweep.<n>.toml``), or a new ``<date>-<name>`` folder under
    `output` written with `text`."""
    with contextlib.ExitStack() as locks:
        taken = [locks.enter_context(name_lock(folder.parent if folder else output, name))]
        if folder is not None:
            taken.append(locks.enter_context(folder_lock(folder)))
        notes = [
            f"{lock.what}: took over the lock of pid {lock.stale.get('pid')} on host "
            f"{lock.stale.get('host')}, which ended without releasing it"
            for lock in taken
            if lock.stale
        ]
        if folder is not None:
            archive = ArchiveWriter.open(folder)
            if archive.mended:
                notes.append(f"{folder}: {archive.mended}")
            if text is not None:
                _replace_config(folder, text)
        else:
            if text is None:
                raise BmoeError(f"a new folder of sweep {name!r} needs its configuration")
            archive = ArchiveWriter.create(output, name, text)
        locks.enter_context(folder_lock(archive.root))
        yield SweepFolder(archive, folder is not None, notes)


@contextlib.contextmanager
def _held(name: str, text: str | None, output: Path, folder: Path | None,
          say: Callable[[str], None]) -> Iterator[SweepFolder]:  # fmt: skip
    """:func:`hold_folder`, its notes said."""
    with hold_folder(name, text, output=output, folder=folder) as held:
        for note in held.notes:
            say(note)
        yield held


def _replace_config(folder: Path, text: str) -> None:
    """`text` as the folder's ``sweep.toml`` when it says something else than the one there,
    which is kept as the first free ``sweep.<n>.toml``."""
    current = folder / layout.CONFIG
    previous = current.read_text(encoding="utf-8")
    if tomllib.loads(previous) != tomllib.loads(text):
        layout.write_atomic(layout.config_copy(folder), previous)
        layout.write_atomic(current, text)


class SweepInterrupted(KeyboardInterrupt):
    """A sweep or tune stopped by an interrupt (Ctrl-C, SIGTERM) after its folder was made:
    `root` is the folder to resume."""

    def __init__(self, root: Path):
        super().__init__(str(root))
        self.root = Path(root)


def write_summary(root: Path, kind: str = "Sweep") -> Path | None:
    """``summary.md``: the analysis of what the folder holds, as markdown (None when it holds
    no attempt yet or the results do not read). `kind` heads it (``Sweep``, ``Tune``)."""
    from bmoe.analyze.sweep import analyze_sweep
    from bmoe.analyze.views import SWEEP
    from bmoe.render.tables import render_markdown

    try:
        results = load_results(root)
    except BmoeError:
        return None
    if results.empty:
        return None
    views = analyze_sweep(results)
    title = f"# {kind} {results.attrs.get('name') or Path(root).name}\n\n"
    path = Path(root) / layout.SUMMARY
    text = render_markdown(views, titles=SWEEP.titles(outcome="tok_s_mean"))
    layout.write_atomic(path, title + text)
    return path


def _warn(text: str) -> None:
    import warnings

    warnings.warn(text, stacklevel=3)


@contextlib.contextmanager
def _finishing(root: Path, kind: str, say: Callable[[str], None]) -> Iterator[None]:
    """Write ``summary.md`` when the block ends, however it ends (what completed is analysed
    all the same; a summary that cannot be written is said, never raised over the outcome),
    and name the folder in an interrupt."""
    try:
        yield
    except KeyboardInterrupt:
        _summary_or_say(root, kind, say)
        raise SweepInterrupted(root) from None
    except BaseException:
        _summary_or_say(root, kind, say)
        raise
    _summary_or_say(root, kind, say)


def _summary_or_say(root: Path, kind: str, say: Callable[[str], None]) -> None:
    try:
        write_summary(root, kind)
    except OSError as exc:
        say(f"could not write {Path(root) / layout.SUMMARY}: {exc.strerror or exc}")


def run_in_folder(
    config: SweepConfig,
    plan: Plan,
    held: SweepFolder,
    *,
    predicted: pd.DataFrame | None = None,
    sink: ProgressSink | None = None,
    say: Callable[[str], None] = _warn,
    flags_checked: bool = False,
    keep_going: bool = False,
) -> SweepOutcome:
    """Run `plan` in a held folder (:func:`hold_folder`): the `predicted` runs
    (:func:`bmoe.sweep.predictions.sweep_predictions`) kept as ``predictions.csv`` first,
    ``summary.md`` written last."""
    if predicted is not None:
        layout.write_predictions(held.root, predicted)
    with _finishing(held.root, "Sweep", say):
        return run_sweep(config, plan, held.archive, sink=sink, flags_checked=flags_checked,
                         keep_going=keep_going)  # fmt: skip


def run_sweep_folder(
    config: SweepConfig,
    *,
    output: Path | None = None,
    folder: Path | None = None,
    plan: Plan | None = None,
    sink: ProgressSink | None = None,
    say: Callable[[str], None] = _warn,
    flags_checked: bool = False,
    keep_going: bool = False,
) -> SweepOutcome:
    """A whole sweep, as ``bmoe sweep`` runs it: a new folder under `output` (default: the
    configuration's ``output``), or `folder` resumed; the locks, ``predictions.csv`` (a new
    folder of a configuration with a profile: predicted before the folder is made, so that a
    profile that does not read leaves nothing), the runs, ``summary.md``. What the caller
    should be told on the way (a lock taken over, a manifest mended) goes to `say`. An
    interrupt is raised as :class:`SweepInterrupted`, naming the folder."""
    from bmoe.sweep.predictions import sweep_predictions

    plan = plan or make_plan(config)
    root = Path(output or config.settings.output)
    predicted = sweep_predictions(config, plan) if folder is None else None
    with _held(config.settings.name, resolved_toml(config), root, folder, say) as held:
        return run_in_folder(config, plan, held, predicted=predicted, sink=sink, say=say,
                             flags_checked=flags_checked, keep_going=keep_going)  # fmt: skip


def run_tune_folder(
    config: TuneConfig,
    *,
    output: Path | None = None,
    folder: Path | None = None,
    sink: ProgressSink | None = None,
    say: Callable[[str], None] = _warn,
) -> TuneOutcome:
    """A whole tune, as ``bmoe tune`` runs it: a new folder under `output` (default: the
    configuration's ``output``), or `folder` resumed; the locks, the rounds, ``summary.md``.
    Notes go to `say`; an interrupt is raised as :class:`SweepInterrupted`."""
    from bmoe.sweep.tune import Tuner
    from bmoe.sweep.tune_config import resolved_tune_toml

    settings = config.sweep.settings
    text = resolved_tune_toml(config) if folder is None else None  # a tune resumes as it was
    output = Path(output or settings.output)
    with (
        _held(settings.name, text, output, folder, say) as held,
        _finishing(held.root, "Tune", say),
    ):
        return Tuner(config, held.archive, sink=sink).run()


__all__ = [
    "SweepFolder",
    "SweepInterrupted",
    "hold_folder",
    "run_in_folder",
    "run_sweep_folder",
    "run_tune_folder",
    "write_summary",
]
