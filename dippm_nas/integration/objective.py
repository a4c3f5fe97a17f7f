"""An objective wrapper: a user's accuracy function becomes a hardware-aware multi-objective."""

from __future__ import annotations

import logging
import math
import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import optuna

from dippm_nas.errors import DippmError, DippmWarning, one_line
from dippm_nas.integration.constraints import FITS_MEMORY, HardwareConstraints, record_prediction
from dippm_nas.integration.cost_model import HardwareCostModel
from dippm_nas.integration.featurizer import MACHINE_FAULTS

_LOG = logging.getLogger(__name__)

#: How many trials in a row may fail on a fault of the machinery before the study stops: one is a
#: hiccup (a busy disk, a worker's lock), several in a row are a cause to fix first.
FAULTS_IN_A_ROW = 3


class SearchStopped(DippmError):
    """Several trials in a row failed on a fault of dippm-nas's own machinery, not of their candidates."""


#: The costs an objective can minimise: latency and energy per batch, energy per sample, memory in MiB.
COST_OBJECTIVES = ("latency_ms", "energy_j", "energy_j_per_sample", "memory_mib")
#: A candidate whose host takes at least this share of its latency to issue its operators is host-bound: its
#: latency is the host's, whatever its GPU work.
HOST_BOUND_SHARE = 0.9
#: A search judges its candidates this many at a time (a sampler may close in on host-bound ones late): where
#: most of them are host-bound, it says so, once.
HOST_BOUND_SAMPLE = 20


