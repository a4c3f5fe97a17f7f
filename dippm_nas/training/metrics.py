"""Accuracy metrics: MAPE, Kendall's tau-b, the share of predictions within +-10 %, and intervals over families."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

#: Draws of :func:`cluster_bootstrap` unless told otherwise; the accuracy report names it.
BOOTSTRAP_SAMPLES = 200


def mape(predicted: np.ndarray, measured: np.ndarray) -> float:
    """Mean absolute percentage error, relative to ``measured``, as a fraction (0.1 is 10 %).

    >>> mape(np.array([110.0, 90.0]), np.array([100.0, 100.0]))
    0.1
    """
    return float(np.mean(np.abs(predicted - measured) / np.abs(measured)))


def within(predicted: np.ndarray, measured: np.ndarray, tolerance: float = 0.10) -> float:
    """The share of predictions within ``tolerance`` (a fraction of the measured value; the bound counts
    as within).

    >>> within(np.array([105.0, 120.0]), np.array([100.0, 100.0]))
    0.5
    """
    return float(np.mean(np.abs(predicted - measured) <= tolerance * np.abs(measured)))


def kendall_tau(a: np.ndarray, b: np.ndarray, chunk: int = 512) -> float:
    """Kendall's tau-b (ties counted as neither concordant nor discordant); NaN for fewer than two
    values. It compares ``chunk`` values with all n at a time, so memory grows as ``chunk`` x n.

    >>> kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]), kendall_tau([1, 2, 3, 4], [40, 30, 20, 10])
    (1.0, -1.0)
    >>> round(kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]), 4)
    0.6667
    """
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    n = len(a)
    if n < 2:
        return float("nan")
    concordance = ties_a = ties_b = 0.0
    for start in range(0, n, chunk):
        da = np.sign(a[start:start + chunk, None] - a[None, :])
        db = np.sign(b[start:start + chunk, None] - b[None, :])
        concordance += float(np.sum(da * db))
        ties_a += float(np.sum(da == 0))
        ties_b += float(np.sum(db == 0))
    pairs = n * n
    # the diagonal counts as a tie in both; each unordered pair was seen twice
    denominator = np.sqrt((pairs - ties_a) * (pairs - ties_b))
    return float(concordance / denominator) if denominator else float("nan")


def summary(predicted: np.ndarray, measured: np.ndarray) -> dict[str, float]:
    """MAPE, Kendall tau, the share within 10 % and the number of records, under the keys the accuracy
    report and the model card use.

    >>> summary(np.array([110.0, 190.0, 310.0]), np.array([100.0, 200.0, 300.0]))["within10"]
    1.0
    """
    return {"mape": mape(predicted, measured), "tau": kendall_tau(predicted, measured),
            "within10": within(predicted, measured), "n": float(len(measured))}


def cluster_bootstrap(metric: Callable[[np.ndarray, np.ndarray], float], predicted: np.ndarray, measured: np.ndarray,
                      groups: np.ndarray, samples: int = BOOTSTRAP_SAMPLES, level: float = 0.95,
                      seed: int = 0) -> tuple[float, float]:
    """A ``level`` percentile interval of ``metric`` when whole groups (model families) are drawn again
    with replacement: records of one family err together, so resampling records one by one would
    understate how much the figure depends on which families happened to be in the test set."""
    names, index = np.unique(groups, return_inverse=True)
    members = [np.flatnonzero(index == g) for g in range(len(names))]
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(samples):
        chosen = np.concatenate([members[g] for g in rng.integers(0, len(names), len(names))])
        values.append(metric(predicted[chosen], measured[chosen]))
    tail = (1 - level) / 2 * 100
    low, high = np.nanpercentile(values, [tail, 100 - tail])
    return float(low), float(high)


def median_ratio(predicted: np.ndarray, measured: np.ndarray) -> float:
    """The typical predicted / measured: a model's bias on a split, 1 when it has none."""
    return float(np.median(predicted / measured))


def per_group_log_bias(predicted: np.ndarray, measured: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Each record's group's mean log(predicted / measured), per record."""
    _, index = np.unique(groups, return_inverse=True)
    log_error = np.log(predicted / measured)
    return (np.bincount(index, weights=log_error) / np.bincount(index))[index]


def tau_by_error_part(predicted: np.ndarray, measured: np.ndarray, groups: np.ndarray) -> tuple[float, float]:
    """Where the ranking is lost, between groups and within them: Kendall tau with each group's mean log
    error divided out of the predictions (what the errors within groups alone leave), and with only
    that mean left (what the groups' own errors alone leave)."""
    bias = np.exp(per_group_log_bias(predicted, measured, groups))
    return kendall_tau(predicted / bias, measured), kendall_tau(measured * bias, measured)
