"""Questions asked of a finished study."""

from __future__ import annotations

import optuna
from optuna.trial import FrozenTrial, TrialState

from dippm_nas.hardware.mig import DEFAULT_MIG_MARGIN, fits
from dippm_nas.hardware.registry import DEFAULT_DEVICE, get_device


def trials_fitting_mig(study: optuna.Study, profile: str, device: str = DEFAULT_DEVICE,
                       margin: float = DEFAULT_MIG_MARGIN, states: tuple[TrialState, ...] = (TrialState.COMPLETE,)
                       ) -> list[FrozenTrial]:
    """Trials scored on ``device`` whose predicted memory fits ``profile`` (with the margin)."""
    gpu = get_device(device)
    slot = gpu.mig_profile(profile)
    return [
        t for t in study.get_trials(deepcopy=False, states=states)
        if trial_memory_mib(t) is not None and _scored_gpu(t) == gpu.key
        and fits(slot, trial_memory_mib(t), margin)
    ]


def trials_served_by_slice(study: optuna.Study, profile: str, device: str = DEFAULT_DEVICE) -> list[FrozenTrial]:
    """Feasible trials judged in ``profile`` or a smaller slice of ``device`` (``mig_slice``, which
    :class:`~dippm_nas.integration.HardwareConstraints` with MIG profiles records: the smallest slice that holds
    the candidate and meets its bounds), so that ``profile`` serves each of them within the bounds."""
    gpu = get_device(device).whole_gpu()
    order = [p.name for p in gpu.mig_profiles]
    limit = order.index(gpu.mig_profile(profile).name)
    return [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if is_feasible(t) and _scored_gpu(t) == gpu.key
            and t.user_attrs.get("mig_slice") in order[:limit + 1]]


def _scored_gpu(trial: FrozenTrial) -> str | None:
    """The GPU a trial was scored on (a slice's GPU for a slice), None for a trial dippm-nas did not score."""
    device = trial.user_attrs.get("device")
    return get_device(str(device)).whole_gpu().key if device else None


def trial_memory_mib(trial: FrozenTrial) -> float | None:
    """The predicted memory (MiB) a scored trial carries; None for a trial dippm-nas did not score."""
    value = trial.user_attrs.get("memory_mib")
    return None if value is None else float(value)


def is_feasible(trial: FrozenTrial) -> bool:
    """Whether the trial meets every constraint it set (<= 0); a trial that set none is feasible."""
    return all(v <= 0 for v in trial.constraints.values())


def feasible_pareto_front(study: optuna.Study) -> list[FrozenTrial]:
    """The Pareto-optimal trials among the feasible ones.

    Optuna's ``best_trials`` already keeps to feasible trials in a constrained study; this also holds for
    a study where only some trials set constraints.

    >>> from optuna.trial import create_trial
    >>> optuna.logging.set_verbosity(optuna.logging.WARNING)
    >>> study = optuna.create_study(directions=["maximize", "minimize"])
    >>> study.add_trial(create_trial(values=[0.9, 5.0], constraints={"latency_ms": 1.0}))
    >>> study.add_trial(create_trial(values=[0.8, 3.0], constraints={"latency_ms": -1.0}))
    >>> study.add_trial(create_trial(values=[0.7, 4.0], constraints={"latency_ms": -0.5}))
    >>> [t.number for t in feasible_pareto_front(study)]
    [1]
    """
    return [t for t in study.best_trials if is_feasible(t)]
