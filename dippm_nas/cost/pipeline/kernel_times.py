"""The kernel-times stage: every operator's GPU seconds as the learned operator model times its kernel, with the
roofline's floor under it.

Each operator of the graph becomes a row of :class:`~dippm_nas.cost.learned.kernel_structure.KernelColumns` on the
unit the roofline prices it on; the operator model (:mod:`dippm_nas.cost.learned.operator_network`) gives its
kernel's time, which replaces the roofline's core term (its FLOPs at the peak or its own bytes at the bandwidth,
and one launch). What the roofline charges beyond the core (the casts autocast adds, cuDNN's transposes, eager's
math attention, more kernels than one) stays. No operator is predicted faster than its roofline (for a 3x3
convolution cuDNN may run as Winograd, the Winograd arithmetic's): :func:`floored`, the one step that a
prediction (numpy) and the operator model's training on whole-model records (torch) share.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from array_api_compat import array_namespace

from dippm_nas.cost.learned.kernel_structure import (
    GEMM_GROUPS,
    GROUPS,
    UNITS,
    WINOGRAD_FLOP_SAVING,
    KernelColumns,
    winograd_eligible,
)
from dippm_nas.cost.learned.operator_network import OperatorModel
from dippm_nas.cost.pipeline.roofline import KERNEL_OVERHEAD_US, Roofline, on_tensor_cores
from dippm_nas.cost.pipeline.table import FULL_BYTES, HALF_BYTES, SHAPE_COLUMNS, NodeTable
from dippm_nas.graph import operators
from dippm_nas.hardware.registry import Device
from dippm_nas.precisions import Precision
from dippm_nas.request import Request

#: The groups whose kernels are tiled GEMMs, as indices: a calibration scales them apart from the others.
GEMM_GROUP_INDICES = [GROUPS.index(g) for g in GEMM_GROUPS]


def _group_of_kind(kernels: tuple[str, ...]) -> np.ndarray:
    """The model's group of each kind of the vocabulary, from one of the registry's per-kind kernel columns."""
    return np.array([GROUPS.index(kernel) for kernel in kernels])


def kernel_groups(table: NodeTable) -> np.ndarray:
    """Each operator's kernel group (an index into :data:`~dippm_nas.cost.learned.kernel_structure.GROUPS`): its
    registry entry's, or the one its category names for operators whose shapes keep them off the tensor
    cores (the convolutions cuDNN runs on the CUDA cores)."""
    kinds = operators.kind_table()
    return np.where(table.cuda_core_conv, _group_of_kind(kinds.cuda_core_kernel)[table.kind],
                    _group_of_kind(kinds.kernel)[table.kind])


@dataclass(frozen=True, eq=False)
class _Shapes:
    """What the operator model reads of a graph's operators at one precision, whatever the GPU."""

    group: np.ndarray
    element_bytes: np.ndarray
    moved: np.ndarray
    tensor_unit: np.ndarray  # the unit where the GPU runs it on tensor cores
    winograd: np.ndarray
    weight_operand: np.ndarray


def _shapes(table: NodeTable, precision: Precision) -> _Shapes:
    group = kernel_groups(table)
    lower = precision.autocast & ~table.autocast.stays_f32
    own_half = table.half_operands  # a model's own half tensors: half bytes and half tensor cores, no autocast
    element_bytes = np.where(lower, float(precision.element_bytes), np.where(own_half, float(HALF_BYTES),
                                                                             float(FULL_BYTES)))
    moved = (table.f32_read + table.f32_written + table.weight_numel) * element_bytes + table.other_bytes
    shape = table.shape_attrs
    kernel = shape[:, SHAPE_COLUMNS.index("kernel_h")]
    square = kernel == shape[:, SHAPE_COLUMNS.index("kernel_w")]
    stride = np.maximum(shape[:, SHAPE_COLUMNS.index("strides_0")], shape[:, SHAPE_COLUMNS.index("strides_1")])
    conv = group == GROUPS.index("conv")
    return _Shapes(group=group, element_bytes=element_bytes, moved=moved,
                   tensor_unit=np.where(own_half | precision.autocast, UNITS.index("tensor_half"),
                                        UNITS.index("tensor_tf32")),
                   winograd=conv & square & winograd_eligible(kernel, stride)
                   & (shape[:, SHAPE_COLUMNS.index("groups")] <= 1),
                   weight_operand=(group == GROUPS.index("gemm")) & table.has_weights)


