"""Where a configuration's GPU time goes: per ATen operator and per kernel, from ``torch.profiler``.

The latency rows say how long a model takes; these say which operators and kernels take it, so the
analytical model's per-operator roofline can be checked operator by operator on a GPU we measured
(which kernels cuDNN picks there, what its NCHW transposes, a depthwise convolution or a cast really
cost) instead of only through each model's total. On the H100 the measured latency is a median 1.92
times the analytical one at batch 256, against 1.10 for timm's RTX 4090 rows
(``benchmarks/latency_breakdown.py``), and only a per-operator view can tell which terms are missing.

One row per operator (grouped by its input shapes) and per kernel, with its calls and its self time
per iteration: the device time of the kernels an operator launches itself (not its children's), the
host time it spends itself. Self times partition the profiled time, so a configuration's operator
rows add up to its GPU time. Rows go to their own file (``data/measurements/kernels/``), never
among the latency rows that ``dippm-nas dataset`` imports.
"""

from __future__ import annotations

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from dippm_nas.measure.config import MeasureConfig
from dippm_nas.measure.environment import Environment
from dippm_nas.measure.runner import (
    MEASUREMENTS,
    Measurement,
    ModelOnDevice,
    configuration_row,
    model_input,
)
from dippm_nas.measure.timing import Timer, warm_up

#: Iterations profiled after warm-up; every time is divided by it. Ten keep the trace of a large model
#: at batch 256 (tens of thousands of kernels) small while averaging out a single slow launch.
PROFILED_ITERATIONS = 10

KERNEL_PROTOCOL = (
    f"dippm-nas-kernels-v1: random weights, eval, inference_mode, torch.autocast for fp16/bf16, the model and its "
    f"input cast to half for fp16-weights/bf16-weights; warm-up as "
    f"dippm-nas-v1; torch.profiler (CPU and CUDA activities, input shapes recorded) over {PROFILED_ITERATIONS} "
    "iterations; one row per ATen operator (grouped by input shapes) and per GPU kernel: calls, self device "
    "time and self host time per iteration")

KERNEL_COLUMNS = [
    "key", "model", "source", "family", "input_shape", "batch", "precision", "layout", "status", "error",
    "kind", "name", "input_shapes", "calls", "device_us", "cpu_us", "iterations",
    "device_kind", "gpu_name", "driver", "cuda", "cudnn", "torch", "timm", "tf32_matmul", "tf32_cudnn",
    "cudnn_benchmark", "cpu", "protocol", "measured_by", "date",
]


def _self_device_us(event) -> float:
    # FunctionEventAvg says "device" from PyTorch 2.4 on and "cuda" before.
    total = getattr(event, "self_device_time_total", None)
    return float(total if total is not None else event.self_cuda_time_total)


def profile_rows(averages, iterations: int) -> list[dict[str, object]]:
    """Operator and kernel rows from ``key_averages(group_by_input_shape=True)`` of ``iterations`` calls."""
    rows = []
    for event in averages:
        if event.device_type == DeviceType.CUDA:
            kind, shapes, cpu_us = "kernel", "", 0.0
        elif event.key.startswith("aten::"):
            kind, shapes, cpu_us = "operator", str(event.input_shapes), event.self_cpu_time_total / iterations
        else:
            continue  # the profiler's own ranges and the CUDA runtime's calls
        rows.append({"status": "ok", "kind": kind, "name": event.key, "input_shapes": shapes,
                     "calls": event.count / iterations, "device_us": _self_device_us(event) / iterations,
                     "cpu_us": cpu_us, "iterations": iterations})
    return rows


def profile_one(cfg: MeasureConfig, env: Environment, context_mib: float | None,
                models: ModelOnDevice) -> list[dict[str, object]]:
    """The configuration's operator and kernel rows; a failure raises (``run`` records it)."""
    cuda = env.device_kind == "cuda"
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    model = models(cfg)
    x, autocast = model_input(cfg, env.device_kind, models.device)
    with torch.inference_mode(), autocast:
        def step() -> object:
            return model(x)
        warm_up(step, Timer(env.device_kind))
        with profile(activities=activities, record_shapes=True) as prof:
            for _ in range(PROFILED_ITERATIONS):
                step()
            if cuda:
                torch.cuda.synchronize()
    rows = profile_rows(prof.key_averages(group_by_input_shape=True), PROFILED_ITERATIONS)
    return [{**configuration_row(cfg), **row} for row in rows]


def _summary(rows: list[dict[str, object]]) -> str:
    if rows[0]["status"] != "ok":
        return f"{rows[0]['status']} {rows[0].get('error', '')}"
    operators = [r for r in rows if r["kind"] == "operator"]
    kernels = [r for r in rows if r["kind"] == "kernel"]
    device_ms = sum(float(r["device_us"]) for r in kernels) / 1e3
    host_ms = sum(float(r["cpu_us"]) for r in operators) / 1e3
    return (f"ok, {len(operators)} operators, {len(kernels)} kernels; per iteration {device_ms:.3f} ms in kernels, "
            f"{host_ms:.3f} ms of operators' own host time")


MEASUREMENTS["kernels"] = Measurement(KERNEL_COLUMNS, KERNEL_PROTOCOL, profile_one, _summary)
