"""Stitching cached blocks gives the graph the whole model exports to, liveness included."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from dippm_nas import build_graph
from dippm_nas.cost.pipeline.table import node_table
from dippm_nas.graph.stitch import stitch


def _block(channels: int) -> nn.Module:
    return nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU())


def test_stitched_blocks_free_what_the_whole_model_frees():
    with torch.device("meta"):
        blocks = [_block(8).eval() for _ in range(3)]
        whole = build_graph(nn.Sequential(*blocks).eval(), (8, 16, 16), batch=2)
    stitched = stitch([build_graph(b, (8, 16, 16), batch=2) for b in blocks], "stitched")
    assert [n.kind for n in stitched.nodes] == [n.kind for n in whole.nodes]
    assert stitched.edges == whole.edges
    # eager keeps each block's output until the next block returns: not freed after its first reader
    np.testing.assert_array_equal(node_table(stitched).free_step, node_table(whole).free_step)
    per_block = len(stitched.nodes) // 3
    assert node_table(stitched).free_step[per_block - 1] == 2 * per_block - 1
    # the sums a prediction reads of every operator come from the blocks' own, and are the whole graph's
    assert stitched.flops == whole.flops and stitched.float_weight_dtypes == whole.float_weight_dtypes == {"float32"}
