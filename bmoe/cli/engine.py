"""``bmoe run`` (the embedded engine, native ``bmoe-cli`` flags) and ``bmoe model synth``."""

from __future__ import annotations

import glob
import re
import sys
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

from bmoe.cli import app, console, err_console
from bmoe.render.messages import PrintableBytes

model_app = typer.Typer(help="Make and inspect model files.", no_args_is_help=True)
app.add_typer(model_app, name="model")

_RUN_HELP = """Run a GGUF MoE model on llama-cpp-python, streaming the routed experts from flash.

Takes the native bmoe-cli flags (bmoe run -h lists them) and writes the same files and lines.

Example: bmoe run -m tiny.gguf -n 64 --moe-stream --cache-mb 2 --csv tiny.csv --progress
"""

_RUN_EXAMPLES = (
    "bmoe run -m tiny.gguf -n 64 --moe-stream --cache-mb 2 --csv run.csv --progress",
    "bmoe run -m model-00001-of-00004.gguf --moe-stream --cache-mb auto --route-trace r.csv",
    "bmoe run -m tiny.gguf --moe-stream --cache-mb 2 --drop-cold-experts 0.75",
    "bmoe run -m tiny.gguf --moe-stream --cache-mb 2 --session < requests.jsonl",
)


def _print_flag_table() -> None:
    from rich.table import Table

    from bmoe.engine.embedded.config import FLAG_HELP

    console.print(
        "Usage: bmoe run -m MODEL.gguf [FLAGS]\n\n"
        "Runs a GGUF mixture-of-experts model on llama-cpp-python, streaming the routed "
        "experts from flash. The flags are the native bmoe-cli's; the files and stdout lines "
        "are the same.\n",
        highlight=False,
        markup=False,
    )
    table = Table(box=None, pad_edge=False, show_header=True, header_style="bold")
    table.add_column("flag", style="cyan", no_wrap=True)
    table.add_column("value", no_wrap=True)
    table.add_column("what it does")
    for flags, value, meaning in FLAG_HELP:
        table.add_row(flags, value, meaning)
    console.print(table)
    console.out("\nExamples:", highlight=False)
    for example in _RUN_EXAMPLES:
        console.out(f"  {example}", highlight=False)


class _ProgressView:
    """``--progress`` in a terminal: the BMOE_* lines drawn as a progress bar with the
    token rate, hit rate and reads; the answer and end-of-run lines printed as they come."""

    def __init__(self, out: Any = None) -> None:
        from rich.progress import Progress, TextColumn

        self._out = out or sys.stdout.buffer  # where the answer goes (the run: the filter)
        self._progress = Progress(
            *Progress.get_default_columns()[:3],
            TextColumn("{task.fields[info]}"),
            console=console,
            transient=True,
        )
        self._task: Any = None  # the rich TaskID once the first step arrives
        self._buffer = b""
        self._done = False
        self._progress.start()

    def write(self, data: bytes) -> int:
        if self._done:
            self._out.write(data)
            return len(data)
        self._buffer += data
        while not self._done and b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            self._line(line + b"\n")
        return len(data)

    def _line(self, line: bytes) -> None:
        from bmoe.formats import protocol

        event = protocol.parse_line(line) if line.startswith(b"BMOE_") else None
        if event is None:
            if line.strip():  # the answer banner: the bar is done, the rest is text
                self.close()
                self._out.write(line + self._buffer)
                self._buffer = b""
            return
        if event.tag != "PROGRESS":
            return
        data = event.data
        if self._task is None:
            self._task = self._progress.add_task("generating", total=data["steps"], info="")
        wall = max(float(data.get("wall_ms", 0.0)), 1e-6)
        info = (
            f"{1e3 / wall:6.1f} tok/s  hit {float(data.get('cache_hit_pct', -1)):5.1f} %  "
            f"read {float(data.get('read_mb', 0.0)):6.2f} MiB"
        )
        self._progress.update(self._task, completed=data["step"], info=info)

    def flush(self) -> None:
        if self._done:
            self._out.flush()

    def close(self) -> None:
        if not self._done:
            self._progress.stop()
            self._done = True


