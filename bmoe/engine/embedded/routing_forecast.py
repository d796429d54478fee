"""``--predict-log``: how well a layer's routing can be known before it happens.

Scored as the native engine scores it (telemetry.md, ``moe-predict:``), so the two engines print
the same counts on the same routing. In every decode of generated tokens (a verify decode
included), at each MoE layer ``l`` and for the batch's last token:

- **stale gate**: layer ``l + 1``'s router applied to layer ``l``'s gate input, a layer early;
- **stale-2**: layer ``l + 2``'s router on the same input, two layers early (aggregate only);
- **previous token**: what layer ``l`` routed for the previous token (the ``--prefetch`` bet;
  after a prompt, its last token's routing);
- **fresh-gate control**: layer ``l``'s own router on its own input, which must agree with the
  router wherever the model selects by ranking the raw router logits (a check of the
  arithmetic, not a predictor; a router bias or a selection bias puts it below 100 %).

Layers are counted as the model numbers them: a dense layer has no router, so the layer after
it has no stale-gate prediction. A router is known once a scored decode has reached it, so the
first decode of a process cannot rank ahead at all: each of its routings counts among the ones
the stale gate could not rank, as the first MoE layer's do in every decode. Rankings are the raw
logits, best first, ties to the lower expert id; only the first ``k`` of a ranking count.
Routings wider than 32 experts are declined (counted, not scored). The scores add up over the
whole process: in a session each turn prints the totals so far.

With ``--predict-prefetch`` the stale gate's pick for the next MoE layer (its best
``--predict-spec-max`` experts) is read ahead on idle lanes as soon as the current layer's
gate input exists, so those reads overlap the current layer's expert compute.

``--route-ahead N`` goes further: layer ``l``'s selection is *committed* at layer ``l - N``
(its router applied to that layer's input), read ahead at once, and written over the router's
ids at ``ffn_moe_topk-<l>`` before the weights chain and the expert matmul read them; the
first N MoE layers pass the router's choice through. It changes what is computed, by design.

The gate input is the second source of the ``ffn_moe_logits-<il>`` node; the routers are read
from the GGUF (dequantized once). The picks ``--predict-prefetch`` and ``--route-ahead`` act on
follow llama.cpp's selection: top-k of the softmax of the logits, plus the router bias and the
per-expert selection bias (``exp_probs_b``) where the model has them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from bmoe.engine.embedded.layout import ModelLayout

PREDICTORS = ("stale", "prev", "ctrl")
#: Routings wider than this are declined by the probe (the native engine ranks 32 at most).
MAX_RANKED = 32


def _common(a: np.ndarray, b: np.ndarray) -> int:
    """How many distinct values `a` and `b` share (as ``len(np.intersect1d(a, b))``; sets of
    a handful of ids cost a fraction of the array call)."""
    return len(set(np.asarray(a).ravel().tolist()).intersection(np.asarray(b).ravel().tolist()))


@dataclass
class _Tally:
    routings: int = 0
    slots: int = 0
    slots_hit: int = 0
    whole_hit: int = 0

    def add(self, predicted: np.ndarray, actual: np.ndarray) -> None:
        hit = _common(predicted, actual)
        self.routings += 1
        self.slots += len(actual)
        self.slots_hit += hit
        self.whole_hit += int(hit == len(actual))


@dataclass
class Router:
    """One layer's router: logits = weight @ x (+ bias); selection adds `select_bias`."""

    weight: np.ndarray  # (n_expert, n_embd) float32
    bias: np.ndarray | None = None
    select_bias: np.ndarray | None = None

    def ranking(self, x: np.ndarray, k: int) -> np.ndarray:
        """The `k` best experts by raw logit (``weight @ x``), best first, ties to the lower
        id: the probe's ranking, which sees neither bias."""
        logits = self.weight @ x
        return np.argsort(-logits, kind="stable")[:k]

    def top_k(self, x: np.ndarray, k: int) -> np.ndarray:
        logits = self.weight @ x
        if self.bias is not None:
            logits = logits + self.bias
        if self.select_bias is not None:
            z = np.exp(logits - logits.max())
            logits = z / z.sum() + self.select_bias
        top = np.argpartition(-logits, k - 1)[:k]
        return top[np.argsort(-logits[top], kind="stable")]  # best first


