"""How a sweep times one operator: an event pair per iteration, queued behind a GPU sleep so that the
host's launch time is not timed (the model harness's protocol is :mod:`dippm_nas.measure.timing`)."""

from __future__ import annotations

import math
import statistics
import time

import torch

from dippm_nas.measure.sweep_operators import Step

#: Iterations run before timing: the first call pays lazy initialisation (cuBLAS handles, kernel loading).
WARMUP_ITERATIONS = 3
#: Iterations timed together to size the window: their mean says how many fit in MIN_WINDOW_MS.
ESTIMATE_ITERATIONS = 3
MIN_ITERATIONS = 10
MAX_ITERATIONS = 200
MIN_WINDOW_MS = 20.0


def _quantile(ordered: list[float], q: float) -> float:
    k = (len(ordered) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def _iterations(estimate_ms: float) -> int:
    return max(MIN_ITERATIONS, min(MAX_ITERATIONS, math.ceil(MIN_WINDOW_MS / max(estimate_ms, 1e-6))))


def _summary(times: list[float], window_s: float, host_ms: float) -> dict[str, object]:
    ordered = sorted(times)
    return {"latency_ms_median": statistics.median(ordered), "latency_ms_mean": statistics.fmean(ordered),
            "latency_ms_p10": _quantile(ordered, 0.1), "latency_ms_p90": _quantile(ordered, 0.9),
            "iterations": len(times), "window_s": window_s, "host_ms": host_ms,
            "warmup_iterations": WARMUP_ITERATIONS + ESTIMATE_ITERATIONS}


class CudaTimer:
    """Times a step on the GPU with an event pair per iteration and one synchronisation per point.

    The iterations are queued behind ``torch.cuda._sleep``, long enough for the host to issue them all,
    so they run back to back: the events bracket the kernels, not the host's launch time (which
    ``host_ms`` reports apart, as the cost model's host term wants it).
    """

    def __init__(self) -> None:
        self.starts = [torch.cuda.Event(enable_timing=True) for _ in range(MAX_ITERATIONS)]
        self.ends = [torch.cuda.Event(enable_timing=True) for _ in range(MAX_ITERATIONS)]
        self.cycles_per_ms = self._calibrate()

    def _calibrate(self) -> float | None:
        """GPU clock cycles per millisecond of ``_sleep``; None where this PyTorch has no ``_sleep``."""
        sleep = getattr(torch.cuda, "_sleep", None)
        if sleep is None:
            return None
        try:
            sleep(1000)
            torch.cuda.synchronize()
            self.starts[0].record()
            sleep(2_000_000)
            self.ends[0].record()
            self.ends[0].synchronize()
            elapsed = self.starts[0].elapsed_time(self.ends[0])
            return 2_000_000 / elapsed if elapsed > 0 else None
        except Exception:
            return None

    def __call__(self, step: Step) -> dict[str, object]:
        """The step's timing row fields."""
        for _ in range(WARMUP_ITERATIONS):
            step()
        torch.cuda.synchronize()
        begin = time.perf_counter()
        self.starts[0].record()
        for _ in range(ESTIMATE_ITERATIONS):
            step()
        self.ends[0].record()
        host_estimate = (time.perf_counter() - begin) * 1e3 / ESTIMATE_ITERATIONS
        self.ends[0].synchronize()
        n = _iterations(self.starts[0].elapsed_time(self.ends[0]) / ESTIMATE_ITERATIONS)
        if self.cycles_per_ms:  # room for the host to queue every iteration before the first runs
            torch.cuda._sleep(int(min(1.5 * n * host_estimate + 0.1, 250.0) * self.cycles_per_ms))
        starts, ends = self.starts[:n], self.ends[:n]
        begin = time.perf_counter()
        for start, end in zip(starts, ends):
            start.record()
            step()
            end.record()
        host_ms = (time.perf_counter() - begin) * 1e3 / n
        ends[-1].synchronize()
        times = [start.elapsed_time(end) for start, end in zip(starts, ends)]
        return _summary(times, starts[0].elapsed_time(ends[-1]) / 1e3, host_ms)


def cpu_timer(step: Step) -> dict[str, object]:
    """The step's timing row fields on the CPU: the wall clock around each iteration."""
    for _ in range(WARMUP_ITERATIONS):
        step()
    begin = time.perf_counter()
    for _ in range(ESTIMATE_ITERATIONS):
        step()
    n = _iterations((time.perf_counter() - begin) * 1e3 / ESTIMATE_ITERATIONS)
    times = []
    begin = time.perf_counter()
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e3)
    window = time.perf_counter() - begin
    return _summary(times, window, window * 1e3 / n)
