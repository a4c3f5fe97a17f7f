"""What every cost model returns, and the registry that names them."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Protocol

from dippm_nas.cost.error_table import ErrorFigure
from dippm_nas.errors import DippmError, suggest
from dippm_nas.graph.model_graph import ModelGraph
from dippm_nas.hardware.registry import DEFAULT_LAYOUT, Device
from dippm_nas.modes import DEFAULT_MODE


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

    def scaled(self, factor: float) -> NodeCost:
        """The same operator with its time times ``factor``: what ``dataclasses.replace`` gives, in a third of
        its time, which counts where every operator of a graph is scaled."""
        return NodeCost(self.node, self.op, self.time_ms * factor, self.flops, self.bytes, self.bound, self.unit)


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
    """A cost model's answer for one graph on one device at one precision. ``answered_by`` is the name the
    model is registered under (``operators``, ``analytical``, ``pmgns``); ``cost_model`` says it for a
    reader, with what it learned (``pmgns (latency learned; ...)``)."""

    latency_ms: float
    energy_j: float
    memory_mib: float
    cost_model: str
    answered_by: str
    memory: MemoryBreakdown | None = None
    nodes: tuple[NodeCost, ...] = field(default=(), repr=False)
    notes: tuple[str, ...] = ()
    #: The cost model's latency error on comparable held-out records (:mod:`dippm_nas.cost.error_table`).
    error: ErrorFigure | None = None

    def top_nodes(self, n: int = 10) -> list[NodeCost]:
        """The operators that dominate the latency."""
        return sorted(self.nodes, key=lambda c: c.time_ms, reverse=True)[:n]


class NotCovered(DippmError, LookupError):
    """A cost model cannot answer this request (a device, precision or graph it was not trained for).

    Under the default (``auto``), :func:`dippm_nas.predict_graph` then falls back to the analytical model
    and says why; a model named explicitly raises it, and the CLI says it as one line.
    """


class CostModel(Protocol):
    """What every cost model offers: an :class:`Estimate` for one graph on one device at one precision.

    ``name`` is the name it is registered under (:func:`register_cost_model`). A model that cannot
    answer a request raises :class:`NotCovered` with the reason.
    """

    name: str

    def estimate(self, graph: ModelGraph, device: Device, precision: str, layout: str = DEFAULT_LAYOUT, *,
                 mode: str = DEFAULT_MODE, host: object = None) -> Estimate:
        """Latency, energy and memory of one inference of ``graph`` (at its batch) on ``device``."""
        ...


_COST_MODELS: dict[str, Callable[[], CostModel]] = {}


def register_cost_model(name: str, factory: Callable[[], CostModel]) -> None:
    """Make ``factory`` (called once per request) answer to ``name`` in :func:`get_cost_model`."""
    _COST_MODELS[name] = factory


def cost_model_names() -> list[str]:
    """The registered cost models' names, in registration order."""
    return list(_COST_MODELS)


def get_cost_model(name: str) -> CostModel:
    """The cost model registered as ``name``; an unknown name is an error that lists the known ones.

    >>> get_cost_model("analytical").name
    'analytical'
    """
    if name not in _COST_MODELS:
        raise DippmError(f"unknown cost model {name!r}; known: {', '.join(_COST_MODELS)}."
                         + suggest(name, _COST_MODELS))
    return _COST_MODELS[name]()


#: The unit of every number :meth:`Prediction.to_dict` gives, as its ``units`` entry says them.
UNITS: dict[str, str] = {
    "latency_ms": "ms for one inference of the whole batch",
    "energy_j": "J for one inference of the whole batch",
    "energy_j_per_sample": "J per input of the batch (energy_j / batch)",
    "memory_mib": "MiB (2**20 bytes) the process holds on the GPU, as NVML counts it (nvidia-smi prints it as MB)",
    "memory_mb": "deprecated alias of memory_mib, also in MiB",
    "memory_available_mib": "MiB of the device's memory (a MIG slice's usable memory)",
    "gflops": "GFLOPs for one inference of the whole batch",
    "params_m": "millions of parameters",
    "host": "the host profile whose per-operator dispatch time eager mode pays ('' under cuda-graphs)",
}


