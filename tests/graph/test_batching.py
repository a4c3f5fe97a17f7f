"""A batch-1 graph scaled to batch B predicts what a graph exported at batch B predicts."""

import pytest

from dippm_nas import build_graph, predict_graph
from dippm_nas.graph.batching import scale_batch


@pytest.mark.parametrize("model", ["resnet18", "vit_tiny_patch16_224"])
def test_scaled_graph_matches_exported(model):
    one = build_graph(model, batch=1)
    exported = build_graph(model, batch=8)
    scaled = scale_batch(one, 8)
    assert scaled.flops == exported.flops and scaled.param_bytes == exported.param_bytes
    # sizes agree exactly; a layout such as (3, B, ...) becomes (3B, ...), which no cost depends on
    assert [[t.numel for t in n.outputs] for n in scaled.nodes] == [[t.numel for t in n.outputs] for n in exported.nodes]
    a, b = predict_graph(scaled), predict_graph(exported)
    # within a few parts per million: a parameter broadcast to the batch (ViT's class token) is a
    # folded weight of batch-1 shape in the scaled graph
    assert a.latency_ms == pytest.approx(b.latency_ms, rel=1e-5)
    assert a.memory_mb == pytest.approx(b.memory_mb, rel=1e-5)