@app.command(
    "run",
    help=_RUN_HELP,
    context_settings={
        "allow_extra_args": True,
        "ignore_unknown_options": True,
        "help_option_names": [],
    },
)
def run(ctx: typer.Context) -> None:
    from bmoe.engine.embedded.config import parse_args, wants_help
    from bmoe.engine.embedded.run import run_engine
    from bmoe.engine.embedded.telemetry import engine_version

    if wants_help(ctx.args):
        _print_flag_table()
        return
    cfg, version = parse_args(ctx.args)
    if version:
        console.out(engine_version(), highlight=False)
        return
    _check_outputs(cfg)
    # the prompt echoed and the answer through the output filter (BMOE_* lines carry none)
    out = PrintableBytes(sys.stdout.buffer)
    try:
        if cfg.session:
            from bmoe.engine.embedded.serve import serve_session

            serve_session(cfg, stdin=sys.stdin.buffer, out=out, err=sys.stderr)  # type: ignore[arg-type]
        elif cfg.progress and sys.stdout.isatty():  # a person is watching: draw, not JSON
            view = _ProgressView(out)
            try:
                run_engine(cfg, out=view, err=sys.stderr)  # type: ignore[arg-type]
            finally:
                view.close()
        else:
            run_engine(cfg, out=out, err=sys.stderr)  # type: ignore[arg-type]
    finally:
        out.close()


def _shards(model: Path) -> list[Path]:
    """The files of a split model named like `model` (``<prefix>-00001-of-0000N.gguf``, the
    names llama.cpp and ``--split-max-tensors`` give) that exist beside it; `model` alone
    otherwise."""
    m = re.fullmatch(r"(.*)-\d{5}-of-(\d{5})\.gguf", model.name)
    if m is None:
        return [model]
    pattern = f"{glob.escape(m[1])}-[0-9][0-9][0-9][0-9][0-9]-of-{m[2]}.gguf"
    return [model, *model.parent.glob(pattern)]


def _check_outputs(cfg) -> None:
    """The run's files: never the model (or a shard of it) nor the fidelity reference it
    reads, an existing one only with --force."""
    from bmoe.formats.outputs import check_outputs

    dests = (cfg.csv, cfg.route_trace, cfg.io_trace, cfg.compute_trace, cfg.compute_trace_layers,
             cfg.fidelity_save)  # fmt: skip
    inputs = [*(_shards(Path(cfg.model)) if cfg.model else ()), cfg.fidelity_ref]
    check_outputs(dests, inputs, force=cfg.force)


