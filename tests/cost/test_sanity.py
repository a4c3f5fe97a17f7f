"""The analytical model behaves as physics says it must."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import estimate_of, request_of
from torch import nn

from dippm_nas import build_graph, mig_table, predict_graph
from dippm_nas.cost.models.analytical import AnalyticalCostModel
from dippm_nas.cost.pipeline.host_queue import queued_latency
from dippm_nas.cost.pipeline.memory import peak_live, transient_bytes
from dippm_nas.cost.pipeline.power import IDLE_POWER_FRACTION
from dippm_nas.cost.pipeline.roofline import roofline
from dippm_nas.cost.pipeline.summary import summarize
from dippm_nas.cost.pipeline.table import NodeTable, node_table
from dippm_nas.graph.batching import scale_batch
from dippm_nas.graph.tensor import EAGER_HOLD, EAGER_INPLACE_OF
from dippm_nas.hosts import get_host_profile
from dippm_nas.precisions import PRECISIONS


def _peak_activations(table: NodeTable, precision: str = "fp32", runtime: tuple[int, int] | None = None) -> float:
    """Peak bytes of live tensors when the operators run in order; a view shares its input."""
    return peak_live(table, PRECISIONS[precision], *transient_bytes(table, PRECISIONS[precision], runtime))


@pytest.fixture(scope="module")
def resnet_graphs():
    return {b: build_graph("resnet18", batch=b) for b in (1, 8, 32)}


def test_latency_and_memory_grow_with_batch(resnet_graphs):
    preds = [predict_graph(resnet_graphs[b]) for b in (1, 8, 32)]
    assert preds[0].latency_ms < preds[1].latency_ms < preds[2].latency_ms
    assert preds[0].memory_mib < preds[1].memory_mib < preds[2].memory_mib
    assert preds[0].energy_j < preds[1].energy_j < preds[2].energy_j


def test_h100_faster_than_a100_and_7g_faster_than_1g(resnet_graphs):
    g = resnet_graphs[8]
    assert predict_graph(g, "h100-sxm").latency_ms < predict_graph(g, "a100-40gb").latency_ms
    assert predict_graph(g, "a100-40gb:7g.40gb").latency_ms < predict_graph(g, "a100-40gb:1g.5gb").latency_ms
    table = {row.profile: row for row in mig_table(g, "a100-40gb")}
    assert table["7g.40gb"].latency_ms < table["3g.20gb"].latency_ms < table["1g.5gb"].latency_ms
    assert all(row.fits for row in table.values())


def test_fp16_faster_than_fp32_for_matmul_bound_model():
    with torch.device("meta"):
        mlp = nn.Sequential(nn.Linear(4096, 4096), nn.GELU(), nn.Linear(4096, 4096))
    g = build_graph(mlp, (4096,), batch=512)
    fp32, fp16 = (predict_graph(g, precision=p, cost_model="analytical") for p in ("fp32", "fp16"))
    assert fp16.latency_ms < fp32.latency_ms / 4
    assert [c.bound for c in fp32.estimate.nodes if c.op == "matmul"] == ["compute", "compute"]


def test_memory_breakdown_adds_up(resnet_graphs):
    p = predict_graph(resnet_graphs[8])
    m = p.estimate.memory
    assert p.memory_mib == pytest.approx(m.total_mib)
    assert m.weights_mib == pytest.approx(resnet_graphs[8].param_bytes / 2**20)
    assert 0 < m.activations_mib < resnet_graphs[8].activation_bytes / 2**20


def test_autocast_holds_a_half_copy_of_a_weight_only_while_its_layer_runs():
    """Inference mode: autocast casts each float32 weight at every call and frees the copy after it."""
    with torch.device("meta"):
        mlp = nn.Sequential(nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 4096))
    g = build_graph(mlp, (4096,), batch=1)
    fp32, fp16 = (predict_graph(g, precision=p).estimate.memory for p in ("fp32", "fp16"))
    assert fp16.weights_mib == fp32.weights_mib == pytest.approx(2 * 4096 * 4097 * 4 / 2**20)
    # one layer's half copy (32 MiB) at a time, not both; activations of one sample are a few KiB
    assert fp16.activations_mib - fp32.activations_mib == pytest.approx(32, abs=2.1)


def test_cudnn_holds_an_nhwc_copy_of_the_input_of_a_3x3_convolution_not_of_a_1x1_nor_of_an_rgb_stem():
    """Under autocast on NCHW activations, cuDNN transposes a tensor-core convolution's input to NHWC
    and holds the copy while it runs; a 1x1, stride-1 convolution is a GEMM over NCHW as it is (the
    H100's peak allocated bytes), though its time is still charged the transposition."""
    def transient(kernel: int) -> tuple[float, float]:
        with torch.device("meta"):
            conv = nn.Conv2d(64, 64, kernel, padding=kernel // 2)
        table = NodeTable.of(build_graph(conv, (64, 32, 32), batch=1))
        workspace = transient_bytes(table, PRECISIONS["fp16"])[1]
        moved = roofline(table, request_of("a100-40gb", "fp16")).moved
        return float(workspace[0, 0]), float(moved[0])

    (copy3, moved3), (copy1, moved1) = transient(3), transient(1)
    assert copy3 == 64 * 32 * 32 * 2 and copy1 == 0
    assert moved1 - moved3 == pytest.approx(64 * 64 * (1 - 9) * (4 + 2 + 2))  # only the weights differ
    with torch.device("meta"):
        stem = nn.Conv2d(3, 64, 3, padding=1)  # off the NCHW tensor-core kernels: an NHWC output instead
    workspace = transient_bytes(NodeTable.of(build_graph(stem, (3, 32, 32), batch=1)), PRECISIONS["fp16"])[1]
    assert workspace[0].tolist()[:2] == [0.0, 64 * 32 * 32 * 2]


def test_attention_no_fused_kernel_takes_runs_as_math():
    """PyTorch's fused attention kernels take 4-D query, key and value only. Attention over 5-D blocks
    of heads (NesT, Twins) runs ATen's math fallback, which keeps the scores and their softmax in
    memory at once; from PyTorch 2.5 on it upcasts half inputs to float32 and multiplies on the CUDA
    cores, before that it stays in half on the tensor cores."""
    from dataclasses import replace

    import numpy as np

    from dippm_nas import TensorSpec
    from dippm_nas.hardware import get_device

    class Attention(nn.Module):
        def forward(self, q, k, v):
            return nn.functional.scaled_dot_product_attention(q, k, v)

    batch, blocks, heads, tokens, dim = 256, 4, 2, 64, 32
    graphs = {rank: build_graph(Attention(), [TensorSpec(shape, name=n) for n in "qkv"], batch=batch) for rank, shape
              in ((4, (blocks * heads, tokens, dim)), (5, (heads, blocks, tokens, dim)))}
    tables = {rank: NodeTable.of(g) for rank, g in graphs.items()}
    assert not tables[4].math_fallback.any()
    scores, q, k, v, out, mask = tables[5].math_fallback[tables[5].math_fallback[:, 0] > 0][0]
    assert scores == batch * blocks * heads * tokens * tokens and q == k == v == out == scores / tokens * dim
    model, gpu = AnalyticalCostModel(), get_device("a100-40gb")

    def attention_cost(rank: int, torch_version: tuple[int, int] | None):
        table, request = tables[rank], request_of(gpu, "fp16", torch_version)
        timed = model.timed(table, request)
        (cost,) = [c for c, n in zip(summarize(graphs[rank], timed, request, model.name).nodes, graphs[rank].nodes)
                   if n.category == "attention"]
        return cost, _peak_activations(table, "fp16", torch_version)

    (fused, _), (upcast, upcast_peak), (half, half_peak) = (
        attention_cost(4, None), attention_cost(5, None), attention_cost(5, (2, 4)))
    unfused_peak = _peak_activations(replace(tables[5], math_fallback=np.zeros_like(tables[5].math_fallback)), "fp16")
    # float32 scores, softmax, _safe_softmax's bool mask and result live at once
    assert 13 * scores <= upcast_peak - unfused_peak <= 13 * scores + 8 * q + 4 * k + 4 * v
    assert 4 * scores <= half_peak - unfused_peak <= 4 * scores + 2 * q  # half scores and softmax
    assert upcast.time_ms >= upcast.flops / (gpu.fp32_tflops * 1e12) * 1e3
    assert upcast.time_ms > 2 * half.time_ms > 2 * fused.time_ms
    assert upcast.bytes > fused.bytes + 30 * scores and half.bytes > fused.bytes + 8 * scores


def test_gpu_waits_on_the_host_when_its_operators_are_short():
    """One host thread issues the operators, the GPU runs each once issued and once the previous one
    ended: the closed form is the step-by-step queue, and a small batch is bound by the host."""
    rng = np.random.default_rng(0)
    time_s, host_s = rng.exponential(1e-5, 300), rng.exponential(1e-5, 300)
    scales = np.array([0.5, 1.0, 3.0])
    expected = []
    for scale in scales:
        issued = end = 0.0
        for t, h in zip(time_s * scale, host_s):
            issued += h
            end = max(issued, end) + t
        expected.append(end)
    assert queued_latency(host_s, [time_s], gpu_scales=[scales]) == pytest.approx(expected)
    import torch as torch_module  # the same function over torch tensors, as the operator model's training runs it
    assert float(queued_latency(torch_module.from_numpy(host_s), [torch_module.from_numpy(time_s)])) == \
        pytest.approx(expected[1])

    g = build_graph("resnet18", batch=1)
    model, request = AnalyticalCostModel(), request_of("h100-sxm", "fp16")
    gpu = request.gpu
    small = model.timed(node_table(g), request)
    host = float(small.host_s.sum())
    assert small.latency_s >= host > 3 * small.gpu_s.sum() and small.host_wait_share() > 0.6
    profile = get_host_profile()
    assert host == pytest.approx((~node_table(g).is_view).sum() * profile.issue_us(half=True) * 1e-6
                                 + node_table(g).is_view.sum() * profile.view_us * 1e-6)
    large = model.timed(node_table(scale_batch(g, 1024)), request)
    assert large.latency_s == pytest.approx(large.gpu_s.sum(), rel=0.01) and large.host_wait_share() < 0.01
    # the GPU idles while it waits: energy is the idle power over the latency plus the busy units' share
    estimate = summarize(g, small, request, model.name)
    idle_w = IDLE_POWER_FRACTION * gpu.tdp_w
    assert estimate.latency_ms == pytest.approx(small.latency_s * 1e3)
    assert estimate.energy_j == pytest.approx(small.latency_s * idle_w
                                              + small.roofline.busy_s.sum() * (gpu.tdp_w - idle_w))


class _ReluChain(nn.Module):
    """Six ReLUs in a row: each output is read once, by the next."""

    def forward(self, x):
        for _ in range(6):
            x = torch.relu(x)
        return x


def test_peak_activations_follow_liveness():
    """A chain frees as it goes; a long skip keeps its tensor alive to the end."""

    class Skip(nn.Module):
        def forward(self, x):
            y = x
            for _ in range(6):
                y = torch.relu(y)
            return y + torch.relu(x)

    elems = 1024 * 1024
    chain = _peak_activations(NodeTable.of(build_graph(_ReluChain(), (elems,), batch=1)))
    skip = _peak_activations(NodeTable.of(build_graph(Skip(), (elems,), batch=1)))
    assert chain == 3 * elems * 4  # input + the tensor being read + the one being written
    assert skip > chain


def test_a_module_call_holds_its_arguments_until_it_returns():
    """``x = self.stages(x)``: the caller's ``x`` keeps the stem's output alive through every stage,
    as PyTorch eager does; without the module call it is freed after its last reader."""

    class Held(nn.Module):
        def __init__(self):
            super().__init__()
            self.stages = _ReluChain()

        def forward(self, x):
            return self.stages(torch.relu(x))

    class Inline(nn.Module):
        def forward(self, x):
            return _ReluChain.forward(self, torch.relu(x))

    elems = 1024 * 1024
    held_graph = build_graph(Held(), (elems,), batch=1)
    stem = held_graph.nodes[0]
    assert stem.attrs[EAGER_HOLD] == len(held_graph.nodes) - 1  # until the last relu of the stages
    held = _peak_activations(NodeTable.of(held_graph))
    inline = _peak_activations(NodeTable.of(build_graph(Inline(), (elems,), batch=1)))
    assert inline == 3 * elems * 4
    assert held == 4 * elems * 4  # and the stem's output


def test_a_local_variable_holds_its_value_until_bound_again_or_returned():
    """NASNet's cells keep every branch in a local variable: eager frees it when the forward returns
    (or binds the name again), not after its last reader."""

    class Cell(nn.Module):
        def forward(self, x):
            left = torch.relu(x)
            right = torch.sigmoid(left)
            total = right * 2
            total = total + 1
            return torch.tanh(total)

    elems = 1024 * 1024
    graph = build_graph(Cell(), (elems,), batch=1)
    left, right, doubled, summed, _ = graph.nodes
    assert (left.attrs[EAGER_HOLD], right.attrs[EAGER_HOLD]) == (4, 3)  # until tanh, the forward's last
    assert doubled.attrs[EAGER_HOLD] == 1  # bound again by ``total = total + 1``
    # input, left, right and both totals while the second is written (or the last total and tanh)
    assert _peak_activations(NodeTable.of(graph)) == 5 * elems * 4


def test_locals_of_a_method_other_than_forward_are_held_too():
    """Non-strict export keeps only ``forward`` frames in its stack traces; NASNet binds every cell's
    output to a local of ``forward_features``, alive until it returns. ``a, b = ...`` binds both names
    again (TNT's blocks), which ends the holds of what they were bound to before."""

    class Cell(nn.Module):
        def forward(self, a, b):
            return torch.relu(a) + b

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.cell_0, self.cell_1, self.cell_2 = Cell(), Cell(), Cell()

        def forward_features(self, x):
            x_cell_0 = self.cell_0(x, x)
            x_cell_1 = self.cell_1(x_cell_0, x)
            x_cell_2 = self.cell_2(x_cell_1, x_cell_1)
            return torch.tanh(x_cell_2)

        def pair(self, x):
            first = torch.sigmoid(x)
            second = torch.exp(x)
            first, second = second * 2, first * 3
            return torch.cos(first + second)

        def forward(self, x):
            return self.pair(self.forward_features(x))

    graph = build_graph(Net(), (1024,), batch=1)
    kinds = [n.kind for n in graph.nodes]
    add = [i for i, k in enumerate(kinds) if k == "add"]
    tanh = kinds.index("tanh")
    # x_cell_0 lives through cell_2 (it was last read by cell_1) until forward_features returns
    assert add[0] + graph.nodes[add[0]].attrs[EAGER_HOLD] == tanh
    sigmoid, exp = kinds.index("sigmoid"), kinds.index("exp")
    tripled = len(kinds) - 1 - kinds[::-1].index("multiply")
    # held until ``first, second = ...`` binds them again, not until ``pair`` returns
    assert sigmoid + graph.nodes[sigmoid].attrs[EAGER_HOLD] == tripled
    assert exp + graph.nodes[exp].attrs[EAGER_HOLD] == tripled


def test_a_list_holds_what_is_appended_until_its_function_returns():
    """HGNet's blocks append every layer's output to a list they concatenate, then run more layers:
    eager frees the list (and what it holds) when the block returns, not after the concatenation.
    VoVNet's appends to its caller's list (a parameter): held until the caller returns. And
    ``a, b = f(x), g(x)`` binds each value to its name (StarNet), held like ``a = f(x)``."""

    class Block(nn.Module):  # modules where a statement runs more than once: each call is one execution
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.ReLU(), nn.ReLU()])
            self.sigmoid, self.tanh = nn.Sigmoid(), nn.Tanh()

        def append_exp(self, x, out):
            out.append(torch.exp(x))
            return x

        def forward(self, x):
            output = [x]
            for layer in self.layers:
                x = layer(x)
                output.append(x)
            self.append_exp(x, output)
            joined = torch.cat(output, dim=1)
            first, second = self.sigmoid(joined), self.tanh(joined)
            return torch.cos(first * second + 1)

    graph = build_graph(Block(), (1024,), batch=1)
    kinds = [n.kind for n in graph.nodes]
    last = len(kinds) - 1
    assert kinds[last] == "cos"
    relus = [i for i, k in enumerate(kinds) if k == "relu"]
    exp = kinds.index("exp")
    for held in (*relus, exp):  # appended: until the forward returns
        assert held + graph.nodes[held].attrs[EAGER_HOLD] == last
    for held in (kinds.index("sigmoid"), kinds.index("tanh")):  # bound to names until the forward returns
        assert held + graph.nodes[held].attrs[EAGER_HOLD] == last


