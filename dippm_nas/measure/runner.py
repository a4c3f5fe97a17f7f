"""Measure every configuration of a manifest, appending each row as it finishes.

Safe with data: a row is flushed and fsynced as soon as its configuration ends, a rerun skips the
configurations already in the file, and ``budget_s`` stops cleanly before a time limit, so a crash or
a kill loses at most the configuration in flight. An out-of-memory is a result, recorded with its
batch size, not a crash.
"""

from __future__ import annotations

import contextlib
import csv
import gc
import importlib
import os
import resource
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from dippm_nas.errors import one_line
from dippm_nas.measure.config import MeasureConfig
from dippm_nas.measure.energy import EnergyMeter
from dippm_nas.measure.environment import PROTOCOL, Environment, describe, nvml, utc_now
from dippm_nas.measure.timing import Timer, time_steps

MIB = 2**20

COLUMNS = [
    "key", "model", "source", "family", "input_shape", "batch", "precision", "layout", "status", "error",
    "latency_ms_median", "latency_ms_mean", "latency_ms_p10", "latency_ms_p90", "iterations", "window_s",
    "warmup_iterations", "energy_j", "energy_method", "power_w_mean", "memory_context_mib",
    "memory_reserved_mib", "memory_allocated_mib", "memory_total_mib", "cpu_peak_rss_mib",
    "device_kind", "gpu_name", "driver", "cuda", "cudnn", "torch", "timm", "tf32_matmul", "tf32_cudnn",
    "cudnn_benchmark", "cpu", "protocol", "measured_by", "date",
]

_AUTOCAST = {"fp16": torch.float16, "bf16": torch.bfloat16}


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
    """Random weights: timm ``pretrained=False``, or a ``module:factory`` callable."""
    if cfg.source == "timm":
        import timm

        return timm.create_model(cfg.model, pretrained=False)
    module_name, _, attr = cfg.model.partition(":")
    return getattr(importlib.import_module(module_name), attr)()


class ModelOnDevice:
    """The last model built, kept on the device: consecutive configurations of one model (its batches
    and precisions) build it once, which is most of a small configuration's time."""

    def __init__(self, device: torch.device):
        self.device = device
        self._key: tuple[str, str, str] | None = None
        self._model: torch.nn.Module | None = None

    def __call__(self, cfg: MeasureConfig) -> torch.nn.Module:
        """The configuration's model in eval mode on the device, built only when the model or layout differs."""
        key = (cfg.source, cfg.model, cfg.layout)
        if key != self._key:
            self.drop()
            model = build_model(cfg).to(self.device).eval()
            if cfg.layout == "nhwc":
                model = model.to(memory_format=torch.channels_last)
            self._key, self._model = key, model
        return self._model

    def drop(self) -> None:
        """Forgets the model, so that a failed configuration's memory can be freed and the next one rebuilds."""
        self._key = self._model = None


def context_memory_mib(device_kind: str) -> float | None:
    """NVML used memory once CUDA, cuBLAS and cuDNN are initialised, minus before, minus what the
    allocator holds: the context and library handles the process pays before its first tensor."""
    if device_kind != "cuda":
        return None
    lib = nvml()
    handle = lib.nvmlDeviceGetHandleByIndex(0) if lib else None
    before = lib.nvmlDeviceGetMemoryInfo(handle).used if handle else 0
    x = torch.randn(64, 64, device="cuda")
    torch.nn.functional.conv2d(x[None, None], torch.randn(1, 1, 3, 3, device="cuda"))  # cuDNN
    x @ x  # cuBLAS
    torch.cuda.synchronize()
    del x
    if handle is None:
        return None
    after = lib.nvmlDeviceGetMemoryInfo(handle).used
    return (after - before - torch.cuda.memory_reserved()) / MIB


def model_input(cfg: MeasureConfig, device_kind: str, device: torch.device
                ) -> tuple[torch.Tensor, contextlib.AbstractContextManager]:
    """A random input batch in the configuration's layout, and the autocast its precision runs under."""
    x = torch.randn(cfg.batch, *cfg.input_shape, device=device)
    if cfg.layout == "nhwc":
        x = x.to(memory_format=torch.channels_last)
    autocast = (torch.autocast(device_kind, dtype=_AUTOCAST[cfg.precision])
                if cfg.precision in _AUTOCAST else contextlib.nullcontext())
    return x, autocast


