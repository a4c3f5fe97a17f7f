"""The first stage: a graph as columns, every per-operator number the later stages and the learned features
read, taken from the operators once, with the rules of PyTorch eager, autocast, cuDNN and the caching
allocator that decide what each operator moves and holds.

A prediction has to take about a millisecond once the graph exists; walking the operators in Python once
per consumer (batch-1 copy, node features, roofline, liveness) would cost several. Here each column is read
from the operators (or their tensors) by one C-level pass, ``map`` into ``np.fromiter``, with no Python loop
per operator; everything after is numpy over the columns. It reads the graph at its own batch B and also
keeps the per-sample (batch-1) values the features are defined on: every activation of rank two or more has
B times the elements of its sample, and FLOPs are B times a sample's (the inverse of
:func:`dippm_nas.graph.batching.scale_batch`).

A table lives as long as its graph (:func:`node_table`), and so do the columns later stages derive from the
graph and a precision alone (:meth:`NodeTable.derived`): a graph predicted again, on another GPU or MIG
slice, reads them again, and only what depends on the GPU is computed anew.
"""

from __future__ import annotations

import itertools
import math
import weakref
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from functools import cache
from operator import attrgetter
from typing import TypeVar

import numpy as np

from dippm_nas.graph import operators
from dippm_nas.graph.model_graph import ModelGraph, Node
from dippm_nas.graph.tensor import DTYPE_BYTES, EAGER_HOLD, EAGER_INPLACE_OF, dtype_bytes
from dippm_nas.precisions import FULL_DTYPE, HALF_FORMATS, autocast_element_sizes

MAX_RANK = 5
_Derived = TypeVar("_Derived")
SPATIAL_ATTRS = ("strides", "dilation", "padding", "pool_size")
#: Operator attributes as numbers: kernel height and width, groups, number of inputs, output rank,
#: then the first two values of each spatial attribute.
SHAPE_COLUMNS = ("kernel_h", "kernel_w", "groups", "n_inputs", "rank",
                 *(f"{a}_{i}" for a in SPATIAL_ATTRS for i in range(2)))

_KERNEL_H, _KERNEL_W = SHAPE_COLUMNS.index("kernel_h"), SHAPE_COLUMNS.index("kernel_w")
_STRIDE_H, _STRIDE_W = SHAPE_COLUMNS.index("strides_0"), SHAPE_COLUMNS.index("strides_1")
_GROUPS = SHAPE_COLUMNS.index("groups")
_N_INPUTS, _RANK = SHAPE_COLUMNS.index("n_inputs"), SHAPE_COLUMNS.index("rank")
_SPATIAL = slice(SHAPE_COLUMNS.index("strides_0"), len(SHAPE_COLUMNS))
#: The attributes behind the shape columns other than the kernel's size (which a convolution's weight has).
_SHAPED_ATTRS = frozenset({*SPATIAL_ATTRS, "groups"})

#: PyTorch's caching allocator rounds every block up to 512 bytes.
ALLOCATOR_BLOCK_BYTES = 512
#: Bytes of an element outside autocast.
FULL_BYTES = dtype_bytes(FULL_DTYPE)
#: The half dtypes an operator's operands may be in: ``NodeTable.operand_half`` is a position here plus one.
HALF_OPERAND_DTYPES = tuple(HALF_FORMATS)
#: Bytes of an element of a half dtype, float16 and bfloat16 alike.
(HALF_BYTES,) = {dtype_bytes(dtype) for dtype in HALF_OPERAND_DTYPES}
_HALF_CODE = {dtype: i + 1 for i, dtype in enumerate(HALF_OPERAND_DTYPES)}


def _indices() -> tuple[dict[str, int], dict[str, int]]:
    """One-hot positions of kinds and categories, for the registry as it stands."""
    return _indices_of(operators.vocabulary(), operators.category_names())


