"""``--predict-log`` scoring on a routing built by hand, its expected counts worked out by hand.

Three MoE layers (0, 1, 2), four experts, top-2. The routers are permutations, so a ranking
is read off the gate input: layers 0 and 2 score expert e by x[e], layer 1 by x[(e + 1) % 4].
A prompt, then two decodes; the comments give each score.
"""

from __future__ import annotations

import numpy as np

from bmoe.engine.embedded.routing_forecast import RoutePredictor, Router

IDENTITY = np.eye(4, dtype=np.float32)
SHIFT = np.roll(np.eye(4, dtype=np.float32), 1, axis=1)  # row e picks x[(e + 1) % 4]


def _predictor() -> RoutePredictor:
    routers = {0: Router(IDENTITY), 1: Router(SHIFT), 2: Router(IDENTITY)}
    return RoutePredictor(routers, [0, 1, 2], k=2, n_layer=3)


def _decode(p: RoutePredictor, steps: list[tuple[list[float], list[int]]]) -> None:
    p.active = True
    for layer, (x, ids) in enumerate(steps):
        p.gate_input(layer, np.array(x, dtype=np.float32))
        p.routed(layer, np.array(ids, dtype=np.int32))
    p.active = False


def test_hand_built_routing_scores_as_worked_out() -> None:
    p = _predictor()
    for layer, ids in enumerate(([0, 1], [2, 3], [0, 1])):  # the prompt's last token
        p.routed(layer, np.array(ids))
    # decode 1: no router is known ahead yet, so nothing is stale-ranked (3 unranked);
    # control: L0 [0,1] vs [0,1] 2 hits, L1 [2,1] vs [2,3] 1, L2 [2,3] vs [2,3] 2;
    # previous token (the prompt's): L0 2, L1 2, L2 [0,1] vs [2,3] 0
    _decode(p, [([4, 3, 2, 1], [0, 1]), ([1, 2, 3, 4], [2, 3]), ([0, 0, 5, 1], [2, 3])])
    # decode 2: L0 is never stale-ranked (4 unranked); stale L1 = shift on L0's input
    # [1,5,0,2] -> [0,2] vs [0,2]: 2 hits, whole; stale L2 = identity on L1's [3,0,0,4] ->
    # [3,0] vs [1,0]: 1; stale-2 L2 = identity on L0's input -> [1,3] vs [1,0]: 1;
    # control: L0 [1,3] 2, L1 [2,3] vs [0,2] 1, L2 ties 0,2,3 to the lowest: [1,0] 2;
    # previous token: L0 [0,1] vs [1,3] 1, L1 [2,3] vs [0,2] 1, L2 [2,3] vs [1,0] 0
    _decode(p, [([1, 5, 0, 2], [1, 3]), ([3, 0, 0, 4], [0, 2]), ([0, 1, 0, 0], [1, 0])])
    assert p.lines() == [
        "moe-predict: stale-gate 75.0% of routed slots (50.0% whole routings) | "
        "prev-token 50.0% (33.3%) | fresh-gate control 83.3% (66.7%)",
        "moe-predict: stale-2 (two layers early) 50.0% of routed slots (0.0% whole routings)",
        "moe-predict: scored — stale-gate 2 routings/4 slots, prev-token 6/12, control 6/12; "
        "4 routings the stale-gate could not rank",
        "moe-predict: the control is below 100%, so this model's expert selection is not raw-logit",
        "             ranking (an added selection bias, or group-limited routing). The stale-gate",
        "             figure understates the method by about the control's own gap.",
        "  layer   stale    prev   ctrl   routings",
        "      0       -    75.0  100.0          0",
        "      1   100.0    75.0   50.0          1",
        "      2    50.0     0.0  100.0          1",
    ]


def test_a_dense_layer_leaves_the_next_one_unranked_and_wide_routings_are_declined() -> None:
    # layers 0 and 2 are MoE, layer 1 dense: layer 2's stale gate would be layer 1's router
    p = RoutePredictor({0: Router(IDENTITY), 2: Router(IDENTITY)}, [0, 2], k=2, n_layer=3)
    for _ in range(3):
        _decode(p, [([4, 3, 2, 1], [0, 1])])
        p.active = True
        p.gate_input(2, np.array([1, 2, 3, 4], np.float32))
        p.routed(2, np.array([3, 2]))
        p.active = False
    tot = p.totals()
    assert tot["stale"].routings == 0 and p.unranked == 6
    assert p.stale2.routings == 2  # layer 0's input ranked for layer 2, from the 2nd decode
    assert tot["prev"].routings == 4 and tot["ctrl"].routings == 6
    wide = RoutePredictor({0: Router(np.eye(40, dtype=np.float32))}, [0], k=33, n_layer=1)
    _decode(wide, [([1.0] * 40, list(range(33)))])
    assert wide.unranked == 1 and wide.totals()["ctrl"].routings == 0


def test_sixteen_layers_over_sixteen_decodes_give_the_native_counts() -> None:
    rng = np.random.default_rng(0)
    routers = {il: Router(rng.standard_normal((64, 32)).astype(np.float32)) for il in range(16)}
    p = RoutePredictor(routers, list(range(16)), k=8, n_layer=16)
    for il in range(16):
        p.routed(il, rng.permutation(64)[:8])
    for _ in range(16):
        _decode(p, [(rng.standard_normal(32), rng.permutation(64)[:8]) for _ in range(16)])
    scored = p.lines()[2]
    assert scored == (
        "moe-predict: scored — stale-gate 225 routings/1800 slots, prev-token 256/2048, "
        "control 256/2048; 31 routings the stale-gate could not rank"
    )
