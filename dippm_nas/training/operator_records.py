"""Whole-model records as ground truth for the operator model, through the graph and the host queue.

The operator corpus and the sweeps time single operators; a whole model's latency times all of them at
once, at shapes networks really have, on GPUs no operator was measured on (timm's RTX 3090 and 4090, the
H200) and at the tensor-core precisions the corpus lacks. A record is predicted as the operator cost
model predicts it, through the same stages (:mod:`dippm_nas.cost.pipeline`): each operator's kernel from its
candidates, what the roofline charges beyond the kernel, never below the roofline
(:func:`~dippm_nas.cost.pipeline.kernel_times.floored`), the whole through the host queue
(:func:`~dippm_nas.cost.pipeline.host_queue.queued_latency`) — here in torch, so the loss of a record reaches the
operator model's parameters.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from dippm_nas.cost.learned.operator_network import CandidateTensors, OperatorNetwork
from dippm_nas.cost.pipeline.host_queue import issue_seconds, queued_latency
from dippm_nas.cost.pipeline.kernel_times import beyond_and_floor, floored, kernel_columns
from dippm_nas.cost.pipeline.roofline import roofline
from dippm_nas.cost.pipeline.table import node_table
from dippm_nas.training.dataset import configurations, load_graphs
from dippm_nas.training.records import Record, measured_request


def progress_to_stderr(line: str) -> None:
    """The operator model's training and reports say how far they are, a line at a time, on stderr."""
    print(line, file=sys.stderr, flush=True)


@dataclass(frozen=True, eq=False)
class RecordSet:
    """Records as the operator model's training reads them: per record its operators in graph order (the host's
    time to issue each, what the roofline charges beyond each kernel, the roofline's floor, whether it runs a
    kernel) and every kernel's candidates on the record's GPU, and the measured latency."""

    records: list[Record]
    candidates: list[CandidateTensors]  # per record, its kernels' candidates (operators numbered 0..kernels-1)
    kernel_of: list[np.ndarray]  # per record, each operator's kernel index, -1 for a view
    host_s: list[np.ndarray]  # per record, the host's time to issue each operator
    beyond_s: list[np.ndarray]
    floor_s: list[np.ndarray]
    latency_s: np.ndarray

    def __len__(self) -> int:
        return len(self.records)

    def take(self, index: np.ndarray) -> RecordSet:
        """The records at ``index``."""
        pick = index.tolist()
        return RecordSet([self.records[i] for i in pick], *([column[i] for i in pick] for column in (
            self.candidates, self.kernel_of, self.host_s, self.beyond_s, self.floor_s)),
            latency_s=self.latency_s[index])


#: Records per GPU and precision the operator model trains on at most (drawn with a fixed seed): timm's
#: thousands of RTX records would otherwise outweigh every other GPU's.
MAX_RECORDS_PER_GPU_AND_PRECISION = 400
#: NeuSight's whole-transformer labels stay out of training: they are the test of whole models the operator
#: model is held to (``dippm-nas evaluate --operators``).
HELD_OUT_SOURCES = frozenset({"neusight"})


def training_records(records: Sequence[Record], seed: int = 0) -> list[Record]:
    """The records the operator model trains on: NeuSight's labels left out, at most
    :data:`MAX_RECORDS_PER_GPU_AND_PRECISION` of each GPU and precision."""
    import random

    rng = random.Random(seed)
    groups: dict[tuple[str, str], list[Record]] = {}
    for r in records:
        if r.source not in HELD_OUT_SOURCES:
            groups.setdefault((r.device, r.precision), []).append(r)
    kept = []
    for key in sorted(groups):
        group = groups[key]
        kept += group if len(group) <= MAX_RECORDS_PER_GPU_AND_PRECISION else rng.sample(
            group, MAX_RECORDS_PER_GPU_AND_PRECISION)
    return kept


def record_set(records: Sequence[Record], progress: Callable[[str], None] = progress_to_stderr) -> RecordSet:
    """Every record whose graph the project's store holds, ready for :func:`record_latencies`."""
    graphs = load_graphs({r.graph_key for r in records})
    kept = [r for r in records if r.graph_key in graphs]
    rows: dict[int, tuple] = {}
    for done, (graph, members) in enumerate(configurations(kept, graphs)):
        if done % 200 == 0:
            progress(f"records for the operator model: {done} configurations read")
        table = node_table(graph)
        for i in members:
            request = measured_request(kept[i])
            bounds = roofline(table, request)
            columns = kernel_columns(table, bounds.peak, request.gpu, request.precision)
            beyond, floor = beyond_and_floor(columns, bounds, request.gpu)
            run = np.flatnonzero(~table.is_view)
            kernel_of = np.full(len(table), -1)
            kernel_of[run] = np.arange(len(run))
            rows[i] = (CandidateTensors.of(columns.take(run), request.gpu), kernel_of, issue_seconds(table, request),
                       beyond, floor)
    order = sorted(rows)
    return RecordSet([kept[i] for i in order], *([rows[i][j] for i in order] for j in range(5)),
                     latency_s=np.array([kept[i].latency_ms * 1e-3 for i in order]))


def record_latencies(network: OperatorNetwork, records: RecordSet, index: np.ndarray) -> torch.Tensor:
    """The predicted latency (seconds) of the records at ``index``, differentiable in the network."""
    out = []
    for i in index.tolist():
        kernels = records.candidates[i].seconds(network)
        kernel_of = torch.from_numpy(records.kernel_of[i])
        runs = kernel_of >= 0
        beyond = torch.from_numpy(records.beyond_s[i])
        floor = torch.from_numpy(records.floor_s[i])
        times = torch.zeros(len(kernel_of), dtype=torch.float64)
        times[runs] = floored(beyond[runs], kernels[kernel_of[runs]].double(), floor[runs])
        out.append(queued_latency(torch.from_numpy(records.host_s[i]), [times]))
    return torch.stack(out)
