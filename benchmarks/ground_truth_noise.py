"""How far does the ground truth itself move? Where our harness measured a configuration twice, and
where it measured a batch slower than a larger batch of the same model, beside the leave-one-GPU-out
error on those records.

No predictor that reads only the model, the batch, the precision and the GPU can come closer to one
measurement of a configuration than that measurement is to another of the same configuration.

1. **Repeats.** Every configuration measured more than once on one GPU model, on another machine (so
   another host CPU) or in a fresh process on the same machine
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
from dippm_nas.training.records import Record, harness_rows

#: A second measurement contradicts a first when they differ by more than this factor.
CONTRADICTION = 1.10
#: Up to this batch eager PyTorch mostly waits on the host (``docs/transfer.md``'s ranges 1 and 2-8).
HOST_BOUND_BATCH = 8
#: Two rows taken this far apart came from different machines (the harness's machine holds its GPU for 30 minutes
#: at most).
ANOTHER_MACHINE_S = 3600.0


@dataclass(frozen=True)
class Measurement:
    """One harness row: its record (the configuration, the latency, the file it is written in) and what
    the row read beside it that a record leaves out."""

    record: Record
    date: datetime
    sm_clock_mhz: str
    cuda_graphs_ms: str
    host_issue_ms: str

    @property
    def configuration(self) -> tuple:
        """What a prediction is asked for: two rows with the same configuration measured the same thing."""
        r = self.record
        return r.model, r.image_size, r.batch, r.precision, r.layout, r.device, r.torch

    @property
    def series(self) -> tuple:
        """The configuration without its batch: one model's batches at one precision."""
        r = self.record
        return r.origin, r.model, r.image_size, r.precision, r.layout, r.device, r.torch

    def matches(self, row: dict[str, str]) -> bool:
        """Whether a row of ``transfer_predictions.csv`` is this measurement's record."""
        return ((row["model"], int(row["image_size"]), int(row["batch"]), row["precision"], row["layout"],
                 row["device"], row["torch"]) == self.configuration
                and abs(float(row["measured_ms"]) / self.record.latency_ms - 1) < 1e-3)


def harness_files(root: Path) -> list[Path]:
    """Every CSV of harness rows that measured whole models: the campaigns', the imported H200 check's
    and the repeatability passes'."""
    data = root / "data"
    return [*sorted((data / "measurements").glob("*.csv")),
            *sorted((data / "measurements" / "repeatability").glob("*.csv")),
            *sorted((data / "h200").glob("h200*.csv"))]


def read_measurements(files: list[Path]) -> list[Measurement]:
    """The measured rows of the harness's ``files``, read as the data set reads them."""
    return [Measurement(record, datetime.fromisoformat(record.date), sm_clock_mhz=row.get("sm_clock_mhz") or "",
                        cuda_graphs_ms=row.get("latency_ms_cuda_graphs") or "",
                        host_issue_ms=row.get("host_issue_ms") or "")
            for row, record in harness_rows(files) if record.latency_ms is not None]


def regime(batch: int) -> str:
    """The batch range a figure is given for: where eager PyTorch mostly waits on the host, or above."""
    return f"batch <= {HOST_BOUND_BATCH}" if batch <= HOST_BOUND_BATCH else f"batch > {HOST_BOUND_BATCH}"


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
        by_series[m.series].append(m)
    found = []
    for series in by_series.values():
        ordered = sorted(series, key=lambda m: m.record.batch)
        found += [(small, large) for small, large in zip(ordered, ordered[1:])
                  if small.record.batch < large.record.batch
                  and small.record.latency_ms > CONTRADICTION * large.record.latency_ms]
    return found


def differ(first: Measurement, second: Measurement) -> bool:
    """Whether two measurements of one configuration contradict each other."""
    times = first.record.latency_ms, second.record.latency_ms
    return max(times) > CONTRADICTION * min(times)


def pair_kind(first: Measurement, second: Measurement) -> str:
    """``another machine`` or ``another process`` (on the same machine), from the rows' dates."""
    return "another machine" if (second.date - first.date).total_seconds() > ANOTHER_MACHINE_S else "another process"


def repeat_lines(pairs: list[tuple[Measurement, Measurement]]) -> list[str]:
    """Part 1: each repeat and, per kind and batch range, how far the later is from the earlier."""
    lines = ["## 1. Configurations measured more than once (later latency / earlier)", ""]
    groups = defaultdict(list)
    for first, second in sorted(pairs, key=lambda p: (pair_kind(*p), p[0].record.device, p[0].record.batch,
                                                      p[0].record.model)):
        a, b = first.record, second.record
        ratio = b.latency_ms / a.latency_ms
        kind = pair_kind(first, second)
        groups[(kind, regime(a.batch))].append(ratio)
        lines.append(f"  {kind:15s} {a.device:9s} {a.model:34s} b{a.batch:<4d} {a.precision:5s} "
                     f"{a.latency_ms:8.2f} -> {b.latency_ms:8.2f} ms  {ratio:5.2f}   {a.origin} -> {b.origin}")
    lines += ["", "  Per kind and batch range: pairs; |later / earlier - 1| mean (about the MAPE one measurement gets "
              "as a prediction of the other), largest; pairs that differ by more than "
              f"{CONTRADICTION - 1:.0%}", ""]
    for (kind, batches), ratios in sorted(groups.items()):
        gap = np.abs(np.array(ratios) - 1)
        lines.append(f"  {kind:15s} {batches:11s} {len(ratios):3d} pairs: mean {gap.mean():5.1%}, "
                     f"largest {gap.max():5.1%}, over {CONTRADICTION - 1:.0%}: {int((gap > CONTRADICTION - 1).sum())}")
    return lines


