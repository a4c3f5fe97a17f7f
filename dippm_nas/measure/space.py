"""The candidates of a search space worth measuring on a user's GPU, for ``dippm-nas calibrate``.

A calibration fits a GPU's kernel and host speeds to the rows it is given; rows that all cost alike cannot
tell those speeds apart. So the candidates span the space: its smallest and largest, and between them
candidates drawn at random whose costs lie evenly spaced on a log scale. The cost that orders them is the
predicted latency where the predictor is installed, else the FLOPs that PyTorch counts (a harness-only
machine, without TVM): either orders a space's candidates much as the GPU will.
"""

from __future__ import annotations

import itertools
import math
import random
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from dippm_nas.measure.config import MeasureConfig
from dippm_nas.measure.gpu_state import require_device
from dippm_nas.measure.runner import run
from dippm_nas.precisions import DEFAULT_PRECISION

#: How many candidates are drawn for each one measured: the pool the spread is chosen from.
POOL_PER_CANDIDATE = 5

Cost = Callable[[Sequence[object], int, str], list[float]]


def flops(candidates: Sequence[object], batch: int, precision: str) -> list[float]:
    """The FLOPs PyTorch counts in each candidate's forward pass (on the ``meta`` device: no weights, no time)."""
    from torch.utils.flop_counter import FlopCounterMode

    counts = []
    for candidate in candidates:
        with FlopCounterMode(display=False) as counter:
            candidate.module(torch.empty(batch, *candidate.input_shape, device="meta"))
        counts.append(float(max(counter.get_total_flops(), 1)))
    return counts


def predicted_latency(candidates: Sequence[object], batch: int, precision: str) -> list[float]:
    """Each candidate's latency as the default model predicts it on the default GPU: the order of a space's
    candidates, which hardly depends on the GPU."""
    from dippm_nas.integration import HardwareCostModel

    cost = HardwareCostModel(batch=batch, precision=precision)
    return [p.latency_ms for p in cost.score_many(candidates, progress=True)]


def default_cost() -> tuple[Cost, str]:
    """The predicted latency where the predictor can be imported, else the FLOPs; and its name."""
    try:
        import tvm  # noqa: F401
    except ImportError:
        return flops, "FLOPs (TVM is not installed here, so nothing is predicted)"
    return predicted_latency, "predicted latency"


def spread_candidates(space, n: int, batch: int, precision: str, seed: int = 0, cost: Cost | None = None,
                      say: Callable[[str], None] = print) -> list:
    """``n`` candidates of ``space``: its smallest and largest, and ``n - 2`` drawn (seeded) from a pool of
    :data:`POOL_PER_CANDIDATE` times as many, each the nearest in log cost to an evenly spaced target."""
    if n < 1:
        raise ValueError(f"n={n}: measure one candidate or more")
    if cost is None:
        cost, name = default_cost()
        say(f"candidates spread over {name}")
    ends = [space.extreme(), space.extreme(largest=True)]
    if n <= 2:
        return ends[:n]
    rng = random.Random(seed)
    seen = {c.signature for c in ends}
    pool = []
    for _ in range(20 * POOL_PER_CANDIDATE * n):  # a small space may hold fewer distinct candidates
        candidate = space.random(rng)
        if candidate.signature not in seen:
            seen.add(candidate.signature)
            pool.append(candidate)
        if len(pool) == POOL_PER_CANDIDATE * n:
            break
    costs = [math.log(c) for c in cost(ends + pool, batch, precision)]
    low, high = min(costs[:2]), max(costs[:2])
    left = dict(enumerate(costs[2:], start=2))  # the pool's costs, by their index in ends + pool
    chosen = [0, 1]
    for k in range(1, n - 1):
        if not left:
            break
        target = low + (high - low) * k / (n - 1)
        nearest = min(left, key=lambda i: abs(left[i] - target))
        chosen.append(nearest)
        del left[nearest]
    return [(ends + pool)[i] for i in sorted(chosen, key=costs.__getitem__)]


def space_configs(space, candidates: Sequence[object], batch: int, precision: str) -> list[MeasureConfig]:
    """The harness's configurations of ``candidates``: the space as the source, the architecture as the model,
    so that a row names its candidate as ``space:architecture`` and anyone can rebuild it."""
    return [MeasureConfig(space.arch_text(c.arch), tuple(c.input_shape), batch, precision, source=space.name,
                          family=space.name) for c in candidates]


def measure_space(space, out: str | Path, n: int = 10, batch: int | Sequence[int] = 64, precision: str = "fp32",
                  device_kind: str = "cuda", seed: int = 0, budget_s: float | None = None,
                  measured_by: str = "dippm-nas harness", cost: Cost | None = None,
                  progress: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)) -> int:
    """Measure ``n`` candidates of ``space`` (a name of ``search_spaces.SEARCH_SPACES`` or a space of your own,
    which is registered so that its candidates' names rebuild) at ``batch`` (one, or several: each candidate at
    each) and ``precision`` into ``out``, rows that ``dippm-nas calibrate`` reads; returns how many were measured
    (a rerun skips those in ``out``). The candidates spread over their cost at the largest batch.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as folder:  # doctest: +SKIP
    ...     measure_space("nb201", f"{folder}/rows.csv", n=3, batch=1, device_kind="cpu")
    3
    """
    from search_spaces import get_search_space, register_search_space

    require_device(device_kind, "harness")
    if isinstance(space, str):
        space = get_search_space(space)
    else:
        register_search_space(type(space))
    batches = sorted({batch} if isinstance(batch, int) else set(batch))
    candidates = spread_candidates(space, n, batches[-1], precision, seed, cost, progress)
    configs = [config for b in batches for config in space_configs(space, candidates, b, precision)]
    return run(configs, out, device_kind, budget_s, measured_by, progress)


def spaces_manifest(spaces: Sequence[str], per_space: int, batches: Sequence[int], precisions: Sequence[str],
                    seed: int = 0, progress: Callable[[str], None] = lambda line: None) -> list[MeasureConfig]:
    """Every candidate of a seeded spread of each space at every batch and precision, ordered so that any prefix
    spans the candidates, the settings and the spaces: in round ``r`` the ``j``-th (precision, batch) goes to
    candidate ``(j + r) mod per_space`` (a Latin square: after ``per_space`` rounds each candidate has every
    setting once), and the spaces take turns. The spread orders candidates by FLOPs, the same on every
    machine, so the list is too.

    >>> configs = spaces_manifest(["nb201"], 2, [1, 64], ["fp32"])  # its smallest and largest candidate
    >>> [(c.batch, c.model == configs[0].model) for c in configs]
    [(1, True), (64, False), (1, False), (64, True)]
    """
    from search_spaces import get_search_space

    settings = [(precision, batch) for precision in precisions for batch in batches]
    by_space = []
    for name in spaces:
        space = get_search_space(name)
        candidates = spread_candidates(space, per_space, max(batches), DEFAULT_PRECISION, seed, flops, progress)
        by_space.append([space_configs(space, [candidates[(j + r) % len(candidates)]], batch, precision)[0]
                         for r in range(len(candidates)) for j, (precision, batch) in enumerate(settings)])
    return [config for turn in itertools.zip_longest(*by_space) for config in turn if config is not None]
