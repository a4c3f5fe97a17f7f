"""Reductions, scans, sorts and top-k: one FLOP per element read."""

from __future__ import annotations

from dippm_nas.graph.operators import _rules
from dippm_nas.graph.operators._registry import AUTOCAST_FLOAT32, declare_category, register_relax, spell_aten

REDUCE = declare_category("reduce", kernel="reduce")

register_relax(("relax.mean", "relax.max", "relax.min", "relax.variance", "relax.std", "relax.argmax",
                "relax.argmin", "relax.collapse_sum_like", "relax.collapse_sum_to", "relax.topk", "relax.sort",
                "relax.argsort"), REDUCE, _rules.per_input, rows=_rules.rows_reduced)
# autocast runs these in float32
register_relax(("relax.sum", "relax.prod", "relax.cumsum", "relax.cumprod", "relax.norm"), REDUCE, _rules.per_input,
               autocast=AUTOCAST_FLOAT32, rows=_rules.rows_reduced)
spell_aten(("amax.default", "amin.default"), "max")
spell_aten(("linalg_vector_norm.default",), "norm", kept_whole=True)
