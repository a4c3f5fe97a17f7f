"""Graphs whose nodes, edges, FLOPs and parameter bytes are known by hand."""

from __future__ import annotations

import contextlib
import io

import pytest
import torch
from conftest import estimate_of
from torch import nn

from dippm_nas import TensorSpec, build_graph
from dippm_nas.cost.learned.features import node_feature_names, static_features, to_pyg
from dippm_nas.cost.models.analytical import AnalyticalCostModel
from dippm_nas.cost.pipeline.table import NodeTable
from dippm_nas.graph.batching import scale_batch


def test_small_cnn_nodes_edges_flops_params(small_cnn):
    g = build_graph(small_cnn, (3, 8, 8), batch=1)
    assert [n.kind for n in g.nodes] == ["conv2d", "relu", "conv2d", "add", "adaptive_avg_pool2d", "reshape", "matmul"]
    # the residual add has two producers: relu (0->1) and conv2 (2)
    assert g.edges == ((0, 1), (1, 2), (1, 3), (2, 3), (3, 4), (4, 5), (5, 6))
    assert g.producers[3] == (1, 2)
    out = 8 * 8 * 8
    conv1 = 2 * out * 3 * 3 * 3 + out  # conv + fused bias
    conv2 = 2 * out * 8 * 3 * 3 + out
    assert [n.flops for n in g.nodes] == [conv1, out, conv2, out, out, 0, 2 * 8 * 10 + 10]
    assert g.param_count == (8 * 3 * 9 + 8) + (8 * 8 * 9 + 8) + (8 * 10 + 10)
    assert g.param_bytes == 4 * g.param_count
    assert g.outputs == (6,)
    assert g.nodes[0].attrs["strides"] == (1, 1) and g.nodes[0].attrs["padding"] == (1, 1, 1, 1)
    assert g.nodes[0].bytes_written == out * 4
    assert g.nodes[3].activation_bytes_read == 2 * out * 4


def test_transformer_block_nodes_and_flops(transformer_block):
    b, s, d, h, dff = 2, 16, 32, 4, 128
    g = build_graph(transformer_block, TensorSpec((s, d)), batch=b)
    kinds = [n.kind for n in g.nodes]
    assert kinds.count("matmul") == 4 and kinds.count("attention") == 1
    assert kinds.count("layer_norm") == 2 and kinds.count("gelu") == 1 and kinds.count("add") == 2
    matmuls = [n.flops for n in g.nodes if n.kind == "matmul"]
    tokens = b * s
    assert matmuls == [2 * tokens * d * 3 * d + tokens * 3 * d, 2 * tokens * d * d + tokens * d,
                       2 * tokens * d * dff + tokens * dff, 2 * tokens * dff * d + tokens * d]
    attention = next(n for n in g.nodes if n.kind == "attention")
    assert attention.flops == 2 * b * h * s * s * (d // h) * 2
    # both residual adds read two activations; the second reads the first add and fc2
    adds = [n for n in g.nodes if n.kind == "add"]
    assert len(g.producers[adds[1].id]) == 2 and adds[0].id in g.producers[adds[1].id]
    assert g.param_count == 2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * dff + dff) + (dff * d + d)


@pytest.mark.parametrize("cin,cout,k,stride,groups,hw",
                         [(3, 16, 3, 1, 1, 32), (16, 32, 5, 2, 1, 17), (32, 32, 3, 1, 32, 14)])
