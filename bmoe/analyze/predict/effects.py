"""What each lever has been seen to do to a prediction that did not price it: the data an
unpriced lever's interval is widened by.

Each record is the spread (relative sd of the decode time, log scale: the root mean square
of ``ln(predicted / measured tok/s)``) of predictions that changed that lever from what
their profile's runs measured and priced it as if it were free, over the runs named in
``seen``; ``where`` says where those runs are and how the figure was made. A lever that no
run of the corpus or the archives varied takes the largest spread any lever was seen to
have (never zero: nothing measured it). The figures are re-measured by the
leave-one-lever-out check of ``benchmarks/bench_predict_corpus.py`` and
``benchmarks/bench_predict.py`` (see ``benchmarks/README.md``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class LeverEffect:
    """The spread of a lever's effect on predictions that did not price it."""

    lever: str
    sd_rel: float  # of the decode time, log scale
    seen: tuple[float, ...]  # the errors it was measured from, % of tok/s
    where: str

    @property
    def effect_pct(self) -> float:
        return 100.0 * self.sd_rel


def _rms_log(errors_pct: tuple[float, ...]) -> float:
    """The root mean square of ln(1 + error) over errors in % of tok/s."""
    return math.sqrt(sum(math.log1p(e / 100.0) ** 2 for e in errors_pct) / len(errors_pct))


def _effect(lever: str, seen: tuple[float, ...], where: str) -> LeverEffect:
    return LeverEffect(lever, _rms_log(seen), seen, where)


_RECORDED = (
    _effect(
        "prefetch",
        (58.0, -9.7, -21.5, -4.4, -11.0, -12.9, -8.1, -11.0),
        "phone: a 48-layer Q4_K_M model's prefetch-1 run (8 lanes, overlap) from a profile of "
        "two prefetch-0 runs, recorded on another day (+58 %); the corpus's qwen_pf2 from "
        "profiles of prefetch-0 --overlap runs of one and two files (-22 to -4 %)",
    ),
    _effect(
        "cache_mb",
        (43.0, 18.2, 23.4, 27.1, 25.4, 13.5),
        "phone: a 4,000 MiB run from a profile whose largest cached 3,000 MiB (+43 %, its "
        "MemAvailable 1.5 GB against 2.7); the corpus's qwen_auto_ov (4,675 MiB) from "
        "profiles of 4,000 MiB runs (+14 to +27 %)",
    ),
    _effect(
        "policy",
        (52.0,),
        "phone: a cache_policy=layer-lfu run from an LRU-only profile (+52 %, compute 0.19 s "
        "a token against 0.10)",
    ),
    _effect(
        "io_threads",
        (-44.0, -36.6, 38.0, 25.0, -20.0),
        "host: the archived tiny-cache-lanes sweep, profiles of one lane count predicting "
        "the others' cells (-44 to +38 %)",
    ),
    _effect(
        "overlap",
        (36.8, 30.6, 22.0, 8.9, 34.7, 33.7, 29.0, 29.0, 20.4, 26.2),
        "phone: the corpus's serial qwen_c4000_l4 from profiles of --overlap runs only (lane "
        "busy time taken for a serial batch's wait: +9 to +37 %)",
    ),
    _effect(
        "drop",
        (-13.0, -11.6),
        "host: native-tiny's drop run (--drop-cold-experts 1.0) from a profile of runs that "
        "did not drop, replayed with the drop (-13 and -12 %)",
    ),
    _effect(
        "memory",
        (43.0,),
        "phone: the 4,000 MiB run above, which asked for more memory than any profile run "
        "and ran with MemAvailable near 1.5 GB (+43 %)",
    ),
)

#: The recorded effects by lever.
EFFECTS: dict[str, LeverEffect] = {e.lever: e for e in _RECORDED}
#: A lever no run varied: the largest spread any lever was seen to have.
UNSEEN = max(_RECORDED, key=lambda e: e.sd_rel)


def effect_of(lever: str) -> LeverEffect:
    """The recorded effect of `lever`; for a lever never varied, the largest one recorded
    (under the lever's own name, saying so)."""
    if lever in EFFECTS:
        return EFFECTS[lever]
    return LeverEffect(
        lever,
        UNSEEN.sd_rel,
        UNSEEN.seen,
        f"no run of the corpus or the archives varied {lever}: the largest effect recorded "
        f"for any lever ({UNSEEN.lever})",
    )


__all__ = ["EFFECTS", "UNSEEN", "LeverEffect", "effect_of"]
