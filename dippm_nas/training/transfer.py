"""Leave one GPU out: what a user of a GPU the model never saw gets.

For each GPU with data, the learned models are trained without any of its records (PMGNS and the residual
early stopping on a validation share of the other GPUs' records, so nothing is chosen on the held-out GPU; the
operator model also without its operators and those of another board of its chip) and tested on all of them,
beside the analytical model, which has nothing to train. The residual corrects the operator model that never
saw the GPU, and learns from every other GPU's records read the same way (:mod:`dippm_nas.training.residual_training`).
Figures per GPU, and per precision and batch range within it, for latency and, where the GPU's records measured
it, energy.
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from dippm_nas.training.dataset import TrainingSet
from dippm_nas.training.evaluate import prediction_rows
from dippm_nas.training.metrics import summary
from dippm_nas.training.operator_data import OperatorSamples
from dippm_nas.training.operator_records import RecordSet
from dippm_nas.training.residual_training import fold_operator_models, held_out_training_set, residual_config
from dippm_nas.training.splits import BATCH_RANGES, Split, leave_gpu_out
from dippm_nas.training.train import TrainConfig, applied_corrections, fit_split, predict_targets

#: The models a leave-one-GPU-out run can score; the learned ones train once per held-out GPU (the operator model
#: once per chip).
TRANSFER_MODELS = ("analytical", "operators", "residual", "pmgns")
#: The bars the cost-model issue sets on leave-one-GPU-out latency: MAPE and Kendall tau per GPU.
TRANSFER_BARS = {"mape": 0.15, "tau": 0.90}


def batch_range(batch: int) -> str:
    """The label of the :data:`BATCH_RANGES` entry that holds ``batch``.

    >>> batch_range(1), batch_range(32), batch_range(1024)
    ('1', '9-64', '>256')
    """
    return next(label for label, lo, hi in BATCH_RANGES if lo <= batch <= hi)


@dataclass
class HeldOutGpu:
    """One held-out GPU's test records and what each model predicted for them."""

    gpu: str
    split: Split
    measured: np.ndarray  # [records, targets], NaN where not measured
    predicted: dict[str, np.ndarray]  # model -> [records, targets]
    precisions: np.ndarray
    batches: np.ndarray
    best_epoch: int | None = None

    def metrics(self, target: int = 0, mask: np.ndarray | None = None) -> dict[str, dict[str, float]]:
        """Each model's MAPE, Kendall tau and share within 10 % on ``target`` (0 latency, 1 energy) over
        the records ``mask`` selects that measured it; empty where none did."""
        have = ~np.isnan(self.measured[:, target])
        if mask is not None:
            have &= mask
        if have.sum() < 2:
            return {}
        truth = self.measured[have, target]
        return {name: summary(p[have, target], truth) for name, p in self.predicted.items()}

    def breakdown(self, target: int = 0) -> list[tuple[str, int, dict[str, dict[str, float]]]]:
        """Per precision and batch range: (label, records, each model's metrics)."""
        rows = []
        ranges = np.array([batch_range(int(b)) for b in self.batches])
        have = ~np.isnan(self.measured[:, target])
        for precision in sorted(set(self.precisions)):
            for label, _, _ in BATCH_RANGES:
                mask = (self.precisions == precision) & (ranges == label)
                if (mask & have).sum() >= 2:
                    rows.append((f"{precision}, batch {label}", int((mask & have).sum()), self.metrics(target, mask)))
        return rows


