"""Fits the host's per-operator cost of eager PyTorch, by precision mode, on the harness's host-bound records.

Where the host binds (the GPU's own time, the analytical model's under CUDA graphs, is under
1 / HOST_BOUND of the measured latency), eager latency is mostly the time to issue every operator. The
fit prices it as a prediction does (:func:`~dippm_nas.cost.pipeline.host_queue.queued_latency`: the operators
issued one by one, each run on the GPU at the roofline's time once issued) and chooses the
``operator_us`` whose predictions have the least squared relative error. Views cost too little to
tell apart from the operators in these records, so ``view_us`` stays the profile's. PyTorch's fp32
defaults and fp16 autocast are fitted apart (autocast dispatches casts too), and each H100 session apart
(each machine is another host). Under autocast a second fit keeps the fp32 ``operator_us`` and prices each
cast kernel an operator launches (a weight cast of a convolution or matrix product, a cast of an input of
the other precision) apart, ``cast_us``: does what autocast adds go with its casts, not every operator?
The harness's own host-cost rows (``data/measurements/host/``: a chain of tiny operators, no
``nn.Module`` in between) are printed beside the fit: what a model adds to the bare dispatch, and what a
convolution's or matrix product's weight cast adds to its dispatch under autocast.

    python benchmarks/host_profile.py [--out benchmarks/results/host_profile.txt]
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np

from dippm_nas.cost.models.analytical import AnalyticalCostModel
from dippm_nas.cost.pipeline.host_queue import queued_latency
from dippm_nas.cost.pipeline.table import node_table
from dippm_nas.graph import operators
from dippm_nas.graph.batching import scale_batch
from dippm_nas.hosts import get_host_profile
from dippm_nas.training.dataset import load_graphs
from dippm_nas.training.records import load_records, measured_request

#: A record is host-bound where its measured latency is at least this many times the GPU's own time.
HOST_BOUND = 2.5
DEVICE = "h100-sxm"
HOST_ROWS = Path("data/measurements/host")


def host_bound_rows(records, graphs, analytical: AnalyticalCostModel) -> list[dict]:
    """Per host-bound record: its session (origin file), precision, operators, views and latency."""
    rows = []
    for r in records:
        if r.graph_key not in graphs or r.latency_ms is None:
            continue
        table = node_table(scale_batch(graphs[r.graph_key], r.batch))
        gpu = analytical.timed(table, replace(measured_request(r), mode="cuda-graphs"))
        if r.latency_ms < HOST_BOUND * gpu.latency_s * 1e3:
            continue
        # the cast kernels autocast launches: its inputs of the other precision, and a library operator's weights
        weight_casts = operators.kind_table().has_library[table.kind] & table.has_weights
        rows.append({"origin": r.origin, "precision": r.precision, "model": r.model, "batch": r.batch,
                     "gpu_s": gpu.gpu_s, "is_view": table.is_view, "latency_us": r.latency_ms * 1e3,
                     "casts": table.autocast.casts + weight_casts})
    return rows


#: The operator costs the fit tries, in microseconds.
OPERATOR_US_GRID = np.arange(2.0, 80.0, 0.1)


def fit_operator_us(rows: list[dict], view_us: float) -> tuple[float, np.ndarray]:
    """The ``operator_us`` of OPERATOR_US_GRID whose queued latencies have the least squared relative error,
    and each row's relative error at it."""
    return _fit(rows, lambda row, us: np.where(row["is_view"], view_us, us) * 1e-6)


def fit_cast_us(rows: list[dict], view_us: float, operator_us: float) -> tuple[float, np.ndarray]:
    """The ``cast_us`` of OPERATOR_US_GRID, each cast kernel's dispatch on top of ``operator_us``, whose queued
    latencies have the least squared relative error, and each row's relative error at it."""
    return _fit(rows, lambda row, us: np.where(row["is_view"], view_us, operator_us + row["casts"] * us) * 1e-6)


