"""The timing protocol: warm up until stable, then time enough iterations for a stable median."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

MIN_WARMUP = 5
MAX_WARMUP = 200
STABLE_WINDOW = 5
STABLE_TOLERANCE = 0.02
MIN_TIMED = 30
MIN_TIMED_S = 1.0


@dataclass(frozen=True)
class Timing:
    """One timed window: per-iteration times in milliseconds, the window in seconds, the warm-up iterations."""

    median_ms: float
    mean_ms: float
    p10_ms: float
    p90_ms: float
    iterations: int
    window_s: float
    warmup: int


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


class Timer:
    """Times one call in milliseconds: CUDA events on a GPU, the wall clock on the CPU."""

    def __init__(self, device_kind: str):
        self.cuda = device_kind == "cuda"

    def __call__(self, step: Callable[[], object]) -> float:
        """Runs ``step`` once and returns its time in milliseconds, waiting for the GPU to finish it."""
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        begin = time.perf_counter()
        step()
        return (time.perf_counter() - begin) * 1e3


def warm_up(step: Callable[[], object], timer: Timer) -> int:
    """At least MIN_WARMUP iterations, then until the median of the last window moves < 2 %."""
    times = [timer(step) for _ in range(MIN_WARMUP)]
    previous = statistics.median(times[-STABLE_WINDOW:])
    while len(times) < MAX_WARMUP:
        times.extend(timer(step) for _ in range(STABLE_WINDOW))
        current = statistics.median(times[-STABLE_WINDOW:])
        if abs(current - previous) <= STABLE_TOLERANCE * previous:
            break
        previous = current
    return len(times)


def time_steps(step: Callable[[], object], timer: Timer, on_start: Callable[[], None] = lambda: None,
               on_end: Callable[[], None] = lambda: None) -> Timing:
    """Timed window: >= MIN_TIMED iterations and >= MIN_TIMED_S seconds."""
    warm = warm_up(step, timer)
    times: list[float] = []
    on_start()
    begin = time.perf_counter()
    while len(times) < MIN_TIMED or time.perf_counter() - begin < MIN_TIMED_S:
        times.append(timer(step))
    window = time.perf_counter() - begin
    on_end()
    return Timing(statistics.median(times), statistics.fmean(times), _quantile(times, 0.1),
                  _quantile(times, 0.9), len(times), window, warm)