class HardwareObjective:
    """``objective(trial) -> (accuracy, *costs)``: maximise accuracy, minimise the chosen costs.

    Every candidate is scored before it is trained. Predictions go on the trial as user attributes,
    the constraints are set, and a candidate that breaks one is pruned right there, before
    ``accuracy_fn`` runs: nothing it could learn would make its cost fit. A candidate whose memory does
    not fit the device (or slice) it is scored on breaks a constraint even without ``constraints``
    (:data:`~dippm_nas.integration.constraints.FITS_MEMORY`). A candidate that fails to export is pruned
    too, with the reason in its ``prune_reason`` attribute; the study goes on. A fault of the machinery
    (a cache file that cannot be opened, the disk, an error of the cost model itself) is not the
    candidate's: it fails the trial with a warning that gives the cause (its ``fault`` attribute keeps
    it), and ``max_faults_in_a_row`` such failures in a row stop the study with :class:`SearchStopped`.
    ``study.optimize(objective)`` scores one trial at a time; :meth:`ask_and_tell` a generation at once.

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
                 prune_infeasible: bool = True, max_faults_in_a_row: int = FAULTS_IN_A_ROW):
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
        if isinstance(max_faults_in_a_row, bool) or not isinstance(max_faults_in_a_row, int) \
                or max_faults_in_a_row < 1:
            raise DippmError(f"max_faults_in_a_row must be a whole number of at least 1, got {max_faults_in_a_row!r}.")
        self.max_faults_in_a_row = max_faults_in_a_row
        self._faults_in_a_row = 0
        self._faults_lock = threading.Lock()  # Optuna's n_jobs runs trials in threads
        self._host_bound: list[int] | None = [0, 0]  # host-bound and scored candidates of the window; None: said

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
        candidate = self._sample(trial)
        try:
            graph: Any = self.cost.graph(candidate)
        except MACHINE_FAULTS as exc:  # the cache's location, the disk, the machine
            return self._fault(trial, exc)
        except Exception as exc:  # a candidate that cannot be exported is a pruned trial, not a crash
            graph = exc
        return self._judged(trial, candidate, graph)

    def ask_and_tell(self, study: optuna.Study, n: int, progress: bool = False) -> list[optuna.trial.FrozenTrial]:
        """Ask ``study`` for ``n`` trials (a population, a generation), score their candidates together
        (:meth:`HardwareCostModel.graph_many`: the new blocks of them all are exported at once, in worker
        processes), then judge and tell each as :meth:`__call__` would; returns the trials told. An error
        of the space or ``accuracy_fn``, or :class:`SearchStopped`, fails the trials not yet told and is raised.
        (Optuna's warning that a storage's heartbeat is meant for ``Study.optimize`` is not shown: this method tells
        or fails every trial it asks itself.)"""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
            trials = [study.ask() for _ in range(n)]
        told: list[optuna.trial.FrozenTrial] = []
        try:
            candidates = [self._sample(trial) for trial in trials]
            try:
                graphs: list[Any] = self.cost.graph_many(candidates, progress)
            except MACHINE_FAULTS as exc:
                graphs = [_Fault(exc)] * n
            for trial, candidate, graph in zip(trials, candidates, graphs):
                try:
                    values = self._fault(trial, graph.cause) if isinstance(graph, _Fault) else \
                        self._judged(trial, candidate, graph)
                except optuna.TrialPruned:
                    told.append(study.tell(trial, state=optuna.trial.TrialState.PRUNED))
                else:
                    told.append(study.tell(trial, values))
        finally:
            for trial in trials[len(told):]:
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
        return told

    def _sample(self, trial: optuna.Trial) -> Any:
        candidate = self.space.sample(trial)
        trial.set_user_attr("architecture", dict(candidate.arch))
        return candidate

    def _judged(self, trial: optuna.Trial, candidate: Any, graph: Any) -> tuple[float, ...]:
        """Predict, constrain and, if feasible, evaluate a candidate from its graph, or from the exception
        that kept it from one (the candidate's own: the trial is pruned with the reason)."""
        if isinstance(graph, Exception):
            reason = f"featurizing failed: {one_line(graph)}"
            trial.set_user_attr("prune_reason", reason)
            raise optuna.TrialPruned(reason) from graph
        constraints = self.constraints or HardwareConstraints(device=self.cost.device.key,
                                                              mig_margin=self.cost.mig_margin)
        try:
            prediction = self.cost.predict(graph)
            on_slices = self._slice_predictions(graph, prediction, constraints)
        except Exception as exc:  # any error here is the cost model's own, never the candidate's
            return self._fault(trial, exc)
        with self._faults_lock:
            self._faults_in_a_row = 0
            self._count_host_bound(prediction)
        record_prediction(trial, prediction)
        values = constraints.apply(trial, prediction, on_slices)
        if self.prune_infeasible and not HardwareConstraints.feasible(values):
            broken = ", ".join(_broken(k, v, prediction) for k, v in values.items() if v > 0)
            trial.set_user_attr("prune_reason", f"infeasible before training: {broken}")
            raise optuna.TrialPruned(f"infeasible: {broken}")
        accuracy = float(self.accuracy_fn(candidate))
        return (accuracy, *(float(getattr(prediction, o)) for o in self.objectives))

    def _count_host_bound(self, prediction) -> None:
        """Say once where most of :data:`HOST_BOUND_SAMPLE` candidates in a row are host-bound: their latencies are
        the host's and differ little, so a latency objective or bound hardly tells them apart."""
        counts = self._host_bound
        if counts is None:
            return
        counts[0] += prediction.host_share >= HOST_BOUND_SHARE
        counts[1] += 1
        if counts[1] < HOST_BOUND_SAMPLE:
            return
        if counts[0] <= HOST_BOUND_SAMPLE // 2:
            counts[:] = [0, 0]
            return
        self._host_bound = None
        warnings.warn(
            f"{counts[0]} of {counts[1]} candidates in a row are host-bound on {prediction.device} at batch "
            f"{prediction.batch} ({prediction.mode}): the host's time to issue their operators is most of their "
            "latency, so their predicted latencies hardly differ and the search cannot tell them apart by it; "
            "price the GPU's work with mode='cuda-graphs' or a larger batch", DippmWarning, stacklevel=3)

    def _slice_predictions(self, graph, prediction, constraints: HardwareConstraints) -> dict[str, Any]:
        """The candidate's prediction in each slice its latency or energy bound is judged in (none is needed
        where only memory is bounded, or for the slice the cost model scores on)."""
        if not constraints.judges_slice_speed:
            return {}
        gpu = constraints.gpu
        return {profile: self.cost.predict(graph, device=gpu.as_slice(gpu.mig_profile(profile)))
                for profile, key in constraints.slice_devices().items() if key != prediction.device}

    def _fault(self, trial: optuna.Trial, exc: Exception) -> tuple[float, ...]:
        """Fail the trial on a fault of ours (NaN values fail an Optuna trial and let the study go on),
        or stop the study when the faults come ``max_faults_in_a_row`` in a row."""
        cause = one_line(exc)
        with self._faults_lock:
            self._faults_in_a_row += 1
            in_a_row = self._faults_in_a_row
        trial.set_user_attr("fault", cause)
        if in_a_row >= self.max_faults_in_a_row:
            raise SearchStopped(f"{in_a_row} trials in a row failed on a fault of dippm-nas, not of their "
                                f"candidates; the last: {cause}. Fix it and resume the study: its storage keeps "
                                "every trial.") from exc
        _LOG.warning("trial %d failed on a fault of dippm-nas, not of its candidate (%d in a row; the study "
                     "stops at %d): %s", trial.number, in_a_row, self.max_faults_in_a_row, cause)
        return (math.nan,) * len(self.directions)


@dataclass(frozen=True)
class _Fault:
    """A fault of the machinery that kept a whole batch of candidates from their graphs."""

    cause: Exception


def _broken(key: str, value: float, prediction) -> str:
    """One broken constraint in words, for a trial's ``prune_reason``."""
    if key == FITS_MEMORY:
        return (f"does not fit the {prediction.memory_available_mib:.0f} MiB of {prediction.device} "
                f"({prediction.memory_mib:.0f} MiB predicted, {value:.4g} MiB over with the margin)")
    return f"{key} by {value:.4g}"