def inversion_lines(measurements: list[Measurement], found: list[tuple[Measurement, Measurement]]) -> list[str]:
    """Part 2: each inversion, with the clocks and CUDA-graph latencies where the rows recorded them, and
    how many adjacent batch pairs each file has."""
    lines = ["", f"## 2. A batch measured more than {CONTRADICTION - 1:.0%} slower than the next larger batch "
             "(same file, model and precision)", ""]
    adjacent = defaultdict(set)
    for m in measurements:
        adjacent[m.series].add(m.record.batch)
    per_file = defaultdict(int)
    for (file, *_), batches in adjacent.items():
        per_file[file] += max(len(batches) - 1, 0)
    for small, large in sorted(found, key=lambda p: (p[0].record.origin, p[0].record.model)):
        detail = ""
        if small.sm_clock_mhz:
            detail = (f"  SM clock {float(small.sm_clock_mhz):.0f} / {float(large.sm_clock_mhz):.0f} MHz; "
                      f"under CUDA graphs {float(small.cuda_graphs_ms or 'nan'):.2f} / "
                      f"{float(large.cuda_graphs_ms or 'nan'):.2f} ms")
        if small.host_issue_ms:
            detail += (f"; the host's issue {float(small.host_issue_ms):.2f} / "
                       f"{float(large.host_issue_ms or 'nan'):.2f} ms")
        a, b = small.record, large.record
        lines.append(f"  {a.origin:45s} {a.model:34s} {a.precision:5s} b{a.batch} {a.latency_ms:7.2f} ms > "
                     f"b{b.batch} {b.latency_ms:7.2f} ms  ({a.latency_ms / b.latency_ms:4.2f}x){detail}")
    lines += ["", "  Per file: adjacent batch pairs, inverted"]
    counts = defaultdict(int)
    for small, _ in found:
        counts[small.record.origin] += 1
    lines += [f"  {file:45s} {pairs:4d} pairs, {counts[file]:3d} inverted"
              for file, pairs in sorted(per_file.items()) if pairs]
    return lines


def held_out_lines(devices: set[str], contradicted: list[Measurement], predictions: Path) -> list[str]:
    """Part 3: per GPU and batch range, the leave-one-GPU-out MAPE on every record and on those no second
    measurement contradicts."""
    lines = ["", "## 3. Leave-one-GPU-out MAPE, every record and the records no second measurement contradicts", ""]
    if not predictions.exists():
        return lines + [f"  {predictions} is missing: run `dippm-nas evaluate --leave-one-gpu-out` first."]
    by_device = {device: [m for m in contradicted if m.record.device == device] for device in devices}
    with predictions.open(newline="") as fh:
        rows = [row for row in csv.DictReader(fh)
                if row["device"] in devices and row["split"] == f"without {row['device']}"]
    lines.append(f"  {'GPU':9s} {'batches':11s} {'records':>7s} {'contradicted':>12s}   analytical: every, the rest   "
                 "PMGNS: every, the rest")
    for device, suspects in sorted(by_device.items()):
        for batches in (regime(1), regime(HOST_BOUND_BATCH + 1)):
            own = [row for row in rows if row["device"] == device and regime(int(row["batch"])) == batches]
            if not own:
                continue
            kept = np.array([not any(m.matches(row) for m in suspects) for row in own])
            measured = np.array([float(row["measured_ms"]) for row in own])
            figures = []
            for column in ("analytical_ms", "pmgns_ms"):
                predicted = np.array([float(row[column]) for row in own])
                figures += [mape(predicted, measured), mape(predicted[kept], measured[kept])]
            lines.append(f"  {device:9s} {batches:11s} {len(own):7d} {int((~kept).sum()):12d}   {figures[0]:16.1%}, "
                         f"{figures[1]:6.1%}   {figures[2]:11.1%}, {figures[3]:6.1%}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="benchmarks/results/ground_truth_noise.txt")
    args = parser.parse_args(argv)
    root = project().root
    measurements = read_measurements(harness_files(root))
    pairs = repeats(measurements)
    found = inversions(measurements)
    contradicted = {m for pair in pairs if differ(*pair) for m in pair} | {small for small, _ in found}
    lines = ["$ python benchmarks/ground_truth_noise.py  (2-core build machine, no GPU)",
             f"{len(measurements)} harness rows of {len({m.record.origin for m in measurements})} files; a second "
             f"measurement contradicts a first where they differ by more than {CONTRADICTION - 1:.0%}.", ""]
    lines += repeat_lines(pairs)
    lines += inversion_lines(measurements, found)
    predictions = root / "docs" / "accuracy" / "transfer_predictions.csv"
    lines += held_out_lines({m.record.device for m in measurements}, sorted(contradicted, key=lambda m: m.date),
                            predictions)
    text = "\n".join(lines) + "\n"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
