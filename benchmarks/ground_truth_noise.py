"""How far does the ground truth itself move? Where our harness measured a configuration twice, and
where it measured a batch slower than a larger batch of the same model, beside the leave-one-GPU-out
error on those records.

No predictor that reads only the model, the batch, the precision and the GPU can come closer to one
measurement of a configuration than that measurement is to another of the same configuration.

1. **Repeats.** Every configuration measured more than once on one GPU model, in another lease (another
   lent machine, so another host CPU) or in a fresh process of the same lease
   (``data/measurements/repeatability/``, ``data/h200/h200_repeat.csv``): the later latency over the
   earlier, at batch <= 8 (where eager PyTorch waits on the host) and above.
2. **Batch inversions.** In one file, a model and precision measured more than ``CONTRADICTION`` times
   slower at one batch than at the next larger one. The larger batch issues the same operators from
   the host and runs them on more data; where the rows recorded the GPU's clock, the latency under
   CUDA graphs (the GPU's own time) and the host's time to issue a pass, they show which side moved.
3. **Held-out error without the contradicted records.** PMGNS's and the analytical model's
   leave-one-GPU-out MAPE (``docs/accuracy/transfer_predictions.csv``, written by ``dippm-nas evaluate
   --leave-one-gpu-out``) per GPU and batch range, on every record and on those that neither a repeat
   nor a larger batch contradicts. Nothing is chosen on these figures; they say how much of the
   held-out error the contradicted records carry.

    python benchmarks/ground_truth_noise.py [--out benchmarks/results/ground_truth_noise.txt]
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from itertools import combinations
from pathlib import Path

import numpy as np

from dippm_nas.training.metrics import mape
from dippm_nas.training.paths import project
from dippm_nas.training.records import GPU_NAMES

#: A second measurement contradicts a first when they differ by more than this factor.
CONTRADICTION = 1.10
#: Up to this batch eager PyTorch mostly waits on the host (``docs/transfer.md``'s ranges 1 and 2-8).
HOST_BOUND_BATCH = 8
#: Two rows taken this far apart came from different leases (a lease is held 30 minutes at most).
ANOTHER_LEASE_S = 3600.0


@dataclass(frozen=True)
class Measurement:
    """One harness row: the configuration it measured, when, where it is written, and what it read."""

    model: str
    image_size: int
    batch: int
    precision: str
    layout: str
    device: str
    torch: str
    latency_ms: float
    date: datetime
    file: str
    sm_clock_mhz: str
    cuda_graphs_ms: str
    host_issue_ms: str

    @property
    def configuration(self) -> tuple:
        """What a prediction is asked for: two rows with the same configuration measured the same thing."""
        return self.model, self.image_size, self.batch, self.precision, self.layout, self.device, self.torch

    @property
    def series(self) -> tuple:
        """The configuration without its batch: one model's batches at one precision."""
        return self.model, self.image_size, self.precision, self.layout, self.device, self.torch

    def matches(self, row: dict[str, str]) -> bool:
        """Whether a row of ``transfer_predictions.csv`` is this measurement's record."""
        return ((row["model"], int(row["image_size"]), int(row["batch"]), row["precision"], row["layout"],
                 row["device"], row["torch"]) == self.configuration
                and abs(float(row["measured_ms"]) / self.latency_ms - 1) < 1e-3)


def harness_files(root: Path) -> list[Path]:
    """Every CSV of harness rows that measured whole models: the campaigns', the imported H200 check's
    and the repeatability passes'."""
    data = root / "data"
    return [*sorted((data / "measurements").glob("*.csv")),
            *sorted((data / "measurements" / "repeatability").glob("*.csv")),
            *sorted((data / "h200").glob("h200*.csv"))]


def read_measurements(path: Path, root: Path) -> list[Measurement]:
    """The measured rows of one harness file."""
    rows = []
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            if row.get("status") != "ok" or row.get("device_kind") != "cuda" or not row.get("latency_ms_median"):
                continue
            rows.append(Measurement(
                model=row["model"], image_size=int(row["input_shape"].split("x")[-1]), batch=int(row["batch"]),
                precision=row["precision"], layout=row["layout"],
                device=GPU_NAMES.get(row["gpu_name"], row["gpu_name"]), torch=row["torch"],
                latency_ms=float(row["latency_ms_median"]), date=datetime.fromisoformat(row["date"]),
                file=str(path.relative_to(root)),
                sm_clock_mhz=row.get("sm_clock_mhz") or "", cuda_graphs_ms=row.get("latency_ms_cuda_graphs") or "",
                host_issue_ms=row.get("host_issue_ms") or ""))
    return rows


