"""The timing protocol: warm up until stable, time enough iterations for a stable median, and time
again a window whose spread says it was disturbed; a forward pass replayed as a CUDA graph too."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch

MIN_WARMUP = 5
MAX_WARMUP = 200
STABLE_WINDOW = 5
STABLE_TOLERANCE = 0.02
MIN_TIMED = 30
MIN_TIMED_S = 1.0
#: A slow configuration (a large model at batch 256 in fp32 runs near a second an iteration) would spend
#: half a minute on MIN_TIMED iterations, and a session's budget on a handful of them: once the warm-up has
#: run MAX_WARMUP_S, or the window MAX_TIMED_S, MIN_WARMUP and MIN_TIMED_SLOW iterations are enough.
MAX_WARMUP_S = 5.0
MAX_TIMED_S = 5.0
MIN_TIMED_SLOW = 5
#: A window whose (p90 - p10) / median is above this was disturbed (clocks moving, another process, a
#: background thread): it is timed again. 0.10 is about three times what a quiet H100 or H200 shows.
SPREAD_LIMIT = 0.10
#: The first window and up to two more; the tightest is kept, so a noisy configuration costs at most
#: three windows and is recorded as noisy (its ``attempts`` and p10/p90 say so) rather than dropped.
MAX_ATTEMPTS = 3

T = TypeVar("T")


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

    @property
    def spread(self) -> float:
        """(p90 - p10) / median: how disturbed the window was; a quiet GPU keeps it to a few per cent.

        >>> Timing(2.0, 2.1, 1.5, 2.5, 30, 1.0, 5).spread
        0.5
        """
        return (self.p90_ms - self.p10_ms) / self.median_ms if self.median_ms > 0 else 0.0


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


def warm_up(step: Callable[[], object], timer: Callable[[Callable[[], object]], float]) -> int:
    """At least MIN_WARMUP iterations, then until the median of the last window moves < 2 %, or the
    warm-up has taken MAX_WARMUP_S by the timer (a slow step is steady after its first iterations).

    >>> warm_up(lambda: None, lambda step: 2000.0)  # 2 s an iteration: the minimum is enough
    5
    """
    times = [timer(step) for _ in range(MIN_WARMUP)]
    previous = statistics.median(times[-STABLE_WINDOW:])
    while len(times) < MAX_WARMUP and sum(times) < MAX_WARMUP_S * 1e3:
        times.extend(timer(step) for _ in range(STABLE_WINDOW))
        current = statistics.median(times[-STABLE_WINDOW:])
        if abs(current - previous) <= STABLE_TOLERANCE * previous:
            break
        previous = current
    return len(times)


def time_steps(step: Callable[[], object], timer: Callable[[Callable[[], object]], float],
               on_start: Callable[[], None] = lambda: None, on_end: Callable[[], None] = lambda: None,
               min_seconds: float | None = None, clock: Callable[[], float] = time.perf_counter) -> Timing:
    """Warm-up, then a timed window: >= MIN_TIMED iterations and >= ``min_seconds`` (MIN_TIMED_S) by ``clock``,
    or, once the window has lasted MAX_TIMED_S, >= MIN_TIMED_SLOW iterations.

    ``on_start`` and ``on_end`` bracket the window (an energy meter, the GPU's clocks); ``clock`` is
    only there so that a test can run the protocol on a simulated timer without waiting a second.
    """
    min_seconds = MIN_TIMED_S if min_seconds is None else min_seconds
    warm = warm_up(step, timer)
    times: list[float] = []
    on_start()
    begin = clock()
    while len(times) < MIN_TIMED or clock() - begin < min_seconds:
        if len(times) >= MIN_TIMED_SLOW and clock() - begin >= MAX_TIMED_S:
            break
        times.append(timer(step))
    window = clock() - begin
    on_end()
    return Timing(statistics.median(times), statistics.fmean(times), _quantile(times, 0.1),
                  _quantile(times, 0.9), len(times), window, warm)


def tightest(measure: Callable[[], T], spread: Callable[[T], float] = lambda t: t.spread,
             limit: float | None = None, max_attempts: int | None = None) -> tuple[T, int]:
    """Calls ``measure`` until one result's ``spread`` is within ``limit`` (SPREAD_LIMIT), at most
    ``max_attempts`` (MAX_ATTEMPTS) times; returns the tightest result and how many calls it took.

    A window disturbed by a clock change or another process is as likely to bias the median as to
    widen it, so a wide one is measured again instead of being trusted.

    >>> spreads = iter([0.3, 0.05, 0.01])
    >>> tightest(lambda: next(spreads), spread=lambda s: s)
    (0.05, 2)
    """
    limit = SPREAD_LIMIT if limit is None else limit
    max_attempts = MAX_ATTEMPTS if max_attempts is None else max_attempts
    best: T | None = None
    attempts = 0
    while attempts < max(1, max_attempts):
        result = measure()
        attempts += 1
        if best is None or spread(result) < spread(best):
            best = result
        if spread(result) <= limit:
            break
    return best, attempts


def free_cublas_workspaces() -> None:
    """Frees the cuBLAS workspace that PyTorch keeps per stream (32 MiB each on Hopper), on CUDA.

    A user's eager process has one, on its default stream. The harness's CUDA-graph captures run on
    side streams drawn from PyTorch's pool of 32, each of which keeps a workspace of its own for the
    process's life: without this, a configuration's peak allocated, reserved and NVML memory carried
    32 MiB more for every configuration measured before it in the process, up to about a GiB. Called
    before each configuration, so that its first matmul allocates the one workspace a user's process has.
    """
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        clear()


def capture_cuda_graph(step: Callable[[], object], warmup: int = 3) -> Callable[[], object]:
    """``step`` captured as a CUDA graph (its inputs must stay where they are); returns the replay.

    Warmed up on a side stream first, as ``torch.cuda.graphs`` asks, so lazy initialisation (cuDNN's
    algorithm choice, autocast's weight casts) happens outside the capture; the capture's errors are
    this thread's alone (``capture_error_mode="thread_local"``), so the energy meter's thread is safe.
    Raises where the step cannot be captured (a host synchronisation, data-dependent control flow).
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        out = step()

    def replay() -> object:
        graph.replay()
        return out  # the graph's static output, kept alive as long as the replay

    return replay
