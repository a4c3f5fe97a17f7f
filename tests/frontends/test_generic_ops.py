"""An operator no frontend knows becomes a generic node with a warning, not a crash."""

from __future__ import annotations

import torch
from torch import nn

from dippm_nas import build_graph, predict


class UsesLgamma(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.lgamma(x)) + 1  # TVM's importer has no lgamma


def test_unknown_operator_is_a_generic_node():
    with torch.device("meta"):
        model = UsesLgamma()
    g = build_graph(model, (8,), batch=4)
    generic = [n for n in g.nodes if n.kind == "other"]
    assert len(generic) == 1 and generic[0].attrs["aten"] == "lgamma.default"
    assert generic[0].outputs[0].shape == (4, 8)
    assert g.producers[generic[0].id + 1] == (generic[0].id,)  # dataflow goes through it
    assert any("lgamma" in w for w in g.warnings)
    p = predict(model, (8,), batch=4)
    assert p.latency_ms > 0 and any("lgamma" in note for note in p.notes)


def test_onnx_operator_unknown_to_tvm_becomes_a_generic_node(tmp_path):
    """TVM's ONNX frontend has no Celu: it stays in the graph as a generic node, shape from ONNX inference."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.random.default_rng(0).normal(size=(4, 3, 3, 3)).astype("float32"), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Celu", ["c"], ["a"]),
         helper.make_node("Relu", ["a"], ["y"])],
        "celu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [weight])
    path = tmp_path / "celu.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    g = build_graph(str(path), batch=2)
    assert [n.kind for n in g.nodes] == ["conv2d", "other", "relu"]
    assert g.nodes[1].outputs[0].shape == (2, 4, 8, 8) and g.nodes[2].outputs[0].shape == (2, 4, 8, 8)
    assert any("Celu" in w and "generic node" in w for w in g.warnings)
    assert predict(str(path), batch=2).latency_ms > 0


def test_a_converter_that_fails_halfway_leaves_one_generic_node(monkeypatch):
    """An operator TVM fails to convert after emitting part of it (a GEMM before the bias add its types
    refuse) becomes one generic node: the part emitted first is read by nothing and is no operator."""
    from tvm import relax

    from dippm_nas.frontends import _torch

    def emits_then_fails(node, importer):
        importer.block_builder.emit(relax.op.nn.relu(importer.env[node.args[0]]))
        raise TypeError("refused after one operator")

    monkeypatch.setitem(_torch.EXTRA_CONVERTERS, "gelu.default", emits_then_fails)
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(8, 8), nn.GELU())
    g = build_graph(model, (8,), batch=4)
    assert [n.kind for n in g.nodes] == ["matmul", "other"] and g.nodes[1].attrs["aten"] == "gelu.default"
    assert any("refused after one operator" in w for w in g.warnings)
