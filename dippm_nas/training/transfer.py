"""Leave one GPU out: what a user of a GPU the model never saw gets.

For each GPU with data, the learned models are trained without any of its records (PMGNS early stopping
on a validation share of the other GPUs' records, so nothing is chosen on the held-out GPU; the operator
model also without its operators) and tested on all of them, beside the analytical model, which has
nothing to train. Figures per GPU, and per
precision and batch range within it, for latency and, where the GPU's records measured it, energy.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, field

import numpy as np

from dippm_nas.training.dataset import TrainingSet
from dippm_nas.training.evaluate import prediction_rows
from dippm_nas.training.metrics import summary
from dippm_nas.training.operator_data import OperatorSamples
from dippm_nas.training.operator_records import RecordSet
from dippm_nas.training.records import Record
from dippm_nas.training.splits import Split, leave_gpu_out
from dippm_nas.training.train import TrainConfig, applied_corrections, fit_split, predict_targets

#: The models a leave-one-GPU-out run can score; ``operators`` and ``pmgns`` train once per held-out GPU.
TRANSFER_MODELS = ("analytical", "operators", "pmgns")
#: Batch ranges the figures are broken down by: (label, smallest, largest).
BATCH_RANGES = (("1", 1, 1), ("2-8", 2, 8), ("9-64", 9, 64), ("65-256", 65, 256), (">256", 257, 1 << 30))
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
    #: (``docs/accuracy/transfer_predictions.csv``, where the error table reads PMGNS's error on a new GPU).
    prediction_rows: list[dict[str, object]] = field(default_factory=list)

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


def _operators_without(gpu: str, test: list[Record], data: tuple[OperatorSamples, RecordSet] | None) -> np.ndarray:
    """Latency and energy of the ``test`` records by the operator model trained without ``gpu`` (and a GPU of
    the same chip): neither its operators nor its records."""
    import tempfile
    from pathlib import Path

    from dippm_nas.cost.operator_cost import OperatorCostModel
    from dippm_nas.graph.batching import scale_batch
    from dippm_nas.hardware.registry import get_device
    from dippm_nas.training.dataset import load_graphs
    from dippm_nas.training.operator_training import chip_of, fit_without

    if data is None:
        raise ValueError("scoring the operator model needs its operator samples and training records")
    samples, records = data
    model = fit_without(chip_of(gpu), samples, records)
    graphs = load_graphs({r.graph_key for r in test})
    out = np.full((len(test), 2), np.nan)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "operators"
        model.save(path)
        cost = OperatorCostModel(path)
        for i, r in enumerate(test):
            graph = scale_batch(graphs[r.graph_key], r.batch)
            estimate = cost.estimate(graph, get_device(r.device), r.precision, r.layout)
            out[i] = estimate.latency_ms, estimate.energy_j
    return out


def evaluate_transfer(ts: TrainingSet, config: TrainConfig, gpus: list[str] | None = None,
                      models: tuple[str, ...] = TRANSFER_MODELS, progress: bool = True,
                      operator_data: tuple[OperatorSamples, RecordSet] | None = None) -> TransferEvaluation:
    """Hold out each GPU of ``gpus`` (default: every GPU in ``ts``) in turn and score ``models`` on it;
    ``operators`` needs ``operator_data`` (its operator samples and training records)."""
    unknown = set(models) - set(TRANSFER_MODELS)
    if unknown:
        raise ValueError(f"unknown models {sorted(unknown)}; known: {', '.join(TRANSFER_MODELS)}")
    devices = ts.devices
    result = TransferEvaluation(config, tuple(models))
    for gpu in gpus or sorted(set(devices)):
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
            predicted["operators"] = _operators_without(gpu, [ts.records[i] for i in split.test], operator_data)
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
    return result
