"""The analytical cost model: the roofline of every operator through the host queue, liveness memory and the
spec sheet's power; no parameters to train.

It needs only a spec sheet, so it answers for every GPU of the registry and its MIG slices (never
:class:`~dippm_nas.cost.estimate.NotCovered`). It gets the physics right (what is compute-bound, what is
memory-bound, what a slice or a precision changes) but assumes every kernel reaches the peak of its unit; the
operator model times the kernels instead (:mod:`dippm_nas.cost.models.operators`).

>>> import dippm_nas
>>> graph, request, _ = dippm_nas.Request.of("a100-40gb").resolved(dippm_nas.build_graph("resnet18", batch=8))
>>> estimate = AnalyticalCostModel().estimate(graph, request)
>>> estimate.answered_by, 0 < estimate.latency_ms < 100, estimate.memory.weights_mib < estimate.memory_mib
('analytical', True, True)
>>> estimate.top_nodes(1)[0].op
'nn.conv2d'
"""

from __future__ import annotations

from dataclasses import replace

from dippm_nas.cost.error_table import lookup
from dippm_nas.cost.estimate import Estimate, OneAtATime
from dippm_nas.cost.pipeline.fusion import compile_note, compiled, eager_request
from dippm_nas.cost.pipeline.host_queue import issue_seconds
from dippm_nas.cost.pipeline.roofline import roofline
from dippm_nas.cost.pipeline.summary import Timed, summarize
from dippm_nas.cost.pipeline.table import NodeTable, node_table
from dippm_nas.graph.model_graph import ModelGraph
from dippm_nas.request import Request


class AnalyticalCostModel(OneAtATime):
    """The roofline, the host queue, the memory and the energy stages; answers every request."""

    name = "analytical"

    def covers(self, request: Request) -> str | None:
        """None: the roofline answers every request."""
        return None

    def timed(self, table: NodeTable, request: Request, reuse: Timed | None = None) -> Timed:
        """Every operator at its roofline time, and the host's time to issue it (``reuse``: nothing of another
        timing is worth reusing)."""
        if request.compiled:  # the library calls at the layout Inductor chooses, the fused kernels' rooflines
            return compiled(self.timed(table, eager_request(table, request)), request)
        bounds = roofline(table, request)
        return Timed(table, request, bounds, bounds.time_s, issue_seconds(table, request))

    def estimate(self, graph: ModelGraph, request: Request) -> Estimate:
        """Latency, energy and memory of one inference of ``graph`` at its batch, with per-operator costs, and
        (``error``) the model's latency error on the measured records most like the request
        (:mod:`dippm_nas.cost.error_table`)."""
        timed = self.timed(node_table(graph), request)
        estimate = summarize(graph, timed, request, self.name)
        if request.compiled:
            estimate = replace(estimate, notes=estimate.notes + (compile_note(timed),))
        if estimate.latency_ms <= 0:  # nothing runs: no latency to be wrong about
            return estimate
        return replace(estimate, error=lookup(self.name, request.gpu, request.precision, graph.batch))
