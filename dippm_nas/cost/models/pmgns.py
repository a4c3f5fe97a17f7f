"""PMGNS, DIPPM's graph network, as a correction of a base cost model's whole-graph estimate: the ``pmgns`` cost
model corrects the analytical model; the residual (:mod:`dippm_nas.cost.models.residual`) the operator model.

A network is an ensemble of one or more PMGNS networks trained from different seeds (the shipped ones have
one); a prediction is the geometric mean of theirs. It answers for every GPU of the registry: the network reads a
GPU through its spec sheet, so a GPU its records never measured, or one added to the registry as a CSV row, is
predicted without retraining, and its notes say so and cite the error measured on GPUs held out of training. A
precision without records is read as its stand-in (the precision table's, :mod:`dippm_nas.precisions`; a model
of half weights read as fp16 is read with float32 weights under autocast, as those records ran), and a MIG slice
as its whole GPU (no slice was measured): the correction the network gives what it read applies to the request's
own base timing (a 7g slice, which has every SM, predicts as its GPU does). So does another execution mode or
host: the network reads the request as its records were measured (eager, on the default host) and its correction
of the GPU's time applies to the requested execution's queue. Where the card has neither the precision nor its
stand-in, or its weights were trained on other inputs than this version computes (:mod:`dippm_nas.cost.learned.card`
and :func:`reference_mismatch`), it declines (:class:`~dippm_nas.cost.estimate.NotCovered`).
Latency is learned on every device of the card; energy and memory only on the devices where the harness measured
them, and only where the training configuration applies their correction (the card's ``target_devices``).
Elsewhere energy is the base's power times the learned time and memory the base's, and the label says which.
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from dippm_nas.cost.error_table import ErrorFigure, lookup
from dippm_nas.cost.estimate import Estimate, NotCovered, OneAtATime
from dippm_nas.cost.learned.card import (
    PMGNS_WEIGHTS,
    RETRAIN,
    WEIGHTS,
    Card,
    load_card,
    no_weights,
    not_covered,
    read_as,
)
from dippm_nas.cost.learned.features import adjacency, node_feature_matrix, node_feature_names
from dippm_nas.cost.learned.network_inputs import NetworkInputs, network_inputs
from dippm_nas.cost.learned.pmgns_network import MAX_LOG_RATIO, TARGETS
from dippm_nas.cost.models.analytical import AnalyticalCostModel
from dippm_nas.cost.pipeline.notes import host_bound_notes
from dippm_nas.cost.pipeline.summary import Timed, summarize
from dippm_nas.cost.pipeline.table import NodeTable, node_table
from dippm_nas.graph import operators
from dippm_nas.graph.cast import cast_floats
from dippm_nas.graph.model_graph import ModelGraph
from dippm_nas.hosts import DEFAULT_HOST, get_host_profile
from dippm_nas.precisions import FULL_DTYPE, PRECISIONS, Precision
from dippm_nas.request import Request, torch_major_minor

if TYPE_CHECKING:
    import torch

    from dippm_nas.cost.learned.pmgns_network import PMGNS

#: The host every record was measured on: a network reads a request as measured there.
RECORDS_HOST = get_host_profile(DEFAULT_HOST)


class BaseModel(Protocol):
    """A cost model a graph network corrects: its timing of a graph's operators, reused where it can be."""

    name: str

    def timed(self, table: NodeTable, request: Request, reuse: Timed | None = None) -> Timed:
        """Every operator's GPU seconds and the host's, as the base model times them."""
        ...


@dataclass(frozen=True)
class Corrected:
    """A graph network's answer: the corrected estimate, the base's latency (ms) it corrected, and the factor on
    the base's GPU time (the host's stays)."""

    estimate: Estimate
    base_ms: float
    gpu_ratio: float


@cache
def load(path: Path) -> tuple[PMGNS, ...]:
    """The ensemble's networks at ``path``, read once."""
    import torch
    from safetensors.torch import load_file

    from dippm_nas.cost.learned.pmgns_network import PMGNS

    card = load_card(path)
    members = torch.nn.ModuleList([PMGNS(card.raw["node_dim"], len(card.static_features), conv=card.config["conv"],
                                         hidden=card.config["hidden"], bound=float(card.config.get("bound",
                                                                                                   MAX_LOG_RATIO)))
                                   for _ in range(card.raw["members"])])
    members.load_state_dict(load_file(str(path.with_suffix(".safetensors"))))
    members.eval()
    return tuple(members)


