"""Predictions on Optuna trials: user attributes to read, constraints to obey.

Optuna 5 constraints are set per trial with ``trial.set_constraint(key, value)``; a trial is
feasible when every value is <= 0. Each bound here becomes ``predicted - bound``, so the value also
says by how much a candidate misses.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

from dippm_nas.errors import DippmError, is_finite_number
from dippm_nas.hardware.mig import DEFAULT_MIG_MARGIN, check_mig_margin, required_memory
from dippm_nas.hardware.registry import DEFAULT_DEVICE, Device, get_device
from dippm_nas.prediction import Prediction

#: The user attributes a scored trial carries (Optuna's dashboard shows them), in the units of
#: :data:`dippm_nas.prediction.UNITS` (latency and energy per batch, memory in MiB); ``fits`` says whether the
#: candidate fits the device's memory; ``notes`` say which cost model answered, how far the candidate is from what
#: it learned from, and its latency error on comparable held-out records.
PREDICTION_ATTRS = ("latency_ms", "energy_j", "energy_j_per_sample", "memory_mib", "fits",
                    "mig_profile", "device", "precision", "batch", "cost_model", "host_share", "notes")


def record_prediction(trial, prediction: Prediction) -> None:
    """Put the prediction's :data:`PREDICTION_ATTRS` on ``trial`` as user attributes (tuples as lists)."""
    values = prediction.to_dict()
    for name in PREDICTION_ATTRS:
        trial.set_user_attr(name, values[name])


#: The constraint every scored candidate gets: its memory plus the margin, less the device's memory.
FITS_MEMORY = "fits_memory"
#: Each bound a constraint takes, and its unit (the units of :data:`dippm_nas.prediction.UNITS`).
BOUNDS = {"latency_ms": "ms per batch", "energy_j": "J per batch", "memory_mib": "MiB"}


def check_bound(name: str, bound: object) -> None:
    """A bound must be a finite number above 0: at or below 0 no candidate could meet it, and NaN would
    reach Optuna as a constraint it cannot compare."""
    if bound is None:
        return
    if not is_finite_number(bound) or bound <= 0:
        raise DippmError(f"the {name} bound must be a finite number above 0 ({BOUNDS[name]}), got {bound!r}; "
                         "leave it at None to not constrain it.")


