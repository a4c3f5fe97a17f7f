"""Fit a calibration (:mod:`dippm_nas.calibration`) to a few of a user's own measurements.

The rows come from a CSV: the harness's own output (``dippm-nas measure``: ``model``, ``source``,
``input_shape``, ``batch``, ``precision``, ``status``, ``latency_ms_median``) or a minimal file with
``model,batch,latency_ms`` and optionally ``input_size``, ``precision``, ``energy_j`` and ``memory_mib``.
Each row's model is built as ``predict`` builds it; the operator model splits its predicted latency into the
GEMM-class kernels, the others and the host's issue times (:class:`~dippm_nas.cost.models.calibrated.LatencyParts`), and
the scales that bring the predictions nearest the measurements in log space are searched on a grid that
narrows around the best point. A pull towards 1 keeps a scale the rows cannot tell (the host's, where no row
waits on it) where the spec sheet put it. Ten rows rarely separate three scales: the rows themselves
choose, by how well each fit predicts every row left out of it, among the :data:`FITS` (none at all, one
speed for all the GPU's kernels, that and the host's, or all three) and the weights of the pull
(:data:`PRIOR_WEIGHTS`), the simplest where they tie.

Rows that measured energy (the harness's ``energy_j``, or an ``energy_j`` column of the minimal file) fit
the GPU's idle and busy power the same way: the rows choose, by the leave-one-out error, among the spec
sheet's powers, one factor on both, and the two apart (:data:`POWER_FITS`). Rows that measured memory (the
harness's NVML figure for the process, or a ``memory_mib`` column: the process's peak GPU memory as
``nvidia-smi`` shows it) fit the memory outside PyTorch's allocator and a factor on its reserve beyond the
weights, chosen the same way among :data:`MEMORY_FITS`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np

from dippm_nas.calibration import ALL_SCALES_FIT, LARGEST_SCALE, Calibration, CalibrationRow
from dippm_nas.cost.models.calibrated import LatencyParts, memory_terms
from dippm_nas.cost.models.operators import OperatorCostModel
from dippm_nas.cost.pipeline.memory import CUDA_CONTEXT_MIB, KERNEL_MODULES_MIB
from dippm_nas.cost.pipeline.memory import memory as memory_held
from dippm_nas.cost.pipeline.power import energy_j, spec_powers
from dippm_nas.cost.pipeline.table import node_table
from dippm_nas.errors import DippmError, one_line
from dippm_nas.graph.cast import graph_at_precision
from dippm_nas.modes import EXECUTION_MODES
from dippm_nas.precisions import DEFAULT_PRECISION, PRECISIONS
from dippm_nas.request import Request
from dippm_nas.training.metrics import mape
from dippm_nas.training.records import MEMORY_NVML_PROCESS, harness_memory
from dippm_nas.user_files import read_user_csv
from search_spaces import SEARCH_SPACES

#: The weights of the pull of each log-scale towards 0 (a factor of 1), against the mean squared log error,
#: that a calibration chooses from: from barely a tie-breaker to scales held near 1.
PRIOR_WEIGHTS = (1e-3, 1e-2, 1e-1, 1.0)
#: Fewer rows than this cannot separate three scales from noise.
MIN_ROWS = 3
MINIMAL_COLUMNS = ("model", "batch", "latency_ms")
#: The harness's latency column of each execution mode: in its latency rows, and in its compiled rows
#: (``measure --mode compile``).
HARNESS_LATENCY = {"eager": "latency_ms_median", "cuda-graphs": "latency_ms_cuda_graphs"}
COMPILED_HARNESS_LATENCY = {"eager": "latency_ms_eager", "compile": "latency_ms_compiled",
                            "compile-cudagraphs": "latency_ms_compiled_cudagraphs"}
#: The names and the parameters of the fits :func:`choose_by_left_out` chooses among.
Name = TypeVar("Name")
Params = TypeVar("Params")


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
    memory_mib: float | None = None
    #: Whether ``memory_mib`` counts the kernels' modules (NVML's figure for the process does; the harness's
    #: first protocol measured the context plus PyTorch's peak reserved memory, which does not).
    memory_counts_modules: bool = True
    #: The GPU the row was measured on, as CUDA names it (the harness's ``gpu_name``); None where unsaid.
    gpu_name: str | None = None
    #: How the forward pass was issued (``eager`` or ``cuda-graphs``); None where the row does not say.
    mode: str | None = None
    #: Whether the harness ran the row on the CPU (its ``device_kind``): no timing of a GPU.
    on_cpu: bool = False

    @property
    def label(self) -> str:
        """The row in words, for messages."""
        size = f"@{self.input_size}" if self.input_size else ""
        return f"{self.model}{size} b{self.batch}"


def read_rows(path: str | Path, mode: str | None = None) -> list[MeasuredRow]:
    """The measured rows of a harness CSV or a minimal one; a file of neither kind is one clear DippmError.
    Harness rows whose status is not ``ok`` are left out. A harness row holds several modes: a latency row its
    eager latency, or with ``mode="cuda-graphs"`` its forward replayed as a CUDA graph (rows whose capture failed
    are left out), without its energy and memory, which the harness measures in the eager window; a compiled row
    (``measure --mode compile``) its eager, ``compile`` and ``compile-cudagraphs`` latencies, without energy or
    memory. A minimal file's rows are as the user ran them, in the mode its ``mode`` column says (None where it
    has none)."""
    file = Path(path)
    if not file.is_file():
        raise DippmError(f"no measurements file at {path}: give the harness's CSV or one with columns "
                         f"{','.join(MINIMAL_COLUMNS)}.")
    reader = read_user_csv(file, "the measurements file")
    columns = set(reader.fieldnames or ())
    latency_columns = next((kind for kind in (HARNESS_LATENCY, COMPILED_HARNESS_LATENCY)
                            if {kind["eager"], "input_shape", "status"} <= columns), None)
    harness = latency_columns is not None
    if not harness and not set(MINIMAL_COLUMNS) <= columns:
        raise DippmError(f"{path} has columns {', '.join(sorted(columns)) or 'none'}: give the harness's CSV or "
                         f"one with columns {','.join(MINIMAL_COLUMNS)} (and optionally "
                         "input_size,precision,mode,energy_j,memory_mib).")
    if harness and (mode or "eager") not in latency_columns:
        other = "its compiled rows (`dippm-nas measure --mode compile`)" if latency_columns is HARNESS_LATENCY else (
            "its latency rows (`dippm-nas measure`)")
        raise DippmError(f"{path} is the harness's CSV, which times {', '.join(latency_columns)} runs, not mode "
                         f"{mode}: give {other}, or a file with columns model,batch,latency_ms (and mode).")
    rows = []
    for line, row in enumerate(reader, start=2):
        if harness and (row["status"] != "ok" or not row.get(latency_columns[mode or "eager"])):
            continue
        try:
            rows.append(_harness_row(row, line, latency_columns[mode or "eager"], mode or "eager") if harness
                        else _minimal_row(row, line))
        except (ValueError, KeyError, TypeError) as exc:  # TypeError: a row with fewer fields than the header
            raise DippmError(f"{path}, line {line}: {one_line(exc)}; fix the row or delete it.") from None
    return rows


def _minimal_row(row: dict[str, str], line: int) -> MeasuredRow:
    latency = float(row["latency_ms"])
    if not math.isfinite(latency) or latency <= 0:
        raise ValueError(f"latency_ms {row['latency_ms']!r} is not a time above 0")
    size = (row.get("input_size") or "").strip()
    mode = (row.get("mode") or "").strip() or None
    if mode not in (None, *EXECUTION_MODES):
        raise ValueError(f"mode {mode!r} is not one of {', '.join(EXECUTION_MODES)}")
    return MeasuredRow(row["model"].strip(), int(row["batch"]), latency, int(size) if size else None,
                       (row.get("precision") or "").strip() or None, line, _positive(row, "energy_j", "an energy"),
                       _positive(row, "memory_mib", "a memory"), mode=mode)


def _harness_row(row: dict[str, str], line: int, column: str, mode: str) -> MeasuredRow:
    size = int(row["input_shape"].split("x")[-1])
    source = row.get("source") or "timm"  # a space's rows name their candidate as space:architecture
    model = f"{source}:{row['model']}" if source in SEARCH_SPACES else row["model"]
    latency = float(row[column])
    eager = column == HARNESS_LATENCY["eager"]  # energy and memory are the latency rows' eager window's
    memory, measure = harness_memory(row) if eager else (None, "")
    return MeasuredRow(model, int(row["batch"]), latency, size, row["precision"], line,
                       _positive(row, "energy_j", "an energy", strict=False) if eager else None, memory,
                       memory_counts_modules=measure == MEMORY_NVML_PROCESS, gpu_name=row.get("gpu_name") or None,
                       mode=mode, on_cpu=row.get("device_kind") == "cpu")


def _positive(row: dict[str, str], column: str, what: str, strict: bool = True) -> float | None:
    """The row's ``column``, None where it has none. A value that is not above 0 raises ValueError where the
    user wrote it (``strict``); in the harness's rows it is a counter that did not tick in a short window
    (NVML's energy), and the row counts as one without it."""
    text = (row.get(column) or "").strip()
    if not text:
        return None
    value = float(text)
    if math.isfinite(value) and value > 0:
        return value
    if strict:
        raise ValueError(f"{column} {text!r} is not {what} above 0")
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
    Fit("none (no fit beat the rows' uncalibrated predictions by more than its noise)", (None, None, None)),
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


def choose_by_left_out(names: Sequence[Name], fit: Callable[[Name, np.ndarray], Params | None],
                       predict: Callable[[Params, int], float], measured: np.ndarray
                       ) -> tuple[Name, Params, np.ndarray]:
    """The fit of ``names`` whose leave-one-out predictions of ``measured`` err least, among the first (which
    always fits: no fit at all, or the spec sheet's) and the fits that beat it by more than their own leave-one-out
    spread: its name, its parameters fitted on every row and those predictions. A fit chosen on a few rows'
    leave-one-out error alone would often be chosen on their noise, and then predict the rows to come worse than
    none (:func:`beats_first`). ``fit(name, rows)`` gives the parameters of ``name`` fitted on the rows of a boolean
    mask, or None where it has none valid; ``predict(parameters, i)`` row i's value with them."""
    best = None
    first: np.ndarray | None = None  # each row's left-out error under the first fit
    every = np.ones(len(measured), dtype=bool)
    for name in names:
        left_out = np.zeros(len(measured))
        for i in range(len(measured)):
            others = every.copy()
            others[i] = False
            params = fit(name, others)
            if params is None:
                break
            left_out[i] = predict(params, i)
        else:
            errors = np.abs(left_out - measured) / measured
            first = errors if first is None else first
            if (best is None or errors.mean() < best[0]) and (errors is first or beats_first(first, errors)):
                params = fit(name, every)  # on every row only a fit that errs least so far
                if params is not None:
                    best = (errors.mean(), name, params, left_out)
    return best[1], best[2], best[3]


def beats_first(first: np.ndarray, errors: np.ndarray) -> bool:
    """Whether a fit whose rows' left-out errors are ``errors`` beats the first fit's (``first``) by more than its
    leave-one-out spread: the mean of the rows' gains above one standard error of it.

    >>> beats_first(np.array([0.10, 0.12, 0.08]), np.array([0.02, 0.03, 0.01]))
    True
    >>> beats_first(np.array([0.10, 0.12, 0.08]), np.array([0.02, 0.20, 0.05]))  # better on average, by chance
    False
    """
    gains = first - errors
    if len(gains) < 2:
        return False
    return bool(gains.mean() > gains.std(ddof=1) / math.sqrt(len(gains)))


def fit_chosen(parts: Sequence[LatencyParts], measured_s: np.ndarray) -> tuple[np.ndarray, np.ndarray, Fit]:
    """The scales of the fit of :data:`FITS`, with the weight of :data:`PRIOR_WEIGHTS`, whose leave-one-out
    predictions err least among none and the fits that beat none by more than their noise
    (:func:`choose_by_left_out`), those predictions (ms) and the fit. The error they give is the chosen fit's: a
    little optimistic, as it was chosen on it."""
    candidates = [(fit, weight) for fit in FITS for weight in (PRIOR_WEIGHTS if fit.free else PRIOR_WEIGHTS[:1])]
    (fit, _), scales, predicted = choose_by_left_out(
        candidates, lambda candidate, rows: fit_scales([p for p, kept in zip(parts, rows) if kept], measured_s[rows],
                                                       candidate[1], fit=candidate[0]),
        lambda scales, i: scaled_latency_ms(parts[i], scales), measured_s * 1e3)
    return scales, predicted, fit


#: The power fits a calibration chooses among, simplest first: the spec sheet's idle and busy watts, one
#: factor on both, and the two apart.
POWER_FITS = ("spec sheet", "one factor", "idle and busy apart")


def fit_power(latency_s: np.ndarray, busy_s: np.ndarray, energy: np.ndarray, spec: tuple[float, float],
              fit: str) -> tuple[float, float] | None:
    """The idle and busy watts of ``fit`` whose energies (:func:`~dippm_nas.cost.pipeline.power.energy_j`) have
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
    name, powers, left_out = choose_by_left_out(
        POWER_FITS, lambda fit, rows: fit_power(latency_s[rows], busy_s[rows], energy[rows], spec, fit),
        lambda powers, i: energy_j(latency_s[i], busy_s[i], *powers), energy)
    return (None if name == POWER_FITS[0] else powers), left_out


#: The memory fits a calibration chooses among, simplest first: the analytical model's memory, the memory
#: outside the allocator fitted, and that with the allocator's reserve beyond the weights.
MEMORY_FITS = ("the analytical model's", "the memory outside the allocator",
               "the memory outside the allocator and the allocator's reserve")


def fit_memory(terms: np.ndarray, measured: np.ndarray, fit: str) -> tuple[float, float] | None:
    """The factors on the memory outside the allocator and on the allocator's reserve (``terms``' first and
    last columns, :func:`~dippm_nas.calibration.memory_terms`) of ``fit`` whose memories have the least
    squared relative error against ``measured``; None where a factor falls beyond :data:`LARGEST_SCALE`."""
    runtime, weights, reserve = terms.T
    if fit == MEMORY_FITS[0]:
        return 1.0, 1.0
    if fit == MEMORY_FITS[1]:
        share, rest = runtime / measured, (measured - weights - reserve) / measured
        factors = float((share * rest).sum() / (share ** 2).sum()), 1.0
    else:
        columns = np.stack([runtime, reserve], axis=1) / measured[:, None]
        solution = np.linalg.lstsq(columns, (measured - weights) / measured, rcond=None)[0]
        factors = float(solution[0]), float(solution[1])
    return factors if all(1 / LARGEST_SCALE <= f <= LARGEST_SCALE for f in factors) else None


def memory_mib(terms: np.ndarray, factors: tuple[float, float]) -> np.ndarray:
    """The memory (MiB) of each row of ``terms`` with the two ``factors``."""
    return factors[0] * terms[:, 0] + terms[:, 1] + factors[1] * terms[:, 2]


def fit_memories(terms: np.ndarray, measured: np.ndarray) -> tuple[tuple[float, float] | None, np.ndarray]:
    """The factors of the fit of :data:`MEMORY_FITS` whose leave-one-out memories err least (None where that
    is the analytical model's), and those memories (MiB)."""
    name, factors, left_out = choose_by_left_out(
        MEMORY_FITS, lambda fit, rows: fit_memory(terms[rows], measured[rows], fit),
        lambda factors, i: float(memory_mib(terms[i:i + 1], factors)[0]), measured)
    return (None if name == MEMORY_FITS[0] else factors), left_out


def precision_of_rows(rows: Sequence[MeasuredRow], source: str) -> str:
    """The one precision ``rows`` say they were measured at (PyTorch's defaults where none says); rows of several
    are one DippmError that lists them and says how to choose.

    >>> precision_of_rows([MeasuredRow("resnet18", 8, 1.0, precision="fp16")] * 2, "rows.csv")
    'fp16'
    """
    return _one_said(rows, "precision", source, DEFAULT_PRECISION)


def mode_of_rows(rows: Sequence[MeasuredRow], source: str) -> str:
    """The one execution mode ``rows`` say they ran in (eager, PyTorch's default, where none says); rows of
    several are one DippmError, as for :func:`precision_of_rows`."""
    return _one_said(rows, "mode", source, EXECUTION_MODES[0])


def _one_said(rows: Sequence[MeasuredRow], field: str, source: str, default: str) -> str:
    said = Counter(getattr(r, field) for r in rows if getattr(r, field))
    if len(said) > 1:
        raise DippmError(f"{source} holds rows at {_held(said)}: calibrate one of them with --{field}.")
    return next(iter(said), default)


def _held(values: Counter) -> str:
    return ", ".join(f"{name} ({n} row{'s' * (n > 1)})" for name, n in values.most_common())


def calibrate(rows: Sequence[MeasuredRow], device: str, precision: str, mode: str, source: str,
              graph_of: Callable[[MeasuredRow], object] | None = None, say: Callable[[str], None] = print,
              model: OperatorCostModel | None = None, cpu_rows: bool = False) -> Calibration:
    """The calibration of ``device`` at ``precision`` and ``mode`` fitted on ``rows`` (those of another
    precision are left out; those measured on another GPU and a row whose model cannot be built are said and
    left out), of the shipped operator model or ``model``. Rows the harness ran on the CPU are left out too,
    unless ``cpu_rows`` says to fit them: a try of the commands without a GPU, which says nothing of one."""
    from dippm_nas import __version__
    from dippm_nas.hardware.registry import device_named, get_device
    from dippm_nas.hosts import DEFAULT_HOST, get_host_profile

    gpu = get_device(device)
    model = model or OperatorCostModel()
    # as the default host issues them: the host's scale is fitted over it
    request = Request(gpu, PRECISIONS[precision], mode=mode, host=get_host_profile(DEFAULT_HOST))
    reason = model.covers(request)
    if reason:
        raise DippmError(f"a calibration adjusts the operator model, and {reason}")
    graph_of = graph_of or _graph_of
    used: list[MeasuredRow] = []
    parts: list[LatencyParts] = []
    terms: list[tuple[float, float, float]] = []
    elsewhere: Counter[str] = Counter()  # rows measured on another GPU (or on the CPU), by its key
    for row in rows:
        if (row.precision or precision) != precision or (row.mode or mode) != mode:
            continue
        if row.on_cpu and not cpu_rows:
            elsewhere[CPU] += 1
            continue
        measured_on = device_named(row.gpu_name) if row.gpu_name else None
        if measured_on not in (None, gpu.key):
            elsewhere[measured_on] += 1
            continue
        try:
            graph = graph_of(row)
        except Exception as exc:  # the user's model: said, and the calibration goes on without it
            say(f"line {row.line}: {row.label} left out: {one_line(exc)}")
            continue
        used.append(row)
        graph = graph_at_precision(graph, request.precision)[0]  # at the precision's dtypes, for time and memory
        table = node_table(graph)
        parts.append(LatencyParts.of(model.timed(table, request)))
        terms.append(memory_terms(memory_held(table, request.precision), row.memory_counts_modules))
    for other, count in elsewhere.items():
        say(f"{count} row{'s' if count > 1 else ''} measured on {other} left out: this calibrates {gpu.key}"
            + (" from its GPU's timings" if other == CPU else ""))
    if len(used) < MIN_ROWS and elsewhere:
        other = elsewhere.most_common(1)[0][0]
        if other == CPU:
            raise DippmError(f"{source}'s rows at {precision} were measured on the CPU (device_kind cpu), which says "
                             f"nothing of {gpu.key}: measure on the GPU (`dippm-nas measure` where it is visible), "
                             "or give --cpu-rows to try the commands on them.")
        raise DippmError(f"{source}'s rows at {precision} were measured on {other}, not {gpu.key}: calibrate with "
                         f"--device {other}.")
    if len(used) < MIN_ROWS:
        held = Counter(f"{r.precision or precision} {r.mode or mode}" for r in rows
                       if (r.precision or precision, r.mode or mode) != (precision, mode))
        other = (f"; the file holds rows at {_held(held)}: calibrate those with --precision and --mode" if held
                 else "")
        raise DippmError(f"{len(used)} usable rows at {precision} {mode} in {source}: a calibration needs "
                         f"{MIN_ROWS} or more (about ten, spread over batch sizes and models, calibrate best){other}.")
    if any(row.on_cpu for row in used):
        say(f"fitted to rows measured on the CPU (--cpu-rows): this calibration tries the commands; it says nothing "
            f"of {gpu.key}")
    measured = np.array([r.latency_ms for r in used]) * 1e-3
    scales, left_out, fit = fit_chosen(parts, measured)
    _say_bounds(scales, gpu.key, precision, mode, say)
    before = np.array([scaled_latency_ms(part, np.ones(3)) for part in parts]) * 1e-3
    after = np.array([scaled_latency_ms(part, scales) for part in parts]) * 1e-3
    busy = np.array([part.busy_s for part in parts])
    # the powers are fitted on the calibrated latencies: a prediction's
    spec = spec_powers(gpu)
    energy = _fit_rows_energy(used, before, after, busy, spec, say)
    memory = _fit_rows_memory(used, np.array(terms), say)
    out = [CalibrationRow(row.model, row.batch, row.input_size, row.latency_ms, before[i] * 1e3, after[i] * 1e3,
                          float(left_out[i]), *energy.rows[i], *memory.rows[i]) for i, row in enumerate(used)]
    idle_w, busy_w = energy.params or (None, None)
    runtime_mib, reserve_scale = memory.params or (None, None)
    return Calibration(device=gpu.key, precision=precision, mode=mode, gemm_scale=round(float(scales[0]), 4),
                       memory_scale=round(float(scales[1]), 4), host_scale=round(float(scales[2]), 4),
                       rows=tuple(out), source=source, version=__version__, host=DEFAULT_HOST, fit=fit.name,
                       idle_w=idle_w, busy_w=busy_w, runtime_mib=runtime_mib, reserve_scale=reserve_scale)


#: What :func:`calibrate` names rows the harness ran on the CPU.
CPU = "the CPU"
#: The names of the three scales, in their order.
SCALE_NAMES = ("GEMM-class kernels'", "other kernels'", "host's issue time")


def _say_bounds(scales: np.ndarray, gpu: str, precision: str, mode: str, say: Callable[[str], None]) -> None:
    """Say which scales stopped at :data:`LARGEST_SCALE` either way: the rows are further from what the operator
    model expects than a GPU's own speed explains, and the fit could not follow them."""
    bound = [name for name, scale in zip(SCALE_NAMES, scales)
             if math.isclose(scale, LARGEST_SCALE, rel_tol=1e-3) or math.isclose(scale, 1 / LARGEST_SCALE,
                                                                                   rel_tol=1e-3)]
    if bound:
        say(f"the {' and '.join(bound)} scale stopped at its bound (x{LARGEST_SCALE:g} or x1/{LARGEST_SCALE:g}): "
            f"the rows are further from the operator model than a GPU's own speed explains; check that they are "
            f"{gpu}'s, at {precision} in {mode}, in milliseconds for the whole batch")


@dataclass(frozen=True)
class TargetFit:
    """What the rows' energy or memory fitted: its two parameters as the calibration keeps them (None: the
    spec sheet's power, the analytical model's memory), and per row the measured value and its predictions
    before, after and left out (Nones where the row measured none)."""

    params: tuple[float, float] | None
    rows: list[tuple[float | None, ...]]


def _metered(values: Sequence[float | None], what: str, fits: str, stands: str,
             say: Callable[[str], None]) -> np.ndarray | None:
    """Which rows measured ``what`` (their ``values`` are not None), where :data:`MIN_ROWS` or more did; else
    None, said where some did."""
    metered = np.array([v is not None for v in values])
    if metered.sum() >= MIN_ROWS:
        return metered
    if metered.any():
        say(f"{int(metered.sum())} rows measured {what}: {MIN_ROWS} or more fit {fits}; {stands} stands")
    return None


def _by_row(metered: np.ndarray, columns: Sequence[Sequence[float]]) -> list[tuple[float | None, ...]]:
    """Per row, the ``columns`` (one value per metered row each), or Nones for a row not metered."""
    rows: list[tuple[float | None, ...]] = [(None,) * len(columns)] * len(metered)
    for j, i in enumerate(np.flatnonzero(metered)):
        rows[i] = tuple(float(c[j]) for c in columns)
    return rows


def _fit_rows_energy(used: Sequence[MeasuredRow], before_s: np.ndarray, after_s: np.ndarray, busy_s: np.ndarray,
                     spec: tuple[float, float], say: Callable[[str], None]) -> TargetFit:
    """The power fit of the rows that measured energy, where :data:`MIN_ROWS` or more did."""
    metered = _metered([row.energy_j for row in used], "energy", "the GPU's power", "the spec sheet's", say)
    if metered is None:
        return TargetFit(None, [(None,) * 4 for _ in used])
    measured = np.array([row.energy_j for row in used if row.energy_j is not None])
    powers, left_out = fit_powers(after_s[metered], busy_s[metered], measured, spec)
    before = [energy_j(t, b, *spec) for t, b in zip(before_s[metered], busy_s[metered])]
    after = [energy_j(t, b, *(powers or spec)) for t, b in zip(after_s[metered], busy_s[metered])]
    return TargetFit(tuple(round(w, 2) for w in powers) if powers else None,
                     _by_row(metered, (measured, before, after, left_out)))


def _fit_rows_memory(used: Sequence[MeasuredRow], terms: np.ndarray, say: Callable[[str], None]) -> TargetFit:
    """The memory fit of the rows that measured memory, where :data:`MIN_ROWS` or more did: the memory outside
    the allocator (MiB) and the factor on its reserve."""
    metered = _metered([row.memory_mib for row in used], "memory", "it", "the analytical model's", say)
    if metered is None:
        return TargetFit(None, [(None,) * 4 for _ in used])
    measured = np.array([row.memory_mib for row in used if row.memory_mib is not None])
    factors, left_out = fit_memories(terms[metered], measured)
    before = memory_mib(terms[metered], (1.0, 1.0))
    after = memory_mib(terms[metered], factors or (1.0, 1.0))
    rows = _by_row(metered, (measured, before, after, left_out))
    if factors is None:
        return TargetFit(None, rows)
    # the factor on the runtime's terms, as the MiB a prediction (which counts the modules) holds outside the allocator
    return TargetFit((round(factors[0] * (CUDA_CONTEXT_MIB + KERNEL_MODULES_MIB), 1), round(factors[1], 4)), rows)


def _graph_of(row: MeasuredRow):
    """The row's model at its batch, as ``predict`` builds it (through the disk cache of graphs)."""
    from dippm_nas._predict import build_graph
    from dippm_nas.cache.models import cached_graph

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
    for unit, rows, attrs, fitted in (
            ("J", calibration.energy_rows, ("energy_j", "energy_before_j", "energy_after_j", "energy_left_out_j"),
             f"power: {calibration.idle_w:.0f} W idle, {calibration.busy_w:.0f} W per second of the roofline's busy "
             "time" if calibration.idle_w is not None else "power: the spec sheet's (the rows fit it best)"),
            ("MiB", calibration.memory_rows,
             ("memory_mib", "memory_before_mib", "memory_after_mib", "memory_left_out_mib"),
             f"memory: {calibration.runtime_mib:.0f} MiB outside the allocator, its reserve beyond the weights "
             f"x{calibration.reserve_scale:.3g}" if calibration.runtime_mib is not None
             else "memory: the analytical model's (the rows fit it best)")):
        if rows:
            lines.append(_target_table(rows, attrs, unit, fitted))
    return "\n".join(lines)


def _target_table(rows: Sequence[CalibrationRow], attrs: Sequence[str], unit: str, fitted: str) -> str:
    """The rows' measured energy or memory (``attrs``: measured, before, after, left out) and the errors."""
    what = "energy" if unit == "J" else "memory"
    lines = [f"\n{'row':<44} {'measured':>9} {'before':>9} {'after':>9} {'left out':>9}  ({unit})"]
    values = np.array([[getattr(r, a) for a in attrs] for r in rows])
    lines += [f"{_label(r):<44} " + " ".join(f"{v:9.3f}" for v in row) for r, row in zip(rows, values)]
    before, after, left_out = (mape(values[:, k], values[:, 0]) for k in (1, 2, 3))
    lines.append(f"{what} MAPE on these {len(rows)} rows: {before:.1%} uncalibrated, {after:.1%} calibrated; "
                 f"each row left out of its fit: {left_out:.1%}")
    return "\n".join(lines + [fitted])


def _label(row: CalibrationRow) -> str:
    """A calibration row in words: its model, input size and batch."""
    return f"{row.model}{f'@{row.input_size}' if row.input_size else ''} b{row.batch}"