class GraphCorrection:
    """The network at ``path`` correcting the estimates of ``base``; ``name`` is the cost model it answers as."""

    def __init__(self, name: str, path: Path, base: BaseModel):
        self.name, self.path, self.base = name, path, base

    @property
    def card(self) -> Card:
        """The weights' card; raises NotCovered where there are no weights."""
        card = load_card(self.path)
        if card is None:
            raise NotCovered(no_weights(self.path))
        return card

    def covers(self, request: Request) -> str | None:
        """None where it answers ``request``, else why not: the card's precisions and vocabulary, then its
        reference inputs, checked once; a compiled model it was never shown (its records are eager runs)."""
        if request.compiled:
            return ("PMGNS corrects eager and CUDA-graph timings and learned from no compiled run: for mode "
                    f"{request.mode} choose the operator model (the default) or the analytical one")
        return not_covered(request.precision.name, self.path) or _inputs_mismatch(self.path, operators.fingerprint())

    def correct(self, graph: ModelGraph, request: Request, reuse: Timed | None = None) -> Corrected:
        """The base's estimate of ``graph`` on ``request``, corrected; ``reuse``: the base's timing of the same graph,
        GPU and precision, whose network output (the operator model's) it reads again. Raises NotCovered for a
        request it cannot read or a graph without operators."""
        reason = self.covers(request)
        if reason:
            raise NotCovered(reason)
        if not graph.nodes:  # its latency and energy are 0: no ratio of them to learn
            raise NotCovered(f"{graph.name or 'the model'} runs no operators")
        card, precision = self.card, request.precision
        gpu = request.gpu.whole_gpu()
        read = PRECISIONS[read_as(precision.name, card.precisions)]
        read_graph = _as_read(graph, precision, read)
        # the Device itself, not its key: a user's Device whose values differ from its key's row is read as given
        as_measured = replace(request, gpu=gpu, precision=read, mode="eager", host=RECORDS_HOST,
                              runtime=torch_major_minor(card.runtime(gpu.key)), calibration=None)
        same = read_graph is graph and gpu is request.gpu and read is precision
        inputs = self._inputs(read_graph, as_measured, reuse if same else None)
        out = self._correction(read_graph, inputs)  # [members, targets]
        if not (same and request.mode == "eager" and request.host.name == DEFAULT_HOST):
            # the correction of the request as measured, on the request's own base timing and queue
            inputs = self._inputs(graph, replace(as_measured, gpu=request.gpu, precision=precision,
                                                 mode=request.mode, host=request.host), reuse)
        latency_ms = _latency_ms(inputs.latency_curve, out[:, 0])
        base = inputs.estimate
        ratio = dict(zip(TARGETS, (math.exp(v) for v in out.mean(dim=0).tolist())))
        # The learned latency ratio scales the GPU time; the host's time to issue the operators stays.
        gpu_ratio = ratio["latency_ms"]
        gpu_ms = base.latency_ms * (1 - inputs.features["host_wait_share"]) * gpu_ratio
        ratio["latency_ms"] = latency_ms / base.latency_ms
        learned = [t for t in TARGETS[1:] if gpu.key in card.target_devices.get(t, ())]
        # Where no energy was measured on this device, the base's power over the learned time.
        energy = base.energy_j * ratio["energy_j" if "energy_j" in learned else "latency_ms"]
        memory = base.memory_mib * (ratio["memory_mb"] if "memory_mb" in learned else 1.0)
        seen_gpu = gpu.key in card.devices
        error = lookup(self.name, request.gpu, precision, graph.batch,
                       family_in_training=graph.family in card.families, gpu_in_training=seen_gpu)
        notes = (f"MIG slice {request.gpu.slice_of}: no slice was measured; PMGNS's correction of the whole "
                 f"{gpu.key} is applied to the slice's roofline (its SMs and share of memory bandwidth)",
                 ) if request.gpu.slice_of else ()
        if not seen_gpu:
            notes += (f"no record of {gpu.key} was in PMGNS's training data: the network reads its spec sheet "
                      f"(peaks, bandwidth, SMs, L2, TDP) at PyTorch {card.runtime(gpu.key)}; docs/transfer.md gives "
                      "its error on each GPU held out of training",)
        if read is not precision:
            notes += (f"no {precision.name} record was in PMGNS's training data: its correction of the request at "
                      f"{read.name} is applied to the {precision.name} roofline",)
        table = node_table(graph)
        estimate = Estimate(
            latency_ms=latency_ms, energy_j=energy, memory_mib=memory, memory=base.memory,
            cost_model=f"{self.name} ({_learned_label(learned)})", answered_by=self.name,
            operators=base.operators.scaled(gpu_ratio),
            notes=coverage_notes(card, graph.family, graph.batch, error) + notes
            + host_bound_notes(max(0.0, 1 - gpu_ms / latency_ms), int((~table.is_view).sum()), request.host,
                               precision.autocast),
            error=error, host_share=base.host_share * base.latency_ms / latency_ms)  # the host's time is the base's
        return Corrected(estimate, base.latency_ms, gpu_ratio)

    def _inputs(self, graph: ModelGraph, request: Request, reuse: Timed | None) -> NetworkInputs:
        """What the network reads of ``graph`` on ``request``, through the base's timing (``reuse`` itself where it
        is the timing the request would give)."""
        table = node_table(graph)
        timed = reuse if reuse is not None and reuse.prices(table, request) else self.base.timed(table, request, reuse)
        return network_inputs(timed, summarize(graph, timed, request, self.base.name), request)

    def _correction(self, graph: ModelGraph, inputs: NetworkInputs) -> torch.Tensor:
        """Each member's log-ratios for one configuration of ``graph``, ``[members, targets]``."""
        import torch

        from dippm_nas.cost.learned.threads import one_thread

        card, table = self.card, node_table(graph)
        names = card.static_features  # through numpy: torch.tensor over a list of floats is slower
        raw = torch.from_numpy(np.fromiter(map(inputs.features.__getitem__, names), dtype=np.float32,
                                           count=len(names)))[None]
        with torch.inference_mode(), one_thread():
            static = card.static_scaling(raw)
            x = table.derived(("node features", self.path), lambda: card.node_scaling(node_feature_matrix(table)))
            adj = table.derived("adjacency", lambda: adjacency(graph))
            one_graph = torch.zeros(len(x), dtype=torch.long), torch.zeros(1, dtype=torch.long)  # batch, graph_of
            time_share = torch.from_numpy(inputs.time_share)[None]
            return torch.cat([model(x, adj, *one_graph, static, time_share) for model in load(self.path)])


