"""What the learned model reads of one configuration besides its graph's node features: the static
features (graph, batch, device spec sheet, precision, runtime), the estimate it corrects (its base: the
analytical model's, or for the residual the operator model's), each operator's share of that estimate's
time, and the latency curve the GPU-time correction is read from.

A training record and a prediction request go through the same function, so the features a network
was trained on are the features it is asked about.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from dippm_nas.cost.analytical import BOUNDS, AnalyticalCostModel, Roofline, torch_major_minor
from dippm_nas.cost.base import Estimate
from dippm_nas.cost.features import static_features
from dippm_nas.cost.pmgns import LATENCY_CURVE_LOG_RATIOS, TARGETS
from dippm_nas.cost.table import NodeTable
from dippm_nas.hardware.registry import PRECISIONS, Device, get_device
from dippm_nas.precisions import PrecisionLike, precision_named

#: The bounds that take time (a view, "free", takes none).
TIME_SHARES = tuple(b for b in BOUNDS if b != "free")

#: Each operator's GPU seconds in place of the roofline's (table, roofline, device, precision): how a base other
#: than the analytical model times them (the operator model's ``OperatorCostModel.operator_seconds``).
Timing = Callable[[NodeTable, Roofline, Device, PrecisionLike], np.ndarray]


#: The precisions with a one-hot column of their own: the network reads a model of half weights as its
#: stand-in (:func:`dippm_nas.cost.coverage.read_as`), whose records it learned from.
PRECISION_COLUMNS = tuple(name for name, p in PRECISIONS.items() if p.weights_dtype is None)


def device_features(device: Device, precision: PrecisionLike) -> dict[str, float]:
    """A device's spec sheet as the learned model reads it: logs of its peaks (the tensor cores' at
    ``precision``), bandwidth, SMs, L2, TDP and memory."""
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
    torch_version = torch_major_minor(text)
    return torch_version[0] + torch_version[1] / 100 if torch_version else 0.0


@dataclass(frozen=True, eq=False)
class RecordInputs:
    """What PMGNS reads of one configuration besides its graph's node features."""

    features: dict[str, float]  # static features by name
    estimate: Estimate  # the base model's (without per-operator costs)
    time_share: np.ndarray  # each operator's share of the base's latency, in graph order
    latency_curve: np.ndarray  # log-latency (ms) at LATENCY_CURVE_LOG_RATIOS of the GPU time


def record_inputs(table: NodeTable, record_like: dict, analytical: AnalyticalCostModel,
                  timing: Timing | None = None) -> RecordInputs:
    """``table`` is the graph's at the configuration's batch; ``record_like`` needs batch, device (a key or a
    :class:`~dippm_nas.hardware.registry.Device`), precision, layout and torch: a Record or a prediction request
    alike. It may also name an execution ``mode`` and ``host`` profile (:mod:`dippm_nas.cost.host`); every
    record was measured eager on its harness's host, the default. With ``timing`` the operators' GPU times are
    its, composed through the same queue: the base is that model's estimate, not the analytical one."""
    device = get_device(record_like["device"])
    precision = precision_named(record_like["precision"])
    torch_version = torch_major_minor(record_like["torch"])
    mode, host = record_like.get("mode", "eager"), record_like.get("host")
    roofline = analytical.roofline(table, device, precision, record_like["layout"], torch_version, mode=mode, host=host)
    if timing is not None:
        roofline = replace(roofline, time_s=timing(table, roofline, device, precision))
    estimate = analytical.summarize(table, roofline, device, precision, torch_version=torch_version, host=host)
    feats = {k: (math.log1p(v) if k.startswith(("count=", "n_", "dippm_")) else v)
             for k, v in static_features(table).items()}
    feats["batch"] = math.log(record_like["batch"])
    feats.update(device_features(device, precision))
    for p in PRECISION_COLUMNS:
        feats[f"precision={p}"] = float(precision.name == p)
    feats["layout_nhwc"] = float(record_like["layout"] == "nhwc")
    feats["torch_version"] = _torch_version(record_like["torch"])
    for bound in TIME_SHARES:
        feats[f"time_share_{bound}"] = roofline.share(bound)
    feats["host_wait_share"] = roofline.host_wait_share()
    # The memory feature is the context plus peak reserved, the scale the shipped network learned on
    # (the first protocol's rows); the kernels' modules are a constant it adds nothing to know.
    memory = estimate.memory.context_and_reserved_mib if estimate.memory else estimate.memory_mib
    for name, value in zip(TARGETS, (estimate.latency_ms, estimate.energy_j, memory)):
        feats[f"log_analytical_{name}"] = math.log(value)
    share = roofline.time_s / roofline.time_s.sum()  # positive, as the latency is
    return RecordInputs(feats, estimate, share.astype(np.float32), roofline.latency_curve(LATENCY_CURVE_LOG_RATIOS))
