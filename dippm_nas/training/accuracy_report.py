"""Render an :class:`~dippm_nas.training.evaluate.Evaluation` (``docs/accuracy.md``, predicted-against-
measured plots, ``results.json``, every test prediction as a CSV) and a leave-one-GPU-out
:class:`~dippm_nas.training.transfer.TransferEvaluation` (``docs/transfer.md``). Nothing here trains or
chooses."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from dippm_nas.cost.learned.pmgns_network import TARGETS
from dippm_nas.training.dataset import TrainingSet
from dippm_nas.training.evaluate import (
    BARS,
    PREDICTION_KEYS,
    TARGET_BARS,
    UNAPPLIED,
    Evaluation,
    SplitOutcome,
    format_intervals,
    format_metrics,
)
from dippm_nas.training.metrics import BOOTSTRAP_SAMPLES, summary
from dippm_nas.training.train import TrainConfig
from dippm_nas.training.transfer import TRANSFER_BARS, TransferEvaluation

UNITS = {"latency_ms": "latency (ms)", "energy_j": "energy per batch (J)", "memory_mb": "GPU memory (MiB)"}


def _plot(measured: np.ndarray, predictions: dict[str, np.ndarray], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.2, 5))
    lo, hi = float(np.min(measured)), float(np.max(measured))
    for (name, pred), marker in zip(predictions.items(), ("o", "x", "+")):
        ax.scatter(measured, pred, s=6, alpha=0.5, marker=marker, label=name)
        lo, hi = min(lo, float(np.min(pred))), max(hi, float(np.max(pred)))
    ax.plot([lo, hi], [lo, hi], "k--", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured")
    ax.set_ylabel("predicted")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_name(split: str, target: str = "latency_ms") -> str:
    return f"{target.split('_')[0]}_{split.replace('->', '_to_')}.png"


def write_predictions(rows: list[dict[str, object]], path: Path) -> None:
    """Prediction rows (one dict per record, the same keys in each) as a CSV."""
    with path.open("w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _energy_memory_section(splits: dict[str, dict], ts: TrainingSet) -> list[str]:
    """Energy and memory exist only in the harness's rows; a split whose test set has none is left out."""
    lines = ["## Energy and memory", ""]
    rows = [(name, target, result[target]) for name, result in splits.items()
            for target in TARGETS[1:] if target in result]
    if not rows:
        return lines + ["No GPU measurement with energy or memory is in the data set yet: these tables wait "
                        "for the harness's rows (`dippm-nas measure`).", ""]
    devices = sorted({r.device for r, y in zip(ts.records, ts.targets) if not np.isnan(y[1:]).all()})
    lines += [f"Measured by our harness (`data/measurements/`) on {', '.join(devices)}: energy per batch from "
              "NVML's energy counter, memory as the CUDA context plus the allocator's peak reserved memory. "
              "Same models, splits and training as the latency tables (one network predicts all three).", "",
              "| split | target | model | MAPE | Kendall tau | within 10 % | bar |", "|---|---|---|---|---|---|---|"]
    unapplied = sorted({target for _, target, metrics in rows if UNAPPLIED in metrics})
    if unapplied:
        lines[-2:-2] = [f"PMGNS predicts {' and '.join(unapplied)} as the analytical model does: the training "
                        "configuration does not apply that head's learned correction (`TrainConfig.corrected_targets`, "
                        "chosen on validation: it carries to families seen in training, not to unseen ones). The "
                        f"row '{UNAPPLIED}' gives what it would have predicted.", ""]
    for name, target, metrics in rows:
        bar = TARGET_BARS.get((name, target))
        for model, m in metrics.items():
            verdict = ""
            if bar is not None and model == "PMGNS (GraphSAGE)":
                verdict = f"MAPE <= {bar:g}: {'met' if m['mape'] <= bar else 'NOT met'}"
            lines.append(f"| {name} | {target} | {model} | {format_metrics(m)} | {verdict} |")
    plots = [f"[{name} {target.split('_')[0]}](accuracy/{_plot_name(name, target)})" for name, target, _ in rows]
    return lines + ["", "Plots: " + ", ".join(plots), ""]