def read_routers(layout: ModelLayout) -> dict[int, Router]:
    """Every MoE layer's router, from the model's shards."""
    from gguf import GGUFReader, quants

    found: dict[str, np.ndarray] = {}
    wanted = set()
    for il in layout.moe_layers:
        wanted |= {
            f"blk.{il}.ffn_gate_inp.weight",
            f"blk.{il}.ffn_gate_inp.bias",
            f"blk.{il}.exp_probs_b.bias",
        }
    for shard in layout.shards:
        for t in GGUFReader(Path(shard)).tensors:
            if t.name in wanted:
                data = quants.dequantize(t.data, t.tensor_type)
                found[t.name] = np.asarray(data, dtype=np.float32)
    routers = {}
    for il in layout.moe_layers:
        weight = found.get(f"blk.{il}.ffn_gate_inp.weight")
        if weight is None:
            continue
        routers[il] = Router(
            weight.reshape(layout.n_expert, -1),
            _flat(found.get(f"blk.{il}.ffn_gate_inp.bias")),
            _flat(found.get(f"blk.{il}.exp_probs_b.bias")),
        )
    return routers


def _flat(a: np.ndarray | None) -> np.ndarray | None:
    return None if a is None else a.reshape(-1)


@dataclass
class RoutePredictor:
    """Scores the predictors routing by routing (see the module docstring), and holds the
    picks ``--predict-prefetch`` and ``--route-ahead`` act on."""

    routers: dict[int, Router]
    moe_layers: list[int]
    k: int
    ahead: int = 0  # --route-ahead N (0 = off)
    n_layer: int = 0  # the model's layers (0 = up to the last MoE layer)
    tallies: dict[str, dict[int, _Tally]] = field(default_factory=dict)
    stale2: _Tally = field(default_factory=_Tally)  # two layers early, aggregate only
    unranked: int = 0  # routings the stale gate could not rank (or declined)
    committed: int = 0  # --route-ahead: routings replaced by the committed selection
    passthrough: int = 0  # and routings left to the router (the first N layers)
    agree_slots: int = 0  # committed slots the router also chose

    def __post_init__(self) -> None:
        self.tallies = {p: {il: _Tally() for il in self.moe_layers} for p in PREDICTORS}
        if not self.n_layer:
            self.n_layer = max(self.moe_layers, default=-1) + 1
        self._next = dict(zip(self.moe_layers, self.moe_layers[1:], strict=False))
        self._seen: set[int] = set()  # routers a scored decode has reached
        self._stale: dict[int, np.ndarray] = {}
        self._stale2: dict[int, np.ndarray] = {}
        self._ctrl: dict[int, np.ndarray] = {}
        self._prev: dict[int, np.ndarray] = {}
        self._pick: dict[int, np.ndarray] = {}  # --predict-prefetch: the next MoE layer's
        self._commit: dict[int, np.ndarray] = {}
        self._ahead = (
            dict(zip(self.moe_layers, self.moe_layers[self.ahead :], strict=False))
            if self.ahead
            else {}
        )
        self.active = False  # set per decode: only decodes of generated tokens are scored

    def gate_input(self, layer: int, x: np.ndarray) -> None:
        """Layer `layer`'s router is about to run on `x` (the gate input of the batch's last
        token)."""
        if not self.active:
            return
        x = np.asarray(x, dtype=np.float32).reshape(-1)
        self._seen.add(layer)
        k = min(self.k, MAX_RANKED)
        router = self.routers.get(layer)
        if router is not None:
            self._ctrl[layer] = router.ranking(x, k)
        for ahead, store in ((1, self._stale), (2, self._stale2)):
            target = layer + ahead
            store.pop(target, None)
            if target < self.n_layer and target in self._seen and target in self.routers:
                store[target] = self.routers[target].ranking(x, k)
        nxt = self._next.get(layer)
        if nxt is not None and nxt in self.routers:
            self._pick[nxt] = self.routers[nxt].top_k(x, self.k)
        later = self._ahead.get(layer)
        if later is not None and later in self.routers:
            self._commit[later] = self.routers[later].top_k(x, self.k)

    def ahead_target(self, layer: int) -> int | None:
        """``--route-ahead``: the layer whose selection is committed at `layer`."""
        return self._ahead.get(layer)

    def commitment(self, layer: int) -> np.ndarray | None:
        """``--route-ahead``: the selection committed for `layer` (best first), if any."""
        return self._commit.get(layer)

    def take_commitment(self, layer: int, router_ids: np.ndarray) -> np.ndarray | None:
        """The committed selection that replaces the router's `router_ids` at `layer`, with
        the agreement counted; None (passed through) where nothing was committed."""
        if not self.active or not self.ahead:
            return None
        chosen = self._commit.pop(layer, None)
        if chosen is None:
            self.passthrough += 1
            return None
        self.committed += 1
        self.agree_slots += _common(chosen, router_ids)
        return chosen

    @property
    def agree_pct(self) -> float:
        return 100.0 * self.agree_slots / (self.committed * self.k) if self.committed else 0.0

    def stale(self, layer: int) -> np.ndarray | None:
        """``--predict-prefetch``'s pick for `layer` (best first), once the MoE layer before
        it ran."""
        return self._pick.get(layer)

    def next_layer(self, layer: int) -> int | None:
        return self._next.get(layer)

    def routed(self, layer: int, ids: np.ndarray) -> None:
        """The router of `layer` chose `ids` for the batch's last token (any batch: a prompt's
        last token is the previous token of the first one generated)."""
        actual = np.asarray(ids).reshape(-1)
        if self.active:
            self._score(layer, actual)
        self._prev[layer] = actual

    def _score(self, layer: int, actual: np.ndarray) -> None:
        stale = self._stale.pop(layer, None)
        ctrl = self._ctrl.pop(layer, None)
        stale2 = self._stale2.pop(layer, None)
        if not 0 < len(actual) <= MAX_RANKED:
            self.unranked += 1  # declined, not missed
            return
        tallies = self.tallies
        if stale is None:
            self.unranked += 1
        else:
            tallies["stale"][layer].add(stale, actual)
        if ctrl is not None:
            tallies["ctrl"][layer].add(ctrl, actual)
        prev = self._prev.get(layer)
        if prev is not None:
            tallies["prev"][layer].add(prev[: len(actual)], actual)
        if stale2 is not None:
            self.stale2.add(stale2, actual)

    def table(self) -> pd.DataFrame:
        """Per layer and predictor: routings scored, % of slots and % of whole routings."""
        rows = []
        for il in self.moe_layers:
            row: dict[str, float | int] = {"layer": il}
            for p in PREDICTORS:
                t = self.tallies[p][il]
                row[f"{p}_routings"] = t.routings
                row[f"{p}_slot_pct"] = 100.0 * t.slots_hit / t.slots if t.slots else np.nan
                row[f"{p}_whole_pct"] = 100.0 * t.whole_hit / t.routings if t.routings else np.nan
            rows.append(row)
        return pd.DataFrame(rows)

    def totals(self) -> dict[str, _Tally]:
        out = {}
        for p in PREDICTORS:
            total = _Tally()
            for t in self.tallies[p].values():
                total.routings += t.routings
                total.slots += t.slots
                total.slots_hit += t.slots_hit
                total.whole_hit += t.whole_hit
            out[p] = total
        return out

    def lines(self) -> list[str]:
        """The end-of-run ``moe-predict:`` lines and the per-layer table, as the native engine
        prints them (an empty predictor reads 0.0 % in the headline, ``-`` in the table)."""
        tot = self.totals()

        def both(t: _Tally) -> tuple[str, str]:
            slot = 100.0 * t.slots_hit / t.slots if t.slots else 0.0
            whole = 100.0 * t.whole_hit / t.routings if t.routings else 0.0
            return f"{slot:.1f}%", f"{whole:.1f}%"

        s, p, c = tot["stale"], tot["prev"], tot["ctrl"]
        (s1, s2), (p1, p2), (c1, c2) = both(s), both(p), both(c)
        out = [
            f"moe-predict: stale-gate {s1} of routed slots ({s2} whole routings) | "
            f"prev-token {p1} ({p2}) | fresh-gate control {c1} ({c2})"
        ]
        if self.stale2.routings:
            t1, t2 = both(self.stale2)
            out.append(
                f"moe-predict: stale-2 (two layers early) {t1} of routed slots "
                f"({t2} whole routings)"
            )
        out.append(
            f"moe-predict: scored — stale-gate {s.routings} routings/{s.slots} slots, "
            f"prev-token {p.routings}/{p.slots}, control {c.routings}/{c.slots}; "
            f"{self.unranked} routings the stale-gate could not rank"
        )
        if c.routings and c.slots_hit < 0.999 * c.slots:
            out += [
                "moe-predict: the control is below 100%, so this model's expert selection is "
                "not raw-logit",
                "             ranking (an added selection bias, or group-limited routing). "
                "The stale-gate",
                "             figure understates the method by about the control's own gap.",
            ]
        out.append("  layer   stale    prev   ctrl   routings")
        for il in self.moe_layers:
            cells = []
            for name in PREDICTORS:
                t = self.tallies[name][il]
                cells.append(f"{100.0 * t.slots_hit / t.slots:6.1f}" if t.routings else "-")
            if not any(self.tallies[name][il].routings for name in PREDICTORS):
                continue  # a layer nothing scored (the native table skips it)
            routings = self.tallies["stale"][il].routings
            out.append(f"  {il:5d}  {cells[0]:>6}  {cells[1]:>6} {cells[2]:>6}     {routings:6d}")
        return out
