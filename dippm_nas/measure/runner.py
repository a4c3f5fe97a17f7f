"""Measure every configuration of a manifest, appending each row as it finishes.

Safe with data: a row is flushed and fsynced as soon as its configuration ends, a rerun skips the
configurations already in the file, and ``budget_s`` stops cleanly before a time limit, so a crash or
a kill loses at most the configuration in flight. An out-of-memory is a result, recorded with its
batch size, not a crash.

The protocol (``environment.PROTOCOL``) is the run's: NVML's used memory read before CUDA starts (the
baseline of the process's memory where the driver gives no per-process figure), the GPU kept busy
until its clock settles, the host's cost per eager operator measured once; then per configuration,
under its precision's flags and autocast, a timed window (again while its spread is wide) with the
host's time to issue each forward pass, the clocks and temperature it ran at, the memory NVML counts
for the process at its peak, and the forward pass replayed as a CUDA graph.
"""

from __future__ import annotations

import contextlib
import csv
import gc
import importlib
import json
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from dippm_nas.errors import one_line
from dippm_nas.measure.config import MeasureConfig
from dippm_nas.measure.energy import EnergyMeter
from dippm_nas.measure.environment import PROTOCOL, Environment, describe, utc_now
from dippm_nas.measure.gpu_state import GpuProbe, cuda_load_sampler, require_device, settle_clocks
from dippm_nas.measure.host_cost import HostCost, measure_host_cost
from dippm_nas.measure.precision_modes import precision_mode, running_in
from dippm_nas.measure.timing import (
    Timer,
    Timing,
    capture_cuda_graph,
    free_cublas_workspaces,
    tightest,
    time_steps,
)

MIB = 2**20

COLUMNS = [
    "key", "model", "source", "family", "input_shape", "batch", "precision", "layout", "status", "error",
    "latency_ms_median", "latency_ms_mean", "latency_ms_p10", "latency_ms_p90", "iterations", "window_s",
    "warmup_iterations", "attempts", "host_issue_ms", "latency_ms_cuda_graphs", "cuda_graphs_error",
    "energy_j", "energy_method", "power_w_mean",
    "memory_process_mib", "memory_process_method", "memory_context_mib", "memory_reserved_mib",
    "memory_allocated_mib", "memory_total_mib", "cpu_peak_rss_mib",
    "sm_clock_mhz", "mem_clock_mhz", "temperature_c", "power_limit_w",
    "host_us_per_op", "host_us_per_op_autocast", "host_profile",
    "device_kind", "gpu_name", "driver", "cuda", "cudnn", "torch", "timm", "tf32_matmul", "tf32_cudnn",
    "cudnn_benchmark", "cpu", "protocol", "measured_by", "date",
]


def measured_keys(path: Path) -> set[str]:
    """Keys of the configurations ``path`` already holds a row for (empty when there is no file yet)."""
    if not path.exists() or path.stat().st_size == 0:
        return set()
    with path.open(newline="") as fh:
        return {row["key"] for row in csv.DictReader(fh) if row.get("key")}


