"""The compiled per-cell weight figures are numpy's to the last bit: its reduceat sums (in
its order of addition), its maxima, over cells of every length it takes, weights unknown,
zero, negative and signed zeros included."""

from __future__ import annotations

import numpy as np
import pytest

from bmoe.analyze import route_weights


def numpys(weight: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, ...]:
    """What the route views computed with numpy alone."""
    w = weight.astype(np.float64)
    known = ~np.isnan(w)
    wk, known_w = np.where(known, w, 0.0), np.where(known, w, -np.inf)
    pos = wk > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        wlogw = np.where(pos, wk, 0.0) * np.log2(np.where(pos, wk, 1.0))
    return (
        np.logical_and.reduceat(known, starts),
        np.add.reduceat(wk, starts),
        np.add.reduceat(wlogw, starts),
        np.maximum.reduceat(known_w, starts),
    )


def compiled(weight: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, ...]:
    n = len(starts)
    out = np.empty(n, dtype=bool), np.empty(n), np.empty(n), np.empty(n)
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.log2(weight.astype(np.float64))
    route_weights.cell_weights(weight, logs, starts, *out)
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cell_weights_are_numpys_bit_for_bit(dtype) -> None:
    rng = np.random.default_rng(7)
    # every length up to the longest taken, many times over: the pairwise sum's branches
    sizes = np.concatenate([np.arange(1, route_weights.MAX_CELL + 1).repeat(3),
                            rng.integers(1, 10, size=3000)])  # fmt: skip
    rng.shuffle(sizes)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    weight = rng.random(int(sizes.sum())) * rng.choice([1e-6, 1.0, 1e6], size=int(sizes.sum()))
    weight = weight.astype(dtype)
    odd = rng.random(len(weight))
    weight[odd < 0.01] = np.nan
    weight[(odd >= 0.01) & (odd < 0.02)] = 0.0
    weight[(odd >= 0.02) & (odd < 0.025)] = -0.0
    weight[(odd >= 0.025) & (odd < 0.03)] *= -1
    weight[starts[:5]] = -0.0  # cells of signed zeros alone
    expect = numpys(weight, starts)
    got = compiled(weight, starts)
    for e, g in zip(expect, got, strict=True):
        np.testing.assert_array_equal(g, e)
        assert (np.signbit(g) == np.signbit(e)).all()
    assert not expect[0].all() and expect[0].any()  # both kinds of cell were there


def test_a_sequences_weights_take_the_compiled_pass_and_give_numpys(monkeypatch) -> None:
    """The step sequence's figures are the same whichever pass makes them."""
    from bmoe.analyze import route_cells

    rng = np.random.default_rng(3)
    n_steps, n_layers, k = 200, 5, 4
    cols = {
        "turn": np.zeros(n_steps * n_layers * k, dtype=np.int16),
        "phase": np.ones(n_steps * n_layers * k, dtype=np.int8),
        "step": np.repeat(np.arange(n_steps), n_layers * k).astype(np.int32),
        "layer": np.tile(np.repeat(np.arange(n_layers), k), n_steps).astype(np.int16),
        "slot": np.tile(np.arange(k), n_steps * n_layers).astype(np.int8),
        "expert": rng.integers(0, 16, size=n_steps * n_layers * k).astype(np.int16),
        "weight": rng.dirichlet(np.ones(k), size=n_steps * n_layers).reshape(-1).astype(
            np.float32),
    }  # fmt: skip
    cols["weight"][5] = np.nan
    fast = route_cells.order_rows(dict(cols)).cell_weights()
    monkeypatch.setattr(route_weights, "MAX_CELL", 0)  # every cell too long: numpy's path
    slow = route_cells.order_rows(dict(cols)).cell_weights()
    for f, s in zip(fast, slow, strict=True):
        np.testing.assert_array_equal(f, s)


def test_the_entropy_sums_are_numpys(monkeypatch) -> None:
    """The entropy view's per-layer means, bit for bit, whichever pass sums them: cells of
    unknown weights, zero and negative sums, and a layer with no cell counted included."""
    from bmoe.analyze import route, route_cells

    rng = np.random.default_rng(9)
    n_steps, n_layers, k = 3, 400, 6  # a few cells a layer: one value's last bit shows
    n = n_steps * n_layers * k
    weight = rng.dirichlet(np.ones(k), size=n_steps * n_layers).reshape(-1)
    weight[rng.random(n) < 0.02] = np.nan
    weight[rng.random(n) < 0.02] = 0.0
    weight[rng.random(n) < 0.01] *= -5
    layer = np.tile(np.repeat(np.arange(n_layers), k), n_steps)
    weight[layer == 3] = 0.0  # no cell of this layer has a positive sum
    cols = {
        "step": np.repeat(np.arange(n_steps), n_layers * k).astype(np.int32),
        "layer": layer.astype(np.int16),
        "slot": np.tile(np.arange(k), n_steps * n_layers).astype(np.int8),
        "expert": rng.integers(0, 16, size=n).astype(np.int16),
        "weight": weight.astype(np.float32),
    }
    fast = route._entropy(route_cells.order_rows(dict(cols)))
    monkeypatch.setattr(route_weights.entropy_sums, "takes", lambda *args: False)
    slow = route._entropy(route_cells.order_rows(dict(cols)))
    assert list(fast) == list(slow)
    for name, values in fast.items():
        assert values.tobytes() == slow[name].tobytes(), name
    assert np.isnan(fast["entropy_bits"][3])
