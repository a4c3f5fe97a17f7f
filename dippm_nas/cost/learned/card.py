"""The model card of learned weights, one format for the operator model, PMGNS and its residual: what the weights
were trained on, and the contract of their inputs.

Weights mean something only for the inputs they were trained on. As timm's ``pretrained_cfg`` travels with its
weights, the card records that contract, and a prediction checks it before it trusts the weights:

* the operator model's card names its features (:data:`~dippm_nas.cost.learned.kernel_structure.FEATURE_NAMES`);
* a graph network's card records the operator vocabulary (:func:`dippm_nas.graph.operators.fingerprint`) and the
  names of the node and static features, in order: a kind registered since, or one removed, moves every one-hot
  column; and the inputs themselves on a few reference graphs shipped beside the weights
  (``reference_graphs.json``, checked by :mod:`dippm_nas.cost.models.pmgns`).

A mismatch is not an error of the user's: the learned model declines
(:class:`~dippm_nas.cost.estimate.NotCovered`) with a note that says why and which command retrains, and another
model answers. Reading a card needs no torch, so a command answers before torch loads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from dippm_nas.cost.learned.features import node_feature_names
from dippm_nas.graph import operators
from dippm_nas.precisions import PRECISIONS
from dippm_nas.request import version_numbers

if TYPE_CHECKING:
    from dippm_nas.cost.learned.scaling import Scaling

#: Where the shipped weights (``<name>.safetensors``), their cards (``<name>.json``) and the reference graphs live.
WEIGHTS = Path(__file__).resolve().parent / "weights"
#: The operator model, PMGNS and the residual (PMGNS over the operator model) as shipped.
OPERATOR_WEIGHTS = WEIGHTS / "operators"
PMGNS_WEIGHTS = WEIGHTS / "pmgns"
RESIDUAL_WEIGHTS = WEIGHTS / "residual"
RETRAIN = "retrain them with `dippm-nas train` in a dippm-nas checkout (or run --cost-model analytical)"


def weights_available(path: Path) -> bool:
    """Whether trained weights are at ``path``: both the ``.safetensors`` file and its ``.json`` card."""
    return path.with_suffix(".safetensors").exists() and path.with_suffix(".json").exists()


def read_card(path: Path) -> dict:
    """The card's JSON beside the weights at ``path`` (``pmgns`` -> ``pmgns.json``), as written."""
    return json.loads(path.with_suffix(".json").read_text())


@dataclass(frozen=True, eq=False)
class Card:
    """The card of the weights at ``path``: ``raw`` is its JSON as written; the properties read it.

    A graph network's card (PMGNS, the residual) has ``devices``, ``precisions`` and ``families``, which bound what
    it answers for and what it has seen, the scalings of its inputs and its test errors; the residual's adds the
    ``regimes`` where ``auto`` applies it and the fingerprint of the operator model it corrects. The operator
    model's names the GPUs whose operators (``trained_on``) and whole-model records (``records``) it learned from.
    """

    path: Path
    raw: dict

    @property
    def gpus_in_training(self) -> frozenset[str]:
        """The GPUs whose measurements the weights learned from."""
        return frozenset(self.raw.get("trained_on", ())) | frozenset(self.raw.get("records", ())) | frozenset(
            self.raw.get("devices", ()))

    @property
    def config(self) -> dict:
        """The training configuration."""
        return self.raw["config"]

    @property
    def static_features(self) -> list[str]:
        """The names of the static features, in the order the network reads them."""
        return self.raw["static_features"]

    @cached_property
    def static_scaling(self) -> Scaling:
        """How the static features are scaled."""
        from dippm_nas.cost.learned.scaling import Scaling

        return Scaling.from_json(self.raw["static_scaling"])

    @cached_property
    def node_scaling(self) -> Scaling:
        """How the node features are scaled."""
        from dippm_nas.cost.learned.scaling import Scaling

        return Scaling.from_json(self.raw["node_scaling"])

    @property
    def devices(self) -> tuple[str, ...]:
        """The GPUs whose records the network trained on."""
        return tuple(self.raw["devices"])

    @property
    def precisions(self) -> tuple[str, ...]:
        """The precisions its records were measured at."""
        return tuple(self.raw["precisions"])

    @cached_property
    def families(self) -> frozenset[str]:
        """The model families of its records."""
        return frozenset(self.raw["families"])

    @cached_property
    def target_devices(self) -> dict[str, tuple[str, ...]]:
        """The devices whose records had each target the network corrects (``TrainConfig.corrected_targets``): the
        learned energy and memory hold only there."""
        return {t: tuple(d) for t, d in self.raw["target_devices"].items()}

    @property
    def torch_versions(self) -> dict[str, str]:
        """Per device, the newest PyTorch among its records: a prediction is for that runtime."""
        return self.raw["torch_versions"]

    @cached_property
    def batches(self) -> tuple[tuple[int, int], ...]:
        """(batch, records) over the training records: how much of the data a request's batch resembles."""
        return tuple((b, c) for b, c in self.raw.get("batches", ()))

    @property
    def seen_family_mape(self) -> float | None:
        """Test MAPE of the shipped configuration on records of families it saw (random split)."""
        return self.raw.get("test_latency", {}).get("mape")

    @property
    def unseen_family_mape(self) -> float | None:
        """Test MAPE on whole families it never saw (family split), where ``dippm-nas evaluate --ship`` wrote it."""
        return self.raw.get("held_out_family_latency", {}).get("mape")

    @property
    def regimes(self) -> tuple[dict, ...]:
        """A residual's regimes (a precision and a range of batches, eager) where ``auto`` applies it."""
        return tuple(self.raw.get("regimes", ()))

    def runtime(self, gpu: str) -> str:
        """The PyTorch a prediction on ``gpu`` is for: the newest among its records, and for a GPU the records
        never measured, the newest among all of them."""
        return self.torch_versions.get(gpu) or max(self.torch_versions.values(), key=version_numbers)