def test_a_hold_survives_an_identity_operator():
    """Dropout in eval is the identity, so its output and its input are one Relax variable: the longer
    of their holds (here, the stages' argument) is the one kept."""

    class Stages(nn.Module):
        def forward(self, x):
            for _ in range(4):
                x = torch.relu(x)
            return x

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.drop, self.stages = nn.Dropout(0.1), Stages()

        def forward(self, x):
            x = self.drop(torch.sigmoid(x))
            return self.stages(x)

    graph = build_graph(Model().eval(), (1024,), batch=1)
    assert graph.nodes[0].kind == "sigmoid" and graph.nodes[0].attrs[EAGER_HOLD] == len(graph.nodes) - 1


def test_an_operator_eager_runs_in_place_writes_into_its_input():
    """``nn.ReLU(inplace=True)`` allocates nothing: its output is its input's storage, live until the
    last reader of either."""

    class InPlace(nn.Module):
        def __init__(self):
            super().__init__()
            self.act = nn.ReLU(inplace=True)

        def forward(self, x):
            y = x * 2
            return self.act(y) + y

    elems = 1024 * 1024
    graph = build_graph(InPlace(), (elems,), batch=1)
    relu = next(n for n in graph.nodes if n.op == "nn.relu")
    assert relu.attrs[EAGER_INPLACE_OF] == 1
    table = NodeTable.of(graph)
    assert table.free_step[relu.id] == -1
    assert _peak_activations(table) == 3 * elems * 4  # input, y, the sum


