"""What every cost model returns, and the registry that names them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Protocol

from dippm_nas.errors import DippmError, suggest
from dippm_nas.graph.model_graph import ModelGraph
from dippm_nas.hardware.registry import Device


@dataclass(frozen=True)
class NodeCost:
    """One operator's share of the latency: which resource bounds it, and for how long."""

    node: int
    op: str
    time_ms: float
    flops: int
    bytes: int
    bound: str  # "compute", "memory", "overhead" or "free" (a view)


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
    """A cost model's answer for one graph on one device at one precision."""

    latency_ms: float
    energy_j: float
    memory_mib: float
    cost_model: str
    memory: MemoryBreakdown | None = None
    nodes: tuple[NodeCost, ...] = field(default=(), repr=False)
    notes: tuple[str, ...] = ()

    def top_nodes(self, n: int = 10) -> list[NodeCost]:
        """The operators that dominate the latency."""
        return sorted(self.nodes, key=lambda c: c.time_ms, reverse=True)[:n]


class NotCovered(LookupError):
    """A cost model cannot answer this request (a device, precision or graph it was not trained for).

    :func:`dippm_nas.predict_graph` then falls back to the analytical model and says why.
    """


class CostModel(Protocol):
    """What every cost model offers: an :class:`Estimate` for one graph on one device at one precision.

    ``name`` is the name it is registered under (:func:`register_cost_model`). A model that cannot
    answer a request raises :class:`NotCovered` with the reason.
    """

    name: str

    def estimate(self, graph: ModelGraph, device: Device, precision: str, layout: str = "nchw") -> Estimate:
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


@dataclass(frozen=True)
class Prediction:
    """Latency, energy and memory of one inference of a batch, and the MIG slice that holds it.

    ``memory_mb`` is in MiB, the unit nvidia-smi and NVML print as "MB"; ``energy_j`` is per batch.
    ``cost_model`` says which model produced the numbers; ``notes`` say what to be careful about.
    """

    model: str
    latency_ms: float
    energy_j: float
    memory_mb: float
    mig_profile: str | None
    device: str
    precision: str
    batch: int
    cost_model: str
    layout: str = "nchw"
    mig_reason: str = ""
    gflops: float = 0.0
    params_m: float = 0.0
    notes: tuple[str, ...] = ()
    estimate: Estimate | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, object]:
        """The fields as plain JSON-ready values: ``notes`` as a list, the full ``estimate`` left out."""
        out = asdict(self)
        out.pop("estimate")
        out["notes"] = list(self.notes)
        return out