@cache
def _indices_of(vocabulary: tuple[str, ...], categories: tuple[str, ...]) -> tuple[dict[str, int], dict[str, int]]:
    return {k: i for i, k in enumerate(vocabulary)}, {c: i for i, c in enumerate(categories)}


def _pair(value: object) -> tuple[float, float]:
    """The first two numbers of an attribute (strides, padding, ...), zeros where it has fewer."""
    if type(value) is tuple and len(value) >= 2 and type(value[0]) is int and type(value[1]) is int:
        return value[0], value[1]  # the usual case, e.g. strides (2, 2)
    if value is None:
        return 0.0, 0.0
    items = [float(v) for v in (value if isinstance(value, tuple | list) else (value,)) if isinstance(v, int | float)]
    items += [0.0, 0.0]
    return items[0], items[1]


def _per_sample_tails(shapes: list[tuple[int, ...]], batch: int) -> tuple[np.ndarray, np.ndarray]:
    """Each shape's rank, and the last ``MAX_RANK`` dimensions of one sample's, left-aligned and padded
    with zeros (``[len(shapes), MAX_RANK]``). A shape of rank two or more holds the batch in its first
    dimension that the batch divides (the first dimension where none does), as numpy columns: the batch
    leads almost always; attention's (3, B, heads, N, d) after the qkv split does not."""
    k = len(shapes)
    rank = np.fromiter(map(len, shapes), dtype=np.int64, count=k)
    dims = np.zeros((k, max(int(rank.max(initial=0)), 1)), dtype=np.int64)
    starts = np.repeat(np.cumsum(rank) - rank, rank)
    flat = np.fromiter(itertools.chain.from_iterable(shapes), dtype=np.int64, count=len(starts))
    dims[np.repeat(np.arange(k), rank), np.arange(len(flat)) - starts] = flat
    if batch > 1:
        divisible = (np.arange(dims.shape[1]) < rank[:, None]) & (dims % batch == 0)
        first = np.where(divisible.any(axis=1), divisible.argmax(axis=1), 0)
        batched = np.flatnonzero(rank >= 2)
        dims[batched, first[batched]] //= batch
    kept = np.minimum(rank, MAX_RANK)
    column = np.arange(MAX_RANK)
    rows, columns = np.nonzero(column < kept[:, None])
    tails = np.zeros((k, MAX_RANK))
    tails[rows, columns] = dims[rows, (rank - kept)[rows] + columns]
    return rank, tails


def _kernels(node: Node) -> int:
    """The kernels an operator launches: one unless its rule says (at this graph's batch: ATen's
    im2col launches one per sample)."""
    spelling = operators.lookup_aten(node.attrs["aten"]) if "aten" in node.attrs else None
    return spelling.kernels(list(node.inputs), list(node.outputs), node.attrs) if spelling and spelling.kernels else 1


def _operand_half(node: Node) -> int:
    """The half dtype an operator's arithmetic reads, as a code (``NodeTable.operand_half``): its first
    activation's, or its first weight's where it reads none; 0 for float32 or any other dtype."""
    operands = node.inputs or node.weights
    return _HALF_CODE.get(operands[0].dtype, 0) if operands else 0


def _hooked(kind: np.ndarray, hook: str) -> list[int]:
    """The positions of the operators whose registry entry has this per-node hook."""
    return np.flatnonzero(np.isin(kind, operators.kind_table().hooks[hook])).tolist()


def _hook(node: Node, hook: str):
    """A node's registry entry's per-node hook."""
    return getattr(operators.operator(node.kind), hook)


