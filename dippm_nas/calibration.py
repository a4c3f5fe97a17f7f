"""A calibration: physical parameters of one GPU and its host, fitted to a user's own measurements.

A prediction on a GPU nobody measured is as good as its spec sheet and the operator model's transfer; at
small batches eager PyTorch also waits on the host's CPU, which is the user's, not ours. A few measured
latencies pin down what the spec sheet cannot say, without a correction per model:

- ``gemm_scale``: the time of the tiled GEMM-class kernels (matrix products, convolutions, attention)
  over the operator model's: below 1 the GPU sustains more of its peak than the model expects (a higher
  sustained clock), above 1 less (a power limit the spec sheet hides);
- ``memory_scale``: the same for the other kernels (elementwise, normalisation, reductions, pooling),
  whose time is the bandwidth they achieve;
- ``host_scale``: the host's time to issue one eager operator over the default host profile's;
- ``idle_w`` and ``busy_w``, where the rows measured energy: the watts the GPU draws while it waits and
  per second of the roofline's busy time (:func:`~dippm_nas.cost.pipeline.power.energy_j`), in place of the
  spec sheet's share of its TDP and its TDP. The busy power may exceed the TDP: a GPU that sustains less
  than its peak works longer than the roofline's busy seconds;
- ``runtime_mib`` and ``reserve_scale``, where the rows measured memory: what the process holds outside
  PyTorch's caching allocator (the CUDA context, the libraries' handles and the kernels' modules, which
  move with the driver, the CUDA version and the GPU), and a factor on what the allocator reserves beyond
  the weights (the activations, the cuBLAS workspace and the allocator's rounding, which move with the
  PyTorch version and its allocator settings). The weights are what they are.

Ten rows rarely pin down all three, so the rows choose how many to free (``fit``: none, one speed of
all the GPU's kernels, that and the host's, or all three), by how well each choice predicts the rows left
out of it.

The file is JSON a person can read: the device, precision and mode it holds for, the project version that
fitted it, the three scales and which of them the rows freed, the powers, every row it came from with the
prediction before and after, and the leave-one-out errors (each row predicted by a fit of the others),
which the calibrated predictions cite as their latency, energy and memory errors. This module is the file and
its checks; the calibrated cost model (:mod:`dippm_nas.cost.models.calibrated`) applies it.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from dippm_nas.errors import DippmError
from dippm_nas.hardware.registry import Device
from dippm_nas.hosts import HostProfile
from dippm_nas.user_files import read_user_text

#: The format of a calibration file; a file of another format is refused with what to do.
FORMAT = 1
#: The parameters a calibration fits, each a factor on what the operator model and host profile expect.
PARAMETERS = ("gemm_scale", "memory_scale", "host_scale")
#: The cost model a calibration adjusts: its per-operator times are what the scales multiply.
CALIBRATED_MODEL = "operators"
#: The fit that frees all three scales (a calibration may have chosen fewer: ``Calibration.fit``).
ALL_SCALES_FIT = "GEMM-class kernels, the other kernels and the host's issue time"


@dataclass(frozen=True)
class CalibrationRow:
    """One measured row a calibration was fitted on, with what the operator model predicted before and
    after, and in the leave-one-out fit that did not see it."""

    model: str
    batch: int
    input_size: int | None
    latency_ms: float
    before_ms: float
    after_ms: float
    left_out_ms: float
    #: The row's measured energy (J) and the predictions of it, where the row measured one.
    energy_j: float | None = None
    energy_before_j: float | None = None
    energy_after_j: float | None = None
    energy_left_out_j: float | None = None
    #: The row's measured memory (MiB, as NVML counts the process) and the predictions of it, where it has one.
    memory_mib: float | None = None
    memory_before_mib: float | None = None
    memory_after_mib: float | None = None
    memory_left_out_mib: float | None = None


@dataclass(frozen=True)
class Calibration:
    """The fitted parameters of :data:`PARAMETERS` for one device, precision and execution mode."""

    device: str
    precision: str
    mode: str
    gemm_scale: float
    memory_scale: float
    host_scale: float
    rows: tuple[CalibrationRow, ...]
    source: str
    version: str
    #: The host profile the host's scale multiplies (the default profile's name when it was fitted).
    host: str
    format: int = FORMAT
    cost_model: str = CALIBRATED_MODEL
    #: Which scales the rows chose to free (:data:`dippm_nas.training.calibration_fit.FITS`); the others stay 1.
    fit: str = ALL_SCALES_FIT
    #: The whole GPU's idle and busy watts fitted to the rows' energy; None: the spec sheet's.
    idle_w: float | None = None
    busy_w: float | None = None
    #: The memory outside the allocator (MiB) and the factor on the allocator's reserve fitted to the rows'
    #: memory; None: the analytical model's.
    runtime_mib: float | None = None
    reserve_scale: float | None = None

    @property
    def left_out_mape(self) -> float:
        """The mean absolute percentage error of each row predicted by the fit of the others (a fraction)."""
        import numpy as np  # loaded when read: a command checks a calibration's arguments before numpy loads

        return float(np.mean(self._left_out_errors()))

    @property
    def left_out_median(self) -> float:
        """The median of the same errors."""
        import numpy as np

        return float(np.median(self._left_out_errors()))

    def _left_out_errors(self) -> list[float]:
        return [abs(r.left_out_ms / r.latency_ms - 1) for r in self.rows]

    @property
    def energy_left_out_mape(self) -> float | None:
        """The MAPE of each energy row predicted by the power fit of the others; None without fitted powers."""
        return None if self.idle_w is None else _left_out_mape(self.energy_rows, "energy_j", "energy_left_out_j")

    @property
    def energy_rows(self) -> tuple[CalibrationRow, ...]:
        """The rows that measured energy."""
        return tuple(r for r in self.rows if r.energy_j is not None)

    @property
    def memory_left_out_mape(self) -> float | None:
        """The MAPE of each memory row predicted by the memory fit of the others; None without a memory fit."""
        if self.runtime_mib is None:
            return None
        return _left_out_mape(self.memory_rows, "memory_mib", "memory_left_out_mib")

    @property
    def memory_rows(self) -> tuple[CalibrationRow, ...]:
        """The rows that measured memory."""
        return tuple(r for r in self.rows if r.memory_mib is not None)

    def powers(self, device: Device) -> tuple[float, float] | None:
        """The fitted idle and busy watts on ``device`` (a MIG slice draws its share of the whole GPU's, as
        its TDP does), or None where the rows measured too little energy to fit them."""
        if self.idle_w is None or self.busy_w is None:
            return None
        share = device.tdp_w / device.whole_gpu().tdp_w
        return self.idle_w * share, self.busy_w * share

    def check_for(self, device: str, precision: str, mode: str) -> None:
        """Refuse, in one line, a prediction this calibration does not hold for."""
        for what, mine, asked in (("device", self.device, device), ("precision", self.precision, precision),
                                  ("mode", self.mode, mode)):
            if mine != asked:
                raise DippmError(f"this calibration is for {what} {mine}, the prediction is asked for {asked}: "
                                 f"predict with --{what} {mine}, or calibrate {asked} with `dippm-nas calibrate`.")

    def fitted_host(self, base: HostProfile) -> HostProfile:
        """The host it was fitted on: ``base`` (its :attr:`host` profile) with every operator's issue time scaled."""
        return base.scaled(self.host_scale, f"issue times scaled by {self.host_scale:.3g}")

    def note(self) -> str:
        """The line a calibrated prediction carries."""
        energy = (f"; energy from {len(self.energy_rows)} of them: {self.idle_w:.0f} W idle, {self.busy_w:.0f} W "
                  "per second of the roofline's busy time") if self.idle_w is not None else ""
        memory = (f"; memory from {len(self.memory_rows)}: {self.runtime_mib:.0f} MiB outside the allocator, its "
                  f"reserve beyond the weights x{self.reserve_scale:.3g}") if self.runtime_mib is not None else ""
        return (f"calibrated on {len(self.rows)} measured rows of {self.device} ({self.source}), fitted: {self.fit}; "
                f"GEMM-class kernels x{self.gemm_scale:.3g}, the others x{self.memory_scale:.3g}, the host's issue "
                f"time x{self.host_scale:.3g}{energy}{memory}")

    def to_json(self) -> str:
        """The file's text: every field, the rows, and the leave-one-out error for a person to read."""
        data = asdict(self)
        data["left_out_mape"] = round(self.left_out_mape, 4)
        if self.energy_left_out_mape is not None:
            data["energy_left_out_mape"] = round(self.energy_left_out_mape, 4)
        if self.memory_left_out_mape is not None:
            data["memory_left_out_mape"] = round(self.memory_left_out_mape, 4)
        return json.dumps(data, indent=2) + "\n"

    def save(self, path: str | Path) -> None:
        """Write :meth:`to_json` to ``path``."""
        Path(path).write_text(self.to_json())


