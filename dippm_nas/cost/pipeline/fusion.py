r"""The fusion stage: the kernels ``torch.compile`` (TorchDynamo and Inductor, default mode) launches for a graph,
what each moves, and the graph's time when they run.

Inductor keeps matrix products, convolutions and attention as library calls (cuBLAS, cuDNN, the fused attention
kernels: ``ExternKernel`` nodes; ``max_autotune`` is off by default) and generates one Triton kernel for each
group of the other operators it can fuse: pointwise operators with their producers and consumers, a reduction (a
norm, a softmax, a pooling) with the pointwise work before and after it. Batch norm in inference is pointwise
arithmetic on the convolution's output (folded into the convolution's weights only under ``freezing``, off by
default), so it fuses with the activation and the residual add that follow; views become indexing inside a
kernel. A library call takes no generated epilogue: its output is written once and read by the group that follows.
Autocast's casts of activations are pointwise operators too: each fuses into the kernel that produces its input,
so a library call reads its inputs in its own precision without a cast kernel before it, and a kernel whose float32
output only library calls of the lower precision read writes it in that precision (:func:`narrowed_outputs`).
Autocast's casts of weights stay kernels of their own: a weight has no producer in the graph to fuse with.

Two operators fuse when one reads the other's output and no library call lies between them on another path (the
group would have to run both before and after it): here, when both have the same *library depth*, the number of
library calls on the longest path from the model's inputs. A generated kernel moves only what crosses its
boundary, each tensor once:

.. math::

    B_{kernel} = \sum_{i \in kernel} B_i - \sum_{(p, c) \text{ inside}} O_p - \sum_{p \text{ read inside only}} O_p

where :math:`B_i` is what operator :math:`i` moves in eager mode and :math:`O_p` the bytes of :math:`p`'s output;
its time is a streaming kernel's over those bytes (the operator model's, as for any kernel of that structure, or
the roofline's). Where a graph has convolutions, Inductor's inference heuristic (``decide_layout_opt``) runs them
channels last when the benchmarked speed-ups of its convolutions' kinds, weighted by their FLOPs, promise a gain:
then no convolution pays cuDNN's NCHW transposes (:func:`layout_optimized`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from dippm_nas.cost.learned.kernel_structure import KernelColumns
from dippm_nas.cost.pipeline.kernel_times import floored, kernel_columns
from dippm_nas.cost.pipeline.roofline import KERNEL_OVERHEAD_US, roofline
from dippm_nas.cost.pipeline.summary import Timed
from dippm_nas.cost.pipeline.table import FULL_BYTES, SHAPE_COLUMNS, NodeTable
from dippm_nas.graph import operators
from dippm_nas.hardware.registry import Device
from dippm_nas.precisions import Precision
from dippm_nas.request import Request

#: Inductor's benchmarked time of a convolution run channels last over its time contiguous, by kind (``GraphLowering
#: .decide_layout_opt``, PyTorch 2.x): grouped with more than one input channel per group, at most 64 channels in
#: and out, at least twice as many input channels as output channels with a window, and the others.
CHANNELS_LAST_TIME = {"grouped": 1.358, "small": 0.783, "in_out": 0.725, "default": 0.823}
#: A graph with this many operators or more per convolution keeps its layout (``decide_layout_opt``).
OPERATORS_PER_CONVOLUTION = 300


@dataclass(frozen=True, eq=False)
class Fusion:
    """The kernels of a compiled graph: each operator's kernel (``-1`` for a view, which launches none), whether it
    is a library call, the operator whose output it reads where it is a view (``source``: itself otherwise), and
    per kernel its operators' last (where its time is charged) and a member that leads it (its reduction where it
    has one: what the kernel's structure is most like)."""

    kernel: np.ndarray
    library: np.ndarray
    source: np.ndarray
    last: np.ndarray
    lead: np.ndarray

    @property
    def kernels(self) -> int:
        """How many kernels the compiled graph launches."""
        return len(self.last)

    @property
    def generated(self) -> np.ndarray:
        """Which kernels Inductor generates (the others are library calls)."""
        return ~self.library[self.last]


def _root(parent: list[int], i: int) -> int:
    while parent[i] != i:
        parent[i] = parent[parent[i]]
        i = parent[i]
    return i


def fusion(table: NodeTable) -> Fusion:
    """The kernels ``torch.compile`` launches for the graph of ``table`` (computed once per table)."""
    return table.derived("fusion", lambda: _fusion(table))


