"""Softmax and log-softmax over one axis: ``SOFTMAX_FLOPS_PER_ELEMENT`` per element, run in float32 under
autocast, on a contiguous copy of an input that is not contiguous."""

from __future__ import annotations

from collections.abc import Mapping

from dippm_nas.graph import eager_layout
from dippm_nas.graph.operators._registry import AUTOCAST_FLOAT32, declare_category, register_relax
from dippm_nas.graph.operators._rules import rows_of_last_axis
from dippm_nas.graph.tensor import Tensor

SOFTMAX = declare_category("softmax", kernel="softmax")

#: max, subtract, exp, sum, divide.
SOFTMAX_FLOPS_PER_ELEMENT = 5


def _softmax(args: list[Tensor], outs: list[Tensor], attrs: Mapping[str, object]) -> int:
    return SOFTMAX_FLOPS_PER_ELEMENT * args[0].numel


register_relax(("relax.nn.softmax", "relax.nn.log_softmax"), SOFTMAX, _softmax, autocast=AUTOCAST_FLOAT32,
               layout=eager_layout.first_contiguous, rows=rows_of_last_axis)
