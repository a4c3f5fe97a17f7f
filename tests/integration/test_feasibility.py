"""A candidate that does not fit the device's memory is infeasible, a report with nothing to plot says why,
and a constraint no candidate could meet is refused when it is made."""

from __future__ import annotations

import re

import optuna
import pytest

from dippm_nas import DippmError
from dippm_nas.cli import main
from dippm_nas.integration import HardwareConstraints, HardwareCostModel, HardwareObjective, is_feasible
from dippm_nas.integration.constraints import FITS_MEMORY
from dippm_nas.integration.report import scored_trials
from search_spaces import get_search_space

optuna.logging.set_verbosity(optuna.logging.WARNING)


def proxy(candidate) -> float:
    return float(candidate.arch["depth_0"])


@pytest.fixture(scope="module")
def space():
    return get_search_space("mobilenetv3", fixed={"resolution": 160})


def _study(objective, n_trials=2, storage=None, name=None) -> optuna.Study:
    study = optuna.create_study(directions=objective.directions, sampler=optuna.samplers.RandomSampler(seed=1),
                                storage=storage, study_name=name)
    study.optimize(objective, n_trials=n_trials)
    return study


def test_out_of_memory_candidates_are_infeasible_without_constraints(space, tmp_path):
    """At batch 1024 no candidate fits an a100-40gb 1g.5gb slice: each is pruned, with the reason."""
    cost = HardwareCostModel("a100-40gb:1g.5gb", batch=1024)
    url = f"sqlite:///{tmp_path / 'oom.db'}"
    study = _study(HardwareObjective(space, proxy, cost), storage=url, name="oom")
    for t in study.trials:
        assert t.state == optuna.trial.TrialState.PRUNED and t.constraints[FITS_MEMORY] > 0
        assert t.user_attrs["fits"] is False and "does not fit the 4864 MiB of a100-40gb:1g.5gb" in (
            t.user_attrs["prune_reason"])
    with pytest.raises(DippmError, match=f"all 2 trials were pruned as infeasible.*{FITS_MEMORY} \\(2 of 2\\)"):
        scored_trials(study)
    assert main(["report", "--storage", url, "--study", "oom", "--out", str(tmp_path / "r.html")]) == 2


def test_fitting_candidates_stay_feasible_and_record_units(space):
    cost = HardwareCostModel("a100-40gb:1g.5gb", batch=8)
    study = _study(HardwareObjective(space, proxy, cost, objectives=("memory_mib", "energy_j_per_sample"),
                                     constraints=HardwareConstraints(mig_profiles=("1g.5gb",))))
    for t in study.trials:
        assert t.state == optuna.trial.TrialState.COMPLETE and is_feasible(t) and t.constraints[FITS_MEMORY] < 0
        a = t.user_attrs
        assert a["memory_mib"] == a["memory_mb"] == t.values[1] and a["fits"] is True
        assert a["energy_j_per_sample"] == pytest.approx(a["energy_j"] / 8) == t.values[2]
        assert a["mig_profile"] == "1g.5gb" and a["device"] == "a100-40gb:1g.5gb"


def test_report_names_why_there_is_nothing_to_plot(space):
    with pytest.raises(DippmError, match="has no trials yet"):
        scored_trials(optuna.create_study())
    cost = HardwareCostModel("a100-40gb", batch=8)
    study = _study(HardwareObjective(space, proxy, cost, constraints=HardwareConstraints(latency_ms=0.01)))
    with pytest.raises(DippmError, match=r"pruned as infeasible.*latency_ms \(2 of 2\).*closest missed latency_ms"):
        scored_trials(study)


@pytest.mark.parametrize("bounds, says", [
    ({"latency_ms": -1}, "latency_ms bound must be a finite number above 0 (ms per batch), got -1"),
    ({"latency_ms": 0}, "latency_ms bound must be a finite number above 0"),
    ({"latency_ms": float("nan")}, "got nan"),
    ({"energy_j": float("inf")}, "energy_j bound must be a finite number above 0 (J per batch), got inf"),
    ({"memory_mib": "4GB"}, "memory_mib bound must be a finite number above 0 (MiB), got '4GB'"),
    ({"memory_mb": True}, "memory_mb bound"),
    ({"mig_margin": -0.1}, "MIG safety margin must be a fraction >= 0"),
])
def test_a_bound_no_candidate_could_meet_is_refused_at_construction(bounds, says):
    """Rather than every trial pruned in silence, or an Optuna traceback at the first trial."""
    with pytest.raises(DippmError, match=re.escape(says)):
        HardwareConstraints(**bounds)


def test_an_accuracy_function_must_be_a_function(space):
    with pytest.raises(DippmError, match="accuracy_fn must be a function of a candidate"):
        HardwareObjective(space, None, HardwareCostModel("a100-40gb", batch=8))
