"""Fits the host's per-operator cost of eager PyTorch, by precision mode, on the harness's host-bound records.

Where the host binds (the GPU's own time, the analytical model's under CUDA graphs, is under
1 / HOST_BOUND of the measured latency), eager latency is mostly the time to issue every operator. The
fit prices it as a prediction does (:func:`~dippm_nas.cost.analytical.queued_latency`: the operators
issued one by one, each run on the GPU at the roofline's time once issued) and chooses the
``operator_us`` whose predictions have the least squared relative error. Views cost too little to
tell apart from the operators in these records, so ``view_us`` stays the profile's. PyTorch's fp32
defaults and fp16 autocast are fitted apart (autocast dispatches casts too), and each H100 session apart
(each machine is another host).
The harness's own host-cost rows (``data/measurements/host/``: a chain of tiny operators, no
``nn.Module`` in between) are printed beside the fit: what a model adds to the bare dispatch.

    python benchmarks/host_profile.py [--out benchmarks/results/host_profile.txt]
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from dippm_nas.cost.analytical import AnalyticalCostModel, queued_latency, torch_release
from dippm_nas.cost.host import get_host_profile
from dippm_nas.cost.table import node_table
from dippm_nas.graph.batching import scale_batch
from dippm_nas.hardware import get_device
from dippm_nas.training.dataset import load_graphs
from dippm_nas.training.records import load_records

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
        gpu = analytical.roofline(table, get_device(r.device), r.precision, r.layout, torch_release(r.torch),
                                  mode="cuda-graphs")
        if r.latency_ms < HOST_BOUND * gpu.latency_s * 1e3:
            continue
        rows.append({"origin": r.origin, "precision": r.precision, "model": r.model, "batch": r.batch,
                     "gpu_s": gpu.time_s, "is_view": table.is_view, "latency_us": r.latency_ms * 1e3})
    return rows


#: The operator costs the fit tries, in microseconds.
OPERATOR_US_GRID = np.arange(2.0, 80.0, 0.1)


def fit_operator_us(rows: list[dict], view_us: float) -> tuple[float, np.ndarray]:
    """The ``operator_us`` of OPERATOR_US_GRID whose queued latencies have the least squared relative error,
    and each row's relative error at it."""
    curves = []
    for row in rows:
        views = np.where(row["is_view"], view_us * 1e-6, 0.0)
        operators = (~row["is_view"]).astype(float) * 1e-6
        curves.append([queued_latency(row["gpu_s"], views + operators * us, np.ones(1))[0] * 1e6 / row["latency_us"] - 1
                       for us in OPERATOR_US_GRID])
    errors = np.array(curves)  # [rows, grid]
    best = int((errors ** 2).sum(axis=0).argmin())
    return float(OPERATOR_US_GRID[best]), errors[:, best]


def chain_rows() -> list[str]:
    """The harness's host-cost rows, one line per file and precision: the mean over operator kinds."""
    lines = []
    for path in sorted(HOST_ROWS.glob("*.csv")):
        by_precision = defaultdict(list)
        with path.open(newline="") as fh:
            for row in csv.DictReader(fh):
                if row["host_us"] and row["kind"] != "view":
                    by_precision[row["precision"]].append(float(row["host_us"]))
        for precision, values in sorted(by_precision.items()):
            lines.append(f"  {path}: {precision}: {statistics.fmean(values):.1f} us an operator (chain of tiny "
                         f"operators, mean of {len(values)} kinds)")
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
    lines += ["", "The harness's host-cost rows (no module between the operators):", *chain_rows()]
    text = "\n".join(lines) + "\n"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
