"""Pooling: ``numel(out) * prod(window)`` FLOPs; adaptive pooling one per element read."""

from __future__ import annotations

import math
from collections.abc import Mapping

from dippm_nas.graph.operators import _rules
from dippm_nas.graph.operators._registry import declare_category, register_relax
from dippm_nas.graph.tensor import Tensor

POOL = declare_category("pool", kernel="pool")


def _pool(args: list[Tensor], outs: list[Tensor], attrs: Mapping[str, object]) -> int:
    window = attrs.get("pool_size") or ()
    return outs[0].numel * math.prod(window)  # type: ignore[arg-type]


register_relax(("relax.nn.max_pool1d", "relax.nn.max_pool2d", "relax.nn.max_pool3d", "relax.nn.avg_pool1d",
                "relax.nn.avg_pool2d", "relax.nn.avg_pool3d"), POOL, _pool, rows=_rules.rows_of_planes)
register_relax(("relax.nn.adaptive_avg_pool1d", "relax.nn.adaptive_avg_pool2d", "relax.nn.adaptive_avg_pool3d",
                "relax.nn.adaptive_max_pool2d"), POOL, _rules.per_input, rows=_rules.rows_of_planes)
