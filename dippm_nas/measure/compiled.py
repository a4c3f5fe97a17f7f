"""A configuration eager and under ``torch.compile``: the rows that check the modes ``compile`` and
``compile-cudagraphs``.

Compiling changes a model's time a lot on one GPU (timm's RTX 4090 runs: eager / compiled 1.61 at the median), and
only rows that time the same model both ways, on the same GPU, in the same process, show what the fusion stage
must predict. Each row holds the latencies, taken under one protocol, and the compile time apart from them: the
first call of the compiled model, which traces, lowers and builds its kernels, is timed once and never enters the
latency. Inductor's own count of the kernels it generated is kept too, to set beside the fusion stage's.

The rows go to a file of their own (``data/measurements/compiled/``), never among the latency rows that
``dippm-nas dataset`` imports: a compiled latency is not an eager record.
"""

from __future__ import annotations

import time

import torch

from dippm_nas.errors import one_line
from dippm_nas.measure.config import MeasureConfig
from dippm_nas.measure.environment import PROTOCOL, Environment
from dippm_nas.measure.runner import (
    MEASUREMENTS,
    Measurement,
    ModelOnDevice,
    configuration_row,
    model_input,
)
from dippm_nas.measure.timing import Timer, Timing, tightest, time_steps

COMPILED_PROTOCOL = (
    "dippm-nas-compiled-v1: each configuration timed eager, then as torch.compile(model) (backend inductor, "
    "default mode) and, on a GPU, as torch.compile(model, mode='reduce-overhead') (the compiled kernels replayed as "
    "a CUDA graph), each compile fresh after torch._dynamo.reset() with Inductor's FX graph cache off, all under "
    "the latency protocol's precision mode, warm-up and windows (" + PROTOCOL.split(":", 1)[0] + "); compile_s = "
    "wall clock of the compiled "
    "model's first call, synchronised, which traces, lowers and builds its kernels and is never part of a latency; "
    "inductor_kernels = torch._inductor.metrics.generated_kernel_count after the default mode's first call")

COMPILED_COLUMNS = [
    "key", "model", "source", "family", "input_shape", "batch", "precision", "layout", "status", "error",
    "latency_ms_eager", "latency_ms_eager_p10", "latency_ms_eager_p90", "iterations_eager",
    "latency_ms_compiled", "latency_ms_compiled_p10", "latency_ms_compiled_p90", "iterations_compiled",
    "compile_s", "compile_error", "inductor_kernels",
    "latency_ms_compiled_cudagraphs", "compile_s_cudagraphs", "compile_cudagraphs_error",
    "device_kind", "gpu_name", "driver", "cuda", "cudnn", "torch", "timm", "tf32_matmul", "tf32_cudnn",
    "cudnn_benchmark", "cpu", "protocol", "measured_by", "date",
]


def _timed(step, timer: Timer) -> Timing:
    return tightest(lambda: time_steps(step, timer))[0]


def _compiled(model: torch.nn.Module, x: torch.Tensor, timer: Timer, cuda: bool, mode: str | None
              ) -> tuple[float, Timing, int]:
    """``model`` compiled in ``mode`` (None: the default): its compile time (the first call), its timed window and
    how many kernels Inductor generated; a fresh compile, forgotten afterwards. Inductor's cache of compiled graphs
    is off for the first call: a graph it held would skip the code generation whose time and kernels are counted."""
    from torch._dynamo import reset
    from torch._inductor import config, metrics

    reset()
    metrics.reset()
    compiled = torch.compile(model, mode=mode)
    try:
        began = time.perf_counter()
        with config.patch(fx_graph_cache=False):
            compiled(x)
        if cuda:
            torch.cuda.synchronize()
        compile_s, kernels = time.perf_counter() - began, metrics.generated_kernel_count
        return compile_s, _timed(lambda: compiled(x), timer), kernels
    finally:
        reset()  # the compiled code and its guards, before the next compile


def measure_compiled(cfg: MeasureConfig, env: Environment, context_mib: float | None,
                     models: ModelOnDevice) -> list[dict[str, object]]:
    """The configuration's row: eager's latency, then each compiled mode's, with its compile time. An eager failure
    raises (``run`` records it); a compile failure is recorded in the row beside eager's latency, since it is a
    property of the model under Inductor, not of the run."""
    cuda = env.device_kind == "cuda"
    model = models(cfg)
    x, precision = model_input(cfg, env.device_kind, models.device)
    timer = Timer(env.device_kind)
    row: dict[str, object] = configuration_row(cfg)
    with torch.inference_mode(), precision:
        eager = _timed(lambda: model(x), timer)
        row.update(status="ok", latency_ms_eager=eager.median_ms, latency_ms_eager_p10=eager.p10_ms,
                   latency_ms_eager_p90=eager.p90_ms, iterations_eager=eager.iterations)
        try:
            compile_s, timing, kernels = _compiled(model, x, timer, cuda, None)
            row.update(compile_s=compile_s, inductor_kernels=kernels, latency_ms_compiled=timing.median_ms,
                       latency_ms_compiled_p10=timing.p10_ms, latency_ms_compiled_p90=timing.p90_ms,
                       iterations_compiled=timing.iterations)
        except Exception as exc:  # Dynamo or Inductor cannot compile the model: a result, eager's row stands
            row["compile_error"] = one_line(exc)
        if cuda:  # reduce-overhead's CUDA graphs exist on a GPU only
            try:
                compile_s, timing, _ = _compiled(model, x, timer, cuda, "reduce-overhead")
                row.update(compile_s_cudagraphs=compile_s, latency_ms_compiled_cudagraphs=timing.median_ms)
            except Exception as exc:
                row["compile_cudagraphs_error"] = one_line(exc)
    return [row]


def _summary(rows: list[dict[str, object]]) -> str:
    row = rows[0]
    if row["status"] != "ok":
        return f"{row['status']} {row.get('error', '')}"
    eager = f"eager {row['latency_ms_eager']:.3f} ms"
    if row.get("compile_error"):
        return f"ok, {eager}; compile failed: {row['compile_error']}"
    replayed = row.get("latency_ms_compiled_cudagraphs")
    return (f"ok, {eager}, compiled {row['latency_ms_compiled']:.3f} ms "
            f"({row['inductor_kernels']} generated kernels, compiled in {row['compile_s']:.1f} s)"
            + (f", reduce-overhead {replayed:.3f} ms" if isinstance(replayed, float) else ""))


MEASUREMENTS["compiled"] = Measurement(COMPILED_COLUMNS, COMPILED_PROTOCOL, measure_compiled, _summary)
