"""The text ``bmoe tune`` prints: the recommendation (as a command line and a TOML snippet),
its measured objective with its interval, the runner-up, the device time against the grid's,
and predicted against measured for every run."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: Cells named one per line before the rest are counted.
SHOWN = 6
#: Runs shown predicted against measured (the latest; tune.json keeps them all).
RUN_ROWS = 5


def _num(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def tune_report(state: Mapping[str, Any]) -> str:
    """The tune's answer from its ``tune.json`` state, as plain text."""
    result = state.get("result") or {}
    stop = result.get("stop") or state.get("stop") or {}
    objective = state.get("objective", "tok_s")
    lines = [f"stopped: {stop.get('sentence', '?')}"]
    if result.get("settle_runs"):
        lines.append(
            f"not settled: about {result['settle_runs']} more runs would settle it (a larger "
            "budget, then bmoe tune DIR)"
        )
    best = result.get("best")
    if best:
        level = round(100 * float(best.get("confidence", 0.95)))
        half = (best["high"] - best["low"]) / 2 if best["high"] is not None else None
        lines += [
            f"best: {best['label']}",
            f"  {objective} {_num(best['objective'])} ± {_num(half)} ({level} % interval of the "
            f"mean of {best['runs']} runs)",
        ]
        worst = [f"{k[6:]} {_num(v)}" for k, v in best.items() if k.startswith("worst_")]
        if worst:
            lines.append("  worst run: " + ", ".join(worst))
        lines += [f"  why: {why}" for why in result.get("reasons") or []]
        lines += ["  command: " + best["command"], "  toml:"]
        lines += ["    " + line for line in best["toml"].strip().splitlines()]
    elif result.get("cells_measured") == 0:
        lines.append("no cell was measured")
    else:
        n = result.get("cells_measured")
        lines.append(
            f"none of the {n} cells measured satisfies every constraint"
            if n
            else "no cell was measured that satisfies every constraint"
        )
    runner = result.get("runner_up")
    if best and runner:
        span = f"{_num(runner['ratio_low'])} to {_num(runner['ratio_high'])}"
        if runner.get("distinguishable"):
            how = f"the best is {_num(runner['ratio'])}x ({span}) better: distinguishable"
        elif runner.get("ratio_low") is None:
            how = "not distinguishable (a single run)"
        else:
            how = f"not distinguishable ({_num(runner['ratio'])}x, {span} includes 1)"
        lines.append(
            f"runner-up: {runner['label']}: {objective} {_num(runner['objective'])}, {how}"
        )
    infeasible = result.get("infeasible") or {}
    if infeasible:
        lines.append("never recommended (a run broke a constraint):")
        shown = list(infeasible.items())
        lines += [f"  {label}: {why}" for label, why in shown[:SHOWN]]
        if len(shown) > SHOWN:
            lines.append(f"  ... and {len(shown) - SHOWN} more (tune.json names them)")
    if result.get("excluded"):
        lines.append(
            f"not run: {result['excluded']} cells no less lossy than a cell that broke a "
            "fidelity constraint (tune.json names them)"
        )
    grid_s = result.get("grid_predicted_device_s")
    used_s = result.get("used_device_s")
    share = f": {100 * used_s / grid_s:.0f} % of it" if grid_s and used_s is not None else ""
    lines.append(
        f"device time: {_num(used_s, 1)} s in {result.get('used_runs')} runs; the full grid: "
        f"{result.get('grid_runs')} runs, predicted {_num(grid_s, 1)} s{share}"
    )
    runs = state.get("runs") or []
    if runs:
        named = "/".join([*(state.get("axes") or []), "repeat"])
        lines.append(f"predicted against measured ({objective}; runs by {named}):")
        lines.append(f"  {'round':>5}  {'predicted':>9}  {'measured':>9}  {'error':>7}  run")
        for row in runs[-RUN_ROWS:]:
            err = row.get("error_pct")
            error = f"{err:.1f} %" if err is not None else "-"
            lines.append(
                f"  {row['round']:>5}  {_num(row.get('predicted')):>9}  "
                f"{_num(row.get('measured')):>9}  {error:>7}  {row.get('short') or row['run']}"
            )
        if len(runs) > RUN_ROWS:
            lines.append(f"  ... the last {RUN_ROWS} of {len(runs)} runs (tune.json has every one)")
    return "\n".join(lines)
