"""Normalisations: batch, layer, group, RMS, instance and local response norm.

FLOPs: ``NORM_FLOPS_PER_ELEMENT`` per element. Autocast runs layer and group norm in float32, casting
lower-precision inputs up; batch and instance norm (cuDNN's) take float32 parameters with lower-precision
inputs and stay in the lower precision.
"""

from __future__ import annotations

from collections.abc import Mapping

from dippm_nas.graph import eager_layout
from dippm_nas.graph.operators._registry import (
    AUTOCAST_FLOAT32,
    AUTOCAST_WIDEST_KEEPS_WEIGHT_DTYPE,
    declare_category,
    register,
)
from dippm_nas.graph.operators._rules import rows_of_last_axis, rows_of_planes
from dippm_nas.graph.tensor import Tensor

NORM = declare_category("norm", kernel="plane_norm")

#: mean, variance, subtract, divide, scale-and-shift.
NORM_FLOPS_PER_ELEMENT = 5


def _norm(args: list[Tensor], outs: list[Tensor], attrs: Mapping[str, object]) -> int:
    return NORM_FLOPS_PER_ELEMENT * args[0].numel


register("batch_norm", NORM, _norm, relax=("relax.nn.batch_norm",), autocast=AUTOCAST_WIDEST_KEEPS_WEIGHT_DTYPE,
         layout=eager_layout.first_dense, rows=rows_of_planes)
register("layer_norm", NORM, _norm, relax=("relax.nn.layer_norm",), aten=("layer_norm.default",
         "native_layer_norm.default"), autocast=AUTOCAST_FLOAT32, layout=eager_layout.first_contiguous,
         rows=rows_of_last_axis, kernel="row_norm")
register("group_norm", NORM, _norm, relax=("relax.nn.group_norm",), autocast=AUTOCAST_FLOAT32,
         layout=eager_layout.first_contiguous, rows=rows_of_planes)
register("rms_norm", NORM, _norm, relax=("relax.nn.rms_norm",), aten=("_fused_rms_norm.default", "rms_norm.default"),
         layout=eager_layout.first_contiguous, rows=rows_of_last_axis, kernel="row_norm")
register("instance_norm", NORM, _norm, relax=("relax.nn.instance_norm",),
         autocast=AUTOCAST_WIDEST_KEEPS_WEIGHT_DTYPE, rows=rows_of_planes)
register("local_response_norm", NORM, _norm, relax=("relax.nn.local_response_norm",), rows=rows_of_planes)