@dataclass(frozen=True)
class HardwareConstraints:
    """Upper bounds on predicted cost; ``mig_profiles`` are the slices a candidate may run in.

    A bound left at None is not checked. Latency is in ms and energy in J, both per batch, memory in
    MiB; a candidate fits a slice when its
    memory plus ``mig_margin`` does. With ``mig_profiles`` the bounds hold *in the slice*: a candidate
    is feasible when, in one of the slices, its memory fits and its latency and energy there (a slice
    has a share of the GPU's multiprocessors and bandwidth, so it runs the candidate slower) meet the
    bounds; :meth:`judged_slice` says which slice it is judged in. Whatever the bounds, a candidate
    whose memory plus ``mig_margin`` does not fit the device it was predicted on (a slice's usable
    memory) breaks :data:`FITS_MEMORY`. A bound that is not a finite number above 0 is a DippmError,
    and so is an unknown device or profile (it lists the known ones).

    >>> HardwareConstraints(latency_ms=2.0, mig_profiles=("1g.5gb",), device="a100-40gb")  # doctest: +ELLIPSIS
    HardwareConstraints(latency_ms=2.0, ...)
    """

    latency_ms: float | None = None
    energy_j: float | None = None
    memory_mib: float | None = None
    mig_profiles: tuple[str, ...] = ()
    device: str = DEFAULT_DEVICE
    mig_margin: float = DEFAULT_MIG_MARGIN

    def __post_init__(self) -> None:
        for name in BOUNDS:
            check_bound(name, getattr(self, name))
        check_mig_margin(self.mig_margin)
        if isinstance(self.mig_profiles, str):
            object.__setattr__(self, "mig_profiles", (self.mig_profiles,))
        gpu = self.gpu  # each profile as the device names it ('1G.5GB' is 1g.5gb, as a device key reads it)
        object.__setattr__(self, "mig_profiles", tuple(gpu.mig_profile(name).name for name in self.mig_profiles))

    @classmethod
    def in_any_slice(cls, latency_ms: float | None = None, energy_j: float | None = None,
                     device: str = DEFAULT_DEVICE, mig_margin: float = DEFAULT_MIG_MARGIN) -> HardwareConstraints:
        """Every MIG profile of ``device``: a candidate is feasible where some slice holds its memory and meets the
        bounds there, and is judged in the smallest such slice (``mig_slice``), the slice to deploy it in.

        >>> HardwareConstraints.in_any_slice(latency_ms=5.0, device="a100-40gb").mig_profiles[:2]
        ('1g.5gb', '1g.10gb')
        """
        gpu = get_device(device).whole_gpu()
        if not gpu.has_mig:
            raise DippmError(f"{gpu.key} ({gpu.name}) does not support MIG: bound the whole GPU instead "
                             "(HardwareConstraints(latency_ms=...)).")
        return cls(latency_ms=latency_ms, energy_j=energy_j, device=device, mig_margin=mig_margin,
                   mig_profiles=tuple(p.name for p in gpu.mig_profiles))

    @cached_property
    def gpu(self) -> Device:
        """The device the MIG profiles belong to (a slice key stands for its GPU), read once."""
        return get_device(self.device).whole_gpu()

    @property
    def bounds(self) -> dict[str, float]:
        """The bounds that are set, by name."""
        return {name: getattr(self, name) for name in BOUNDS if getattr(self, name) is not None}

    def slice_devices(self) -> dict[str, str]:
        """The device key of each slice of ``mig_profiles`` (``a100-40gb:1g.5gb``), by profile, smallest first:
        where latency or energy is bounded, the candidate's prediction on each is what :meth:`values` judges."""
        ordered = sorted(self.mig_profiles, key=lambda p: self.gpu.mig_profile(p).usable_mib)
        return {profile: f"{self.gpu.key}:{profile}" for profile in ordered}

    @property
    def judges_slice_speed(self) -> bool:
        """Whether a slice's own prediction matters: MIG profiles and a latency or energy bound."""
        return bool(self.mig_profiles) and (self.latency_ms is not None or self.energy_j is not None)

    def judged_slice(self, prediction: Prediction,
                     on_slices: Mapping[str, Prediction] | None = None) -> tuple[str, Prediction] | None:
        """The slice a candidate is judged in and its prediction there, None without ``mig_profiles``: the
        smallest slice in which it meets every bound, else the one it misses by the least (relative to the
        bound). ``on_slices``: its prediction in each slice of :meth:`slice_devices`, by profile; it may
        leave out the slice ``prediction`` was made on, and every slice where no latency or energy is
        bounded (memory does not depend on the slice)."""
        if not self.mig_profiles:
            return None
        if prediction.device.partition(":")[0] != self.gpu.key:
            raise DippmError(f"the MIG constraint is for {self.gpu.key} but the prediction is for "
                             f"{prediction.device}; score on the same device.")
        best, best_miss = None, math.inf
        for profile, key in self.slice_devices().items():
            on_slice = self._on_slice(profile, key, prediction, on_slices or {})
            misses = self._slice_values(profile, on_slice)
            usable = self.gpu.mig_profile(profile).usable_mib
            relative = [v / (self.bounds.get(name) or usable) for name, v in misses.items()]
            if max(relative) <= 0:
                return profile, on_slice
            if max(relative) < best_miss:
                best, best_miss = (profile, on_slice), max(relative)
        return best

    def _on_slice(self, profile: str, key: str, prediction: Prediction,
                  on_slices: Mapping[str, Prediction]) -> Prediction:
        if profile in on_slices:
            return on_slices[profile]
        if prediction.device == key or not self.judges_slice_speed:
            return prediction
        raise DippmError(f"a latency or energy bound with MIG profiles is judged in each slice: give the "
                         f"candidate's prediction on {key} (HardwareCostModel.predict(graph, device={key!r}); "
                         "HardwareObjective does this).")

    def _slice_values(self, profile: str, on_slice: Prediction) -> dict[str, float]:
        """Each bound's miss in one slice, and ``mig:<profiles>``: the memory it needs beyond the slice's."""
        out = self._bound_values(on_slice)
        need = required_memory(on_slice.memory_mib, self.mig_margin)
        out["mig:" + "|".join(self.mig_profiles)] = need - self.gpu.mig_profile(profile).usable_mib
        return out

    def _bound_values(self, prediction: Prediction) -> dict[str, float]:
        return {name: getattr(prediction, name) - bound for name, bound in self.bounds.items()}

    def values(self, prediction: Prediction,
               on_slices: Mapping[str, Prediction] | None = None) -> dict[str, float]:
        """Constraint values by name, each the prediction minus its bound: feasible when <= 0.

        With ``mig_profiles`` the bounds are judged in the slice :meth:`judged_slice` picks (give
        ``on_slices`` where latency or energy is bounded), and ``mig:<profiles>`` is the memory the
        candidate needs beyond that slice's. Raises DippmError when the prediction is for another GPU. A
        prediction that knows its device's memory (every one :func:`dippm_nas.predict_graph` makes) also
        gets :data:`FITS_MEMORY`.

        >>> from dippm_nas.prediction import Prediction
        >>> prediction = Prediction(model="m", latency_ms=2.5, energy_j=0.1, memory_mib=900.0, mig_profile="1g.5gb",
        ...                         device="a100-40gb", precision="fp32", batch=8, cost_model="analytical")
        >>> HardwareConstraints(latency_ms=2.0, energy_j=0.5).values(prediction)
        {'latency_ms': 0.5, 'energy_j': -0.4}
        >>> from dataclasses import replace
        >>> HardwareConstraints(memory_mib=1000).values(replace(prediction, memory_available_mib=800.0))
        {'memory_mib': -100.0, 'fits_memory': 145.0}
        >>> in_slice = replace(prediction, latency_ms=6.0, device="a100-40gb:1g.5gb")
        >>> HardwareConstraints(latency_ms=4.0, mig_profiles=("1g.5gb",)).values(prediction, {"1g.5gb": in_slice})
        {'latency_ms': 2.0, 'mig:1g.5gb': -3919.0}
        """
        return self._values(prediction, self.judged_slice(prediction, on_slices))

    def _values(self, prediction: Prediction, judged: tuple[str, Prediction] | None) -> dict[str, float]:
        out = self._bound_values(prediction) if judged is None else {}
        if prediction.memory_available_mib is not None:
            out[FITS_MEMORY] = required_memory(prediction.memory_mib, self.mig_margin) - prediction.memory_available_mib
        if judged is not None:
            out.update(self._slice_values(*judged))
        return out

    def apply(self, trial, prediction: Prediction,
              on_slices: Mapping[str, Prediction] | None = None) -> dict[str, float]:
        """Set :meth:`values` as the trial's constraints (``trial.set_constraint``) and return them; with
        ``mig_profiles``, the slice the candidate is judged in and its latency and energy there are the
        user attributes ``mig_slice``, ``slice_latency_ms`` and ``slice_energy_j``."""
        judged = self.judged_slice(prediction, on_slices)
        values = self._values(prediction, judged)
        for key, value in values.items():
            trial.set_constraint(key, value)
        if judged is not None:
            profile, on_slice = judged
            trial.set_user_attr("mig_slice", profile)
            trial.set_user_attr("slice_latency_ms", on_slice.latency_ms)
            trial.set_user_attr("slice_energy_j", on_slice.energy_j)
        return values

    @staticmethod
    def feasible(values: dict[str, float]) -> bool:
        """Whether every value of :meth:`values` is met (<= 0); no values at all is feasible."""
        return all(v <= 0 for v in values.values())
