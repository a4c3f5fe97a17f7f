"""Training the kernel-efficiency model on operators and on whole networks, and holding GPUs out of it.

Two kinds of ground truth train the one perceptron of :mod:`dippm_nas.cost.kernel_efficiency`:

* operator rows (:mod:`dippm_nas.training.operators`): the log of measured time over the core bound,
  operator by operator;
* whole-model records, through the graph: each operator's time is what the roofline charges beyond its
  core plus its core time times the predicted slowdown, the host issues the operators as the analytical
  model's queue has it (:func:`~dippm_nas.cost.analytical.queued_latency`), and the loss is the squared
  log error of the network's latency. These are what cover the GPUs no operator was timed on.

Each GPU weighs in by the square root of its share of the rows (or records), so the GPU with the most
(a sweep's thousands of operators, the RTX 4090's thousands of records) does not decide alone what
transfers. Training stops at the step with the least loss on validation records drawn from the training
GPUs, never on a held-out GPU.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
from tqdm import tqdm

from dippm_nas.cost.analytical import AnalyticalCostModel, torch_release
from dippm_nas.cost.kernel_efficiency import (
    GROUPS,
    MAX_LOG_SLOWDOWN,
    MIN_LOG_SLOWDOWN,
    SIGMOID_SHIFT,
    UNITS,
    KernelEfficiency,
    core_seconds,
    features,
    operator_seconds,
    split_roofline,
)
from dippm_nas.graph.model_graph import ModelGraph
from dippm_nas.hardware.registry import get_device
from dippm_nas.training.dataset import configurations
from dippm_nas.training.metrics import mape
from dippm_nas.training.operators import OperatorRow, design, operators_of
from dippm_nas.training.records import Record


@dataclass(frozen=True, eq=False)
class Networks:
    """Whole-model records as the model trains on them: every operator of every record in one set of
    arrays, record after record (``start[r]:start[r + 1]`` are record r's), and per record its measured
    latency, the plain roofline's, its GPU, precision and batch."""

    x: np.ndarray  # [operators, features], float32
    core_s: np.ndarray
    extra_s: np.ndarray  # what the roofline charges beyond the core: casts, transposes, extra launches
    host_s: np.ndarray
    view: np.ndarray
    group: np.ndarray
    unit: np.ndarray
    start: np.ndarray  # [records + 1]
    measured_ms: np.ndarray
    roofline_ms: np.ndarray
    gpu: np.ndarray
    precision: np.ndarray
    batch: np.ndarray

    def __len__(self) -> int:
        return len(self.measured_ms)

    def operator_index(self, records: np.ndarray) -> np.ndarray:
        """The operators of ``records``, in their order."""
        return np.concatenate([np.arange(self.start[r], self.start[r + 1]) for r in records.tolist()])

    def latency_ms(self, log_slowdown: np.ndarray, records: np.ndarray) -> np.ndarray:
        """The latency of ``records`` with their operators' slowdowns (one per operator of those records)."""
        import torch

        ops = self.operator_index(records)
        seconds = operator_seconds(self.core_s[ops], self.extra_s[ops], self.view[ops], log_slowdown)
        segment = torch.from_numpy(np.repeat(np.arange(len(records)), np.diff(self.start)[records]))
        return _queued(torch.from_numpy(seconds), torch.from_numpy(self.host_s[ops]), segment,
                       len(records)).numpy() * 1e3


def _queued(seconds, host_s, segment, count: int):
    """:func:`~dippm_nas.cost.analytical.queued_latency` of many graphs at once, as torch tensors
    (``segment``: each operator's graph, graphs contiguous), so that training can differentiate it."""
    import torch

    total = torch.zeros(count, dtype=seconds.dtype).index_add_(0, segment, seconds)
    host_total = torch.zeros(count, dtype=seconds.dtype).index_add_(0, segment, host_s)
    host_before = torch.cumsum(host_total, 0) - host_total
    time_before = torch.cumsum(total, 0) - total
    issued = torch.cumsum(host_s, 0) - host_before[segment]
    remaining = total[segment] - (torch.cumsum(seconds, 0) - seconds - time_before[segment])
    return torch.full((count,), -math.inf, dtype=seconds.dtype).scatter_reduce(
        0, segment, issued + remaining, reduce="amax")


def network_operators(records: Sequence[Record], graphs: dict[str, ModelGraph]) -> Networks:
    """The operators of every record with a latency whose graph is in ``graphs``, priced on its GPU at
    its precision. Shows a progress bar on stderr."""
    kept = [r for r in records if r.latency_ms and r.graph_key in graphs]
    analytical = AnalyticalCostModel()
    parts: list[tuple[np.ndarray, ...]] = []
    roofline_ms, order = [], []
    with tqdm(total=len(kept), desc="network operators", unit="record", file=sys.stderr) as bar:
        for table, group in configurations(kept, graphs):
            for i in group:
                r = kept[i]
                device = get_device(r.device)
                roofline = analytical.roofline(table, device, r.precision, r.layout, torch_release(r.torch))
                operators, core, extra = split_roofline(table, roofline, device, r.precision)
                parts.append((features(operators, device).astype(np.float32), core, extra, roofline.host_s,
                              table.is_view, operators.group, operators.unit))
                roofline_ms.append(roofline.latency_s * 1e3)
                order.append(i)
                bar.update()
    kept = [kept[i] for i in order]
    columns = [np.concatenate(c) for c in zip(*parts)]
    start = np.concatenate([[0], np.cumsum([len(p[1]) for p in parts])])
    return Networks(*columns, start=start, measured_ms=np.array([r.latency_ms for r in kept]),
                    roofline_ms=np.array(roofline_ms), gpu=np.array([r.device for r in kept]),
                    precision=np.array([r.precision for r in kept]), batch=np.array([r.batch for r in kept]))


def _subset(networks: Networks, records: np.ndarray) -> Networks:
    ops = networks.operator_index(records)
    start = np.concatenate([[0], np.cumsum(np.diff(networks.start)[records])])
    per_op = {k: getattr(networks, k)[ops] for k in ("x", "core_s", "extra_s", "host_s", "view", "group", "unit")}
    per_record = {k: getattr(networks, k)[records] for k in ("measured_ms", "roofline_ms", "gpu", "precision", "batch")}
    return Networks(**per_op, start=start, **per_record)


def without_gpu(networks: Networks, gpu: str) -> Networks:
    """The records of every other GPU."""
    return _subset(networks, np.flatnonzero(networks.gpu != gpu))


def of_gpu(networks: Networks, gpu: str) -> Networks:
    """The records of ``gpu``."""
    return _subset(networks, np.flatnonzero(networks.gpu == gpu))


@dataclass(frozen=True)
class FitConfig:
    """The perceptron and its training; fixed, not chosen on any held-out GPU."""

    hidden: int = 64
    layers: int = 2
    steps: int = 1500
    records_per_step: int = 128
    validation_share: float = 0.15
    evaluate_every: int = 100
    learning_rate: float = 3e-3
    weight_decay: float = 1e-4
    seed: int = 0


def _gpu_weights(gpus: np.ndarray) -> np.ndarray:
    """1 / sqrt(rows of the GPU), normalised to mean 1."""
    names, counts = np.unique(gpus, return_counts=True)
    per_gpu = dict(zip(names, counts))
    weight = np.array([1.0 / math.sqrt(per_gpu[g]) for g in gpus])
    return weight / weight.mean()


def fit(rows: Sequence[OperatorRow], networks: Networks | None = None, config: FitConfig = FitConfig(),
        progress: bool = False) -> KernelEfficiency:
    """Trains the model on operator ``rows`` and, where given, whole-model ``networks``."""
    import torch

    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    d = design(rows) if rows else None
    covered = np.zeros((len(GROUPS), len(UNITS)), dtype=bool)
    samples = []
    if d is not None:
        covered[d.group, d.unit] = True
        samples.append(d.x)
    train = validation = np.zeros(0, dtype=np.int64)
    if networks is not None and len(networks):
        order = rng.permutation(len(networks))
        cut = int(round(len(order) * config.validation_share))
        validation, train = np.sort(order[:cut]), np.sort(order[cut:])
        busy = ~networks.view
        covered[networks.group[busy], networks.unit[busy]] = True
        samples.append(networks.x[rng.choice(len(networks.x), min(len(networks.x), 200_000), replace=False)])
    reference = np.concatenate(samples).astype(np.float64)
    mean, scale = reference.mean(axis=0), reference.std(axis=0)
    scale[scale == 0] = 1.0

    sizes = [reference.shape[1], *([config.hidden] * config.layers), 1]
    linears = [torch.nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:])]
    net = torch.nn.Sequential(*[m for lin in linears[:-1] for m in (lin, torch.nn.SiLU())], linears[-1])
    mean_t, scale_t = torch.tensor(mean, dtype=torch.float32), torch.tensor(scale, dtype=torch.float32)

    def slowdown(x: np.ndarray) -> torch.Tensor:
        raw = net((torch.from_numpy(np.asarray(x, dtype=np.float32)) - mean_t) / scale_t)[:, 0]
        return MIN_LOG_SLOWDOWN + (MAX_LOG_SLOWDOWN - MIN_LOG_SLOWDOWN) * torch.sigmoid(raw + SIGMOID_SHIFT)

    record_weight = _gpu_weights(networks.gpu) if networks is not None else np.zeros(0)

    def network_loss(records: np.ndarray) -> torch.Tensor:
        ops = networks.operator_index(records)
        s = slowdown(networks.x[ops]).double()
        seconds = torch.from_numpy(networks.extra_s[ops]) + torch.from_numpy(networks.core_s[ops]) * torch.exp(s)
        seconds = torch.where(torch.from_numpy(networks.view[ops]), torch.zeros_like(seconds), seconds)
        segment = torch.from_numpy(np.repeat(np.arange(len(records)), np.diff(networks.start)[records]))
        latency = _queued(seconds, torch.from_numpy(networks.host_s[ops]), segment, len(records))
        error = torch.log(latency * 1e3) - torch.from_numpy(np.log(networks.measured_ms[records]))
        return (torch.from_numpy(record_weight[records]) * error ** 2).mean()

    draw = record_weight[train] / record_weight[train].sum() if len(train) else None
    op_weight = torch.tensor(_gpu_weights(d.gpu) if d is not None else np.zeros(0))
    optimizer = torch.optim.AdamW(net.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, config.steps)
    best, best_state = math.inf, None
    for step in tqdm(range(config.steps), desc="kernel model", unit="step", file=sys.stderr, disable=not progress):
        optimizer.zero_grad()
        loss = torch.zeros((), dtype=torch.float64)
        if d is not None:
            loss = loss + (op_weight * (slowdown(d.x).double() - torch.from_numpy(d.y)) ** 2).mean()
        if draw is not None:
            batch = rng.choice(train, size=min(config.records_per_step, len(train)), replace=False, p=draw)
            loss = loss + network_loss(np.sort(batch))
        loss.backward()
        optimizer.step()
        schedule.step()
        if len(validation) and ((step + 1) % config.evaluate_every == 0 or step + 1 == config.steps):
            with torch.no_grad():
                held = float(network_loss(validation))
            if held < best:
                best, best_state = held, [p.detach().clone() for p in net.parameters()]
    if best_state is not None:
        with torch.no_grad():
            for p, kept in zip(net.parameters(), best_state):
                p.copy_(kept)
    layers = tuple((lin.weight.detach().double().numpy().T.copy(), lin.bias.detach().double().numpy().copy())
                   for lin in linears)
    trained_on = {"operator_rows": {str(g): int(c) for g, c in zip(*np.unique(d.gpu, return_counts=True))}
                  if d is not None else {},
                  "network_records": {str(g): int(c) for g, c in zip(*np.unique(networks.gpu, return_counts=True))}
                  if networks is not None else {},
                  "config": asdict(config)}
    return KernelEfficiency(mean, scale, layers, covered, trained_on)


