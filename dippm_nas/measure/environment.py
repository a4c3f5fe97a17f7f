"""Provenance of a measurement: where, with what, under which flags. Never a serial or a UUID."""

from __future__ import annotations

import datetime as dt
import platform
from dataclasses import asdict, dataclass

import torch

PROTOCOL = ("dippm-nas-v1: random weights, eval, inference_mode, torch.autocast for fp16/bf16; warm-up >= 5 "
            "iterations until the median of the last 5 moves < 2 %; timed >= 30 iterations and >= 1 s (CUDA "
            "events per iteration, median); energy = NVML energy counter over the timed window / iterations; "
            "memory = CUDA context + peak reserved from the resident model onwards (input and run included)")


@dataclass(frozen=True)
class Environment:
    """What a row was measured with: the GPU, its driver, the library versions and the flags that change timing."""

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


def nvml():
    """The pynvml module, initialised, or None where NVML is missing."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:
        return None


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
