"""Provenance of a measurement: where, with what, under which flags. Never a serial or a UUID."""

from __future__ import annotations

import datetime as dt
import platform
from dataclasses import asdict, dataclass

import torch

from dippm_nas.measure import gpu_state, host_cost, timing
from dippm_nas.measure.gpu_state import nvml

#: How a latency row is measured, written in every row. v2 against v1: precisions run under their
#: mode's flags, the GPU brought to a settled clock first, a wide window timed again, the clocks and
#: temperature recorded, the memory NVML counts for the process, a CUDA-graph latency, the host's cost.
#: v3 frees the captures' cuBLAS workspaces; v4 records the host's time to issue each forward pass.
PROTOCOL = (
    "dippm-nas-v4: random weights, eval, inference_mode; each configuration under its precision's mode "
    "(precision.running_in: fp32 = PyTorch's defaults, cuDNN TF32 on and matmul TF32 off; fp32-strict TF32 off; "
    "tf32 TF32 on; fp16/bf16 torch.autocast; fp16-weights/bf16-weights the model and its input cast to half, no "
    "autocast), the flags it ran under recorded per row; before the first "
    f"configuration the GPU runs fp16 matmuls until {gpu_state.SETTLE_SAMPLES} SM clock readings in a row are "
    f"within {gpu_state.SETTLE_TOLERANCE:.0%} (>= {gpu_state.SETTLE_MIN_S:g} s, at most {gpu_state.SETTLE_CAP_S:g} "
    f"s); warm-up >= {timing.MIN_WARMUP} iterations until the median of the last {timing.STABLE_WINDOW} moves "
    f"< {timing.STABLE_TOLERANCE:.0%} (or until it has run {timing.MAX_WARMUP_S:g} s); timed >= {timing.MIN_TIMED} "
    f"iterations and >= {timing.MIN_TIMED_S:g} s (>= {timing.MIN_TIMED_SLOW} iterations once the window has run "
    f"{timing.MAX_TIMED_S:g} s; CUDA events per iteration, median), warm-up and window again while (p90 - p10) / "
    f"median > {timing.SPREAD_LIMIT:g}, at most {timing.MAX_ATTEMPTS} windows, the tightest kept (attempts); "
    "host_issue_ms = median over the kept window's iterations of the wall clock until the forward pass returns "
    "(the host's time to issue it; it includes waiting for the GPU where the launch queue fills or the forward "
    "synchronises); SM "
    "and memory clocks, temperature and power limit by NVML as the kept window closes; energy = NVML energy "
    "counter over the kept window / iterations; before each configuration the cuBLAS workspaces of earlier "
    "streams are freed (the CUDA-graph captures' side streams each keep one); memory_process = NVML's "
    "usedGpuMemory for this PID, else the device's used memory minus its value before the process initialised "
    "CUDA, read after the timed windows with the allocator's cache kept (its peak); memory_total = CUDA context + "
    "peak reserved from the resident model onwards (as v1); latency_ms_cuda_graphs = the forward captured as a "
    "CUDA graph (static input, captured after eager warm-up), same warm-up and window, median; host_us_per_op = "
    f"once per run, host time to issue a chain of {host_cost.CHAIN} tiny eager operators (add, relu, conv1x1, matmul, "
    f"layer_norm, view) / chain length, median of {host_cost.REPEATS} chains (>= {host_cost.MIN_REPEATS}, fewer past "
    f"{host_cost.KIND_CAP_S:g} s), mean over kinds, fp32 and fp16 autocast, one intra-op thread; GPU time per operator "
    "from the chain replayed as a CUDA graph, in host_profile")


@dataclass(frozen=True)
class Environment:
    """What a row was measured with: the GPU, its driver, the library versions and the flags that change timing.

    ``tf32_matmul`` and ``tf32_cudnn`` are the process's defaults; a row records instead the flags its
    configuration's precision ran under (``precision.running_in``).
    """

    device_kind: str  # "cuda" or "cpu"
    gpu_name: str
    driver: str
    cuda: str
    cudnn: str
    torch: str
    timm: str
    tf32_matmul: bool
    tf32_cudnn: bool
    cudnn_benchmark: bool
    cpu: str
    protocol: str = PROTOCOL

    def as_row(self) -> dict[str, object]:
        """The fields as columns of a measurement row."""
        return asdict(self)


def describe(device_kind: str) -> Environment:
    """This machine's environment; the GPU name and driver are '' on the CPU or (the driver) without NVML."""
    import timm

    gpu_name = driver = ""
    if device_kind == "cuda":
        gpu_name = torch.cuda.get_device_name(0)
        lib = nvml()
        if lib is not None:
            raw = lib.nvmlSystemGetDriverVersion()
            driver = raw.decode() if isinstance(raw, bytes) else str(raw)
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return Environment(
        device_kind=device_kind, gpu_name=gpu_name, driver=driver, cuda=torch.version.cuda or "",
        cudnn=str(cudnn or ""), torch=torch.__version__, timm=timm.__version__,
        tf32_matmul=torch.backends.cuda.matmul.allow_tf32, tf32_cudnn=torch.backends.cudnn.allow_tf32,
        cudnn_benchmark=torch.backends.cudnn.benchmark, cpu=platform.processor() or platform.machine(),
    )


def utc_now() -> str:
    """The time in UTC to the second, ISO 8601: a row's ``date``."""
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()
