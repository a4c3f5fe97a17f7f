"""A model's repeated blocks are exported once each and spliced: the graph is the whole export's."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from dippm_nas import build_graph
from dippm_nas.frontends import _repeated
from dippm_nas.frontends._repeated import (
    alike_blocks,
    export_spliced,
    meta_pass,
    repeated_blocks,
    structure_keys,
    whole_exports,
)


class Block(nn.Module):
    """A residual block with a local variable that outlives its reader, a kwarg and a float scale."""

    def __init__(self, width: int, scale: float = 1.0, gated: bool = False):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(*[layer for _ in range(4) for layer in (nn.Linear(width, width), nn.GELU())])
        self.scale, self.gated = scale, gated

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        shortcut = x
        h = self.mlp(self.norm(x))
        if self.gated:
            h = h * torch.sigmoid(h)
        if bias is not None:
            h = h + bias
        return shortcut + h * self.scale


class Repeats(nn.Module):
    """Six blocks alike but for their float scales, two gated ones, and a head."""

    def __init__(self, width: int = 32):
        super().__init__()
        self.stem = nn.Linear(16, width)
        self.blocks = nn.ModuleList([Block(width, scale=1.0 / (i + 1)) for i in range(6)])
        self.gated = nn.ModuleList([Block(width, gated=True) for _ in range(2)])
        self.bias = nn.Parameter(torch.zeros(width))
        self.head = nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x, bias=self.bias)
        for block in self.gated:
            x = block(x)
        return self.head(x.transpose(1, 2).mean(-1))


def _meta(module: nn.Module) -> nn.Module:
    return module.to("meta").eval()


def test_blocks_alike_but_for_floats_are_one_group_and_different_ones_another():
    model = _meta(Repeats())
    groups = repeated_blocks(model, (torch.zeros(2, 10, 16, device="meta"),))
    paths = sorted([i.path for i in g] for g in groups)
    assert paths == [[f"blocks.{i}" for i in range(6)]]  # the two gated blocks save too little
    assert groups[0][0].operators * 5 >= _repeated.MIN_SAVED_OPERATORS > groups[0][0].operators


def test_a_float_that_changes_what_runs_splits_the_group():
    class Branchy(Block):
        def forward(self, x, bias=None):
            return super().forward(x) if self.scale < 0.5 else x.relu() + super().forward(x)

    model = _meta(Repeats())
    model.blocks = nn.ModuleList([Branchy(32, scale=1.0 / (i + 1)) for i in range(6)]).to("meta")
    groups = alike_blocks(model, meta_pass(model, (torch.zeros(2, 10, 16, device="meta"),)),
                          structure_keys(model, floats=False))
    blocks = sorted([i.path for i in g] for g in groups if re.fullmatch(r"blocks\.\d", g[0].path))
    assert blocks == [["blocks.0", "blocks.1"], ["blocks.2", "blocks.3", "blocks.4", "blocks.5"]]


@pytest.mark.parametrize("model, shape", [
    ("repeats", (10, 16)), ("vit_tiny_patch16_224", None), ("resnet26", None),
    ("vit_small_patch16_rope_mixed_224", None),  # blocks take the rope as a keyword; repeat_interleave decomposed
    ("hrnet_w18_small", None),  # modules change the list of branches their caller reads
    ("efficientvit_b1", None),  # a block calls one module twice
    ("convit_tiny", None),  # the first forward computes and keeps the relative indices
])
def test_spliced_graph_equals_the_whole_export(model, shape):
    model = _meta(Repeats()) if model == "repeats" else model
    spliced = build_graph(model, shape, batch=2)
    with whole_exports():
        whole = build_graph(model, shape, batch=2)
    assert spliced == whole


def test_meta_pass_follows_a_module_called_on_many_inputs():
    """HRNet runs one activation on every branch and its modules change the list of branches: the pass
    runs through and finds its repeated branches."""
    from dippm_nas.frontends._timm import build_timm

    model = build_timm("hrnet_w18_small").eval()
    args = (torch.zeros(1, 3, 224, 224, device="meta"),)
    calls = meta_pass(model, args)
    assert calls is not None
    alike = {g[0].path: len(g) for g in alike_blocks(model, calls, structure_keys(model, floats=False))}
    assert alike["stage2.0.branches.0"] == 3  # the first branch of stages 2, 3 and 4


def test_splice_is_what_answers(monkeypatch):
    """The splice runs (its operator never reaches the importer), and a splice that fails falls back
    to the whole export."""
    model = _meta(Repeats())
    spliced = []
    real = _repeated.splice
    monkeypatch.setattr("dippm_nas.frontends._torch.splice", lambda s: spliced.append(s) or real(s))
    graph = build_graph(model, (10, 16), batch=2)
    assert len(spliced) == 1 and len(spliced[0].blocks) == 6
    assert not any("repeated_block" in n.op for n in graph.nodes)

    def broken(_):
        raise RuntimeError("a fault of the splice")

    monkeypatch.setattr("dippm_nas.frontends._torch.splice", broken)
    assert build_graph(model, (10, 16), batch=2) == graph


def test_a_model_with_weights_is_exported_whole():
    """A forward on the CPU would compute: only a model on the meta device is spliced."""
    exported = []
    assert export_spliced(Repeats().eval(), (torch.zeros(2, 10, 16),), lambda *a: exported.append(a)) is None
    assert not exported


def test_an_operator_tvm_lacks_is_decomposed_where_it_stands():
    """``var`` has no TVM converter: it is decomposed node by node, and the in-place ReLU beside it
    stays in place (the whole program is not traced again into its functional form)."""

    class Norm(nn.Module):
        def forward(self, x):
            y = torch.relu_(x * 2)
            return y / x.var(dim=-1, keepdim=True, unbiased=False)

    graph = build_graph(Norm(), (8,), batch=3)
    assert "variance" in graph.op_counts() and not any(n.kind == "other" for n in graph.nodes)
    assert not graph.warnings
    relu = next(n for n in graph.nodes if n.kind == "relu")
    assert relu.attrs.get("eager_inplace_of") == 1