@dataclass(frozen=True, eq=False)
class NodeTable:
    """Columns over the operators, in graph order (views included). Byte counts of activations
    are kept apart by dtype because autocast changes float32 activations and nothing else."""

    batch: int
    kind: np.ndarray  # index into operators.vocabulary()
    category: np.ndarray  # index into operators.categories()
    is_view: np.ndarray
    flops: np.ndarray  # at the graph's batch
    f32_read: np.ndarray  # float32 activation elements read
    f32_written: np.ndarray  # float32 activation elements written
    autocast: _Autocast  # what those become under autocast (see :func:`_autocast`)
    other_bytes: np.ndarray  # activations of other dtypes read and written
    weight_numel: np.ndarray
    weight_bytes: np.ndarray
    weight_tensor_bytes: np.ndarray  # every weight tensor's bytes, in execution order (the allocator's requests)
    has_weights: np.ndarray
    nchw_transposed_numel: np.ndarray  # input elements cuDNN transposes to NHWC first (the ``nchw_transpose`` hook)
    cuda_core_conv: np.ndarray  # a node whose shapes keep it off the tensor cores (the ``cuda_cores`` hook)
    serial_iterations: np.ndarray  # iterations each thread runs in turn (the ``serial_loop`` hook), else 0
    serial_blocks: np.ndarray  # the thread blocks of such a kernel
    kernels: np.ndarray
    #: the half dtype its arithmetic reads, whatever the precision (a model built half): 0 for none, else a
    #: position in HALF_OPERAND_DTYPES plus one
    operand_half: np.ndarray
    math_fallback: np.ndarray  # [n, 6]: the ``math_fallback`` hook's columns, else zeros
    gemm: np.ndarray  # [n, 4]: batches, M, N, K of the GEMM an operator runs (the ``gemm`` hook), else zeros
    rows: np.ndarray  # [n, 2]: rows and row length a reduction or normalisation works through (``rows``), else zeros
    #: allocator bytes of the outputs, by the element size of the precision (:meth:`allocations`)
    alloc_bytes: dict[int | None, np.ndarray]
    f32_weight: np.ndarray  # reads a float32 weight (autocast's policy may follow it)
    #: by a lower element size, the allocator bytes autocast would save on the outputs, were they cast down
    f32_saving: dict[int, np.ndarray]
    free_step: np.ndarray  # the step after which a node's allocation is freed; -1 where it shares one
    input_bytes: float  # the model's inputs (autocast keeps them float32)
    # per sample (the batch-1 graph):
    flops1: np.ndarray
    read1: np.ndarray  # activation bytes read
    written1: np.ndarray
    out_dims1: np.ndarray  # [n, MAX_RANK]: the last MAX_RANK dimensions of the first output
    shape_attrs: np.ndarray  # [n, len(SHAPE_COLUMNS)], batch-free
    #: [edges, 2]: (producer, consumer) of each tensor passed between two operators, and the operators whose
    #: outputs the model returns: what the fusion stage follows
    edges: np.ndarray
    outputs: np.ndarray
    param_count: int
    param_bytes: int
    def __post_init__(self) -> None:
        # what later stages derived from the table and a precision alone, by what they derived it for: a cache, no
        # field of the table
        object.__setattr__(self, "_derived", {})

    def derived(self, key: Hashable, make: Callable[[], _Derived]) -> _Derived:
        """``make()``, computed once per ``key`` (a stage's name and the precision it is for) and kept with the
        table: columns that depend on the graph and the precision alone, whatever the GPU."""
        found = self._derived.get(key)
        if found is None:
            found = self._derived[key] = make()
        return found

    @property
    def half_operands(self) -> np.ndarray:
        """A mask: the operators whose arithmetic reads half tensors of the model's own (not autocast's)."""
        return self.operand_half > 0

    @property
    def nhwc_copy_numel(self) -> np.ndarray:
        """The input elements of which cuDNN holds an NHWC copy while a tensor-core convolution on NCHW
        activations runs: every 2-D one's but a 1x1, stride-1 one's, whose GEMM reads NCHW as it is."""
        shape = self.shape_attrs
        pointwise = ((shape[:, _KERNEL_H] == 1) & (shape[:, _KERNEL_W] == 1)
                     & (shape[:, _STRIDE_H] <= 1) & (shape[:, _STRIDE_W] <= 1))
        return np.where(pointwise, 0.0, self.nchw_transposed_numel)

    def allocations(self, element_bytes: int | None) -> np.ndarray:
        """The allocator's bytes for each operator's outputs: without autocast (``None``), or under autocast
        in a precision of ``element_bytes`` an element."""
        return self.alloc_bytes[element_bytes]

    def nhwc_output_bytes(self, element_bytes: int | None) -> np.ndarray:
        """At half precision (under autocast at ``element_bytes``, or a model's own half dtypes with None), the
        bytes of the NHWC output cuDNN writes and then transposes to NCHW for a convolution of one group whose
        channels keep it off its NCHW tensor-core kernels (an RGB stem), held while it runs; 0 for every
        other operator."""
        return np.where(self.cuda_core_conv & (self.shape_attrs[:, _GROUPS] == 1), self.allocations(element_bytes),
                        0.0)

    def __len__(self) -> int:
        return len(self.kind)

    @classmethod
    def of(cls, graph: ModelGraph) -> NodeTable:
        """Read every column from ``graph``'s operators; :func:`node_table` does it once per graph and keeps it."""
        kinds, categories = _indices()
        other_kind = kinds[operators.OTHER]
        nodes = graph.nodes
        n, batch = len(nodes), max(graph.batch, 1)
        attrs = list(map(attrgetter("attrs"), nodes))
        kind = np.fromiter(map(kinds.get, map(attrgetter("kind"), nodes), itertools.repeat(other_kind)),
                           dtype=np.int64, count=n)
        category = np.fromiter(map(categories.__getitem__, map(attrgetter("category"), nodes)), dtype=np.int64, count=n)
        flops = np.fromiter(map(attrgetter("flops"), nodes), dtype=np.float64, count=n)
        in_place, held = _eager_columns(attrs)
        first_outputs = [out[0].shape if out else () for out in map(attrgetter("outputs"), nodes)]
        rank, out_dims1 = _per_sample_tails(first_outputs, batch)
        tensors = _Tensors.of(nodes, batch)
        shape_attrs = np.zeros((n, len(SHAPE_COLUMNS)))
        shape_attrs[:, _GROUPS] = 1.0
        shape_attrs[:, _N_INPUTS], shape_attrs[:, _RANK] = tensors.lengths[0], rank
        for i in np.flatnonzero(~np.fromiter(map(_SHAPED_ATTRS.isdisjoint, attrs), dtype=bool, count=n)).tolist():
            get = nodes[i].attrs.get
            shape_attrs[i, _GROUPS] = float(get("groups", 1) or 1)
            shape_attrs[i, _SPATIAL] = (*_pair(get("strides")), *_pair(get("dilation")), *_pair(get("padding")),
                                        *_pair(get("pool_size")))
        f32_in, f32_out, _ = tensors.per_node(tensors.f32 * tensors.count)
        is_view, has_weights = category == operators.VIEW.index, tensors.lengths[2] > 0
        transposed = np.zeros(n)
        cuda_core_conv = np.zeros(n, dtype=bool)
        for i in _hooked(kind, "cuda_cores"):
            on_cuda_cores = _hook(nodes[i], "cuda_cores")(nodes[i])
            if on_cuda_cores is None:  # the hook does not apply to this node
                continue
            cuda_core_conv[i] = on_cuda_cores
            transpose = _hook(nodes[i], "nchw_transpose")
            if not on_cuda_cores and transpose is not None:
                transposed[i] = transpose(nodes[i])
        for i in _hooked(kind, "kernel_size"):
            window = _hook(nodes[i], "kernel_size")(nodes[i])
            if window is not None:
                shape_attrs[i, _KERNEL_H:_KERNEL_W + 1] = window
        f32_weight = tensors.per_node(tensors.f32 & (tensors.count > 1))[2] > 0
        autocast = _autocast(graph, kind, f32_weight, f32_in, f32_out)
        alloc = tensors.per_node(tensors.blocks(tensors.size))[1]
        f32_saving = {lower: tensors.per_node(tensors.f32 * (tensors.blocks(FULL_BYTES) - tensors.blocks(lower)))[1]
                      for lower in autocast_element_sizes()}
        nbytes, other_bytes, per_sample_bytes = (tensors.per_node(v) for v in (
            tensors.bytes, ~tensors.f32 * tensors.bytes, tensors.per_sample_count * tensors.size))
        columns = {"math_fallback": np.zeros((n, 6)), "gemm": np.zeros((n, 4)), "serial_loop": np.zeros((n, 2)),
                   "rows": np.zeros((n, 2))}
        for hook, column in columns.items():
            for i in _hooked(kind, hook):
                column[i] = _hook(nodes[i], hook)(nodes[i])
        # every other operator works along its output's last axis
        unhooked = np.flatnonzero(~np.isin(kind, operators.kind_table().hooks["rows"]))
        columns["rows"][unhooked, 1] = out_dims1[unhooked, np.maximum(np.minimum(rank[unhooked], MAX_RANK) - 1, 0)]
        lengths = np.maximum(columns["rows"][unhooked, 1], 1.0)
        columns["rows"][unhooked, 0] = tensors.per_node(tensors.count)[1][unhooked] / lengths
        serial = columns["serial_loop"]
        return cls(
            batch=graph.batch, kind=kind, category=category, is_view=is_view, has_weights=has_weights,
            kernels=np.fromiter(map(_kernels, nodes), dtype=np.float64, count=n), nchw_transposed_numel=transposed,
            operand_half=np.fromiter(map(_operand_half, nodes), dtype=np.int64, count=n),
            cuda_core_conv=cuda_core_conv, math_fallback=columns["math_fallback"], gemm=columns["gemm"],
            rows=columns["rows"],
            serial_iterations=serial[:, 0], serial_blocks=serial[:, 1],
            flops=flops, f32_read=f32_in, f32_written=f32_out, autocast=autocast,
            other_bytes=other_bytes[0] + other_bytes[1], weight_numel=tensors.per_node(tensors.count)[2],
            weight_bytes=nbytes[2], weight_tensor_bytes=tensors.bytes[tensors.role == 2].astype(np.float64),
            alloc_bytes=_alloc_bytes(alloc, f32_saving, autocast), f32_weight=f32_weight, f32_saving=f32_saving,
            free_step=_free_steps(graph, is_view, in_place, held),
            input_bytes=float(sum(t.nbytes for t in graph.inputs)), flops1=flops // batch,
            read1=per_sample_bytes[0], written1=per_sample_bytes[1],
            out_dims1=out_dims1, shape_attrs=shape_attrs,
            edges=graph.edge_array, outputs=np.asarray(graph.outputs, dtype=np.int64),
            param_count=graph.param_count, param_bytes=graph.param_bytes,
        )

    @classmethod
    def stitched(cls, tables: Sequence[NodeTable], graph: ModelGraph) -> NodeTable:
        """The table of ``graph``, the stitch of the graphs ``tables`` are of, in order
        (:func:`~dippm_nas.graph.stitch.stitch`), equal to :meth:`of` it and without reading its operators
        again: every per-operator column is its block's, and what follows the dataflow across blocks (autocast's
        precisions, when each allocation is freed) is worked out on the stitched graph."""
        def joined(column: str) -> np.ndarray:
            return np.concatenate([getattr(t, column) for t in tables])

        kind, is_view = joined("kind"), joined("is_view")
        f32_weight, f32_in, f32_out = joined("f32_weight"), joined("f32_read"), joined("f32_written")
        autocast = _autocast(graph, kind, f32_weight, f32_in, f32_out)
        f32_saving = {lower: np.concatenate([t.f32_saving[lower] for t in tables]) for lower in tables[0].f32_saving}
        alloc = np.concatenate([t.alloc_bytes[None] for t in tables])
        in_place, held = _eager_columns(list(map(attrgetter("attrs"), graph.nodes)))
        per_operator = {column: joined(column) for column in _PER_OPERATOR}
        return cls(
            batch=graph.batch, **per_operator, kind=kind, is_view=is_view, f32_read=f32_in, f32_written=f32_out,
            autocast=autocast, f32_weight=f32_weight, f32_saving=f32_saving,
            alloc_bytes=_alloc_bytes(alloc, f32_saving, autocast),
            free_step=_free_steps(graph, is_view, in_place, held), input_bytes=tables[0].input_bytes,
            edges=graph.edge_array, outputs=np.asarray(graph.outputs, dtype=np.int64),
            param_count=graph.param_count, param_bytes=graph.param_bytes,
        )


