"""``dippm-nas evaluate``: every split, PMGNS against the analytical model and a log-linear baseline,
the paper's GNN comparison. It computes and returns an :class:`Evaluation`; rendering it (``docs/accuracy.md``,
plots, the predictions CSV) is :mod:`dippm_nas.training.accuracy_report`'s job."""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass

import numpy as np

from dippm_nas.cost.learned.pmgns_network import TARGETS
from dippm_nas.training.dataset import TrainingSet
from dippm_nas.training.metrics import (
    cluster_bootstrap,
    kendall_tau,
    mape,
    median_ratio,
    summary,
    tau_by_error_part,
)
from dippm_nas.training.splits import Split, device_split, family_split, random_split
from dippm_nas.training.train import (
    Fitted,
    TrainConfig,
    applied_corrections,
    final_training_records,
    fit,
    fit_split,
    predict_targets,
)

COMPARISON = ("sage", "gcn", "gat", "gin", "mlp")
BARS = {"random": {"mape": 0.05}, "family": {"mape": 0.12, "tau": 0.93},
        "rtx3090->rtx4090": {"mape": 0.15, "tau": 0.93}}
#: The bars for energy and memory: test MAPE with whole families held out.
TARGET_BARS = {("family", "energy_j"): 0.10, ("family", "memory_mb"): 0.05}


#: Train on the first GPU's records, test on the second's.
DEVICE_PAIRS = (("rtx3090", "rtx4090"), ("rtx4090", "rtx3090"))
SPLIT_NAMES = ("random", "family", *(f"{a}->{b}" for a, b in DEVICE_PAIRS))


def splits_for(ts: TrainingSet, seed: int = 0) -> list[Split]:
    """The splits named in :data:`SPLIT_NAMES`, in that order."""
    return [random_split(len(ts.records), seed), family_split(ts.families, seed),
            *(device_split(ts.devices, a, b, seed) for a, b in DEVICE_PAIRS)]


def _loglinear_features(ts: TrainingSet, idx: np.ndarray) -> np.ndarray:
    names = ts.static_names
    col = {n: i for i, n in enumerate(names)}
    s = ts.static[idx]
    log_batch = s[:, col["batch"]]
    rows = [np.ones(len(idx)), log_batch + s[:, col["log_macs"]], log_batch + s[:, col["log_activation_bytes"]],
            s[:, col["log_params"]], log_batch, s[:, col["dev_log_tensor_tflops"]], s[:, col["dev_log_bw_gbs"]]]
    return np.stack(rows, axis=1)


def loglinear(ts: TrainingSet, split: Split, fitted_on: np.ndarray) -> np.ndarray:
    """Least squares of log latency on log GMACs, log activations, log parameters (times batch),
    log batch and the device's log peak and bandwidth: the baseline the issue names. It has nothing
    to choose, so it is fitted on the records PMGNS was finally trained on (``fitted_on``)."""
    a = _loglinear_features(ts, fitted_on)
    y = np.log(ts.targets[fitted_on, 0])
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    return np.exp(_loglinear_features(ts, split.test) @ coef)


#: Families listed per split in the error breakdown: those that add the most to the test MAPE.
WORST_FAMILIES = 6