@cache
def load_card(path: Path) -> Card | None:
    """The card of the weights at ``path``, read once; None where no weights are there."""
    return Card(path, read_card(path)) if weights_available(path) else None


def no_weights(path: Path) -> str:
    """Why a learned model without weights at ``path`` answers nothing, and what to do."""
    command = "dippm-nas train --operators" if path.name == OPERATOR_WEIGHTS.name else "dippm-nas train"
    return f"no trained weights at {path}.safetensors (run `{command}`)"


@cache
def operator_model_mismatch(path: Path = OPERATOR_WEIGHTS) -> str | None:
    """Why the operator model at ``path`` cannot answer, or None where it can: no weights, or a card of other
    features than this version computes. Read once per path, since every prediction asks (``dippm-nas train
    --operators`` forgets it when it writes new weights)."""
    from dippm_nas.cost.learned.kernel_structure import FEATURE_NAMES

    card = load_card(path)
    if card is None:
        return no_weights(path)
    if card.raw.get("features") != list(FEATURE_NAMES):
        return ("the operator model was trained on other features than this version computes: retrain it with "
                "`dippm-nas train --operators` in a dippm-nas checkout")
    return None


def vocabulary_mismatch(card: Card) -> str | None:
    """Why a graph network whose card is ``card`` cannot read this version's node features, or None where it can:
    the vocabulary it was trained with differs (kinds registered since, or removed)."""
    recorded = card.raw.get("contract", {})
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


def read_as(precision: str, trained: tuple[str, ...]) -> str | None:
    """The precision a graph network reads a request at ``precision`` as: itself where records measured it, else
    its stand-in where records measured that, else None. The network reads the stand-in; its correction applies
    to the requested precision's own roofline.

    >>> read_as("bf16", ("fp16", "fp32")), read_as("fp32", ("fp32",)), read_as("fp32", ("fp16",))
    ('fp16', 'fp32', None)
    """
    if precision in trained:
        return precision
    stand_in = PRECISIONS[precision].stand_in
    return stand_in if stand_in in trained else None


def not_covered(precision: str, path: Path) -> str | None:
    """Why the graph network at ``path`` does not answer at ``precision``, or None where it does: wherever there are
    weights trained with this version's operator vocabulary and ``precision`` or its stand-in was measured. It
    answers on every GPU then, since it reads the GPU's spec sheet.

    >>> not_covered("fp32", PMGNS_WEIGHTS) is None
    True
    """
    card = load_card(path)
    if card is None:
        return no_weights(path)
    mismatch = vocabulary_mismatch(card)
    if mismatch:
        return mismatch
    if read_as(precision, card.precisions) is None:
        stand_in = PRECISIONS[precision].stand_in
        stand_in = f" (nor {stand_in}, which it would read it as)" if stand_in else ""
        return f"PMGNS is trained for {', '.join(card.precisions)}, not {precision}{stand_in}"
    return None
