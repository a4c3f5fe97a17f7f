"""Operator-level ground truth, and the kernel-efficiency model trained on it.

Two sources, each read as it is:
* ``data/measurements/sweeps/*.csv``: the harness's operator sweeps (``dippm-nas sweep``): one operator
  alone at a drawn shape and precision, its median device time;
* ``data/neusight/label/<GPU>/*.csv``: NeuSight's per-operator traces of one transformer layer (fp32,
  torch.fx nodes with their shapes and latency), for the GEMMs, normalisations, softmax and
  elementwise operators they hold.

Each becomes an :class:`OperatorRow`: the operator as :class:`~dippm_nas.cost.kernel_efficiency.Operators`
describes it, the GPU it ran on and its measured seconds; :mod:`dippm_nas.training.kernel_training`
trains the model on them.
"""

from __future__ import annotations

import ast
import csv
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dippm_nas.cost.analytical import peak_tflops
from dippm_nas.cost.kernel_efficiency import (
    GROUPS,
    Operators,
    core_seconds,
    features,
    unit_index,
)
from dippm_nas.graph import operators
from dippm_nas.graph.operators.conv import TENSOR_CORE_CHANNEL_MULTIPLE
from dippm_nas.hardware.registry import get_device
from dippm_nas.precisions import precision_named
from dippm_nas.training.paths import project
from dippm_nas.training.records import GPU_NAMES, NEUSIGHT_GPUS, origin_of

#: A sweep kind -> (group, the roofline category that prices its arithmetic).
SWEEP_KINDS = {
    "mm": ("matmul", "matmul"), "linear": ("matmul", "matmul"), "bmm": ("matmul", "matmul"),
    "conv2d": ("conv", "conv"), "sdpa": ("attention", "attention"),
    "add": ("elementwise", "elementwise"), "mul": ("elementwise", "elementwise"),
    "relu": ("elementwise", "activation"), "gelu": ("elementwise", "activation"),
    "silu": ("elementwise", "activation"), "sum": ("reduce", "reduce"), "mean": ("reduce", "reduce"),
    "max_pool2d": ("reduce", "pool"), "adaptive_avg_pool2d": ("reduce", "pool"),
    "batch_norm": ("norm", "norm"), "layer_norm": ("norm", "norm"), "group_norm": ("norm", "norm"),
    "softmax": ("softmax", "softmax"),
}


@dataclass(frozen=True)
class OperatorRow:
    """One measured operator: its shape, precision, GPU (a registry key) and median seconds."""

    gpu: str
    group: str
    category: str  # the roofline category that prices its arithmetic
    precision: str
    flops: float
    moved: float
    gemm: tuple[float, float, float, float]
    seconds: float
    source: str  # the file it came from, relative to the project


