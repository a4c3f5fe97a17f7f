"""PMGNS at prediction time: shipped weights (safetensors) and their model card (JSON).

A model is an ensemble of one or more PMGNS networks trained from different seeds (the shipped one has
one); a prediction is the geometric mean of theirs. It answers for every GPU of the registry: the network
reads a GPU through its spec sheet, so a GPU its records never measured, or one added to the registry as a
CSV row, is predicted without retraining, and its notes say so and cite the error measured on GPUs held
out of training. A precision without records is read as its stand-in (the precision table's,
:mod:`dippm_nas.precisions`; a model of half weights read as fp16 is read with float32 weights under autocast,
as those records ran), and a MIG slice as its whole GPU (no slice was measured): the correction
the network gives what it read applies to the request's own roofline (a 7g slice, which has every SM,
predicts as its GPU does). Where the card has neither the precision nor its stand-in, or its weights were
trained on other inputs than this version computes (:mod:`dippm_nas.cost.card`), it raises
:class:`NotCovered` and :func:`dippm_nas.predict_graph` falls back to the analytical model, saying so.
Latency is learned on every device of the card; energy and memory only on the devices where the
harness measured them, and only where the training configuration applies their correction (the card's
``target_devices``). Elsewhere energy is the analytical power times the learned time and memory the
analytical liveness model, and the cost-model label says which.
"""

from __future__ import annotations

import math
from functools import cache, cached_property
from pathlib import Path

import numpy as np
import torch

from dippm_nas.cost.analytical import AnalyticalCostModel, host_bound_notes
from dippm_nas.cost.base import Estimate, NotCovered
from dippm_nas.cost.card import WEIGHTS, Card, load_card, reference_mismatch
from dippm_nas.cost.coverage import no_weights, not_covered, raw_card, read_as, weights_available
from dippm_nas.cost.error_table import ErrorFigure, lookup
from dippm_nas.cost.features import adjacency, dense_node_features, node_feature_matrix, one_hot_columns, one_hot_width
from dippm_nas.cost.host import DEFAULT_HOST, HOST_PROFILES, HostProfile, get_host_profile
from dippm_nas.cost.learned_inputs import RecordInputs, Timing, record_inputs
from dippm_nas.cost.pmgns import FUSED_PREFIX, MAX_LOG_RATIO, PMGNS, TARGETS, FusedSage, log_latency
from dippm_nas.cost.table import node_table
from dippm_nas.cost.threads import one_thread
from dippm_nas.graph import operators
from dippm_nas.graph.cast import cast_floats, graph_at_precision
from dippm_nas.graph.model_graph import ModelGraph
from dippm_nas.hardware.registry import DEFAULT_LAYOUT, Device
from dippm_nas.modes import DEFAULT_MODE, check_mode
from dippm_nas.precisions import DEFAULT_PRECISION, FULL_DTYPE, PRECISIONS, Precision, PrecisionLike, precision_named


@cache
def load(path: Path = WEIGHTS / "pmgns") -> tuple[tuple[PMGNS, ...], Card]:
    """The ensemble's networks and the card."""
    card = load_card(path)
    members = torch.nn.ModuleList([PMGNS(card.raw["node_dim"], len(card.static_features), conv=card.config["conv"],
                                         hidden=card.config["hidden"], bound=_bound(card))
                                   for _ in range(card.raw["members"])])
    members.load_state_dict(load_weights(path))
    members.eval()
    return tuple(members), card


def forget_loaded() -> None:
    """Drop every weight file and card read so far: the next prediction reads them again (after a
    training run rewrote them in place)."""
    for cached in (load, load_card, load_weights, _fused, raw_card, _inputs_mismatch):
        cached.cache_clear()


@cache
def load_weights(path: Path = WEIGHTS / "pmgns") -> dict[str, torch.Tensor]:
    """The ensemble's members' weights as saved, keys ``<member>.<parameter>`` (the fused layout left out)."""
    from safetensors.torch import load_file

    return {k: v for k, v in load_file(str(path.with_suffix(".safetensors"))).items() if not k.startswith(FUSED_PREFIX)}


available = weights_available


