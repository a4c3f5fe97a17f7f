"""The smallest MIG slice that meets a latency bound and holds the model: the API, the command line and a study
agree, and a bound no slice meets is one clear line."""

from __future__ import annotations

import json

import optuna
import pytest

import dippm_nas
from dippm_nas import DippmError
from dippm_nas.cli import main
from dippm_nas.integration import (
    HardwareConstraints,
    HardwareCostModel,
    HardwareObjective,
    is_feasible,
    trials_served_by_slice,
)
from dippm_nas.integration.report import write_report
from search_spaces import get_search_space

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture(scope="module")
def graph():
    return dippm_nas.build_graph("resnet18", batch=8)


@pytest.fixture(scope="module")
def rows(graph):
    return dippm_nas.mig_table(graph, "a100-40gb")


def test_the_api_takes_the_smallest_slice_within_the_bound(graph, rows):
    """Between the latencies of two slices, the bound is met by the slower one's successors only."""
    by_profile = {r.profile: r for r in rows}
    bound = (by_profile["2g.10gb"].latency_ms + by_profile["3g.20gb"].latency_ms) / 2
    assert by_profile["3g.20gb"].latency_ms < bound < by_profile["2g.10gb"].latency_ms
    choice = dippm_nas.smallest_slice(graph, bound, "a100-40gb")
    assert choice.profile == "3g.20gb" and choice.slice == by_profile["3g.20gb"]
    assert choice.reason.startswith("3g.20gb is the smallest slice that holds the model")
    first = [r for r in rows if r.latency_ms <= bound][0]
    assert first.profile == "3g.20gb"  # the registry's order: usable memory, then SMs
    assert dippm_nas.smallest_slice(graph, 1e6, "a100-40gb:7g.40gb").profile == rows[0].profile  # a slice: its GPU


def test_a_bound_no_slice_meets_says_which_comes_closest(graph, rows):
    choice = dippm_nas.smallest_slice(graph, 1e-3, "a100-40gb")
    fastest = min(rows, key=lambda r: r.latency_ms)
    assert choice.profile is None and choice.slice is None
    assert choice.reason == (f"no MIG slice of a100-40gb runs it within 0.001 ms per batch: the fastest, "
                             f"{fastest.profile}, takes {fastest.latency_ms:.3g} ms")


def test_a_model_no_slice_holds_is_said_whatever_the_bound():
    from dippm_nas._predict import SliceEstimate, choose_slice

    choice = choose_slice([SliceEstimate("1g.5gb", 4864.0, 14, False, 1.0, 0.1)], 10.0, "a100-40gb")
    assert choice.profile is None and "holds the model's memory" in choice.reason


@pytest.mark.parametrize("bound", [0, -2.0, float("nan"), float("inf"), "5", True])
def test_a_bound_that_is_not_a_latency_is_refused(graph, bound):
    with pytest.raises(DippmError, match="latency bound must be a finite number of ms per batch above 0"):
        dippm_nas.smallest_slice(graph, bound, "a100-40gb")


def test_a_gpu_without_mig_is_refused_before_the_export():
    with pytest.raises(DippmError, match="does not support MIG"):
        dippm_nas.smallest_slice("no-such-model-is-ever-built", 5.0, "rtx4090")


def test_the_command_line_chooses_the_same_slice_and_exits_1_where_none_meets_it(rows, capsys):
    by_profile = {r.profile: r for r in rows}
    bound = (by_profile["2g.10gb"].latency_ms + by_profile["3g.20gb"].latency_ms) / 2
    assert main(["mig", "resnet18", "--batch", "8", "--max-latency-ms", f"{bound:.6f}"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1].startswith("3g.20gb is the smallest slice that holds the model")
    assert main(["mig", "resnet18", "--batch", "8", "--max-latency-ms", f"{bound:.6f}", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["choice"]["profile"] == "3g.20gb"
    assert main(["mig", "resnet18", "--batch", "8", "--max-latency-ms", "0.001"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("no MIG slice of a100-40gb runs it within 0.001 ms per batch")
    assert main(["mig", "resnet18", "--batch", "8", "--max-latency-ms", "-1"]) == 2
    assert "latency bound must be a finite number" in capsys.readouterr().err


def test_a_study_records_the_smallest_slice_within_the_bound_and_the_report_shows_it(tmp_path):
    """Every candidate is judged in the smallest slice that holds it and meets the bound, as the API chooses."""
    space = get_search_space("mobilenetv3", fixed={"resolution": 160})
    cost = HardwareCostModel("a100-40gb", batch=8)
    candidate = space.extreme()
    on_slices = dippm_nas.mig_table(cost.graph(candidate), "a100-40gb")
    by_profile = {r.profile: r for r in on_slices}
    bound = (by_profile["2g.10gb"].latency_ms + by_profile["3g.20gb"].latency_ms) / 2
    constraints = HardwareConstraints.in_any_slice(latency_ms=bound, device="a100-40gb")
    study = optuna.create_study(directions=["maximize"])
    study.enqueue_trial(dict(candidate.arch))
    study.optimize(HardwareObjective(space, lambda c: 1.0, cost, objectives=(), constraints=constraints), n_trials=1)
    trial = study.trials[0]
    expected = dippm_nas.smallest_slice(cost.graph(candidate), bound, "a100-40gb")
    assert is_feasible(trial) and trial.user_attrs["mig_slice"] == expected.profile == "3g.20gb"
    assert trial.user_attrs["slice_latency_ms"] == pytest.approx(expected.slice.latency_ms)
    assert [t.number for t in trials_served_by_slice(study, "3g.20gb")] == [trial.number]
    assert trials_served_by_slice(study, "2g.10gb") == []
    page = write_report(study, tmp_path / "report.html").path.read_text()
    assert "3g.20gb (" in page and "ms there)" in page


def test_constraints_in_any_slice_need_a_gpu_with_mig():
    with pytest.raises(DippmError, match="does not support MIG"):
        HardwareConstraints.in_any_slice(latency_ms=5.0, device="rtx4090")
