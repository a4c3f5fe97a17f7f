"""What a graph network (PMGNS, the residual) reads of one configuration besides its graph's node features: the
static features (graph, batch, device spec sheet, precision, runtime), the estimate it corrects (its base: the
analytical model's, or for the residual the operator model's), each operator's share of that estimate's time,
and the latency curve the GPU-time correction is read from.

A training record and a prediction request go through the same function, so the features a network was trained
on are the features it is asked about.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dippm_nas.cost.estimate import BOUNDS, Estimate
from dippm_nas.cost.learned.features import static_features
from dippm_nas.cost.learned.pmgns_network import LATENCY_CURVE_LOG_RATIOS, TARGETS
from dippm_nas.cost.pipeline.summary import Timed
from dippm_nas.hardware.registry import Device
from dippm_nas.precisions import PRECISIONS, Precision
from dippm_nas.request import Request

#: The bounds that take time (a view, "free", takes none).
TIME_SHARES = tuple(b for b in BOUNDS if b != "free")

#: The precisions with a one-hot column of their own: the network reads a model of half weights as its
#: stand-in (:func:`dippm_nas.cost.learned.card.read_as`), whose records it learned from.
PRECISION_COLUMNS = tuple(name for name, p in PRECISIONS.items() if p.weights_dtype is None)

#: Static features read as log(1 + x): counts.
_COUNTS = ("count=", "n_", "dippm_")


def device_features(gpu: Device, precision: Precision) -> dict[str, float]:
    """A device's spec sheet as the network reads it: logs of its peaks (the tensor cores' at ``precision``),
    bandwidth, SMs, L2, TDP and memory."""
    return {
        "dev_log_fp32_tflops": math.log(gpu.fp32_tflops),
        "dev_log_tensor_tflops": math.log(gpu.tensor_tflops(precision)),
        "dev_log_bw_gbs": math.log(gpu.memory_bw_gbs),
        "dev_log_sms": math.log(gpu.sm_count),
        "dev_log_l2_mb": math.log(gpu.l2_mb),
        "dev_log_tdp_w": math.log(gpu.tdp_w),
        "dev_log_memory_gib": math.log(gpu.memory_gib),
    }


@dataclass(frozen=True, eq=False)
class NetworkInputs:
    """What a graph network reads of one configuration besides its graph's node features."""

    features: dict[str, float]  # static features by name
    estimate: Estimate  # the base model's
    time_share: np.ndarray  # each operator's share of the base's GPU time, in graph order
    latency_curve: np.ndarray  # log-latency (ms) at LATENCY_CURVE_LOG_RATIOS of the GPU time


def network_inputs(timed: Timed, estimate: Estimate, request: Request) -> NetworkInputs:
    """The inputs of the configuration ``timed`` prices (its graph at its batch, on ``request``), whose base
    estimate is ``estimate``: a training record and a prediction alike. Every record was measured eager on its
    harness's host (the default host profile)."""
    table, precision = timed.table, request.precision
    graph_features = table.derived("static features", lambda: {
        k: (math.log1p(v) if k.startswith(_COUNTS) else v) for k, v in static_features(table).items()})
    feats = dict(graph_features)
    feats["batch"] = math.log(table.batch)
    feats.update(device_features(request.gpu, precision))
    for p in PRECISION_COLUMNS:
        feats[f"precision={p}"] = float(precision.name == p)
    feats["layout_nhwc"] = float(request.layout == "nhwc")
    feats["torch_version"] = request.runtime[0] + request.runtime[1] / 100 if request.runtime else 0.0
    for bound in TIME_SHARES:
        feats[f"time_share_{bound}"] = timed.share(bound)
    feats["host_wait_share"] = timed.host_wait_share()
    # The memory feature is the context plus peak reserved, the scale the shipped network learned on (the first
    # protocol's rows); the kernels' modules are a constant it adds nothing to know.
    memory = estimate.memory.context_and_reserved_mib if estimate.memory else estimate.memory_mib
    for name, value in zip(TARGETS, (estimate.latency_ms, estimate.energy_j, memory)):
        feats[f"log_analytical_{name}"] = math.log(value)
    share = timed.gpu_s / timed.gpu_s.sum()  # positive, as the latency is
    return NetworkInputs(feats, estimate, share.astype(np.float32), timed.latency_curve(LATENCY_CURVE_LOG_RATIOS))
