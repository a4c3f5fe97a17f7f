"""Operator sweeps: single-operator timings by the thousand, the ground truth of a learned per-operator cost model.

A whole-model row says how long a network took, not which of its operators took it; a per-operator
cost model needs each operator timed alone over the shapes real networks give it. A sweep draws a
seeded, stratified sample of shapes for the operators that dominate real models (GEMMs, convolutions,
attention, normalisations, elementwise, reductions, pooling), runs every shape at every precision of
:data:`~dippm_nas.measure.precision.PRECISIONS` and appends one row per point with its FLOPs, bytes
and provenance. Each point allocates its inputs once, builds no model and synchronises once, so
that a minute of GPU time is meant to buy thousands of timings.

The plan is interleaved (round-robin over operator kinds, each shape at every precision), so a run
that its budget cuts short still covers every kind and precision; it is resumable (a rerun skips the
keys already in the file) and a kill loses at most the point in flight. Rows go to a file of their
own, e.g. ``data/measurements/sweeps/h100.csv``, never among the model rows of
``data/measurements/*.csv``. Like the rest of the harness it imports only torch and the standard
library (timm through :func:`~dippm_nas.measure.environment.describe`), never TVM::

    dippm-nas sweep --out data/measurements/sweeps/h100.csv --budget-s 540
"""

from __future__ import annotations

import csv
import math
import random
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from dippm_nas.errors import DippmError, one_line
from dippm_nas.measure.environment import describe, utc_now
from dippm_nas.measure.precision import PRECISION_MODES, PRECISIONS, running_in
from dippm_nas.measure.runner import append_rows, measured_keys

MIB = 2**20

#: Iterations run before timing: the first call pays lazy initialisation (cuBLAS handles, kernel loading).
WARMUP_ITERATIONS = 3
#: Iterations timed together to size the window: their mean says how many fit in MIN_WINDOW_MS.
ESTIMATE_ITERATIONS = 3
MIN_ITERATIONS = 10
MAX_ITERATIONS = 200
MIN_WINDOW_MS = 20.0

#: On CUDA a point may take this share of the memory free when the sweep starts: the allocator's
#: cache, a kernel's workspace and fragmentation need the rest.
CUDA_MEMORY_FRACTION = 0.25
#: On the CPU, where sweeps test the harness, points stay small so that a test measures dozens in seconds.
CPU_MEMORY_CAP = 32 * MIB
#: The CPU plan keeps the shapes under this many FLOPs (a few milliseconds an iteration at most).
CPU_MAX_FLOPS = 1e7

#: Every plan: no shape above these (a GEMM of 16384^3 or a convolution of batch 256 over 2048 channels
#: at 224x224 is no real model's and would take seconds a point).
PLAN_MAX_FLOPS = 2e12
PLAN_MAX_BYTES = 4 * 2**30
#: Rounds in the default plan; a round draws ``weight`` shapes of every kind.
DEFAULT_ROUNDS = 100

SWEEP_PROTOCOL = (
    f"dippm-nas-sweep-v1: one operator alone; inputs and weights uniform random at the precision's dtype "
    f"(float32 for fp32, fp32-strict and tf32), allocated once per point; inference_mode under the precision's "
    f"TF32 flags and autocast (fp16/bf16); warm-up {WARMUP_ITERATIONS} iterations, then {ESTIMATE_ITERATIONS} "
    f"timed together to size the window; timed window >= {MIN_ITERATIONS} iterations and >= {MIN_WINDOW_MS:g} "
    f"ms, <= {MAX_ITERATIONS} iterations; CUDA: an event pair around each iteration, queued behind a GPU sleep "
    f"so that host launch time is not timed (host_ms: the host's time per queued iteration); CPU: wall clock "
    f"per iteration; median, mean, p10, p90 per iteration; inputs stay cache-resident between iterations")

