"""Training the residual (:mod:`dippm_nas.cost.models.residual`) and choosing where ``auto`` applies it.

What the residual should learn is what the operator model misses on a GPU it never saw. So every whole-model
record is read through the operator model trained without that record's GPU (and another board of its chip,
:func:`~dippm_nas.training.operator_training.chip_of`): one fit per chip, shared by every record of it
(:func:`held_out_training_set`). The residual is PMGNS on those estimates (:data:`RESIDUAL_CONFIG`).

Leaving a GPU out of the residual's evaluation (:mod:`dippm_nas.training.transfer`) trains it on the other
GPUs' records, each read as above, and tests it on the held-out GPU's, read through the operator model that
never saw that GPU either. The other GPUs' estimates came from operator models that did see the held-out GPU;
its records are never a target, and their estimates are never read, while it is held out.

A regime (a precision and a batch range of :data:`~dippm_nas.training.splits.BATCH_RANGES`) turns the residual
on where it erred less than the operator model alone on every held-out GPU with records there
(:func:`residual_regimes`): chosen on GPUs each held out, never on a GPU a user predicts that nobody measured.
``dippm-nas evaluate --leave-one-gpu-out --ship`` writes them into the shipped residual's card.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from dippm_nas.cost.learned.pmgns_network import RESIDUAL_LOG_RATIO
from dippm_nas.training.dataset import TrainingSet, build_training_set
from dippm_nas.training.operator_data import OperatorSamples
from dippm_nas.training.operator_records import RecordSet
from dippm_nas.training.records import Record
from dippm_nas.training.splits import BATCH_RANGES
from dippm_nas.training.train import TrainConfig


def residual_config(config: TrainConfig) -> TrainConfig:
    """PMGNS's training settings ``config`` for the residual: the operator model's estimate as its base, the
    correction bounded to a factor of two."""
    return replace(config, base="operators", bound=RESIDUAL_LOG_RATIO)


#: The shipped residual's settings: PMGNS's defaults (chosen for PMGNS on its family split's validation set).
RESIDUAL_CONFIG = residual_config(TrainConfig())
#: A regime counts only with this many held-out GPUs, each with this many records in it.
MIN_GPUS, MIN_RECORDS = 2, 10
#: What the card says of its regimes and its data.
CHOSEN_BY = ("dippm-nas evaluate --leave-one-gpu-out: each GPU held out in turn, the residual against the operator "
             "model alone")
DATA = "data/records.csv, each record read through the operator model trained without its GPU's chip"


def fold_operator_models(gpus: Sequence[str], operator_data: tuple[OperatorSamples, RecordSet],
                         folder: Path) -> dict[str, Path]:
    """Per GPU of ``gpus``, the path (under ``folder``) of the operator model trained without its chip: its
    operators and whole-model records left out. One fit per chip."""
    from dippm_nas.training.operator_training import chip_of, fit_without

    samples, records = operator_data
    paths: dict[str, Path] = {}
    for chip in sorted({chip_of(gpu) for gpu in gpus}):
        path = folder / f"operators-without-{'+'.join(chip)}"
        fit_without(chip, samples, records).save(path)
        paths |= {gpu: path for gpu in chip}
    return paths


def held_out_training_set(records: list[Record], paths: dict[str, Path], store: Path | None = None) -> TrainingSet:
    """Every record with its graph, read through the operator model ``paths`` gives for its GPU
    (:func:`fold_operator_models`): the residual's training set."""
    from dippm_nas.cost.models.operators import OperatorCostModel

    models = {path: OperatorCostModel(path) for path in set(paths.values())}
    return build_training_set(records, store, base_of=lambda record: models[paths[record.device]])