def write_report(evaluation: Evaluation, ts: TrainingSet, docs: Path) -> Path:
    """Write ``accuracy.md`` and ``accuracy/`` (plots, ``results.json``, ``predictions.csv``) under
    ``docs``; returns the Markdown file's path."""
    outcomes = evaluation.outcomes
    for outcome in outcomes:
        name = outcome.split.name
        _plot(outcome.measured, outcome.latency, f"{UNITS['latency_ms']}, {name} split, test",
              docs / "accuracy" / _plot_name(name))
        for target, (truth, both) in outcome.other_targets.items():
            _plot(truth, both, f"{UNITS[target]}, {name} split, test", docs / "accuracy" / _plot_name(name, target))
    lines = _header(evaluation, ts) + _latency_table(outcomes)
    splits = evaluation.results["splits"]
    lines += ["", "Plots: " + ", ".join(f"[{s}](accuracy/{_plot_name(s)})" for s in splits), ""]
    lines += _energy_memory_section(splits, ts)
    lines += _breakdown_section(outcomes)
    lines += _comparison_section(evaluation)
    docs.mkdir(parents=True, exist_ok=True)
    (docs / "accuracy.md").write_text("\n".join(lines) + "\n")
    (docs / "accuracy" / "results.json").write_text(json.dumps(evaluation.results, indent=1, default=float))
    write_predictions(evaluation.prediction_rows, docs / "accuracy" / "predictions.csv")
    return docs / "accuracy.md"


def _header(evaluation: Evaluation, ts: TrainingSet) -> list[str]:
    config = evaluation.config
    lines = ["# Accuracy", "",
             "Written by `dippm-nas evaluate` on the committed data set (`data/records.csv`: timm's published "
             "RTX 3090 / RTX 4090 benchmarks and NeuSight's A100 / V100 / T4 transformer latencies, imported as "
             "they are, plus the GPU rows measured by our harness). "
             f"{len(ts.records)} records, {len(ts.graph_keys)} graphs, seed {config.seed}. Targets present: latency "
             f"on {int(np.sum(~np.isnan(ts.targets[:, 0])))} records, "
             f"energy on {int(np.sum(~np.isnan(ts.targets[:, 1])))}, "
             f"memory on {int(np.sum(~np.isnan(ts.targets[:, 2])))}. Metrics on each split's test set: MAPE, Kendall "
             "tau between predicted and measured, share within +-10 %. Early stopping and every choice of "
             "hyper-parameters used the validation set only"
             + (": early stopping on it chose the number of epochs, then the model was trained again on training "
                "+ validation records for that many epochs (never on test)." if config.refit else ".")
             + f" The model kept is a moving average of the weights (decay {config.ema_decay} per step).", ""]
    if ts.missing:
        lines += [f"{len(ts.missing)} graphs could not be featurized; their records are left out "
                  "(`data/graphs/failures.csv` lists them with the reason).", ""]
    return lines


def _latency_table(outcomes: list[SplitOutcome]) -> list[str]:
    lines = ["## Latency: PMGNS against the analytical model and a log-linear baseline", "",
             "The intervals are 95 % percentile intervals when the test set's model families are drawn again "
             f"with replacement ({BOOTSTRAP_SAMPLES} draws): how much a figure depends on which families happen to "
             "be in the test set.", "",
             "| split | test records | model | MAPE | Kendall tau | within 10 % | MAPE, tau: 95 % intervals | bar |",
             "|---|---|---|---|---|---|---|---|"]
    for outcome in outcomes:
        split, bar = outcome.split, BARS.get(outcome.split.name, {})
        bar_text = ", ".join(f"{k} {'<=' if k == 'mape' else '>='} {v:g}" for k, v in bar.items())
        for name, m in outcome.metrics.items():
            verdict = ("met" if outcome.bar_met else "NOT met") if name.startswith("PMGNS") and bar else ""
            lines.append(f"| {split.name} | {len(split.test)} | {name} | {format_metrics(m)} | {format_intervals(m)} | "
                         f"{bar_text + ': ' + verdict if verdict else ''} |")
    return lines


