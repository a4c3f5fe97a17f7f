"""A candidate that does not fit the device's memory is infeasible, and a report with nothing to plot
says why."""

from __future__ import annotations

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