def _latency_ms(curve: np.ndarray, log_ratios: torch.Tensor) -> float:
    """The members' geometric mean of the latency (ms) their GPU-time corrections give on the base's ``curve``."""
    import torch

    from dippm_nas.cost.learned.pmgns_network import log_latency

    curves = torch.from_numpy(curve).float()[None].expand(len(log_ratios), -1)
    return math.exp(float(log_latency(curves, log_ratios).mean()))


class PMGNSCostModel(OneAtATime):
    """DIPPM's learned cost model: the analytical estimate corrected by the trained PMGNS weights at ``path``.

    >>> import dippm_nas
    >>> graph, request, _ = dippm_nas.Request.of("rtx4090", "fp16").resolved(dippm_nas.build_graph("resnet18", batch=8))
    >>> estimate = PMGNSCostModel().estimate(graph, request)
    >>> estimate.cost_model.startswith("pmgns"), estimate.latency_ms > 0
    (True, True)
    """

    name = "pmgns"

    def __init__(self, path: Path = PMGNS_WEIGHTS):
        self.correction = GraphCorrection(self.name, path, AnalyticalCostModel())

    def covers(self, request: Request) -> str | None:
        """Why the weights cannot answer ``request``, or None."""
        return self.correction.covers(request)

    def estimate(self, graph: ModelGraph, request: Request) -> Estimate:
        """Latency, energy and memory of one inference of ``graph`` at its batch, under the newest PyTorch the card
        has records of on the GPU; each operator's time is the roofline's, scaled as the network scales the GPU's."""
        return self.correction.correct(graph, request).estimate


def _as_read(graph: ModelGraph, precision: Precision, read: Precision) -> ModelGraph:
    """The graph the network reads a request at ``precision`` as, at ``read``: a model of half weights read as
    autocast's records ran theirs, with float32 weights; any other as it is."""
    weights = precision.weights_dtype
    if weights is None or read.weights_dtype is not None:
        return graph
    return cast_floats(graph, weights, FULL_DTYPE)


def _learned_label(learned: list[str]) -> str:
    energy = "energy learned" if "energy_j" in learned else "energy = analytical power x learned time"
    memory = "memory learned" if "memory_mb" in learned else "memory analytical"
    return f"latency learned; {energy}; {memory}"


#: A batch smaller (larger) than all but this share of the training records' is flagged as far from the data.
SPARSE_SHARE = 0.05


def coverage_notes(card: Card, family: str, batch: int, error: ErrorFigure | None = None) -> tuple[str, ...]:
    """How far a request is from what the network learned from, and the error measured that far out: a user
    ranking candidates should know whether a figure is interpolated or extrapolated.

    ``error`` is the figure of comparable held-out records (:func:`~dippm_nas.cost.error_table.lookup`), which
    the prediction carries in a note of its own; without one, the family note cites the card's split-wide test
    MAPE instead."""
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


