"""``dippm-nas evaluate --nas``: NAS candidates of two search spaces on GPUs nobody here measured, zero-shot and
after a calibration on ten of them; written to ``docs/nas.md``.

HELP's latencies (``data/help``: NAS-Bench-201 cells on a GTX 1080 Ti, TITAN X (Pascal), TITAN Xp and RTX 2080
Ti; OFA MobileNetV3 subnets on an RTX 2080 Ti, TITAN Xp and V100; fp32, PyTorch eager) are the ground truth.
A seeded sample of each space's candidates is predicted on each GPU and batch:

- **zero-shot**: by the default (``auto``: the operator model, with its residual where the residual's card turns it
  on), the operator model alone, the analytical model and PMGNS; MAPE, Spearman's rho and
  Kendall's tau against the measured latencies, FLOPs' Spearman beside (a proxy that knows no GPU). Nothing the
  project ships learns from HELP's data, so every GPU is one no model saw;
- **calibrated**: ``dippm-nas calibrate``'s fit (:func:`dippm_nas.training.calibration_fit.calibrate`) on ten rows,
  then the other candidates predicted with it: MAPE and Spearman, the mean and the worst of five draws. The rows
  are ten random candidates at the batch, or five each at batch 1 and at the batch: the user's path, measure the
  candidates of the space on the GPU, calibrate, search.
"""

from __future__ import annotations

import csv
import gzip
import json
import random
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

from dippm_nas.training.metrics import kendall_tau, mape
from dippm_nas.training.paths import project

#: HELP's GPU names and the registry's keys (data/help/README.md).
HELP_GPUS = {"1080ti": "gtx1080ti", "titanx": "titanx-pascal", "titanxp": "titanxp", "2080ti": "rtx2080ti",
             "titan_xp": "titanxp", "v100": "v100"}
#: The batches a bar is set on: HELP's small batches are the unknown hosts' more than the GPUs'.
BAR_BATCH = 32
BARS = {"calibrated_mape": 0.05, "calibrated_spearman": 0.98}
ZERO_SHOT_MODELS = ("auto", "operators", "analytical", "pmgns")
CALIBRATION_ROWS, CALIBRATION_DRAWS = 10, 5


@dataclass(frozen=True)
class Measured:
    """One candidate of a space with its measured latency (ms) per (GPU key, batch)."""

    space: str
    name: str
    build: Callable[[], object]  # the search space's Candidate
    latency_ms: dict[tuple[str, int], float]


def _columns(row: dict[str, str]) -> dict[tuple[str, int], float]:
    out = {}
    for column, value in row.items():
        if column.endswith("_ms"):
            gpu, _, batch = column.removesuffix("_ms").rpartition("_")
            out[(HELP_GPUS[gpu], int(batch))] = float(value)
    return out


def help_candidates(n: int, seed: int = 0, folder: Path | None = None) -> list[Measured]:
    """A seeded sample of ``n`` candidates of each space, with HELP's latencies."""
    from search_spaces import get_search_space

    folder = folder or project().data / "help"
    rng = random.Random(seed)
    nb201, ofa = get_search_space("nb201"), get_search_space("mobilenetv3")
    with gzip.open(folder / "nasbench201_latency.csv.gz", "rt", newline="") as fh:
        cells = list(csv.DictReader(fh))
    with gzip.open(folder / "ofa_mbv3_latency.csv.gz", "rt", newline="") as fh:
        subnets = list(csv.DictReader(fh))
    out = [Measured("nb201", f"nb201:{row['nb201_index']}", lambda row=row: nb201.from_cell(row["arch"]),
                    _columns({k: v for k, v in row.items() if k not in ("nb201_index", "arch")}))
           for row in rng.sample(cells, min(n, len(cells)))]
    ints = lambda text: [int(v) for v in text.split()]  # noqa: E731
    out += [Measured("mobilenetv3", f"ofa:{row['ofa_index']}",
                     lambda row=row: ofa.from_help(int(row["resolution"]), ints(row["depths"]), ints(row["kernels"]),
                                                   ints(row["expands"])),
                     _columns({k: v for k, v in row.items() if k.endswith("_ms")}))
            for row in rng.sample(subnets, min(n, len(subnets)))]
    return out


