"""The default cost model is chosen in one place: the operator model, the roofline where it declines."""

import json

import pytest

from dippm_nas import build_graph, predict_graph


@pytest.fixture(scope="module")
def graph():
    return build_graph("resnet18", batch=16)


@pytest.fixture
def card(tmp_path, monkeypatch):
    """A routing card of the test's own: PMGNS at fp16 for batches 9 to 64, or nowhere."""
    from dippm_nas.cost import choice

    path = tmp_path / "routing.json"
    monkeypatch.setattr(choice, "ROUTING", path)

    def write(regimes):
        path.write_text(json.dumps({"pmgns": regimes}))
        choice._routing.cache_clear()

    yield write
    choice._routing.cache_clear()


@pytest.mark.parametrize("device, precision", [("a100-40gb", "fp32"), ("h100-sxm", "fp16"), ("t4", "fp16"),
                                               ("rtx5090", "bf16-weights"), ("h100-sxm:1g.10gb", "fp16")])
def test_with_no_regime_of_pmgns_auto_is_the_operator_model(graph, card, device, precision):
    card([])
    auto = predict_graph(graph, device, precision)
    named = predict_graph(graph, device, precision, "operators")
    assert auto.answered_by == named.answered_by == "operators" and auto.cost_model == "operators"
    assert (auto.latency_ms, auto.energy_j, auto.memory_mib) == (named.latency_ms, named.energy_j, named.memory_mib)
    assert auto.latency_error == named.latency_error and auto.notes == named.notes


def test_auto_falls_back_to_the_roofline_where_the_operator_model_declines(graph, monkeypatch):
    from dippm_nas.cost.operator_cost import OperatorCostModel

    reason = "the operator model was trained on other features than this version computes"
    monkeypatch.setattr(OperatorCostModel, "covers", lambda self: reason)
    p = predict_graph(graph, "a100-40gb")
    assert p.answered_by == "analytical" and p.latency_ms > 0
    assert f"{reason}: analytical (roofline) estimate" in p.notes


def test_pmgns_answers_in_the_regimes_the_card_lists_and_says_so(graph, card):
    card([{"precision": "fp16", "batch_min": 9, "batch_max": 64, "gpus": ["h100-sxm", "rtx4090"],
           "operators_mape": {"h100-sxm": 0.3, "rtx4090": 0.5}, "pmgns_mape": {"h100-sxm": 0.2, "rtx4090": 0.1}}])
    learned = predict_graph(graph, "h100-sxm", "fp16")
    operators = predict_graph(graph, "h100-sxm", "fp16", "operators")
    assert learned.answered_by == "pmgns" and learned.latency_ms == predict_graph(graph, "h100-sxm", "fp16",
                                                                                   "pmgns").latency_ms
    note = next(n for n in learned.notes if n.startswith("PMGNS answered"))
    assert "at fp16, batch 9-64" in note and "rtx4090 10% against 50%" in note
    assert f"the operator model says {operators.latency_ms:.4g} ms" in note
    for other in ({"precision": "fp32"}, {"precision": "bf16"}, {"precision": "fp16", "mode": "cuda-graphs"}):
        assert predict_graph(graph, "h100-sxm", **other).answered_by == "operators", other  # no record showed it
    assert predict_graph(build_graph("resnet18", batch=128), "h100-sxm", "fp16").answered_by == "operators"
