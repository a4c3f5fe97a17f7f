"""Activations and elementwise arithmetic: one FLOP per element written (the fvcore convention),
memory-bound, laid out like their inputs (TensorIterator)."""

from __future__ import annotations

from dippm_nas.graph import eager_layout
from dippm_nas.graph.operators import _rules
from dippm_nas.graph.operators._registry import (
    AUTOCAST_FLOAT32,
    AUTOCAST_LOWER,
    declare_category,
    register,
    register_relax,
    spell_aten,
)

ACTIVATION = declare_category("activation", layout=eager_layout.elementwise)
ELEMENTWISE = declare_category("elementwise", layout=eager_layout.elementwise)
#: The kind DIPPM counts among its static features (#relu).
RELU = "relu"

register_relax(("relax.nn.relu", "relax.nn.gelu", "relax.nn.gelu_tanh", "relax.nn.silu", "relax.sigmoid",
                "relax.tanh", "relax.nn.leakyrelu", "relax.nn.selu", "relax.nn.elu", "relax.nn.celu", "relax.clip",
                "relax.erf", "relax.sqrt", "relax.abs", "relax.negative", "relax.sin", "relax.cos", "relax.square",
                "relax.sign", "relax.floor", "relax.ceil", "relax.round", "relax.trunc", "relax.logical_not",
                "relax.isnan", "relax.isinf", "relax.nn.mish"), ACTIVATION, _rules.per_output)
# autocast runs prelu in the lower precision, and these in float32
register_relax(("relax.nn.prelu",), ACTIVATION, _rules.per_output, autocast=AUTOCAST_LOWER)
register_relax(("relax.exp", "relax.log", "relax.rsqrt", "relax.reciprocal", "relax.nn.softplus"), ACTIVATION,
               _rules.per_output, autocast=AUTOCAST_FLOAT32)
# TVM's torch importer decomposes these; PyTorch eager runs one kernel
register("hardswish", ACTIVATION, _rules.per_output, aten=("hardswish.default", "hardswish_.default"),
         kept_whole=True)
register("hardsigmoid", ACTIVATION, _rules.per_output, aten=("hardsigmoid.default", "hardsigmoid_.default"),
         kept_whole=True)

register_relax(("relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.floor_divide",
                "relax.maximum", "relax.minimum", "relax.where", "relax.equal", "relax.not_equal", "relax.less",
                "relax.greater", "relax.less_equal", "relax.greater_equal", "relax.logical_and", "relax.logical_or",
                "relax.floor_mod", "relax.mod", "relax.bitwise_and", "relax.bitwise_or", "relax.astype",
                "relax.nn.dropout", "relax.atan2", "relax.ewise_fma", "relax.log_add_exp"), ELEMENTWISE,
               _rules.per_output)
register_relax(("relax.power",), ELEMENTWISE, _rules.per_output, autocast=AUTOCAST_FLOAT32)
spell_aten(("div.Tensor_mode",), "floor_divide")
