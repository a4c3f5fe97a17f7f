"""The registry itself: categories, operator entries, the spellings that name them, the vocabulary.

As TVM registers an operator once and sets its attributes on it (``RELAY_REGISTER_OP(...).set_attr``),
an :class:`Operator` carries everything the library knows about one node kind: its category, its FLOP
rule, its autocast policy, the library its arithmetic runs in, how eager lays out its output, its GEMM
view and the per-node facts the cost models read. A :class:`Spelling` is one name it is recognised by
in Relax (``relax.nn.gelu``) or as an ATen operator kept as a generic node (``gelu.default``),
with the rules of that name where they differ from the kind's. Nothing here names an operator: each
family module (``conv.py``, ``gemm.py``, ...) registers its own.

Operators not registered still become nodes (kind ``other``, one FLOP per output element), so an
unfamiliar model never fails here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache, cached_property
from typing import TYPE_CHECKING, Protocol

import numpy as np

from dippm_nas.graph.tensor import Tensor

if TYPE_CHECKING:
    from dippm_nas.graph.eager_layout import Layout


class Node(Protocol):
    """What a per-node hook reads of a graph's node (:class:`dippm_nas.graph.model_graph.Node`)."""

    kind: str
    attrs: dict[str, object]
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    weights: tuple[Tensor, ...]
    flops: int

FlopRule = Callable[[list[Tensor], list[Tensor], Mapping[str, object]], int]
KernelRule = Callable[[list[Tensor], list[Tensor], Mapping[str, object]], int]
#: A layout rule: (input ``meta`` tensors, the operator's attributes, its output shapes) -> its Layout.
LayoutRule = Callable[[list, dict, list], "Layout"]

#: How ``torch.autocast`` runs an operator (PyTorch's "Autocast Op Reference", CUDA): in the lower
#: precision, casting float32 inputs first; in float32, casting lower-precision inputs up; or in the widest
#: type of its inputs, so a lower-precision activation added to a float32 one gives float32. The last
#: policy is the widest rule for operators that take float32 parameters with lower-precision inputs and stay
#: in the lower precision (cuDNN's batch norm); for any other "widest" operator a float32 parameter of more
#: than one element makes the output float32.
AUTOCAST_LOWER = "lower"
AUTOCAST_FLOAT32 = "float32"
AUTOCAST_WIDEST = "widest"
AUTOCAST_WIDEST_KEEPS_WEIGHT_DTYPE = "widest, keeps its input's dtype"
AUTOCAST_POLICIES = (AUTOCAST_LOWER, AUTOCAST_FLOAT32, AUTOCAST_WIDEST, AUTOCAST_WIDEST_KEEPS_WEIGHT_DTYPE)


@dataclass(frozen=True)
class Kernel:
    """A kind of kernel, as the operator-level cost model tells them apart: its position among
    :func:`kernels` is its one-hot column in that model's features (whose card records them), so a kind is
    added at the end.

    ``tiled``: its work is tiled GEMMs (matrix products, implicit-GEMM convolutions, attention's products),
    which the cost model expands into one candidate per output tile; ``loads_rows``: its library loads the
    operands by rows, so the tensor cores' vector loads need rows of a multiple of 16 bytes.
    """

    name: str
    tiled: bool = False
    loads_rows: bool = False


@dataclass(frozen=True)
class Category:
    """Which hardware unit bounds an operator, and the defaults of its kinds.

    ``counts_macs``: its FLOPs are multiply-accumulates, reported as MACs (as timm and DIPPM count them);
    ``library``: the library whose kernels run its arithmetic (``cudnn``, ``cublas``; a key of
    :data:`dippm_nas.precisions.TF32_FLAGS`), which may put it on tensor cores; None for the CUDA cores;
    ``takes_bias``: a bias add right after it is its epilogue (cuDNN's and cuBLAS's kernels fuse it);
    ``noun``: what a note calls one of its operators where it tells them apart (plural with an ``s``);
    ``kernel``: the kind of kernel (:class:`Kernel`) its operators run; ``cuda_core_kernel``: the one they run
    where their shapes keep them off the tensor cores (the ``cuda_cores`` hook of :class:`Operator`).
    """

    name: str
    counts_macs: bool = False
    library: str | None = None
    autocast: str = AUTOCAST_WIDEST
    takes_bias: bool = False
    is_view: bool = False
    layout: LayoutRule | None = None
    noun: str = ""
    kernel: str = "elementwise"
    cuda_core_kernel: str | None = None

    @property
    def index(self) -> int:
        """Its position among :func:`categories`: its one-hot column in the node features."""
        return categories().index(self)