def repeats(measurements: list[Measurement]) -> list[tuple[Measurement, Measurement]]:
    """Every pair of measurements of one configuration, earlier first."""
    by_configuration = defaultdict(list)
    for m in measurements:
        by_configuration[m.configuration].append(m)
    return [pair for group in by_configuration.values()
            for pair in combinations(sorted(group, key=lambda m: m.date), 2)]


def inversions(measurements: list[Measurement]) -> list[tuple[Measurement, Measurement]]:
    """Per file, each (smaller batch, next larger batch) of one series where the smaller batch measured
    more than CONTRADICTION times slower."""
    by_series = defaultdict(list)
    for m in measurements:
        by_series[(m.file, m.series)].append(m)
    found = []
    for series in by_series.values():
        ordered = sorted(series, key=lambda m: m.batch)
        found += [(small, large) for small, large in zip(ordered, ordered[1:])
                  if small.batch < large.batch and small.latency_ms > CONTRADICTION * large.latency_ms]
    return found


def differ(first: Measurement, second: Measurement) -> bool:
    """Whether two measurements of one configuration contradict each other."""
    return max(first.latency_ms, second.latency_ms) > CONTRADICTION * min(first.latency_ms, second.latency_ms)


def pair_kind(first: Measurement, second: Measurement) -> str:
    """``another lease`` or ``another process`` (the same lease), from the rows' dates."""
    return "another lease" if (second.date - first.date).total_seconds() > ANOTHER_LEASE_S else "another process"


def repeat_lines(pairs: list[tuple[Measurement, Measurement]]) -> list[str]:
    """Part 1: each repeat and, per kind and batch range, how far the later is from the earlier."""
    lines = ["## 1. Configurations measured more than once (later latency / earlier)", ""]
    groups = defaultdict(list)
    for first, second in sorted(pairs, key=lambda p: (pair_kind(*p), p[0].device, p[0].batch, p[0].model)):
        ratio = second.latency_ms / first.latency_ms
        kind = pair_kind(first, second)
        regime = f"batch <= {HOST_BOUND_BATCH}" if first.batch <= HOST_BOUND_BATCH else f"batch > {HOST_BOUND_BATCH}"
        groups[(kind, regime)].append(ratio)
        lines.append(f"  {kind:15s} {first.device:9s} {first.model:34s} b{first.batch:<4d} {first.precision:5s} "
                     f"{first.latency_ms:8.2f} -> {second.latency_ms:8.2f} ms  {ratio:5.2f}   "
                     f"{first.file} -> {second.file}")
    lines += ["", "  Per kind and batch range: pairs; |later / earlier - 1| mean (about the MAPE one measurement gets "
              "as a prediction of the other), largest; pairs that differ by more than "
              f"{CONTRADICTION - 1:.0%}", ""]
    for (kind, regime), ratios in sorted(groups.items()):
        gap = np.abs(np.array(ratios) - 1)
        lines.append(f"  {kind:15s} {regime:11s} {len(ratios):3d} pairs: mean {gap.mean():5.1%}, "
                     f"largest {gap.max():5.1%}, over {CONTRADICTION - 1:.0%}: {int((gap > CONTRADICTION - 1).sum())}")
    return lines


