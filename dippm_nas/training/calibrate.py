"""Fit a calibration (:mod:`dippm_nas.cost.calibration`) to a few of a user's own measurements.

The rows come from a CSV: the harness's own output (``dippm-nas measure``: ``model``, ``source``,
``input_shape``, ``batch``, ``precision``, ``status``, ``latency_ms_median``) or a minimal file with
``model,batch,latency_ms`` and optionally ``input_size``, ``precision`` and ``energy_j``. Each row's model
is built as ``predict`` builds it; the operator model splits its predicted latency into the GEMM-class
kernels, the others and the host's issue times (:class:`~dippm_nas.cost.operator_cost.LatencyParts`), and
the scales that bring the predictions nearest the measurements in log space are searched on a grid that
narrows around the best point. A pull towards 1 keeps a scale the rows cannot tell (the host's, where no row
waits on it) where the spec sheet put it. Ten rows rarely separate three scales: the rows themselves
choose, by how well each fit predicts every row left out of it, among the :data:`FITS` (none at all, one
speed for all the GPU's kernels, that and the host's, or all three) and the weights of the pull
(:data:`PRIOR_WEIGHTS`), the simplest where they tie.

Rows that measured energy (the harness's ``energy_j``, or an ``energy_j`` column of the minimal file) fit
the GPU's idle and busy power the same way: the rows choose, by the leave-one-out error, among the spec
sheet's powers, one factor on both, and the two apart (:data:`POWER_FITS`).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dippm_nas.cost.analytical import energy_j, spec_powers
from dippm_nas.cost.calibration import ALL_SCALES_FIT, Calibration, CalibrationRow
from dippm_nas.cost.operator_cost import LatencyParts, OperatorCostModel
from dippm_nas.errors import DippmError, one_line
from dippm_nas.training.metrics import mape

#: The widest factor a scale may take either way: beyond it a row is more likely wrong than the GPU odd.
LARGEST_SCALE = 8.0
#: The weights of the pull of each log-scale towards 0 (a factor of 1), against the mean squared log error,
#: that a calibration chooses from: from barely a tie-breaker to scales held near 1.
PRIOR_WEIGHTS = (1e-3, 1e-2, 1e-1, 1.0)
#: Fewer rows than this cannot separate three scales from noise.
MIN_ROWS = 3
MINIMAL_COLUMNS = ("model", "batch", "latency_ms")


@dataclass(frozen=True)
class MeasuredRow:
    """One measured latency of a model at a batch (and input size, precision and energy where the file says)."""

    model: str
    batch: int
    latency_ms: float
    input_size: int | None = None
    precision: str | None = None
    line: int = 0
    energy_j: float | None = None  # of one inference of the whole batch

    @property
    def label(self) -> str:
        """The row in words, for messages."""
        size = f"@{self.input_size}" if self.input_size else ""
        return f"{self.model}{size} b{self.batch}"


def read_rows(path: str | Path) -> list[MeasuredRow]:
    """The measured rows of a harness CSV or a minimal one; a file of neither kind is one clear DippmError.
    Harness rows whose status is not ``ok`` are left out."""
    file = Path(path)
    if not file.is_file():
        raise DippmError(f"no measurements file at {path}: give the harness's CSV or one with columns "
                         f"{','.join(MINIMAL_COLUMNS)}.")
    with open(file, newline="") as f:
        reader = csv.DictReader(f)
        columns = set(reader.fieldnames or ())
        harness = {"latency_ms_median", "input_shape", "status"} <= columns
        if not harness and not set(MINIMAL_COLUMNS) <= columns:
            raise DippmError(f"{path} has columns {', '.join(sorted(columns)) or 'none'}: give the harness's CSV or "
                             f"one with columns {','.join(MINIMAL_COLUMNS)} (and optionally "
                             "input_size,precision,energy_j).")
        rows = []
        for line, row in enumerate(reader, start=2):
            if harness and row["status"] != "ok":
                continue
            try:
                rows.append(_harness_row(row, line) if harness else _minimal_row(row, line))
            except (ValueError, KeyError) as exc:
                raise DippmError(f"{path}, line {line}: {one_line(exc)}; fix the row or delete it.") from None
    return rows


def _minimal_row(row: dict[str, str], line: int) -> MeasuredRow:
    latency = float(row["latency_ms"])
    if not math.isfinite(latency) or latency <= 0:
        raise ValueError(f"latency_ms {row['latency_ms']!r} is not a time above 0")
    size = (row.get("input_size") or "").strip()
    return MeasuredRow(row["model"].strip(), int(row["batch"]), latency, int(size) if size else None,
                       (row.get("precision") or "").strip() or None, line, _energy(row))


def _harness_row(row: dict[str, str], line: int) -> MeasuredRow:
    size = int(row["input_shape"].split("x")[-1])
    model = row["model"] if row.get("source", "timm") == "timm" else f"{row['source']}:{row['model']}"
    return MeasuredRow(model, int(row["batch"]), float(row["latency_ms_median"]), size, row["precision"], line,
                       _energy(row, strict=False))


def _energy(row: dict[str, str], strict: bool = True) -> float | None:
    """The row's ``energy_j``, None where it has none. A value that is no energy above 0 raises ValueError
    where the user wrote it (``strict``); in the harness's rows it is an energy counter that did not tick in
    a short window, and the row counts as one without energy."""
    text = (row.get("energy_j") or "").strip()
    if not text:
        return None
    energy = float(text)
    if math.isfinite(energy) and energy > 0:
        return energy
    if strict:
        raise ValueError(f"energy_j {text!r} is not an energy above 0")
    return None


@dataclass(frozen=True)
class Fit:
    """Which scales a calibration frees: ``ties[i]`` is the free parameter scale i (GEMM-class, others,
    host) follows, or None where it stays 1."""

    name: str
    ties: tuple[int | None, int | None, int | None]

    @property
    def free(self) -> int:
        """How many parameters the fit has."""
        return len({t for t in self.ties if t is not None})

    def log_scales(self, free: np.ndarray) -> np.ndarray:
        """The three log-scales of each row of free parameters ``[points, free]``: ``[points, 3]``."""
        columns = [free[:, t] if t is not None else np.zeros(len(free)) for t in self.ties]
        return np.stack(columns, axis=1)


#: The fits a calibration chooses among, simplest first.
FITS = (
    Fit("none (the rows predict best uncalibrated)", (None, None, None)),
    Fit("one speed of all the GPU's kernels", (0, 0, None)),
    Fit("one speed of the GPU's kernels and the host's issue time", (0, 0, 1)),
    Fit(ALL_SCALES_FIT, (0, 1, 2)),
)
#: The fit of all three scales.
ALL_SCALES = FITS[-1]


def fit_scales(parts: Sequence[LatencyParts], measured_s: np.ndarray, prior_weight: float, rounds: int = 5,
               points: int = 9, fit: Fit = ALL_SCALES) -> np.ndarray:
    """The three scales (GEMM-class, others, host) that ``fit`` frees and that minimise the mean squared log
    error of the queued latencies against ``measured_s``, plus ``prior_weight`` times their free parameters'
    squared logs."""
    if not fit.free:
        return np.ones(3)
    limit = math.log(LARGEST_SCALE)
    best, span = np.zeros(fit.free), limit
    for _ in range(rounds):
        axis = np.linspace(-span, span, points)
        free = np.stack(np.meshgrid(*[axis] * fit.free, indexing="ij"), axis=-1).reshape(-1, fit.free) + best
        free = np.clip(free, -limit, limit)
        scales = np.exp(fit.log_scales(free))
        loss = prior_weight * (free ** 2).sum(axis=1)
        for part, seconds in zip(parts, measured_s):
            loss += np.log(part.latency_s(scales[:, 0], scales[:, 1], scales[:, 2]) / seconds) ** 2 / len(parts)
        best = free[int(np.argmin(loss))]
        span /= 3
    return np.exp(fit.log_scales(best[None]))[0]


def scaled_latency_ms(part: LatencyParts, scales: np.ndarray) -> float:
    """The queued latency (ms) of one row with the three ``scales`` (GEMM-class, others, host)."""
    return float(part.latency_s(*(np.array([s]) for s in scales))[0] * 1e3)


def left_out_ms(parts: Sequence[LatencyParts], measured_s: np.ndarray, prior_weight: float,
                fit: Fit = ALL_SCALES) -> np.ndarray:
    """Each row's latency (ms) as the fit of all the other rows predicts it."""
    out = np.zeros(len(parts))
    for i in range(len(parts)):
        others = [j for j in range(len(parts)) if j != i]
        scales = fit_scales([parts[j] for j in others], measured_s[others], prior_weight, fit=fit)
        out[i] = scaled_latency_ms(parts[i], scales)
    return out