def _breakdown(ts: TrainingSet, split: Split, predicted: np.ndarray, measured: np.ndarray,
               analytical: np.ndarray) -> list[str]:
    """Where a split's PMGNS error comes from: a bias common to the whole test set (what a GPU never
    seen in training leaves), the models' own errors against their configurations' (batch, GPU,
    runtime), and by memory layout, by PyTorch version, by family.

    A family's share is its part of the split's total absolute percentage error, so a small family
    predicted very badly shows up next to a large one predicted a little badly.
    """
    ratio = median_ratio(predicted, measured)
    unbiased, own = tau_by_error_part(predicted, measured, ts.graph_of[split.test])
    parts = [f"bias: median predicted / measured {ratio:.3f} (the analytical model's "
             f"{median_ratio(analytical, measured):.3f}); with it divided out, "
             f"MAPE {mape(predicted / ratio, measured):.1%}",
             f"models against configurations: Kendall tau {unbiased:.3f} with each model's mean log error divided out "
             f"(its configurations' errors alone), {own:.3f} with only that mean left (the models' own errors alone)"]
    errors = np.abs(predicted / measured - 1)
    records = [ts.records[i] for i in split.test]
    groups = {"layout": [r.layout for r in records], "PyTorch": [r.torch for r in records],
              "family": [r.family for r in records]}
    for label, values in groups.items():
        values = np.array(values)
        rows = [(v, int((values == v).sum()), float(errors[values == v].mean()),
                 float(errors[values == v].sum() / errors.sum())) for v in np.unique(values)]
        rows.sort(key=lambda r: -r[3])
        if label == "family":
            rows = rows[:WORST_FAMILIES]
        parts.append(f"{label}: " + ", ".join(f"{v} {n} rec. {e:.1%} MAPE ({share:.0%} of the error)"
                                              for v, n, e, share in rows))
    return parts


#: What identifies a record in predictions.csv, beside its split and the latencies.
PREDICTION_KEYS = ("model", "family", "device", "batch", "image_size", "precision", "layout", "torch")


def prediction_rows(ts: TrainingSet, split: Split, measured: np.ndarray,
                     predictions: dict[str, np.ndarray]) -> list[dict[str, object]]:
    """One row per test record of ``split``: what it is, its measured latency and each model's prediction."""
    rows = []
    for k, i in enumerate(split.test):
        record = ts.records[i]
        row: dict[str, object] = {"split": split.name, **{key: getattr(record, key) for key in PREDICTION_KEYS},
                                  "measured_ms": f"{measured[k]:.6g}"}
        row.update({f"{name.split(' ')[0].lower().replace('-', '_')}_ms": f"{p[k]:.6g}"
                    for name, p in predictions.items()})
        rows.append(row)
    return rows


def format_metrics(m: dict[str, float]) -> str:
    """MAPE, Kendall tau and the share within 10 % as a table's cells."""
    return f"{m['mape']:.1%} | {m['tau']:.3f} | {m['within10']:.1%}"


def format_intervals(m: dict) -> str:
    """The bootstrap intervals of MAPE and tau as one table cell."""
    (mape_low, mape_high), (tau_low, tau_high) = m["mape_interval"], m["tau_interval"]
    return f"{mape_low:.1%}-{mape_high:.1%}, {tau_low:.3f}-{tau_high:.3f}"


#: The energy and memory tables' row for a head whose correction the configuration does not apply.
UNAPPLIED = "PMGNS's correction, not applied"


@dataclass
class SplitOutcome:
    """One split's test set as the shipped configuration predicts it, beside the baselines."""

    split: Split
    fitted: Fitted
    measured: np.ndarray  # latency (ms) of the test records
    latency: dict[str, np.ndarray]  # each model's predicted latency, by the name the tables print
    metrics: dict[str, dict]  # each model's latency metrics, with their bootstrap intervals
    #: Energy and memory where the test records have them: (measured, predictions by model name).
    other_targets: dict[str, tuple[np.ndarray, dict[str, np.ndarray]]]
    breakdown: list[str]  # where the PMGNS error comes from (:func:`_breakdown`)

    @property
    def bar_met(self) -> bool | None:
        """Whether PMGNS meets the split's bar (:data:`BARS`); None where the split has none."""
        bar = BARS.get(self.split.name)
        if not bar:
            return None
        m = self.metrics["PMGNS (GraphSAGE)"]
        return all(m[k] <= v if k == "mape" else m[k] >= v for k, v in bar.items())


@dataclass
class Evaluation:
    """What ``dippm-nas evaluate`` measured: every split, the GNN comparison, every test prediction.
    :func:`dippm_nas.training.accuracy_report.write_report` renders it."""

    config: TrainConfig
    comparison_epochs: int
    outcomes: list[SplitOutcome]
    comparison: dict[str, dict[str, dict[str, float]]]  # split -> convolution -> metrics
    prediction_rows: list[dict[str, object]]
    results: dict[str, object]  # the JSON summary (``docs/accuracy/results.json``)


