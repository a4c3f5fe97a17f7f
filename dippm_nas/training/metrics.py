"""Accuracy metrics: MAPE, Kendall's tau-b, and the share of predictions within +-10 %."""

from __future__ import annotations

import numpy as np


def mape(predicted: np.ndarray, measured: np.ndarray) -> float:
    return float(np.mean(np.abs(predicted - measured) / np.abs(measured)))


def within(predicted: np.ndarray, measured: np.ndarray, tolerance: float = 0.10) -> float:
    return float(np.mean(np.abs(predicted - measured) <= tolerance * np.abs(measured)))


def kendall_tau(a: np.ndarray, b: np.ndarray, chunk: int = 512) -> float:
    """Kendall's tau-b (ties counted as neither concordant nor discordant), in O(n^2 / chunk) steps."""
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
    return {"mape": mape(predicted, measured), "tau": kendall_tau(predicted, measured),
            "within10": within(predicted, measured), "n": float(len(measured))}
