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
    assert ([[t.numel for t in n.outputs] for n in scaled.nodes]
            == [[t.numel for t in n.outputs] for n in exported.nodes])
    a, b = predict_graph(scaled), predict_graph(exported)
    # within a few parts per million: a parameter broadcast to the batch (ViT's class token) is a
    # folded weight of batch-1 shape in the scaled graph
    assert a.latency_ms == pytest.approx(b.latency_ms, rel=1e-5)
    assert a.memory_mib == pytest.approx(b.memory_mib, rel=1e-5)


@pytest.mark.parametrize("model", ["resnet18", "vit_tiny_patch16_224"])
def test_features_of_a_batch_are_its_samples(model):
    """Node and static features are per sample: the same from a graph exported at batch 8 as at 1."""
    import numpy as np

    from dippm_nas.cost.learned.features import node_feature_matrix, node_feature_names, static_features
    from dippm_nas.cost.pipeline.table import NodeTable

    g1, g8 = build_graph(model, batch=1), build_graph(model, batch=8)
    one, eight = NodeTable.of(g1), NodeTable.of(g8)
    x1, x8 = node_feature_matrix(one).numpy(), node_feature_matrix(eight).numpy()
    # Equal to the last digit, attention's (3, B, heads, N, d) views included, but for weight bytes:
    # ViT's class token is a parameter broadcast to the batch, folded into a weight of batch shape.
    weights = [node_feature_names().index(n) for n in ("log_bytes_read", "log_weight_bytes")]
    folded = np.array([bool(n.weights) for n in g8.nodes])
    assert np.array_equal(np.delete(x8, weights, axis=1), np.delete(x1, weights, axis=1))
    assert np.array_equal(x8[~folded], x1[~folded])
    s1, s8 = static_features(one), static_features(eight)
    assert s8.pop("batch") == 8 and s1.pop("batch") == 1
    assert s8 == pytest.approx(s1, rel=1e-6)
    assert np.array_equal(eight.flops1, one.flops) and eight.flops.sum() == 8 * one.flops.sum()
