"""The device profile's one schema describes every field a profile holds: each key of a
profile ``bmoe profile`` writes has its entry in ``SCHEMA``, and a wrong value anywhere is a
one-line error naming the key (never a traceback later, where the value is used)."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest
from conftest import ROOT
from hostile_inputs import run_in_process

from bmoe.errors import BmoeError
from bmoe.formats.profile import SCHEMA, profile_from_dict, read_profile

SMALL = ROOT / "bench-data" / "2026-11-29-small-traces"


def _schema_paths(value, path: str = ""):
    """The SCHEMA name of every key and entry in a profile document (``a.b``, ``a[].b`` for
    rows, ``a{}`` for the values of a map); texts and sizes check their entries themselves."""
    spec = SCHEMA.get(path)
    if spec is not None and spec.kind in ("texts", "sizes"):
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if spec is not None and spec.kind == "map":
                name = f"{path}{{}}"
            else:
                name = f"{path}.{key}" if path else key
            yield name
            yield from _schema_paths(item, name)
    elif isinstance(value, list):
        for item in value:
            yield f"{path}[]" if not isinstance(item, dict) else path
            yield from _schema_paths(item, f"{path}[]")


def _profiles(corpus: Path) -> list[dict]:
    from bmoe.analyze.device import build_profile, profile_runs
    from bmoe.formats.runfiles import read_recorded_runs

    m = corpus / "metrics"
    sets = [
        ([corpus / "native-tiny/run.csv", corpus / "native-tiny/pf.csv"], {}),
        ([m / "2026-07-12/qwen_c4000_l4.csv", m / "2026-07-13/qwen_auto_ov.csv"], {}),
        ([SMALL / "cells"], {"allow_traced": True}),
    ]
    out = []
    for paths, kw in sets:
        if all(p.exists() for p in paths):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out.append(build_profile(profile_runs(read_recorded_runs(paths)), **kw).to_dict())
    return out


def test_every_key_of_a_written_profile_is_in_the_schema(corpus):
    """Profiles of the serial, mixed and sweep runs (terms, runs, memory, overlap, tracing,
    the model error): no key goes unchecked."""
    profiles = _profiles(corpus)
    assert len(profiles) >= 2
    seen = set()
    for doc in profiles:
        names = set(_schema_paths(json.loads(json.dumps(doc))))
        seen |= names
        missing = {n for n in names if n not in SCHEMA}
        assert not missing, sorted(missing)
    for name in (
        "terms{}.sd_rel",
        "terms{}.run_means{}",
        "runs[].traced",
        "runs[].assumed{}",
        "model_error.held_out[].error_pct",
        "overlap.lanes[]",
        "tracing.how",
    ):
        assert name in seen, name  # fmt: skip


def _doc(corpus: Path) -> dict:
    return json.loads(json.dumps(_profiles(corpus)[0]))


@pytest.mark.parametrize(
    ("where", "value", "needle"),
    [
        (("terms", "compute", "sd_rel"), "wide", "terms.compute.sd_rel must be a finite number"),
        (("terms", "compute", "sd_rel"), 1e300, "terms.compute.sd_rel must be at most"),
        (("terms", "compute", "settled"), 5, "terms.compute.settled must be true or false"),
        (("terms", "compute", "runs"), "a.csv", "terms.compute.runs must be a list of texts"),
        (("terms", "compute"), [], "terms.compute must be an object"),
        (("runs", 0, "traced"), "yes", "runs[0].traced must be true or false"),
        (("runs", 0, "tokens"), 1.5, "runs[0].tokens must be a whole number"),
        (("runs", 0, "assumed"), {"threads": 3}, "runs[0].assumed.threads must be text"),
        (("runs",), {"a": 1}, "runs must be a list of objects"),
        (("model_error", "configurations"), -1, "model_error.configurations must be >= 0"),
        (("model_error", "held_out"), 3, "model_error.held_out must be a list of objects"),
        (("coverage",), 1.0, "coverage must be below 1"),
        (("coverage",), 0, "coverage must be > 0"),
        (("unsettled",), [1], "unsettled[0] must be text"),
        (("absent",), {"prefill": None}, "absent.prefill must be text"),
        (("tracing", "overhead_ms"), {"compute_ms": "x"}, "tracing.overhead_ms.compute_ms must be"),
        (("model", "sizes_from"), 7, "model.sizes_from must be text"),
        (("flash", 0, "source"), ["io"], "flash[0].source must be text"),
    ],
)
def test_a_wrong_value_of_a_version_2_field_names_its_key(corpus, where, value, needle):
    doc = _doc(corpus)
    node = doc
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    with pytest.raises(BmoeError, match="^profile: " + re.escape(needle)):
        profile_from_dict(doc)


def test_memory_points_need_their_totals_and_a_positive_memory(corpus):
    """The prediction divides by the memory available: 0 or a missing total is refused."""
    doc = _doc(corpus)
    doc["memory"] = {"ms_per_fault": 1.0, "points": [
        {"asked_mib": 10.0, "available_mib": 100.0, "faults_per_token": 1.0}]}  # fmt: skip
    with pytest.raises(BmoeError, match=r"memory\.resident_mib is missing"):
        profile_from_dict(doc)
    doc["memory"].update(resident_mib=5.0, available_mib=100.0)
    assert profile_from_dict(doc).memory["available_mib"] == 100.0
    doc["memory"]["points"][0]["available_mib"] = 0
    with pytest.raises(BmoeError, match=r"memory\.points\[0\]\.available_mib must be > 0"):
        profile_from_dict(doc)
    doc["memory"] = {"points": []}
    with pytest.raises(BmoeError, match=r"memory\.ms_per_fault is missing"):
        profile_from_dict(doc)
    doc["memory"] = {}  # a profile without memory pressure writes an empty section
    assert profile_from_dict(doc).memory == {}


def test_an_unsized_profile_reads_only_as_version_2_without_a_source(corpus):
    doc = _doc(corpus)
    doc["model"].update(expert_bytes={}, read_bytes_per_expert={}, sizes_from=None)
    assert not profile_from_dict(doc).sized
    doc["model"]["sizes_from"] = "the route trace t.csv"
    with pytest.raises(BmoeError, match=r"model\.expert_bytes must map layers to bytes"):
        profile_from_dict(doc)
    doc["model"]["sizes_from"] = None
    doc["version"] = 1
    with pytest.raises(BmoeError, match=r"model\.expert_bytes must map layers to bytes"):
        profile_from_dict(doc)


def test_a_written_profile_of_every_kind_reads_back(corpus, tmp_path):
    for i, doc in enumerate(_profiles(corpus)):
        path = tmp_path / f"p{i}.json"
        path.write_text(json.dumps(doc))
        assert read_profile(path).to_dict() == doc


def test_a_profile_of_wrong_types_through_predict_against_is_one_line(corpus, tmp_path):
    """The --against path reads the profile's runs and model error: a wrong one is refused
    where the file is read."""
    doc = _doc(corpus)
    doc["model_error"]["held_out"] = [{"run": 5}]
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    tiny = corpus / "native-tiny"
    result = run_in_process(["predict", "-p", str(path), "--against", str(tiny / "run.csv")])
    assert result.code == 2 and result.traceback is None, result.err
    assert "model_error.held_out[0].run must be text" in " ".join(result.err.split())
