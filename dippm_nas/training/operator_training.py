"""Training the operator model (:mod:`dippm_nas.cost.learned.operator_network`) on operator-level ground truth, and
holding each GPU out of it in turn.

The loss is the absolute log ratio of predicted to measured seconds (about the relative error, and robust to
the few measurements a machine disturbed), each (GPU, operator, protocol) weighted alike so that NeuSight's
87,000 batched matrix products do not drown its 1,400 layer norms, and the kernels timed alone (the sweeps'
points and Vidur's GEMMs, the only ones at the tensor-core precisions) weighted
:attr:`OperatorTraining.kernel_weight` times. A corpus measurement is
predicted as its machine's protocol gap plus the kernel's time (:mod:`dippm_nas.training.operator_data`).
Every setting is fixed here, before any GPU is held out; nothing is chosen on a held-out GPU.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch

from dippm_nas.cost.learned.kernel_structure import FEATURE_NAMES, GROUPS, UNITS
from dippm_nas.cost.learned.operator_network import MIN_KERNEL_S, CandidateTensors, OperatorModel, OperatorNetwork
from dippm_nas.hardware.registry import get_device
from dippm_nas.training.operator_data import OperatorSamples, gap_of, protocol_gaps
from dippm_nas.training.operator_records import RecordSet, progress_to_stderr, record_latencies


@dataclass(frozen=True)
class OperatorTraining:
    """The settings of a fit."""

    epochs: int = 20
    batch_size: int = 4096
    lr: float = 3e-3
    kernel_weight: float = 3.0
    #: whole-model records per step, and their loss's weight beside the operators'
    record_batch: int = 32
    record_weight: float = 1.0
    seed: int = 0


@dataclass(frozen=True, eq=False)
class _Stacked:
    """Every sample's candidates on its own GPU, stacked: sample i's are ``order[start[i]:end[i]]``."""

    candidates: CandidateTensors
    start: np.ndarray
    end: np.ndarray
    order: np.ndarray

    @classmethod
    def of(cls, samples: OperatorSamples, use_named_tiles: bool) -> _Stacked:
        parts, offsets = [], []
        for gpu in sorted(set(samples.gpu)):
            index = np.flatnonzero(samples.gpu == gpu)
            parts.append(CandidateTensors.of(samples.columns.take(index), get_device(gpu), use_named_tiles))
            offsets.append(index)
        operator = np.concatenate([o[p.operator.numpy()] for o, p in zip(offsets, parts)])
        stacked = CandidateTensors.concatenate(parts, torch.from_numpy(operator), len(samples))
        order = np.argsort(operator, kind="stable")
        ordered = operator[order]
        return cls(stacked, np.searchsorted(ordered, np.arange(len(samples))),
                   np.searchsorted(ordered, np.arange(len(samples)), side="right"), order)

    def subset(self, index: np.ndarray) -> CandidateTensors:
        """The candidates of the samples at ``index``, their operators renumbered 0..len(index)-1."""
        lengths = self.end[index] - self.start[index]
        rows = np.concatenate([self.order[s:e] for s, e in zip(self.start[index], self.end[index])])
        return self.candidates.take(torch.from_numpy(rows),
                                    torch.from_numpy(np.repeat(np.arange(len(index)), lengths)), len(index))


def _weights(samples: OperatorSamples, kernel_weight: float) -> np.ndarray:
    """Each sample's weight: every (GPU, operator, protocol) alike, the kernels timed alone (every protocol
    but NeuSight's corpus) ``kernel_weight`` times."""
    keys = list(zip(samples.gpu, samples.operator, samples.protocol))
    counts = Counter(keys)
    w = np.array([1.0 / counts[key] for key in keys])
    return np.where(samples.protocol != "corpus", w * kernel_weight, w)


