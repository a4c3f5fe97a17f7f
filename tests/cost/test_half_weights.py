"""A model whose weights are half is priced as PyTorch runs it: half bytes, half tensor cores, no cast."""

import pytest
import torch

import dippm_nas
from dippm_nas.errors import DippmError
from dippm_nas.graph.cast import cast_floats, graph_at_precision
from dippm_nas.inputs import TensorSpec
from dippm_nas.precisions import PRECISIONS

TOKENS = 1024


def _linear(dtype: torch.dtype) -> torch.nn.Module:
    with torch.device("meta"):
        return torch.nn.Linear(4096, 22016, dtype=dtype)


def _matmul(prediction):
    (node,) = [n for n in prediction.estimate.nodes if n.op.endswith("matmul")]
    return node


@pytest.fixture(scope="module")
def half_linear():
    """Llama-2-7B's up-projection, built in float16 on the meta device, at 1024 tokens."""
    return dippm_nas.build_graph(_linear(torch.float16), TensorSpec((4096,), "float16"), batch=TOKENS)


@pytest.mark.parametrize("cost_model", ["operators", "analytical"])
def test_a_half_linear_layer_is_one_half_gemm_on_tensor_cores_with_no_cast(half_linear, cost_model):
    assert [n.kind for n in half_linear.nodes] == ["matmul"]  # no cast, no generic node
    (node,) = half_linear.nodes
    assert {t.dtype for t in (*node.inputs, *node.outputs, *node.weights)} == {"float16"}
    assert half_linear.param_bytes == 2 * half_linear.param_count  # 2 bytes a weight
    p = dippm_nas.predict_graph(half_linear, "h100-sxm", cost_model=cost_model, mode="cuda-graphs")
    assert p.precision == "fp16-weights" and "the model's weights are float16" in p.notes[0]
    matmul = _matmul(p)
    assert matmul.unit == "tensor cores (FP16)"
    # what the GEMM itself reads and writes at two bytes an element: input, weight, bias, output
    assert matmul.bytes == 2 * (TOKENS * 4096 + 4096 * 22016 + 22016 + TOKENS * 22016)
    assert p.estimate.memory.weights_mib == pytest.approx(half_linear.param_count * 2 / 2**20)


def test_autocast_over_float32_weights_keeps_the_weight_cast(half_linear):
    graph = dippm_nas.build_graph(_linear(torch.float32), (4096,), batch=TOKENS)
    autocast = dippm_nas.predict_graph(graph, "h100-sxm", "fp16", cost_model="analytical", mode="cuda-graphs")
    half = dippm_nas.predict_graph(half_linear, "h100-sxm", cost_model="analytical", mode="cuda-graphs")
    assert autocast.precision == "fp16" and _matmul(autocast).unit == "tensor cores (FP16)"
    # each float32 operand (weight, bias, input) read, its half copy written and read again: 4 + 2 + 2 bytes
    # an element where the half model reads 2
    cast = 4096 * 22016 + 22016 + TOKENS * 4096
    assert _matmul(autocast).bytes - _matmul(half).bytes == 6 * cast
    assert autocast.estimate.memory.weights_mib == pytest.approx(2 * half.estimate.memory.weights_mib)


@pytest.mark.parametrize("asked", ["fp32", "tf32", "fp16"])
def test_a_half_model_asked_at_another_precision_is_predicted_half_with_a_note(half_linear, asked):
    p = dippm_nas.predict_graph(half_linear, "h100-sxm", asked, cost_model="analytical")
    assert p.precision == "fp16-weights" and _matmul(p).unit == "tensor cores (FP16)"
    assert any(f"whatever {asked} sets: predicted at fp16-weights" in note for note in p.notes)


def test_a_float32_model_at_half_weights_is_the_model_built_half():
    """The precision casts the exported float32 graph as model.half() does: the same prediction as the model
    built in float16 and exported, for a timm model; weights take half the memory, and the latency is no
    more than autocast's at batch 64 on an H100."""
    with torch.device("meta"):
        import timm

        half_model = timm.create_model("resnet18").half()
    on_h100 = {"batch": 64, "device": "h100-sxm", "cost_model": "operators"}
    built_half = dippm_nas.predict(half_model, **on_h100)
    cast = dippm_nas.predict("resnet18", precision="fp16-weights", **on_h100)
    full = dippm_nas.predict("resnet18", **on_h100)
    autocast = dippm_nas.predict("resnet18", precision="fp16", **on_h100)
    assert built_half.precision == cast.precision == "fp16-weights" and full.precision == "fp32"
    assert built_half.latency_ms == pytest.approx(cast.latency_ms, rel=1e-9)
    assert built_half.memory_mib == pytest.approx(cast.memory_mib, rel=1e-9)
    assert any("cast to float16" in note for note in cast.notes)
    assert built_half.estimate.memory.weights_mib == pytest.approx(full.estimate.memory.weights_mib / 2, rel=0.01)
    assert built_half.latency_ms <= autocast.latency_ms