def _breakdown_section(outcomes: list[SplitOutcome]) -> list[str]:
    lines = ["## Where the PMGNS error is", "",
             "Per split: PMGNS's bias (the median of predicted over measured) and its MAPE without it; Kendall tau "
             "when each model's (graph's) mean error is taken out of its predictions and when it is all that is "
             "left, which says whether the ranking is lost between models or between the configurations of one; "
             "test MAPE per memory layout, PyTorch version and (the worst) families, and each group's share of "
             "the split's total error. Every test prediction is in [predictions.csv](accuracy/predictions.csv). "
             "Read only after the model was fixed: nothing here chose anything.", ""]
    for outcome in outcomes:
        lines += [f"- **{outcome.split.name}**"] + [f"  - {part}" for part in outcome.breakdown]
    lines.append("")
    return lines


def _comparison_section(evaluation: Evaluation) -> list[str]:
    lines = ["## The paper's comparison: graph convolutions against an MLP on static features only", "",
             f"Same splits, same features, same schedule: at most {evaluation.comparison_epochs} epochs each, early "
             "stopping on validation, no refit, one network each (the early-stopped models themselves, to keep the "
             "comparison's cost).", "", "| split | model | MAPE | Kendall tau | within 10 % |", "|---|---|---|---|---|"]
    for split_name, by_conv in evaluation.comparison.items():
        for conv, m in by_conv.items():
            lines.append(f"| {split_name} | {conv if conv != 'mlp' else 'MLP (static features only)'} | "
                         f"{format_metrics(m)} |")
    return lines


def _training_settings(config: TrainConfig) -> str:
    """The settings a leave-one-GPU-out figure depends on, as the command's flags set them.

    >>> _training_settings(TrainConfig(epochs=30, patience=8, refit=False))
    'at most 30 epochs, patience 8, 1 network, no refit'
    """
    networks = f"{config.members} network{'s' if config.members > 1 else ''}"
    refit = "refitted on training and validation records" if config.refit else "no refit"
    return f"at most {config.epochs} epochs, patience {config.patience}, {networks}, {refit}"


def keep_unscored(rows: list[dict[str, object]], path: Path) -> tuple[list[dict[str, object]], list[str]]:
    """``rows`` (a leave-one-GPU-out run's held-out predictions) with the prediction columns of the models it did
    not score kept from the file at ``path`` they replace, where that file holds the same held-out records (the
    same data set), and the names of the columns kept: a run of some of the models leaves the others' alone."""
    if not rows or not path.exists():
        return rows, []
    with path.open(newline="") as f:
        old = list(csv.DictReader(f))
    columns = [c for c in (old[0] if old else {}) if c.endswith("_ms") and c not in rows[0]]

    def key(row: dict[str, object]) -> tuple[str, ...]:
        return tuple("" if row[k] is None else str(row[k]) for k in ("split", *PREDICTION_KEYS))

    earlier = {key(r): r for r in old}
    if not columns or len(old) != len(rows) or set(earlier) != {key(r) for r in rows}:
        return rows, []
    return [r | {c: earlier[key(r)][c] for c in columns} for r in rows], columns


def kept_section(rows: list[dict[str, object]], kept: list[str], csv_name: str) -> list[str]:
    """The latency figures of the prediction columns ``kept`` (:func:`keep_unscored`) per held-out GPU, as the lines
    of a section of ``transfer.md``; none where nothing was kept."""
    if not kept:
        return []
    lines = ["", "## Latency of the models this run did not score", "",
             f"Their held-out predictions of the same records are kept in `accuracy/{csv_name}` from the last run "
             "that scored them (`--models` names the models a run scores).", "",
             "| held-out GPU | records | model | MAPE | Kendall tau | within 10 % |", "|---|---|---|---|---|---|"]
    for split in dict.fromkeys(r["split"] for r in rows):
        mine = [r for r in rows if r["split"] == split]
        truth = np.array([float(r["measured_ms"]) for r in mine])
        for column in kept:
            m = summary(np.array([float(r[column]) for r in mine]), truth)
            lines.append(f"| {str(split).removeprefix('without ')} | {len(mine)} | {column.removesuffix('_ms')} | "
                         f"{format_metrics(m)} |")
    return lines


