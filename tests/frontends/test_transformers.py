"""Token-id models from Hugging Face configs, built without weights."""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")

from dippm_nas import TensorSpec, build_graph, predict  # noqa: E402

B, S, D, LAYERS, HEADS, FF, VOCAB = 2, 16, 64, 2, 4, 128, 100


def _matmul_flops(graph) -> int:
    return sum(n.flops for n in graph.nodes if n.kind == "matmul")


def _textbook(layers: int) -> int:
    """Q, K, V, O projections, the two FFN layers, Q K^T and A V, plus one add per biased output."""
    tokens = B * S
    matmuls = 4 * 2 * tokens * D * D + 2 * 2 * tokens * D * FF + 2 * 2 * B * S * S * D
    biases = 4 * tokens * D + tokens * FF + tokens * D
    return layers * (matmuls + biases)


def test_bert_predicts_with_token_ids():
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=D, num_hidden_layers=LAYERS,
                                     num_attention_heads=HEADS, intermediate_size=FF, max_position_embeddings=64)
    g = build_graph(config, [TensorSpec((S,), "int64", "input_ids")], batch=B)
    assert g.inputs[0].dtype == "int64" and g.inputs[0].shape == (B, S)
    # the pooler's output is not returned, but eager computes it: one more biased D x D product per sample
    assert _matmul_flops(g) == _textbook(LAYERS) + 2 * B * D * D + B * D
    p = predict(config, [TensorSpec((S,), "int64", "input_ids")], batch=B)
    assert p.latency_ms > 0 and p.memory_mib > 0


def test_gpt2_predicts_with_token_ids():
    config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=D, n_layer=LAYERS, n_head=HEADS, n_inner=FF,
                                     n_positions=64)
    g = build_graph(config, [TensorSpec((S,), "int64", "input_ids")], batch=B)
    assert _matmul_flops(g) == _textbook(LAYERS)
    p = predict(config, [TensorSpec((S,), "int64", "input_ids")], batch=B, device="h100-sxm")
    assert p.latency_ms > 0 and p.device == "h100-sxm"


def test_hf_prefix_builds_default_config():
    g = build_graph("hf:bert", batch=1)
    assert g.inputs[0].shape == (1, 128) and g.param_count > 100e6