def configuration_row(cfg: MeasureConfig) -> dict[str, object]:
    """The columns that say which configuration a row belongs to; every row starts with them."""
    return {"key": cfg.key, "model": cfg.model, "source": cfg.source, "family": cfg.family,
            "input_shape": "x".join(map(str, cfg.input_shape)), "batch": cfg.batch,
            "precision": cfg.precision, "layout": cfg.layout}


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


def measure_one(cfg: MeasureConfig, env: Environment, context_mib: float | None,
                models: ModelOnDevice) -> dict[str, object]:
    """The configuration's latency row; a failure raises (``run`` records it)."""
    model = models(cfg)
    if env.device_kind == "cuda":  # the peak from here on: the resident weights, the input, the run
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    x, autocast = model_input(cfg, env.device_kind, models.device)
    meter = EnergyMeter() if env.device_kind == "cuda" else None
    with torch.inference_mode(), autocast:
        def step() -> object:
            return model(x)
        timing = time_steps(step, Timer(env.device_kind),
                            on_start=meter.start if meter else (lambda: None),
                            on_end=meter.stop if meter else (lambda: None))
    row = {**configuration_row(cfg), "memory_context_mib": context_mib, "status": "ok",
           "latency_ms_median": timing.median_ms, "latency_ms_mean": timing.mean_ms, "latency_ms_p10": timing.p10_ms,
           "latency_ms_p90": timing.p90_ms, "iterations": timing.iterations, "window_s": timing.window_s,
           "warmup_iterations": timing.warmup}
    if meter is not None and meter.joules is not None:
        row.update(energy_j=meter.joules / timing.iterations, energy_method=meter.method,
                   power_w_mean=meter.joules / timing.window_s)
    if env.device_kind == "cuda":
        reserved = torch.cuda.max_memory_reserved() / MIB
        row.update(memory_reserved_mib=reserved, memory_allocated_mib=torch.cuda.max_memory_allocated() / MIB,
                   memory_total_mib=(context_mib or 0.0) + reserved)
    else:
        row["cpu_peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return row


def _check_header(path: Path, columns: list[str], what: str) -> None:
    """Rows of one kind per file: appending others would corrupt what is there."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with path.open(newline="") as fh:
        header = next(csv.reader(fh), [])
    if header != columns:
        raise RuntimeError(f"{path} holds rows of another kind than {what!r} (its columns differ); "
                           "give --out a file of its own")


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


#: What ``run`` can measure, by name (``dippm_nas.measure.kernels`` adds "kernels").
MEASUREMENTS: dict[str, Measurement] = {
    "latency": Measurement(COLUMNS, PROTOCOL, lambda *args: [measure_one(*args)], _latency_summary),
}


def run(configs: Iterable[MeasureConfig], out: str | Path, device_kind: str = "cuda",
        budget_s: float | None = None, measured_by: str = "dippm-nas harness",
        progress: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
        what: str = "latency") -> int:
    """Measure what ``out`` does not hold yet; returns how many configurations were measured."""
    if what not in MEASUREMENTS:
        raise ValueError(f"unknown measurement {what!r}; known: {', '.join(MEASUREMENTS)}")
    if device_kind == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("no CUDA device is visible; use device_kind='cpu' (--device cpu) to test the harness")
    measurement = MEASUREMENTS[what]
    out = Path(out)
    _check_header(out, measurement.columns, what)
    done = measured_keys(out)
    todo = [c for c in configs if c.key not in done]
    progress(f"{len(done)} configurations already in {out}; {len(todo)} to measure")
    start = time.monotonic()
    env = describe(device_kind)
    context = context_memory_mib(device_kind)
    models = ModelOnDevice(torch.device(device_kind))
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
        for row in rows:
            row.update(env.as_row(), protocol=measurement.protocol, measured_by=measured_by, date=utc_now())
        append_rows(out, rows, measurement.columns)
        longest = max(longest, time.monotonic() - began)
        progress(f"[{i}/{len(todo)}] {cfg.key}: {measurement.summary(rows)}")
    return len(todo)
