"""Predictions on Optuna trials: user attributes to read, constraints to obey.

Optuna 5 constraints are set per trial with ``trial.set_constraint(key, value)``; a trial is
feasible when every value is <= 0. Each bound here becomes ``predicted - bound``, so the value also
says by how much a candidate misses.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from dippm_nas.cost.base import Prediction
from dippm_nas.errors import DippmError
from dippm_nas.hardware.mig import DEFAULT_MIG_MARGIN, check_mig_margin, required_memory
from dippm_nas.hardware.registry import Device, get_device

#: The user attributes a scored trial carries (Optuna's dashboard shows them), in the units of
#: :data:`dippm_nas.cost.base.UNITS` (latency and energy per batch, memory in MiB; ``memory_mb`` is the
#: deprecated alias of ``memory_mib``, kept for one release); ``fits`` says whether the candidate fits the
#: device's memory; ``notes`` say which cost model answered, how far the candidate is from what it
#: learned from, and its latency error on comparable held-out records.
PREDICTION_ATTRS = ("latency_ms", "energy_j", "energy_j_per_sample", "memory_mib", "memory_mb", "fits",
                    "mig_profile", "device", "precision", "batch", "cost_model", "notes")


def record_prediction(trial, prediction: Prediction) -> None:
    """Put the prediction's :data:`PREDICTION_ATTRS` on ``trial`` as user attributes (tuples as lists)."""
    values = prediction.to_dict()
    for name in PREDICTION_ATTRS:
        trial.set_user_attr(name, values[name])


#: The constraint every scored candidate gets: its memory plus the margin, less the device's memory.
FITS_MEMORY = "fits_memory"
#: Each bound a constraint takes, and its unit (the units of :data:`dippm_nas.cost.base.UNITS`).
BOUNDS = {"latency_ms": "ms per batch", "energy_j": "J per batch", "memory_mib": "MiB", "memory_mb": "MiB"}


def check_bound(name: str, bound: object) -> None:
    """A bound must be a finite number above 0: at or below 0 no candidate could meet it, and NaN would
    reach Optuna as a constraint it cannot compare."""
    if bound is None:
        return
    if not isinstance(bound, numbers.Real) or isinstance(bound, bool) or not math.isfinite(bound) or bound <= 0:
        raise DippmError(f"the {name} bound must be a finite number above 0 ({BOUNDS[name]}), got {bound!r}; "
                         "leave it at None to not constrain it.")


@dataclass(frozen=True)
class HardwareConstraints:
    """Upper bounds on predicted cost; ``mig_profiles`` are the slices a candidate may run in.

    A bound left at None is not checked. Latency is in ms and energy in J, both per batch, memory in
    MiB (``memory_mb`` is the deprecated name of ``memory_mib``); a candidate fits a slice when its
    memory plus ``mig_margin`` does. Whatever the bounds, a candidate whose memory plus ``mig_margin``
    does not fit the device it was predicted on (a slice's usable memory) breaks :data:`FITS_MEMORY`.
    A bound that is not a finite number above 0 is a DippmError, and so is an unknown device or profile
    (it lists the known ones).

    >>> HardwareConstraints(latency_ms=2.0, mig_profiles=("1g.5gb",), device="a100-40gb")  # doctest: +ELLIPSIS
    HardwareConstraints(latency_ms=2.0, ...)
    """

    latency_ms: float | None = None
    energy_j: float | None = None
    memory_mb: float | None = None
    mig_profiles: tuple[str, ...] = ()
    device: str = "a100-40gb"
    mig_margin: float = DEFAULT_MIG_MARGIN
    memory_mib: float | None = None

    def __post_init__(self) -> None:
        for name in BOUNDS:
            check_bound(name, getattr(self, name))
        check_mig_margin(self.mig_margin)
        if isinstance(self.mig_profiles, str):
            object.__setattr__(self, "mig_profiles", (self.mig_profiles,))
        gpu = self.gpu
        for name in self.mig_profiles:
            gpu.mig_profile(name)  # raises with the known profiles of the device

    @property
    def gpu(self) -> Device:
        """The device the MIG profiles belong to (a slice key stands for its GPU)."""
        return get_device(self.device).whole_gpu()

    def values(self, prediction: Prediction) -> dict[str, float]:
        """Constraint values by name, each the prediction minus its bound: feasible when <= 0.

        Raises DippmError when there are MIG profiles and the prediction is for another device. A
        prediction that knows its device's memory (every one :func:`dippm_nas.predict_graph` makes)
        also gets :data:`FITS_MEMORY`.

        >>> from dippm_nas.cost import Prediction
        >>> prediction = Prediction(model="m", latency_ms=2.5, energy_j=0.1, memory_mib=900.0, mig_profile="1g.5gb",
        ...                         device="a100-40gb", precision="fp32", batch=8, cost_model="analytical")
        >>> HardwareConstraints(latency_ms=2.0, energy_j=0.5).values(prediction)
        {'latency_ms': 0.5, 'energy_j': -0.4}
        >>> from dataclasses import replace
        >>> HardwareConstraints(memory_mib=1000).values(replace(prediction, memory_available_mib=800.0))
        {'memory_mib': -100.0, 'fits_memory': 145.0}
        """
        out: dict[str, float] = {}
        for name in BOUNDS:
            bound = getattr(self, name)
            if bound is not None:
                value = prediction.memory_mib if name.startswith("memory") else getattr(prediction, name)
                out[name] = value - bound
        if prediction.memory_available_mib is not None:
            out[FITS_MEMORY] = required_memory(prediction.memory_mib, self.mig_margin) - prediction.memory_available_mib
        if self.mig_profiles:
            if get_device(prediction.device).whole_gpu().key != self.gpu.key:
                raise DippmError(f"the MIG constraint is for {self.gpu.key} but the prediction is for "
                                 f"{prediction.device}; score on the same device.")
            need = required_memory(prediction.memory_mib, self.mig_margin)
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
