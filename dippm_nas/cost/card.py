"""The model card of learned weights: what they were trained on, and the contract of their inputs.

Weights mean something only for the inputs they were trained on. As timm's ``pretrained_cfg`` travels
with its weights, the card records that contract, and a prediction checks it before it trusts the
weights:

* the operator vocabulary (:func:`dippm_nas.graph.operators.fingerprint`) and the names of the node and
  static features, in order: a kind registered since, or one removed, moves every one-hot column;
* the inputs themselves on a few reference graphs shipped beside the weights (``reference_graphs.json``):
  the static features, the analytical latency curve, each operator's share of the time and the node
  features' column sums, at a few requests. A change to the analytical model or to the graph's columns
  moves them, and the weights' error figures would go stale without a word.

A mismatch is not an error of the user's: the learned model declines
(:class:`~dippm_nas.cost.base.NotCovered`) with a note that says why and which command retrains, and the
analytical model answers. The first check needs no torch; the second runs once per process.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dippm_nas.cost.features import node_feature_names
from dippm_nas.graph import operators

if TYPE_CHECKING:
    from dippm_nas.cost.analytical import AnalyticalCostModel
    from dippm_nas.cost.scaling import Scaling
    from dippm_nas.graph.model_graph import ModelGraph

#: Where the shipped weights (``pmgns.safetensors``), their card (``pmgns.json``) and the reference graphs live.
WEIGHTS = Path(__file__).resolve().parent / "weights"
#: The graphs the card's input reference is computed on, serialized (no TVM needed to read them).
REFERENCE_GRAPHS = WEIGHTS / "reference_graphs.json"
#: The requests each reference graph is read at: a convolution-friendly fp32 one and an autocast one, eager.
REFERENCE_REQUESTS = (
    {"device": "a100-40gb", "precision": "fp32", "batch": 8, "layout": "nchw", "torch": "2.11.0"},
    {"device": "h100-sxm", "precision": "fp16", "batch": 64, "layout": "nchw", "torch": "2.11.0"},
)
#: Relative difference under which a reference input counts as the same (rounding across platforms).
REFERENCE_RTOL = 1e-6
RETRAIN = "retrain them with `dippm-nas train` in a dippm-nas checkout (or run --cost-model analytical)"
#: Where the shipped operator model lives (``operators.safetensors`` beside its card ``operators.json``).
OPERATOR_WEIGHTS = WEIGHTS / "operators"


@dataclass(frozen=True)
class Card:
    """The model card of trained weights: what they were trained on and how to scale their inputs.

    ``devices``, ``precisions`` and ``families`` bound what the model answers for and what it has seen;
    ``raw`` is the card's JSON as written.
    """

    config: dict
    static_features: list[str]
    static_scaling: Scaling
    node_scaling: Scaling
    devices: tuple[str, ...]
    precisions: tuple[str, ...]
    families: frozenset[str]
    #: The devices whose records had each target the model corrects (TrainConfig.corrected_targets):
    #: the learned energy and memory hold only there.
    target_devices: dict[str, tuple[str, ...]]
    #: Per device, the newest PyTorch among its records: a prediction is for that runtime.
    torch_versions: dict[str, str]
    raw: dict
    #: (batch, records) over the training records: how much of the data a request's batch resembles.
    batches: tuple[tuple[int, int], ...] = ()
    #: Test MAPE of the shipped configuration on records of families it saw (random split) and, when
    #: ``dippm-nas evaluate --ship`` wrote the card, on whole families it never saw (family split).
    seen_family_mape: float | None = None
    unseen_family_mape: float | None = None

    def runtime(self, gpu: str) -> str:
        """The PyTorch a prediction on ``gpu`` is for: the newest among its records, and for a GPU the
        records never measured, the newest among all of them."""
        from dippm_nas.cost.analytical import version_numbers

        return self.torch_versions.get(gpu) or max(self.torch_versions.values(), key=version_numbers)


def read_card(path: Path) -> dict:
    """The card's JSON beside the weights at ``path`` (``pmgns`` -> ``pmgns.json``)."""
    return json.loads(path.with_suffix(".json").read_text())


@cache
def load_card(path: Path = WEIGHTS / "pmgns") -> Card:
    """The model card: what the weights were trained on, how their inputs are scaled, their test error."""
    from dippm_nas.cost.scaling import Scaling

    raw = read_card(path)
    return Card(raw["config"], raw["static_features"], Scaling.from_json(raw["static_scaling"]),
                Scaling.from_json(raw["node_scaling"]), tuple(raw["devices"]),
                tuple(raw["precisions"]), frozenset(raw["families"]),
                {t: tuple(d) for t, d in raw["target_devices"].items()}, raw["torch_versions"], raw,
                tuple((b, c) for b, c in raw.get("batches", ())), raw.get("test_latency", {}).get("mape"),
                raw.get("held_out_family_latency", {}).get("mape"))


