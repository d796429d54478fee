"""What the sweep runner costs per run, against a plain shell loop running the same commands.

    python benchmarks/bench_sweep.py [--runs-per-cell 5] [--tokens 16]

Both sides run the stand-in engine (tests/stand_ins/bmoe_cli.py) on a 2x2 grid with no
per-token delay, so the difference is the runner's own work per run: stray check, gate
reading, sampler, stream following, checksums, atomic rename, fsync'd manifest line. The
baseline is what an ad-hoc script does: ``for ...; do bmoe-cli ... > run.out; done``.
Prints both times, the per-run overhead, the ratio, the time to build results.parquet and
analyse the folder, and the peak RSS of this process.
"""

from __future__ import annotations

import argparse
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from sweep_helpers import install_fake_cli  # noqa: E402

from bmoe.analyze.sweep import analyze_sweep  # noqa: E402
from bmoe.sweep.archive import ArchiveWriter, load_results, results_frame  # noqa: E402
from bmoe.sweep.config import load_config, resolved_toml  # noqa: E402
from bmoe.sweep.plan import make_plan  # noqa: E402
from bmoe.sweep.runner import finish_results, run_sweep  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs-per-cell", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        fake = install_fake_cli(tmp_path / "bin")
        (tmp_path / "m.gguf").write_bytes(b"x")
        cfg = tmp_path / "bench.toml"
        cfg.write_text(
            f'[sweep]\nname = "bench"\nrepeats = {args.runs_per_cell}\n'
            f'output = "{tmp_path / "out"}"\n'
            f'[base]\nmodel = "m.gguf"\nprompt = "hello"\nn_predict = {args.tokens}\n'
            f"[grid]\ncache_mb = [0, 8]\nio_threads = [1, 2]\n"
            f'[[targets]]\nname = "here"\nbinary = "{fake}"\n'
        )
        config = load_config(cfg)
        plan = make_plan(config)
        n = len(plan.runs)

        # Baseline: the same engine commands from a shell loop, output to files.
        lines = []
        for i, run in enumerate(plan.runs):
            p = run.cell.params
            argv = [str(fake), "-m", str(tmp_path / "m.gguf"), "-p", "hello", "-n",
                    str(args.tokens), "--cache-mb", str(p["cache_mb"]), "--io-threads",
                    str(p["io_threads"]), "--csv", f"{i}.csv", "--progress"]  # fmt: skip
            lines.append(f"{shlex.join(argv)} > {i}.out 2> {i}.err")
        script = tmp_path / "loop.sh"
        script.write_text("\n".join(lines) + "\n")
        (tmp_path / "loop").mkdir()
        t0 = time.perf_counter()
        subprocess.run(["bash", str(script)], cwd=tmp_path / "loop", check=True)
        baseline = time.perf_counter() - t0

        archive = ArchiveWriter.create(tmp_path / "out", "bench", resolved_toml(config))
        t0 = time.perf_counter()
        outcome = run_sweep(config, plan, archive)
        swept = time.perf_counter() - t0
        assert outcome.completed == n, outcome.failed_runs

        t0 = time.perf_counter()
        frame = results_frame(archive.root)
        finish_results(archive, plan, config)
        analyze_sweep(load_results(archive.root))
        analysed = time.perf_counter() - t0

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"runs: {n} ({args.tokens} tokens each, stand-in engine, local target)")
    print(f"shell loop:   {baseline:7.2f} s  ({baseline / n * 1000:6.0f} ms/run)")
    print(f"bmoe sweep:   {swept:7.2f} s  ({swept / n * 1000:6.0f} ms/run)")
    print(
        f"overhead:     {(swept - baseline) / n * 1000:7.0f} ms/run, ratio {swept / baseline:.2f}x"
    )
    print(f"results + analysis of {len(frame)} attempts: {analysed:.2f} s")
    print(f"peak RSS (this process): {peak:.0f} MiB")


if __name__ == "__main__":
    main()
