"""The calibrated cost model: the operator model fitted to a user's own measurements of their GPU and host.

It answers a request that carries a calibration (``dippm-nas calibrate``'s file, :mod:`dippm_nas.calibration`):
the operator model's stages with the GEMM-class kernels' and the other kernels' times scaled, the host's issue
times scaled (the request's host is the calibration's, fitted: :meth:`dippm_nas.Request.of`), the idle and busy
power and the memory outside the allocator and its reserve fitted where the rows measured them; its latency
error is the calibration's leave-one-out error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from dippm_nas.calibration import Calibration
from dippm_nas.cost.error_table import CALIBRATION_GROUP, ErrorFigure
from dippm_nas.cost.estimate import Estimate, MemoryBreakdown, NotCovered
from dippm_nas.cost.models.operators import OperatorCostModel
from dippm_nas.cost.pipeline.host_queue import queued_latency
from dippm_nas.cost.pipeline.memory import memory
from dippm_nas.cost.pipeline.summary import Timed, summarize
from dippm_nas.cost.pipeline.table import NodeTable, node_table
from dippm_nas.cost_model_names import CALIBRATED
from dippm_nas.graph.model_graph import ModelGraph
from dippm_nas.request import Request


class CalibratedCostModel:
    """The operator model (``operators``: at its shipped weights by default) scaled by the request's calibration."""

    name = CALIBRATED

    def __init__(self, operators: OperatorCostModel | None = None):
        self.operators = operators or OperatorCostModel()

    def covers(self, request: Request) -> str | None:
        """Why it cannot answer ``request`` (no calibration, or no operator model), else None."""
        if request.calibration is None:
            return "no calibration was given: `dippm-nas calibrate` writes one from your own measurements"
        return self.operators.covers(request)

    def timed_many(self, tables: Sequence[NodeTable], request: Request) -> list[Timed]:
        """The operator model's timings with every kernel's time scaled as the calibration fitted it (the host's is
        the request's, fitted already)."""
        reason = self.covers(request)
        if reason:
            raise NotCovered(reason)
        return [replace(base, gpu_s=scaled_times(request.calibration, base.gpu_s, base.kernels.gemm_class))
                for base in self.operators.timed_many(tables, request)]

    def estimate(self, graph: ModelGraph, request: Request) -> Estimate:
        """Latency, energy and memory of one inference of ``graph`` on the user's GPU and host, fitted."""
        return self.estimate_many([graph], request)[0]

    def estimate_many(self, graphs: Sequence[ModelGraph], request: Request) -> list[Estimate]:
        """:meth:`estimate` of each graph, the operator network run once over all their operators."""
        timed = self.timed_many([node_table(graph) for graph in graphs], request)
        return [self.finished(graph, t, request) for graph, t in zip(graphs, timed)]

    def finished(self, graph: ModelGraph, timed: Timed, request: Request) -> Estimate:
        """The estimate of a calibrated timing: the fitted power and memory, the calibration's error."""
        calibration = request.calibration
        held = calibrated_memory(calibration, memory(timed.table, request.precision, request.runtime))
        estimate = summarize(graph, timed, request, self.name, powers=calibration.powers(request.gpu), held=held)
        notes = estimate.notes + self.operators.notes(request) + (calibration.note(),) + _batch_note(calibration,
                                                                                                     graph.batch)
        estimate = replace(estimate, notes=notes)
        return estimate if estimate.latency_ms <= 0 else replace(estimate, error=calibration_error(calibration))