@dataclass
class TransferEvaluation:
    """Every held-out GPU; :func:`dippm_nas.training.accuracy_report.write_transfer_report` renders it."""

    config: TrainConfig
    models: tuple[str, ...]
    held_out: list[HeldOutGpu] = field(default_factory=list)
    #: One row per held-out record: what it is, its measured latency and each model's
    #: (``docs/accuracy/transfer_predictions.csv``, where the error table reads the error on a new GPU).
    prediction_rows: list[dict[str, object]] = field(default_factory=list)
    #: Every record read through the operator model trained without its GPU: what the residual learns from.
    held_out_estimates: TrainingSet | None = None

    def summary(self) -> dict[str, object]:
        """The figures as JSON: per GPU, latency and energy, overall and per precision and batch range."""
        out: dict[str, object] = {"config": asdict(self.config), "models": list(self.models), "gpus": {}}
        for h in self.held_out:
            out["gpus"][h.gpu] = {
                "records": len(h.split.test), "best_epoch": h.best_epoch,
                "latency": h.metrics(0), "energy": h.metrics(1),
                "latency_breakdown": {label: {"records": n, **m} for label, n, m in h.breakdown(0)},
            }
        return out


def evaluate_transfer(ts: TrainingSet, config: TrainConfig, gpus: list[str] | None = None,
                      models: tuple[str, ...] = TRANSFER_MODELS, progress: bool = True,
                      operator_data: tuple[OperatorSamples, RecordSet] | None = None) -> TransferEvaluation:
    """Hold out each GPU of ``gpus`` (default: every GPU in ``ts``) in turn and score ``models`` on it;
    ``operators`` and ``residual`` need ``operator_data`` (its operator samples and training records)."""
    unknown = set(models) - set(TRANSFER_MODELS)
    if unknown:
        raise ValueError(f"unknown models {sorted(unknown)}; known: {', '.join(TRANSFER_MODELS)}")
    devices = ts.devices
    result = TransferEvaluation(config, tuple(models))
    with tempfile.TemporaryDirectory() as folder:
        if {"operators", "residual"} & set(models):
            if operator_data is None:
                raise ValueError("scoring the operator model needs its operator samples and training records")
            paths = fold_operator_models(sorted(set(devices)), operator_data, Path(folder))
            result.held_out_estimates = held_out_training_set(ts.records, paths)
        for gpu in gpus or sorted(set(devices)):
            _hold_out(gpu, ts, config, result, progress)
    return result


def _hold_out(gpu: str, ts: TrainingSet, config: TrainConfig, result: TransferEvaluation, progress: bool) -> None:
    """Score ``result.models`` on ``gpu``'s records, each learned model trained without them."""
    devices, models, estimates = ts.devices, result.models, result.held_out_estimates
    split = leave_gpu_out(devices, gpu, config.seed)
    if not len(split.test):
        known = ", ".join(sorted(set(devices)))
        raise ValueError(f"no record of {gpu} in the data set; GPUs with records: {known}")
    measured = ts.targets[split.test][:, :2]
    predicted = {}
    best_epoch = None
    if "analytical" in models:
        predicted["analytical"] = ts.analytical[split.test][:, :2]
    if "operators" in models:
        predicted["operators"] = estimates.analytical[split.test][:, :2]
    if "residual" in models:
        residual = fit_split(estimates, split, residual_config(config), progress=progress,
                             label=f"residual/without {gpu}")
        predicted["residual"] = predict_targets(residual, estimates, split.test)[:, :2]
    if "pmgns" in models:
        fitted = fit_split(ts, split, config, progress=progress, label=f"sage/without {gpu}")
        every = predict_targets(fitted, ts, split.test, every_correction=True)
        predicted["PMGNS"] = applied_corrections(fitted, ts, split.test, every)[:, :2]
        best_epoch = fitted.best_epoch
    records = [ts.records[i] for i in split.test]
    held = HeldOutGpu(gpu, split, measured, predicted, np.array([r.precision for r in records]),
                      np.array([r.batch for r in records]), best_epoch)
    result.held_out.append(held)
    result.prediction_rows += prediction_rows(ts, split, measured[:, 0], {k: p[:, 0] for k, p in predicted.items()})
    line = "; ".join(f"{name} MAPE {m['mape']:.1%} tau {m['tau']:.3f}" for name, m in held.metrics(0).items())
    print(f"without {gpu} ({len(split.test)} records): {line}", file=sys.stderr)
