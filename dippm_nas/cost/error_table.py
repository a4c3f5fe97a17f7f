"""How far off a prediction is likely to be: held-out error figures, shipped as package data.

``dippm-nas evaluate`` writes every test prediction beside its measurement
(``docs/accuracy/predictions.csv``) and the splits' summary (``docs/accuracy/results.json``);
``dippm-nas evaluate --leave-one-gpu-out`` writes every held-out GPU's
(``docs/accuracy/transfer_predictions.csv``). This module condenses them into a small table,
``dippm_nas/cost/weights/error_table.json``, that ships with the package: the latency MAPE of each cost
model on held-out records, grouped by

- the **cost model** and what its training saw: PMGNS on model families it saw (the random split's
  test records), on whole families held out (the family split's), and on a GPU it was not trained on
  (each GPU held out in turn); the analytical model, which trains on nothing, on every measured record
  once (records repeated across splits counted once);
- the **device** the records were measured on, the **precision** and the **batch** range
  (:data:`BATCH_BINS`), each also pooled (``"*"``).

At prediction time :func:`lookup` picks the most comparable cell with at least :data:`MIN_RECORDS`
records, widening device, precision and batch range in that order of preference, and says what it
widened: a request on a GPU nobody measured gets the model's error on the GPUs that were, said as such.
The library reads only this shipped table, never ``docs/``. Rebuild it after an evaluation with::

    python -m dippm_nas.cost.error_table docs/accuracy/predictions.csv

>>> figure = lookup("pmgns", "h100-sxm", "fp16", 1, family_in_training=True)
>>> figure.devices, figure.batch_max, figure.records >= MIN_RECORDS, figure.mape > 0.2
(('h100-sxm',), 1, True, True)
"""

from __future__ import annotations

import argparse
import csv
import fnmatch
import hashlib
import json
import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path

#: The shipped table, read at prediction time.
TABLE = Path(__file__).resolve().parent / "weights" / "error_table.json"

#: Batch ranges (inclusive; None is open-ended). The harness measured batch 1, 32 and 256 on the H100;
#: timm's benchmarks are mostly at 256-1024, with a few smaller batches.
BATCH_BINS: tuple[tuple[int, int | None], ...] = ((1, 3), (4, 15), (16, 63), (64, 255), (256, 1023), (1024, None))

#: A cell with fewer records is not cited; the lookup widens it.
MIN_RECORDS = 10

#: Every group of held-out records: what the cost model's training had seen of them.
GROUPS: dict[str, dict[str, object]] = {
    "pmgns/random": {"cost_model": "pmgns", "splits": ("random",), "gpu_in_training": True,
                     "family_in_training": True,
                     "description": "test records of model families it saw in training (random split)"},
    "pmgns/family": {"cost_model": "pmgns", "splits": ("family",), "gpu_in_training": True,
                     "family_in_training": False,
                     "description": "test records of whole model families held out from its training "
                                    "(family split)"},
    "pmgns/device": {"cost_model": "pmgns", "splits": ("without *",),
                     "gpu_in_training": False, "family_in_training": None,
                     "description": "records of a GPU held out of its training (leave one GPU out)"},
    "analytical/all": {"cost_model": "analytical", "splits": None, "gpu_in_training": None,
                       "family_in_training": None,
                       "description": "measured test records (every split's, each once; it trains on nothing)"},
}

#: The columns that identify a record of predictions.csv, whatever split it is in.
RECORD_KEYS = ("model", "family", "device", "batch", "image_size", "precision", "layout", "torch")

#: The model names results.json uses for the two cost models.
RESULT_NAMES = {"pmgns": "PMGNS (GraphSAGE)", "analytical": "analytical"}


def batch_bin(batch: int) -> str:
    """The label of the :data:`BATCH_BINS` range that holds ``batch``.

    >>> batch_bin(1), batch_bin(8), batch_bin(256), batch_bin(4096)
    ('1-3', '4-15', '256-1023', '1024+')
    """
    for low, high in BATCH_BINS:
        if batch >= low and (high is None or batch <= high):
            return f"{low}+" if high is None else f"{low}-{high}"
    raise ValueError(f"batch must be >= 1, got {batch}")


