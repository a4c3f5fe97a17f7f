"""PMGNS at prediction time: shipped weights (safetensors) and their model card (JSON).

A model is an ensemble of one or more PMGNS networks trained from different seeds (the shipped one has
one); a prediction is the geometric mean of theirs. It answers for every GPU of the registry: the network
reads a GPU through its spec sheet, so a GPU its records never measured, or one added to the registry as a
CSV row, is predicted without retraining, and its notes say so and cite the error measured on GPUs held
out of training. A precision without records is read as its stand-in
(:data:`~dippm_nas.cost.coverage.STAND_IN`), and a MIG slice as its whole GPU (no slice was measured):
the correction the network gives what it read applies to the request's own roofline (a 7g slice, which
has every SM, predicts as its GPU does). Where the card has neither the precision nor its stand-in it
raises :class:`NotCovered` and :func:`dippm_nas.predict_graph` falls back to the analytical model, saying
so. Latency is learned on every device of the card; energy and memory only on the devices where the
harness measured them, and only where the training configuration applies their correction (the card's
``target_devices``). Elsewhere energy is the analytical power times the learned time and memory the
analytical liveness model, and the cost-model label says which.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path

import numpy as np
import torch

from dippm_nas.cost.analytical import HALF_PRECISIONS, AnalyticalCostModel, host_bound_notes, version_numbers
from dippm_nas.cost.base import Estimate, NotCovered
from dippm_nas.cost.coverage import WEIGHTS, _trained_on, no_weights, not_covered, read_as, weights_available
from dippm_nas.cost.error_table import ErrorFigure, lookup
from dippm_nas.cost.features import adjacency, dense_node_features, node_feature_matrix, one_hot_columns, one_hot_width
from dippm_nas.cost.host import DEFAULT_HOST, HostProfile, check_mode, get_host_profile
from dippm_nas.cost.learned_inputs import RecordInputs, record_inputs
from dippm_nas.cost.pmgns import LAYER_NORM_EPS, PMGNS, TARGETS, bounded, log_latency
from dippm_nas.cost.scaling import Scaling
from dippm_nas.cost.table import NodeTable, node_table
from dippm_nas.graph.model_graph import ModelGraph
from dippm_nas.hardware.registry import Device, get_device


@dataclass(frozen=True)
class Card:
    """The model card of trained weights: what they were trained on and how to scale their inputs.

    ``devices``, ``precisions`` and ``families`` bound what the model answers for and what it has seen;
    ``raw`` is the card's JSON as written.
    """

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

    def runtime(self, gpu: str) -> str:
        """The PyTorch a prediction on ``gpu`` is for: the newest among its records, and for a GPU the
        records never measured, the newest among all of them."""
        return self.torch_versions.get(gpu) or max(self.torch_versions.values(), key=version_numbers)


@cache
def load(path: Path = WEIGHTS / "pmgns") -> tuple[tuple[PMGNS, ...], Card]:
    """The ensemble's networks and the card."""
    card = load_card(path)
    members = torch.nn.ModuleList([PMGNS(card.raw["node_dim"], len(card.static_features), conv=card.config["conv"],
                                         hidden=card.config["hidden"]) for _ in range(card.raw["members"])])
    members.load_state_dict(load_weights(path))
    members.eval()
    return tuple(members), card


def forget_loaded() -> None:
    """Drop every weight file and card read so far: the next prediction reads them again (after a
    training run rewrote them in place)."""
    for cached in (load, load_card, load_weights, _fused, _trained_on):
        cached.cache_clear()


@cache
def load_weights(path: Path = WEIGHTS / "pmgns") -> dict[str, torch.Tensor]:
    """The ensemble's weights as saved, keys ``<member>.<parameter>``."""
    from safetensors.torch import load_file

    return load_file(str(path.with_suffix(".safetensors")))