def _left_out_mape(rows: tuple[CalibrationRow, ...], measured: str, left_out: str) -> float:
    """The MAPE of the rows' ``left_out`` predictions of their ``measured`` values."""
    import numpy as np

    return float(np.mean([abs(getattr(r, left_out) / getattr(r, measured) - 1) for r in rows]))


def load_calibration(path: str | Path) -> Calibration:
    """The calibration in the file at ``path``; a missing, unreadable or foreign file is one clear DippmError."""
    file = Path(path)
    if not file.is_file():
        raise DippmError(f"no calibration file at {path}: write one with `dippm-nas calibrate MEASUREMENTS.csv "
                         "--device GPU --out PROFILE.json`.")
    try:
        data = json.loads(read_user_text(file, "the calibration file"))
        if data.get("format") != FORMAT:
            raise DippmError(f"{path} is a calibration of format {data.get('format')!r}; this version reads format "
                             f"{FORMAT}: calibrate again with `dippm-nas calibrate`.")
        rows = tuple(CalibrationRow(**row) for row in data.pop("rows"))
        data.pop("left_out_mape", None)
        data.pop("energy_left_out_mape", None)
        data.pop("memory_left_out_mape", None)
        calibration = Calibration(rows=rows, **data)
    except DippmError:
        raise
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise DippmError(f"{path} is not a calibration file of dippm-nas ({type(exc).__name__}: {exc}); write one "
                         "with `dippm-nas calibrate`.") from None
    _check_values(path, calibration)
    return calibration