@dataclass(frozen=True)
class Operator:
    """Everything the library knows about one node kind. ``None`` for a rule means the category's
    (``autocast``, ``library``, ``layout``) or none (the per-node hooks).

    Per-node hooks, read once per graph into the cost models' columns (:mod:`dippm_nas.cost.pipeline.table`):
    ``gemm``: (batches, M, N, K) of the GEMM it runs, as cuBLAS and cuDNN tile it; ``kernel_size``: the
    (height, width) of its window; ``cuda_cores``: whether this node's shapes keep it off the tensor cores
    its category may use; ``nchw_transpose``: the input elements cuDNN transposes to NHWC before it runs
    on tensor cores; ``math_fallback``: what eager's unfused fallback works on (see the attention family);
    ``serial_loop``: (iterations each thread runs one after another, thread blocks) of a kernel that loops
    over planes in every thread; ``rows``: (rows, row length) of the tensor a reduction or normalisation
    kernel works through one row at a time.
    """

    kind: str
    category: Category
    flops: FlopRule
    autocast: str | None = None
    library: str | None = None
    layout: LayoutRule | None = None
    #: It may copy inputs that are all contiguous (a broadcast batch is expanded first).
    copies_contiguous_inputs: bool = False
    #: ATen picks its kernel by its input's layout; the graph records ``eager_channels_last``.
    dispatch_on_layout: bool = False
    gemm: Callable[[Node], tuple[float, float, float, float]] | None = None
    kernel_size: Callable[[Node], tuple[float, float]] | None = None
    cuda_cores: Callable[[Node], bool] | None = None
    nchw_transpose: Callable[[Node], int] | None = None
    math_fallback: Callable[[Node], tuple[float, ...]] | None = None
    serial_loop: Callable[[Node], tuple[int, int]] | None = None
    rows: Callable[[Node], tuple[float, float]] | None = None
    #: the kind of kernel it runs, where it differs from its category's (a layer norm's rows, not planes)
    kernel: str | None = None

    @property
    def autocast_policy(self) -> str:
        """Its autocast policy, its category's where it has none of its own."""
        return self.autocast or self.category.autocast

    @property
    def math_library(self) -> str | None:
        """The library its arithmetic runs in, its category's where it names none."""
        return self.library or self.category.library

    @property
    def layout_rule(self) -> LayoutRule | None:
        """Its eager layout rule, its category's where it has none."""
        return self.layout or self.category.layout

    @property
    def kernel_group(self) -> str:
        """The kind of kernel it runs, its category's where it names none."""
        return self.kernel or self.category.kernel


@dataclass(frozen=True)
class Spelling:
    """One name an operator kind is recognised by, with that name's rules: a Relax operator
    (``relax.nn.gelu``) or an ATen (or ``onnx.``) operator kept as a generic node."""

    name: str
    operator: Operator
    flops: FlopRule
    kernels: KernelRule | None = None
    #: TVM's torch importer converts it into several operators where PyTorch eager runs one kernel:
    #: the torch frontend keeps it one node instead.
    kept_whole: bool = False
    layout: LayoutRule | None = None

    @property
    def kind(self) -> str:
        """The node kind it reads as."""
        return self.operator.kind

    @property
    def category(self) -> str:
        """The name of its kind's category."""
        return self.operator.category.name

    @property
    def layout_rule(self) -> LayoutRule | None:
        """Its own layout rule, else its kind's."""
        return self.layout or self.operator.layout_rule


_KERNELS: list[Kernel] = []
_CATEGORIES: list[Category] = []
_OPERATORS: dict[str, Operator] = {}
_RELAX: dict[str, Spelling] = {}
#: ATen operators that reach the graph as generic nodes (TVM could not convert them), by ATen name.
_ATEN: dict[str, Spelling] = {}

#: The kind and category of an operator the registry does not know.
OTHER = "other"


def _changed() -> None:
    categories.cache_clear()
    vocabulary.cache_clear()
    kind_table.cache_clear()
    fingerprint.cache_clear()