def _cell(records: list[tuple[dict[str, str], float]]) -> dict[str, object]:
    """The figures of one cell: records, MAPE, median APE, and the devices, precisions and batches they cover."""
    ordered = sorted(e for _, e in records)
    mid = len(ordered) // 2
    median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    batches = [int(r["batch"]) for r, _ in records]
    return {"n": len(ordered), "mape": round(sum(ordered) / len(ordered), 6), "median_ape": round(median, 6),
            "devices": sorted({r["device"] for r, _ in records}),
            "precisions": sorted({r["precision"] for r, _ in records}),
            "batch_min": min(batches), "batch_max": max(batches)}


def _group_records(rows: list[dict[str, str]], group: str) -> list[tuple[dict[str, str], float]]:
    """(record, absolute percentage error) of ``group``'s cost model over its records."""
    spec = GROUPS[group]
    column = f"{spec['cost_model']}_ms"
    out, seen = [], set()
    for row in rows:
        if spec["splits"] is not None and not any(fnmatch.fnmatchcase(row["split"], s) for s in spec["splits"]):
            continue
        if spec["splits"] is None:  # the analytical model: each record once, whichever split tested it
            key = tuple(row[k] for k in RECORD_KEYS)
            if key in seen:
                continue
            seen.add(key)
        out.append((row, abs(float(row[column]) / float(row["measured_ms"]) - 1)))
    return out


def build_error_table(predictions_csv: str | Path, results_json: str | Path | None = None,
                      transfer_csv: str | Path | None = None) -> dict:
    """The error table from an evaluation's ``predictions.csv``, if given its ``results.json``, and a
    leave-one-GPU-out run's ``transfer_predictions.csv``.

    Every cell is a MAPE recomputed from the predictions beside their measurements. With
    ``results_json``, each split's pooled latency MAPE is checked against the one the evaluation
    reported (a ValueError if the two files come from different runs), and the energy and memory
    figures, which exist only per split, are carried over. Without ``transfer_csv`` the table has no
    figure for a GPU held out of training.
    """
    path = Path(predictions_csv)
    text = path.read_text()
    rows = list(csv.DictReader(text.splitlines()))
    if not rows:
        raise ValueError(f"{path} has no prediction rows")
    transfer_text = Path(transfer_csv).read_text() if transfer_csv is not None else ""
    scored = rows + list(csv.DictReader(transfer_text.splitlines()))
    cells = []
    for group in GROUPS:
        # the analytical model's records are the evaluation's test records, each once; a held-out GPU's
        # records are in the transfer run too, and would count twice
        records = _group_records(scored if GROUPS[group]["splits"] is not None else rows, group)
        buckets: dict[tuple[str, str, str], list[tuple[dict[str, str], float]]] = {}
        for row, error in records:
            for device in (row["device"], "*"):
                for precision in (row["precision"], "*"):
                    for batches in (batch_bin(int(row["batch"])), "*"):
                        buckets.setdefault((device, precision, batches), []).append((row, error))
        for (device, precision, batches), members in sorted(buckets.items()):
            cells.append({"group": group, "device": device, "precision": precision, "batch": batches,
                          **_cell(members)})
    table = {
        "about": "latency MAPE of each cost model on held-out test records; written by "
                 "dippm_nas.cost.error_table from an evaluation's predictions.csv and a leave-one-GPU-out "
                 "run's transfer_predictions.csv",
        "source": path.name, "source_sha256": hashlib.sha256(text.encode()).hexdigest(),
        "transfer_source": Path(transfer_csv).name if transfer_csv is not None else None,
        "transfer_sha256": hashlib.sha256(transfer_text.encode()).hexdigest() if transfer_csv is not None else None,
        "batch_bins": [list(b) for b in BATCH_BINS], "min_records": MIN_RECORDS,
        "groups": {name: {k: v for k, v in spec.items()} for name, spec in GROUPS.items()},
        "cells": cells, "splits": {},
    }
    if results_json is not None:
        table["splits"] = _split_figures(rows, json.loads(Path(results_json).read_text()))
    return table


def _split_figures(rows: list[dict[str, str]], results: dict) -> dict[str, dict]:
    """Per split: the latency, energy and memory MAPE results.json reports for each cost model, after
    checking that its latency figures are the ones ``rows`` give."""
    out = {}
    for split, result in results.get("splits", {}).items():
        figures: dict[str, dict] = {}
        for model, name in RESULT_NAMES.items():
            reported = result.get("metrics", {}).get(name)
            errors = [abs(float(r[f"{model}_ms"]) / float(r["measured_ms"]) - 1) for r in rows if r["split"] == split]
            if reported is None or not errors:
                continue
            if not math.isclose(sum(errors) / len(errors), reported["mape"], rel_tol=1e-4, abs_tol=1e-5) \
                    or len(errors) != int(reported["n"]):
                raise ValueError(f"split {split}: results.json reports {model} latency MAPE {reported['mape']:.4%} "
                                 f"on {int(reported['n'])} records, predictions.csv gives "
                                 f"{sum(errors) / len(errors):.4%} on {len(errors)}: not the same evaluation")
            figures[model] = {"latency_ms": {"mape": round(reported["mape"], 6), "n": int(reported["n"])}}
            for target in ("energy_j", "memory_mb"):
                metric = result.get(target, {}).get(name)
                if metric is not None:
                    figures[model][target] = {"mape": round(metric["mape"], 6), "n": int(metric["n"])}
        out[split] = {"description": result.get("description", ""), **figures}
    return out


