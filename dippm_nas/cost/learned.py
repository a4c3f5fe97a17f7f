"""PMGNS at prediction time: shipped weights (safetensors) and their model card (JSON).

It answers only where it was trained: a device and precision in its card. Elsewhere it raises
:class:`NotCovered` and :func:`dippm_nas.predict_graph` falls back to the analytical model, saying so.
Latency is learned on every device of the card; energy and memory only on the devices where the
harness measured them, and only where the training configuration applies their correction (the
card's ``target_devices``). Elsewhere energy is the analytical power times the learned time and memory
the analytical liveness model, and the cost-model label says which.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from dippm_nas.cost.analytical import AnalyticalCostModel, host_bound_notes, version_numbers
from dippm_nas.cost.base import Estimate, register_cost_model
from dippm_nas.cost.pmgns import PMGNS, TARGETS, log_latency
from dippm_nas.graph.features import (adjacency, dense_node_features, node_feature_matrix, one_hot_columns,
                                     one_hot_width)
from dippm_nas.graph.model_graph import ModelGraph
from dippm_nas.graph.table import NodeTable
from dippm_nas.hardware.registry import Device
from dippm_nas.training.train import Scaling

if TYPE_CHECKING:
    from dippm_nas.training.dataset import RecordInputs

WEIGHTS = Path(__file__).resolve().parent / "weights"


class NotCovered(LookupError):
    """The learned model was not trained for this device or precision."""


@dataclass(frozen=True)
class Card:
    config: dict
    static_features: list[str]
    static_scaling: Scaling
    node_scaling: Scaling
    devices: tuple[str, ...]
    precisions: tuple[str, ...]
    families: frozenset[str]
    #: The devices whose records had each target the model corrects (TrainConfig.corrected_targets):
    #: the learned energy and memory hold only there.
    target_devices: dict[str, tuple[str, ...]]
    #: Per device, the newest PyTorch among its records: a prediction is for that runtime.
    torch_versions: dict[str, str]
    raw: dict
    #: (batch, records) over the training records: how much of the data a request's batch resembles.
    batches: tuple[tuple[int, int], ...] = ()
    #: Test MAPE of the shipped configuration on records of families it saw (random split) and, when
    #: ``dippm-nas evaluate --ship`` wrote the card, on whole families it never saw (family split).
    seen_family_mape: float | None = None
    unseen_family_mape: float | None = None


def save(fitted, ts, trained_on: np.ndarray, path: Path, extra: dict) -> None:
    """Weights to ``path``.safetensors, the card to ``path``.json; what the card says was learned from
    (devices, precisions, families, batches) is read from the records ``trained_on``."""
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in fitted.model.state_dict().items()}, str(path.with_suffix(".safetensors")))
    records = [ts.records[i] for i in trained_on]
    target_devices = {t: sorted({ts.records[r].device for r in trained_on if not np.isnan(ts.targets[r, i])})
                      for i, t in enumerate(TARGETS) if t in fitted.config.corrected_targets}
    batches, counts = np.unique([r.batch for r in records], return_counts=True)
    card = {
        "config": vars(fitted.config), "static_features": ts.static_names,
        "static_scaling": fitted.static_scaling.to_json(), "node_scaling": fitted.node_scaling.to_json(),
        "node_dim": int(ts.x[0].shape[1]), "devices": sorted({r.device for r in records}),
        "precisions": sorted({r.precision for r in records}), "families": sorted({r.family for r in records}),
        "target_devices": {t: d for t, d in target_devices.items() if d},
        "torch_versions": {d: max((r.torch for r in records if r.device == d), key=version_numbers)
                           for d in sorted({r.device for r in records})},
        "batches": [[int(b), int(c)] for b, c in zip(batches, counts)],
        "best_val_mape": fitted.best_val_mape, "best_epoch": fitted.best_epoch, **extra,
    }
    path.with_suffix(".json").write_text(json.dumps(card, indent=1))


@cache
def load(path: Path = WEIGHTS / "pmgns") -> tuple[PMGNS, Card]:
    from safetensors.torch import load_file

    raw = json.loads(path.with_suffix(".json").read_text())
    model = PMGNS(raw["node_dim"], len(raw["static_features"]), conv=raw["config"]["conv"], hidden=raw["config"]["hidden"])
    model.load_state_dict(load_file(str(path.with_suffix(".safetensors"))))
    model.eval()
    card = Card(raw["config"], raw["static_features"], Scaling.from_json(raw["static_scaling"]),
                Scaling.from_json(raw["node_scaling"]), tuple(raw["devices"]),
                tuple(raw["precisions"]), frozenset(raw["families"]),
                {t: tuple(d) for t, d in raw["target_devices"].items()}, raw["torch_versions"], raw,
                tuple((b, c) for b, c in raw.get("batches", ())), raw.get("test_latency", {}).get("mape"),
                raw.get("held_out_family_latency", {}).get("mape"))
    return model, card


def available(path: Path = WEIGHTS / "pmgns") -> bool:
    return path.with_suffix(".safetensors").exists() and path.with_suffix(".json").exists()


@contextmanager
def one_thread() -> Iterator[None]:
    """One prediction is a few hundred rows: torch's intra-op threads only wait on each other, and on a
    busy machine (parallel NAS workers) they made it about thirty times slower (5 ms against 144 ms
    per graph, measured with a training run on the other core)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _sage_output(projected: torch.Tensor, adjacency: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """A GraphSAGE convolution from its inputs projected by both linear maps at once (``[n, 2 *
    hidden]``: neighbour half, own half): by linearity the mean over producers commutes with the
    projection, so one matrix product and one sparse mean replace SAGEConv's two products."""
    from torch_geometric.utils import spmm

    neighbours, own = projected.chunk(2, dim=1)
    return spmm(adjacency, neighbours.contiguous(), reduce="mean") + bias + own


@dataclass(frozen=True)
class FusedSage:
    """A GraphSAGE network's convolutions, rearranged for one prediction; the output is the plain
    network's up to rounding (``tests/training``).

    The first convolution is folded into the node features' standardisation: most node-feature
    columns are one-hot (kind, category), and standardised and clipped such a column takes one of
    two values, so its part of ``features @ W.T`` is a row of ``W`` looked up, not multiplied. Each
    later convolution is one product with its two linear maps stacked (:func:`_sage_output`), without
    torch-geometric's message-passing dispatch, which took longer than the arithmetic."""

    base: torch.Tensor  # [2 * hidden]: the first projections of an operator with every one-hot column off
    switch: torch.Tensor  # [one-hot columns, 2 * hidden]: what turning each one on adds
    dense_weight: torch.Tensor  # [dense columns, 2 * hidden]
    dense_scaling: Scaling
    later: tuple[torch.Tensor, ...]  # per convolution after the first: [hidden, 2 * hidden], both linear maps
    biases: tuple[torch.Tensor, ...]  # per convolution, the first included
    norms: tuple[torch.nn.Module, ...]  # per convolution, the first included

    @classmethod
    def of(cls, model: PMGNS, card: Card) -> FusedSage:
        stacked = tuple(torch.cat([c.lin_l.weight, c.lin_r.weight]).detach().T.contiguous() for c in model.convs)
        k = one_hot_width()
        one_hot = card.node_scaling.columns(slice(None, k))
        off, on = one_hot(torch.zeros(k)), one_hot(torch.ones(k))
        first = stacked[0]
        return cls(base=off @ first[:k], switch=(on - off)[:, None] * first[:k], dense_weight=first[k:].contiguous(),
                   dense_scaling=card.node_scaling.columns(slice(k, None)), later=stacked[1:],
                   biases=tuple(c.lin_l.bias.detach() for c in model.convs), norms=tuple(model.norms))

    def __call__(self, table: NodeTable, adjacency: torch.Tensor) -> torch.Tensor:
        """Every operator's output of the last convolution block."""
        dense = self.dense_scaling(torch.from_numpy(dense_node_features(table)))
        kind, category = (torch.from_numpy(columns) for columns in one_hot_columns(table))
        projected = self.base + self.switch[kind] + self.switch[category] + dense @ self.dense_weight
        h = torch.relu(self.norms[0](_sage_output(projected, adjacency, self.biases[0])))
        for weight, bias, norm in zip(self.later, self.biases[1:], self.norms[1:]):
            h = torch.relu(norm(_sage_output(h @ weight, adjacency, bias)))
        return h


class PMGNSCostModel:
    name = "pmgns"

    def __init__(self, path: Path = WEIGHTS / "pmgns"):
        self.path = path
        self.analytical = AnalyticalCostModel()

    def _loaded(self) -> tuple[PMGNS, Card]:
        if not available(self.path):  # a stat per call: checked once, then the loaded model is kept
            raise NotCovered(f"no trained PMGNS weights at {self.path}.safetensors (run `dippm-nas train`)")
        return load(self.path)

    @cached_property
    def card(self) -> Card:
        return self._loaded()[1]

    @cached_property
    def model(self) -> PMGNS:
        return self._loaded()[0]

    @cached_property
    def fused(self) -> FusedSage | None:
        return FusedSage.of(self.model, self.card) if self.model.conv_name == "sage" else None

    def covers(self, device: Device, precision: str) -> str | None:
        """None when covered, else why not."""
        if device.slice_of or device.key not in self.card.devices:
            return f"PMGNS is trained on {', '.join(self.card.devices)}, not {device.key}"
        if precision not in self.card.precisions:
            return f"PMGNS is trained for {', '.join(self.card.precisions)}, not {precision}"
        return None

    def estimate(self, graph: ModelGraph, device: Device, precision: str = "fp32", layout: str = "nchw") -> Estimate:
        from dippm_nas.training.dataset import record_inputs

        reason = self.covers(device, precision)
        if reason:
            raise NotCovered(reason)
        table = graph.table  # its per-sample columns are the batch-1 graph's
        request = {"batch": graph.batch, "device": device.key, "precision": precision, "layout": layout,
                   "torch": self.card.torch_versions[device.key]}
        inputs = record_inputs(table, request, self.analytical)
        analytical = inputs.estimate
        with torch.inference_mode(), one_thread():
            out = self._correction(graph, inputs)
            curve = torch.from_numpy(inputs.latency_curve).float()[None]
            latency_ms = math.exp(float(log_latency(curve, out[:, 0])[0]))
        ratio = dict(zip(TARGETS, (math.exp(v) for v in out[0].tolist())))
        # The learned latency ratio scales the GPU time; the host's time to issue the operators stays.
        gpu_ms = analytical.latency_ms * (1 - inputs.features["host_wait_share"]) * ratio["latency_ms"]
        ratio["latency_ms"] = latency_ms / analytical.latency_ms
        learned = [t for t in TARGETS[1:] if device.key in self.card.target_devices.get(t, ())]
        # Where no energy was measured on this device, the analytical power over the learned time.
        energy = analytical.energy_j * ratio["energy_j" if "energy_j" in learned else "latency_ms"]
        memory = analytical.memory_mib * (ratio["memory_mb"] if "memory_mb" in learned else 1.0)
        return Estimate(
            latency_ms=latency_ms, energy_j=energy, memory_mib=memory,
            memory=analytical.memory, cost_model=_learned_label(learned),
            notes=coverage_notes(self.card, graph.family, graph.batch)
            + host_bound_notes(max(0.0, 1 - gpu_ms / latency_ms), int((~table.is_view).sum())),
        )

    def _correction(self, graph: ModelGraph, inputs: RecordInputs) -> torch.Tensor:
        """The network's log-ratios for one configuration of ``graph``; a GraphSAGE network's
        convolutions come fused."""
        raw = torch.tensor([[inputs.features[n] for n in self.card.static_features]], dtype=torch.float32)
        static = self.card.static_scaling(raw)
        time_share = torch.from_numpy(inputs.time_share)[None]
        adj = adjacency(graph)
        if self.fused is not None:
            embedding = self.model.readout(self.fused(graph.table, adj), None, None, time_share)
            return self.model.correction(torch.cat([embedding, static], dim=1))
        x = self.card.node_scaling(node_feature_matrix(graph.table))
        return self.model(x, adj, torch.zeros(len(x), dtype=torch.long), torch.zeros(1, dtype=torch.long), static,
                          time_share)


def _learned_label(learned: list[str]) -> str:
    energy = "energy learned" if "energy_j" in learned else "energy = analytical power x learned time"
    memory = "memory learned" if "memory_mb" in learned else "memory analytical"
    return f"pmgns (latency learned; {energy}; {memory})"


#: A batch smaller (larger) than all but this share of the training records' is flagged as far from the data.
SPARSE_SHARE = 0.05


def coverage_notes(card: Card, family: str, batch: int) -> tuple[str, ...]:
    """How far a request is from what PMGNS learned from, and the error measured that far out: a user
    ranking candidates should know whether a figure is interpolated or extrapolated."""
    seen = family in card.families
    error = card.seen_family_mape if seen else card.unseen_family_mape
    if error is not None:  # the held-out families are timm's: a model unlike any of them may be further off
        measured = f" (test MAPE {error:.1%} on {'families it saw' if seen else 'whole timm families held out'})"
    else:
        measured = "" if seen else " (its error on unseen families: docs/accuracy.md)"
    notes = [f"PMGNS trained on {', '.join(card.devices)}; model family {family or '(unknown)'} "
             f"{'was' if seen else 'was not'} in its training data{measured}"]
    if card.batches:
        total = sum(c for _, c in card.batches)
        below = sum(c for b, c in card.batches if b < batch) / total
        above = sum(c for b, c in card.batches if b > batch) / total
        span = f"{card.batches[0][0]}-{card.batches[-1][0]}"
        if above > 1 - SPARSE_SHARE:
            notes.append(f"batch {batch}: {above:.0%} of its training records have a larger batch ({span}); its correction "
                         "of the GPU's time has seen few batches this small")
        elif below > 1 - SPARSE_SHARE:
            notes.append(f"batch {batch}: {below:.0%} of its training records have a smaller batch ({span}); "
                         "the learned correction is extrapolating")
    return tuple(notes)


register_cost_model("pmgns", PMGNSCostModel)