def _fit(rows: list[dict], host_s) -> tuple[float, np.ndarray]:
    """The value of OPERATOR_US_GRID whose queued latencies, with each operator's host seconds
    ``host_s(row, value)``, have the least squared relative error, and each row's relative error at it."""
    curves = []
    for row in rows:
        curves.append([queued_latency(host_s(row, us), [row["gpu_s"]]) * 1e6 / row["latency_us"] - 1
                       for us in OPERATOR_US_GRID])
    errors = np.array(curves)  # [rows, grid]
    best = int((errors ** 2).sum(axis=0).argmin())
    return float(OPERATOR_US_GRID[best]), errors[:, best]


#: The chain's kinds whose weights autocast casts: what fp16 adds to their dispatch is the weight cast's.
WEIGHT_CAST_KINDS = ("conv1x1", "matmul")


def chain_rows() -> list[str]:
    """The harness's host-cost rows, one line per file and precision (the mean over operator kinds), and
    what fp16 adds to the dispatch of the kinds whose weights autocast casts."""
    lines = []
    for path in sorted(HOST_ROWS.glob("*.csv")):
        by_precision, by_kind = defaultdict(list), {}
        with path.open(newline="") as fh:
            for row in csv.DictReader(fh):
                if row["host_us"] and row["kind"] != "view":
                    by_precision[row["precision"]].append(float(row["host_us"]))
                    by_kind[(row["kind"], row["precision"])] = float(row["host_us"])
        for precision, values in sorted(by_precision.items()):
            lines.append(f"  {path}: {precision}: {statistics.fmean(values):.1f} us an operator (chain of tiny "
                         f"operators, mean of {len(values)} kinds)")
        added = [by_kind[(k, "fp16")] - by_kind[(k, "fp32")] for k in WEIGHT_CAST_KINDS
                 if (k, "fp16") in by_kind and (k, "fp32") in by_kind]
        if added:
            lines.append(f"  {path}: a weight cast under autocast adds {statistics.fmean(added):.1f} us to the "
                         f"dispatch ({', '.join(WEIGHT_CAST_KINDS)}: fp16 over fp32)")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="benchmarks/results/host_profile.txt")
    args = parser.parse_args(argv)
    profile = get_host_profile()
    records = [r for r in load_records() if r.device == DEVICE and r.batch <= 8
               and r.origin.startswith("data/measurements/")]
    graphs = load_graphs({r.graph_key for r in records})
    rows = host_bound_rows(records, graphs, AnalyticalCostModel())
    lines = ["$ python benchmarks/host_profile.py",
             f"Host cost per eager operator, fitted on {DEVICE} harness records at batch <= 8 whose latency is >= "
             f"{HOST_BOUND:g} x the GPU's own time (analytical, CUDA graphs); view_us held at the "
             f"{profile.name!r} profile's {profile.view_us:g}.",
             f"Profile {profile.name!r}: {profile.issue_us(half=False):g} us an operator at fp32, "
             f"{profile.issue_us(half=True):g} under autocast (fp16, bf16).", ""]
    groups = defaultdict(list)
    for row in rows:
        groups[(row["precision"], row["origin"])].append(row)
        groups[(row["precision"], "every session")].append(row)
    for (precision, origin), group in sorted(groups.items()):
        operator_us, errors = fit_operator_us(group, profile.view_us)
        spread = np.abs(errors)
        lines.append(f"{precision:5s} {origin:48s} {len(group):4d} records: operator_us {operator_us:5.1f}; |error| "
                     f"median {np.median(spread):.1%}, largest {spread.max():.1%}")
        if precision != "fp32":
            fp32_us = profile.issue_us(half=False)
            cast_us, errors = fit_cast_us(group, profile.view_us, fp32_us)
            spread = np.abs(errors)
            label = f"  or {fp32_us:g} us an operator and, per cast kernel,"
            lines.append(f"{'':5s} {label:48s} {'':12s} cast_us {cast_us:5.1f}; |error| median "
                         f"{np.median(spread):.1%}, largest {spread.max():.1%}")
    lines += ["", "The harness's host-cost rows (no module between the operators):", *chain_rows()]
    text = "\n".join(lines) + "\n"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
