"""What a prediction answers: :class:`Prediction`, the predict stage's output, with the unit of every number."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from dippm_nas.cost.error_table import ErrorFigure
from dippm_nas.cost.estimate import Estimate
from dippm_nas.hardware.registry import DEFAULT_LAYOUT
from dippm_nas.modes import DEFAULT_MODE

#: The unit of every number :meth:`Prediction.to_dict` gives, as its ``units`` entry says them.
UNITS: dict[str, str] = {
    "latency_ms": "ms for one inference of the whole batch",
    "energy_j": "J for one inference of the whole batch",
    "energy_j_per_sample": "J per input of the batch (energy_j / batch)",
    "memory_mib": "MiB (2**20 bytes) the process holds on the GPU, as NVML counts it (nvidia-smi prints it as MB)",
    "memory_available_mib": "MiB of the device's memory (a MIG slice's usable memory)",
    "gflops": "GFLOPs for one inference of the whole batch",
    "params_m": "millions of parameters",
    "host": "the host profile whose issue time eager mode pays per operator and compile per kernel ('' under "
            "cuda-graphs and compile-cudagraphs)",
    "host_share": "the host's time to issue the operators as a fraction of the latency (0 where the pass is "
                  "replayed as a CUDA graph)",
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
    #: The registered name of the cost model that answered (``operators``, ``analytical``, ``residual``, ...).
    answered_by: str = ""
    mig_reason: str = ""
    gflops: float = 0.0
    params_m: float = 0.0
    notes: tuple[str, ...] = ()
    fits: bool | None = None
    memory_available_mib: float | None = None
    latency_error: ErrorFigure | None = None
    #: How the forward pass is issued: ``eager`` (from the host, ``host`` names its profile), ``cuda-graphs``,
    #: ``compile`` (each compiled kernel from the host) or ``compile-cudagraphs`` (the compiled kernels replayed).
    mode: str = DEFAULT_MODE
    host: str = ""
    #: The host's time to issue the operators over the latency: near 1 the latency is the host's, the same for
    #: models whose GPU work differs (:attr:`Estimate.host_share`).
    host_share: float = 0.0
    estimate: Estimate | None = field(default=None, repr=False, compare=False)

    @property
    def energy_j_per_sample(self) -> float:
        """Energy per input: :attr:`energy_j` (the whole batch's) over the batch."""
        return self.energy_j / self.batch

    def to_dict(self) -> dict[str, object]:
        """The fields as plain JSON-ready values: ``notes`` as a list, the full ``estimate`` left out,
        ``energy_j_per_sample`` added, and a ``units`` entry naming the unit of each number."""
        out: dict[str, object] = {}
        for f in fields(self):
            if f.name == "estimate":
                continue
            out[f.name] = getattr(self, f.name)
            if f.name == "energy_j":
                out["energy_j_per_sample"] = self.energy_j_per_sample
        out["notes"] = list(self.notes)
        out["latency_error"] = self.latency_error.to_dict() if self.latency_error else None
        out["units"] = dict(UNITS)
        return out