@model_app.command("synth")
def synth(
    out: Path = typer.Argument(..., help="GGUF file to write."),
    preset: str = typer.Option("tiny", help="tiny (~8 MB, tests) or small (~1 GB)."),
    layers: int | None = typer.Option(None, help="Transformer layers (all MoE)."),
    experts: int | None = typer.Option(None, help="Experts per layer."),
    top_k: int | None = typer.Option(None, "--top-k", help="Experts routed per token."),
    n_embd: int | None = typer.Option(None, "--n-embd", help="Embedding width."),
    n_ff_exp: int | None = typer.Option(None, "--n-ff-exp", help="Expert hidden width."),
    vocab: int | None = typer.Option(None, help="Vocabulary size (>= 259)."),
    arch: str | None = typer.Option(
        None,
        "--arch",
        help="Family: qwen3moe (default), qwen2moe, llama, deepseek2, gpt-oss, gemma4.",
    ),
    type_: str | None = typer.Option(
        None, "--type", help="Weight type: f32, f16, q8_0, q4_0, q5_0 or mxfp4 (experts)."
    ),
    layer_types: str | None = typer.Option(
        None,
        "--layer-types",
        metavar="T1,T2,...",
        help="The experts' weight type layer by layer, cycled (q8_0,q4_0: even layers q8_0, "
        "odd q4_0), as a K-quant mixes types: expert sizes differ by layer.",
    ),
    seed: int | None = typer.Option(None, help="Random seed of the weights."),
    skew: float | None = typer.Option(None, help="Router skew: 0 = uniform; larger = hotter."),
    fused_gate_up: bool = typer.Option(
        False, "--fused-gate-up", help="deepseek2: one ffn_gate_up_exps tensor per layer."
    ),
    split_max_tensors: int = typer.Option(
        0,
        "--split-max-tensors",
        help="Split into shards of at most N tensors (OUT-00001-of-0000M.gguf); 0 = one file.",
    ),
    no_tensor_first_split: bool = typer.Option(
        False,
        "--no-tensor-first-split",
        help="With --split-max-tensors: the first shard holds the metadata only.",
    ),
    chat_template: str | None = typer.Option(
        None,
        "--chat-template",
        help="Write a chat template: chatml, or think (ChatML reading enable_thinking).",
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite model files that exist."),
) -> None:
    """Write a synthetic mixture-of-experts GGUF model that llama.cpp loads.

    Families: --arch qwen3moe (default), qwen2moe (a gated shared expert beside the routed
    ones), llama (Mixtral: a llama with routed experts), deepseek2 (a leading dense layer,
    shared experts, low-rank attention; --fused-gate-up stores ffn_gate_up_exps), gpt-oss
    (biases on the router and the experts, attention sinks; its experts ship in MXFP4),
    gemma4 (fused ffn_gate_up_exps, a dense MLP beside the experts, dense layers mixed in).

    Weight types: --type f32, f16, q8_0, q4_0, q5_0, mxfp4 (MXFP4 experts, the rest f16);
    --layer-types gives the experts a type per layer (mixed like a K-quant's).

    Larger models: every size of the preset can be overridden (--layers, --experts, --n-embd,
    --n-ff-exp, ...). A split model, as large models ship: --split-max-tensors N
    writes OUT-00001-of-0000M.gguf ...; run it with -m OUT-00001-of-0000M.gguf.

    Example: bmoe model synth tiny.gguf --preset tiny
    Example: bmoe model synth big.gguf --preset small --layers 48 --experts 128 --type q8_0
    Example: bmoe model synth split.gguf --split-max-tensors 16
    Example: bmoe model synth mixed.gguf --type q8_0 --layer-types q8_0,q4_0,q5_0
    """
    from bmoe.engine.synth import estimate_bytes, preset_config, synth_model
    from bmoe.formats.outputs import check_output

    if split_max_tensors > 0:  # the shards' names: OUT-00001-of-0000N.gguf, N not known yet
        stem = glob.escape(out.name.removesuffix(".gguf"))
        for shard in sorted(out.parent.glob(f"{stem}-[0-9]*-of-[0-9]*.gguf")):
            check_output(shard, force=force)
    else:
        check_output(out, force=force)

    overrides = {
        "layers": layers,
        "experts": experts,
        "top_k": top_k,
        "n_embd": n_embd,
        "n_ff_exp": n_ff_exp,
        "vocab": vocab,
        "type": type_,
        "arch": arch,
        "fused_gate_up": fused_gate_up or None,
        "seed": seed,
        "skew": skew,
        "chat_template": chat_template,
        "layer_types": tuple(t.strip() for t in layer_types.split(",") if t.strip())
        if layer_types
        else None,
    }
    overrides = {k: v for k, v in overrides.items() if v is not None}
    total = estimate_bytes(preset_config(preset, **overrides))
    columns = (
        *Progress.get_default_columns()[:1],
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=err_console, transient=True) as bar:
        task = bar.add_task(escape(f"writing {out.name}"), total=total)  # read as markup
        path = synth_model(
            out,
            preset,
            progress=lambda done, _t: bar.update(task, completed=done),
            split_max_tensors=split_max_tensors,
            no_tensor_first_split=no_tensor_first_split,
            **overrides,
        )
    from bmoe.engine.embedded.layout import read_layout

    shards = [Path(p) for p in read_layout(path).shards]
    size = sum(p.stat().st_size for p in shards) / 2**20
    more = f" ({len(shards)} shards)" if len(shards) > 1 else ""
    console.out(f"{path}: {size:.1f} MiB{more}", highlight=False)
