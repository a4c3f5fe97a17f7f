"""How far below its roofline each kernel runs, learned per operator from its shape on the target GPU.

The roofline assumes every kernel reaches the peak of its unit. Measured kernels do not: a GEMM whose
tiles leave the last wave of SMs half empty, a convolution cuDNN runs as an implicit GEMM of awkward
sizes, a normalisation over rows too short to fill a warp. This model reads how far below its bound a kernel
runs from the operator's shape as the target GPU sees it (tiles, waves over its SMs, tile padding, its
arithmetic intensity against the GPU's ridge point, its bytes against the L2), never from the GPU's
name, as NeuSight (ASPLOS 2025) does, so that a GPU never measured would be a new spec sheet rather
than a new training run.

Per operator it predicts :math:`s = \\log(t_{measured} / t_{core})`, with
:math:`t_{core} = \\max(F / P_{unit}, B / W) + t_{launch}` over what the operator itself computes and
moves; a small multilayer perceptron maps :func:`features` to :math:`s`, bounded (:func:`bounded`).
A (group of operators, unit) pair the training data never measured keeps the roofline
(:math:`s = 0`): nothing is extrapolated into a kind of kernel no one timed.

:mod:`dippm_nas.training.kernel_training` trains it on operator-level measurements and on whole-model
records through the graph. It is not in the prediction path: ``benchmarks/kernel_transfer.py`` measures
it on GPUs held out of its training, and on the data the project has it does not transfer as PMGNS does
(``docs/kernel_efficiency.md``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dippm_nas.cost.analytical import KERNEL_OVERHEAD_US, Roofline
from dippm_nas.cost.table import FULL_BYTES, NodeTable
from dippm_nas.graph import operators
from dippm_nas.hardware.registry import Device
from dippm_nas.precisions import precision_named

#: The categories with an efficiency curve of their own; the others share the elementwise one (pooling the
#: reductions').
_OWN_CURVE = (operators.GEMM, operators.CONV, operators.ATTENTION, operators.NORM, operators.SOFTMAX,
              operators.REDUCE)
#: The kinds of kernel the model tells apart, each with its own efficiency curve (a convolution off the
#: tensor cores has its own).
CUDA_CORE_CONV = f"{operators.CONV.name}_cuda_cores"
GROUPS = (operators.GEMM.name, operators.CONV.name, CUDA_CORE_CONV, *(c.name for c in _OWN_CURVE[2:]),
          operators.ELEMENTWISE.name)
#: The groups whose arithmetic may run on tensor cores: those a library runs.
TENSOR_CORE_GROUPS = tuple(c.name for c in _OWN_CURVE if c.library)
#: The unit a kernel's arithmetic runs on.
UNITS = ("cuda_cores", "tensor_tf32", "tensor_half")
#: The output tile of a cuBLAS / cuDNN tensor-op GEMM kernel of the usual size, and its K step.
TILE_MN, TILE_K = 128, 32
#: Resident threads per SM the waves of an elementwise kernel are counted in.
THREADS_PER_SM = 2048
#: The range of the predicted log slowdown. A kernel may beat its DRAM bound by serving its bytes from
#: the L2 (a network's small activations, a sweep's cache-resident inputs), not by more than twice; one
#: thirty times slower than its bound is a different kernel, not a slower one.
MIN_LOG_SLOWDOWN = math.log(0.5)
MAX_LOG_SLOWDOWN = math.log(30.0)
#: The perceptron's output passes through a sigmoid onto that range, shifted so that an output of 0 is
#: a slowdown of 1 (the roofline).
SIGMOID_SHIFT = math.log(-MIN_LOG_SLOWDOWN / MAX_LOG_SLOWDOWN)


def bounded(raw: np.ndarray) -> np.ndarray:
    """The perceptron's raw output as a log slowdown within [MIN_LOG_SLOWDOWN, MAX_LOG_SLOWDOWN].

    >>> [round(float(s), 3) + 0.0 for s in bounded(np.array([0.0, -50.0, 50.0]))]
    [0.0, -0.693, 3.401]
    """
    return MIN_LOG_SLOWDOWN + (MAX_LOG_SLOWDOWN - MIN_LOG_SLOWDOWN) / (1.0 + np.exp(-(raw + SIGMOID_SHIFT)))

#: Where a graph category's operators go (a convolution off the tensor cores has its own group).
CATEGORY_GROUPS = {c.name: c.name if c in _OWN_CURVE else operators.REDUCE.name if c is operators.POOL
                   else operators.ELEMENTWISE.name for c in operators.categories()}
_GROUP_OF_CATEGORY = np.array([GROUPS.index(CATEGORY_GROUPS[c]) for c in operators.category_names()])

FEATURE_NAMES = (
    *(f"group={g}" for g in GROUPS), *(f"unit={u}" for u in UNITS), "bytes_per_element",
    "log_compute_us", "log_memory_us", "log_intensity_over_ridge",
    "log_m", "log_n", "log_k", "log_batches", "log_waves", "last_wave_fill", "tile_fill", "k_fill",
    "log_thread_waves", "log_bytes_over_l2",
)


@dataclass(frozen=True)
class Operators:
    """Operators as columns: what the model reads of each, wherever it comes from (a graph's
    :class:`~dippm_nas.cost.table.NodeTable`, a sweep row, a profiler trace)."""

    group: np.ndarray  # index into GROUPS
    unit: np.ndarray  # index into UNITS
    element_bytes: np.ndarray  # 2 at half precision, 4 otherwise
    flops: np.ndarray
    moved: np.ndarray  # bytes read and written
    gemm: np.ndarray  # [n, 4]: batches, M, N, K; zeros for an operator that is not a GEMM
    peak: np.ndarray  # FLOP/s of the unit its arithmetic runs on

    def __len__(self) -> int:
        return len(self.group)


def unit_index(peak: np.ndarray, group: np.ndarray, device: Device, half: bool | np.ndarray) -> np.ndarray:
    """The unit from the peak the roofline priced an operator on: tensor cores where that peak is above
    the GPU's FP32 one and the group can use them, the CUDA cores otherwise."""
    tensor = np.isin(group, [GROUPS.index(g) for g in TENSOR_CORE_GROUPS]) & (peak > device.fp32_tflops * 1e12)
    return np.where(tensor, np.where(half, UNITS.index("tensor_half"), UNITS.index("tensor_tf32")),
                    UNITS.index("cuda_cores"))


