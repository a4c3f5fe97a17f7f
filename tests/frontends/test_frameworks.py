"""TensorFlow/Keras, TFLite and PaddlePaddle models: the same architecture gives the same graph and prediction.

Needs the extras: pip install -e ".[test]" installs them (``[tensorflow]`` and ``[paddle]``).
"""

from __future__ import annotations

import json
import sys

import pytest
import torch
from torch import nn

# isort: off
import dippm_nas  # noqa: F401  # before TensorFlow, so that Triton loads first (see dippm_nas._llvm)
from dippm_nas import TensorSpec, build_graph, predict
from dippm_nas.cli import main
from dippm_nas.errors import MissingExtraError, ModelLoadError

import paddle  # noqa: E402  # before TensorFlow: Paddle's native core crashes when loaded after it
import keras  # noqa: E402
from keras import layers, ops  # noqa: E402
# isort: on

SEQ, DIM, HEADS, HIDDEN = 16, 32, 4, 128
PREDICTION_TOLERANCE = 0.02  # the bar: predictions within 2 % of each other
RANDOM = "random_normal"  # Keras' default zero biases would be dropped as "add 0" by tf2onnx


# ---- one small CNN, three frameworks ----------------------------------------------------------------


def keras_cnn() -> keras.Model:
    x = keras.Input((8, 8, 3))
    a = layers.Conv2D(8, 3, padding="same", activation="relu", bias_initializer=RANDOM)(x)
    b = layers.Add()([layers.Conv2D(8, 3, padding="same", bias_initializer=RANDOM)(a), a])
    return keras.Model(x, layers.Dense(10, bias_initializer=RANDOM)(layers.GlobalAveragePooling2D()(b)))