def fit(samples: OperatorSamples, records: RecordSet | None = None, config: OperatorTraining = OperatorTraining(),
        progress: Callable[[str], None] = progress_to_stderr) -> OperatorModel:
    """The operator model fitted on ``samples`` and, where given, whole-model ``records`` (all of them: hold a
    GPU out by leaving its samples and records out)."""
    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    gaps = protocol_gaps(samples)
    gap = torch.from_numpy(gap_of(samples, gaps, set(samples.gpu)).astype(np.float32))
    stacked = _Stacked.of(samples, use_named_tiles=True)
    features = stacked.candidates.features
    covered = torch.zeros(len(GROUPS), len(UNITS), dtype=torch.bool)
    covered[torch.from_numpy(samples.columns.group), torch.from_numpy(samples.columns.unit)] = True
    network = OperatorNetwork(features.mean(dim=0), _scale(features), covered)
    optimiser = torch.optim.Adam(network.parameters(), lr=config.lr)
    weights = torch.from_numpy(_weights(samples, config.kernel_weight).astype(np.float32))
    measured = torch.from_numpy(np.log(samples.seconds).astype(np.float32))
    record_weights = _record_weights(records) if records else None
    for epoch in range(config.epochs):
        order, total, record_total = rng.permutation(len(samples)), 0.0, 0.0
        record_order = rng.permutation(len(records)) if records else np.zeros(0, dtype=np.int64)
        steps = range(0, len(order), config.batch_size)
        for step, start in enumerate(steps):
            index = order[start:start + config.batch_size]
            index_t = torch.from_numpy(index)
            predicted = stacked.subset(index).seconds(network) + gap[index_t]
            w = weights[index_t]
            loss = (w * (torch.log(predicted) - measured[index_t]).abs()).sum() / w.sum()
            total += loss.item() * len(index)
            if records:
                share = len(record_order) // len(steps) + 1
                batch = record_order[step * share:(step + 1) * share]
                if len(batch):
                    latency = record_latencies(network, records, batch)
                    wr = torch.from_numpy(record_weights[batch])
                    record_loss = (wr * (torch.log(latency) - torch.from_numpy(np.log(records.latency_s[batch]))).abs()
                                   ).sum() / wr.sum()
                    loss = loss + config.record_weight * record_loss.float()
                    record_total += record_loss.item() * len(batch)
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
        on_records = f", records {record_total / len(records):.3f}" if records else ""
        progress(f"operator model: epoch {epoch + 1}/{config.epochs}, mean |log ratio| operators "
                 f"{total / len(samples):.3f}{on_records}")
    network.eval()
    card = {"features": list(FEATURE_NAMES), "groups": list(GROUPS), "units": list(UNITS), "config": asdict(config),
            "trained_on": {gpu: {op: int(n) for op, n in sorted(Counter(samples.operator[samples.gpu == gpu]).items())}
                           for gpu in sorted(set(samples.gpu))},
            "sources": sorted(set(samples.source)),
            "records": {d: int(n) for d, n in sorted(Counter(r.device for r in records.records).items())}
            if records else {},
            "protocol_gaps_us": {f"{gpu}:{op}": round(g * 1e6, 3) for (gpu, op), g in sorted(gaps.items())}}
    return OperatorModel(network, card)


def _scale(features: torch.Tensor) -> torch.Tensor:
    """Each feature's standardising scale; infinite for a feature the training data never varies (no
    misaligned tensor-core GEMM among a fold's GPUs, say), so that the network reads it as 0 rather than
    as a value it never learned anything about."""
    std = features.std(dim=0)
    return torch.where(std > 1e-6, std + 1e-3, torch.inf)


def _record_weights(records: RecordSet) -> np.ndarray:
    """Each record's weight: every GPU's records alike."""
    counts = Counter(r.device for r in records.records)
    return np.array([1.0 / counts[r.device] for r in records.records])


