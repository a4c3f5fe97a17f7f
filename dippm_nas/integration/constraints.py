"""Predictions on Optuna trials: user attributes to read, constraints to obey.

Optuna 5 constraints are set per trial with ``trial.set_constraint(key, value)``; a trial is
feasible when every value is <= 0. Each bound here becomes ``predicted - bound``, so the value also
says by how much a candidate misses.
"""

from __future__ import annotations

from dataclasses import dataclass

from dippm_nas.cost.base import Prediction
from dippm_nas.errors import DippmError
from dippm_nas.hardware.mig import DEFAULT_MIG_MARGIN, required_memory
from dippm_nas.hardware.registry import Device, get_device

#: The user attributes a scored trial carries (Optuna's dashboard shows them); ``notes`` say which cost
#: model answered and how far the candidate is from what it learned from.
PREDICTION_ATTRS = ("latency_ms", "energy_j", "memory_mb", "mig_profile", "device", "precision", "batch",
                    "cost_model", "notes")


def record_prediction(trial, prediction: Prediction) -> None:
    """Put the prediction's :data:`PREDICTION_ATTRS` on ``trial`` as user attributes (tuples as lists)."""
    for name in PREDICTION_ATTRS:
        value = getattr(prediction, name)
        trial.set_user_attr(name, list(value) if isinstance(value, tuple) else value)


@dataclass(frozen=True)
class HardwareConstraints:
    """Upper bounds on predicted cost; ``mig_profiles`` are the slices a candidate may run in.

    A bound left at None is not checked. Latency is in ms, energy in J per batch, memory in MiB; a
    candidate fits a slice when its memory plus ``mig_margin`` does. An unknown device or profile is a
    DippmError that lists the known ones.

    >>> HardwareConstraints(latency_ms=2.0, mig_profiles=("1g.5gb",), device="a100-40gb")  # doctest: +ELLIPSIS
    HardwareConstraints(latency_ms=2.0, ...)
    """

    latency_ms: float | None = None
    energy_j: float | None = None
    memory_mb: float | None = None
    mig_profiles: tuple[str, ...] = ()
    device: str = "a100-40gb"
    mig_margin: float = DEFAULT_MIG_MARGIN

    def __post_init__(self) -> None:
        if isinstance(self.mig_profiles, str):
            object.__setattr__(self, "mig_profiles", (self.mig_profiles,))
        gpu = get_device(self.device)
        for name in self.mig_profiles:
            gpu.mig_profile(name)  # raises with the known profiles of the device

    @property
    def gpu(self) -> Device:
        """The device the MIG profiles belong to."""
        return get_device(self.device)

    def values(self, prediction: Prediction) -> dict[str, float]:
        """Constraint values by name, each the prediction minus its bound: feasible when <= 0.

        Raises DippmError when there are MIG profiles and the prediction is for another device.

        >>> from dippm_nas.cost import Prediction
        >>> prediction = Prediction(model="m", latency_ms=2.5, energy_j=0.1, memory_mb=900.0, mig_profile="1g.5gb",
        ...                         device="a100-40gb", precision="fp32", batch=8, cost_model="analytical")
        >>> HardwareConstraints(latency_ms=2.0, energy_j=0.5).values(prediction)
        {'latency_ms': 0.5, 'energy_j': -0.4}
        """
        out: dict[str, float] = {}
        for name in ("latency_ms", "energy_j", "memory_mb"):
            bound = getattr(self, name)
            if bound is not None:
                out[name] = getattr(prediction, name) - bound
        if self.mig_profiles:
            if prediction.device.split(":")[0] != self.gpu.key:
                raise DippmError(f"the MIG constraint is for {self.gpu.key} but the prediction is for "
                                 f"{prediction.device}; score on the same device.")
            need = required_memory(prediction.memory_mb, self.mig_margin)
            largest = max(self.gpu.mig_profile(p).usable_mib for p in self.mig_profiles)
            out["mig:" + "|".join(self.mig_profiles)] = need - largest
        return out

    def apply(self, trial, prediction: Prediction) -> dict[str, float]:
        """Set :meth:`values` as the trial's constraints (``trial.set_constraint``) and return them."""
        values = self.values(prediction)
        for key, value in values.items():
            trial.set_constraint(key, value)
        return values

    @staticmethod
    def feasible(values: dict[str, float]) -> bool:
        """Whether every value of :meth:`values` is met (<= 0); no values at all is feasible."""
        return all(v <= 0 for v in values.values())