def evaluate(ts: TrainingSet, config: TrainConfig, comparison_epochs: int,
             comparison_splits: tuple[str, ...] = ("random", "family"), ship=None) -> Evaluation:
    """Train and test on every split of :data:`SPLIT_NAMES` and run the paper's GNN comparison.

    ``ship(fitted, split, test_metrics, held_out_family)`` receives the random split's GraphSAGE model,
    the very model ``dippm-nas train`` fits with the same seed and configuration (so one run can also
    ship it), once every split is done: its card then also says how the configuration fares on families
    it never saw."""
    results: dict[str, object] = {"config": asdict(config), "splits": {}, "comparison": {}}
    outcomes: list[SplitOutcome] = []
    predictions: list[dict[str, object]] = []
    for split in splits_for(ts, config.seed):
        fitted = fit_split(ts, split, config, label=f"sage/{split.name}")
        measured = ts.targets[split.test, 0]
        every = predict_targets(fitted, ts, split.test, every_correction=True)
        pmgns = applied_corrections(fitted, ts, split.test, every)
        preds = {"PMGNS (GraphSAGE)": pmgns[:, 0],
                 "analytical": ts.analytical[split.test, 0],
                 "log-linear": loglinear(ts, split, final_training_records(split, config))}
        metrics = {name: summary(p, measured) for name, p in preds.items()}
        families = ts.families[split.test]
        for name, p in preds.items():
            for metric, fn in (("mape", mape), ("tau", kendall_tau)):
                metrics[name][f"{metric}_interval"] = cluster_bootstrap(fn, p, measured, families)
        results["splits"][split.name] = {"description": split.description, "metrics": metrics,
                                         "best_epoch": fitted.best_epoch, "epochs_run": fitted.epochs_run,
                                         "val_mape": fitted.best_val_mape, "n_train": len(split.train),
                                         "n_val": len(split.val), "n_test": len(split.test)}
        predictions += prediction_rows(ts, split, measured, preds)
        other: dict[str, tuple[np.ndarray, dict[str, np.ndarray]]] = {}
        for t, target in enumerate(TARGETS[1:], start=1):
            have = ~np.isnan(ts.targets[split.test, t])
            if have.any():
                truth = ts.targets[split.test, t][have]
                both = {"PMGNS (GraphSAGE)": pmgns[have, t], "analytical": ts.analytical[split.test, t][have]}
                if target not in config.corrected_targets:
                    both[UNAPPLIED] = every[have, t]
                results["splits"][split.name][target] = {name: summary(p, truth) for name, p in both.items()}
                other[target] = (truth, both)
        outcomes.append(SplitOutcome(split, fitted, measured, preds, metrics, other,
                                     _breakdown(ts, split, pmgns[:, 0], measured, preds["analytical"])))
        print(f"{split.name}: "
              + "; ".join(f"{n} {format_metrics(m)} ({format_intervals(m)})" for n, m in metrics.items()),
              file=sys.stderr)
    if ship is not None:
        random = next(o for o in outcomes if o.split.name == "random")
        ship(random.fitted, random.split, random.metrics["PMGNS (GraphSAGE)"],
             held_out_family=results["splits"]["family"]["metrics"]["PMGNS (GraphSAGE)"])
    for split in [s for s in splits_for(ts, config.seed) if s.name in comparison_splits]:
        for conv in COMPARISON:
            cfg = TrainConfig(**{**asdict(config), "conv": conv, "epochs": comparison_epochs, "refit": False})
            fitted = fit(ts, split.train, split.val, cfg, label=f"{conv}/{split.name}")
            m = summary(predict_targets(fitted, ts, split.test)[:, 0], ts.targets[split.test, 0])
            results["comparison"].setdefault(split.name, {})[conv] = m
    return Evaluation(config, comparison_epochs, outcomes, results["comparison"], predictions, results)
