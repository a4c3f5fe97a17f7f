"""``dippm-nas evaluate --calibration``: a calibration on ten rows never predicts a GPU's other rows worse than none.

On every GPU of the measured data from outside the project (timm's RTX 3090 and RTX 4090 records, ``data/timm``;
HELP's NAS-Bench-201 and OFA MobileNetV3 latencies on five GPUs, ``data/help``), ten rows are drawn at random,
``dippm-nas calibrate``'s fit (:func:`~dippm_nas.training.calibration_fit.calibrate`) is run on them, and the GPU's
other rows are predicted with it and without it, by the same operator model: the calibration's worth is the
difference of the two MAPEs on the same rows. The operator model is the shipped one for HELP's GPUs, which it
never saw; for timm's, which it trained on, one trained without the GPU and the GPUs of its chip (neither their
operators nor their records), so that each GPU is one the model never saw, as a user's is. The bar: calibrated
is never worse than uncalibrated by more than :data:`BAR_POINTS` points, the mean of the draws, on every GPU,
space or precision, and batch. Written to ``docs/calibration.md`` and ``docs/accuracy/calibration.json``.
"""

from __future__ import annotations

import json
import random
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dippm_nas.training.calibration_fit import MeasuredRow, calibrate, scaled_latency_ms
from dippm_nas.training.metrics import mape
from dippm_nas.training.paths import project

#: Rows a calibration is fitted on, and the draws of them.
ROWS, DRAWS = 10, 5
#: How much worse than none a calibration may predict the rows it left out, in points of MAPE.
BAR_POINTS = 0.5
#: The GPUs of timm's records (``data/timm``) and the precision they were measured at.
TIMM_GPUS = {"rtx3090": "fp16", "rtx4090": "fp16"}
#: timm's records of one GPU drawn for the check (all of them: thousands; the MAPEs settle well before).
TIMM_RECORDS = 600


@dataclass(frozen=True)
class Cell:
    """One GPU at one workload and batch: its rows' MAPE uncalibrated and calibrated, each draw on the rows it left
    out, and the fits the draws chose."""

    data: str
    gpu: str
    workload: str
    batch: str
    rows: int
    uncalibrated: tuple[float, ...]
    calibrated: tuple[float, ...]
    fits: tuple[str, ...]

    @property
    def points(self) -> float:
        """Calibrated less uncalibrated, in points of MAPE, the mean of the draws (above 0: worse)."""
        return 100 * float(np.mean(np.subtract(self.calibrated, self.uncalibrated)))

    @property
    def worst_points(self) -> float:
        """The worst draw's calibrated less uncalibrated, in points."""
        return 100 * float(np.max(np.subtract(self.calibrated, self.uncalibrated)))

    @property
    def met(self) -> bool:
        """Whether the calibration is no worse than none by more than :data:`BAR_POINTS` points."""
        return self.points <= BAR_POINTS


def check_cell(rows: Sequence[MeasuredRow], parts: Sequence, gpu: str, precision: str, graph_of: Callable,
               model=None) -> tuple[list[float], list[float], list[str]]:
    """The uncalibrated and calibrated MAPE of each draw of :data:`ROWS` of ``rows`` on the rows it left out, by the
    operator model's timings ``parts`` of each row (:class:`~dippm_nas.cost.models.calibrated.LatencyParts`), and
    the fit each draw chose."""
    measured = np.array([r.latency_ms for r in rows])
    uncalibrated = np.array([scaled_latency_ms(p, np.ones(3)) for p in parts])
    before, after, fits = [], [], []
    for draw in range(DRAWS):
        chosen = sorted(random.Random(draw).sample(range(len(rows)), ROWS))
        rest = np.array([i for i in range(len(rows)) if i not in set(chosen)])
        fitted = calibrate([rows[i] for i in chosen], gpu, precision, "eager", "check", graph_of=graph_of,
                           say=lambda _: None, model=model)
        scales = np.array([fitted.gemm_scale, fitted.memory_scale, fitted.host_scale])
        calibrated = np.array([scaled_latency_ms(parts[i], scales) for i in rest])
        before.append(mape(uncalibrated[rest], measured[rest]))
        after.append(mape(calibrated, measured[rest]))
        fits.append(fitted.fit)
    return before, after, fits