# ---- the contract of the inputs ---------------------------------------------------------------------------------

#: The graphs the card's input reference is computed on, serialized (no TVM needed to read them), and the models
#: they are built from, each at batch 1 (``dippm-nas train --reference-graphs`` writes them).
REFERENCE_GRAPHS = WEIGHTS / "reference_graphs.json"
REFERENCE_MODELS = ("resnet18", "mobilenetv3_small_100", "deit_tiny_patch16_224")
#: The requests each reference graph is read at: a convolution-friendly fp32 one and an autocast one, eager.
REFERENCE_REQUESTS = (
    {"device": "a100-40gb", "precision": "fp32", "batch": 8, "layout": "nchw", "torch": "2.11.0"},
    {"device": "h100-sxm", "precision": "fp16", "batch": 64, "layout": "nchw", "torch": "2.11.0"},
)
#: Relative difference under which a reference input counts as the same (rounding across platforms).
REFERENCE_RTOL = 1e-6


def contract(with_reference_inputs: bool = True) -> dict:
    """This version's side of the contract, as a graph network's card records it: the vocabulary's fingerprint,
    the node feature names and the reference inputs (:func:`reference_inputs`)."""
    terms: dict = {"vocabulary": operators.fingerprint(), "node_features": node_feature_names()}
    if with_reference_inputs:
        terms["reference_inputs"] = reference_inputs()
    return terms


@cache
def _reference_graphs(path: Path = REFERENCE_GRAPHS) -> tuple[ModelGraph, ...]:
    from dippm_nas.graph.serialize import graph_from_bytes

    stored = json.loads(path.read_text())
    return tuple(graph_from_bytes(base64.b64decode(blob)) for blob in stored.values())


def reference_inputs(graphs: tuple[ModelGraph, ...] | None = None) -> dict:
    """What a graph network reads of each reference graph at each of :data:`REFERENCE_REQUESTS`, through the
    analytical model, by name: its static features, latency curve, operators' time shares and node features'
    column sums."""
    from dippm_nas.graph.batching import scale_batch
    from dippm_nas.hardware.registry import get_device

    analytical = AnalyticalCostModel()
    values: dict[str, list[float]] = {}
    for graph in graphs if graphs is not None else _reference_graphs():
        for asked in REFERENCE_REQUESTS:
            scaled = scale_batch(graph, asked["batch"])
            table = node_table(scaled)
            request = Request(get_device(asked["device"]), PRECISIONS[asked["precision"]], asked["layout"],
                              runtime=torch_major_minor(asked["torch"]))
            timed = analytical.timed(table, request)
            inputs = network_inputs(timed, summarize(scaled, timed, request, analytical.name), request)
            name = f"{graph.name}@{asked['device']}:{asked['precision']}:b{asked['batch']}"
            values[f"{name}:static"] = [inputs.features[k] for k in sorted(inputs.features)]
            values[f"{name}:latency_curve"] = inputs.latency_curve.tolist()
            values[f"{name}:time_share"] = inputs.time_share.astype(float).tolist()
            values[f"{name}:node_features"] = node_feature_matrix(table).double().sum(dim=0).tolist()
    return values


def reference_mismatch(card: Card) -> str | None:
    """Why the weights whose card is ``card`` were trained on other inputs than this version computes, or None: the
    first reference input that moved by more than :data:`REFERENCE_RTOL`."""
    recorded = card.raw.get("contract", {}).get("reference_inputs")
    if recorded is None:
        return ("PMGNS's card records no reference inputs, so its weights cannot be checked against this version: "
                + RETRAIN)
    current = reference_inputs()
    for name in sorted(set(recorded) | set(current)):
        before, now = recorded.get(name), current.get(name)
        if before is None or now is None or len(before) != len(now) or not np.allclose(
                now, before, rtol=REFERENCE_RTOL, atol=REFERENCE_RTOL):
            return (f"the inputs PMGNS was trained on have changed in this version ({name} differs on its reference "
                    f"graphs: the analytical model or the graph's columns moved), so its correction no longer "
                    f"applies: {RETRAIN}")
    return None


@cache
def _inputs_mismatch(path: Path, vocabulary: str) -> str | None:
    """:func:`reference_mismatch` of the weights at ``path``, checked once per weights file and vocabulary."""
    card = load_card(path)
    return reference_mismatch(card) if card is not None else None
