"""NVML's view of the GPU a run measures on: the memory this process holds, clocks, temperature.

PyTorch counts only what its caching allocator reserved; a MIG slice limits what NVML counts for the
process: the CUDA context, the kernels' modules loaded lazily, cuDNN and cuBLAS workspaces as well
(50-100 MiB more than context + reserved on the H200, ``data/h200/README.md``). And a GPU that idled
runs its first configurations at a low clock, so a run first keeps it busy until its clock settles,
and each row says at which clocks and temperature it was timed.

Every function takes the NVML module (``pynvml``, or any object with the same functions, which is how
the tests simulate a GPU) and answers None where NVML, the GPU or the driver does not tell.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from dippm_nas.errors import DippmError

MIB = 2**20

#: pynvml's constants, for NVML modules (fakes) that do not define them.
NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0
#: NVML's "not available" for a process's memory (under MIG and WDDM), where pynvml does not map it to None.
NVML_VALUE_NOT_AVAILABLE = 2**64 - 1

#: How memory_process_mib was read: the driver's figure for this PID, or the device's used memory
#: minus what it used before this process initialised CUDA (valid where the harness runs alone).
PROCESS_METHOD = "nvml-process"
DEVICE_METHOD = "device-used-minus-baseline"

#: Clock settling: SETTLE_SAMPLES consecutive SM clock readings under load within SETTLE_TOLERANCE of
#: their maximum, after at least SETTLE_MIN_S of load, or SETTLE_CAP_S whatever the clock does.
SETTLE_SAMPLES = 5
SETTLE_TOLERANCE = 0.03
SETTLE_MIN_S = 2.0
SETTLE_CAP_S = 30.0

STATE_COLUMNS = ("sm_clock_mhz", "mem_clock_mhz", "temperature_c", "power_limit_w")


def require_device(device_kind: str, what: str) -> None:
    """A DippmError where ``device_kind`` is ``cuda`` and no CUDA device is visible, said before any work that
    the run would waste (choosing candidates, exporting their blocks). ``torch.cuda.is_available`` makes no CUDA
    context, so the memory baseline a run takes after it still sees the device without this process."""
    if device_kind not in ("cuda", "cpu"):
        raise DippmError(f"device {device_kind!r} is neither 'cuda' nor 'cpu'")
    import torch

    if device_kind == "cuda" and not torch.cuda.is_available():
        raise DippmError(f"no CUDA device is visible; use device_kind='cpu' (--device cpu) to test the {what}")


def nvml():
    """The pynvml module, initialised, or None where NVML is missing."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:
        return None


def _call(fn: Callable[[], object]) -> object | None:
    try:
        return fn()
    except Exception:  # NVML_ERROR_NOT_SUPPORTED and friends: the GPU does not tell
        return None


class GpuProbe:
    """One GPU as NVML sees it, for one process; every reading is None without NVML (``lib`` None).

    >>> GpuProbe(None).state()
    {'sm_clock_mhz': None, 'mem_clock_mhz': None, 'temperature_c': None, 'power_limit_w': None}
    >>> GpuProbe(None).process_memory()
    (None, '')
    """

    def __init__(self, lib: object | None, device_index: int = 0, pid: int | None = None):
        self.lib = lib
        self.handle = _call(lambda: lib.nvmlDeviceGetHandleByIndex(device_index)) if lib is not None else None
        self.pid = os.getpid() if pid is None else pid
        #: the device's used memory in bytes before this process initialised CUDA (``take_baseline``)
        self.baseline_used: int | None = None

    @classmethod
    def open(cls, device_kind: str, device_index: int = 0) -> GpuProbe:
        """The probe of a run: pynvml's on CUDA where NVML loads, one that answers None otherwise."""
        if device_kind != "cuda":
            return cls(None)
        return cls(nvml(), device_index)

    @property
    def available(self) -> bool:
        """Whether NVML answers for this GPU."""
        return self.handle is not None

    def device_used(self) -> int | None:
        """The device's used memory in bytes, all processes together."""
        if not self.available:
            return None
        info = _call(lambda: self.lib.nvmlDeviceGetMemoryInfo(self.handle))
        return None if info is None else int(info.used)

    def take_baseline(self) -> None:
        """Reads the device's used memory now: call it before this process initialises CUDA, so that
        what the device uses later, minus this, is what the process holds (where it runs alone)."""
        self.baseline_used = self.device_used()

    def process_memory(self) -> tuple[float | None, str]:
        """The GPU memory this process holds by NVML, in MiB, and how it was read (PROCESS_METHOD or
        DEVICE_METHOD); (None, '') where NVML is missing or neither way answers.

        The driver's per-process figure where it lists this PID with a figure (a container's PID
        namespace hides it, MIG and WDDM give none); else used memory minus ``baseline_used``.
        """
        if not self.available:
            return None, ""
        processes = _call(lambda: self.lib.nvmlDeviceGetComputeRunningProcesses(self.handle)) or []
        for proc in processes:
            used = getattr(proc, "usedGpuMemory", None)
            if getattr(proc, "pid", None) == self.pid and used is not None and used != NVML_VALUE_NOT_AVAILABLE:
                return used / MIB, PROCESS_METHOD
        used = self.device_used()
        if used is None or self.baseline_used is None:
            return None, ""
        return (used - self.baseline_used) / MIB, DEVICE_METHOD

    def sm_clock_mhz(self) -> float | None:
        """The SM clock now, in MHz."""
        if not self.available:
            return None
        clock = _call(lambda: self.lib.nvmlDeviceGetClockInfo(self.handle, getattr(self.lib, "NVML_CLOCK_SM",
                                                                                     NVML_CLOCK_SM)))
        return None if clock is None else float(clock)

    def state(self) -> dict[str, float | None]:
        """The columns that say under which conditions a window ran: SM and memory clocks (MHz), the
        GPU's temperature (degrees C) and its enforced power limit (W)."""
        if not self.available:
            return dict.fromkeys(STATE_COLUMNS)
        lib, h = self.lib, self.handle
        mem = _call(lambda: lib.nvmlDeviceGetClockInfo(h, getattr(lib, "NVML_CLOCK_MEM", NVML_CLOCK_MEM)))
        temp = _call(lambda: lib.nvmlDeviceGetTemperature(h, getattr(lib, "NVML_TEMPERATURE_GPU",
                                                                     NVML_TEMPERATURE_GPU)))
        limit_mw = _call(lambda: lib.nvmlDeviceGetEnforcedPowerLimit(h))
        return {"sm_clock_mhz": self.sm_clock_mhz(), "mem_clock_mhz": None if mem is None else float(mem),
                "temperature_c": None if temp is None else float(temp),
                "power_limit_w": None if limit_mw is None else limit_mw / 1000.0}