def timm_cells(progress: Callable[[str], None]) -> list[Cell]:
    """Each GPU of timm's records, at its precision, by an operator model trained without the GPU's chip."""
    from dippm_nas.cost.models.calibrated import LatencyParts
    from dippm_nas.cost.pipeline.table import node_table
    from dippm_nas.graph.batching import scale_batch
    from dippm_nas.hardware.registry import get_device
    from dippm_nas.precisions import PRECISIONS
    from dippm_nas.request import Request
    from dippm_nas.training.dataset import load_graphs
    from dippm_nas.training.records import load_records

    records = [r for r in load_records() if r.latency_ms and r.device in TIMM_GPUS]
    graphs = load_graphs({r.graph_key for r in records})
    cells = []
    for gpu, precision in TIMM_GPUS.items():
        mine = [r for r in records if r.device == gpu and r.precision == precision and r.graph_key in graphs]
        mine = random.Random(0).sample(mine, min(TIMM_RECORDS, len(mine)))
        model = held_out_operator_model(gpu)
        request = Request(get_device(gpu), PRECISIONS[precision])
        scaled = [scale_batch(graphs[r.graph_key], r.batch) for r in mine]
        parts = [LatencyParts.of(model.timed(node_table(g), request)) for g in scaled]
        rows = [MeasuredRow(r.model, r.batch, r.latency_ms, r.image_size, r.precision) for r in mine]
        by_row = {(r.model, r.batch, r.input_size): g for r, g in zip(rows, scaled)}
        before, after, fits = check_cell(rows, parts, gpu, precision,
                                         lambda row, by_row=by_row: by_row[(row.model, row.batch, row.input_size)],
                                         model)
        batches = sorted({r.batch for r in mine})
        cells.append(Cell("timm", gpu, f"timm models, {precision}", f"{batches[0]}-{batches[-1]}", len(mine),
                          tuple(before), tuple(after), tuple(fits)))
        progress(_said(cells[-1]))
    return cells


def help_cells(n: int, progress: Callable[[str], None]) -> list[Cell]:
    """Each (space, GPU, batch) of HELP's latencies, ``n`` candidates of each space, by the shipped operator model."""
    from dippm_nas.cost.models.calibrated import LatencyParts
    from dippm_nas.cost.models.operators import OperatorCostModel
    from dippm_nas.cost.pipeline.table import node_table
    from dippm_nas.graph.batching import scale_batch
    from dippm_nas.hardware.registry import get_device
    from dippm_nas.integration import HardwareCostModel
    from dippm_nas.precisions import PRECISIONS
    from dippm_nas.request import Request
    from dippm_nas.training.nas_report import help_candidates

    candidates = help_candidates(n)
    featurizer = HardwareCostModel(batch=1, cost_model="analytical")
    graphs = {c.name: featurizer.graph(c.build()) for c in candidates}
    model = OperatorCostModel()
    cells = []
    for space in sorted({c.space for c in candidates}):
        mine = [c for c in candidates if c.space == space]
        for gpu, batch in sorted({k for c in mine for k in c.latency_ms}):
            scaled = {c.name: scale_batch(graphs[c.name], batch) for c in mine}
            request = Request(get_device(gpu), PRECISIONS["fp32"])
            parts = [LatencyParts.of(model.timed(node_table(scaled[c.name]), request)) for c in mine]
            rows = [MeasuredRow(c.name, batch, c.latency_ms[(gpu, batch)]) for c in mine]
            before, after, fits = check_cell(rows, parts, gpu, "fp32", lambda row, scaled=scaled: scaled[row.model],
                                             model)
            cells.append(Cell("HELP", gpu, f"{space}, fp32", str(batch), len(mine), tuple(before), tuple(after),
                              tuple(fits)))
            progress(_said(cells[-1]))
    return cells


