"""The HTML report, rendered in headless Chromium as a person would open it."""

from __future__ import annotations

import re
import shutil

import optuna
import pytest

from dippm_nas import DippmError
from dippm_nas.cli import main
from dippm_nas.integration import HardwareConstraints, HardwareCostModel, HardwareObjective
from dippm_nas.integration.report import COSTS, pareto_2d, scored_trials, study_front, write_report
from search_spaces import get_search_space

MODELS = ["resnet18", "resnet50", "mobilenetv3_large_100", "efficientnet_b0", "vit_small_patch16_224",
          "convnext_tiny", "densenet121", "regnety_040"]


@pytest.fixture(scope="module")
def study_url(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('report') / 'study.db'}"
    space = get_search_space("timm_zoo", entries=MODELS)

    def top1(candidate):
        return candidate.metadata["top1"]

    top1.metric_name = "top-1"
    cost = HardwareCostModel(device="a100-40gb", batch=256, precision="fp16")
    objective = HardwareObjective(space, top1, cost, objectives=("latency_ms", "energy_j"),
                                  constraints=HardwareConstraints(mig_profiles=("3g.20gb",)), prune_infeasible=False)
    study = optuna.create_study(study_name="zoo", storage=url, directions=objective.directions,
                                sampler=optuna.samplers.RandomSampler(seed=0))
    study.set_metric_names(objective.metric_names)
    study.optimize(objective, n_trials=16)
    return url


def test_report_renders_plots_and_pareto_table(study_url, tmp_path, capsys):
    if shutil.which("chromium") is None:
        pytest.skip("Debian's chromium is not installed (`.ci/run` installs it)")
    from dippm_nas.integration.browser import rendered_dom

    out = tmp_path / "report.html"
    assert main(["report", "--storage", study_url, "--study", "zoo", "--out", str(out), "--png", str(tmp_path / "png"),
                 "--screenshot", str(tmp_path / "page.png")]) == 0
    html = out.read_text()
    assert "<script" in html and not re.search(r"<script[^>]*\ssrc=", html)  # plotly.js inline: opens offline
    dom = rendered_dom(out)
    study = optuna.load_study(study_name="zoo", storage=study_url)
    trials = scored_trials(study)
    for cost in COSTS:
        block = dom.split(f'id="front-{cost}"')[1].split('id="front-')[0]
        assert len(re.findall(r'<path class="point"', block)) >= len(trials)  # every trial drawn
    front = [t.number for t in study_front(study, trials)]
    table = dom.split('id="pareto-table"')[1].split("</table>")[0]
    listed = sorted(int(n) for n in re.findall(r"<tr><td>(\d+)</td>", table))
    assert listed == front and front and "top-1 (maximize), latency_ms (minimize), energy_j (minimize)" in dom
    assert 'title="' in table and "the residual applies at fp16" in table  # the notes, on hover
    assert "infeasible" in dom or all(t.constraints.get("mig:3g.20gb", 0) <= 0 for t in trials)
    assert (tmp_path / "page.png").stat().st_size > 10_000
    assert sorted(p.name for p in (tmp_path / "png").iterdir()) == sorted(f"pareto_{c}.png" for c in COSTS)


def test_report_on_unscored_study_is_a_clear_error(tmp_path):
    study = optuna.create_study()
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    with pytest.raises(DippmError, match="no completed trial scored by dippm-nas"):
        write_report(study, tmp_path / "r.html")


def test_a_large_study_is_drawn_with_webgl(study_url):
    """Ten thousand SVG markers a figure make a page slow to draw: from LARGE_STUDY trials on, WebGL."""
    from dippm_nas.integration.report import LARGE_STUDY, _front_figure

    study = optuna.load_study(study_name="zoo", storage=study_url)
    trials = scored_trials(study)
    many = trials * -(-LARGE_STUDY // len(trials))
    for shown, kind in ((trials, "scatter"), (many, "scattergl")):
        figure = _front_figure(study, shown, "latency_ms", pareto_2d(shown, "latency_ms", maximize=True))
        assert {trace.type for trace in figure.data if trace.mode == "markers"} == {kind}


def test_the_table_is_the_studys_front_and_lists_no_dominated_trial(study_url, tmp_path):
    """A trial on a plot's 2-D front (top-1 against memory, an axis the study does not minimise) that another
    trial beats on every objective of the study is no Pareto-optimal trial: the table is the study's own front,
    Optuna's best trials."""
    study = optuna.load_study(study_name="zoo", storage=study_url)
    trials = scored_trials(study)
    summary = write_report(study, tmp_path / "r.html")
    best = sorted(t.number for t in study.best_trials if all(v <= 0 for v in t.constraints.values()))
    assert list(summary.pareto) == best
    on_some_plot = {t.number for cost in COSTS for t in pareto_2d(trials, cost, maximize=True)}
    values = {t.number: t.values for t in trials}
    for number in on_some_plot - set(best):  # each dominated on the study's objectives
        assert any(values[b][0] >= values[number][0] and all(values[b][i] <= values[number][i] for i in (1, 2))
                   for b in best)


def test_on_a_gpu_without_mig_no_point_is_coloured_by_a_slice(tmp_path):
    space = get_search_space("timm_zoo", entries=MODELS[:4])
    cost = HardwareCostModel(device="rtx4090", batch=8, cost_model="analytical")
    objective = HardwareObjective(space, lambda candidate: candidate.metadata["top1"], cost)
    study = optuna.create_study(directions=objective.directions, sampler=optuna.samplers.RandomSampler(seed=0))
    study.optimize(objective, n_trials=4)
    page = write_report(study, tmp_path / "r.html").path.read_text()
    assert "fits no MIG slice" not in page and "smallest MIG profile" not in page
    assert "the GPU has no MIG, so no colour tells slices apart" in page and '"name":"feasible"' in page