SWEEP_COLUMNS = [
    "key", "kind", "params", "precision", "dtype", "flops", "bytes", "status", "error",
    "latency_ms_median", "latency_ms_mean", "latency_ms_p10", "latency_ms_p90", "iterations", "window_s",
    "warmup_iterations", "host_ms",
    "device_kind", "gpu_name", "driver", "cuda", "cudnn", "torch", "timm", "tf32_matmul", "tf32_cudnn",
    "cudnn_benchmark", "cpu", "protocol", "measured_by", "date", "seed",
]

Params = Mapping[str, int]
Step = Callable[[], object]


# ---- the operators ------------------------------------------------------------------------------


@dataclass(frozen=True)
class OperatorKind:
    """What the sweep knows of one operator: how to draw its shapes, count its work and run it.

    ``numels`` gives the elements of its inputs, its weights and its output, from which a point's
    bytes (and its memory footprint) follow at any dtype; ``flops`` follows the conventions of
    ``dippm_nas.graph.ops`` (a multiply-add is two FLOPs), so a row and a graph node count alike.
    """

    name: str
    #: shapes drawn per round: the operators that dominate real models' time get more
    weight: int
    sample: Callable[[random.Random], dict[str, int]]
    numels: Callable[[Params], tuple[int, int, int]]
    flops: Callable[[Params], int]
    build: Callable[[Params, torch.dtype, torch.device], Step]


#: The operators a sweep covers, in the order of a round; :func:`register` adds one.
KINDS: dict[str, OperatorKind] = {}


def register(kind: OperatorKind) -> OperatorKind:
    """Adds an operator to every plan drawn from then on (its shapes come from a stream of its own, so
    the other kinds' samples, and the keys already measured, do not change)."""
    KINDS[kind.name] = kind
    return kind


def _size(rng: random.Random, lo: int, hi: int) -> int:
    """Log-uniform in [lo, hi]; a third rounded down to a multiple of 64 and a third to one of 8, as
    tensor-core kernels see aligned and unaligned sizes differently."""
    x = min(hi, max(lo, int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1))))))
    r = rng.random()
    if r < 1 / 3 and x >= 64:
        x = x // 64 * 64
    elif r < 2 / 3 and x >= 8:
        x = x // 8 * 8
    return x


def _log(rng: random.Random, lo: int, hi: int) -> int:
    return min(hi, max(lo, int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1))))))


#: The spatial sizes of an ImageNet network's stages, which half the spatial draws take.
_PYRAMID = (7, 14, 28, 56, 112, 224)


def _spatial(rng: random.Random) -> int:
    return rng.choice(_PYRAMID) if rng.random() < 0.5 else _log(rng, 7, 224)


