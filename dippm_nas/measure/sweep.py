"""Operator sweeps: single-operator timings by the thousand, the ground truth of a learned per-operator cost model.

A whole-model row says how long a network took, not which of its operators took it; a per-operator
cost model needs each operator timed alone over the shapes real networks give it. A sweep draws a
seeded, stratified sample of shapes for the operators that dominate real models (GEMMs, convolutions,
attention, normalisations, elementwise, reductions, pooling), runs every shape at every precision of
:data:`~dippm_nas.measure.precision_modes.PRECISIONS` and appends one row per point with its FLOPs, bytes
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
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from dippm_nas.errors import DippmError, one_line
from dippm_nas.measure.environment import describe, utc_now
from dippm_nas.measure.gpu_state import require_device
from dippm_nas.measure.precision_modes import PRECISION_MODES, PRECISIONS, running_in
from dippm_nas.measure.runner import append_rows, measured_keys
from dippm_nas.measure.sweep_operators import KINDS, OperatorKind, Step
from dippm_nas.measure.sweep_timing import (
    ESTIMATE_ITERATIONS,
    MAX_ITERATIONS,
    MIN_ITERATIONS,
    MIN_WINDOW_MS,
    WARMUP_ITERATIONS,
    CudaTimer,
    cpu_timer,
)
from dippm_nas.user_files import read_user_csv

MIB = 2**20

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
    f"TF32 flags and autocast (fp16/bf16; none for fp16-weights/bf16-weights); warm-up {WARMUP_ITERATIONS} "
    f"iterations, then {ESTIMATE_ITERATIONS} "
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
        """The tensors' dtype: autocast's for fp16 and bf16, the weights' for fp16-weights and bf16-weights,
        float32 for the other precisions."""
        mode = PRECISION_MODES[self.precision]
        return mode.autocast_dtype or mode.weights_dtype or torch.float32

    @property
    def flops(self) -> int:
        """Floating-point operations of one call, by the operator registry's rule (:mod:`dippm_nas.graph.operators`)."""
        return KINDS[self.kind].flops(self.shape)

    @property
    def bytes(self) -> int:
        """Inputs, weights and output at the point's dtype: the least a kernel must move. Under autocast a
        float32-list operator (layer norm, group norm, softmax, sum on CUDA) writes a float32 output and moves more."""
        return KINDS[self.kind].numel(self.shape) * self.dtype.itemsize

    @property
    def footprint(self) -> int:
        """The memory a point may need, checked before anything is allocated: twice its tensors at four bytes an
        element, room for autocast's float32 copies and a kernel's workspace."""
        return 2 * 4 * KINDS[self.kind].numel(self.shape)


def _draw_shapes(kind: OperatorKind, seed: int, count: int, max_flops: float) -> list[tuple[tuple[str, int], ...]]:
    """``count`` distinct shapes of ``kind`` from its own seeded stream, within the plan's limits."""
    rng = random.Random(f"dippm-nas-sweep:{seed}:{kind.name}")
    shapes: list[tuple[tuple[str, int], ...]] = []
    seen: set[tuple[tuple[str, int], ...]] = set()
    for _ in range(200 * count):
        if len(shapes) == count:
            break
        params = kind.sample(rng)
        if kind.flops(params) > max_flops or 4 * kind.numel(params) > PLAN_MAX_BYTES:
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
    >>> first_pass = plan[:len(KINDS) * len(PRECISIONS)]
    >>> len({p.kind for p in first_pass}), len(plan) == len(PRECISIONS) * sum(k.weight for k in KINDS.values())
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


def read_points(path: str | Path) -> list[Point]:
    """The points a plan file lists, in its order: a CSV whose ``key`` column names each point as a sweep's row
    does (``linear:m=1;n=3072;k=4096;bias=0:fp16-weights``). A plan of shapes chosen elsewhere (an LLM's
    projections, say) is timed by the sweep's protocol, point for point comparable with its rows."""
    path = Path(path)
    if not path.is_file():
        raise DippmError(f"no plan of points at {path}; give a CSV with a key column, e.g. "
                         "data/manifests/vidur_gemms.csv")
    points = []
    reader = read_user_csv(path, "the plan of points")
    if "key" not in (reader.fieldnames or []):
        raise DippmError(f"{path} has no key column; a plan of points lists each point's key, as a sweep's "
                         "rows name them")
    for line, row in enumerate(reader, start=2):
        try:
            point = Point.from_key(row["key"] or "")
            if point.kind not in KINDS or point.precision not in PRECISION_MODES:
                raise ValueError(f"unknown {'kind' if point.kind not in KINDS else 'precision'}")
            KINDS[point.kind].operands(point.shape)
        except (KeyError, ValueError) as exc:
            raise DippmError(f"{path}, line {line}: {row['key']!r} is no sweep point ({one_line(exc)}); a key "
                             f"is kind:name=value;...:precision, of the kinds {', '.join(KINDS)} and the "
                             f"precisions {', '.join(PRECISIONS)}") from None
        points.append(point)
    return points


def run_sweep(out: str | Path, device_kind: str = "cuda", budget_s: float | None = None, seed: int = 0,
              measured_by: str = "dippm-nas harness", progress: Callable[[str], None] = _stderr,
              limit: int | None = None, points: Sequence[Point] | None = None) -> int:
    """Measure the points of the seed's plan (or of ``points``, a plan of its own) that ``out`` does not hold
    yet; returns how many were measured.

    Stops cleanly before ``budget_s`` seconds (the longest point so far is the margin) or after ``limit``
    points; a rerun with the same plan continues where this one stopped. A point whose footprint exceeds
    :func:`memory_cap` is skipped before anything is allocated (no row: it is not a result of the GPU);
    an out-of-memory or another failure is a row with status ``oom`` or ``error``, and the sweep goes on.
    A row of a plan of its own leaves ``seed`` empty.
    """
    start = time.monotonic()
    require_device(device_kind, "sweep")
    out = Path(out)
    prepare_file(out)
    done = measured_keys(out)
    plan, plan_name, again = ((sweep_points(seed, device_kind), f"seed {seed}'s plan", f"rerun with --seed {seed}")
                              if points is None else (points, "the plan given", "rerun with the same plan"))
    todo = [p for p in plan if p.key not in done]
    progress(f"{len(done)} points already in {out}; {len(todo)} of {plan_name} to measure")
    env = describe(device_kind).as_row()
    timer = CudaTimer() if device_kind == "cuda" else cpu_timer
    cap = memory_cap(device_kind)
    measured = skipped = 0
    longest = 0.0
    for point in todo:
        if limit is not None and measured >= limit:
            break
        if budget_s is not None and time.monotonic() - start + longest > budget_s:
            progress(f"budget of {budget_s:g} s reached after {measured} points; {again} to continue")
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
                   measured_by=measured_by, date=utc_now(), seed=seed if points is None else "")
        append_rows(out, [row], SWEEP_COLUMNS)
        if broken is not None:
            raise broken
        measured += 1
        longest = max(longest, time.monotonic() - began)
        verdict = f"{row['latency_ms_median']:.4f} ms" if row["status"] == "ok" else row["error"]
        progress(f"[{measured}] {point.key}: {row['status']} {verdict}")
    left = len(todo) - measured - skipped
    progress(f"{measured} points measured, {skipped} skipped (over the memory cap of {cap / MIB:.0f} MiB); "
             + (f"{left} left: {again} to continue" if left else "the plan is done"))
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