def group_index(category: np.ndarray, cuda_core_conv: np.ndarray) -> np.ndarray:
    """The group of each operator from its graph category (an index into ``operators.categories()``)."""
    return np.where(cuda_core_conv, GROUPS.index(CUDA_CORE_CONV), _GROUP_OF_CATEGORY[category])


def core_seconds(operators: Operators, device: Device) -> np.ndarray:
    """The time the model's slowdown multiplies: the bound of the busier unit plus one launch."""
    bound = np.maximum(operators.flops / operators.peak, operators.moved / (device.memory_bw_gbs * 1e9))
    return bound + KERNEL_OVERHEAD_US * 1e-6


def _log2p(x: np.ndarray) -> np.ndarray:
    return np.log2(1.0 + np.maximum(x, 0.0))


def features(operators: Operators, device: Device) -> np.ndarray:
    """``[n, len(FEATURE_NAMES)]``: each operator's shape as ``device`` sees it.

    Everything about the GPU enters through the operator: its roofline terms in microseconds, its
    intensity against the ridge point (peak over bandwidth), its tiles and waves over the SMs, its
    bytes against the L2. No feature names a GPU, so none can stand for one.
    """
    n = len(operators)
    x = np.zeros((n, len(FEATURE_NAMES)))
    x[np.arange(n), operators.group] = 1.0
    x[np.arange(n), len(GROUPS) + operators.unit] = 1.0
    c = len(GROUPS) + len(UNITS)
    bandwidth = device.memory_bw_gbs * 1e9
    flops, moved = np.maximum(operators.flops, 1.0), np.maximum(operators.moved, 1.0)
    batches, m, nn, k = operators.gemm.T
    is_gemm = batches > 0
    tiles = batches * np.ceil(m / TILE_MN) * np.ceil(nn / TILE_MN)
    waves = tiles / device.sm_count
    padded = np.maximum(np.ceil(m / TILE_MN) * np.ceil(nn / TILE_MN) * TILE_MN ** 2, 1.0)
    x[:, c] = operators.element_bytes / 4.0
    x[:, c + 1] = _log2p(operators.flops / operators.peak * 1e6)
    x[:, c + 2] = _log2p(operators.moved / bandwidth * 1e6)
    x[:, c + 3] = np.log2(flops / moved) - np.log2(operators.peak / bandwidth)
    x[:, c + 4] = _log2p(m)
    x[:, c + 5] = _log2p(nn)
    x[:, c + 6] = _log2p(k)
    x[:, c + 7] = _log2p(batches)
    x[:, c + 8] = _log2p(waves)
    x[:, c + 9] = np.where(is_gemm, waves / np.maximum(np.ceil(waves), 1.0), 0.0)
    x[:, c + 10] = np.where(is_gemm, m * nn / padded, 0.0)
    x[:, c + 11] = np.where(is_gemm, k / np.maximum(np.ceil(k / TILE_K) * TILE_K, 1.0), 0.0)
    x[:, c + 12] = _log2p(moved / operators.element_bytes / (device.sm_count * THREADS_PER_SM))
    x[:, c + 13] = np.log2(moved / (device.l2_mb * 2 ** 20))
    return x