def _rand(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    # uniform is several times faster than randn on the CPU; the values do not change the timing
    return torch.empty(shape, dtype=dtype, device=device).uniform_(-1.0, 1.0)


def _conv_out(p: Params) -> int:
    return (p["h"] + 2 * (p["r"] // 2) - p["r"]) // p["s"] + 1


def _sample_gemm(rng: random.Random) -> dict[str, int]:
    return {"m": _size(rng, 1, 16384), "n": _size(rng, 1, 16384), "k": _size(rng, 1, 16384)}


def _sample_bmm(rng: random.Random) -> dict[str, int]:
    return {"b": _log(rng, 1, 256), **_sample_gemm(rng)}


def _sample_conv(rng: random.Random) -> dict[str, int]:
    n, h = _log(rng, 1, 256), _spatial(rng)
    r = rng.choices((1, 3, 5, 7), weights=(3, 4, 1.5, 1.5))[0]
    s = rng.choices((1, 2), weights=(3, 1))[0]
    mode = rng.choices(("dense", "depthwise", "grouped"), weights=(2, 1, 1))[0]
    if mode == "depthwise":
        c = k = g = _size(rng, 8, 2048)
    elif mode == "grouped":
        g = rng.choice((2, 4, 8, 16, 32, 64))
        c, k = (g * max(1, _size(rng, 8, 2048) // g) for _ in range(2))
    else:
        g, c, k = 1, 3 if rng.random() < 0.1 else _size(rng, 3, 2048), _size(rng, 8, 2048)
    return {"n": n, "c": c, "k": k, "h": h, "r": r, "s": s, "g": g}


def _sample_elementwise(rng: random.Random) -> dict[str, int]:
    return {"n": _size(rng, 64, 2**28)}


def _sample_rows(rng: random.Random) -> dict[str, int]:
    return {"m": _size(rng, 1, 2**20), "n": _size(rng, 8, 16384)}


def _sample_nchw(rng: random.Random) -> dict[str, int]:
    return {"n": _log(rng, 1, 256), "c": _size(rng, 8, 2048), "h": _spatial(rng)}


def _sample_group_norm(rng: random.Random) -> dict[str, int]:
    p = _sample_nchw(rng)
    g = rng.choice((1, 8, 16, 32))
    return {**p, "c": g * max(1, p["c"] // g), "g": g}


def _sample_sdpa(rng: random.Random) -> dict[str, int]:
    return {"b": _log(rng, 1, 256), "h": _log(rng, 1, 16), "s": _size(rng, 16, 4096), "d": 8 * rng.randint(4, 16)}


def _binary(op: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
    def build(p: Params, dtype: torch.dtype, device: torch.device) -> Step:
        x, y = _rand((p["n"],), dtype, device), _rand((p["n"],), dtype, device)
        return lambda: op(x, y)
    return build


def _unary(op: Callable[[torch.Tensor], torch.Tensor], shape: Callable[[Params], tuple[int, ...]]):
    def build(p: Params, dtype: torch.dtype, device: torch.device) -> Step:
        x = _rand(shape(p), dtype, device)
        return lambda: op(x)
    return build


def _build_mm(p: Params, dtype: torch.dtype, device: torch.device) -> Step:
    a, b = _rand((p["m"], p["k"]), dtype, device), _rand((p["k"], p["n"]), dtype, device)
    return lambda: torch.mm(a, b)


def _build_linear(p: Params, dtype: torch.dtype, device: torch.device) -> Step:
    x, w, b = (_rand(s, dtype, device) for s in ((p["m"], p["k"]), (p["n"], p["k"]), (p["n"],)))
    return lambda: F.linear(x, w, b)


def _build_bmm(p: Params, dtype: torch.dtype, device: torch.device) -> Step:
    a, b = _rand((p["b"], p["m"], p["k"]), dtype, device), _rand((p["b"], p["k"], p["n"]), dtype, device)
    return lambda: torch.bmm(a, b)


def _build_conv(p: Params, dtype: torch.dtype, device: torch.device) -> Step:
    x = _rand((p["n"], p["c"], p["h"], p["h"]), dtype, device)
    w = _rand((p["k"], p["c"] // p["g"], p["r"], p["r"]), dtype, device)
    return lambda: F.conv2d(x, w, None, p["s"], p["r"] // 2, 1, p["g"])


def _build_batch_norm(p: Params, dtype: torch.dtype, device: torch.device) -> Step:
    x = _rand((p["n"], p["c"], p["h"], p["h"]), dtype, device)
    mean, weight, bias = (_rand((p["c"],), dtype, device) for _ in range(3))
    var = _rand((p["c"],), dtype, device).abs_().add_(0.5)
    return lambda: F.batch_norm(x, mean, var, weight, bias, training=False)


def _build_layer_norm(p: Params, dtype: torch.dtype, device: torch.device) -> Step:
    x, w, b = _rand((p["m"], p["n"]), dtype, device), _rand((p["n"],), dtype, device), _rand((p["n"],), dtype, device)
    return lambda: F.layer_norm(x, (p["n"],), w, b)


def _build_group_norm(p: Params, dtype: torch.dtype, device: torch.device) -> Step:
    x = _rand((p["n"], p["c"], p["h"], p["h"]), dtype, device)
    w, b = _rand((p["c"],), dtype, device), _rand((p["c"],), dtype, device)
    return lambda: F.group_norm(x, p["g"], w, b)


def _build_sdpa(p: Params, dtype: torch.dtype, device: torch.device) -> Step:
    q, k, v = (_rand((p["b"], p["h"], p["s"], p["d"]), dtype, device) for _ in range(3))
    return lambda: F.scaled_dot_product_attention(q, k, v)


def _rows_shape(p: Params) -> tuple[int, ...]:
    return (p["m"], p["n"])


def _nchw(p: Params) -> int:
    return p["n"] * p["c"] * p["h"] * p["h"]


def _pooled(p: Params) -> int:  # max pooling 3x3, stride 2, padding 1
    return p["n"] * p["c"] * ((p["h"] - 1) // 2 + 1) ** 2


register(OperatorKind("mm", 2, _sample_gemm, lambda p: (p["m"] * p["k"] + p["k"] * p["n"], 0, p["m"] * p["n"]),
                      lambda p: 2 * p["m"] * p["n"] * p["k"], _build_mm))
register(OperatorKind("linear", 3, _sample_gemm,
                      lambda p: (p["m"] * p["k"], p["n"] * p["k"] + p["n"], p["m"] * p["n"]),
                      lambda p: 2 * p["m"] * p["n"] * p["k"], _build_linear))
register(OperatorKind("bmm", 2, _sample_bmm,
                      lambda p: (p["b"] * (p["m"] * p["k"] + p["k"] * p["n"]), 0, p["b"] * p["m"] * p["n"]),
                      lambda p: 2 * p["b"] * p["m"] * p["n"] * p["k"], _build_bmm))
register(OperatorKind("conv2d", 6, _sample_conv,
                      lambda p: (_nchw(p), p["k"] * p["c"] // p["g"] * p["r"] ** 2,
                                 p["n"] * p["k"] * _conv_out(p) ** 2),
                      lambda p: 2 * p["n"] * p["k"] * _conv_out(p) ** 2 * p["c"] // p["g"] * p["r"] ** 2, _build_conv))
register(OperatorKind("sdpa", 2, _sample_sdpa, lambda p: (3 * p["b"] * p["h"] * p["s"] * p["d"], 0,
                                                           p["b"] * p["h"] * p["s"] * p["d"]),
                      lambda p: 4 * p["b"] * p["h"] * p["s"] ** 2 * p["d"], _build_sdpa))
for _name, _op in (("add", torch.add), ("mul", torch.mul)):
    register(OperatorKind(_name, 1, _sample_elementwise, lambda p: (2 * p["n"], 0, p["n"]), lambda p: p["n"],
                          _binary(_op)))
for _name, _op in (("relu", F.relu), ("gelu", F.gelu), ("silu", F.silu)):
    register(OperatorKind(_name, 1, _sample_elementwise, lambda p: (p["n"], 0, p["n"]), lambda p: p["n"],
                          _unary(_op, lambda p: (p["n"],))))
register(OperatorKind("sum", 1, _sample_rows, lambda p: (p["m"] * p["n"], 0, p["m"]), lambda p: p["m"] * p["n"],
                      _unary(lambda x: x.sum(-1), _rows_shape)))
register(OperatorKind("mean", 1, _sample_rows, lambda p: (p["m"] * p["n"], 0, p["m"]), lambda p: p["m"] * p["n"],
                      _unary(lambda x: x.mean(-1), _rows_shape)))
register(OperatorKind("batch_norm", 1, _sample_nchw, lambda p: (_nchw(p), 4 * p["c"], _nchw(p)),
                      lambda p: 5 * _nchw(p), _build_batch_norm))
register(OperatorKind("layer_norm", 1, _sample_rows, lambda p: (p["m"] * p["n"], 2 * p["n"], p["m"] * p["n"]),
                      lambda p: 5 * p["m"] * p["n"], _build_layer_norm))
register(OperatorKind("group_norm", 1, _sample_group_norm, lambda p: (_nchw(p), 2 * p["c"], _nchw(p)),
                      lambda p: 5 * _nchw(p), _build_group_norm))
register(OperatorKind("softmax", 1, _sample_rows, lambda p: (p["m"] * p["n"], 0, p["m"] * p["n"]),
                      lambda p: 5 * p["m"] * p["n"], _unary(lambda x: torch.softmax(x, -1), _rows_shape)))
register(OperatorKind("max_pool2d", 1, _sample_nchw, lambda p: (_nchw(p), 0, _pooled(p)), lambda p: 9 * _pooled(p),
                      _unary(lambda x: F.max_pool2d(x, 3, 2, 1), lambda p: (p["n"], p["c"], p["h"], p["h"]))))
register(OperatorKind("adaptive_avg_pool2d", 1, _sample_nchw, lambda p: (_nchw(p), 0, p["n"] * p["c"]), _nchw,
                      _unary(lambda x: F.adaptive_avg_pool2d(x, 1), lambda p: (p["n"], p["c"], p["h"], p["h"]))))


# ---- points and the plan ------------------------------------------------------------------------


@dataclass(frozen=True)
class Point:
    """One operator shape at one precision: a row of a sweep, named by a key that a rerun recognises.

    >>> p = Point("mm", (("m", 128), ("n", 64), ("k", 32)), "fp16")
    >>> p.key, p.flops, p.bytes
    ('mm:m=128;n=64;k=32:fp16', 524288, 28672)
    >>> Point.from_key(p.key) == p
    True
    """

    kind: str
    params: tuple[tuple[str, int], ...]
    precision: str

    @property
    def shape(self) -> dict[str, int]:
        """The shape parameters by name (``m``, ``n``, ``k`` for a GEMM; ``n``, ``c``, ``k``, ``h``, ``r``, ``s``,
        ``g`` for a convolution: batch, channels in and out, square input size, kernel, stride, groups)."""
        return dict(self.params)

    @property
    def params_text(self) -> str:
        """The shape as the ``params`` column writes it: ``m=128;n=64;k=32``."""
        return ";".join(f"{name}={value}" for name, value in self.params)

    @property
    def key(self) -> str:
        """``kind:params:precision``: the same on every machine and every run, so a rerun skips what is measured
        and sweeps of different GPUs can be joined point by point."""
        return f"{self.kind}:{self.params_text}:{self.precision}"

    @classmethod
    def from_key(cls, key: str) -> Point:
        """The point a row's key names, so a cost model can rebuild the shape it was measured at."""
        kind, params, precision = key.split(":")
        pairs = tuple((name, int(value)) for name, value in (item.split("=") for item in params.split(";")))
        return cls(kind, pairs, precision)

    @property
    def dtype(self) -> torch.dtype:
        """The tensors' dtype: autocast's for fp16 and bf16, float32 for the other precisions."""
        return PRECISION_MODES[self.precision].autocast_dtype or torch.float32

    @property
    def flops(self) -> int:
        """Floating-point operations of one call, counted as ``dippm_nas.graph.ops`` counts them."""
        return KINDS[self.kind].flops(self.shape)

    @property
    def bytes(self) -> int:
        """Inputs, weights and output at the point's dtype: the least a kernel must move. Under autocast a
        float32-list operator (layer norm, group norm, softmax, sum on CUDA) writes a float32 output and moves more."""
        return sum(KINDS[self.kind].numels(self.shape)) * self.dtype.itemsize

    @property
    def footprint(self) -> int:
        """The memory a point may need, checked before anything is allocated: twice its tensors at four bytes an
        element, room for autocast's float32 copies and a kernel's workspace."""
        return 2 * 4 * sum(KINDS[self.kind].numels(self.shape))


def _draw_shapes(kind: OperatorKind, seed: int, count: int, max_flops: float) -> list[tuple[tuple[str, int], ...]]:
    """``count`` distinct shapes of ``kind`` from its own seeded stream, within the plan's limits."""
    rng = random.Random(f"dippm-nas-sweep:{seed}:{kind.name}")
    shapes: list[tuple[tuple[str, int], ...]] = []
    seen: set[tuple[tuple[str, int], ...]] = set()
    for _ in range(200 * count):
        if len(shapes) == count:
            break
        params = kind.sample(rng)
        if kind.flops(params) > max_flops or 4 * sum(kind.numels(params)) > PLAN_MAX_BYTES:
            continue
        shape = tuple(params.items())
        if shape not in seen:
            seen.add(shape)
            shapes.append(shape)
    return shapes


def sweep_points(seed: int = 0, device_kind: str = "cuda", rounds: int = DEFAULT_ROUNDS) -> list[Point]:
    """The ordered plan of a sweep: deterministic for a seed, so a rerun finds its keys again.

    Each operator kind draws ``rounds * weight`` shapes from a stream seeded by ``seed`` and its name;
    the plan takes them round-robin (the first kind-by-kind pass holds one shape of every kind) and
    each shape at every precision, so any prefix covers every kind and precision in proportion. The
    CPU plan, which tests the harness, keeps only shapes of at most CPU_MAX_FLOPS (from the same
    streams, so it is a subset of the shapes the GPU plan draws first).

    >>> plan = sweep_points(seed=0, rounds=1)
    >>> len({p.kind for p in plan[:len(KINDS) * 5]}), len(plan) == 5 * sum(k.weight for k in KINDS.values())
    (18, True)
    """
    max_flops = CPU_MAX_FLOPS if device_kind == "cpu" else PLAN_MAX_FLOPS
    shapes = {name: _draw_shapes(kind, seed, rounds * kind.weight, max_flops) for name, kind in KINDS.items()}
    taken = dict.fromkeys(KINDS, 0)
    plan: list[Point] = []
    for _ in range(rounds):
        for turn in range(max(kind.weight for kind in KINDS.values())):
            for name, kind in KINDS.items():
                if turn >= kind.weight or taken[name] >= len(shapes[name]):
                    continue
                shape = shapes[name][taken[name]]
                taken[name] += 1
                plan.extend(Point(name, shape, precision) for precision in PRECISIONS)
    return plan


# ---- timing -------------------------------------------------------------------------------------


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


# ---- the sweep ----------------------------------------------------------------------------------


def memory_cap(device_kind: str) -> int:
    """Bytes a point's footprint may take here: CUDA_MEMORY_FRACTION of the GPU's free memory, or CPU_MEMORY_CAP."""
    if device_kind == "cuda":
        free, _total = torch.cuda.mem_get_info()
        return int(free * CUDA_MEMORY_FRACTION)
    return CPU_MEMORY_CAP


def point_row(point: Point) -> dict[str, object]:
    """The columns that say which point a row belongs to and how much work it is; every row starts with them."""
    return {"key": point.key, "kind": point.kind, "params": point.params_text, "precision": point.precision,
            "dtype": str(point.dtype).removeprefix("torch."), "flops": point.flops, "bytes": point.bytes}


def measure_point(point: Point, device_kind: str, timer: Callable[[Step], dict[str, object]]) -> dict[str, object]:
    """The point's timing row; a failure raises (``run_sweep`` records it as a row)."""
    device = torch.device(device_kind)
    with torch.inference_mode(), running_in(point.precision, device_kind):
        step = KINDS[point.kind].build(point.shape, point.dtype, device)
        try:
            return {**point_row(point), "status": "ok", **timer(step)}
        finally:
            del step


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


def prepare_file(path: Path) -> None:
    """Makes ``path`` ready to append to, or refuses it: a file of other rows is never touched, and a last line
    that a kill cut short (no line end) is dropped, so the file stays valid CSV and the point is measured again."""
    if not path.exists() or path.stat().st_size == 0:
        return
    data = path.read_bytes()
    header = ",".join(SWEEP_COLUMNS).encode()
    first, newline, _rest = data.partition(b"\n")
    if not newline:  # a kill while the header was being written
        if header.startswith(data.rstrip(b"\r")):
            path.write_bytes(b"")
            return
    elif next(csv.reader([first.decode(errors="replace")]), []) == SWEEP_COLUMNS:
        if not data.endswith(b"\n"):
            with path.open("r+b") as fh:
                fh.truncate(data.rindex(b"\n") + 1)
        return
    raise DippmError(f"{path} holds rows of another kind than operator sweeps (its columns differ); give --out a "
                     "file of its own, e.g. data/measurements/sweeps/<gpu>.csv")


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run_sweep(out: str | Path, device_kind: str = "cuda", budget_s: float | None = None, seed: int = 0,
              measured_by: str = "dippm-nas harness", progress: Callable[[str], None] = _stderr,
              limit: int | None = None) -> int:
    """Measure the points of the seed's plan that ``out`` does not hold yet; returns how many were measured.

    Stops cleanly before ``budget_s`` seconds (the longest point so far is the margin) or after ``limit``
    points; a rerun with the same seed continues where this one stopped. A point whose footprint exceeds
    :func:`memory_cap` is skipped before anything is allocated (no row: it is not a result of the GPU);
    an out-of-memory or another failure is a row with status ``oom`` or ``error``, and the sweep goes on.
    """
    start = time.monotonic()
    if device_kind not in ("cuda", "cpu"):
        raise DippmError(f"device {device_kind!r} is neither 'cuda' nor 'cpu'")
    if device_kind == "cuda" and not torch.cuda.is_available():
        raise DippmError("no CUDA device is visible; use device_kind='cpu' (--device cpu) to test the sweep")
    out = Path(out)
    prepare_file(out)
    done = measured_keys(out)
    todo = [p for p in sweep_points(seed, device_kind) if p.key not in done]
    progress(f"{len(done)} points already in {out}; {len(todo)} of seed {seed}'s plan to measure")
    env = describe(device_kind).as_row()
    timer = CudaTimer() if device_kind == "cuda" else cpu_timer
    cap = memory_cap(device_kind)
    measured = skipped = 0
    longest = 0.0
    for point in todo:
        if limit is not None and measured >= limit:
            break
        if budget_s is not None and time.monotonic() - start + longest > budget_s:
            progress(f"budget of {budget_s:g} s reached after {measured} points; rerun with --seed {seed} to continue")
            return measured
        if point.footprint > cap:
            skipped += 1
            continue
        began = time.monotonic()
        try:
            row = measure_point(point, device_kind, timer)
        except Exception as exc:  # an out-of-memory or an operator that fails is a result to record
            row = {**point_row(point), "status": "oom" if _is_oom(exc) else "error", "error": one_line(exc)}
        # outside the handler, whose traceback would keep the failed point's tensors alive
        broken = _recover(point) if device_kind == "cuda" and row["status"] != "ok" else None
        row.update(env, **PRECISION_MODES[point.precision].flags(), protocol=SWEEP_PROTOCOL,
                   measured_by=measured_by, date=utc_now(), seed=seed)
        append_rows(out, [row], SWEEP_COLUMNS)
        if broken is not None:
            raise broken
        measured += 1
        longest = max(longest, time.monotonic() - began)
        verdict = f"{row['latency_ms_median']:.4f} ms" if row["status"] == "ok" else row["error"]
        progress(f"[{measured}] {point.key}: {row['status']} {verdict}")
    left = len(todo) - measured - skipped
    progress(f"{measured} points measured, {skipped} skipped (over the memory cap of {cap / MIB:.0f} MiB); "
             + (f"{left} left: rerun with --seed {seed} to continue" if left else "the plan is done"))
    return measured


def _recover(point: Point) -> RuntimeError | None:
    """Frees what a failed point left on the GPU. A context the failure broke (an illegal address is sticky)
    comes back as the error that stops the sweep, raised once the point's row is written: every later point
    would fail the same way."""
    torch.cuda.empty_cache()
    try:
        torch.cuda.synchronize()
    except Exception as exc:
        return RuntimeError(f"the CUDA context failed at {point.key} ({one_line(exc)}); a rerun in a new process "
                            "continues after this point")
    return None
