"""NAS-Bench-201 (Dong and Yang, ICLR 2020): one cell searched, repeated through a CIFAR network.

The network takes a 32x32 image: a 3x3 stem to 16 channels, three stages of five cells (16, 32 and 64
channels) with a residual reduction block between them (3x3 at stride 2, then 3x3; the shortcut average-pools
and projects), then batch norm, ReLU, global pooling and the classifier (100 classes: CIFAR-100, the task of
HELP's NAS-Bench-201 results). A cell has four nodes; node ``j`` is the sum over ``i < j`` of one operation of
node ``i``, so its six edges (``edge_j_i``) each take one of :data:`OPERATIONS`: ``none`` (multiplied by zero:
the benchmark's networks run it as a kernel), ``skip_connect``, ``nor_conv_1x1`` and ``nor_conv_3x3``
(ReLU, convolution, batch norm) and ``avg_pool_3x3``. That is 5**6 = 15,625 cells, written as NAS-Bench-201
writes them (``|nor_conv_3x3~0|+|skip_connect~0|none~1|+|...~0|...~1|...~2|``) and numbered as its API numbers
them (:func:`cell_of_index`, :func:`index_of_cell`: its order is not one a formula gives, so it ships as data,
``data/nb201_index.csv.gz``, from HELP's copy of the benchmark's list).
"""

from __future__ import annotations

import csv
import gzip
import itertools
from collections.abc import Iterator, Mapping
from functools import cache
from importlib import resources
from typing import Any

from torch import nn

from dippm_nas.errors import DippmError
from search_spaces.base import BlockSpec, Candidate, SearchSpace, register_block

OPERATIONS = ("none", "skip_connect", "nor_conv_1x1", "nor_conv_3x3", "avg_pool_3x3")
#: The edges of a cell as (node, input), in the order NAS-Bench-201's string lists them.
EDGES = ((1, 0), (2, 0), (2, 1), (3, 0), (3, 1), (3, 2))
STAGE_WIDTHS = (16, 32, 64)
CELLS_PER_STAGE = 5
RESOLUTION = 32
CLASSES = 100


def edge_name(node: int, source: int) -> str:
    """The parameter of the edge into ``node`` from ``source``: ``edge_2_0``."""
    return f"edge_{node}_{source}"


def cell_string(arch: Mapping[str, str]) -> str:
    """The cell as NAS-Bench-201 writes it.

    >>> cell_string({edge_name(n, s): "skip_connect" for n, s in EDGES})
    '|skip_connect~0|+|skip_connect~0|skip_connect~1|+|skip_connect~0|skip_connect~1|skip_connect~2|'
    """
    nodes = ["|" + "|".join(f"{arch[edge_name(n, s)]}~{s}" for m, s in EDGES if m == n) + "|" for n in (1, 2, 3)]
    return "+".join(nodes)


def arch_of_cell(text: str) -> dict[str, str]:
    """The edges of a cell written as NAS-Bench-201 writes it; a ValueError for a string that is not a cell.

    >>> arch_of_cell("|none~0|+|skip_connect~0|none~1|+|nor_conv_1x1~0|none~1|avg_pool_3x3~2|")["edge_3_2"]
    'avg_pool_3x3'
    """
    nodes = text.strip().split("+")
    arch: dict[str, str] = {}
    if len(nodes) != 3:
        raise ValueError(f"{text!r} is not a NAS-Bench-201 cell: it has {len(nodes)} nodes, not 3")
    for node, part in enumerate(nodes, start=1):
        edges = [e for e in part.strip("|").split("|") if e]
        if len(edges) != node:
            raise ValueError(f"{text!r} is not a NAS-Bench-201 cell: node {node} has {len(edges)} inputs")
        for edge in edges:
            op, _, source = edge.partition("~")
            if op not in OPERATIONS or not source.isdigit() or int(source) >= node:
                raise ValueError(f"{text!r} is not a NAS-Bench-201 cell: edge {edge!r}")
            arch[edge_name(node, int(source))] = op
    return arch


@cache
def _index_table() -> tuple[str, ...]:
    """The 15,625 cells in NAS-Bench-201's order."""
    data = resources.files("search_spaces").joinpath("data", "nb201_index.csv.gz").read_bytes()
    rows = csv.DictReader(gzip.decompress(data).decode().splitlines())
    return tuple(row["arch"] for row in sorted(rows, key=lambda r: int(r["nb201_index"])))


def cell_of_index(index: int) -> str:
    """The cell NAS-Bench-201 numbers ``index`` (0 to 15,624)."""
    table = _index_table()
    if not 0 <= index < len(table):
        raise ValueError(f"NAS-Bench-201 numbers its cells 0 to {len(table) - 1}, not {index}")
    return table[index]


def index_of_cell(text: str) -> int:
    """NAS-Bench-201's number of a cell."""
    return _cell_numbers()[cell_string(arch_of_cell(text))]


@cache
def _cell_numbers() -> dict[str, int]:
    return {cell: i for i, cell in enumerate(_index_table())}