def test_breakdown_names_the_dominant_operators(resnet_graphs):
    top = predict_graph(resnet_graphs[32], cost_model="analytical").estimate.top_nodes(3)
    assert len(top) == 3 and top[0].time_ms >= top[1].time_ms >= top[2].time_ms
    assert all(c.bound in {"compute", "memory", "overhead"} for c in top)


def test_channels_last_saves_the_transposes_of_half_precision_convolutions(resnet_graphs):
    """NCHW at fp16 pays cuDNN's transpose of a tensor-core convolution's input; channels_last does not;
    fp32 and depthwise (CUDA-core) convolutions are the same in both layouts. (The GPU's time, that is:
    at this batch the GPU waits on the host either way.)"""
    g, model, gpu = resnet_graphs[8], AnalyticalCostModel(), "rtx4090"
    nchw, nhwc = (estimate_of(model, g, gpu, "fp16", layout=layout) for layout in ("nchw", "nhwc"))
    convs = {n.id for n in g.nodes if n.category == "conv"}
    slower = {a.node for a, b in zip(nchw.nodes, nhwc.nodes) if a.time_ms > b.time_ms}
    assert slower and slower <= convs and sum(c.time_ms for c in nchw.nodes) > sum(c.time_ms for c in nhwc.nodes)
    inputs = {n.id: n.inputs[0].numel for n in g.nodes}
    assert all(a.bytes - b.bytes == 2 * 2 * inputs[a.node]  # the input read and written once more
               for a, b in zip(nchw.nodes, nhwc.nodes) if a.node in slower)
    stem = next(n for n in g.nodes if n.category == "conv")  # 3 input channels: no tensor cores
    assert stem.id not in slower
    assert estimate_of(model, g, gpu, "fp32").latency_ms == estimate_of(model, g, gpu, "fp32", layout="nhwc").latency_ms
    with torch.device("meta"):
        depthwise = nn.Sequential(nn.Conv2d(64, 64, 3, padding=1, groups=64), nn.ReLU())
    dw = build_graph(depthwise, (64, 56, 56), batch=8)
    dw_nchw, dw_nhwc = (estimate_of(model, dw, gpu, "fp16", layout=layout) for layout in ("nchw", "nhwc"))
    assert dw_nchw.latency_ms == dw_nhwc.latency_ms


