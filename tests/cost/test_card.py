"""A learned model's card guards its weights: weights trained on other inputs decline with a line that says
what to do, and the default prediction falls back to the analytical model, saying why."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import estimate_of

from dippm_nas import build_graph, predict_graph
from dippm_nas.cost.estimate import NotCovered
from dippm_nas.cost.learned.card import (
    OPERATOR_WEIGHTS,
    PMGNS_WEIGHTS,
    operator_model_mismatch,
    read_card,
    weights_available,
)
from dippm_nas.cost.models import forget_loaded
from dippm_nas.cost.models.operators import OperatorCostModel
from dippm_nas.cost.models.pmgns import PMGNSCostModel, contract
from dippm_nas.cost.pipeline import roofline
from dippm_nas.errors import DippmError

pytestmark = pytest.mark.skipif(not weights_available(PMGNS_WEIGHTS),
                                reason="no shipped weights (run `dippm-nas train`)")


@pytest.fixture(scope="module")
def graph():
    return build_graph("resnet18", batch=8)


def _copy_with_card(tmp_path, change) -> PMGNSCostModel:
    """The shipped weights beside a copy of their card that ``change`` edited."""
    for suffix in (".safetensors", ".json"):
        shutil.copy(PMGNS_WEIGHTS.with_suffix(suffix), tmp_path / f"pmgns{suffix}")
    raw = read_card(tmp_path / "pmgns")
    change(raw["contract"])
    (tmp_path / "pmgns.json").write_text(json.dumps(raw))
    return PMGNSCostModel(tmp_path / "pmgns")


def test_the_shipped_card_matches_this_version(graph):
    recorded, current = read_card(PMGNS_WEIGHTS)["contract"], contract(with_reference_inputs=False)
    assert recorded["vocabulary"] == current["vocabulary"]
    assert recorded["node_features"] == current["node_features"]
    assert predict_graph(graph, "a100-40gb", cost_model="pmgns").cost_model.startswith("pmgns")


def test_card_mismatch(tmp_path, graph, monkeypatch):
    """A card of another vocabulary, or reference inputs the analytical model no longer gives: PMGNS declines
    with a line that says what to do."""
    gpu = "rtx4090"
    other_vocabulary = _copy_with_card(tmp_path, lambda c: c.update(
        vocabulary="0" * 64, node_features=[n for n in c["node_features"] if n != "kind=gelu"]))
    with pytest.raises(NotCovered, match="another operator vocabulary \\(added: gelu\\).*dippm-nas train"):
        estimate_of(other_vocabulary, graph, gpu, "fp16")
    (tmp_path / "inputs").mkdir()
    moved = _copy_with_card(tmp_path / "inputs", lambda c: c["reference_inputs"][next(iter(c["reference_inputs"]))]
                            .__setitem__(0, 123.0))
    with pytest.raises(NotCovered, match="inputs PMGNS was trained on have changed.*dippm-nas train"):
        estimate_of(moved, graph, gpu, "fp16")
    # the analytical model itself changed: PMGNS declines every request, saying why
    monkeypatch.setattr(roofline, "KERNEL_OVERHEAD_US", roofline.KERNEL_OVERHEAD_US * 2)
    forget_loaded()
    try:
        with pytest.raises(DippmError, match="have changed in this version.*dippm-nas train"):  # one line in the CLI
            predict_graph(graph, "rtx4090", "fp16", "pmgns")
    finally:
        monkeypatch.undo()
        forget_loaded()
    assert predict_graph(graph, "rtx4090", "fp16", "pmgns").cost_model.startswith("pmgns")


def test_an_operator_model_of_other_features_declines(tmp_path, graph):
    for suffix in (".safetensors", ".json"):
        shutil.copy(OPERATOR_WEIGHTS.with_suffix(suffix), tmp_path / f"operators{suffix}")
    card = read_card(tmp_path / "operators")
    (tmp_path / "operators.json").write_text(json.dumps(dict(card, features=card["features"][:-1])))
    reason = operator_model_mismatch(tmp_path / "operators")
    assert reason is not None and "dippm-nas train --operators" in reason
    assert "no trained weights" in operator_model_mismatch(tmp_path / "elsewhere")
    with pytest.raises(DippmError, match="trained on other features.*dippm-nas train --operators"):
        estimate_of(OperatorCostModel(tmp_path / "operators"), graph, "rtx4090", "fp16")


def test_the_shipped_reference_graphs_are_what_their_command_builds(tmp_path, monkeypatch):
    """`dippm-nas train --reference-graphs` rebuilds, to the byte, the graphs the cards' contract is checked on."""
    from dippm_nas.cli import main
    from dippm_nas.cost.models import pmgns

    shipped = pmgns.REFERENCE_GRAPHS.read_text()
    monkeypatch.setattr(pmgns, "REFERENCE_GRAPHS", tmp_path / "reference_graphs.json")
    try:
        assert main(["train", "--reference-graphs"]) == 0
        assert (tmp_path / "reference_graphs.json").read_text() == shipped
    finally:
        monkeypatch.undo()
        forget_loaded()
