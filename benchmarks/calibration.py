"""Calibrating a GPU from ten of its measured rows: how close the calibrated operator model comes on the rest.

For each GPU, the operator model is trained without that GPU and the GPUs of its chip (neither their
operators nor their records, as ``dippm-nas evaluate --leave-one-gpu-out`` trains it; the H100 and the H200
are one chip), so the GPU is one it never saw. Then, for each seed,
ten of the GPU's records at one precision are drawn at random, ``dippm-nas calibrate``'s fit is run on them,
and the latency MAPE on the GPU's other records at that precision is printed before and after, beside the
calibration's own leave-one-out error, and the floor of the design: the three scales fitted on all the
GPU's records at that precision. Beside it, the floor of a richer design: one scale per kernel group of
the registry (GEMMs, convolutions, attention, elementwise, each normalisation, softmax, reductions, pooling)
and the host's, fitted on all the records; where that too is above the bar, no calibration of the kernels'
speeds meets it. The energy MAPE on the same records follows, before and after (the
calibration's fitted idle and busy power on its calibrated latencies; every record measured energy), and
the memory MAPE on the records that measured memory (the calibration's fitted memory outside the allocator
and its reserve; the analytical model's where the calibration's rows fit none). The held-out operator
models are kept under ``$DIPPM_NAS_CACHE_DIR/held-out`` (trained in a few minutes each when missing).

    python benchmarks/calibration.py                       # h200 and h100-sxm, fp32 and fp16, seeds 0-4
    python benchmarks/calibration.py --gpus h200 --seeds 1
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys

import numpy as np

from dippm_nas.calibration import Calibration
from dippm_nas.cost.estimate import MemoryBreakdown
from dippm_nas.cost.learned.kernel_structure import GROUPS
from dippm_nas.cost.models.calibrated import LatencyParts, calibrated_memory, memory_terms
from dippm_nas.cost.pipeline.host_queue import queued_latency
from dippm_nas.cost.pipeline.kernel_times import kernel_groups
from dippm_nas.cost.pipeline.memory import memory
from dippm_nas.cost.pipeline.power import energy_j, spec_powers
from dippm_nas.cost.pipeline.table import node_table
from dippm_nas.graph.batching import scale_batch
from dippm_nas.hardware.registry import get_device
from dippm_nas.precisions import PRECISIONS
from dippm_nas.request import Request
from dippm_nas.training.calibration_check import held_out_operator_model
from dippm_nas.training.calibration_fit import (
    PRIOR_WEIGHTS,
    MeasuredRow,
    calibrate,
    fit_scales,
    scaled_latency_ms,
)
from dippm_nas.training.dataset import load_graphs
from dippm_nas.training.metrics import mape
from dippm_nas.training.records import MEMORY_NVML_PROCESS, Record, load_records

#: Batches up to this one are where eager PyTorch mostly waits on the host.
HOST_BOUND_BATCH = 8
#: Adam's steps for the floor of one scale per kernel group: the fit has settled well before.
GROUP_FIT_STEPS = 300


def regime(batch: int) -> str:
    """The batch range a figure is given for: where eager PyTorch mostly waits on the host, or above."""
    return f"batch <= {HOST_BOUND_BATCH}" if batch <= HOST_BOUND_BATCH else f"batch > {HOST_BOUND_BATCH}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", default="h200,h100-sxm")
    parser.add_argument("--precisions", default="fp32,fp16")
    parser.add_argument("--rows", type=int, default=10, help="rows a calibration is fitted on (default: 10)")
    parser.add_argument("--seeds", type=int, default=5, help="draws of those rows, seeds 0 to N-1 (default: 5)")
    args = parser.parse_args()
    records = [r for r in load_records() if r.latency_ms]
    graphs = load_graphs({r.graph_key for r in records})

    print(f"{'GPU':<10} {'precision':<9} {'records':>7} {'seed':>4} {'uncalibrated':>12} {'calibrated':>10} "
          f"{'calibration LOO':>15}  {'energy: uncalibrated':>20} {'calibrated':>10}  {'memory: uncalibrated':>20} "
          f"{'calibrated':>10}  scales (GEMM-class, others, host); power (idle, busy W); memory (MiB outside the "
          "allocator, reserve scale)")
    for gpu in args.gpus.split(","):
        model = held_out_operator_model(gpu)
        device = get_device(gpu)
        for precision in args.precisions.split(","):
            mine = [r for r in records if r.device == gpu and r.precision == precision and r.graph_key in graphs]
            if len(mine) <= args.rows:
                print(f"{gpu:<10} {precision:<9} {len(mine):>7}  too few records")
                continue
            scaled = {id(r): scale_batch(graphs[r.graph_key], r.batch) for r in mine}
            request = Request(device, PRECISIONS[precision])  # eager, on the default host, as a calibration fits
            parts = {id(r): LatencyParts.of(model.timed(node_table(scaled[id(r)]), request)) for r in mine}
            uncalibrated = np.array([scaled_latency_ms(parts[id(r)], np.ones(3)) for r in mine])
            spec = spec_powers(device)
            joules = np.array([r.energy_j or np.nan for r in mine])
            uncalibrated_j = np.array([energy_j(ms * 1e-3, parts[id(r)].busy_s, *spec)
                                       for ms, r in zip(uncalibrated, mine)])
            metered = [r for r in mine if r.memory_mb]
            breakdowns = {id(r): memory(node_table(scaled[id(r)]), request.precision) for r in metered}
            calibrated_errors, calibrated_energy, calibrated_memory = [], [], []
            left_out_draws: list[tuple[list[int], np.ndarray]] = []  # each draw's records left out, calibrated
            for seed in range(args.seeds):
                chosen = set(random.Random(seed).sample(range(len(mine)), args.rows))
                fit_on = [mine[i] for i in sorted(chosen)]
                rest = [i for i in range(len(mine)) if i not in chosen]
                calibration = calibrate([_row(r) for r in fit_on], gpu, precision, "eager", "records",
                                        graph_of=_graph_of(fit_on, graphs), say=lambda line: None, model=model)
                scales = np.array([calibration.gemm_scale, calibration.memory_scale, calibration.host_scale])
                after = np.array([scaled_latency_ms(parts[id(mine[i])], scales) for i in rest])
                measured = np.array([mine[i].latency_ms for i in rest])
                before = mape(uncalibrated[rest], measured)
                calibrated_errors.append(mape(after, measured))
                left_out_draws.append((rest, after))
                powers = calibration.powers(device) or spec
                after_j = np.array([energy_j(ms * 1e-3, parts[id(mine[i])].busy_s, *powers)
                                    for ms, i in zip(after, rest)])
                calibrated_energy.append(mape(after_j, joules[rest]))
                rest_metered = [mine[i] for i in rest if mine[i].memory_mb]
                memory_before = _memory_mape(rest_metered, breakdowns)
                calibrated_memory.append(_memory_mape(rest_metered, breakdowns, calibration))
                fitted_memory = (f"{calibration.runtime_mib:.0f}, {calibration.reserve_scale:.3g}"
                                 if calibration.runtime_mib is not None else "analytical")
                print(f"{gpu:<10} {precision:<9} {len(rest):>7} {seed:>4} {before:>12.1%} "
                      f"{calibrated_errors[-1]:>10.1%} {calibration.left_out_mape:>15.1%}  "
                      f"{mape(uncalibrated_j[rest], joules[rest]):>20.1%} {calibrated_energy[-1]:>10.1%}  "
                      f"{_percent(memory_before):>20} {_percent(calibrated_memory[-1]):>10}  "
                      f"{calibration.gemm_scale:.3g}, {calibration.memory_scale:.3g}, {calibration.host_scale:.3g}; "
                      f"{powers[0]:.0f}, {powers[1]:.0f}; {fitted_memory}", flush=True)
            measured_all = np.array([r.latency_ms for r in mine])
            every = fit_scales([parts[id(r)] for r in mine], measured_all * 1e-3, PRIOR_WEIGHTS[0])
            fitted_all = np.array([scaled_latency_ms(parts[id(r)], every) for r in mine])
            floor = mape(fitted_all, measured_all)
            group_floor, group_scales = _group_floor([parts[id(r)] for r in mine], [scaled[id(r)] for r in mine],
                                                     measured_all * 1e-3)
            print(f"{gpu:<10} {precision:<9} mean over {args.seeds} seeds: uncalibrated "
                  f"{mape(uncalibrated, measured_all):.1%} on all {len(mine)} records, calibrated "
                  f"{statistics.mean(calibrated_errors):.1%} on the records each calibration left out; fitted on all "
                  f"{len(mine)}: {floor:.1%} (scales {every[0]:.3g}, {every[1]:.3g}, {every[2]:.3g}), with a scale "
                  f"per kernel group {group_floor:.1%} ({group_scales}); energy: "
                  f"uncalibrated {mape(uncalibrated_j, joules):.1%}, calibrated "
                  f"{statistics.mean(calibrated_energy):.1%}; memory on the {len(metered)} records that measured it: "
                  f"uncalibrated {_percent(_memory_mape(metered, breakdowns))}, "
                  f"calibrated {_percent(statistics.mean(calibrated_memory))}", flush=True)
            print(f"{gpu:<10} {precision:<9} by batch, latency: "
                  + _by_batch(mine, measured_all, uncalibrated, left_out_draws, fitted_all), flush=True)
    return 0


def _by_batch(records: list[Record], measured: np.ndarray, uncalibrated: np.ndarray,
              draws: list[tuple[list[int], np.ndarray]], fitted_all: np.ndarray) -> str:
    """The latency MAPE uncalibrated, calibrated (mean over the draws, on the records each left out) and fitted
    on all records, apart for the batches where eager PyTorch mostly waits on the host (<= HOST_BOUND_BATCH)
    and the larger ones, whose measurements repeat far more closely (docs/measurement.md)."""
    small = np.array([r.batch <= HOST_BOUND_BATCH for r in records])
    parts = []
    for label, side in ((regime(1), small), (regime(HOST_BOUND_BATCH + 1), ~small)):
        if not side.any():
            continue
        calibrated = statistics.mean(mape(after[side[rest]], measured[rest][side[rest]]) for rest, after in draws)
        before, floor = mape(uncalibrated[side], measured[side]), mape(fitted_all[side], measured[side])
        parts.append(f"{label} ({int(side.sum())} records): uncalibrated {before:.1%}, calibrated {calibrated:.1%}, "
                     f"fitted on all {floor:.1%}")
    return "; ".join(parts)


def _group_floor(parts: list[LatencyParts], graphs: list, measured_s: np.ndarray) -> tuple[float, str]:
    """The latency MAPE of one scale per kernel group (:data:`~dippm_nas.cost.learned.kernel_structure.GROUPS`) and
    one on the host's issue time, fitted on every graph (the mean squared log error of the queued latency,
    by Adam on the log-scales) from its operators' times ``parts``, and the scales of the groups the graphs
    run."""
    import torch

    length = max(len(part.host_s) for part in parts)
    # padded with operators that take no time and issue at once: they end no latency
    seconds = torch.zeros(len(parts), length, dtype=torch.float64)
    group = torch.zeros(len(parts), length, dtype=torch.long)
    host = torch.zeros(len(parts), length, dtype=torch.float64)
    real = torch.zeros(len(parts), length, dtype=torch.bool)
    for i, (part, graph) in enumerate(zip(parts, graphs)):
        n = len(part.host_s)
        real[i, :n] = True
        seconds[i, :n] = torch.from_numpy(part.gemm_s + part.other_s)
        group[i, :n] = torch.from_numpy(kernel_groups(node_table(graph)))
        host[i, :n] = torch.from_numpy(part.host_s)
    log_scales = torch.zeros(len(GROUPS) + 1, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.Adam([log_scales], lr=0.05)

    def latencies() -> torch.Tensor:
        return queued_latency(host, [seconds * torch.exp(log_scales[group])],
                              torch.exp(log_scales[-1]).expand(len(parts)))

    measured = torch.from_numpy(measured_s)
    for _ in range(GROUP_FIT_STEPS):
        optimizer.zero_grad()
        torch.mean(torch.log(latencies() / measured) ** 2).backward()
        optimizer.step()
    with torch.no_grad():
        fitted = latencies().numpy()
        scales = torch.exp(log_scales).numpy()
    used = sorted(set(group[real].tolist()))
    named = ", ".join(f"{GROUPS[g]} {scales[g]:.2g}" for g in used) + f", host {scales[-1]:.2g}"
    return mape(fitted, measured_s), named


def _row(record: Record) -> MeasuredRow:
    return MeasuredRow(record.model, record.batch, record.latency_ms, record.image_size, record.precision,
                       energy_j=record.energy_j, memory_mib=record.memory_mb,
                       memory_counts_modules=record.memory_measure == MEMORY_NVML_PROCESS)


def _percent(fraction: float) -> str:
    """A MAPE in percent, or "none" where no record measured it (nan)."""
    return "none" if np.isnan(fraction) else f"{fraction:.1%}"


def _memory_mape(records: list[Record], breakdowns: dict[int, MemoryBreakdown],
                 calibration: Calibration | None = None) -> float:
    """The memory MAPE of ``records`` as the analytical model (with ``calibration``'s memory, where given)
    predicts what each measured (:func:`~dippm_nas.cost.models.calibrated.memory_terms`: NVML's figure for the
    process, or the first protocol's context plus reserved); nan where there are none."""
    if not records:
        return float("nan")
    predicted = [sum(memory_terms(calibrated_memory(calibration, breakdowns[id(r)]) if calibration
                                  else breakdowns[id(r)], r.memory_measure == MEMORY_NVML_PROCESS)) for r in records]
    return mape(np.array(predicted), np.array([r.memory_mb for r in records]))


def _graph_of(records: list[Record], graphs: dict):
    """The stored graph of each calibration row at its batch (the records' graphs, not a new export)."""
    by_row = {(r.model, r.batch, r.image_size): r for r in records}

    def graph_of(row: MeasuredRow):
        record = by_row[(row.model, row.batch, row.input_size)]
        return scale_batch(graphs[record.graph_key], record.batch)

    return graph_of


if __name__ == "__main__":
    sys.exit(main())