class PaddleCNN(paddle.nn.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = paddle.nn.Conv2D(3, 8, 3, padding=1)
        self.conv2 = paddle.nn.Conv2D(8, 8, 3, padding=1)
        self.pool = paddle.nn.AdaptiveAvgPool2D(1)
        self.fc = paddle.nn.Linear(8, 10)

    def forward(self, x):
        a = paddle.nn.functional.relu(self.conv1(x))
        return self.fc(paddle.flatten(self.pool(self.conv2(a) + a), 1))


# ---- one small pre-norm transformer block, three frameworks -----------------------------------------
# Attention is written out (q k^T * scale, softmax, times v) in all three: Keras has no fused
# attention operator that tf2onnx exports, so PyTorch's SDPA would be a different architecture.


class TorchBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.fc1, self.fc2 = nn.Linear(DIM, HIDDEN), nn.Linear(HIDDEN, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv(self.norm1(x)).reshape(-1, SEQ, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attention = torch.softmax(q @ k.transpose(2, 3) * (DIM // HEADS) ** -0.5, dim=-1)
        x = x + self.proj((attention @ v).transpose(1, 2).reshape(-1, SEQ, DIM))
        return x + self.fc2(nn.functional.gelu(self.fc1(self.norm2(x))))


def keras_block() -> keras.Model:
    x = keras.Input((SEQ, DIM))
    norm = dict(epsilon=1e-5, gamma_initializer=RANDOM, beta_initializer=RANDOM)
    qkv = layers.Dense(3 * DIM, bias_initializer=RANDOM)(layers.LayerNormalization(**norm)(x))
    qkv = ops.transpose(ops.reshape(qkv, (-1, SEQ, 3, HEADS, DIM // HEADS)), (2, 0, 3, 1, 4))
    q, k, v = qkv[0], qkv[1], qkv[2]
    attention = ops.softmax(ops.matmul(q, ops.transpose(k, (0, 1, 3, 2))) * (DIM // HEADS) ** -0.5, axis=-1)
    mixed = ops.reshape(ops.transpose(ops.matmul(attention, v), (0, 2, 1, 3)), (-1, SEQ, DIM))
    x1 = x + layers.Dense(DIM, bias_initializer=RANDOM)(mixed)
    hidden = layers.Dense(HIDDEN, activation="gelu", bias_initializer=RANDOM)(layers.LayerNormalization(**norm)(x1))
    return keras.Model(x, x1 + layers.Dense(DIM, bias_initializer=RANDOM)(hidden))


class PaddleBlock(paddle.nn.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = paddle.nn.LayerNorm(DIM), paddle.nn.LayerNorm(DIM)
        self.qkv, self.proj = paddle.nn.Linear(DIM, 3 * DIM), paddle.nn.Linear(DIM, DIM)
        self.fc1, self.fc2 = paddle.nn.Linear(DIM, HIDDEN), paddle.nn.Linear(HIDDEN, DIM)

    def forward(self, x):
        qkv = self.qkv(self.norm1(x)).reshape([-1, SEQ, 3, HEADS, DIM // HEADS]).transpose([2, 0, 3, 1, 4])
        q, k, v = qkv[0], qkv[1], qkv[2]
        attention = paddle.nn.functional.softmax(paddle.matmul(q, k.transpose([0, 1, 3, 2])) * (DIM // HEADS) ** -0.5)
        x = x + self.proj(paddle.matmul(attention, v).transpose([0, 2, 1, 3]).reshape([-1, SEQ, DIM]))
        return x + self.fc2(paddle.nn.functional.gelu(self.fc1(self.norm2(x))))


def _assert_same(graphs: dict[str, object], predictions: dict[str, object]) -> None:
    reference = graphs["torch"]
    for name, graph in graphs.items():
        assert graph.flops == reference.flops, (name, graph.flops, reference.flops)
        assert graph.param_bytes == reference.param_bytes, (name, graph.param_bytes, reference.param_bytes)
    for metric in ("latency_ms", "energy_j", "memory_mib"):
        values = {name: getattr(p, metric) for name, p in predictions.items()}
        spread = max(values.values()) / min(values.values()) - 1
        assert spread <= PREDICTION_TOLERANCE, (metric, values)


def test_small_cnn_is_the_same_in_torch_keras_and_paddle():
    from conftest import SmallCNN

    with torch.device("meta"):
        models = {"torch": SmallCNN(), "keras": keras_cnn(), "paddle": PaddleCNN()}
    inputs = {"torch": (3, 8, 8), "keras": None, "paddle": (3, 8, 8)}
    graphs = {name: build_graph(m, inputs[name], batch=4) for name, m in models.items()}
    assert graphs["keras"].source == "tensorflow" and graphs["paddle"].source == "paddle"
    predictions = {name: predict(m, inputs[name], batch=4) for name, m in models.items()}
    _assert_same(graphs, predictions)


def test_transformer_block_is_the_same_in_torch_keras_and_paddle():
    with torch.device("meta"):
        torch_block = TorchBlock()
    models = {"torch": torch_block, "keras": keras_block(), "paddle": PaddleBlock()}
    spec = TensorSpec((SEQ, DIM))
    inputs = {"torch": spec, "keras": None, "paddle": spec}
    graphs = {name: build_graph(m, inputs[name], batch=8) for name, m in models.items()}
    # the exporters' decompositions were folded back: one layer_norm, gelu and batched matmul each
    for name, graph in graphs.items():
        kinds = [n.kind for n in graph.nodes]
        assert kinds.count("layer_norm") == 2 and kinds.count("gelu") == 1 and kinds.count("matmul") == 6, name
        # and eager's copies are found from the layouts alike: q, k^T and v before their batched
        # matmuls, and the transposed heads before the reshape that merges them
        assert kinds.count("layout_transform") == 4, name
        # ONNX's Slice and Squeeze of one entry of q, k and v are PyTorch's one indexing operator: the
        # GPU waits on the host at this batch, and each operator issued costs host time
        assert "squeeze" not in kinds, name
    predictions = {name: predict(m, inputs[name], batch=8) for name, m in models.items()}
    _assert_same(graphs, predictions)


def test_keras_multi_head_attention_imports_with_its_shape_arithmetic_folded():
    """tf2onnx computes MultiHeadAttention's reshape targets with Shape/Gather/Concat, and a fresh
    LayerNormalization (gamma 1, beta 0) loses its affine part: both still give a clean graph."""
    x = keras.Input((SEQ, DIM))
    y = layers.MultiHeadAttention(num_heads=HEADS, key_dim=DIM // HEADS)(x, x)
    graph = build_graph(keras.Model(x, layers.LayerNormalization()(x + y)), batch=2)
    kinds = [n.kind for n in graph.nodes]
    assert kinds.count("layer_norm") == 1 and kinds.count("softmax") == 1 and kinds.count("matmul") == 6
    assert "other" not in kinds and [w for w in graph.warnings if "not as TensorFlow runs it" not in w] == []


# ---- real models from the CLI, in every file format ----------------------------------------------


def _cli(capsys, *argv: str) -> dict:
    code = main(["predict", *argv, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def test_keras_application_predicts_from_the_cli_as_keras_file_saved_model_and_tflite(tmp_path, capsys):
    import tensorflow as tf

    model = keras.applications.MobileNetV2(weights=None)
    model.save(tmp_path / "mobilenet_v2.keras")
    model.export(str(tmp_path / "saved_model"), verbose=False)
    (tmp_path / "mobilenet_v2.tflite").write_bytes(tf.lite.TFLiteConverter.from_keras_model(model).convert())
    timm_gflops = predict("mobilenetv2_100", batch=2).gflops
    capsys.readouterr()  # what the exports printed
    for path in ("mobilenet_v2.keras", "saved_model", "mobilenet_v2.tflite"):
        data = _cli(capsys, str(tmp_path / path), "--batch", "2")
        assert data["latency_ms"] > 0 and data["memory_mib"] > 0 and data["batch"] == 2
        # the same architecture as timm's mobilenetv2_100: within 5 % of its FLOPs, all 3.5 M parameters
        assert abs(data["gflops"] / timm_gflops - 1) < 0.05, (path, data["gflops"], timm_gflops)
        assert abs(data["params_m"] - 3.5) < 0.1, (path, data["params_m"])


def test_paddle_vision_model_predicts_from_the_cli(tmp_path, capsys):
    layer = paddle.vision.models.resnet18()
    layer.eval()
    static = paddle.jit.to_static(layer, input_spec=[paddle.static.InputSpec([None, 3, 224, 224], "float32", "x")],
                                  full_graph=True)
    paddle.jit.save(static, str(tmp_path / "resnet18"))
    program = next(p for p in tmp_path.iterdir() if p.suffix in (".json", ".pdmodel"))
    capsys.readouterr()
    data = _cli(capsys, str(program), "--batch", "4")
    timm = predict("resnet18", batch=4)
    assert data["batch"] == 4 and abs(data["params_m"] - timm.params_m) < 0.01
    assert abs(data["gflops"] / timm.gflops - 1) < 0.02
    assert predict(layer, batch=4).gflops == pytest.approx(data["gflops"])  # the Layer object, no file


# ---- bad input: one clear line each ---------------------------------------------------------------


def test_keras_input_of_unknown_shape_says_how_to_give_it(capsys):
    x = keras.Input((None, None, 3), name="image")
    model = keras.Model(x, layers.Conv2D(4, 3)(x))
    with pytest.raises(ModelLoadError,
                       match=r"input 'image' has unknown dimensions \(batch, \?, \?, 3\).*--input image="):
        build_graph(model)
    assert build_graph(model, TensorSpec((32, 32, 3), name="image")).flops > 0


def test_corrupt_saved_model_is_a_clear_error(tmp_path, capsys):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "saved_model.pb").write_bytes(b"not a protobuf")
    assert main(["predict", str(broken)]) == 2
    assert "is not a readable TensorFlow SavedModel" in capsys.readouterr().err


@pytest.mark.parametrize("module,extra,model", [
    ("tf2onnx", "tensorflow", "model.tflite"),
    ("paddle2onnx", "paddle", "model.pdmodel"),
])
def test_missing_extra_names_the_pip_install(monkeypatch, tmp_path, module, extra, model):
    (tmp_path / model).write_bytes(b"")
    (tmp_path / model).with_suffix(".pdiparams").write_bytes(b"")
    monkeypatch.setitem(sys.modules, module, None)  # what an environment without the extra sees
    with pytest.raises(MissingExtraError, match=rf"pip install 'dippm-nas\[{extra}\]'"):
        build_graph(str(tmp_path / model))