def _sweep_gemm(kind: str, p: dict[str, int]) -> tuple[tuple[float, float, float, float], bool]:
    """(batches, M, N, K) of a sweep point, and whether a convolution's channels keep it off the tensor cores."""
    if kind in ("mm", "linear"):
        return (1, p["m"], p["n"], p["k"]), False
    if kind == "bmm":
        return (p["b"], p["m"], p["n"], p["k"]), False
    if kind == "sdpa":
        return (p["b"] * p["h"], p["s"], p["s"], p["d"]), False
    if kind == "conv2d":
        out = (p["h"] + 2 * (p["r"] // 2) - p["r"]) // p["s"] + 1
        c, k = p["c"] // p["g"], p["k"] // p["g"]
        cuda_cores = bool(c % TENSOR_CORE_CHANNEL_MULTIPLE or k % TENSOR_CORE_CHANNEL_MULTIPLE)
        return (p["g"], p["n"] * out * out, k, c * p["r"] ** 2), cuda_cores
    return (0, 0, 0, 0), False


def sweep_rows(path: Path) -> list[OperatorRow]:
    """The ``ok`` rows of one sweep file."""
    rows = []
    origin = origin_of(path, project().root)
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row["status"] != "ok" or row["kind"] not in SWEEP_KINDS or row["gpu_name"] not in GPU_NAMES:
                continue
            params = {k: int(v) for k, v in (item.split("=") for item in row["params"].split(";"))}
            group, category = SWEEP_KINDS[row["kind"]]
            gemm, cuda_cores = _sweep_gemm(row["kind"], params)
            if cuda_cores:
                group, category = "conv_cuda_cores", "elementwise"  # priced at the FP32 peak, as the roofline does
            rows.append(OperatorRow(GPU_NAMES[row["gpu_name"]], group, category, row["precision"], float(row["flops"]),
                                    float(row["bytes"]), tuple(map(float, gemm)),
                                    float(row["latency_ms_median"]) * 1e-3, origin))
    return rows


#: NeuSight's Linear modules, by the attribute names of the models it traced.
_LINEAR_MODULE = re.compile(r"(dense|proj|fc1|fc2|lm_head|query|key|value|classifier|c_attn|c_proj|c_fc)$")
_LAYER_NORM_MODULE = re.compile(r"(LayerNorm|ln_\w+|layer_norm|layernorm)$")
_ELEMENTWISE = re.compile(r"<built-in (function|method) (add|mul|truediv|sub|pow|tanh|where|max)\b"
                          r"|<function (gelu|dropout)>|<built-in function gelu>|activation_fn$|\.act$")


def _linear(m: int, n: int, k: int) -> tuple[str, str, float, float, tuple[float, ...]]:
    """A fp32 linear layer's (group, category, FLOPs, bytes, GEMM): inputs, weight, output and bias."""
    return "matmul", "matmul", 2.0 * m * n * k, 4.0 * (m * k + k * n + m * n + n), (1, m, n, k)


def _trace_row(row: dict[str, str]) -> tuple[str, str, float, float, tuple[float, ...]] | None:
    """(group, category, FLOPs, bytes, GEMM) of one traced fp32 operator; None for a view, a scalar,
    a shape query or an operator the rules do not read."""
    target = row["target"]
    try:
        inputs = ast.literal_eval(row["input_shapes"])
        out = ast.literal_eval(row["output_shape"])
    except (ValueError, SyntaxError):
        return None
    if not isinstance(out, tuple) or not out or not all(isinstance(d, int) for d in out):
        return None
    numel = math.prod(out)
    if numel <= 1:
        return None
    if row["op"] == "call_module" and _LINEAR_MODULE.search(target) and len(inputs) == 1:
        return _linear(numel // out[-1], out[-1], inputs[0][-1])
    if "addmm" in target and len(inputs) == 3:
        (m, k), n = inputs[1], inputs[2][1]
        return _linear(m, n, k)
    if re.search(r"method (matmul|bmm)\b", target) and len(inputs) == 2 and len(inputs[0]) >= 2:
        a, b = inputs
        m, k, n = a[-2], a[-1], b[-1]
        batches = math.prod(out[:-2])
        moved = 4.0 * batches * (m * k + k * n + m * n)
        return "matmul", "matmul", 2.0 * batches * m * n * k, moved, (batches, m, n, k)
    if "softmax" in target:
        return "softmax", "softmax", 5.0 * numel, 8.0 * numel, (0, 0, 0, 0)
    if row["op"] == "call_module" and _LAYER_NORM_MODULE.search(target):
        return "norm", "norm", 5.0 * numel, 8.0 * numel, (0, 0, 0, 0)
    if _ELEMENTWISE.search(target) and "dropout" not in target:
        tensors = sum(1 for shape in inputs if math.prod(shape) > 1)
        return "elementwise", "elementwise", float(numel), 4.0 * numel * (tensors + 1), (0, 0, 0, 0)
    return None


def neusight_rows(folder: Path) -> list[OperatorRow]:
    """The operators of NeuSight's per-layer traces (``label/<GPU>/<model>-inf-<seqlen>-<batch>.csv``)."""
    rows = []
    for path in sorted(folder.glob("*/*-inf-*.csv")):
        if path.parent.name not in NEUSIGHT_GPUS or "fusion" in path.name:
            continue
        origin = origin_of(path, project().root)
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                if row["op"] not in ("call_function", "call_method", "call_module") or not row["latency"]:
                    continue
                read = _trace_row(row)
                if read is None or float(row["latency"]) <= 0:
                    continue
                group, category, flops, moved, gemm = read
                rows.append(OperatorRow(NEUSIGHT_GPUS[path.parent.name], group, category, "fp32", flops, moved,
                                        tuple(map(float, gemm)), float(row["latency"]) * 1e-3, origin))
    return rows


def load_operator_rows() -> list[OperatorRow]:
    """Every operator-level row of the project's data set."""
    paths = project()
    rows = [r for path in sorted((paths.root / "data" / "measurements" / "sweeps").glob("*.csv"))
            for r in sweep_rows(path)]
    return rows + neusight_rows(paths.root / "data" / "neusight" / "label")


def operators_of(rows: Sequence[OperatorRow]) -> Operators:
    """The rows as the model reads them; all rows must be of one GPU."""
    device = get_device(rows[0].gpu)
    peak = np.array([peak_tflops(operators.category_named(r.category).library, device, r.precision) * 1e12
                     for r in rows])
    group = np.array([GROUPS.index(r.group) for r in rows])
    modes = [precision_named(r.precision) for r in rows]
    half = np.array([m.autocast for m in modes])
    return Operators(group=group, unit=unit_index(peak, group, device, half),
                     element_bytes=np.array([float(m.element_bytes) for m in modes]),
                     flops=np.array([r.flops for r in rows]), moved=np.array([r.moved for r in rows]),
                     gemm=np.array([r.gemm for r in rows], dtype=np.float64), peak=peak)


@dataclass(frozen=True, eq=False)
class Design:
    """The rows as matrices: features, log slowdown over the core roofline time, and each row's GPU,
    group and unit."""

    x: np.ndarray
    y: np.ndarray
    gpu: np.ndarray
    group: np.ndarray
    unit: np.ndarray


def design(rows: Sequence[OperatorRow]) -> Design:
    """Features and targets of ``rows``, GPU by GPU (each GPU's features read its own spec sheet)."""
    parts = []
    for gpu in sorted({r.gpu for r in rows}):
        mine = [r for r in rows if r.gpu == gpu]
        operators = operators_of(mine)
        device = get_device(gpu)
        roof = core_seconds(operators, device)
        measured = np.array([r.seconds for r in mine])
        parts.append((features(operators, device), np.log(measured / roof),
                      np.array([gpu] * len(mine)), operators.group, operators.unit))
    return Design(*(np.concatenate(columns) for columns in zip(*parts)))