@cache
def load_card(path: Path = WEIGHTS / "pmgns") -> Card:
    """The model card: what the weights were trained on, how their inputs are scaled, their test error."""
    raw = json.loads(path.with_suffix(".json").read_text())
    return Card(raw["config"], raw["static_features"], Scaling.from_json(raw["static_scaling"]),
                Scaling.from_json(raw["node_scaling"]), tuple(raw["devices"]),
                tuple(raw["precisions"]), frozenset(raw["families"]),
                {t: tuple(d) for t, d in raw["target_devices"].items()}, raw["torch_versions"], raw,
                tuple((b, c) for b, c in raw.get("batches", ())), raw.get("test_latency", {}).get("mape"),
                raw.get("held_out_family_latency", {}).get("mape"))


available = weights_available


@contextmanager
def one_thread() -> Iterator[None]:
    """Run the block on one torch thread, restoring the count after.

    One prediction is a few hundred rows: torch's intra-op threads only wait on each other, and on a
    busy machine (parallel NAS workers) they make it many times slower.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@dataclass(frozen=True)
class FusedSage:
    """An ensemble of GraphSAGE networks rearranged for one prediction, its members side by side; the
    output is the plain networks' up to rounding (``tests/training``).

    The first convolution is folded into the node features' standardisation: most node-feature
    columns are one-hot (kind, category), and standardised and clipped such a column takes one of
    two values, so its part of ``features @ W.T`` is a row of ``W`` looked up, not multiplied. Every
    convolution projects by its two linear maps at once (by linearity the mean over producers commutes
    with the projection, so one product and one sparse mean replace SAGEConv's two products), every
    member's in one batched product and their means in one sparse product over the shared adjacency,
    and the heads run as batched products too: without torch-geometric's message-passing dispatch,
    which takes longer than the arithmetic, and with one operator per step for the whole ensemble."""

    # [members * 2 * hidden]: the first projections of an operator with every one-hot column off
    base: torch.Tensor
    switch: torch.Tensor  # [one-hot columns, members * 2 * hidden]: what turning each one on adds
    dense_weight: torch.Tensor  # [dense columns, members * 2 * hidden]
    dense_scaling: Scaling
    later: tuple[torch.Tensor, ...]  # per convolution after the first: [members, hidden, 2 * hidden] (neighbour, own)
    biases: tuple[torch.Tensor, ...]  # per convolution, the first included: [members, hidden]
    norms: tuple[tuple[torch.Tensor, torch.Tensor, float], ...]  # per convolution: weight, bias [members, hidden], eps
    # per linear layer of the heads: [members, in, out], [members, 1, out]
    heads: tuple[tuple[torch.Tensor, torch.Tensor], ...]

    @classmethod
    def of(cls, models: tuple[PMGNS, ...], card: Card) -> FusedSage:
        """The trained GraphSAGE ``models`` rearranged, ``card``'s node scaling folded into their first convolution."""
        return cls.from_state(torch.nn.ModuleList(models).state_dict(), card)

    @classmethod
    def from_state(cls, state: dict[str, torch.Tensor], card: Card) -> FusedSage:
        """The same from the ensemble's weights as saved (keys ``<member>.<parameter>``): a prediction
        needs no network object, so torch-geometric is never imported."""
        members = range(len({key.split(".")[0] for key in state}))
        layers = range(len({key.split(".")[2] for key in state if key.startswith("0.convs.")}))
        linears = sorted({int(key.split(".")[2]) for key in state if key.startswith("0.head.")})

        def both(m: int, i: int) -> torch.Tensor:  # [in, 2 * hidden]: the neighbour map's columns, then the own map's
            return torch.cat([state[f"{m}.convs.{i}.lin_l.weight"], state[f"{m}.convs.{i}.lin_r.weight"]]).T

        def stacked(name: str) -> torch.Tensor:
            return torch.stack([state[f"{m}.{name}"] for m in members])

        first = torch.cat([both(m, 0) for m in members], dim=1)
        k = one_hot_width()
        one_hot = card.node_scaling.columns(slice(None, k))
        off, on = one_hot(torch.zeros(k)), one_hot(torch.ones(k))
        return cls(
            base=off @ first[:k], switch=(on - off)[:, None] * first[:k], dense_weight=first[k:].contiguous(),
            dense_scaling=card.node_scaling.columns(slice(k, None)),
            later=tuple(torch.stack([both(m, i) for m in members]) for i in layers[1:]),
            biases=tuple(stacked(f"convs.{i}.lin_l.bias") for i in layers),
            norms=tuple((stacked(f"norms.{i}.weight"), stacked(f"norms.{i}.bias"), LAYER_NORM_EPS) for i in layers),
            heads=tuple((torch.stack([state[f"{m}.head.{j}.weight"].T for m in members]),
                         torch.stack([state[f"{m}.head.{j}.bias"][None] for m in members])) for j in linears))

    def __call__(self, table: NodeTable, adjacency: torch.Tensor) -> torch.Tensor:
        """Every operator's output of the last convolution block, per member: ``[operators, members, hidden]``."""
        members, hidden = self.biases[0].shape
        dense = self.dense_scaling(torch.from_numpy(dense_node_features(table)))
        kind, category = (torch.from_numpy(columns) for columns in one_hot_columns(table))
        projected = (self.base + self.switch.index_select(0, kind) + self.switch.index_select(0, category)
                     + dense @ self.dense_weight)
        h = self._block(projected.view(len(dense), members, 2 * hidden), adjacency, 0)
        for i, weight in enumerate(self.later, start=1):
            h = self._block(torch.bmm(h.transpose(0, 1), weight).transpose(0, 1), adjacency, i)
        return h

    def _block(self, projected: torch.Tensor, adjacency: torch.Tensor, i: int) -> torch.Tensor:
        """Convolution block ``i`` from its inputs projected by both linear maps, ``[n, members, 2 * hidden]``."""
        n, members, width = projected.shape
        neighbours, own = projected.split(width // 2, dim=2)
        # the mean over producers: the sparse product torch-geometric's spmm runs for a CSR matrix on the CPU
        mean = torch.sparse.mm(adjacency, neighbours.reshape(n, -1), "mean").view(n, members, -1)
        weight, bias, eps = self.norms[i]
        normed = torch.nn.functional.layer_norm(mean + self.biases[i] + own, (width // 2,), eps=eps)
        return torch.relu(normed * weight + bias)

    def correction(self, h: torch.Tensor, time_share: torch.Tensor, static: torch.Tensor) -> torch.Tensor:
        """Each member's log-ratios, ``[members, targets]``, from :meth:`__call__`'s output, the operators'
        time shares ``[1, operators]`` and the scaled static features ``[1, features]``: the read-out of
        :meth:`PMGNS.readout` (mean, max, time-weighted mean) and the heads."""
        n, members, hidden = h.shape
        weighted = (time_share @ h.reshape(n, -1)).view(members, hidden)
        x = torch.cat([h.mean(0), h.amax(0), weighted, static.expand(members, -1)], dim=1)[:, None]
        for j, (weight, bias) in enumerate(self.heads):
            x = torch.baddbmm(bias, x, weight)
            if j < len(self.heads) - 1:
                x = torch.relu(x)
        return bounded(x[:, 0])


@cache
def _fused(path: Path) -> FusedSage:
    """The GraphSAGE ensemble at ``path`` fused for prediction, built once."""
    return FusedSage.from_state(load_weights(path), load_card(path))


class PMGNSCostModel:
    """The learned cost model: the analytical estimate corrected by the trained PMGNS weights at ``path``.

    It answers only for the devices and precisions of the weights' card, and raises
    :class:`~dippm_nas.cost.base.NotCovered` elsewhere or when there are no weights; the weights load on
    first use and are shared by every instance.

    >>> import dippm_nas
    >>> graph = dippm_nas.build_graph("resnet18", batch=8)
    >>> estimate = PMGNSCostModel().estimate(graph, dippm_nas.get_device("rtx4090"), "fp16")
    >>> estimate.cost_model.startswith("pmgns"), estimate.latency_ms > 0
    (True, True)
    """

    name = "pmgns"

    def __init__(self, path: Path = WEIGHTS / "pmgns"):
        self.path = path
        self.analytical = AnalyticalCostModel()

    def _require_weights(self) -> None:
        """Raise NotCovered where there are no weights (a stat per call: each property checks once)."""
        if not available(self.path):
            raise NotCovered(no_weights(self.path))

    @cached_property
    def card(self) -> Card:
        """The weights' model card; raises NotCovered when there are no weights."""
        self._require_weights()
        return load_card(self.path)

    @cached_property
    def models(self) -> tuple[PMGNS, ...]:
        """The ensemble's networks; raises NotCovered when there are no weights."""
        self._require_weights()
        return load(self.path)[0]

    @cached_property
    def fused(self) -> FusedSage | None:
        """The ensemble fused for fast prediction when it is GraphSAGE, else None (the plain networks run);
        built once per weights file, whatever instance asks (``get_cost_model`` makes one per request)."""
        return _fused(self.path) if self.card.config["conv"] == "sage" else None

    def covers(self, device: Device, precision: str) -> str | None:
        """None when covered, else why not (:func:`dippm_nas.cost.coverage.not_covered`, from the card alone)."""
        return not_covered(precision, self.path)

    def estimate(self, graph: ModelGraph, device: Device, precision: str = "fp32", layout: str = "nchw", *,
                 mode: str = "eager", host: str | HostProfile | None = None) -> Estimate:
        """Latency, energy and memory of one inference of ``graph`` at its batch, under the newest PyTorch
        the card has records of on ``device``.

        On a MIG slice, the network reads the whole GPU's request, and its correction applies to the
        slice's roofline. So does a precision without records of its own, read as its stand-in, and another
        execution ``mode`` or ``host``: the network reads the request as its records were measured (eager,
        on the default host) and its correction of the GPU's time applies to the requested execution's
        queue (under CUDA graphs, no host term at all). A GPU the card's records never measured is read
        through its spec sheet at the newest PyTorch of the card. Raises NotCovered for a precision the card
        cannot read, or a graph without operators; the notes say how far the request is from the training
        data, and ``error`` how far off PMGNS was on comparable held-out records.
        """
        reason = self.covers(device, precision)
        if reason:
            raise NotCovered(reason)
        if not graph.nodes:  # its latency and energy are 0: no ratio of them to learn
            raise NotCovered(f"{graph.name or 'the model'} runs no operators")
        gpu = get_device(device.key.split(":")[0]) if device.slice_of else device
        read_precision = read_as(precision, self.card.precisions)
        table = node_table(graph)  # its per-sample columns are the batch-1 graph's
        request = {"batch": graph.batch, "device": gpu.key, "precision": read_precision, "layout": layout,
                   "torch": self.card.runtime(gpu.key)}
        inputs = record_inputs(table, request, self.analytical)
        with torch.inference_mode(), one_thread():
            out = self._correction(graph, inputs)  # [members, targets]
            execution = {"mode": check_mode(mode), "host": host}
            if (device.slice_of or read_precision != precision or mode != "eager"
                    or get_host_profile(host).name != DEFAULT_HOST):
                # the correction of the request as measured, on the request's own roofline and queue
                inputs = record_inputs(table, request | {"device": device.key, "precision": precision} | execution,
                                       self.analytical)
            curve = torch.from_numpy(inputs.latency_curve).float()[None].expand(len(out), -1)
            latency_ms = math.exp(float(log_latency(curve, out[:, 0]).mean()))  # the members' geometric mean
        analytical = inputs.estimate
        ratio = dict(zip(TARGETS, (math.exp(v) for v in out.mean(dim=0).tolist())))
        # The learned latency ratio scales the GPU time; the host's time to issue the operators stays.
        gpu_ms = analytical.latency_ms * (1 - inputs.features["host_wait_share"]) * ratio["latency_ms"]
        ratio["latency_ms"] = latency_ms / analytical.latency_ms
        learned = [t for t in TARGETS[1:] if gpu.key in self.card.target_devices.get(t, ())]
        # Where no energy was measured on this device, the analytical power over the learned time.
        energy = analytical.energy_j * ratio["energy_j" if "energy_j" in learned else "latency_ms"]
        memory = analytical.memory_mib * (ratio["memory_mb"] if "memory_mb" in learned else 1.0)
        seen_gpu = gpu.key in self.card.devices
        error = lookup("pmgns", device.key, precision, graph.batch,
                       family_in_training=graph.family in self.card.families, gpu_in_training=seen_gpu)
        read_notes = (f"MIG slice {device.slice_of}: no slice was measured; PMGNS's correction of the whole "
                      f"{gpu.key} is applied to the slice's roofline (its SMs and share of memory bandwidth)",
                      ) if device.slice_of else ()
        if not seen_gpu:
            read_notes += (f"no record of {gpu.key} was in PMGNS's training data: the network reads its spec sheet "
                           f"(peaks, bandwidth, SMs, L2, TDP) at PyTorch {request['torch']}; docs/transfer.md gives "
                           "its error on each GPU held out of training",)
        if read_precision != precision:
            read_notes += (f"no {precision} record was in PMGNS's training data: its correction of the request at "
                           f"{read_precision} is applied to the {precision} roofline",)
        return Estimate(
            latency_ms=latency_ms, energy_j=energy, memory_mib=memory,
            memory=analytical.memory, cost_model=_learned_label(learned),
            notes=coverage_notes(self.card, graph.family, graph.batch, error) + read_notes
            + host_bound_notes(max(0.0, 1 - gpu_ms / latency_ms), int((~table.is_view).sum()), host,
                               precision in HALF_PRECISIONS),
            error=error,
        )

    def _correction(self, graph: ModelGraph, inputs: RecordInputs) -> torch.Tensor:
        """Each member's log-ratios for one configuration of ``graph``, ``[members, targets]``; GraphSAGE
        networks come fused."""
        names = self.card.static_features  # through numpy: torch.tensor over a list of floats is slower
        raw = torch.from_numpy(np.fromiter(map(inputs.features.__getitem__, names), dtype=np.float32,
                                           count=len(names)))[None]
        static = self.card.static_scaling(raw)
        time_share = torch.from_numpy(inputs.time_share)[None]
        adj = adjacency(graph)
        if self.fused is not None:
            return self.fused.correction(self.fused(node_table(graph), adj), time_share, static)
        x = self.card.node_scaling(node_feature_matrix(node_table(graph)))
        one_graph = torch.zeros(len(x), dtype=torch.long), torch.zeros(1, dtype=torch.long)  # batch, graph_of
        return torch.cat([model(x, adj, *one_graph, static, time_share) for model in self.models])


def _learned_label(learned: list[str]) -> str:
    energy = "energy learned" if "energy_j" in learned else "energy = analytical power x learned time"
    memory = "memory learned" if "memory_mb" in learned else "memory analytical"
    return f"pmgns (latency learned; {energy}; {memory})"


#: A batch smaller (larger) than all but this share of the training records' is flagged as far from the data.
SPARSE_SHARE = 0.05


def coverage_notes(card: Card, family: str, batch: int, error: ErrorFigure | None = None) -> tuple[str, ...]:
    """How far a request is from what PMGNS learned from, and the error measured that far out: a user
    ranking candidates should know whether a figure is interpolated or extrapolated.

    ``error`` is the figure of comparable held-out records (:func:`~dippm_nas.cost.error_table.lookup`),
    which the prediction carries in a note of its own; without one, the family note cites the card's
    split-wide test MAPE instead."""
    seen = family in card.families
    split_error = card.seen_family_mape if seen else card.unseen_family_mape
    if error is not None:  # the comparable figure is its own note; the held-out families are timm's
        measured = "" if seen else " (a model unlike timm's families may be further off than its latency error says)"
    elif split_error is not None:
        measured = f" (test MAPE {split_error:.1%} on {'families it saw' if seen else 'whole timm families held out'})"
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
            notes.append(f"batch {batch}: {above:.0%} of its training records have a larger batch ({span}); "
                         "its correction of the GPU's time has seen few batches this small")
        elif below > 1 - SPARSE_SHARE:
            notes.append(f"batch {batch}: {below:.0%} of its training records have a smaller batch ({span}); "
                         "the learned correction is extrapolating")
    return tuple(notes)