def _metrics(predicted: np.ndarray, measured: np.ndarray) -> dict[str, float]:
    return {"mape": mape(predicted, measured), "spearman": float(spearmanr(predicted, measured).statistic),
            "kendall": kendall_tau(predicted, measured)}


def evaluate_nas(candidates: list[Measured], progress: Callable[[str], None] = print) -> dict:
    """Every (space, GPU, batch): zero-shot figures of each model and FLOPs, and the calibrated figures."""
    import dippm_nas
    from dippm_nas.graph.batching import scale_batch
    from dippm_nas.integration import HardwareCostModel

    featurizer = HardwareCostModel(batch=1, cost_model="analytical")
    graphs = {}
    for i, c in enumerate(candidates):
        graphs[c.name] = featurizer.graph(c.build())
        if (i + 1) % 25 == 0:
            progress(f"NAS candidates: {i + 1} of {len(candidates)} featurized")
    results: dict = {}
    for space in sorted({c.space for c in candidates}):
        mine = [c for c in candidates if c.space == space]
        for gpu, batch in sorted({k for c in mine for k in c.latency_ms}):
            measured = np.array([c.latency_ms[(gpu, batch)] for c in mine])
            scaled = {c.name: scale_batch(graphs[c.name], batch) for c in mine}
            entry = {"candidates": len(mine), "flops_spearman": float(spearmanr(
                [scaled[c.name].flops for c in mine], measured).statistic)}
            for model in ZERO_SHOT_MODELS:
                predicted = np.array([dippm_nas.predict_graph(scaled[c.name], gpu, "fp32", model).latency_ms
                                      for c in mine])
                entry[model] = _metrics(predicted, measured)
            entry["calibrated"] = _calibrated(mine, gpu, {batch: scaled}, batch, CALIBRATION_ROWS)
            if batch > 1 and all((gpu, 1) in c.latency_ms for c in mine):
                at_one = {c.name: graphs[c.name] for c in mine}
                entry["calibrated_two_batches"] = _calibrated(mine, gpu, {1: at_one, batch: scaled}, batch,
                                                              CALIBRATION_ROWS // 2)
            results.setdefault(space, {})[f"{gpu}@{batch}"] = entry
            progress(f"{space} on {gpu} at batch {batch}: default {entry['auto']['mape']:.1%}, calibrated "
                     f"{entry['calibrated']['mape_mean']:.1%}")
    return results


def _calibrated(mine: list[Measured], gpu: str, graphs: dict[int, dict[str, object]], batch: int,
                candidates: int) -> dict[str, float]:
    """``dippm-nas calibrate`` on ``candidates`` drawn at random, each measured at every batch of ``graphs`` (their
    graphs by batch and name), the others predicted at ``batch``: the mean and the worst of the draws."""
    import dippm_nas
    from dippm_nas.training.calibration_fit import MeasuredRow, calibrate

    draws = []
    for draw in range(CALIBRATION_DRAWS):
        chosen = sorted(random.Random(draw).sample(range(len(mine)), candidates))
        rows = [MeasuredRow(mine[i].name, b, mine[i].latency_ms[(gpu, b)]) for i in chosen for b in sorted(graphs)]
        fitted = calibrate(rows, gpu, "fp32", "eager", f"{mine[0].space} on {gpu}",
                           graph_of=lambda row: graphs[row.batch][row.model], say=lambda _: None)
        rest = [i for i in range(len(mine)) if i not in chosen]
        predicted = np.array([dippm_nas.predict_graph(graphs[batch][mine[i].name], gpu, "fp32",
                                                      calibration=fitted).latency_ms for i in rest])
        draws.append(_metrics(predicted, np.array([mine[i].latency_ms[(gpu, batch)] for i in rest])))
    return {"mape_mean": float(np.mean([d["mape"] for d in draws])),
            "mape_worst": float(np.max([d["mape"] for d in draws])),
            "spearman_mean": float(np.mean([d["spearman"] for d in draws])),
            "spearman_worst": float(np.min([d["spearman"] for d in draws]))}


def _calibration_cell(figures: dict[str, float] | None) -> str:
    """A calibration's figures in a table cell; '-' where it was not run."""
    if figures is None:
        return "-"
    return (f"{figures['mape_mean']:.1%} / {figures['mape_worst']:.1%}, rho {figures['spearman_mean']:.3f} / "
            f"{figures['spearman_worst']:.3f}")


def write_nas_report(results: dict, n: int, docs: Path) -> Path:
    """``docs/nas.md`` and ``docs/accuracy/nas.json``; returns the Markdown file's path."""
    lines = [
        "# NAS candidates on GPUs nobody here measured", "",
        f"Written by `dippm-nas evaluate --nas`. {n} candidates of each space drawn (seed 0) from HELP's latencies "
        "(`data/help`, NeurIPS 2021: NAS-Bench-201 cells, OFA MobileNetV3 subnets; fp32, PyTorch eager, GPUs of "
        "2017-2019 whose hosts are not stated), predicted on each GPU and batch. Nothing the project ships learns "
        "from HELP's data. Zero-shot: each model's MAPE and Spearman's rho (Kendall's tau in the JSON), FLOPs' "
        f"rho beside. Calibrated: `dippm-nas calibrate` on {CALIBRATION_ROWS} rows, the other candidates predicted "
        f"with it, the mean and the worst of {CALIBRATION_DRAWS} draws: {CALIBRATION_ROWS} random candidates at the "
        f"batch, or {CALIBRATION_ROWS // 2} random candidates each at batch 1 and at the batch (what `dippm-nas "
        "measure --space NAME --n 5 --batch 1,B` measures): rows at batch 1, where the host's time to issue the "
        "operators is most of the latency, tell it from the kernels' speed. Bars, on the ten rows at the batch, at "
        f"batch {BAR_BATCH} and more: MAPE <= {BARS['calibrated_mape']:.0%} (mean of the draws) and rho >= "
        f"{BARS['calibrated_spearman']}; zero-shot rho of the default at least FLOPs'.", "",
        "| space | GPU | batch | default (auto) | operators | analytical | PMGNS | FLOPs rho | 10 at the batch: MAPE "
        "mean / worst, rho mean / worst | 5 at batch 1 and 5 at the batch: MAPE mean / worst, rho mean / worst | "
        "bar |",
        "|---|---|---|---|---|---|---|---|---|---|---|"]
    for space, entries in results.items():
        for key, e in entries.items():
            gpu, _, batch = key.partition("@")
            one, two = e["calibrated"], e.get("calibrated_two_batches")
            verdict = ""
            if int(batch) >= BAR_BATCH:
                met = (one["mape_mean"] <= BARS["calibrated_mape"]
                       and one["spearman_mean"] >= BARS["calibrated_spearman"]
                       and e["auto"]["spearman"] >= e["flops_spearman"])
                verdict = "met" if met else "NOT met"
            cells = " | ".join(f"{e[m]['mape']:.1%}, rho {e[m]['spearman']:.3f}" for m in ZERO_SHOT_MODELS)
            lines.append(f"| {space} | {gpu} | {batch} | {cells} | {e['flops_spearman']:.3f} | "
                         f"{_calibration_cell(one)} | {_calibration_cell(two)} | {verdict} |")
    (docs / "accuracy").mkdir(parents=True, exist_ok=True)
    (docs / "accuracy" / "nas.json").write_text(json.dumps({"candidates": n, "results": results}, indent=1) + "\n")
    path = docs / "nas.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def run(n: int = 100, seed: int = 0) -> Path:
    """Sample, evaluate and write the report."""
    warnings.filterwarnings("ignore")
    candidates = help_candidates(n, seed)
    results = evaluate_nas(candidates, progress=lambda line: print(line, file=sys.stderr))
    return write_nas_report(results, n, project().docs)