def _relu_conv_bn(cin: int, cout: int, kernel: int, stride: int) -> nn.Sequential:
    return nn.Sequential(nn.ReLU(), nn.Conv2d(cin, cout, kernel, stride, kernel // 2, bias=False), nn.BatchNorm2d(cout))


class Zero(nn.Module):
    """The ``none`` operation: its input times zero, a kernel like any other in the benchmark's networks."""

    def forward(self, x):
        """``x`` multiplied by 0."""
        return x.mul(0.0)


def _operation(name: str, channels: int) -> nn.Module:
    return {"none": Zero, "skip_connect": nn.Identity,
            "nor_conv_1x1": lambda: _relu_conv_bn(channels, channels, 1, 1),
            "nor_conv_3x3": lambda: _relu_conv_bn(channels, channels, 3, 1),
            "avg_pool_3x3": lambda: nn.AvgPool2d(3, 1, 1, count_include_pad=False)}[name]()


class Cell(nn.Module):
    """Four nodes; each node after the first sums one operation of every node before it."""

    def __init__(self, arch: Mapping[str, str], channels: int):
        super().__init__()
        self.edges = nn.ModuleDict({edge_name(n, s): _operation(arch[edge_name(n, s)], channels) for n, s in EDGES})

    def forward(self, x):
        """The last node's features."""
        nodes = [x]
        for node in (1, 2, 3):
            nodes.append(sum(self.edges[edge_name(node, s)](nodes[s]) for s in range(node)))
        return nodes[-1]


class Reduction(nn.Module):
    """The residual block between stages: two ReLU-conv-BN 3x3 (the first at stride 2), the shortcut average
    pooled and projected."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.body = nn.Sequential(_relu_conv_bn(cin, cout, 3, 2), _relu_conv_bn(cout, cout, 3, 1))
        self.shortcut = nn.Sequential(nn.AvgPool2d(2, 2), nn.Conv2d(cin, cout, 1, bias=False))

    def forward(self, x):
        """The shortcut plus the body."""
        return self.shortcut(x) + self.body(x)


@register_block("nb201_stem")
def stem(width: int) -> nn.Module:
    """A 3x3 convolution to ``width`` channels and batch norm."""
    return nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width))


@register_block("nb201_cell")
def cell(cell: str, channels: int) -> nn.Module:
    """The cell NAS-Bench-201's string ``cell`` writes, at ``channels``."""
    return Cell(arch_of_cell(cell), channels)


@register_block("nb201_reduction")
def reduction(cin: int, cout: int) -> nn.Module:
    """The residual reduction block between two stages."""
    return Reduction(cin, cout)


@register_block("nb201_head")
def head(cin: int) -> nn.Module:
    """Batch norm, ReLU, global pooling and the classifier."""
    return nn.Sequential(nn.BatchNorm2d(cin), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, CLASSES))


class NB201Space(SearchSpace):
    """NAS-Bench-201's cells, each edge a parameter (``edge_2_0``, ...).

    >>> space = NB201Space()
    >>> candidate = space.from_index(0)
    >>> cell_string(candidate.arch) == cell_of_index(0), len(candidate.blocks)
    (True, 19)
    """

    name = "nb201"

    @property
    def parameters(self) -> dict[str, tuple[Any, ...]]:
        """One parameter per edge, each among :data:`OPERATIONS`."""
        return {edge_name(n, s): OPERATIONS for n, s in EDGES}

    def sample(self, trial: Any) -> Candidate:
        """Ask for every edge's operation."""
        return self.from_arch({name: self.choose(trial, name) for name in self.parameters})

    def extreme(self, largest: bool = False) -> Candidate:
        """The cheapest cell (every edge ``none``) or the costliest (every edge a 3x3 convolution); a ``fixed``
        edge stays fixed."""
        op = "nor_conv_3x3" if largest else "none"
        return self.from_arch({name: self.fixed.get(name, op) for name in self.parameters})

    def arch_text(self, arch: Mapping[str, Any]) -> str:
        """The cell as NAS-Bench-201 writes it: ``nb201:|nor_conv_3x3~0|+|...|`` names the candidate."""
        return cell_string({**self.fixed, **arch})

    def arch_of_text(self, text: str) -> dict[str, Any]:
        """The edges of a cell written as NAS-Bench-201 writes it."""
        try:
            return arch_of_cell(text)
        except ValueError as exc:
            raise DippmError(f"nb201: {exc}") from None

    def from_index(self, index: int) -> Candidate:
        """The candidate NAS-Bench-201 numbers ``index``."""
        return self.from_arch(arch_of_cell(cell_of_index(index)))

    def from_cell(self, text: str) -> Candidate:
        """The candidate of a cell as NAS-Bench-201 writes it."""
        return self.from_arch(arch_of_cell(text))

    def covering_archs(self) -> Iterator[dict[str, Any]]:
        """Every cell: each is a block of its own."""
        for ops in itertools.product(OPERATIONS, repeat=len(EDGES)):
            arch = dict(zip(self.parameters, ops))
            if all(self.fixed.get(k, v) == v for k, v in arch.items()):
                yield arch

    def from_arch(self, arch: Mapping[str, Any]) -> Candidate:
        """The stem, the three stages of cells with the reductions between them, and the head."""
        arch = {**self.fixed, **arch}
        self.check_names(arch)
        missing = [name for name in self.parameters if name not in arch]
        if missing:
            raise DippmError(f"nb201: the architecture names no operation for {', '.join(missing)}; give each of "
                             f"the six edges one of {', '.join(OPERATIONS)}.")
        text = cell_string(arch)
        blocks = [BlockSpec.of("nb201_stem", (3, RESOLUTION, RESOLUTION), width=STAGE_WIDTHS[0])]
        size, cin = RESOLUTION, STAGE_WIDTHS[0]
        for stage, width in enumerate(STAGE_WIDTHS):
            if stage:
                blocks.append(BlockSpec.of("nb201_reduction", (cin, size, size), cin=cin, cout=width))
                size //= 2
            blocks += [BlockSpec.of("nb201_cell", (width, size, size), cell=text, channels=width)] * CELLS_PER_STAGE
            cin = width
        blocks.append(BlockSpec.of("nb201_head", (cin, size, size), cin=cin))
        return Candidate(self.name, dict(arch), (3, RESOLUTION, RESOLUTION), tuple(blocks),
                         metadata={"cell": text, "nb201_index": index_of_cell(text)})