def write_transfer_report(result: TransferEvaluation, ts: TrainingSet, docs: Path) -> Path:
    """Write ``transfer.md`` (leave one GPU out), ``accuracy/transfer.json`` and every held-out prediction
    (``accuracy/transfer_predictions.csv``) under ``docs``; returns the Markdown file's path."""
    mape_bar, tau_bar = TRANSFER_BARS["mape"], TRANSFER_BARS["tau"]
    lines = ["# Leave one GPU out", "",
             "Written by `dippm-nas evaluate --leave-one-gpu-out` on the committed data set "
             f"({len(ts.records)} records of {len(set(ts.devices))} GPUs). For each GPU, "
             + (f"PMGNS is trained without any of its records ({_training_settings(result.config)}; early stopping "
                "on 15 % of the other GPUs' records, so nothing is chosen on the held-out GPU), "
                if "pmgns" in result.models else "")
             + ("the operator model without its records and operators or those of another board of its chip, "
                if "operators" in result.models else "")
             + ("the residual (PMGNS over the operator model, bounded to a factor of two) without its records, "
                "learning from every other GPU's records as the operator model trained without that GPU predicts "
                "them and correcting the operator model that never saw this one, "
                if "residual" in result.models else "")
             + ("and " if set(result.models) - {"analytical"} else "")
             + "every one of its records is predicted: what a user of a GPU never measured gets. The analytical "
             "model has nothing to train. Metrics: MAPE, Kendall tau between predicted and measured, share within "
             f"+-10 %. The bar: MAPE <= {mape_bar:.0%} and tau >= {tau_bar:.2f} per GPU.", "",
             "## Latency", "",
             "| held-out GPU | records | model | MAPE | Kendall tau | within 10 % | bar |",
             "|---|---|---|---|---|---|---|"]
    for held in result.held_out:
        for name, m in held.metrics(0).items():
            met = m["mape"] <= mape_bar and m["tau"] >= tau_bar
            lines.append(f"| {held.gpu} | {len(held.split.test)} | {name} | {format_metrics(m)} | "
                         f"{'met' if met else 'NOT met'} |")
    energy = [(held, held.metrics(1)) for held in result.held_out]
    if any(m for _, m in energy):
        lines += ["", "## Energy (where the held-out GPU's records measured it)", "",
                  "| held-out GPU | model | MAPE | Kendall tau | within 10 % |", "|---|---|---|---|---|"]
        for held, metrics in energy:
            lines += [f"| {held.gpu} | {name} | {format_metrics(m)} |" for name, m in metrics.items()]
    lines += ["", "## Latency by precision and batch", "",
              "| held-out GPU | precision, batch | records | model | MAPE | Kendall tau | within 10 % |",
              "|---|---|---|---|---|---|---|"]
    for held in result.held_out:
        for label, n, metrics in held.breakdown(0):
            lines += [f"| {held.gpu} | {label} | {n} | {name} | {format_metrics(m)} |" for name, m in metrics.items()]
    docs.mkdir(parents=True, exist_ok=True)
    (docs / "accuracy").mkdir(parents=True, exist_ok=True)
    (docs / "accuracy" / "transfer.json").write_text(json.dumps(result.summary(), indent=1, default=float))
    predictions = docs / "accuracy" / "transfer_predictions.csv"
    rows, kept = keep_unscored(result.prediction_rows, predictions)
    write_predictions(rows, predictions)
    lines += kept_section(rows, kept, predictions.name)
    path = docs / "transfer.md"
    path.write_text("\n".join(lines) + "\n")
    return path
