"""The last stages: a graph's operators, timed for one request, composed into one :class:`Estimate` through the
host queue, the memory and the energy stages, with the notes of what was priced."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, partial

import numpy as np

from dippm_nas.cost.estimate import BOUNDS, Estimate, MemoryBreakdown, OperatorCosts
from dippm_nas.cost.pipeline.host_queue import queued_latency
from dippm_nas.cost.pipeline.kernel_times import KernelTimes
from dippm_nas.cost.pipeline.memory import memory
from dippm_nas.cost.pipeline.notes import host_bound_notes, precision_note
from dippm_nas.cost.pipeline.power import energy_j, spec_powers
from dippm_nas.cost.pipeline.roofline import Roofline, runtime_key, units
from dippm_nas.cost.pipeline.table import NodeTable
from dippm_nas.graph.model_graph import ModelGraph
from dippm_nas.request import Request


@dataclass(frozen=True, eq=False)
class Timed:
    """One graph's operators priced for one request: the table, the request, the roofline, each operator's GPU
    seconds as the cost model times it, and the host's seconds to issue it; ``kernels``: the operator model's times
    where it timed them. What the queue, the energy, the notes and the learned models read."""

    table: NodeTable
    request: Request
    roofline: Roofline
    gpu_s: np.ndarray
    host_s: np.ndarray
    kernels: KernelTimes | None = None

    @cached_property
    def latency_s(self) -> float:
        """GPU time plus what the GPU waits on the host (:func:`~dippm_nas.cost.pipeline.host_queue.queued_latency`)."""
        return float(queued_latency(self.host_s, [self.gpu_s]))

    def latency_curve(self, log_ratios: np.ndarray) -> np.ndarray:
        """The log of the latency (ms) were every operator's GPU time ``exp(log_ratio)`` times this one's and the
        host's unchanged: what a learned correction of the GPU's time gives."""
        return np.log(queued_latency(self.host_s, [self.gpu_s], gpu_scales=[np.exp(log_ratios)]) * 1e3)

    def host_share(self) -> float:
        """The host's time to issue the operators over the latency (none where nothing runs)."""
        return float(self.host_s.sum()) / self.latency_s if self.latency_s else 0.0

    def host_wait_share(self) -> float:
        """The fraction of the latency the GPU waits on the host (none where nothing runs)."""
        if not self.latency_s:
            return 0.0
        return max(0.0, 1.0 - float(self.gpu_s.sum()) / self.latency_s)

    def prices(self, table: NodeTable, request: Request) -> bool:
        """Whether this timing is the one ``request`` would give of ``table``: the same GPU, precision, layout and
        execution, and a PyTorch runtime that prices the graph alike (:func:`~.roofline.runtime_key`)."""
        mine = self.request
        return (table is self.table and mine.gpu == request.gpu and mine.precision is request.precision
                and (mine.layout, mine.mode, mine.host) == (request.layout, request.mode, request.host)
                and runtime_key(table, mine.runtime) == runtime_key(table, request.runtime))

    def share(self, bound: str) -> float:
        """The fraction of the GPU's time spent in operators the roofline finds bound by ``bound``."""
        total = float(self.gpu_s.sum()) or 1e-12
        return float(self.gpu_s[self.roofline.bound == BOUNDS.index(bound)].sum()) / total


def summarize(graph: ModelGraph, timed: Timed, request: Request, name: str,
              powers: tuple[float, float] | None = None, held: MemoryBreakdown | None = None) -> Estimate:
    """The estimate ``name`` answers from ``timed``: its queued latency, the energy at ``powers`` (idle and busy
    watts; the spec sheet's where None), the memory ``held`` (the memory stage's where None), each operator's cost
    and the notes of what was priced."""
    table, roofline, precision = timed.table, timed.roofline, request.precision
    latency_s = timed.latency_s
    energy = energy_j(latency_s, float(roofline.busy_s.sum()), *(powers or spec_powers(request.gpu)))
    held = held or memory(table, precision, request.runtime)
    notes = precision_note(table, roofline.peak, request) + host_bound_notes(
        timed.host_wait_share(), int((~table.is_view).sum()), request.host, precision.autocast)
    return Estimate(latency_ms=latency_s * 1e3, energy_j=energy, memory_mib=held.total_mib, cost_model=name,
                    answered_by=name, memory=held, notes=notes, host_share=timed.host_share(),
                    operators=OperatorCosts(graph, timed.gpu_s * 1e3, roofline.moved, roofline.bound,
                                            partial(units, table, roofline.peak, request)))
