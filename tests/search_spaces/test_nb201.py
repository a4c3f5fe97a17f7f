"""NAS-Bench-201 as a search space: every cell, numbered as the benchmark numbers it, built and exported."""

import itertools
import random

import pytest

from dippm_nas.integration import HardwareCostModel
from search_spaces import get_search_space
from search_spaces.nb201 import (
    EDGES,
    OPERATIONS,
    RESOLUTION,
    STAGE_WIDTHS,
    arch_of_cell,
    cell_of_index,
    cell_string,
    edge_name,
    index_of_cell,
)


def test_every_cell_has_its_index_and_back():
    cells = [cell_string(dict(zip([edge_name(n, s) for n, s in EDGES], ops)))
             for ops in itertools.product(OPERATIONS, repeat=len(EDGES))]
    assert len(set(cells)) == 15_625
    indices = {index_of_cell(c) for c in cells}
    assert indices == set(range(15_625))
    for index in random.Random(0).sample(range(15_625), 200):
        assert index_of_cell(cell_of_index(index)) == index
    assert cell_of_index(0) == ("|avg_pool_3x3~0|+|nor_conv_1x1~0|skip_connect~1|+|nor_conv_1x1~0|skip_connect~1|"
                                "skip_connect~2|")  # the benchmark's own first cell
    with pytest.raises(ValueError, match="not a NAS-Bench-201 cell"):
        arch_of_cell("|conv~0|+|none~0|none~1|+|none~0|none~1|none~2|")


def _conv_macs(cell: str) -> int:
    """Multiply-accumulates of the cell's convolutions in the whole network, from its string alone."""
    ops = list(arch_of_cell(cell).values())
    per_pixel = ops.count("nor_conv_3x3") * 9 + ops.count("nor_conv_1x1")
    return sum(5 * per_pixel * c * c * (RESOLUTION >> stage) ** 2 for stage, c in enumerate(STAGE_WIDTHS))


@pytest.mark.parametrize("index", random.Random(1).sample(range(15_625), 4))
def test_a_sample_of_cells_exports_with_the_macs_its_string_counts(index):
    space = get_search_space("nb201")
    candidate = space.from_index(index)
    assert candidate.metadata == {"cell": cell_of_index(index), "nb201_index": index}
    cost = HardwareCostModel(device="rtx3090", batch=4, cost_model="analytical")
    graph = cost.graph(candidate)
    cells = [n for n in graph.nodes if n.category == "conv"]
    fixed = space.from_arch({edge_name(n, s): "none" for n, s in EDGES})  # the stem, reductions and head alone
    assert graph.macs - cost.graph(fixed).macs == 4 * _conv_macs(candidate.metadata["cell"])
    assert cells and cost.predict(graph).latency_ms > 0