@dataclass(frozen=True, eq=False)
class KernelEfficiency:
    """A trained model: feature scaling, the perceptron's layers and the (group, unit) cells it saw."""

    mean: np.ndarray
    scale: np.ndarray
    layers: tuple[tuple[np.ndarray, np.ndarray], ...]  # (weight [in, out], bias [out]) each
    covered: np.ndarray  # [len(GROUPS), len(UNITS)] bool: measured in training
    trained_on: dict  # provenance: the GPUs and sources, the rows of each

    def log_slowdown(self, operators: Operators, device: Device) -> np.ndarray:
        """Per operator, the log of its time over its core time on ``device``; 0 where the training data
        has no kernel of its group on its unit."""
        return self.predict(features(operators, device), operators.group, operators.unit)

    def predict(self, x: np.ndarray, group: np.ndarray, unit: np.ndarray) -> np.ndarray:
        """:meth:`log_slowdown` from features already computed (``[n, len(FEATURE_NAMES)]``)."""
        if not len(x):
            return np.zeros(0)
        h = (x - self.mean) / self.scale
        for i, (weight, bias) in enumerate(self.layers):
            h = h @ weight + bias
            if i < len(self.layers) - 1:
                h = h / (1.0 + np.exp(-h))  # SiLU
        return np.where(self.covered[group, unit], bounded(h[:, 0]), 0.0)


def graph_operators(table: NodeTable, roofline: Roofline, device: Device, precision: str) -> Operators:
    """The operators of a graph's :class:`~dippm_nas.cost.table.NodeTable` as the model reads them, on the
    units its :class:`~dippm_nas.cost.analytical.Roofline` priced them on."""
    numbers = precision_named(precision)
    half = numbers.autocast
    group = group_index(table.category, table.cuda_core_conv)
    element_bytes = np.where(half & ~table.autocast.stays_f32, float(numbers.element_bytes), float(FULL_BYTES))
    # What the operator itself must move at its dtype, as a sweep row counts it: autocast's casts, cuDNN's
    # transposes and the other extra passes the roofline charges stay the roofline's.
    moved = (table.f32_read + table.f32_written + table.weight_numel) * element_bytes + table.other_bytes
    return Operators(group=group, unit=unit_index(roofline.peak, group, device, half),
                     element_bytes=element_bytes, flops=table.flops, moved=moved, gemm=table.gemm,
                     peak=roofline.peak)


def split_roofline(table: NodeTable, roofline: Roofline, device: Device, precision: str
                   ) -> tuple[Operators, np.ndarray, np.ndarray]:
    """A graph's operators as the model reads them, each one's core time, and what the roofline charges
    beyond the core (autocast's casts, cuDNN's transposes, the launches of extra kernels)."""
    operators = graph_operators(table, roofline, device, precision)
    core = core_seconds(operators, device)
    return operators, core, np.maximum(roofline.time_s - core, 0.0)


def operator_seconds(core_s: np.ndarray, extra_s: np.ndarray, view: np.ndarray,
                     log_slowdown: np.ndarray) -> np.ndarray:
    """Each operator's time when its kernel runs as far from its bound as ``log_slowdown`` says: its core
    time times the slowdown, plus what the roofline charges beyond the core; views stay free."""
    return np.where(view, 0.0, extra_s + core_s * np.exp(log_slowdown))


def calibrated_seconds(table: NodeTable, roofline: Roofline, device: Device, precision: str,
                       model: KernelEfficiency) -> np.ndarray:
    """Each operator's time on ``device`` as the model says its kernel runs (:func:`operator_seconds`)."""
    operators, core, extra = split_roofline(table, roofline, device, precision)
    return operator_seconds(core, extra, table.is_view, model.log_slowdown(operators, device))
