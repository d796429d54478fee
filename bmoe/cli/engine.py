"""``bmoe run`` (the embedded engine, native ``bmoe-cli`` flags) and ``bmoe model synth``."""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

from bmoe.cli import app, console, err_console

model_app = typer.Typer(help="Make and inspect model files.", no_args_is_help=True)
app.add_typer(model_app, name="model")

_RUN_HELP = """Run a GGUF MoE model on llama-cpp-python, streaming the routed experts from flash.

Takes the native bmoe-cli flags and writes the same files and stdout lines:
-m/--model PATH, -p/--prompt STR, -n/--n-predict N, -t/--threads N, -c/--ctx-size N,
--ubatch N, --n-expert-used N, --temp F, --top-k N, --top-p F, --seed N, --progress,
--csv PATH, --route-trace PATH, --io-trace PATH, --compute-trace PATH,
--compute-trace-layers PATH, --moe-stream, --cache-mb N|auto, --cache-floor-mb N,
--cache-ceil-mb N, --force-cache, --io-threads N, --no-odirect, --load-all, --prefetch K,
--dense-weights mmap|warm, --version.

Example: bmoe run -m tiny.gguf -n 64 --moe-stream --cache-mb 2 --csv run.csv --progress
"""


@app.command(
    "run",
    help=_RUN_HELP,
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
def run(ctx: typer.Context) -> None:
    from bmoe.engine.embedded.config import parse_args
    from bmoe.engine.embedded.run import run_engine
    from bmoe.engine.embedded.telemetry import engine_version

    cfg, version = parse_args(ctx.args)
    if version:
        console.out(engine_version(), highlight=False)
        return
    run_engine(cfg, out=sys.stdout.buffer, err=sys.stderr)


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
    type_: str | None = typer.Option(None, "--type", help="Weight type: f32, f16 or q8_0."),
    seed: int | None = typer.Option(None, help="Random seed of the weights."),
    skew: float | None = typer.Option(None, help="Router skew: 0 = uniform; larger = hotter."),
) -> None:
    """Write a synthetic qwen3moe GGUF model that llama.cpp loads.

    Larger models: override the preset's sizes, e.g.
    bmoe model synth big.gguf --preset small --layers 48 --experts 128 --n-embd 1024
    --n-ff-exp 768 --type q8_0 (about 10 GB).

    Example: bmoe model synth tiny.gguf --preset tiny
    """
    from bmoe.engine.synth import estimate_bytes, preset_config, synth_model

    overrides = {
        "layers": layers,
        "experts": experts,
        "top_k": top_k,
        "n_embd": n_embd,
        "n_ff_exp": n_ff_exp,
        "vocab": vocab,
        "type": type_,
        "seed": seed,
        "skew": skew,
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
            out, preset, progress=lambda done, _t: bar.update(task, completed=done), **overrides
        )
    console.out(f"{path}: {path.stat().st_size / 2**20:.1f} MiB", highlight=False)