def test_conv_flops_textbook(cin, cout, k, stride, groups, hw):
    with torch.device("meta"):
        m = nn.Conv2d(cin, cout, k, stride=stride, groups=groups, bias=False)
    g = build_graph(m, (cin, hw, hw), batch=2)
    (node,) = g.nodes
    ho = (hw - k) // stride + 1
    assert node.flops == 2 * (2 * cout * ho * ho) * (cin // groups) * k * k
    assert node.macs == node.flops // 2


def test_linear_and_matmul_flops_textbook():
    with torch.device("meta"):
        m = nn.Linear(64, 48, bias=False)
    (node,) = build_graph(m, (10, 64), batch=3).nodes
    assert node.flops == 2 * 3 * 10 * 64 * 48

    class BatchedMatmul(nn.Module):
        def forward(self, a, b):
            return a @ b

    g = build_graph(BatchedMatmul(), [TensorSpec((4, 7, 5), name="a"), TensorSpec((4, 5, 9), name="b")], batch=2)
    (node,) = g.nodes
    assert node.flops == 2 * (2 * 4 * 7 * 9) * 5
    assert len(node.inputs) == 2 and not node.weights


def test_attention_flops_textbook():
    class Attention(nn.Module):
        def forward(self, q, k, v):
            return nn.functional.scaled_dot_product_attention(q, k, v)

    b, h, sq, sk, d = 2, 3, 10, 12, 16
    specs = [TensorSpec((h, sq, d), name="q"), TensorSpec((h, sk, d), name="k"), TensorSpec((h, sk, d), name="v")]
    g = build_graph(Attention(), specs, batch=b)
    (node,) = [n for n in g.nodes if n.kind == "attention"]
    assert node.flops == 2 * b * h * sq * sk * d + 2 * b * h * sq * sk * d


def _export_onnx(module: nn.Module, shape: tuple[int, ...], path) -> str:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        torch.onnx.export(module.eval(), (torch.randn(*shape),), str(path), dynamo=True)
    return str(path)


def test_torch_and_onnx_give_the_same_graph(tmp_path):
    from conftest import SmallCNN

    path = _export_onnx(SmallCNN(), (2, 3, 8, 8), tmp_path / "cnn.onnx")
    with torch.device("meta"):
        model = SmallCNN()
    g_torch = build_graph(model, (3, 8, 8), batch=2)
    g_onnx = build_graph(path, batch=2)
    assert g_onnx.flops == g_torch.flops
    assert g_onnx.param_bytes == g_torch.param_bytes
    assert len(g_onnx.edges) == len(g_torch.edges)
    assert _operators(g_onnx) == _operators(g_torch)


#: The same operator as two frontends spell it: ONNX's global average pooling is a mean over the spatial axes.
SPELLED_ALIKE = {"mean": "adaptive_avg_pool2d"}


def _operators(graph) -> list:
    """Each operator's kind and shapes, in an order that does not depend on how a frontend numbered them."""
    return sorted((SPELLED_ALIKE.get(n.kind, n.kind), [t.shape for t in n.inputs], [t.shape for t in n.outputs],
                   sorted(t.shape for t in n.weights)) for n in graph.nodes)


def test_torch_and_onnx_transformer_same_macs(tmp_path):
    """ONNX spells attention as matmul + softmax: the MACs agree, the signatures cannot."""
    from conftest import TransformerBlock

    block = TransformerBlock()
    for p in block.parameters():  # distinct values, so the exporter cannot merge equal initializers
        nn.init.normal_(p)
    path = _export_onnx(block, (2, 16, 32), tmp_path / "block.onnx")
    with torch.device("meta"):
        model = TransformerBlock()
    g_torch = build_graph(model, TensorSpec((16, 32)), batch=2)
    g_onnx = build_graph(path, batch=2)
    assert g_onnx.macs == g_torch.macs
    assert g_onnx.param_bytes == g_torch.param_bytes


def test_pyg_export(small_cnn):
    g = build_graph(small_cnn, (3, 8, 8), batch=4)
    data = to_pyg(g)
    assert data.x.shape == (len(g.nodes), len(node_feature_names()))
    assert data.edge_index.shape == (2, len(g.edges))
    feats = static_features(NodeTable.of(g))
    assert feats["batch"] == 4 and feats["dippm_convs"] == 2 and feats["dippm_dense"] == 1
    assert data.static.shape == (1, len(feats))


def test_featurizing_never_materializes_weights():
    """A ~1.6-billion-parameter MLP featurizes from the meta device in seconds, without memory."""
    with torch.device("meta"):
        model = nn.Sequential(*[nn.Linear(8192, 8192) for _ in range(24)])
    g = build_graph(model, (8192,), batch=1)
    assert g.param_count == 24 * (8192 * 8192 + 8192)
    assert all(p.device.type == "meta" for p in model.parameters())


class HardActivationsNormAndRoll(nn.Module):
    """MobileNetV3's activations, Swin V2's cosine attention and Swin's shifted windows."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.act = nn.Hardswish(inplace=True)
        self.gate = nn.Hardsigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.act(self.conv(x))
        y = torch.roll(y * self.gate(y.mean((2, 3), keepdim=True)), shifts=(1, 1), dims=(2, 3))
        return torch.linalg.vector_norm(y, dim=1)


def test_same_padding_convolution_reads_as_the_explicit_one():
    """``padding="same"`` exports as ``conv2d.padding``, which TVM's importer does not convert: it is
    decomposed as eager runs it, into one convolution with its groups, strides, dilation and padding, so a
    depthwise one (ConvMixer's) costs and reads as a depthwise one, not as a dense convolution with an
    unknown layout."""
    with torch.device("meta"):
        same = nn.Conv2d(64, 64, 7, padding="same", dilation=2, groups=64, bias=False)
        explicit = nn.Conv2d(64, 64, 7, padding=6, dilation=2, groups=64, bias=False)
    g_same, g_explicit = (build_graph(m, (64, 28, 28), batch=2) for m in (same, explicit))
    (a,), (b,) = g_same.nodes, g_explicit.nodes
    assert a.attrs["aten"] == "convolution.default" and a.kind == b.kind == "conv2d"
    assert a.outputs[0].shape == b.outputs[0].shape and a.flops == b.flops
    assert {k: a.attrs[k] for k in ("groups", "strides", "dilation", "padding")} == {
        "groups": 64, "strides": (1, 1), "dilation": (2, 2), "padding": (6, 6, 6, 6)}
    assert (b.attrs["groups"], tuple(b.attrs["padding"])) == (64, (6, 6, 6, 6))
    ta, tb = NodeTable.of(g_same), NodeTable.of(g_explicit)
    assert (ta.shape_attrs == tb.shape_attrs).all() and ta.cuda_core_conv.all()


def test_hard_activations_norm_and_roll_are_one_kernel_each_as_in_pytorch():
    """TVM spells hard swish as four elementwise operators, a vector norm as four and a roll over two
    axes as slices and two concatenations; PyTorch eager runs one kernel for each, and the graph
    says so."""
    g = build_graph(HardActivationsNormAndRoll(), (3, 8, 8), batch=2)
    kinds = [n.kind for n in g.nodes]
    assert kinds == ["conv2d", "hardswish", "mean", "hardsigmoid", "multiply", "roll", "norm"], kinds
    assert not g.warnings
    table = NodeTable.of(g)
    roll, hardswish = kinds.index("roll"), kinds.index("hardswish")
    assert table.kernels[hardswish] == table.kernels[roll] == table.kernels[-1] == 1
    assert g.nodes[-1].outputs[0].shape == (2, 8, 8)
    assert table.flops[hardswish] == 2 * 8 * 8 * 8  # one operation per output element
    assert g.nodes[roll].outputs[0].shape == (2, 8, 8, 8)


class OutlookUnfoldFold(nn.Module):
    """VOLO's outlook attention in small: values unfolded into 3x3 patches, weighted, folded back."""

    def __init__(self) -> None:
        super().__init__()
        self.v = nn.Conv2d(8, 8, 1)
        self.unfold = nn.Unfold(3, padding=1, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        patches = self.unfold(self.v(x)) * 2.0
        return nn.functional.fold(patches, output_size=(8, 8), kernel_size=3, padding=1, stride=2)


def test_unfold_and_fold_are_one_kernel_each_in_their_inputs_precision():
    """Decomposed, F.unfold is a padded copy, a gather and a copy, and F.fold a scatter into a float32
    zero buffer and a crop; eager runs im2col and col2im in the input's dtype, col2im as one kernel,
    im2col as a zeroing and one kernel per sample (at every batch the graph is scaled to)."""
    g = build_graph(OutlookUnfoldFold(), (8, 8, 8), batch=2)
    assert [n.kind for n in g.nodes] == ["conv2d", "index_tensor", "multiply", "index_put"] and not g.warnings
    im2col, col2im = g.nodes[1], g.nodes[3]
    assert (im2col.attrs["aten"], col2im.attrs["aten"]) == ("im2col.default", "col2im.default")
    assert im2col.outputs[0].shape == (2, 8 * 9, 16) and col2im.outputs[0].shape == (2, 8, 8, 8)
    assert im2col.flops == 0 and col2im.flops == 2 * 8 * 9 * 16  # col2im adds each patch element in
    table = NodeTable.of(g)
    assert table.kernels[1:].tolist() == [1 + 2, 1, 1]
    assert NodeTable.of(scale_batch(build_graph(OutlookUnfoldFold(), (8, 8, 8), batch=1), 16)).kernels[1] == 1 + 16
    # under autocast they stay in the convolution's half precision: 2 bytes per element
    assert table.allocations(2)[1] == 2 * 72 * 16 * 2 and table.allocations(2)[3] == 2 * 8 * 8 * 8 * 2


class HeadsByPermute(nn.Module):
    """Attention as timm writes it where it does not fuse: heads split by a permute, then matmuls."""

    def __init__(self, dim: int = 16, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.norm = nn.LayerNorm(dim // heads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        attn = (q @ k.transpose(-2, -1)).softmax(-1)
        y = (attn @ v).transpose(1, 2)  # a view that is not contiguous
        return self.norm(y).reshape(b, n, c)  # layer norm copies it first; its output views freely


def test_copies_pytorch_eager_makes_are_nodes():
    """Eager views a tensor only where its strides allow: the permuted q and k are copied before
    the batched GEMM folds their batch dimensions, v too, and layer norm copies its transposed input.
    A reshape of a contiguous tensor stays a free view."""
    g = build_graph(HeadsByPermute(), (10, 16), batch=2)
    kinds = [n.kind for n in g.nodes]
    copies = [n for n in g.nodes if n.kind == "layout_transform"]
    assert len(copies) == 4, kinds
    assert sorted(c.outputs[0].shape for c in copies) == [(2, 4, 4, 10), (2, 4, 10, 4), (2, 4, 10, 4), (2, 10, 4, 4)]
    assert all(c.category == "movement" for c in copies)
    assert kinds[-1] == "reshape" and g.nodes[-1].is_view
    for c in copies:  # each copy feeds the operator that needed it, so liveness sees it
        assert any(c.id in g.producers[n.id] for n in g.nodes)
    node_costs = estimate_of(AnalyticalCostModel(), g, "a100-40gb").nodes
    assert all(node_costs[c.id].time_ms > 0 and node_costs[c.id].bound != "free" for c in copies)


@pytest.mark.parametrize("layers,bidirectional", [(1, True), (2, False)])
def test_lstm_is_one_node_with_textbook_flops_and_a_kernel_count(layers, bidirectional):
    """TVM would unroll every time step into elementwise nodes; PyTorch runs one cuDNN call."""
    from dippm_nas.cost.pipeline.roofline import KERNEL_OVERHEAD_US
    from dippm_nas.graph.operators.recurrent import RECURRENT_POINTWISE_FLOPS

    steps, batch, d_in, hidden = 20, 4, 32, 48
    with torch.device("meta"):
        lstm = nn.LSTM(d_in, hidden, num_layers=layers, bidirectional=bidirectional, batch_first=True)
    graph = build_graph(lstm, (steps, d_in), batch=batch)
    (node,) = [n for n in graph.nodes if n.kind == "lstm"]
    assert len(graph.nodes) == 1 and not graph.warnings
    dirs = 2 if bidirectional else 1
    matmul = sum(2 * 4 * hidden * ((d_in if layer == 0 else dirs * hidden) + hidden)
                 for layer in range(layers)) * dirs
    pointwise = (RECURRENT_POINTWISE_FLOPS * 4 * hidden + hidden) * layers * dirs
    assert node.flops == steps * batch * (matmul + pointwise)
    kernels = layers * dirs * (1 + 2 * steps)
    assert NodeTable.of(graph).kernels.tolist() == [kernels]
    assert node.outputs[0].shape == (batch, steps, dirs * hidden)
    (cost,) = estimate_of(AnalyticalCostModel(), graph, "rtx4090", "fp32").nodes
    assert cost.time_ms >= kernels * KERNEL_OVERHEAD_US * 1e-3



class _Recurrent(nn.Module):
    def __init__(self, cls: type[nn.Module]) -> None:
        super().__init__()
        self.rnn = cls(32, 48, batch_first=True, bidirectional=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rnn(x)[0]


@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU])
def test_torch_and_onnx_recurrent_layers_cost_the_same(tmp_path, cls):
    """ONNX's LSTM/GRU (what Keras and Paddle LSTMs become) is one node with PyTorch's FLOPs and kernels."""
    torch.manual_seed(0)
    path = _export_onnx(_Recurrent(cls).eval(), (2, 20, 32), tmp_path / "rnn.onnx")
    g_torch = build_graph(_Recurrent(cls), (20, 32), batch=2)
    g_onnx = build_graph(path, batch=2)
    kind = "lstm" if cls is nn.LSTM else "gru"
    (a,), (b,) = ([n for n in g.nodes if n.kind == kind] for g in (g_torch, g_onnx))
    kernels = [NodeTable.of(g).kernels[g.nodes.index(n)] for g, n in ((g_torch, a), (g_onnx, b))]
    assert a.flops == b.flops and kernels == [2 * (1 + 2 * 20)] * 2
    assert not [w for w in g_onnx.warnings if "unknown" in w]

@pytest.mark.parametrize("conv", ["sage", "gcn", "gat", "gin"])
def test_adjacency_and_edge_index_give_the_same_pmgns_output(small_cnn, conv):
    """Training batches graphs through edge_index; one prediction uses the sparse adjacency."""
    from dippm_nas.cost.learned.features import adjacency, edge_index, node_feature_matrix
    from dippm_nas.cost.learned.pmgns_network import PMGNS

    torch.manual_seed(0)
    g = build_graph(small_cnn, (3, 8, 8), batch=2)
    x = node_feature_matrix(NodeTable.of(g))
    model = PMGNS(x.shape[1], 4, conv=conv, hidden=16).eval()
    nodes, graphs, static = torch.zeros(len(x), dtype=torch.long), torch.zeros(1, dtype=torch.long), torch.randn(1, 4)
    share = torch.rand(1, len(x))
    share /= share.sum()
    with torch.inference_mode():
        a = model(x, edge_index(g), nodes, graphs, static, share)
        b = model(x, adjacency(g), nodes, graphs, static, share)
    assert torch.allclose(a, b, atol=1e-5)