def declare_kernel(name: str, *, tiled: bool = False, loads_rows: bool = False) -> Kernel:
    """Declare a kind of kernel (its position is the order of declaration; :class:`Kernel`); raises
    ValueError for a name declared before."""
    if any(k.name == name for k in _KERNELS):
        raise ValueError(f"kernel {name!r} is declared twice")
    declared = Kernel(name, tiled, loads_rows)
    _KERNELS.append(declared)
    _changed()
    return declared


def kernels() -> tuple[Kernel, ...]:
    """Every kind of kernel in order of declaration."""
    return tuple(_KERNELS)


def declare_category(name: str, **defaults: object) -> Category:
    """Declare a category (its position is the order of declaration) with its kinds' defaults
    (:class:`Category`); raises ValueError for a name declared before."""
    if any(c.name == name for c in _CATEGORIES):
        raise ValueError(f"category {name!r} is declared twice")
    if defaults.get("autocast", AUTOCAST_WIDEST) not in AUTOCAST_POLICIES:
        raise ValueError(f"unknown autocast policy {defaults['autocast']!r}")
    declared = Category(name, **defaults)  # type: ignore[arg-type]
    _CATEGORIES.append(declared)
    _changed()
    return declared


@cache
def categories() -> tuple[Category, ...]:
    """Every category in order of declaration, ``other`` last."""
    return (*(c for c in _CATEGORIES if c.name != OTHER), category_named(OTHER))


def category_named(name: str) -> Category:
    """The category called ``name``; raises KeyError for one never declared."""
    for declared in _CATEGORIES:
        if declared.name == name:
            return declared
    raise KeyError(f"no operator category {name!r}")


def category_names() -> tuple[str, ...]:
    """The categories' names in order: the one-hot positions of the node features."""
    return tuple(c.name for c in categories())


def register(kind: str, category: Category, flops: FlopRule, *, relax: tuple[str, ...] = (),
             aten: tuple[str, ...] = (), kernels: KernelRule | None = None, kept_whole: bool = False,
             **attributes: object) -> Operator:
    """Register a node kind with its rules (:class:`Operator`) and the Relax and ATen names it is
    recognised by, each with the kind's FLOP rule (ATen ones with ``kernels`` and ``kept_whole``).
    A kind registered again must keep its category; its entry is replaced.

    >>> from dippm_nas.graph import operators
    >>> operators.lookup("relax.nn.gelu").kind, operators.lookup("relax.nn.gelu").category
    ('gelu', 'activation')
    """
    if category not in _CATEGORIES:
        raise ValueError(f"category {category.name!r} was never declared")
    if kind == OTHER:
        raise ValueError(f"{OTHER!r} is the kind of every operator the registry does not know")
    if attributes.get("autocast") not in (None, *AUTOCAST_POLICIES):
        raise ValueError(f"unknown autocast policy {attributes['autocast']!r}")
    previous = _OPERATORS.get(kind)
    if previous is not None and previous.category != category:
        raise ValueError(f"kind {kind!r} is registered with category {previous.category.name!r}, "
                         f"not {category.name!r}")
    entry = Operator(kind, category, flops, **attributes)  # type: ignore[arg-type]
    _OPERATORS[kind] = entry
    for name in relax:
        _RELAX[name] = Spelling(name, entry, flops)
    for name in aten:
        _ATEN[name] = Spelling(name, entry, flops, kernels, kept_whole)
    # spellings registered before keep their own rules but read the new entry
    for table in (_RELAX, _ATEN):
        for name, spelling in table.items():
            if spelling.operator.kind == kind and spelling.operator is not entry:
                table[name] = Spelling(name, entry, spelling.flops, spelling.kernels, spelling.kept_whole,
                                       spelling.layout)
    _changed()
    return entry


def unregister(kind: str) -> None:
    """Remove a node kind and every spelling of it (an operator registered for a while, as a test does);
    raises KeyError for a kind not registered."""
    del _OPERATORS[kind]
    for table in (_RELAX, _ATEN):
        for name in [n for n, spelling in table.items() if spelling.kind == kind]:
            del table[name]
    _changed()


def relax_kind(name: str) -> str:
    """The node kind of a Relax operator: its name without ``relax.`` and ``nn.``.

    >>> relax_kind("relax.nn.gelu"), relax_kind("relax.image.resize2d")
    ('gelu', 'image_resize2d')
    """
    return name.removeprefix("relax.").removeprefix("nn.").replace(".", "_")


def register_relax(names: tuple[str, ...], category: Category, flops: FlopRule, **attributes: object) -> None:
    """Register each Relax operator of ``names`` as a kind of its own (:func:`relax_kind`)."""
    for name in names:
        register(relax_kind(name), category, flops, relax=(name,), **attributes)


