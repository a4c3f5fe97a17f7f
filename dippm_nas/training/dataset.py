"""Records + graph store -> tensors for training: node features per graph; per record the static
features, the estimate the network corrects (the analytical model's, or for the residual the operator
model's), its operators' shares of that estimate's latency, and the targets as measured values (missing ones
are NaN)."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from dippm_nas.cache.store import GraphCache
from dippm_nas.cost.estimate import Estimate
from dippm_nas.cost.learned.features import edge_index, node_feature_matrix
from dippm_nas.cost.learned.network_inputs import network_inputs
from dippm_nas.cost.learned.pmgns_network import LATENCY_CURVE_LOG_RATIOS, TARGETS
from dippm_nas.cost.models.analytical import AnalyticalCostModel
from dippm_nas.cost.models.pmgns import BaseModel
from dippm_nas.cost.pipeline.summary import summarize
from dippm_nas.cost.pipeline.table import node_table
from dippm_nas.graph.batching import scale_batch
from dippm_nas.graph.model_graph import ModelGraph
from dippm_nas.training.featurize import store_key
from dippm_nas.training.paths import project
from dippm_nas.training.records import MEMORY_NVML_PROCESS, Record, measured_request


def graph_tensors(graph: ModelGraph) -> tuple[torch.Tensor, torch.Tensor]:
    """A graph as PMGNS reads it: node features ``[operators, features]`` and the ``[2, edges]`` index."""
    return node_feature_matrix(node_table(graph)), edge_index(graph)


@dataclass
class TrainingSet:
    """Everything training reads, one row per record (``graph_of`` names its graph, an index into ``x``
    and ``edges``); ``analytical`` and ``targets`` have a column per target in the order of ``TARGETS``.
    ``analytical`` is the estimate the network corrects: the analytical model's, or for the residual the
    operator model's (:func:`build_training_set`'s ``base_of``). ``missing`` names the graphs left out with
    their reason."""

    records: list[Record]
    graph_keys: list[str]
    x: list[torch.Tensor]
    edges: list[torch.Tensor]
    graph_of: np.ndarray
    static: np.ndarray
    static_names: list[str]
    analytical: np.ndarray
    targets: np.ndarray
    time_share: list[np.ndarray]  # per record: its operators' shares of the analytical latency
    latency_curve: np.ndarray  # per record: NetworkInputs.latency_curve
    missing: dict[str, str] = field(default_factory=dict)

    @property
    def families(self) -> np.ndarray:
        """Each record's model family, what the family split holds out."""
        return np.array([r.family for r in self.records])

    @property
    def devices(self) -> np.ndarray:
        """Each record's GPU (a device registry key), what a device split divides."""
        return np.array([r.device for r in self.records])


def comparable_memory(record: Record, estimate: Estimate) -> float:
    """The analytical memory that ``record``'s measured memory compares with: the whole footprint for
    NVML's per-process figure, the context plus peak reserved (no kernel modules) for the first
    protocol's rows, which left the modules out."""
    if record.memory_measure == MEMORY_NVML_PROCESS or estimate.memory is None:
        return estimate.memory_mib
    return estimate.memory.context_and_reserved_mib


def load_graphs(keys: set[str], store: Path | None = None) -> dict[str, ModelGraph]:
    """The stored graphs of ``keys`` (``source:model@size``) that the store (the project's, by default)
    has; a key it lacks is left out."""
    cache = GraphCache(store or project().graph_store)
    graphs = {}
    for key in sorted(keys):
        graph = cache.get(store_key(key))
        if graph is not None:
            graphs[key] = graph
    return graphs


def configurations(records: Sequence[Record], graphs: dict[str, ModelGraph]
                   ) -> Iterator[tuple[ModelGraph, list[int]]]:
    """Each (graph, batch) of ``records`` once, in order of graph and batch: the graph at that batch and the
    indices of the records measured on it. Records of other devices, precisions and runtimes share a (graph,
    batch), so its node table is built once. Every record's graph must be in ``graphs``."""
    by_config = sorted(range(len(records)), key=lambda i: (records[i].graph_key, records[i].batch))
    for (key, batch), group in itertools.groupby(by_config, key=lambda i: (records[i].graph_key, records[i].batch)):
        yield scale_batch(graphs[key], batch), list(group)


def build_training_set(records: list[Record], store: Path | None = None,
                       base_of: Callable[[Record], BaseModel] | None = None) -> TrainingSet:
    """The tensors of every record whose graph the store (the project's, by default) has; a record whose
    graph it lacks is left out and its graph listed in ``missing``. With ``base_of`` each record's operators
    are timed by the cost model it gives for that record (the residual's base), else by the analytical model.
    Shows a progress bar on stderr."""
    graphs = load_graphs({r.graph_key for r in records}, store)
    missing = {r.graph_key: "not featurized (see failures.csv)" for r in records if r.graph_key not in graphs}
    kept = [r for r in records if r.graph_key in graphs]
    keys = sorted({r.graph_key for r in kept})
    index = {k: i for i, k in enumerate(keys)}
    tensors = [graph_tensors(graphs[k]) for k in keys]
    analytical = AnalyticalCostModel()
    statics: list[list[float]] = [[] for _ in kept]
    estimates: list[list[float]] = [[] for _ in kept]
    shares: list[np.ndarray] = [np.zeros(0, dtype=np.float32) for _ in kept]
    curves = np.zeros((len(kept), len(LATENCY_CURVE_LOG_RATIOS)))
    names: list[str] = []
    desc = "analytical estimates" if base_of is None else "operator-model estimates"
    with tqdm(total=len(kept), desc=desc, unit="record", file=sys.stderr) as bar:
        for graph, group in configurations(kept, graphs):
            table = node_table(graph)
            for i in group:
                base = base_of(kept[i]) if base_of is not None else analytical
                request = measured_request(kept[i])
                timed = base.timed(table, request)
                inputs = network_inputs(timed, summarize(graph, timed, request, base.name), request)
                names = names or list(inputs.features)
                statics[i] = [inputs.features[n] for n in names]
                est = inputs.estimate
                estimates[i] = [est.latency_ms, est.energy_j, comparable_memory(kept[i], est)]
                shares[i] = inputs.time_share
                curves[i] = inputs.latency_curve
                bar.update()
    targets = np.array([[np.nan if getattr(r, t) is None else getattr(r, t) for t in TARGETS] for r in kept])
    return TrainingSet(
        records=kept, graph_keys=keys, x=[t[0] for t in tensors], edges=[t[1] for t in tensors],
        graph_of=np.array([index[r.graph_key] for r in kept]), static=np.array(statics, dtype=np.float64),
        static_names=names, analytical=np.array(estimates), targets=targets, time_share=shares,
        latency_curve=curves, missing=missing,
    )
