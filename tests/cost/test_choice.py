"""The default cost model is chosen in one place: the operator model, its residual where the card turns it on,
the roofline where the operator model declines."""

import pytest

from dippm_nas import build_graph, predict_graph


@pytest.fixture(scope="module")
def graph():
    return build_graph("resnet18", batch=16)


@pytest.fixture
def card(monkeypatch):
    """Regimes of the test's own in place of the shipped residual card's (its weights stay the shipped ones)."""
    from dippm_nas.cost.models import auto

    shipped = auto.residual_regime

    def write(regimes):
        monkeypatch.setattr(auto, "residual_regime",
                            lambda precision, batch: shipped(precision, batch, {"regimes": regimes}))

    return write


@pytest.mark.parametrize("device, precision", [("a100-40gb", "fp32"), ("h100-sxm", "fp16"), ("t4", "fp16"),
                                               ("rtx5090", "bf16-weights"), ("h100-sxm:1g.10gb", "fp16"),
                                               ("l4", "fp16")])
def test_with_the_residual_off_auto_is_the_operator_model(graph, card, device, precision):
    card([])
    auto = predict_graph(graph, device, precision)
    named = predict_graph(graph, device, precision, "operators")
    assert auto.answered_by == named.answered_by == "operators" and auto.cost_model == "operators"
    assert (auto.latency_ms, auto.energy_j, auto.memory_mib) == (named.latency_ms, named.energy_j, named.memory_mib)
    assert auto.latency_error == named.latency_error and auto.notes == named.notes


def test_auto_falls_back_to_the_roofline_where_the_operator_model_declines(graph, monkeypatch):
    from dippm_nas.cost.models.operators import OperatorCostModel

    reason = "the operator model was trained on other features than this version computes"
    monkeypatch.setattr(OperatorCostModel, "covers", lambda self, request: reason)
    p = predict_graph(graph, "a100-40gb")
    assert p.answered_by == "analytical" and p.latency_ms > 0
    assert f"{reason}: analytical (roofline) estimate" in p.notes


def test_the_residual_answers_in_the_regimes_the_card_lists_and_says_so(graph, card):
    card([{"precision": "fp16", "batch_min": 9, "batch_max": 64, "gpus": ["h100-sxm", "rtx4090"],
           "operators_mape": {"h100-sxm": 0.3, "rtx4090": 0.5}, "residual_mape": {"h100-sxm": 0.2, "rtx4090": 0.1}}])
    corrected = predict_graph(graph, "l4", "fp16")  # a GPU the operator model never learned from
    operators = predict_graph(graph, "l4", "fp16", "operators")
    assert corrected.answered_by == "residual"
    named = predict_graph(graph, "l4", "fp16", "residual")
    assert (corrected.latency_ms, corrected.estimate.nodes) == (named.latency_ms, named.estimate.nodes)
    note = next(n for n in corrected.notes if n.startswith("the residual applies"))
    assert "at fp16, batch 9-64" in note and "rtx4090 10% against 50%" in note
    moved = corrected.latency_ms / operators.latency_ms - 1
    assert f"moved the operator model's {operators.latency_ms:.4g} ms by {moved:+.1%}" in " ".join(corrected.notes)
    assert 0.5 <= corrected.latency_ms / operators.latency_ms <= 2.0
    for other in ({"precision": "fp32"}, {"precision": "bf16-weights"}, {"precision": "fp16", "mode": "cuda-graphs"}):
        assert predict_graph(graph, "l4", **other).answered_by == "operators", other  # no regime holds it
    assert predict_graph(build_graph("resnet18", batch=128), "l4", "fp16").answered_by == "operators"
    # where the operator model learned from the GPU's own measurements it answers alone
    assert predict_graph(graph, "h100-sxm", "fp16").answered_by == "operators"


def test_the_shipped_card_says_where_the_residual_is_on():
    """Each regime: a precision, a batch range, and the held-out GPUs whose figures turned it on."""
    from dippm_nas.cost.learned.card import RESIDUAL_WEIGHTS, read_card
    from dippm_nas.cost.models.residual import operator_model_fingerprint

    shipped = read_card(RESIDUAL_WEIGHTS)
    assert shipped["config"]["base"] == "operators" and shipped["base_fingerprint"] == operator_model_fingerprint()
    assert "leave-one-gpu-out" in shipped["chosen_by"]
    for regime in shipped["regimes"]:
        assert regime["batch_min"] <= regime["batch_max"] and len(regime["gpus"]) >= 2
        assert all(regime["residual_mape"][g] < regime["operators_mape"][g] for g in regime["gpus"])