def append_rows(path: Path, rows: list[dict[str, object]], columns: list[str] = COLUMNS) -> None:
    """Appends one configuration's rows and syncs them to disk before the next configuration starts."""
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists() or path.stat().st_size == 0
    with path.open("a", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        if new:
            writer.writeheader()
        writer.writerows({k: row.get(k, "") for k in columns} for row in rows)
        fh.flush()
        os.fsync(fh.fileno())


def build_model(cfg: MeasureConfig) -> torch.nn.Module:
    """Random weights: timm ``pretrained=False``, a search space's candidate (``source`` names the space,
    ``model`` the architecture) or a ``module:factory`` callable."""
    if cfg.source == "timm":
        import timm

        return timm.create_model(cfg.model, pretrained=False)
    from search_spaces import SEARCH_SPACES, candidate_named

    if cfg.source in SEARCH_SPACES:
        return candidate_named(f"{cfg.source}:{cfg.model}").instantiate()
    module_name, _, attr = cfg.model.partition(":")
    return getattr(importlib.import_module(module_name), attr)()


class ModelOnDevice:
    """The device a run measures on: the last model built, kept there (consecutive configurations of
    one model, its batches and precisions, build it once, which is most of a small configuration's
    time), and NVML's view of the GPU (``gpu``: the process's memory, clocks; answers None on the CPU)."""

    def __init__(self, device: torch.device, gpu: GpuProbe | None = None):
        self.device = device
        self.gpu = gpu if gpu is not None else GpuProbe(None)
        self._key: tuple[str, str, str, torch.dtype | None] | None = None
        self._model: torch.nn.Module | None = None

    def __call__(self, cfg: MeasureConfig) -> torch.nn.Module:
        """The configuration's model in eval mode on the device, cast to its precision's weights dtype where it
        has one (``model.half()``), built only when the model, the dtype or the layout differs."""
        dtype = precision_mode(cfg.precision).weights_dtype
        key = (cfg.source, cfg.model, cfg.layout, dtype)
        if key != self._key:
            self.drop()
            model = build_model(cfg).to(self.device).eval()
            if dtype is not None:
                model = model.to(dtype)
            if cfg.layout == "nhwc":
                model = model.to(memory_format=torch.channels_last)
            self._key, self._model = key, model
        return self._model

    def drop(self) -> None:
        """Forgets the model, so that a failed configuration's memory can be freed and the next one rebuilds."""
        self._key = self._model = None


def context_memory_mib(device_kind: str, gpu: GpuProbe | None = None) -> float | None:
    """NVML used memory once CUDA, cuBLAS and cuDNN are initialised, minus before, minus what the
    allocator holds: the context and library handles the process pays before its first tensor.

    Kept as the v1 column ``memory_context_mib``; ``memory_process_mib`` is what a MIG slice limits.
    """
    if device_kind != "cuda":
        return None
    gpu = gpu if gpu is not None else GpuProbe.open(device_kind)
    before = gpu.device_used()
    x = torch.randn(64, 64, device="cuda")
    torch.nn.functional.conv2d(x[None, None], torch.randn(1, 1, 3, 3, device="cuda"))  # cuDNN
    x @ x  # cuBLAS
    torch.cuda.synchronize()
    del x
    after = gpu.device_used()
    if before is None or after is None:
        return None
    return (after - before - torch.cuda.memory_reserved()) / MIB


def model_input(cfg: MeasureConfig, device_kind: str, device: torch.device
                ) -> tuple[torch.Tensor, contextlib.AbstractContextManager]:
    """A random input batch in the configuration's layout and its precision's input dtype, and the context its
    precision runs under (``precision.running_in``: the mode's TF32 flags, autocast where it has one; it yields
    the mode)."""
    x = torch.randn(cfg.batch, *cfg.input_shape, device=device, dtype=precision_mode(cfg.precision).input_dtype)
    if cfg.layout == "nhwc":
        x = x.to(memory_format=torch.channels_last)
    return x, running_in(cfg.precision, device_kind)


def configuration_row(cfg: MeasureConfig) -> dict[str, object]:
    """The columns that say which configuration a row belongs to; every row starts with them."""
    return {"key": cfg.key, "model": cfg.model, "source": cfg.source, "family": cfg.family,
            "input_shape": "x".join(map(str, cfg.input_shape)), "batch": cfg.batch,
            "precision": cfg.precision, "layout": cfg.layout}


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


@dataclass(frozen=True)
class Window:
    """One timed window of a configuration, with what was read at its end: the energy meter that
    bracketed it (None on the CPU) and the GPU's clocks, temperature and power limit."""

    timing: Timing
    meter: EnergyMeter | None
    state: dict[str, float | None]
    #: The median over the window's iterations of the host's time to issue one (:class:`IssueClock`).
    host_issue_ms: float | None = None


class IssueClock:
    """``step`` that also keeps, per call, the host's time to issue it: the wall clock until the call
    returns, while the GPU may still run what it was given. Eager latency at small batches is this
    time; it moves with the host's speed, which no GPU counter shows. Where the launch queue fills or
    the forward pass synchronises, the host's wait for the GPU is in it too."""

    def __init__(self, step: Callable[[], object]):
        self.step = step
        self.ms: list[float] = []

    def __call__(self) -> object:
        """Runs ``step`` once and keeps how long the host took to return from it."""
        began = time.perf_counter()
        result = self.step()
        self.ms.append((time.perf_counter() - began) * 1e3)
        return result


def timed_window(step: Callable[[], object], timer: Callable[[Callable[[], object]], float],
                 gpu: GpuProbe, energy: bool) -> Window:
    """Warm-up and one timed window of ``step``, its energy metered where ``energy`` (CUDA), the GPU's
    state read as the window closes and the host's time to issue each of the window's iterations."""
    meter = EnergyMeter(lib=gpu.lib) if energy else None
    state: dict[str, float | None] = {}
    issued = IssueClock(step)
    window_calls: list[int] = []

    def start() -> None:
        window_calls.append(len(issued.ms))
        if meter is not None:
            meter.start()

    def end() -> None:
        window_calls.append(len(issued.ms))
        if meter is not None:
            meter.stop()
        state.update(gpu.state())

    timing = time_steps(issued, timer, on_start=start, on_end=end)
    first, last = window_calls
    host_ms = issued.ms[first:last]
    return Window(timing, meter, state, statistics.median(host_ms) if host_ms else None)


def time_cuda_graph(step: Callable[[], object], timer: Callable[[Callable[[], object]], float],
                    capture: Callable[[Callable[[], object]], Callable[[], object]] = capture_cuda_graph,
                    ) -> tuple[float | None, str]:
    """The median latency in ms of ``step`` replayed as a CUDA graph (the same protocol's warm-up and
    window), or None and the capture's failure on one line: eager's host wait, removed."""
    try:
        replay = capture(step)
        return time_steps(replay, timer).median_ms, ""
    except Exception as exc:  # a host synchronisation in forward, an unsupported op, an OOM in the graph's pool
        return None, one_line(exc)


def measure_one(cfg: MeasureConfig, env: Environment, context_mib: float | None,
                models: ModelOnDevice) -> dict[str, object]:
    """The configuration's latency row; a failure raises (``run`` records it)."""
    cuda = env.device_kind == "cuda"
    model = models(cfg)
    gpu = models.gpu
    if cuda:  # the peak from here on: the resident weights, the input, the run
        free_cublas_workspaces()  # those of the graph captures so far; the run allocates its own
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    x, precision = model_input(cfg, env.device_kind, models.device)
    timer = Timer(env.device_kind)
    with torch.inference_mode(), precision:
        flags = {"tf32_matmul": torch.backends.cuda.matmul.allow_tf32, "tf32_cudnn": torch.backends.cudnn.allow_tf32}

        def step() -> object:
            return model(x)

        window, attempts = tightest(lambda: timed_window(step, timer, gpu, energy=cuda),
                                    spread=lambda w: w.timing.spread)
        # the configuration's peak: the caching allocator still holds the segments the run reserved
        memory_process, memory_method = gpu.process_memory()
        if cuda:
            reserved = torch.cuda.max_memory_reserved() / MIB
            allocated = torch.cuda.max_memory_allocated() / MIB
            graph_ms, graph_error = time_cuda_graph(step, timer)
    timing = window.timing
    row = {**configuration_row(cfg), "memory_context_mib": context_mib, "status": "ok", **flags, **window.state,
           "latency_ms_median": timing.median_ms, "latency_ms_mean": timing.mean_ms, "latency_ms_p10": timing.p10_ms,
           "latency_ms_p90": timing.p90_ms, "iterations": timing.iterations, "window_s": timing.window_s,
           "warmup_iterations": timing.warmup, "attempts": attempts, "host_issue_ms": window.host_issue_ms,
           "memory_process_mib": memory_process, "memory_process_method": memory_method}
    meter = window.meter
    if meter is not None and meter.joules is not None:
        row.update(energy_j=meter.joules / timing.iterations, energy_method=meter.method,
                   power_w_mean=meter.joules / timing.window_s)
    if cuda:
        row.update(memory_reserved_mib=reserved, memory_allocated_mib=allocated,
                   memory_total_mib=(context_mib or 0.0) + reserved,
                   latency_ms_cuda_graphs=graph_ms, cuda_graphs_error=graph_error)
    else:
        row["cpu_peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return row


def _check_header(path: Path, columns: list[str], what: str) -> None:
    """Rows of one kind and one protocol per file: appending rows with other columns would corrupt it."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with path.open(newline="") as fh:
        header = next(csv.reader(fh), [])
    if header != columns:
        missing = [c for c in columns if c not in header]
        extra = [c for c in header if c not in columns]

        def names(cols: list[str]) -> str:
            return ", ".join(cols[:6]) + (f" and {len(cols) - 6} more" if len(cols) > 6 else "") if cols else "none"

        raise RuntimeError(
            f"{path} holds rows of another kind than {what!r}, or of an older protocol (its columns differ: "
            f"missing {names(missing)}; not ours {names(extra)}), and appending would corrupt it; write to a new "
            "file: give --out a path of its own (the old file stays valid as it is, with its own protocol)")


@dataclass(frozen=True)
class Measurement:
    """One kind of row the harness writes per configuration: its columns, protocol and how it is taken."""

    columns: list[str]
    protocol: str
    #: the configuration's rows; raises where it fails (``run`` records the failure as a row)
    take: Callable[[MeasureConfig, Environment, float | None, ModelOnDevice], list[dict[str, object]]]
    summary: Callable[[list[dict[str, object]]], str]  # the progress line's verdict


def _latency_summary(rows: list[dict[str, object]]) -> str:
    latency = rows[0].get("latency_ms_median")
    verdict = f"{latency:.3f} ms" if isinstance(latency, float) else str(rows[0].get("error", ""))
    return f"{rows[0]['status']} {verdict}"


#: What ``run`` can measure, by name (``dippm_nas.measure.kernels`` adds "kernels", ``dippm_nas.measure.compiled``
#: "compiled").
MEASUREMENTS: dict[str, Measurement] = {
    "latency": Measurement(COLUMNS, PROTOCOL, lambda *args: [measure_one(*args)], _latency_summary),
}


def _host_columns(device_kind: str, progress: Callable[[str], None]) -> dict[str, object]:
    """The run's host cost as the columns of every latency row; a failure is reported, not fatal."""
    began = time.monotonic()
    try:
        cost: HostCost = measure_host_cost(device_kind)
    except Exception as exc:  # the ground truth does not depend on it
        progress(f"host cost per operator not measured: {one_line(exc)}")
        return {"host_profile": json.dumps({"error": one_line(exc)})}
    autocast = cost.us_per_op_autocast
    progress(f"host cost per eager operator: {cost.us_per_op or 0:.2f} us (fp32), "
             f"{autocast or 0:.2f} us (fp16 autocast); measured in {time.monotonic() - began:.1f} s")
    return cost.as_row()


def run(configs: Iterable[MeasureConfig], out: str | Path, device_kind: str = "cuda",
        budget_s: float | None = None, measured_by: str = "dippm-nas harness",
        progress: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
        what: str = "latency") -> int:
    """Measure what ``out`` does not hold yet; returns how many configurations were measured.

    Before any CUDA call it reads the device's used memory (the baseline of ``memory_process_mib``
    where the driver gives no per-process figure); before the first configuration it keeps the GPU
    busy until its clock settles and measures the host's cost per operator (``host.py``), all within
    ``budget_s``.
    """
    start = time.monotonic()
    if what not in MEASUREMENTS:
        raise ValueError(f"unknown measurement {what!r}; known: {', '.join(MEASUREMENTS)}")
    # First of all, before anything touches torch.cuda: what the device uses without this process.
    gpu = GpuProbe.open(device_kind)
    cuda_was_up = device_kind == "cuda" and torch.cuda.is_initialized()
    if not cuda_was_up:
        gpu.take_baseline()
    require_device(device_kind, "harness")
    measurement = MEASUREMENTS[what]
    out = Path(out)
    _check_header(out, measurement.columns, what)
    done = measured_keys(out)
    todo = [c for c in configs if c.key not in done]
    progress(f"{len(done)} configurations already in {out}; {len(todo)} to measure")
    if not todo:
        return 0
    if cuda_was_up:
        progress("CUDA was initialised before the run: memory_process_mib only where the driver lists this process")
    env = describe(device_kind)
    context = context_memory_mib(device_kind, gpu)
    if device_kind == "cuda":
        progress(settle_clocks(cuda_load_sampler(gpu)).describe())
        torch.cuda.empty_cache()
    run_columns = _host_columns(device_kind, progress) if "host_us_per_op" in measurement.columns else {}
    models = ModelOnDevice(torch.device(device_kind), gpu)
    longest = 0.0
    for i, cfg in enumerate(todo, 1):
        elapsed = time.monotonic() - start
        if budget_s is not None and elapsed + longest > budget_s:
            progress(f"budget of {budget_s:.0f} s reached after {i - 1} configurations; rerun to continue")
            return i - 1
        began = time.monotonic()
        try:
            rows = measurement.take(cfg, env, context, models)
        except Exception as exc:  # an out-of-memory or a model that fails is a result to record
            rows = [{**configuration_row(cfg), "memory_context_mib": context,
                     "status": "oom" if _is_oom(exc) else "error", "error": one_line(exc)}]
            models.drop()
        gc.collect()  # what the configuration left, before the next one starts
        if device_kind == "cuda":
            torch.cuda.empty_cache()
        # the environment, then the flags of the configuration's precision (a row's own reading wins)
        flags = precision_mode(cfg.precision).flags()
        rows = [{**env.as_row(), **flags, **run_columns, **row, "protocol": measurement.protocol,
                 "measured_by": measured_by, "date": utc_now()} for row in rows]
        append_rows(out, rows, measurement.columns)
        longest = max(longest, time.monotonic() - began)
        progress(f"[{i}/{len(todo)}] {cfg.key}: {measurement.summary(rows)}")
    return len(todo)
