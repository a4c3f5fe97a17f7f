"""The operator model, the default: every operator's kernel timed by the learned operator model on the target GPU,
the whole through the host queue, energy and memory as the analytical model has them.

A composition of stages: the roofline (:mod:`~dippm_nas.cost.pipeline.roofline`), the kernel times with the
roofline's floor (:mod:`~dippm_nas.cost.pipeline.kernel_times`), the host queue (eager at small batches waits
on the host, under CUDA graphs it does not), then memory and energy (:mod:`~dippm_nas.cost.pipeline.summary`),
which learned times do not change but through the latency.

>>> import dippm_nas
>>> graph, request, _ = dippm_nas.Request.of("a100-40gb").resolved(dippm_nas.build_graph("resnet18", batch=8))
>>> estimate = OperatorCostModel().estimate(graph, request)
>>> estimate.answered_by, len(estimate.top_nodes(5))
('operators', 5)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from dippm_nas.cost.error_table import lookup
from dippm_nas.cost.estimate import Estimate, NotCovered
from dippm_nas.cost.learned.card import OPERATOR_WEIGHTS, load_card, operator_model_mismatch
from dippm_nas.cost.pipeline.fusion import compile_note, compiled_many, eager_request
from dippm_nas.cost.pipeline.host_queue import issue_seconds
from dippm_nas.cost.pipeline.kernel_times import kernel_times_many
from dippm_nas.cost.pipeline.roofline import roofline
from dippm_nas.cost.pipeline.summary import Timed, summarize
from dippm_nas.cost.pipeline.table import NodeTable, node_table
from dippm_nas.graph.model_graph import ModelGraph
from dippm_nas.request import Request


class OperatorCostModel:
    """The analytical model's stages with each operator's kernel timed by the learned operator model at ``path``.

    It declines (:class:`~dippm_nas.cost.estimate.NotCovered`) where there is no trained model or its card does
    not match this version's features, with what to run to retrain it.
    """

    name = "operators"

    def __init__(self, path: Path = OPERATOR_WEIGHTS):
        self.path = path

    def covers(self, request: Request) -> str | None:
        """None where a trained model whose features this version computes is at the path, else why not (from its
        card alone: no torch); the same for every request."""
        return operator_model_mismatch(self.path)

    def gpus_in_training(self) -> frozenset[str]:
        """The GPUs whose operators or whole-model records the model learned from."""
        card = load_card(self.path)
        return card.gpus_in_training if card else frozenset()

    def timed(self, table: NodeTable, request: Request, reuse: Timed | None = None) -> Timed:
        """Every operator's GPU seconds, its kernel timed by the operator model, and the host's time to issue it;
        ``reuse``: an operator-model timing of the same graph, GPU and precision, whose network output it reads
        again. Raises NotCovered where the model cannot answer."""
        learned = reuse.kernels.learned_s if reuse is not None and reuse.kernels is not None else None
        return self.timed_many([table], request, None if learned is None else [learned])[0]

    def timed_many(self, tables: Sequence[NodeTable], request: Request,
                   learned_s: Sequence[np.ndarray] | None = None) -> list[Timed]:
        """:meth:`timed` of several graphs, the network run once over all their operators."""
        from dippm_nas.cost.learned.operator_network import load

        reason = self.covers(request)
        if reason:
            raise NotCovered(reason)
        if request.compiled:  # each graph's library calls at the layout Inductor chooses for it, then its kernels
            by_layout: dict[str, tuple[Request, list[int]]] = {}
            for i, table in enumerate(tables):
                library = eager_request(table, request)
                by_layout.setdefault(library.layout, (library, []))[1].append(i)
            eager: list[Timed] = [None] * len(tables)  # type: ignore[list-item]
            for library, indices in by_layout.values():
                for i, timed in zip(indices, self.timed_many([tables[i] for i in indices], library)):
                    eager[i] = timed
            return compiled_many(eager, request, load(self.path).seconds)
        bounds = [roofline(table, request) for table in tables]
        times = kernel_times_many(tables, bounds, request, load(self.path), learned_s)
        return [Timed(table, request, b, t.seconds, issue_seconds(table, request), t)
                for table, b, t in zip(tables, bounds, times)]

    def finished(self, graph: ModelGraph, timed: Timed, request: Request) -> Estimate:
        """The estimate of ``timed``, with the notes of which data backs it and its latency error."""
        estimate = summarize(graph, timed, request, self.name)
        compiled_note = (compile_note(timed),) if request.compiled else ()
        estimate = replace(estimate, notes=estimate.notes + compiled_note + self.notes(request))
        if estimate.latency_ms <= 0:
            return estimate
        return replace(estimate, error=lookup(self.name, request.gpu, request.precision, graph.batch))

    def estimate(self, graph: ModelGraph, request: Request) -> Estimate:
        """Latency, energy and memory of one inference of ``graph`` at its batch, with each operator's time."""
        return self.finished(graph, self.timed(node_table(graph), request), request)

    def estimate_many(self, graphs: Sequence[ModelGraph], request: Request) -> list[Estimate]:
        """:meth:`estimate` of each graph, the network run once over all their operators."""
        timed = self.timed_many([node_table(graph) for graph in graphs], request)
        return [self.finished(graph, t, request) for graph, t in zip(graphs, timed)]

    def notes(self, request: Request) -> tuple[str, ...]:
        """Which data backs the operators' units at this precision and on this GPU."""
        card = load_card(self.path).raw
        trained = card["trained_on"]
        gpu = request.gpu.whole_gpu().key
        notes = []
        if request.gpu.slice_of:
            notes.append(f"MIG slice {request.gpu.slice_of}: no slice was measured; its operators are timed on the "
                         "slice's SMs and its share of the memory bandwidth")
        if gpu not in trained:
            notes.append(f"no operator of {gpu} was measured: the operator model reads its spec sheet (SMs, clock, "
                         f"peaks, bandwidth, L2, TDP, process, generation); docs/operators.md gives its error on GPUs "
                         "held out of its training")
        precision = request.precision
        if precision.half_dtype or precision.tf32["cublas"] or precision.tf32["cudnn"]:
            # the operator sweeps name operators by the registry's kinds, NeuSight's fp32 corpus by its own
            swept = sorted(g for g, ops in trained.items() if any(op in ops for op in ("mm", "sdpa")))
            records = ", ".join(sorted(card["records"]))
            notes.append(f"tensor-core operators are learned from the operator sweeps of {', '.join(swept) or 'no GPU'}"
                         f" and the whole-model records of {records} only; fp32 operators on the CUDA cores from "
                         "NeuSight's corpus of five GPUs as well")
        return tuple(notes)
