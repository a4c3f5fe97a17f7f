"""Records + graph store -> tensors for training: node features per graph; per record the static
features, the analytical estimate, its operators' shares of that estimate's latency, and the targets
as measured values (missing ones are NaN)."""

from __future__ import annotations

import itertools
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from dippm_nas.cache import GraphCache
from dippm_nas.cost.analytical import BOUNDS, AnalyticalCostModel, torch_release
from dippm_nas.cost.base import Estimate
from dippm_nas.cost.pmgns import LATENCY_CURVE_LOG_RATIOS, TARGETS
from dippm_nas.graph.batching import scale_batch
from dippm_nas.graph.features import edge_index, node_feature_matrix, static_features
from dippm_nas.graph.model_graph import ModelGraph
from dippm_nas.graph.table import NodeTable
from dippm_nas.hardware.registry import PRECISIONS, Device, get_device
from dippm_nas.training.featurize import DEFAULT_STORE, store_key
from dippm_nas.training.records import Record

#: The bounds that take time (a view, "free", takes none).
TIME_SHARES = tuple(b for b in BOUNDS if b != "free")


def device_features(device: Device, precision: str) -> dict[str, float]:
    return {
        "dev_log_fp32_tflops": math.log(device.fp32_tflops),
        "dev_log_tensor_tflops": math.log(device.tensor_tflops(precision)),
        "dev_log_bw_gbs": math.log(device.memory_bw_gbs),
        "dev_log_sms": math.log(device.sm_count),
        "dev_log_l2_mb": math.log(device.l2_mb),
        "dev_log_tdp_w": math.log(device.tdp_w),
        "dev_log_memory_gib": math.log(device.memory_gib),
    }


def _torch_version(text: str) -> float:
    release = torch_release(text)
    return release[0] + release[1] / 100 if release else 0.0


@dataclass(frozen=True, eq=False)
class RecordInputs:
    """What PMGNS reads of one configuration besides its graph's node features."""

    features: dict[str, float]  # static features by name
    estimate: Estimate  # the analytical model's (without per-operator costs)
    time_share: np.ndarray  # each operator's share of the analytical latency, in graph order
    latency_curve: np.ndarray  # log-latency (ms) at LATENCY_CURVE_LOG_RATIOS of the GPU time


def record_inputs(table: NodeTable, record_like: dict, analytical: AnalyticalCostModel) -> RecordInputs:
    """``table`` is the graph's at the configuration's batch; ``record_like`` needs batch, device,
    precision, layout and torch: a Record or a prediction request alike."""
    device = get_device(record_like["device"])
    precision = record_like["precision"]
    release = torch_release(record_like["torch"])
    roofline = analytical.roofline(table, device, precision, record_like["layout"], release)
    estimate = analytical.summarize(table, roofline, device, precision, release=release)
    feats = {k: (math.log1p(v) if k.startswith(("count=", "n_", "dippm_")) else v)
             for k, v in static_features(table).items()}
    feats["batch"] = math.log(record_like["batch"])
    feats.update(device_features(device, precision))
    for p in PRECISIONS:
        feats[f"precision={p}"] = float(precision == p)
    feats["layout_nhwc"] = float(record_like["layout"] == "nhwc")
    feats["torch_version"] = _torch_version(record_like["torch"])
    for bound in TIME_SHARES:
        feats[f"time_share_{bound}"] = roofline.share(bound)
    feats["host_wait_share"] = roofline.host_wait_share()
    for name, value in zip(TARGETS, (estimate.latency_ms, estimate.energy_j, estimate.memory_mib)):
        feats[f"log_analytical_{name}"] = math.log(value)
    share = roofline.time_s / roofline.time_s.sum()  # positive, as the latency is
    return RecordInputs(feats, estimate, share.astype(np.float32), roofline.latency_curve(LATENCY_CURVE_LOG_RATIOS))


def graph_tensors(graph: ModelGraph) -> tuple[torch.Tensor, torch.Tensor]:
    return node_feature_matrix(graph.table), edge_index(graph)


@dataclass
class TrainingSet:
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
    latency_curve: np.ndarray  # per record: RecordInputs.latency_curve
    missing: dict[str, str] = field(default_factory=dict)

    @property
    def families(self) -> np.ndarray:
        return np.array([r.family for r in self.records])

    @property
    def devices(self) -> np.ndarray:
        return np.array([r.device for r in self.records])


def load_graphs(keys: set[str], store: Path = DEFAULT_STORE) -> dict[str, ModelGraph]:
    cache = GraphCache(store)
    graphs = {}
    for key in sorted(keys):
        graph = cache.get(store_key(key))
        if graph is not None:
            graphs[key] = graph
    return graphs


def build_training_set(records: list[Record], store: Path = DEFAULT_STORE) -> TrainingSet:
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
    # Records of other devices, precisions and runtimes share a (graph, batch): its table is built once.
    by_config = sorted(range(len(kept)), key=lambda i: (kept[i].graph_key, kept[i].batch))
    with tqdm(total=len(kept), desc="analytical estimates", unit="record", file=sys.stderr) as bar:
        for (key, batch), group in itertools.groupby(by_config, key=lambda i: (kept[i].graph_key, kept[i].batch)):
            table = scale_batch(graphs[key], batch).table
            for i in group:
                inputs = record_inputs(table, asdict(kept[i]), analytical)
                names = names or list(inputs.features)
                statics[i] = [inputs.features[n] for n in names]
                est = inputs.estimate
                estimates[i] = [est.latency_ms, est.energy_j, est.memory_mib]
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
