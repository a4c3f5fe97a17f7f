"""Build the error table that predictions cite (:mod:`dippm_nas.cost.error_table`) from an evaluation's
predictions beside their measurements: ``dippm-nas evaluate`` calls it after writing them, and so does::

    python -m dippm_nas.training.held_out_errors docs/accuracy/predictions.csv
"""

from __future__ import annotations

import argparse
import csv
import fnmatch
import hashlib
import json
import math
from pathlib import Path

from dippm_nas.cost.error_table import BATCH_BINS, GROUPS, MIN_RECORDS, TABLE, batch_bin, load_table

#: The columns that identify a record of predictions.csv, whatever split it is in.
RECORD_KEYS = ("model", "family", "device", "batch", "image_size", "precision", "layout", "torch")

#: The model names results.json uses for the two cost models.
RESULT_NAMES = {"pmgns": "PMGNS (GraphSAGE)", "analytical": "analytical"}


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
    """(record, absolute percentage error) of ``group``'s cost model over its records (a run that did not score
    the cost model has none)."""
    spec = GROUPS[group]
    column = f"{spec['cost_model']}_ms"
    out, seen = [], set()
    for row in rows:
        if spec["splits"] is not None and not any(fnmatch.fnmatchcase(row["split"], s) for s in spec["splits"]):
            continue
        if not row.get(column):
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
                 "dippm_nas.training.held_out_errors from an evaluation's predictions.csv and a leave-one-GPU-out "
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
    so does ``python -m dippm_nas.training.held_out_errors``.
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


def main(argv: list[str] | None = None) -> int:
    """``python -m dippm_nas.training.held_out_errors PREDICTIONS_CSV [--results JSON] [--out JSON]``."""
    parser = argparse.ArgumentParser(prog="python -m dippm_nas.training.held_out_errors",
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