@dataclass(frozen=True, eq=False)
class LatencyParts:
    """What a calibration scales of one graph's operator-model timing, per operator in issue order: the GPU seconds
    of the GEMM-class kernels (0 for the others), of the other kernels (0 for GEMM-class ones), and the host's
    seconds to issue it; and the roofline's busy seconds, which the energy reads."""

    gemm_s: np.ndarray
    other_s: np.ndarray
    host_s: np.ndarray
    busy_s: float = 0.0

    @classmethod
    def of(cls, timed: Timed) -> LatencyParts:
        """The parts of an operator-model timing."""
        gemm = timed.kernels.gemm_class
        return cls(np.where(gemm, timed.gpu_s, 0.0), np.where(gemm, 0.0, timed.gpu_s), timed.host_s,
                   float(timed.roofline.busy_s.sum()))

    def latency_s(self, gemm_scale: np.ndarray, memory_scale: np.ndarray, host_scale: np.ndarray) -> np.ndarray:
        """The queued latency for each set of scales (one array each, of the same length)."""
        return queued_latency(self.host_s, [self.gemm_s, self.other_s], host_scale, [gemm_scale, memory_scale])


#: A batch this many times below the calibration's smallest row's, or above its largest's, is said to be far from
#: the rows: at small batches the host binds, at large ones the GPU's kernels, and the rows may not have told
#: the scales of the other regime.
FAR_BATCH = 4


def _batch_note(calibration: Calibration, batch: int) -> tuple[str, ...]:
    """A note where ``batch`` is far from the batches the calibration's rows measured."""
    batches = [r.batch for r in calibration.rows]
    low, high = min(batches), max(batches)
    if low / FAR_BATCH <= batch <= high * FAR_BATCH:
        return ()
    return (f"the calibration's rows measured batch {low}-{high}, far from this prediction's {batch}: its scales "
            "were fitted where another part of the time (the host's or the kernels') binds; calibrate with rows near "
            "this batch to trust it here",)


def scaled_times(calibration: Calibration, seconds: np.ndarray, gemm_class: np.ndarray) -> np.ndarray:
    """Each operator's GPU seconds with the GEMM-class kernels and the others scaled."""
    return seconds * np.where(gemm_class, calibration.gemm_scale, calibration.memory_scale)


def calibrated_memory(calibration: Calibration, breakdown: MemoryBreakdown) -> MemoryBreakdown:
    """``breakdown`` with the fitted memory outside the allocator (its context and modules in their proportion)
    and the allocator's reserve scaled; unchanged where the rows fitted no memory."""
    if calibration.runtime_mib is None or calibration.reserve_scale is None:
        return breakdown
    share = calibration.runtime_mib / (breakdown.context_mib + breakdown.modules_mib)
    scale = calibration.reserve_scale
    return replace(breakdown, context_mib=breakdown.context_mib * share, modules_mib=breakdown.modules_mib * share,
                   activations_mib=breakdown.activations_mib * scale, workspace_mib=breakdown.workspace_mib * scale,
                   allocator_mib=breakdown.allocator_mib * scale)


def memory_terms(breakdown: MemoryBreakdown, counts_modules: bool = True) -> tuple[float, float, float]:
    """The three terms (MiB) of a measured memory that a calibration weighs apart: the runtime's memory outside
    the allocator (the context, and the kernels' modules where the measure counts them: NVML's figure for the
    process does, the harness's first protocol's context plus reserved does not), the weights, and the
    allocator's reserve beyond the weights."""
    runtime = breakdown.context_mib + (breakdown.modules_mib if counts_modules else 0.0)
    reserve = breakdown.activations_mib + breakdown.workspace_mib + breakdown.allocator_mib
    return runtime, breakdown.weights_mib, reserve


def calibration_error(calibration: Calibration) -> ErrorFigure:
    """The leave-one-out errors, as the latency (energy, memory) error a calibrated prediction cites."""
    batches = [r.batch for r in calibration.rows]
    metered = sum(1 for r in calibration.rows if (r.energy_j is not None and calibration.idle_w is not None)
                  or (r.memory_mib is not None and calibration.runtime_mib is not None))
    return ErrorFigure(cost_model=calibration.cost_model, mape=calibration.left_out_mape,
                       median_ape=calibration.left_out_median, records=len(calibration.rows), group=CALIBRATION_GROUP,
                       devices=(calibration.device,), precisions=(calibration.precision,), batch_min=min(batches),
                       batch_max=max(batches), energy_mape=calibration.energy_left_out_mape,
                       memory_mape=calibration.memory_left_out_mape, target_records=metered)