def _mape(predicted: np.ndarray, measured: np.ndarray) -> float:
    return 100 * mape(predicted, measured)


@dataclass(frozen=True)
class HeldOutOperators:
    """One GPU's operators, predicted by a model trained without them: MAPE of time per group."""

    gpu: str
    rows: int
    roofline_mape: float
    learned_mape: float
    groups: tuple[tuple[str, int, float, float], ...]  # group, rows, roofline MAPE, learned MAPE


def leave_one_gpu_out(rows: Sequence[OperatorRow], config: FitConfig = FitConfig(),
                      gpus: Sequence[str] | None = None) -> list[HeldOutOperators]:
    """For each GPU with operator rows: train on the other GPUs' rows alone, predict its rows."""
    results = []
    for gpu in gpus or sorted({r.gpu for r in rows}):
        model = fit([r for r in rows if r.gpu != gpu], config=config)
        test = [r for r in rows if r.gpu == gpu]
        operators = operators_of(test)
        device = get_device(gpu)
        roof = core_seconds(operators, device)
        learned = roof * np.exp(model.log_slowdown(operators, device))
        measured = np.array([r.seconds for r in test])
        masks = [(g, operators.group == i) for i, g in enumerate(GROUPS)]
        groups = tuple((g, int(m.sum()), _mape(roof[m], measured[m]), _mape(learned[m], measured[m]))
                       for g, m in masks if m.any())
        results.append(HeldOutOperators(gpu, len(test), _mape(roof, measured), _mape(learned, measured), groups))
    return results


def predict_networks(model: KernelEfficiency, networks: Networks) -> np.ndarray:
    """Every record's latency (ms) with the model's slowdowns."""
    records = np.arange(len(networks))
    return networks.latency_ms(model.predict(networks.x.astype(np.float64), networks.group, networks.unit), records)
