"""A sweep's results table and the runs table of files or folders: the archive's runs read
(:mod:`bmoe.formats.archive_runs`) and built into one row per run
(:mod:`bmoe.analyze.runs_table`)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import pandas as pd

from bmoe.analyze.runs_table import attempts_frame, loose_runs_frame, varying_columns
from bmoe.errors import BmoeError
from bmoe.formats import archive as layout
from bmoe.formats.archive_runs import read_attempts, read_loose_runs, read_stored_results


def results_frame(root: Path) -> pd.DataFrame:
    """One row per attempt of the sweep folder `root`, built from its manifest, each
    completed run's CSV and ``.metrics`` sidecar read for its summary figures."""
    return attempts_frame(read_attempts(Path(root)))


def load_results(root: Path, required: Sequence[str] = layout.RESULT_KEYS) -> pd.DataFrame:
    """A sweep's results table (``results.parquet``, or rebuilt from the manifest when the
    sweep did not get as far as writing it, or wrote one without the `required` columns).
    ``attrs`` carry ``axes`` and ``params``."""
    stored = read_stored_results(Path(root), required)
    if stored is not None:
        return stored
    frame = results_frame(root)
    frame.attrs["axes"] = varying_columns(frame, frame.attrs.get("params", []))
    return frame


def files_frame(paths: Sequence[str | os.PathLike]) -> pd.DataFrame:
    """One row per metrics file of `paths` (:func:`bmoe.analyze.runs_table.loose_runs_frame`):
    its summary, configuration, entry state, and an order guessed from modification times."""
    return loose_runs_frame(read_loose_runs(paths))


def runs_table(paths: Iterable[str | os.PathLike], required: Sequence[str] = ("cell",)
               ) -> pd.DataFrame:  # fmt: skip
    """The runs table of files, folders, or one sweep folder.

    A single sweep folder is read as its results (:func:`load_results`: one row per attempt,
    with its axes and parameters); otherwise every metrics file found (folders searched
    recursively) becomes a row (:func:`files_frame`).
    """
    given = [Path(p) for p in paths]
    if len(given) == 1 and layout.is_sweep_folder(given[0]):
        return load_results(given[0], required)
    files = layout.find_metrics_files(given)
    if not files:
        raise BmoeError(f"no metrics files found in {', '.join(str(p) for p in given)}")
    return files_frame(files)


__all__ = ["files_frame", "load_results", "results_frame", "runs_table"]