def fit_chosen(parts: Sequence[LatencyParts], measured_s: np.ndarray) -> tuple[np.ndarray, np.ndarray, Fit]:
    """The scales of the fit of :data:`FITS`, with the weight of :data:`PRIOR_WEIGHTS`, whose leave-one-out
    predictions err least (the simpler where two tie), those predictions (ms) and the fit. The error they
    give is the chosen fit's: a little optimistic, as it was chosen on it."""
    best = None
    for fit in FITS:
        for weight in PRIOR_WEIGHTS if fit.free else PRIOR_WEIGHTS[:1]:
            predicted = left_out_ms(parts, measured_s, weight, fit)
            error = mape(predicted, measured_s * 1e3)
            if best is None or error < best[0]:
                best = (error, weight, fit, predicted)
    _, weight, fit, predicted = best
    return fit_scales(parts, measured_s, weight, fit=fit), predicted, fit


#: The power fits a calibration chooses among, simplest first: the spec sheet's idle and busy watts, one
#: factor on both, and the two apart.
POWER_FITS = ("spec sheet", "one factor", "idle and busy apart")


def fit_power(latency_s: np.ndarray, busy_s: np.ndarray, energy: np.ndarray, spec: tuple[float, float],
              fit: str) -> tuple[float, float] | None:
    """The idle and busy watts of ``fit`` whose energies (:func:`~dippm_nas.cost.analytical.energy_j`) have
    the least squared relative error against ``energy``; None where the fit gives no power above 0 (or an idle
    power above the busy one)."""
    if fit == POWER_FITS[0]:
        return spec
    if fit == POWER_FITS[1]:
        ratio = energy_j(latency_s, busy_s, *spec) / energy
        factor = float(ratio.sum() / (ratio ** 2).sum())
        return spec[0] * factor, spec[1] * factor
    # energy = idle * (latency - busy) + busy_w * busy, each row divided by its energy
    columns = np.stack([latency_s - busy_s, busy_s], axis=1) / energy[:, None]
    idle, busy = np.linalg.lstsq(columns, np.ones(len(energy)), rcond=None)[0]
    return (float(idle), float(busy)) if 0 < idle < busy else None