#: The columns of a :class:`NodeTable` that are each operator's own, whatever the graph around it.
_PER_OPERATOR = ("category", "flops", "other_bytes", "weight_numel", "weight_bytes", "weight_tensor_bytes",
                 "has_weights", "nchw_transposed_numel", "cuda_core_conv", "serial_iterations", "serial_blocks",
                 "kernels", "operand_half", "math_fallback", "gemm", "rows", "flops1", "read1", "written1", "out_dims1",
                 "shape_attrs")


def _eager_columns(attrs: list[dict[str, object]]) -> tuple[np.ndarray, np.ndarray]:
    """Each operator's ``eager_inplace_of`` and ``eager_hold`` attributes (0 where it has none), as columns."""
    return tuple(np.fromiter(map(dict.get, attrs, itertools.repeat(key), itertools.repeat(0)), dtype=np.int64,
                             count=len(attrs)) for key in (EAGER_INPLACE_OF, EAGER_HOLD))


def _alloc_bytes(alloc: np.ndarray, f32_saving: dict[int, np.ndarray], autocast: _Autocast
                 ) -> dict[int | None, np.ndarray]:
    """The allocator's bytes of each operator's outputs without autocast (None) and under it, by element size:
    an output that stays float32 saves nothing."""
    return {None: alloc} | {lower: alloc - np.where(autocast.stays_f32, 0.0, saving)
                            for lower, saving in f32_saving.items()}