def test_the_cast_follows_the_weights_dtype(half_linear):
    bf16, precision, notes = graph_at_precision(half_linear, PRECISIONS["bf16-weights"])
    assert precision.name == "bf16-weights" and bf16.float_weight_dtypes == {"bfloat16"}
    assert "float16 weights and activations cast to bfloat16" in notes[0]
    assert graph_at_precision(half_linear, PRECISIONS["fp16-weights"]) == (half_linear, PRECISIONS["fp16-weights"], ())
    back = cast_floats(bf16, "bfloat16", "float16")
    assert back.nodes == half_linear.nodes and back.param_bytes == half_linear.param_bytes


@pytest.mark.parametrize("cost_model", ["operators", "analytical", "residual"])
def test_each_precision_is_priced_as_pytorch_runs_it_on_the_gpu(half_linear, cost_model):
    """On a GPU without tensor cores of the precision's format PyTorch still runs it: TF32 flags change nothing
    (tf32 is fp32-strict), half tensors are computed on the CUDA cores in FP32 arithmetic; each is said. Only
    bfloat16 without bf16 units, which PyTorch emulates, is refused, and why is said."""
    half = dippm_nas.predict_graph(half_linear, "p100-pcie-16gb", "fp16-weights", cost_model=cost_model)
    full_linear = dippm_nas.build_graph(_linear(torch.float32), (4096,), batch=TOKENS)
    full = dippm_nas.predict_graph(full_linear, "p100-pcie-16gb", "fp32-strict", cost_model=cost_model)
    assert half.precision == "fp16-weights" and _matmul(half).unit == "CUDA cores (FP32 math on FP16)"
    assert any("no fp16 tensor cores: PyTorch keeps float16 tensors" in n for n in half.notes), half.notes
    assert half.latency_ms <= full.latency_ms and half.memory_mib < full.memory_mib  # same arithmetic, half bytes
    with torch.device("meta"):
        model = torch.nn.Linear(1024, 1024)
    graph = dippm_nas.build_graph(model, (1024,), batch=64)
    tf32 = dippm_nas.predict_graph(graph, "t4", "tf32", cost_model=cost_model)
    assert tf32.precision == "fp32-strict" and "t4 has no TF32 tensor cores" in " ".join(tf32.notes)
    assert tf32.latency_ms == dippm_nas.predict_graph(graph, "t4", "fp32-strict", cost_model=cost_model).latency_ms
    assert "tf32" in dippm_nas.get_device("t4").precisions and "bf16" not in dippm_nas.get_device("t4").precisions
    with pytest.raises(DippmError, match="t4 .* has no bf16 units .* PyTorch only emulates bfloat16 there"):
        dippm_nas.predict_graph(graph, "t4", "bf16", cost_model=cost_model)


def test_a_depthwise_convolution_under_autocast_says_its_tensors_are_half():
    with torch.device("meta"):
        model = torch.nn.Conv2d(64, 64, 7, padding=3, groups=64)
    p = dippm_nas.predict(model, (64, 56, 56), batch=8, precision="fp16", cost_model="analytical")
    (conv,) = [n for n in p.estimate.nodes if n.op.endswith("conv2d")]
    assert conv.unit == "CUDA cores (FP32 math on FP16)"


def test_half_inputs_follow_a_half_module():
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU()).to(
            torch.bfloat16)
    loaded = dippm_nas.load_model(model, (3, 32, 32), batch=2)
    assert [s.dtype for s in loaded.inputs] == ["bfloat16"] and "read in bfloat16" in loaded.warnings[0]
    graph = dippm_nas.build_graph(model, (3, 32, 32), batch=2)
    assert {n.kind for n in graph.nodes} >= {"conv2d", "batch_norm"} and "other" not in {n.kind for n in graph.nodes}
    assert dippm_nas.predict_graph(graph, "a100-40gb", cost_model="analytical").precision == "bf16-weights"


def test_a_nas_cost_model_keeps_a_half_model_apart_from_its_float32_twin():
    from dippm_nas.integration import HardwareCostModel

    cost = HardwareCostModel(device="h100-sxm", batch=4, cost_model="analytical")
    with torch.device("meta"):
        full = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU())
        half = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()).half()
    assert repr(full) == repr(half)
    assert [cost.score(m, (64,)).precision for m in (full, half, full)] == ["fp32", "fp16-weights", "fp32"]


class _BodyAndHead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body, self.head = torch.nn.Linear(16, 16), torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.body(x))


def test_a_module_that_pytorch_cannot_run_for_its_mixed_dtypes_is_refused():
    """Only its head cast by ``.half()``: a float32 activation meets float16 weights, which PyTorch refuses."""
    model = _BodyAndHead()
    model.head.half()
    with pytest.raises(DippmError, match=r"runs linear \(linear_1\) on operands of float16 and float32: PyTorch "
                                         r"cannot run it as built"):
        dippm_nas.build_graph(model, (16,), batch=2)


def test_a_half_module_cast_to_another_half_dtype_says_one_input_dtype():
    half = _BodyAndHead().half()
    notes = dippm_nas.predict(half, (16,), batch=2, precision="bf16-weights", cost_model="analytical").notes
    assert any("cast to bfloat16" in n and "with bfloat16 inputs" in n for n in notes)
    assert not any("read in float16" in n for n in notes), notes
    own = dippm_nas.predict(half, (16,), batch=2, cost_model="analytical").notes
    assert any("read in float16" in n for n in own)
