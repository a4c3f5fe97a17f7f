"""LSTM and GRU layers, one node each, as cuDNN runs them.

TVM unrolls LSTM and GRU into a dozen nodes per time step (27,000 for sequencer2d_s), each charged a
kernel; PyTorch runs each layer as one cuDNN call, and the torch frontend keeps it one node. Their
attributes (hidden_size, num_layers, bidirectional, batch_first) come from the frontend. The same for
ONNX's LSTM and GRU (one layer each), which TVM's ONNX frontend does not convert.
"""

from __future__ import annotations

from collections.abc import Mapping

from dippm_nas.graph.operators._registry import FlopRule, register
from dippm_nas.graph.operators.gemm import GEMM, gemm_view
from dippm_nas.graph.tensor import Tensor

#: Per gate pre-activation: two bias adds and the recurrent sum, then its sigmoid or tanh.
RECURRENT_POINTWISE_FLOPS = 4


def _recurrent_flops(gates: int) -> FlopRule:
    """Per step of every sequence (``T * B``: the input's elements over its feature size), each layer
    and direction applies its [gates * H, I] input and [gates * H, H] recurrent matrices; a layer after
    the first reads the directions' outputs side by side. ``2 * T * B * numel(W)`` for every weight matrix,
    plus ``RECURRENT_POINTWISE_FLOPS`` per gate pre-activation and hidden unit per step."""

    def flops(args: list[Tensor], outs: list[Tensor], attrs: Mapping[str, object]) -> int:
        steps = args[0].numel // args[0].shape[-1]
        hidden = int(attrs.get("hidden_size", 0))
        directions = 2 if attrs.get("bidirectional") else 1
        per_step = 0
        for layer in range(int(attrs.get("num_layers", 1))):
            features = args[0].shape[-1] if layer == 0 else directions * hidden
            products = 2 * gates * hidden * (features + hidden)
            per_step += directions * (products + RECURRENT_POINTWISE_FLOPS * gates * hidden + hidden)  # + cell update
        return steps * per_step

    return flops


def _recurrent_layers(attrs: Mapping[str, object]) -> int:
    """Layers times directions: how many recurrences run."""
    return int(attrs.get("num_layers", 1)) * (2 if attrs.get("bidirectional") else 1)


def _recurrent_kernels(args: list[Tensor], outs: list[Tensor], attrs: Mapping[str, object]) -> int:
    """cuDNN's standard RNN algorithm (PyTorch's): per layer and direction, one GEMM for the inputs
    of every step, then per step a recurrent GEMM and one fused pointwise kernel."""
    steps = args[0].shape[1] if attrs.get("batch_first") else args[0].shape[0]
    return _recurrent_layers(attrs) * (1 + 2 * steps)


register("lstm", GEMM, _recurrent_flops(4), aten=("lstm.input", "onnx.LSTM"), kernels=_recurrent_kernels,
         gemm=gemm_view)
register("gru", GEMM, _recurrent_flops(3), aten=("gru.input", "onnx.GRU"), kernels=_recurrent_kernels,
         gemm=gemm_view)
