"""A learned model's card guards its weights: weights trained on other inputs decline with a line that says
what to do, and the default prediction falls back to the analytical model, saying why."""

from __future__ import annotations

import json
import shutil

import pytest

from dippm_nas import _predict, build_graph, predict_graph
from dippm_nas.cost import analytical
from dippm_nas.cost.base import NotCovered
from dippm_nas.cost.card import OPERATOR_WEIGHTS, WEIGHTS, contract, operator_model_mismatch, read_card
from dippm_nas.cost.learned import PMGNSCostModel, available, forget_loaded
from dippm_nas.cost.operator_cost import OperatorCostModel
from dippm_nas.errors import DippmError
from dippm_nas.hardware import get_device

pytestmark = pytest.mark.skipif(not available(), reason="no shipped weights (run `dippm-nas train`)")


@pytest.fixture(scope="module")
def graph():
    return build_graph("resnet18", batch=8)


def _copy_with_card(tmp_path, change) -> PMGNSCostModel:
    """The shipped weights beside a copy of their card that ``change`` edited."""
    for suffix in (".safetensors", ".json"):
        shutil.copy(WEIGHTS.joinpath("pmgns").with_suffix(suffix), tmp_path / f"pmgns{suffix}")
    raw = read_card(tmp_path / "pmgns")
    change(raw["contract"])
    (tmp_path / "pmgns.json").write_text(json.dumps(raw))
    return PMGNSCostModel(tmp_path / "pmgns")


def test_the_shipped_card_matches_this_version(graph):
    recorded = read_card(WEIGHTS / "pmgns")["contract"]
    assert recorded["vocabulary"] == contract()["vocabulary"]
    assert recorded["node_features"] == contract()["node_features"]
    assert predict_graph(graph, "a100-40gb", cost_model="pmgns").cost_model.startswith("pmgns")


def test_card_mismatch(tmp_path, graph, monkeypatch):
    """A card of another vocabulary, or reference inputs the analytical model no longer gives: PMGNS declines
    with a line that says what to do."""
    gpu = get_device("rtx4090")
    other_vocabulary = _copy_with_card(tmp_path, lambda c: c.update(
        vocabulary="0" * 64, node_features=[n for n in c["node_features"] if n != "kind=gelu"]))
    with pytest.raises(NotCovered, match="another operator vocabulary \\(added: gelu\\).*dippm-nas train"):
        other_vocabulary.estimate(graph, gpu, "fp16")
    (tmp_path / "inputs").mkdir()
    moved = _copy_with_card(tmp_path / "inputs", lambda c: c["reference_inputs"][next(iter(c["reference_inputs"]))]
                            .__setitem__(0, 123.0))
    with pytest.raises(NotCovered, match="inputs PMGNS was trained on have changed.*dippm-nas train"):
        moved.estimate(graph, gpu, "fp16")
    # the analytical model itself changed: PMGNS declines every request, saying why
    monkeypatch.setattr(analytical, "KERNEL_OVERHEAD_US", analytical.KERNEL_OVERHEAD_US * 2)
    forget_loaded()
    try:
        with pytest.raises(DippmError, match="have changed in this version.*dippm-nas train"):  # one line in the CLI
            predict_graph(graph, "rtx4090", "fp16", "pmgns")
    finally:
        monkeypatch.undo()
        forget_loaded()
    assert predict_graph(graph, "rtx4090", "fp16", "pmgns").cost_model.startswith("pmgns")


def test_an_operator_model_of_other_features_declines_and_top_falls_to_the_roofline(tmp_path, graph, monkeypatch):
    for suffix in (".safetensors", ".json"):
        shutil.copy(OPERATOR_WEIGHTS.with_suffix(suffix), tmp_path / f"operators{suffix}")
    card = read_card(tmp_path / "operators")
    (tmp_path / "operators.json").write_text(json.dumps(dict(card, features=card["features"][:-1])))
    reason = operator_model_mismatch(tmp_path / "operators")
    assert reason is not None and "dippm-nas train --operators" in reason
    assert "no trained operator model" in operator_model_mismatch(tmp_path / "elsewhere")
    with pytest.raises(DippmError, match="trained on other features.*dippm-nas train --operators"):
        OperatorCostModel(tmp_path / "operators").estimate(graph, get_device("rtx4090"), "fp16")
    monkeypatch.setattr(_predict, "operator_model_mismatch", lambda: reason)
    p = predict_graph(graph, "rtx4090", "fp16", "pmgns")
    assert _predict.slowest_operators(graph, p, 3)[1] == "analytical"
