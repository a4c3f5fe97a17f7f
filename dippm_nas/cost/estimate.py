"""What every cost model returns (:class:`Estimate`), and the one signature they share (:class:`CostModel`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Protocol

import numpy as np

from dippm_nas.cost.error_table import ErrorFigure
from dippm_nas.errors import DippmError
from dippm_nas.graph.model_graph import ModelGraph
from dippm_nas.request import Request

#: What bounds an operator, as :class:`NodeCost` names it; a cost model's columns hold an index into it.
BOUNDS = ("compute", "memory", "overhead", "free")


@dataclass(frozen=True)
class NodeCost:
    """One operator's share of the latency: which resource bounds it, and for how long."""

    node: int
    op: str
    time_ms: float
    flops: int
    bytes: int
    bound: str  # "compute", "memory", "overhead" or "free" (a view)
    unit: str = ""  # what runs its arithmetic: "tensor cores (TF32)", "CUDA cores (FP32)"...; "" for a view


@dataclass(frozen=True, eq=False)
class OperatorCosts:
    """Every operator's time, bytes moved and bound as columns in graph order, and what names the unit each runs
    on: a prediction makes the :class:`NodeCost` objects, and names the units, only where someone reads them
    (:attr:`Estimate.nodes`)."""

    graph: ModelGraph
    time_ms: np.ndarray
    moved: np.ndarray
    bound: np.ndarray  # index into BOUNDS
    units: Callable[[], np.ndarray]  # each operator's unit, a Python string

    def scaled(self, factor: float) -> OperatorCosts:
        """The same operators with every time times ``factor``."""
        return OperatorCosts(self.graph, self.time_ms * factor, self.moved, self.bound, self.units)

    def costs(self) -> tuple[NodeCost, ...]:
        """One :class:`NodeCost` an operator."""
        return tuple(NodeCost(n.id, n.op, t, n.flops, int(m), BOUNDS[b], u) for n, t, m, b, u in zip(
            self.graph.nodes, self.time_ms.tolist(), self.moved.tolist(), self.bound.tolist(), self.units().tolist()))


@dataclass(frozen=True)
class MemoryBreakdown:
    """What one inference holds on the GPU, in MiB, split by what holds it.

    ``context_mib`` is the CUDA context and libraries' handles, outside PyTorch's caching allocator;
    ``modules_mib`` what the model's own kernels load on top of it (CUDA lazy module loading, the
    libraries' per-algorithm state), also outside the allocator; ``activations_mib`` the live tensors at
    their peak; ``allocator_mib`` the allocator's rounding and fragmentation on top of the live bytes.
    """

    context_mib: float
    weights_mib: float
    activations_mib: float
    workspace_mib: float
    allocator_mib: float = 0.0  # the caching allocator's segments beyond the live bytes at the peak
    modules_mib: float = 0.0

    @property
    def total_mib(self) -> float:
        """The whole footprint of the process as NVML counts it: what a MIG slice or a GPU must have free."""
        return self.context_and_reserved_mib + self.modules_mib

    @property
    def context_and_reserved_mib(self) -> float:
        """The context plus the allocator's peak reserved memory, without the kernels' modules: what the
        harness's ``memory_total_mib`` column measures (its context is taken with two tiny kernels)."""
        return self.context_mib + self.weights_mib + self.activations_mib + self.workspace_mib + self.allocator_mib


@dataclass(frozen=True)
class Estimate:
    """A cost model's answer for one graph and one request. ``answered_by`` is the name the model is registered
    under (``operators``, ``analytical``, ``residual``, ...); ``cost_model`` says it for a reader, with what it
    learned (``pmgns (latency learned; ...)``). ``operators`` holds each operator's time where the model times
    them (PMGNS corrects the total only); :attr:`nodes` reads them as objects."""

    latency_ms: float
    energy_j: float
    memory_mib: float
    cost_model: str
    answered_by: str
    memory: MemoryBreakdown | None = None
    operators: OperatorCosts | None = field(default=None, repr=False)
    notes: tuple[str, ...] = ()
    #: The cost model's latency error on comparable held-out records (:mod:`dippm_nas.cost.error_table`).
    error: ErrorFigure | None = None
    #: The host's time to issue the operators over the latency (0 under CUDA graphs): near 1 the host sets the
    #: latency, and what the GPU's work would tell apart hardly shows.
    host_share: float = 0.0

    @cached_property
    def nodes(self) -> tuple[NodeCost, ...]:
        """Each operator's cost, in graph order; empty where the model times no operator."""
        return self.operators.costs() if self.operators is not None else ()

    def top_nodes(self, n: int = 10) -> list[NodeCost]:
        """The ``n`` operators that take the most time (1 or more)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise DippmError(f"top_nodes takes how many of the slowest operators to list, a whole number of 1 or "
                             f"more, not {n!r}.")
        return sorted(self.nodes, key=lambda c: c.time_ms, reverse=True)[:n]


class NotCovered(DippmError, LookupError):
    """A cost model cannot answer this request (a device, precision or graph it was not trained for).

    Under the default (``auto``) another model answers and the prediction says why; a model named explicitly
    raises it, and the command line says it as one line.
    """


class CostModel(Protocol):
    """What every cost model offers: an :class:`Estimate` for one graph and one resolved request, and for many
    graphs on one request (a population of candidates, each estimated as it would be alone).

    ``name`` is the name it is registered under (:func:`~dippm_nas.cost.register_cost_model`); a model of your own
    may leave :meth:`estimate_many` out (or inherit :class:`OneAtATime`'s). A graph is one the request resolved
    (:meth:`dippm_nas.Request.resolved`: cast to its precision, which is then set). A model that cannot answer
    raises :class:`NotCovered` with the reason, which :meth:`covers` gives beforehand.
    """

    name: str

    def covers(self, request: Request) -> str | None:
        """None where the model answers ``request``, else why not."""
        ...

    def estimate(self, graph: ModelGraph, request: Request) -> Estimate:
        """Latency, energy and memory of one inference of ``graph`` (at its batch) as ``request`` asks."""
        ...

    def estimate_many(self, graphs: Sequence[ModelGraph], request: Request) -> list[Estimate]:
        """:meth:`estimate` of each graph, equal to it."""
        ...


class OneAtATime:
    """A cost model whose estimates of many graphs are its estimates of each, one after another: where batching
    them would save nothing worth its code."""

    def estimate_many(self, graphs: Sequence[ModelGraph], request: Request) -> list[Estimate]:
        """:meth:`estimate` of each graph."""
        return [self.estimate(graph, request) for graph in graphs]