def spell_aten(names: tuple[str, ...], kind: str, flops: FlopRule | None = None, kernels: KernelRule | None = None,
               kept_whole: bool = False, layout: LayoutRule | None = None) -> None:
    """ATen names of a kind already registered, with their own rules where they differ from the kind's."""
    entry = _OPERATORS[kind]
    for name in names:
        _ATEN[name] = Spelling(name, entry, flops or entry.flops, kernels, kept_whole, layout)
    _changed()


def lookup(op_name: str) -> Spelling | None:
    """The spelling of a Relax operator by its full name, or None for one not registered (kind ``other``)."""
    return _RELAX.get(op_name)


def lookup_aten(aten_name: str) -> Spelling | None:
    """The spelling of an ATen (or ``onnx.``) operator kept as a generic node, or None for one not registered."""
    return _ATEN.get(aten_name)


def operator(kind: str) -> Operator | None:
    """The entry of a node kind, None for ``other`` or a kind not registered."""
    return _OPERATORS.get(kind)


def kept_whole_aten() -> tuple[str, ...]:
    """The ATen operators the torch frontend keeps one node (see :attr:`Spelling.kept_whole`)."""
    return tuple(name for name, spelling in _ATEN.items() if spelling.kept_whole)


@cache
def vocabulary() -> tuple[str, ...]:
    """Every node kind, sorted, then ``other``: the one-hot positions of the node features. Cached
    until the next registration, since every prediction reads it."""
    return tuple(sorted(_OPERATORS)) + (OTHER,)


@dataclass(frozen=True, eq=False)
class KindTable:
    """Per-kind attributes as arrays over :func:`vocabulary` (``other`` last), so that a cost model reads
    them for every node of a graph with one index: ``table.autocast[kinds]``."""

    category: np.ndarray  # index into categories()
    autocast: np.ndarray  # index into AUTOCAST_POLICIES
    library: tuple[str | None, ...]
    counts_macs: np.ndarray
    kernel: tuple[str, ...]
    #: the kernel it runs off the tensor cores (the ``cuda_cores`` hook), its own kernel where it names none
    cuda_core_kernel: tuple[str, ...]
    #: the per-node hooks each kind has, by hook name: kind indices
    hooks: Mapping[str, np.ndarray]

    @cached_property
    def has_library(self) -> np.ndarray:
        """A mask over the vocabulary: the kinds a library runs, which may put them on tensor cores."""
        return np.array([lib is not None for lib in self.library])


HOOKS = ("gemm", "kernel_size", "cuda_cores", "nchw_transpose", "math_fallback", "serial_loop", "rows")


@cache
def kind_table() -> KindTable:
    """The registry's per-kind attributes as arrays (:class:`KindTable`), until the next registration."""
    entries = [_OPERATORS.get(kind) for kind in vocabulary()]
    other = category_named(OTHER)
    cats = [e.category if e else other for e in entries]
    kernel = tuple(e.kernel_group if e else other.kernel for e in entries)
    cuda_core_kernel = tuple(c.cuda_core_kernel or k for c, k in zip(cats, kernel))
    unknown = sorted(set(kernel + cuda_core_kernel) - {k.name for k in _KERNELS})
    if unknown:
        raise ValueError(f"operators name kernels never declared: {', '.join(unknown)} (declare_kernel)")
    return KindTable(
        category=np.array([c.index for c in cats]),
        autocast=np.array([AUTOCAST_POLICIES.index(e.autocast_policy if e else other.autocast) for e in entries]),
        library=tuple(e.math_library if e else other.library for e in entries),
        counts_macs=np.array([c.counts_macs for c in cats]),
        kernel=kernel,
        cuda_core_kernel=cuda_core_kernel,
        hooks={hook: np.array([i for i, e in enumerate(entries) if e and getattr(e, hook) is not None], dtype=np.int64)
               for hook in HOOKS},
    )


@cache
def fingerprint() -> str:
    """A digest of what the node features' one-hot columns mean: the vocabulary and the categories, in
    order. Learned weights record it; a graph cache keys on it."""
    payload = [list(vocabulary()), list(category_names())]
    return hashlib.sha256(json.dumps(payload).encode()).hexdigest()


#: The category of every operator the registry does not know (kind ``other``).
OTHER_CATEGORY = declare_category(OTHER)