def residual_regimes(summary: dict) -> list[dict[str, object]]:
    """The regimes where the residual erred less than the operator model alone on every held-out GPU with records
    there (:meth:`~dippm_nas.training.transfer.TransferEvaluation.summary`), with the figures that chose them.

    >>> row = lambda ops, res: {"records": 20, "operators": {"mape": ops}, "residual": {"mape": res}}
    >>> gpus = {g: {"latency_breakdown": {"fp16, batch 65-256": row(0.3, 0.1), "fp32, batch 1": row(0.1, 0.2)}}
    ...         for g in ("a", "b")}
    >>> [(r["precision"], r["batch_min"], r["batch_max"]) for r in residual_regimes({"gpus": gpus})]
    [('fp16', 65, 256)]
    """
    found: dict[tuple[str, str], dict[str, dict]] = {}
    for gpu, figures in summary["gpus"].items():
        for label, cell in figures.get("latency_breakdown", {}).items():
            if "operators" in cell and "residual" in cell and cell["records"] >= MIN_RECORDS:
                precision, _, batches = label.partition(", batch ")
                found.setdefault((precision, batches), {})[gpu] = cell
    regimes = []
    for (precision, batches), cells in sorted(found.items()):
        if len(cells) < MIN_GPUS or any(c["residual"]["mape"] >= c["operators"]["mape"] for c in cells.values()):
            continue
        _, low, high = next(r for r in BATCH_RANGES if r[0] == batches)
        regimes.append({"precision": precision, "batch_min": low, "batch_max": high, "gpus": sorted(cells),
                        "operators_mape": {g: round(c["operators"]["mape"], 4) for g, c in sorted(cells.items())},
                        "residual_mape": {g: round(c["residual"]["mape"], 4) for g, c in sorted(cells.items())}})
    return regimes


def ship_residual(estimates: TrainingSet, regimes: list[dict], seed: int = 0, path: Path | None = None,
                  config: TrainConfig = RESIDUAL_CONFIG) -> Path:
    """The residual trained on ``estimates`` (every record read through the operator model without its GPU;
    early stopping on a random 15 % of them, then refitted on those too, 15 % kept for a test figure), saved
    with the regimes ``auto`` applies it in and the fingerprint of the operator model it corrects; returns the
    card's path."""
    from dippm_nas.cost.learned.card import RESIDUAL_WEIGHTS
    from dippm_nas.cost.models.residual import operator_model_fingerprint
    from dippm_nas.training.metrics import summary
    from dippm_nas.training.ship import save
    from dippm_nas.training.splits import random_split
    from dippm_nas.training.train import final_training_records, fit_split, predict_targets

    path = path or RESIDUAL_WEIGHTS
    split = random_split(len(estimates.records), seed)
    fitted = fit_split(estimates, split, replace(config, seed=seed), label="residual/shipped")
    test = summary(predict_targets(fitted, estimates, split.test)[:, 0], estimates.targets[split.test, 0])
    save(fitted, estimates, final_training_records(split, fitted.config), path, {
        "split": split.description, "test_latency": test, "regimes": regimes,
        "base_fingerprint": operator_model_fingerprint(), "chosen_by": CHOSEN_BY, "data": DATA})
    return path.with_suffix(".json")


def set_regimes(regimes: list[dict], path: Path | None = None) -> Path:
    """Write ``regimes`` (:func:`residual_regimes` of a leave-one-GPU-out run) into the card of the residual shipped
    at ``path``, its weights as they are: a run that scored the residual over the same operator model and data set
    as the shipped one need not train it again. Returns the card's path."""
    from dippm_nas.cost.learned.card import RESIDUAL_WEIGHTS
    from dippm_nas.cost.models.residual import corrects_installed

    card_path = (path or RESIDUAL_WEIGHTS).with_suffix(".json")
    card = json.loads(card_path.read_text())
    if not corrects_installed(card):
        raise ValueError(f"{card_path} corrects another operator model than the one installed: ship it again "
                         "(dippm-nas evaluate --leave-one-gpu-out --ship)")
    card["regimes"] = regimes
    card["chosen_by"] = CHOSEN_BY
    card_path.write_text(json.dumps(card, indent=1))
    return card_path