def test_convolutions_off_the_tensor_cores_run_at_the_cuda_cores_peak():
    """A depthwise convolution (one channel per group) cannot use tensor cores: at half precision
    cuDNN computes it in float32 on the CUDA cores, 16 times slower than the A100's tensor peak, so a
    large-kernel one is compute-bound; a dense one with aligned channels runs at the tensor peak."""
    from dippm_nas.hardware import get_device

    with torch.device("meta"):
        depthwise = nn.Conv2d(256, 256, 9, padding=4, groups=256, bias=False)
        dense = nn.Conv2d(256, 256, 3, padding=1, bias=False)
    a100, model = get_device("a100-40gb"), AnalyticalCostModel()
    for conv, peak in ((depthwise, a100.fp32_tflops), (dense, a100.tensor_tflops("fp16"))):
        cost = next(c for c in estimate_of(model, build_graph(conv, (256, 64, 64), batch=64), a100, "fp16").nodes
                    if c.op == "nn.conv2d")
        assert cost.bound == "compute"
        assert cost.time_ms == pytest.approx(cost.flops / (peak * 1e12) * 1e3, rel=0.05)


def test_bilinear_upsampling_of_nchw_planes_is_bound_by_memory_latency():
    """ATen's bilinear upsampling of an NCHW tensor runs one thread per output pixel, each looping over
    every (sample, channel) plane: EfficientFormerV2's 7x7 -> 14x14 upsampling of 1024 channels runs
    196 threads through 1024 planes per sample, one memory round trip each. A channels-last input
    (CoaT's tokens transposed into an image) and nearest-neighbour upsampling are spread over threads
    and stay memory-bound by bandwidth."""
    from dippm_nas.cost.pipeline.roofline import MEMORY_ROUND_TRIP_NS

    class Upsample(nn.Module):
        def __init__(self, mode: str, tokens: bool):
            super().__init__()
            self.mode, self.tokens = mode, tokens
            self.mix = nn.Linear(64, 64)

        def forward(self, x):
            if self.tokens:  # tokens (B, H*W, C) from a linear layer, back to an image as a transposed view
                b, c, h, w = x.shape
                x = self.mix(x.flatten(2).transpose(1, 2)).transpose(1, 2).reshape(b, c, h, w)
            return nn.functional.interpolate(x, scale_factor=2, mode=self.mode)

    device, model = "rtx3090", AnalyticalCostModel()
    times = {}
    for mode, tokens in (("bilinear", False), ("bilinear", True), ("nearest", False)):
        graph = build_graph(Upsample(mode, tokens), (64, 7, 7), batch=256)
        (node,) = [n for n in graph.nodes if n.kind == "image_resize2d"]
        assert node.attrs["eager_channels_last"] is tokens
        cost = next(c for c in estimate_of(model, graph, device, "fp16").nodes if c.node == node.id)
        times[mode, tokens] = cost.time_ms
        assert cost.bound == "memory"  # by bandwidth, or by latency
    assert times["bilinear", False] == pytest.approx(256 * 64 * MEMORY_ROUND_TRIP_NS * 1e-6, rel=0.01)
    assert max(times["bilinear", True], times["nearest", False]) < times["bilinear", False] / 10