def write_error_table(predictions_csv: str | Path, results_json: str | Path | None = None,
                      out: str | Path = TABLE, transfer_csv: str | Path | None = None) -> Path:
    """Build the table (:func:`build_error_table`) and write it to ``out`` (the shipped file by default).

    ``results_json`` and ``transfer_csv`` default to the ``results.json`` and ``transfer_predictions.csv``
    beside ``predictions_csv`` where they exist. The evaluation calls this after writing its predictions;
    so does ``python -m dippm_nas.cost.error_table``.
    """
    beside = Path(predictions_csv).parent
    if results_json is None and (beside / "results.json").exists():
        results_json = beside / "results.json"
    if transfer_csv is None and (beside / "transfer_predictions.csv").exists():
        transfer_csv = beside / "transfer_predictions.csv"
    table = build_error_table(predictions_csv, results_json, transfer_csv)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(table, indent=1) + "\n")
    load_table.cache_clear()
    return out


@cache
def load_table(path: Path = TABLE) -> dict | None:
    """The shipped table, read once; None when there is none (then predictions carry no error figure)."""
    if not path.exists():
        return None
    table = json.loads(path.read_text())
    table["index"] = {(c["group"], c["device"], c["precision"], c["batch"]): c for c in table["cells"]}
    return table


@dataclass(frozen=True)
class ErrorFigure:
    """How far off a latency prediction is likely to be: a cost model's MAPE on comparable held-out records.

    ``group`` names which records (:data:`GROUPS`); ``devices``, ``precisions``, ``batch_min`` and
    ``batch_max`` are those of the records the figure is measured on, which may be wider than the request
    where too few records matched: ``widened`` says what was widened and why. ``memory_mape`` and
    ``energy_mape`` are the same split's figures for those targets, on the ``target_records`` test records
    that measured them (the harness's GPU only); None where the evaluation has none.
    """

    cost_model: str
    mape: float
    median_ape: float
    records: int
    group: str
    devices: tuple[str, ...]
    precisions: tuple[str, ...]
    batch_min: int
    batch_max: int
    widened: tuple[str, ...] = ()
    memory_mape: float | None = None
    energy_mape: float | None = None
    target_records: int = 0

    @property
    def basis(self) -> str:
        """Which records the figure is measured on, in words."""
        batches = str(self.batch_min) if self.batch_min == self.batch_max else f"{self.batch_min}-{self.batch_max}"
        return (f"{self.records} {GROUPS[self.group]['description']}, {', '.join(self.devices)}, batch {batches}, "
                f"{'/'.join(self.precisions)}")

    @property
    def note(self) -> str:
        """The one line a prediction's notes carry."""
        name = "PMGNS" if self.cost_model == "pmgns" else "the analytical model"
        line = f"latency error: {name}'s MAPE was {self.mape:.1%} (median {self.median_ape:.1%}) on {self.basis}"
        if self.widened:
            line += "; " + "; ".join(self.widened)
        extra = [f"{label} {v:.1%}" for label, v in (("memory", self.memory_mape), ("energy", self.energy_mape))
                 if v is not None]
        if extra:
            line += f"; {' and '.join(extra)} MAPE on the {self.target_records} test records that measured them"
        return line

    def to_dict(self) -> dict[str, object]:
        """JSON-ready: the fields, ``basis`` and ``note``."""
        out = {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(self).items()}
        return out | {"basis": self.basis, "note": self.note}


def _group_for(cost_model: str, family_in_training: bool | None, gpu_in_training: bool) -> str:
    if cost_model != "pmgns":
        return "analytical/all"
    if not gpu_in_training:
        return "pmgns/device"
    return "pmgns/random" if family_in_training else "pmgns/family"


