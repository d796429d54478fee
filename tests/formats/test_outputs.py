"""No command writes over an existing file without --force, and none over its own input even
with it (a link to an input counts as the input).

The commands' path options are enumerated from the command line itself: each must be
classified here as an input or an output, and each output must be a writer of
``hostile_inputs.WRITERS`` (run below over an existing file, its input and a link to its
input) or of ``DERIVED_WRITERS`` (names derived from inputs, with their own tests). A new
command that writes a file cannot pass unnoticed."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import ROOT
from hostile_inputs import DERIVED_WRITERS, WRITERS, run_in_process, writer_inputs, writer_scenarios

#: Every path the command line takes, by (command, parameter): what the command does with it.
PATHS = {
    ("info", "files"): "input",
    ("validate", "files"): "input",
    ("convert", "files"): "input",
    ("convert", "out_dir"): "convert",
    ("sweep", "config"): "input",
    ("sweep", "output"): "sweep folder",
    ("report", "paths"): "input",
    ("report", "out"): "report -o",
    ("report", "metrics"): "input",
    ("history", "folders"): "input",
    ("history", "plot"): "history --plot",
    ("profile", "paths"): "input",
    ("profile", "out"): "profile -o",
    ("profile", "probe_file"): "input",
    ("profile", "trace_path"): "input",
    ("profile", "model_path"): "input",
    ("predict", "paths"): "input",
    ("predict", "profile_path"): "input",
    ("predict", "csv_out"): "predict --csv",
    ("analyze metrics", "files"): "input",
    ("analyze stall", "file"): "input",
    ("analyze stall", "plot"): "analyze stall --plot",
    ("analyze compare", "files"): "input",
    ("analyze contamination", "paths"): "input",
    ("analyze route", "trace_path"): "input",
    ("analyze route", "plot"): "analyze route --plot",
    ("analyze sweep", "folder"): "input",
    ("analyze sweep", "plots"): "analyze sweep --plots",
    ("analyze replay", "trace_path"): "input",
    ("analyze replay", "metrics"): "input",
    ("analyze replay", "csv_out"): "analyze replay --csv",
    ("analyze replay", "plot"): "analyze replay --plot",
    ("analyze drop", "trace_path"): "input",
    ("analyze decode compute", "file"): "input",
    ("analyze decode compute", "metrics"): "input",
    ("analyze decode compute", "plot"): "analyze decode compute --plot",
    ("analyze decode io", "file"): "input",
    ("analyze decode io", "metrics"): "input",
    ("analyze decode io", "plot"): "analyze decode io --plot",
    ("export trace", "files"): "input",
    ("export trace", "out"): "export trace -o",
    ("model synth", "out"): "model synth",
    ("tune", "config"): "input",
    ("tune", "output"): "sweep folder",
}
#: ``bmoe run``'s path flags (its own flag table, not typer's).
RUN_PATHS = {
    "-m, --model": "input",
    "--csv": "run --csv",
    "--route-trace": "run --route-trace",
    "--io-trace": "run --io-trace",
    "--compute-trace": "run --compute-trace",
    "--compute-trace-layers": "run --compute-trace-layers",
    "--fidelity-save": "run --fidelity-save",
    "--fidelity-ref": "input",
}
#: Words that make a parameter of any type look like a file (``csv_out``, ``probe_file``).
_PATH_WORDS = {"out", "output", "csv", "plot", "plots", "file", "files", "path", "paths",
               "dir", "html", "json", "dest"}  # fmt: skip
#: Parameters named like a file that are not one.
NOT_PATHS = {("analyze route", "plot_kind")}


def _parameters():
    """(command, parameter name, is a path type) of every parameter of every command."""
    import typer

    import bmoe.cli

    bmoe.cli.register()

    def walk(command, path=()):
        if hasattr(command, "commands"):
            for name, sub in command.commands.items():
                yield from walk(sub, (*path, name))
            return
        for param in command.params:
            yield " ".join(path), param.name, type(param.type).__name__ == "TyperPath"

    return list(walk(typer.main.get_command(bmoe.cli.app)))


def test_every_path_parameter_is_classified():
    unclassified = []
    for command, name, is_path in _parameters():
        looks = is_path or bool(_PATH_WORDS & set(name.split("_")))
        if looks and (command, name) not in PATHS and (command, name) not in NOT_PATHS:
            unclassified.append(f"{command} {name}")
    assert not unclassified, f"classify these in PATHS (input, or its writer): {unclassified}"
    known = {(c, n) for c, n, _ in _parameters()}
    assert set(PATHS) <= known, set(PATHS) - known  # no stale entries


def test_every_run_path_flag_is_classified():
    from bmoe.engine.embedded.config import FLAG_HELP

    paths = {flags for flags, value, _ in FLAG_HELP if "PATH" in value}
    assert paths == set(RUN_PATHS), paths ^ set(RUN_PATHS)


def test_every_output_has_its_refusals_tested():
    outputs = {w for w in [*PATHS.values(), *RUN_PATHS.values()] if w != "input"}
    outputs -= {"sweep folder"}  # a folder of new sweep folders: never written over
    untested = outputs - set(WRITERS) - set(DERIVED_WRITERS)
    assert not untested, f"add these to hostile_inputs.WRITERS: {sorted(untested)}"
    assert set(WRITERS) <= outputs  # nothing listed that no command writes


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, corpus):
    folder = tmp_path_factory.mktemp("writers")
    sweep = ROOT / "bench-data" / "2026-11-29-small-traces"
    return folder, writer_inputs(corpus, folder / "in", sweep)


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_no_writer_overwrites_an_input_or_an_existing_file(inputs, writer):
    folder, paths = inputs
    scratch = folder / writer.replace(" ", "_").replace("-", "")
    scratch.mkdir()
    seen = []
    for scenario, args, keep in writer_scenarios(writer, scratch, paths):
        before = keep.read_bytes()
        result = run_in_process(args)
        assert result.code == 2, (writer, scenario, result.err)
        assert keep.read_bytes() == before, (writer, scenario)
        message = "is also an input" if scenario != "existing" else "pass --force"
        assert message in result.err, (writer, scenario, result.err)
        seen.append(scenario)
    assert seen[0] == "existing" and (len(seen) == 3 or WRITERS[writer][1] in (None, "sweep"))


def test_force_writes_over_an_existing_output(corpus, tmp_path):
    from hostile_inputs import good_profile

    tiny = corpus / "native-tiny"
    profile = tmp_path / "p.json"
    for args, dest in (
        (["profile", str(tiny / "run.csv"), "--allow-traced", "-o"], tmp_path / "new.json"),
        (["predict", str(tiny / "run.route.csv"), "-g", "cache_mb=1", "--csv"], tmp_path / "p.csv"),
    ):
        if args[0] == "predict":
            import json

            profile.write_text(json.dumps(good_profile(corpus)))
            args = [*args[:2], "-p", str(profile), *args[2:]]
        dest.write_text("old")
        assert run_in_process([*args, str(dest)]).code == 2 and dest.read_text() == "old"
        result = run_in_process([*args, str(dest), "--force"])
        assert result.code == 0, result.err
        assert dest.read_text() != "old"


def test_a_model_is_never_a_run_output_even_a_shard(tmp_path):
    shards = [tmp_path / f"m-0000{i}-of-00002.gguf" for i in (1, 2)]
    for shard in shards:
        shard.write_bytes(b"GGUF")
    result = run_in_process(["run", "-m", str(shards[0]), "--csv", str(shards[1]), "--force"])
    assert result.code == 2 and "is also an input" in result.err, result.err
    assert shards[1].read_bytes() == b"GGUF"
    both = str(tmp_path / "a.csv")
    args = ["run", "-m", str(shards[0]), "--moe-stream", "--csv", both, "--route-trace", both]
    result = run_in_process(args)
    assert result.code == 2 and "is also the output" in result.err, result.err


def test_synth_refuses_existing_shards(tmp_path):
    (tmp_path / "m-00001-of-00003.gguf").write_bytes(b"keep")
    result = run_in_process(
        ["model", "synth", str(tmp_path / "m.gguf"), "--split-max-tensors", "4"]
    )
    assert result.code == 2 and "pass --force" in result.err
    assert (tmp_path / "m-00001-of-00003.gguf").read_bytes() == b"keep"


def test_the_output_helper_directly(tmp_path: Path):
    from bmoe.errors import BmoeError
    from bmoe.formats.outputs import check_output, check_outputs

    src = tmp_path / "in.csv"
    src.write_text("x")
    link = tmp_path / "link.csv"
    link.symlink_to(src)
    hard = tmp_path / "hard.csv"
    hard.hardlink_to(src)
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    for dest in (src, link, hard, tmp_path / "." / "in.csv"):
        with pytest.raises(BmoeError, match="is also an input"):
            check_output(dest, [src], force=True)
    with pytest.raises(BmoeError, match="pass --force"):
        check_output(loop, [src])  # a dangling or looping link exists too
    with pytest.raises(BmoeError, match="is a directory"):
        check_output(tmp_path, force=True)
    assert check_output(tmp_path / "new.csv", [src]) == tmp_path / "new.csv"
    with pytest.raises(BmoeError, match="is also the output"):
        check_outputs([tmp_path / "a", None, tmp_path / "." / "a"], [src])


def test_predict_csv_is_never_a_measured_file_or_one_inside_a_measured_folder(corpus, tmp_path):
    """``predict --against`` reads loose metrics files and folders: --csv over one of them, or
    over a file inside a folder it reads, is refused even with --force."""
    import json

    from hostile_inputs import good_profile

    tiny = corpus / "native-tiny"
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps(good_profile(corpus)))
    loose = tmp_path / "run.csv"
    loose.write_bytes((tiny / "run.csv").read_bytes())
    folder = tmp_path / "runs"
    folder.mkdir()
    inner = folder / "a.csv"
    inner.write_bytes(loose.read_bytes())
    base = ["predict", str(tiny / "run.route.csv"), "-p", str(profile), "--against"]
    for measured, dest in ((loose, loose), (folder, inner)):
        before = dest.read_bytes()
        result = run_in_process([*base, str(measured), "--csv", str(dest), "--force"])
        assert result.code == 2 and "is also an input" in result.err, result.err
        assert dest.read_bytes() == before
    result = run_in_process([*base, str(loose), "--csv", str(profile), "--force"])
    assert result.code == 2 and "is also an input" in result.err, result.err


def test_profile_o_is_never_its_trace_or_model(corpus, tmp_path):
    tiny = corpus / "native-tiny"
    trace = tmp_path / "t.route.csv"
    trace.write_bytes((tiny / "run.route.csv").read_bytes())
    before = trace.read_bytes()
    args = ["profile", str(tiny / "run.csv"), "--allow-traced", "--trace", str(trace)]
    result = run_in_process([*args, "-o", str(trace), "--force"])
    assert result.code == 2 and "is also an input" in result.err, result.err
    assert trace.read_bytes() == before
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    result = run_in_process(["profile", str(tiny / "run.csv"), "--model", str(model),
                             "-o", str(model), "--force"])  # fmt: skip
    assert result.code == 2 and "is also an input" in result.err, result.err
    assert model.read_bytes() == b"GGUF"


def test_fidelity_save_is_never_the_reference_it_reads(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    ref = tmp_path / "ref.npz"
    ref.write_bytes(b"keep")
    args = ["run", "-m", str(model), "--fidelity-ref", str(ref), "--fidelity-save", str(ref)]
    result = run_in_process([*args, "--force"])
    assert result.code == 2 and "is also an input" in result.err, result.err
    assert ref.read_bytes() == b"keep"