def fit_powers(latency_s: np.ndarray, busy_s: np.ndarray, energy: np.ndarray, spec: tuple[float, float]
               ) -> tuple[tuple[float, float] | None, np.ndarray]:
    """The idle and busy watts of the fit of :data:`POWER_FITS` whose leave-one-out energies err least (None
    where that is the spec sheet's), and those energies (J)."""
    best = None
    for fit in POWER_FITS:
        left_out = np.zeros(len(energy))
        for i in range(len(energy)):
            others = np.arange(len(energy)) != i
            powers = fit_power(latency_s[others], busy_s[others], energy[others], spec, fit)
            if powers is None:
                break
            left_out[i] = energy_j(latency_s[i], busy_s[i], *powers)
        else:
            powers = fit_power(latency_s, busy_s, energy, spec, fit)
            error = mape(left_out, energy)
            if powers is not None and (best is None or error < best[0]):
                best = (error, None if fit == POWER_FITS[0] else powers, left_out)
    return best[1], best[2]


def calibrate(rows: Sequence[MeasuredRow], device: str, precision: str, mode: str, source: str,
              graph_of: Callable[[MeasuredRow], object] | None = None, say: Callable[[str], None] = print,
              model: OperatorCostModel | None = None) -> Calibration:
    """The calibration of ``device`` at ``precision`` and ``mode`` fitted on ``rows`` (those of another
    precision are left out, and a row whose model cannot be built is said and left out), of the shipped
    operator model or ``model``."""
    from dippm_nas import __version__
    from dippm_nas.cost.host import DEFAULT_HOST
    from dippm_nas.hardware.registry import get_device

    gpu = get_device(device)
    model = model or OperatorCostModel()
    reason = model.covers()
    if reason:
        raise DippmError(f"a calibration adjusts the operator model, and {reason}")
    graph_of = graph_of or _graph_of
    used: list[MeasuredRow] = []
    parts: list[LatencyParts] = []
    for row in rows:
        if row.precision is not None and row.precision != precision:
            continue
        try:
            graph = graph_of(row)
        except Exception as exc:  # the user's model: said, and the calibration goes on without it
            say(f"line {row.line}: {row.label} left out: {one_line(exc)}")
            continue
        used.append(row)
        parts.append(model.latency_parts(graph, gpu, precision, mode=mode, host=DEFAULT_HOST))
    if len(used) < MIN_ROWS:
        raise DippmError(f"{len(used)} usable rows at {precision} in {source}: a calibration needs {MIN_ROWS} or "
                         "more (about ten, spread over batch sizes and models, calibrate best).")
    measured = np.array([r.latency_ms for r in used]) * 1e-3
    scales, left_out, fit = fit_chosen(parts, measured)
    before = np.array([scaled_latency_ms(part, np.ones(3)) for part in parts]) * 1e-3
    after = np.array([scaled_latency_ms(part, scales) for part in parts]) * 1e-3
    busy = np.array([part.busy_s for part in parts])
    # the energy rows' powers, fitted on the calibrated latencies (a prediction's) where enough rows measured energy
    spec = spec_powers(gpu)
    metered = np.array([row.energy_j is not None for row in used])
    fits_power = metered.sum() >= MIN_ROWS
    powers, energy_left_out = None, np.full(len(used), np.nan)
    if fits_power:
        measured_energy = np.array([row.energy_j for row in used if row.energy_j is not None])
        powers, energy_left_out[metered] = fit_powers(after[metered], busy[metered], measured_energy, spec)
    elif metered.any():
        say(f"{int(metered.sum())} rows measured energy: {MIN_ROWS} or more fit the GPU's power; the spec sheet's "
            "stands")
    out = []
    for i, (row, predicted) in enumerate(zip(used, left_out)):
        energies = (row.energy_j, energy_j(before[i], busy[i], *spec), energy_j(after[i], busy[i], *(powers or spec)),
                    float(energy_left_out[i])) if metered[i] and fits_power else ()
        out.append(CalibrationRow(row.model, row.batch, row.input_size, row.latency_ms, before[i] * 1e3,
                                  after[i] * 1e3, float(predicted), *energies))
    idle_w, busy_w = (round(w, 2) for w in powers) if powers else (None, None)
    return Calibration(device=gpu.key, precision=precision, mode=mode, gemm_scale=round(float(scales[0]), 4),
                       memory_scale=round(float(scales[1]), 4), host_scale=round(float(scales[2]), 4),
                       rows=tuple(out), source=source, version=__version__, host=DEFAULT_HOST, fit=fit.name,
                       idle_w=idle_w, busy_w=busy_w)