#: The split whose energy and memory figures go with each group.
_GROUP_SPLIT = {"pmgns/random": "random", "pmgns/family": "family", "analytical/all": "random"}


def lookup(cost_model: str, device: str, precision: str, batch: int, *, family_in_training: bool | None = None,
           gpu_in_training: bool = True, table: dict | None = None) -> ErrorFigure | None:
    """The error figure for a prediction by ``cost_model`` (``pmgns`` or ``analytical``; a label such as
    ``"pmgns (latency learned; ...)"`` works too) on ``device`` (a MIG slice counts as its whole GPU) at
    ``precision`` and ``batch``; ``family_in_training`` and ``gpu_in_training`` say what PMGNS saw.

    None when no table is shipped. The most comparable cell with :data:`MIN_RECORDS` records wins:
    the request's device, precision and batch range; else pooled over precisions, then over the
    device's batches, then over the measured GPUs; the figure says what it pooled.
    """
    table = table if table is not None else load_table()
    if table is None:
        return None
    model = cost_model.split(" ")[0]
    group = _group_for(model, family_in_training, gpu_in_training)
    gpu = device.split(":")[0]
    index = table.get("index") or {(c["group"], c["device"], c["precision"], c["batch"]): c for c in table["cells"]}
    devices = {d for (g, d, _, _) in index if g == group and d != "*"}
    precisions = {p for (g, _, p, _) in index if g == group and p != "*"}
    want = batch_bin(batch)
    d = gpu if gpu in devices else "*"
    p = precision if precision in precisions else "*"
    # A GPU's own records first (each GPU has its own level of error), then the measured GPUs pooled.
    order = [(d, p, want), (d, "*", want), (d, p, "*"), (d, "*", "*"),
             ("*", p, want), ("*", "*", want), ("*", p, "*"), ("*", "*", "*")]
    least = table.get("min_records", MIN_RECORDS)
    key = next((c for c in dict.fromkeys(order) if index.get((group, *c), {}).get("n", 0) >= least), order[-1])
    cell = index.get((group, *key))
    if cell is None:
        return None
    widened = []
    if ":" in device:
        widened.append(f"no MIG slice was measured: this is the whole GPU's figure ({device} is a slice of {gpu})")
    if gpu not in devices:
        widened.append(f"{gpu} was never measured: this is the error on the GPUs that were")
    elif key[0] == "*":
        widened.append(f"fewer than {least} {gpu} records at batch {want}: pooled over the measured GPUs")
    if precision not in precisions:
        widened.append(f"no {precision} record was measured: this is the error at {'/'.join(sorted(precisions))}")
    elif key[1] == "*" and len(precisions) > 1:
        widened.append(f"fewer than {least} {precision} records: pooled over precisions")
    if key[2] == "*":
        widened.append(f"fewer than {least} comparable records at batch {want}: pooled over batches")
    figures = table.get("splits", {}).get(_GROUP_SPLIT.get(group, ""), {}).get(model, {})
    return ErrorFigure(
        cost_model=model, mape=cell["mape"], median_ape=cell["median_ape"], records=cell["n"], group=group,
        devices=tuple(cell["devices"]), precisions=tuple(cell["precisions"]), batch_min=cell["batch_min"],
        batch_max=cell["batch_max"], widened=tuple(widened),
        memory_mape=figures.get("memory_mb", {}).get("mape"), energy_mape=figures.get("energy_j", {}).get("mape"),
        target_records=figures.get("memory_mb", figures.get("energy_j", {})).get("n", 0),
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m dippm_nas.cost.error_table PREDICTIONS_CSV [--results JSON] [--out JSON]``."""
    parser = argparse.ArgumentParser(prog="python -m dippm_nas.cost.error_table",
                                     description="Condense an evaluation's predictions.csv into the shipped "
                                                 "error table that predictions cite.")
    parser.add_argument("predictions", help="the evaluation's predictions.csv (docs/accuracy/predictions.csv)")
    parser.add_argument("--results", default=None,
                        help="its results.json (default: the one beside predictions.csv, if any)")
    parser.add_argument("--transfer", default=None,
                        help="a leave-one-GPU-out run's transfer_predictions.csv (default: the one beside "
                             "predictions.csv, if any)")
    parser.add_argument("--out", default=str(TABLE), help=f"where to write the table (default: {TABLE})")
    args = parser.parse_args(argv)
    out = write_error_table(args.predictions, args.results, args.out, args.transfer)
    table = load_table(Path(out))
    print(f"{out}: {len(table['cells'])} cells from {table['source']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