def held_out_operator_model(gpu: str):
    """The operator model trained without ``gpu`` and the GPUs of its chip, kept under the cache directory's
    ``held-out`` folder (trained there, in a few minutes, where it is missing)."""
    from dippm_nas.cache.location import cache_dir
    from dippm_nas.cost.models.operators import OperatorCostModel
    from dippm_nas.training.operator_training import chip_of

    fold = chip_of(gpu)
    folder = (cache_dir() or Path(".")) / "held-out"
    path = folder / f"operators-without-{'+'.join(fold)}"
    if not (path.with_suffix(".json").exists() or path.exists()):
        from dippm_nas.training.operator_data import load_operator_samples
        from dippm_nas.training.operator_records import record_set, training_records
        from dippm_nas.training.operator_training import fit_without
        from dippm_nas.training.records import load_records

        print(f"training the operator model without {', '.join(fold)} (kept at {path})", file=sys.stderr)
        samples = load_operator_samples()
        records = record_set(training_records(load_records(), 0))
        folder.mkdir(parents=True, exist_ok=True)
        fit_without(fold, samples, records).save(path)
    return OperatorCostModel(path)


def _said(cell: Cell) -> str:
    return (f"{cell.data} {cell.gpu} {cell.workload} batch {cell.batch}: uncalibrated "
            f"{np.mean(cell.uncalibrated):.1%}, calibrated {np.mean(cell.calibrated):.1%} "
            f"({cell.points:+.2f} points, worst draw {cell.worst_points:+.2f})")


def write_calibration_report(cells: Sequence[Cell], docs: Path) -> Path:
    """``docs/calibration.md`` and ``docs/accuracy/calibration.json``; returns the Markdown file's path."""
    met = all(c.met for c in cells)
    worst = max(cells, key=lambda c: c.points)
    lines = [
        "# Does a calibration ever make predictions worse?", "",
        f"Written by `dippm-nas evaluate --calibration`. On every GPU of the measured data from outside the project "
        f"(timm's records of an RTX 3090 and an RTX 4090, HELP's NAS latencies of five GPUs), {DRAWS} draws of "
        f"{ROWS} rows each calibrate the operator model (`dippm-nas calibrate`'s fit), and the GPU's other rows are "
        "predicted with and without the calibration: the MAPEs below are on the rows each draw left out, their mean "
        "over the draws. The operator model is the shipped one on HELP's GPUs, which it never saw, and one trained "
        f"without the GPU's chip on timm's ({TIMM_RECORDS} records of each drawn). The bar: calibrated never worse "
        f"than uncalibrated by more than {BAR_POINTS} points (the mean of the draws) on any row of the table.", "",
        f"Bar {'met' if met else 'NOT met'}: the largest difference is {worst.points:+.2f} points ({worst.gpu}, "
        f"{worst.workload}, batch {worst.batch}).", "",
        "| data | GPU | workload | batch | rows | uncalibrated | calibrated | points (mean, worst draw) | fits chosen "
        "| bar |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        fits = ", ".join(f"{n}x {name}" for name, n in _counted(c.fits))
        lines.append(f"| {c.data} | {c.gpu} | {c.workload} | {c.batch} | {c.rows} | {np.mean(c.uncalibrated):.1%} | "
                     f"{np.mean(c.calibrated):.1%} | {c.points:+.2f}, {c.worst_points:+.2f} | {fits} | "
                     f"{'met' if c.met else 'NOT met'} |")
    path = docs / "calibration.md"
    path.write_text("\n".join(lines) + "\n")
    (docs / "accuracy").mkdir(exist_ok=True)
    (docs / "accuracy" / "calibration.json").write_text(json.dumps(
        {"rows": ROWS, "draws": DRAWS, "bar_points": BAR_POINTS, "met": met,
         "cells": [vars(c) | {"points": c.points, "worst_points": c.worst_points} for c in cells]}, indent=1) + "\n")
    return path


def _counted(names: Sequence[str]) -> list[tuple[str, int]]:
    return [(name, names.count(name)) for name in dict.fromkeys(names)]


def run(n: int = 100) -> Path:
    """Check every GPU and write the report."""
    warnings.filterwarnings("ignore")
    say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    return write_calibration_report([*help_cells(n, say), *timm_cells(say)], project().docs)