@dataclass(frozen=True)
class Settling:
    """How a GPU was brought to steady state before a run: seconds under load, whether the SM clock
    settled (False: the cap was reached, or NVML gives no clock), and the clocks read under load."""

    seconds: float
    settled: bool
    clocks_mhz: tuple[float, ...]

    def describe(self) -> str:
        """One line for the run's progress output."""
        if not self.clocks_mhz:
            return f"GPU kept busy {self.seconds:.1f} s (NVML gives no SM clock to watch)"
        verdict = "settled" if self.settled else "did not settle (time cap)"
        return (f"GPU SM clock {verdict} at {self.clocks_mhz[-1]:.0f} MHz after {self.seconds:.1f} s under load "
                f"(from {self.clocks_mhz[0]:.0f} MHz, {len(self.clocks_mhz)} readings)")


def settle_clocks(sample: Callable[[], float | None], cap_s: float = SETTLE_CAP_S, samples: int = SETTLE_SAMPLES,
                  tolerance: float = SETTLE_TOLERANCE, min_s: float = SETTLE_MIN_S,
                  clock: Callable[[], float] = time.monotonic) -> Settling:
    """Calls ``sample`` (keeps the GPU busy a moment and returns the SM clock read while it is busy)
    until ``samples`` readings in a row lie within ``tolerance`` of their maximum after ``min_s`` of
    load, or ``cap_s`` passed. Without a clock reading it keeps the GPU busy ``min_s`` and stops.

    >>> ramp = iter([465, 1200, 1755, 1980, 1980, 1965, 1980, 1980])
    >>> now = iter(range(100))
    >>> s = settle_clocks(lambda: next(ramp), min_s=0, clock=lambda: next(now))
    >>> s.settled, s.clocks_mhz[-1], len(s.clocks_mhz)
    (True, 1980, 8)
    """
    begin = clock()
    clocks: list[float] = []
    while True:
        mhz = sample()
        elapsed = clock() - begin
        if mhz is None:
            if elapsed >= min_s or elapsed >= cap_s:
                return Settling(elapsed, False, tuple(clocks))
            continue
        clocks.append(mhz)
        last = clocks[-samples:]
        if len(last) == samples and elapsed >= min_s and max(last) - min(last) <= tolerance * max(last):
            return Settling(elapsed, True, tuple(clocks))
        if elapsed >= cap_s:
            return Settling(elapsed, False, tuple(clocks))


#: The load that settles the clocks: fp16 matmuls of LOAD_SIZE squared, LOAD_MATMULS queued per reading
#: (about 7 TFLOP: ~10 ms on an H100, ~0.1 s on a T4), enough to draw the power a large model draws.
LOAD_SIZE = 4096
LOAD_MATMULS = 50


def cuda_load_sampler(probe: GpuProbe, device_index: int = 0) -> Callable[[], float | None]:
    """A ``sample`` for ``settle_clocks`` on CUDA: queues LOAD_MATMULS large matmuls, reads the SM clock
    while the GPU runs them, then waits for them (so that the next reading sees the GPU under load)."""
    import torch

    device = torch.device("cuda", device_index)
    a = torch.randn(LOAD_SIZE, LOAD_SIZE, device=device, dtype=torch.float16)
    b = torch.randn(LOAD_SIZE, LOAD_SIZE, device=device, dtype=torch.float16)
    out = torch.empty_like(a)

    def sample() -> float | None:
        for _ in range(LOAD_MATMULS):
            torch.matmul(a, b, out=out)
        mhz = probe.sm_clock_mhz()
        torch.cuda.synchronize(device)
        return mhz

    return sample