def kernel_seconds(model: OperatorModel, samples: OperatorSamples) -> np.ndarray:
    """Each sample's predicted kernel seconds on its own GPU (the fastest candidate; no named tile)."""
    out = np.zeros(len(samples))
    for gpu in sorted(set(samples.gpu)):
        index = np.flatnonzero(samples.gpu == gpu)
        for start in range(0, len(index), 50_000):
            part = index[start:start + 50_000]
            out[part] = model.seconds(samples.columns.take(part), get_device(gpu))
    return out


def roofline_seconds(samples: OperatorSamples) -> np.ndarray:
    """Each sample's roofline on its own GPU: its FLOPs at the unit's peak or its bytes at the bandwidth,
    whichever takes longer, after the least time a kernel takes."""
    bandwidth = np.array([get_device(g).memory_bw_gbs * 1e9 for g in samples.gpu])
    return MIN_KERNEL_S + np.maximum(samples.columns.flops / samples.columns.peak, samples.columns.moved / bandwidth)


@dataclass(frozen=True, eq=False)
class HeldOut:
    """The predictions of one held-out GPU's samples: the model's and the roofline's, each with the
    protocol gap the GPU gets (the other machines' median)."""

    gpu: str
    samples: OperatorSamples
    predicted: np.ndarray
    roofline: np.ndarray


def leave_one_gpu_out(samples: OperatorSamples, records: RecordSet | None = None,
                      config: OperatorTraining = OperatorTraining(),
                      progress: Callable[[str], None] = progress_to_stderr) -> list[HeldOut]:
    """Each GPU held out in turn: the model fitted on the others' samples and records, then every sample of
    the held-out GPU predicted. GPUs of one chip (:data:`SAME_CHIP`) are held out together."""
    gaps = protocol_gaps(samples)
    results = []
    for fold in _folds(samples.gpu):
        progress(f"holding out {', '.join(fold)}")
        held = np.isin(samples.gpu, fold)
        model = fit_without(fold, samples, records, config, progress)
        test = samples.take(np.flatnonzero(held))
        gap = gap_of(test, gaps, set(samples.gpu[~held]))
        results.extend(HeldOut(gpu, test.take(np.flatnonzero(test.gpu == gpu)),
                               (kernel_seconds(model, test) + gap)[test.gpu == gpu],
                               (roofline_seconds(test) + gap)[test.gpu == gpu]) for gpu in fold)
    return results


def fit_without(gpus: Sequence[str], samples: OperatorSamples, records: RecordSet | None = None,
                config: OperatorTraining = OperatorTraining(),
                progress: Callable[[str], None] = progress_to_stderr) -> OperatorModel:
    """The operator model fitted without ``gpus``: neither their operator samples nor their records."""
    return fit(samples.take(np.flatnonzero(~np.isin(samples.gpu, gpus))), without(records, gpus), config, progress)


def without(records: RecordSet | None, gpus: Sequence[str]) -> RecordSet | None:
    """The records of every GPU but ``gpus``."""
    if records is None:
        return None
    keep = [i for i, r in enumerate(records.records) if r.device not in gpus]
    return records.take(np.array(keep, dtype=np.int64))


#: GPUs held out together: one chip with other memory on another board (GA100 with 40 or 80 GB, GH100 with
#: HBM3 or HBM3e). Their kernels are the same; a fold that trained on one would time the other's from its twin's
#: measurements, which a user of a GPU nobody measured does not have.
SAME_CHIP = (("a100-40gb-pcie", "a100-80gb-pcie", "a100-80gb"), ("h100-sxm", "h200"))


def chip_of(gpu: str) -> tuple[str, ...]:
    """``gpu`` and every GPU of the same chip (:data:`SAME_CHIP`): what holding it out leaves out."""
    return next((group for group in SAME_CHIP if gpu in group), (gpu,))


def _folds(gpus: np.ndarray) -> list[tuple[str, ...]]:
    present = sorted(set(gpus))
    folds = [tuple(g for g in group if g in present) for group in SAME_CHIP]
    folds = [f for f in folds if f]
    grouped = {g for f in folds for g in f}
    return sorted(folds + [(g,) for g in present if g not in grouped])
