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


#: Leave one lever out on the corpus and the archives (``benchmarks/bench_predict_corpus.py``,
#: recorded 2026-12-03), and phone runs of other days held out from the corpus.
_PHONE_HELD_OUT = (
    "phone runs of a 48-layer Q4_K_M model recorded on other days, predicted from two-run "
    "profiles of that model"
)
# fmt: off
_RECORDED = (
    _effect(
        "prefetch",
        (58.0, -21.5, -4.4, -11.0, -12.9, -8.1, -11.0, -5.8, -12.3, -7.8, -4.3),
        f"{_PHONE_HELD_OUT}: a prefetch-1 run (8 lanes, overlap) from a profile of two "
        "prefetch-0 runs (+58 %); the corpus's qwen_pf2 from profiles of one and two prefetch-0 "
        "files (-22 to -4 %); native-tiny's pf run from its run without prefetch (-4 %)",
    ),
    _effect(
        "cache_mb",
        (43.0, 27.1, 18.3, 13.5, 23.4, 13.6, 54.6, 74.0, 100.2, 149.6, 132.2, 186.8, -28.2,
         -15.4, -29.0, -31.9, -10.3, -31.1, -23.2, -43.3, -28.6, -59.3, -38.9, -55.8),
        f"{_PHONE_HELD_OUT}: a 4,000 MiB run from a profile whose largest run cached 3,000 "
        "MiB (+43 %); the corpus's qwen_auto_ov (4,675 MiB) from profiles of the 4,000 MiB "
        "files (+14 to +27 %); the archived tiny-cache-lanes sweep, its 4 and 8 MiB cells "
        "from profiles of its 0 and 1 MiB cells at each lane count (-59 to +187 %)",
    ),
    _effect(
        "policy",
        (52.0,),
        f"{_PHONE_HELD_OUT}: a cache_policy=layer-lfu run from an LRU-only profile (+52 %, "
        "compute 0.19 s a token against 0.10)",
    ),
    _effect(
        "io_threads",
        (-27.2, -36.2, -37.8, -30.1, -24.9, -36.2, -52.3, -43.9, -52.9, -42.0, -57.2, -46.1,
         -4.1, 2.5, -7.0, 14.9, 23.4, 4.8, 55.4, 74.8, 101.1, -4.1, -29.3, -10.8, -6.3, 0.1,
         -9.2, 13.4, -0.6, -3.1, 52.3, 71.4, 97.2, -22.8, -9.0, -23.6),
        "the archived tiny-cache-lanes sweep: each lane count's cells predicted from a "
        "profile of another lane count's (-57 to +101 %)",
    ),
    _effect(
        "overlap",
        (36.8, 8.9, 30.6, 22.0, 8.9, 30.6, 22.0, 29.0, 20.4, 26.2),
        "the corpus's serial qwen_c4000_l4 from profiles of --overlap files only (lane busy "
        "time taken for a serial batch's wait: +9 to +37 %)",
    ),
    _effect(
        "drop",
        (-9.6,),
        "native-tiny's drop run (--drop-cold-experts 1.0) from its run without dropping, "
        "replayed with the drop (-10 %)",
    ),
    _effect(
        "flash_volume",
        (20.8, 12.0, 24.9, 27.8, 34.3, 20.9, 11.6, 12.3, -0.3, -6.4, -2.3, 16.1, 24.7, -2.3,
         21.8, 19.0, 32.4, 26.7, 33.6, 49.2, 67.9),
        "generated models on the laptop (bench_predict_models.py, deepseek2, gemma4 and a "
        "qwen3moe with a type per layer, recorded on a quiet machine): the flash wait a token "
        "(measured over priced, not tok/s) of cells reading another volume than the one "
        "profile configuration at their lane count, priced as if a request took what it took "
        "there (-6 to +68 %: the wait per MiB grows as the reads fall, by a cause its runs do "
        "not show)",
    ),
    _effect(
        "memory",
        (43.0, 27.1, 18.3, 13.5, 23.4, 13.6),
        f"{_PHONE_HELD_OUT}: the 4,000 MiB run above, which asked for more memory than any "
        "profile run and ran with MemAvailable near 1.5 GB against 2.7 (+43 %); the corpus's "
        "qwen_auto_ov, which asked 680 MiB more than any 4,000 MiB run (+14 to +27 %)",
    ),
)
# fmt: on

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