def _graph_of(row: MeasuredRow):
    """The row's model at its batch, as ``predict`` builds it (through the disk cache of graphs)."""
    from dippm_nas._model_cache import cached_graph
    from dippm_nas._predict import build_graph

    inputs = (3, row.input_size, row.input_size) if row.input_size and not row.model.startswith("hf:") else None
    return cached_graph(row.model, inputs, row.batch, build_graph)


def report(calibration: Calibration) -> str:
    """Each row measured against the prediction before, after, and left out of the fit; then the errors."""
    lines = [f"{'row':<44} {'measured':>9} {'before':>9} {'after':>9} {'left out':>9}  (ms)"]
    for r in calibration.rows:
        lines.append(f"{_label(r):<44} {r.latency_ms:9.3f} {r.before_ms:9.3f} {r.after_ms:9.3f} {r.left_out_ms:9.3f}")

    measured = np.array([r.latency_ms for r in calibration.rows])

    def mape_of(attr: str) -> float:
        return mape(np.array([getattr(r, attr) for r in calibration.rows]), measured)

    lines.append(f"MAPE on these {len(calibration.rows)} rows: {mape_of('before_ms'):.1%} uncalibrated, "
                 f"{mape_of('after_ms'):.1%} calibrated; each row left out of its fit: {calibration.left_out_mape:.1%}")
    lines.append(f"fitted: {calibration.fit}; scales: GEMM-class kernels x{calibration.gemm_scale:.3g}, the others "
                 f"x{calibration.memory_scale:.3g}, the host's issue time x{calibration.host_scale:.3g}")
    metered = calibration.energy_rows
    if metered:
        lines.append(f"\n{'row':<44} {'measured':>9} {'before':>9} {'after':>9} {'left out':>9}  (J)")
        for r in metered:
            lines.append(f"{_label(r):<44} {r.energy_j:9.3f} {r.energy_before_j:9.3f} {r.energy_after_j:9.3f} "
                         f"{r.energy_left_out_j:9.3f}")
        joules = np.array([r.energy_j for r in metered])
        before = mape(np.array([r.energy_before_j for r in metered]), joules)
        after = mape(np.array([r.energy_after_j for r in metered]), joules)
        left_out = mape(np.array([r.energy_left_out_j for r in metered]), joules)
        lines.append(f"energy MAPE on these {len(metered)} rows: {before:.1%} uncalibrated, {after:.1%} calibrated; "
                     f"each row left out of its fit: {left_out:.1%}")
        fitted = calibration.idle_w is not None
        lines.append(f"power: {calibration.idle_w:.0f} W idle, {calibration.busy_w:.0f} W per second of the "
                     "roofline's busy time" if fitted else "power: the spec sheet's (the rows fit it best)")
    return "\n".join(lines)


def _label(row: CalibrationRow) -> str:
    """A calibration row in words: its model, input size and batch."""
    return f"{row.model}{f'@{row.input_size}' if row.input_size else ''} b{row.batch}"