def kernel_columns(table: NodeTable, peak: np.ndarray, gpu: Device, precision: Precision) -> KernelColumns:
    """A graph's operators as the operator model reads them, on the units ``peak`` (the roofline's) prices them on.
    The bytes are what each operator itself must move at its dtype; autocast's casts and cuDNN's transposes stay
    the roofline's. What depends on the precision alone is kept with the table."""
    shapes = table.derived(("kernel shapes", precision.name), lambda: _shapes(table, precision))
    unit = np.where(on_tensor_cores(peak, gpu), shapes.tensor_unit, UNITS.index("cuda_cores"))
    return KernelColumns(group=shapes.group, unit=unit, element_bytes=shapes.element_bytes, flops=table.flops,
                         moved=shapes.moved, gemm=table.gemm, rows=table.rows, winograd=shapes.winograd,
                         weight_operand=shapes.weight_operand, peak=peak)


def beyond_and_floor(columns: KernelColumns, roofline: Roofline, gpu: Device) -> tuple[np.ndarray, np.ndarray]:
    """Per operator, what the roofline charges beyond the kernel's own core (its FLOPs at the peak or its own bytes
    at the bandwidth, and one launch), which the learned time does not replace, and the least time it may take:
    the roofline's, with Winograd's arithmetic for a 3x3 convolution on the CUDA cores."""
    core = np.maximum(columns.flops / roofline.peak, columns.moved / (gpu.memory_bw_gbs * 1e9))
    core = core + KERNEL_OVERHEAD_US * 1e-6
    floor = np.where(columns.winograd & (columns.unit == 0), roofline.time_s / WINOGRAD_FLOP_SAVING, roofline.time_s)
    return np.maximum(roofline.time_s - core, 0.0), floor


def floored(beyond_s: Any, kernel_s: Any, floor_s: Any) -> Any:
    """An operator's GPU seconds: the roofline's time beyond its kernel plus the kernel's learned time, never below
    its floor (numpy arrays or torch tensors alike)."""
    return array_namespace(beyond_s, kernel_s, floor_s).maximum(beyond_s + kernel_s, floor_s)


@dataclass(frozen=True, eq=False)
class KernelTimes:
    """Each operator's GPU seconds as the operator model times it, the network's own part of it (which another
    estimate on the same GPU and precision may reuse), and which operators run GEMM-class kernels."""

    seconds: np.ndarray
    learned_s: np.ndarray
    gemm_class: np.ndarray


def kernel_times(table: NodeTable, roofline: Roofline, request: Request, model: OperatorModel,
                 learned_s: np.ndarray | None = None) -> KernelTimes:
    """Every operator's GPU seconds on the request's GPU, its kernel timed by ``model``; ``learned_s``: the
    network's kernel seconds where an estimate of the same graph, GPU and precision already ran it."""
    return kernel_times_many([table], [roofline], request, model, None if learned_s is None else [learned_s])[0]


def kernel_times_many(tables: Sequence[NodeTable], rooflines: Sequence[Roofline], request: Request,
                      model: OperatorModel, learned_s: Sequence[np.ndarray] | None = None) -> list[KernelTimes]:
    """:func:`kernel_times` of several graphs on one request: the network runs once over all their operators (a
    population's candidates, scored together), and each graph's times are what it alone would get."""
    gpu = request.gpu
    columns = [kernel_columns(t, r.peak, gpu, request.precision) for t, r in zip(tables, rooflines)]
    if learned_s is None:
        runs = [np.flatnonzero(~t.is_view) for t in tables]
        timed = [c.take(run) for c, run in zip(columns, runs)]
        seconds = model.seconds(timed[0] if len(timed) == 1 else KernelColumns.concatenate(timed), gpu)
        learned_s = []
        for table, run, end in zip(tables, runs, np.cumsum([len(run) for run in runs])):
            learned = np.zeros(len(table))
            learned[run] = seconds[end - len(run):end]
            learned_s.append(learned)
    out = []
    for table, bounds, kernel, learned in zip(tables, rooflines, columns, learned_s):
        beyond, floor = beyond_and_floor(kernel, bounds, gpu)
        out.append(KernelTimes(np.where(table.is_view, 0.0, floored(beyond, learned, floor)), learned,
                               np.isin(kernel.group, GEMM_GROUP_INDICES)))
    return out
