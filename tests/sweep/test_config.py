"""Sweep configuration and plan: validation with located errors, grid expansion, order."""

from __future__ import annotations

import itertools
import tomllib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bmoe.sweep.config import ConfigError, parse_config, resolved_toml
from bmoe.sweep.plan import make_plan
from bmoe.sweep.tomltext import dumps, key_lines

BASE = """\
[sweep]
name = "t"

[base]
model = "m.gguf"
prompt = "hello"
"""


def config(text: str, tmp_path=None):
    return parse_config(text, "cfg.toml", base_dir=tmp_path or "/")


def error_of(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        make_plan(config(text))
    return info.value


def line_with(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


@pytest.mark.parametrize(
    ("extra", "needle", "key", "says"),
    [
        ("[grid]\ncache_mb = 8\n", "cache_mb = 8", "grid.cache_mb", "list of values"),
        ("[grid]\ncache_mb = []\n", "cache_mb = []", "grid.cache_mb", "at least one"),
        ("[grid]\ncache_mb = [1, 1]\n", "cache_mb = [1, 1]", "grid.cache_mb", "twice"),
        ("[gate]\nmax_cpu_temp = 50\n", "max_cpu_temp = 50", "gate.max_cpu_temp", "did you mean"),
        ("[[targets]]\nkind = \"adb\"\nserial = \"x\"\n", "[[targets]]", "targets[0]",
         "binary"),
        ("[[targets]]\nkind = \"ssh\"\nserial = \"x\"\nhost = \"h\"\nbinary = \"b\"\n",
         "serial = \"x\"", "targets[0].serial", "unknown key"),
        ("[[targets]]\nkind = \"ssh\"\nhost = \"h\"\nbinary = \"b\"\nport = \"22\"\n",
         "port = \"22\"", "targets[0].port", "integer"),
        ("[[cells]]\ncsv = \"/etc/passwd\"\n", "csv = \"/etc/passwd\"", "cells[0].csv",
         "sweep folder"),
        ("[[cells]]\nprogress = true\n", "progress = true", "cells[0].progress",
         "set by the sweep"),
        ("[grid]\nio_threads = [1, 2]\n[[exclude]]\nio_threads = 3\n", "[[exclude]]",
         "exclude[0]", "matches no cell"),
        ("[grid]\nio_threads = [1, 2]\n[[exclude]]\ncache_mb = 3\n", "cache_mb = 3",
         "exclude[0].cache_mb", "no cell sets"),
        ("[pair]\naxis = \"prefetch\"\n", "axis = \"prefetch\"", "pair.axis", "does not vary"),
        ("[grid]\nmodel = [\"a\", \"b\"]\n", "model = [\"a\", \"b\"]", "grid.model",
         "both in [base]"),
    ],
)  # fmt: skip
def test_errors_name_the_key_and_its_line(extra, needle, key, says):
    text = BASE + extra
    err = error_of(text)
    assert err.key == key
    assert err.line == line_with(text, needle)
    assert says in err.problem
    assert str(err).startswith(f"cfg.toml:{err.line}: {key}: ")


def test_sweep_section_errors():
    text = '[sweep]\nname = "x"\norder = "shuffle"\n[base]\nmodel = "m"\n'
    err = error_of(text)
    assert (err.key, err.line) == ("sweep.order", 3) and "seed" in err.problem
    err = error_of('[sweep]\nname = "x"\nseed = 3\n[base]\nmodel = "m"\n')
    assert (err.key, err.line) == ("sweep.seed", 3)
    err = error_of('[sweep]\nname = "has space"\n')
    assert err.key == "sweep.name" and err.line == 2
    err = error_of('[sweep]\nname = "x"\nrepeats = 0\n')
    assert err.key == "sweep.repeats" and "at least 1" in err.problem
    err = error_of('[sweep]\nname = "x"\nengine = "embedded"\n[base]\nmodel = "m"\n'
                   '[[targets]]\nkind = "adb"\nbinary = "b"\n')  # fmt: skip
    assert err.key == "targets[0].kind" and err.line == 7
    err = error_of('[sweep]\nname = "x"\n[bogus]\n')
    assert err.key == "bogus" and err.line == 3
    err = error_of('[sweep]\nname = "x"\n[base]\nprompt = "p"\n')
    assert "model" in err.problem
    with pytest.raises(ConfigError) as info:
        config('[sweep]\nname = "x"\nrepeats = \n')
    assert info.value.line == 3 and "not valid TOML" in str(info.value)


def test_tags_must_be_satisfiable():
    text = BASE + (
        '[grid]\nmodel_x = [1, 2]\n[[limit]]\nwhere = { model_x = 2 }\ntags = ["big"]\n'
        '[[targets]]\nname = "a"\nkind = "local"\n'
    )
    err = error_of(text.replace('model = "m.gguf"\n', 'model = "m.gguf"\n'))
    assert "big" in err.problem


def test_grid_product_exclusions_cells_and_limits():
    text = BASE + (
        "[grid]\ncache_mb = [0, 8, 16]\nio_threads = [1, 2]\n"
        "[[exclude]]\ncache_mb = 0\nio_threads = [2]\n"
        '[[cells]]\ncache_mb = 64\nio_threads = 4\ntags = ["big"]\n'
        '[[limit]]\nwhere = { cache_mb = 16 }\ntags = ["fast"]\n'
        '[[targets]]\nname = "a"\ntags = ["big", "fast"]\n'
        '[[targets]]\nname = "b"\n'
    )
    plan = make_plan(config(text))
    combos = [(c.params["cache_mb"], c.params["io_threads"]) for c in plan.cells]
    expected = [c for c in itertools.product([0, 8, 16], [1, 2]) if c != (0, 2)] + [(64, 4)]
    assert combos == expected
    assert all(c.params["prompt"] == "hello" for c in plan.cells)
    tags = {(c.params["cache_mb"], c.params["io_threads"]): c.tags for c in plan.cells}
    assert tags[(64, 4)] == {"big"} and tags[(16, 1)] == {"fast"} and tags[(8, 2)] == set()
    assert plan.axes == ["cache_mb", "io_threads"]
    assert len({c.id for c in plan.cells}) == len(plan.cells)


def test_order_modes_and_pairs():
    grid = '[grid]\nprefetch = [0, 1]\ncache_mb = [4, 8]\n[pair]\naxis = "prefetch"\n'
    plan = make_plan(config(BASE.replace('name = "t"', 'name = "t"\nrepeats = 2\n'
                                         'order = "alternate"') + grid))  # fmt: skip
    seq = [(r.cell.params["cache_mb"], r.cell.params["prefetch"], r.round) for r in plan.runs]
    assert seq == [(4, 0, 1), (4, 1, 1), (8, 0, 1), (8, 1, 1),
                   (8, 1, 2), (8, 0, 2), (4, 1, 2), (4, 0, 2)]  # fmt: skip
    assert [len(u.runs) for u in plan.units] == [2, 2, 2, 2]
    assert [r.order for r in plan.runs] == list(range(8))
    assert [r.reversed for r in plan.runs] == [False] * 4 + [True] * 4

    shuffled = BASE.replace('name = "t"', 'name = "t"\nrepeats = 3\norder = "shuffle"\nseed = 7')
    a = make_plan(config(shuffled + "[grid]\ncache_mb = [1, 2, 3, 4, 5]\n"))
    b = make_plan(config(shuffled + "[grid]\ncache_mb = [1, 2, 3, 4, 5]\n"))
    assert [r.id for r in a.runs] == [r.id for r in b.runs]
    rounds = [[r.cell.params["cache_mb"] for r in a.runs if r.round == k] for k in (1, 2, 3)]
    assert all(sorted(r) == [1, 2, 3, 4, 5] for r in rounds)
    assert len({tuple(r) for r in rounds}) > 1

    rev = make_plan(config(BASE.replace('name = "t"', 'name = "t"\norder = "reverse"')
                           + "[grid]\ncache_mb = [1, 2, 3]\n"))  # fmt: skip
    assert [r.cell.params["cache_mb"] for r in rev.runs] == [3, 2, 1]


def test_prompt_lines_and_prompt_file(tmp_path):
    (tmp_path / "prompts.txt").write_text('first prompt\n\nsecond "quoted" one\n')
    (tmp_path / "p.txt").write_text("line one\nline two\n")
    text = '[sweep]\nname = "p"\n[base]\nmodel = "m"\n[grid]\nprompt_lines = "prompts.txt"\n'
    plan = make_plan(config(text, tmp_path))
    assert [c.params["prompt"] for c in plan.cells] == ["first prompt", 'second "quoted" one']
    text = '[sweep]\nname = "p"\n[base]\nmodel = "m"\nprompt_file = "p.txt"\n'
    plan = make_plan(config(text, tmp_path))
    assert plan.cells[0].params["prompt"] == "line one\nline two\n"
    assert "prompt_file" not in plan.cells[0].params


def test_resolved_config_reloads_to_the_same_cells(tmp_path):
    text = BASE + (
        '[grid]\ncache_mb = [0, 8]\ntemp = [0.0, 0.7]\n[[cells]]\nprompt = "a \\"b\\"\\nc"\n'
        "cache_mb = 1\n[gate]\nmin_mem_available_mb = 500\n"
        '[[targets]]\nname = "phone"\nkind = "adb"\nserial = "S1"\nbinary = "/d/b"\n'
        'models = { "m.gguf" = "/data/local/tmp/m.gguf" }\n'
    )
    first = config(text, tmp_path)
    again = parse_config(resolved_toml(first), "resolved.toml", base_dir="/elsewhere")
    assert again.settings == first.settings
    assert [c.id for c in make_plan(again).cells] == [c.id for c in make_plan(first).cells]
    assert again.targets == first.targets and again.gate == first.gate


def test_key_lines_tracks_tables_arrays_and_multiline_strings():
    text = (
        '[sweep]\nname = "x"\nnote = """\nfake = 1\n"""\n[[targets]]\nname = "a"\n'
        '[[targets]]\n"quoted key" = 1\nmodels = { a = "1", b = "2" }\n'
        "list = [\n  1,\n  2,\n]\nafter = 3\n"
    )
    lines = key_lines(text)
    assert lines[("sweep", "name")] == 2
    assert ("sweep", "fake") not in lines
    assert lines[("targets", 0, "name")] == 7
    assert lines[("targets", 1)] == 8
    assert lines[("targets", 1, "quoted key")] == 9
    assert lines[("targets", 1, "models", "b")] == 10
    assert lines[("targets", 1, "after")] == 15


scalars = st.one_of(
    st.text(max_size=20),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
    st.booleans(),
)
keys = st.text(min_size=1, max_size=8)


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(keys, scalars, max_size=4),
    st.dictionaries(keys, st.lists(scalars, max_size=3), max_size=3),
    st.lists(st.dictionaries(keys, scalars, min_size=1, max_size=3), max_size=3),
)
def test_toml_writer_round_trips(table, lists, array):
    doc = {"t": table, "g": lists}
    if array:
        doc["a"] = array
    assert tomllib.loads(dumps(doc)) == doc


@pytest.mark.parametrize(
    ("extra", "needle", "key", "says"),
    [
        ('[grid]\nprompt = ["a\\u0000b"]\n', "prompt = [", "grid.prompt", "NUL"),
        ('[[targets]]\nname = "h"\nenv = { A = "x\\u0000" }\n', "env = {", "targets[0].env.A",
         "NUL"),
        ('[[targets]]\nname = "h"\nenv = { "A=B" = "x" }\n', "env = {", 'targets[0].env.A=B',
         "no '='"),
        ('[[targets]]\nname = "h"\nenv = { "1A" = "x" }\n', "env = {", "targets[0].env.1A",
         "environment variable name"),
        ("[grid]\ncache_mb = [8, inf]\n", "cache_mb = [8, inf]", "grid.cache_mb", "finite"),
        ("[grid]\ncache_mb = [nan]\n", "cache_mb = [nan]", "grid.cache_mb", "finite"),
        ("[[cells]]\ncache_mb = -inf\n", "cache_mb = -inf", "cells[0].cache_mb", "finite"),
    ],
)  # fmt: skip
def test_values_no_run_could_carry_are_refused_before_the_first_run(extra, needle, key, says):
    text = BASE + extra
    err = error_of(text)
    assert err.key == key, str(err)
    assert err.line == line_with(text, needle)
    assert says in err.problem


def test_a_nul_in_a_prompt_file_is_refused(tmp_path):
    (tmp_path / "p.txt").write_text("one\x00two", encoding="utf-8")
    text = '[sweep]\nname = "t"\n[base]\nmodel = "m"\nprompt_file = "p.txt"\n'
    with pytest.raises(ConfigError, match="NUL") as info:
        make_plan(parse_config(text, "cfg.toml", base_dir=tmp_path))
    assert info.value.key == "base.prompt_file"


def test_a_config_path_with_a_newline_archives_a_config_that_loads_again(tmp_path):
    folder = tmp_path / "odd\nname"
    folder.mkdir()
    path = folder / "sweep\n[evil]\nx = 1.toml"
    path.write_text(BASE, encoding="utf-8")
    from bmoe.sweep.config import load_config

    cfg = load_config(path)
    archived = resolved_toml(cfg)
    again = parse_config(archived, "sweep.toml", base_dir="/")
    assert tomllib.loads(archived).keys() == {"sweep", "base", "targets"}
    assert again.settings.base_dir == str(folder.resolve())
    assert make_plan(again).cells[0].params == make_plan(cfg).cells[0].params


@pytest.mark.parametrize("prompt", ["--help", "-h", "--version", "-n", "--prompt=x"])
def test_a_prompt_that_looks_like_a_flag_reaches_the_embedded_engine_as_a_prompt(prompt):
    from bmoe.engine.embedded.config import parse_args
    from bmoe.engine.native import engine_args
    from bmoe.sweep.flags import attached_values

    params = {"model": "m.gguf", "prompt": prompt, "n_predict": 3, "temp": -1.5}
    argv = attached_values(engine_args(params, {"csv": "run.csv"}))
    assert f"--prompt={prompt}" in argv and "--temp=-1.5" in argv
    assert "--help" not in argv and "--version" not in argv
    engine_config, version = parse_args(argv, env={})
    assert (engine_config.prompt, engine_config.temp, version) == (prompt, -1.5, False)
    assert engine_config.n_predict == 3


def test_bmoe_run_takes_an_attached_help_prompt_as_a_prompt(capsys):
    from bmoe.cli import main

    # Without a model the run stops at the configuration check: no help text was printed.
    assert main(["run", "--prompt=--help"]) == 2
    captured = capsys.readouterr()
    assert "model is required" in captured.err and "Usage" not in captured.out + captured.err


EMBEDDED = """\
[sweep]
name = "t"
engine = "embedded"

[base]
model = "m.gguf"
"""


def flags_error(text: str, tmp_path) -> ConfigError:
    from bmoe.sweep.flags import check_flags
    from bmoe.sweep.targets import open_target

    cfg = config(text)
    targets = [open_target(spec, tmp_path) for spec in cfg.targets]
    with pytest.raises(ConfigError) as info:
        check_flags(cfg, make_plan(cfg).cells, targets)
    return info.value


@pytest.mark.parametrize(
    ("extra", "needle", "key", "says"),
    [
        ("[grid]\nio_thread = [1, 2]\n", "io_thread", "grid.io_thread",
         "--io-thread is not a flag of the embedded engine (did you mean 'io_threads'?)"),
        ("overlap = true\n", "overlap", "base.overlap",
         "--overlap is a native bmoe-cli flag the embedded engine does not implement"),
        ("[[cells]]\ncache_mb = 1\n[[cells]]\ncache_mb = 2\nmtp = true\n", "mtp", "cells[1].mtp",
         "does not implement"),
        ("route_trace = true\n[grid]\ncache_mb = [1, 2]\n", "[grid]", "grid",
         "--route-trace needs --moe-stream"),
        ('[grid]\ndense_weights = ["mmap", "ahwb"]\n', "[grid]", "grid",
         "implements mmap, warm and anon"),
        ('[[targets]]\nname = "here"\nenv = { BMOE_OVERLAP = "1" }\n', "[base]", "base",
         "BMOE_OVERLAP=1"),
    ],
)  # fmt: skip
def test_embedded_flags_are_checked_against_its_own_table(tmp_path, extra, needle, key, says):
    text = EMBEDDED + extra
    err = flags_error(text, tmp_path)
    assert err.key == key, str(err)
    assert err.line == line_with(text, needle)
    assert says in err.problem


def test_native_flags_are_checked_against_the_binarys_help(tmp_path):
    from sweep_helpers import install_fake_cli

    from bmoe.sweep.flags import check_flags, native_flags
    from bmoe.sweep.targets import open_target

    fake = install_fake_cli(tmp_path / "bin")
    text = BASE + f'cache_mb = 8\n[grid]\nio_thread = [1, 2]\n[[targets]]\nbinary = "{fake}"\n'
    cfg = config(text)
    targets = [open_target(spec, tmp_path) for spec in cfg.targets]
    table = native_flags(targets[0])
    assert table is not None and {"--cache-mb", "--io-threads", "-m"} <= table.known
    with pytest.raises(ConfigError) as info:
        check_flags(cfg, make_plan(cfg).cells, targets)
    assert info.value.key == "grid.io_thread" and "did you mean 'io_threads'?" in str(info.value)
    # Without probing the target (a farm's driver), native flags are not checked.
    assert check_flags(cfg, make_plan(cfg).cells, targets, probe=False) == []


def test_a_model_the_native_engine_would_not_stream_is_refused_before_any_run(tmp_path):
    """Its architecture read from the GGUF header: a streamed cell of a Mixtral-style llama is
    refused with the line that names the model; the same cell unstreamed, or a family the
    native engine streams, passes."""
    pytest.importorskip("gguf", reason="the engine extra (gguf) makes the models")
    from bmoe.engine.synth import synth_model
    from bmoe.sweep.flags import check_flags
    from bmoe.sweep.targets import open_target

    for arch in ("llama", "qwen3moe"):
        synth_model(tmp_path / f"{arch}.gguf", "tiny", arch=arch)

    def check(model: str, stream: str) -> list[str]:
        text = f'[sweep]\nname = "t"\n\n[base]\nmodel = "{model}"\n{stream}'
        cfg = config(text, tmp_path)
        targets = [open_target(spec, tmp_path / "state") for spec in cfg.targets]
        return check_flags(cfg, make_plan(cfg).cells, targets, probe=False)

    with pytest.raises(ConfigError) as info:
        check("llama.gguf", "moe_stream = true\n")
    err = info.value
    assert (err.key, err.line) == ("base.model", 5)
    assert "no MoE recipe for architecture 'llama'" in err.problem
    assert 'engine = "embedded"' in err.problem and "qwen3moe" in err.problem
    assert check("llama.gguf", "") == []  # not streamed: the native engine loads it
    assert check("qwen3moe.gguf", "moe_stream = true\n") == []
    assert check("elsewhere.gguf", "moe_stream = true\n") == []  # not here: the engine decides