@dataclass(frozen=True)
class Prediction:
    """Latency, energy and memory of one inference of a batch, and the MIG slice that holds it.

    ``latency_ms`` and ``energy_j`` are for the whole batch (``energy_j_per_sample`` divides by it);
    ``memory_mib`` is in MiB, the unit nvidia-smi and NVML print as "MB". ``fits`` says whether that
    memory, plus the MIG margin, fits the device's (a slice's usable) ``memory_available_mib``: None
    only for a prediction built by hand. ``cost_model`` says which model produced the numbers,
    ``latency_error`` how far off it was on comparable held-out records, ``notes`` what to be careful about.

    >>> p = Prediction(model="m", latency_ms=2.0, energy_j=0.8, memory_mib=900.0, mig_profile="1g.5gb",
    ...                device="a100-40gb", precision="fp32", batch=8, cost_model="analytical")
    >>> p.energy_j_per_sample, p.to_dict()["units"]["memory_mib"].split(" ")[0]
    (0.1, 'MiB')
    """

    model: str
    latency_ms: float
    energy_j: float
    memory_mib: float
    mig_profile: str | None
    device: str
    precision: str
    batch: int
    cost_model: str
    layout: str = DEFAULT_LAYOUT
    #: The registered name of the cost model that answered (``operators``, ``analytical``, ``pmgns``).
    answered_by: str = ""
    mig_reason: str = ""
    gflops: float = 0.0
    params_m: float = 0.0
    notes: tuple[str, ...] = ()
    fits: bool | None = None
    memory_available_mib: float | None = None
    latency_error: ErrorFigure | None = None
    #: How the forward pass is issued: ``eager`` (from the host, ``host`` names its profile) or ``cuda-graphs``.
    mode: str = DEFAULT_MODE
    host: str = ""
    estimate: Estimate | None = field(default=None, repr=False, compare=False)

    @property
    def memory_mb(self) -> float:
        """Deprecated alias of :attr:`memory_mib` (the value always was MiB); it goes in the next version."""
        warnings.warn("Prediction.memory_mb is deprecated: the value is in MiB, read Prediction.memory_mib",
                      DeprecationWarning, stacklevel=2)
        return self.memory_mib

    @property
    def energy_j_per_sample(self) -> float:
        """Energy per input: :attr:`energy_j` (the whole batch's) over the batch."""
        return self.energy_j / self.batch

    def to_dict(self) -> dict[str, object]:
        """The fields as plain JSON-ready values: ``notes`` as a list, the full ``estimate`` left out,
        ``energy_j_per_sample`` and the deprecated ``memory_mb`` (= ``memory_mib``) added, and a ``units``
        entry naming the unit of each number."""
        out: dict[str, object] = {}
        for f in fields(self):
            if f.name == "estimate":
                continue
            key = f.name
            out[key] = getattr(self, key)
            if key == "energy_j":
                out["energy_j_per_sample"] = self.energy_j_per_sample
            elif key == "memory_mib":
                out["memory_mb"] = self.memory_mib
        out["notes"] = list(self.notes)
        out["latency_error"] = self.latency_error.to_dict() if self.latency_error else None
        out["units"] = dict(UNITS)
        return out


def _accept_memory_mb(init: Callable[..., None]) -> Callable[..., None]:
    """Let ``Prediction(memory_mb=...)`` keep working for one version, with a DeprecationWarning."""

    @functools.wraps(init)
    def __init__(self, *args, memory_mb: float | None = None, **kwargs) -> None:  # noqa: N807
        if memory_mb is not None:
            warnings.warn("Prediction(memory_mb=...) is deprecated: pass memory_mib (the value is in MiB)",
                          DeprecationWarning, stacklevel=2)
            kwargs.setdefault("memory_mib", memory_mb)
        init(self, *args, **kwargs)

    return __init__


Prediction.__init__ = _accept_memory_mb(Prediction.__init__)  # type: ignore[method-assign]