@cache
def _fused(path: Path) -> FusedSage | None:
    """The ensemble at ``path`` as fused for prediction when its weights file holds the fused layout (a
    GraphSAGE ensemble, as :func:`~dippm_nas.training.ship.save` writes it), else None; read once."""
    from safetensors.torch import load_file

    stored = {k.removeprefix(FUSED_PREFIX): v for k, v in load_file(str(path.with_suffix(".safetensors"))).items()
              if k.startswith(FUSED_PREFIX)}
    if not stored:
        return None
    card = load_card(path)
    return FusedSage.from_state(stored, card.node_scaling.columns(slice(one_hot_width(), None)), _bound(card))


def _bound(card: Card) -> float:
    """The bound of the corrections the card's networks give (a card written before it had one: PMGNS's)."""
    return float(card.config.get("bound", MAX_LOG_RATIO))


@cache
def _inputs_mismatch(path: Path, vocabulary: str) -> str | None:
    """Why the weights at ``path`` were trained on other inputs than this version computes (the card's
    reference inputs, :func:`~dippm_nas.cost.card.reference_mismatch`), or None; checked once per weights
    file and vocabulary."""
    return reference_mismatch(raw_card(path), AnalyticalCostModel())


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
    #: How the estimate it corrects times each operator: None, the analytical roofline.
    timing: Timing | None = None

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
        """The ensemble fused for fast prediction where its weights file holds it (GraphSAGE), else None (the
        plain networks run); read once per weights file, whatever instance asks (``get_cost_model`` makes one
        per request)."""
        self._require_weights()
        return _fused(self.path)

    def covers(self, device: Device, precision: str) -> str | None:
        """None when covered, else why not: the card's precisions and vocabulary
        (:func:`dippm_nas.cost.coverage.not_covered`), then its reference inputs, checked once."""
        return not_covered(precision, self.path) or _inputs_mismatch(self.path, operators.fingerprint())

    def estimate(self, graph: ModelGraph, device: Device, precision: PrecisionLike = DEFAULT_PRECISION,
                 layout: str = DEFAULT_LAYOUT, *, mode: str = DEFAULT_MODE, host: str | HostProfile | None = None,
                 base: Estimate | None = None) -> Estimate:
        """Latency, energy and memory of one inference of ``graph`` at its batch, under the newest PyTorch
        the card has records of on ``device``. ``base``: the estimate of the same request by the model this one
        corrects, where the caller has it (``auto`` has the operator model's), so :meth:`finished` need not make
        it again.

        On a MIG slice, the network reads the whole GPU's request, and its correction applies to the
        slice's roofline. So does a precision without records of its own, read as its stand-in, and another
        execution ``mode`` or ``host``: the network reads the request as its records were measured (eager,
        on the default host) and its correction of the GPU's time applies to the requested execution's
        queue (under CUDA graphs, no host term at all). A GPU the card's records never measured is read
        through its spec sheet at the newest PyTorch of the card. Raises NotCovered for a precision the card
        cannot read, or a graph without operators; the notes say how far the request is from the training
        data, and ``error`` how far off PMGNS was on comparable held-out records.
        """
        numbers, host = precision_named(precision), get_host_profile(host)
        reason = self.covers(device, numbers.name)
        if reason:
            raise NotCovered(reason)
        if not graph.nodes:  # its latency and energy are 0: no ratio of them to learn
            raise NotCovered(f"{graph.name or 'the model'} runs no operators")
        gpu = device.whole_gpu()
        read = PRECISIONS[read_as(numbers.name, self.card.precisions)]
        graph = graph_at_precision(graph, numbers)[0]
        read_graph = _as_read(graph, numbers, read)
        table = node_table(graph)  # its per-sample columns are the batch-1 graph's
        # the Device itself, not its key: a user's Device whose values differ from its key's row is read as given
        request = {"batch": graph.batch, "device": gpu, "precision": read, "layout": layout,
                   "torch": self.card.runtime(gpu.key), "host": HOST_PROFILES[DEFAULT_HOST]}  # as the records ran
        inputs = record_inputs(node_table(read_graph), request, self.analytical, self.timing)
        with torch.inference_mode(), one_thread():
            out = self._correction(read_graph, inputs)  # [members, targets]
            execution = {"mode": check_mode(mode), "host": host}
            if device.slice_of or read is not numbers or mode != "eager" or host.name != DEFAULT_HOST:
                # the correction of the request as measured, on the request's own roofline and queue
                inputs = record_inputs(table, request | {"device": device, "precision": numbers} | execution,
                                       self.analytical, self.timing)
            curve = torch.from_numpy(inputs.latency_curve).float()[None].expand(len(out), -1)
            latency_ms = math.exp(float(log_latency(curve, out[:, 0]).mean()))  # the members' geometric mean
        analytical = inputs.estimate
        ratio = dict(zip(TARGETS, (math.exp(v) for v in out.mean(dim=0).tolist())))
        # The learned latency ratio scales the GPU time; the host's time to issue the operators stays.
        gpu_ratio = ratio["latency_ms"]
        gpu_ms = analytical.latency_ms * (1 - inputs.features["host_wait_share"]) * gpu_ratio
        ratio["latency_ms"] = latency_ms / analytical.latency_ms
        learned = [t for t in TARGETS[1:] if gpu.key in self.card.target_devices.get(t, ())]
        # Where no energy was measured on this device, the analytical power over the learned time.
        energy = analytical.energy_j * ratio["energy_j" if "energy_j" in learned else "latency_ms"]
        memory = analytical.memory_mib * (ratio["memory_mb"] if "memory_mb" in learned else 1.0)
        seen_gpu = gpu.key in self.card.devices
        error = lookup(self.name, device, numbers, graph.batch,
                       family_in_training=graph.family in self.card.families, gpu_in_training=seen_gpu)
        read_notes = (f"MIG slice {device.slice_of}: no slice was measured; PMGNS's correction of the whole "
                      f"{gpu.key} is applied to the slice's roofline (its SMs and share of memory bandwidth)",
                      ) if device.slice_of else ()
        if not seen_gpu:
            read_notes += (f"no record of {gpu.key} was in PMGNS's training data: the network reads its spec sheet "
                           f"(peaks, bandwidth, SMs, L2, TDP) at PyTorch {request['torch']}; docs/transfer.md gives "
                           "its error on each GPU held out of training",)
        if read is not numbers:
            read_notes += (f"no {numbers.name} record was in PMGNS's training data: its correction of the request at "
                           f"{read.name} is applied to the {numbers.name} roofline",)
        estimate = Estimate(
            latency_ms=latency_ms, energy_j=energy, memory_mib=memory,
            memory=analytical.memory, cost_model=f"{self.name} ({_learned_label(learned)})", answered_by=self.name,
            notes=coverage_notes(self.card, graph.family, graph.batch, error) + read_notes
            + host_bound_notes(max(0.0, 1 - gpu_ms / latency_ms), int((~table.is_view).sum()), host,
                               numbers.autocast),
            error=error,
        )
        return self.finished(estimate, analytical.latency_ms, gpu_ratio, graph, device, numbers, layout, execution,
                             base)

    def finished(self, estimate: Estimate, base_ms: float, gpu_ratio: float, graph: ModelGraph, device: Device,
                 precision: Precision, layout: str, execution: dict, base: Estimate | None = None) -> Estimate:
        """The estimate as answered, from the corrected one, the base's latency ``base_ms`` and the correction of
        the GPU's time ``gpu_ratio``: PMGNS's as it is (it corrects the total only, and times no operator)."""
        return estimate

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
            table = node_table(graph)
            one_hot = tuple(torch.from_numpy(columns) for columns in one_hot_columns(table))
            h = self.fused(one_hot, torch.from_numpy(dense_node_features(table)), adj)
            return self.fused.correction(h, time_share, static)
        x = self.card.node_scaling(node_feature_matrix(node_table(graph)))
        one_graph = torch.zeros(len(x), dtype=torch.long), torch.zeros(1, dtype=torch.long)  # batch, graph_of
        return torch.cat([model(x, adj, *one_graph, static, time_share) for model in self.models])


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