def _fusion(table: NodeTable) -> Fusion:
    n = len(table)
    library = operators.kind_table().has_library[table.kind] & ~table.is_view
    producers: list[list[int]] = [[] for _ in range(n)]
    for p, c in table.edges.tolist():
        producers[c].append(p)
    source = list(range(n))
    depth = [0] * n
    parent = list(range(n))
    for i in range(n):
        real = [source[p] for p in producers[i]]
        depth[i] = max((depth[p] + int(library[p]) for p in real), default=0)
        if table.is_view[i]:
            source[i] = real[0] if len(real) == 1 else i
            continue
        if library[i]:
            continue
        for p in real:
            if not library[p] and not table.is_view[p] and depth[p] == depth[i]:
                parent[_root(parent, p)] = _root(parent, i)
    runs = np.flatnonzero(~table.is_view)
    ids: dict[int, int] = {}
    kernel = np.full(n, -1, dtype=np.int64)
    for i in runs.tolist():
        kernel[i] = ids.setdefault(_root(parent, i), len(ids))
    last = np.zeros(len(ids), dtype=np.int64)
    lead = np.full(len(ids), -1, dtype=np.int64)
    reduces = np.asarray(operators.kind_table().kernel)[table.kind] != "elementwise"
    for i in runs.tolist():
        k = kernel[i]
        last[k] = i
        if lead[k] < 0 or (reduces[i] and not reduces[lead[k]]):
            lead[k] = i
    return Fusion(kernel, library, np.asarray(source, dtype=np.int64), last, lead)


def boundary_bytes(table: NodeTable, fused: Fusion, moved: np.ndarray, out_bytes: np.ndarray,
                   narrowed: np.ndarray | None = None) -> np.ndarray:
    """Per kernel, the bytes it moves: its operators' eager bytes (``moved``) less each output read inside the
    kernel, and less the write of each output nothing outside the kernel reads or the model returns (``out_bytes``:
    each operator's output bytes); ``narrowed``: per operator, the bytes its output's write saves where a generated
    kernel writes it (:func:`narrowed_outputs`)."""
    source, kernel = fused.source, fused.kernel
    outside = np.zeros(len(kernel), dtype=bool)
    outside[source[table.outputs]] = True
    saved = np.zeros(fused.kernels)
    for p, c in table.edges.tolist():
        s = source[p]
        if kernel[c] < 0 or kernel[s] < 0:
            continue
        if kernel[s] == kernel[c] and not fused.library[c]:
            saved[kernel[c]] += out_bytes[s]  # read from registers, not memory
        else:
            outside[s] = True
    written_inside = (kernel >= 0) & ~outside & ~fused.library
    np.add.at(saved, kernel[written_inside], out_bytes[written_inside])  # never written
    if narrowed is not None:
        written = (kernel >= 0) & outside & ~fused.library
        np.add.at(saved, kernel[written], narrowed[written])
    total = np.zeros(fused.kernels)
    runs = kernel >= 0
    np.add.at(total, kernel[runs], moved[runs])
    return np.maximum(total - saved, 0.0)


def narrowed_outputs(table: NodeTable, fused: Fusion) -> np.ndarray:
    """Which operators' float32 outputs under autocast a compiled graph writes in the lower precision: those that
    only library calls of the lower precision read (the cast each of them makes of it fuses into the producer)."""
    lower_library = table.autocast.lower & fused.library
    read_lower, read = np.ones(len(table), dtype=bool), np.zeros(len(table), dtype=bool)
    for p, c in table.edges.tolist():
        if not table.is_view[c]:  # a view's readers are edges of their own, from the view's source
            s = fused.source[p]
            read[s] = True
            read_lower[s] &= bool(lower_library[c])
    read_lower[fused.source[table.outputs]] = False
    return table.autocast.stays_f32 & read & read_lower & ~fused.library


def layout_optimized(table: NodeTable) -> bool:
    """Whether Inductor runs the graph's convolutions channels last: it has convolutions, not too few for its size,
    and their FLOPs weighted by :data:`CHANNELS_LAST_TIME` come to no more than their FLOPs (decided once per
    table)."""
    return table.derived("layout optimized", lambda: _layout_optimized(table))


def _layout_optimized(table: NodeTable) -> bool:
    conv = (table.category == operators.category_names().index("conv")) & (table.gemm[:, 0] > 0)
    if not conv.any() or len(table) >= OPERATORS_PER_CONVOLUTION * int(conv.sum()):
        return False
    groups, _, out_per_group, depth = table.gemm[conv].T
    window = table.shape_attrs[conv, SHAPE_COLUMNS.index("kernel_h")] * np.maximum(
        table.shape_attrs[conv, SHAPE_COLUMNS.index("kernel_w")], 1.0)
    in_per_group = depth / np.maximum(window, 1.0)
    out = out_per_group * groups
    kind = np.select([(groups > 1) & (in_per_group > 1), (out <= 64) & (in_per_group <= 64),
                      (out * 2 <= in_per_group) & (table.shape_attrs[conv, SHAPE_COLUMNS.index("kernel_h")] > 1)],
                     [CHANNELS_LAST_TIME["grouped"], CHANNELS_LAST_TIME["small"], CHANNELS_LAST_TIME["in_out"]],
                     CHANNELS_LAST_TIME["default"])
    flops = table.flops[conv]
    return float((flops * kind).sum()) <= float(flops.sum())