#: The widest factor a scale may take either way: beyond it a row is more likely wrong than the GPU odd.
LARGEST_SCALE = 8.0
#: The ranges of a calibration's other numbers: watts a GPU can draw, MiB a process can hold outside the
#: allocator, and any measured row's milliseconds, joules and MiB.
PLAUSIBLE = {"idle_w": (0.1, 10_000.0), "busy_w": (0.1, 10_000.0), "runtime_mib": (1.0, 65_536.0),
             "reserve_scale": (1 / LARGEST_SCALE, LARGEST_SCALE)}
ROW_PLAUSIBLE = {"ms": (1e-4, 1e7), "j": (1e-9, 1e7), "mib": (1.0, 4_194_304.0)}


def _check_values(path: str | Path, calibration: Calibration) -> None:
    """Every number of a calibration file finite and in its range, as strictly as a devices file's: a scale within
    :data:`LARGEST_SCALE` of 1 either way, the powers and the memory in :data:`PLAUSIBLE`, every row's numbers."""
    from dippm_nas.modes import EXECUTION_MODES
    from dippm_nas.precisions import PRECISIONS

    def bad(what: str, value: object, low: float, high: float) -> bool:
        return isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not (
            low <= value <= high)

    problems = [f"{name} is {getattr(calibration, name)!r} (a factor from {1 / LARGEST_SCALE:g} to {LARGEST_SCALE:g})"
                for name in PARAMETERS if bad(name, getattr(calibration, name), 1 / LARGEST_SCALE, LARGEST_SCALE)]
    problems += [f"{name} is {value!r} (from {low:g} to {high:g})" for name, (low, high) in PLAUSIBLE.items()
                 if (value := getattr(calibration, name)) is not None and bad(name, value, low, high)]
    if calibration.idle_w is not None and calibration.busy_w is not None and not problems \
            and calibration.idle_w > calibration.busy_w:
        problems.append(f"idle_w ({calibration.idle_w:g} W) is above busy_w ({calibration.busy_w:g} W)")
    if calibration.precision not in PRECISIONS or calibration.mode not in EXECUTION_MODES:
        problems.append(f"precision {calibration.precision!r} or mode {calibration.mode!r} is none this version knows")
    if not calibration.rows:
        problems.append("it holds no rows")
    for number, row in enumerate(calibration.rows, start=1):
        for field in fields(row):
            value = getattr(row, field.name)
            unit = field.name.rsplit("_", 1)[-1]
            if unit in ROW_PLAUSIBLE and value is not None and bad(field.name, value, *ROW_PLAUSIBLE[unit]):
                problems.append(f"row {number}'s {field.name} is {value!r}")
        if isinstance(row.batch, bool) or not isinstance(row.batch, int) or row.batch < 1:
            problems.append(f"row {number}'s batch is {row.batch!r}")
    if problems:
        raise DippmError(f"{path} is no calibration this version can use: {'; '.join(problems[:3])}"
                         f"{' and more' if len(problems) > 3 else ''}; calibrate again with `dippm-nas calibrate`.")