@dataclass(frozen=True, eq=False)
class _Tensors:
    """The operators' tensors flattened, their inputs first, then their outputs, then their weights
    (each in graph order), so that sums per operator are numpy's, not a Python loop's. Element counts
    stay integers (int64) until they are summed, so the sums are exact."""

    lengths: np.ndarray  # [3, operators]: each operator's inputs, outputs and weights
    owner: np.ndarray  # role * operators + operator, per tensor
    count: np.ndarray  # elements
    size: np.ndarray  # bytes per element
    f32: np.ndarray
    per_sample_count: np.ndarray  # elements of one sample: a tensor of rank two or more holds the batch's

    @classmethod
    def of(cls, nodes: tuple[Node, ...], batch: int) -> _Tensors:
        groups = [*map(attrgetter("inputs"), nodes), *map(attrgetter("outputs"), nodes),
                  *map(attrgetter("weights"), nodes)]
        flat = list(itertools.chain.from_iterable(groups))
        shapes, dtypes, k = [t.shape for t in flat], [t.dtype for t in flat], len(flat)
        count = np.fromiter(map(math.prod, shapes), dtype=np.int64, count=k)
        batched = np.fromiter(map(len, shapes), dtype=np.int64, count=k) >= 2
        lengths = np.fromiter(map(len, groups), dtype=np.int64, count=len(groups))
        return cls(lengths=lengths.reshape(3, -1), owner=np.repeat(np.arange(len(groups)), lengths), count=count,
                   size=np.fromiter(map(DTYPE_BYTES.get, dtypes, itertools.repeat(4)), dtype=np.int64, count=k),
                   f32=np.fromiter(map("float32".__eq__, dtypes), dtype=bool, count=k),
                   per_sample_count=np.where(batched, count // batch, count))

    @property
    def role(self) -> np.ndarray:
        """0 for an input, 1 for an output, 2 for a weight."""
        return self.owner // self.lengths.shape[1]

    @property
    def bytes(self) -> np.ndarray:
        return self.count * self.size

    def blocks(self, size: int | np.ndarray) -> np.ndarray:
        """The allocator's bytes for each tensor at ``size`` bytes an element: whole blocks."""
        return -(-self.count * size // ALLOCATOR_BLOCK_BYTES) * ALLOCATOR_BLOCK_BYTES

    def per_node(self, values: np.ndarray) -> np.ndarray:
        """``values`` (one per tensor) summed per role and operator, ``[3, operators]`` float64."""
        return np.bincount(self.owner, weights=values, minlength=self.lengths.size).reshape(3, -1)


@dataclass(frozen=True, eq=False)
class _Autocast:
    """Each operator under autocast (:func:`_autocast`), as element counts: the precision's element size
    turns them into bytes (:meth:`moved`, :meth:`copies`)."""

    lower: np.ndarray  # runs in the lower precision
    float32: np.ndarray  # runs in float32
    stays_f32: np.ndarray  # its float32 output stays float32
    casts: np.ndarray  # cast kernels added
    f32_read: np.ndarray  # the float32 activation elements it reads that arrive in float32
    lower_read: np.ndarray  # ... that arrive in the lower precision, their producer's output cast down
    f32_in: np.ndarray
    f32_out: np.ndarray

    def moved(self, element_bytes: int, casts_fused: bool = False) -> np.ndarray:
        """What the float32 activations move under autocast at ``element_bytes`` an element, casts included:
        an operator that runs in one precision first casts inputs of the other (reading them and writing a
        copy), then reads the copy; a "widest" one reads each input as it is. ``casts_fused``: each cast is
        part of the kernel that produces its input (``torch.compile``), so the operator reads its inputs in its
        own precision and launches no cast."""
        h, f = element_bytes, FULL_BYTES
        cast_lower, cast_f32 = (h, f) if casts_fused else (f + h, h + f)
        read = np.where(self.lower, self.f32_in * h + self.f32_read * cast_lower,
                        np.where(self.float32, self.f32_in * f + self.lower_read * cast_f32,
                                 self.f32_read * f + self.lower_read * h))
        return read + self.f32_out * np.where(self.stays_f32, f, h)

    def copies(self, element_bytes: int) -> np.ndarray:
        """The copies autocast's casts of its inputs make, held while the operator runs."""
        return np.where(self.lower, self.f32_read * element_bytes,
                        np.where(self.float32, self.lower_read * FULL_BYTES, 0.0))


def _autocast(graph: ModelGraph, kind: np.ndarray, f32_weight: np.ndarray, f32_in: np.ndarray,
              f32_out: np.ndarray) -> _Autocast:
    """Each operator under autocast, by its kind's policy (:mod:`dippm_nas.graph.operators`): whether its
    output stays float32, which follows its producers in graph order, and the elements and casts that follow.

    Which input came from which producer the graph does not keep, so mixed producers count in proportion;
    the model's own inputs arrive in float32."""
    policy = operators.kind_table().autocast[kind]
    n = len(kind)
    half = policy == operators.AUTOCAST_POLICIES.index(operators.AUTOCAST_LOWER)
    float32 = policy == operators.AUTOCAST_POLICIES.index(operators.AUTOCAST_FLOAT32)
    keeps_weight_dtype = policy == operators.AUTOCAST_POLICIES.index(operators.AUTOCAST_WIDEST_KEEPS_WEIGHT_DTYPE)
    widest = ~half & ~float32
    entry = np.zeros(n, dtype=bool)
    entry[list(graph.entry_nodes)] = True
    src, dst = graph.edge_array.T
    settled = float32 | (widest & (entry | (f32_weight & ~keeps_weight_dtype)))
    stays = settled.tolist()
    rows, producers = graph.producers_by_consumer
    indegree = np.diff(rows)
    bounds, feeds = rows.tolist(), producers.tolist()
    for i in np.flatnonzero(widest & ~settled).tolist():  # producers come first
        for p in feeds[bounds[i]:bounds[i + 1]]:
            if stays[p]:
                stays[i] = True
                break
    stays_f32 = np.array(stays, dtype=bool)
    sources = indegree + entry
    share = np.divide(np.bincount(dst, weights=stays_f32[src], minlength=n) + entry, sources,
                      out=np.ones(n), where=sources > 0)
    f32_read, lower_read = f32_in * share, f32_in * (1 - share)
    casts = (half & (f32_read > 0)) | (float32 & (lower_read > 0))
    return _Autocast(half, float32, stays_f32, casts.astype(np.float64), f32_read, lower_read, f32_in, f32_out)


def _free_steps(graph: ModelGraph, is_view: np.ndarray, in_place: np.ndarray, held: np.ndarray) -> np.ndarray:
    """Liveness as PyTorch eager sees it: a view shares its input's allocation, and so does an
    operator eager runs in place (``eager_inplace_of``, where the frontend knows it); an allocation is
    freed after the last operator that reads it (or any view of it) or, later, once eager drops its last
    reference (a node's ``eager_hold``: a module call's argument, a local variable), outputs of the model
    at the end, and one nobody reads right after it is written. -1 marks a node without an allocation of
    its own. ``in_place`` and ``held`` are those two attributes per node (0 where a node has none)."""
    n = len(graph.nodes)
    src, dst = graph.edge_array.T
    producer_count = np.bincount(dst, minlength=n)
    producer = np.full(n, -1, dtype=np.int64)
    producer[dst] = src  # exact where a node has one producer, the only case read below
    shares = (is_view & (producer_count == 1)) | (in_place > 0)
    producer = np.where(in_place > 0, np.arange(n) - in_place, producer)
    chain = list(range(n))
    for i, p in zip(np.flatnonzero(shares).tolist(), producer[shares].tolist()):  # in graph order: views of views
        chain[i] = chain[p]
    owner = np.array(chain, dtype=np.int64)
    last_use = np.arange(n, dtype=np.int64)  # never read: freed at its own step
    np.maximum.at(last_use, owner[src], dst)
    np.maximum.at(last_use, owner, np.arange(n, dtype=np.int64) + held)
    last_use[shares] = -1
    last_use[owner[list(graph.outputs)]] = n
    return last_use


#: Each graph's table by the graph object's identity, dropped when the graph is: a graph is a frozen value,
#: and two equal graphs (copies made with ``dataclasses.replace``) are two objects with a table each.
_TABLES: dict[int, NodeTable] = {}


def keep_table(graph: ModelGraph, table: NodeTable) -> None:
    """Keep ``table`` for ``graph`` as :func:`node_table` would: a table made another way (:meth:`NodeTable.stitched`)
    that must equal :meth:`NodeTable.of` the graph."""
    key = id(graph)
    if key not in _TABLES:
        weakref.finalize(graph, _TABLES.pop, key, None)
    _TABLES[key] = table


def node_table(graph: ModelGraph) -> NodeTable:
    """The operators' numbers as columns, computed once per graph object and kept while it lives: every MIG
    slice, device and precision a graph is predicted for reads the same table. A copy made with
    ``dataclasses.replace`` (another batch, another name) is another graph and gets its own."""
    table = _TABLES.get(id(graph))
    if table is None:
        table = NodeTable.of(graph)
        keep_table(graph, table)
    return table
