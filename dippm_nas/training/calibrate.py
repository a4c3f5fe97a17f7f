"""Fit a calibration (:mod:`dippm_nas.cost.calibration`) to a few of a user's own measured latencies.

The rows come from a CSV: the harness's own output (``dippm-nas measure``: ``model``, ``source``,
``input_shape``, ``batch``, ``precision``, ``status``, ``latency_ms_median``) or a minimal file with
``model,batch,latency_ms`` and optionally ``input_size`` and ``precision``. Each row's model is built as
``predict`` builds it; the operator model splits its predicted latency into the GEMM-class kernels, the
others and the host's issue times (:class:`~dippm_nas.cost.operator_cost.LatencyParts`), and the scales
that bring the predictions nearest the measurements in log space are searched on a grid that narrows
around the best point. A pull towards 1 keeps a scale the rows cannot tell (the host's, where no row
waits on it) where the spec sheet put it. Ten rows rarely separate three scales: the rows themselves
choose, by how well each fit predicts every row left out of it, among the :data:`FITS` (none at all, one
speed for all the GPU's kernels, that and the host's, or all three) and the weights of the pull
(:data:`PRIOR_WEIGHTS`), the simplest where they tie.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

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
    """One measured latency of a model at a batch (and input size, and precision where the file says)."""

    model: str
    batch: int
    latency_ms: float
    input_size: int | None = None
    precision: str | None = None
    line: int = 0

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
                             f"one with columns {','.join(MINIMAL_COLUMNS)} (and optionally input_size,precision).")
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
                       (row.get("precision") or "").strip() or None, line)


def _harness_row(row: dict[str, str], line: int) -> MeasuredRow:
    size = int(row["input_shape"].split("x")[-1])
    model = row["model"] if row.get("source", "timm") == "timm" else f"{row['source']}:{row['model']}"
    return MeasuredRow(model, int(row["batch"]), float(row["latency_ms_median"]), size, row["precision"], line)


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
    out = [CalibrationRow(row.model, row.batch, row.input_size, row.latency_ms, scaled_latency_ms(part, np.ones(3)),
                          scaled_latency_ms(part, scales), float(predicted))
           for row, part, predicted in zip(used, parts, left_out)]
    return Calibration(device=gpu.key, precision=precision, mode=mode, gemm_scale=round(float(scales[0]), 4),
                       memory_scale=round(float(scales[1]), 4), host_scale=round(float(scales[2]), 4),
                       rows=tuple(out), source=source, version=__version__, host=DEFAULT_HOST, fit=fit.name)


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
        label = f"{r.model}{f'@{r.input_size}' if r.input_size else ''} b{r.batch}"
        lines.append(f"{label:<44} {r.latency_ms:9.3f} {r.before_ms:9.3f} {r.after_ms:9.3f} {r.left_out_ms:9.3f}")

    measured = np.array([r.latency_ms for r in calibration.rows])

    def mape_of(attr: str) -> float:
        return mape(np.array([getattr(r, attr) for r in calibration.rows]), measured)

    lines.append(f"MAPE on these {len(calibration.rows)} rows: {mape_of('before_ms'):.1%} uncalibrated, "
                 f"{mape_of('after_ms'):.1%} calibrated; each row left out of its fit: {calibration.left_out_mape:.1%}")
    lines.append(f"fitted: {calibration.fit}; scales: GEMM-class kernels x{calibration.gemm_scale:.3g}, the others "
                 f"x{calibration.memory_scale:.3g}, the host's issue time x{calibration.host_scale:.3g}")
    return "\n".join(lines)