def inversion_lines(measurements: list[Measurement], found: list[tuple[Measurement, Measurement]]) -> list[str]:
    """Part 2: each inversion, with the clocks and CUDA-graph latencies where the rows recorded them, and
    how many adjacent batch pairs each file has."""
    lines = ["", f"## 2. A batch measured more than {CONTRADICTION - 1:.0%} slower than the next larger batch "
             "(same file, model and precision)", ""]
    adjacent = defaultdict(set)
    for m in measurements:
        adjacent[(m.file, m.series)].add(m.batch)
    per_file = defaultdict(int)
    for (file, _), batches in adjacent.items():
        per_file[file] += max(len(batches) - 1, 0)
    for small, large in sorted(found, key=lambda p: (p[0].file, p[0].model)):
        detail = ""
        if small.sm_clock_mhz:
            detail = (f"  SM clock {float(small.sm_clock_mhz):.0f} / {float(large.sm_clock_mhz):.0f} MHz; "
                      f"under CUDA graphs {float(small.cuda_graphs_ms or 'nan'):.2f} / "
                      f"{float(large.cuda_graphs_ms or 'nan'):.2f} ms")
        if small.host_issue_ms:
            detail += (f"; the host's issue {float(small.host_issue_ms):.2f} / "
                       f"{float(large.host_issue_ms or 'nan'):.2f} ms")
        lines.append(f"  {small.file:45s} {small.model:34s} {small.precision:5s} b{small.batch} "
                     f"{small.latency_ms:7.2f} ms > b{large.batch} {large.latency_ms:7.2f} ms  "
                     f"({small.latency_ms / large.latency_ms:4.2f}x){detail}")
    lines += ["", "  Per file: adjacent batch pairs, inverted"]
    counts = defaultdict(int)
    for small, _ in found:
        counts[small.file] += 1
    lines += [f"  {file:45s} {pairs:4d} pairs, {counts[file]:3d} inverted"
              for file, pairs in sorted(per_file.items()) if pairs]
    return lines


def held_out_lines(devices: set[str], contradicted: list[Measurement], predictions: Path) -> list[str]:
    """Part 3: per GPU and batch range, the leave-one-GPU-out MAPE on every record and on those no second
    measurement contradicts."""
    lines = ["", "## 3. Leave-one-GPU-out MAPE, every record and the records no second measurement contradicts", ""]
    if not predictions.exists():
        return lines + [f"  {predictions} is missing: run `dippm-nas evaluate --leave-one-gpu-out` first."]
    by_device = {device: [m for m in contradicted if m.device == device] for device in devices}
    with predictions.open(newline="") as fh:
        rows = [row for row in csv.DictReader(fh)
                if row["device"] in devices and row["split"] == f"without {row['device']}"]
    lines.append(f"  {'GPU':9s} {'batch':5s} {'records':>7s} {'contradicted':>12s}   analytical: every, the rest   "
                 "PMGNS: every, the rest")
    for device, suspects in sorted(by_device.items()):
        for host_bound in (True, False):
            own = [row for row in rows
                   if row["device"] == device and (int(row["batch"]) <= HOST_BOUND_BATCH) == host_bound]
            if not own:
                continue
            kept = np.array([not any(m.matches(row) for m in suspects) for row in own])
            measured = np.array([float(row["measured_ms"]) for row in own])
            figures = []
            for column in ("analytical_ms", "pmgns_ms"):
                predicted = np.array([float(row[column]) for row in own])
                figures += [mape(predicted, measured), mape(predicted[kept], measured[kept])]
            batches = f"<= {HOST_BOUND_BATCH}" if host_bound else f"> {HOST_BOUND_BATCH}"
            lines.append(f"  {device:9s} {batches:5s} {len(own):7d} {int((~kept).sum()):12d}   {figures[0]:16.1%}, "
                         f"{figures[1]:6.1%}   {figures[2]:11.1%}, {figures[3]:6.1%}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="benchmarks/results/ground_truth_noise.txt")
    args = parser.parse_args(argv)
    root = project().root
    measurements = [m for path in harness_files(root) for m in read_measurements(path, root)]
    pairs = repeats(measurements)
    found = inversions(measurements)
    contradicted = {m for pair in pairs if differ(*pair) for m in pair} | {small for small, _ in found}
    lines = ["$ python benchmarks/ground_truth_noise.py  (2-core build machine, no GPU)",
             f"{len(measurements)} harness rows of {len({m.file for m in measurements})} files; a second measurement "
             f"contradicts a first where they differ by more than {CONTRADICTION - 1:.0%}.", ""]
    lines += repeat_lines(pairs)
    lines += inversion_lines(measurements, found)
    predictions = root / "docs" / "accuracy" / "transfer_predictions.csv"
    lines += held_out_lines({m.device for m in measurements}, sorted(contradicted, key=lambda m: m.date), predictions)
    text = "\n".join(lines) + "\n"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
