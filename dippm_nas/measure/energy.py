"""Energy over a timed window from NVML: the total-energy counter, else sampled power."""

from __future__ import annotations

import threading
import time

from dippm_nas.measure.gpu_state import nvml

POWER_SAMPLE_S = 0.01


class EnergyMeter:
    """``start()`` and ``stop()`` around the timed window; ``joules`` and ``method`` after.

    One meter per window: a configuration timed again (a wide spread) keeps the energy of the window
    it keeps. ``lib`` is the NVML module (pynvml by default; a test passes a fake).
    """

    def __init__(self, device_index: int = 0, lib: object | None = None):
        self.lib = lib if lib is not None else nvml()
        self.handle = self.lib.nvmlDeviceGetHandleByIndex(device_index) if self.lib else None
        self.method = "none"
        self.joules: float | None = None
        self._samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_mj = 0

    def _counter_works(self) -> bool:
        try:
            self.lib.nvmlDeviceGetTotalEnergyConsumption(self.handle)
            return True
        except Exception:
            return False

    def start(self) -> None:
        """Opens the window: reads the energy counter, or starts sampling power where the GPU has none."""
        if self.handle is None:
            return
        if self._counter_works():
            self.method = "nvml_total_energy_counter"
            self._start_mj = self.lib.nvmlDeviceGetTotalEnergyConsumption(self.handle)
            self._t0 = time.perf_counter()
            return
        self.method = "nvml_power_sampling"
        self._stop.clear()
        self._samples = []
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            watts = self.lib.nvmlDeviceGetPowerUsage(self.handle) / 1000.0
            self._samples.append((time.perf_counter(), watts))
            time.sleep(POWER_SAMPLE_S)

    def stop(self) -> None:
        """Closes the window and sets ``joules``; it stays None without NVML."""
        if self.method == "nvml_total_energy_counter":
            self.joules = (self.lib.nvmlDeviceGetTotalEnergyConsumption(self.handle) - self._start_mj) / 1000.0
        elif self.method == "nvml_power_sampling" and self._thread is not None:
            self._stop.set()
            self._thread.join()
            pts = self._samples
            self.joules = sum((t1 - t0) * (w0 + w1) / 2 for (t0, w0), (t1, w1) in zip(pts, pts[1:]))