@cache
def operator_model_mismatch(path: Path = OPERATOR_WEIGHTS) -> str | None:
    """Why the operator model at ``path`` cannot answer, or None where it can: no weights, or a card of other
    features than this version computes. Needs no torch; read once per path, since every prediction asks
    (``dippm-nas train --operators`` forgets it when it writes new weights)."""
    from dippm_nas.cost.kernel_structure import FEATURE_NAMES

    if not (path.with_suffix(".safetensors").exists() and path.with_suffix(".json").exists()):
        return f"no trained operator model at {path}.safetensors (run `dippm-nas train --operators`)"
    if read_card(path).get("features") != list(FEATURE_NAMES):
        return ("the operator model was trained on other features than this version computes: retrain it with "
                "`dippm-nas train --operators` in a dippm-nas checkout")
    return None


# ---- the contract -------------------------------------------------------------------------------


def contract(analytical: AnalyticalCostModel | None = None) -> dict:
    """This version's side of the contract, as a card records it: the vocabulary's fingerprint, the node
    feature names and, given the analytical model, the reference inputs (:func:`reference_inputs`)."""
    terms: dict = {"vocabulary": operators.fingerprint(), "node_features": node_feature_names()}
    if analytical is not None:
        terms["reference_inputs"] = reference_inputs(analytical)
    return terms


def vocabulary_mismatch(raw: dict) -> str | None:
    """Why weights whose card is ``raw`` cannot read this version's node features, or None where they can:
    the vocabulary they were trained with differs (kinds registered since, or removed). Needs no torch."""
    recorded = raw.get("contract", {})
    if recorded.get("vocabulary") == operators.fingerprint():
        return None
    names = node_feature_names()
    trained = recorded.get("node_features")
    if trained is None:
        return ("PMGNS's card records no operator vocabulary, so its weights cannot be checked against this one: "
                + RETRAIN)
    added = [n.split("=", 1)[1] for n in names if n not in trained and n.startswith(("kind=", "category="))]
    removed = [n.split("=", 1)[1] for n in trained if n not in names and n.startswith(("kind=", "category="))]
    change = "; ".join(part for part in (f"added: {', '.join(added)}" if added else "",
                                         f"removed: {', '.join(removed)}" if removed else "") if part)
    return (f"PMGNS was trained with another operator vocabulary ({change or 'the same kinds in another order'}), "
            f"so its node features would mean something else: {RETRAIN}")


@cache
def _reference_graphs(path: Path = REFERENCE_GRAPHS) -> tuple[ModelGraph, ...]:
    from dippm_nas.graph.serialize import graph_from_bytes

    stored = json.loads(path.read_text())
    return tuple(graph_from_bytes(base64.b64decode(blob)) for blob in stored.values())


def reference_inputs(analytical: AnalyticalCostModel, graphs: tuple[ModelGraph, ...] | None = None) -> dict:
    """What the learned model reads of each reference graph at each of :data:`REFERENCE_REQUESTS`, by name:
    its static features, latency curve, operators' time shares and node features' column sums."""
    from dippm_nas.cost.features import node_feature_matrix
    from dippm_nas.cost.learned_inputs import record_inputs
    from dippm_nas.cost.table import node_table
    from dippm_nas.graph.batching import scale_batch

    values: dict[str, list[float]] = {}
    for graph in graphs if graphs is not None else _reference_graphs():
        for request in REFERENCE_REQUESTS:
            scaled = scale_batch(graph, request["batch"])
            table = node_table(scaled)
            inputs = record_inputs(table, request, analytical)
            name = f"{graph.name}@{request['device']}:{request['precision']}:b{request['batch']}"
            values[f"{name}:static"] = [inputs.features[k] for k in sorted(inputs.features)]
            values[f"{name}:latency_curve"] = inputs.latency_curve.tolist()
            values[f"{name}:time_share"] = inputs.time_share.astype(float).tolist()
            values[f"{name}:node_features"] = node_feature_matrix(table).double().sum(dim=0).tolist()
    return values


def reference_mismatch(raw: dict, analytical: AnalyticalCostModel) -> str | None:
    """Why weights whose card is ``raw`` were trained on other inputs than this version computes, or None:
    the first reference input that moved by more than :data:`REFERENCE_RTOL`."""
    recorded = raw.get("contract", {}).get("reference_inputs")
    if recorded is None:
        return ("PMGNS's card records no reference inputs, so its weights cannot be checked against this version: "
                + RETRAIN)
    current = reference_inputs(analytical)
    for name in sorted(set(recorded) | set(current)):
        before, now = recorded.get(name), current.get(name)
        if before is None or now is None or len(before) != len(now) or not np.allclose(
                now, before, rtol=REFERENCE_RTOL, atol=REFERENCE_RTOL):
            return (f"the inputs PMGNS was trained on have changed in this version ({name} differs on its reference "
                    f"graphs: the analytical model or the graph's columns moved), so its correction no longer "
                    f"applies: {RETRAIN}")
    return None


def write_reference_graphs(graphs: list[ModelGraph], path: Path = REFERENCE_GRAPHS) -> None:
    """Store the reference graphs (serialized, base64) that :func:`reference_inputs` reads."""
    from dippm_nas.graph.serialize import graph_to_bytes

    path.write_text(json.dumps({g.name: base64.b64encode(graph_to_bytes(g)).decode() for g in graphs}, indent=1)
                    + "\n")
    _reference_graphs.cache_clear()