def eager_request(table: NodeTable, request: Request) -> Request:
    """The eager request whose library calls a compiled graph's are: channels last where Inductor chooses it."""
    return replace(request, mode="eager", layout="nhwc" if layout_optimized(table) else request.layout)


def generated_kernels(eager: Timed, request: Request) -> KernelColumns:
    """The kernels Inductor generates for the graph of ``eager`` (its timing for :func:`eager_request`), as the
    operator model reads them for ``request``: each one streaming kernel over its boundary bytes, with its
    operators' FLOPs, shaped as its lead operator."""
    table, precision = eager.table, request.precision
    columns = kernel_columns(table, eager.roofline.peak, request.gpu, precision)
    lead, moved, flops = table.derived(("generated kernels", precision.name),
                                       lambda: _generated_traffic(table, precision, columns))
    return replace(columns.take(lead), moved=moved, flops=flops)


def _generated_traffic(table: NodeTable, precision: Precision, columns: KernelColumns
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per generated kernel, its lead operator, its boundary bytes and its FLOPs: the graph's and the precision's
    alone (``columns``' bytes are), so a table keeps them."""
    fused = fusion(table)
    narrowed = None
    if precision.autocast:
        narrowed = narrowed_outputs(table, fused) * table.f32_written * (FULL_BYTES - precision.element_bytes)
    traffic = boundary_bytes(table, fused, columns.moved, table.f32_written * columns.element_bytes, narrowed)
    flops = np.zeros(fused.kernels)
    runs = fused.kernel >= 0
    np.add.at(flops, fused.kernel[runs], table.flops[runs])
    generated = np.flatnonzero(fused.generated)
    return fused.lead[generated], traffic[generated], flops[generated]


def compiled(eager: Timed, request: Request,
             kernel_seconds: Callable[[KernelColumns, Device], np.ndarray] | None = None) -> Timed:
    """The graph of ``eager`` (its timing for :func:`eager_request`) as its compiled kernels run for ``request``:
    each library call's time as eager's less the casts of its inputs, each generated kernel's over its boundary
    bytes, by ``kernel_seconds`` (the operator model's
    :meth:`~dippm_nas.cost.learned.operator_network.OperatorModel.seconds`; None: the roofline's), charged at its
    last operator; the host issues each kernel once (Inductor's wrapper calls them in order), or never where the
    pass is replayed as a CUDA graph."""
    return compiled_many([eager], request, kernel_seconds)[0]


def compiled_many(eager: Sequence[Timed], request: Request,
                  kernel_seconds: Callable[[KernelColumns, Device], np.ndarray] | None = None) -> list[Timed]:
    """:func:`compiled` of several graphs, ``kernel_seconds`` run once over all their generated kernels (a
    population's candidates, scored together)."""
    if not eager:
        return []
    rows = [generated_kernels(timed, request) for timed in eager]
    everything = rows[0] if len(rows) == 1 else KernelColumns.concatenate(rows)
    floor = np.maximum(everything.flops / everything.peak, everything.moved / (request.gpu.memory_bw_gbs * 1e9))
    floor = floor + KERNEL_OVERHEAD_US * 1e-6
    seconds = floor if kernel_seconds is None else floored(0.0, kernel_seconds(everything, request.gpu), floor)
    out = []
    for timed, end in zip(eager, np.cumsum([len(r) for r in rows])):
        table, fused = timed.table, fusion(timed.table)
        casts_s = timed.roofline.time_s - roofline(table, timed.request, casts_fused=True).time_s
        gpu_s = np.where(fused.library, timed.gpu_s - casts_s, 0.0)
        generated = np.flatnonzero(fused.generated)
        gpu_s[fused.last[generated]] = seconds[end - len(generated):end]
        host_s = np.zeros(len(table))
        if not request.replayed:  # autocast is traced away: no casts to dispatch
            host_s[fused.last] = request.host.issue_us(half=False) * 1e-6
        kernels = None if timed.kernels is None else replace(timed.kernels, seconds=gpu_s)
        out.append(Timed(table, request, timed.roofline, gpu_s, host_s, kernels))
    return out


def compile_note(timed: Timed) -> str:
    """What a compiled prediction assumed of the graph of ``timed``: its kernels, and its convolutions' layout."""
    table = timed.table
    fused = fusion(table)
    generated = int(fused.generated.sum())
    conv = bool((table.category == operators.category_names().index("conv")).any())
    casts = (", autocast's casts of their inputs fused into the kernels that produce them"
             if timed.request.precision.autocast else "")
    layout = ("; its convolutions run channels last (Inductor's layout heuristic), without cuDNN's NCHW "
              "transposes" if layout_optimized(table) else
              "; its convolutions keep their layout (Inductor's layout heuristic)" if conv else "")
    return (f"compile: {int((~table.is_view).sum())} operators launch as {fused.kernels} kernels, {generated} "
            f"generated by Inductor (each priced over the bytes crossing its boundary) and "
            f"{fused.kernels - generated} library calls priced as in eager mode{casts}{layout}")
