"""An objective wrapper: a user's accuracy function becomes a hardware-aware multi-objective."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import optuna

from dippm_nas.cache import CacheFault
from dippm_nas.errors import DippmError, one_line
from dippm_nas.integration.constraints import FITS_MEMORY, HardwareConstraints, record_prediction
from dippm_nas.integration.cost_model import HardwareCostModel

#: The costs an objective can minimise: latency and energy per batch, energy per sample, memory in MiB
#: (``memory_mb`` is the deprecated name of ``memory_mib``).
COST_OBJECTIVES = ("latency_ms", "energy_j", "energy_j_per_sample", "memory_mib", "memory_mb")


class HardwareObjective:
    """``objective(trial) -> (accuracy, *costs)``: maximise accuracy, minimise the chosen costs.

    Every candidate is scored before it is trained. Predictions go on the trial as user attributes,
    the constraints are set, and a candidate that breaks one is pruned right there, before
    ``accuracy_fn`` runs: nothing it could learn would make its cost fit. A candidate whose memory does
    not fit the device (or slice) it is scored on breaks a constraint even without ``constraints``
    (:data:`~dippm_nas.integration.constraints.FITS_MEMORY`). A candidate that fails to export is pruned
    too, with the reason in its ``prune_reason`` attribute; the study goes on. A fault of the machinery
    (a cache file that cannot be opened, the disk, an error of the cost model itself) is not the
    candidate's: it fails the trial and stops the study with its cause.

    Here the accuracy is real: each candidate of the timm zoo space is a published model and carries
    its ImageNet top-1.

    >>> from search_spaces import get_search_space
    >>> optuna.logging.set_verbosity(optuna.logging.WARNING)
    >>> space = get_search_space("timm_zoo", entries=["resnet10t"])
    >>> cost = HardwareCostModel(device="a100-40gb", batch=8)
    >>> objective = HardwareObjective(space, lambda c: c.metadata["top1"], cost, objectives=("latency_ms",),
    ...                               constraints=HardwareConstraints(mig_profiles=("1g.5gb",)))
    >>> objective.directions
    ['maximize', 'minimize']
    >>> study = optuna.create_study(directions=objective.directions)
    >>> study.optimize(objective, n_trials=2)
    >>> [t.state.name for t in study.trials]
    ['COMPLETE', 'COMPLETE']
    """

    def __init__(self, space: Any, accuracy_fn: Callable[[Any], float], cost: HardwareCostModel,
                 objectives: Sequence[str] = ("latency_ms",), constraints: HardwareConstraints | None = None,
                 prune_infeasible: bool = True):
        if not callable(accuracy_fn):
            raise DippmError(f"accuracy_fn must be a function of a candidate that returns its accuracy, got "
                             f"{accuracy_fn!r}.")
        unknown = [o for o in objectives if o not in COST_OBJECTIVES]
        if unknown:
            raise DippmError(f"unknown cost objective(s) {unknown}; choose from {', '.join(COST_OBJECTIVES)}.")
        scored_on = cost.device.whole_gpu().key  # a slice's constraints are its GPU's profiles
        if constraints is not None and constraints.mig_profiles and constraints.gpu.key != scored_on:
            raise DippmError(f"constraints are for {constraints.gpu.key}, the cost model scores {cost.device.key}.")
        self.space, self.accuracy_fn, self.cost = space, accuracy_fn, cost
        self.objectives = tuple(objectives)
        self.constraints = constraints
        self.prune_infeasible = prune_infeasible

    @property
    def directions(self) -> list[str]:
        """For ``optuna.create_study(directions=...)``: maximise the accuracy, minimise each cost."""
        return ["maximize"] + ["minimize"] * len(self.objectives)

    @property
    def metric_names(self) -> list[str]:
        """For ``study.set_metric_names``: reports and the dashboard then name the axes."""
        return [getattr(self.accuracy_fn, "metric_name", "accuracy"), *self.objectives]

    def __call__(self, trial: optuna.Trial) -> tuple[float, ...]:
        """Score, constrain and, if feasible, evaluate the trial's candidate; raises TrialPruned otherwise."""
        candidate = self.space.sample(trial)
        trial.set_user_attr("architecture", dict(candidate.arch))
        try:
            graph = self.cost.graph(candidate)
        except (CacheFault, OSError, MemoryError):
            raise  # the cache's location, the disk, the machine: a fault of ours fails the trial
        except Exception as exc:  # a candidate that cannot be exported is a pruned trial, not a crash
            reason = f"featurizing failed: {one_line(exc)}"
            trial.set_user_attr("prune_reason", reason)
            raise optuna.TrialPruned(reason) from exc
        prediction = self.cost.predict(graph)  # any error here is the cost model's own, never the candidate's
        record_prediction(trial, prediction)
        constraints = self.constraints or HardwareConstraints(device=self.cost.device.key,
                                                              mig_margin=self.cost.mig_margin)
        values = constraints.apply(trial, prediction)
        if self.prune_infeasible and not HardwareConstraints.feasible(values):
            broken = ", ".join(_broken(k, v, prediction) for k, v in values.items() if v > 0)
            trial.set_user_attr("prune_reason", f"infeasible before training: {broken}")
            raise optuna.TrialPruned(f"infeasible: {broken}")
        accuracy = float(self.accuracy_fn(candidate))
        return (accuracy, *(float(getattr(prediction, "memory_mib" if o == "memory_mb" else o))
                            for o in self.objectives))


def _broken(key: str, value: float, prediction) -> str:
    """One broken constraint in words, for a trial's ``prune_reason``."""
    if key == FITS_MEMORY:
        return (f"does not fit the {prediction.memory_available_mib:.0f} MiB of {prediction.device} "
                f"({prediction.memory_mib:.0f} MiB predicted, {value:.4g} MiB over with the margin)")
    return f"{key} by {value:.4g}"