def test_unknown_layout_names_the_known_ones(resnet_graphs):
    from dippm_nas.errors import DippmError

    with pytest.raises(DippmError, match="choose one of: nchw, nhwc"):
        predict_graph(resnet_graphs[8], layout="channels_last")


def test_autocast_keeps_what_pytorch_keeps_in_float32():
    """A pre-norm residual block under fp16 autocast, as PyTorch's autocast runs it: layer_norm in
    float32, the linear layers in half (casting their float32 input first), and the residual add of
    a half output to the float32 stream in float32; a BatchNorm CNN stays in half throughout after
    its first convolution casts the model's input."""

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.fc = nn.LayerNorm(256), nn.Linear(256, 256)

        def forward(self, x):
            return x + self.fc(self.norm(x))

    with torch.device("meta"):
        model = nn.Sequential(Block(), nn.Linear(256, 256))
        cnn = nn.Sequential(nn.Conv2d(16, 32, 3), nn.BatchNorm2d(32), nn.ReLU(), nn.Conv2d(32, 32, 3))
    g = build_graph(model, (64, 256), batch=4)
    t = NodeTable.of(g)
    ops = [(n.kind, bool(f32), int(casts)) for n, f32, casts in zip(g.nodes, t.autocast.stays_f32, t.autocast.casts)
           if not n.is_view]
    assert ops == [("layer_norm", True, 0), ("matmul", False, 1), ("add", True, 0), ("matmul", False, 1)]
    elems = 4 * 64 * 256
    kinds = [n.kind for n in g.nodes]
    moved = t.autocast.moved(2)  # at two bytes an element
    assert moved[kinds.index("layer_norm")] == elems * (4 + 4)
    assert moved[kinds.index("matmul")] == elems * (4 + 2 + 2 + 2)  # cast, read the copy, write
    assert moved[kinds.index("add")] == elems * (4 + 2 + 4)
    tc = NodeTable.of(build_graph(cnn, (16, 32, 32), batch=4))
    assert not tc.autocast.stays_f32.any() and tc.autocast.casts.tolist() == [1, 0, 0, 0]  # only the stem casts
